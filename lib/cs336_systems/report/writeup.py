"""The writeup: every executed notebook of a report folder, in assignment order, as one document.

A title page (hardware, software, profile, commit, date), the headline numbers the notebooks
recorded with `ctx.headline`, the deliverables that could not run here (`ctx.not_run`), the known
problems of committed results (`caveats.json` beside the notebooks, kept by hand), then each
problem's prose, tables and figures with the code hidden, each section linking to its notebook.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

PRINT_CSS = """
<style>
@page { size: A4; margin: 14mm 12mm; }
body { max-width: 60rem; margin: 0 auto; }
.jp-OutputArea-output img, img { max-width: 100% !important; height: auto; page-break-inside: avoid; break-inside: avoid; }
.jp-RenderedHTMLCommon table, table { font-size: 0.72em; max-width: 100%; table-layout: auto; }
.jp-RenderedHTMLCommon td, .jp-RenderedHTMLCommon th, td, th { white-space: normal !important; overflow-wrap: break-word; padding: 2px 4px !important; }
.jp-RenderedHTMLCommon pre, pre { white-space: pre-wrap; word-break: break-word; }
h1.writeup-section { page-break-before: always; break-before: page; }
.writeup-title { page-break-after: always; break-after: page; }
/* JupyterLab scrolls wide outputs sideways; on paper a scroll box cuts them at the page edge */
@media print { * { overflow: visible !important; } .jp-Cell { break-inside: auto; } .jp-OutputArea-output { break-inside: avoid; } }
</style>
"""


def _load_json(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def _markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    if not rows:
        return "_none_\n"
    head = "| " + " | ".join(title for _, title in columns) + " |\n|" + "---|" * len(columns) + "\n"
    body = "".join("| " + " | ".join(_fmt(r.get(key, "")) for key, _ in columns) + " |\n" for r in rows)
    return head + body


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v).replace("|", "\\|")


def title_cells(
    env: dict[str, str], headlines: list[dict], not_run: list[dict], sections: list[str], runs: list[dict] = (),
    caveats: list[dict] = (),
) -> list:
    env_table = "\n".join(f"| {k} | {v} |" for k, v in env.items())
    machines = sorted({r["machine"] for r in runs if r.get("machine")})
    title = (
        "<div class='writeup-title'>\n\n"
        f"# CS336 Assignment 2 — Systems and Parallelism: report ({env.get('profile', '?')} profile)\n\n"
        "Regenerated from measurements on the machine below by `make report`.\n\n"
        f"| environment | |\n|---|---|\n{env_table}\n\n"
        + (f"The notebooks of this report ran on {len(machines)} machines ({'; '.join(machines)}): the table "
           "below names the machine, commit and date of each; the environment above is the latest run's.\n\n"
           + _markdown_table(runs, [("name", "notebook"), ("machine", "machine"), ("commit", "commit"),
                                     ("date", "date"), ("seconds", "seconds")])
           if len(machines) > 1 else "")
        + "</div>"
    )
    summary = "## Summary of headline numbers\n\n" + _markdown_table(
        headlines, [("notebook", "problem"), ("key", "quantity"), ("value", "value"), ("unit", "unit"), ("note", "note")]
    )
    missing = "## Not run on this machine\n\n" + _markdown_table(
        not_run, [("notebook", "problem"), ("key", "deliverable"), ("reason", "reason")]
    )
    known = ("## Known problems of these results\n\n" + _markdown_table(
        list(caveats), [("notebook", "problem"), ("caveat", "what is wrong or stale, and what fixes it")]
    )) if caveats else ""
    contents = "## Contents\n\n" + "\n".join(f"1. [{s}](#{s})" for s in sections)
    return [nbformat.v4.new_markdown_cell(t) for t in (title, summary, missing, known, contents) if t]


def _is_setup_cell(cell) -> bool:
    return cell.cell_type == "code" and "setup_notebook(" in cell.source


def build_writeup(report_dir: Path, env: dict[str, str], runs: list[dict] = ()) -> Path:
    report_dir = Path(report_dir)
    executed = sorted(p for p in report_dir.glob("[0-9][0-9]_*.ipynb"))
    results = report_dir / "results"
    # in the order of the assignment (stable within a notebook), however the runs were merged
    headlines = sorted(_load_json(results / "headlines.json"), key=lambda h: h["notebook"])
    not_run = sorted(_load_json(results / "not_run.json"), key=lambda h: h["notebook"])
    # Written by a maintainer, not by a notebook: what is known to be wrong or stale in committed results.
    caveats = _load_json(report_dir / "caveats.json")
    doc = nbformat.v4.new_notebook()
    doc.cells.extend(title_cells(env, headlines, not_run, [p.stem for p in executed], list(runs), caveats))
    run_of = {r["name"]: r for r in runs}
    for path in executed:
        nb = nbformat.read(path, as_version=4)
        run = run_of.get(path.stem, {})
        where = ", ".join(x for x in (run.get("machine"), f"commit {run['commit']}" if run.get("commit") else "",
                                      run.get("date")) if x)
        doc.cells.append(nbformat.v4.new_markdown_cell(
            f"<h1 class='writeup-section' id='{path.stem}'>{path.stem}</h1>\n\n"
            f"From the executed notebook [{path.name}]({path.stem}.html) (code hidden here)"
            + (f"; ran on {where}." if where else ".")
        ))
        for cell in nb.cells:
            tags = cell.get("metadata", {}).get("tags", [])
            if "parameters" in tags or "injected-parameters" in tags or _is_setup_cell(cell):
                continue
            if cell.cell_type == "code":
                # stderr (warnings, progress bars) stays in the notebook; the writeup keeps results
                cell.outputs = [o for o in cell.get("outputs", []) if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
                if not cell.outputs:
                    continue
            doc.cells.append(cell)
    for i, cell in enumerate(doc.cells):  # ids must be unique in the merged document
        cell["id"] = f"w{i:04d}"
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(doc)
    body = body.replace("</head>", PRINT_CSS + "</head>", 1)
    out = report_dir / "writeup.html"
    out.write_text(body, encoding="utf-8")
    write_summary(report_dir, env, headlines, not_run, caveats, list(runs))
    return out


def write_summary(report_dir: Path, env: dict[str, str], headlines: list[dict], not_run: list[dict],
                  caveats: list[dict], runs: list[dict]) -> Path:
    """README.md of a report folder: where each notebook ran and the headline numbers, from the run's data.

    What the project README points to for results, so no measured number is typed by hand."""
    lines = [
        f"# Results of the `{env.get('profile', '?')}` report",
        "",
        "Generated by `python -m cs336_systems.report.run` from this folder's `runs.json` and "
        "`results/headlines.json`; the full answers are in [writeup.html](writeup.html) "
        "([writeup.pdf](writeup.pdf)) and each notebook's own HTML.",
        "",
        "## Where each notebook ran",
        "",
        _markdown_table([dict(r, notebook=f"[{r['name']}]({r['name']}.html)") for r in runs],
                        [("notebook", "notebook"), ("status", "status"), ("machine", "machine"),
                         ("commit", "commit"), ("date", "date")]),
        "## Headline numbers",
        "",
        _markdown_table(headlines, [("notebook", "problem"), ("key", "quantity"), ("value", "value"),
                                    ("unit", "unit"), ("note", "note")]),
        "## Not run on the machine of the run",
        "",
        _markdown_table(not_run, [("notebook", "problem"), *[(k, k) for k in sorted({k for r in not_run for k in r} - {"notebook"})]]),
        "## Known problems",
        "",
        _markdown_table(caveats, [("notebook", "notebook"), ("caveat", "caveat")]),
    ]
    out = Path(report_dir) / "README.md"
    out.write_text("\n".join(lines), encoding="utf-8")
    return out
