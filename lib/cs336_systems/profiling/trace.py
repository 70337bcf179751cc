"""A torch.profiler (Kineto) Chrome/Perfetto trace as a tidy DataFrame of events.

One row per event: name, cat, kind, ts_us, dur_us, end_us, pid, tid, lane, source, plus

  - launch_ts_us / host_pid: for a GPU kernel, memcpy or memset, the CPU time and process of the
    runtime call that launched it (joined on the trace's "correlation" id). A kernel belongs to a
    named range when its *launch* lies inside the range, which is how Nsight Systems projects
    NVTX ranges onto the GPU: the GPU runs behind the CPU, so kernel times alone would not do.
  - self_us: for CPU operators, the duration minus the direct child operators' durations.
  - depth: nesting depth among CPU operators of one thread (0 = outermost).
  - bytes / total_allocated: for the "[memory]" events that profile_memory=True records.

`events_in_ranges(events, ["measured step", "forward"])` keeps the events inside an instance of
every named range (the intersection), and `range_instances` lists the ranges themselves.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

GPU_KINDS = ("kernel", "memcpy", "memset")
_KIND_BY_CAT = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cpu_op": "cpu_op",
    "user_annotation": "range",
    "gpu_user_annotation": "gpu_range",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "python_function": "python",
}
COLUMNS = [
    "name",
    "cat",
    "kind",
    "ts_us",
    "dur_us",
    "end_us",
    "pid",
    "tid",
    "lane",
    "source",
    "device",
    "correlation",
    "external_id",
    "launch_ts_us",
    "host_pid",
    "self_us",
    "depth",
    "bytes",
    "total_allocated",
]


def read_trace_json(path: str | Path) -> dict:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def record_chrome_trace(step) -> dict:
    """Run `step()` once under torch.profiler (CPU, and CUDA where available) and return the Chrome trace
    it exports, as a dict (what `load_trace` reads)."""
    import tempfile

    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())


def load_trace(trace: str | Path | dict, source: str | None = None) -> pd.DataFrame:
    """Events of a Chrome trace (a path to .json / .json.gz, or the loaded dict) as a DataFrame."""
    data = trace if isinstance(trace, dict) else read_trace_json(trace)
    raw = data.get("traceEvents") if isinstance(data, dict) else None
    if raw is None:
        raise ValueError("not a Chrome trace: no 'traceEvents' list (export one with prof.export_chrome_trace)")
    rows = []
    for e in raw:
        ph, cat = e.get("ph"), e.get("cat")
        memory = ph == "i" and e.get("name") == "[memory]"
        if ph != "X" and not memory:
            continue
        args = e.get("args") or {}
        kind = "memory" if memory else _KIND_BY_CAT.get(cat, "other")
        rows.append(
            dict(
                name=str(e.get("name", "")),
                cat=cat or "",
                kind=kind,
                ts_us=float(e.get("ts", 0.0)),
                dur_us=float(e.get("dur", 0.0)),
                pid=e.get("pid"),
                tid=e.get("tid"),
                device=args.get("device"),
                stream=args.get("stream"),
                correlation=args.get("correlation"),
                external_id=args.get("External id"),
                bytes=args.get("Bytes"),
                total_allocated=args.get("Total Allocated"),
            )
        )
    df = pd.DataFrame(
        rows,
        columns=[
            "name",
            "cat",
            "kind",
            "ts_us",
            "dur_us",
            "pid",
            "tid",
            "device",
            "stream",
            "correlation",
            "external_id",
            "bytes",
            "total_allocated",
        ],
    )
    df["source"] = source or ""
    df["end_us"] = df["ts_us"] + df["dur_us"]
    gpu = df["kind"].isin(GPU_KINDS)
    # Kineto puts device events in pid = device index, tid = stream; args repeat both.
    df.loc[gpu, "device"] = df.loc[gpu, "device"].fillna(df.loc[gpu, "pid"])
    df.loc[gpu, "stream"] = df.loc[gpu, "stream"].fillna(df.loc[gpu, "tid"])
    df["lane"] = _lane_names(df)
    _join_launches(df)
    _cpu_nesting(df)
    df = df.drop(columns=["stream"]).sort_values("ts_us", kind="stable").reset_index(drop=True)
    return df[COLUMNS]


def _lane_names(df: pd.DataFrame) -> pd.Series:
    prefix = df["source"].where(df["source"] == "", df["source"] + " · ")
    gpu = df["kind"].isin(GPU_KINDS) | (df["kind"] == "gpu_range")
    gpu_lane = "GPU " + df["device"].map(_as_label) + " stream " + df["stream"].map(_as_label)
    cpu_lane = "CPU thread " + df["tid"].map(_as_label)
    return prefix + gpu_lane.where(gpu, cpu_lane)


def _as_label(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _join_launches(df: pd.DataFrame) -> None:
    """launch_ts_us/host_pid: own ts/pid for CPU events, the launching runtime call's for GPU ones."""
    df["launch_ts_us"] = df["ts_us"]
    df["host_pid"] = df["pid"]
    gpu = df["kind"].isin(GPU_KINDS)
    runtime = df[(df["kind"] == "runtime") & df["correlation"].notna()]
    if not gpu.any() or runtime.empty:
        return
    by_corr = runtime.drop_duplicates("correlation").set_index("correlation")
    corr = df.loc[gpu, "correlation"]
    df.loc[gpu, "launch_ts_us"] = corr.map(by_corr["ts_us"]).fillna(df.loc[gpu, "ts_us"]).to_numpy()
    df.loc[gpu, "host_pid"] = corr.map(by_corr["pid"]).to_numpy()


