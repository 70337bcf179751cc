"""The device's measured matmul ceiling: FLOP/s of one large square matrix product.

An n x n by n x n product does 2 n^3 FLOPs. The ceiling against which model FLOPs utilisation and
attention kernels' rates are reported is measured here rather than taken from a spec sheet, so it
reflects this device, its clocks and this PyTorch build.
"""

from __future__ import annotations

import statistics

import torch

from cs336_systems.benchmarking.timing import TimingSettings, measure_times_ms


def measure_matmul_tflops(
    dtype: torch.dtype = torch.bfloat16,
    n: int = 8192,
    device: torch.device | str | None = None,
    settings: TimingSettings = TimingSettings(warmup_ms=25, rep_ms=100),
) -> float:
    """Achieved TFLOP/s of an n×n by n×n matmul (2·n³ FLOPs over the median time of `measure_times_ms`)."""
    if n < 1:
        raise ValueError(f"need n >= 1, got {n}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
    ms = statistics.median(measure_times_ms(lambda: a @ b, device, settings))
    return 2 * n**3 / (ms * 1e-3) / 1e12
