"""The deliverable map (`cs336_systems.report.deliverables`) against the handouts' own text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cs336_systems.report.deliverables import (
    DELIVERABLES,
    HANDOUT_TITLES,
    PROBLEM_POINTS,
    Deliverable,
    answer_keys,
    deliverables,
    problems,
)

REPO = Path(__file__).resolve().parents[1]
HANDOUT_DIRS = (Path("/work/shared/handouts"), REPO.parent / "shared" / "handouts")
FORMS = {"code", "sentences", "table", "plot", "derivation", "number"}
HANDOUTS = sorted(HANDOUT_TITLES)


def _handout_text(handout: str) -> str:
    for folder in HANDOUT_DIRS:
        path = folder / f"cs336_assignment2_systems_spring{handout}.txt"
        if path.exists():
            return path.read_text()
    pytest.skip(f"the {handout} handout's text is not here (looked in {', '.join(map(str, HANDOUT_DIRS))})")


def _problem_blocks(text: str) -> list[tuple[str, str]]:
    """(name, text from its `Problem (name)` to the next one) for every problem, in order."""
    matches = list(re.finditer(r"Problem \((\w+)\)", text))
    return [
        (m.group(1), text[m.start() : matches[i + 1].start() if i + 1 < len(matches) else len(text)])
        for i, m in enumerate(matches)
    ]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _ngrams(words: list[str], n: int = 8) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_api_and_ids():
    for handout in HANDOUTS:
        items = deliverables(handout)
        assert items and all(isinstance(d, Deliverable) and d.handout == handout for d in items)
        ids = [d.id for d in items]
        assert len(ids) == len(set(ids)), "ids are unique per handout"
    assert list(DELIVERABLES) == [d for h in HANDOUTS for d in deliverables(h)]
    d = deliverables("2025")[0]
    assert d.id == "2025/benchmarking_script.a"
    assert next(x for x in DELIVERABLES if x.part == "").id.count(".") == 0
    with pytest.raises(ValueError, match="1999.*2025.*2026"):
        deliverables("1999")
    assert answer_keys() == {d.answer for d in DELIVERABLES}


def test_fields():
    for d in DELIVERABLES:
        assert d.form in FORMS, d.id
        assert d.points is None or d.points > 0, d.id
        assert re.fullmatch(r"[a-z]?", d.part), d.id
        assert len(d.asks) <= 200 and len(d.asks.split()) <= 30, d.id
        assert d.asks.endswith(".") and d.asks.count(". ") == 0, f"{d.id}: one sentence"
        assert (REPO / "notebooks" / f"{d.notebook}.py").exists(), f"{d.id}: notebook {d.notebook} is missing"


def test_answer_keys():
    by_key: dict[str, list[Deliverable]] = {}
    for d in DELIVERABLES:
        by_key.setdefault(d.answer, []).append(d)
        base = d.problem + (f".{d.part}" if d.part else "")
        assert d.answer in (base, f"{base}.2026"), d.id
        assert not d.answer.endswith(".2026") or d.handout == "2026", d.id
    for key, items in by_key.items():
        assert len({d.handout for d in items}) == len(items), f"{key} is used twice in one handout"
        assert len({d.notebook for d in items}) == 1, f"{key} is answered by one notebook"
    # A 2026-specific key stands beside the 2025 deliverable it replaces, when 2025 has one.
    for key in answer_keys():
        if key.endswith(".2026") and key.removesuffix(".2026") in answer_keys():
            assert by_key[key.removesuffix(".2026")][0].handout == "2025"


@pytest.mark.parametrize("handout", HANDOUTS)
def test_problems_follow_the_handout(handout):
    text = _handout_text(handout)
    names = [name for name, _ in _problem_blocks(text)]
    assert len(names) == len(set(names))
    # Deliverables that are not a `Problem (...)` of the handout have no stated points.
    listed = [p for p in problems(handout) if p in PROBLEM_POINTS[handout]]
    assert listed == names
    for extra in set(problems(handout)) - set(names):
        assert extra.replace("_", " ") in text.lower(), extra
        assert all(d.points is None for d in deliverables(handout) if d.problem == extra)
    assert set(PROBLEM_POINTS[handout]) == set(names)


@pytest.mark.parametrize("handout", HANDOUTS)
def test_problem_points_match_the_handout(handout):
    for name, block in _problem_blocks(_handout_text(handout)):
        stated = re.search(r"(\d+)\s+points?\b", block[:300])
        assert stated, name
        assert PROBLEM_POINTS[handout][name] == float(stated.group(1)), name


@pytest.mark.parametrize("handout", HANDOUTS)
def test_parts_follow_the_handout(handout):
    for name, block in _problem_blocks(_handout_text(handout)):
        parts = [d.part for d in deliverables(handout) if d.problem == name]
        # Every part ends in one "Deliverable:"; nested enumerations inside a part do not.
        n = block.count("Deliverable:")
        assert len(parts) == n, f"{name}: {n} deliverables in the handout, {len(parts)} in the map"
        first = block[: block.index("Deliverable:")]
        if n == 1:
            lettered = re.search(r"(?m)^\s*\(a\)\s", first) is not None
            assert parts == (["a"] if lettered else [""]), name
        else:
            assert parts == [chr(ord("a") + i) for i in range(n)], name
            for letter in parts:
                assert re.search(rf"(?m)^\s*\({letter}\)\s", block), f"{name} ({letter})"


def test_asks_in_own_words():
    texts = [_words(_handout_text(h)) for h in HANDOUTS]
    handout_grams = set().union(*(_ngrams(w) for w in texts))
    for d in DELIVERABLES:
        shared = _ngrams(_words(d.asks)) & handout_grams
        assert not shared, f"{d.id} repeats the handout: {' '.join(next(iter(shared)))}"
