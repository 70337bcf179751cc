"""Answers of attention: naive and compiled attention (notebooks 07, 08), FlashAttention-2 (09), its
benchmark (10) and the FlashAttention-2 leaderboard (11)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.benchmarking.launch_bound import LAUNCH_BOUND
from cs336_systems.experiments.answers import NotAnswered, Results, builds
from cs336_systems.experiments.answers.words import MODE_WORDS, and_join, span, times, times_span
from cs336_systems.report.answers import MAX_SUPPORT_ROWS, Answer
from cs336_systems.report.tables import fmt_ms

# The 2026 handout's model sizes; its small, medium and large are the 2025 ones.
SIZES_2026 = {
    "small": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": dict(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": dict(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
    "10B": dict(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
}
CONTEXT_2026 = 512
DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


# ---------------------------------------------------------------- formatting


def sig(x: float, digits: int = 3) -> float:
    """`x` rounded to `digits` significant digits (so 0.0016 stays 0.0016, not 0.00)."""
    if x != x or x == 0:
        return x
    return float(f"{x:.{digits}g}")


def errors_as_text(table: pd.DataFrame) -> pd.DataFrame:
    """The table with its error columns as text in scientific notation."""
    return table.assign(**{c: table[c].map(sci) for c in table.columns if "error" in c})


def sci(x: float) -> str:
    """A small error as text in scientific notation (3.5e-07), so no table format rounds it to 0."""
    return "–" if x != x else f"{x:.1e}"


def count(x: float) -> str:
    """An integer with thousands separators."""
    return f"{x:,.0f}"


def ms_span(values) -> str:
    """'a–b ms' (or 'a ms')."""
    text = span(values, fmt=lambda x: fmt_ms(x).removesuffix(" ms"))
    return f"{text} ms"


def on_machine(results: Results, notebook: str) -> str:
    """'On one NVIDIA H100 80GB HBM3', 'On the CPU', 'On this machine'."""
    return f"On {results.gpu_name(notebook)}"


def is_cpu_run(results: Results, notebook: str) -> bool:
    return "NVIDIA" not in results.machine(notebook) and results.gpu_name(notebook) in ("the CPU", "this machine")


def cpu_caveat(results: Results, notebook: str, what: str = "tiny sizes, few steps") -> str:
    """The caveat of a CPU-profile run, empty on a GPU."""
    if not is_cpu_run(results, notebook):
        return ""
    return f"This is a CPU-profile run ({what}) on a shared CPU: its timings are noisy and say nothing about a GPU."


def capped(df: pd.DataFrame) -> pd.DataFrame:
    """The first rows a support table may hold."""
    return df.head(MAX_SUPPORT_ROWS).reset_index(drop=True)


def spread_pick(values, count: int) -> list:
    """`count` values of the sorted distinct `values`, evenly spread, first and last included."""
    distinct = sorted(pd.unique(pd.Series(values)))
    if len(distinct) <= count:
        return distinct
    return [distinct[i] for i in sorted(set(np.linspace(0, len(distinct) - 1, count).round().astype(int)))]


# ---------------------------------------------------------------- 07: naive attention


def batch_of(rows: pd.DataFrame, saved_column: str) -> int | None:
    """The batch size the sweep ran at, read back from its saved-for-backward memory: the measured bytes over
    the naive attention's bytes per batch element at the longest sequence; None when that is no whole number."""
    from cs336_systems.experiments.attention_benchmark import MiB, naive_attention_memory

    ran = rows.dropna(subset=[saved_column])
    if ran.empty:
        return None
    r = ran.sort_values(["seq_len", "d_model"]).iloc[-1]
    per_element = naive_attention_memory(1, int(r.seq_len), int(r.d_model))["saved_for_backward"]
    batch = r[saved_column] * MiB / per_element
    return round(batch) if round(batch) >= 1 and abs(batch / round(batch) - 1) < 0.02 else None


def batch_clause(batch: int | None) -> str:
    return f"batch {batch}, " if batch else ""


def first_oom(sweep: pd.DataFrame) -> pd.Series:
    """Per head dimension, the first sequence length that ran out of memory."""
    return sweep[sweep.status == "OOM"].groupby("d_model").seq_len.min()


def oom_clause(sweep: pd.DataFrame) -> str:
    """Where the attention first runs out of memory, per head dimension, in words."""
    oom = first_oom(sweep)
    if oom.empty:
        return f"no configuration ran out of memory up to sequence length {sweep.seq_len.max():,}"
    if oom.nunique() == 1:
        return f"the first out-of-memory comes at sequence length {oom.iloc[0]:,} for every head dimension"
    return "the first out-of-memory comes at sequence length " + "; ".join(f"{n:,} for d = {d}" for d, n in oom.items())


def accounting_sentence(sweep: pd.DataFrame, accounting: pd.DataFrame, batch: int | None) -> str:
    """The memory accounting of the smallest configuration that ran out of memory, from its table."""
    unit = accounting.columns[1]
    part = accounting.set_index("item")[unit]
    smallest = sweep[sweep.status == "OOM"].sort_values(["seq_len", "d_model"]).iloc[0]
    n, d = int(smallest.seq_len), int(smallest.d_model)
    small = part["inputs and output"] + part["row statistics"]
    return (
        f"Accounting for d = {d}, N = {n:,} (fp32, 4 bytes per element): before the backward the attention keeps "
        f"S = QKᵀ/√d, exp(S − max S) and P = softmax(S), three B·N² tensors of {part['scores']:,.1f} {unit} each "
        f"{f'(B = {batch})' if batch else ''}, and {small:,.2f} {unit} of Q, K, V, O and row statistics, "
        f"{part['before backward']:,.1f} {unit} "
        f"in all; the backward adds dP and dS ({part['backward extra']:,.1f} {unit}), against "
        f"{part['memory limit of this run']:,.1f} {unit} available."
    )


