"""Headless regeneration: execute the notebooks with papermill, convert them to HTML, write an index.

    python -m cs336_systems.report.run --profile cpu --notebooks 01,03 --out reports/cpu

A notebook that fails is still converted (its error cell shows where), listed on the index with
the error, and the others still run; the exit status is non-zero when any failed, or when a notebook
that ran left a deliverable of the handouts' map (`report.deliverables`) without an answer.

What a report folder holds stays consistent however a run ends:

- Each notebook is executed into a hidden `.NN_name.<pid>.partial.ipynb` in the report folder and
  rendered beside it; only when its run has ended are they moved into place (os.replace). A run cut
  short (Ctrl-C, a kill, a timeout of the whole job) leaves the earlier `NN_name.ipynb`, `.html`
  and its runs.json record as they were.
- A run that ends with an error is a result: its executed notebook becomes `NN_name.ipynb`/`.html`,
  as its record in runs.json says. When the run before it was not a failure, that run's notebook
  and HTML move to `previous-ok/` and the record's `previous_ok` says where it ran (the index links
  it); a later ok run removes them.
- runs.json is re-read, merged and rewritten (atomically) under a lock on `runs.json.lock` after
  each notebook, so runners that share a report folder keep each other's records.
- A notebook writes its tables, figures and records into a hidden staging folder; when its run has
  ended they replace the report's (`merge_results`): every record of the notebook (headlines, not-run
  parts, answers) comes from its latest run, none is left from an older one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from cs336_systems.report.environment import environment_info, repo_root, resolve_profile
from cs336_systems.report.files import DamagedReportFile, locked, read_json, write_atomic


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
    previous_ok: str = ""  # a failed run's: where the earlier run kept in previous-ok/ ran


RUN_FIELDS = {f.name for f in fields(NotebookRun)}


def run_record(run: NotebookRun) -> dict:
    """The runs.json record of `run` (without an empty `previous_ok`)."""
    record = asdict(run)
    if not record["previous_ok"]:
        del record["previous_ok"]
    return record


def where_ran(record: dict) -> str:
    return " · ".join(record[k] for k in ("machine", "commit", "date") if record.get(k))


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
    if not notebook_dir.is_dir():
        raise ValueError(f"the notebook folder {notebook_dir} does not exist")
    all_nbs = sorted(p for p in notebook_dir.glob("[0-9][0-9]_*.ipynb"))
    if not all_nbs:
        raise ValueError(f"the notebook folder {notebook_dir} has no NN_name.ipynb notebooks")
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


def execute(notebook: Path, executed: Path, profile: str, cell_timeout: int) -> NotebookRun:
    """Run `notebook` with papermill, writing the executed notebook to `executed` as it goes."""
    import papermill as pm

    noise = PapermillNoise()
    start = time.perf_counter()
    try:
        noise.assigned = assigned_parameters(notebook)
        with papermill_log(noise):
            pm.execute_notebook(
                str(notebook),
                str(executed),
                parameters={"profile": profile},
                cwd=str(notebook.parent),
                kernel_name="python3",
                progress_bar=False,
                execution_timeout=cell_timeout,
                extra_arguments=KERNEL_ARGUMENTS,
            )
        status, error = "ok", ""
    except Exception as err:  # noqa: BLE001 - any failure is recorded and the next notebook runs
        status = "failed"
        error = f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', str(err))}".strip()
        if not executed.exists():
            error += "\n" + traceback.format_exc(limit=3)
    return NotebookRun(notebook.stem, status, time.perf_counter() - start, error[:2000])


def to_html(executed: Path, html_path: Path | None = None) -> Path:
    """`executed` as HTML, by default beside it with the suffix .html."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(executed, as_version=4)
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    html_path = html_path or executed.with_suffix(".html")
    html_path.write_text(body, encoding="utf-8")
    return html_path


