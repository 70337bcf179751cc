"""The answers a report gives to the handouts' deliverables, as a notebook records them.

A notebook answers a deliverable of the map (`report.deliverables`) with `ctx.answer(key, Answer(...))`:
the answer's text in the form the deliverable asks for (generated from the run's data where it states a
measurement), then at most one table or one figure that supports it. The record goes to
`results/answers.json` (the support table beside it, `results/answers/<key>.csv`), from which the
writeups are assembled: one per handout, each deliverable in the handout's order, answer first.

A deliverable the machine cannot answer (too few GPUs, out of memory) is recorded with the reason
(`Answer.not_answered(reason)`), so it appears in place, never silently absent.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from cs336_systems.report.files import read_json, write_atomic

ANSWERS_FILE = "answers.json"
TABLES_FOLDER = "answers"
# A support table is the one table a grader reads beside the answer; sweeps stay in the notebook.
MAX_SUPPORT_ROWS = 24


@dataclass
class Answer:
    """One deliverable's answer: `text` (Markdown), then `table` or `figure` (a path relative to the
    results folder), `caveat` (what the run's settings leave out), or `reason` when it is not answered."""

    text: str = ""
    table: pd.DataFrame | None = None
    figure: str | None = None
    caveat: str = ""
    reason: str = ""

    @classmethod
    def not_answered(cls, reason: str) -> Answer:
        return cls(reason=reason)

    @property
    def answered(self) -> bool:
        return not self.reason

    def __post_init__(self) -> None:
        if not self.text and not self.reason:
            raise ValueError("an Answer needs its text, or the reason it is not answered")
        if self.table is not None and self.figure is not None:
            raise ValueError("an Answer is supported by one table or one figure, not both")
        if self.table is not None and len(self.table) > MAX_SUPPORT_ROWS:
            raise ValueError(
                f"a support table has at most {MAX_SUPPORT_ROWS} rows (got {len(self.table)}): "
                "keep the sweep in the notebook and show the rows the answer rests on"
            )


def _file_key(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)


def record_answer(results_dir: Path, notebook: str, key: str, answer: Answer) -> dict:
    """Writes `answer` under `key` into the results folder (replacing an earlier answer to the same key)."""
    results_dir = Path(results_dir)
    table_path = ""
    if answer.table is not None:
        folder = results_dir / TABLES_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        table_path = f"{TABLES_FOLDER}/{_file_key(key)}.csv"
        answer.table.to_csv(results_dir / table_path, index=False)
    record = dict(
        key=key,
        notebook=notebook,
        text=answer.text,
        table=table_path,
        figure=answer.figure or "",
        caveat=answer.caveat,
        reason=answer.reason,
    )
    path = results_dir / ANSWERS_FILE
    records = [r for r in load_answers(results_dir).values() if r["key"] != key]
    records.append(record)
    records.sort(key=lambda r: (r["notebook"], r["key"]))
    results_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(records, indent=2))
    return record


def load_answers(results_dir: Path) -> dict[str, dict]:
    """key -> record of the answers in a results folder (empty when none were recorded)."""
    path = Path(results_dir) / ANSWERS_FILE
    if not path.exists():
        return {}
    records = read_json(
        path,
        "delete it and re-run the notebooks, or rebuild it with "
        "`python -m cs336_systems.experiments.answers <report folder>`",
    )
    return {r["key"]: r for r in records}


def support_table(results_dir: Path, record: dict) -> pd.DataFrame | None:
    return pd.read_csv(Path(results_dir) / record["table"]) if record.get("table") else None


def answer_as_dict(answer: Answer) -> dict:
    """The answer's fields without its table (for messages and tests)."""
    return {k: v for k, v in asdict(answer).items() if k != "table"}