def saved_growth(sweep: pd.DataFrame) -> str:
    """How the saved-for-backward memory grows between the two longest sequences that ran, in words."""
    ok = sweep[sweep.status == "ok"].sort_values("seq_len")
    factors = []
    for _, g in ok.groupby("d_model"):
        if len(g) >= 2:
            a, b = g.iloc[-2], g.iloc[-1]
            factors.append((a.seq_len, b.seq_len, b.saved_for_backward_mib / a.saved_for_backward_mib))
    if not factors:
        return ""
    lo_n, hi_n = factors[0][0], factors[0][1]
    same = all(f[0] == lo_n and f[1] == hi_n for f in factors)
    where = f"from N = {lo_n:,} to {hi_n:,}" if same else "between the two longest sequences that ran"
    growth = hi_n / lo_n
    return (
        f"measured: it grows {times_span([f[2] for f in factors])} {where}, where a pure N² term gives "
        f"{growth**2:.0f}× and a linear one {growth:.0f}×"
    )


@builds("pytorch_attention.a")
def pytorch_attention(results: Results) -> Answer:
    """Timings table of the naive attention, where it runs out of memory, the accounting and the remedy."""
    nb = "07_pytorch_attention"
    sweep = results.table("attention_sweep")
    batch = batch_of(sweep[sweep.status == "ok"], "saved_for_backward_mib")
    grid = sweep[~sweep.extended.astype(bool)]
    ran = grid[grid.status == "ok"]
    largest = ran.sort_values(["seq_len", "d_model"]).iloc[-1]
    ran_text = f"all {len(grid)}" if len(ran) == len(grid) else f"{len(ran)} of the {len(grid)}"
    text = (
        f"{on_machine(results, nb)} ({batch_clause(batch)}fp32), {ran_text} configurations of the grid ran "
        f"(the largest, d = {largest.d_model} at N = {largest.seq_len:,}: {fmt_ms(largest.forward_ms)} forward, "
        f"{fmt_ms(largest.backward_ms)} backward), and {oom_clause(sweep)}. "
    )
    if results.has("oom_accounting") and (sweep.status == "OOM").any():
        text += accounting_sentence(sweep, results.table("oom_accounting"), batch) + " "
    growth = saved_growth(sweep)
    text += (
        "The memory saved for the backward is therefore quadratic in the sequence length, 3·B·N²·4 bytes plus "
        "terms linear in N" + (f" ({growth})" if growth else "") + "; FlashAttention-2 removes it by computing the "
        "attention tile by tile with an online softmax and recomputing P in the backward from Q, K, V and the "
        "per-row logsumexp, so only O(N) memory is saved."
    )
    oom = first_oom(sweep)
    shown = pd.concat(
        [
            grid,
            sweep[sweep.extended.astype(bool) & sweep.set_index(["d_model", "seq_len"]).index.isin(list(oom.items()))],
        ]
    ).sort_values(["d_model", "seq_len"])
    table = shown.assign(
        status=shown.status.map(lambda s: "ran" if s == "ok" else "out of memory" if s == "OOM" else s),
    )[["d_model", "seq_len", "status", "forward_ms", "backward_ms", "memory_before_backward_mib"]].rename(
        columns={
            "d_model": "d",
            "seq_len": "sequence length",
            "forward_ms": "forward (ms)",
            "backward_ms": "backward (ms)",
            "memory_before_backward_mib": "memory before backward (MiB)",
        }
    )
    table = table.round({"forward (ms)": 3, "backward (ms)": 3, "memory before backward (MiB)": 1})
    return Answer(
        text, table=capped(table), caveat=cpu_caveat(results, nb, "tiny sequences, a simulated memory budget")
    )


# ---------------------------------------------------------------- 08: torch.compile


def compiled_attention_text(both: pd.DataFrame, sweep: pd.DataFrame) -> str:
    """Compiled against eager attention in words: ranges, the shortest and longest sequences, memory."""
    short, long = both.seq_len.min(), both.seq_len.max()
    at = {n: both[both.seq_len == n] for n in (short, long)}
    dims = span(both.d_model, fmt=count)
    text = (
        f"torch.compile made the naive attention's forward {times_span(both.forward_speedup)} and its backward "
        f"{times_span(both.backward_speedup)} as fast as eager (eager time / compiled time) over the {len(both)} "
        f"configurations where both ran (d = {dims}); "
    )
    if short != long:
        text += (
            f"at N = {long:,} the forward is {times_span(at[long].forward_speedup)} and the backward "
            f"{times_span(at[long].backward_speedup)}, at N = {short:,} (eager calls of "
            f"{ms_span(at[short][['forward_ms_eager', 'backward_ms_eager']].stack())}) "
            f"{times_span(at[short].forward_speedup)} "
            f"and {times_span(at[short].backward_speedup)}. "
        )
    else:
        text = text.removesuffix("; ") + ". "
    saved = both.saved_for_backward_mib_compiled / both.saved_for_backward_mib_eager
    biggest = both.loc[both.saved_for_backward_mib_eager.idxmax()]
    text += (
        f"The compiled attention saves {times_span(saved)} the eager one's memory for the backward "
        f"({biggest.saved_for_backward_mib_compiled:,.0f} against {biggest.saved_for_backward_mib_eager:,.0f} MiB at "
        f"d = {biggest.d_model}, N = {biggest.seq_len:,})"
    )
    oom = sweep[(sweep.status_eager == "OOM") | (sweep.status_compiled == "OOM")]
    if len(oom):
        first = {impl: sweep[sweep[f"status_{impl}"] == "OOM"].seq_len.min() for impl in ("eager", "compiled")}
        if first["eager"] == first["compiled"]:
            text += f", yet both first run out of memory at N = {first['eager']:,}, as the N² terms remain"
        else:
            text += f"; eager first runs out of memory at N = {first['eager']:,}, compiled at {first['compiled']:,}"
    return text + "."


