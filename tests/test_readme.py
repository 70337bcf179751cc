"""The README is a start page: short, the two commands first, a Contributing section, no dates, version tags
or commit hashes; and every link of the README and docs/ reaches a file (and a heading, where it names one)."""

import re
from pathlib import Path

import pytest

from cs336_systems.report.writeup import jargon

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_a_start_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 160
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[0] == "Quick start"
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make report" in quick_start and "make test" in quick_start
    contributing = text.split("## Contributing", 1)[1]
    for what in ("A kernel", "A notebook", "A parallel wrapper", "make lint", "make test"):
        assert what in contributing


def test_the_readme_holds_no_dates_version_tags_or_commits():
    text = README.read_text()
    assert jargon(text) == []
    assert not re.findall(
        r"\b20\d\d-\d\d-\d\d\b|\b(?:January|February|March|April|May|June|July|August|"
        r"September|October|November|December) \d{1,2}\b",
        text,
    )


def slug(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's) gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(text: str) -> str:
    """Markdown without its code blocks and code spans (`kernel[grid](...)` is no link)."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_reaches_its_file_and_heading(page):
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        assert where.exists(), f"{page.name} links {target}, which is missing"
        if anchor and where.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", where.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"{page.name} links {target}: no such heading"
