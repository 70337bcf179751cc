"""Timeline figures from profiler traces: one lane per GPU stream (or CPU thread), named ranges above.

    events = load_trace("trace.json")                       # or several, pd.concat'ed with a source each
    fig = plot_timeline(events, ranges=["forward", "backward", "optimizer step"],
                        window="measured step", title="small, context 256")

Kernels are coloured by category (matmul, elementwise, communication, ...), so NCCL kernels on
their own stream stand out next to the compute stream. Without GPU events (a CPU profile) the
lanes are CPU threads and the bars are their outermost operators. The ranges are drawn from the
GPU-side copies of the annotations when the trace has them (they line up with the kernels),
else from the CPU-side ranges.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from cs336_systems.profiling.kernel_names import CATEGORIES, kernel_category
from cs336_systems.profiling.trace import GPU_KINDS, load_trace, range_instances

__all__ = ["CATEGORY_COLORS", "lane_events", "load_trace", "plot_timeline", "range_span", "timeline_window"]

CATEGORY_COLORS = dict(
    zip(
        CATEGORIES,
        [
            "#0173b2",
            "#56b4e9",
            "#cc78bc",
            "#029e73",
            "#de8f05",
            "#949494",
            "#d55e00",
            "#ece133",
            "#ca9161",
        ],
    )
)


def lane_events(events: pd.DataFrame, kinds: Sequence[str] | None = None) -> pd.DataFrame:
    """The events drawn as bars: GPU kernels/copies if the trace has any, else outermost CPU operators."""
    if kinds is None:
        kinds = GPU_KINDS if events["kind"].isin(GPU_KINDS).any() else ("cpu_op",)
    drawn = events[events["kind"].isin(list(kinds))]
    if list(kinds) == ["cpu_op"]:
        drawn = drawn[drawn["depth"] == 0]
    return drawn


def timeline_window(
    events: pd.DataFrame, window: str | tuple[float, float] | None, gpu: bool, instance: int = 0
) -> tuple[float, float]:
    """(start_us, end_us): a given pair, an instance of a named range, or the span of all events."""
    if window is None:
        return float(events["ts_us"].min()), float(events["end_us"].max())
    if isinstance(window, str):
        spans = range_instances(events, window, gpu=gpu)
        if spans.empty:
            spans = range_instances(events, window)
        if len(spans) <= instance:
            raise ValueError(
                f"the trace has {len(spans)} instance(s) of range {window!r}; asked for instance {instance}"
            )
        row = spans.iloc[instance]
        return float(row["ts_us"]), float(row["end_us"])
    start, end = window
    if end <= start:
        raise ValueError(f"timeline window must have end > start, got {window}")
    return float(start), float(end)


def range_span(
    events: pd.DataFrame, first: str, last: str, after_us: float = float("-inf"), gpu: bool = True
) -> tuple[float, float]:
    """(start_us, end_us) from the first `first` range that starts after `after_us` (CPU time) to the
    end of the first `last` range after that; on the GPU copies of the ranges when the trace has one
    per CPU range (they line up with the kernels), else on the CPU ranges."""
    starts, ends = range_instances(events, first), range_instances(events, last)
    i, j = int((starts["ts_us"] < after_us).sum()), int((ends["ts_us"] < after_us).sum())
    if i >= len(starts) or j >= len(ends):
        raise ValueError(f"no {first!r} ... {last!r} ranges after t = {after_us} us")
    if gpu:
        gpu_starts, gpu_ends = range_instances(events, first, gpu=True), range_instances(events, last, gpu=True)
        if len(gpu_starts) == len(starts) and len(gpu_ends) == len(ends):
            starts, ends = gpu_starts, gpu_ends
    return float(starts.iloc[i]["ts_us"]), float(ends.iloc[j]["end_us"])


def plot_timeline(
    events: pd.DataFrame,
    ranges: Sequence[str] = (),
    lanes: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
    window: str | tuple[float, float] | None = None,
    instance: int = 0,
    title: str | None = None,
    width: float = 13.0,
):
    """Figure: the chosen lanes (default: all lanes with drawn events) over time in ms, ranges on top.

    `window` is a (start_us, end_us) pair or a range name (its `instance`-th occurrence); events and
    ranges are clipped to it. `lanes` picks and orders lanes by name (see `events["lane"]`).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    drawn = lane_events(events, kinds)
    gpu = drawn["kind"].isin(GPU_KINDS).any()
    t0, t1 = timeline_window(events, window, gpu, instance)
    drawn = drawn[(drawn["end_us"] > t0) & (drawn["ts_us"] < t1)]
    lane_names = list(lanes) if lanes is not None else sorted(drawn["lane"].unique(), key=_lane_order)
    missing = set(lane_names) - set(events["lane"])
    if missing:
        raise ValueError(f"unknown lanes {sorted(missing)}; the trace has {sorted(events['lane'].unique())}")
    if not lane_names:
        raise ValueError("nothing to draw: no events of the chosen kinds inside the window")

    n_rows = len(ranges) + len(lane_names)
    fig, ax = plt.subplots(figsize=(width, 0.9 + 0.42 * n_rows))
    to_ms = lambda t: (np.asarray(t, dtype=float) - t0) / 1e3  # noqa: E731
    y_labels = []
    for row, name in enumerate(ranges):
        spans = range_instances(events, name, gpu=gpu)
        if spans.empty:
            spans = range_instances(events, name)
        spans = spans[(spans["end_us"] > t0) & (spans["ts_us"] < t1)]
        y = n_rows - 1 - row
        for start, end in zip(to_ms(spans["ts_us"].clip(lower=t0)), to_ms(spans["end_us"].clip(upper=t1))):
            ax.broken_barh(
                [(start, end - start)], (y - 0.4, 0.8), facecolor="#f2e6c9", edgecolor="#8c6d31", linewidth=0.8
            )
            if end - start > 0.06 * (t1 - t0) / 1e3:
                ax.text((start + end) / 2, y, name, ha="center", va="center", fontsize=8, clip_on=True)
        y_labels.append((y, name))
    categories = drawn["name"].map(_cached_category)
    for i, lane in enumerate(lane_names):
        y = len(lane_names) - 1 - i
        in_lane = drawn["lane"] == lane
        for category, group in drawn[in_lane].groupby(categories[in_lane]):
            starts = to_ms(group["ts_us"].clip(lower=t0))
            widths = to_ms(group["end_us"].clip(upper=t1)) - starts
            ax.broken_barh(list(zip(starts, widths)), (y - 0.4, 0.8), facecolor=CATEGORY_COLORS[category], linewidth=0)
        y_labels.append((y, lane))
    ax.set_yticks([y for y, _ in y_labels], [label for _, label in y_labels], fontsize=8)
    ax.set_ylim(-0.6, n_rows - 0.4)
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel("time (ms)")
    if ranges:
        ax.axhline(len(lane_names) - 0.5, color="black", linewidth=0.6)
    present = [c for c in CATEGORIES if c in set(categories)]
    ax.legend(
        handles=[Patch(color=CATEGORY_COLORS[c], label=c) for c in present],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
        title="GPU kernels" if gpu else "CPU operators",
    )
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


_category_cache: dict[str, str] = {}


def _cached_category(name: str) -> str:
    if name not in _category_cache:
        _category_cache[name] = kernel_category(name)
    return _category_cache[name]


def _lane_order(lane: str) -> tuple:
    # Sort "GPU 0 stream 7" numerically by device and stream, keeping sources together.
    parts = [int(p) if p.isdigit() else p for p in lane.replace("·", " ").split()]
    return tuple((0, p) if isinstance(p, int) else (1, p) for p in parts)
