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
this module on top, which alone reads the options (`backward_impl`, `tiles`: per call, else the process's
`DEFAULTS`) and passes them down as arguments. `FlashAttentionTriton.apply` (and so `flash_attention_triton`,
`flash_attention`) sends eager CUDA calls through the C++ node where it serves the geometry (the same kernels
and launch plans, no Python on the host path); everything else takes the Python `autograd.Function`, whose
forward and backward run `launch.dispatch`'s host path: eagerly, or, under torch.compile, as the custom ops
`cs336::flash_forward` and `cs336::flash_backward` in one graph (`fullgraph=True` traces it).
On CPU tensors the kernels run only under TRITON_INTERPRET=1, set before triton is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from cs336_systems.attention.launch import native
from cs336_systems.attention.launch.dispatch import flash_backward_triton, flash_forward_with_route
from cs336_systems.attention.pytorch import FlashAttentionPytorch, flash_backward
from cs336_systems.attention.validation import check_is_causal

BACKWARD_IMPLS = ("triton", "pytorch")


@dataclass
class AttentionDefaults:
    """The options a call takes where it names none of its own: `backward_impl` ("triton" | "pytorch") and
    `tiles`, a (Q_TILE, K_TILE) pair of powers of two >= 16 that overrides the tiles of every kernel's
    configuration (`configs.config_for`; the interpreter tests use 16 for the models they run). A plain
    object rather than attributes of the autograd.Function: torch.compile reads it as constants (guarded),
    where it cannot resolve an autograd.Function's class attributes and breaks the graph."""

    backward_impl: str = "triton"
    tiles: tuple[int, int] | None = None

    def resolve(self, backward_impl: str | None, tiles: tuple[int, int] | None) -> tuple[str, tuple[int, int] | None]:
        """A call's options, each filled from these defaults where the call names none, checked."""
        backward_impl = backward_impl or self.backward_impl
        if backward_impl not in BACKWARD_IMPLS:
            raise ValueError(f"unknown backward_impl {backward_impl!r}; choose one of {', '.join(BACKWARD_IMPLS)}")
        return backward_impl, tiles if tiles is not None else self.tiles


DEFAULTS = AttentionDefaults()


class FlashAttentionTriton(torch.autograd.Function):
    """O = softmax(Q K^T / sqrt(d) [+ causal mask]) V with Triton kernels; saves L, Q, K, V, O.

    `apply(q, k, v, is_causal=False, backward_impl=None, tiles=None)`: the options per call, each None
    taking `DEFAULTS`'s (`AttentionDefaults`).
    """

    @classmethod
    def apply(
        cls,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        backward_impl: str | None = None,
        tiles: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Eager CUDA calls with the Triton backward go through the C++ autograd node of `launch.native`
        where it serves the geometry (the same kernels and plans, no Python on the host path; its grad_fn
        shows the same saved tensors); every other call, torch.compile's included, through this Function."""
        if "tiles" in cls.__dict__ or "backward_impl" in cls.__dict__:
            raise AttributeError(
                "FlashAttentionTriton.tiles and .backward_impl are not switches: pass them per call, or set "
                "cs336_systems.attention.api.DEFAULTS for every call that names none"
            )  # (a metaclass that refused the assignment would hide the Function from torch.compile)
        backward_impl, tiles = DEFAULTS.resolve(backward_impl, tiles)
        check_is_causal(is_causal)  # before any cached route or C++ program is looked up by it
        if backward_impl == "triton" and not torch.compiler.is_compiling():
            out = native.attention(q, k, v, is_causal, tiles)
            if out is not None:
                return out
        return super().apply(q, k, v, is_causal, backward_impl, tiles)

    @classmethod
    def python_apply(
        cls,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        backward_impl: str | None = None,
        tiles: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """This Python autograd.Function alone, never the C++ node (to compare the two paths)."""
        return super().apply(q, k, v, is_causal, backward_impl, tiles)  # the forward fills them from DEFAULTS

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        backward_impl: str | None = None,
        tiles: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        # the options arrive resolved (`apply`, `python_apply`); a direct Function.apply call is checked here
        backward_impl, tiles = DEFAULTS.resolve(backward_impl, tiles)
        out, lse, ctx.route = flash_forward_with_route(q, k, v, is_causal, tiles)
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
            grads = flash_backward_triton(q, k, v, out, grad_out, lse, ctx.is_causal, ctx.route, ctx.tiles)
        return (*grads, None, None, None)


def flash_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    *,
    backward_impl: str | None = None,
    tiles: tuple[int, int] | None = None,
) -> torch.Tensor:
    """`FlashAttentionTriton.apply` with its options per call, keyword only (None: `DEFAULTS`')."""
    return FlashAttentionTriton.apply(q, k, v, is_causal, backward_impl, tiles)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) [+ causal mask, as SDPA's]) V of (..., N, d) tensors, differentiable: the
    library's one entry to FlashAttention-2 (`flash_attention_triton` with the default backward)."""
    return flash_attention_triton(q, k, v, is_causal)
