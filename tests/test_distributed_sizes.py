"""The distributed benchmarks of notebooks 13-17 run one configuration per model size in one distributed run
(gloo, 2 processes, the two CPU sizes): every table tells the sizes apart, later sizes take their own steps,
and FSDP profiles forward passes of the chosen size only, one per per-rank batch, up to the first that keeps the
GPU busy (stubbed here: a CPU trace has no GPU clock) or the first that does not fit."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.distributed.launch import spawn
from cs336_systems.experiments.ddp_benchmark import DDPBenchmarkConfig, benchmark_ddp_sizes, per_size
from cs336_systems.experiments.fsdp_benchmark import FSDPBenchmarkConfig, run_fsdp_benchmark
from cs336_systems.experiments.fsdp_timeline import summarize_profiles
from cs336_systems.experiments.sharding_benchmark import (
    ShardingBenchmarkConfig,
    breakdown_table,
    run_setup,
    run_sharding_benchmark,
)
from cs336_systems.model import TransformerLM

SIZES = ["nano", "tiny"]


@pytest.mark.multiprocess
def test_ddp_sizes_in_one_run():
    base = DDPBenchmarkConfig(
        size="nano",
        context_length=16,
        flavours=("no-communication", "naive"),
        warmup=1,
        steps=2,
        backend="gloo",
        profile=("naive",),
    )
    df, timelines = benchmark_ddp_sizes(per_size(base, SIZES, later_warmup=0, later_steps=1))
    assert df["size"].tolist() == ["nano", "nano", "tiny", "tiny"] and (df.status == "ok").all()
    assert df.groupby("size").steps.first().to_dict() == {"nano": 2, "tiny": 1}
    assert df.groupby("size").parameters.first()["tiny"] > df.groupby("size").parameters.first()["nano"]
    # each size's overhead is against its own step without communication
    assert (df[df.flavour == "no-communication"].overhead_ms == 0).all()
    assert set(timelines) == set(SIZES) and all(set(t) == {"naive"} for t in timelines.values())


@pytest.mark.multiprocess
def test_sharding_sizes_in_one_run():
    configs = per_size(
        ShardingBenchmarkConfig(
            size="nano",
            context_length=16,
            warmup=1,
            steps=1,
            backend="gloo",
            optimizers=("unsharded", "sharded"),
            equality_steps=1,
        ),
        SIZES,
    )
    result = run_sharding_benchmark(configs)
    assert result["timing"]["size"].tolist() == ["nano", "nano", "tiny", "tiny"]
    table = breakdown_table(result["memory"], configs[0], unit="MB")
    after = table[(table.point == "after step") & (table.optimizer == "unsharded") & (table["rank"] == 0)].set_index(
        "size"
    )
    # each size's measured optimizer state matches the analysis of that size
    assert after.optimizer_state.to_dict() == pytest.approx(after.expected_optimizer_state.to_dict())
    assert after.loc["tiny", "optimizer_state"] > after.loc["nano", "optimizer_state"]
    assert run_setup(configs, "gloo")["size"].tolist() == SIZES


@pytest.mark.multiprocess
def test_fsdp_sizes_in_one_run_profile_the_chosen_size_only():
    base = FSDPBenchmarkConfig(
        size="nano",
        context_length=16,
        vocab_size=97,
        warmup=1,
        steps=1,
        backend="gloo",
        runs=(("fsdp", "fp32"), ("fsdp", "bf16")),
        profile_run=("fsdp", "bf16"),
        profile_size="tiny",
        profile_batches=(1, 3),
        equality_steps=1,
        equality_dtypes=("fp32",),
    )
    result = run_fsdp_benchmark(per_size(base, SIZES))
    assert result["runs"]["size"].tolist() == ["nano", "nano", "tiny", "tiny"] and (result["runs"].status == "ok").all()
    profiles = result["profiles"]
    assert [(p["size"], p["batch_per_rank"], p["status"]) for p in profiles] == [("tiny", 1, "ok"), ("tiny", 3, "ok")]
    table = summarize_profiles(profiles)
    assert table.gathers.tolist() == [2 + 7 * 2, 2 + 7 * 2]  # embedding, head, and 7 weights in each of tiny's 2 blocks
    assert table.shown.tolist() == [True, False]  # a CPU trace: no busy fraction, the first is shown
    with pytest.raises(ValueError, match="profile_size"):
        run_fsdp_benchmark(per_size(FSDPBenchmarkConfig(profile_size="small", backend="gloo"), SIZES))


class _RunsOutOfMemoryFrom(torch.nn.Module):
    """A model whose forward raises the allocator's error from a batch of `rows` sequences on."""

    def __init__(self, model: torch.nn.Module, rows: int):
        super().__init__()
        self.model, self.rows = model, rows

    def forward(self, tokens):
        if tokens.shape[0] >= self.rows:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.model(tokens)


def _profile_series(ctx, busy_by_batch: dict[int, float], oom_from: int) -> list[tuple]:
    """The profiled forwards of a small FSDP model with the GPU-busy fraction of rank 0's traces stubbed (a
    CPU trace has none) and an out-of-memory error from `oom_from` sequences on."""
    from cs336_systems.distributed.fsdp import FSDP
    from cs336_systems.experiments import fsdp_benchmark

    config = FSDPBenchmarkConfig(
        size="nano",
        context_length=8,
        vocab_size=97,
        backend="gloo",
        profile_batches=(1, 2, 3, 4),
        profile_until_busy=0.8,
    )
    calls = iter([busy_by_batch[b] for b in config.profile_batches])
    fsdp_benchmark.forward_overlap = lambda events: dict(busy_fraction=next(calls))
    torch.manual_seed(0)
    model = FSDP(TransformerLM.from_config(config.model_config()))
    profiles = fsdp_benchmark._profile_forwards(ctx, config, _RunsOutOfMemoryFrom(model, oom_from))
    return [(p["batch_per_rank"], p["status"], p["events"] is not None) for p in profiles]


def _series_worker(ctx) -> dict:
    return dict(
        bound=_profile_series(ctx, {1: 0.1, 2: 0.5, 3: 0.9, 4: 0.95}, oom_from=99),
        oom=_profile_series(ctx, {1: 0.1, 2: 0.5, 3: 0.9, 4: 0.95}, oom_from=2),
    )


@pytest.mark.multiprocess
def test_the_profiled_series_ends_at_the_first_gpu_bound_forward_or_the_first_that_does_not_fit():
    ranks = spawn(_series_worker, 2, backend="gloo", timeout_s=150)
    assert ranks[0]["bound"] == [(1, "ok", True), (2, "ok", True), (3, "ok", True)]
    assert ranks[1]["bound"] == [(1, "ok", False), (2, "ok", False), (3, "ok", False)]  # only rank 0 keeps its trace
    assert ranks[0]["oom"] == [(1, "ok", True), (2, "OOM", False)]