def _cpu_nesting(df: pd.DataFrame) -> None:
    """depth and self_us of CPU operators, per (source, pid, tid), by a sweep over start times."""
    df["self_us"] = np.where(df["kind"].isin(GPU_KINDS), df["dur_us"], np.nan)
    df["depth"] = np.nan
    ops = df[df["kind"] == "cpu_op"].sort_values(["ts_us", "dur_us"], ascending=[True, False])
    self_us, depth = {}, {}
    for _, group in ops.groupby(["source", "pid", "tid"], sort=False):
        stack: list[tuple[int, float]] = []  # (row index, end time)
        for idx, ts, end, dur in zip(group.index, group["ts_us"], group["end_us"], group["dur_us"]):
            while stack and stack[-1][1] <= ts:
                stack.pop()
            if stack:
                self_us[stack[-1][0]] -= dur
            depth[idx] = len(stack)
            self_us[idx] = dur
            stack.append((idx, end))
    if self_us:
        idx = list(self_us)
        df.loc[idx, "self_us"] = np.maximum([self_us[i] for i in idx], 0.0)
        df.loc[idx, "depth"] = [depth[i] for i in idx]


def range_instances(events: pd.DataFrame, name: str, gpu: bool = False) -> pd.DataFrame:
    """The instances of one named range (CPU-side; `gpu=True`: the GPU-side annotation)."""
    kind = "gpu_range" if gpu else "range"
    return events[(events["kind"] == kind) & (events["name"] == name)].sort_values("ts_us")


def events_in_ranges(
    events: pd.DataFrame, names: Sequence[str] | str | None, kinds: Iterable[str] | None = None
) -> pd.DataFrame:
    """Events (optionally only of `kinds`) whose launch time lies inside an instance of every named range.

    Ranges are matched within the same trace source and host process; a GPU event counts by the
    CPU time of its launch, so kernels of the backward pass launched from the autograd thread fall
    inside the "backward" range opened on the main thread.
    """
    if isinstance(names, str):
        names = [names]
    selected = events if kinds is None else events[events["kind"].isin(list(kinds))]
    for name in names or []:
        ranges = range_instances(events, name)
        if ranges.empty:
            known = sorted(events.loc[events["kind"] == "range", "name"].unique())
            raise ValueError(f"no range named {name!r} in the trace; ranges present: {known}")
        inside = np.zeros(len(selected), dtype=bool)
        for (source, pid), rs in ranges.groupby(["source", "pid"]):
            mask = (selected["source"] == source).to_numpy() & (selected["host_pid"] == pid).to_numpy()
            inside[mask] = _inside_intervals(
                selected["launch_ts_us"].to_numpy()[mask], rs["ts_us"].to_numpy(), rs["end_us"].to_numpy()
            )
        selected = selected[inside]
    return selected


def _inside_intervals(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """t inside any [start, end); intervals of one range name never overlap each other."""
    order = np.argsort(starts)
    starts, ends = starts[order], ends[order]
    i = np.searchsorted(starts, t, side="right") - 1
    return (i >= 0) & (t < ends[np.clip(i, 0, None)])


def count_range_instances(events: pd.DataFrame, name: str, within: Sequence[str] | str | None = None) -> int:
    """How many instances of range `name` start inside the `within` ranges (e.g. forward passes per measured step)."""
    ranges = events_in_ranges(events, within, kinds=("range",))
    return int((ranges["name"] == name).sum())
