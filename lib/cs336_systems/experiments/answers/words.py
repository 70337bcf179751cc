"""Small wording helpers the answer builders share."""

from __future__ import annotations


def and_join(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def pct(x: float, digits: int = 1) -> str:
    """A share as a percentage: 0.545 -> '54.5%'."""
    return f"{100 * x:.{digits}f}%"
