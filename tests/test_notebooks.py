"""Smoke run of every notebook in the cpu profile, through the same runner as `make report`."""

import json
from pathlib import Path

import nbformat
import pytest

from cs336_systems.report.run import run_report

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="session")
def cpu_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report_cpu")
    runs = run_report("cpu", None, out, cell_timeout=600)
    return out, {r.name: r for r in runs}


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
