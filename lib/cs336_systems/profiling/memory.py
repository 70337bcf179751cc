"""CUDA memory snapshots: record them, read them back, draw the active memory timeline.

Recording wraps the handout's recipe,

    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    ...                                            # the steps to look at
    torch.cuda.memory._dump_snapshot("memory_snapshot.pickle")
    torch.cuda.memory._record_memory_history(enabled=None)

and keeps the pickle (it opens in pytorch.org/memory_viz) plus a small JSON of phase marks
(forward, backward, optimizer step) taken with the same clock as the allocator's `time_us`.

A snapshot holds `segments` (what is allocated when it was dumped, with the stack of each
block) and `device_traces` (every alloc / free_requested / free_completed since recording
started, each with `time_us` and Python stack `frames`, innermost first). As memory_viz does, an
allocation is active from its `alloc` to its `free_completed`; one freed without having been
allocated in the trace, or still allocated in `segments` without an alloc, existed before
recording started. Each allocation is labelled by the first frame in the user's code (not in
torch or the standard library), e.g. "model.py:128 forward".
"""

from __future__ import annotations

import contextlib
import json
import pickle
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cs336_systems.benchmarking.harness import (
    BenchmarkConfig,
    TrainingSetup,
    autocast_context,
    build,
    free_device_memory,
)
from cs336_systems.model import cross_entropy
from cs336_systems.profiling.ranges import annotated

BEFORE_RECORDING = "allocated before recording"
NO_PYTHON_FRAME = "autograd engine (no Python frame)"
_LIBRARY_MARKERS = ("/site-packages/torch/", "/dist-packages/torch/", "/torch/", "<frozen", "<string>", "/lib/python3")
_USER_PACKAGE_MARKERS = ("/cs336_systems/",)


