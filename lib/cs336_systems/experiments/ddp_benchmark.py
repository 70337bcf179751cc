"""Time a training step of the Transformer LM under each DDP flavour, all in one distributed run.

Every flavour gets a fresh model (same seed, rank 0's weights broadcast), the same local batch
(rank r takes rows r*b/n .. (r+1)*b/n - 1 of one global batch) and AdamW. Each measured step
is split into three synchronized phases, timed with `timeit.default_timer`:

    forward+backward   until the compute stream is idle (an all-reduce that a hook launched on
                       NCCL's own stream may still be running; on gloo it runs on gloo's threads)
    sync               finish_gradient_synchronization() until the device is idle: for naive and
                       flat all the communication, for the overlapping flavours only the part
                       the backward pass did not hide; torch DDP finishes inside backward() (NaN)
    optimizer          AdamW step and zero_grad

    step = the sum;   overhead = step - step of "no-communication" (the same step, no all-reduce)

On a GPU every rank runs its steps on a CUDA stream of higher priority than NCCL's
(`prioritize_compute`, compute_stream.py), so the all-reduces that overlap the backward pass take
the SMs compute leaves free instead of competing for them; `prioritize_compute=False` measures
the default (equal priorities). An untimed no-communication run warms the process up first.
Each step starts with an untimed barrier, so no rank's time includes waiting for a peer's
previous step. Per-rank times are gathered with all_gather_object; means and standard deviations
are over all ranks and measured steps, `rank_spread_ms` is the gap between the slowest and
fastest rank's mean. A flavour can also record one profiled step (chrome trace ->
ddp_timeline.timeline_events). A flavour that runs out of memory becomes a row with status "OOM".
`benchmark_ddp_sizes` runs one configuration per model size (`per_size`) in the same processes, so
start-up and the untimed warm-up run are paid once; the `size` column tells the rows apart.

Runs under `spawn` (notebooks) and torchrun alike:
    torchrun --nproc-per-node 2 -m cs336_systems.experiments.ddp_benchmark --size xl --out ddp.csv
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import timeit
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import pandas as pd
import torch
import torch.nn as nn

from cs336_systems.benchmarking.harness import free_device_memory, is_out_of_memory, synchronize
from cs336_systems.distributed.compute_stream import prioritized_compute
from cs336_systems.distributed.ddp_bucketed import DDPBucketed
from cs336_systems.distributed.ddp_flat import DDPFlat
from cs336_systems.distributed.ddp_individual import DDPIndividualParameters
from cs336_systems.distributed.ddp_naive import DDPNaive
from cs336_systems.distributed.launch import DistContext, gather_timings, launch_from_env, spawn
from cs336_systems.experiments.ddp_flavours import FLAVOURS, DDPFlavour, NoCommunication, expand_flavours
from cs336_systems.experiments.ddp_timeline import timeline_events
from cs336_systems.model import VOCAB_SIZE, TransformerLM, cross_entropy
from cs336_systems.optim import AdamW
from cs336_systems.profiling.ranges import annotated
from cs336_systems.profiling.trace import record_chrome_trace

PHASE_COLUMNS = ("fwd_bwd", "sync", "optimizer")


@dataclass(frozen=True)
class DDPBenchmarkConfig:
    size: str = "xl"
    global_batch_size: int = 4
    context_length: int = 512
    flavours: tuple[str, ...] = FLAVOURS
    bucket_sizes_mb: tuple[float | None, ...] = (1, 10, 100, 1000)
    bucket_max_ctas: tuple[int | None, ...] = (None,)  # each bucket size also with these NCCL thread-block caps
    bucket_tail_mb: tuple[float | None, ...] = (None,)  # each bucket size also with a final bucket of at most this size
    warmup: int = 3
    steps: int = 10
    world_size: int = 2
    backend: str | None = "auto"
    profile: tuple[str, ...] = ()  # flavour labels that also record one profiled step
    prioritize_compute: bool = True  # GPU: steps on a CUDA stream that outranks NCCL's (compute_stream.py)
    vocab_size: int = VOCAB_SIZE
    lr: float = 1e-4
    seed: int = 0

    def __post_init__(self):
        if self.world_size < 1 or self.global_batch_size % self.world_size:
            raise ValueError(
                f"global batch size {self.global_batch_size} must split evenly over world size {self.world_size}"
            )
        if self.warmup < 0 or self.steps < 1:
            raise ValueError(f"need warmup >= 0 and steps >= 1, got warmup={self.warmup}, steps={self.steps}")

    def variants(self) -> list[DDPFlavour]:
        return expand_flavours(self.flavours, self.bucket_sizes_mb, self.bucket_max_ctas, self.bucket_tail_mb)


def all_reduce_calls(ddp: nn.Module) -> int | None:
    """All-reduce calls per step (None for torch DDP, whose buckets are internal)."""
    params = [p for p in ddp.parameters() if p.requires_grad]
    if isinstance(ddp, DDPBucketed):
        return len(ddp.buckets)
    if isinstance(ddp, DDPFlat):
        return len({p.dtype for p in params})
    if isinstance(ddp, (DDPNaive, DDPIndividualParameters)):
        return len(params)
    return 0 if isinstance(ddp, NoCommunication) else None


def _wait_for_compute(device: torch.device) -> None:
    """Wait for the current stream only: collectives on NCCL's stream may still be running."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def run_columns(ctx: DistContext, config) -> dict:
    """The columns every row of a distributed benchmark carries: the model, the process group and the batch
    (`config` is any of the benchmarks' configurations: size, global_batch_size, context_length)."""
    return dict(
        size=config.size,
        world_size=ctx.world_size,
        backend=ctx.backend,
        global_batch_size=config.global_batch_size,
        context_length=config.context_length,
    )


