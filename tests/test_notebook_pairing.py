"""Each notebooks/NN_*.ipynb (what papermill runs) is paired by jupytext (notebooks/jupytext.toml) with a
percent-format NN_*.py beside it (what one reads, edits and diffs): the two must hold the same cells --
types, sources and tags (papermill finds its `parameters` cell by tag). `make sync-notebooks` brings a
pair in step after editing either file; JupyterLab (`make lab`) keeps them in step on save.

A code cell's source ending in a newline has no exact percent-format form (the script shows it as one
more blank line before the next cell), so trailing newlines are not compared."""

import shutil
import tomllib
from pathlib import Path

import jupytext
import jupytext.cli
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"


def _cells(nb: nbformat.NotebookNode) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(c.cell_type, c.source.rstrip("\n"), tuple(c.get("metadata", {}).get("tags", ()))) for c in nb.cells]


def pairing_problems(notebook_dir: Path) -> list[str]:
    """What is wrong with the notebook/script pairs of `notebook_dir`, one line each."""
    problems = []
    for script in sorted(notebook_dir.glob("[0-9][0-9]_*.py")):
        if not script.with_suffix(".ipynb").exists():
            problems.append(f"{script.name} has no notebook {script.stem}.ipynb (make sync-notebooks writes it)")
    for path in sorted(notebook_dir.glob("[0-9][0-9]_*.ipynb")):
        script = path.with_suffix(".py")
        if not script.exists():
            problems.append(f"{path.name} has no script {script.name} (make sync-notebooks writes it)")
            continue
        ours, theirs = _cells(nbformat.read(path, as_version=4)), _cells(jupytext.read(script, fmt="py:percent"))
        if ours == theirs:
            continue
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        what = (
            f"cell {first}: notebook {ours[first] if first < len(ours) else 'has no such cell'!r}, "
            f"script {theirs[first] if first < len(theirs) else 'has no such cell'!r}"
        )
        problems.append(f"{path.name} and {script.name} differ ({len(ours)} and {len(theirs)} cells); {what[:600]}")
    return problems


def test_every_notebook_has_its_script_and_they_agree():
    assert sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")), "no notebooks found"
    problems = pairing_problems(NOTEBOOK_DIR)
    assert not problems, "\n".join(problems)


def test_the_pairing_is_declared_for_jupytext():
    config = tomllib.loads((NOTEBOOK_DIR / "jupytext.toml").read_text())
    assert config["formats"] == "ipynb,py:percent"


def test_the_parameters_tag_is_in_the_script():
    for script in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.py")):
        assert script.read_text().count('# %% tags=["parameters"]\n') == 1, script.name


def test_sync_notebooks_leaves_a_clean_checkout_unchanged(tmp_path):
    """`make sync-notebooks` (jupytext --update --to ipynb of every script) must rewrite each notebook byte for byte:
    a committed .ipynb that jupytext would write otherwise shows up as changed in a fresh clone."""
    for path in [
        NOTEBOOK_DIR / "jupytext.toml",
        *NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"),
        *NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"),
    ]:
        shutil.copy(path, tmp_path)
    jupytext.cli.jupytext(
        ["--quiet", "--update", "--to", "ipynb", *sorted(str(p) for p in tmp_path.glob("[0-9][0-9]_*.py"))]
    )
    changed = [
        p.name for p in sorted(tmp_path.glob("*.ipynb")) if p.read_bytes() != (NOTEBOOK_DIR / p.name).read_bytes()
    ]
    assert not changed, f"make sync-notebooks rewrites {changed}; run it and commit what it wrote"


@pytest.fixture
def one_pair(tmp_path) -> Path:
    for suffix in (".ipynb", ".py"):
        shutil.copy(NOTEBOOK_DIR / f"03_mixed_precision_accumulation{suffix}", tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda s: s.replace("n = 1000", "n = 1001"), id="source"),
        pytest.param(lambda s: s.replace('# %% tags=["parameters"]', "# %%"), id="parameters-tag"),
        pytest.param(lambda s: s.replace("# %% [markdown]", "# %%", 1), id="cell-type"),
        pytest.param(lambda s: s + "\n# %%\nprint('one more cell')\n", id="extra-cell"),
    ],
)
def test_a_script_that_differs_from_its_notebook_is_reported(one_pair, edit):
    assert pairing_problems(one_pair) == []
    script = one_pair / "03_mixed_precision_accumulation.py"
    edited = edit(script.read_text())
    assert edited != script.read_text()
    script.write_text(edited)
    problems = pairing_problems(one_pair)
    assert (
        len(problems) == 1
        and "03_mixed_precision_accumulation.ipynb and 03_mixed_precision_accumulation.py differ" in problems[0]
    )


def test_a_notebook_without_its_script_and_a_script_without_its_notebook_are_reported(one_pair):
    (one_pair / "03_mixed_precision_accumulation.py").rename(one_pair / "04_orphan.py")
    assert pairing_problems(one_pair) == [
        "04_orphan.py has no notebook 04_orphan.ipynb (make sync-notebooks writes it)",
        (
            "03_mixed_precision_accumulation.ipynb has no script 03_mixed_precision_accumulation.py "
            "(make sync-notebooks writes it)"
        ),
    ]
