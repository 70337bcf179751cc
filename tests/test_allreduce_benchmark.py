"""All-reduce benchmark: bandwidth formulas, a gloo run with subgroups, torchrun, generated commentary."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

from cs336_systems.experiments.allreduce_benchmark import (
    MB,
    benchmark_allreduce,
    bus_bandwidth,
    describe_allreduce,
    ring_traffic,
    size_label,
)


def test_bandwidth_formulas_by_hand():
    assert ring_traffic(2) == 1.0 and ring_traffic(4) == 1.5 and ring_traffic(6) == pytest.approx(5 / 3)
    assert bus_bandwidth(10.0, 4) == 15.0  # 10 GB/s of input, each rank moves 2*3/4 of it
    assert bus_bandwidth(10.0, 1) == 0.0
    assert [size_label(s) for s in (10**6, 10**7, 10**8, 10**9)] == ["1 MB", "10 MB", "100 MB", "1 GB"]


@pytest.mark.multiprocess
def test_gloo_run_measures_every_world_size_and_size():
    df, not_run = benchmark_allreduce(["gloo", "nccl"], [1, 2], [4 * 1024, MB], warmup=1, iters=3)
    assert list(zip(df.world_size, df.size_bytes)) == [(1, 4096), (1, MB), (2, 4096), (2, MB)]
    assert (df.backend == "gloo").all() and (df.mean_ms > 0).all()
    assert all(
        len(per_rank) == n and all(len(t) == 3 for t in per_rank) for per_rank, n in zip(df.per_rank_ms, df.world_size)
    )
    assert df.algbw_gbps.tolist() == pytest.approx((df.size_bytes / (df.mean_ms / 1e3) / 1e9).tolist())
    assert df.busbw_gbps.tolist() == pytest.approx((df.algbw_gbps * 2 * (df.world_size - 1) / df.world_size).tolist())
    if torch.cuda.device_count() < 2:
        assert [part for part, _ in not_run][-1] == "nccl with 2 processes"


def test_bad_settings_are_rejected_before_starting_processes():
    with pytest.raises(ValueError, match="multiples of 4 bytes"):
        benchmark_allreduce(["gloo"], [2], [10**6 + 1])
    with pytest.raises(ValueError, match="world sizes"):
        benchmark_allreduce(["gloo"], [0, 2], [MB])


@pytest.mark.multiprocess
def test_runs_under_torchrun(tmp_path):
    out = tmp_path / "ar.csv"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "cs336_systems.experiments.allreduce_benchmark",
        "--sizes-mb",
        "0.004",
        "0.04",
        "--warmup",
        "1",
        "--iters",
        "2",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    df = pd.read_csv(out)
    assert df.world_size.tolist() == [2, 2] and df.size_bytes.tolist() == [4000, 40000]


def test_commentary_is_computed_from_the_table():
    df = pd.DataFrame(
        [
            dict(
                backend="gloo", device="cpu", world_size=2, size_bytes=10**6, size="1 MB", mean_ms=2.0, busbw_gbps=0.5
            ),
            dict(
                backend="gloo", device="cpu", world_size=2, size_bytes=10**7, size="10 MB", mean_ms=10.0, busbw_gbps=1.0
            ),
            dict(
                backend="gloo", device="cpu", world_size=4, size_bytes=10**7, size="10 MB", mean_ms=30.0, busbw_gbps=0.5
            ),
            dict(
                backend="nccl",
                device="cuda",
                world_size=2,
                size_bytes=10**7,
                size="10 MB",
                mean_ms=0.1,
                busbw_gbps=100.0,
            ),
        ]
    )
    text = describe_allreduce(df)
    assert "1.00 GB/s, at 10 MB with 2 processes" in text
    assert "(3.00×)" in text and "grows 1.50×" in text and "above" in text  # 30/10 against ring 1.5/1.0
    assert "100.0× the bus bandwidth" in text
