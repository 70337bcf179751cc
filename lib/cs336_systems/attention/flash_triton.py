"""FlashAttention-2 as an autograd Function around the Triton kernels.

Forward: `flash_fwd_kernel` on a grid (ceil(N_q / Q_TILE), batch·heads, key chunks); saves L (shape
q.shape[:-1], fp32), Q, K, V, O and the causal flag. Backward: either the two Triton kernels
(`backward_impl = "triton"`, the default: dQ and D = rowsum(O * dO) per query tile, then dK/dV
per key tile, no atomics) or the compiled PyTorch equations 13-19 (`backward_impl = "pytorch"`).

Inputs (..., N, d) of any leading shape are read as (batch·heads, N, d) (`as_rows`: in place where
the leading dimensions merge into one stride, else from a contiguous copy); N_q and N_k may
differ; any N works (edge tiles are masked); d <= 256; fp32, fp16, bf16. fp32 products follow
`torch.set_float32_matmul_precision` (see `input_precision`).
`is_causal` means what it means for `scaled_dot_product_attention`: query i sees keys j <= i (the mask
aligned to the upper left); decoding against a cache (lower-right alignment) is not offered.
16-bit inputs are read through tensor descriptors (TMA) on Hopper and later (`reads_by_tma`), except
by forwards whose grid is small (`flash_configs.is_small_grid`): there building the descriptors is
latency no other program hides. Where it pays, such forwards also split each query tile's keys over
several programs (`flash_configs.kv_split_chunk`), whose partial results the kernel merges.
On Hopper, 16-bit forwards at d = 64 and 128 with enough work to fill the GPU run the warp-specialized
Gluon kernel instead (`flash_gluon`), and so do causal backwards at d = 64 (one fused kernel, dQ
summed by TMA reduce-add).
On grids with fewer programs than SMs, fp32 backwards split each kernel's loop over programs that add
into zeroed gradients (`flash_configs.backward_split`).
`flash_attention_triton` sends eager CUDA calls through the C++ autograd node of `flash_native` where it
serves the geometry (the same kernels and launch plans, no Python on the host path).
At short N the host is the latency, so a launch does little work per call: its grid, strides and
constexprs are derived once per geometry (`_plan`; the forward's input checks and kernel choice too,
`flash_forward_triton`), and `triton_launch.CachedLauncher` skips Triton's per-call argument
binding after a launch signature's first call.
On CPU tensors the kernels run only under TRITON_INTERPRET=1, set before triton is imported.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
import triton
from torch.autograd.function import once_differentiable

from cs336_systems.attention import flash_native
from cs336_systems.attention.flash_configs import (
    KernelConfig,
    answer_cache,
    backward_split,
    config_for,
    device_facts,
    is_small_grid,
    kv_split_chunk,
    sm_count,
)
from cs336_systems.attention.flash_gluon import (
    flash_backward_gluon,
    gluon_backward_applies,
    gluon_forward_applies,
    launch_forward_gluon,
)
from cs336_systems.attention.flash_pytorch import FlashAttentionPytorch, flash_backward
from cs336_systems.attention.flash_triton_backward import flash_bwd_dkdv_kernel, flash_bwd_dq_kernel
from cs336_systems.attention.flash_triton_forward import flash_fwd_kernel
from cs336_systems.attention.triton_launch import CachedLauncher, current_device_and_stream
from cs336_systems.attention.validation import check_triton_inputs

BACKWARD_IMPLS = ("triton", "pytorch")


def kernels_interpreted() -> bool:
    """True when the kernels were built by the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(flash_fwd_kernel, InterpretedFunction)


