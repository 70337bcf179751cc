"""Gradient clipping by global norm, as in assignment 1: the step before the optimizer's when training clips."""

from __future__ import annotations

from collections.abc import Iterable

import torch


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
