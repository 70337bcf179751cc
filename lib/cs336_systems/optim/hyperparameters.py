"""The hyperparameter check AdamW and FusedAdamW share, with torch.optim.AdamW's messages (so a wrong value
reads the same whichever optimizer got it)."""

from __future__ import annotations

import numbers


def check_adamw_hyperparameters(
    name: str, lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> None:
    """torch.optim.AdamW's checks and messages, prefixed with the optimizer's `name`: TypeError for a value
    that is not a real number or betas that are not a pair, ValueError for one out of its range."""
    for arg, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(f"{name}: {arg} must be a real number, got {type(value).__name__}")
    if not (
        isinstance(betas, (tuple, list))
        and len(betas) == 2
        and all(isinstance(b, numbers.Real) and not isinstance(b, bool) for b in betas)
    ):
        raise TypeError(f"{name}: betas must be a pair of floats, got {betas!r}")
    if not lr >= 0.0:
        raise ValueError(f"{name}: Invalid learning rate: {lr}")
    if not eps >= 0.0:
        raise ValueError(f"{name}: Invalid epsilon value: {eps}")
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"{name}: Invalid beta parameter at index {i}: {beta}")
    if not weight_decay >= 0.0:
        raise ValueError(f"{name}: Invalid weight_decay value: {weight_decay}")
