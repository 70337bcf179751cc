"""Cross-entropy over one chunk of logits rows in Triton: loss and d(loss)/d(logits), in place.

One program owns one row z (length V) of a chunk's logits and its target t. With s the loss's
scale (1 / number of non-ignored targets for "mean", 1 for "sum"):

    pass 1, over V in blocks of BLOCK_V (online, as FlashAttention folds key tiles):
        m_new = max(m, max_j z_j);   l = l * exp(m - m_new) + sum_j exp(z_j - m_new);   m = m_new
        lse = m + log l
        loss = lse - z_t
    pass 2 (WRITE_GRAD), over V again, overwriting the row:
        z_j <- (exp(z_j - lse) - [j == t]) * s          = d(s * loss) / d z_j

A row whose target is `ignore_index` gets loss 0 and a zero gradient row. Exponentials are taken
in base 2 (exp(x) = exp2(x log2 e), exp2 being the native instruction); everything on chip is
fp32 whatever the logits' dtype, and the gradient is rounded to that dtype only when stored.
Padded lanes of the ragged last block load -inf, which adds exp(-inf) = 0 to l. The first block
always holds at least one real logit, so m is finite after it and exp(m - m_new) never sees
-inf - (-inf).

The kernel reads each row twice and writes it once; it never needs the whole [N, V] logits: the
host (`linear_cross_entropy`) feeds it one chunk of rows at a time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cs336_systems.triton_support.interpreter import built_by_interpreter

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)

DEFAULT_BLOCK_V = 4096  # logits per loop step; a power of two (tl.arange)
NUM_WARPS = 8


@triton.jit
def cross_entropy_rows_kernel(
    logits_ptr,
    stride_row,
    targets_ptr,
    loss_ptr,
    V,
    scale,
    ignore_index,
    BLOCK_V: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
):
    """Row `program_id(0)`: loss into loss_ptr[row]; with WRITE_GRAD the row's gradient over its logits."""
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    target = tl.load(targets_ptr + row).to(tl.int64)
    valid = target != ignore_index
    offs = tl.arange(0, BLOCK_V)

    # Pass 1: running max and sum of exponentials, in base 2 (m2 = m log2 e).
    m2 = float("-inf")
    l = 0.0
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        z2 = tl.load(row_ptr + cols, mask=cols < V, other=float("-inf")).to(tl.float32) * LOG2E
        m2_new = tl.maximum(m2, tl.max(z2, axis=0))
        l = l * tl.math.exp2(m2 - m2_new) + tl.sum(tl.math.exp2(z2 - m2_new), axis=0)
        m2 = m2_new
    lse2 = m2 + tl.math.log2(l)  # log2 of sum_j exp(z_j)

    safe_target = tl.where(valid, target, 0)
    z_target = tl.load(row_ptr + safe_target).to(tl.float32)
    loss = tl.where(valid, lse2 * LN2 - z_target, 0.0)
    tl.store(loss_ptr + row, loss)

    if WRITE_GRAD:
        row_scale = tl.where(valid, scale, 0.0)
        for start in range(0, V, BLOCK_V):
            cols = start + offs
            in_row = cols < V
            z = tl.load(row_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
            p = tl.math.exp2(z * LOG2E - lse2)
            g = (p - tl.where(cols == safe_target, 1.0, 0.0)) * row_scale
            tl.store(row_ptr + cols, g.to(logits_ptr.dtype.element_ty), mask=in_row)


def kernel_interpreted() -> bool:
    """True when the kernel was built by the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    return built_by_interpreter(cross_entropy_rows_kernel)


def block_v_for(V: int, block_v: int | None = None) -> int:
    """The loop step over the vocabulary: `block_v` (a power of two) or min(DEFAULT_BLOCK_V, next power of two >= V)."""
    if block_v is None:
        return min(DEFAULT_BLOCK_V, max(16, 1 << (V - 1).bit_length()))
    if block_v < 1 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two, got {block_v}")
    return block_v


def launch_cross_entropy_rows(
    logits: torch.Tensor,
    targets: torch.Tensor,
    loss: torch.Tensor,
    scale: float,
    ignore_index: int,
    write_grad: bool,
    block_v: int | None = None,
) -> None:
    """Run the kernel on a (rows, V) logits chunk (unit column stride): per-row loss into `loss`
    (fp32, rows), and, with `write_grad`, d(scale * sum of losses)/d logits over `logits` in place."""
    rows, V = logits.shape
    if rows == 0:
        return
    cross_entropy_rows_kernel[(rows,)](
        logits,
        logits.stride(0),
        targets,
        loss,
        V,
        float(scale),
        int(ignore_index),
        BLOCK_V=block_v_for(V, block_v),
        WRITE_GRAD=bool(write_grad),
        num_warps=NUM_WARPS,
    )