@builds("torch_compile.a")
def torch_compile_attention(results: Results) -> Answer:
    """Compiled against eager naive attention, forward and backward, on the grid of notebook 07."""
    nb = "08_torch_compile"
    wide = results.table("compiled_vs_eager")
    both = wide[(wide.status_eager == "ok") & (wide.status_compiled == "ok")]
    if both.empty:
        raise NotAnswered("no configuration ran both eager and compiled")
    batch = batch_of(both, "saved_for_backward_mib_eager")
    text = f"{on_machine(results, nb)} ({batch_clause(batch)}fp32), " + compiled_attention_text(both, wide)
    first_oom_rows = wide[(wide.status_eager != "ok") | (wide.status_compiled != "ok")].groupby("d_model").head(1)
    shown = pd.concat([both, first_oom_rows]).sort_values(["d_model", "seq_len"])
    table = pd.DataFrame(
        {
            "d": shown.d_model,
            "sequence length": shown.seq_len,
            "forward eager (ms)": shown.forward_ms_eager.round(3),
            "forward compiled (ms)": shown.forward_ms_compiled.round(3),
            "backward eager (ms)": shown.backward_ms_eager.round(3),
            "backward compiled (ms)": shown.backward_ms_compiled.round(3),
            "status": [
                ("ran" if e == "ok" and c == "ok" else f"eager {e}, compiled {c}".replace("OOM", "out of memory"))
                for e, c in zip(shown.status_eager, shown.status_compiled)
            ],
        }
    )
    return Answer(text, table=capped(table), caveat=cpu_caveat(results, nb))


def compiled_model_text(both: pd.DataFrame, sizes: list[str]) -> str:
    """Vanilla against compiled model per mode, smallest and largest size, in words."""
    first, last = sizes[0], sizes[-1]
    parts = []
    for mode, g in both.groupby("mode", sort=False):
        by = g.set_index("size").speedup
        if len(sizes) > 1:
            parts.append(
                f"{MODE_WORDS.get(mode, mode)} {times(by[first])} for {first}, {times(by[last])} for {last} "
                f"({times_span(by)} over the {len(by)} sizes)"
            )
        else:
            parts.append(f"{MODE_WORDS.get(mode, mode)} {times(by[first])} for {first}")
    return and_join(parts)


def whole_model_text(ok: pd.DataFrame, scope: str) -> str:
    """The whole-model compilation against the block-by-block one, compiled times only."""
    whole = ok[ok.scope == "model"]
    if whole.empty or scope == "model":
        return ""
    size = whole["size"].iloc[0]
    w = whole[whole["size"] == size].set_index("mode")
    b = ok[(ok.scope == scope) & (ok["size"] == size)].set_index("mode")
    mode = w.index[0]
    if mode not in b.index:
        return ""
    return (
        f" Compiled as one whole-model graph, {size} ran its {MODE_WORDS.get(mode, mode)} in "
        f"{fmt_ms(w.loc[mode].compiled_ms)} "
        f"against {fmt_ms(b.loc[mode].compiled_ms)} compiled block by block, after a first call (the compilation) of "
        f"{w.loc[mode].compiled_first_call_s:.1f} s against {b.loc[mode].compiled_first_call_s:.1f} s."
    )


def vanilla_regime_text(main: pd.DataFrame, ok: pd.DataFrame, labels: dict[str, str]) -> str:
    """Which vanilla steps are launch-bound, by this notebook's own probe (none said where the probe measured
    nothing, as on a CPU); and the one vanilla step this notebook timed twice (the block-by-block and
    whole-model sweeps both build the same eager model) where the two times differ by more than a fifth."""
    name = lambda size: labels.get(size, size)  # noqa: E731
    text = ""
    if "regime" in main and main.busy_fraction.notna().any():
        bound = main[main.regime == LAUNCH_BOUND]
        if bound.empty:
            text += (
                f" Every vanilla step kept the GPU busy at least {main.busy_fraction.min():.0%} of its time "
                f"(measured with the profiler): none is launch-bound, so the speed-ups are the fused kernels' own."
            )
        else:
            items = [
                f"{name(r['size'])}'s {MODE_WORDS.get(r['mode'], r['mode'])} ({r.busy_fraction:.0%} busy, "
                f"{times(r.graph_speedup)} as a CUDA graph)"
                for _, r in bound.iterrows()
            ]
            text += (
                f" Measured with the profiler and as CUDA graphs, the vanilla step is launch-bound (the GPU idles "
                f"between kernels while the host launches them) for {and_join(items)}: there much of what "
                f"compiling gains is fewer kernel launches (fused kernels), not faster arithmetic."
            )
    scopes = ok[ok["size"].isin(set(main["size"]))].pivot_table(
        index=["size", "mode"], columns="scope", values="vanilla_ms", aggfunc="first"
    )
    if scopes.shape[1] > 1:
        spread = (scopes.max(axis=1) / scopes.min(axis=1)).dropna()
        if len(spread) and spread.max() > 1.2:
            size, mode = spread.idxmax()
            measured = scopes.loc[(size, mode)].dropna()
            text += (
                f" The same eager {name(size)} {MODE_WORDS.get(mode, mode)} measured "
                + " and ".join(
                    f"{fmt_ms(ms)} in the {'block-by-block' if sc == 'blocks' else 'whole-model'} sweep"
                    for sc, ms in measured.items()
                )  # fmt: skip
                + f" ({spread.max():.2f}× apart): a launch-bound time follows the host's state, not the model's work."
            )
    return text


