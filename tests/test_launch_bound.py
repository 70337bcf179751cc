"""Launch-bound or GPU-bound: the busy fraction of synthetic intervals, the labels, the CPU measurement, and
the CUDA-graph path with the device faked (no GPU here)."""

from __future__ import annotations

import contextlib
import math

import pandas as pd
import pytest
import torch

import cs336_systems.benchmarking.harness as harness
import cs336_systems.benchmarking.launch_bound as lb
from cs336_systems.benchmarking import BenchmarkConfig, grid, run_benchmark, sweep
from cs336_systems.profiling.trace import load_trace

TINY = dict(size="nano", context_length=16, batch_size=2, warmup=1, steps=2, device="cpu")


def _x(name, cat, ts, dur, pid, tid, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def two_step_trace() -> dict:
    """Host process 100 launching onto GPU 0. Measured steps [0, 1000) and [1000, 2000); a warm-up step
    [2000, 2500) whose kernel must not count. Step 1: kernels [100, 150) and [120, 200) overlap (100 busy),
    [300, 310) after a gap (10); step 2: [1100, 1200) on stream 7 and [1150, 1250) on stream 20 (150 busy),
    and a memset [1400, 1410) (10). 270 us over two steps."""
    events = [
        _x("measured step", "user_annotation", 0, 1000, 100, 100),
        _x("measured step", "user_annotation", 1000, 1000, 100, 100),
        _x("warmup step", "user_annotation", 2000, 500, 100, 100),
    ]
    work = [
        (10, "kernel", 100, 50, 7),
        (20, "kernel", 120, 80, 7),
        (30, "kernel", 300, 10, 7),
        (1010, "kernel", 1100, 100, 7),
        (1020, "kernel", 1150, 100, 20),
        (1030, "gpu_memset", 1400, 10, 7),
        (2010, "kernel", 2100, 300, 7),
    ]
    for corr, (launch, cat, ts, dur, stream) in enumerate(work):
        events.append(_x("cudaLaunchKernel", "cuda_runtime", launch, 5, 100, 100, correlation=corr))
        events.append(_x(f"{cat}_{corr}", cat, ts, dur, 0, stream, correlation=corr, device=0, stream=stream))
    return {"traceEvents": events}


def test_busy_time_is_the_union_of_overlapping_kernels_inside_the_measured_steps():
    out = lb.busy_time(load_trace(two_step_trace()), steps=2)
    assert out == {"busy_ms": pytest.approx(0.135), "busy_on": lb.ON_GPU}
    assert lb.union_length([20, 0, 5, 25, 14], [25, 10, 12, 30, 15]) == 23  # overlapping, touching, apart
    assert lb.union_length([], []) == 0.0


def test_busy_time_of_a_cpu_trace_is_the_union_of_its_operators():
    trace = {
        "traceEvents": [
            _x("measured step", "user_annotation", 0, 100, 1, 1),
            _x("aten::linear", "cpu_op", 10, 40, 1, 1),
            _x("aten::mm", "cpu_op", 15, 30, 1, 1),
            _x("aten::relu", "cpu_op", 70, 10, 1, 1),
            _x("aten::mm", "cpu_op", 150, 10, 1, 1),
        ]
    }
    assert lb.busy_time(load_trace(trace)) == {"busy_ms": pytest.approx(0.05), "busy_on": lb.ON_CPU}


@pytest.mark.parametrize(
    "busy, speedup, gpu, label",
    [
        (0.3, 3.0, True, "launch-bound"),
        (0.69, 1.3, True, "launch-bound"),
        (0.95, 1.02, True, "GPU-bound"),
        (0.7, 1.29, True, "GPU-bound"),
        (0.4, 1.1, True, "unclear"),  # the GPU idles but a graph does not recover it
        (0.9, 2.0, True, "unclear"),  # busy, yet a graph is much faster
        (0.4, float("nan"), True, "host-bound"),
        (0.9, float("nan"), True, "GPU-bound"),
        (0.4, float("nan"), False, "dispatch-bound"),
        (0.9, float("nan"), False, "operator-bound"),
        (float("nan"), 2.0, True, "not measured"),
    ],
)
def test_regime_labels(busy, speedup, gpu, label):
    assert lb.regime(busy, speedup, gpu) == label


def _row(size, mode="forward", mean=10.0, busy=5.0, graphed=5.0, on=lb.ON_GPU, status="ok", graph="ok", profiled=20.0):
    return dict(
        size=size,
        context_length=256,
        batch_size=4,
        precision="fp32",
        mode=mode,
        status=status,
        mean_ms=mean,
        busy_ms=busy,
        busy_on=on,
        profiled_ms=profiled,
        graphed_ms=graphed,
        graph_status=graph,
    )


def test_with_regime_divides_kernels_by_the_eager_time_and_operators_by_the_profiled_time():
    rows = pd.DataFrame(
        [
            _row("small", mean=20.0, busy=5.0, graphed=5.5),  # 25% busy, 3.6x: launch-bound
            _row("large", mean=100.0, busy=97.0, graphed=99.0),  # GPU-bound
            _row("xl", mean=50.0, busy=60.0, graphed=49.0),  # busier than timed: capped at 1
            _row("10B", status="OOM", mean=float("nan"), busy=float("nan")),
            _row("medium", busy=3.0, graphed=float("nan"), graph="failed: RuntimeError: operation not permitted"),
            _row(
                "nano",
                on=lb.ON_CPU,
                mean=10.0,
                busy=15.0,
                profiled=30.0,
                graphed=float("nan"),
                graph=lb.NO_GRAPH_ON_CPU,
            ),
        ]
    )
    d = lb.with_regime(rows).set_index("size")
    assert d.loc["small", "busy_fraction"] == pytest.approx(0.25)
    assert d.loc["small", "graph_speedup"] == pytest.approx(20 / 5.5)
    assert d.loc["xl", "busy_fraction"] == 1.0
    assert d.loc["nano", "busy_fraction"] == pytest.approx(0.5)  # 15 of the 30 profiled ms, not of the 10 timed
    assert list(d["regime"]) == [
        "launch-bound",
        "GPU-bound",
        "GPU-bound",
        "not measured",
        "host-bound",
        "dispatch-bound",
    ]
    table = lb.regime_table(rows, ["nano", "small", "medium", "large", "xl", "10B"]).set_index("size")
    assert table.loc["10B", "eager (ms)"] == "OOM" and table.loc["10B", "regime"] == "OOM"
    assert table.loc["medium", "graphed (ms)"].startswith("failed: RuntimeError")
    assert pd.isna(table.loc["nano", "graphed (ms)"])  # no graph on a CPU: empty, not a failure
    assert list(table.index) == ["nano", "small", "medium", "large", "xl", "10B"]


def test_a_table_without_the_measurement_is_not_measured():
    rows = pd.DataFrame([dict(size="small", mode="forward", status="ok", mean_ms=10.0)])
    assert list(lb.with_regime(rows)["regime"]) == ["not measured"]


def test_the_cpu_measurement_runs_in_the_sweep_and_keeps_the_timings():
    rows = sweep(grid(BenchmarkConfig(**TINY), mode=list(harness.MODES)), progress=False, then=lb.launch_probe())
    assert list(rows["status"]) == ["ok"] * 3
    assert (rows["busy_on"] == lb.ON_CPU).all() and (rows["busy_ms"] > 0).all() and (rows["profiled_ms"] > 0).all()
    assert (rows["graph_status"] == lb.NO_GRAPH_ON_CPU).all() and rows["graphed_ms"].isna().all()
    d = lb.with_regime(rows)
    assert d["busy_fraction"].between(0, 1).all()
    assert set(d["regime"]) <= {"dispatch-bound", "operator-bound"}
    assert len(rows["step_times_ms"].iloc[0]) == 2  # the timed steps are the harness's, the probe's come after


def test_a_profile_that_fails_leaves_the_timed_row_and_says_why(monkeypatch):
    def fail(setup, steps):
        raise RuntimeError("the profiler recorded no GPU kernels for the step")

    monkeypatch.setattr(lb, "step_busy", fail)
    rows = sweep([BenchmarkConfig(**TINY)], progress=False, then=lb.launch_probe())
    assert rows["status"].tolist() == ["ok"] and rows["mean_ms"].notna().all()
    assert rows["busy_status"].tolist() == ["failed: RuntimeError: the profiler recorded no GPU kernels for the step"]
    assert lb.regime_table(rows)["regime"].tolist() == [
        "not measured: failed: RuntimeError: the profiler recorded no GPU kernels for the step"
    ]


def test_the_row_keeps_the_timed_steps_peak_memory_whatever_then_allocates(monkeypatch):
    peak = {"bytes": 3 * 2**20}
    monkeypatch.setattr(harness, "device_peak_memory", lambda device: peak["bytes"])

    def then(setup):
        peak["bytes"] = 99 * 2**20  # a CUDA graph's own pool, say
        return {}

    assert run_benchmark(BenchmarkConfig(**TINY), then=then)["peak_memory_mib"] == 3


# ------------------------------------------------------------------------- CUDA graphs, device faked


class FakeGraph:
    """Records the step it captures and runs it again on replay."""

    def __init__(self):
        self.step, self.replays, self.was_reset = None, 0, False

    def replay(self):
        self.replays += 1
        self.step()

    def reset(self):
        self.was_reset = True


@pytest.fixture
def fake_cuda_setup(monkeypatch):
    """A CPU model stepped as if on a GPU: no device synchronize, a graph that replays the captured step."""
    monkeypatch.setattr(harness, "synchronize", lambda device: None)
    graphs = []

    def make_graph():
        graphs.append(FakeGraph())
        return graphs[-1]

    monkeypatch.setattr(torch.cuda, "CUDAGraph", make_graph)
    setup = harness.build(BenchmarkConfig(**{**TINY, "mode": "forward-backward"}))
    setup.device = torch.device("cuda")
    return setup, graphs


def test_graphed_step_times_the_replays(monkeypatch, fake_cuda_setup):
    setup, graphs = fake_cuda_setup

    def capture(graph, step, device):
        graph.step = step
        step()

    monkeypatch.setattr(lb, "capture", capture)
    out = lb.graphed_step(setup, warmup=1, steps=3)
    assert out["graph_status"] == "ok" and out["graphed_ms"] > 0 and out["graphed_std_ms"] >= 0
    assert graphs[0].replays == 4 and graphs[0].was_reset


@pytest.mark.parametrize(
    "error, status",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "OOM"),
        (
            RuntimeError("operation not permitted when stream is capturing\nmore"),
            "failed: RuntimeError: operation not permitted when stream is capturing",
        ),
    ],
)
def test_a_capture_that_fails_is_a_status_and_leaves_no_gradients(monkeypatch, fake_cuda_setup, error, status):
    setup, graphs = fake_cuda_setup

    def capture(graph, step, device):
        for p in setup.model.parameters():  # a backward that got halfway
            p.grad = torch.ones_like(p)
        raise error

    monkeypatch.setattr(lb, "capture", capture)
    out = lb.graphed_step(setup)
    assert out["graph_status"] == status and math.isnan(out["graphed_ms"])
    assert graphs[0].was_reset and all(p.grad is None for p in setup.model.parameters())


