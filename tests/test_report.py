"""The papermill runner: failures are reported, the other notebooks still render, exit status non-zero."""

import json

import nbformat
import pytest

from cs336_systems.report.run import discover, main

GOOD = [
    nbformat.v4.new_code_cell("profile = None", metadata={"tags": ["parameters"]}),
    nbformat.v4.new_code_cell("from cs336_systems.report import setup_notebook\nctx = setup_notebook('01_good', profile=profile)"),
    nbformat.v4.new_code_cell(
        "ctx.md(f'profile is {ctx.profile}')\nctx.headline('answer', 42)\nctx.not_run('a 2-GPU part', 'one GPU here')"
    ),
]
BAD = [
    nbformat.v4.new_code_cell("profile = None", metadata={"tags": ["parameters"]}),
    nbformat.v4.new_code_cell("raise ValueError('deliberate failure')"),
]


@pytest.fixture
def notebook_dir(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    for name, cells in (("01_good", GOOD), ("02_bad", BAD), ("03_good_too", GOOD)):
        nb = nbformat.v4.new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, d / f"{name}.ipynb")
    return d


@pytest.mark.slow
def test_a_failing_notebook_is_reported_and_the_others_render(notebook_dir, tmp_path):
    out = tmp_path / "report"
    status = main(["--profile", "cpu", "--notebook-dir", str(notebook_dir), "--out", str(out), "--cell-timeout", "120"])
    assert status == 1
    runs = {r["name"]: r for r in json.loads((out / "runs.json").read_text())}
    assert runs["01_good"]["status"] == "ok" and runs["03_good_too"]["status"] == "ok"
    assert runs["02_bad"]["status"] == "failed" and "deliberate failure" in runs["02_bad"]["error"]
    for name in runs:
        assert (out / f"{name}.html").exists()
    index = (out / "index.html").read_text()
    assert "deliberate failure" in index and "profile" in index
    writeup = (out / "writeup.html").read_text()
    assert "profile is cpu" in writeup and "one GPU here" in writeup and "answer" in writeup


def test_selection_of_notebooks(notebook_dir):
    assert [p.stem for p in discover(notebook_dir, "01,03")] == ["01_good", "03_good_too"]
    with pytest.raises(ValueError, match="no notebook matches 99"):
        discover(notebook_dir, "99")


def test_unknown_profile_is_a_clear_error(capsys):
    assert main(["--profile", "tpu"]) == 2
    assert "unknown profile 'tpu'" in capsys.readouterr().err


def _executed(name: str, text: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell("ctx.md('...')")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/markdown": text})]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name}"), cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def test_a_report_gathered_from_several_machines_names_each(tmp_path):
    """runs.json records machine, commit and date per notebook; the writeup and index show them, and caveats."""
    from cs336_systems.report.run import build_index

    runs = [
        dict(name="01_one", status="ok", seconds=3.0, machine="1 × GPU A", commit="aaa111", date="2026-01-01 10:00 UTC"),
        dict(name="02_two", status="ok", seconds=4.0, machine="2 × GPU B", commit="bbb222", date="2026-01-02 11:00 UTC"),
        dict(name="03_old", status="ok", seconds=5.0),  # a record from before machines were recorded
    ]
    for r in runs:
        nbformat.write(_executed(r["name"], f"result of {r['name']}"), tmp_path / f"{r['name']}.ipynb")
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    (tmp_path / "environment.json").write_text(json.dumps({"GPU": "2 × GPU B", "profile": "gpu"}))
    (tmp_path / "caveats.json").write_text(json.dumps([{"notebook": "01_one", "caveat": "ran before the fix of the leak"}]))
    (tmp_path / "results").mkdir()
    merged_later_first = [dict(notebook=n, key=f"number of {n}", value=1, unit="", note="") for n in ("02_two", "01_one", "02_two")]
    (tmp_path / "results" / "headlines.json").write_text(json.dumps(merged_later_first))
    build_index(tmp_path, "gpu")
    writeup = (tmp_path / "writeup.html").read_text()
    assert "ran on 2 machines" in writeup and "1 × GPU A" in writeup and "bbb222" in writeup
    assert "ran on 1 × GPU A, commit aaa111, 2026-01-01 10:00 UTC" in writeup
    assert "Known problems of these results" in writeup and "ran before the fix of the leak" in writeup
    assert "result of 03_old" in writeup
    assert writeup.index("number of 01_one") < writeup.index("number of 02_two")  # summary in notebook order
    index = (tmp_path / "index.html").read_text()
    assert "2 × GPU B · bbb222 · 2026-01-02 11:00 UTC" in index


def test_one_machine_and_no_caveats_add_no_tables(tmp_path):
    from cs336_systems.report.run import build_index

    nbformat.write(_executed("01_one", "x"), tmp_path / "01_one.ipynb")
    (tmp_path / "runs.json").write_text(json.dumps([dict(name="01_one", status="ok", seconds=1.0, machine="M", commit="c", date="d")]))
    (tmp_path / "environment.json").write_text(json.dumps({"CPU": "M", "profile": "cpu"}))
    build_index(tmp_path, "cpu")
    writeup = (tmp_path / "writeup.html").read_text()
    assert "Known problems" not in writeup and "machines (" not in writeup
