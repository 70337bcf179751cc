"""What the report runner leaves in a report folder when a run is interrupted, fails, shares the folder
with another runner or meets damaged files; where a notebook run by hand writes. papermill is
replaced by a stand-in that writes the executed notebook, so no kernel starts."""

import json

import nbformat
import pandas as pd
import papermill
import pytest

from cs336_systems.report import run as runner
from cs336_systems.report.run import main, run_report


def _notebooks(folder, *names):
    folder.mkdir(exist_ok=True)
    for name in names:
        nb = nbformat.v4.new_notebook(
            cells=[
                nbformat.v4.new_code_cell("profile = None", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("print('result')"),
            ]
        )
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, folder / f"{name}.ipynb")
    return folder


class Papermill:
    """Stands in for papermill.execute_notebook: writes the notebook with `text` as its last cell's
    output, then runs `then` (which may raise, as papermill does for a cell's error or a Ctrl-C)."""

    def __init__(self, monkeypatch, text="result", then=None):
        self.text, self.then = text, then
        monkeypatch.setattr(papermill, "execute_notebook", self)

    def __call__(self, input_path, output_path, **kwargs):
        nb = nbformat.read(input_path, as_version=4)
        nb.cells[-1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=self.text)]
        nbformat.write(nb, output_path)
        if self.then:
            self.then()


