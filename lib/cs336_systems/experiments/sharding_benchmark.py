"""Optimizer state sharding in a training step: equality, memory at three points, time per step.

Three optimizers drive the same data-parallel model (DDPIndividualParameters: every gradient is
all-reduced as soon as the backward pass completes it), all in one distributed run:

    unsharded   the project's AdamW over every parameter
    sharded     ShardedOptimizer(AdamW): state for the rank's own parameters, then sends them
    zero        torch.distributed.optim.ZeroRedundancyOptimizer(AdamW), PyTorch's version of it

Memory, per rank, at the handout's three points — after model initialization, directly before
and directly after the optimizer step (of a step after warm-up, when the AdamW state exists):
`allocated` is what the CUDA caching allocator holds at that point and `peak` the most it held
since the previous point; `parameters`, `gradients` and `optimizer_state` are the bytes of the
live tensors of each kind, counted from the objects themselves (so they exist on a CPU too), and
`rest` = allocated − their sum (activations, temporaries, communication buffers).
Time per iteration: forward+backward, gradient synchronization, optimizer step, each phase
synchronized (ddp_benchmark.timed_step), over `steps` measured steps after `warmup` ones.
Given one configuration per model size (`ddp_benchmark.per_size`), one run measures every size in
turn (the equality check once, on the first configuration's settings); a `size` column tells the
rows apart.
"""

from __future__ import annotations

import copy
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import pandas as pd
import torch
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from cs336_systems.accounting.sharding import (
    ShardingSetup,
    communication_table,
    memory_per_rank,
    memory_table,
    setup_for_model,
    transformer_parameter_shapes,
    zero_paper_memory,
)
from cs336_systems.benchmarking.harness import free_device_memory, is_out_of_memory, synchronize
from cs336_systems.distributed.ddp_individual import DDPIndividualParameters
from cs336_systems.distributed.launch import DistContext, gather_timings, spawn
from cs336_systems.distributed.sharded_optimizer import ShardedOptimizer, assign_greedy
from cs336_systems.experiments.ddp_benchmark import one_per_size, run_columns, timed_step
from cs336_systems.model import VOCAB_SIZE, ModelConfig, TransformerLM, cross_entropy
from cs336_systems.optim import AdamW

OPTIMIZERS = ("unsharded", "sharded", "zero")
POINTS = ("after init", "before step", "after step")
PARTS = ("parameters", "gradients", "optimizer_state")
PHASES = ("fwd_bwd", "sync", "optimizer")


@dataclass(frozen=True)
class ShardingBenchmarkConfig:
    size: str = "xl"
    global_batch_size: int = 4
    context_length: int = 512
    optimizers: tuple[str, ...] = OPTIMIZERS
    warmup: int = 3
    steps: int = 10
    world_size: int = 2
    backend: str | None = "auto"
    vocab_size: int = VOCAB_SIZE
    lr: float = 1e-4
    seed: int = 0
    equality_size: str = "nano"
    equality_steps: int = 10

    def __post_init__(self):
        if self.world_size < 1 or self.global_batch_size % self.world_size:
            raise ValueError(
                f"global batch size {self.global_batch_size} must split evenly over world size {self.world_size}"
            )
        unknown = set(self.optimizers) - set(OPTIMIZERS)
        if unknown or "unsharded" not in self.optimizers:
            raise ValueError(
                f"optimizers {self.optimizers}: choose from {', '.join(OPTIMIZERS)}, "
                "'unsharded' (the reference) included"
            )
        if self.warmup < 1 or self.steps < 1:
            raise ValueError(
                f"need warmup >= 1 (the AdamW state must exist) and steps >= 1, got {self.warmup}, {self.steps}"
            )

    def model_config(self, size: str | None = None) -> ModelConfig:
        return ModelConfig.from_size(size or self.size, context_length=self.context_length, vocab_size=self.vocab_size)


