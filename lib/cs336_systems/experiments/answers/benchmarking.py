"""Answers of notebooks 01, 03 and 04: end-to-end timing and mixed precision (notebook 02's kernel profile is
answered in `nsys_profile`, which shares the size and wording helpers here).

Timings of small models on a GPU are often set by how fast the CPU launches kernels, not by their
FLOPs; `layer_bound` finds the sizes where the table shows it (time per layer about constant while
FLOPs per layer grow), so an answer never presents such a time as the model's compute time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.accounting.flops import forward_flops
from cs336_systems.accounting.memory import predicted_peaks
from cs336_systems.benchmarking.launch_bound import LAUNCH_BOUND
from cs336_systems.experiments.answers import NotAnswered, Results, builds, builds_each_handout
from cs336_systems.experiments.answers.launch_regime import measured_regimes, regime_sentence
from cs336_systems.experiments.answers.words import MODE_WORDS, and_join, pct, span, times
from cs336_systems.model import MODEL_SIZES, SIZE_TABLES, ModelConfig, handout_name
from cs336_systems.report.answers import Answer
from cs336_systems.report.tables import fmt_ms

NB_TIMING, NB_PROFILE, NB_PRECISION = "01_benchmarking_script", "02_nsys_profile", "04_benchmarking_mixed_precision"

# The 2026 handout's size table (d_model, d_ff, layers, heads); its xl has the 2025 2.7B's shape.
SIZES_2026 = {
    name: tuple(MODEL_SIZES[key][k] for k in ("d_model", "d_ff", "num_layers", "num_heads"))
    for name, key in SIZE_TABLES["2026"].items()
}
# Each handout's default context ("unless otherwise specified").
DEFAULT_CONTEXT = {"2025": 256, "2026": 512}
# What a step keeps besides activations, by mode.
STATE_WORDS = {
    "forward": "the parameters",
    "forward-backward": "the parameters and gradients",
    "train-step": "the parameters, gradients and AdamW state",
}
# Sizes whose time per layer stays within this factor, while their FLOPs per layer spread at least
# FLOP_SPREAD, are timed by their kernel launches rather than their arithmetic.
LAYER_SPREAD, FLOP_SPREAD, MIN_POINTS = 1.5, 2.0, 3
# What sets a time that does not follow the FLOPs, on a GPU and on a CPU.
OVERHEAD = {True: "kernel launches", False: "per-operator dispatch overheads"}


# ---------------------------------------------------------------------------------------------- words


def versus(value: float, ref: float) -> str:
    """How `value` compares with `ref` in words that follow the numbers: 'equal to', '9% above',
    '37% below', or a ratio ('3.1×', '0.21×') when they are more than 2× apart."""
    r = value / ref
    if abs(r - 1) < 0.005:
        return "equal to"
    if 1 < r <= 2:
        return f"{r - 1:.0%} above"
    if 0.5 <= r < 1:
        return f"{1 - r:.0%} below"
    return times(r)


# ------------------------------------------------------------------------------------------ sizes


def size_2026(size: str) -> str | None:
    """The 2026 handout's name for a size of the same shape, or None."""
    return handout_name(size, "2026")


def size_label(size: str, handout: str = "2025") -> str:
    """The size's name in the handout's size table: a 2026 answer calls the 2.7B shape 'xl'."""
    return handout_name(size, handout) or size


def naming_2026(sizes) -> str:
    """The caveat line of a 2026 answer whose rows include the 2025 2.7B, named xl there."""
    if not any(s == "2.7B" for s in sizes):
        return ""
    d = SIZES_2026["xl"]
    return (
        f"xl here is the 2026 xl (d_model {d[0]}, d_ff {d[1]}, {d[2]} layers, {d[3]} heads), which this run has under "
        "its 2025 name 2.7B."
    )


def layers(size: str) -> int:
    """The number of layers of a size of the model table."""
    return MODEL_SIZES[size]["num_layers"]


def step_flops(size: str, batch: int, context: int, mode: str) -> float:
    """FLOPs of one step (forward, or forward+backward = 3× forward) of a handout model."""
    config = ModelConfig.from_size(size, context_length=context)
    return forward_flops(config, batch, context) * (1 if mode == "forward" else 3)


def size_flops(size: str) -> float:
    """Orders sizes by their FLOPs per token."""
    return step_flops(size, 1, 1, "forward")


def layer_bound(rows: pd.DataFrame) -> pd.DataFrame | None:
    """The smallest sizes (at least MIN_POINTS) whose time per layer stays within LAYER_SPREAD while their
    FLOPs per layer spread at least FLOP_SPREAD: timed by kernel launches, not FLOPs. Columns: size, ms,
    flops; None when no such group."""
    rows = rows.sort_values("flops").assign(layers=lambda d: d["size"].map(layers))
    found = None
    for k in range(MIN_POINTS, len(rows) + 1):
        head = rows.iloc[:k]
        per_layer, flops_per_layer = head.ms / head.layers, head.flops / head.layers
        if (
            per_layer.max() / per_layer.min() <= LAYER_SPREAD
            and flops_per_layer.max() / flops_per_layer.min() >= FLOP_SPREAD
        ):
            found = head
    return found


def layer_bound_sentence(
    group: pd.DataFrame | None, what: str, others: pd.DataFrame | None = None, gpu: bool = True
) -> str:
    """'For small, medium and large the forward takes 1.73–2.28 ms per layer while their FLOPs per layer grow
    2.8×: ...' — the sentence saying which times follow the layer count, or '' when the table does not show it."""
    if group is None:
        return ""
    per_layer = group.ms / group.layers
    flops_per_layer = group.flops / group.layers
    rate = group.flops / group.ms / 1e9
    tail = ""
    if others is not None and len(others):
        other_rate = others.flops / others.ms / 1e9
        tail = f", against {span(other_rate, '{:.2g}')} TFLOP/s for {and_join(others['size'].tolist())}"
    return (
        f"For {and_join(group['size'].tolist())} the {what} takes {span(per_layer, '{:.2f}')} ms per layer while "
        f"their FLOPs per layer grow {times(flops_per_layer.max() / flops_per_layer.min())} "
        f"({span(rate, '{:.2g}')} TFLOP/s{tail}): at these sizes the time follows the number of layers (the "
        f"{OVERHEAD[gpu]}), not the FLOPs, and is not the model's compute time."
    )


# ---------------------------------------------------------------------------------------- machine


