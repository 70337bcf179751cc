"""Memory and communication per rank for data parallelism and its sharded variants.

Ψ parameters, N ranks; master weights, gradients and the optimizer state's K elements per
parameter (AdamW: K = 2, m and v) in fp32 unless stated. Per rank, per training step:

    strategy              parameters   gradients    optimizer state   communication (bytes sent)
    ddp                   4Ψ           4Ψ           4KΨ               all-reduce(grads)              2(N−1)/N · 4Ψ
    optimizer_sharding    4Ψ           4Ψ           4K·Ψ_own          all-reduce(grads)              2(N−1)/N · 4Ψ
      (ShardedOptimizer, torch's ZeroRedundancyOptimizer)            + broadcast(params from owners) (N−1)/N · 4Ψ
    zero1  (ZeRO P_os)    4Ψ           4Ψ           4KΨ/N             reduce-scatter(grads)          (N−1)/N · 4Ψ
                                                                     + all-gather(params)            (N−1)/N · 4Ψ
    zero2  (P_os+g)       4Ψ           4Ψ/N         4KΨ/N             as zero1
    fsdp   (P_os+g+p)     4Ψ_s/N+4Ψ_r  4Ψ_s/N+4Ψ_r  4K(Ψ_s/N+Ψ_r)     all-gather(fwd) + all-gather(bwd)
                                                                     + reduce-scatter(grads)      3(N−1)/N · cΨ_s
                                                                     + all-reduce(replicated)       2(N−1)/N · 4Ψ_r

Ψ_own is the largest number of elements a rank owns when whole parameters are assigned greedily
(ShardedOptimizer's rule, which torch's ZeroRedundancyOptimizer shares), ≥ Ψ/N. FSDP shards the
Ψ_s elements of Linear/Embedding weights (each padded to a multiple of N) and replicates the
Ψ_r norm gains; c is the bytes of its compute dtype, in which it communicates. Collective volumes
are the ring algorithms' (accounting/rings.py): an all-reduce sends 2(N−1)/N of the buffer per
rank, a reduce-scatter or all-gather (N−1)/N; a broadcast of every parameter from its owner is an
all-gather with uneven pieces, (N−1)/N of the bytes per rank on average with a pipelined ring, and so
are ShardedOptimizer's point-to-point sends of each owner's parameters to every other rank.
Gathered-weight buffers of FSDP and activations are not part of the table (they are measured).

ZeRO's paper counts mixed precision: fp16 parameters and gradients (2Ψ each) and K = 12 bytes of
fp32 state per parameter (master weights, m, v), all of which P_os shards; `zero_paper_memory`
gives its numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from cs336_systems.accounting.rings import ring_all_gather_time, ring_all_reduce_time, ring_reduce_scatter_time
from cs336_systems.distributed.sharded_optimizer import assign_greedy
from cs336_systems.model import ModelConfig

GB = 1e9
STRATEGIES = ("ddp", "optimizer_sharding", "zero1", "zero2", "fsdp")
STRATEGY_LABELS = {
    "ddp": "DDP (all replicated)",
    "optimizer_sharding": "optimizer state sharding (ours)",
    "zero1": "ZeRO stage 1 (P_os)",
    "zero2": "ZeRO stage 2 (P_os+g)",
    "fsdp": "FSDP / ZeRO-3 (P_os+g+p)",
}


def transformer_parameter_shapes(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every TransformerLM parameter, in `named_parameters()` order, without building it."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    shapes = [("token_embeddings.weight", (v, d))]
    for i in range(config.num_layers):
        p = f"layers.{i}."
        shapes += [(p + "ln1.weight", (d,))]
        shapes += [(p + f"attn.{n}.weight", (d, d)) for n in ("q_proj", "k_proj", "v_proj", "output_proj")]
        shapes += [
            (p + "ln2.weight", (d,)),
            (p + "ffn.w1.weight", (f, d)),
            (p + "ffn.w2.weight", (d, f)),
            (p + "ffn.w3.weight", (f, d)),
        ]
    return shapes + [("ln_final.weight", (d,)), ("lm_head.weight", (v, d))]


def is_sharded_by_fsdp(name: str) -> bool:
    """FSDP shards Linear and Embedding weights (2-D) and replicates the norm gains (1-D, named ln*)."""
    return not name.rsplit(".", 2)[-2].startswith("ln")


@dataclass(frozen=True)
class ShardingSetup:
    """What the formulas need: Ψ, N, dtypes, and the two quantities that depend on the parameter shapes."""

    num_params: int
    world_size: int
    param_bytes: int = 4
    grad_bytes: int = 4
    state_per_param: int = 2  # AdamW: m and v
    state_bytes: int = 4
    compute_bytes: int | None = None  # FSDP's communication dtype; None: param_bytes
    owned_params: int | None = None  # ShardedOptimizer's largest share; None: ceil(Ψ/N)
    fsdp_sharded_params: int | None = None  # Ψ_s, padded; None: all of Ψ
    fsdp_replicated_params: int = 0  # Ψ_r

    def __post_init__(self):
        if self.world_size < 1:
            raise ValueError(f"world size must be at least 1, got {self.world_size}")
        if self.num_params < 0:
            raise ValueError(f"number of parameters must be non-negative, got {self.num_params}")

    @property
    def own(self) -> int:
        return self.owned_params if self.owned_params is not None else math.ceil(self.num_params / self.world_size)

    @property
    def sharded(self) -> int:
        return self.fsdp_sharded_params if self.fsdp_sharded_params is not None else self.num_params

    @property
    def c(self) -> int:
        return self.compute_bytes or self.param_bytes


def setup_for_model(config: ModelConfig, world_size: int, compute_bytes: int | None = None, **kwargs) -> ShardingSetup:
    """ShardingSetup of a TransformerLM: Ψ, the greedy largest share, FSDP's padded and replicated counts."""
    shapes = transformer_parameter_shapes(config)
    numels = [math.prod(s) for _, s in shapes]
    loads = [0] * world_size
    assign_greedy(numels, loads)
    sharded = sum(
        math.ceil(n / world_size) * world_size for (name, _), n in zip(shapes, numels) if is_sharded_by_fsdp(name)
    )
    replicated = sum(n for (name, _), n in zip(shapes, numels) if not is_sharded_by_fsdp(name))
    return ShardingSetup(
        num_params=sum(numels),
        world_size=world_size,
        compute_bytes=compute_bytes,
        owned_params=max(loads),
        fsdp_sharded_params=sharded,
        fsdp_replicated_params=replicated,
        **kwargs,
    )


