"""The nsys_profile questions over a grid of model sizes and context lengths, from torch.profiler.

Each (size, context) is profiled twice: an inference forward pass ("forward" mode) and a full
training step ("train-step": forward, loss, backward, AdamW). From each trace, only the measured
steps count (the "measured step" range filters the warm-up out, as the NVTX filter does in
Nsight Systems), and kernels are attributed to scopes by the range their launch sits in:

    forward            the forward range of the forward-mode run        (questions b, c, d, e)
    forward+backward   the training step without its optimizer range   (question b)
    training step      the whole measured training step                (question d)

The 2026 handout asks for the longest context that fits: `profile_sweep(..., until_oom=True)` goes
up a ladder of contexts (`context_ladder`: 256, 512, ... up to a cap that bounds the run time) and
stops a size after the first context whose training step runs out of memory; `longest_contexts`
reads what it found from the rows.

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
from cs336_systems.profiling.torch_profile import (
    MEASURED,
    category_summary,
    kernel_summary,
    profile_benchmark,
    range_summary,
)

SCOPES = {
    "forward": dict(mode="forward", within=[MEASURED, "forward"], exclude=None),
    "forward+backward": dict(mode="train-step", within=[MEASURED], exclude="optimizer step"),
    "training step": dict(mode="train-step", within=[MEASURED], exclude=None),
}
PHASES = ("forward", "backward", "optimizer step")
ATTENTION_RANGES = ("computing attention scores", "computing softmax", "final matmul")


@dataclass
class ProfileSweep:
    runs: pd.DataFrame  # one row per (size, context, mode): status, profiled step time, phase times
    kernels: pd.DataFrame  # kernel summaries, with size, context_length and scope columns
    categories: pd.DataFrame  # category summaries, same keys
    attention: pd.DataFrame  # per (size, context): time per attention range and its FLOPs (forward)
    traces: dict[tuple[str, int, str], Path] = field(default_factory=dict)
    unit: str = "CUDA kernel"  # or "CPU operator" on a CPU-only trace


def context_ladder(start: int, cap: int) -> list[int]:
    """The powers of two from `start` (itself a power of two) up to `cap`: 256, 512, ..., cap."""
    if start < 1 or start & (start - 1):
        raise ValueError(f"the ladder starts at a power of two, got {start}")
    if cap < start:
        raise ValueError(f"the cap ({cap}) is below the start ({start})")
    return [start << k for k in range((cap // start).bit_length())]


def profile_sweep(
    base: BenchmarkConfig,
    sizes: Sequence[str],
    contexts: Sequence[int],
    trace_for: tuple[str, int] | None = None,
    trace_dir: str | Path | None = None,
    progress: bool = True,
    until_oom: bool = False,
    known: pd.DataFrame | None = None,
) -> ProfileSweep:
    """Profile forward and training steps of every (size, context); keep the trace of `trace_for`.

    With `until_oom`, each size goes up `contexts` in ascending order and stops after the first context
    whose training step runs out of memory (that context's rows are kept, the OOM among them): the
    search for the longest context that fits. `known` holds `runs` rows of configurations profiled
    already (another sweep's); they are not profiled again, but their status counts for stopping.
    """
    tables = _Tables()
    seen = (
        {}
        if known is None
        else {(r["size"], int(r["context_length"]), r["mode"]): r["status"] for r in known.to_dict("records")}
    )
    order = sorted(contexts) if until_oom else list(contexts)
    bar = tqdm(total=len(sizes) * len(order) * 2, desc="profiling", disable=not progress, leave=False)
    for size in sizes:
        for context in order:
            status = {}
            for mode in ("forward", "train-step"):
                bar.update()
                if (size, context, mode) in seen:
                    status[mode] = seen[(size, context, mode)]
                    continue
                config = replace(base, size=size, context_length=context, mode=mode, model_context_length=None)
                keep = trace_for == (size, context) and trace_dir is not None
                path = Path(trace_dir) / f"trace_{size}_ctx{context}_{mode}.json.gz" if keep else None
                status[mode] = tables.add(config, path)
            if until_oom and status["train-step"] != "ok":
                break
    bar.close()
    return tables.sweep()


@dataclass
class _Tables:
    """What a sweep collects, run by run: only summaries, so that no trace stays in memory."""

    runs: list[dict] = field(default_factory=list)
    kernels: list[pd.DataFrame] = field(default_factory=list)
    categories: list[pd.DataFrame] = field(default_factory=list)
    attention: list[pd.DataFrame] = field(default_factory=list)
    traces: dict[tuple[str, int, str], Path] = field(default_factory=dict)
    unit: str = "CUDA kernel"

    def add(self, config: BenchmarkConfig, path: Path | None) -> str:
        """Profiles one configuration (keeping its trace at `path`, if given) and returns its status."""
        size, context, mode = config.size, config.context_length, config.mode
        run = profile_benchmark(config, trace_path=path)
        key = dict(size=size, context_length=context)
        row = {
            **key,
            "mode": mode,
            "status": run.status,
            "batch_size": config.batch_size,
            "precision": config.precision,
        }
        self.runs.append(row)
        if run.status != "ok":
            return run.status
        self.unit = run.unit
        if path is not None:
            self.traces[(size, context, mode)] = path
        ev = run.events
        row["profiled_step_ms"] = statistics.fmean(run.step_times_ms)
        phases = range_summary(ev, PHASES, within=MEASURED).set_index("range")
        for phase in PHASES:
            if phases.loc[phase, "instances"]:
                tag = phase.replace(" ", "_")
                row.update(
                    {
                        f"{tag}_wall_ms": phases.loc[phase, "wall_ms"],
                        f"{tag}_compute_ms": phases.loc[phase, "compute_ms"],
                        f"{tag}_gpu_span_ms": phases.loc[phase, "gpu_span_ms"],
                    }
                )
        for scope, spec in SCOPES.items():
            if spec["mode"] != mode:
                continue
            per = "forward" if scope == "forward" else None
            self.kernels.append(
                kernel_summary(ev, spec["within"], per=per, exclude=spec["exclude"]).assign(**key, scope=scope)
            )
            self.categories.append(
                category_summary(ev, spec["within"], exclude=spec["exclude"]).assign(**key, scope=scope)
            )
        if mode == "forward":
            parts = range_summary(ev, ATTENTION_RANGES, within=[MEASURED, "forward"])
            flops = attention_flops(config.model_config(), config.batch_size, context)
            parts["flops_per_layer"] = parts["range"].map(flops)
            self.attention.append(parts.assign(**key))
        return run.status

    def sweep(self) -> ProfileSweep:
        return ProfileSweep(
            runs=pd.DataFrame(self.runs),
            kernels=_concat(self.kernels),
            categories=_concat(self.categories),
            attention=_concat(self.attention),
            traces=self.traces,
            unit=self.unit,
        )


def _concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def combine(*sweeps: ProfileSweep) -> ProfileSweep:
    """One sweep from several (a grid and the longest-context search beside it), rows in order."""
    profiled = [s for s in sweeps if len(s.kernels)]  # only a sweep that profiled something knows its unit
    return ProfileSweep(
        runs=_concat([s.runs for s in sweeps]),
        kernels=_concat([s.kernels for s in sweeps]),
        categories=_concat([s.categories for s in sweeps]),
        attention=_concat([s.attention for s in sweeps]),
        traces={k: v for s in sweeps for k, v in s.traces.items()},
        unit=(profiled or sweeps)[0].unit,
    )


def longest_contexts(runs: pd.DataFrame, sizes: Sequence[str], contexts: Sequence[int]) -> pd.DataFrame:
    """Per size, what the search up `contexts` found. A context fits when its whole training step (forward,
    loss, backward, AdamW) and its forward both ran. Columns: size, fits (the contexts that fit, e.g.
    "256,512"), longest_fits, out_of_memory (the first context whose training step ran out of memory; empty
    when every context tried fits), forward_fits_there (whether the forward alone still ran at it),
    tried_from, tried_up_to, and the analytic peak of that training step where `runs` has it."""
    rows = []
    for size in sizes:
        mine = runs[(runs["size"] == size) & runs.context_length.isin(contexts)]
        status = {(int(r.context_length), r.mode): r.status for r in mine.itertuples()}
        tried = sorted({c for c, _ in status})
        fits = [c for c in tried if status.get((c, "forward")) == "ok" and status.get((c, "train-step")) == "ok"]
        oom = next((c for c in tried if status.get((c, "train-step")) not in (None, "ok")), None)
        row = dict(
            size=size,
            fits=",".join(map(str, fits)),
            longest_fits=max(fits) if fits else None,
            out_of_memory=oom,
            forward_fits_there=None if oom is None else status.get((oom, "forward")) == "ok",
            tried_from=min(tried) if tried else None,
            tried_up_to=max(tried) if tried else None,
        )
        if oom is not None:
            at = mine[(mine.context_length == oom) & (mine["mode"] == "train-step")].iloc[0]
            row.update(
                {
                    col: at[col]
                    for col in ("predicted_peak_gib", "predicted_states_gib", "device_memory_gib")
                    if col in at.index
                }
            )
        rows.append(row)
    return pd.DataFrame(rows)


def top_kernels(sweep: ProfileSweep, scope: str) -> pd.DataFrame:
    """Per (size, context): the kernel with the most time in `scope`, its share and instances."""
    k = sweep.kernels[sweep.kernels["scope"] == scope]
    if k.empty:
        return pd.DataFrame(columns=["size", "context_length", "kernel", "category", "share", "instances"])
    top = k.loc[k.groupby(["size", "context_length"], sort=False)["total_ms"].idxmax()]
    columns = ["size", "context_length", "kernel", "category", "total_ms", "share", "instances"]
    columns += (
        ["instances_per_range"] if "instances_per_range" in top and top["instances_per_range"].notna().any() else []
    )
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