def make_optimizer(kind: str, params, lr: float) -> torch.optim.Optimizer:
    if kind == "unsharded":
        return AdamW(params, lr=lr)
    if kind == "sharded":
        return ShardedOptimizer(params, AdamW, lr=lr)
    if kind == "zero":
        return ZeroRedundancyOptimizer(params, optimizer_class=AdamW, lr=lr)
    raise ValueError(f"unknown optimizer {kind!r}; choose one of {', '.join(OPTIMIZERS)}")


def local_state(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state this rank actually holds."""
    if isinstance(optimizer, ShardedOptimizer):
        return optimizer.local_optimizer.state
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer.optim.state
    return optimizer.state


def tensor_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of live parameters, gradients and optimizer-state tensors on this rank."""
    params = list(model.parameters())
    state = [v for entry in local_state(optimizer).values() for v in entry.values() if torch.is_tensor(v)]
    return dict(
        parameters=sum(p.numel() * p.element_size() for p in params),
        gradients=sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
        optimizer_state=sum(t.numel() * t.element_size() for t in state),
    )


def allocated_bytes(device: torch.device) -> float:
    """Bytes of live tensors on `device` now (NaN off CUDA): a run's baseline before it builds anything."""
    synchronize(device)
    return float(torch.cuda.memory_allocated(device)) if device.type == "cuda" else math.nan


def memory_point(
    point: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    baseline: float = 0.0,
) -> dict:
    """One row: allocated now and peak since the last point (then reset), both above `baseline` (the
    bytes already allocated before this run built its model), and the live tensors' bytes."""
    synchronize(device)
    row = dict(point=point, **tensor_bytes(model, optimizer))
    if device.type == "cuda":
        row.update(
            allocated=torch.cuda.memory_allocated(device) - baseline,
            peak=torch.cuda.max_memory_allocated(device) - baseline,
            baseline=baseline,
        )
        torch.cuda.reset_peak_memory_stats(device)
    else:
        row.update(allocated=math.nan, peak=math.nan, baseline=math.nan)
    row["rest"] = row["allocated"] - sum(row[p] for p in PARTS)
    return row


def reset_peak(device: torch.device) -> None:
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def local_batch(
    ctx: DistContext, vocab_size: int, global_batch: int, context_length: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's rows of one global batch of token ids (identical on every rank before slicing)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (global_batch, context_length + 1), generator=generator)
    per_rank = global_batch // ctx.world_size
    mine = tokens[ctx.rank * per_rank : (ctx.rank + 1) * per_rank].to(ctx.device)
    return mine[:, :-1], mine[:, 1:]


def _equality(ctx: DistContext, config: ShardingBenchmarkConfig) -> list[dict]:
    """Max |θ_kind − θ_unsharded| after `equality_steps` data-parallel steps on a small model."""
    torch.manual_seed(config.seed)
    mcfg = config.model_config(config.equality_size)
    base = TransformerLM.from_config(mcfg, device=ctx.device)
    start = copy.deepcopy(base)
    runs = {}
    for kind in config.optimizers:
        model = copy.deepcopy(start)
        ddp = DDPIndividualParameters(model)
        runs[kind] = (model, ddp, make_optimizer(kind, model.parameters(), lr=1e-2))
    for step in range(config.equality_steps):
        inputs, targets = local_batch(
            ctx, mcfg.vocab_size, config.global_batch_size, mcfg.context_length, config.seed + step
        )
        for _model, ddp, optimizer in runs.values():
            cross_entropy(ddp(inputs), targets).backward()
            ddp.finish_gradient_synchronization()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    reference = runs["unsharded"][0]
    moved = max((p - q).abs().max().item() for p, q in zip(reference.parameters(), start.parameters()))
    return [
        dict(
            optimizer=kind,
            rank=ctx.rank,
            size=config.equality_size,
            steps=config.equality_steps,
            max_abs_diff=max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters())),
            max_update=moved,
        )
        for kind, (model, _, _) in runs.items()
    ]


