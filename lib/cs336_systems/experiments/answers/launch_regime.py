"""Sentences on which timed steps are launch-bound, from the launch measurement of a harness table.

`benchmarking.launch_bound` adds to each row of a timing sweep the GPU's busy time in the step and the
step replayed as one CUDA graph; these helpers turn the rows that carry it into prose for the answers of
notebooks 01 and 04 and for the notebooks' own summaries. Rows without it (a run from before the
measurement) give no claim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from cs336_systems.accounting.memory import parameter_count
from cs336_systems.benchmarking.launch_bound import (
    BUSY_MAX,
    GPU_BOUND,
    GRAPH_GAIN_MIN,
    HOST_BOUND,
    LAUNCH_BOUND,
    NOT_MEASURED,
    ON_CPU,
    ON_GPU,
    UNCLEAR,
    with_regime,
)
from cs336_systems.experiments.answers.words import MODE_WORDS, and_join, span, times
from cs336_systems.model import ModelConfig
from cs336_systems.report.tables import fmt_ms


def measured_regimes(raw: pd.DataFrame, on: str = ON_GPU) -> pd.DataFrame | None:
    """The rows of a harness table that ran and carry the launch measurement taken `on` GPU kernels (or CPU
    operators), with their busy fraction, graph speed-up and regime, smallest model first (by parameters: the
    harness's count, else the size table's); None when there are none."""
    if "busy_ms" not in raw or "busy_on" not in raw:
        return None
    d = with_regime(raw)
    d = d[(d["status"] == "ok") & (d["busy_on"] == on) & (d["regime"] != NOT_MEASURED)]
    if d.empty:
        return None
    if "parameters" not in d or d["parameters"].isna().any():
        d = d.assign(parameters=d["size"].map(lambda s: parameter_count(ModelConfig.from_size(s))))
    return d.sort_values(["parameters", "context_length"], kind="stable")


def ms_range(values) -> str:
    """'7.10 ms' or '7.10–65.42 ms'."""
    lo, hi = fmt_ms(min(values)), fmt_ms(max(values))
    return lo if lo == hi else f"{lo.removesuffix(' ms')}–{hi}"


def busy_range(fractions) -> str:
    return span([100 * f for f in fractions], "{:.0f}", "%")


def regime_sentence(
    rows: pd.DataFrame,
    modes: Sequence[str],
    name: Callable[[str], str] = str,
    lead: str = "",
    extra: Sequence[str] = (),
) -> str:
    """One sentence on `rows` (measured_regimes of one context) in `modes`: which steps are launch-bound,
    with the GPU's busy share and the graphed against the eager times, then how many of the others are
    GPU-bound and any whose two measurements disagree or whose graph could not be captured. `lead` opens
    it ('At context 256'); `extra` clauses follow after semicolons. '' when no row is in `modes`."""
    rows = rows[rows["mode"].isin(modes)]
    if rows.empty:
        return ""
    several = "precision" in rows and rows["precision"].nunique() > 1

    def step(precision: str, mode: str) -> str:
        return f"{precision} {MODE_WORDS[mode]}" if several else MODE_WORDS[mode]

    clauses = []
    launch = rows[rows["regime"] == LAUNCH_BOUND]
    for precision in dict.fromkeys(rows["precision"]):
        for mode in modes:
            g = launch[(launch["mode"] == mode) & (launch["precision"] == precision)]
            if len(g):
                clauses.append(
                    f"the {step(precision, mode)} of {and_join([name(s) for s in g['size']])} (the GPU busy "
                    f"{busy_range(g.busy_fraction)}; as one CUDA graph {ms_range(g.graphed_ms)} against "
                    f"{ms_range(g.mean_ms)} eager)"
                )
    opening = f"{lead}, " if lead else ""
    bound = rows[rows["regime"] == GPU_BOUND]
    gpu_bound = (
        f"GPU-bound (the GPU busy {busy_range(bound.busy_fraction)} of the step; as one CUDA graph "
        f"{span(bound.graph_speedup.dropna())}× as fast)"
        if bound.graph_speedup.notna().any()
        else f"GPU-bound (the GPU busy {busy_range(bound.busy_fraction)} of the step)"
    )
    if clauses:
        text = f"{opening}the profiler and CUDA graphs show these steps launch-bound: {and_join(clauses)}"
        if len(bound) and len(bound) == len(rows) - len(launch):
            text += f"; the other {len(bound)} are {gpu_bound}"
        elif len(bound):
            text += f"; {len(bound)} of the {len(rows)} steps are {gpu_bound}"
    else:
        text = (
            f"{opening}no step here is launch-bound (the GPU busy under {BUSY_MAX:.0%} of the step and at least "
            f"{times(GRAPH_GAIN_MIN)} faster as one CUDA graph)"
        )
        if len(bound):
            share = f"all {len(bound)}" if len(bound) == len(rows) else f"{len(bound)} of the {len(rows)}"
            text += f": {share} steps are {gpu_bound}"
    for r in rows[rows["regime"] == UNCLEAR].itertuples():
        text += (
            f"; for the {step(r.precision, r.mode)} of {name(r.size)} the two disagree (the GPU busy "
            f"{r.busy_fraction:.0%}, {times(r.graph_speedup)} faster as a graph)"
        )
    for r in rows[rows["regime"] == HOST_BOUND].itertuples():
        text += (
            f"; the {step(r.precision, r.mode)} of {name(r.size)} leaves the GPU idle (busy {r.busy_fraction:.0%}) "
            f"but was not replayed as a graph ({r.graph_status})"
        )
    text += "".join(f"; {c}" for c in extra)
    return text[0].upper() + text[1:] + "."


def regime_rule() -> str:
    """The criterion of the labels, from the thresholds of `launch_bound`."""
    return (
        f"A step is launch-bound when the GPU is busy less than {BUSY_MAX:.0%} of it (its eager time then "
        f"overstates the GPU's work by more than {times(1 / BUSY_MAX)}) and one CUDA graph runs it at least "
        f"{times(GRAPH_GAIN_MIN)} faster, GPU-bound when the GPU is busy at least {BUSY_MAX:.0%} and the graph gains "
        f"less."
    )


def regime_summary(raw: pd.DataFrame, name: Callable[[str], str] = str) -> str:
    """The notebooks' summary of their launch measurement: one sentence per context on a GPU; on a CPU the
    share of the steps spent inside operators. '' when the table does not carry the measurement."""
    gpu = measured_regimes(raw, ON_GPU)
    if gpu is not None:
        modes = list(dict.fromkeys(gpu["mode"]))
        return " ".join(
            regime_sentence(g, modes, name, lead=f"At context {int(c)}")
            for c, g in gpu.groupby("context_length", sort=True)
        )
    cpu = measured_regimes(raw, ON_CPU)
    if cpu is None:
        return ""
    return (
        f"On the CPU there are no kernel launches to wait for and no CUDA graphs: the {len(cpu)} steps spend "
        f"{busy_range(cpu.busy_fraction)} of their profiled time inside PyTorch's operators, the rest in Python and "
        f"dispatch between them."
    )


def same_steps_elsewhere(
    here: pd.DataFrame, folder: Path, table: str, where: str, name: Callable[[str], str] = str
) -> str:
    """The sentence comparing a launch-bound step timed `here` with the same configuration in another notebook's
    `table` of the same results `folder` (`where`, e.g. 'notebook 01'): the step whose eager times differ most,
    with both graphed times. '' when the other table is absent, carries no measurement, or the eager times of the
    steps both timed agree within a tenth."""
    path = Path(folder) / f"{table}.csv"
    a = measured_regimes(here)
    b = measured_regimes(pd.read_csv(path)) if path.exists() else None
    if a is None or b is None:
        return ""
    keys = ["size", "context_length", "batch_size", "precision", "mode"]
    both = a.merge(b, on=keys, suffixes=("", "_there"))
    both = both[(both["regime"] == LAUNCH_BOUND) | (both["regime_there"] == LAUNCH_BOUND)]
    if both.empty:
        return ""
    gap = (both["mean_ms"] / both["mean_ms_there"] - 1).abs()
    r = both.loc[gap.idxmax()]
    if gap.max() < 0.1:
        return ""
    graphs = f"as one CUDA graph {fmt_ms(r.graphed_ms_there)} and {fmt_ms(r.graphed_ms)}"
    same = abs(r.graphed_ms / r.graphed_ms_there - 1) < 0.1
    return (
        f"The same {r.precision} {MODE_WORDS[r['mode']]} of {name(r['size'])} at context {int(r.context_length)} "
        f"took {fmt_ms(r.mean_ms_there)} in {where} and {fmt_ms(r.mean_ms)} here, {graphs}"
        + (
            ": the eager time of a launch-bound step is the pace at which the host launched its kernels in that "
            "run, while the GPU's work stays put."
            if same
            else "."
        )
    )
