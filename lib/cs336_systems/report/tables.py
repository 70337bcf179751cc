"""Small table helpers shared by the notebooks."""

from __future__ import annotations

import pandas as pd


def fmt_ms(ms: float) -> str:
    """Milliseconds with sensible precision (0.123 ms, 12.3 ms, 1,234 ms)."""
    if ms != ms:  # NaN
        return "–"
    if ms < 1:
        return f"{ms:.3f} ms"
    if ms < 100:
        return f"{ms:.2f} ms"
    return f"{ms:,.0f} ms"


def timing_pivot(df: pd.DataFrame, index: str | list[str], order: list | None = None) -> pd.DataFrame:
    """One row per `index`: mean and std per mode, and backward = (forward+backward) − forward."""
    ok = df[df.status == "ok"]
    wide = ok.pivot_table(index=index, columns="mode", values=["mean_ms", "std_ms"], aggfunc="first")
    wide.columns = [f"{mode}_{stat}" for stat, mode in wide.columns]
    wide = wide.reindex(df[index].drop_duplicates() if isinstance(index, str) else None)
    if "forward_mean_ms" in wide and "forward-backward_mean_ms" in wide:
        wide["backward_ms"] = wide["forward-backward_mean_ms"] - wide["forward_mean_ms"]
    wide = wide.reset_index()
    if order is not None and isinstance(index, str):
        wide[index] = pd.Categorical(wide[index], order, ordered=True)
        wide = wide.sort_values(index)
        wide[index] = wide[index].astype(str)
    cols = [
        c
        for c in [
            "forward_mean_ms",
            "forward_std_ms",
            "forward-backward_mean_ms",
            "forward-backward_std_ms",
            "backward_ms",
            "train-step_mean_ms",
            "train-step_std_ms",
        ]
        if c in wide
    ]
    return wide[[*([index] if isinstance(index, str) else index), *cols]]