def timed_step(
    ddp: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[float, float, float]:
    """One training step; seconds of (forward+backward, gradient sync, optimizer)."""
    device = inputs.device
    start = timeit.default_timer()
    with annotated("forward"):
        loss = cross_entropy(ddp(inputs), targets)
    with annotated("backward"):
        loss.backward()
    _wait_for_compute(device)
    backward_done = timeit.default_timer()
    with annotated("gradient synchronization"):
        ddp.finish_gradient_synchronization()
    synchronize(device)
    synced = timeit.default_timer()
    with annotated("optimizer step"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return backward_done - start, synced - backward_done, timeit.default_timer() - synced


def profiled_step(step) -> pd.DataFrame:
    return timeline_events(record_chrome_trace(step))


def local_batch(ctx: DistContext, config: DDPBenchmarkConfig) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(config.seed)
    tokens = torch.randint(
        0, config.vocab_size, (config.global_batch_size, config.context_length + 1), generator=generator
    )
    per_rank = config.global_batch_size // ctx.world_size
    mine = tokens[ctx.rank * per_rank : (ctx.rank + 1) * per_rank].to(ctx.device)
    return mine[:, :-1], mine[:, 1:]


def _run_flavour(
    ctx: DistContext, config: DDPBenchmarkConfig, flavour: DDPFlavour, inputs, targets
) -> tuple[dict, list, pd.DataFrame | None]:
    """This rank's info, per-step phase times and (if asked) profiled timeline for one flavour."""
    torch.manual_seed(config.seed + ctx.rank)
    model = TransformerLM.from_size(
        config.size, context_length=config.context_length, vocab_size=config.vocab_size, device=ctx.device
    )
    ddp = flavour.wrap(model)
    optimizer = AdamW(ddp.parameters(), lr=config.lr)
    info = dict(
        parameters=sum(p.numel() for p in model.parameters()),
        gradient_bytes=sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
        all_reduce_calls=all_reduce_calls(ddp),
    )

    def step():
        ctx.barrier()  # every rank starts the step together, so a step's times are not a peer's lag
        return timed_step(ddp, optimizer, inputs, targets)

    for _ in range(config.warmup):
        step()
    times = [step() for _ in range(config.steps)]
    timeline = None
    if flavour.label in config.profile:
        ctx.barrier()
        timeline = profiled_step(lambda: timed_step(ddp, optimizer, inputs, targets))
    return info, times, timeline


def _run_or_oom(
    ctx: DistContext, config: DDPBenchmarkConfig, flavour: DDPFlavour, inputs, targets
) -> tuple[str, tuple]:
    """("ok", results) or ("OOM", empty results). Ranks run the same shapes, so an out-of-memory
    error strikes all of them at the same point and the collectives issued so far still match."""
    try:
        return "ok", _run_flavour(ctx, config, flavour, inputs, targets)
    except Exception as err:  # noqa: BLE001 - only out-of-memory becomes a row
        if not is_out_of_memory(err):
            raise
        return "OOM", ({}, [], None)
    finally:
        free_device_memory()


def _summarize(flavour: DDPFlavour, info: dict, per_rank: list[list]) -> dict:
    row = dict(
        flavour=flavour.label,
        kind=flavour.name,
        bucket_size_mb=flavour.bucket_size_mb,
        max_ctas=flavour.max_ctas,
        tail_bucket_mb=flavour.tail_bucket_mb,
        status="ok",
        **info,
    )
    steps = [[sum(t) for t in times] for times in per_rank]
    every = [s * 1e3 for rank_steps in steps for s in rank_steps]
    row.update(step_ms=statistics.fmean(every), step_std_ms=statistics.stdev(every) if len(every) > 1 else 0.0)
    for i, phase in enumerate(PHASE_COLUMNS):
        values = [t[i] * 1e3 for times in per_rank for t in times]
        row[f"{phase}_ms"] = statistics.fmean(values)
        row[f"{phase}_std_ms"] = statistics.stdev(values) if len(values) > 1 else 0.0
    rank_means = [statistics.fmean(s) * 1e3 for s in steps]
    row["rank_spread_ms"] = max(rank_means) - min(rank_means)
    if flavour.name == "torch-ddp":
        row["sync_ms"] = row["sync_std_ms"] = math.nan
    return row


def compute_priority(config: DDPBenchmarkConfig, device: torch.device) -> str:
    """The `compute_priority` column: "highest" when the steps ran on a prioritized CUDA stream."""
    if device.type != "cuda":
        return "n/a (no CUDA streams)"
    return "highest" if config.prioritize_compute else "default"


def _benchmark_worker(
    ctx: DistContext, config: DDPBenchmarkConfig, warm_up: bool = True
) -> tuple[list[dict], dict[str, pd.DataFrame]]:
    if ctx.device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.world_size))
    # Everything a flavour allocates lives and dies inside this block, on the one stream it opened.
    with prioritized_compute(ctx.device) if config.prioritize_compute else contextlib.nullcontext():
        return _benchmark_flavours(ctx, config, warm_up)


