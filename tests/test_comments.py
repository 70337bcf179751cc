"""Comments and docstrings give reasons, not a diary: no version tags (a `v` and a number), dates or commit
hashes in the code. Measurements and their provenance belong in the tuning records (docs/*_record.md,
docs/flash_attention_tuning.md), which a comment may point to by subject."""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Their comments still cite the tuning record's sections by version; drop each from here once rewritten.
NOT_YET = ()
DIARY = {
    "version tag": re.compile(r"(?<![\w.])v\d+(?:\.\d+)?\b"),
    "date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "commit hash": re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])"),
}


def sources() -> list[Path]:
    files = [
        *(ROOT / "lib" / "cs336_systems").rglob("*.py"),
        *(ROOT / "tests").glob("*.py"),
        *(ROOT / "tools").glob("*.py"),
    ]
    return sorted(f for f in files if not str(f.relative_to(ROOT)).startswith(NOT_YET))


def notes(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        documented = isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        if documented and (text := ast.get_docstring(node, clean=False)) is not None:
            found.append((node.body[0].lineno, text))
    return found


def test_comments_hold_no_diary():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {kind} {m.group(0)!r}"
        for path in sources()
        for line, text in notes(path.read_text())
        for kind, rx in DIARY.items()
        for m in rx.finditer(text)
    ]
    assert found == []