def _repair_interpreter() -> None:
    """Work around two defects of the Triton 3.6 interpreter (CPU only) that these kernels hit.

    1. It holds a scalar as a 1-element array and makes a loop bound of it with int(array),
       which NumPy >= 2.4 refuses; our loops run to runtime bounds (N_KEYS, the causal stop).
    2. Its tl.dot multiplies bfloat16 operands as their raw 16-bit patterns (NumPy has no
       bfloat16); widening them to float32 first gives the product the GPU computes.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter, "_cs336_repaired", False):
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    create_dot = interpreter.InterpreterBuilder.create_dot

    def widen(h):
        if h.dtype == tl.bfloat16 and h.data.dtype == np.uint16:
            return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return h

    def create_dot_widened(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interpreter._patch_lang_tensor = patch_lang_tensor
    interpreter.InterpreterBuilder.create_dot = create_dot_widened
    interpreter._cs336_repaired = True


INTERPRETED = kernels_interpreted()  # fixed when the kernels were built, at import
if INTERPRETED:
    _repair_interpreter()


def head_dim_tile(d: int) -> int:
    """The on-chip head dimension: the next power of two, at least 16 (tl.dot's smallest)."""
    return max(16, 1 << (d - 1).bit_length())  # triton.next_power_of_2 is a JIT helper: 10x slower per call


def input_precision(dtype: torch.dtype) -> str:
    """How tl.dot multiplies fp32 tiles, following torch.get_float32_matmul_precision().

    "highest" (torch's default): tf32x3, fp32 accuracy from TF32 tensor cores. Each operand is
    split as a = a_hi + a_lo (a_hi its TF32 rounding) and a·b ≈ a_hi·b_hi + a_hi·b_lo + a_lo·b_hi,
    dropping only a_lo·b_lo (relative size 2^-22). It is the product of PyTorch's own fp32
    attention kernel (SDPA's memory-efficient backend, at any setting). On an H100 (2026-11-23,
    d = 64 and 128, N = 1,024 to 16,384) its errors against float64 measured 5.5e-7 to 9.5e-7,
    below those of IEEE products on the FMA units (up to 3.1e-6: longer fp32 accumulation chains),
    and it ran 1.07-2.8x faster; IEEE products also lost to cuBLAS's SGEMM in the materialised
    attention at d = 128. "high" and "medium": one TF32 product (10 mantissa bits, about 1e-3
    relative error), as torch's own matmuls take under those settings.
    16-bit inputs always use tensor cores; the setting does not apply to them.
    """
    if dtype != torch.float32:
        return "tf32"
    return "tf32x3" if torch.get_float32_matmul_precision() == "highest" else "tf32"


class FlashAttentionTriton(torch.autograd.Function):
    """O = softmax(Q K^T / sqrt(d) [+ causal mask]) V with Triton kernels; saves L, Q, K, V, O.

    `apply(q, k, v, is_causal=False, backward_impl=None)`. Class-level switches:
    `backward_impl` ("triton" | "pytorch"), the default when the call names none (read when the
    forward runs), and `tiles`, a (Q_TILE, K_TILE) pair of powers of two >= 16 that overrides
    the tiles of every kernel's configuration (`flash_configs.config_for`; the interpreter tests
    use 16).
    """

    backward_impl: str = "triton"
    tiles: tuple[int, int] | None = None

    @staticmethod
    def _config(kernel: str, q: torch.Tensor, n_k: int, is_causal: bool) -> KernelConfig:
        """`tiles` when set (same warps and stages), else the device's tuned configuration."""
        n_q, d = q.shape[-2:]
        config = config_for(kernel, head_dim_tile(d), q.dtype, is_causal, n_q, n_k, q.device, q.numel() // (n_q * d))
        tiles = FlashAttentionTriton.tiles
        if tiles is not None:
            try:
                config = KernelConfig(tiles[0], tiles[1], config.num_warps, config.num_stages)
            except ValueError as err:
                raise ValueError(f"FlashAttentionTriton.tiles = {tiles}: {err}") from None
        return config

    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, backward_impl: str | None = None
    ) -> torch.Tensor:
        backward_impl = backward_impl or FlashAttentionTriton.backward_impl
        if backward_impl not in BACKWARD_IMPLS:
            raise ValueError(f"unknown backward_impl {backward_impl!r}; choose one of {', '.join(BACKWARD_IMPLS)}")
        is_causal = bool(is_causal)
        if torch.compiler.is_compiling():
            # Traced here rather than through flash_forward_triton: traced there, the forward's subgraph
            # allocated and returned O and L itself, and the compiled leaderboard forward ran 5% slower
            # (H100, one machine: 1.30-1.32 against 1.23-1.26 ms).
            check_triton_inputs(q, k, v, is_causal, INTERPRETED)
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
            if gluon_forward_applies(q, k, v, INTERPRETED):
                launch_forward_gluon(q, k, v, out, lse, is_causal)
            else:
                launch_forward(q, k, v, out, lse, is_causal, FlashAttentionTriton._config("forward", q, k.shape[-2], is_causal))
            ctx.route_key = None
        else:
            out, lse, ctx.route_key = _forward_eager(q, k, v, is_causal)
        ctx.save_for_backward(lse, q, k, v, out)
        ctx.is_causal = is_causal
        ctx.backward_impl = backward_impl
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        lse, q, k, v, out = ctx.saved_tensors
        if ctx.backward_impl == "pytorch":
            grads = flash_backward(
                q, k, v, out, grad_out, lse, ctx.is_causal, compiled=FlashAttentionPytorch.compile_backward
            )
        else:
            grads = flash_backward_triton(q, k, v, out, grad_out, lse, ctx.is_causal, ctx.route_key)
        return (*grads, None, None)


def flash_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, *, backward_impl: str | None = None
) -> torch.Tensor:
    """`FlashAttentionTriton.apply` with the backward chosen per call (None: the class default). Eager calls
    on CUDA tensors with the Triton backward go through the C++ autograd node of `flash_native` where it
    serves the geometry: the same kernels, launched without Python on the host path."""
    if (backward_impl or FlashAttentionTriton.backward_impl) == "triton":
        out = flash_native.attention(q, k, v, is_causal)
        if out is not None:
            return out
    return FlashAttentionTriton.apply(q, k, v, is_causal, backward_impl)