def _run_optimizer(
    ctx: DistContext, config: ShardingBenchmarkConfig, kind: str, inputs, targets
) -> tuple[list[dict], list[tuple]]:
    """Memory rows at the three points and the measured step phases for one optimizer."""
    free_device_memory()
    baseline = allocated_bytes(ctx.device)
    reset_peak(ctx.device)
    torch.manual_seed(config.seed)
    model = TransformerLM.from_config(config.model_config(), device=ctx.device)
    ddp = DDPIndividualParameters(model)
    optimizer = make_optimizer(kind, model.parameters(), config.lr)
    memory = [memory_point("after init", model, optimizer, ctx.device, baseline)]
    for _ in range(config.warmup):
        timed_step(ddp, optimizer, inputs, targets)
    times = [timed_step(ddp, optimizer, inputs, targets) for _ in range(config.steps)]
    # One more step, probed at the handout's points (outside the timed steps).
    reset_peak(ctx.device)
    cross_entropy(ddp(inputs), targets).backward()
    ddp.finish_gradient_synchronization()
    memory.append(memory_point("before step", model, optimizer, ctx.device, baseline))
    optimizer.step()
    memory.append(memory_point("after step", model, optimizer, ctx.device, baseline))
    optimizer.zero_grad(set_to_none=True)
    for row in memory:
        row.update(optimizer=kind, rank=ctx.rank)
    return memory, times


def _worker(ctx: DistContext, configs: Sequence[ShardingBenchmarkConfig]) -> dict:
    if ctx.device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.world_size))
    equality = [row for rows in gather_timings(_equality(ctx, configs[0])) for row in rows]
    memory, timing = [], []
    for config in configs:
        size_memory, size_timing = _measure_size(ctx, config)
        memory.append(size_memory)
        timing.append(size_timing)
    return dict(
        equality=pd.DataFrame(equality),
        memory=pd.concat(memory, ignore_index=True),
        timing=pd.concat(timing, ignore_index=True),
        config=asdict(configs[0]),
    )


