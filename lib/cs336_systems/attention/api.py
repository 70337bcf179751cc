"""FlashAttention-2 with Triton kernels, the public API: `flash_attention`, `flash_attention_triton`,
`FlashAttentionTriton` (the course's autograd.Function); inputs are checked by `validation`.

Forward: O and L (shape q.shape[:-1], fp32, the row logsumexp); saves L, Q, K, V, O. Backward: the
Triton kernels (`backward_impl = "triton"`, the default: dQ and D = rowsum(O * dO) per query tile, then
dK/dV per key tile, no atomics; on Hopper the fused Gluon kernel where it applies) or the compiled
PyTorch equations 13-19 (`backward_impl = "pytorch"`).

Inputs (..., N, d) of any leading shape are read as (batch·heads, N, d) (`launch.layout.as_rows`: in
place where the leading dimensions merge into one stride, else from a contiguous copy); N_q and N_k
may differ; any N works (edge tiles are masked); d <= 256; fp32, fp16, bf16. fp32 products follow
`torch.set_float32_matmul_precision` (`launch.layout.input_precision`).
`is_causal` means what it means for `scaled_dot_product_attention`: query i sees keys j <= i (the mask
aligned to the upper left); decoding against a cache (lower-right alignment) is not offered.

The package by role (docs/architecture.md), each layer importing only those below it: `kernels` (the
Triton and Gluon kernels, math first); `heuristics` (every threshold and route rule) and `configs` (the
tuned table); `launch` (shape facts in `layout`, launch plans and caches in `plans`, the Gluon launches in
`gluon`, the route of a call and the Python host path in `dispatch`, the C++ autograd node in `native`);
this module on top, whose calls take the options `backward_impl` and `tiles` and pass them down.

One host path: `FlashAttentionTriton.apply` (and so `flash_attention`) sends eager CUDA calls through the C++
node where it serves the geometry (it replays the launches of the same routes, no Python on the host path);
every other call, torch.compile's included, takes the Python `autograd.Function`, whose forward and backward
are the custom ops of `launch.dispatch` around the same route decision and launch code. On CPU tensors the
kernels run only under TRITON_INTERPRET=1, set before triton is imported.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from cs336_systems.attention.launch import dispatch, native
from cs336_systems.attention.pytorch import FlashAttentionPytorch, flash_backward

BACKWARD_IMPLS = ("triton", "pytorch")
# What a call that names no option gets (tests and notebook 09 lower the tiles for the interpreter). Module
# values rather than class attributes: torch.compile reads them as constants of the graph, where a class
# attribute of the autograd.Function broke the graph.
DEFAULT_BACKWARD_IMPL = "triton"
DEFAULT_TILES: tuple[int, int] | None = None


class FlashAttentionTriton(torch.autograd.Function):
    """O = softmax(Q K^T / sqrt(d) [+ causal mask]) V with Triton kernels; saves L, Q, K, V, O.

    `apply(q, k, v, is_causal=False, backward_impl=None, tiles=None)`: `backward_impl` "triton" | "pytorch",
    `tiles` a (Q_TILE, K_TILE) pair of powers of two >= 16 that overrides the tiles of every kernel's
    configuration (`configs.config_for`); None takes `DEFAULT_BACKWARD_IMPL`, `DEFAULT_TILES`.
    """

    @classmethod
    def apply(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
              backward_impl: str | None = None, tiles: tuple[int, int] | None = None) -> torch.Tensor:
        """Eager CUDA calls with the Triton backward go through the C++ autograd node of `launch.native`
        where it serves the geometry (the same routes and launches, no Python on the host path; its grad_fn
        shows the same saved tensors); every other call, torch.compile's included, through this Function,
        whose passes are the custom ops of `launch.dispatch`. (torch.compile calls `forward` directly.)"""
        backward_impl, tiles = backward_impl or DEFAULT_BACKWARD_IMPL, tiles or DEFAULT_TILES
        if backward_impl == "triton" and not torch.compiler.is_compiling():
            out = native.attention(q, k, v, is_causal, tiles)
            if out is not None:
                return out
        return super().apply(q, k, v, is_causal, backward_impl, tiles)

    @classmethod
    def python_apply(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                     backward_impl: str | None = None, tiles: tuple[int, int] | None = None) -> torch.Tensor:
        """This Python autograd.Function alone, never the C++ node (to compare the two paths)."""
        return super().apply(q, k, v, is_causal, backward_impl, tiles)

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                backward_impl: str | None = None, tiles: tuple[int, int] | None = None) -> torch.Tensor:
        backward_impl, tiles = backward_impl or DEFAULT_BACKWARD_IMPL, tiles or DEFAULT_TILES
        if backward_impl not in BACKWARD_IMPLS:
            raise ValueError(f"unknown backward_impl {backward_impl!r}; choose one of {', '.join(BACKWARD_IMPLS)}")
        out, lse = dispatch.forward(q, k, v, is_causal, tiles)
        ctx.save_for_backward(lse, q, k, v, out)
        ctx.is_causal = is_causal
        ctx.backward_impl = backward_impl
        ctx.tiles = tiles
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
            grads = dispatch.backward(q, k, v, out, grad_out, lse, ctx.is_causal, ctx.tiles)
        return (*grads, None, None, None)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, *,
                    backward_impl: str | None = None, tiles: tuple[int, int] | None = None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) [+ causal mask, as SDPA's]) V of (..., N, d) tensors, differentiable: the
    library's one entry to FlashAttention-2. `backward_impl` ("triton", the default, or "pytorch") and
    `tiles` (a (Q_TILE, K_TILE) override of the kernels' tiles) are per call; None takes the module's
    defaults."""
    return FlashAttentionTriton.apply(q, k, v, is_causal, backward_impl, tiles)


# The name under which notebooks, tools and the benchmarks call it.
flash_attention_triton = flash_attention