def on_gpu(raw: pd.DataFrame) -> bool:
    """Whether a harness table was measured on a GPU (peak memory is only measured there)."""
    return "peak_memory_mib" in raw and raw["peak_memory_mib"].notna().any()


def machine(results: Results, notebook: str, gpu: bool) -> str:
    """The machine for prose; a run without a machine record that measured no GPU ran on the CPU."""
    name = results.gpu_name(notebook)
    return "the CPU" if not gpu and name == "this machine" else name


def cpu_caveat(gpu: bool, sizes) -> str:
    """What a CPU run leaves out, '' on a GPU."""
    if gpu:
        return ""
    names = list(dict.fromkeys(sizes))
    return (
        f"Measured on the CPU with the stand-in size{'s' * (len(names) > 1)} {and_join(names)}; the handout's sizes "
        "and a GPU's kernels are in the GPU report."
    )


def join_caveats(*parts: str) -> str:
    """The non-empty caveat sentences, in order."""
    return " ".join(p for p in parts if p)


# ============================================================================ benchmarking_script


HARNESS = (
    "`cs336_systems.benchmarking` (`BenchmarkConfig`, `run_benchmark`; on the command line "
    "`python -m cs336_systems.benchmarking --size … --context-length … --mode …`) builds a `TransformerLM` "
    "from a size name or from hyperparameters, draws a random batch of token ids, runs `warmup` untimed steps, "
    "then times `steps` steps with `timeit.default_timer`, calling `torch.cuda.synchronize()` after each"
)


def _sweep_sizes(sizes, handout: str) -> str:
    """The sweep's sizes by the names of `handout`'s table, those it lacks by the other handout's (the run names
    the 2026 xl "2.7B" and also has the 2025 xl, which the 2026 table has not), and sizes of neither table (the
    CPU profile's) by their own names."""
    sizes = list(dict.fromkeys(sizes))
    other = "2025" if handout == "2026" else "2026"
    own = [size_label(s, handout) for s in sizes if handout_name(s, handout)]
    theirs = [handout_name(s, other) for s in sizes if not handout_name(s, handout) and handout_name(s, other)]
    neither = [s for s in sizes if not handout_name(s, handout) and not handout_name(s, other)]
    if not theirs:
        return and_join(own + neither)
    parts = ([f"the {handout} table's {and_join(own)}"] if own else []) + [f"the {other} table's {and_join(theirs)}"]
    if neither:
        parts.append(and_join(neither))
    return ", and ".join(parts)


@builds_each_handout("benchmarking_script.a")
def _harness_answer(results: Results, handout: str) -> Answer:
    rows = results.table("by_size_raw")
    gpu = on_gpu(rows)
    n_ok, n_oom = int((rows.status == "ok").sum()), int((rows.status != "ok").sum())
    modes = (
        "`forward`, `forward-backward` or `train-step` (forward, loss, backward and the AdamW step)"
        if handout == "2026"
        else "`forward` or `forward-backward`"
    )
    text = (
        f"{HARNESS}; `--mode` picks {modes}. On {machine(results, NB_TIMING, gpu)} this run timed {len(rows)} "
        f"configurations of the size sweep with it ({_sweep_sizes(rows['size'], handout)}; "
        f"{and_join(sorted(set(rows['mode'])))}): {n_ok} ran"
        + (f" and {n_oom} ran out of memory, recorded as such rather than failing." if n_oom else ".")
    )
    timed = set(rows["mode"])
    caveat = ""
    if handout == "2026" and "train-step" not in timed:
        caveat = (
            "Notebook 01 times forward and forward+backward only; the full training step with the optimizer is "
            "timed under the profiler in notebook 02."
        )
    return Answer(text=text, caveat=caveat)


def _timing_rows(raw: pd.DataFrame) -> pd.DataFrame:
    """One row per size: forward and forward+backward mean/std, backward, layers, forward FLOPs."""
    ok = raw[raw.status == "ok"]
    wide = ok.pivot_table(index="size", columns="mode", values=["mean_ms", "std_ms"], aggfunc="first", sort=False)
    wide.columns = [f"{mode}_{stat}" for stat, mode in wide.columns]
    out = wide.reset_index()
    need = ["forward_mean_ms", "forward-backward_mean_ms"]
    if any(c not in out for c in need):
        raise NotAnswered("this run has no forward and forward+backward timings of the same sizes")
    out = out.dropna(subset=need)
    first = ok.drop_duplicates("size").set_index("size")
    out["context"] = out["size"].map(first.context_length).astype(int)
    out["batch"] = out["size"].map(first.batch_size).astype(int)
    out["layers"] = out["size"].map(layers)
    out["backward_ms"] = out["forward-backward_mean_ms"] - out["forward_mean_ms"]
    out["flops"] = [step_flops(s, b, c, "forward") for s, b, c in zip(out["size"], out.batch, out.context)]
    return out.sort_values("flops").reset_index(drop=True)


def _spread_sentence(t: pd.DataFrame, steps: int, handout: str) -> str:
    """Whether the standard deviation is small, per size, in words that follow the numbers."""
    cv = pd.DataFrame(
        {
            "size": [size_label(s, handout) for s in t["size"]],
            "forward": t.forward_std_ms / t.forward_mean_ms,
            "forward+backward": t["forward-backward_std_ms"] / t["forward-backward_mean_ms"],
        }
    )
    worst = cv[["forward", "forward+backward"]].max(axis=1)
    low, high = cv[worst <= 0.02], cv[worst > 0.02]
    if high.empty:
        return (
            f"The standard deviation over {steps} steps is small: at most {pct(worst.max())} of the mean for every "
            "size."
        )
    i = worst.idxmax()
    mode = "forward" if cv.loc[i, "forward"] >= cv.loc[i, "forward+backward"] else "forward+backward"
    where = f"{cv.loc[i, 'size']}'s {mode}"
    if low.empty:
        return (
            f"The standard deviation over {steps} steps is not small: {span(100 * worst, '{:.1f}', '%')} of the mean, "
            f"largest for {where}."
        )
    return (
        f"The standard deviation over {steps} steps is small for {and_join(low['size'].tolist())} (at most "
        f"{pct(worst[low.index].max())} of the mean) but not for {and_join(high['size'].tolist())} (up to "
        f"{pct(worst.max())}, {where})."
    )


