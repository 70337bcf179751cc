"""Tolerances for floating-point results that depend on a BLAS's summation order.

A matrix product sums its terms in an order its BLAS chooses (MKL's AVX2 and AVX-512 paths, its
compatible mode, OpenBLAS and cuBLAS each have their own), so one value computed two ways (a whole
batch, or two halves averaged) may differ in its last bits, by amounts that scale with the values.
Such comparisons are stated in units of the compared tensors' precision at their largest magnitude,
not as an absolute number that holds only for the magnitudes one seed gives on one machine.
"""

from __future__ import annotations

import torch


def eps_units(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| in units of eps·max(|a|, |b|) over the tensors (one ulp of their largest element is 1/2 to 1 unit)."""
    diff = (a - b).abs().max()
    if diff == 0:
        return 0.0
    return (diff / (torch.finfo(a.dtype).eps * torch.maximum(a.abs().max(), b.abs().max()))).item()