@dataclass
class PhaseRecorder:
    """Named phases (start, end) in microseconds since the epoch, the allocator's clock."""

    phases: list[dict] = field(default_factory=list)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.time_ns() // 1000
        try:
            with annotated(name):
                yield
        finally:
            self.phases.append(dict(name=name, start_us=start, end_us=time.time_ns() // 1000))


def phases_path(snapshot_path: str | Path) -> Path:
    return Path(snapshot_path).with_suffix(".phases.json")


@contextlib.contextmanager
def record_memory_history(
    path: str | Path, max_entries: int = 1_000_000, stacks: str = "python"
) -> Iterator[PhaseRecorder]:
    """Record CUDA allocations inside the block; dump the snapshot to `path` and phases beside it."""
    if not torch.cuda.is_available():
        raise ValueError("memory snapshots record the CUDA caching allocator; this machine has no CUDA device")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recorder = PhaseRecorder()
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks=stacks)
    try:
        yield recorder
    finally:
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        phases_path(path).write_text(json.dumps(recorder.phases, indent=1))


def step_with_phases(setup: TrainingSetup, recorder: PhaseRecorder) -> None:
    """The harness's step (forward, loss, backward, AdamW step) with each phase marked for the snapshot."""
    cfg = setup.config
    with autocast_context(cfg.precision, setup.device):
        if cfg.mode == "forward":
            with torch.no_grad(), recorder.phase("forward"):
                setup.model(setup.inputs)
            return
        with recorder.phase("forward"):
            loss = cross_entropy(setup.model(setup.inputs), setup.targets)
    with recorder.phase("backward"):
        loss.backward()
    if cfg.mode == "train-step":
        with recorder.phase("optimizer step"):
            setup.optimizer.step()
            setup.optimizer.zero_grad(set_to_none=True)
    else:
        setup.model.zero_grad(set_to_none=True)


def record_step_snapshot(config: BenchmarkConfig, path: str | Path, steps: int = 1) -> Path:
    """Warm up (`config.warmup` steps, unrecorded), then record `steps` steps into a snapshot at `path`."""
    setup = build(config)
    try:
        for _ in range(config.warmup):
            setup.step()
        torch.cuda.synchronize()
        with record_memory_history(path) as recorder:
            for _ in range(steps):
                step_with_phases(setup, recorder)
    finally:
        del setup
        free_device_memory()
    return Path(path)


def load_snapshot(path: str | Path) -> tuple[dict, list[dict]]:
    """The snapshot dict and its phase marks ([] if the JSON beside it is missing)."""
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot or "segments" not in snapshot:
        raise ValueError(f"{path} is not a CUDA memory snapshot (needs 'segments' and 'device_traces')")
    ppath = phases_path(path)
    phases = json.loads(ppath.read_text()) if ppath.exists() else []
    times = [e["time_us"] for trace in snapshot["device_traces"] for e in trace if "time_us" in e]
    if phases and times:
        inside = [p for p in phases if p["end_us"] >= min(times) and p["start_us"] <= max(times)]
        if len(inside) < len(phases):
            warnings.warn(
                f"{len(phases) - len(inside)} phase mark(s) of {path} fall outside the snapshot's time range; dropped",
                stacklevel=2,
            )
        phases = inside
    return snapshot, phases


def user_frame(frames: Sequence[dict]) -> dict | None:
    """The innermost frame in the user's code: a .py file outside torch and the standard library."""
    for f in frames:
        filename = str(f.get("filename", ""))
        if not filename.endswith(".py"):
            continue
        if any(m in filename for m in _USER_PACKAGE_MARKERS) or not any(m in filename for m in _LIBRARY_MARKERS):
            return f
    return None


def frame_label(frames: Sequence[dict]) -> str:
    if not frames:
        return NO_PYTHON_FRAME
    f = user_frame(frames)
    if f is None:
        f = frames[0]
    return f"{Path(str(f['filename'])).name}:{f['line']} {f['name']}"


def snapshot_allocations(snapshot: dict, device: int = 0) -> pd.DataFrame:
    """One row per allocation: addr, size, start/end (event index and time_us; NaN = beyond the trace), label, stack.

    Event indices count the alloc and free_completed actions, the x axis of memory_viz's Active
    Memory Timeline; allocations alive before recording start at index -1.
    """
    traces = snapshot["device_traces"]
    if device >= len(traces):
        raise ValueError(f"snapshot has traces for {len(traces)} device(s); asked for device {device}")
    rows: list[dict] = []
    open_by_addr: dict[int, int] = {}
    times: list[float] = []
    for entry in traces[device]:
        action = entry.get("action")
        if action == "alloc":
            open_by_addr[entry["addr"]] = len(rows)
            rows.append(_allocation(entry, len(times), entry.get("frames", [])))
            times.append(entry.get("time_us", np.nan))
        elif action in ("free_completed", "free"):
            i = open_by_addr.pop(entry["addr"], None)
            if i is None:  # allocated before recording started
                i = len(rows)
                rows.append(_allocation(entry, -1, entry.get("frames", []), before=True))
            rows[i].update(end=len(times), end_us=entry.get("time_us", np.nan))
            times.append(entry.get("time_us", np.nan))
    for seg in snapshot["segments"]:
        if seg.get("device", device) != device:
            continue
        for block in seg.get("blocks", []):
            if block.get("state") == "active_allocated" and block.get("address") not in open_by_addr:
                rows.append(
                    _allocation(
                        dict(addr=block["address"], size=block["size"]), -1, block.get("frames", []), before=True
                    )
                )
    df = pd.DataFrame(rows, columns=["addr", "size", "start", "end", "start_us", "end_us", "label", "stack"])
    df.attrs["event_times_us"] = np.asarray(times, dtype=float)
    return df


def _allocation(entry: dict, index: int, frames: list, before: bool = False) -> dict:
    label = BEFORE_RECORDING if before and not frames else frame_label(frames)
    stack = " <- ".join(f"{Path(str(f['filename'])).name}:{f['line']} {f['name']}" for f in frames[:8])
    return dict(
        addr=entry["addr"],
        size=int(entry["size"]),
        start=index,
        end=np.nan,
        start_us=entry.get("time_us", np.nan) if index >= 0 else np.nan,
        end_us=np.nan,
        label=label,
        stack=stack,
    )


def active_memory(allocations: pd.DataFrame, groups: pd.Series) -> pd.DataFrame:
    """Active bytes per group after each event (rows: event index -1..n-1, columns: groups)."""
    n = (
        len(allocations.attrs.get("event_times_us", []))
        or int(np.nanmax(allocations[["start", "end"]].to_numpy(dtype=float), initial=0)) + 1
    )
    out = {}
    for group, allocs in allocations.groupby(groups, sort=False):
        delta = np.zeros(n + 2)
        np.add.at(delta, allocs["start"].to_numpy(dtype=int) + 1, allocs["size"].to_numpy())
        ends = allocs["end"].dropna()
        np.add.at(delta, ends.to_numpy(dtype=int) + 1, -allocs.loc[ends.index, "size"].to_numpy())
        out[group] = np.cumsum(delta)[: n + 1]
    return pd.DataFrame(out, index=pd.RangeIndex(-1, n, name="event"))


def largest_allocations(allocations: pd.DataFrame, top: int = 10) -> pd.DataFrame:
    """The largest allocation sizes: size (MiB), how many were made, and the source lines that made them."""
    table = (
        allocations.groupby(["size", "label"])
        .size()
        .rename("count")
        .reset_index()
        .sort_values(["size", "count"], ascending=[False, False])
        .head(top)
    )
    table.insert(0, "size_mib", table.pop("size") / 2**20)
    return table.reset_index(drop=True)


def peak_active_bytes(allocations: pd.DataFrame) -> int:
    total = active_memory(allocations, pd.Series("all", index=allocations.index)).sum(axis=1)
    return int(total.max())


def plot_active_memory(
    snapshot: dict,
    phases: Sequence[dict] = (),
    device: int = 0,
    top: int = 8,
    title: str | None = None,
    x: str = "event",
    ax=None,
):
    """Stacked area of active memory over the trace: the `top` source lines with the largest
    allocations in colour (labelled), memory from before recording at the bottom, the rest grey.

    x="event" puts allocation/free events on the x axis, as memory_viz does; x="time" uses ms.
    Phases (from the recorder) are shaded and named along the top. Drawn on `ax` when given (one
    panel of a larger figure), else on a figure of its own; returns the figure.
    """
    import matplotlib.pyplot as plt

    allocs = snapshot_allocations(snapshot, device)
    if allocs.empty:
        raise ValueError("the snapshot has no allocations on this device")
    largest = allocs[allocs["label"] != BEFORE_RECORDING].groupby("label")["size"].max().sort_values(ascending=False)
    coloured = list(largest.index[:top])
    groups = allocs["label"].where(allocs["label"].isin(coloured + [BEFORE_RECORDING]), "smaller allocations")
    active = active_memory(allocs, groups)
    order = [g for g in [BEFORE_RECORDING, "smaller allocations", *coloured[::-1]] if g in active.columns]
    unit, scale = ("GiB", 2**30) if active.sum(axis=1).max() >= 2**30 else ("MiB", 2**20)
    active = active[order] / scale
    times = allocs.attrs["event_times_us"]
    if x == "time":
        t0 = np.nanmin(times) if len(times) else 0.0
        xs = np.concatenate([[0.0], (times - t0) / 1e3])
        xlabel = "time since recording started (ms)"
    elif x == "event":
        xs, xlabel = active.index.to_numpy(dtype=float), "allocation / free event"
    else:
        raise ValueError(f"x must be 'event' or 'time', got {x!r}")

    palette = plt.get_cmap("tab10").colors
    colours = {BEFORE_RECORDING: "#c9c9c9", "smaller allocations": "#8c8c8c"}
    colours.update({label: palette[i % len(palette)] for i, label in enumerate(coloured)})
    own = ax is None
    fig, ax = plt.subplots(figsize=(12, 5)) if own else (ax.figure, ax)
    ax.stackplot(
        xs,
        active.to_numpy().T,
        labels=[_legend_label(g, largest) for g in order],
        colors=[colours[g] for g in order],
        step="post",
        linewidth=0,
    )
    top_y = float(active.sum(axis=1).max()) * 1.08
    for p in phases:
        start, end = _phase_x(p, times, x)
        ax.axvspan(start, end, color="#f2e6c9", alpha=0.35, zorder=0)
        ax.axvline(start, color="#8c6d31", linewidth=0.8, linestyle="--")
        ax.text((start + end) / 2, top_y * 0.985, p["name"], ha="center", va="top", fontsize=9, color="#5c4718")
    ax.set_ylim(0, top_y)
    ax.set_xlim(xs[0], xs[-1])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"active memory ({unit})")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title:
        ax.set_title(title)
    if own:
        fig.tight_layout()
    return fig


