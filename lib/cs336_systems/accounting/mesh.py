"""When is the forward pass of an FFN block compute bound on an X (FSDP) × Y (TP) TPU mesh?

Notation of the TPU Scaling Book (Austin et al., 2025, part 5, "FSDP + tensor parallelism"): B tokens
in the global batch, D = d_model, F = d_ff, N = X Y chips of C FLOP/s, W_ici bytes/s of
bidirectional bandwidth per link, and an all-gather or reduce-scatter of V bytes over a mesh axis
that spans M hardware axes takes V / (M W_ici). Per block (W_in: D × F, W_out: F × D), with weights
and activations in `bytes_per_value` bytes (2 for BF16):

    T_math = 2 · 2 B D F / (N C)                   two matmuls, B/X tokens × F/Y units per chip
    T_FSDP = 2 · bytes · D F / (Y M_X W_ici)       all-gather both weights' Y-shards over X
    T_TP   = 2 · bytes · B D / (X M_Y W_ici)       all-gather the input, reduce-scatter the output over Y

It is compute bound when T_math ≥ max(T_FSDP, T_TP): the FSDP term needs B ≥ X · (bytes/2) · C / (M_X W_ici)
(a batch condition), the TP term needs Y ≤ M_Y F W_ici / C (independent of the batch). Plain
arithmetic again: numbers or sympy symbols.
"""

from __future__ import annotations

import math

import pandas as pd
import sympy as sp

from cs336_systems.accounting.symbolic import Quantity, crossing, evaluate


def mesh_forward_times(
    batch: Quantity,
    d_model: Quantity,
    d_ff: Quantity,
    x: Quantity,
    y: Quantity,
    flops_per_s: Quantity,
    w_ici: Quantity,
    m_x: Quantity,
    m_y: Quantity,
    bytes_per_value: Quantity = 2,
) -> dict[str, Quantity]:
    """T_math, T_FSDP and T_TP of one block's forward pass (see the module docstring)."""
    return dict(
        math=2 * 2 * batch * d_model * d_ff / (x * y * flops_per_s),
        fsdp=2 * bytes_per_value * d_model * d_ff / (y * m_x * w_ici),
        tp=2 * bytes_per_value * batch * d_model / (x * m_y * w_ici),
    )


def mesh_min_batch(
    d_model: Quantity,
    d_ff: Quantity,
    x: Quantity,
    y: Quantity,
    flops_per_s: Quantity,
    w_ici: Quantity,
    m_x: Quantity,
    m_y: Quantity,
    bytes_per_value: Quantity = 2,
) -> Quantity:
    """Smallest global batch B (tokens) with T_math ≥ T_FSDP, solved by sympy: B = X (bytes/2) C / (M_X W_ici)."""

    def times(b: sp.Symbol) -> dict[str, Quantity]:
        return mesh_forward_times(b, d_model, d_ff, x, y, flops_per_s, w_ici, m_x, m_y, bytes_per_value)

    return crossing(lambda b: times(b)["math"], lambda b: times(b)["fsdp"], "B", form=sp.simplify)


def mesh_max_tp(
    d_ff: Quantity,
    flops_per_s: Quantity,
    w_ici: Quantity,
    m_y: Quantity,
    bytes_per_value: Quantity = 2,
) -> Quantity:
    """Largest Y with T_math ≥ T_TP (the batch cancels), solved by sympy: Y = M_Y F W_ici (2/bytes) / C."""
    b, d, x = sp.symbols("B D X", positive=True)

    def times(y: sp.Symbol) -> dict[str, Quantity]:
        return mesh_forward_times(b, d, d_ff, x, y, flops_per_s, w_ici, 1, m_y, bytes_per_value)

    return crossing(lambda y: times(y)["math"], lambda y: times(y)["tp"], "Y", form=sp.simplify)


def mesh_best_split(
    n: Quantity,
    d_ff: Quantity,
    flops_per_s: Quantity,
    w_ici: Quantity,
    m_x: Quantity,
    m_y: Quantity,
    bytes_per_value: Quantity = 2,
) -> dict[str, Quantity]:
    """The X × Y = N split with the smallest compute-bound batch, the Scaling Book's optimum:
    the batch grows with X, so take the largest Y the TP condition allows, Y* = mesh_max_tp, X* = N / Y*,
    and B* = X* (bytes/2) C / (M_X W_ici) = N (bytes/2)² C² / (M_X M_Y F W_ici²)  (X, Y real-valued)."""
    y = mesh_max_tp(d_ff, flops_per_s, w_ici, m_y, bytes_per_value)
    x = evaluate(sp.sympify(n) / y, form=sp.simplify)
    batch = mesh_min_batch(sp.Symbol("D", positive=True), d_ff, x, y, flops_per_s, w_ici, m_x, m_y, bytes_per_value)
    return dict(x=x, y=y, batch=batch)


def mesh_batch_table(d_model: int, d_ff: int, flops_per_s: float, w_ici: float, layouts: list[dict]) -> pd.DataFrame:
    """For each layout (name, x, y, m_x, m_y; optional bytes_per_value = 2, stages = 1): the compute-bound
    global batch, the same per chip, and whether the TP axis is compute bound at all (Y ≤ M_Y F W_ici / C).

    `stages` pipeline stages each run an x × y mesh on their share of the blocks; the batch condition is
    per stage and unchanged, provided a stage keeps its gathered weights across its micro-batches."""
    rows = []
    for layout in layouts:
        layout = dict(bytes_per_value=2, stages=1) | layout
        args = (layout["x"], layout["y"], flops_per_s, w_ici, layout["m_x"], layout["m_y"], layout["bytes_per_value"])
        tp_ok = layout["y"] <= mesh_max_tp(d_ff, flops_per_s, w_ici, layout["m_y"], layout["bytes_per_value"])
        batch = mesh_min_batch(d_model, d_ff, *args) if tp_ok else math.inf
        chips = layout["x"] * layout["y"] * layout["stages"]
        rows.append(
            dict(
                layout=layout["name"],
                X=layout["x"],
                Y=layout["y"],
                stages=layout["stages"],
                chips=chips,
                M_X=layout["m_x"],
                M_Y=layout["m_y"],
                bytes_per_value=layout["bytes_per_value"],
                tp_compute_bound=tp_ok,
                min_global_batch=batch,
                min_batch_per_chip=batch / chips,
            )
        )
    return pd.DataFrame(rows)


def mesh_times_table(
    d_model: int,
    d_ff: int,
    x: int,
    y: int,
    flops_per_s: float,
    w_ici: float,
    m_x: int,
    m_y: int,
    batches: list[float],
    bytes_per_value: int = 2,
) -> pd.DataFrame:
    """T_math, T_FSDP and T_TP of one block's forward pass (seconds) for each global batch (tokens)."""
    return pd.DataFrame(
        [
            dict(batch=b, **mesh_forward_times(b, d_model, d_ff, x, y, flops_per_s, w_ici, m_x, m_y, bytes_per_value))
            for b in batches
        ]
    )
