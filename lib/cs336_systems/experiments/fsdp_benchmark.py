"""FSDP in a training step: equality with one process, memory and time next to FSDP2, gather timing.

One distributed run does everything, so start-up is paid once and every number shares a machine:

1. Equality. A small TransformerLM trains `equality_steps` AdamW steps with FSDP (each rank on
   its slice of the global batch) and, on every rank, without any parallelism on the whole
   batch. fp32: plain training. A low compute dtype: the reference is ordinary mixed precision
   (Linear/Embedding weights cast to that dtype for forward and backward, fp32 gradients and
   update). With a low dtype AdamW uses eps = 1e-5: at eps = 1e-8 the update lr·m/(√v+eps) turns
   a gradient component near zero into ±lr whatever its size, so one-ulp differences between a
   split and a whole batch (two rounded halves summed vs one rounding) would move isolated
   weights by up to 2·lr.
2. Strategies, each on a fresh model (same seed), the same local batch and the project's AdamW:
       replicated  DDPIndividualParameters (fp32 only): the memory baseline of the analysis
       fsdp        this repository's FSDP(model, compute_dtype)
       fsdp2       torch.distributed.fsdp.fully_shard on every TransformerBlock, then the root,
                   MixedPrecisionPolicy(param_dtype=reduce_dtype=compute dtype) for a low dtype
   Time per step in phases (ddp_benchmark.timed_step), the allocator's peak over the measured
   steps, and the bytes of the live parameters, gradients and optimizer state (local shards).
   FSDP2's parameters are DTensors, so the per-tensor AdamW dispatches through DTensor; the
   optimizer phase is reported separately so that cost can be told apart.
3. Profiled forward passes of `profile_run` at `profile_size` (rank 0's traces), one per per-rank
   batch of `profile_batches`, for fsdp_timeline: every all-gather of the forward pass against the
   moment its module's forward needed the weight, and how busy the GPU was. They run without
   gradients (torch.no_grad; FSDP's hooks gather and prefetch exactly as in training), so a batch
   far larger than the training one fits: a small batch's forward can be paced by the host (Python
   hooks and launches), and only a GPU-bound forward shows whether the gathers keep pace with
   compute. With `profile_until_busy`, the series ends at the first forward
   whose GPU-busy fraction (rank 0's, fsdp_timeline.forward_overlap) reaches it.
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
from dataclasses import asdict, dataclass

import pandas as pd
import torch
import torch.nn as nn

from cs336_systems.accounting.sharding import memory_per_rank, setup_for_model
from cs336_systems.benchmarking.harness import free_device_memory, is_out_of_memory, synchronize
from cs336_systems.distributed.ddp_individual import DDPIndividualParameters
from cs336_systems.distributed.fsdp import FSDP, shardable_weight
from cs336_systems.distributed.launch import DistContext, gather_timings, spawn
from cs336_systems.experiments.ddp_benchmark import one_per_size, run_columns, timed_step
from cs336_systems.experiments.fsdp_timeline import forward_overlap
from cs336_systems.experiments.sharding_benchmark import PHASES, allocated_bytes, local_batch, reset_peak
from cs336_systems.model import VOCAB_SIZE, ModelConfig, TransformerLM, cross_entropy
from cs336_systems.optim import AdamW
from cs336_systems.profiling.ranges import annotated
from cs336_systems.profiling.trace import load_trace, record_chrome_trace

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
STRATEGIES = ("replicated", "fsdp", "fsdp2")
EQUALITY_TOLERANCE = {"fp32": 1e-6, "fp16": 1e-4, "bf16": 1e-3}
EQUALITY_ADAM_EPS = {"fp32": 1e-8, "fp16": 1e-5, "bf16": 1e-5}


@dataclass(frozen=True)
class FSDPBenchmarkConfig:
    size: str = "xl"
    global_batch_size: int = 4
    context_length: int = 512
    runs: tuple[tuple[str, str], ...] = (
        ("replicated", "fp32"),
        ("fsdp", "fp32"),
        ("fsdp2", "fp32"),
        ("fsdp", "bf16"),
        ("fsdp2", "bf16"),
    )
    profile_run: tuple[str, str] | None = ("fsdp", "bf16")
    profile_size: str | None = None  # the model size whose profile_run is profiled (None: every size)
    profile_batches: tuple[int, ...] | None = None  # per-rank batches of the profiled forwards (None: the training one)
    profile_until_busy: float | None = None  # end the series at the first forward whose GPU-busy fraction reaches this
    warmup: int = 3
    steps: int = 10
    world_size: int = 2
    backend: str | None = "auto"
    vocab_size: int = VOCAB_SIZE
    lr: float = 1e-4
    seed: int = 0
    equality_size: str = "nano"
    equality_context_length: int = 32
    equality_steps: int = 3
    equality_dtypes: tuple[str, ...] = ("fp32", "fp16")

    def __post_init__(self):
        if self.world_size < 1 or self.global_batch_size % self.world_size:
            raise ValueError(
                f"global batch size {self.global_batch_size} must split evenly over world size {self.world_size}"
            )
        for strategy, dtype in self.runs:
            if strategy not in STRATEGIES or dtype not in DTYPES:
                raise ValueError(
                    f"unknown run ({strategy!r}, {dtype!r}); strategies {STRATEGIES}, dtypes {tuple(DTYPES)}"
                )
            if strategy == "replicated" and dtype != "fp32":
                raise ValueError("the replicated baseline runs in fp32 only")
        if self.profile_run is not None and (
            self.profile_run[0] != "fsdp" or tuple(self.profile_run) not in set(self.runs)
        ):
            raise ValueError(f"profile_run {self.profile_run} must be one of the runs {self.runs} with strategy 'fsdp'")
        if self.warmup < 1 or self.steps < 1:
            raise ValueError(f"need warmup >= 1 and steps >= 1, got warmup={self.warmup}, steps={self.steps}")
        if self.profile_batches is not None and (not self.profile_batches or min(self.profile_batches) < 1):
            raise ValueError(f"profile_batches must be positive per-rank batch sizes, got {self.profile_batches}")

    @property
    def profiled(self) -> bool:
        """Whether this configuration's model size is the one whose `profile_run` is profiled."""
        return self.profile_run is not None and self.profile_size in (None, self.size)

    def profile_batch_sizes(self) -> tuple[int, ...]:
        return self.profile_batches or (self.global_batch_size // self.world_size,)

    def model_config(self) -> ModelConfig:
        return ModelConfig.from_size(self.size, context_length=self.context_length, vocab_size=self.vocab_size)


# ---- 1. equality -----------------------------------------------------------------------------
def mixed_precision_step(
    master: nn.Module, optimizer: torch.optim.Optimizer, inputs, targets, dtype: torch.dtype
) -> None:
    """One non-parallel step: the weights FSDP shards cast to `dtype` for compute, fp32 gradients and update."""
    working = master
    if dtype != torch.float32:
        working = copy.deepcopy(master)
        for m in working.modules():
            if shardable_weight(m) is not None:
                m.weight.data = m.weight.data.to(dtype)
    cross_entropy(working(inputs), targets).backward()
    if working is not master:
        for p, q in zip(master.parameters(), working.parameters()):
            p.grad = q.grad.to(p.dtype)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _equality(ctx: DistContext, config: FSDPBenchmarkConfig, dtype_name: str) -> dict:
    dtype = DTYPES[dtype_name]
    mcfg = ModelConfig.from_size(
        config.equality_size, context_length=config.equality_context_length, vocab_size=config.vocab_size
    )
    torch.manual_seed(config.seed)
    reference = TransformerLM.from_config(mcfg, device=ctx.device)
    start = copy.deepcopy(reference)
    fsdp = FSDP(copy.deepcopy(reference), compute_dtype=None if dtype == torch.float32 else dtype)
    eps = EQUALITY_ADAM_EPS[dtype_name]
    opt_ref, opt = AdamW(reference.parameters(), lr=1e-3, eps=eps), AdamW(fsdp.parameters(), lr=1e-3, eps=eps)
    per_rank = config.global_batch_size // ctx.world_size
    for step in range(config.equality_steps):
        generator = torch.Generator().manual_seed(config.seed + 1 + step)
        tokens = torch.randint(
            0, mcfg.vocab_size, (config.global_batch_size, mcfg.context_length + 1), generator=generator
        ).to(ctx.device)
        mixed_precision_step(reference, opt_ref, tokens[:, :-1], tokens[:, 1:], dtype)
        mine = tokens[ctx.rank * per_rank : (ctx.rank + 1) * per_rank]
        cross_entropy(fsdp(mine[:, :-1]), mine[:, 1:]).backward()
        fsdp.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad(set_to_none=True)
    full, expected = fsdp.gather_full_params(), dict(reference.named_parameters())
    return dict(
        compute_dtype=dtype_name,
        rank=ctx.rank,
        size=config.equality_size,
        steps=config.equality_steps,
        adam_eps=eps,
        max_abs_diff=max((full[n] - p).abs().max().item() for n, p in expected.items()),
        max_update=max((p - q).abs().max().item() for p, q in zip(reference.parameters(), start.parameters())),
        tolerance=EQUALITY_TOLERANCE[dtype_name],
    )


# ---- 2. strategies ---------------------------------------------------------------------------
class FullyShardedModel(nn.Module):
    """FSDP2 behind the interface of the other wrappers: its reduce-scatters finish inside backward()."""

    def __init__(self, module: nn.Module, ctx: DistContext, compute_dtype: torch.dtype | None):
        super().__init__()
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=compute_dtype)
        for block in module.layers:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        self.module = fully_shard(module, mesh=mesh, mp_policy=policy)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Nothing left to wait for: FSDP2 waits for its reduce-scatters at the end of backward()."""


def wrap(strategy: str, model: nn.Module, ctx: DistContext, dtype_name: str) -> nn.Module:
    compute_dtype = None if dtype_name == "fp32" else DTYPES[dtype_name]
    if strategy == "replicated":
        return DDPIndividualParameters(model)
    if strategy == "fsdp":
        return FSDP(model, compute_dtype=compute_dtype)
    if strategy == "fsdp2":
        return FullyShardedModel(model, ctx, compute_dtype)
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # FSDP2's DTensors: this rank's shard


def local_tensor_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of this rank's parameters, gradients and optimizer state (shards where sharded)."""

    def nbytes(t):
        t = _local(t)
        return t.numel() * t.element_size()

    params = list(model.parameters())
    return dict(
        parameters=sum(nbytes(p) for p in params),
        gradients=sum(nbytes(p.grad) for p in params if p.grad is not None),
        optimizer_state=sum(nbytes(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)),
    )


