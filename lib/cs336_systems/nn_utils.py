"""Numerics shared by the model and the training step: softmax, cross-entropy, gradient clipping."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x); the max keeps exp from overflowing."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    exp = torch.exp(shifted)
    return exp / exp.sum(dim=dim, keepdim=True)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over all positions of -log softmax(logits)[target] = logsumexp(logits) - logits[target].

    `logits` has shape (..., vocab) and `targets` shape (...). Computed in fp32 whatever the
    input dtype, because logsumexp over a 10k vocabulary loses digits in bf16.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"cross_entropy: logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}")
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    target_logit = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (lse - target_logit).mean()


def clip_gradients(parameters: Iterable[torch.nn.Parameter], max_l2_norm: float, eps: float = 1e-6) -> torch.Tensor:
    """Scale all gradients by min(1, max_norm / (||g||_2 + eps)); returns the norm before clipping."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    scale = torch.clamp(max_l2_norm / (total + eps), max=1.0)
    for g in grads:
        g.mul_(scale.to(g.dtype))
    return total
