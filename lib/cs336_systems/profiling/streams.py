"""What each GPU stream of a profiled step did, and how much of the communication the compute hid.

    events = load_trace("trace.json.gz")
    stream_summary(events)          # one row per (device, stream): kernels, busy ms, communication ms
    communication_overlap(events)   # per device: communication busy ms, hidden behind compute, exposed

A stream's busy time is the union of its kernels' intervals (kernels of one stream do not overlap, but
copies and memsets may sit between them). Communication is what `kernel_category` calls it (NCCL's
kernels); everything else is compute. Communication is *hidden* where a compute kernel of the same
device runs at the same time, *exposed* where none does: the exposed part is what the step waits for.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.profiling.kernel_names import kernel_category
from cs336_systems.profiling.trace import GPU_KINDS


def merged_intervals(starts, ends) -> np.ndarray:
    """The union of intervals [start, end) as sorted, disjoint rows (n, 2)."""
    pairs = np.column_stack([np.asarray(starts, float), np.asarray(ends, float)])
    if len(pairs) == 0:
        return pairs.reshape(0, 2)
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    merged = [pairs[0].copy()]
    for s, e in pairs[1:]:
        if s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append(np.array([s, e]))
    return np.array(merged)


def overlap_length(a: np.ndarray, b: np.ndarray) -> float:
    """Total length of the intersection of two unions of disjoint sorted intervals (`merged_intervals`)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        total += max(0.0, hi - lo)
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return total


def _gpu_events(events: pd.DataFrame) -> pd.DataFrame:
    gpu = events[events["kind"].isin(GPU_KINDS)].copy()
    if gpu.empty:
        raise ValueError("the trace has no GPU kernels, copies or memsets (profile with ProfilerActivity.CUDA)")
    gpu["communication"] = gpu["name"].map(kernel_category) == "communication"
    return gpu


def stream_summary(events: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU lane (device and stream) of `load_trace`'s events: kernels, busy_ms, communication_ms
    (busy with communication kernels), role ('communication' where that is most of the busy time)."""
    rows = []
    for lane, group in _gpu_events(events).groupby("lane", sort=True):
        busy = merged_intervals(group.ts_us, group.end_us)
        comm = group[group.communication]
        comm_us = np.ptp(merged_intervals(comm.ts_us, comm.end_us), axis=1).sum() if len(comm) else 0.0
        busy_us = float(np.ptp(busy, axis=1).sum())
        rows.append(
            dict(
                lane=lane,
                device=group.device.iloc[0],
                kernels=len(group),
                busy_ms=busy_us / 1e3,
                communication_ms=float(comm_us) / 1e3,
                role="communication" if comm_us > busy_us / 2 else "compute",
            )
        )
    return pd.DataFrame(rows, columns=["lane", "device", "kernels", "busy_ms", "communication_ms", "role"])


def communication_overlap(events: pd.DataFrame) -> pd.DataFrame:
    """Per device: span_ms (first GPU event to last), compute_ms and communication_ms (busy, unions over its
    streams), hidden_ms (communication while compute runs on that device), exposed_ms (the rest) and
    hidden_fraction."""
    rows = []
    for device, group in _gpu_events(events).groupby("device", sort=True):
        comm = merged_intervals(group[group.communication].ts_us, group[group.communication].end_us)
        compute = merged_intervals(group[~group.communication].ts_us, group[~group.communication].end_us)
        comm_us = float(np.ptp(comm, axis=1).sum()) if len(comm) else 0.0
        hidden_us = overlap_length(comm, compute)
        rows.append(
            dict(
                device=device,
                span_ms=(group.end_us.max() - group.ts_us.min()) / 1e3,
                compute_ms=float(np.ptp(compute, axis=1).sum()) / 1e3 if len(compute) else 0.0,
                communication_ms=comm_us / 1e3,
                hidden_ms=hidden_us / 1e3,
                exposed_ms=(comm_us - hidden_us) / 1e3,
                hidden_fraction=hidden_us / comm_us if comm_us else float("nan"),
            )
        )
    return pd.DataFrame(rows)


def clip_to_window(events: pd.DataFrame, start_us: float, end_us: float) -> pd.DataFrame:
    """The GPU events' parts inside [start_us, end_us): those wholly outside dropped, those across an edge cut
    at it (the other events as they are). What a steady-state step is, when the trace holds more than one."""
    gpu = events["kind"].isin(GPU_KINDS)
    outside = gpu & ((events["end_us"] <= start_us) | (events["ts_us"] >= end_us))
    clipped = events[~outside].copy()
    inside = clipped["kind"].isin(GPU_KINDS)
    clipped.loc[inside, "ts_us"] = clipped.loc[inside, "ts_us"].clip(lower=start_us)
    clipped.loc[inside, "end_us"] = clipped.loc[inside, "end_us"].clip(upper=end_us)
    clipped.loc[inside, "dur_us"] = clipped.loc[inside, "end_us"] - clipped.loc[inside, "ts_us"]
    return clipped


def compute_span(events: pd.DataFrame) -> tuple[float, float]:
    """(start, end) in µs of the compute kernels among `events` (communication excluded)."""
    gpu = _gpu_events(events)
    compute = gpu[~gpu["communication"]]
    if compute.empty:
        raise ValueError("no compute kernels among the events")
    return float(compute["ts_us"].min()), float(compute["end_us"].max())
