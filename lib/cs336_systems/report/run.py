"""Headless regeneration: execute the notebooks with papermill, convert them to HTML, write an index.

    python -m cs336_systems.report.run --profile cpu --notebooks 01,03 --out reports/cpu

A notebook that fails is still converted (its error cell shows where), listed on the index with
the error, and the others still run; the exit status is non-zero when any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from cs336_systems.report.environment import environment_info, repo_root, resolve_profile


@dataclass
class NotebookRun:
    name: str
    status: str  # "ok" | "failed"
    seconds: float
    error: str = ""
    # Where and from what it ran: a report folder can gather notebooks run on several machines.
    machine: str = ""
    commit: str = ""
    date: str = ""


def machine_of(env: dict[str, str]) -> str:
    """The accelerator of an environment_info() record, else its CPU."""
    return env.get("GPU") or env.get("CPU", "")


# What running and rendering the notebooks needs beyond the library: the `report` extra.
REPORT_PACKAGES = ("papermill", "nbconvert", "nbformat", "ipykernel")


def missing_report_packages(names: tuple[str, ...] = REPORT_PACKAGES) -> list[str]:
    import importlib.util

    return [name for name in names if importlib.util.find_spec(name) is None]


def discover(notebook_dir: Path, selection: str | None) -> list[Path]:
    """Notebooks in `notebook_dir`; `selection` is a comma list of prefixes or names ("01,03")."""
    all_nbs = sorted(p for p in notebook_dir.glob("[0-9][0-9]_*.ipynb"))
    if not selection:
        return all_nbs
    wanted = [s.strip() for s in selection.replace(" ", ",").split(",") if s.strip()]
    chosen = [p for p in all_nbs if any(p.stem == w or p.stem.startswith(w) for w in wanted)]
    missing = [w for w in wanted if not any(p.stem == w or p.stem.startswith(w) for p in all_nbs)]
    if missing:
        raise ValueError(f"no notebook matches {', '.join(missing)}; have {', '.join(p.stem for p in all_nbs)}")
    return chosen


# ipykernel warns at every start that its sockets are TCP without encryption: they are on loopback,
# owned by this process, and nothing a report user can change. Errors of the kernel still show.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]


class PapermillNoise(logging.Filter):
    """Drops the papermill warnings that say nothing wrong: "Unable to parse line ..." for each line of a
    parameters cell with a second `=` (in its comment: the parameter is still set, papermill only
    cannot read its default for `--help-notebook`), and the "Passed unknown parameter: x" that follows
    when the cell does assign `x`. Every other record passes."""

    def __init__(self) -> None:
        super().__init__()
        self.assigned: set[str] = set()  # the parameters the notebook being run assigns

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Unable to parse line"):
            return False
        unknown = re.fullmatch(r"Passed unknown parameter: (\w+)", message)
        return not (unknown and unknown.group(1) in self.assigned)


def assigned_parameters(notebook: Path) -> set[str]:
    """Names assigned at the start of a line of the notebook's `parameters` cell."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    sources = [c.source for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    return {m.group(1) for src in sources for m in re.finditer(r"^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=", src, re.M)}


@contextlib.contextmanager
def papermill_log(noise: PapermillNoise) -> Iterator[None]:
    """papermill's warnings to stderr through `noise` while the block runs (they would go to logging's
    last-resort handler, unfiltered), then the logger as it was."""
    logger = logging.getLogger("papermill")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(noise)
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def execute(notebook: Path, out_dir: Path, profile: str, cell_timeout: int) -> NotebookRun:
    import papermill as pm

    out_path = out_dir / notebook.name
    noise = PapermillNoise()
    start = time.perf_counter()
    try:
        noise.assigned = assigned_parameters(notebook)
        with papermill_log(noise):
            pm.execute_notebook(
                str(notebook), str(out_path), parameters={"profile": profile}, cwd=str(notebook.parent),
                kernel_name="python3", progress_bar=False, execution_timeout=cell_timeout,
                extra_arguments=KERNEL_ARGUMENTS,
            )
        status, error = "ok", ""
    except Exception as err:  # noqa: BLE001 - any failure is recorded and the next notebook runs
        status = "failed"
        error = f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', str(err))}".strip()
        if not out_path.exists():
            error += "\n" + traceback.format_exc(limit=3)
    return NotebookRun(notebook.stem, status, time.perf_counter() - start, error[:2000])


def to_html(executed: Path) -> Path:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(executed, as_version=4)
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    html_path = executed.with_suffix(".html")
    html_path.write_text(body, encoding="utf-8")
    return html_path