def _timing_table(t: pd.DataFrame, handout: str, regimes: pd.DataFrame | None = None) -> pd.DataFrame:
    table = pd.DataFrame(
        {
            "size": [size_label(s, handout) for s in t["size"]],
            "layers": t.layers,
            "forward (ms)": t.forward_mean_ms.round(2),
            "forward std (ms)": t.forward_std_ms.round(2),
            "backward (ms)": t.backward_ms.round(2),
            "forward+backward (ms)": t["forward-backward_mean_ms"].round(2),
            "forward+backward std (ms)": t["forward-backward_std_ms"].round(2),
            "forward ms per layer": (t.forward_mean_ms / t.layers).round(2),
            "forward TFLOP/s": [float(f"{x:.3g}") for x in t.flops / t.forward_mean_ms / 1e9],
        }
    )
    if handout == "2026" and "train-step_mean_ms" in t:
        table["training step (ms)"] = t["train-step_mean_ms"].round(2)
        table["optimizer step (ms)"] = (t["train-step_mean_ms"] - t["forward-backward_mean_ms"]).round(2)
    if regimes is not None:  # the measured regime says what the per-layer time and FLOP rate only suggested
        table = table.drop(columns=["forward ms per layer", "forward TFLOP/s"])
        for mode in ("forward", "forward-backward"):
            label = regimes[regimes["mode"] == mode].set_index("size")["regime"]
            table[f"{MODE_WORDS[mode]} regime"] = t["size"].map(label).fillna("").to_numpy()
    return table


def _timing_answer(
    raw: pd.DataFrame, where: str, handout: str, sweep: pd.DataFrame | None = None, regimes: pd.DataFrame | None = None
) -> tuple[str, pd.DataFrame]:
    """The timing sentences and table of the rows at one context. With `regimes` (the launch measurement of the
    handout's sizes, every context: launch_regime.measured_regimes) the answer says which steps are
    launch-bound from it; without, it infers it where the table shows it (time per layer, context sweep)."""
    gpu = on_gpu(raw)
    t = _timing_rows(raw)
    steps = int(raw.steps.iloc[0])
    warm = int(raw.warmup.iloc[0])
    first, last = t.iloc[0], t.iloc[-1]
    context = int(first.context)
    ratio = t.backward_ms / t.forward_mean_ms
    spread = _spread_sentence(t, steps, handout)
    text = (
        f"On {where} at context {context} (batch {int(first.batch)}, {warm} warm-up and {steps} timed steps), "
        f"a forward pass takes {fmt_ms(first.forward_mean_ms)} ({size_label(first['size'], handout)}) to "
        f"{fmt_ms(last.forward_mean_ms)} ({size_label(last['size'], handout)}) and a backward pass "
        f"{fmt_ms(first.backward_ms)} to {fmt_ms(last.backward_ms)}, {span(ratio, '{:.1f}')}× the forward"
    )
    at = regimes[regimes.context_length == context] if regimes is not None else None
    if at is not None and len(at):
        # One sentence fewer for the measured regime's: the answer keeps to four.
        modes = ["forward", "forward-backward"] + (["train-step"] if handout == "2026" else [])
        name = lambda s: size_label(s, handout)  # noqa: E731
        extra = [c for c in (_context_inversion(regimes, context, name), _size_inversion(at, name)) if c]
        text += f"; {spread[0].lower() + spread[1:]} {regime_sentence(at, modes, name, extra=extra)}"
        return text, _timing_table(t, handout, at)
    text += ". " + spread
    forward = t.rename(columns={"forward_mean_ms": "ms"})
    group = layer_bound(forward[["size", "ms", "flops"]])
    if group is not None:
        rest = forward[~forward["size"].isin(group["size"])]
        text += " " + layer_bound_sentence(group, "forward", rest, gpu)
    elif sweep is not None:
        text += " " + _context_anomaly(sweep, t["size"].tolist(), context, handout, gpu)
    return text.strip(), _timing_table(t, handout)


def _context_inversion(regimes: pd.DataFrame, context: int, name) -> str:
    """The clause for a size whose forward is shorter eager at `context` than at the next shorter measured
    context although its FLOPs grow, with both as CUDA graphs. '' when no size shows it or a graph is missing."""
    fwd = regimes[regimes["mode"] == "forward"]
    for (size, _), g in fwd.groupby(["size", "precision"], sort=False):
        g = g.set_index("context_length").sort_index()
        shorter = g[g.index < context]
        if context not in g.index or shorter.empty:
            continue
        now, before = g.loc[context], shorter.iloc[-1]
        if now.mean_ms >= before.mean_ms or now.graphed_ms != now.graphed_ms or before.graphed_ms != before.graphed_ms:
            continue
        growth = step_flops(size, int(now.batch_size), context, "forward") / step_flops(
            size, int(now.batch_size), int(before.name), "forward"
        )
        ordered = ", in the order of its FLOPs" if now.graphed_ms > before.graphed_ms else ""
        return (
            f"{name(size)}'s forward is shorter eager at context {context} ({fmt_ms(now.mean_ms)}) than at "
            f"{int(before.name)} ({fmt_ms(before.mean_ms)}) although its FLOPs grow {times(growth)}, while as CUDA "
            f"graphs it takes {fmt_ms(before.graphed_ms)} at {int(before.name)} and {fmt_ms(now.graphed_ms)} at "
            f"{context}{ordered}"
        )
    return ""


def _size_inversion(at: pd.DataFrame, name) -> str:
    """The clause for the first pair of sizes, next to each other in FLOPs, whose larger one is faster eager in the
    same precision and pass while one of them is launch-bound, with both as CUDA graphs (the forward+backward
    looked at first). '' when none."""
    order = {"forward-backward": 0, "forward": 1, "train-step": 2}
    groups = sorted(at.groupby(["precision", "mode"], sort=False), key=lambda kv: order.get(kv[0][1], 3))
    for (precision, mode), g in groups:
        g = g.sort_values("size", key=lambda sizes: sizes.map(size_flops))
        for a, b in zip(g.itertuples(), g.iloc[1:].itertuples()):
            if (
                b.mean_ms >= a.mean_ms
                or LAUNCH_BOUND not in (a.regime, b.regime)
                or a.graphed_ms != a.graphed_ms
                or b.graphed_ms != b.graphed_ms
            ):
                continue
            what = f"{precision} {MODE_WORDS[mode]}" if at["precision"].nunique() > 1 else MODE_WORDS[mode]
            ordered = ", in the order of their sizes" if a.graphed_ms < b.graphed_ms else ""
            return (
                f"the {layers(a.size)}-layer {name(a.size)}'s {what} is slower eager than the {layers(b.size)}-layer "
                f"{name(b.size)}'s ({fmt_ms(a.mean_ms)} against {fmt_ms(b.mean_ms)}) although it is the smaller "
                f"model, while as CUDA graphs they take {fmt_ms(a.graphed_ms)} and {fmt_ms(b.graphed_ms)}{ordered}"
            )
    return ""