def _sizes_worker(
    ctx: DistContext, configs: Sequence[DDPBenchmarkConfig]
) -> tuple[list[dict], dict[str, dict[str, pd.DataFrame]]]:
    """Every configuration in turn in these processes; the timelines by size, then flavour."""
    rows, timelines = [], {}
    for i, config in enumerate(configs):
        size_rows, timelines[config.size] = _benchmark_worker(ctx, config, warm_up=i == 0)
        rows += size_rows
    return rows, timelines


def _benchmark_flavours(
    ctx: DistContext, config: DDPBenchmarkConfig, warm_up: bool = True
) -> tuple[list[dict], dict[str, pd.DataFrame]]:
    inputs, targets = local_batch(ctx, config)
    common = dict(
        run_columns(ctx, config),
        warmup=config.warmup,
        steps=config.steps,
        compute_priority=compute_priority(config, ctx.device),
    )
    # Untimed: the first model built in a process pays one-time costs (allocator growth, kernel
    # and thread-pool start-up) that would otherwise land on the first flavour measured.
    if warm_up:
        _run_or_oom(
            ctx,
            replace(config, warmup=config.warmup + 1, steps=1, profile=()),
            DDPFlavour("no-communication"),
            inputs,
            targets,
        )
    rows, timelines = [], {}
    for flavour in config.variants():
        status, (info, times, timeline) = _run_or_oom(ctx, config, flavour, inputs, targets)
        statuses = gather_timings([status])
        per_rank = [gather_timings([t[i] for t in times]) for i in range(len(PHASE_COLUMNS))]
        if any(s != ["ok"] for s in statuses):
            rows.append(
                dict(
                    flavour=flavour.label,
                    kind=flavour.name,
                    bucket_size_mb=flavour.bucket_size_mb,
                    max_ctas=flavour.max_ctas,
                    tail_bucket_mb=flavour.tail_bucket_mb,
                    status="OOM",
                    **common,
                )
            )
            continue
        per_rank_steps = [list(zip(*(phase[r] for phase in per_rank))) for r in range(ctx.world_size)]
        rows.append({**_summarize(flavour, info, per_rank_steps), **common})
        if timeline is not None:
            timelines[flavour.label] = timeline
    return rows, timelines


def add_overheads(df: pd.DataFrame) -> pd.DataFrame:
    """overhead_ms = step - no-communication step; sync_fraction = sync / step (NaN where a flavour did not run)."""
    df = df.copy()
    for col in ("step_ms", "sync_ms"):  # absent when every flavour ran out of memory
        if col not in df:
            df[col] = math.nan
    base = df.loc[(df.kind == "no-communication") & (df.status == "ok"), "step_ms"]
    df["overhead_ms"] = df["step_ms"] - base.iloc[0] if len(base) else math.nan
    df["sync_fraction"] = df["sync_ms"] / df["step_ms"]
    return df


def benchmark_ddp(config: DDPBenchmarkConfig) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """All flavours of `config` in one spawned run: the table and the profiled timelines (rank 0's)."""
    df, timelines = benchmark_ddp_sizes([config])
    return df, timelines[config.size]


