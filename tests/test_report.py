"""The papermill runner: failures are reported, the other notebooks still render, exit status non-zero."""

import json

import nbformat
import pytest

from cs336_systems.report.run import discover, main

GOOD = [
    nbformat.v4.new_code_cell("profile = None", metadata={"tags": ["parameters"]}),
    nbformat.v4.new_code_cell(
        "from cs336_systems.report import setup_notebook\nctx = setup_notebook('01_good', profile=profile)"
    ),
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
    for handout in ("2025", "2026"):
        assert "profile" in (out / f"writeup_{handout}.html").read_text()
    assert "writeup_2026.html" in index and "writeup_2025.html" in index


@pytest.mark.slow
def test_a_notebook_that_leaves_its_deliverables_unanswered_fails_the_report(tmp_path, capsys):
    """A notebook the map says answers communication_accounting ran to the end and recorded nothing."""
    d = tmp_path / "notebooks"
    d.mkdir()
    nb = nbformat.v4.new_notebook(cells=GOOD)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, d / "18_communication_accounting.ipynb")
    status = main(["--profile", "cpu", "--notebook-dir", str(d), "--out", str(tmp_path / "report")])
    assert status == 1
    err = capsys.readouterr().err
    assert "have no answer" in err and "2025/communication_accounting.a (18_communication_accounting)" in err
    page = (tmp_path / "report" / "writeup_2025.html").read_text()
    assert "no answer recorded by 18_communication_accounting" in page


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
        dict(
            name="01_one", status="ok", seconds=3.0, machine="1 × GPU A", commit="aaa111", date="2026-01-01 10:00 UTC"
        ),
        dict(
            name="02_two", status="ok", seconds=4.0, machine="2 × GPU B", commit="bbb222", date="2026-01-02 11:00 UTC"
        ),
        dict(name="03_old", status="ok", seconds=5.0),  # a record from before machines were recorded
    ]
    for r in runs:
        nbformat.write(_executed(r["name"], f"result of {r['name']}"), tmp_path / f"{r['name']}.ipynb")
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    (tmp_path / "environment.json").write_text(json.dumps({"GPU": "2 × GPU B", "profile": "gpu"}))
    (tmp_path / "caveats.json").write_text(
        json.dumps([{"notebook": "01_one", "caveat": "ran before the fix of the leak"}])
    )
    (tmp_path / "results").mkdir()
    merged_later_first = [
        dict(notebook=n, key=f"number of {n}", value=1, unit="", note="") for n in ("02_two", "01_one", "02_two")
    ]
    (tmp_path / "results" / "headlines.json").write_text(json.dumps(merged_later_first))
    build_index(tmp_path, "gpu")
    writeup = (tmp_path / "writeup_2026.html").read_text()
    assert "1 × GPU A" in writeup and "aaa111" in writeup and "bbb222" in writeup and "2026-01-01 10:00 UTC" in writeup
    assert "Known problems of these results" in writeup and "ran before the fix of the leak" in writeup
    summary = (tmp_path / "README.md").read_text()
    assert summary.index("number of 01_one") < summary.index("number of 02_two")  # in notebook order
    index = (tmp_path / "index.html").read_text()
    assert "2 × GPU B · bbb222 · 2026-01-02 11:00 UTC" in index


def test_one_machine_and_no_caveats_add_no_tables(tmp_path):
    from cs336_systems.report.run import build_index

    nbformat.write(_executed("01_one", "x"), tmp_path / "01_one.ipynb")
    (tmp_path / "runs.json").write_text(
        json.dumps([dict(name="01_one", status="ok", seconds=1.0, machine="M", commit="c", date="d")])
    )
    (tmp_path / "environment.json").write_text(json.dumps({"CPU": "M", "profile": "cpu"}))
    build_index(tmp_path, "cpu")
    writeup = (tmp_path / "writeup_2026.html").read_text()
    assert "Known problems" not in writeup


def test_the_runner_prints_its_progress_without_papermill_and_kernel_noise(tmp_path, capfd, caplog):
    """A `=` in a parameters cell's comment made papermill warn "Unable to parse line" (and then
    "Passed unknown parameter: profile"), and every kernel start warned about TCP: none of it actionable."""
    d = tmp_path / "notebooks"
    d.mkdir()
    params = 'profile = None  # "cpu" or "gpu", None means gpu = CUDA available\nsteps = 3  # steps = timed steps'
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]}),
            nbformat.v4.new_code_cell("print(profile, steps)"),
        ]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, d / "01_tiny.ipynb")
    status = main(
        [
            "--profile",
            "cpu",
            "--notebook-dir",
            str(d),
            "--out",
            str(tmp_path / "out"),
            "--no-html",
            "--cell-timeout",
            "120",
        ]
    )
    out, err = capfd.readouterr()
    err += caplog.text  # under pytest, records that reach the root logger are captured there, not on stderr
    assert status == 0, out + err
    assert "[report] 01_tiny (cpu) ..." in out and "[report] 01_tiny: ok in" in out and "1 of 1 notebooks ran" in out
    for noise in ("Unable to parse line", "Passed unknown parameter", "Kernel is running over TCP"):
        assert noise not in out + err, noise
    executed = nbformat.read(tmp_path / "out" / "01_tiny.ipynb", as_version=4)
    assert executed.cells[-1].outputs[0]["text"] == "cpu 3\n"


def test_papermill_warnings_that_matter_still_show():
    import logging

    from cs336_systems.report.run import PapermillNoise

    noise = PapermillNoise()
    noise.assigned = {"profile"}

    def passes(message: str) -> bool:
        return noise.filter(logging.LogRecord("papermill", logging.WARNING, __file__, 1, message, None, None))

    assert not passes("Unable to parse line 1 'profile = None  # a = b'.")
    assert not passes("Passed unknown parameter: profile")
    assert passes("Passed unknown parameter: profil")  # a parameter the notebook does not have
    assert passes("Black encountered an error, skipping formatting")


def test_the_parameters_a_notebook_assigns(tmp_path):
    from cs336_systems.report.run import assigned_parameters

    cells = [
        nbformat.v4.new_code_cell(
            "x = 1  # not y = 2\n# z = 3\nsizes: list | None = None\nitems = [\n  1,\n]",
            metadata={"tags": ["parameters"]},
        ),
        nbformat.v4.new_code_cell("w = 4"),
    ]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), tmp_path / "nb.ipynb")
    assert assigned_parameters(tmp_path / "nb.ipynb") == {"x", "sizes", "items"}


def test_discover_takes_the_notebooks_not_their_paired_scripts(notebook_dir):
    (notebook_dir / "01_good.py").write_text('# %% tags=["parameters"]\nprofile = None\n')
    (notebook_dir / "04_script_only.py").write_text("# %%\nprint(1)\n")
    (notebook_dir / "jupytext.toml").write_text('formats = "ipynb,py:percent"\n')
    assert [p.name for p in discover(notebook_dir, None)] == ["01_good.ipynb", "02_bad.ipynb", "03_good_too.ipynb"]
    assert [p.name for p in discover(notebook_dir, "01")] == ["01_good.ipynb"]