def memory_per_rank(strategy: str, s: ShardingSetup) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state one rank holds (the most loaded rank)."""
    n, psi, k = s.world_size, s.num_params, s.state_per_param
    state_full = k * s.state_bytes * psi
    if strategy == "ddp":
        return dict(parameters=s.param_bytes * psi, gradients=s.grad_bytes * psi, optimizer_state=state_full)
    if strategy == "optimizer_sharding":
        return dict(
            parameters=s.param_bytes * psi, gradients=s.grad_bytes * psi, optimizer_state=k * s.state_bytes * s.own
        )
    if strategy == "zero1":
        return dict(parameters=s.param_bytes * psi, gradients=s.grad_bytes * psi, optimizer_state=state_full / n)
    if strategy == "zero2":
        return dict(parameters=s.param_bytes * psi, gradients=s.grad_bytes * psi / n, optimizer_state=state_full / n)
    if strategy == "fsdp":
        local = s.sharded / n + s.fsdp_replicated_params
        return dict(
            parameters=s.param_bytes * local, gradients=s.grad_bytes * local, optimizer_state=k * s.state_bytes * local
        )
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def communication_per_rank(strategy: str, s: ShardingSetup) -> list[tuple[str, float]]:
    """(collective, bytes one rank sends) per training step, ring algorithms."""
    n, psi = s.world_size, s.num_params
    grads, params = s.grad_bytes * psi, s.param_bytes * psi
    if strategy == "ddp":
        return [("all-reduce gradients", ring_all_reduce_time(grads, n, 1))]
    if strategy == "optimizer_sharding":
        return [
            ("all-reduce gradients", ring_all_reduce_time(grads, n, 1)),
            ("broadcast parameters from owners", ring_all_gather_time(params, n, 1)),
        ]
    if strategy in ("zero1", "zero2"):
        return [
            ("reduce-scatter gradients", ring_reduce_scatter_time(grads, n, 1)),
            ("all-gather parameters", ring_all_gather_time(params, n, 1)),
        ]
    if strategy == "fsdp":
        weights = s.c * s.sharded
        return [
            ("all-gather weights (forward)", ring_all_gather_time(weights, n, 1)),
            ("all-gather weights (backward)", ring_all_gather_time(weights, n, 1)),
            ("reduce-scatter gradients", ring_reduce_scatter_time(weights, n, 1)),
            ("all-reduce replicated gradients", ring_all_reduce_time(s.grad_bytes * s.fsdp_replicated_params, n, 1)),
        ]
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def memory_table(s: ShardingSetup, strategies: tuple[str, ...] = STRATEGIES) -> pd.DataFrame:
    """Per strategy: GB of parameters, gradients, optimizer state, their total, and the saving over DDP."""
    ddp_total = sum(memory_per_rank("ddp", s).values())
    rows = []
    for strategy in strategies:
        parts = memory_per_rank(strategy, s)
        total = sum(parts.values())
        rows.append(
            dict(
                strategy=strategy,
                label=STRATEGY_LABELS[strategy],
                **{f"{k}_GB": v / GB for k, v in parts.items()},
                total_GB=total / GB,
                saving_vs_ddp_GB=(ddp_total - total) / GB,
            )
        )
    return pd.DataFrame(rows)


def communication_table(
    s: ShardingSetup, strategies: tuple[str, ...] = STRATEGIES, bandwidth: float | None = None
) -> pd.DataFrame:
    """Per strategy: the collectives of one step, GB sent per rank, relative to DDP, and (given W) seconds."""
    ddp_bytes = sum(b for _, b in communication_per_rank("ddp", s))
    rows = []
    for strategy in strategies:
        parts = communication_per_rank(strategy, s)
        total = sum(b for _, b in parts)
        row = dict(
            strategy=strategy,
            label=STRATEGY_LABELS[strategy],
            collectives=" + ".join(name for name, _ in parts),
            sent_per_rank_GB=total / GB,
            relative_to_ddp=total / ddp_bytes if ddp_bytes else math.nan,
        )
        if bandwidth is not None:
            row["time_s"] = total / bandwidth
        rows.append(row)
    return pd.DataFrame(rows)


def zero_paper_memory(num_params: int, world_size: int, k: int = 12) -> pd.DataFrame:
    """ZeRO paper, mixed precision: (2 + 2 + K)Ψ for DDP; P_os 4Ψ + KΨ/N; P_os+g 2Ψ + (2+K)Ψ/N; P_os+g+p (4+K)Ψ/N."""
    psi, n = num_params, world_size
    totals = {
        "ddp": (4 + k) * psi,
        "zero1": 4 * psi + k * psi / n,
        "zero2": 2 * psi + (2 + k) * psi / n,
        "fsdp": (4 + k) * psi / n,
    }
    return pd.DataFrame(
        [dict(strategy=name, label=STRATEGY_LABELS[name], total_GB=b / GB) for name, b in totals.items()]
    )