RUNS_REMEDY = (
    "move it aside or delete it, then re-run the notebooks (each run adds its record) or rebuild "
    "the index with --index-only, which then lists only the notebooks re-run since"
)
ENVIRONMENT_REMEDY = (
    "move it aside or delete it: the next notebook run writes it again, and --index-only "
    "without it shows this machine's environment"
)


def read_runs(runs_path: Path) -> dict[str, dict]:
    """The records of runs.json by notebook name; {} when there is none."""
    if not runs_path.exists():
        return {}
    records = read_json(runs_path, RUNS_REMEDY)
    if not (isinstance(records, list) and all(isinstance(r, dict) and isinstance(r.get("name"), str) for r in records)):
        raise DamagedReportFile(f"{runs_path} is damaged (not a list of records with a name); {RUNS_REMEDY}")
    return {r["name"]: r for r in records}


def move(src: Path, dst: Path) -> None:
    """`src` to `dst`, or `dst` removed where there is no `src`."""
    if src.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    else:
        dst.unlink(missing_ok=True)


def commit_run(out_dir: Path, run: NotebookRun, executed: Path, rendered: Path | None) -> None:
    """Move a finished run's notebook (and HTML, unless `rendered` is None) into place and merge its
    record into runs.json, all under the folder's lock. See the module's docstring."""
    runs_path = out_dir / "runs.json"
    notebook, page = out_dir / f"{run.name}.ipynb", out_dir / f"{run.name}.html"
    kept = out_dir / "previous-ok"
    with locked(runs_path):
        runs = read_runs(runs_path)  # again: another runner may have added records since
        earlier = runs.get(run.name, {})
        if run.status == "ok":
            for p in (kept / notebook.name, kept / page.name):
                p.unlink(missing_ok=True)
        elif earlier.get("status") == "failed":
            run.previous_ok = earlier.get("previous_ok", "")
        elif notebook.exists():
            move(notebook, kept / notebook.name)
            move(page, kept / page.name)
            run.previous_ok = where_ran(earlier) or "an earlier run"
        move(executed, notebook)
        if rendered is not None:
            move(rendered, page)
        runs[run.name] = run_record(run)
        write_atomic(runs_path, json.dumps([runs[k] for k in sorted(runs)], indent=2))


# Files of results/ that gather every notebook's records, one list each; a run replaces its notebook's.
RECORD_FILES = ("headlines.json", "not_run.json", "answers.json")


def merge_results(staged: Path, results: Path, notebook: str) -> None:
    """A finished run's results (`staged`) into the report's: its tables and figures replace those of the
    same name, and its records replace every earlier record of `notebook` (none is left from an older run)."""
    for src in sorted(p for p in staged.rglob("*") if p.is_file()):
        if src.parent == staged and src.name in RECORD_FILES:
            continue
        move(src, results / src.relative_to(staged))
    for name in RECORD_FILES:
        target = results / name
        ours = read_json(staged / name, "it was written by this run") if (staged / name).exists() else []
        theirs = read_json(target, "move it aside or delete it and re-run the notebooks") if target.exists() else []
        merged = [r for r in theirs if r.get("notebook") != notebook] + ours
        if merged or target.exists():
            results.mkdir(parents=True, exist_ok=True)
            write_atomic(target, json.dumps(sorted(merged, key=lambda r: r.get("notebook", "")), indent=2, default=str))


def run_one(
    notebook: Path, out_dir: Path, profile: str, cell_timeout: int, html: bool, env: dict[str, str]
) -> NotebookRun:
    """Execute and render `notebook` into hidden files of `out_dir`, its results into a staging folder,
    then commit them; on any exception or interruption they are removed and the earlier results stay as
    they were."""
    executed = out_dir / f".{notebook.stem}.{os.getpid()}.partial.ipynb"
    rendered = executed.with_suffix(".html")
    staging = out_dir / f".{notebook.stem}.{os.getpid()}.staging"
    try:
        with environ(CS336_REPORT_DIR=str(staging)):
            run = execute(notebook, executed, profile, cell_timeout)
        run.machine, run.commit, run.date = machine_of(env), env.get("commit", ""), env.get("date", "")
        if html and executed.exists():
            to_html(executed, rendered)
        with locked(out_dir / "runs.json"):
            merge_results(staging / "results", out_dir / "results", notebook.stem)
        commit_run(out_dir, run, executed, rendered if html else None)
    finally:
        executed.unlink(missing_ok=True)
        rendered.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
    return run


