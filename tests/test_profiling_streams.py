"""Per-stream busy time and hidden communication of a profiled step (`profiling.streams`), on a hand-made
Chrome trace whose answers are known: device 0 has a compute stream (kernels at 0-10, 10-20 and 40-50 µs) and
an NCCL stream (30-45 µs, and 60-70 µs: 5 µs hidden behind the third compute kernel, 20 µs exposed);
device 1 one compute kernel and no communication."""

from __future__ import annotations

import math

import pytest

from cs336_systems.profiling.streams import communication_overlap, merged_intervals, overlap_length, stream_summary
from cs336_systems.profiling.trace import load_trace

REDUCE = "ncclDevKernel_Reduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"


def kernel(name, device, stream, ts, dur):
    return dict(
        ph="X", cat="kernel", name=name, pid=device, tid=stream, ts=ts, dur=dur, args=dict(device=device, stream=stream)
    )


TRACE = {
    "traceEvents": [
        kernel(GEMM, 0, 7, 0, 10),
        kernel("triton_poi_fused_mul_silu_0", 0, 7, 10, 10),
        kernel(GEMM, 0, 7, 40, 10),
        kernel(REDUCE, 0, 21, 30, 15),
        kernel(REDUCE, 0, 21, 60, 10),
        kernel(GEMM, 1, 7, 0, 30),
        dict(ph="X", cat="user_annotation", name="backward", pid=1, tid=1, ts=0, dur=80),
    ]
}


def test_merged_intervals_and_their_overlap():
    merged = merged_intervals([5, 0, 20, 8], [10, 6, 30, 9])
    assert merged.tolist() == [[0, 10], [20, 30]]
    assert overlap_length(merged, merged_intervals([8, 25], [22, 40])) == 2 + 2 + 5
    assert overlap_length(merged, merged_intervals([], [])) == 0.0


def test_stream_summary():
    summary = stream_summary(load_trace(TRACE)).set_index("lane")
    assert list(summary.index) == ["GPU 0 stream 21", "GPU 0 stream 7", "GPU 1 stream 7"]
    assert summary.loc["GPU 0 stream 7"].tolist() == [0, 3, pytest.approx(0.030), 0.0, "compute"]
    assert summary.loc["GPU 0 stream 21", "busy_ms"] == pytest.approx(0.025)
    assert summary.loc["GPU 0 stream 21", "role"] == "communication"


def test_communication_hidden_behind_compute_on_its_device():
    overlap = communication_overlap(load_trace(TRACE)).set_index("device")
    row = overlap.loc[0]
    assert row.communication_ms == pytest.approx(0.025) and row.hidden_ms == pytest.approx(0.005)
    assert row.exposed_ms == pytest.approx(0.020) and row.hidden_fraction == pytest.approx(0.2)
    assert row.span_ms == pytest.approx(0.070) and row.compute_ms == pytest.approx(0.030)
    assert overlap.loc[1].communication_ms == 0 and math.isnan(overlap.loc[1].hidden_fraction)


def test_a_trace_without_gpu_events_is_refused():
    cpu_only = {"traceEvents": [dict(ph="X", cat="cpu_op", name="aten::mm", pid=1, tid=1, ts=0, dur=5)]}
    with pytest.raises(ValueError, match="no GPU kernels"):
        stream_summary(load_trace(cpu_only))


def test_two_gpu_profile_of_a_trace_file(tmp_path):
    """What notebook 20 and tools/leaderboard_8b_two_gpus.py show of a traced step, from a gzipped trace file."""
    import gzip
    import json

    import matplotlib

    matplotlib.use("Agg")
    from cs336_systems.experiments.leaderboard_8b_record import two_gpu_profile

    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(TRACE, f)
    streams, overlap, fig = two_gpu_profile(path)
    assert len(streams) == 3 and overlap.set_index("device").loc[0].exposed_ms == pytest.approx(0.020)
    assert fig.axes[0].get_title().startswith("8B step")


def _launched(name, device, stream, ts, dur, launch_ts, correlation):
    """A kernel on (device, stream) at [ts, ts + dur) µs and the runtime call on host 100 that launched it."""
    k = kernel(name, device, stream, ts, dur)
    k["args"]["correlation"] = correlation
    launch = dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", pid=100, tid=1, ts=launch_ts, dur=1,
                  args=dict(correlation=correlation))  # fmt: skip
    return [k, launch]


# Two steps, the second in the command's "traced step" range (host 100..200 µs): the first step's compute at
# 0-50 µs, its exchange in two rounds (50-100 µs, 150-160 µs) running into the second step, whose compute runs
# 95-150 and 160-200 µs, and whose own exchange trails at 200-240 µs, after its last compute kernel.
TWO_STEPS = {
    "traceEvents": [
        *_launched(GEMM, 0, 7, 0, 50, 5, 1),
        *_launched(REDUCE, 0, 21, 50, 50, 60, 2),
        *_launched(REDUCE, 0, 21, 150, 10, 61, 3),
        *_launched(GEMM, 0, 7, 95, 55, 110, 4),
        *_launched(GEMM, 0, 7, 160, 40, 120, 5),
        *_launched(REDUCE, 0, 21, 200, 40, 130, 6),
        dict(ph="X", cat="user_annotation", name="traced step", pid=100, tid=1, ts=100, dur=100),
    ]
}


def test_the_traced_step_is_cut_to_its_compute_span(tmp_path):
    """The window is the traced step's compute kernels' span (95-200 µs): the first step's exchange counts
    where it runs into it (5 µs hidden, 10 µs exposed), its own trailing exchange does not."""
    import gzip
    import json

    import matplotlib

    matplotlib.use("Agg")
    from cs336_systems.experiments.leaderboard_8b_record import two_gpu_profile
    from cs336_systems.profiling.streams import clip_to_window

    whole = communication_overlap(load_trace(TWO_STEPS)).iloc[0]
    assert whole.exposed_ms == pytest.approx(0.095)
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(TWO_STEPS, f)
    streams, overlap, fig = two_gpu_profile(path)
    assert fig.axes[0].get_xlim() == pytest.approx((0.0, 0.105)), "the figure spans the traced step's window only"
    row = overlap.iloc[0]
    assert row.span_ms == pytest.approx(0.105) and row.compute_ms == pytest.approx(0.095)
    assert row.communication_ms == pytest.approx(0.015) and row.hidden_ms == pytest.approx(0.005)
    assert row.exposed_ms == pytest.approx(0.010)
    assert streams.set_index("lane").loc["GPU 0 stream 21", "kernels"] == 2
    clipped = clip_to_window(load_trace(TWO_STEPS), 95, 200)
    gpu = clipped[clipped.kind == "kernel"]
    assert (gpu.dur_us == gpu.end_us - gpu.ts_us).all() and gpu.ts_us.min() == 95 and gpu.end_us.max() == 200
    assert (clipped.kind == "runtime").sum() == 6, "the host's events stay as they are"