def _profile_forwards(ctx: DistContext, config: FSDPBenchmarkConfig, wrapped: nn.Module) -> list[dict]:
    """One profiled forward pass without gradients per per-rank batch of `profile_batches` (rank 0's trace as
    `events`, None elsewhere); a batch that does not fit ends the series with an OOM row."""
    out = []
    for batch in config.profile_batch_sizes():
        generator = torch.Generator().manual_seed(config.seed)
        tokens = torch.randint(0, config.vocab_size, (batch, config.context_length), generator=generator).to(ctx.device)

        def forward(tokens: torch.Tensor = tokens):
            with torch.no_grad(), annotated("forward"):
                wrapped(tokens)
            synchronize(ctx.device)  # the trace ends with the pass's last kernel, not when the host is done

        events, status = None, "ok"
        try:
            forward()  # untimed: this shape's first pass (allocator growth, kernel selection)
            ctx.barrier()
            if ctx.rank == 0:
                events = load_trace(record_chrome_trace(forward))
            else:
                forward()  # the collectives of rank 0's profiled pass need a partner
        except Exception as err:  # noqa: BLE001 - only out-of-memory becomes a row
            if not is_out_of_memory(err):
                raise
            events, status = None, "OOM"
        free_device_memory()
        busy = forward_overlap(events)["busy_fraction"] if events is not None else math.nan
        (status_0, busy_0), *others = gather_timings([status, busy])
        ok = status_0 == "ok" and all(o[0] == "ok" for o in others)
        out.append(
            dict(
                size=config.size,
                strategy=config.profile_run[0],
                compute_dtype=config.profile_run[1],
                batch_per_rank=batch,
                context_length=config.context_length,
                status="ok" if ok else "OOM",
                events=events if ok else None,
            )
        )
        if not ok or (config.profile_until_busy is not None and busy_0 >= config.profile_until_busy):
            break  # a larger batch would not fit, or would only confirm what this one shows
    return out


