"""The DDP overhead model of `ddp_bucketed_benchmarking` (b), derived with sympy and fitted to measurements.

Gradients of s bytes in total are split into n_b equal buckets. All-reducing one bucket costs a
fixed o seconds per call plus its bytes over the algorithm bandwidth w: o + s/(n_b w). Assume,
as the handout does, that computing a bucket's gradients takes as long as transferring it,
tau = s/(n_b w). Bucket k (k = 1..n_b) is ready at k tau; the collectives run one after another
on one stream, and because the stream is exactly as fast as the backward pass delivers bytes,
each call's fixed cost o pushes every later bucket back: bucket k finishes at (k + 1) tau + k o.
The backward pass ends at n_b tau, the last bucket at (n_b + 1) tau + n_b o, so

    overhead(n_b) = s / (n_b w) + n_b o             (only the last transfer, but every call's o, is exposed)

d/dn_b = 0 gives   n_b* = sqrt(s / (w o)),   bucket size b* = s / n_b* = sqrt(s w o),
and the least overhead  2 sqrt(s o / w).   At n_b = 1 the model is s/w + o: nothing overlaps.

The fit: overhead = o * n_b + (1/w) * (s / n_b) is linear in (o, 1/w), so numpy least squares
over the measured (n_b, overhead) points gives both; a coefficient that comes out negative
(noise) is clamped to zero and the other refitted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sympy as sp

s, w, o, n_b = sp.symbols("s w o n_b", positive=True)


def derive() -> dict[str, sp.Expr]:
    """The overhead, the optimal bucket count and size, and the least overhead, as sympy expressions."""
    overhead = s / (n_b * w) + n_b * o
    (n_opt,) = sp.solve(sp.diff(overhead, n_b), n_b)
    return dict(
        overhead=overhead,
        optimal_buckets=n_opt,
        optimal_bucket_bytes=sp.simplify(s / n_opt),
        least_overhead=sp.simplify(overhead.subs(n_b, n_opt)),
    )


def latex_equations() -> str:
    """The derivation's results as display-math Markdown."""
    e = derive()
    return "\n".join(
        f"$$ {lhs} = {sp.latex(e[key])} $$"
        for lhs, key in (
            (r"\mathrm{overhead}(n_b)", "overhead"),
            (r"n_b^\ast", "optimal_buckets"),
            (r"b^\ast = s / n_b^\ast", "optimal_bucket_bytes"),
            (r"\mathrm{overhead}(n_b^\ast)", "least_overhead"),
        )
    )


@dataclass(frozen=True)
class OverheadFit:
    per_call_s: float  # o
    bandwidth_bytes_per_s: float  # w (inf when the fit attributes nothing to bandwidth)
    model_bytes: float  # s
    rms_error_s: float
    r_squared: float  # share of the overheads' variance the model explains

    def predict(self, buckets) -> np.ndarray:
        nb = np.asarray(buckets, dtype=float)
        return self.model_bytes / (nb * self.bandwidth_bytes_per_s) + nb * self.per_call_s

    @property
    def optimal_buckets(self) -> float:
        if self.per_call_s == 0:
            return float("inf")
        return float(np.sqrt(self.model_bytes / (self.bandwidth_bytes_per_s * self.per_call_s)))

    @property
    def optimal_bucket_bytes(self) -> float:
        return self.model_bytes / self.optimal_buckets


def fit_overhead(buckets, overhead_s, model_bytes: float) -> OverheadFit:
    """Least-squares (o, w) of overhead = s/(n_b w) + n_b o over the measured points."""
    nb = np.asarray(buckets, dtype=float)
    y = np.asarray(overhead_s, dtype=float)
    if nb.shape != y.shape or nb.size < 2:
        raise ValueError(f"need at least two (buckets, overhead) points of equal length, got {nb.size} and {y.size}")
    if (nb < 1).any():
        raise ValueError(f"bucket counts must be at least 1, got {nb.tolist()}")
    design = np.column_stack([nb, model_bytes / nb])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    if (coef < 0).any():
        keep = int(np.argmax(coef))
        only, *_ = np.linalg.lstsq(design[:, [keep]], y, rcond=None)
        coef = np.zeros(2)
        coef[keep] = max(float(only[0]), 0.0)
    per_call, inverse_bw = coef
    residual = y - design @ coef
    return OverheadFit(
        per_call_s=float(per_call),
        bandwidth_bytes_per_s=float(1 / inverse_bw) if inverse_bw > 0 else float("inf"),
        model_bytes=float(model_bytes),
        rms_error_s=float(np.sqrt(np.mean(residual**2))),
        r_squared=float(1 - np.sum(residual**2) / np.sum((y - y.mean()) ** 2)) if np.ptp(y) > 0 else 1.0,
    )


def plot_overhead_fit(fit: OverheadFit, points: dict[str, tuple[float, float]]):
    """Measured overhead (ms) per labelled point (n_b, seconds) and the fitted model curve."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    counts = [n for n, _ in points.values()]
    grid = np.geomspace(1, max(max(counts), 2) * 2, 200)
    ax.plot(grid, fit.predict(grid) * 1e3, color="black", label="model s/(n_b w) + n_b o (fitted)")
    for i, (label, (n, seconds)) in enumerate(points.items()):
        ax.scatter([n], [seconds * 1e3], color=f"C{i}", zorder=3)
        ax.annotate(label, (n, seconds * 1e3), textcoords="offset points", xytext=(5, 5), fontsize=8)
    if np.isfinite(fit.optimal_buckets):
        best = fit.optimal_buckets
        ax.axvline(best, color="grey", linestyle=":", label=f"optimum n_b* = {best:.1f}")
    ax.set(xscale="log", xlabel="number of buckets n_b", ylabel="overhead beyond no-communication (ms)")
    ax.legend(fontsize=8)
    return fig
