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
