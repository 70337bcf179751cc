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