def _context_anomaly(sweep: pd.DataFrame, sizes: list[str], context: int, handout: str, gpu: bool = True) -> str:
    """The sentence for a size whose forward is shorter at `context` than at the next shorter context of the
    sweep although its FLOPs grow: its times are launch-bound. '' when no size shows it."""
    ok = sweep[(sweep.status == "ok") & (sweep["mode"] == "forward") & sweep["size"].isin(sizes)]
    for size, g in ok.groupby("size", sort=False):
        g = g.set_index("context_length").mean_ms.sort_index()
        shorter = g[g.index < context]
        if context not in g or shorter.empty or g[context] >= shorter.iloc[-1]:
            continue
        before = int(shorter.index[-1])
        batch = int(sweep.batch_size.iloc[0])
        growth = step_flops(size, batch, context, "forward") / step_flops(size, batch, before, "forward")
        label = size_label(size, handout)
        return (
            f"{label[0].upper() + label[1:]}'s forward is shorter at context {context} "
            f"({fmt_ms(g[context])}) than at {before} ({fmt_ms(shorter.iloc[-1])}) although its FLOPs grow "
            f"{times(growth)}: at this size the time is set by {OVERHEAD[gpu]} and their noise, not by the FLOPs, "
            f"and is not the model's compute time."
        )
    return ""


@builds("benchmarking_script.b")
def benchmarking_script_b(results: Results) -> Answer:
    raw = results.table("by_size_raw")
    gpu = on_gpu(raw)
    regimes = measured_regimes(_rows_of(raw, "2025"))
    raw = _at_context(_rows_of(raw, "2025"), DEFAULT_CONTEXT["2025"])
    text, table = _timing_answer(raw, machine(results, NB_TIMING, gpu), "2025", regimes=regimes)
    text = join_caveats(text, _oom_sentence(raw, "2025", gpu))
    return Answer(text=text, table=table, caveat=cpu_caveat(gpu, raw["size"]))


def _rows_of(raw: pd.DataFrame, handout: str) -> pd.DataFrame:
    """The rows of the handout's sizes (every size when the run has none of them)."""
    keep = raw["size"].map(lambda s: handout_name(s, handout)).notna()
    return raw[keep] if keep.any() else raw


def _rows_2026(raw: pd.DataFrame) -> pd.DataFrame:
    """The rows of the 2026 sizes (every size when the run has none of them)."""
    return _rows_of(raw, "2026")


def _at_context(raw: pd.DataFrame, context: int) -> pd.DataFrame:
    """The rows at `context`, or at the table's first context when it has none there."""
    if raw.empty or (raw.context_length == context).any():
        return raw[raw.context_length == context] if len(raw) else raw
    return raw[raw.context_length == raw.context_length.iloc[0]]


def _with_predictions(raw: pd.DataFrame, gpu: bool) -> pd.DataFrame:
    """The rows with their analytic peaks: the notebook's columns, else computed here."""
    if "predicted_peak_gib" in raw and raw["predicted_peak_gib"].notna().all():
        return raw
    return pd.concat(
        [
            raw.drop(columns=["predicted_peak_gib", "predicted_states_gib"], errors="ignore"),
            predicted_peaks(raw, "cuda" if gpu else "cpu"),
        ],
        axis=1,
    )


def _oom_sentence(raw: pd.DataFrame, handout: str, gpu: bool) -> str:
    """For each size with a step that ran out of memory: which steps, the analytic peak of the largest, and what
    parameters, gradients and optimizer state take of it before any activation. '' when all fit."""
    if "status" not in raw or not (raw.status == "OOM").any():
        return ""
    rows = _with_predictions(raw, gpu)
    several = rows["precision"].nunique() > 1
    out = []
    for size, g in rows[rows.status == "OOM"].groupby("size", sort=False):
        modes = [m for m in MODE_WORDS if m in set(g["mode"])]
        top = g[g["mode"] == modes[-1]].sort_values("precision", ascending=False)
        precisions = list(top["precision"])
        peaks = (
            and_join([f"{r.predicted_peak_gib:.0f} GiB in {r.precision}" for r in top.itertuples()])
            if several
            else f"{top.predicted_peak_gib.iloc[0]:.0f} GiB"
        )
        what = MODE_WORDS[modes[-1]] if several else f"{precisions[0]} {MODE_WORDS[modes[-1]]}"
        text = (
            f"{size_label(size, handout)} runs out of memory for the {and_join([MODE_WORDS[m] for m in modes])}"
            + (f" in {and_join(list(dict.fromkeys(g['precision'])))}" if several else "")
            + f": the analytic peak of its {what} is {peaks}, of which {STATE_WORDS[modes[-1]]} alone take "
            f"{top.predicted_states_gib.iloc[0]:.0f} GiB before any activation"
            + (" (bf16 autocast keeps them in fp32)" if "bf16" in precisions else "")
        )
        if "device_memory_gib" in g and g["device_memory_gib"].notna().any():
            text += f", more than the GPU's {g['device_memory_gib'].max():.0f} GiB"
        fits = rows[(rows["size"] == size) & (rows.status == "ok")]
        if len(fits):
            ran = fits.sort_values("precision", ascending=False).drop_duplicates("mode")
            text += "; " + and_join([f"its {MODE_WORDS[r.mode]} fits ({fmt_ms(r.mean_ms)})" for r in ran.itertuples()])
        out.append(text + ".")
    return " ".join(out)


