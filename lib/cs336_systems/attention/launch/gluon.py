"""How the Gluon kernels for Hopper run (`kernels.gluon_forward`, `kernels.gluon_backward`,
`kernels.gluon_backward_d128`): their launches, built once per geometry as `KernelLaunch`es that the Python
path runs and the C++ node (`launch.native`) replays.

Where they run instead of the Triton kernels is decided by `heuristics` (the rules, with their reasons) and
`launch.dispatch` (the tensors' own facts). The forward is one kernel; the fused backward three launches: D
and a zeroed fp32 dQ accumulator (`preprocess_launch`), the fused kernel (`backward_launch`), dQ converted to
q's dtype (`dq_copy_launch`). Under the causal mask their CTAs go heaviest first in sections of heads, as
many heads per section as the caller passes (`heuristics.Choices`, `kernels.gluon_schedule`).

A compiled graph reaches them through `launch.dispatch`'s custom ops, like every other launch.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton

from cs336_systems.attention.heuristics import (
    CONSUMER_REGS,
    GLUON_BWD_REGS,
    GLUON_BWD_TILES,
    GLUON_TILES,
    PRODUCER_REGS,
    in_backward_scope,
)
from cs336_systems.attention.launch.layout import INTERPRETED, as_rows, batch_stride, output_strides
from cs336_systems.triton_support.launch import compiled_kernel

PREPROCESS_ROWS = 64
DQ_COPY_ROWS = 32  # rows per program of dq_from_planes_kernel
DQ_PLANE_COLS = 64  # d = 128: dQ's accumulator columns per plane, one plane per consumer warpgroup


_LAYOUTS: dict[tuple, object] = {}


def shared_layout(dtype: torch.dtype, d: int, rows: int):
    """The swizzled shared-memory layout of a (1, rows, d) tile."""
    key = (dtype, d, rows)
    if key not in _LAYOUTS:
        import triton.language as tl
        from triton.experimental.gluon.language import NVMMASharedLayout

        element = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]
        _LAYOUTS[key] = NVMMASharedLayout.get_default_for([1, rows, d], element)
    return _LAYOUTS[key]


def _descriptor(t: torch.Tensor, stride_b: int, rows: int, layout):
    """A (batch, N, d) tensor descriptor of `t` with (1, rows, d) blocks.

    Built without TensorDescriptor's constructor checks, whose host time is a launch's own:
    `launch.dispatch.tma_readable` has checked what they check (unit last stride, 16-byte alignment)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    n, d = t.shape[-2:]
    desc = object.__new__(TensorDescriptor)
    desc.base, desc.padding, desc.layout = t, "zero", layout
    desc.shape = [t.numel() // (n * d), n, d]
    desc.strides = [stride_b, t.stride(-2), 1]
    desc.block_shape = [1, rows, d]
    return desc


def schedule_grid(n_blocks: int, batch: int, section: int) -> tuple[int, ...]:
    """The grid of a Gluon kernel's n_blocks · batch CTAs in the order of `section` heads per section
    (`kernels.gluon_schedule.block_and_batch`): (n_blocks, batch) for one head after another, as before
    sections existed; one dimension otherwise."""
    return (n_blocks, batch) if section == 1 else (n_blocks * batch,)


def with_section(launch: KernelLaunch, section: int, batch: int) -> KernelLaunch:
    """A Gluon kernel's `launch` over `batch` heads, reordered to `section` heads per section (its grid and
    SECTION; `heads_per_section` picks the shipped one)."""
    grid = schedule_grid(math.prod(launch.grid) // batch, batch, section)
    return launch._replace(grid=grid, options={**launch.options, "SECTION": section})


class KernelLaunch(NamedTuple):
    """One launch of the Gluon route, `kernel[grid](*args, **options)`: a Gluon kernel, whose tensor
    descriptors among `args` name their tensor by `base`, or a Triton kernel of the route's conversions."""

    kernel: object
    grid: tuple[int, ...]
    args: tuple
    options: dict

    def run(self) -> None:
        self.kernel[self.grid](*self.args, **self.options)

    def compiled(self):
        """The compiled kernel this launch runs (`triton_support.launch.compiled_kernel`)."""
        return compiled_kernel(self.kernel, self.grid, self.args, self.options)


def forward_launch(q, k, v, out, lse, is_causal: bool, section: int) -> KernelLaunch:
    """The Gluon forward on these tensors, its CTAs ordered `section` heads per section
    (`heuristics.Choices.forward_section`): the descriptors of q, k, v and `out`, then L, its strides and the
    lengths."""
    from cs336_systems.attention.kernels.gluon_forward import flash_fwd_gluon_kernel

    n, d = q.shape[-2:]
    q_tile, k_tile, stages = GLUON_TILES[d]
    q_layout, kv_layout = shared_layout(q.dtype, d, q_tile), shared_layout(q.dtype, d, k_tile)
    (q_b, *_), (k_b, *_), (v_b, *_) = (as_rows(t)[1] for t in (q, k, v))
    o_b = output_strides(out)[0]
    l_b, l_n = output_strides(lse, 1)
    batch = q.numel() // (n * d)
    args = (
        _descriptor(q, q_b, q_tile, q_layout),
        _descriptor(k, k_b, k_tile, kv_layout),
        _descriptor(v, v_b, k_tile, kv_layout),
        _descriptor(out, o_b, q_tile, q_layout),
        lse,
        l_b,
        l_n,
        n,
        n,
    )
    options = dict(
        scale=d**-0.5,
        STAGES=stages,
        is_causal=bool(is_causal),
        SECTION=section,
        CONSUMER_REGS=CONSUMER_REGS,
        PRODUCER_REGS=PRODUCER_REGS,
        num_warps=4,
    )
    grid = schedule_grid(triton.cdiv(n, 2 * q_tile), batch, section)
    return KernelLaunch(flash_fwd_gluon_kernel, grid, args, options)


def preprocess_launch(out, do, delta, dq_acc) -> KernelLaunch:
    """D = rowsum(O * dO) into `delta` and the fp32 dQ accumulator zeroed (`flash_bwd_preprocess_kernel`)."""
    from cs336_systems.attention.kernels.triton_backward import flash_bwd_preprocess_kernel

    n, d = out.shape[-2:]
    (o_b, o_n, _), (do_b, do_n, _) = as_rows(out)[1], as_rows(do)[1]
    l_b, l_n = output_strides(delta, 1)
    return KernelLaunch(
        flash_bwd_preprocess_kernel,
        (triton.cdiv(n, PREPROCESS_ROWS), out.numel() // (n * d)),
        (out, do, delta, dq_acc, o_b, o_n, do_b, do_n, l_b, l_n, n),
        dict(D=d, ROWS=PREPROCESS_ROWS),
    )


def backward_launch(
    q, k, v, do, lse, delta, grad_k, grad_v, dq_acc, is_causal: bool, section: int, tiles=None, regs=None, kernel=None
) -> KernelLaunch:
    """The fused Gluon backward on these tensors, its CTAs ordered `section` heads per section
    (`heuristics.Choices.backward_section`; `tiles`, `regs` and `kernel` override the shipped ones)."""
    n, d = q.shape[-2:]
    q_tile, k_half, stages = tiles or GLUON_BWD_TILES[d]
    consumer_regs, producer_regs = regs or GLUON_BWD_REGS[d]
    q_layout, kv_layout = shared_layout(q.dtype, d, q_tile), shared_layout(q.dtype, d, k_half)
    (q_b, *_), (k_b, *_), (v_b, *_), (do_b, *_) = (as_rows(t)[1] for t in (q, k, v, do))
    dk_b, dv_b = output_strides(grad_k)[0], output_strides(grad_v)[0]
    l_b, l_n = output_strides(lse, 1)
    # d = 64: one warpgroup adds a tile's whole dQ part; d = 128: each adds half of its columns, into
    # dq_acc read as (batch, 2, N, 64) planes (kernels.gluon_backward_d128)
    planes = dq_acc.view(-1, n, DQ_PLANE_COLS) if d == 128 else dq_acc
    cols = planes.shape[-1]
    dq_desc = _descriptor(planes, n * cols, q_tile, shared_layout(torch.float32, cols, q_tile))
    args = (
        _descriptor(q, q_b, q_tile, q_layout),
        _descriptor(k, k_b, k_half, kv_layout),
        _descriptor(v, v_b, k_half, kv_layout),
        _descriptor(do, do_b, q_tile, q_layout),
        _descriptor(grad_k, dk_b, k_half, kv_layout),
        _descriptor(grad_v, dv_b, k_half, kv_layout),
        dq_desc,
        lse,
        delta,
        l_b,
        l_n,
        n,
    )
    batch = q.numel() // (n * d)
    grid = schedule_grid(triton.cdiv(n, 2 * k_half), batch, section)
    options = dict(
        scale=d**-0.5,
        STAGES=stages,
        SECTION=section,
        CONSUMER_REGS=consumer_regs,
        PRODUCER_REGS=producer_regs,
        num_warps=4,
    )
    if d == 64:
        from cs336_systems.attention.kernels.gluon_backward import flash_bwd_gluon_kernel

        return KernelLaunch(kernel or flash_bwd_gluon_kernel, grid, args, options)
    from cs336_systems.attention.kernels.gluon_backward_d128 import flash_bwd_gluon_d128_kernel

    return KernelLaunch(kernel or flash_bwd_gluon_d128_kernel, grid, args, {**options, "is_causal": bool(is_causal)})


def _backward(q, k, v, out, do, lse, is_causal: bool, section: int, tiles=None, regs=None, kernel=None):
    n, d = q.shape[-2:]
    batch = q.numel() // (n * d)
    delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    dq_acc = torch.empty((batch, n, d), dtype=torch.float32, device=q.device)
    # Gradients in the inputs' strides: a model's (1, h, N, d) views of its (1, N, h d) projections get theirs
    # in the projections' layout, which autograd passes on as they are; contiguous ones cost a copy each
    # (AccumulateGrad's into a strided leaf, or the reshape back to the projections').
    grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (q, k, v))
    preprocess_launch(out, do, delta, dq_acc).run()
    backward_launch(q, k, v, do, lse, delta, grad_k, grad_v, dq_acc, is_causal, section, tiles, regs, kernel).run()
    copy_dq(grad_q, dq_acc)
    return grad_q, grad_k, grad_v


def dq_copy_launch(grad_q: torch.Tensor, dq_acc: torch.Tensor) -> KernelLaunch | None:
    """`dq_from_planes_kernel` writing the fp32 accumulator into grad_q (`copy_dq`), or None where grad_q's
    rows are not a kernel's to address (column stride other than 1, leading dimensions that do not merge)."""
    n, d = grad_q.shape[-2:]
    stride_b = batch_stride(grad_q, 2)
    if stride_b is None or grad_q.stride(-1) != 1:
        return None
    from cs336_systems.attention.kernels.triton_backward import dq_from_planes_kernel

    cols = DQ_PLANE_COLS if d == 128 else d
    return KernelLaunch(
        dq_from_planes_kernel,
        (triton.cdiv(n, DQ_COPY_ROWS), grad_q.numel() // (n * d)),
        (dq_acc, grad_q, stride_b, grad_q.stride(-2), n),
        dict(COLS=cols, PLANES=d // cols, ROWS=DQ_COPY_ROWS),
    )


def copy_dq(grad_q: torch.Tensor, dq_acc: torch.Tensor) -> None:
    """grad_q (..., N, d), any strides, = the fp32 accumulator in grad_q's dtype, one copy. At d = 128 the
    accumulator's memory holds each batch's column halves as planes, (batch, d / DQ_PLANE_COLS, N,
    DQ_PLANE_COLS); below, (batch, N, d) rows (one plane). `dq_from_planes_kernel` writes them into rows a
    kernel can address (unit column stride, leading dimensions merging into one stride: a model's head
    views included) with 16-byte accesses (`dq_copy_launch`); other strides take PyTorch's copy, at d = 128
    of the transposed planes, whose generic strided loop is slower (tuning record)."""
    launch = dq_copy_launch(grad_q, dq_acc) if grad_q.is_cuda or INTERPRETED else None
    if launch is not None:
        launch.run()
        return
    n, d = grad_q.shape[-2:]
    if d != 128:
        grad_q.copy_(dq_acc.view(grad_q.shape))
        return
    halves = d // DQ_PLANE_COLS
    planes = dq_acc.view(*grad_q.shape[:-2], halves, n, DQ_PLANE_COLS)
    grad_q.unflatten(-1, (halves, DQ_PLANE_COLS)).copy_(planes.transpose(-3, -2))


def flash_backward_gluon(q, k, v, out, do, lse, is_causal: bool, section: int, tiles=None, regs=None):
    """dQ, dK, dV of (..., N, d) tensors in one pass (`kernels.gluon_backward` at d = 64,
    `kernels.gluon_backward_d128` at d = 128): D and a zeroed fp32 dQ accumulator from
    `flash_bwd_preprocess_kernel`, the fused kernel, then dQ converted to q's dtype; the gradients have the
    strides of q, k, v (`torch.empty_like`). `out` and `do` have unit column stride and rows that `as_rows`
    reads in place; its CTAs go `section` heads per section. `tiles` = (Q_TILE, K_HALF, STAGES) and `regs` =
    (consumer, producer) registers override the shipped ones."""
    d = q.shape[-1]
    if not in_backward_scope(d, is_causal):
        raise ValueError(
            f"the Gluon backward runs d in {sorted(GLUON_BWD_TILES)} (causal only at d = 64); got "
            f"d = {d}, is_causal = {bool(is_causal)} (heuristics.gluon_backward_eligible)"
        )
    return _backward(q, k, v, out, do, lse, is_causal, section, tiles, regs)


def launch_forward_gluon(q, k, v, out, lse, is_causal: bool, section: int) -> None:
    """O and L of (..., N, d) inputs into `out` (q's shape, contiguous rows) and `lse` (q.shape[:-1]), the
    CTAs `section` heads per section."""
    forward_launch(q, k, v, out, lse, is_causal, section).run()
