"""Small wording helpers the answer builders share."""

from __future__ import annotations


def and_join(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def pct(x: float, digits: int = 1) -> str:
    """A share as a percentage: 0.545 -> '54.5%'."""
    return f"{100 * x:.{digits}f}%"


# The harness's modes in prose.
MODE_WORDS = {"forward": "forward", "forward-backward": "forward+backward", "train-step": "training step"}


def times(x: float) -> str:
    """A ratio that still reads when small: 0.0031×, 0.43×, 1.38×, 16×."""
    if x >= 10:
        return f"{x:.0f}×"
    if x >= 0.995:
        return f"{x:.2f}×"
    return f"{x:.2g}×"


def span(values, fmt: str = "{:.2f}", unit: str = "") -> str:
    """'a–b' for a range of values, 'a' when they print the same."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}–{hi}{unit}"