def benchmark_ddp_sizes(
    configs: Sequence[DDPBenchmarkConfig],
) -> tuple[pd.DataFrame, dict[str, dict[str, pd.DataFrame]]]:
    """All flavours of each configuration (one per model size, `per_size`) in one spawned run: the table,
    its `size` column telling them apart, and rank 0's profiled timelines by size, then flavour."""
    configs = one_per_size(configs)
    rows, timelines = spawn(
        _sizes_worker, configs[0].world_size, args=(configs,), backend=configs[0].backend, timeout_s=1800
    )[0]
    df = pd.DataFrame(rows)
    return pd.concat([add_overheads(df[df["size"] == c.size]) for c in configs], ignore_index=True), timelines


Config = TypeVar("Config")


def per_size(
    config: Config, sizes: Sequence[str], later_warmup: int | None = None, later_steps: int | None = None
) -> list[Config]:
    """One copy of a benchmark configuration (any dataclass with size, warmup and steps) per model size; the
    sizes after the first take `later_warmup` and `later_steps` where given (a shorter run for a larger model)."""
    if not sizes:
        raise ValueError("need at least one model size")
    later = {k: v for k, v in (("warmup", later_warmup), ("steps", later_steps)) if v is not None}
    return [replace(config, size=size, **(later if i else {})) for i, size in enumerate(sizes)]


def one_per_size(config) -> list:
    """A configuration, or a sequence of them for one run, as a list; checks that each names its own model
    size and that they share the processes' world size and backend."""
    configs = list(config) if isinstance(config, (list, tuple)) else [config]
    if not configs or len({c.size for c in configs}) != len(configs):
        raise ValueError(f"need one configuration per model size, got sizes {[c.size for c in configs]}")
    if len({(c.world_size, c.backend) for c in configs}) != 1:
        raise ValueError("the configurations of one run must share world_size and backend")
    return configs


def format_bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def describe_setup(df: pd.DataFrame) -> str:
    """The benchmark's setting, stated from the rows themselves: one paragraph per model size."""
    groups = df.groupby("size", sort=False) if "size" in df else [("", df)]
    return "\n\n".join(_describe_size(size, rows) for size, rows in groups)


def _describe_size(size: str, rows: pd.DataFrame) -> str:
    ok = rows[rows.status == "ok"]
    if ok.empty:
        return f"Model **{size}**: every flavour ran out of memory."
    r = ok.iloc[0]
    stream = {
        "highest": " Every step runs on a CUDA stream of the highest priority, above NCCL's (compute_stream.py).",
        "default": " Every step runs at the default CUDA stream priority, the same as NCCL's.",
    }.get(r.get("compute_priority"), "")
    return (
        f"Model **{r['size']}** ({r.parameters / 1e6:,.1f} M parameters, "
        f"{format_bytes(r.gradient_bytes)} of fp32 gradients), "
        f"global batch {r.global_batch_size} sequences of {r.context_length} tokens "
        f"({r.global_batch_size // r.world_size} per rank), "
        f"{r.world_size} ranks on {r.backend}, fp32, AdamW; "
        f"{r.warmup} warm-up and {r.steps} measured steps per flavour, "
        f"all flavours in one run, each with a fresh model and optimizer.{stream}"
    )


def stream_priority_effect(prioritized: pd.DataFrame, default: pd.DataFrame) -> pd.DataFrame:
    """Per flavour measured in both runs (`add_overheads` tables): step, forward+backward and
    overhead at the default and at the highest compute-stream priority, and each overhead as a
    share of the naive overhead of its own run."""

    def columns(df: pd.DataFrame, tag: str) -> pd.DataFrame:
        ok = df[df.status == "ok"].set_index("flavour")
        naive = ok.loc["naive", "overhead_ms"] if "naive" in ok.index else math.nan
        out = ok[["step_ms", "fwd_bwd_ms", "overhead_ms"]].add_suffix(f"_{tag}")
        out[f"share_of_naive_{tag}"] = ok.overhead_ms / naive if naive > 0 else math.nan
        return out

    both = columns(default, "default").join(columns(prioritized, "highest"), how="inner")
    return both.reset_index()