def write_index(out_dir: Path, runs: list[NotebookRun], env: dict[str, str]) -> Path:
    import html

    env_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in env.items())
    nb_rows = []
    for r in runs:
        badge = "✅" if r.status == "ok" else "❌"
        err = f"<pre>{html.escape(r.error)}</pre>" if r.error else ""
        if r.previous_ok:
            err += f"<a href='previous-ok/{r.name}.html'>the earlier run</a> ({html.escape(r.previous_ok)})"
        where = html.escape(" · ".join(x for x in (r.machine, r.commit, r.date) if x))
        nb_rows.append(
            f"<tr><td>{badge}</td><td><a href='{r.name}.html'>{r.name}</a></td>"
            f"<td><a href='{r.name}.ipynb'>ipynb</a></td><td>{r.seconds:.1f} s</td><td>{where}</td><td>{err}</td></tr>"
        )
    writeups = [(h, f"writeup_{h}") for h in ("2026", "2025") if (out_dir / f"writeup_{h}.html").exists()]
    writeup = (
        (
            "<p>The writeups, every deliverable of a handout in its order, answer first: "
            + ", ".join(f"<a href='{name}.html'>spring {h}</a> (<a href='{name}.pdf'>pdf</a>)" for h, name in writeups)
            + ".</p>"
        )
        if writeups
        else ""
    )
    page = f"""<!doctype html><html><head>\
<meta charset="utf-8"><title>CS336 systems report ({env.get("profile")})</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto}}\
td,th{{padding:.2rem .6rem;text-align:left;vertical-align:top}}
pre{{white-space:pre-wrap;color:#a00;margin:0}}table{{border-collapse:collapse}}tr{{border-bottom:1px solid #ddd}}\
</style></head><body>
<h1>CS336 assignment 2 — systems report</h1>{writeup}
<h2>Environment of the latest run</h2><table>{env_rows}</table>
<h2>Notebooks</h2><table><tr><th></th><th>notebook</th><th></th><th>time</th><th>machine · commit · date</th>\
<th>error</th></tr>{"".join(nb_rows)}</table>
</body></html>"""
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def build_index(out_dir: Path, profile: str) -> None:
    """index.html and the writeups from the executed notebooks and runs.json of a report folder."""
    records = read_runs(out_dir / "runs.json").values()
    runs = [NotebookRun(**{k: v for k, v in r.items() if k in RUN_FIELDS}) for r in records]
    env_path = out_dir / "environment.json"  # the machine the notebooks ran on, not this one
    env = read_json(env_path, ENVIRONMENT_REMEDY) if env_path.exists() else environment_info(profile)
    from cs336_systems.report.writeup import build_writeup

    build_writeup(out_dir, env, runs=[run_record(r) for r in runs])
    write_index(out_dir, runs, env)


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """os.environ with `values` for the block (the kernels started in it inherit them), then as it was."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_report(
    profile: str | None,
    selection: str | None,
    out_dir: Path | None,
    cell_timeout: int = 3600,
    html: bool = True,
    notebook_dir: Path | None = None,
) -> list[NotebookRun]:
    profile = resolve_profile(profile)
    root = repo_root()
    notebooks = discover(Path(notebook_dir) if notebook_dir else root / "notebooks", selection)
    out_dir = Path(out_dir or root / "reports" / profile).resolve()
    read_runs(out_dir / "runs.json")  # a damaged file stops the run here, not after the first notebook
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment_info(profile)
    write_atomic(out_dir / "environment.json", json.dumps(env, indent=2))
    print(f"[report] {len(notebooks)} notebook(s), profile {profile}, into {out_dir}", flush=True)
    runs = []
    # for the kernels, which inherit them; progress bars would fill the executed notebooks
    with environ(
        CS336_REPORT_DIR=str(out_dir), CS336_PROFILE=profile, TQDM_DISABLE=os.environ.get("TQDM_DISABLE", "1")
    ):
        for i, nb in enumerate(notebooks, 1):
            print(f"[report] {nb.stem} ({profile}) ... [{i}/{len(notebooks)}]", flush=True)
            run = run_one(nb, out_dir, profile, cell_timeout, html, env)
            print(
                f"[report] {nb.stem}: {run.status} in {run.seconds:.1f} s"
                + (f"\n  {run.error.splitlines()[0]}" if run.error else ""),
                flush=True,
            )
            runs.append(run)
    if html:
        build_index(out_dir, profile)
    return runs


def unanswered(out_dir: Path, notebooks: set[str] | None = None) -> list[str]:
    """The deliverables (handout/problem.part) whose notebook ran to the end in `out_dir` (of `notebooks`, when
    given) but recorded no answer: a notebook that no longer answers what the map says it does."""
    from cs336_systems.report.writeup import coverage

    runs = list(read_runs(out_dir / "runs.json").values())
    gaps = [s for statuses in coverage(out_dir, runs).values() for s in statuses]
    return [
        s.deliverable.id + f" ({s.deliverable.notebook})"
        for s in gaps
        if notebooks is None or s.deliverable.notebook in notebooks
    ]


def report_unanswered(out_dir: Path, notebooks: set[str] | None = None) -> int:
    gaps = unanswered(out_dir, notebooks)
    if gaps:
        print(
            f"[report] error: {len(gaps)} deliverable(s) have no answer in the notebooks that ran: " + ", ".join(gaps),
            file=sys.stderr,
        )
    return 1 if gaps else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cs336_systems.report.run", description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="auto", help="cpu, gpu or auto (gpu when CUDA is available)")
    p.add_argument("--notebooks", default="", help="comma list of notebook prefixes, e.g. 01,03 (default: all)")
    p.add_argument("--out", default=None, help="output folder (default: reports/<profile>)")
    p.add_argument("--cell-timeout", type=int, default=3600, help="seconds a single cell may run")
    p.add_argument("--no-html", action="store_true")
    p.add_argument("--notebook-dir", default=None, help="where the notebooks are (default: notebooks/)")
    p.add_argument("--index-only", action="store_true", help="only rebuild index.html and the writeups of --out")
    args = p.parse_args(argv)
    missing = missing_report_packages(("nbconvert", "nbformat") if args.index_only else REPORT_PACKAGES)
    if missing:
        print(
            f"error: the report needs {', '.join(missing)}, which are not installed: pip install -e '.[report]' "
            "(make setup installs it)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.index_only:
            profile = args.profile if args.profile != "auto" else resolve_profile(None)
            out_dir = Path(args.out or repo_root() / "reports" / profile)
            build_index(out_dir, profile)
            return report_unanswered(out_dir)
        runs = run_report(
            args.profile,
            args.notebooks,
            args.out,
            args.cell_timeout,
            html=not args.no_html,
            notebook_dir=args.notebook_dir,
        )
        out_dir = Path(args.out or repo_root() / "reports" / resolve_profile(args.profile))
        gaps = report_unanswered(out_dir, {r.name for r in runs if r.status == "ok"})
    except ValueError as err:  # a bad argument or a damaged report file
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "[report] interrupted: the notebook that was running keeps its earlier results; "
            "--index-only rebuilds the index with the ones that finished",
            file=sys.stderr,
        )
        return 130
    failed = [r for r in runs if r.status != "ok"]
    print(
        f"[report] {len(runs) - len(failed)} of {len(runs)} notebooks ran"
        + (f"; failed: {', '.join(r.name for r in failed)}" if failed else "")
    )
    return 1 if failed or gaps else 0


if __name__ == "__main__":
    sys.exit(main())
