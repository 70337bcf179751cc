"""Every answer of the spring 2026 §8 problems, as a formula and as a number, from the same functions.

Each row calls one function of `rings.py` / `parallelism.py` twice: with sympy symbols (the formula the
deliverable asks for) and with an example (B, D, D_FF, N, C, W) (the number). `answers_markdown`
renders one problem's rows as display math for the notebook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pandas as pd
import sympy as sp

from cs336_systems.accounting import parallelism as par
from cs336_systems.accounting import rings
from cs336_systems.accounting.symbolic import evaluate

S, N = sp.symbols("S N", positive=True)


@dataclass(frozen=True)
class Example:
    """The numbers the formulas are evaluated at."""

    batch: float  # B, tokens
    d_model: int
    d_ff: int
    n_devices: int  # N of the ring collectives and of the per-device DP, FSDP and TP quantities
    n_fsdp: int  # the grid of the per-device FSDP × TP quantities
    n_tp: int
    flops_per_s: float  # C
    bandwidth: float  # W, egress bytes/s
    ring_bytes: float  # S of the ring collectives


def _answer(problem: str, part: str, quantity: str, lhs: str, unit: str, f: Callable, **args) -> dict:
    """A row: f at the symbols and at the numbers of `args` (name=(symbol, number))."""
    formula = f(**{name: symbol for name, (symbol, _) in args.items()})
    value = f(**{name: number for name, (_, number) in args.items()})
    is_limit = unit == "devices"  # the limits keep the form parallelism.py gives them (1 + BW/C, products)
    return dict(
        problem=problem,
        part=part,
        quantity=quantity,
        lhs=lhs,
        relation=r"\le" if is_limit else "=",
        formula=formula if is_limit else evaluate(formula, form=_tidy),
        value=float(value),
        unit=unit,
    )


def _max(a, b):
    return max(a, b) if sp.sympify(a - b).is_number else sp.Max(a, b)


def _tidy(expr: sp.Expr) -> sp.Expr:
    """Factored, term by term inside a max (factor would expand the max's arguments)."""
    return sp.Max(*map(sp.factor, expr.args)) if isinstance(expr, sp.Max) else sp.factor(expr)


def parallelism_answers(ex: Example) -> pd.DataFrame:
    """One row per deliverable of alternate_ring_all_reduce, data_parallel_calcs, fsdp_calcs, tp_calcs
    and fsdp_tp_calcs: the formula (sympy) and its value at the example."""
    b, d, d_ff = (par.B, ex.batch), (par.D, ex.d_model), (par.D_FF, ex.d_ff)
    c, w = (par.C, ex.flops_per_s), (par.W, ex.bandwidth)
    ffn, hw = dict(batch=b, d_model=d, d_ff=d_ff), dict(flops_per_s=c, bandwidth=w)
    ring = dict(size_bytes=(S, ex.ring_bytes), n=(N, ex.n_devices), bandwidth=w)
    n_dp, n_fsdp, n_tp = (par.N_DP, ex.n_devices), (par.N_FSDP, ex.n_devices), (par.N_TP, ex.n_devices)
    grid = dict(ffn, n_fsdp=(par.N_FSDP, ex.n_fsdp), n_tp=(par.N_TP, ex.n_tp))
    forward, backward = dict(backward=False), dict(backward=True)
    flops, comm, limit = r"\mathrm{FLOPs}", r"T_{\mathrm{comm}}", "largest N before communication bound"
    rows = [
        _answer(
            "alternate_ring_all_reduce",
            "",
            "time",
            r"T_{\mathrm{alt}}",
            "s",
            rings.alternate_ring_all_reduce_time,
            **ring,
        ),
        _answer(
            "alternate_ring_all_reduce",
            "",
            "over the ring all-reduce",
            r"T_{\mathrm{alt}} / T_{\mathrm{ring}}",
            "×",
            lambda **a: rings.alternate_ring_all_reduce_time(**a) / rings.ring_all_reduce_time(**a),
            **ring,
        ),
        _answer("data_parallel_calcs", "a", "backward FLOPs per device", flops, "FLOP", par.dp_flops, **ffn, n_dp=n_dp),
        _answer(
            "data_parallel_calcs",
            "b",
            "backward communication time",
            comm,
            "s",
            par.dp_backward_comm_time,
            d_model=d,
            d_ff=d_ff,
            n_dp=n_dp,
            bandwidth=w,
        ),
        _answer("data_parallel_calcs", "c", limit, "N_{DP}", "devices", par.dp_max_devices, **ffn, **hw),
    ]
    for name, kw in [("backward", backward), ("forward", forward)]:
        rows += [
            _answer(
                "fsdp_calcs",
                "a",
                f"{name} FLOPs per device",
                flops,
                "FLOP",
                partial(par.fsdp_flops, **kw),
                **ffn,
                n_fsdp=n_fsdp,
            ),
            _answer(
                "fsdp_calcs",
                "b",
                f"{name} communication time",
                comm,
                "s",
                partial(par.fsdp_comm_time, **kw),
                d_model=d,
                d_ff=d_ff,
                n_fsdp=n_fsdp,
                bandwidth=w,
            ),
            _answer(
                "fsdp_calcs",
                "c",
                f"{limit} ({name})",
                "N_{FSDP}",
                "devices",
                partial(par.fsdp_max_devices, **kw),
                **ffn,
                **hw,
            ),
        ]
    for name, kw in [("forward", forward), ("backward", backward)]:
        rows += [
            _answer(
                "tp_calcs",
                "b",
                f"{name} FLOPs per device",
                flops,
                "FLOP",
                partial(par.tp_flops, **kw),
                **ffn,
                n_tp=n_tp,
            ),
            _answer(
                "tp_calcs",
                "c",
                f"{name} communication time",
                comm,
                "s",
                par.tp_comm_time,
                batch=b,
                d_model=d,
                n_tp=n_tp,
                bandwidth=w,
            ),
        ]
    for name, kw in [("backward", backward), ("forward", forward)]:
        rows.append(
            _answer(
                "tp_calcs",
                "d",
                f"{limit} ({name})",
                "N_{TP}",
                "devices",
                partial(par.tp_max_devices, **kw),
                **ffn,
                **hw,
            )
        )
    rows += [
        _answer("fsdp_tp_calcs", "a", "forward FLOPs per device", flops, "FLOP", par.fsdp_tp_forward_flops, **grid),
        _answer(
            "fsdp_tp_calcs",
            "b",
            "forward communication time, axes overlapped",
            comm,
            "s",
            lambda **a: _max(*par.fsdp_tp_forward_comm_times(**a)),
            **grid,
            bandwidth=w,
        ),
        _answer(
            "fsdp_tp_calcs",
            "c",
            f"{limit}, axes overlapped",
            "N",
            "devices",
            lambda **a: par.fsdp_tp_max_devices_overlapped(**a)[2],
            **ffn,
            **hw,
        ),
        _answer(
            "fsdp_tp_calcs",
            "d",
            f"{limit}, axes sharing the network",
            "N",
            "devices",
            lambda **a: par.fsdp_tp_max_devices_shared(**a)[2],
            **ffn,
            **hw,
        ),
    ]
    return pd.DataFrame(rows)


def answers_markdown(answers: pd.DataFrame, problem: str) -> str:
    """One problem's rows as Markdown: part, quantity, display math, and the value at the example."""
    lines = []
    for row in answers[answers.problem == problem].sort_values("part", kind="stable").itertuples():
        part = f"**({row.part})** " if row.part else ""
        value, unit = (row.value * 1e3, "ms") if row.unit == "s" else (row.value, row.unit)
        lines.append(
            f"{part}{row.quantity}: $$ {row.lhs} {row.relation} {sp.latex(row.formula)} "
            rf"\qquad \left(= {_format(value)}\ \text{{{unit} at the example}}\right) $$"
        )
    return "\n\n".join(lines)


def _format(value: float) -> str:
    """Four significant digits, thousands grouped (LaTeX-safe), scientific notation past a million."""
    if abs(value) >= 1e6:
        return sp.latex(sp.Float(value, 4))
    return f"{value:,.4g}".replace(",", "{,}") if abs(value) < 1e4 else f"{value:,.0f}".replace(",", "{,}")