def write_index(out_dir: Path, runs: list[NotebookRun], env: dict[str, str]) -> Path:
    import html

    env_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in env.items())
    nb_rows = []
    for r in runs:
        badge = "✅" if r.status == "ok" else "❌"
        err = f"<pre>{html.escape(r.error)}</pre>" if r.error else ""
        where = html.escape(" · ".join(x for x in (r.machine, r.commit, r.date) if x))
        nb_rows.append(
            f"<tr><td>{badge}</td><td><a href='{r.name}.html'>{r.name}</a></td>"
            f"<td><a href='{r.name}.ipynb'>ipynb</a></td><td>{r.seconds:.1f} s</td><td>{where}</td><td>{err}</td></tr>"
        )
    writeup = "<p><a href='writeup.html'>The writeup</a> — every problem in order.</p>" if (out_dir / "writeup.html").exists() else ""
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>CS336 systems report ({env.get('profile')})</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto}}td,th{{padding:.2rem .6rem;text-align:left;vertical-align:top}}
pre{{white-space:pre-wrap;color:#a00;margin:0}}table{{border-collapse:collapse}}tr{{border-bottom:1px solid #ddd}}</style></head><body>
<h1>CS336 assignment 2 — systems report</h1>{writeup}
<h2>Environment of the latest run</h2><table>{env_rows}</table>
<h2>Notebooks</h2><table><tr><th></th><th>notebook</th><th></th><th>time</th><th>machine · commit · date</th><th>error</th></tr>{''.join(nb_rows)}</table>
</body></html>"""
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def build_index(out_dir: Path, profile: str) -> None:
    """index.html and writeup.html from the executed notebooks and runs.json of a report folder."""
    from cs336_systems.report.writeup import build_writeup

    runs_path = out_dir / "runs.json"
    runs = [NotebookRun(**r) for r in json.loads(runs_path.read_text())] if runs_path.exists() else []
    env_path = out_dir / "environment.json"  # the machine the notebooks ran on, not this one
    env = json.loads(env_path.read_text()) if env_path.exists() else environment_info(profile)
    build_writeup(out_dir, env, runs=[asdict(r) for r in runs])
    write_index(out_dir, runs, env)


def run_report(
    profile: str | None, selection: str | None, out_dir: Path | None, cell_timeout: int = 3600, html: bool = True,
    notebook_dir: Path | None = None,
) -> list[NotebookRun]:
    profile = resolve_profile(profile)
    root = repo_root()
    out_dir = Path(out_dir or root / "reports" / profile).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ["CS336_REPORT_DIR"] = str(out_dir)
    os.environ["CS336_PROFILE"] = profile
    os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars would fill the executed notebooks
    notebooks = discover(Path(notebook_dir) if notebook_dir else root / "notebooks", selection)
    env = environment_info(profile)
    (out_dir / "environment.json").write_text(json.dumps(env, indent=2))
    runs_path = out_dir / "runs.json"
    previous = {r["name"]: r for r in json.loads(runs_path.read_text())} if runs_path.exists() else {}
    runs = []
    for nb in notebooks:
        print(f"[report] {nb.stem} ({profile}) ...", flush=True)
        run = execute(nb, out_dir, profile, cell_timeout)
        run.machine, run.commit, run.date = machine_of(env), env.get("commit", ""), env.get("date", "")
        print(f"[report] {nb.stem}: {run.status} in {run.seconds:.1f} s" + (f"\n  {run.error.splitlines()[0]}" if run.error else ""), flush=True)
        if html and (out_dir / nb.name).exists():
            to_html(out_dir / nb.name)
        runs.append(run)
        previous[run.name] = asdict(run)
        # written after every notebook, so a run cut short still has its record
        runs_path.write_text(json.dumps([previous[k] for k in sorted(previous)], indent=2))
    if html:
        build_index(out_dir, profile)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cs336_systems.report.run", description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="auto", help="cpu, gpu or auto (gpu when CUDA is available)")
    p.add_argument("--notebooks", default="", help="comma list of notebook prefixes, e.g. 01,03 (default: all)")
    p.add_argument("--out", default=None, help="output folder (default: reports/<profile>)")
    p.add_argument("--cell-timeout", type=int, default=3600, help="seconds a single cell may run")
    p.add_argument("--no-html", action="store_true")
    p.add_argument("--notebook-dir", default=None, help="where the notebooks are (default: notebooks/)")
    p.add_argument("--index-only", action="store_true", help="only rebuild index.html and writeup.html of --out")
    args = p.parse_args(argv)
    missing = missing_report_packages(("nbconvert", "nbformat") if args.index_only else REPORT_PACKAGES)
    if missing:
        print(f"error: the report needs {', '.join(missing)}, which are not installed: pip install -e '.[report]' "
              "(make setup installs it)", file=sys.stderr)
        return 2
    if args.index_only:
        profile = args.profile if args.profile != "auto" else resolve_profile(None)
        build_index(Path(args.out or repo_root() / "reports" / profile), profile)
        return 0
    try:
        runs = run_report(args.profile, args.notebooks, args.out, args.cell_timeout, html=not args.no_html, notebook_dir=args.notebook_dir)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = [r for r in runs if r.status != "ok"]
    print(f"[report] {len(runs) - len(failed)} of {len(runs)} notebooks ran" + (f"; failed: {', '.join(r.name for r in failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