def compiled_model_answer(
    results: Results, sizes: list[str] | None = None, labels: dict[str, str] | None = None, caveat: str = ""
) -> Answer:
    """The vanilla and compiled Transformer side by side (block-by-block scope), for `sizes` (default: all)."""
    nb = "08_torch_compile"
    df = results.table("compiled_model")
    ok = df[df.status == "ok"]
    scope = "blocks" if (ok.scope == "blocks").any() else ok.scope.iloc[0] if len(ok) else "blocks"
    main = ok[ok.scope == scope]
    if sizes is not None:
        main = main[main["size"].isin(sizes)]
    if main.empty:
        raise NotAnswered("the compiled-model sweep timed no model")
    order = [s for s in (sizes or list(dict.fromkeys(df["size"]))) if s in set(main["size"])]
    labels = labels or {}
    regime_text = vanilla_regime_text(main, ok, labels)
    main = main.assign(size=main["size"].map(lambda s: labels.get(s, s)))
    order = [labels.get(s, s) for s in order]
    how = "each Transformer block" if scope == "blocks" else "the whole model"
    text = (
        f"{on_machine(results, nb)} (context {int(main.context_length.iloc[0])}), compiling {how} with torch.compile "
        f"gave these speed-ups (vanilla time / compiled time): {compiled_model_text(main, order)}"
        + (
            "; the training step includes the AdamW step, which is not compiled."
            if (main["mode"] == "train-step").any()
            else "."
        )
    )
    text += whole_model_text(ok.assign(size=ok["size"].map(lambda s: labels.get(s, s))), scope)
    text += regime_text
    table = pd.DataFrame(
        {
            "size": main["size"],
            "pass": main["mode"].map(lambda m: MODE_WORDS.get(m, m)),
            "vanilla (ms)": main.vanilla_ms.round(2),
            "compiled (ms)": main.compiled_ms.round(2),
            "speed-up (×)": main.speedup.map(sig),
            "compiled first call (s)": main.compiled_first_call_s.round(2),
        }
    )
    not_ok = df[df.status != "ok"]
    if len(not_ok):
        caveat += (
            " Not timed: "
            + ", ".join(
                f"{r['size']} {MODE_WORDS.get(r['mode'], r['mode'])} ({r.status})" for _, r in not_ok.iterrows()
            )
            + "."
        )
    caveat = " ".join(c for c in (caveat.strip(), cpu_caveat(results, nb, "a tiny model")) if c)
    return Answer(text, table=capped(table), caveat=caveat)


@builds("torch_compile.b")
def torch_compile_model(results: Results) -> Answer:
    """Vanilla against compiled Transformer: forward, forward+backward, training step, per model size."""
    return compiled_model_answer(results)


def sizes_as_2026() -> dict[str, str]:
    """Our size names whose dimensions are a 2026 size -> that 2026 name."""
    from cs336_systems.model import MODEL_SIZES

    return {ours: name for ours, dims in MODEL_SIZES.items() for name, want in SIZES_2026.items() if dims == want}


@builds("torch_compile.b.2026")
def torch_compile_model_2026(results: Results) -> Answer:
    """`torch_compile.b` on the 2026 sizes the run has (its 2.7B is 2026's xl), with what is missing."""
    df = results.table("compiled_model")
    as_2026 = sizes_as_2026()
    ran = list(dict.fromkeys(df["size"]))
    have = [s for s in ran if s in as_2026]
    missing = [n for n in SIZES_2026 if n not in {as_2026[s] for s in have}]
    labels = {s: (f"{as_2026[s]} (2026; our {s})" if as_2026[s] != s else s) for s in have}
    contexts = set(df.context_length)
    notes = []
    if missing:
        notes.append(f"This run does not include the 2026 size{'s' if len(missing) > 1 else ''} {and_join(missing)}.")
    if CONTEXT_2026 not in contexts:
        notes.append(
            f"It ran at context {and_join([str(c) for c in sorted(contexts)])}, not the 2026 handout's default "
            f"{CONTEXT_2026}."
        )
    if not have:
        notes.append("None of its model sizes is a 2026 size, so the rows shown are the sizes it ran.")
        return compiled_model_answer(results, caveat=" ".join(notes))
    return compiled_model_answer(results, sizes=have, labels=labels, caveat=" ".join(notes))


# ---------------------------------------------------------------- 09: FlashAttention-2 code


def case_summary(raw: pd.DataFrame) -> str:
    """The cases of the accuracy table in words: count, dtypes, shapes."""
    cases = raw.drop_duplicates(["implementation", "shape_q", "shape_kv", "dtype", "is_causal"])
    shapes = cases.drop_duplicates(["shape_q", "shape_kv"])
    shape_text = and_join(
        [q if q == kv else f"Q {q} against K, V {kv}" for q, kv in zip(shapes.shape_q, shapes.shape_kv)]
    )
    dtypes = and_join([DTYPE_NAMES.get(d, d) for d in dict.fromkeys(cases.dtype)])
    causal = {str(c) for c in cases.is_causal}
    flags = "causal and not" if causal == {"True", "False"} else "causal" if causal == {"True"} else "not causal"
    return f"{dtypes}, {flags}; shapes {shape_text}"


def accuracy_table(raw: pd.DataFrame, impl: str, tensors: list[str], causal: bool | None = None) -> pd.DataFrame:
    """Worst norm-wise relative error of `tensors` per dtype (and causal flag) for one implementation."""
    sel = raw[raw.implementation == impl]
    if causal is not None:
        sel = sel[sel.is_causal.astype(str) == str(causal)]
    if sel.empty:
        raise NotAnswered(f"the accuracy check did not run {impl}")
    keys = ["dtype", "is_causal"] if causal is None else ["dtype"]
    cases = sel.drop_duplicates(["shape_q", "shape_kv", "dtype", "is_causal"])
    per_case = sel.groupby(["shape_q", "shape_kv", "dtype", "is_causal"], sort=False).passes.all().reset_index()
    worst = sel[sel.tensor.isin(tensors)].pivot_table(
        index=keys, columns="tensor", values="relative_error", aggfunc="max", sort=False
    )[tensors]
    worst.columns = [f"worst relative error {t}" for t in tensors]
    worst = worst.map(lambda x: sig(x, 2))
    counts = cases.groupby(keys, sort=False).size().rename("cases")
    passed = per_case.groupby(keys, sort=False).passes.sum().rename("cases within tolerance")
    out = pd.concat([counts, passed, worst], axis=1).reset_index()
    out["dtype"] = out.dtype.map(lambda d: DTYPE_NAMES.get(d, d))
    return out.rename(columns={"dtype": "precision", "is_causal": "causal"})


