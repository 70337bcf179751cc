"""Small wording helpers the answer builders share."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd


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
    """A ratio that still reads when it is small or large: 0.0025×, 0.93×, 12.3×, 684×; '–' when not measured."""
    if x != x or x <= 0:
        return "–"
    if x < 0.1:
        return f"{x:.2g}×"
    if x < 10:
        return f"{x:.2f}×"
    if x < 100:
        return f"{x:.1f}×"
    return f"{x:,.0f}×"


def span(values, fmt: str | Callable[[float], str] = "{:.2f}", unit: str = "") -> str:
    """'a–b' over `values` (NaN dropped), 'a' when both ends print the same, '–' when none is left. `fmt` is a
    format string or a function (`times`: 'a–b×', the sign once)."""
    v = pd.Series(values, dtype=float).dropna()
    if v.empty:
        return "–"
    text = fmt if callable(fmt) else fmt.format
    lo, hi = text(v.min()), text(v.max())
    if lo == hi:
        return f"{lo}{unit}"
    if lo.endswith("×") and hi.endswith("×"):
        lo = lo[:-1]
    return f"{lo}–{hi}{unit}"


def times_span(values) -> str:
    """`span` of ratios: '0.77–2.52×'."""
    return span(values, fmt=times)
