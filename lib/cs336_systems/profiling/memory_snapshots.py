"""Memory snapshots of one step at several contexts, a step that does not fit recorded as far as it gets.

For each context and mode (an inference forward pass, a full training step), `record_snapshots`
warms up and records one step (`memory.record_step_snapshot`). A step that runs out of memory
becomes a row with status "OOM" and the snapshot of the attempt: when the recorded step itself
fails, the snapshot is dumped at the failure; when the warm-up fails first, one step is recorded
again from a fresh model without warm-up (so no AdamW state or gradients exist yet), and that
step's snapshot ends where it ran out. Either way the phase that was running when the allocator
failed (forward, backward or optimizer step) is the part of the step that does not fit, read from
the run rather than guessed; when not even the model fits, there is no snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd

from cs336_systems.benchmarking.harness import BenchmarkConfig, free_device_memory, is_out_of_memory
from cs336_systems.profiling.memory import phases_path, record_step_snapshot

MODES = ("forward", "train-step")
# The phase name of a step that could not start: the model (parameters, optimizer) did not fit.
MODEL = "model"


@dataclass
class SnapshotRun:
    context_length: int
    mode: str
    status: str  # "ok" or "OOM"
    path: Path | None  # the snapshot (up to the failure for an OOM); None when not even the model fit
    warmup: int  # warm-up steps before the recorded one
    failed_phase: str  # the phase running when memory ran out; "" when the step fit


def record_snapshot_run(config: BenchmarkConfig, path: str | Path) -> SnapshotRun:
    """One step of `config` recorded into a snapshot at `path`; out of memory is a row, never an error."""
    path = Path(path)
    if _attempt(config, path):
        return SnapshotRun(config.context_length, config.mode, "ok", path, config.warmup, "")
    if not path.exists() and config.warmup:
        # The warm-up ran out before recording began: record one step that is allowed to fail.
        config = replace(config, warmup=0)
        if _attempt(config, path):  # without the warm-up's state it fits after all
            return SnapshotRun(config.context_length, config.mode, "ok", path, 0, "")
    if not path.exists():
        return SnapshotRun(config.context_length, config.mode, "OOM", None, config.warmup, MODEL)
    phases = json.loads(phases_path(path).read_text()) if phases_path(path).exists() else []
    return SnapshotRun(
        config.context_length, config.mode, "OOM", path, config.warmup, phases[-1]["name"] if phases else MODEL
    )


def _attempt(config: BenchmarkConfig, path: Path) -> bool:
    """Whether the recorded step fit; a failed attempt leaves its snapshot at `path` only if recording began."""
    for stale in (path, phases_path(path)):
        stale.unlink(missing_ok=True)
    try:
        record_step_snapshot(config, path)
        return True
    except Exception as err:  # noqa: BLE001 - out of memory is a result here, anything else is not expected
        if not is_out_of_memory(err):
            raise
    finally:
        free_device_memory()  # after the handler: the traceback no longer holds the failed step's tensors
    return False


def record_snapshots(
    base: BenchmarkConfig,
    contexts: Sequence[int],
    path_for: Callable[[int, str], Path],
    modes: Sequence[str] = MODES,
) -> list[SnapshotRun]:
    """A snapshot of each mode at each context (`path_for(context, mode)` names its file)."""
    return [
        record_snapshot_run(replace(base, context_length=c, mode=m), path_for(c, m)) for c in contexts for m in modes
    ]


def snapshot_table(runs: Sequence[SnapshotRun]) -> pd.DataFrame:
    """One row per recorded step: context, mode, status, warm-up steps, the failed phase, the snapshot's file name."""
    rows = [{**asdict(r), "path": r.path.name if r.path else ""} for r in runs]
    return pd.DataFrame(rows).rename(columns={"path": "snapshot"})


def plot_timelines(
    runs: Sequence[SnapshotRun],
    contexts: Sequence[int],
    title: Callable[[str, int], str],
    modes: Sequence[str] = MODES,
    top: int = 8,
):
    """The active-memory timelines of `runs` in one figure: a row per mode, a column per context. A step that
    ran out of memory shows its snapshot up to the failure, named so in its title; one with no snapshot (not
    even the model fit) a sentence in its place."""
    import matplotlib.pyplot as plt

    from cs336_systems.profiling.memory import load_snapshot, plot_active_memory

    by_key = {(r.mode, r.context_length): r for r in runs}
    fig, axes = plt.subplots(len(modes), len(contexts), figsize=(13 * len(contexts), 5 * len(modes)), squeeze=False)
    for i, mode in enumerate(modes):
        for j, context in enumerate(contexts):
            ax, r = axes[i][j], by_key.get((mode, context))
            name = title(mode, context)
            if r is not None and r.status != "ok":
                name += f" — out of memory in its {r.failed_phase}" if r.failed_phase != MODEL else " — out of memory"
            if r is None or r.path is None:
                ax.text(
                    0.5,
                    0.5,
                    "not recorded"
                    if r is None
                    else "out of memory before the step began: the model and its optimizer do not fit",
                    ha="center",
                    va="center",
                )
                ax.set_title(name)
                ax.axis("off")
            else:
                plot_active_memory(*load_snapshot(r.path), top=top, title=name, ax=ax)
    fig.tight_layout()
    return fig
