"""A fused LM head + cross-entropy loss that never holds the whole [N, V] logits.

`linear_cross_entropy(hidden, weight, targets, *, chunk_tokens=None, reduction="mean", ignore_index=-100)`
equals `F.cross_entropy(hidden @ weight.T, targets)` in value and gradients. It runs the tokens in chunks:
torch's matmul makes a chunk's logits, one Triton kernel (`cross_entropy_kernels`) turns them in place into
the loss and d loss / d logits, and two more matmuls fold them into the gradients of hidden and weight, all in
the forward; the backward only scales those by grad_output (`linear_cross_entropy`).
"""

from cs336_systems.fused_loss.linear_cross_entropy import (
    LinearCrossEntropy,
    default_chunk_tokens,
    linear_cross_entropy,
)

__all__ = ["LinearCrossEntropy", "default_chunk_tokens", "linear_cross_entropy"]
