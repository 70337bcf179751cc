"""How busy the GPU was in a profiled FSDP forward pass and how much of its all-gather time compute hid
(`fsdp_timeline.forward_overlap`, `summarize_profiles`), on hand-made Chrome traces whose answers are known,
and the per-size benchmark configurations (`ddp_benchmark.per_size`). No processes are started.

The trace: two modules A and B. Compute stream 7 runs a previous kernel 20-60 µs, A's 60-100, B's 130-150;
NCCL stream 20 gathers A's weight 10-50 and B's 60-130. Span 10-150 = 140 µs; compute busy 80 + 20 = 100 µs
(busy fraction 5/7); gathers 40 + 70 = 110 µs, of which 30 + 40 = 70 µs run beside compute (hidden) and 40 µs
alone (exposed); B's gather is late: the stream is free from 100 and B starts at 130 (30 µs exposed).
With `filled`, compute kernels also cover 10-20 and 100-130: the GPU is never idle (busy fraction 1).
"""

from __future__ import annotations

import itertools
import math

import pytest

from cs336_systems.experiments.ddp_benchmark import DDPBenchmarkConfig, one_per_size, per_size
from cs336_systems.experiments.fsdp_benchmark import FSDPBenchmarkConfig, expected_saving
from cs336_systems.experiments.fsdp_timeline import forward_gather_timing, forward_overlap, summarize_profiles
from cs336_systems.profiling.trace import load_trace

GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
_CORRELATIONS = itertools.count(1)


def _range(name, ts, dur):
    return dict(ph="X", cat="user_annotation", name=name, pid=1, tid=1, ts=ts, dur=dur)


def _kernel(name, stream, ts, dur, launched_at):
    """A kernel on device 0 and the runtime call that launched it (host time `launched_at`)."""
    correlation = next(_CORRELATIONS)
    launch = dict(
        ph="X",
        cat="cuda_runtime",
        name="cudaLaunchKernel",
        pid=1,
        tid=1,
        ts=launched_at,
        dur=1,
        args=dict(correlation=correlation),
    )
    kernel = dict(
        ph="X",
        cat="kernel",
        name=name,
        pid=0,
        tid=stream,
        ts=ts,
        dur=dur,
        args=dict(device=0, stream=stream, correlation=correlation),
    )
    return [launch, kernel]


def _trace(filled: bool = False) -> dict:
    events = [
        _range("fsdp all-gather A", 0, 5),
        _range("fsdp all-gather B", 20, 5),
        _range("fsdp forward A", 30, 10),
        _range("fsdp forward B", 50, 10),
    ]
    events += _kernel(GATHER, 20, 10, 40, launched_at=2) + _kernel(GATHER, 20, 60, 70, launched_at=22)
    events += _kernel(GEMM, 7, 20, 40, launched_at=1) + _kernel(GEMM, 7, 60, 40, launched_at=32)
    events += _kernel(GEMM, 7, 130, 20, launched_at=52)
    if filled:  # launched outside the modules' ranges: other layers' work that keeps the stream busy
        events += _kernel("triton_poi_fused_mul_0", 7, 10, 10, launched_at=1)
        events += _kernel("triton_poi_fused_mul_0", 7, 100, 30, launched_at=45)
    return {"traceEvents": events}


def test_forward_overlap_measures_busy_time_and_hidden_gathers():
    o = forward_overlap(load_trace(_trace()))
    assert o["forward_ms"] == pytest.approx(0.140) and o["busy_fraction"] == pytest.approx(100 / 140)
    assert o["gather_ms"] == pytest.approx(0.110) and o["hidden_ms"] == pytest.approx(0.070)
    assert o["exposed_ms"] == pytest.approx(0.040) and o["hidden_fraction"] == pytest.approx(70 / 110)
    full = forward_overlap(load_trace(_trace(filled=True)))
    assert full["busy_fraction"] == pytest.approx(1.0) and full["exposed_ms"] == pytest.approx(0.0)
    assert full["hidden_fraction"] == pytest.approx(1.0)


