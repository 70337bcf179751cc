"""How the FlashAttention kernels read (rows, D_TILE) tiles of a (batch, N, D) tensor.

Two sources, chosen per launch by the constexpr USE_TMA:

- a tensor descriptor (Hopper's Tensor Memory Accelerator): one thread issues a bulk copy of
  the whole tile into shared memory. Rows past N and columns past D arrive as zeros, so no
  boundary checks are needed, and the copy costs no per-thread address arithmetic or registers
  (faster and fewer registers at the leaderboard shape: docs/flash_attention_tuning.md). Needs a unit last stride
  and 16-byte-aligned rows (`tma_compatible`); used for 16-bit inputs (`launch.layout.reads_by_tma` says why not
  fp32).
- a block pointer, for everything else: per-thread (cp.async) loads, rows and columns checked
  where a tile can pass the end.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_tile(block_ptr, CHECK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    """Load a (rows, D_TILE) tile, checking rows only where a tile can pass the end, columns only when D < D_TILE."""
    if CHECK_ROWS:
        if EVEN_D:
            tile = tl.load(block_ptr, boundary_check=(0,), padding_option="zero")
        else:
            tile = tl.load(block_ptr, boundary_check=(0, 1), padding_option="zero")
    else:
        if EVEN_D:
            tile = tl.load(block_ptr)
        else:
            tile = tl.load(block_ptr, boundary_check=(1,), padding_option="zero")
    return tile


@triton.jit
def row_source(
    ptr,
    batch_index,
    stride_b,
    stride_n,
    stride_d,
    N,
    D: tl.constexpr,
    ROWS: tl.constexpr,
    D_TILE: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Where `load_rows` reads (ROWS, D_TILE) tiles of batch element `batch_index` from."""
    if USE_TMA:
        source = tl.make_tensor_descriptor(
            ptr,
            shape=[tl.num_programs(1), N, D],
            strides=[stride_b, stride_n, 1],
            block_shape=[1, ROWS, D_TILE],
        )
    else:
        source = tl.make_block_ptr(
            ptr + batch_index.to(tl.int64) * stride_b,
            shape=(N, D),
            strides=(stride_n, stride_d),
            offsets=(0, 0),
            block_shape=(ROWS, D_TILE),
            order=(1, 0),
        )
    return source


@triton.jit
def load_rows(
    source,
    batch_index,
    row,
    ROWS: tl.constexpr,
    D_TILE: tl.constexpr,
    CHECK_ROWS: tl.constexpr,
    EVEN_D: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Rows [row, row + ROWS) of the batch element as a (ROWS, D_TILE) tile, zeros past the ends."""
    if USE_TMA:
        tile = source.load([batch_index, row, 0]).reshape(ROWS, D_TILE)
    else:
        # tl.advance, not source.advance: some releases' interpreter calls a block pointer's own methods
        # without the builder they need.
        tile = load_tile(tl.advance(source, (row, 0)), CHECK_ROWS, EVEN_D)
    return tile
