"""The committed GPU report: no error outputs, every notebook's machine named, every gap explained."""

import json
from pathlib import Path

import nbformat
import pytest

REPORT = Path(__file__).resolve().parents[1] / "reports" / "gpu"
NOTEBOOKS = sorted(p.stem for p in (REPORT.parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXECUTED = sorted(p.stem for p in REPORT.glob("[0-9][0-9]_*.ipynb"))

pytestmark = pytest.mark.skipif(not REPORT.is_dir(), reason="no committed GPU report")


@pytest.mark.parametrize("name", EXECUTED)
def test_executed_notebook_has_no_error_output(name):
    nb = nbformat.read(REPORT / f"{name}.ipynb", as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    assert (REPORT / f"{name}.html").is_file()


def test_every_run_names_its_machine_commit_and_date():
    runs = {r["name"]: r for r in json.loads((REPORT / "runs.json").read_text())}
    assert set(EXECUTED) <= set(runs)
    for name in EXECUTED:
        assert runs[name]["status"] == "ok"
        assert all(runs[name].get(k) for k in ("machine", "commit", "date")), f"{name}: {runs[name]}"


def test_every_notebook_ran_or_its_absence_is_explained():
    caveats = json.loads((REPORT / "caveats.json").read_text()) if (REPORT / "caveats.json").exists() else []
    explained = {c["notebook"] for c in caveats}
    missing = [n for n in NOTEBOOKS if n not in EXECUTED and n not in explained]
    assert not missing, f"notebooks with neither a GPU run nor a caveat saying why: {missing}"


def _runs():
    return json.loads((REPORT / "runs.json").read_text())


@pytest.mark.parametrize("handout", ["2025", "2026"])
def test_every_deliverable_of_the_handout_has_an_answer_or_its_reason(handout):
    from cs336_systems.report.writeup import deliverable_status

    statuses = deliverable_status(REPORT, _runs(), handout)
    unrecorded = [s.deliverable.id for s in statuses if s.record is None]
    assert not unrecorded, f"deliverables with neither an answer nor a reason in the committed report: {unrecorded}"


@pytest.mark.parametrize("handout", ["2025", "2026"])
def test_the_committed_writeup_speaks_to_a_grader(handout):
    from cs336_systems.report.writeup import jargon, writeup_text

    page = REPORT / f"writeup_{handout}.html"
    assert page.exists(), "rebuild with python -m cs336_systems.report.run --profile gpu --index-only"
    found = jargon(writeup_text(page.read_text()))
    assert not found, found


@pytest.mark.parametrize("handout", ["2025", "2026"])
def test_the_committed_writeup_pdf_is_at_most_45_pages(handout):
    import re

    pdf = REPORT / f"writeup_{handout}.pdf"
    assert pdf.exists(), "print it with python -m cs336_systems.report.pdf --profile gpu"
    pages = len(re.findall(rb"/Type\s*/Page(?![s\w])", pdf.read_bytes()))
    assert 1 <= pages <= 45, f"{pdf.name} has {pages} pages"


def test_the_committed_answers_are_what_the_builders_make_of_the_committed_tables():
    """The answers in the report are generated from its tables: rebuilding them changes no text."""
    from cs336_systems.experiments.answers import Results, build
    from cs336_systems.report.answers import load_answers

    results = Results(REPORT / "results")
    stale = [
        key
        for key, record in load_answers(REPORT / "results").items()
        if (lambda a: (a.text, a.reason))(build(key, results)) != (record["text"], record["reason"])
    ]
    assert not stale, (
        f"answers that differ from their builders' (run python -m cs336_systems.experiments.answers "
        f"reports/gpu): {stale}"
    )
