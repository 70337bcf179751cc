"""The device's measured matmul ceiling: FLOP/s of one large square matrix product.

An n x n by n x n product does 2 n^3 FLOPs. The ceiling against which model FLOPs utilisation
is reported is measured here rather than taken from a spec sheet, so it reflects this device,
its clocks and this PyTorch build.
"""

from __future__ import annotations

import statistics
import timeit

import torch

from cs336_systems.benchmarking.harness import synchronize


def measure_matmul_tflops(
    dtype: torch.dtype = torch.bfloat16, n: int = 8192, device: torch.device | str | None = None, warmup: int = 3, repeats: int = 10,
) -> float:
    """Median TFLOP/s of `repeats` synchronized n x n x n products (random data) after `warmup` ones."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if n < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need n >= 1, repeats >= 1, warmup >= 0; got n={n}, repeats={repeats}, warmup={warmup}")
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(warmup):
        a @ b
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = timeit.default_timer()
        a @ b
        synchronize(device)
        times.append(timeit.default_timer() - start)
    return 2.0 * n**3 / statistics.median(times) / 1e12