def _train_step_sentence(t: pd.DataFrame, handout: str) -> str:
    """The full training step, smallest and largest size, and its optimizer step (training step less
    forward+backward) where that difference exceeds the run-to-run spread of the two timings it is taken from
    (their standard deviations combined); for the other sizes the sentence says the difference cannot be read."""
    if "train-step_mean_ms" not in t or t["train-step_mean_ms"].isna().all():
        return ""
    s = t.dropna(subset=["train-step_mean_ms"]).reset_index(drop=True)
    label = lambda size: size_label(size, handout)  # noqa: E731
    first, last = s.iloc[0], s.iloc[-1]
    text = (
        f"A full training step with AdamW (forward, loss, backward and the optimizer step) takes "
        f"{fmt_ms(first['train-step_mean_ms'])} ({label(first['size'])}) to "
        f"{fmt_ms(last['train-step_mean_ms'])} ({label(last['size'])})"
    )
    optimizer = s["train-step_mean_ms"] - s["forward-backward_mean_ms"]
    spread = np.hypot(*(s[f"{mode}_std_ms"].fillna(0.0) for mode in ("forward-backward", "train-step")))
    readable = optimizer > spread
    if readable.any():
        o = optimizer[readable]
        low, high = o.idxmin(), o.idxmax()
        share = 100 * o / s.loc[readable, "train-step_mean_ms"]
        text += (
            f"; the optimizer step, the training step less the forward+backward, adds {fmt_ms(o[low])} "
            f"({label(s.at[low, 'size'])})"
            + (f" to {fmt_ms(o[high])} ({label(s.at[high, 'size'])})" if high != low else "")
            + f", {span(share, '{:.0f}', '%')} of the step"
        )
    if not readable.all():
        lost = s[~readable]
        text += (
            f"; for {and_join([label(x) for x in lost['size']])} that difference "
            f"({and_join([fmt_ms(x) for x in optimizer[~readable]])}) is no larger than the run-to-run spread of "
            f"the two timings it is taken from ({and_join([fmt_ms(x) for x in spread[~readable]])}, their standard "
            f"deviations combined), so these runs cannot time their optimizer step"
        )
    return text + "."


@builds("benchmarking_script.b.2026")
def benchmarking_script_b_2026(results: Results) -> Answer:
    """The 2026 sizes at the 2026 default context 512 where the context sweep has it."""
    by_size = _rows_2026(results.table("by_size_raw"))
    gpu = on_gpu(by_size)
    raw, sweep = by_size, None
    if results.has("context_sweep_raw"):
        sweep = _rows_2026(results.table("context_sweep_raw"))
        if (sweep.context_length == 512).any() and not (raw.context_length == 512).any():
            raw = sweep[sweep.context_length == 512]
    raw = _at_context(raw, DEFAULT_CONTEXT["2026"])
    text, table = _timing_answer(
        raw, machine(results, NB_TIMING, gpu), "2026", sweep=sweep, regimes=measured_regimes(by_size)
    )
    text = join_caveats(text, _train_step_sentence(_timing_rows(raw), "2026"), _oom_sentence(raw, "2026", gpu))
    context = int(raw.context_length.iloc[0])
    present = {size_2026(s) for s in raw["size"]}
    missing = [s for s in SIZES_2026 if s not in present]
    caveat = join_caveats(
        f"This run has no {and_join(missing)} model{'s' * (len(missing) > 1)}." if missing else "",
        naming_2026(raw["size"]),
        "" if context == 512 else f"It is at context {context}, not the 2026 default 512.",
        ""
        if "train-step" in set(raw["mode"])
        else "The optimizer step is not timed by the Python timer here; notebook 02 profiles a full training step with "
        "AdamW.",
        cpu_caveat(gpu, raw["size"]),
    )
    return Answer(text=text, table=table, caveat=caveat)


def _warmed_step_in_the_sweep(raw: pd.DataFrame, ref: pd.Series) -> str:
    """The warmed-up step beside the size sweep's time of the same configuration (size, context, fp32
    forward+backward, as many warm-up steps), where the two differ by more than a fifth: each warm-up setting runs
    in a fresh process (`run_isolated`), the sweep in the notebook's own, and a launch-bound step's time is the
    host's launch pace."""
    if raw.empty or "warmup" not in raw:
        return ""
    context = int(raw.context_length.iloc[0])
    same = raw[
        (raw["size"] == ref["size"])
        & (raw["mode"] == "forward-backward")
        & (raw["status"] == "ok")
        & (raw["context_length"] == context)
        & (raw["warmup"] == ref["warmup"])
        & (raw.get("precision", "fp32") == "fp32")
    ]
    if same.empty:
        return ""
    sweep = same.iloc[0]
    ratio = max(sweep.mean_ms, ref.mean_ms) / min(sweep.mean_ms, ref.mean_ms)
    if ratio < 1.2:
        return ""
    regimes = measured_regimes(same)
    measured = regimes.iloc[0] if regimes is not None else None
    why = (
        f", and this launch-bound step (the GPU busy {measured.busy_fraction:.0%} of it in the sweep) runs at the pace "
        "at which its process's host launches the kernels"
        if measured is not None and measured.regime == LAUNCH_BOUND
        else ""
    )
    return (
        f" The same step after the same {int(ref['warmup'])} warm-up steps took {fmt_ms(sweep.mean_ms)} in the "
        f"notebook's size sweep (same context and batch), {times(sweep.mean_ms / ref.mean_ms)} the "
        f"{fmt_ms(ref.mean_ms)} here, as each warm-up setting here runs in a fresh process and the size sweep in the "
        f"notebook's own{why}."
    )