def worst_errors(table: pd.DataFrame, tensor: str) -> str:
    """'3.5e-07 (fp32), 2.1e-04 (fp16) and 1.7e-03 (bf16)' for one tensor's column."""
    col = table.groupby("precision", sort=False)[f"worst relative error {tensor}"].max()
    return and_join([f"{v:.1e} ({p})" for p, v in col.items()])


def within(table: pd.DataFrame) -> str:
    """'all 21 cases' or '20 of 21 cases'."""
    n, ok = int(table.cases.sum()), int(table["cases within tolerance"].sum())
    return f"all {n}" if n == ok else f"{ok} of {n}"


def accuracy_rows(results: Results) -> pd.DataFrame:
    return results.table("flash_accuracy_raw")


def code_caveat(results: Results, nb: str) -> str:
    if not is_cpu_run(results, nb):
        return ""
    return (
        "This CPU-profile run checks small shapes only, the Triton kernels in the Triton interpreter with 16 × 16 "
        "tiles; the GPU run checks longer sequences with the kernels compiled."
    )


def power_of_ten(x: float) -> str:
    """1e-3 -> '10⁻³'; a value that is not a power of ten as it prints ('5e-03' -> '0.005')."""
    exponent = round(float(np.log10(x)))
    if not np.isclose(x, 10.0**exponent):
        return f"{x:g}"
    return "10" + str(exponent).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


def tolerance_text() -> str:
    """The accuracy checks' tolerance per dtype, in words, from the tests' own table (`attention.reference`)."""
    from cs336_systems.attention.reference import TOLERANCE

    by_value: dict[float, list[str]] = {}
    for dtype, tolerance in TOLERANCE.items():
        by_value.setdefault(tolerance.checks, []).append(DTYPE_NAMES.get(str(dtype).removeprefix("torch."), dtype))
    return "norm-wise relative error; tolerance " + ", ".join(
        f"{power_of_ten(value)} in {and_join(names)}" for value, names in by_value.items()
    )


TOLERANCE_TEXT = tolerance_text()


@builds("flash_forward.a")
def flash_forward_pytorch(results: Results) -> Answer:
    """Where the tiled PyTorch forward is, and how it compared with float64 attention in the run."""
    from cs336_systems.attention.pytorch import MIN_TILE, FlashAttentionPytorch

    nb = "09_flash_attention"
    raw = accuracy_rows(results)
    table = accuracy_table(raw, "flash_pytorch", ["O", "L"])
    text = (
        f"`cs336_systems.attention.FlashAttentionPytorch` (`attention/pytorch.py`, returned by "
        f"`cs336_systems.adapters.get_flashattention_autograd_function_pytorch`) runs Algorithm 1 over "
        f"{FlashAttentionPytorch.q_tile} × {FlashAttentionPytorch.k_tile} tiles (B_q × B_k, at least {MIN_TILE}) with "
        f"a running max, sum and output per query tile, and saves L, Q, K, V and O for the backward. "
        f"{on_machine(results, nb)} its O and logsumexp L matched softmax attention computed in float64 in "
        f"{within(table)} cases of the check ({case_summary(raw[raw.implementation == 'flash_pytorch'])}), with worst "
        f"relative error {worst_errors(table, 'O')} for O and at most {table['worst relative error L'].max():.1e} for "
        f"L ({TOLERANCE_TEXT})."
    )
    return Answer(text, table=errors_as_text(table), caveat=code_caveat(results, nb))


@builds("flash_forward.b")
def flash_forward_triton(results: Results) -> Answer:
    """Where the Triton forward kernel is, and how it compared with float64 attention in the run."""
    nb = "09_flash_attention"
    raw = accuracy_rows(results)
    table = accuracy_table(raw, "flash_triton", ["O", "L"])
    text = (
        f"`cs336_systems.attention.FlashAttentionTriton` (`attention/api.py`, returned by "
        "`cs336_systems.adapters.get_flashattention_autograd_function_triton`) calls the fused kernel "
        "`flash_fwd_kernel` (`attention/kernels/triton_forward.py`): launch grid (⌈N_q/B_q⌉, batch·heads), one loop "
        "over key tiles with block pointers advanced at its end, O, l and m held in fp32 on chip, P̃ cast to V's dtype "
        f"before its product, and O and L written once. {on_machine(results, nb)} its O and L matched float64 "
        f"attention in {within(table)} "
        f"cases of the check ({case_summary(raw[raw.implementation == 'flash_triton'])}), with worst relative error "
        f"{worst_errors(table, 'O')} for O and at most {table['worst relative error L'].max():.1e} for L "
        f"({TOLERANCE_TEXT})."
    )
    return Answer(text, table=errors_as_text(table), caveat=code_caveat(results, nb))


