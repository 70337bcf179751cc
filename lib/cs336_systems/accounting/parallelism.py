"""FLOPs, communication time and device-count limits of one FFN under DP, FSDP, TP and FSDP×TP.

The setting of the spring 2026 handout, §8: the FFN

    x1 = x W1,  x2 = x W2,  z = f(x1) * x2,  y = z W3,     x: (B, D), W1, W2: (D, D_FF), W3: (D_FF, D)

with FP16 weights, activations and gradients (2 bytes), devices of C FLOP/s with W bytes/s of egress
bandwidth, and ring collectives (`rings.py`). Counting matmuls only, (m, k)(k, n) costs 2mkn:

    forward   3 matmuls  →  6 B D D_FF
    backward  6 matmuls  →  12 B D D_FF    (dz = dy W3ᵀ; dx = dx1 W1ᵀ + dx2 W2ᵀ; dW3, dW2, dW1)

A strategy is compute bound while T_comm ≤ T_compute = FLOPs / C (the two overlap). Every time below
is plain arithmetic, so it takes numbers or sympy symbols; the limits on N are not typed in but
solved by sympy from the same time functions (`largest_devices`), and evaluated at the numbers given.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
import sympy as sp

from cs336_systems.accounting.rings import ring_all_gather_time, ring_all_reduce_time, ring_reduce_scatter_time
from cs336_systems.accounting.symbolic import Quantity, crossing, evaluate

BYTES_PER_VALUE = 2  # §8 keeps weights, activations and gradients in FP16

# The symbols the formulas are shown with.
B, D, D_FF, C, W = sp.symbols("B D D_FF C W", positive=True)
N_DP, N_FSDP, N_TP = sp.symbols("N_DP N_FSDP N_TP", positive=True)


def ffn_forward_flops(batch: Quantity, d_model: Quantity, d_ff: Quantity) -> Quantity:
    """6 B D D_FF: x W1 and x W2, (B, D)(D, D_FF), and z W3, (B, D_FF)(D_FF, D), at 2BDD_FF each."""
    return 3 * 2 * batch * d_model * d_ff


def ffn_backward_flops(batch: Quantity, d_model: Quantity, d_ff: Quantity) -> Quantity:
    """12 B D D_FF: dz = dy W3ᵀ, dx1 W1ᵀ, dx2 W2ᵀ, dW3 = zᵀdy, dW2 = xᵀdx2, dW1 = xᵀdx1, 2BDD_FF each."""
    return 6 * 2 * batch * d_model * d_ff


def ffn_weight_bytes(d_model: Quantity, d_ff: Quantity) -> Quantity:
    """3 D D_FF values of W1, W2, W3, in FP16 (the size of the weights and of their gradients)."""
    return 3 * d_model * d_ff * BYTES_PER_VALUE


# --- data parallel: the batch is split, the weights are replicated, the gradients all-reduced


def dp_flops(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    n_dp: Quantity,
    backward: bool = True,
) -> Quantity:
    """Per device: the FFN on B/N_DP rows, 12 B D D_FF / N_DP backward (6 B D D_FF / N_DP forward)."""
    flops = ffn_backward_flops if backward else ffn_forward_flops
    return flops(batch / n_dp, d_model, d_ff)


def dp_backward_comm_time(d_model: Quantity, d_ff: Quantity, n_dp: Quantity, bandwidth: Quantity) -> Quantity:
    """Ring all-reduce of the 6 D D_FF bytes of dW1, dW2, dW3: 2 (N_DP−1)/N_DP · 6 D D_FF / W."""
    return ring_all_reduce_time(ffn_weight_bytes(d_model, d_ff), n_dp, bandwidth)


# --- FSDP: the batch is split and so are the weights; gather them before use, reduce-scatter the gradients


def fsdp_flops(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    n_fsdp: Quantity,
    backward: bool = True,
) -> Quantity:
    """Per device the same as DP: 12 B D D_FF / N_FSDP backward, 6 B D D_FF / N_FSDP forward."""
    return dp_flops(batch, d_model, d_ff, n_fsdp, backward)


def fsdp_comm_time(
    d_model: Quantity,
    d_ff: Quantity,
    n_fsdp: Quantity,
    bandwidth: Quantity,
    backward: bool = True,
) -> Quantity:
    """Forward: all-gather W1, W2, W3, (N−1)/N · 6 D D_FF / W.
    Backward: all-gather them again and reduce-scatter dW1, dW2, dW3, 2 (N−1)/N · 6 D D_FF / W."""
    weights = ffn_weight_bytes(d_model, d_ff)
    gather = ring_all_gather_time(weights, n_fsdp, bandwidth)
    return gather + ring_reduce_scatter_time(weights, n_fsdp, bandwidth) if backward else gather


# --- TP: W1, W2 split by output column, W3 by input row; every device sees the whole batch


def tp_flops(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    n_tp: Quantity,
    backward: bool = True,
) -> Quantity:
    """Per device: the FFN with D_FF / N_TP hidden units, 12 B D D_FF / N_TP backward (6 forward)."""
    flops = ffn_backward_flops if backward else ffn_forward_flops
    return flops(batch, d_model, d_ff / n_tp)


def tp_comm_time(batch: Quantity, d_model: Quantity, n_tp: Quantity, bandwidth: Quantity) -> Quantity:
    """One all-reduce of a (B, D) activation in either pass (y forward, dx backward):
    2 (N_TP−1)/N_TP · 2 B D / W."""
    return ring_all_reduce_time(batch * d_model * BYTES_PER_VALUE, n_tp, bandwidth)


# --- FSDP × TP on an N_FSDP × N_TP grid, forward pass (eqs. 52–59)


def fsdp_tp_forward_flops(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    n_fsdp: Quantity,
    n_tp: Quantity,
) -> Quantity:
    """6 B D D_FF / (N_FSDP N_TP): B / N_FSDP rows through D_FF / N_TP hidden units."""
    return ffn_forward_flops(batch / n_fsdp, d_model, d_ff / n_tp)


def fsdp_tp_forward_comm_times(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    n_fsdp: Quantity,
    n_tp: Quantity,
    bandwidth: Quantity,
) -> tuple[Quantity, Quantity]:
    """(FSDP axis, TP axis) times of the forward pass:
    all-gather of the TP shards of W1, W2, W3 over N_FSDP devices, (N_FSDP−1)/N_FSDP · 6 D D_FF / (N_TP W);
    all-reduce of y^(i,j), (B / N_FSDP, D), over N_TP devices, 2 (N_TP−1)/N_TP · 2 B D / (N_FSDP W)."""
    fsdp = ring_all_gather_time(ffn_weight_bytes(d_model, d_ff) / n_tp, n_fsdp, bandwidth)
    tp = ring_all_reduce_time(batch / n_fsdp * d_model * BYTES_PER_VALUE, n_tp, bandwidth)
    return fsdp, tp


# --- limits on the number of devices


def largest_devices(
    compute_time: Callable[[sp.Symbol], Quantity],
    comm_time: Callable[[sp.Symbol], Quantity],
) -> Quantity:
    """The N at which comm_time(N) = compute_time(N).

    For every strategy here T_comm / T_compute grows with N (compute ∝ 1/N, comm ∝ (N−1)/N), so the
    strategy stays compute bound exactly for N ≤ this value.
    """
    return crossing(compute_time, comm_time, "N")


def dp_max_devices(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    flops_per_s: Quantity,
    bandwidth: Quantity,
) -> Quantity:
    """Backward: 12 B D D_FF / (N C) ≥ 12 (N−1) D D_FF / (N W)  ⇔  N_DP ≤ 1 + B W / C."""
    return largest_devices(
        lambda n: dp_flops(batch, d_model, d_ff, n) / flops_per_s,
        lambda n: dp_backward_comm_time(d_model, d_ff, n, bandwidth),
    )


def fsdp_max_devices(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    flops_per_s: Quantity,
    bandwidth: Quantity,
    backward: bool = True,
) -> Quantity:
    """Both passes: N_FSDP ≤ 1 + B W / C (backward doubles compute and communication alike)."""
    return largest_devices(
        lambda n: fsdp_flops(batch, d_model, d_ff, n, backward) / flops_per_s,
        lambda n: fsdp_comm_time(d_model, d_ff, n, bandwidth, backward),
    )


def tp_max_devices(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    flops_per_s: Quantity,
    bandwidth: Quantity,
    backward: bool = True,
) -> Quantity:
    """Backward: N_TP ≤ 1 + 3 D_FF W / C; forward (half the FLOPs, same all-reduce): N_TP ≤ 1 + 3 D_FF W / (2C)."""
    return largest_devices(
        lambda n: tp_flops(batch, d_model, d_ff, n, backward) / flops_per_s,
        lambda n: tp_comm_time(batch, d_model, n, bandwidth),
    )


def fsdp_tp_max_devices_overlapped(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    flops_per_s: Quantity,
    bandwidth: Quantity,
) -> tuple[Quantity, Quantity, Quantity]:
    """Collectives of the two axes overlap, so T_comm = max(T_FSDP, T_TP) and each axis has its own limit:
    N_FSDP ≤ 1 + B W / C  (FSDP terms: the N_TP cancels),  N_TP ≤ 1 + 3 D_FF W / (2C)  (the N_FSDP cancels).
    Returns (N_FSDP, N_TP, N = N_FSDP N_TP), each at its limit."""

    def compute(f: Quantity, t: Quantity) -> Quantity:
        return fsdp_tp_forward_flops(batch, d_model, d_ff, f, t) / flops_per_s

    def comms(f: Quantity, t: Quantity) -> tuple[Quantity, Quantity]:
        return fsdp_tp_forward_comm_times(batch, d_model, d_ff, f, t, bandwidth)

    n_fsdp = largest_devices(lambda f: compute(f, N_TP), lambda f: comms(f, N_TP)[0])
    n_tp = largest_devices(lambda t: compute(N_FSDP, t), lambda t: comms(N_FSDP, t)[1])
    return n_fsdp, n_tp, evaluate(n_fsdp * n_tp, form=sp.factor)


def _shared_slack(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    flops_per_s: Quantity,
    bandwidth: Quantity,
    f: sp.Symbol,
    t: sp.Symbol,
) -> sp.Expr:
    """(T_compute − T_FSDP − T_TP) · N_FSDP N_TP: linear in N_FSDP and N_TP, ≥ 0 while compute bound."""
    compute = fsdp_tp_forward_flops(batch, d_model, d_ff, f, t) / flops_per_s
    comm = sum(fsdp_tp_forward_comm_times(batch, d_model, d_ff, f, t, bandwidth))
    return sp.expand(sp.cancel((compute - comm) * f * t))


def fsdp_tp_max_devices_shared(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    flops_per_s: Quantity,
    bandwidth: Quantity,
) -> tuple[Quantity, Quantity, Quantity]:
    """Collectives of the two axes share the network, so T_FSDP + T_TP ≤ T_compute. Times N_FSDP N_TP W / (2D):

        3 D_FF (N_FSDP − 1) + 2 B (N_TP − 1) ≤ 3 B D_FF W / C,

    a linear budget; N_FSDP N_TP is largest where the two terms are equal (Lagrange), so
    N ≤ (3 B D_FF W / C + 3 D_FF + 2 B)² / (24 B D_FF). Returns (N_FSDP, N_TP, N) at that optimum."""
    f, t = sp.symbols("f t", positive=True)
    lam = sp.Symbol("lambda")
    slack = _shared_slack(batch, d_model, d_ff, flops_per_s, bandwidth, f, t)
    stationary = [t - lam * sp.diff(slack, f), f - lam * sp.diff(slack, t), slack]  # ∇(f t) = λ ∇slack, slack = 0
    solutions = sp.solve(stationary, [f, t, lam], dict=True, rational=False)
    if len(solutions) != 1:
        raise ValueError(f"expected one optimum of N_FSDP N_TP, got {solutions}")
    n_fsdp, n_tp = solutions[0][f], solutions[0][t]
    return evaluate(n_fsdp), evaluate(n_tp), evaluate(n_fsdp * n_tp, form=sp.factor)


def _whole(limit: float) -> int:
    """The largest integer at or below a limit computed in floating point (N = limit is still compute bound)."""
    return math.floor(limit * (1 + 1e-12))


def fsdp_tp_split_table(batch: float, d_model: int, d_ff: int, flops_per_s: float, bandwidth: float) -> pd.DataFrame:
    """For every integer N_TP up to the TP-axis limit: the largest integer N_FSDP, and N = N_FSDP N_TP,
    when the collectives of the two axes overlap and when they share the network.

    Shared, the slack is linear in N_FSDP at a fixed N_TP, so its root in N_FSDP is the limit."""
    n_fsdp_limit, n_tp_limit, _ = fsdp_tp_max_devices_overlapped(batch, d_model, d_ff, flops_per_s, bandwidth)
    f, t = sp.symbols("f t", positive=True)
    shared_limit = sp.solve(_shared_slack(batch, d_model, d_ff, flops_per_s, bandwidth, f, t), f, rational=False)[0]
    rows = []
    for n_tp in range(1, _whole(n_tp_limit) + 1):
        overlapped, shared = _whole(n_fsdp_limit), max(_whole(float(shared_limit.subs(t, n_tp))), 0)
        rows.append(
            dict(
                n_tp=n_tp,
                n_fsdp_overlapped=overlapped,
                n_overlapped=overlapped * n_tp,
                n_fsdp_shared=shared,
                n_shared=shared * n_tp,
            )
        )
    return pd.DataFrame(rows)


def best_fsdp_tp_split(
    batch: float,
    d_model: int,
    d_ff: int,
    flops_per_s: float,
    bandwidth: float,
    overlapped: bool = True,
) -> dict[str, int]:
    """The integer grid (N_FSDP, N_TP) with the most devices whose forward pass stays compute bound
    (ties go to the larger N_TP)."""
    kind = "overlapped" if overlapped else "shared"
    table = fsdp_tp_split_table(batch, d_model, d_ff, flops_per_s, bandwidth)
    best = table.sort_values([f"n_{kind}", "n_tp"]).iloc[-1]
    return dict(n_fsdp=int(best[f"n_fsdp_{kind}"]), n_tp=int(best["n_tp"]), n=int(best[f"n_{kind}"]))


def leading_term(limit: sp.Expr) -> sp.Expr:
    """k (W/C)^p, the leading term of a device limit when bandwidth is plentiful next to compute (W/C → ∞):
    every (N−1)/N is then ≈ 1 and the additive 1s and mixed terms drop out."""
    x = sp.Symbol("x", positive=True)
    scaled = sp.sympify(limit).subs(W, x * W)
    order = sp.limit(sp.log(scaled) / sp.log(x), x, sp.oo)
    return sp.simplify(sp.limit(scaled / x**order, x, sp.oo))
