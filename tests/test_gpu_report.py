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