def _run(
    ctx: DistContext, config: FSDPBenchmarkConfig, strategy: str, dtype_name: str, inputs, targets
) -> tuple[dict, list, list[dict]]:
    # Memory is counted above what was allocated before this run (earlier runs' leftovers, if any).
    free_device_memory()
    baseline = allocated_bytes(ctx.device)
    reset_peak(ctx.device)
    torch.manual_seed(config.seed)
    model = TransformerLM.from_config(config.model_config(), device=ctx.device)
    wrapped = wrap(strategy, model, ctx, dtype_name)
    optimizer = AdamW(wrapped.parameters(), lr=config.lr)
    info = dict(after_init_allocated=allocated_bytes(ctx.device) - baseline, baseline=baseline)

    def step():
        return timed_step(wrapped, optimizer, inputs, targets)

    for _ in range(config.warmup):
        step()
    reset_peak(ctx.device)
    times = [step() for _ in range(config.steps)]
    info["peak"] = torch.cuda.max_memory_allocated(ctx.device) - baseline if ctx.device.type == "cuda" else math.nan
    # Live state after a step, gradients still present: what the analysis counts.
    cross_entropy(wrapped(inputs), targets).backward()
    wrapped.finish_gradient_synchronization()
    optimizer.step()
    info.update(local_tensor_bytes(wrapped, optimizer))
    optimizer.zero_grad(set_to_none=True)
    profiles = []
    if config.profiled and (strategy, dtype_name) == tuple(config.profile_run):
        profiles = _profile_forwards(ctx, config, wrapped)
    return info, times, profiles


