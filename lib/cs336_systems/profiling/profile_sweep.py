"""The nsys_profile questions over a grid of model sizes and context lengths, from torch.profiler.

Each (size, context) is profiled twice: an inference forward pass ("forward" mode) and a full
training step ("train-step": forward, loss, backward, AdamW). From each trace, only the measured
steps count (the "measured step" range filters the warm-up out, as the NVTX filter does in
Nsight Systems), and kernels are attributed to scopes by the range their launch sits in:

    forward            the forward range of the forward-mode run        (questions b, c, d, e)
    forward+backward   the training step without its optimizer range   (question b)
    training step      the whole measured training step                (question d)

The result keeps only summaries (per-kernel, per-category and per-range tables, one row per run)
so a sweep over large models does not hold every trace in memory; the trace of one chosen
configuration can be kept on disk for the timeline figure and for Perfetto.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from cs336_systems.accounting.flops import attention_flops
from cs336_systems.benchmarking.harness import BenchmarkConfig
from cs336_systems.profiling.torch_profile import MEASURED, category_summary, kernel_summary, profile_benchmark, range_summary

SCOPES = {
    "forward": dict(mode="forward", within=[MEASURED, "forward"], exclude=None),
    "forward+backward": dict(mode="train-step", within=[MEASURED], exclude="optimizer step"),
    "training step": dict(mode="train-step", within=[MEASURED], exclude=None),
}
PHASES = ("forward", "backward", "optimizer step")
ATTENTION_RANGES = ("computing attention scores", "computing softmax", "final matmul")


@dataclass
class ProfileSweep:
    runs: pd.DataFrame            # one row per (size, context, mode): status, profiled step time, phase times
    kernels: pd.DataFrame         # kernel summaries, with size, context_length and scope columns
    categories: pd.DataFrame      # category summaries, same keys
    attention: pd.DataFrame       # per (size, context): time per attention range and its FLOPs (forward)
    traces: dict[tuple[str, int, str], Path] = field(default_factory=dict)
    unit: str = "CUDA kernel"     # or "CPU operator" on a CPU-only trace


def profile_sweep(
    base: BenchmarkConfig,
    sizes: Sequence[str],
    contexts: Sequence[int],
    trace_for: tuple[str, int] | None = None,
    trace_dir: str | Path | None = None,
    progress: bool = True,
) -> ProfileSweep:
    """Profile forward and training steps of every (size, context); keep the trace of `trace_for`."""
    runs, kernels, categories, attention, traces = [], [], [], [], {}
    unit = "CUDA kernel"
    jobs = [(s, c, m) for s in sizes for c in contexts for m in ("forward", "train-step")]
    for size, context, mode in tqdm(jobs, desc="profiling", disable=not progress, leave=False):
        config = replace(base, size=size, context_length=context, mode=mode, model_context_length=None)
        keep = trace_for == (size, context) and trace_dir is not None
        path = Path(trace_dir) / f"trace_{size}_ctx{context}_{mode}.json.gz" if keep else None
        run = profile_benchmark(config, trace_path=path)
        key = dict(size=size, context_length=context)
        row = {**key, "mode": mode, "status": run.status}
        if run.status != "ok":
            runs.append(row)
            continue
        unit = run.unit
        if path is not None:
            traces[(size, context, mode)] = path
        ev = run.events
        row["profiled_step_ms"] = statistics.fmean(run.step_times_ms)
        phases = range_summary(ev, PHASES, within=MEASURED).set_index("range")
        for phase in PHASES:
            if phases.loc[phase, "instances"]:
                tag = phase.replace(" ", "_")
                row.update({f"{tag}_wall_ms": phases.loc[phase, "wall_ms"], f"{tag}_compute_ms": phases.loc[phase, "compute_ms"],
                            f"{tag}_gpu_span_ms": phases.loc[phase, "gpu_span_ms"]})
        runs.append(row)
        for scope, spec in SCOPES.items():
            if spec["mode"] != mode:
                continue
            per = "forward" if scope == "forward" else None
            kernels.append(kernel_summary(ev, spec["within"], per=per, exclude=spec["exclude"]).assign(**key, scope=scope))
            categories.append(category_summary(ev, spec["within"], exclude=spec["exclude"]).assign(**key, scope=scope))
        if mode == "forward":
            parts = range_summary(ev, ATTENTION_RANGES, within=[MEASURED, "forward"])
            flops = attention_flops(config.model_config(), config.batch_size, context)
            parts["flops_per_layer"] = parts["range"].map(flops)
            attention.append(parts.assign(**key))
        del run, ev
    return ProfileSweep(
        runs=pd.DataFrame(runs),
        kernels=pd.concat(kernels, ignore_index=True) if kernels else pd.DataFrame(),
        categories=pd.concat(categories, ignore_index=True) if categories else pd.DataFrame(),
        attention=pd.concat(attention, ignore_index=True) if attention else pd.DataFrame(),
        traces=traces,
        unit=unit,
    )


def top_kernels(sweep: ProfileSweep, scope: str) -> pd.DataFrame:
    """Per (size, context): the kernel with the most time in `scope`, its share and instances."""
    k = sweep.kernels[sweep.kernels["scope"] == scope]
    if k.empty:
        return pd.DataFrame(columns=["size", "context_length", "kernel", "category", "share", "instances"])
    top = k.loc[k.groupby(["size", "context_length"], sort=False)["total_ms"].idxmax()]
    columns = ["size", "context_length", "kernel", "category", "total_ms", "share", "instances"]
    columns += ["instances_per_range"] if "instances_per_range" in top and top["instances_per_range"].notna().any() else []
    return top[columns + ["name"]].reset_index(drop=True)


def matmul_shares(sweep: ProfileSweep) -> pd.DataFrame:
    """Per (size, context): each category's share of time, inference forward vs training step.

    A category absent from a run that was profiled has share 0; a run that was not profiled
    (out of memory) stays NaN, so medians and ranges skip it instead of counting a 0% share.
    """
    scopes = ["forward", "training step"]
    c = sweep.categories[sweep.categories["scope"].isin(scopes)]
    wide = c.pivot_table(index=["size", "context_length", "category"], columns="scope", values="share", aggfunc="first")
    wide = wide.reindex(columns=scopes)
    profiled = c.groupby(["size", "context_length", "scope"]).size().unstack("scope").reindex(columns=scopes).notna()
    ran = profiled.reindex(wide.index.droplevel("category")).to_numpy()
    wide = wide.mask(wide.isna() & ran, 0.0)
    return wide.reset_index()
