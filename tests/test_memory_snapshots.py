"""Snapshots of a step at several contexts, out of memory included, without a GPU: the recording is replaced by
a stand-in that writes what `record_step_snapshot` writes and fails where a real run would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from cs336_systems.benchmarking import BenchmarkConfig  # noqa: E402
from cs336_systems.profiling import memory_snapshots  # noqa: E402
from cs336_systems.profiling.memory import phases_path  # noqa: E402
from cs336_systems.profiling.memory_snapshots import (  # noqa: E402
    SnapshotRun,
    plot_timelines,
    record_snapshot_run,
    record_snapshots,
    snapshot_table,
)

EXAMPLE = Path(__file__).parent / "data" / "memory_snapshot_example.pickle"


def _stand_in(fails: dict[tuple[int, str], str], calls: list):
    """Records like the real one; `fails[(context, mode)]` is where that step runs out of memory: "warmup" (before
    recording), "model" (building it, whatever the warm-up) or a phase of the recorded step (after the warm-up
    failed, the phase the fresh step fails in)."""

    def record(config: BenchmarkConfig, path: Path) -> Path:
        calls.append((config.context_length, config.mode, config.warmup))
        where = fails.get((config.context_length, config.mode))
        if where == "model" or (where == "warmup" and config.warmup):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        shutil.copy(EXAMPLE, path)
        phases = json.loads(phases_path(EXAMPLE).read_text())  # forward, backward, optimizer step
        names = [p["name"] for p in phases]
        last = names.index(where) if where in names else 0 if where else len(names) - 1
        phases_path(path).write_text(json.dumps(phases[: last + 1]))
        if where is not None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return path

    return record


def test_a_step_that_does_not_fit_is_a_row_with_the_phase_it_failed_in(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        memory_snapshots,
        "record_step_snapshot",
        _stand_in({(2048, "train-step"): "warmup", (4096, "forward"): "model", (4096, "train-step"): "model"}, calls),
    )
    base = BenchmarkConfig(size="nano", batch_size=4, warmup=1, steps=1)
    runs = record_snapshots(base, [128, 2048, 4096], lambda c, m: tmp_path / f"snapshot_ctx{c}_{m}.pickle")
    table = snapshot_table(runs).set_index(["context_length", "mode"])
    assert list(table.status) == ["ok", "ok", "ok", "OOM", "OOM", "OOM"]
    # the warm-up ran out, so one step was recorded from a fresh model without it, and it failed in its forward
    assert (2048, "train-step", 0) in calls and table.loc[(2048, "train-step"), "failed_phase"] == "forward"
    assert table.loc[(2048, "train-step"), "warmup"] == 0
    assert table.loc[(2048, "train-step"), "snapshot"] == "snapshot_ctx2048_train-step.pickle"
    assert table.loc[(2048, "forward"), "warmup"] == 1 and table.loc[(2048, "forward"), "failed_phase"] == ""
    # not even the model fits: no snapshot
    assert table.loc[(4096, "forward"), "snapshot"] == "" and table.loc[(4096, "forward"), "failed_phase"] == "model"
    assert not (tmp_path / "snapshot_ctx4096_forward.pickle").exists()
    fig = plot_timelines(runs, [128, 2048], lambda m, c: f"{m} at {c}")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [
        "forward at 128",
        "forward at 2048",
        "train-step at 128",
        "train-step at 2048 — out of memory in its forward",
    ]


def test_a_failure_in_the_recorded_step_keeps_its_warmup_and_other_errors_are_raised(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(memory_snapshots, "record_step_snapshot", _stand_in({(512, "train-step"): "backward"}, calls))
    run = record_snapshot_run(
        BenchmarkConfig(size="nano", context_length=512, mode="train-step", warmup=2), tmp_path / "s.pickle"
    )
    assert (run.status, run.warmup, run.failed_phase) == ("OOM", 2, "backward") and len(calls) == 1

    def broken(config, path):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(memory_snapshots, "record_step_snapshot", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        record_snapshot_run(BenchmarkConfig(size="nano"), tmp_path / "t.pickle")


def test_a_panel_without_a_snapshot_says_why():
    runs = [SnapshotRun(64, "forward", "OOM", None, 0, "model")]
    fig = plot_timelines(runs, [64], lambda m, c: f"{m} at {c}", modes=["forward"])
    assert fig.axes[0].get_title() == "forward at 64 — out of memory"
    assert "the model and its optimizer do not fit" in fig.axes[0].texts[0].get_text()
