"""Timelines of a profiled training step, drawn from torch.profiler's chrome trace.

`timeline_events(trace)` turns the trace (the JSON of `prof.export_chrome_trace`, as a dict)
into one row per span: which lane it is drawn in, its kind, start and duration in microseconds
from the first span. On a GPU the lanes are the CUDA streams of each device, so NCCL kernels,
which run on their own stream, sit in a lane below the compute kernels and either overlap the
backward kernels or come after them. On a CPU (gloo) the communication runs on gloo's threads,
recorded as `gloo:*` ranges; those threads become the lanes.

The top lane holds the step's named ranges (forward, backward, gradient synchronization,
optimizer step; see profiling/ranges.py). On a CPU they are drawn as recorded. On a GPU a range
is drawn where its kernels ran: from the first to the last kernel *launched* inside it (kernel
and launch call share a correlation id), since the CPU runs ahead of the GPU, and autograd
launches the backward kernels from its own thread. Communication kernels do not stretch the
compute phases (they would hide the overlap this is meant to show), except gradient
synchronization, whose kernels may be all communication. `plot_timeline(events)` draws the lanes.
"""

from __future__ import annotations

import pandas as pd

PHASES = ("forward", "backward", "gradient synchronization", "optimizer step")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
COLLECTIVE_PREFIXES = ("gloo:", "nccl:")
COLOURS = {"compute": "#4c72b0", "communication": "#dd8452"}
PHASE_COLOURS = dict(zip(PHASES, ("#8172b3", "#55a868", "#c44e52", "#937860")))


def _is_communication(name: str) -> bool:
    return "nccl" in name.lower() or name.startswith(COLLECTIVE_PREFIXES)


def _gpu_phase_spans(spans: list[dict], phases: list[dict]) -> list[tuple]:
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in spans
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
    }
    kernels = [e for e in spans if e.get("cat") in GPU_CATEGORIES and e.get("args", {}).get("correlation") in launches]
    rows = []
    for phase in phases:
        start, end = phase["ts"], phase["ts"] + phase["dur"]
        inside = [k for k in kernels if start <= launches[k["args"]["correlation"]] <= end]
        if phase["name"] != "gradient synchronization":
            inside = [k for k in inside if not _is_communication(k["name"])]
        if inside:
            first = min(k["ts"] for k in inside)
            rows.append(("step phases", "phase", phase["name"], first, max(k["ts"] + k["dur"] for k in inside) - first))
    return rows


def timeline_events(trace: dict) -> pd.DataFrame:
    """Spans of a chrome trace: columns lane, kind ("phase"/"compute"/"communication"), name, start_us, dur_us."""
    spans = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    phases = [e for e in spans if e.get("cat") == "user_annotation" and e["name"] in PHASES]
    on_gpu = any(e.get("cat") in GPU_CATEGORIES for e in spans)
    if on_gpu:
        rows = _gpu_phase_spans(spans, phases)
        for e in spans:
            if e.get("cat") in GPU_CATEGORIES:
                kind = "communication" if _is_communication(e["name"]) else "compute"
                rows.append((f"GPU {e['pid']} stream {e['tid']}", kind, e["name"], e["ts"], e["dur"]))
    else:
        rows = [("step phases", "phase", e["name"], e["ts"], e["dur"]) for e in phases]
        rows += [
            (f"thread {e['tid']}", "communication", e["name"], e["ts"], e["dur"])
            for e in spans
            if e.get("cat") == "user_annotation" and e["name"].startswith(COLLECTIVE_PREFIXES)
        ]
    df = pd.DataFrame(rows, columns=["lane", "kind", "name", "start_us", "dur_us"])
    if not df.empty:
        df["start_us"] = df["start_us"].astype(float) - df["start_us"].min()
    return df


def overlap_fraction(events: pd.DataFrame, phase: str = "backward") -> float:
    """Share of the communication time that falls inside `phase`'s span(s)."""
    comm = events[events.kind == "communication"]
    windows = events[(events.kind == "phase") & (events.name == phase)]
    total = comm.dur_us.sum()
    if total == 0 or windows.empty:
        return 0.0
    inside = 0.0
    for w_start, w_dur in zip(windows.start_us, windows.dur_us):
        lo = comm.start_us.clip(lower=w_start)
        hi = (comm.start_us + comm.dur_us).clip(upper=w_start + w_dur)
        inside += (hi - lo).clip(lower=0).sum()
    return float(inside / total)


def communication_after(events: pd.DataFrame, phase: str = "backward") -> float:
    """Milliseconds from the end of `phase` to the end of the last communication span."""
    comm = events[events.kind == "communication"]
    windows = events[(events.kind == "phase") & (events.name == phase)]
    if comm.empty or windows.empty:
        return 0.0
    return max(0.0, float((comm.start_us + comm.dur_us).max() - (windows.start_us + windows.dur_us).max()) / 1e3)


def plot_timeline(events: pd.DataFrame, title: str = "", ax=None):
    """One row per lane (phases on top), spans as bars: compute blue, communication orange."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes = ["step phases", *sorted(name for name in events.lane.unique() if name != "step phases")]
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 0.6 * len(lanes) + 1.2))
    for y, lane in enumerate(lanes):
        spans = events[events.lane == lane]
        for kind, group in spans.groupby("kind"):
            if kind == "phase":
                for _, span in group.iterrows():
                    ax.broken_barh(
                        [(span.start_us / 1e3, span.dur_us / 1e3)],
                        (y - 0.4, 0.8),
                        color=PHASE_COLOURS[span["name"]],
                        alpha=0.8,
                    )
                    ax.text(
                        (span.start_us + span.dur_us / 2) / 1e3, y, span["name"], ha="center", va="center", fontsize=7
                    )
            else:
                bars = list(zip(group.start_us / 1e3, group.dur_us / 1e3))
                ax.broken_barh(bars, (y - 0.4, 0.8), color=COLOURS[kind])
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel("time in the profiled step (ms)")
    ax.set_title(title)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], loc="lower right", fontsize=8)
    return ax.figure


def plot_timelines(timelines: dict[str, pd.DataFrame]):
    """The timelines one above the other, on a shared time axis."""
    import matplotlib.pyplot as plt

    heights = [events.lane.nunique() + 1 for events in timelines.values()]
    fig, axes = plt.subplots(
        len(timelines),
        1,
        figsize=(12, 0.55 * sum(heights) + 1.5),
        sharex=True,
        gridspec_kw=dict(height_ratios=heights),
        squeeze=False,
    )
    for ax, (title, events) in zip(axes[:, 0], timelines.items()):
        plot_timeline(events, title, ax=ax)
    fig.tight_layout()
    return fig