def _warmup_answer(results: Results) -> Answer:
    warm = results.table("warmup").sort_values("warmup").reset_index(drop=True)
    if 0 not in set(warm.warmup) or len(warm) < 2:
        raise NotAnswered("the run has no timing without warm-up to compare with")
    per_step = results.table("warmup_steps") if results.has("warmup_steps") else None
    raw = results.table("by_size_raw") if results.has("by_size_raw") else pd.DataFrame()
    gpu = on_gpu(raw) if len(raw) else results.gpu_name(NB_TIMING) not in ("the CPU", "this machine")
    w0, ref = warm[warm.warmup == 0].iloc[0], warm.iloc[-1]
    size, n, k = w0["size"], int(ref.steps), int(ref.warmup)
    context = f" at context {int(raw.context_length.iloc[0])}" if len(raw) else ""
    text = (
        f"Without warm-up, the mean of {n} forward+backward steps of {size}{context} is {fmt_ms(w0.mean_ms)} ± "
        f"{fmt_ms(w0.std_ms)}, against {fmt_ms(ref.mean_ms)} ± {fmt_ms(ref.std_ms)} after {k} warm-up steps, a mean "
        f"{versus(w0.mean_ms, ref.mean_ms)} the warmed-up one and a standard deviation "
        f"{times(w0.std_ms / max(ref.std_ms, 1e-9))} as large"
    )
    medians = f"{fmt_ms(w0.median_ms)} and {fmt_ms(ref.median_ms)}"
    if per_step is not None:
        first = per_step[(per_step.warmup == 0) & (per_step.step == 0)].ms.iloc[0]
        steady = per_step[(per_step.warmup == k) & (per_step.phase == "measured")].ms.median()
        text += (
            f"; the medians are {medians}, and the very first step alone takes {fmt_ms(first)}, "
            f"{versus(first, steady)} a steady step ({fmt_ms(steady)})."
        )
    elif w0.mean_ms > 1.2 * w0.median_ms and abs(w0.median_ms / ref.median_ms - 1) < 0.1:
        text += f"; the medians barely differ ({medians}), so a few outlying steps carry the excess."
    else:
        text += f"; the medians are {medians}."
    slower = w0.mean_ms > ref.mean_ms + ref.std_ms
    if slower:
        text += (
            " The first step of a process pays one-time costs that are not the model's work: creating the CUDA "
            "context and library handles, loading and selecting kernels, and the caching allocator requesting memory "
            "from the driver."
            if gpu
            else " The first step of a process pays one-time costs that are not the model's work: first calls that "
            "fill PyTorch's dispatcher and allocator caches, and memory the process requests from the system."
        )
    else:
        text += (
            f" So the run without warm-up is not slower here by more than one standard deviation "
            f"({fmt_ms(ref.std_ms)}): whatever one-time costs the first step pays are lost in the step-to-step noise "
            f"of this machine."
        )
    mid = warm[warm.warmup.isin([1, 2])]
    if len(mid):
        gap = mid.mean_ms - ref.mean_ms
        if (gap.abs() <= ref.std_ms).all():
            judged = (
                ": each within one standard deviation of it, so one step already absorbs most of the one-time cost "
                "and what may remain (the allocator still growing, clocks ramping up under load) is smaller than "
                "the step-to-step noise here"
            )
        elif (gap > ref.std_ms).any():
            judged = (
                ", above it by more than one standard deviation: the one-time costs need not all fall in the first "
                "step (the allocator keeps growing while the backward allocates its buffers, clocks ramp up under "
                "load), and step-to-step noise adds to the difference"
            )
        else:
            low = mid.mean_ms[gap < -ref.std_ms]
            judged = (
                f", and {and_join([fmt_ms(m) for m in low])} lie{'s' * (len(low) == 1)} more than one standard "
                f"deviation below it, which leftover one-time costs cannot explain: these means vary from run to run "
                f"by more than the warm-up changes them"
            )
        text += (
            f" With {and_join([str(int(w)) for w in mid.warmup])} warm-up step{'s' * (len(mid) > 1)} the means are "
            f"{and_join([fmt_ms(m) for m in mid.mean_ms])}, {and_join([versus(m, ref.mean_ms) for m in mid.mean_ms])} "
            f"the {k}-step mean{judged}."
        )
    text += _warmed_step_in_the_sweep(raw, ref)
    has_figure = (results.folder / "figures" / "warmup_steps.png").exists()
    table = (
        None
        if has_figure
        else warm.rename(
            columns={
                "warmup": "warm-up steps",
                "mean_ms": "mean (ms)",
                "std_ms": "std (ms)",
                "median_ms": "median (ms)",
                "min_ms": "min (ms)",
            }
        ).round(2)
    )
    return Answer(
        text=text,
        figure=results.figure("warmup_steps") if has_figure else None,
        table=table,
        caveat=cpu_caveat(gpu, [size]),
    )


@builds("benchmarking_script.c")
def benchmarking_script_c(results: Results) -> Answer:
    return _warmup_answer(results)


@builds("benchmarking_script.c.2026")
def benchmarking_script_c_2026(results: Results) -> Answer:
    a = _warmup_answer(results)
    a.caveat = join_caveats(
        "Measured on one size for forward+backward; the 2026 default context 512 and the full training step with the "
        "optimizer are not part of this comparison.",
        a.caveat,
    )
    return a


# ================================================================== mixed_precision_accumulation


@builds("mixed_precision_accumulation")
def mixed_precision_accumulation(results: Results) -> Answer:
    t = results.table("accumulation")
    handout_rows = t[t.in_handout.astype(str).str.lower() == "true"]
    r = {
        (row.accumulator, row.addend, str(row.explicit_upcast).lower() == "true"): row
        for row in handout_rows.itertuples()
    }
    try:
        fp32, fp16 = r[("fp32", "fp32", False)], r[("fp16", "fp16", False)]
        mixed, upcast = r[("fp32", "fp16", False)], r[("fp32", "fp16", True)]
    except KeyError as missing:
        raise NotAnswered(f"the accumulation table lacks the handout's case {missing}") from None
    n = round(fp32.result / fp32.addend_as_stored) if fp32.addend_as_stored else 1000
    same = "the same" if mixed.result == upcast.result else f"{upcast.result:.6f} with the explicit cast"
    text = (
        f"fp32 throughout gives {fp32.result:.6f} (error {fp32.abs_error:.1e}): 0.01 has no exact binary form and "
        f"every addition rounds, but to fp32's spacing near 10 ({fp32.accumulator_spacing_at_result:.1e}), so the "
        f"error stays tiny. fp16 throughout gives {fp16.result:.6f}, off by {fp16.abs_error:.3f}, because near 10 "
        f"consecutive fp16 numbers are {fp16.accumulator_spacing_at_result:g} apart, close to 0.01 itself, so each "
        "addition is rounded by a large part of the addend. An fp32 accumulator with fp16 addends gives "
        f"{mixed.result:.6f} ({same} "
        f"whether the addend is cast implicitly or explicitly): its whole error, {mixed.abs_error:.1e}, is the fp16 "
        f"rounding of 0.01 ({mixed.addend_rounding_error:+.1e}) added {n} times, so accumulating in fp32 keeps the "
        f"sum accurate even with low-precision inputs."
    )
    columns = ["accumulator", "addend", "explicit_upcast", "result", "abs_error", "accumulator_spacing_at_result"]
    table = handout_rows[columns].rename(
        columns={
            "explicit_upcast": "addend cast to fp32",
            "abs_error": "error",
            "accumulator_spacing_at_result": "accumulator spacing near the result",
        }
    )
    return Answer(text=text, table=table)


# ================================================================== benchmarking_mixed_precision


