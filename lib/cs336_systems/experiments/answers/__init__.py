"""The answers to the handouts' deliverables, built from a report's results.

Each builder takes the results folder of a run (`Results`) and returns the `Answer` to one
deliverable of the map (`report.deliverables`): its text, in the form the deliverable asks for and
generated from the run's tables wherever it states a measurement, then the one table or figure that
supports it. A notebook calls `give(ctx, key, ...)` once the tables a key reads are saved; the writeups
are assembled from what it records. The same builders rebuild the answers of a committed report from its
tables, without re-running it:

    python -m cs336_systems.experiments.answers reports/gpu

A builder raises `NotAnswered(reason)` when the run cannot answer (a table the key reads is absent,
too few GPUs): the writeup shows the deliverable in place with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from cs336_systems.report.answers import Answer, record_answer
from cs336_systems.report.deliverables import DELIVERABLES


class NotAnswered(Exception):
    """The run cannot answer this deliverable; the message says why, in a reader's words."""


class Results:
    """Read access to a run's results folder for the builders; a missing table is a `NotAnswered`."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def has(self, name: str) -> bool:
        return (self.folder / f"{name}.csv").exists()

    def table(self, name: str) -> pd.DataFrame:
        path = self.folder / f"{name}.csv"
        if not path.exists():
            raise NotAnswered(f"this run has no `{name}` table")
        return pd.read_csv(path, dtype={"commit": str})  # a hash of digits and one "e" would read as a float

    def json(self, name: str):
        path = self.folder / f"{name}.json"
        if not path.exists():
            raise NotAnswered(f"this run has no `{name}` record")
        return json.loads(path.read_text())

    def figure(self, name: str) -> str:
        """The path of figures/<name>.png relative to the folder, if the run drew it."""
        rel = f"figures/{name}.png"
        if not (self.folder / rel).exists():
            raise NotAnswered(f"this run has no `{name}` figure")
        return rel

    def run_record(self, notebook: str) -> dict:
        """A notebook's entry in the report's runs.json (name, status, machine, commit, date); {} where none."""
        runs = self.folder.parent / "runs.json"
        for r in json.loads(runs.read_text()) if runs.exists() else []:
            if r.get("name") == notebook:
                return r
        return {}

    def machine(self, notebook: str) -> str:
        """The machine a notebook ran on, as the report's runs.json names it (e.g. '2 × NVIDIA H200 (...)'),
        else this report's environment; '' when neither says."""
        if machine := self.run_record(notebook).get("machine"):
            return machine
        env = self.folder.parent / "environment.json"
        if env.exists():
            e = json.loads(env.read_text())
            return e.get("GPU") or e.get("CPU", "")
        return ""

    def run_date(self, notebook: str) -> pd.Timestamp | None:
        """When a notebook's run ended, as the report's runs.json dates it; None where it does not."""
        date = self.run_record(notebook).get("date")
        return pd.Timestamp(date.removesuffix(" UTC")) if date else None

    def gpu_name(self, notebook: str) -> str:
        """A short name of the machine for prose: 'an NVIDIA H100 80GB HBM3', '2 × NVIDIA H200', or 'the CPU'."""
        machine = self.machine(notebook)
        if "×" not in machine:
            return "the CPU" if machine else "this machine"
        count, name = machine.split("×", 1)
        name = name.split("(")[0].strip()
        return f"one {name}" if count.strip() == "1" else f"{count.strip()} × {name}"

    def not_run(self, notebook: str) -> dict[str, str]:
        """The deliverables a notebook recorded as not run here (part -> reason)."""
        path = self.folder / "not_run.json"
        records = json.loads(path.read_text()) if path.exists() else []
        return {r["key"]: r["reason"] for r in records if r.get("notebook") == notebook}


Builder = Callable[[Results], Answer]
BUILDERS: dict[str, Builder] = {}


def builds(*keys: str) -> Callable[[Builder], Builder]:
    """Registers a builder as the answer to `keys` (answer keys of the deliverable map)."""

    def register(fn: Builder) -> Builder:
        for key in keys:
            if key in BUILDERS:
                raise ValueError(f"two builders answer {key}: {BUILDERS[key].__name__} and {fn.__name__}")
            BUILDERS[key] = fn
        return fn

    return register


def builds_each_handout(key: str) -> Callable[[Callable[[Results, str], Answer]], Callable[[Results, str], Answer]]:
    """Registers `fn(results, handout)` as the answer to `key` (the 2025 sub-part, handout "2025") and to
    `key.2026` (the sub-part at the 2026 handout's settings, handout "2026")."""

    def register(fn: Callable[[Results, str], Answer]) -> Callable[[Results, str], Answer]:
        for handout, answer_key in (("2025", key), ("2026", f"{key}.2026")):

            def answer(results: Results, handout: str = handout) -> Answer:
                return fn(results, handout)

            answer.__name__ = f"{fn.__name__}[{handout}]"
            builds(answer_key)(answer)
        return fn

    return register


def build(key: str, results: Results) -> Answer:
    """The answer to `key` from `results`; a run that cannot answer gives `Answer.not_answered(reason)`."""
    if key not in BUILDERS:
        raise KeyError(f"no builder answers {key!r}; known: {', '.join(sorted(BUILDERS))}")
    try:
        return BUILDERS[key](results)
    except NotAnswered as why:
        return Answer.not_answered(str(why))


def give(ctx, *keys: str) -> None:
    """Builds, shows and records the answers to `keys` from the notebook's own results."""
    results = Results(ctx.results_dir)
    for key in keys:
        ctx.answer(key, build(key, results))


def notebook_of(key: str) -> str:
    for d in DELIVERABLES:
        if d.answer == key:
            return d.notebook
    raise KeyError(f"{key!r} answers no deliverable of the map")


def rebuild(report_dir: Path) -> dict[str, Answer]:
    """Rebuilds the answers of every notebook that ran to the end in `report_dir` from its results."""
    report_dir = Path(report_dir)
    runs_path = report_dir / "runs.json"
    ran = (
        {r["name"] for r in json.loads(runs_path.read_text()) if r.get("status") == "ok"}
        if runs_path.exists()
        else set()
    )
    results = Results(report_dir / "results")
    built = {}
    for key in sorted({d.answer for d in DELIVERABLES}):
        notebook = notebook_of(key)
        if notebook in ran and key in BUILDERS:
            built[key] = build(key, results)
            record_answer(results.folder, notebook, key, built[key])
    return built


# The builders, one module per group of notebooks; importing them fills BUILDERS.
from cs336_systems.experiments.answers import (  # noqa: E402, F401
    accounting,
    attention,
    benchmarking,
    distributed,
    leaderboard_8b,
    memory,
    nsys_profile,
)
