"""One formula, two uses: cost functions written as plain arithmetic take numbers or sympy symbols.

`crossing` solves where two such functions meet (compute time = communication time, memory =
capacity, ...) with sympy, so a limit is derived from the cost functions instead of typed in a
second time; `evaluate` turns a fully numeric result into a float and leaves a symbolic one as an
expression for the notebooks to print.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy as sp

Quantity = int | float | sp.Expr  # a number, or a sympy expression when the formula itself is wanted


def evaluate(expr, form: Callable[[sp.Expr], sp.Expr] = sp.expand):
    """A float when every symbol was given a number, else the sympy expression in the given form."""
    expr = sp.sympify(expr)
    return float(expr) if expr.is_number else form(expr)


def crossing(left: Callable, right: Callable, name: str = "N", form: Callable[[sp.Expr], sp.Expr] = sp.expand):
    """The positive v with left(v) = right(v), solved by sympy; a ValueError unless there is exactly one."""
    v = sp.Symbol(name, positive=True)
    roots = sp.solve(sp.Eq(left(v), right(v)), v, rational=False)
    if len(roots) != 1:
        raise ValueError(f"expected one positive solution for {name}, got {roots}")
    return evaluate(roots[0], form)


def latex_equation(lhs: str, rhs, relation: str = "=") -> str:
    """Markdown display math `lhs relation rhs`, the right side rendered by sympy."""
    return f"$$ {lhs} {relation} {sp.latex(sp.sympify(rhs))} $$"


def positive_fraction(expr) -> sp.Expr:
    """p/q printed with both signs flipped when sympy's canonical form leads with minus signs,
    e.g. (−A − 2S)/(A − 2M) as (A + 2S)/(2M − A); the value is unchanged."""
    num, den = sp.fraction(sp.factor(expr))
    if sp.expand(num).could_extract_minus_sign():
        num, den = sp.expand(-num), sp.expand(-den)
    return sp.Mul(num, sp.Pow(den, -1, evaluate=False), evaluate=False)