@builds("flash_forward.c")
def flash_forward_causal(results: Results) -> Answer:
    """The causal flag of the Triton forward, and the causal cases of the run's check."""
    nb = "09_flash_attention"
    raw = accuracy_rows(results)
    causal = raw[raw.is_causal.astype(str) == "True"]
    if causal.empty:
        raise NotAnswered("the accuracy check ran no causal case")
    table = pd.concat(
        [
            accuracy_table(raw, impl, ["O", "L"], causal=True).assign(implementation=label)
            for impl, label in (("flash_triton", "Triton"), ("flash_pytorch", "PyTorch"))
            if (causal.implementation == impl).any()
        ],
        ignore_index=True,
    )
    table = table[["implementation", *[c for c in table.columns if c != "implementation"]]]
    triton = table[table.implementation == "Triton"]
    text = (
        "`FlashAttentionTriton.apply(q, k, v, is_causal=False)` takes the flag last, off by default, and saves it as "
        "`ctx.is_causal` for the backward; the kernel's `is_causal: tl.constexpr` builds query and key index vectors "
        "per tile, adds −10⁶ to the scores of keys after their query (query i sees keys j ≤ i, as "
        "`scaled_dot_product_attention(is_causal=True)`), masks only the diagonal tiles and skips key tiles entirely "
        f"after the query tile. {on_machine(results, nb)} the Triton forward's causal outputs matched float64 "
        f"attention in {within(triton if len(triton) else table)} causal cases of the check, with worst relative error "
        f"{worst_errors(triton if len(triton) else table, 'O')} for O ({TOLERANCE_TEXT})."
    )
    return Answer(text, table=errors_as_text(table), caveat=code_caveat(results, nb))


def compiled_in_memory_sweep(results: Results) -> str:
    """', and ran compiled in the memory sweep up to N = ...' where the GPU memory sweep ran the PyTorch backward."""
    if not results.has("flash_memory"):
        return ""
    mem = results.table("flash_memory")
    ran = mem[(mem.implementation == "flash_triton, PyTorch backward") & (mem.status == "ok")]
    if ran.empty:
        return ""
    return f", and it ran compiled in the notebook's memory sweep up to N = {ran.seq_len.max():,}"


@builds("flash_backward")
def flash_backward(results: Results) -> Answer:
    """Where the compiled PyTorch backward is, and how its gradients compared with float64 in the run."""
    nb = "09_flash_attention"
    raw = accuracy_rows(results)
    impls = [
        (i, label)
        for i, label in (
            ("flash_pytorch", "PyTorch forward and backward"),
            ("flash_triton, PyTorch backward", "Triton forward, PyTorch backward"),
            ("flash_triton", "Triton forward and backward"),
        )
        if (raw.implementation == i).any()
    ]
    if not impls:
        raise NotAnswered("the accuracy check ran no backward")
    tables = {label: accuracy_table(raw, i, ["dQ", "dK", "dV"]) for i, label in impls}
    table = pd.concat([t.assign(implementation=label) for label, t in tables.items()], ignore_index=True)
    table = (
        table.groupby(["implementation", "precision"], sort=False)
        .agg(
            {
                "cases": "sum",
                "cases within tolerance": "sum",
                "worst relative error dQ": "max",
                "worst relative error dK": "max",
                "worst relative error dV": "max",
            }
        )
        .reset_index()
    )
    main = table[table.implementation == impls[0][1]]
    grads = main[["worst relative error dQ", "worst relative error dK", "worst relative error dV"]].max(axis=1)
    worst = and_join([f"{v:.1e} ({p})" for p, v in zip(main.precision, grads)])
    text = (
        "`cs336_systems.attention.pytorch.flash_backward_reference` computes D = rowsum(O ∘ dO), recomputes "
        "S and P = exp(S − L) from Q, K and the saved L, and returns dQ, dK, dV by equations 13–19; "
        '`FlashAttentionPytorch.backward` (and `FlashAttentionTriton` with `backward_impl="pytorch"`) call it through '
        f"`torch.compile` (`flash_backward`). {on_machine(results, nb)} its dQ, dK and dV matched the gradients of "
        f"float64 attention in {within(main)} cases of the check, worst relative error {worst} over the three "
        f"gradients ({TOLERANCE_TEXT}); the optional Triton backward (Algorithm 2) is in the table too."
    )
    caveat = (
        "The accuracy check runs this backward uncompiled (the same equations; compiling it per precision and "
        "causal flag would cost more than the whole check); the compiled version is checked by the repository's "
        "test `test_pytorch_compiled_backward_matches_float64`" + compiled_in_memory_sweep(results) + "."
    )
    return Answer(
        text, table=errors_as_text(table), caveat=" ".join(c for c in (caveat, code_caveat(results, nb)) if c)
    )


# ---------------------------------------------------------------- 10: FlashAttention-2 benchmark