def describe_stream_priority_effect(effect: pd.DataFrame) -> str:
    """The comparison of `stream_priority_effect` in words, from its numbers."""
    rows = effect.set_index("flavour")
    parts = []
    for flavour, r in rows.drop(index="no-communication", errors="ignore").iterrows():
        part = f"{flavour} overhead {r.overhead_ms_default:.1f} → {r.overhead_ms_highest:.1f} ms"
        if flavour != "naive" and not math.isnan(r.share_of_naive_default) and not math.isnan(r.share_of_naive_highest):
            part += f" ({100 * r.share_of_naive_default:.0f}% → {100 * r.share_of_naive_highest:.0f}% of naive's)"
        parts.append(part)
    text = "From the default to the highest compute-stream priority: " + "; ".join(parts) + "."
    if "no-communication" not in rows.index:
        return text
    base = rows.loc["no-communication"]
    text += (
        f" The no-communication step moved {base.step_ms_highest - base.step_ms_default:+.1f} ms "
        f"({base.step_ms_default:.1f} → {base.step_ms_highest:.1f} ms), with nothing running beside the compute."
    )
    overlapped = [f for f in rows.index if f not in ("no-communication", "naive")]
    if overlapped:
        text += (
            " Forward+backward slowdown against no communication, where the overlapped all-reduces act: "
            + "; ".join(
                f"{f} {rows.loc[f].fwd_bwd_ms_default - base.fwd_bwd_ms_default:.1f} → "
                f"{rows.loc[f].fwd_bwd_ms_highest - base.fwd_bwd_ms_highest:.1f} ms"
                for f in overlapped
            )
            + "."
        )
    return text


def plot_step_breakdown(df: pd.DataFrame, title: str = ""):
    """Stacked bars: forward+backward, gradient sync, optimizer per flavour; the step's std as error bar."""
    import matplotlib.pyplot as plt

    ok = df[df.status == "ok"]
    # several model sizes: one group of bars per size
    labels = ok.flavour + ("\n" + ok["size"].astype(str) if "size" in ok and ok["size"].nunique() > 1 else "")
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(ok) + 2), 4))
    bottom = pd.Series(0.0, index=ok.index)
    for phase, label in zip(PHASE_COLUMNS, ("forward+backward", "gradient sync (exposed)", "optimizer")):
        values = ok[f"{phase}_ms"].fillna(0.0)
        ax.bar(labels, values, bottom=bottom, label=label)
        bottom += values
    ax.errorbar(labels, ok.step_ms, yerr=ok.step_std_ms, fmt="none", ecolor="black", capsize=3)
    ax.set(ylabel="time per training step (ms)", title=title)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    ax.legend(fontsize=8)
    return fig


def plot_bucket_sweep(df: pd.DataFrame):
    """Step time against bucket size for the bucketed flavour, the other flavours as horizontal lines."""
    import matplotlib.pyplot as plt

    ok = df[df.status == "ok"]
    sweep = ok[(ok.kind == "bucketed") & ok.bucket_size_mb.notna()].sort_values("bucket_size_mb")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.errorbar(
        sweep.bucket_size_mb,
        sweep.step_ms,
        yerr=sweep.step_std_ms,
        marker="o",
        capsize=3,
        label="bucketed",
        color="black",
    )
    styles = ("-", "--", "-.", ":")
    for i, row in enumerate(ok[ok.kind != "bucketed"].itertuples()):
        ax.axhline(row.step_ms, linestyle=styles[i % len(styles)], color=f"C{i}", label=row.flavour)
    ax.set(
        xscale="log",
        xlabel="bucket size (MB = 2^20 bytes)",
        ylabel="time per training step (ms)",
        title="Bucket size sweep",
    )
    ax.legend(fontsize=8)
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description="DDP flavours, one step each, under torchrun")
    parser.add_argument("--size", default="xl")
    parser.add_argument("--global-batch-size", type=int, default=4)
    parser.add_argument("--context-length", type=int, default=512)
    parser.add_argument("--flavours", nargs="+", default=list(FLAVOURS))
    parser.add_argument("--bucket-sizes-mb", type=float, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--default-stream-priority",
        action="store_true",
        help="run the steps at the default CUDA stream priority instead of above NCCL's",
    )
    parser.add_argument("--out", type=Path, default=Path("ddp_benchmark.csv"))
    a = parser.parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    config = DDPBenchmarkConfig(
        size=a.size,
        global_batch_size=a.global_batch_size,
        context_length=a.context_length,
        flavours=tuple(a.flavours),
        bucket_sizes_mb=tuple(a.bucket_sizes_mb),
        warmup=a.warmup,
        steps=a.steps,
        world_size=world_size,
        prioritize_compute=not a.default_stream_priority,
    )
    rows, _ = launch_from_env(_benchmark_worker, (config,))
    if int(os.environ.get("RANK", "0")) == 0:
        df = add_overheads(pd.DataFrame(rows))
        df.to_csv(a.out, index=False)
        print(df[["flavour", "step_ms", "sync_ms", "overhead_ms"]].to_string(index=False))


if __name__ == "__main__":
    main()