def _worker(ctx: DistContext, configs: Sequence[FSDPBenchmarkConfig]) -> dict:
    if ctx.device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.world_size))
    first = configs[0]
    equality = [
        row for d in first.equality_dtypes for rows in gather_timings([_equality(ctx, first, d)]) for row in rows
    ]
    runs, profiles = [], []
    for config in configs:
        size_runs, size_profiles = _measure_size(ctx, config)
        runs.append(size_runs)
        profiles += size_profiles
    return dict(
        equality=pd.DataFrame(equality),
        runs=pd.concat(runs, ignore_index=True),
        profiles=profiles,
        config=asdict(first),
    )


def _measure_size(ctx: DistContext, config: FSDPBenchmarkConfig) -> tuple[pd.DataFrame, list[dict]]:
    """Every strategy's row at `config`'s model size, and the profiled forwards if this size is profiled."""
    inputs, targets = local_batch(ctx, config.vocab_size, config.global_batch_size, config.context_length, config.seed)
    rows, profiles = [], []
    for strategy, dtype_name in config.runs:
        try:
            info, times, run_profiles = _run(ctx, config, strategy, dtype_name, inputs, targets)
            status = "ok"
        except Exception as err:  # noqa: BLE001 - only out-of-memory becomes a row
            if not is_out_of_memory(err):
                raise
            info, times, run_profiles, status = {}, [], [], "OOM"
        free_device_memory()
        profiles += run_profiles
        infos = gather_timings([info])
        per_rank = gather_timings([sum(t) for t in times] + [t[i] for i in range(len(PHASES)) for t in times])
        statuses = gather_timings([status])
        row = dict(
            strategy=strategy, compute_dtype=dtype_name, status="ok" if all(s == ["ok"] for s in statuses) else "OOM"
        )
        if row["status"] == "ok":
            row.update(_summarize(per_rank, config.steps))
            for key in infos[0][0]:
                row[key] = max(i[0][key] for i in infos)  # the most loaded rank
        rows.append(row)
    common = dict(run_columns(ctx, config), warmup=config.warmup, steps=config.steps)
    return pd.DataFrame(rows).assign(**common), profiles


def _summarize(per_rank: list[list[float]], steps: int) -> dict:
    step_ms = [t * 1e3 for r in per_rank for t in r[:steps]]
    row = dict(step_ms=statistics.fmean(step_ms), step_std_ms=statistics.stdev(step_ms) if len(step_ms) > 1 else 0.0)
    for i, phase in enumerate(PHASES):
        row[f"{phase}_ms"] = statistics.fmean(t * 1e3 for r in per_rank for t in r[steps * (i + 1) : steps * (i + 2)])
    return row