def benchmark_support(wide: pd.DataFrame) -> pd.DataFrame:
    """Ours against the materialised PyTorch attention at the ends of the head dimensions and a spread of
    sequence lengths, per precision (the full grid stays in the notebook)."""
    dims = spread_pick(wide.head_dim, 2)
    seqs = spread_pick(wide.seq_len, max(1, MAX_SUPPORT_ROWS // max(1, len(dims) * wide.dtype.nunique())))
    sel = wide[wide.head_dim.isin(dims) & wide.seq_len.isin(seqs)]
    cols = {
        "dtype": "precision",
        "head_dim": "d",
        "seq_len": "sequence length",
        "fwd triton (ms)": "ours forward (ms)",
        "bwd triton (ms)": "ours backward (ms)",
        "fwd+bwd triton (ms)": "ours fwd+bwd (ms)",
        "fwd pytorch (ms)": "PyTorch forward (ms)",
        "bwd pytorch (ms)": "PyTorch backward (ms)",
        "fwd+bwd pytorch (ms)": "PyTorch fwd+bwd (ms)",
    }
    out = sel[list(cols)].rename(columns=cols)
    out["precision"] = out.precision.map(lambda d: DTYPE_NAMES.get(d, d))
    out["PyTorch / ours, fwd+bwd (×)"] = out["PyTorch fwd+bwd (ms)"] / out["ours fwd+bwd (ms)"]
    for col in out.columns[3:]:
        out[col] = out[col].map(sig)
    return out.reset_index(drop=True)


def versus_text(table: pd.DataFrame, baseline: str) -> dict[str, pd.DataFrame]:
    """Per dtype, forward+backward ours / `baseline` where both ran."""
    mine = table[(table.impl == "triton") & (table.status == "ok")]
    base = table[(table.impl == baseline) & (table.status == "ok")]
    both = mine.merge(base, on=["dtype", "head_dim", "seq_len"], suffixes=("", "_base"))
    both["ratio"] = both.forward_backward_ms / both.forward_backward_ms_base
    return {dt: g for dt, g in both.groupby("dtype", sort=False)}


def sole_backend(results: Results, dtype: str) -> str:
    """'; only the efficient backend has a kernel in fp32' where one SDPA backend alone ran in `dtype`."""
    if not results.has("flash_benchmarking_all_backends"):
        return ""
    raw = results.table("flash_benchmarking_all_backends")
    sdpa = raw[raw.impl.str.startswith("sdpa_") & (raw.dtype == dtype)]
    ran = sorted(set(sdpa[sdpa.status == "ok"].impl))
    if len(ran) != 1 or sdpa.impl.nunique() < 2:
        return ""
    return f"; only its {ran[0].removeprefix('sdpa_')} backend has a kernel in {DTYPE_NAMES.get(dtype, dtype)}"


def skipped_text(table: pd.DataFrame) -> str:
    skipped = table[(table.impl == "pytorch") & (table.status != "ok")]
    if skipped.empty:
        return ""
    where = and_join(
        [
            f"{DTYPE_NAMES.get(dt, dt)} N = {n:,}"
            for dt, n in skipped.drop_duplicates(["dtype", "seq_len"])[["dtype", "seq_len"]].itertuples(index=False)
        ]
    )
    reasons = skipped.status.str.replace("skipped: memory", "its predicted memory exceeded the budget")
    return (
        f" (the materialised attention did not run at {len(skipped)} points, {where}: {and_join(sorted(set(reasons)))})"
    )


def overhead_text(table: pd.DataFrame) -> str:
    """Where the materialised attention's time stays flat while its arithmetic grows: set by per-call overhead."""
    pt = table[(table.impl == "pytorch") & (table.status == "ok")].sort_values("seq_len")
    if pt.seq_len.nunique() < 3:
        return ""
    times = pt.groupby("seq_len").forward_backward_ms.agg(["min", "max"])
    flat_until = None
    base = times["max"].iloc[0]
    for n, r in times.iterrows():
        if r["max"] <= 2 * base:
            flat_until = n
        else:
            break
    n0 = times.index[0]
    if flat_until is None or flat_until < 8 * n0:
        return ""
    upto = times.loc[:flat_until]
    return (
        f" From N = {n0:,} to {flat_until:,} the materialised attention's forward+backward stays at "
        f"{ms_span(upto[['min', 'max']].stack())} while its arithmetic grows {(flat_until / n0) ** 2:,.0f}-fold, so "
        f"there its time is per-call overhead, not computation."
    )


@builds("flash_benchmarking.a")
def flash_benchmarking(results: Results) -> Answer:
    """Ours against the materialised PyTorch attention (and SDPA's fastest backend), forward, backward, both."""
    nb = "10_flash_benchmarking"
    table = results.table("flash_benchmarking")
    wide = results.table("flash_benchmarking_wide")
    vs_pt = versus_text(table, "pytorch")
    if not vs_pt:
        raise NotAnswered("ours and the PyTorch attention never both ran")
    n_points = table.drop_duplicates(["dtype", "head_dim", "seq_len"]).shape[0]
    grid = (
        f"batch 1, causal, {n_points} points: N = {table.seq_len.min():,}–{table.seq_len.max():,}, "
        f"d = {span(table.head_dim, fmt=count)}, "
        f"{and_join([DTYPE_NAMES.get(d, d) for d in dict.fromkeys(table.dtype)])}"
    )
    ours = table[(table.impl == "triton") & (table.status == "ok")].forward_backward_ms
    how = "medians of a few timed calls" if is_cpu_run(results, nb) else "do_bench medians"
    text = (
        f"{on_machine(results, nb)} ({grid}; {how}), our FlashAttention-2 takes {ms_span(ours)} per "
        f"forward+backward, and the materialised PyTorch attention takes "
        + and_join([f"{times_span(1 / g.ratio)} as long in {DTYPE_NAMES.get(dt, dt)}" for dt, g in vs_pt.items()])
        + f"{skipped_text(table)}."
    )
    vs_sdpa = versus_text(table, "sdpa")
    if vs_sdpa:
        text += (
            " Against PyTorch's fastest fused backend of `scaled_dot_product_attention` at each point, ours / SDPA "
            "forward+backward is "
            + and_join(
                [
                    f"{times_span(g.ratio)} in {DTYPE_NAMES.get(dt, dt)} (ours faster at {int((g.ratio < 1).sum())} of "
                    f"{len(g)} "
                    f"points{sole_backend(results, dt)})"
                    for dt, g in vs_sdpa.items()
                ]
            )
            + "."
        )
    text += overhead_text(table)
    machine = results.gpu_name(nb)
    caveat = ""
    if "H100" not in machine and not is_cpu_run(results, nb):
        caveat = f"Timed on {machine}, not on the H100 the 2025 handout names or the B200 of the 2026 handout. "
    caveat += (
        "The table shows the smallest and largest head dimensions at a spread of sequence lengths; the notebook "
        "has every point, with SDPA's backends."
    )
    caveat = " ".join(
        c for c in (caveat, cpu_caveat(results, nb, "a tiny fp32 grid, our kernels in the Triton interpreter")) if c
    )
    return Answer(text, table=capped(benchmark_support(wide)), caveat=caveat)


# ---------------------------------------------------------------- 11: FlashAttention-2 leaderboard

IMPL_NAMES = {"triton": "ours", "sdpa_flash": "SDPA, flash backend", "sdpa_cudnn": "SDPA, cuDNN backend"}
SHORT_NAMES = {"sdpa_flash": "SDPA flash", "sdpa_cudnn": "cuDNN"}
LONG_NAMES = {"sdpa_flash": "SDPA with its flash backend", "sdpa_cudnn": "SDPA with its cuDNN backend"}


def leaderboard_shapes(cpu: bool):
    """(label, table name, configuration) of the 2025 leaderboard shape and the 2026 model's attention."""
    from cs336_systems.experiments.flash_leaderboard import (
        CPU_SCALED_DOWN,
        CPU_SCALED_DOWN_2026,
        LEADERBOARD,
        LEADERBOARD_2026,
    )

    return [
        ("2025 leaderboard", "leaderboard", CPU_SCALED_DOWN if cpu else LEADERBOARD),
        (
            "2026 leaderboard's 8B model, attention",
            "leaderboard_2026",
            CPU_SCALED_DOWN_2026 if cpu else LEADERBOARD_2026,
        ),
    ]


def gluon_note(results: Results, names: list[str]) -> str:
    """Where the profiled leaderboard steps ran our kernels written in Gluon, a clause saying so."""
    kernels = [results.table(n) for n in names if results.has(n)]
    ours = [k[(k.impl == "triton") & (k.role == "attention")] for k in kernels]
    if not ours or not all(o.kernel.str.contains("gluon").any() for o in ours):
        return ""
    where = "at both shapes" if len(ours) > 1 else "at this shape"
    return (
        f"; {where} the profiled step ran our kernels written in Gluon, Triton's lower-level language for Hopper GPUs"
    )


def shape_text(config) -> str:
    return (
        f"batch 1, {config.heads} heads, N = {config.seq_len:,}, d = {config.head_dim}, "
        f"{DTYPE_NAMES.get(str(config.dtype).removeprefix('torch.'))}{', causal' if config.is_causal else ''}"
    )


def leaderboard_sentence(df: pd.DataFrame, config, lead: str) -> str:
    """Ours at one shape against the best PyTorch backend of the same run, in the leaderboard's statistic."""
    rows = df.set_index("impl")
    if "triton" not in rows.index or rows.loc["triton"].status != "ok":
        status = rows.loc["triton"].status if "triton" in rows.index else "absent"
        return f"{lead} ({shape_text(config)}) ours did not produce a valid timing ({status})."
    ours = rows.loc["triton"]
    others = rows[(rows.index != "triton") & (rows.status == "ok")].sort_values("fwd_bwd_mean_ms")
    text = (
        f"{lead} ({shape_text(config)}) our FlashAttention-2 takes **{fmt_ms(ours.fwd_bwd_mean_ms)}** per "
        f"forward+backward"
    )
    described = [
        f"{fmt_ms(r.fwd_bwd_mean_ms)} for {LONG_NAMES.get(i, i)} (ours / {SHORT_NAMES.get(i, i)} = "
        f"{times(ours.fwd_bwd_mean_ms / r.fwd_bwd_mean_ms)})"
        for i, r in others.iterrows()
    ]
    if described:
        described[0] = described[0].replace(" for ", " for PyTorch's fastest, ", 1)
        text += ", against " + and_join(described)
    return text + "."


@builds("leaderboard")
def leaderboard(results: Results) -> Answer:
    """Our forward+backward time at the leaderboard's shape(s), against PyTorch's best in the same run."""
    nb = "11_leaderboard"
    first = results.table("leaderboard")
    cpu = not str(first.device.iloc[0]).startswith("NVIDIA") and is_cpu_run(results, nb)
    machine = results.gpu_name(nb)
    parts, rows = [], []
    for i, (label, name, config) in enumerate(leaderboard_shapes(cpu)):
        if not results.has(name):
            continue
        df = results.table(name)
        stand_in = "a scaled-down stand-in for " if cpu else ""
        lead = (
            f"{on_machine(results, nb)}, at {stand_in}the 2025 leaderboard's shape"
            if i == 0
            else f"At {stand_in}the attention shape of the 2026 leaderboard's 8B model"
        )
        parts.append(leaderboard_sentence(df, config, lead))
        for r in df.itertuples():
            rows.append(
                {
                    "shape": f"{label}: {config.heads} heads, N = {config.seq_len:,}, d = {config.head_dim}",
                    "implementation": IMPL_NAMES.get(r.impl, r.impl),
                    "fwd+bwd mean (ms)": round(r.fwd_bwd_mean_ms, 3),
                    "fwd+bwd median (ms)": round(r.fwd_bwd_ms, 3),
                    "forward (ms)": round(r.fwd_ms, 3),
                    "backward (ms)": round(r.bwd_ms, 3),
                    "TFLOP/s": sig(r.tflops),
                    "worst relative error": sci(r.max_rel_error),
                    "status": "ran" if r.status == "ok" else r.status,
                }
            )
    how = (
        "Times are the mean of a few calls under the Triton interpreter (ours not compiled)"
        if cpu
        else "Times are do_bench's mean over the handout's 10 s of repetitions (ours compiled with torch.compile as in "
        f"its test{gluon_note(results, ['leaderboard_kernels', 'leaderboard_2026_kernels'])}; SDPA in the same run, "
        "taking turns with ours)"
    )
    text = " ".join(parts) + f" {how}; the table has the medians and the forward and backward apart."
    caveat = ""
    if cpu:
        caveat = (
            "This CPU-profile run times scaled-down shapes with our kernels in the Triton interpreter; "
            "its times say nothing about a GPU."
        )
    elif "H100" not in machine:
        caveat = f"Timed on {machine}, not on the H100 the handout's leaderboard uses."
    return Answer(text, table=pd.DataFrame(rows), caveat=caveat)