def test_the_late_gather_is_found_in_the_same_trace():
    t = forward_gather_timing(load_trace(_trace())).set_index("module")
    assert t.loc["A", "in_time"] and not t.loc["B", "in_time"]
    assert t.loc["B", "exposed_ms"] == pytest.approx(0.030)


def test_a_cpu_trace_has_no_gpu_clock_to_measure_on():
    cpu = {
        "traceEvents": [_range("fsdp all-gather A", 0, 5), _range("fsdp wait A", 6, 2), _range("fsdp forward A", 9, 10)]
    }
    assert all(math.isnan(v) for v in forward_overlap(load_trace(cpu)).values())


def _profile(batch, trace=None, status="ok"):
    return dict(
        size="2.7B",
        strategy="fsdp",
        compute_dtype="bf16",
        batch_per_rank=batch,
        context_length=512,
        status=status,
        events=load_trace(trace) if trace is not None else None,
    )


def test_the_first_gpu_bound_forward_is_shown():
    profiles = [_profile(2, _trace()), _profile(16, _trace(filled=True)), _profile(64, status="OOM")]
    df = summarize_profiles(profiles, busy_threshold=0.8)
    assert df.gpu_bound.tolist() == [False, True, False] and df.shown.tolist() == [False, True, False]
    assert df.tokens_per_rank.tolist() == [1024, 8192, 32768]
    assert (
        df.loc[0, "gathers"] == 2 and df.loc[0, "gathers_in_time"] == 1 and df.loc[0, "late_ms"] == pytest.approx(0.030)
    )
    assert math.isnan(df.loc[2, "busy_fraction"]) and (df.busy_threshold == 0.8).all()


def test_without_a_gpu_bound_forward_the_busiest_is_shown():
    df = summarize_profiles([_profile(16, _trace(filled=True)), _profile(2, _trace())], busy_threshold=1.5)
    assert not df.gpu_bound.any() and df.shown.tolist() == [True, False]
    cpu = {
        "traceEvents": [_range("fsdp all-gather A", 0, 5), _range("fsdp wait A", 6, 2), _range("fsdp forward A", 9, 10)]
    }
    df = summarize_profiles([_profile(2, cpu)])
    assert df.shown.tolist() == [True] and df.gathers.tolist() == [1] and not df.gpu_bound.any()


def test_per_size_gives_later_sizes_their_own_steps():
    configs = per_size(
        DDPBenchmarkConfig(size="nano", warmup=3, steps=10), ["xl", "2.7B"], later_warmup=2, later_steps=6
    )
    assert [(c.size, c.warmup, c.steps) for c in configs] == [("xl", 3, 10), ("2.7B", 2, 6)]
    assert [c.steps for c in per_size(DDPBenchmarkConfig(), ["xl", "2.7B"])] == [10, 10]
    with pytest.raises(ValueError, match="one configuration per model size"):
        one_per_size(per_size(DDPBenchmarkConfig(), ["xl", "xl"]))
    with pytest.raises(ValueError, match="share world_size"):
        one_per_size([DDPBenchmarkConfig(size="xl"), DDPBenchmarkConfig(size="2.7B", world_size=4)])


def test_fsdp_configurations_profile_one_size_at_a_batch_of_their_choice():
    configs = per_size(FSDPBenchmarkConfig(profile_size="2.7B", profile_batches=(2, 16)), ["xl", "2.7B"])
    assert [c.profiled for c in configs] == [False, True]
    assert configs[1].profile_batch_sizes() == (2, 16)
    assert FSDPBenchmarkConfig(global_batch_size=4, world_size=2).profile_batch_sizes() == (2,)
    with pytest.raises(ValueError, match="per-rank batch"):
        FSDPBenchmarkConfig(profile_batches=(0,))
    saving = expected_saving(configs)
    assert saving["size"].tolist() == ["xl", "xl", "2.7B", "2.7B"] and (saving.saving_GB.iloc[[1, 3]] > 0).all()