def test_capture_warms_up_on_its_stream_and_reraises_the_error_raised_inside(monkeypatch):
    events = []

    class Stream:
        def wait_stream(self, other):
            events.append("wait")

    class Capture:
        def __init__(self, graph, stream=None):
            assert isinstance(stream, Stream)

        def __enter__(self):
            events.append("begin")

        def __exit__(self, *exc):
            events.append("end")
            if exc[0] is not None:
                raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    calls = []

    def step():
        calls.append(events[-1])
        if len(calls) == 2:
            raise ValueError("a host synchronisation inside the step")

    with pytest.raises(ValueError, match="host synchronisation"):
        lb.capture(object(), step, torch.device("cuda"))
    assert calls == ["wait", "begin"]  # once on the capture stream before the capture, once inside it
    assert events[-1] == "end"


# ------------------------------------------------------------------------------------- on a real GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_mode_of_a_small_model_is_captured_and_replays_the_steps_work(precision):
    config = BenchmarkConfig(
        size="small", context_length=256, batch_size=4, warmup=2, steps=3, precision=precision, device="cuda"
    )
    rows = lb.with_regime(sweep(grid(config, mode=list(harness.MODES)), progress=False, then=lb.launch_probe()))
    assert (rows["graph_status"] == "ok").all(), rows["graph_status"].tolist()
    assert (rows["busy_on"] == lb.ON_GPU).all() and rows["busy_fraction"].between(0.01, 1).all()
    # A replay runs the step's kernels: it cannot take much less than the GPU's busy time of an eager step.
    assert (rows["graphed_ms"] > 0.8 * rows["busy_ms"]).all(), rows[["mode", "busy_ms", "graphed_ms"]]
    assert (rows["regime"] != lb.NOT_MEASURED).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_graphed_training_step_updates_the_weights_and_gives_its_memory_back():
    setup = harness.build(BenchmarkConfig(size="nano", context_length=64, mode="train-step", device="cuda"))
    setup.step()  # AdamW's state exists before the capture, as after the harness's timed steps
    weights = [p.detach().clone() for p in setup.model.parameters()]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = lb.graphed_step(setup, warmup=0, steps=2)
    assert out["graph_status"] == "ok"
    assert any(not torch.equal(a, b) for a, b in zip(weights, setup.model.parameters()))
    assert torch.cuda.memory_allocated() <= before
