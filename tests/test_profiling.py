"""Profiling helpers: kernel names, trace parsing, per-range summaries, timelines, memory snapshots,
saved-tensor and peak-memory measurement, checkpointing strategies."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from cs336_systems.benchmarking import BenchmarkConfig  # noqa: E402
from cs336_systems.experiments.checkpointing import CheckpointedLM, CountingLayer, run_strategy, strategy_costs  # noqa: E402
from cs336_systems.model import TransformerBlock, TransformerLM  # noqa: E402
from cs336_systems.profiling.kernel_names import kernel_category, short_kernel_name  # noqa: E402
from cs336_systems.profiling.memory import (  # noqa: E402
    BEFORE_RECORDING,
    NO_PYTHON_FRAME,
    active_memory,
    largest_allocations,
    load_snapshot,
    peak_active_bytes,
    plot_active_memory,
    snapshot_allocations,
    user_frame,
)
from cs336_systems.profiling.peak_memory import count_saved_tensors, peak_allocated_bytes  # noqa: E402
from cs336_systems.profiling.timeline import plot_timeline  # noqa: E402
from cs336_systems.profiling.torch_profile import (  # noqa: E402
    category_summary,
    kernel_summary,
    profile_benchmark,
    range_summary,
)
from cs336_systems.profiling.trace import count_range_instances, events_in_ranges, load_trace  # noqa: E402

DATA = Path(__file__).parent / "data"
MIB = 2**20
SGEMM = "ampere_sgemm_128x64_tn"
MUL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, std::array<char*, 3ul>)"
)
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


# ---------------------------------------------------------------- kernel names


@pytest.mark.parametrize(
    "name, category, short",
    [
        (SGEMM, "matmul", SGEMM),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "matmul", "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"),
        (MUL, "elementwise", "vectorized_elementwise_kernel [MulFunctor]"),
        (
            "void at::native::reduce_kernel<512, 1, "
            "at::native::ReduceOp<float, at::native::MaxOps<float>, unsigned int, float, 4, 4> >"
            "(at::native::ReduceOp<float, at::native::MaxOps<float>, unsigned int, float, 4, 4>)",
            "reduction",
            "reduce_kernel [MaxOps]",
        ),
        (
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
            "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
            "softmax",
            "cunn_SoftMaxForward",
        ),
        (NCCL, "communication", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
        ("Memcpy HtoD (Pageable -> Device)", "copy", "Memcpy HtoD (Pageable -> Device)"),
        ("aten::mm", "matmul", "aten::mm"),
        ("aten::bmm", "matmul", "aten::bmm"),
        ("aten::exp", "elementwise", "aten::exp"),
        ("aten::amax", "reduction", "aten::amax"),
        ("aten::empty", "other", "aten::empty"),
    ],
)
def test_kernel_names(name, category, short):
    assert kernel_category(name) == category
    assert short_kernel_name(name) == short


# ---------------------------------------------------------------- a synthetic GPU trace


def _x(name, cat, ts, dur, pid, tid, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def gpu_trace() -> dict:
    """Host process 100 (main thread 100, autograd thread 101) launching onto GPU 0, streams 7 and 20.

    measured step [0, 1000): forward [10, 400) launches sgemm (50 us), mul (10 us), sgemm (30 us);
    backward [400, 900) launches, from the autograd thread, sgemm (100 us), mul (20 us), NCCL (200 us).
    warmup step [1000, 1500) launches one sgemm (50 us), which must not count.
    """
    host, main, autograd = 100, 100, 101
    events = [
        _x("measured step", "user_annotation", 0, 1000, host, main),
        _x("forward", "user_annotation", 10, 390, host, main),
        _x("backward", "user_annotation", 400, 500, host, main),
        _x("warmup step", "user_annotation", 1000, 500, host, main),
        _x("forward", "gpu_user_annotation", 100, 105, 0, 7),
        _x("backward", "gpu_user_annotation", 500, 320, 0, 7),
    ]
    launches = [  # (correlation, launch ts, thread, kernel, kernel ts, dur, stream)
        (1, 20, main, SGEMM, 100, 50, 7),
        (2, 30, main, MUL, 160, 10, 7),
        (3, 40, main, SGEMM, 175, 30, 7),
        (4, 450, autograd, SGEMM, 500, 100, 7),
        (5, 460, autograd, MUL, 610, 20, 7),
        (6, 470, autograd, NCCL, 620, 200, 20),
        (7, 1100, main, SGEMM, 1200, 50, 7),
    ]
    for corr, launch, tid, kernel, ts, dur, stream in launches:
        events.append(_x("cudaLaunchKernel", "cuda_runtime", launch, 5, host, tid, correlation=corr))
        events.append(_x(kernel, "kernel", ts, dur, 0, stream, correlation=corr, device=0, stream=stream))
    events.append({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}})
    return {"traceEvents": events}


def test_trace_joins_kernels_to_their_launches():
    ev = load_trace(gpu_trace())
    kernels = ev[ev["kind"] == "kernel"].set_index("correlation")
    assert kernels.loc[4, "launch_ts_us"] == 450 and kernels.loc[4, "host_pid"] == 100
    assert set(kernels["lane"]) == {"GPU 0 stream 7", "GPU 0 stream 20"}


def test_kernel_summary_filters_by_launch_inside_ranges():
    ev = load_trace(gpu_trace())
    s = kernel_summary(ev, within="measured step").set_index("kernel")
    assert s.loc[SGEMM, "total_ms"] == pytest.approx(0.180)  # 50 + 30 + 100; the warm-up sgemm excluded
    assert s.loc[SGEMM, "instances"] == 3
    assert s.loc["vectorized_elementwise_kernel [MulFunctor]", "instances"] == 2
    assert s.loc[SGEMM, "share"] == pytest.approx(180 / 410)
    assert s["share"].sum() == pytest.approx(1.0)
    # Backward kernels were launched from another thread; they still fall in "backward" by time.
    bwd = kernel_summary(ev, within=["measured step", "backward"]).set_index("kernel")
    assert bwd.loc["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "total_ms"] == pytest.approx(0.200)
    fwd = kernel_summary(ev, within=["measured step", "forward"], per="forward").set_index("kernel")
    assert fwd.loc[SGEMM, "total_ms"] == pytest.approx(0.080)
    assert fwd.loc[SGEMM, "instances_per_range"] == 2
    assert kernel_summary(ev, within=None)["instances"].sum() == 7


def test_category_and_range_summaries():
    ev = load_trace(gpu_trace())
    cats = category_summary(ev, within="measured step").set_index("category")
    assert cats.loc["matmul", "share"] == pytest.approx(180 / 410)
    assert cats.loc["communication", "total_ms"] == pytest.approx(0.2)
    r = range_summary(ev, ["forward", "backward"], within="measured step").set_index("range")
    assert r.loc["forward", "instances"] == 1
    assert r.loc["forward", "wall_ms"] == pytest.approx(0.390)
    assert r.loc["forward", "compute_ms"] == pytest.approx(0.090)
    assert r.loc["forward", "gpu_span_ms"] == pytest.approx(0.105)  # 100 -> 205
    assert r.loc["backward", "gpu_span_ms"] == pytest.approx(0.320)  # 500 -> 820


def test_unknown_range_is_an_error():
    ev = load_trace(gpu_trace())
    with pytest.raises(ValueError, match="no range named 'optimizer step'"):
        events_in_ranges(ev, "optimizer step")


def test_timeline_has_a_lane_per_stream_and_ranges_on_top():
    ev = load_trace(gpu_trace())
    fig = plot_timeline(ev, ranges=["forward", "backward"], window="measured step", title="synthetic")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["forward", "backward", "GPU 0 stream 7", "GPU 0 stream 20"]
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert set(legend) == {"matmul", "elementwise", "communication"}
    with pytest.raises(ValueError, match="unknown lanes"):
        plot_timeline(ev, lanes=["GPU 3 stream 1"])


# ---------------------------------------------------------------- a real CPU profile


@pytest.fixture(scope="module")
def cpu_forward_profile():
    cfg = BenchmarkConfig(size="nano", context_length=16, batch_size=1, mode="forward", warmup=1, steps=2, device="cpu")
    return profile_benchmark(cfg)


def test_cpu_profile_counts_operators_per_forward(cpu_forward_profile):
    run = cpu_forward_profile
    assert run.status == "ok" and not run.on_gpu and run.unit == "CPU operator"
    ev = run.events
    assert count_range_instances(ev, "measured step") == 2
    assert count_range_instances(ev, "forward", "measured step") == 2
    s = kernel_summary(ev, within=["measured step", "forward"], per="forward").set_index("kernel")
    layers = 1  # nano: per layer q, k, v, o, W1, W2, W3 are mm's and the two attention products bmm's; plus the LM head
    assert s.loc["aten::mm", "instances_per_range"] == 7 * layers + 1
    assert s.loc["aten::bmm", "instances_per_range"] == 2 * layers
    assert s["share"].sum() == pytest.approx(1.0)
    # Self times never exceed the wall time of the ranges they sit in.
    r = range_summary(ev, ["forward", "computing softmax"], within="measured step").set_index("range")
    assert r.loc["forward", "compute_ms"] <= r.loc["forward", "wall_ms"] + 1e-9
    assert r.loc["computing softmax", "instances"] == 2 * layers
    with pytest.raises(ValueError, match="no range named 'backward'"):
        kernel_summary(ev, within=["measured step", "backward"])


def test_cpu_timeline_lanes_are_threads(cpu_forward_profile):
    ev = cpu_forward_profile.events
    fig = plot_timeline(ev, ranges=["forward"], window="measured step")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "forward" and all(label.startswith("CPU thread ") for label in labels[1:])


# ---------------------------------------------------------------- memory snapshots


@pytest.fixture(scope="module")
def example_snapshot():
    return load_snapshot(DATA / "memory_snapshot_example.pickle")


def _replay_peak(snapshot: dict) -> int:
    """Independent replay: live bytes after each alloc / free_completed, starting from what existed before."""
    trace = snapshot["device_traces"][0]
    allocated = {e["addr"] for e in trace if e["action"] == "alloc"}
    before = sum(e["size"] for e in trace if e["action"] == "free_completed" and e["addr"] not in allocated)
    before += sum(b["size"] for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    live = peak = before
    for e in trace:
        live += e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
        peak = max(peak, live)
    return peak


def test_snapshot_parsing(example_snapshot):
    snapshot, phases = example_snapshot
    allocs = snapshot_allocations(snapshot)
    assert peak_active_bytes(allocs) == 212 * MIB == _replay_peak(snapshot)  # see tests/data/make_memory_snapshot.py
    before = allocs[allocs["label"] == BEFORE_RECORDING]
    assert before["size"].sum() == 97 * MIB and (before["start"] == -1).all()
    assert set(allocs["label"]) >= {
        "model.py:68 forward",
        "naive.py:21 naive_attention",
        "nn_utils.py:14 softmax",
        "optim.py:65 step",
        NO_PYTHON_FRAME,
    }
    assert [p["name"] for p in phases] == ["forward", "backward", "optimizer step"]
    top = largest_allocations(allocs, top=3)
    assert top.loc[0, "size_mib"] == 32 and top.loc[0, "label"] == BEFORE_RECORDING
    assert top.loc[1, "size_mib"] == 20 and top.loc[1, "label"] == "model.py:68 forward"
    active = active_memory(allocs, allocs["label"])
    assert active.iloc[-1].sum() == 96 * MIB  # parameters and optimizer state remain


def test_user_frame_skips_torch_internals():
    frames = [
        {"filename": "/x/site-packages/torch/_tensor.py", "line": 41, "name": "wrapped"},
        {"filename": "/repo/lib/cs336_systems/attention/naive.py", "line": 21, "name": "naive_attention"},
    ]
    assert user_frame(frames)["line"] == 21
    assert user_frame(frames[:1]) is None


def test_active_memory_figure(example_snapshot):
    snapshot, phases = example_snapshot
    fig = plot_active_memory(snapshot, phases, top=3, title="example")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[0].startswith("model.py:68 forward (largest 20.0 MiB)")
    assert BEFORE_RECORDING in legend and "smaller allocations" in legend
    assert fig.axes[0].get_ylabel() == "active memory (MiB)"
    phase_names = {t.get_text() for t in fig.axes[0].texts}
    assert phase_names == {"forward", "backward", "optimizer step"}


# ---------------------------------------------------------------- memory measurement


def test_count_saved_tensors_by_hand():
    w = torch.nn.Parameter(torch.randn(8, 4))
    x = torch.randn(3, 8, requires_grad=True)
    with count_saved_tensors(exclude=[w]) as saved:
        y = x @ w  # saves x (3x8) and w (a parameter: not counted)
        z = torch.exp(y)  # saves its result (3x4)
        (z * z.T.T).sum()  # saves z twice: same storage, counted once
    assert saved.total_bytes == (3 * 8 + 3 * 4) * 4


def test_peak_allocated_bytes_on_cpu():
    def work():
        a = torch.empty(MIB // 4)  # 1 MiB
        b = torch.empty(2 * MIB // 4)  # 2 MiB
        del a, b
        torch.empty(MIB // 4)  # 1 MiB again, after the peak

    assert peak_allocated_bytes(work, torch.device("cpu")) == 3 * MIB


# ---------------------------------------------------------------- checkpointing


@pytest.mark.parametrize(
    "strategy, unit", [("every", "block"), ("every", "sublayer"), ("binary", "block"), ("chain", "sublayer")]
)
def test_checkpointed_model_matches_plain(strategy, unit):
    torch.manual_seed(0)
    model = TransformerLM(100, 8, 16, 3, 2, 32).double()
    ids = torch.randint(0, 100, (2, 8))
    ref = model(ids).sum()
    ref.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    wrapped = CheckpointedLM(model, strategy, k=2, unit=unit)
    out = wrapped(ids).sum()
    out.backward()
    assert out.item() == pytest.approx(ref.item(), rel=1e-12)
    for g, r in zip((p.grad for p in model.parameters()), ref_grads):
        torch.testing.assert_close(g, r)


def test_block_forwards_per_strategy():
    n = 8
    blocks = [CountingLayer(TransformerBlock(8, 2, 16, 4)) for _ in range(n)]
    x = torch.randn(1, 4, 8, requires_grad=True)
    expected = {
        "none": n,
        "every": 2 * n,
        "binary": 2 * n + n // 2 * (int(math.log2(n)) - 1),
        "chain": n * (n + 1) // 2,
    }
    for strategy, forwards in expected.items():
        for b in blocks:
            b.calls = 0
        run_strategy(blocks, x, strategy, k=2).sum().backward()
        assert sum(b.calls for b in blocks) == forwards, strategy


def test_strategy_memory_trend():
    df = strategy_costs([4, 8], d_model=16, num_heads=2, d_ff=32, batch=1, context=32)
    peak = df.pivot(index="blocks", columns="strategy", values="peak_bytes")
    assert peak.loc[8, "none"] / peak.loc[4, "none"] == pytest.approx(2.0, rel=0.15)  # linear in N
    assert peak.loc[8, "chain"] <= peak.loc[8, "binary"] <= peak.loc[8, "every"] < peak.loc[8, "none"]
    assert peak.loc[8, "chain"] / peak.loc[4, "chain"] < 1.1  # flat in N


def test_matmul_shares_leave_unprofiled_runs_out():
    """A training step that ran out of memory has no categories: its shares are NaN, not 0%."""
    from types import SimpleNamespace

    import pandas as pd

    from cs336_systems.profiling.profile_sweep import matmul_shares

    rows = [
        ("small", 128, "forward", "matmul", 0.8),
        ("small", 128, "forward", "elementwise", 0.2),
        ("small", 128, "training step", "matmul", 0.6),
        ("small", 128, "training step", "copy", 0.4),
        ("xl", 1024, "forward", "matmul", 0.7),
        ("xl", 1024, "forward", "elementwise", 0.3),
    ]
    sweep = SimpleNamespace(
        categories=pd.DataFrame(rows, columns=["size", "context_length", "scope", "category", "share"])
    )
    shares = matmul_shares(sweep).set_index(["size", "context_length", "category"])
    assert shares.loc[("small", 128, "copy"), "forward"] == 0.0  # profiled, no copy kernels
    assert shares.loc[("small", 128, "elementwise"), "training step"] == 0.0
    assert shares.loc[("xl", 1024, "matmul"), "forward"] == 0.7
    assert shares.loc[("xl", 1024, "matmul"), ["training step"]].isna().all()  # out of memory: not profiled
    assert shares["training step"].count() == 3  # the three categories of small only


def test_step_phases_covers_the_three_phases_of_a_training_step_only():
    from cs336_systems.benchmarking.harness import build
    from cs336_systems.profiling.torch_profile import step_phases

    config = BenchmarkConfig(size="nano", context_length=16, batch_size=2, mode="train-step", device="cpu")
    row = step_phases(build(config), steps=2)
    assert set(row) == {f"{p}_{k}_ms" for p in ("forward", "backward", "optimizer") for k in ("wall", "compute")}
    assert all(v > 0 for v in row.values())
    assert all(
        row[f"{p}_compute_ms"] <= row[f"{p}_wall_ms"] for p in ("forward", "backward", "optimizer")
    )  # CPU: self times inside the range
    with pytest.raises(ValueError, match="need a train-step setup, got mode 'forward'"):
        step_phases(build(BenchmarkConfig(size="nano", context_length=16, batch_size=2, mode="forward", device="cpu")))


def test_record_chrome_trace_is_what_load_trace_reads():
    """One call of a step under torch.profiler, exported and read back: its operators are rows."""
    from cs336_systems.profiling.trace import load_trace, record_chrome_trace

    x = torch.randn(32, 32)
    events = load_trace(record_chrome_trace(lambda: torch.mm(x, x)))
    assert (events.name == "aten::mm").sum() == 1
