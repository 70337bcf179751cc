"""Profile a benchmark with torch.profiler and summarise where the time goes, range by range.

`profile_benchmark(config)` builds the harness's model and batch and runs its warm-up and
measured steps under torch.profiler (CPU activity, plus CUDA through CUPTI when the device is a
GPU), exports the Chrome/Perfetto trace and loads it as a DataFrame (profiling/trace.py). The
harness already wraps steps in the ranges "warmup step"/"measured step", "forward", "backward",
"optimizer step", and naive attention in "computing attention scores", "computing softmax",
"final matmul"; `annotated()` also opens NVTX ranges, so `nsys profile python -m
cs336_systems.benchmarking ...` sees the same ranges.

The summaries work on "compute events": GPU kernels (and memcpy/memset) on a GPU trace, or CPU
operators with their *self* time on a CPU trace (so nested operators are not counted twice).

    kernel_summary(events, within=["measured step", "forward"])
        kernel, category, total_ms, instances, avg_us, share of the selection's compute time
    range_summary(events, ["forward", "backward"], within="measured step")
        per range: instances, mean CPU wall time, mean compute time, mean GPU span
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cs336_systems.benchmarking.harness import (
    BenchmarkConfig,
    TrainingSetup,
    build,
    free_device_memory,
    is_out_of_memory,
    time_steps,
)
from cs336_systems.profiling.kernel_names import kernel_category, short_kernel_name
from cs336_systems.profiling.trace import GPU_KINDS, count_range_instances, events_in_ranges, load_trace

MEASURED = "measured step"


@dataclass
class ProfiledRun:
    """A profiled benchmark: its events, the trace file (if kept), the step times seen under the profiler."""

    config: BenchmarkConfig
    status: str  # "ok" or "OOM"
    events: pd.DataFrame | None = None
    trace_path: Path | None = None
    step_times_ms: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def on_gpu(self) -> bool:
        return self.events is not None and bool(self.events["kind"].isin(GPU_KINDS).any())

    @property
    def unit(self) -> str:
        """What the compute events are, for generated prose."""
        return "CUDA kernel" if self.on_gpu else "CPU operator"


def profiler_activities(device: torch.device) -> list[torch.profiler.ProfilerActivity]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def profile_benchmark(
    config: BenchmarkConfig,
    trace_path: str | Path | None = None,
    record_shapes: bool = False,
    with_stack: bool = False,
    profile_memory: bool = False,
    profiled_warmup: int = 1,
    builder: Callable[[BenchmarkConfig], TrainingSetup] = build,
) -> ProfiledRun:
    """Run `config` (warm-up + measured steps) under torch.profiler; OOM becomes status "OOM".

    Only the last `profiled_warmup` warm-up steps run under the profiler (the earlier ones before
    it starts), which keeps traces small while still showing why the "measured step" range filter
    matters. The trace goes to `trace_path` (Chrome JSON, or gzipped if the name ends in .gz; it
    opens in Perfetto / chrome://tracing); with no path it goes to a temporary file, is loaded and
    deleted. `builder` makes the model and batch (the harness's `build`; the Llama reference passes
    its own).
    """
    if profiled_warmup < 0:
        raise ValueError(f"profiled_warmup must be >= 0, got {profiled_warmup}")
    device = config.resolved_device()
    setup = None
    try:
        setup = builder(config)
        profiled = min(profiled_warmup, config.warmup)
        time_steps(setup.step, config.warmup - profiled, 0, device)
        with torch.profiler.profile(
            activities=profiler_activities(device),
            record_shapes=record_shapes,
            with_stack=with_stack,
            profile_memory=profile_memory,
        ) as prof:
            _, measured = time_steps(setup.step, profiled, config.steps, device)
    except Exception as err:  # noqa: BLE001 - only out-of-memory becomes a row
        if not is_out_of_memory(err):
            raise
        return ProfiledRun(config, "OOM", error=str(err).splitlines()[0][:200])
    finally:
        del setup
        free_device_memory()
    step_ms = [t * 1e3 for t in measured]
    if trace_path is None:
        with tempfile.TemporaryDirectory() as tmp:
            prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
            return ProfiledRun(config, "ok", load_trace(Path(tmp) / "trace.json"), None, step_ms)
    path = Path(trace_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return ProfiledRun(config, "ok", load_trace(path), path, step_ms)


def compute_events(
    events: pd.DataFrame,
    within: Sequence[str] | str | None = None,
    exclude: Sequence[str] | str | None = None,
) -> pd.DataFrame:
    """Kernels (GPU trace) or CPU operators with their self time (CPU trace) inside every `within`
    range and outside every `exclude` range.

    Columns: name, kernel (short name), category, time_us, plus the trace columns.
    """
    gpu = events["kind"].isin(GPU_KINDS).any()
    kinds = GPU_KINDS if gpu else ("cpu_op",)
    selected = events_in_ranges(events, within, kinds=kinds)
    for name in [exclude] if isinstance(exclude, str) else exclude or []:
        selected = selected[~selected.index.isin(events_in_ranges(events, name, kinds=kinds).index)]
    selected = selected.copy()
    selected["time_us"] = selected["dur_us"] if gpu else selected["self_us"]
    names = selected["name"].unique()
    selected["kernel"] = selected["name"].map({n: short_kernel_name(n) for n in names})
    selected["category"] = selected["name"].map({n: kernel_category(n) for n in names})
    return selected


def kernel_summary(
    events: pd.DataFrame,
    within: Sequence[str] | str | None = MEASURED,
    per: str | None = None,
    top: int | None = None,
    exclude: Sequence[str] | str | None = None,
) -> pd.DataFrame:
    """Per kernel (or CPU operator): total time, instances, average, share of the selection's time.

    `within` restricts to launches inside every named range (e.g. ["measured step", "forward"]),
    `exclude` drops launches inside any of its ranges (e.g. "optimizer step"). `per="forward"`
    adds `instances_per_range`: instances divided by how many such ranges `within` holds (e.g.
    invocations per forward pass). Sorted by total time, largest first.
    """
    compute = compute_events(events, within, exclude)
    total = compute["time_us"].sum()
    summary = (
        compute.groupby("name")
        .agg(
            kernel=("kernel", "first"),
            category=("category", "first"),
            total_us=("time_us", "sum"),
            instances=("time_us", "size"),
        )
        .reset_index()
        .sort_values("total_us", ascending=False, kind="stable")
    )
    summary["total_ms"] = summary["total_us"] / 1e3
    summary["avg_us"] = summary["total_us"] / summary["instances"]
    summary["share"] = summary["total_us"] / total if total > 0 else np.nan
    if per is not None:
        n = count_range_instances(events, per, within)
        if n == 0:
            raise ValueError(f"no {per!r} ranges inside {within!r}")
        summary["instances_per_range"] = summary["instances"] / n
    columns = ["kernel", "category", "total_ms", "instances", "avg_us", "share"]
    columns += ["instances_per_range"] if per is not None else []
    summary = summary[columns + ["name"]].reset_index(drop=True)
    return summary.head(top) if top else summary


def category_summary(
    events: pd.DataFrame,
    within: Sequence[str] | str | None = MEASURED,
    exclude: Sequence[str] | str | None = None,
) -> pd.DataFrame:
    """Total time and share per kernel category (matmul, elementwise, ...) inside the ranges."""
    compute = compute_events(events, within, exclude)
    total = compute["time_us"].sum()
    summary = compute.groupby("category")["time_us"].agg(total_us="sum", instances="size").reset_index()
    summary["total_ms"] = summary["total_us"] / 1e3
    summary["share"] = summary["total_us"] / total if total > 0 else np.nan
    return summary.sort_values("total_us", ascending=False)[["category", "total_ms", "instances", "share"]].reset_index(
        drop=True
    )


def range_summary(
    events: pd.DataFrame, names: Sequence[str], within: Sequence[str] | str | None = MEASURED
) -> pd.DataFrame:
    """Per named range (instances inside `within`): count, mean CPU wall ms, mean compute ms, mean GPU span ms.

    compute ms sums the kernels (or CPU operator self times) launched inside each instance; the
    GPU span runs from the first kernel's start to the last kernel's end of the instance, i.e.
    the time the GPU needed for it (NaN on a CPU trace).
    """
    compute = compute_events(events, within)
    gpu = events["kind"].isin(GPU_KINDS).any()
    rows = []
    for name in names:
        spans = events_in_ranges(events, within, kinds=("range",))
        spans = spans[spans["name"] == name]
        compute_ms, gpu_span_ms = [], []
        for _, r in spans.iterrows():
            inside = compute[
                (compute["source"] == r["source"])
                & (compute["host_pid"] == r["pid"])
                & (compute["launch_ts_us"] >= r["ts_us"])
                & (compute["launch_ts_us"] < r["end_us"])
            ]
            compute_ms.append(inside["time_us"].sum() / 1e3)
            gpu_span_ms.append(
                (inside["end_us"].max() - inside["ts_us"].min()) / 1e3 if gpu and len(inside) else np.nan
            )
        rows.append(
            dict(
                range=name,
                instances=len(spans),
                wall_ms=spans["dur_us"].mean() / 1e3 if len(spans) else np.nan,
                compute_ms=float(np.mean(compute_ms)) if compute_ms else np.nan,
                gpu_span_ms=float(np.nanmean(gpu_span_ms)) if gpu and compute_ms else np.nan,
            )
        )
    return pd.DataFrame(rows)


STEP_PHASES = ("forward", "backward", "optimizer step")


def step_phases(setup: TrainingSetup, steps: int = 2) -> dict:
    """Where a training step's time goes, from `steps` more steps of `setup` under torch.profiler.

    Per phase (forward, backward, optimizer step): the CPU wall time and the compute time of
    what it launched (kernels on a GPU, operators on a CPU), means over the profiled steps; keys
    `{phase}_wall_ms` and `{phase}_compute_ms` with phase forward, backward or optimizer. Wall
    well above compute means the host, not the device, set the pace of that phase. Meant as
    `run_benchmark(config, then=step_phases)`, which profiles the model it has just timed.
    """
    if setup.config.mode != "train-step":
        raise ValueError(f"step phases need a train-step setup, got mode {setup.config.mode!r}")
    with torch.profiler.profile(activities=profiler_activities(setup.device)) as prof:
        time_steps(setup.step, 0, steps, setup.device)
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
        events = load_trace(Path(tmp) / "trace.json")
    ranges = range_summary(events, STEP_PHASES).set_index("range")
    row = {}
    for phase in STEP_PHASES:
        key = phase.replace(" step", "")
        row[f"{key}_wall_ms"] = float(ranges.loc[phase, "wall_ms"])
        row[f"{key}_compute_ms"] = float(ranges.loc[phase, "compute_ms"])
    return row