@builds("benchmarking_mixed_precision.a")
def benchmarking_mixed_precision_a(results: Results) -> Answer:
    t = results.table("toy_model_dtypes")
    d = dict(zip(t.component, t.dtype))
    if "device" in t:
        gpu = bool((t.device == "cuda").any())
    elif results.has("precision_raw"):
        gpu = on_gpu(results.table("precision_raw"))
    else:
        gpu = results.gpu_name(NB_PRECISION) not in ("the CPU", "this machine")
    where = machine(results, NB_PRECISION, gpu)
    get = lambda key: d.get(key, "not recorded")  # noqa: E731
    text = (
        f"Observed with forward hooks under `torch.autocast(dtype=torch.float16)` on {where}: the parameters stay "
        f"**{get('model parameters inside autocast (fc1.weight)')}** (autocast casts copies for each operation), fc1's "
        f"output is **{get('output of fc1')}**, the layer norm's output **{get('output of ln')}**, the logits "
        f"**{get('logits')}**, the loss **{get('loss')}**, and the gradients **{get('gradients (all parameters)')}**, "
        f"the dtype of the parameters they belong to."
    )
    caveat = (
        ""
        if gpu
        else (
            "The handout asks about a GPU; this table comes from CPU autocast, whose lists of "
            "low-precision and fp32 operations differ from CUDA's, so the GPU report's table is the answer."
        )
    )
    table = t[["component", "dtype"]].rename(columns={"dtype": "dtype under fp16 autocast"})
    return Answer(text=text, table=table, caveat=caveat)


@builds("benchmarking_mixed_precision.b")
def benchmarking_mixed_precision_b(results: Results) -> Answer:
    ln = results.table("layer_norm_sensitivity")
    fp16, bf16 = ln[ln.dtype == "fp16"], ln[ln.dtype == "bf16"]
    centred, offset = fp16[fp16.input_offset == 0], fp16[fp16.input_offset > 0]
    sq_over = centred[~np.isfinite(centred.sum_of_squares_rel_error.astype(float))].input_scale
    var_over = centred[~np.isfinite(centred.variance_rel_error.astype(float))].input_scale
    offset_over = offset[~np.isfinite(offset.sum_of_squares_rel_error.astype(float))]
    parts = []
    if len(sq_over):
        parts.append(
            f"in fp16 the sum of squares overflows 65,504 (fp16's largest value) already for zero-mean inputs "
            f"of scale {sq_over.min():g}"
        )
        if len(offset_over):
            parts[-1] += f" and for inputs offset by {offset_over.input_offset.min():g}"
    if len(var_over):
        wrong = fp16[fp16.input_scale >= var_over.min()].output_rel_error.max()
        parts.append(
            f"the variance itself from scale {var_over.min():g}, after which the normalised output is wrong "
            f"(relative error {wrong:.2f})"
        )
    fp16_part = "; ".join(parts) if parts else f"in fp16 the largest output error is {fp16.output_rel_error.max():.1e}"
    bf16_variance = 100 * bf16.variance_rel_error.median()
    text = (
        f"The reductions are the sensitive part of layer norm, the mean and above all the variance (a sum of squares; "
        f"each step computed here in each dtype and compared with fp64): {fp16_part}; and "
        f"ε = 1e-5 is below fp16's smallest normal number. With bf16 nothing overflows, since it has fp32's exponent "
        f"range, but with 8 significant bits the variance is only accurate to about {bf16_variance:.1g}% "
        f"and an input offset from zero loses up to {bf16.output_rel_error.max():.0%} of the output to cancellation "
        f"in x − mean, so layer norm's statistics should still be computed in fp32 with bf16 — which is what "
        f"autocast does for both dtypes."
    )
    keep = ln[ln.dtype.isin(["fp16", "bf16"])]
    table = keep.pivot_table(
        index=["input_scale", "input_offset"],
        columns="dtype",
        values=["variance_rel_error", "output_rel_error"],
        aggfunc="first",
    )
    table.columns = [
        f"{dt} {'variance' if v.startswith('variance') else 'output'} relative error" for v, dt in table.columns
    ]
    table = table.reset_index().rename(columns={"input_scale": "input scale", "input_offset": "input offset"})
    table = table[
        [c for c in table.columns if not c.endswith("error")]
        + sorted([c for c in table.columns if c.endswith("error")], key=lambda c: (not c.startswith("fp16"), c))
    ]
    return Answer(text=text, table=table.round(4))


def _precision_rows(raw: pd.DataFrame) -> pd.DataFrame:
    ok = raw[raw.status == "ok"]
    wide = ok.pivot_table(index="size", columns=["mode", "precision"], values="mean_ms", aggfunc="first", sort=False)
    wide.columns = [f"{mode} {prec}" for mode, prec in wide.columns]
    out = wide.reset_index()
    need = ["forward fp32", "forward bf16", "forward-backward fp32", "forward-backward bf16"]
    if any(c not in out for c in need):
        raise NotAnswered("this run lacks fp32 or bf16 timings of forward and forward+backward")
    out = out.dropna(subset=need)
    first = ok.drop_duplicates("size").set_index("size")
    out["context"] = out["size"].map(first.context_length).astype(int)
    out["batch"] = out["size"].map(first.batch_size).astype(int)
    out["layers"] = out["size"].map(layers)
    out["flops"] = [step_flops(s, b, c, "forward-backward") for s, b, c in zip(out["size"], out.batch, out.context)]
    out["speedup fwd"] = out["forward fp32"] / out["forward bf16"]
    out["speedup fb"] = out["forward-backward fp32"] / out["forward-backward bf16"]
    if {"train-step fp32", "train-step bf16"} <= set(out):
        out["speedup ts"] = out["train-step fp32"] / out["train-step bf16"]
    return out.sort_values("flops").reset_index(drop=True)


def _graphed_speedup(at: pd.DataFrame, name) -> str:
    """The clause giving bf16's forward+backward speed-up over fp32 with both steps replayed as CUDA graphs (the
    GPU's work alone, launches removed), for the sizes where both were. '' when none."""
    fb = at[at["mode"] == "forward-backward"].pivot_table(
        index="size", columns="precision", values="graphed_ms", aggfunc="first", sort=False
    )
    if not {"fp32", "bf16"} <= set(fb.columns):
        return ""
    ratio = (fb["fp32"] / fb["bf16"]).dropna()
    if ratio.empty:
        return ""
    return (
        "without the launches, as CUDA graphs, bf16 runs the forward+backward "
        + and_join([f"{times(v)} ({name(size)})" for size, v in ratio.items()])
        + " as fast as fp32"
    )


def _speedup_trend(t: pd.DataFrame) -> str:
    """How the forward+backward speed-up moves with model size, in words the points support: a direction only
    from MIN_POINTS + 1 sizes or more and only when it is monotonic; otherwise the values."""
    s = t["speedup fb"]
    if len(t) < MIN_POINTS + 1:
        return ""
    if s.is_monotonic_increasing:
        return "the speed-up grows at every step up in size"
    if s.is_monotonic_decreasing:
        return "the speed-up shrinks at every step up in size"
    return "the speed-up does not move monotonically with size"


