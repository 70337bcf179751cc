"""Selective recomputation of a checkpointed block: its attention's output is kept, not recomputed.

A block under `torch.utils.checkpoint` (non-reentrant) keeps only its input and re-runs its whole forward
before its backward. At long context most of that re-run is attention: O = softmax(Q K^T / sqrt(d)) V costs
4 N^2 d per head (causal: half), the rest of the block O(N d^2). Attention's backward needs Q, K, V (cheap
to recompute: three projections and RoPE), O and the row logsumexp L (expensive: the attention forward).
`KeptAttentionOutput` stands in for a block's attention function and keeps O and L from the block's forward
until its recompute, which then reuses them instead of running the attention forward again: a recomputed
block holds one more (batch, seq, d_model) tensor and (batch, heads, seq) fp32 values, and saves the
attention forward's time.

How it fits non-reentrant checkpointing: the checkpoint matches the tensors saved during the recompute to
the original forward's autograd nodes by their order. `KeptOutputFlashAttention` saves (L, Q, K, V, O) in
the same order in both passes; in the first it computes O and L (and keeps them here, outside the
checkpoint's reach), in the recompute it saves the kept ones with the recomputed Q, K, V. The backward is
the original node's: `flash_backward_triton` with the forward's route.

Use (what `parallelize.Parallelized` does): `keeper.arm()` just before the block's checkpointed forward; the next call
computes and keeps, the call after it (the recompute) reuses and lets go. A keeper that is not armed and
keeps nothing is the plain attention (`fallback`), so the model still runs normally outside the step.
`torch.compiler.disable`: the keeping is Python state that a compiled graph cannot hold, so a compiled
block runs around it in two graphs.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from cs336_systems.attention.launch.dispatch import flash_backward_triton, flash_forward_with_route


class KeptOutputFlashAttention(torch.autograd.Function):
    """FlashAttention (`flash_forward_with_route`, `flash_backward_triton`) whose forward reuses the O and L
    a `KeptAttentionOutput` holds, when it holds them."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal: bool, keeper: KeptAttentionOutput):
        if keeper.kept is None:
            out, lse, route = flash_forward_with_route(q, k, v, bool(is_causal))
            # A detached alias: the original `out` belongs to this pass's autograd node; the recompute's
            # node must not take it over.
            keeper.kept = (out.detach(), lse, route)
            keeper.armed = False
        else:
            out, lse, route = keeper.kept
            if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
                raise RuntimeError(
                    f"KeptAttentionOutput: the kept output {tuple(out.shape)} {out.dtype} does not "
                    f"belong to this call's q {tuple(q.shape)} {q.dtype}: a recompute without its forward"
                )
            keeper.kept = None  # the recompute's saved tensors hold them from here on
            keeper.reuses += 1
        ctx.save_for_backward(lse, q, k, v, out)
        ctx.is_causal, ctx.route = bool(is_causal), route
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        lse, q, k, v, out = ctx.saved_tensors
        grads = flash_backward_triton(q, k, v, out, grad_out, lse, ctx.is_causal, ctx.route)
        return (*grads, None, None)


class KeptAttentionOutput:
    """A block's attention function (q, k, v, is_causal) -> O that keeps O and L from an armed forward to
    the recompute that follows it (module docstring). `reuses` counts the recomputes served."""

    def __init__(self, fallback):
        self.fallback = fallback
        self.kept: tuple | None = None
        self.armed = False
        self.reuses = 0
        self.__name__ = getattr(fallback, "__name__", "attention")

    def arm(self) -> None:
        """The next call is a checkpointed forward whose recompute will follow: keep its O and L."""
        self.kept = None
        self.armed = True

    def release(self) -> None:
        """Forget anything kept (a step that failed between its forward and its backward)."""
        self.kept = None
        self.armed = False

    @torch.compiler.disable
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        if not self.armed and self.kept is None:
            return self.fallback(q, k, v, is_causal)
        return KeptOutputFlashAttention.apply(q, k, v, is_causal, self)
