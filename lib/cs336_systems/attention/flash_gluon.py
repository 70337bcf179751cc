"""When and how the forward and backward passes run the Gluon kernels for Hopper
(`flash_gluon_forward`, `flash_gluon_backward`).

`gluon_forward_applies` decides per call; `launch_forward_gluon` launches. The Triton kernel
(`flash_triton_forward`) remains the forward everywhere else: under the interpreter, before and
after Hopper (`warpgroup_mma` is Hopper's instruction), for fp32, head dimensions other than 64
and 128 (the two measured), N_q != N_k, rows a tensor descriptor cannot read, a `tiles` override,
and small problems. A CTA here holds 2 * 64 query rows, twice the Triton kernel's 64-row
programs, so it needs twice the batch (or sequence) to fill the SMs. Per head dimension it runs from a
sequence length on (`MIN_SEQ_LEN`: d = 64 from 16,384, v7; d = 128 from 4,096, where the Triton kernel took
up to 1.4× cuDNN's time at 16 to 64 heads and the Gluon kernel 0.95–1.02×, v18; docs/flash_attention_tuning.md)
and, below `ANY_GRID_SEQ_LEN`, with enough work: at d = 64 three CTAs per SM (`MIN_CTAS_PER_SM`); at d = 128
enough batch·heads (`MIN_BATCH`): at N = 4,096 and 8,192 the Triton kernel's split-key grids were faster at one
head, and at two heads with the causal mask; without it the Gluon kernel was from two heads on, with it from four
(v21; before the C++ node launched this kernel its eager calls were host-bound there). From N = 16,384 on
(`ANY_GRID_SEQ_LEN`) d = 128 runs it at any grid: at one and four heads it took 0.70–1.01× cuDNN's time there,
the Triton kernel up to 2.4× (v18.2).

The fused backward (`gluon_backward_applies`, `flash_backward_gluon`) has two kernels. At d = 64
(`flash_gluon_backward`) it takes the forward's limits and causal attention only, where it beat the two
Triton kernels; without the mask it did not (docs/flash_attention_tuning.md, v8 to v15). At d = 128
(`flash_gluon_backward_d128`) it runs causal and full attention from N = 16,384 on, and at shorter N from
about one CTA per SM (`D128_BWD_MIN_CTAS_PER_SM`): at N = 4,096 and 8,192 the forward+backward took 0.94–1.0×
cuDNN's time from 128 CTAs on, where the Triton kernels took up to 1.2×, while with 32 and 64 CTAs the Triton
kernels were faster (v21, both routes launched by the C++ autograd node `flash_native`; v18 had kept shorter
sequences off this route because its eager calls, then through the Python `autograd.Function`, were
host-bound).

Under the causal mask, where a head has at most `SECTION_MAX_BLOCKS` blocks, the kernels' CTAs launch
heaviest first in sections of heads whose shared tensors fit in `SECTION_BYTES` (`heads_per_section`,
`flash_gluon_schedule`); elsewhere one head after another, on the (block, batch) grid.

Under torch.compile the launches go through the custom ops `cs336::flash_fwd_gluon` and
`cs336::flash_bwd_gluon`: Dynamo can trace `@triton.jit` launches but not Gluon's tensor-descriptor
arguments.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton

from cs336_systems.attention.flash_configs import device_facts
from cs336_systems.attention.flash_layout import INTERPRETED, as_rows, batch_stride, output_strides, tma_compatible
from cs336_systems.attention.triton_launch import compiled_kernel

# Per head dimension: (Q_TILE per consumer warpgroup, K_TILE, STAGES), the best of a sweep on an H100
# (docs/flash_attention_tuning.md, v7).
GLUON_TILES = {64: (64, 128, 3), 128: (64, 128, 2)}
# Per head dimension: (Q_TILE, K_HALF key rows per consumer warpgroup, STAGES) of the fused backward:
# 64-row tiles are what the registers allow; at d = 64, 2 stages and 232/40 registers were the best of 2-3
# stages and two register splits at the same shape (docs/flash_attention_tuning.md, v8); d = 128 has shared
# memory for 3 stages since P stays in registers, and 2 measured faster (v26).
GLUON_BWD_TILES = {64: (64, 64, 2), 128: (64, 64, 2)}
# Where the fused backward beat the two Triton kernels: causal only at d = 64 (v8), both at d = 128 (v17).
GLUON_BWD_CAUSALITY = {64: (True,), 128: (True, False)}
PREPROCESS_ROWS = 64
DQ_COPY_ROWS = 32  # rows per program of dq_from_planes_kernel
CONSUMER_REGS, PRODUCER_REGS = 232, 40
# Per head dimension of the backward, (consumer, producer) registers: d = 128's dK, dV, S and dP alone
# take 192 of a consumer thread's registers (flash_gluon_backward_d128).
GLUON_BWD_REGS = {64: (CONSUMER_REGS, PRODUCER_REGS), 128: (240, 24)}
DQ_PLANE_COLS = 64  # d = 128: dQ's accumulator columns per plane, one plane per consumer warpgroup
# Per head dimension, below ANY_GRID_SEQ_LEN: CTAs per SM and batch·heads from which on (module docstring)
MIN_CTAS_PER_SM = {64: 3, 128: 0}
MIN_BATCH = {64: {True: 1, False: 1}, 128: {True: 4, False: 2}}  # per head dimension, then causality
MIN_SEQ_LEN = {64: 16384, 128: 4096}  # per head dimension (module docstring)
ANY_GRID_SEQ_LEN = {128: 16384}  # from here on without the CTA floor (module docstring)
# d = 128's fused backward: at any grid from N = 16,384 on (v18), shorter from this many CTAs per SM on: between
# the 64 CTAs where the Triton kernels were faster and the 128 where it was, on 132 SMs (v21, module docstring)
D128_BWD_MIN_SEQ_LEN = 16384
D128_BWD_MIN_CTAS_PER_SM = 0.75
GLUON_DTYPES = (torch.bfloat16, torch.float16)
# The causal kernels' CTAs go heaviest first in sections of heads (`heads_per_section`) whose two shared
# tensors fit in SECTION_BYTES, where a head has at most SECTION_MAX_BLOCKS blocks. On an H100, at 4 to 64
# heads and N = 4,096 and 8,192 (32 and 64 blocks), 8 MiB came within 3% of the best of 2 to 16 heads per
# section and was faster than one head per section; at 128 blocks (N = 16,384) sections gained nothing
# (d = 64, 16 heads) or lost (d = 128, 8 heads). FlashAttention-3 sizes its sections to the whole L2 (50 MB),
# which lost up to 7% at 64 heads (docs/flash_attention_tuning.md, v22).
SECTION_BYTES = 8 << 20
SECTION_MAX_BLOCKS = 64


def gluon_forward_eligible(d: int, n_q: int, n_k: int, dtype: torch.dtype, batch: int, capability_major: int,
                           sm_count: int, is_causal: bool) -> bool:
    """The shape, dtype and device half of `gluon_forward_applies` (module docstring)."""
    if dtype not in GLUON_DTYPES or d not in GLUON_TILES or n_q != n_k or capability_major != 9:
        return False
    if n_q < MIN_SEQ_LEN[d]:
        return False
    if d in ANY_GRID_SEQ_LEN and n_q >= ANY_GRID_SEQ_LEN[d]:
        return True
    ctas = triton.cdiv(n_q, 2 * GLUON_TILES[d][0]) * batch
    return batch >= MIN_BATCH[d][bool(is_causal)] and ctas >= MIN_CTAS_PER_SM[d] * sm_count


def _tma_readable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    for t in (q, k, v):
        rows, strides = as_rows(t)
        if rows is not t or not tma_compatible(rows, strides):  # in place, through descriptors, or not at all
            return False
    return True


def gluon_forward_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, interpreted: bool,
                          tiles: tuple[int, int] | None = None) -> bool:
    """Whether the forward of these (..., N, d) inputs runs the Gluon kernel (module docstring); never
    where the caller overrides the Triton kernels' tiles."""
    if interpreted or q.device.type != "cuda" or tiles is not None:
        return False
    (n_q, d), n_k = q.shape[-2:], k.shape[-2]
    if not gluon_forward_eligible(d, n_q, n_k, q.dtype, q.numel() // (n_q * d), *device_facts(q.device), is_causal):
        return False
    return _tma_readable(q, k, v)


def _in_backward_scope(d: int, is_causal: bool) -> bool:
    return bool(is_causal) in GLUON_BWD_CAUSALITY.get(d, ())


def gluon_backward_eligible(d: int, n_q: int, n_k: int, dtype: torch.dtype, batch: int, capability_major: int,
                            sm_count: int, is_causal: bool) -> bool:
    """The shape, dtype and device half of `gluon_backward_applies`: causal at d = 64 within the forward's
    size limits; at d = 128, causal or not, from N = D128_BWD_MIN_SEQ_LEN or D128_BWD_MIN_CTAS_PER_SM CTAs
    per SM on (`GLUON_BWD_CAUSALITY`)."""
    if not _in_backward_scope(d, is_causal):
        return False
    if d != 128:
        return gluon_forward_eligible(d, n_q, n_k, dtype, batch, capability_major, sm_count, is_causal)
    if dtype not in GLUON_DTYPES or n_q != n_k or capability_major != 9:
        return False
    ctas = triton.cdiv(n_q, 2 * GLUON_BWD_TILES[d][1]) * batch
    return n_q >= D128_BWD_MIN_SEQ_LEN or ctas >= D128_BWD_MIN_CTAS_PER_SM * sm_count


def gluon_backward_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                           interpreted: bool, tiles: tuple[int, int] | None = None) -> bool:
    """Whether the backward of these inputs runs the fused Gluon kernel (module docstring); never where
    the caller overrides the Triton kernels' tiles."""
    if interpreted or q.device.type != "cuda" or tiles is not None:
        return False
    (n_q, d), n_k = q.shape[-2:], k.shape[-2]
    if not gluon_backward_eligible(d, n_q, n_k, q.dtype, q.numel() // (n_q * d), *device_facts(q.device), is_causal):
        return False
    return _tma_readable(q, k, v)


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

    Built without TensorDescriptor's constructor checks, which cost about 10 µs per descriptor:
    `gluon_forward_applies` has checked what they check (unit last stride, 16-byte alignment)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    n, d = t.shape[-2:]
    desc = object.__new__(TensorDescriptor)
    desc.base, desc.padding, desc.layout = t, "zero", layout
    desc.shape = [t.numel() // (n * d), n, d]
    desc.strides = [stride_b, t.stride(-2), 1]
    desc.block_shape = [1, rows, d]
    return desc


def heads_per_section(n: int, d: int, element_size: int, batch: int, block_rows: int, is_causal: bool) -> int:
    """SECTION of `flash_gluon_schedule` for a kernel whose CTAs take `block_rows` rows of a head each: under
    the causal mask, where a head has at most SECTION_MAX_BLOCKS blocks, the most heads, a power of two, whose
    two (N, d) tensors that all of a head's CTAs read (K and V in the forward, Q and dO in the backward) fit in
    SECTION_BYTES together; at least 1 and at most the power of two from `batch` on (larger ones order the CTAs
    alike, and each value compiles its own kernel). Otherwise one head after another: without the mask every
    CTA has the same work, and with more blocks per head a head's last blocks are short beside the whole."""
    if not is_causal or triton.cdiv(n, block_rows) > SECTION_MAX_BLOCKS:
        return 1
    fit = max(1, SECTION_BYTES // (2 * n * d * element_size))
    return min(1 << (fit.bit_length() - 1), 1 << (max(batch, 1) - 1).bit_length())


def schedule_grid(n_blocks: int, batch: int, section: int) -> tuple[int, ...]:
    """The grid of a Gluon kernel's n_blocks · batch CTAs in the order of `section` heads per section
    (`flash_gluon_schedule.block_and_batch`): (n_blocks, batch) for one head after another, as before
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
        """The compiled kernel this launch runs (`triton_launch.compiled_kernel`)."""
        return compiled_kernel(self.kernel, self.grid, self.args, self.options)


def forward_launch(q, k, v, out, lse, is_causal: bool) -> KernelLaunch:
    """The Gluon forward on these tensors: the descriptors of q, k, v and `out`, then L, its strides and the
    lengths."""
    from cs336_systems.attention.flash_gluon_forward import flash_fwd_gluon_kernel

    n, d = q.shape[-2:]
    q_tile, k_tile, stages = GLUON_TILES[d]
    q_layout, kv_layout = shared_layout(q.dtype, d, q_tile), shared_layout(q.dtype, d, k_tile)
    (q_b, *_), (k_b, *_), (v_b, *_) = (as_rows(t)[1] for t in (q, k, v))
    o_b = output_strides(out)[0]
    l_b, l_n = output_strides(lse, 1)
    batch = q.numel() // (n * d)
    args = (_descriptor(q, q_b, q_tile, q_layout), _descriptor(k, k_b, k_tile, kv_layout),
            _descriptor(v, v_b, k_tile, kv_layout), _descriptor(out, o_b, q_tile, q_layout), lse, l_b, l_n, n, n)
    section = heads_per_section(n, d, q.element_size(), batch, 2 * q_tile, is_causal)
    options = dict(scale=d**-0.5, STAGES=stages, is_causal=bool(is_causal), SECTION=section,
                   CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS, num_warps=4)
    grid = schedule_grid(triton.cdiv(n, 2 * q_tile), batch, section)
    return KernelLaunch(flash_fwd_gluon_kernel, grid, args, options)


def preprocess_launch(out, do, delta, dq_acc) -> KernelLaunch:
    """D = rowsum(O * dO) into `delta` and the fp32 dQ accumulator zeroed (`flash_bwd_preprocess_kernel`)."""
    from cs336_systems.attention.flash_triton_backward import flash_bwd_preprocess_kernel

    n, d = out.shape[-2:]
    (o_b, o_n, _), (do_b, do_n, _) = as_rows(out)[1], as_rows(do)[1]
    l_b, l_n = output_strides(delta, 1)
    return KernelLaunch(flash_bwd_preprocess_kernel, (triton.cdiv(n, PREPROCESS_ROWS), out.numel() // (n * d)),
                        (out, do, delta, dq_acc, o_b, o_n, do_b, do_n, l_b, l_n, n), dict(D=d, ROWS=PREPROCESS_ROWS))


def backward_launch(q, k, v, do, lse, delta, grad_k, grad_v, dq_acc, is_causal: bool, tiles=None, regs=None,
                    kernel=None) -> KernelLaunch:
    """The fused Gluon backward on these tensors (`tiles`, `regs` and `kernel` override the shipped ones)."""
    n, d = q.shape[-2:]
    q_tile, k_half, stages = tiles or GLUON_BWD_TILES[d]
    consumer_regs, producer_regs = regs or GLUON_BWD_REGS[d]
    q_layout, kv_layout = shared_layout(q.dtype, d, q_tile), shared_layout(q.dtype, d, k_half)
    (q_b, *_), (k_b, *_), (v_b, *_), (do_b, *_) = (as_rows(t)[1] for t in (q, k, v, do))
    dk_b, dv_b = output_strides(grad_k)[0], output_strides(grad_v)[0]
    l_b, l_n = output_strides(lse, 1)
    # d = 64: one warpgroup adds a tile's whole dQ part; d = 128: each adds half of its columns, into
    # dq_acc read as (batch, 2, N, 64) planes (flash_gluon_backward_d128)
    planes = dq_acc.view(-1, n, DQ_PLANE_COLS) if d == 128 else dq_acc
    cols = planes.shape[-1]
    dq_desc = _descriptor(planes, n * cols, q_tile, shared_layout(torch.float32, cols, q_tile))
    args = (_descriptor(q, q_b, q_tile, q_layout), _descriptor(k, k_b, k_half, kv_layout),
            _descriptor(v, v_b, k_half, kv_layout), _descriptor(do, do_b, q_tile, q_layout),
            _descriptor(grad_k, dk_b, k_half, kv_layout), _descriptor(grad_v, dv_b, k_half, kv_layout), dq_desc,
            lse, delta, l_b, l_n, n)
    batch = q.numel() // (n * d)
    section = heads_per_section(n, d, q.element_size(), batch, 2 * k_half, is_causal)
    grid = schedule_grid(triton.cdiv(n, 2 * k_half), batch, section)
    options = dict(scale=d**-0.5, STAGES=stages, SECTION=section, CONSUMER_REGS=consumer_regs,
                   PRODUCER_REGS=producer_regs, num_warps=4)
    if d == 64:
        from cs336_systems.attention.flash_gluon_backward import flash_bwd_gluon_kernel

        return KernelLaunch(kernel or flash_bwd_gluon_kernel, grid, args, options)
    from cs336_systems.attention.flash_gluon_backward_d128 import flash_bwd_gluon_d128_kernel

    return KernelLaunch(kernel or flash_bwd_gluon_d128_kernel, grid, args, {**options, "is_causal": bool(is_causal)})


def _backward(q, k, v, out, do, lse, is_causal: bool, tiles=None, regs=None, kernel=None):
    n, d = q.shape[-2:]
    batch = q.numel() // (n * d)
    delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    dq_acc = torch.empty((batch, n, d), dtype=torch.float32, device=q.device)
    # Gradients in the inputs' strides: a model's (1, h, N, d) views of its (1, N, h d) projections get theirs
    # in the projections' layout, which autograd passes on as they are; contiguous ones cost a copy each
    # (AccumulateGrad's into a strided leaf, or the reshape back to the projections').
    grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (q, k, v))
    preprocess_launch(out, do, delta, dq_acc).run()
    backward_launch(q, k, v, do, lse, delta, grad_k, grad_v, dq_acc, is_causal, tiles, regs, kernel).run()
    copy_dq(grad_q, dq_acc)
    return grad_q, grad_k, grad_v


def dq_copy_launch(grad_q: torch.Tensor, dq_acc: torch.Tensor) -> KernelLaunch | None:
    """`dq_from_planes_kernel` writing the fp32 accumulator into grad_q (`copy_dq`), or None where grad_q's
    rows are not a kernel's to address (column stride other than 1, leading dimensions that do not merge)."""
    n, d = grad_q.shape[-2:]
    stride_b = batch_stride(grad_q, 2)
    if stride_b is None or grad_q.stride(-1) != 1:
        return None
    from cs336_systems.attention.flash_triton_backward import dq_from_planes_kernel

    cols = DQ_PLANE_COLS if d == 128 else d
    return KernelLaunch(dq_from_planes_kernel, (triton.cdiv(n, DQ_COPY_ROWS), grad_q.numel() // (n * d)),
                        (dq_acc, grad_q, stride_b, grad_q.stride(-2), n),
                        dict(COLS=cols, PLANES=d // cols, ROWS=DQ_COPY_ROWS))


def copy_dq(grad_q: torch.Tensor, dq_acc: torch.Tensor) -> None:
    """grad_q (..., N, d), any strides, = the fp32 accumulator in grad_q's dtype, one copy. At d = 128 the
    accumulator's memory holds each batch's column halves as planes, (batch, d / DQ_PLANE_COLS, N,
    DQ_PLANE_COLS); below, (batch, N, d) rows (one plane). `dq_from_planes_kernel` writes them into rows a
    kernel can address (unit column stride, leading dimensions merging into one stride: a model's head
    views included) with 16-byte accesses (`dq_copy_launch`); other strides take PyTorch's copy, at d = 128
    of the transposed planes, whose generic strided loop is slower (tuning record, v20.1)."""
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


@torch.library.custom_op("cs336::flash_bwd_gluon", mutates_args=())
def _flash_bwd_gluon_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, do: torch.Tensor,
                        lse: torch.Tensor, is_causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(q, k, v, out, do, lse, is_causal)


@_flash_bwd_gluon_op.register_fake
def _(q, k, v, out, do, lse, is_causal):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def flash_backward_gluon(q, k, v, out, do, lse, is_causal: bool, tiles=None, regs=None):
    """dQ, dK, dV of (..., N, d) tensors in one pass (`flash_gluon_backward` at d = 64,
    `flash_gluon_backward_d128` at d = 128): D and a zeroed fp32 dQ accumulator from
    `flash_bwd_preprocess_kernel`, the fused kernel, then dQ converted to q's dtype; the gradients have the
    strides of q, k, v (`torch.empty_like`). `out` and `do` have unit column stride and rows that `as_rows`
    reads in place. `tiles` = (Q_TILE, K_HALF, STAGES) and `regs` = (consumer, producer) registers override
    the shipped ones."""
    d = q.shape[-1]
    if not _in_backward_scope(d, is_causal):
        raise ValueError(f"the Gluon backward runs d in {sorted(GLUON_BWD_TILES)} (causal only at d = 64); got "
                         f"d = {d}, is_causal = {bool(is_causal)} (flash_gluon.gluon_backward_applies)")
    if torch.compiler.is_compiling():
        return torch.ops.cs336.flash_bwd_gluon(q, k, v, out, do, lse, bool(is_causal))
    return _backward(q, k, v, out, do, lse, is_causal, tiles, regs)


@torch.library.custom_op("cs336::flash_fwd_gluon", mutates_args=("out", "lse"))
def _flash_fwd_gluon_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                        is_causal: bool) -> None:
    forward_launch(q, k, v, out, lse, is_causal).run()


@_flash_fwd_gluon_op.register_fake
def _(q, k, v, out, lse, is_causal) -> None:
    return None


def launch_forward_gluon(q, k, v, out, lse, is_causal: bool) -> None:
    """O and L of (..., N, d) inputs into `out` (q's shape, contiguous rows) and `lse` (q.shape[:-1])."""
    if torch.compiler.is_compiling():
        torch.ops.cs336.flash_fwd_gluon(q, k, v, out, lse, bool(is_causal))
    else:  # the custom op's dispatch costs host time that eager calls need not pay
        forward_launch(q, k, v, out, lse, is_causal).run()
