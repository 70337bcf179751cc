"""Did each all-gather of an FSDP forward pass finish before its module needed the weight?

Reads a profiled FSDP step (profiling/trace.py's events of a torch.profiler trace). FSDP's hooks
open named ranges: "fsdp all-gather <module>" around each launch, "fsdp wait <module>" around
each wait, "fsdp forward <module>" around each module's forward. On a GPU trace the kernels
launched inside those ranges place the gather and the module's compute on the GPU clock; on a
CPU trace (gloo) the time blocked in the wait is what the forward lost. `plot_gather_schedule`
draws one row per module: its gather, its forward and any exposed wait.

Whether a gather "was ready in time" says little when the GPU idles between modules (a forward
paced by the host): `forward_overlap` measures, on the GPU clock of a profiled forward pass,

    busy fraction   |∪ compute kernels| / forward span          (1 = the GPU never waited)
    all-gather      |∪ NCCL kernels|, of it hidden = |∪ NCCL ∩ ∪ compute|, exposed = the rest

and `summarize_profiles` does so for each profiled batch, marking which ones were GPU-bound.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from cs336_systems.profiling.streams import communication_overlap
from cs336_systems.profiling.trace import GPU_KINDS


def _first_kernels(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """For each CPU range: GPU start/end of the kernels launched inside it (NaN if none)."""
    kernels = kernels.sort_values("launch_ts_us")
    launch = kernels["launch_ts_us"].to_numpy()
    lo = np.searchsorted(launch, ranges["ts_us"].to_numpy(), side="left")
    hi = np.searchsorted(launch, ranges["end_us"].to_numpy(), side="left")
    starts, ends, lanes = [], [], []
    for a, b in zip(lo, hi):
        inside = kernels.iloc[a:b]
        starts.append(inside["ts_us"].min() if b > a else math.nan)
        ends.append(inside["end_us"].max() if b > a else math.nan)
        lanes.append(inside["lane"].iloc[0] if b > a else None)
    return pd.DataFrame({"start": starts, "end": ends, "lane": lanes}, index=ranges.index)


def _match_gathers_by_order(
    spans: pd.DataFrame, range_rows: pd.Series, gathers: pd.DataFrame, nccl: pd.DataFrame
) -> None:
    """Fill spans a launch did not match (a trace without the NCCL launches' correlation) by order:
    the NCCL stream runs the all-gathers in the order the "fsdp all-gather" ranges issued them."""
    missing = spans["start"].isna() & range_rows.notna()
    all_gathers = nccl[nccl["name"].str.lower().str.contains("allgather")].sort_values("ts_us")
    if not missing.any() or len(all_gathers) != len(gathers):
        return
    order = {row: k for k, row in enumerate(gathers.sort_values("ts_us").index)}
    for i in spans.index[missing]:
        k = order[range_rows[i]]
        spans.loc[i, ["start", "end"]] = all_gathers["ts_us"].iloc[k], all_gathers["end_us"].iloc[k]


def forward_gather_timing(events: pd.DataFrame, tolerance_us: float | None = None) -> pd.DataFrame:
    """Per module, in forward order: did its all-gather finish before its forward needed the weight?

    The gather of module X is the last "fsdp all-gather X" range that starts before the
    "fsdp forward X" range (the prefetch issued at the previous module's start).
    GPU trace: gather = the NCCL kernels launched inside that range; the forward could start
    when the compute stream finished its previous kernel (`ready`); `exposed` = the part of the
    stream's idle gap before X's first kernel that the gather still occupied,
    clip(min(gather end, first kernel) − ready, 0); `gather_found` is False (and `in_time` too)
    where no NCCL kernel could be tied to the gather. CPU trace (gloo): `exposed` = the time the
    "fsdp wait X" range blocked. In time ⇔ exposed ≤ `tolerance_us`, by default 1 µs on the GPU
    clock and 100 µs for a CPU wait, which costs tens of µs under the profiler even when the
    gather is long done. Times in ms from the first gather or forward (trace time `origin_us`).
    """
    ranges = events[events["kind"] == "range"]
    forwards = ranges[ranges["name"].str.startswith("fsdp forward ")].copy()
    if forwards.empty:
        raise ValueError("no 'fsdp forward' ranges in the trace: was the profiled model wrapped in FSDP?")
    forwards["module"] = forwards["name"].str.removeprefix("fsdp forward ")
    gathers = ranges[ranges["name"].str.startswith("fsdp all-gather ")].assign(
        module=lambda d: d["name"].str.removeprefix("fsdp all-gather ")
    )
    waits = ranges[ranges["name"].str.startswith("fsdp wait ")].assign(
        module=lambda d: d["name"].str.removeprefix("fsdp wait ")
    )
    kernels = events[events["kind"].isin(GPU_KINDS)]
    gpu = not kernels.empty
    rows = []
    for _, f in forwards.sort_values("ts_us").iterrows():
        g = gathers[(gathers["module"] == f["module"]) & (gathers["ts_us"] <= f["ts_us"])].tail(1)
        w = waits[(waits["module"] == f["module"]) & (waits["ts_us"] <= f["ts_us"])].tail(1)
        rows.append(
            dict(
                module=f["module"],
                forward_cpu_start=f["ts_us"],
                forward_cpu_end=f["end_us"],
                gather_range=g.index[0] if len(g) else None,
                gather_cpu_start=g["ts_us"].iloc[0] if len(g) else math.nan,
                gather_cpu_end=g["end_us"].iloc[0] if len(g) else math.nan,
                wait_cpu_start=w["ts_us"].iloc[0] if len(w) else math.nan,
                wait_cpu_end=w["end_us"].iloc[0] if len(w) else math.nan,
            )
        )
    df = pd.DataFrame(rows)
    if gpu:
        nccl = kernels[kernels["name"].str.lower().str.contains("nccl")]
        compute = kernels[~kernels.index.isin(nccl.index)]
        gather_spans = _first_kernels(
            nccl, df.rename(columns={"gather_cpu_start": "ts_us", "gather_cpu_end": "end_us"})
        )
        _match_gathers_by_order(gather_spans, df["gather_range"], gathers, nccl)
        forward_spans = _first_kernels(
            compute, df.rename(columns={"forward_cpu_start": "ts_us", "forward_cpu_end": "end_us"})
        )
        df["gather_start"], df["gather_end"] = gather_spans["start"], gather_spans["end"]
        df["compute_start"], df["compute_end"] = forward_spans["start"], forward_spans["end"]
        ready = []
        for start, lane in zip(df["compute_start"], forward_spans["lane"]):
            before = compute[(compute["lane"] == lane) & (compute["ts_us"] < start)]
            ready.append(before["end_us"].max() if len(before) else math.nan)
        df["ready"] = ready
        df["exposed"] = (np.minimum(df["gather_end"], df["compute_start"]) - df["ready"]).clip(lower=0)
    else:
        df["gather_start"], df["gather_end"] = df["gather_cpu_start"], df["wait_cpu_end"].fillna(df["gather_cpu_end"])
        df["compute_start"], df["compute_end"] = df["forward_cpu_start"], df["forward_cpu_end"]
        df["ready"] = df["wait_cpu_start"].fillna(df["forward_cpu_start"])
        df["exposed"] = (df["wait_cpu_end"] - df["wait_cpu_start"]).fillna(0.0)
    t0 = df["forward_cpu_start"].min() if not gpu else np.nanmin(df[["gather_start", "compute_start"]].to_numpy())
    out = pd.DataFrame({"module": df["module"], "position": range(len(df))})
    for col in ("gather_start", "gather_end", "ready", "compute_start", "compute_end"):
        out[f"{col}_ms"] = (df[col] - t0) / 1e3
    out["exposed_ms"] = df["exposed"] / 1e3
    out["gather_found"] = df["gather_end"].notna()
    if tolerance_us is None:
        tolerance_us = 1.0 if gpu else 100.0
    out["in_time"] = df["exposed"] <= tolerance_us
    out["clock"] = "GPU kernels" if gpu else "CPU ranges (gloo)"
    out["origin_us"] = t0  # trace time of 0 ms, to find a window in the trace again
    return out


def plot_gather_schedule(timing: pd.DataFrame, first: int = 16, title: str = ""):
    """One row per module (forward order): its all-gather, its forward, and any exposed wait in red."""
    import matplotlib.pyplot as plt

    df = timing.head(first).reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.32 * len(df)))
    for i, r in df.iterrows():
        y = len(df) - 1 - i
        if not math.isnan(r["gather_start_ms"]):
            ax.broken_barh(
                [(r["gather_start_ms"], r["gather_end_ms"] - r["gather_start_ms"])],
                (y - 0.35, 0.3),
                facecolor="#de8f05",
            )
        ax.broken_barh(
            [(r["compute_start_ms"], r["compute_end_ms"] - r["compute_start_ms"])],
            (y + 0.02, 0.33),
            facecolor="#0173b2",
        )
        if r["exposed_ms"] > 0:
            ax.broken_barh(
                [(r["compute_start_ms"] - r["exposed_ms"], r["exposed_ms"])],
                (y + 0.02, 0.33),
                facecolor="#d55e00",
                hatch="//",
            )
    ax.set_yticks(range(len(df)), list(df["module"])[::-1], fontsize=7)
    ax.set_xlabel(f"time (ms, {df['clock'].iloc[0]})")
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color="#de8f05", label="all-gather of the module's weight"),
            Patch(color="#0173b2", label="the module's forward"),
            Patch(color="#d55e00", label="waiting for the gather (exposed)"),
        ],
        fontsize=8,
        loc="lower right",
    )
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    fig.tight_layout()
    return fig


OVERLAP_COLUMNS = ("forward_ms", "busy_fraction", "gather_ms", "hidden_ms", "hidden_fraction", "exposed_ms")


def forward_overlap(events: pd.DataFrame) -> dict[str, float]:
    """A profiled forward pass on the GPU clock (the device that computed most): its span `forward_ms`, the
    share of it some compute kernel ran (`busy_fraction`), the all-gather kernels' busy time (`gather_ms`),
    the part of it a compute kernel ran beside (`hidden_ms`, `hidden_fraction`) and the rest (`exposed_ms`).
    All NaN for a trace without GPU kernels (gloo on CPUs). The trace must hold the forward pass only: every
    communication kernel in it counts as an all-gather."""
    if not events["kind"].isin(GPU_KINDS).any():
        return dict.fromkeys(OVERLAP_COLUMNS, math.nan)
    per_device = communication_overlap(events)
    d = per_device.loc[per_device["compute_ms"].idxmax()]
    return dict(
        forward_ms=d.span_ms,
        busy_fraction=d.compute_ms / d.span_ms if d.span_ms else math.nan,
        gather_ms=d.communication_ms,
        hidden_ms=d.hidden_ms,
        hidden_fraction=d.hidden_fraction,
        exposed_ms=d.exposed_ms,
    )


def summarize_profiles(profiles: list[dict], busy_threshold: float = 0.8) -> pd.DataFrame:
    """One row per profiled forward (`fsdp_benchmark`'s `profiles`): the model, per-rank batch and tokens,
    status, `forward_overlap`'s measures, how many gathers were ready before their module's compute and how
    late the others were in all; `gpu_bound` where the busy fraction reached `busy_threshold`, and `shown`
    on the one whose gathers a report draws: the first GPU-bound forward, else the busiest (on a CPU trace,
    the first)."""
    rows = []
    for p in profiles:
        row = {k: p[k] for k in ("size", "strategy", "compute_dtype", "batch_per_rank", "context_length", "status")}
        row["tokens_per_rank"] = p["batch_per_rank"] * p["context_length"]
        events = p.get("events")
        if p["status"] == "ok" and events is not None:
            timing = forward_gather_timing(events)
            late = timing[~timing.in_time & timing.gather_found]
            row.update(
                forward_overlap(events),
                gathers=len(timing),
                gathers_in_time=int(timing.in_time.sum()),
                late_ms=float(late.exposed_ms.sum()),
            )
        rows.append(row)
    df = pd.DataFrame(
        rows,
        columns=["size", "strategy", "compute_dtype", "batch_per_rank", "context_length", "status", "tokens_per_rank"]
        if not rows
        else None,
    )
    for col in (*OVERLAP_COLUMNS, "gathers", "gathers_in_time", "late_ms"):
        if col not in df:
            df[col] = math.nan
    df["busy_threshold"] = busy_threshold
    df["gpu_bound"] = df["busy_fraction"] >= busy_threshold
    df["shown"] = False
    measured = df[(df["status"] == "ok") & df["gathers"].notna()]
    if len(measured):
        bound = measured[measured["gpu_bound"]]
        pick = (
            bound.index[0]
            if len(bound)
            else (measured["busy_fraction"].idxmax() if measured["busy_fraction"].notna().any() else measured.index[0])
        )
        df.loc[pick, "shown"] = True
    return df