def _precision_answer(results: Results, handout: str) -> Answer:
    raw = _rows_of(results.table("precision_raw"), handout)
    gpu = on_gpu(raw)
    regimes = measured_regimes(raw)
    raw = _at_context(raw, DEFAULT_CONTEXT[handout])
    t = _precision_rows(raw)
    where = machine(results, NB_PRECISION, gpu)
    first, last = t.iloc[0], t.iloc[-1]
    name = lambda s: size_label(s, handout)  # noqa: E731

    def change(r, mode="forward-backward"):
        f, b = r[f"{mode} fp32"], r[f"{mode} bf16"]
        how = f"{times(f / b)} faster" if b < f else f"{times(b / f)} slower" if b > f else "no change"
        return f"from {fmt_ms(f)} to {fmt_ms(b)} for {name(r['size'])} ({how})"

    at = regimes[regimes.context_length == int(first.context)] if regimes is not None else None
    measured = at is not None and len(at)
    text = (
        f"On {where} at context {int(first.context)}, bf16 autocast changes forward+backward {change(first)} and "
        f"{change(last)}; the forward alone runs {times(first['speedup fwd'])} and {times(last['speedup fwd'])} as "
        f"fast as in fp32"
    )
    if len(t) > 2:
        trend = _speedup_trend(t)
        speedups = and_join([times(v) for v in t["speedup fb"]])
        # Measured, the regime's sentence follows; this one joins the first to keep the answer to four.
        text += (
            f"; over all {len(t)} sizes, smallest to largest, the forward+backward speed-ups are {speedups}"
            + (f" ({trend})" if trend else "")
            if measured
            else f". Over all {len(t)} sizes, smallest to largest, the forward+backward speed-ups are {speedups}"
            + (f": {trend}" if trend else "")
        )
    text += ". "
    bf = t.assign(ms=t["forward-backward bf16"])[["size", "ms", "flops"]]
    group = layer_bound(bf)
    if measured:
        modes = ["forward", "forward-backward"] + (["train-step"] if handout == "2026" else [])
        extra = [c for c in (_size_inversion(at, name), _graphed_speedup(at, name)) if c]
        text += regime_sentence(at, modes, name, extra=extra) + " "
    elif group is not None and gpu:
        g = group.assign(layers=group["size"].map(layers))
        per_layer = g.ms / g.layers
        fpl = g.flops / g.layers
        text += (
            f"The bf16 times follow the number of layers, not the FLOPs: forward+backward takes "
            f"{span(per_layer)} ms per layer for {and_join(g['size'].map(name).tolist())} while their FLOPs per "
            f"layer grow {times(fpl.max() / fpl.min())}"
        )
        inverted = [(a, b) for a, b in zip(g.itertuples(), g.iloc[1:].itertuples()) if b.ms < a.ms]
        if inverted:
            a, b = inverted[0]
            text += (
                f" (the {a.layers}-layer {name(a.size)}, {fmt_ms(a.ms)}, is slower than the {b.layers}-layer "
                f"{name(b.size)}, {fmt_ms(b.ms)})"
            )
        text += (
            ", so in bf16 these steps are bound by kernel launches (autocast adds cast kernels too), and the speed-ups "
            "measure how far each fp32 step is above that floor rather than the tensor cores' full gain on the "
            "matmuls. "
        )
    if handout == "2026" and "speedup ts" in t and t["speedup ts"].notna().any():
        ts = t.dropna(subset=["speedup ts"])
        text += (
            f"The full training step with AdamW changes {change(ts.iloc[0], 'train-step')} and "
            f"{change(ts.iloc[-1], 'train-step')}, the optimizer step itself running in fp32 in both. "
        )
    text = join_caveats(text.strip(), _oom_sentence(raw, handout, gpu))
    table = pd.DataFrame(
        {
            "size": t["size"].map(name),
            "layers": t.layers,
            "forward fp32 (ms)": t["forward fp32"].round(2),
            "forward bf16 (ms)": t["forward bf16"].round(2),
            "forward speed-up": t["speedup fwd"].round(2),
            "fwd+bwd fp32 (ms)": t["forward-backward fp32"].round(2),
            "fwd+bwd bf16 (ms)": t["forward-backward bf16"].round(2),
            "fwd+bwd speed-up": t["speedup fb"].round(2),
            "fwd+bwd bf16 ms per layer": (t["forward-backward bf16"] / t.layers).round(2),
        }
    )
    if handout == "2026" and "speedup ts" in t:
        table["train step fp32 (ms)"] = t["train-step fp32"].round(2)
        table["train step bf16 (ms)"] = t["train-step bf16"].round(2)
        table["train step speed-up"] = t["speedup ts"].round(2)
    if measured:
        fb = at[at["mode"] == "forward-backward"].pivot_table(
            index="size", columns="precision", values="graphed_ms", aggfunc="first"
        )
        if {"fp32", "bf16"} <= set(fb.columns):
            table["fwd+bwd speed-up as CUDA graphs"] = t["size"].map(fb["fp32"] / fb["bf16"]).round(2).to_numpy()
        label = at[(at["mode"] == "forward-backward") & (at["precision"] == "bf16")].set_index("size")["regime"]
        table["fwd+bwd bf16 regime"] = t["size"].map(label).fillna("").to_numpy()
    caveat = cpu_caveat(gpu, t["size"])
    if not gpu:
        caveat = join_caveats(caveat, "On a CPU these bf16 timings say nothing about a GPU's tensor cores.")
    if handout == "2026":
        present = {size_2026(s) for s in raw["size"]}
        missing = [s for s in SIZES_2026 if s not in present]
        caveat = join_caveats(
            f"This run has no {and_join(missing)} model{'s' * (len(missing) > 1)}." if missing else "",
            naming_2026(t["size"]),
            "" if int(first.context) == 512 else f"It is at context {int(first.context)}, not the 2026 default 512.",
            caveat,
        )
    return Answer(text=text, table=table, caveat=caveat)


@builds("benchmarking_mixed_precision.c")
def benchmarking_mixed_precision_c(results: Results) -> Answer:
    return _precision_answer(results, "2025")


@builds("benchmarking_mixed_precision.c.2026")
def benchmarking_mixed_precision_c_2026(results: Results) -> Answer:
    return _precision_answer(results, "2026")
