"""The distributed benchmarks of notebooks 13-17 run one configuration per model size in one distributed run
(gloo, 2 processes, the two CPU sizes): every table tells the sizes apart, later sizes take their own steps,
and FSDP profiles forward passes of the chosen size only, one per per-rank batch."""

from __future__ import annotations

import pytest

from cs336_systems.experiments.ddp_benchmark import DDPBenchmarkConfig, benchmark_ddp_sizes, per_size
from cs336_systems.experiments.fsdp_benchmark import FSDPBenchmarkConfig, run_fsdp_benchmark
from cs336_systems.experiments.fsdp_timeline import summarize_profiles
from cs336_systems.experiments.sharding_benchmark import ShardingBenchmarkConfig, breakdown_table, run_setup, run_sharding_benchmark

SIZES = ["nano", "tiny"]


@pytest.mark.multiprocess
def test_ddp_sizes_in_one_run():
    base = DDPBenchmarkConfig(size="nano", context_length=16, flavours=("no-communication", "naive"), warmup=1, steps=2,
                              backend="gloo", profile=("naive",))
    df, timelines = benchmark_ddp_sizes(per_size(base, SIZES, later_warmup=0, later_steps=1))
    assert df["size"].tolist() == ["nano", "nano", "tiny", "tiny"] and (df.status == "ok").all()
    assert df.groupby("size").steps.first().to_dict() == {"nano": 2, "tiny": 1}
    assert df.groupby("size").parameters.first()["tiny"] > df.groupby("size").parameters.first()["nano"]
    # each size's overhead is against its own step without communication
    assert (df[df.flavour == "no-communication"].overhead_ms == 0).all()
    assert set(timelines) == set(SIZES) and all(set(t) == {"naive"} for t in timelines.values())


@pytest.mark.multiprocess
def test_sharding_sizes_in_one_run():
    configs = per_size(ShardingBenchmarkConfig(size="nano", context_length=16, warmup=1, steps=1, backend="gloo",
                                               optimizers=("unsharded", "sharded"), equality_steps=1), SIZES)
    result = run_sharding_benchmark(configs)
    assert result["timing"]["size"].tolist() == ["nano", "nano", "tiny", "tiny"]
    table = breakdown_table(result["memory"], configs[0], unit="MB")
    after = table[(table.point == "after step") & (table.optimizer == "unsharded") & (table["rank"] == 0)].set_index("size")
    # each size's measured optimizer state matches the analysis of that size
    assert after.optimizer_state.to_dict() == pytest.approx(after.expected_optimizer_state.to_dict())
    assert after.loc["tiny", "optimizer_state"] > after.loc["nano", "optimizer_state"]
    assert run_setup(configs, "gloo")["size"].tolist() == SIZES


@pytest.mark.multiprocess
def test_fsdp_sizes_in_one_run_profile_the_chosen_size_only():
    base = FSDPBenchmarkConfig(size="nano", context_length=16, vocab_size=97, warmup=1, steps=1, backend="gloo",
                               runs=(("fsdp", "fp32"), ("fsdp", "bf16")), profile_run=("fsdp", "bf16"), profile_size="tiny",
                               profile_batches=(1, 3), equality_steps=1, equality_dtypes=("fp32",))
    result = run_fsdp_benchmark(per_size(base, SIZES))
    assert result["runs"]["size"].tolist() == ["nano", "nano", "tiny", "tiny"] and (result["runs"].status == "ok").all()
    profiles = result["profiles"]
    assert [(p["size"], p["batch_per_rank"], p["status"]) for p in profiles] == [("tiny", 1, "ok"), ("tiny", 3, "ok")]
    table = summarize_profiles(profiles)
    assert table.gathers.tolist() == [2 + 7 * 2, 2 + 7 * 2]  # embedding, head, and 7 weights in each of tiny's 2 blocks
    assert table.shown.tolist() == [True, False]  # a CPU trace: no busy fraction, the first is shown
    with pytest.raises(ValueError, match="profile_size"):
        run_fsdp_benchmark(per_size(FSDPBenchmarkConfig(profile_size="small", backend="gloo"), SIZES))
