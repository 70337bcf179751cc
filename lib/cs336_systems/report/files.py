"""The files of a report folder, read and written so that damage is named and readers never see half a file.

Shared by the runner (runs.json, environment.json), the notebook context (answers.json) and the writeup.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path


class DamagedReportFile(ValueError):
    """A JSON file of a report folder that cannot be read."""


def read_json(path: Path, remedy: str):
    """`path`'s JSON; a DamagedReportFile naming the file and `remedy` when it cannot be read."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DamagedReportFile(f"{path} is damaged ({err}); {remedy}") from err


def write_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file, so a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """The block under an exclusive lock of `path`.lock (no lock where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