# Per input geometry, the forward's route, decided once: the inputs checked, then the Gluon kernel (None) or
# the Triton kernel's launch plan. The key holds what each decision reads: the inputs' shapes, strides,
# dtypes, devices and 16-byte alignment, causality, the fp32 matmul precision and the `tiles` override
# (configurations enter through `config_for`, whose answer cache clears this one too). At short sequences
# the host is the latency: on an H100 host the forward's host path (70-95 µs) was as long as the L2 flush
# before each do_bench run (90 µs of GPU time), and at about half of notebook 10's one-head points the GPU
# then waited for the forward's launch.
_FORWARD_ROUTES: dict[tuple, _LaunchPlan | None] = answer_cache()
_UNSEEN = object()


def flash_forward_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool):
    """O and L (q.shape[:-1], fp32) of (..., N, d) inputs, eagerly: the Gluon kernel where
    `gluon_forward_applies`, else `flash_fwd_kernel`; bad inputs raise a ValueError that names the problem.
    (While torch.compile traces, `FlashAttentionTriton.forward` decides in place.)"""
    return _forward_eager(q, k, v, is_causal)[:2]


def _forward_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool):
    """`flash_forward_triton`, and the key of the inputs' geometry, with which the backward finds its route."""
    try:
        key = (q.shape, q.stride(), q.dtype, q.device, q.data_ptr() % 16, k.shape, k.stride(), k.dtype, k.device,
               k.data_ptr() % 16, v.shape, v.stride(), v.dtype, v.device, v.data_ptr() % 16, is_causal,
               torch.get_float32_matmul_precision(), FlashAttentionTriton.tiles)
    except AttributeError:  # not a tensor: the check says which
        check_triton_inputs(q, k, v, is_causal, INTERPRETED)
        raise
    route = _FORWARD_ROUTES.get(key, _UNSEEN)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    if route is _UNSEEN:
        check_triton_inputs(q, k, v, is_causal, INTERPRETED)
        route = None if gluon_forward_applies(q, k, v, INTERPRETED) else _plan(
            "forward", (q, k, v, out, lse), is_causal, FlashAttentionTriton._config("forward", q, k.shape[-2], is_causal))
        if len(_FORWARD_ROUTES) >= MAX_PLANS:
            _FORWARD_ROUTES.clear()
        _FORWARD_ROUTES[key] = route
    if route is None:
        launch_forward_gluon(q, k, v, out, lse, is_causal)
    else:
        _run("forward", route, (q, k, v, out, lse))
    return out, lse, key


class _BackwardRoute(NamedTuple):
    gluon: bool  # the fused Gluon kernel (`flash_backward_gluon`), else the two Triton kernels by these plans
    dq: _LaunchPlan | None
    dkdv: _LaunchPlan | None


# Per forward geometry (`_forward_eager`'s key) and upstream-gradient layout: the backward's route, decided once,
# or None where an input is not contiguous (the general path below then copies it). The key holds everything the
# route reads: q, k, v's geometry through the forward's key; O and L are the forward's own contiguous outputs;
# D and the gradients are allocated here, contiguous and aligned. An eager backward runs its Python on autograd's
# device thread, where on lent H100 hosts our whole forward+backward cost 530-560 µs of host time through autograd
# against 200 µs for the same calls made directly (tools/flash_host_probe.py): what it derives per call costs twice.
_BACKWARD_ROUTES: dict[tuple, _BackwardRoute | None] = answer_cache()


def _backward_route(q, k, v, out, grad_out, lse, is_causal: bool) -> _BackwardRoute | None:
    if not all(t.is_contiguous() for t in (q, k, v, grad_out, lse)):
        return None
    if gluon_backward_applies(q, k, v, is_causal, INTERPRETED):
        return _BackwardRoute(True, None, None)
    n_k = k.shape[-2]
    # D and the gradients as every call allocates them (contiguous, aligned): the plans read their geometry
    delta, grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (lse, q, k, v))
    return _BackwardRoute(
        False,
        _plan("dq", (q, k, v, out, grad_out, lse, delta, grad_q), is_causal,
              FlashAttentionTriton._config("dq", q, n_k, is_causal)),
        _plan("dkdv", (q, k, v, grad_out, lse, delta, grad_k, grad_v), is_causal,
              FlashAttentionTriton._config("dkdv", q, n_k, is_causal)),
    )


def flash_backward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    grad_out: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
    route_key: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (shapes and dtypes of q, k, v) from the two Triton kernels or, where
    `gluon_backward_applies`, the fused Gluon kernel. `route_key`: the key `_forward_eager` returned with
    `out` and `lse`, under which the route is kept (None: decided in full)."""
    if route_key is not None:
        key = (route_key, grad_out.stride(), grad_out.data_ptr() % 16)
        route = _BACKWARD_ROUTES.get(key, _UNSEEN)
        if route is _UNSEEN:
            route = _backward_route(q, k, v, out, grad_out, lse, is_causal)
            if len(_BACKWARD_ROUTES) >= MAX_PLANS:
                _BACKWARD_ROUTES.clear()
            _BACKWARD_ROUTES[key] = route
        if route is not None:
            if route.gluon:
                return flash_backward_gluon(q, k, v, out, grad_out, lse, is_causal)
            delta = torch.empty_like(lse)
            grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
            _run("dq", route.dq, (q, k, v, out, grad_out, lse, delta, grads[0]))
            _run("dkdv", route.dkdv, (q, k, v, grad_out, lse, delta, grads[1], grads[2]))
            return grads
    shapes = (q.shape, k.shape, v.shape)
    # One copy, not one per kernel, where the leading dimensions do not merge.
    q, k, v = (t if t.is_contiguous() else as_rows(t)[0] for t in (q, k, v))
    # An upstream gradient can be a broadcast (o.sum() gives stride-0 ones). The kernels could read
    # it in place, but at the leaderboard shape on an H100 streaming stride-0 tiles took the dK/dV
    # kernel from 2.1 to 2.9 ms; the dense copy costs 0.02 ms.
    grad_out, lse = grad_out.contiguous(), lse.contiguous()
    if gluon_backward_applies(q, k, v, is_causal, INTERPRETED):
        grads = flash_backward_gluon(q, k, v, out, grad_out, lse, is_causal)
        return tuple(grad.view(shape) for grad, shape in zip(grads, shapes))
    delta = torch.empty_like(lse)  # written by the dQ kernel, read by the dK/dV kernel
    # empty_like where it gives the shape: a third less host time than torch.empty
    grad_q, grad_k, grad_v = (torch.empty_like(t) if t.shape == shape else torch.empty(shape, dtype=t.dtype, device=t.device)
                              for t, shape in zip((q, k, v), shapes))
    n_k = k.shape[-2]
    launch_dq(q, k, v, out, grad_out, lse, delta, grad_q, is_causal, FlashAttentionTriton._config("dq", q, n_k, is_causal))
    launch_dkdv(q, k, v, grad_out, lse, delta, grad_k, grad_v, is_causal,
                FlashAttentionTriton._config("dkdv", q, n_k, is_causal))
    return grad_q, grad_k, grad_v


def _batch_stride(t: torch.Tensor, row_dims: int) -> int | None:
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
    stride_b = _batch_stride(t, row_dims)
    if stride_b is None:
        t = t.reshape(-1, *t.shape[len(t.shape) - row_dims:])
        stride_b = t.stride(0)
    return t, (stride_b, *t.stride()[len(t.shape) - row_dims:])


def _output_strides(t: torch.Tensor, row_dims: int = 2) -> tuple[int, ...]:
    """`as_rows` strides of a tensor a kernel writes: a copy would lose what the kernel writes."""
    stride_b = _batch_stride(t, row_dims)
    if stride_b is None:
        raise ValueError(f"output of shape {tuple(t.shape)} and strides {t.stride()}: its leading dimensions must "
                         f"merge into one batch stride (allocate it contiguous)")
    return (stride_b, *t.stride()[len(t.shape) - row_dims:])


def tma_compatible(t: torch.Tensor, strides: tuple[int, ...] | None = None) -> bool:
    """Whether a tensor descriptor can read `t` with these strides (default: its own): unit last
    stride, 16-byte-aligned start and strides.

    Storage offset rather than data_ptr, so it also answers for torch.compile's fake tensors
    (PyTorch's allocators align every storage to at least 16 bytes)."""
    size = t.element_size()
    strides = t.stride() if strides is None else strides
    return (strides[-1] == 1 and t.storage_offset() * size % 16 == 0
            and all(stride * size % 16 == 0 for stride in strides[:-1]))


def _tma_device(t: torch.Tensor) -> bool:
    """16-bit elements on a GPU with the Tensor Memory Accelerator (compute capability >= 9), or the interpreter."""
    device = t.device
    return t.element_size() == 2 and (INTERPRETED or (device.type == "cuda" and device_facts(device)[0] >= 9))


def reads_by_tma(*tensors: torch.Tensor) -> bool:
    """Whether the kernels read these (batch, N, d) tensors through tensor descriptors (`flash_triton_tiles`):
    16-bit inputs on a GPU with the Tensor Memory Accelerator (compute capability >= 9) or under the
    interpreter (so CPU tests cover that path), when every tensor is `tma_compatible`.

    fp32 keeps block pointers: there the products may run on the FMA units from registers, and
    reading the descriptors' swizzled shared-memory tiles made the fp32 backward 4-9x slower at
    d >= 64 (H100, notebook 10 at commit 98260e0), while 16-bit inputs gained (forward 5-8%)."""
    return _tma_device(tensors[0]) and all(tma_compatible(t) for t in tensors)


# Per (device, stream): the scratch memory in which the kernels build their tensor descriptors. Kernels
# on one stream run one after another, so each launch can reuse the last one's (an allocation per
# launch cost about 8 µs of host time on an H100 host); a launch being captured into a CUDA graph gets
# its own, which lives as long as the graph does, as the graph may be replayed on any stream.
_SCRATCH: dict[tuple[int, int], torch.Tensor] = {}


def _descriptor_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(size, dtype=torch.int8, device="cuda")
    key = (torch._C._cuda_getDevice(), stream)
    scratch = _SCRATCH.get(key)
    if scratch is None or scratch.numel() < size:  # the allocator's blocks are aligned far past `alignment`
        scratch = _SCRATCH[key] = torch.empty(size, dtype=torch.int8, device="cuda")
    return scratch


# Each kernel's tensor arguments in order, by role: "read" a (..., N, d) input, read in place where
# its leading dimensions merge (else from a contiguous copy) and through tensor descriptors where
# `reads_by_tma` allows; "write" a (..., N, d) output; "lse" a (..., N) vector of per-row values,
# "lse_like" one with the previous one's strides (the kernels take one pair for both).
_ROLES = {
    "forward": ("read", "read", "read", "write", "lse"),
    "dkdv": ("read", "read", "read", "read", "lse", "lse_like", "write", "write"),
    "dq": ("read", "read", "read", "read", "read", "lse", "lse_like", "write"),
}
_LAUNCHERS = {
    "forward": CachedLauncher(flash_fwd_kernel),
    "dkdv": CachedLauncher(flash_bwd_dkdv_kernel),
    "dq": CachedLauncher(flash_bwd_dq_kernel),
}


class _LaunchPlan(NamedTuple):
    """What a launch derives from its tensors' geometry (`_launch_plan`); `serial` names a cached plan
    to the launcher (`CachedLauncher`'s signature), unique among the plans made in this process."""

    serial: int
    grid: tuple[int, ...]
    copies: tuple[bool, ...]  # per tensor: read from a contiguous (batch, N, d) copy
    scalars: tuple[int, ...]  # the strides in the kernel's order, then N_QUERIES, N_KEYS (forward: KV_CHUNK)
    meta: dict  # constexprs and launch options
    workspace: tuple[int, int] | None = None  # split-key forward: fp32 partials, int32 arrival counts


def _split_plan(q: torch.Tensor, n_k: int, is_causal: bool, config: KernelConfig, kv_chunk: int | None):
    """(keys per program, grid's split dimension, workspace sizes) of a forward launch; keys 0 where it
    does not split. `kv_chunk`: None follows `kv_split_chunk`, 0 never splits, else keys per program."""
    n_q, d = q.shape[-2:]
    batch = q.numel() // (n_q * d)
    if kv_chunk is None:
        kv_chunk = 0 if torch.compiler.is_compiling() else (
            kv_split_chunk(batch, n_q, n_k, is_causal, config.q_tile, config.k_tile, head_dim_tile(d), sm_count(q.device))
            or 0)
    elif kv_chunk < 0 or kv_chunk % config.k_tile:
        raise ValueError(f"kv_chunk must be 0 (no split) or a positive multiple of K_TILE = {config.k_tile}, got {kv_chunk}")
    if not kv_chunk:
        return 0, 1, None
    query_tiles = batch * -(-n_q // config.q_tile)
    # Causal query tiles stop at key (i + 1)·Q_TILE: no program of the last one's keys is idle.
    keys = min(n_k, -(-n_q // config.q_tile) * config.q_tile) if is_causal else n_k
    splits = -(-keys // kv_chunk)
    return kv_chunk, splits, (query_tiles * splits * config.q_tile * (head_dim_tile(d) + 2), query_tiles)


def _launch_plan(kernel: str, tensors: tuple[torch.Tensor, ...], is_causal: bool, config: KernelConfig,
                 serial: int = -1, kv_chunk: int | None = None) -> _LaunchPlan:
    roles = _ROLES[kernel]
    if len(tensors) != len(roles):
        raise ValueError(f"the {kernel} kernel takes {len(roles)} tensors, got {len(tensors)}")
    q, k = tensors[0], tensors[1]
    (n_q, d), n_k = q.shape[-2:], k.shape[-2]
    copies, strides, use_tma = [], [], _tma_device(q)
    if use_tma and kernel == "forward" and is_small_grid(kernel, q.numel() // (n_q * d), n_q, n_k, sm_count(q.device)):
        # Each program builds its descriptors on the device before its first read, a latency that a small
        # grid's one program per SM cannot hide: on an H100 (one head, bf16, N = 1,024 and 2,048) block
        # pointers took 1.4-3 µs less per forward, split or not.
        use_tma = False
    for t, role in zip(tensors, roles):
        copy = False
        if role == "read":
            rows, t_strides = as_rows(t)
            copy = rows is not t
            use_tma = use_tma and tma_compatible(rows, t_strides)
        elif role == "write":
            t_strides = _output_strides(t)
        elif role == "lse":
            lse = t
            t_strides = lse_strides = _output_strides(t, 1)
        else:
            if _output_strides(t, 1) != lse_strides:
                raise ValueError(f"the {kernel} kernel reads its per-row vectors with one set of strides: got shapes "
                                 f"{tuple(lse.shape)} and {tuple(t.shape)}, strides {lse.stride()} and {t.stride()}")
            t_strides = ()
        copies.append(copy)
        strides.extend(t_strides)
    rows_of_grid, tile = (n_k, config.k_tile) if kernel == "dkdv" else (n_q, config.q_tile)
    grid = (-(-rows_of_grid // tile), q.numel() // (n_q * d))  # triton.cdiv is a JIT helper: slow from Python
    scalars = (*strides, n_q, n_k)
    meta = dict(
        # scale is a constexpr: a runtime float becomes fp64 under torch.compile, making S fp64
        scale=d**-0.5, D=d, D_TILE=head_dim_tile(d), Q_TILE_SIZE=config.q_tile, K_TILE_SIZE=config.k_tile,
        is_causal=bool(is_causal), INPUT_PRECISION=input_precision(q.dtype), USE_TMA=use_tma,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    workspace = None
    if kernel == "forward":
        chunk, splits, workspace = _split_plan(q, n_k, is_causal, config, kv_chunk)
        grid, scalars, meta["SPLIT_KV"] = (*grid, splits), (*scalars, chunk), bool(chunk)
        meta["MAX_SPLITS"] = max(2, 1 << (splits - 1).bit_length())
    else:
        chunk, splits, batch = 0, 1, grid[1]
        if (q.dtype == torch.float32 and not torch.compiler.is_compiling()
                and is_small_grid(kernel, batch, n_q, n_k, sm_count(q.device))):
            loop_tile, grid_tile = (config.q_tile, config.k_tile) if kernel == "dkdv" else (config.k_tile, config.q_tile)
            chunk, splits = backward_split(kernel, batch, n_q, n_k, loop_tile, grid_tile, sm_count(q.device))
        grid, scalars, meta["SPLIT"] = (*grid, splits), (*scalars, chunk), splits > 1
    return _LaunchPlan(serial, grid, tuple(copies), scalars, meta, workspace)


# At short sequences the host is the latency, and deriving a plan from shapes and strides took about
# as long as the launch itself: one plan per geometry, kept (past MAX_PLANS the cache starts over).
_PLANS: dict[tuple, _LaunchPlan] = {}
MAX_PLANS = 4096
_PLAN_SERIALS = itertools.count()


# Per (device, stream): the split-key forward's workspace (`flash_triton_forward`), fp32 partials and
# int32 arrival counts that each launch leaves at zero, so launches on one stream, which run one after
# another, reuse it uncleared (the interpreter's, on the CPU, runs synchronously). A launch traced by
# torch.compile gets its own.
_SPLIT_WORKSPACES: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
# A launch being captured into a CUDA graph gets its own partials from the graph's pool, and arrival
# counts carved from a slab per device zeroed outside any capture: each slice serves one captured launch
# for good, and as its launch leaves the counts at zero, every replay finds them so. Zeros made during
# the capture would be a memset node in the graph, run at every replay (about 2 µs on an H100 against a
# 15 µs forward). Before any eager split launch on the device, or once the slab is used up, that is the
# fallback.
GRAPH_ARRIVAL_SLAB = 1 << 16
_GRAPH_ARRIVALS: dict[int, list] = {}  # device index -> [zeroed slab, first free element]


def _split_workspace(device: torch.device, sizes: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    def fresh():
        return (torch.empty(sizes[0], dtype=torch.float32, device=device),
                torch.zeros(sizes[1], dtype=torch.int32, device=device))

    if torch.compiler.is_compiling():
        return fresh()
    if device.type != "cuda":
        key = (-1, 0)
    else:
        key = current_device_and_stream()
        if torch.cuda.is_current_stream_capturing():
            slab = _GRAPH_ARRIVALS.get(key[0])
            if slab is None or slab[1] + sizes[1] > slab[0].numel():
                return fresh()
            slab[1] += sizes[1]
            return torch.empty(sizes[0], dtype=torch.float32, device=device), slab[0][slab[1] - sizes[1]:slab[1]]
        if key[0] not in _GRAPH_ARRIVALS:
            _GRAPH_ARRIVALS[key[0]] = [torch.zeros(GRAPH_ARRIVAL_SLAB, dtype=torch.int32, device=device), 0]
    workspace = _SPLIT_WORKSPACES.get(key)
    if workspace is None or workspace[0].numel() < sizes[0] or workspace[1].numel() < sizes[1]:
        # the old one may still be in use by a queued launch: the stream-ordered allocator keeps it until then
        if workspace is not None:
            sizes = (max(sizes[0], workspace[0].numel()), max(sizes[1], workspace[1].numel()))
        workspace = _SPLIT_WORKSPACES[key] = fresh()
    return workspace


def _plan(kernel: str, tensors: tuple[torch.Tensor, ...], is_causal: bool, config: KernelConfig,
          kv_chunk: int | None = None) -> _LaunchPlan:
    """The launch plan of `kernel` on `tensors` (laid out as `_ROLES[kernel]`), kept per geometry.

    The plan's key holds everything it is derived from: the tensors' shapes, strides, dtypes and
    16-byte alignment of their addresses, the device (descriptor reads), the configuration,
    causality and the fp32 matmul precision. That is also everything Triton specializes the
    compilation on, so the plan's serial number serves the launcher as the launch's signature."""
    if torch.compiler.is_compiling():  # shapes may be symbolic; traced once anyway
        return _launch_plan(kernel, tensors, is_causal, config, kv_chunk=kv_chunk)
    key = (kernel, config, bool(is_causal), tensors[0].device, torch.get_float32_matmul_precision(), kv_chunk,
           *[(t.shape, t.stride(), t.dtype, t.data_ptr() % 16) for t in tensors])
    plan = _PLANS.get(key)
    if plan is None:
        plan = _launch_plan(kernel, tensors, is_causal, config, next(_PLAN_SERIALS), kv_chunk)
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _launch(kernel: str, tensors: tuple[torch.Tensor, ...], is_causal: bool, config: KernelConfig,
            kv_chunk: int | None = None):
    """Launch `kernel` on `tensors` (laid out as `_ROLES[kernel]`); returns the compiled kernel."""
    return _run(kernel, _plan(kernel, tensors, is_causal, config, kv_chunk), tensors)


def _run(kernel: str, plan: _LaunchPlan, tensors: tuple[torch.Tensor, ...]):
    """Launch `kernel` on `tensors` by `plan` (`_plan` of tensors of this geometry)."""
    compiling = torch.compiler.is_compiling()
    if True in plan.copies:
        tensors = tuple(as_rows(t)[0] if copy else t for t, copy in zip(tensors, plan.copies))
    if kernel == "forward":  # without a split, the output and L stand in for the workspace the kernel then never reads
        tensors = (*tensors, *(_split_workspace(tensors[0].device, plan.workspace) if plan.workspace else tensors[3:5]))
    if plan.meta["USE_TMA"] and not INTERPRETED and not compiling:
        # Descriptors built on the device need scratch memory from Triton's allocator: a per-thread
        # setting, and the backward runs on autograd's thread (torch.compile's launcher sets its own).
        triton.set_allocator(_descriptor_scratch)
    if kernel != "forward" and plan.meta["SPLIT"]:  # the chunks add into the gradients (`backward_split`)
        for grad in tensors[-1:] if kernel == "dq" else tensors[-2:]:
            grad.zero_()
    signature = None if compiling or True in plan.copies else plan.serial  # a copy's address is not in the key
    return _LAUNCHERS[kernel](plan.grid, tensors, plan.scalars, plan.meta, signature)


def launch_forward(q, k, v, out, lse, is_causal: bool, config: KernelConfig, kv_chunk: int | None = None):
    """O and L of (..., N, d) inputs into `out` (q's shape) and `lse` (q.shape[:-1]): grid (query
    tiles, batch, key chunks), batch = the leading dimensions. `kv_chunk`: keys per program where
    each query tile's keys are split over programs; None: `flash_configs.kv_split_chunk` decides
    (never while torch.compile traces), 0: no split. Returns the compiled kernel."""
    return _launch("forward", (q, k, v, out, lse), is_causal, config, kv_chunk)


def launch_dkdv(q, k, v, do, lse, delta, grad_k, grad_v, is_causal: bool, config: KernelConfig):
    """dK, dV of (..., N, d) tensors into `grad_k`, `grad_v`: grid (key tiles, batch). `lse` and
    `delta` (q.shape[:-1]) share strides. Returns the compiled kernel."""
    return _launch("dkdv", (q, k, v, do, lse, delta, grad_k, grad_v), is_causal, config)


def launch_dq(q, k, v, out, do, lse, delta, grad_q, is_causal: bool, config: KernelConfig):
    """dQ of (..., N, d) tensors into `grad_q` and D = rowsum(O * dO) into `delta` (strides of `lse`):
    grid (query tiles, batch). Returns the compiled kernel."""
    return _launch("dq", (q, k, v, out, do, lse, delta, grad_q), is_causal, config)