def _measure_size(ctx: DistContext, config: ShardingBenchmarkConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The memory rows (every rank) and the timing rows of every optimizer at `config`'s model size."""
    inputs, targets = local_batch(ctx, config.vocab_size, config.global_batch_size, config.context_length, config.seed)
    memory_rows, timing_rows = [], []
    for kind in config.optimizers:
        try:
            memory, times = _run_optimizer(ctx, config, kind, inputs, targets)
            status = "ok"
        except Exception as err:  # noqa: BLE001 - only out-of-memory becomes a row
            if not is_out_of_memory(err):
                raise
            memory, times, status = [], [], "OOM"
        free_device_memory()
        memory_rows += [row for rows in gather_timings(memory) for row in rows]
        per_rank = gather_timings([sum(t) for t in times] + [t[i] for i in range(len(PHASES)) for t in times])
        statuses = gather_timings([status])
        timing_rows.append(
            _timing_row(kind, per_rank, config.steps, "ok" if all(s == ["ok"] for s in statuses) else "OOM")
        )
    common = run_columns(ctx, config)
    return (
        pd.DataFrame(memory_rows).assign(**common)
        if memory_rows
        else pd.DataFrame(columns=["optimizer", "point", "rank", "size"]),
        pd.DataFrame(timing_rows).assign(**common, warmup=config.warmup, steps=config.steps),
    )


def _timing_row(kind: str, per_rank: list[list[float]], steps: int, status: str) -> dict:
    row = dict(optimizer=kind, status=status)
    if status != "ok":
        return row
    step_ms = [t * 1e3 for r in per_rank for t in r[:steps]]
    row.update(step_ms=statistics.fmean(step_ms), step_std_ms=statistics.stdev(step_ms) if len(step_ms) > 1 else 0.0)
    for i, phase in enumerate(PHASES):
        values = [t * 1e3 for r in per_rank for t in r[steps * (i + 1) : steps * (i + 2)]]
        row[f"{phase}_ms"] = statistics.fmean(values)
    rank_means = [statistics.fmean(r[:steps]) * 1e3 for r in per_rank]
    row["rank_spread_ms"] = max(rank_means) - min(rank_means)
    return row


def run_sharding_benchmark(config: ShardingBenchmarkConfig | Sequence[ShardingBenchmarkConfig]) -> dict:
    """Equality, memory and timing tables of one spawned run (keys equality, memory, timing, config), for
    one configuration or one per model size (`ddp_benchmark.per_size`)."""
    configs = one_per_size(config)
    return spawn(_worker, configs[0].world_size, args=(configs,), backend=configs[0].backend, timeout_s=1800)[0]


def run_setup(configs: Sequence, backend: str) -> pd.DataFrame:
    """One row per configuration of a run: the model (size, parameters), the batch, the ranks and the steps."""
    rows = []
    for c in configs:
        params = setup_for_model(c.model_config(), c.world_size).num_params
        rows.append(
            dict(
                size=c.size,
                parameters=params,
                context_length=c.context_length,
                global_batch_size=c.global_batch_size,
                world_size=c.world_size,
                backend=backend,
                warmup=c.warmup,
                steps=c.steps,
            )
        )
    return pd.DataFrame(rows)


# ---- analysis ---------------------------------------------------------------------------------
def rank_owned_numel(config: ShardingBenchmarkConfig) -> list[int]:
    """Elements whose optimizer state each rank owns under the greedy assignment (analytic)."""
    numels = [math.prod(shape) for _, shape in transformer_parameter_shapes(config.model_config())]
    loads = [0] * config.world_size
    assign_greedy(numels, loads)
    return loads


def analytic_breakdown(config: ShardingBenchmarkConfig) -> pd.DataFrame:
    """Expected bytes of parameters, gradients, optimizer state per optimizer, point and rank (fp32, AdamW)."""
    setup = setup_for_model(config.model_config(), config.world_size)
    loads = rank_owned_numel(config)
    rows = []
    for kind in config.optimizers:
        for rank in range(config.world_size):
            own = setup.num_params if kind == "unsharded" else loads[rank]
            parts = memory_per_rank(
                "optimizer_sharding", ShardingSetup(setup.num_params, config.world_size, owned_params=own)
            )
            for point in POINTS:
                rows.append(
                    dict(
                        optimizer=kind,
                        rank=rank,
                        point=point,
                        parameters=parts["parameters"],
                        gradients=0 if point == "after init" else parts["gradients"],
                        optimizer_state=0 if point == "after init" else parts["optimizer_state"],
                    )
                )
    return pd.DataFrame(rows)


ANALYSIS_STRATEGIES = ("ddp", "optimizer_sharding", "zero1", "zero2", "fsdp")


def analysis_tables(sizes: Sequence[str], context_length: int, world_size: int) -> dict[str, pd.DataFrame]:
    """The sharding analysis (`accounting.sharding`) of each model size, a `size` column first: what a rank
    holds per strategy (`memory`), what it sends per step (`communication`) and ZeRO's mixed-precision
    accounting (`zero_paper`); `setups` maps each size to its ShardingSetup."""
    setups = {s: setup_for_model(ModelConfig.from_size(s, context_length=context_length), world_size) for s in sizes}

    def stack(table) -> pd.DataFrame:
        return pd.concat([table(setup).assign(size=s) for s, setup in setups.items()], ignore_index=True).pipe(
            lambda df: df[["size", *[c for c in df if c != "size"]]]
        )

    return dict(
        memory=stack(lambda x: memory_table(x, ANALYSIS_STRATEGIES)),
        communication=stack(lambda x: communication_table(x, ANALYSIS_STRATEGIES)),
        zero_paper=stack(lambda x: zero_paper_memory(x.num_params, world_size)),
        setups=setups,
    )


UNITS = {"GB": 1e9, "MB": 1e6}


def breakdown_table(memory: pd.DataFrame, config: ShardingBenchmarkConfig, unit: str = "GB") -> pd.DataFrame:
    """Measured next to the analytic expectation, in `unit`, per model size, optimizer, point and rank (the
    expectation of each size from `config` at that size)."""
    sizes = list(dict.fromkeys(memory["size"])) if "size" in memory else [config.size]
    expected = pd.concat([analytic_breakdown(replace(config, size=s)).assign(size=s) for s in sizes], ignore_index=True)
    expected = expected.rename(columns={p: f"expected_{p}" for p in PARTS})
    df = memory.assign(size=memory.get("size", config.size))
    df = df.merge(expected, on=["size", "optimizer", "rank", "point"], how="left")
    cols = ["allocated", "peak", "rest", *PARTS, *(f"expected_{p}" for p in PARTS)]
    df[cols] = df[cols].astype(float) / UNITS[unit]
    df["size"] = pd.Categorical(df["size"], sizes, ordered=True)
    df["point"] = pd.Categorical(df["point"], POINTS, ordered=True)
    df["optimizer"] = pd.Categorical(df["optimizer"], OPTIMIZERS, ordered=True)
    columns = [
        "size",
        "optimizer",
        "point",
        "rank",
        "allocated",
        "peak",
        *PARTS,
        "rest",
        *(f"expected_{p}" for p in PARTS),
    ]
    return df.sort_values(["size", "optimizer", "point", "rank"])[columns].reset_index(drop=True)


def plot_breakdown(table: pd.DataFrame, rank: int = 0, unit: str = "GB", title: str = "", size: str | None = None):
    """Stacked bars (parameters, gradients, optimizer state, rest) per optimizer and point; peaks as markers.
    `size`: the rows of that model size (default: the first in the table)."""
    import matplotlib.pyplot as plt

    df = table[table["rank"] == rank]
    if "size" in df:
        df = df[df["size"] == (size if size is not None else df["size"].iloc[0])]
    df = df.reset_index(drop=True)
    labels = [f"{o}\n{p}" for o, p in zip(df["optimizer"], df["point"])]
    fig, ax = plt.subplots(figsize=(max(7, 0.8 * len(df) + 2), 4.2))
    bottom = pd.Series(0.0, index=df.index)
    parts = (*PARTS, "rest") if df["rest"].notna().any() else PARTS  # no allocator, no "rest", on a CPU
    for part, label in zip(parts, ("parameters", "gradients", "optimizer state", "rest (activations, buffers)")):
        values = df[part].fillna(0.0).clip(lower=0)
        ax.bar(labels, values, bottom=bottom, label=label)
        bottom += values
    if df["peak"].notna().any():
        ax.scatter(labels, df["peak"], marker="_", s=400, color="black", label="peak since previous point", zorder=3)
    ax.set(ylabel=f"{unit} on rank {rank}", title=title)
    plt.setp(ax.get_xticklabels(), fontsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def plot_step_times(timing: pd.DataFrame, title: str = ""):
    """Stacked phases per optimizer with the step's standard deviation."""
    import matplotlib.pyplot as plt

    ok = timing[timing["status"] == "ok"].reset_index(drop=True)
    # several model sizes: one group of bars per size
    labels = ok["optimizer"] + ("\n" + ok["size"].astype(str) if "size" in ok and ok["size"].nunique() > 1 else "")
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(ok) + 2), 3.8))
    bottom = pd.Series(0.0, index=ok.index)
    phase_labels = ("forward+backward", "gradient sync (exposed)", "optimizer step + parameter exchange")
    for phase, label in zip(PHASES, phase_labels):
        ax.bar(labels, ok[f"{phase}_ms"], bottom=bottom, label=label)
        bottom += ok[f"{phase}_ms"]
    ax.errorbar(labels, ok["step_ms"], yerr=ok["step_std_ms"], fmt="none", ecolor="black", capsize=3)
    ax.set(ylabel="time per iteration (ms)", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
