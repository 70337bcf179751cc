"""Shape and stride facts of FlashAttention's tensors, for every layer above the kernels.

How the kernels read (..., N, d) tensors as a batch of (N, d) matrices (`as_rows`), the on-chip head
dimension and the fp32 product they use, and whether tensor descriptors (TMA) can read a tensor. It
imports only a kernel, to learn whether Triton's interpreter built them (`INTERPRETED`).
"""

from __future__ import annotations

import torch

from cs336_systems.attention.configs import device_facts
from cs336_systems.attention.kernels.triton_forward import flash_fwd_kernel
from cs336_systems.triton_support.interpreter import built_by_interpreter, repair_interpreter


def kernels_interpreted() -> bool:
    """True when the kernels were built by the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    return built_by_interpreter(flash_fwd_kernel)


INTERPRETED = kernels_interpreted()  # fixed when the kernels were built, at import
if INTERPRETED:
    repair_interpreter()


def input_precision(dtype: torch.dtype) -> str:
    """How tl.dot multiplies fp32 tiles, following torch.get_float32_matmul_precision().

    "highest" (torch's default): tf32x3, fp32 accuracy from TF32 tensor cores. Each operand is
    split as a = a_hi + a_lo (a_hi its TF32 rounding) and a·b ≈ a_hi·b_hi + a_hi·b_lo + a_lo·b_hi,
    dropping only a_lo·b_lo (relative size 2^-22), the product of PyTorch's own fp32 attention
    kernel; it measured as accurate as IEEE products on the FMA units and faster
    (docs/flash_attention_tuning.md). "high" and "medium": one TF32 product (10 mantissa bits, about
    1e-3 relative error), as torch's own matmuls take under those settings.
    16-bit inputs always use tensor cores; the setting does not apply to them.
    """
    if dtype != torch.float32:
        return "tf32"
    return "tf32x3" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def batch_stride(t: torch.Tensor, row_dims: int) -> int | None:
    """The one stride that steps through t's leading dimensions (all but the last `row_dims`) as a
    single batch dimension, or None where they do not merge (where reshape would copy)."""
    shape, strides = t.shape, t.stride()
    stride_b = span = None
    for i in range(len(shape) - row_dims - 1, -1, -1):
        if shape[i] == 1:
            continue
        if stride_b is None:
            stride_b = strides[i]
        elif strides[i] != span:
            return None
        span = shape[i] * strides[i]
    if stride_b is None:  # a single batch element: any stride serves, this one keeps the rows' alignment
        stride_b = shape[-row_dims] * strides[-row_dims]
    return stride_b


def as_rows(t: torch.Tensor, row_dims: int = 2) -> tuple[torch.Tensor, tuple[int, ...]]:
    """`t` as the kernels read it, a batch of (N, d) matrices (row_dims = 2) or of length-N rows (1):
    `t` itself and its strides (batch, then its own last `row_dims`) where the leading dimensions
    merge into one stride, else a contiguous (batch, ...) copy and its strides. No view is made:
    at short sequences every tensor operation on the host is visible latency."""
    stride_b = batch_stride(t, row_dims)
    if stride_b is None:
        t = t.reshape(-1, *t.shape[len(t.shape) - row_dims :])
        stride_b = t.stride(0)
    return t, (stride_b, *t.stride()[len(t.shape) - row_dims :])


def head_views(projections: torch.Tensor, heads: int) -> torch.Tensor:
    """(b, heads, N, d) views of (b, N, heads d) projections, as a model's attention splits its heads: rows
    heads d apart, no copy. At b = 1 the kernels read them in place (`read_in_place`)."""
    b, n, width = projections.shape
    if width % heads:
        raise ValueError(f"projections of width {width} do not split into {heads} heads")
    return projections.view(b, n, heads, width // heads).transpose(1, 2)


def read_in_place(t: torch.Tensor, row_dims: int = 2) -> bool:
    """Whether the kernels read `t` without a copy (`as_rows`): contiguous, or a view whose leading dimensions
    merge into one stride, such as a model's (1, h, N, d) views of its (1, N, h d) projections."""
    return batch_stride(t, row_dims) is not None


def output_strides(t: torch.Tensor, row_dims: int = 2) -> tuple[int, ...]:
    """`as_rows` strides of a tensor a kernel writes: a copy would lose what the kernel writes."""
    stride_b = batch_stride(t, row_dims)
    if stride_b is None:
        raise ValueError(
            f"output of shape {tuple(t.shape)} and strides {t.stride()}: its leading dimensions must "
            f"merge into one batch stride (allocate it contiguous)"
        )
    return (stride_b, *t.stride()[len(t.shape) - row_dims :])


def tma_compatible(t: torch.Tensor, strides: tuple[int, ...] | None = None) -> bool:
    """Whether a tensor descriptor can read `t` with these strides (default: its own): unit last
    stride, 16-byte-aligned start and strides.

    Storage offset rather than data_ptr, so it also answers for torch.compile's fake tensors
    (PyTorch's allocators align every storage to at least 16 bytes)."""
    size = t.element_size()
    strides = t.stride() if strides is None else strides
    return (
        strides[-1] == 1
        and t.storage_offset() * size % 16 == 0
        and all(stride * size % 16 == 0 for stride in strides[:-1])
    )


def tma_device(t: torch.Tensor) -> bool:
    """16-bit elements on a GPU with the Tensor Memory Accelerator (compute capability >= 9), or the interpreter."""
    device = t.device
    return t.element_size() == 2 and (INTERPRETED or (device.type == "cuda" and device_facts(device)[0] >= 9))


def reads_by_tma(*tensors: torch.Tensor) -> bool:
    """Whether the kernels read these (batch, N, d) tensors through tensor descriptors (`kernels.triton_tiles`):
    16-bit inputs on a GPU with the Tensor Memory Accelerator (compute capability >= 9) or under the
    interpreter (so CPU tests cover that path), when every tensor is `tma_compatible`.

    fp32 keeps block pointers: there the products may run on the FMA units from registers, and
    reading the descriptors' swizzled shared-memory tiles made the fp32 backward several times slower,
    while 16-bit inputs gained (docs/flash_attention_tuning.md)."""
    return tma_device(tensors[0]) and all(tma_compatible(t) for t in tensors)