def run_fsdp_benchmark(config: FSDPBenchmarkConfig | Sequence[FSDPBenchmarkConfig]) -> dict:
    """Keys: equality (DataFrame), runs (DataFrame, a `size` column), profiles (one dict per profiled forward:
    size, strategy, compute_dtype, batch_per_rank, context_length, status, events = rank 0's trace or None),
    config; for one configuration or one per model size (`ddp_benchmark.per_size`)."""
    configs = one_per_size(config)
    sizes = [c.size for c in configs]
    if any(c.profile_size not in (None, *sizes) for c in configs):
        raise ValueError(f"profile_size {configs[0].profile_size!r} is none of the sizes run, {sizes}")
    return spawn(_worker, configs[0].world_size, args=(configs,), backend=configs[0].backend, timeout_s=1800)[0]


# ---- analysis --------------------------------------------------------------------------------
def expected_saving(config: FSDPBenchmarkConfig | Sequence[FSDPBenchmarkConfig]) -> pd.DataFrame:
    """The analysis (accounting.sharding) for each configuration's model: per-rank GB of DDP and FSDP, and the
    saving, one pair of rows per size."""
    frames = []
    for c in one_per_size(config):
        setup = setup_for_model(c.model_config(), c.world_size)
        rows = []
        for strategy, label in (("ddp", "replicated"), ("fsdp", "fsdp")):
            parts = memory_per_rank(strategy, setup)
            rows.append(
                dict(
                    size=c.size,
                    strategy=label,
                    **{f"{k}_GB": v / 1e9 for k, v in parts.items()},
                    total_GB=sum(parts.values()) / 1e9,
                )
            )
        df = pd.DataFrame(rows)
        df["saving_GB"] = df["total_GB"].iloc[0] - df["total_GB"]
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def measured_saving(runs: pd.DataFrame, size: str | None = None) -> dict[str, float]:
    """Replicated − FSDP (fp32), for the live parameters+gradients+optimizer state and for the peak, in GB
    (of `size`'s rows where the table has several sizes)."""
    if size is not None and "size" in runs:
        runs = runs[runs["size"] == size]
    fp32 = runs[(runs["compute_dtype"] == "fp32") & (runs["status"] == "ok")].set_index("strategy")
    if not {"replicated", "fsdp"} <= set(fp32.index):
        return dict(state_GB=math.nan, peak_GB=math.nan)
    state = fp32[["parameters", "gradients", "optimizer_state"]].sum(axis=1)
    return dict(
        state_GB=(state["replicated"] - state["fsdp"]) / 1e9,
        peak_GB=(fp32.loc["replicated", "peak"] - fp32.loc["fsdp", "peak"]) / 1e9,
    )


def plot_runs(runs: pd.DataFrame, title: str = ""):
    """Left: time per step in phases per run; right: peak memory (or, without one, the live state) per run."""
    import matplotlib.pyplot as plt

    ok = runs[runs["status"] == "ok"].reset_index(drop=True)
    several = "size" in ok and ok["size"].nunique() > 1  # one group of bars per size
    labels = [
        f"{s}\n{d}" + (f"\n{z}" if several else "")
        for s, d, z in zip(ok["strategy"], ok["compute_dtype"], ok["size"] if "size" in ok else ok["strategy"])
    ]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(11, 1.2 * len(ok) + 3), 3.8))
    bottom = pd.Series(0.0, index=ok.index)
    for phase, label in zip(PHASES, ("forward+backward", "gradient sync (exposed)", "optimizer step")):
        left.bar(labels, ok[f"{phase}_ms"], bottom=bottom, label=label)
        bottom += ok[f"{phase}_ms"]
    left.errorbar(labels, ok["step_ms"], yerr=ok["step_std_ms"], fmt="none", ecolor="black", capsize=3)
    left.set(ylabel="ms", title="time per step")
    left.legend(fontsize=8)
    if ok["peak"].notna().all():
        right.bar(labels, ok["peak"] / 1e9, color="#949494")
        right.set(ylabel="GB", title="peak allocated over the measured steps")
    else:
        state = ok[["parameters", "gradients", "optimizer_state"]]
        bottom = pd.Series(0.0, index=ok.index)
        for part in state:
            right.bar(labels, state[part] / 1e6, bottom=bottom, label=part.replace("_", " "))
            bottom += state[part] / 1e6
        right.set(ylabel="MB", title="live tensors, most loaded rank (no allocator peak on a CPU)")
        right.legend(fontsize=8)
    for ax in (left, right):
        plt.setp(ax.get_xticklabels(), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig
