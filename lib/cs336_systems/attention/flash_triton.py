"""FlashAttention-2 with Triton kernels: the public API (`flash_attention_triton`, `FlashAttentionTriton`).

Forward: O and L (shape q.shape[:-1], fp32, the row logsumexp); saves L, Q, K, V, O. Backward: the
Triton kernels (`backward_impl = "triton"`, the default: dQ and D = rowsum(O * dO) per query tile, then
dK/dV per key tile, no atomics; on Hopper the fused Gluon kernel where it applies) or the compiled
PyTorch equations 13-19 (`backward_impl = "pytorch"`).

Inputs (..., N, d) of any leading shape are read as (batch·heads, N, d) (`flash_layout.as_rows`: in
place where the leading dimensions merge into one stride, else from a contiguous copy); N_q and N_k
may differ; any N works (edge tiles are masked); d <= 256; fp32, fp16, bf16. fp32 products follow
`torch.set_float32_matmul_precision` (`flash_layout.input_precision`).
`is_causal` means what it means for `scaled_dot_product_attention`: query i sees keys j <= i (the mask
aligned to the upper left); decoding against a cache (lower-right alignment) is not offered.

The layers under this module, each importing only those below it: the kernels (`flash_triton_forward`,
`flash_triton_backward`, `flash_gluon_forward`, `flash_gluon_backward`); `flash_layout` (shape and
stride facts); `flash_launch` (launch plans and every cache, one object) and `flash_gluon` (the Gluon
launches); `flash_dispatch` (which kernels serve a call); `flash_native` (the C++ autograd node). The
switches `FlashAttentionTriton.backward_impl` and `.tiles` are read here only and passed down.
`FlashAttentionTriton.apply` (and so `flash_attention_triton`, `flash_attention`) sends eager CUDA calls
through the C++ node where it serves the geometry (the same kernels and launch plans, no Python on the
host path); everything else, torch.compile included, takes the Python `autograd.Function`. On CPU tensors the kernels run only under TRITON_INTERPRET=1, set
before triton is imported.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from cs336_systems.attention import flash_native
from cs336_systems.attention.flash_dispatch import (
    GLUON,
    backward_route,
    forward_route,
    geometry_key,
    kernel_config,
)
from cs336_systems.attention.flash_gluon import (
    flash_backward_gluon,
    gluon_backward_applies,
    gluon_forward_applies,
    launch_forward_gluon,
)
from cs336_systems.attention.flash_launch import LAUNCHES, launch_dkdv, launch_dq, launch_forward
from cs336_systems.attention.flash_layout import INTERPRETED, as_rows
from cs336_systems.attention.flash_pytorch import FlashAttentionPytorch, flash_backward
from cs336_systems.attention.validation import check_is_causal, check_triton_inputs

BACKWARD_IMPLS = ("triton", "pytorch")


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

    @classmethod
    def apply(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
              backward_impl: str | None = None) -> torch.Tensor:
        """Eager CUDA calls with the Triton backward go through the C++ autograd node of `flash_native`
        where it serves the geometry (the same kernels and plans, no Python on the host path; its grad_fn
        shows the same saved tensors); every other call, torch.compile's included, through this Function."""
        if (backward_impl or cls.backward_impl) == "triton" and not torch.compiler.is_compiling():
            out = flash_native.attention(q, k, v, is_causal, cls.tiles)
            if out is not None:
                return out
        return super().apply(q, k, v, is_causal, backward_impl)

    @classmethod
    def python_apply(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                     backward_impl: str | None = None) -> torch.Tensor:
        """This Python autograd.Function alone, never the C++ node (to compare the two paths)."""
        return super().apply(q, k, v, is_causal, backward_impl)

    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, backward_impl: str | None = None
    ) -> torch.Tensor:
        backward_impl = backward_impl or FlashAttentionTriton.backward_impl
        if backward_impl not in BACKWARD_IMPLS:
            raise ValueError(f"unknown backward_impl {backward_impl!r}; choose one of {', '.join(BACKWARD_IMPLS)}")
        tiles = FlashAttentionTriton.tiles
        if torch.compiler.is_compiling():
            # Traced here rather than through flash_forward_triton: traced there, the forward's subgraph
            # allocated and returned O and L itself, and the compiled leaderboard forward ran slower
            # (docs/flash_attention_tuning.md).
            check_triton_inputs(q, k, v, is_causal, INTERPRETED)
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
            if gluon_forward_applies(q, k, v, is_causal, INTERPRETED, tiles):
                launch_forward_gluon(q, k, v, out, lse, is_causal)
            else:
                launch_forward(q, k, v, out, lse, is_causal, kernel_config("forward", q, k.shape[-2], is_causal, tiles))
            ctx.route_key = None
        else:
            out, lse, ctx.route_key = flash_forward_with_route(q, k, v, is_causal, tiles)
        ctx.tiles = tiles
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
            grads = flash_backward_triton(q, k, v, out, grad_out, lse, ctx.is_causal, ctx.route_key, ctx.tiles)
        return (*grads, None, None)


def flash_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, *, backward_impl: str | None = None
) -> torch.Tensor:
    """`FlashAttentionTriton.apply` with the backward chosen per call (None: the class default), keyword only."""
    return FlashAttentionTriton.apply(q, k, v, is_causal, backward_impl)


def flash_forward_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                         tiles: tuple[int, int] | None = None):
    """O and L (q.shape[:-1], fp32) of (..., N, d) inputs, eagerly: the Gluon kernel where
    `gluon_forward_applies`, else `flash_fwd_kernel`; bad inputs raise a ValueError that names the problem.
    (While torch.compile traces, `FlashAttentionTriton.forward` decides in place.)"""
    return flash_forward_with_route(q, k, v, is_causal, tiles)[:2]


def flash_forward_with_route(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                             tiles: tuple[int, int] | None = None):
    """`flash_forward_triton`'s O and L, and the key of the inputs' geometry under which
    `flash_backward_triton(..., route_key=key)` finds its route (the model's strided layout without copies)."""
    check_is_causal(is_causal)  # on every call: a route found by its key skips the inputs' checks
    key = geometry_key(q, k, v, is_causal, tiles)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    route = forward_route(key, q, k, v, out, lse, is_causal, tiles)
    if route is GLUON:
        launch_forward_gluon(q, k, v, out, lse, is_causal)
    else:
        LAUNCHES.run("forward", route, (q, k, v, out, lse))
    return out, lse, key


def flash_backward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    grad_out: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
    route_key: tuple | None = None,
    tiles: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (shapes and dtypes of q, k, v) from the two Triton kernels or, where
    `gluon_backward_applies`, the fused Gluon kernel. `route_key`: the key `flash_forward_with_route` returned with
    `out` and `lse`, under which the route is kept (None: decided in full)."""
    if route_key is not None:
        route = backward_route(route_key, q, k, v, out, grad_out, lse, is_causal, tiles)
        if route is GLUON:
            return flash_backward_gluon(q, k, v, out, grad_out, lse, is_causal)
        if route is not None:
            delta = torch.empty_like(lse)
            grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
            LAUNCHES.run("dq", route.dq, (q, k, v, out, grad_out, lse, delta, grads[0]))
            LAUNCHES.run("dkdv", route.dkdv, (q, k, v, grad_out, lse, delta, grads[1], grads[2]))
            return grads
    shapes = (q.shape, k.shape, v.shape)
    # One copy, not one per kernel, where the leading dimensions do not merge.
    q, k, v = (t if t.is_contiguous() else as_rows(t)[0] for t in (q, k, v))
    # An upstream gradient can be a broadcast (o.sum() gives stride-0 ones). The kernels could read it in
    # place, but streaming stride-0 tiles slowed the dK/dV kernel by a third at the leaderboard shape; the
    # dense copy costs far less.
    grad_out, lse = grad_out.contiguous(), lse.contiguous()
    if gluon_backward_applies(q, k, v, is_causal, INTERPRETED, tiles):
        grads = flash_backward_gluon(q, k, v, out, grad_out, lse, is_causal)
        return tuple(grad.view(shape) for grad, shape in zip(grads, shapes))
    delta = torch.empty_like(lse)  # written by the dQ kernel, read by the dK/dV kernel
    # empty_like where it gives the shape: a third less host time than torch.empty
    grad_q, grad_k, grad_v = (torch.empty_like(t) if t.shape == shape else torch.empty(shape, dtype=t.dtype, device=t.device)
                              for t, shape in zip((q, k, v), shapes))
    n_k = k.shape[-2]
    launch_dq(q, k, v, out, grad_out, lse, delta, grad_q, is_causal, kernel_config("dq", q, n_k, is_causal, tiles))
    launch_dkdv(q, k, v, grad_out, lse, delta, grad_k, grad_v, is_causal, kernel_config("dkdv", q, n_k, is_causal, tiles))
    return grad_q, grad_k, grad_v


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) [+ causal mask, as SDPA's]) V of (..., N, d) tensors, differentiable: the
    library's one entry to FlashAttention-2 (`flash_attention_triton` with the default backward)."""
    return flash_attention_triton(q, k, v, is_causal)