def _legend_label(group: str, largest: pd.Series) -> str:
    if group in largest.index:
        return f"{group} (largest {largest[group] / 2**20:,.1f} MiB)"
    return group


def _phase_x(phase: dict, times: np.ndarray, x: str) -> tuple[float, float]:
    if x == "time":
        t0 = np.nanmin(times)
        return (phase["start_us"] - t0) / 1e3, (phase["end_us"] - t0) / 1e3
    # First event at or after the phase's start, and the last event before its end.
    return float(np.searchsorted(times, phase["start_us"])), float(np.searchsorted(times, phase["end_us"]) - 1)


def phase_peaks(allocations: pd.DataFrame, phases: Sequence[dict]) -> pd.DataFrame:
    """Active bytes at the start, the peak and the end of each recorded phase."""
    total = active_memory(allocations, pd.Series("all", index=allocations.index))["all"].to_numpy()
    times = allocations.attrs["event_times_us"]
    rows = []
    for p in phases:
        first = int(np.searchsorted(times, p["start_us"]))  # first event in the phase
        last = int(np.searchsorted(times, p["end_us"], side="right"))  # one past its last event
        # total[i + 1] is the active memory after event i; total[0] is before the first event.
        at_start = total[first]
        inside = total[first + 1 : last + 1]
        rows.append(
            dict(
                phase=p["name"],
                start_bytes=int(at_start),
                peak_bytes=int(max(inside.max(initial=0), at_start)),
                end_bytes=int(total[last]),
                events=last - first,
            )
        )
    return pd.DataFrame(rows)
