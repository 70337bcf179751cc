"""Smoke run of every notebook in the cpu profile, through the same runner as `make report`, and the words a
reader meets in the notebooks' Markdown.

The smoke run executes the notebooks whose tests were selected (`pytest -k "13 or 17"` runs those two); a
selected test that needs every notebook (the writeups) runs them all."""

import json
from pathlib import Path

import nbformat
import pytest

from cs336_systems.report.run import run_report
from cs336_systems.report.writeup import jargon

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _selected_notebooks(items) -> str | None:
    """The notebooks the selected tests of `cpu_report` name (a comma list for the runner); None: all of them."""
    users = [item for item in items if "cpu_report" in getattr(item, "fixturenames", ())]
    names = [item.callspec.params.get("name") if hasattr(item, "callspec") else None for item in users]
    return ",".join(sorted(set(names))) if users and all(names) else None


@pytest.fixture(scope="session")
def cpu_report(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("report_cpu")
    runs = run_report("cpu", _selected_notebooks(request.session.items), out, cell_timeout=600)
    return out, {r.name: r for r in runs}


def _reader_jargon(text: str) -> list[str]:
    """`jargon` for a notebook: Jupyter renders LaTeX, which a writeup cannot."""
    return [j for j in jargon(text) if not j.startswith("unrendered LaTeX")]


def test_notebook_markdown_speaks_to_a_reader():
    found = {}
    for name in NOTEBOOKS:
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        words = [j for c in nb.cells if c.cell_type == "markdown" for j in _reader_jargon(c.source)]
        if words:
            found[name] = words
    assert not found, found


def test_notebooks_are_stored_without_outputs_and_with_one_parameters_cell():
    for name in NOTEBOOKS:
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), name
        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1 and "profile = None" in tagged[0].source, name


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_the_cpu_profile(cpu_report, name):
    out, runs = cpu_report
    assert runs[name].status == "ok", runs[name].error
    nb = nbformat.read(out / f"{name}.ipynb", as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert (out / f"{name}.html").stat().st_size > 10_000
    # the prose the notebook generated from its data, the environment table (versions, commit) aside
    shown = [o.get("data", {}).get("text/markdown", "") for c in nb.cells for o in c.get("outputs", [])]
    found = [j for text in shown if not text.startswith("| environment |") for j in _reader_jargon(text)]
    assert not found, found


@pytest.mark.slow
def test_both_writeups_answer_every_deliverable_without_jargon(cpu_report):
    from cs336_systems.report.writeup import HANDOUTS, coverage, deliverable_status, jargon, writeup_text

    out, runs = cpu_report
    records = [dict(name=r.name, status=r.status) for r in runs.values()]
    assert coverage(out, records) == {h: [] for h in HANDOUTS}
    for handout in HANDOUTS:
        assert all(s.record is not None for s in deliverable_status(out, records, handout))
        page = (out / f"writeup_{handout}.html").read_text()
        assert jargon(writeup_text(page)) == []
    headlines = json.loads((out / "results" / "headlines.json").read_text())
    assert {h["notebook"] for h in headlines} >= {"01_benchmarking_script", "03_mixed_precision_accumulation"}