@pytest.fixture
def report(tmp_path, monkeypatch):
    """A notebook folder with 01_one and 02_two, and an empty report folder; the runner's index is
    left out (it renders the writeup, not what these tests are about)."""
    monkeypatch.setattr(runner, "build_index", lambda out_dir, profile: None)
    for var in ("CS336_REPORT_DIR", "CS336_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    return _notebooks(tmp_path / "notebooks", "01_one", "02_two"), tmp_path / "report"


def _raise(err):
    def then():
        raise err

    return then


def _runs(out):
    return {r["name"]: r for r in json.loads((out / "runs.json").read_text())}


def test_an_interrupted_rerun_leaves_the_earlier_results_as_they_were(report, monkeypatch):
    notebooks, out = report
    Papermill(monkeypatch, "earlier result")
    run_report("cpu", "01", out, html=True, notebook_dir=notebooks)
    before = {p: (out / p).read_bytes() for p in ("01_one.ipynb", "01_one.html", "runs.json")}
    assert b"earlier result" in before["01_one.ipynb"] and _runs(out)["01_one"]["status"] == "ok"

    Papermill(monkeypatch, "half a run", then=_raise(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_report("cpu", "01", out, html=True, notebook_dir=notebooks)
    assert {p: (out / p).read_bytes() for p in before} == before
    assert not [p.name for p in out.iterdir() if "partial" in p.name or p.name.endswith(".tmp")]


def test_main_reports_an_interruption_and_exits_130(report, monkeypatch, capsys):
    notebooks, out = report
    Papermill(monkeypatch, then=_raise(KeyboardInterrupt()))
    try:
        status = main(["--profile", "cpu", "--notebook-dir", str(notebooks), "--out", str(out), "--no-html"])
    except KeyboardInterrupt:  # would end the whole test session
        pytest.fail("main let the KeyboardInterrupt through")
    assert status == 130
    assert "interrupted" in capsys.readouterr().err


def test_a_failed_rerun_is_shown_and_the_earlier_ok_run_is_kept_aside(report, monkeypatch):
    notebooks, out = report
    Papermill(monkeypatch, "the good result")
    run_report("cpu", "01", out, html=True, notebook_dir=notebooks)
    good = {p: (out / p).read_bytes() for p in ("01_one.ipynb", "01_one.html")}
    first = _runs(out)["01_one"]

    failure = ValueError("deliberate failure")
    Papermill(monkeypatch, "the error cell", then=_raise(failure))
    run_report("cpu", "01", out, html=True, notebook_dir=notebooks)
    record = _runs(out)["01_one"]
    assert record["status"] == "failed" and "deliberate failure" in record["error"]
    assert record["previous_ok"] == " · ".join(first[k] for k in ("machine", "commit", "date"))
    assert (
        b"the error cell" in (out / "01_one.ipynb").read_bytes()
        and b"the error cell" in (out / "01_one.html").read_bytes()
    )
    assert {p: (out / "previous-ok" / p).read_bytes() for p in good} == good

    run_report("cpu", "01", out, html=True, notebook_dir=notebooks)  # fails again: the good run stays aside
    assert _runs(out)["01_one"]["previous_ok"] == record["previous_ok"]
    assert {p: (out / "previous-ok" / p).read_bytes() for p in good} == good

    Papermill(monkeypatch, "fixed")
    run_report("cpu", "01", out, html=True, notebook_dir=notebooks)
    assert "previous_ok" not in _runs(out)["01_one"] and not list((out / "previous-ok").iterdir())


def test_the_index_links_the_run_kept_aside(tmp_path):
    from cs336_systems.report.run import NotebookRun, write_index

    runs = [NotebookRun("01_one", "failed", 1.0, "ValueError: x", previous_ok="M · c · d")]
    page = write_index(tmp_path, runs, {"profile": "cpu"}).read_text()
    assert "href='previous-ok/01_one.html'" in page and "M · c · d" in page


def test_runners_sharing_a_folder_keep_each_others_records(report, monkeypatch):
    """The first runner read runs.json before the second wrote its record; it must not drop it."""
    notebooks, out = report

    def second_runner():
        Papermill(monkeypatch, "by the second runner")
        run_report("cpu", "02", out, html=False, notebook_dir=notebooks)

    Papermill(monkeypatch, "by the first runner", then=second_runner)
    run_report("cpu", "01", out, html=False, notebook_dir=notebooks)
    assert set(_runs(out)) == {"01_one", "02_two"}
    assert b"by the first runner" in (out / "01_one.ipynb").read_bytes()
    assert b"by the second runner" in (out / "02_two.ipynb").read_bytes()


@pytest.mark.parametrize("text", ['[{"name": "01_one", "status": "o', '{"name": "01_one"}', "\xff\xfe"])
def test_a_damaged_runs_json_is_an_error_that_names_it(tmp_path, monkeypatch, capsys, text):
    notebooks, out = _notebooks(tmp_path / "notebooks", "01_one"), tmp_path / "report"
    out.mkdir()
    (out / "runs.json").write_bytes(text.encode("latin-1"))
    Papermill(monkeypatch)
    assert main(["--profile", "cpu", "--notebook-dir", str(notebooks), "--out", str(out), "--no-html"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{out / 'runs.json'} is damaged" in err and "move it aside" in err
    assert not (out / "01_one.ipynb").exists()  # stopped before running anything
    assert main(["--profile", "cpu", "--out", str(out), "--index-only"]) == 2
    assert f"{out / 'runs.json'} is damaged" in capsys.readouterr().err


def test_a_damaged_environment_json_is_an_error_that_names_it(tmp_path, capsys):
    (tmp_path / "runs.json").write_text("[]")
    (tmp_path / "environment.json").write_text('{"GPU": "1 × ')
    assert main(["--profile", "cpu", "--out", str(tmp_path), "--index-only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{tmp_path / 'environment.json'} is damaged" in err


@pytest.mark.parametrize("content", [None, [], ["notes.ipynb", "01_one.py"]])
def test_a_notebook_folder_without_notebooks_is_an_error(tmp_path, capsys, content):
    """None: the folder does not exist; else it holds these files, none of them an NN_name.ipynb."""
    folder = tmp_path / "notebooks"
    if content is not None:
        folder.mkdir()
        for name in content:
            (folder / name).write_text("{}")
    assert main(["--profile", "cpu", "--notebook-dir", str(folder), "--out", str(tmp_path / "out"), "--no-html"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the notebook folder ") and str(folder) in err
    assert not (tmp_path / "out").exists()


def test_the_runner_counts_the_notebooks_and_restores_the_environment(report, monkeypatch, capsys):
    notebooks, out = report
    Papermill(monkeypatch)
    run_report("cpu", None, out, html=False, notebook_dir=notebooks)
    printed = capsys.readouterr().out
    assert "[report] 01_one (cpu) ... [1/2]" in printed and "[report] 02_two (cpu) ... [2/2]" in printed
    import os

    assert "CS336_REPORT_DIR" not in os.environ and "CS336_PROFILE" not in os.environ


def test_a_notebook_run_by_hand_writes_to_the_scratch_folder(tmp_path, monkeypatch):
    from cs336_systems.report import notebook

    monkeypatch.delenv("CS336_REPORT_DIR", raising=False)
    monkeypatch.setattr(notebook, "repo_root", lambda: tmp_path)
    shown = []
    monkeypatch.setattr(notebook, "_display", shown.append)
    ctx = notebook.setup_notebook("01_one", profile="cpu")
    ctx.save_table(pd.DataFrame({"x": [1]}), "table", show=False)
    scratch = tmp_path / "reports" / "_scratch" / "cpu" / "results"
    assert (scratch / "table.csv").exists() and not (tmp_path / "reports" / "cpu").exists()
    assert any(str(scratch) in getattr(obj, "data", "") for obj in shown)

    monkeypatch.setenv("CS336_REPORT_DIR", str(tmp_path / "report"))  # as the runner sets it
    shown.clear()
    notebook.setup_notebook("01_one", profile="cpu").save_table(pd.DataFrame({"x": [1]}), "table", show=False)
    assert (tmp_path / "report" / "results" / "table.csv").exists()
    assert not any("_scratch" in getattr(obj, "data", "") for obj in shown)


class WritingResults(Papermill):
    """A stand-in whose notebook also writes results through the folder the runner gives it: a table and
    one headline per key of `keys`, as `setup_notebook` + `ctx.save_table` + `ctx.headline` would."""

    def __init__(self, monkeypatch, keys, value=1, then=None):
        super().__init__(monkeypatch, then=then)
        self.keys, self.value = keys, value

    def __call__(self, input_path, output_path, **kwargs):
        from pathlib import Path

        from cs336_systems.report import setup_notebook

        ctx = setup_notebook(Path(input_path).stem, profile="cpu", show_env=False)
        ctx.save_table(pd.DataFrame({"value": [self.value]}), "table", show=False)
        for key in self.keys:
            ctx.headline(key, self.value)
        super().__call__(input_path, output_path, **kwargs)


def _headlines(out):
    return {(h["notebook"], h["key"]): h["value"] for h in json.loads((out / "results" / "headlines.json").read_text())}


def test_a_rerun_replaces_its_notebooks_records_and_keeps_the_others(report, monkeypatch):
    notebooks, out = report
    WritingResults(monkeypatch, ["a", "b"], value=1)
    run_report("cpu", "01,02", out, html=False, notebook_dir=notebooks)
    WritingResults(monkeypatch, ["a"], value=2)
    run_report("cpu", "01", out, html=False, notebook_dir=notebooks)
    # 01's key "b" is gone with the run that wrote it; 02's records stay
    assert _headlines(out) == {("01_one", "a"): 2, ("02_two", "a"): 1, ("02_two", "b"): 1}
    assert pd.read_csv(out / "results" / "table.csv").value.tolist() == [2]
    assert not [p.name for p in out.iterdir() if "staging" in p.name]


def test_an_interrupted_run_leaves_the_results_and_records_as_they_were(report, monkeypatch):
    notebooks, out = report
    WritingResults(monkeypatch, ["a"], value=1)
    run_report("cpu", "01", out, html=False, notebook_dir=notebooks)
    before = {p.name: p.read_bytes() for p in (out / "results").iterdir() if p.is_file()}
    WritingResults(monkeypatch, ["a", "c"], value=5, then=_raise(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_report("cpu", "01", out, html=False, notebook_dir=notebooks)
    assert {p.name: p.read_bytes() for p in (out / "results").iterdir() if p.is_file()} == before
    assert not [p.name for p in out.iterdir() if "staging" in p.name]
