"""The two writeups: every deliverable of a handout in order, answer first, gaps in place, no jargon."""

import json

import pandas as pd
import pytest

from cs336_systems.report.answers import Answer, load_answers, record_answer
from cs336_systems.report.deliverables import deliverables
from cs336_systems.report.writeup import build_writeup, coverage, jargon


@pytest.mark.parametrize(
    "text",
    [
        "ours 0.95x cuDNN: the issue's bars pass",
        "the moonshot is not met",
        "ours <= 1.1 x SDPA-flash: FAIL",
        "the d = 128 backward of v26",
        "predate the fix (acb3c23)",
        "written to PosixPath('/tmp/job/x.csv')",
        "UserWarning: Memory efficient kernel not used because",
        "Triggered internally at ../aten/src/ATen/native/transformers/cuda/sdp_utils.cpp",
        "an H200 takes the H100's entries (flash_configs.SAME_SMS)",
    ],
)
def test_jargon_finds_internal_words_and_artefacts(text):
    assert jargon(text), text


@pytest.mark.parametrize(
    "text",
    [
        "The forward pass of the small model takes 13.4 ms on one NVIDIA H100 80GB HBM3, 0.944x cuDNN's.",
        "Error bars show one standard deviation over 10 steps; bf16 halves the 2.7B model's time.",
        "The 10B model needs 205 GB for fp32 AdamW before activations, so it does not fit in 80 GB.",
        "All-reduce of 1 GB on 4 GPUs takes 4.5 ms (NCCL), against 812 ms on gloo.",
    ],
)
def test_jargon_lets_plain_report_prose_through(text):
    assert jargon(text) == []


def test_commit_hashes_are_allowed_where_asked():
    assert jargon("ran at commit acb3c230872f", allow_commits=True) == []


def _runs(folder, names, status="ok"):
    (folder / "runs.json").write_text(
        json.dumps(
            [
                dict(name=n, status=status, seconds=1.0, machine="1 × GPU A", commit="abc1234", date="2026-01-01")
                for n in names
            ]
        )
    )


def test_coverage_names_the_deliverables_a_notebook_that_ran_left_unanswered(tmp_path):
    first = deliverables("2025")[0]
    same_notebook = [d for d in deliverables("2025") if d.notebook == first.notebook]
    _runs(tmp_path, [first.notebook])
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert {s.deliverable.id for s in coverage(tmp_path, runs)["2025"]} == {d.id for d in same_notebook}
    for d in same_notebook:
        record_answer(tmp_path / "results", d.notebook, d.answer, Answer(f"answer to {d.id}"))
    assert coverage(tmp_path, runs)["2025"] == []


def test_writeups_follow_each_handout_answer_first_with_gaps_in_place(tmp_path):
    items = deliverables("2026")
    answered, other = items[1], next(d for d in items if d.notebook != items[1].notebook)
    _runs(tmp_path, [answered.notebook])
    table = pd.DataFrame({"size": ["small", "medium"], "forward (ms)": [13.4, 30.1]})
    record_answer(
        tmp_path / "results",
        answered.notebook,
        answered.answer,
        Answer("The forward pass takes **13.4 ms**.", table=table, caveat="Run at batch 4."),
    )
    runs = json.loads((tmp_path / "runs.json").read_text())
    outs = build_writeup(tmp_path, {"profile": "cpu", "CPU": "test CPU", "commit": "abc1234"}, runs)
    assert sorted(p.name for p in outs) == ["writeup_2025.html", "writeup_2026.html"]
    page = (tmp_path / "writeup_2026.html").read_text()
    # every problem of the handout, in its order
    positions = [page.index(f"id='{p}'") for p in dict.fromkeys(d.problem for d in items)]
    assert positions == sorted(positions)
    part = page[page.index(f"id='{answered.id}'") :]
    assert part.index("13.4 ms") < part.index("<table>") < part.index("Run at batch 4.") < part.index("Details:")
    # a deliverable of a notebook that did not run is in place, with the reason
    gap = page[page.index(f"id='{other.id}'") :]
    assert gap.index("Not answered in this report") < gap.index("Details:")
    assert f"notebook {other.notebook} has not run" in gap
    assert (tmp_path / "README.md").exists()


def test_a_recorded_reason_shows_in_place_of_the_answer(tmp_path):
    d = deliverables("2025")[0]
    _runs(tmp_path, [d.notebook])
    record_answer(tmp_path / "results", d.notebook, d.answer, Answer.not_answered("this machine has one GPU"))
    build_writeup(tmp_path, {"profile": "cpu"}, json.loads((tmp_path / "runs.json").read_text()))
    page = (tmp_path / "writeup_2025.html").read_text()
    assert "this machine has one GPU" in page[page.index(f"id='{d.id}'") :]


def test_an_answer_is_one_table_or_one_figure_and_a_short_support_table():
    with pytest.raises(ValueError, match="one table or one figure"):
        Answer("x", table=pd.DataFrame({"a": [1]}), figure="figures/x.png")
    with pytest.raises(ValueError, match="at most"):
        Answer("x", table=pd.DataFrame({"a": range(100)}))
    with pytest.raises(ValueError, match="text"):
        Answer()


def test_a_damaged_answers_file_is_named(tmp_path):
    (tmp_path / "answers.json").write_text('[{"key": "a", "te')
    with pytest.raises(ValueError, match="answers.json is damaged"):
        load_answers(tmp_path)


def test_writeup_text_leaves_out_the_environment_and_images():
    from cs336_systems.report.writeup import writeup_text

    page = (
        "<h1>t</h1><h2>Environment</h2><table><tr><td>acb3c230872f</td></tr></table><h2 id='p'>Problem</h2>"
        "<img src='data:image/png;base64,+v12abc'><p>13.4 ms &amp; more</p>"
    )
    text = writeup_text(page)
    assert "acb3c230872f" not in text and "v12" not in text and "13.4 ms & more" in text


def test_jargon_finds_latex_a_writeup_cannot_render():
    assert jargon(r"the overhead is $\frac{s}{n_b w}$")
    assert jargon(r"overhead $$o + s/w$$")


def test_every_answer_key_has_a_builder_and_its_notebook_gives_it():
    """Read statically from the notebooks' `give(ctx, "key", ...)` calls, so a gap shows without running them."""
    import re
    from pathlib import Path

    from cs336_systems.experiments.answers import BUILDERS
    from cs336_systems.report.deliverables import DELIVERABLES

    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    given: dict[str, set[str]] = {}
    for path in notebooks.glob("[0-9][0-9]_*.py"):
        for call in re.finditer(r"give\(ctx,([^)]*)\)", path.read_text()):
            for key in re.findall(r'"([^"]+)"', call.group(1)):
                given.setdefault(key, set()).add(path.stem)
    keys = {d.answer for d in DELIVERABLES}
    assert keys - set(BUILDERS) == set()
    assert sorted({(d.answer, d.notebook) for d in DELIVERABLES if d.notebook not in given.get(d.answer, set())}) == []
    assert set(given) - keys == set(), "a notebook gives an answer no deliverable asks for"
