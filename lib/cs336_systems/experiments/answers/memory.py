"""Answers of memory: `memory_profiling` (notebook 05, both handouts) and `gradient_checkpointing` (notebook 06).

The 2026 handout asks `memory_profiling` (a)-(e) of its xl model (d_model 2560, d_ff 10240, 32 layers,
32 heads: the 2025 handout's 2.7B shape) at contexts 128 and 2048; the `.2026` answers take those
rows where the run has them and say in the caveat which of them it lacks.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from cs336_systems.experiments.answers import NotAnswered, Results, builds, builds_each_handout
from cs336_systems.experiments.answers.words import and_join
from cs336_systems.report.answers import Answer

PROFILING = "05_memory_profiling"
CHECKPOINTING = "06_gradient_checkpointing"
MIB, GIB = 2**20, 2**30
XL_2026 = dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32)
XL_2025 = dict(d_model=1600, d_ff=6400, num_layers=48, num_heads=25)
CONTEXTS_2025 = (128, 256, 512)
CONTEXTS_2026 = (128, 2048)
MODEL_KEYS = ("d_model", "d_ff", "num_layers", "num_heads")


# ---------------------------------------------------------------- shared wording


def _num(x: float) -> str:
    """A size for prose: three significant digits, thousands separated (0.0625, 2.65, 174, 8,551)."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _contexts(contexts) -> str:
    contexts = list(contexts)
    return f"context{'s' if len(contexts) > 1 else ''} {and_join(contexts)}"


def _dims(model: dict) -> str:
    return f"d_model {model['d_model']}, d_ff {model['d_ff']}, {model['num_layers']} layers, {model['num_heads']} heads"


def _same(model: dict, dims: dict) -> bool:
    return all(int(model[k]) == v for k, v in dims.items())


def _model_name(model: dict, handout: str) -> str:
    """How a handout names the measured model: '2.7B' / 'xl' where the shape is the handout's, else by its size."""
    if _same(model, XL_2026):
        return f"the xl model ({_dims(model)})" if handout == "2026" else f"the 2.7B model ({_dims(model)})"
    if _same(model, XL_2025):
        return f"the 2025 handout's xl model ({_dims(model)})"
    return f"the {model['size']} model ({_dims(model)})"


def _model_caveat(model: dict, handout: str) -> str:
    if _same(model, XL_2026):
        return ""
    wanted = "xl model" if handout == "2026" else "2.7B model"
    return (
        f"This run measured {_model_name(model, handout)}, not the handout's {wanted} "
        f"({_dims(dict(size='', **XL_2026))})."
    )


def _headline_model(results: Results, notebook: str) -> dict:
    """The model size a run names in its headlines ('2.7B peak, ...'), for runs that saved no model table."""
    from cs336_systems.model import MODEL_SIZES

    try:
        headlines = results.json("headlines")
    except NotAnswered:
        headlines = []
    for record in headlines:
        size = record.get("key", "").split(" ")[0]
        if record.get("notebook") == notebook and size in MODEL_SIZES:
            context = re.search(r"ctx (\d+)", record["key"])
            return dict(size=size, **MODEL_SIZES[size], batch=4, context=int(context.group(1)) if context else None)
    raise NotAnswered("this run does not record which model it measured")


def _model(results: Results, notebook: str, table: str) -> dict:
    """The measured model: the notebook's one-row model table, else the size its headlines name."""
    if results.has(table):
        return results.table(table).iloc[0].to_dict()
    return _headline_model(results, notebook)


def _unit(df: pd.DataFrame, prefix: str) -> tuple[str, str]:
    """(column suffix, unit) of a table whose columns end in _gib or _mib (GPU runs: GiB; CPU runs: MiB)."""
    for suffix, unit in (("gib", "GiB"), ("GiB", "GiB"), ("mib", "MiB"), ("MiB", "MiB")):
        if f"{prefix}_{suffix}" in df.columns:
            return suffix, unit
    raise NotAnswered(f"the table has no `{prefix}` column in GiB or MiB")


def _on(results: Results, notebook: str) -> str:
    name = results.gpu_name(notebook)
    return f"on {name}" if name != "this machine" else "on this machine"


def _handout_contexts(contexts, handout: str) -> list[int]:
    """The handout's contexts among those the run measured; all of the run's when it has none of them."""
    present = [c for c in (CONTEXTS_2026 if handout == "2026" else CONTEXTS_2025) if c in set(contexts)]
    return present if present else sorted(set(contexts))


def _missing_2026(contexts) -> str:
    missing = [c for c in CONTEXTS_2026 if c not in set(contexts)]
    if not missing:
        return ""
    return (
        f"The 2026 handout asks for contexts {and_join(CONTEXTS_2026)}; this run measured "
        f"{_contexts(sorted(set(contexts)))}, so {_contexts(missing)} {'is' if len(missing) == 1 else 'are'} missing."
    )


def _caveat(*parts: str) -> str:
    return " ".join(p for p in parts if p)


# ---------------------------------------------------------------- (a) timelines

# The contexts of each handout's timelines and largest allocations: 2025 names none of its three, and
# 256 is its default; 2026 asks for 128 and 2048.
TIMELINE_CONTEXTS = {"2025": (256,), "2026": CONTEXTS_2026}


def timeline_contexts(recorded, handout: str) -> list[int]:
    """The contexts of `recorded` a handout's timelines show: its own, else as many of the run's as it asks for."""
    recorded = sorted({int(c) for c in recorded})
    wanted = [c for c in TIMELINE_CONTEXTS[handout] if c in recorded]
    return wanted or recorded[: len(TIMELINE_CONTEXTS[handout])]


def _snapshot_context(results: Results, model: dict) -> int | None:
    """The one context of a run that recorded its snapshots at a single context (before each handout had its own)."""
    if model.get("snapshot_context") is not None and model["snapshot_context"] == model["snapshot_context"]:
        return int(model["snapshot_context"])
    for path in sorted(results.folder.glob("memory_snapshot_*_ctx*_forward.pickle")):
        return int(re.search(r"_ctx(\d+)_", path.name).group(1))
    return None


def _with_contexts(table: pd.DataFrame, results: Results, model: dict) -> pd.DataFrame:
    """`table` with a `context` column: its own, or the single snapshot context of an older run."""
    return table if "context" in table.columns else table.assign(context=_snapshot_context(results, model))


def _parameters(results: Results, suffix: str) -> float:
    """The parameters' size in the peak table's unit, or 0 if the table is absent or in another unit."""
    if not results.has("peak_memory"):
        return 0.0
    peaks = results.table("peak_memory")
    column = f"parameters_{suffix}"
    return float(peaks[column].iloc[0]) if column in peaks.columns else 0.0


def _measured_snapshots(results: Results) -> pd.DataFrame:
    phases = results.table("phase_memory")
    phases = phases[phases["run"] != "example"]
    if phases.empty:
        raise NotAnswered(
            "memory snapshots record the CUDA caching allocator and this run had no GPU; the notebook "
            "draws a synthetic example snapshot instead of a measurement"
        )
    return phases


def _failures(results: Results) -> dict[tuple[str, int], dict]:
    """The recorded steps that ran out of memory, by (mode, context): their failed phase and analytic peak."""
    if not results.has("memory_snapshots"):
        return {}
    runs = results.table("memory_snapshots")
    return {(r["mode"], int(r["context_length"])): r for r in runs[runs.status != "ok"].to_dict("records")}


def _values(values, unit: str, digits: int = 2) -> str:
    """'12.85 GiB' when the values print the same, else '12.85 and 12.87 GiB'."""
    words = list(dict.fromkeys(f"{v:,.{digits}f}" for v in values))
    return f"{and_join(words)} {unit}"


@builds_each_handout("memory_profiling.a")
def _timelines(results: Results, handout: str) -> Answer:
    model = _model(results, PROFILING, "memory_model")
    phases = _with_contexts(_measured_snapshots(results), results, model)
    contexts = timeline_contexts(phases.context, handout)
    suffix, unit = _unit(phases, "peak")
    at = {(r.run, int(r.context), r.phase): r for r in phases.itertuples()}
    failed = _failures(results)
    v = lambda r, k: getattr(r, f"{k}_{suffix}")  # noqa: E731
    params = _parameters(results, suffix)
    several = len(contexts) > 1
    sentences = []
    forward = [
        (c, at[("forward", c, "forward")])
        for c in contexts
        if ("forward", c, "forward") in at and ("forward", c) not in failed
    ]
    if forward:
        mib = 1024 if unit == "GiB" else 1
        rises = [
            f"{(v(f, 'peak') - v(f, 'start')) * mib:,.0f} MiB" + (f" at context {c}" if several else "")
            for c, f in forward
        ]
        sentences.append(
            "In inference (forward only, under no_grad) memory starts at "
            f"{_values([v(f, 'start') for _, f in forward], unit)}"
            + (f", {params:.2f} {unit} of it the parameters" if params else "")
            + f", rises by at most {and_join(rises)} in one short spike per layer and ends at "
            f"{_values([v(f, 'end') for _, f in forward], unit)}: each layer's intermediates are freed once the next "
            "layer has used them, and there are no gradients and no optimizer state."
        )
    for c in contexts:
        lead = f"At context {c}, in" if several else "In"
        steps = {
            p: at[("train-step", c, p)] for p in ("forward", "backward", "optimizer step") if ("train-step", c, p) in at
        }
        if ("train-step", c) in failed:
            sentences.append(_failed_step(failed[("train-step", c)], steps, c, unit, v))
        elif len(steps) == 3:
            f, b, o = (steps[p] for p in ("forward", "backward", "optimizer step"))
            top = max(steps, key=lambda p: v(steps[p], "peak"))
            sentences.append(
                f"{lead} a training step the forward ramps from {v(f, 'start'):.2f} to {v(f, 'end'):.2f} {unit} as "
                f"activations are saved for the backward; the backward starts at {v(b, 'start'):.2f}, peaks at "
                f"{v(b, 'peak'):.2f} and ends at {v(b, 'end'):.2f} {unit}, freeing the saved activations while it "
                f"creates the gradients; the optimizer step peaks at {v(o, 'peak'):.2f} {unit} and drops to "
                f"{v(o, 'end'):.2f} {unit} when the gradients are released."
            )
            sentences.append(
                "So each stage shows in the shape: the ramp is the forward, the backward follows until every gradient "
                f"exists, and AdamW's per-parameter temporaries end in the drop; the step's highest point, "
                f"{v(steps[top], 'peak'):.2f} {unit}, is in the {top}."
            )
    if not sentences:
        raise NotAnswered("this run recorded no timeline of a forward pass or of a training step")
    text = (
        f"Timelines of {_model_name(model, handout)} at {_contexts(contexts)}, recorded {_on(results, PROFILING)}. "
        + " ".join(sentences)
    )
    names = [f"active_memory_timelines_ctx{'_'.join(map(str, contexts))}", "active_memory_timelines"]
    figure = next((f"figures/{n}.png" for n in names if (results.folder / "figures" / f"{n}.png").exists()), None)
    note = ""
    if figure is None:
        figure = results.figure("active_memory_train-step")
        note = "The figure here is the training step's timeline; the inference timeline is the notebook's other figure."
    context_note = ""
    if handout == "2026" and not set(CONTEXTS_2026) <= set(contexts):
        context_note = (
            f"The timelines are at {_contexts(contexts)}; the 2026 handout's contexts are {and_join(CONTEXTS_2026)}."
        )
    return Answer(text=text, figure=figure, caveat=_caveat(note, context_note, _model_caveat(model, handout)))


def _failed_step(failed: dict, steps: dict, context: int, unit: str, v) -> str:
    """The sentence for a training step that ran out of memory: the phase that did not fit, how far its snapshot
    got, and the analytic peak of the whole step."""
    phase = failed["failed_phase"]
    text = f"At context {context} the training step does not fit: " + (
        "not even the model and its optimizer could be built"
        if phase == "model"
        else f"it ran out of memory in its {phase}"
    )
    if phase in steps:
        fresh = int(failed.get("warmup", 1)) == 0
        text += f", after memory had reached {v(steps[phase], 'peak'):.2f} {unit}" + (
            " (recorded from a fresh model without a warm-up step, so with no gradients or AdamW state yet)"
            if fresh
            else ""
        )
        done = [p for p in ("forward", "backward", "optimizer step") if p in steps and p != phase]
        if done:
            text += f", its {and_join(done)} having run"
    peak = failed.get("predicted_peak_gib")
    if peak is not None and peak == peak:
        device = failed.get("device_memory_gib")
        text += f"; the analytic model puts the whole step's peak at {peak:,.1f} GiB" + (
            f", against the GPU's {device:.0f} GiB" if device is not None and device == device else ""
        )
    return text + "."


# ---------------------------------------------------------------- (b), (c) peaks


def _peaks(results: Results) -> tuple[pd.DataFrame, str, str]:
    peaks = results.table("peak_memory")
    suffix, unit = _unit(peaks, "measured")
    return peaks, suffix, unit


def _peak_value(row, suffix: str):
    return round(float(getattr(row, f"measured_{suffix}")), 2) if row.status == "ok" else "out of memory"


def _fmt_peak(value, unit: str) -> str:
    return value if isinstance(value, str) else f"{value:.2f} {unit}"


def _peak_table(peaks: pd.DataFrame, contexts, suffix: str, unit: str, precisions=("fp32",)) -> pd.DataFrame:
    rows = []
    for c in contexts:
        row = {"context": c}
        for precision in precisions:
            for mode, name in (("forward", "forward"), ("train-step", "training step")):
                r = peaks[(peaks.context_length == c) & (peaks["mode"] == mode) & (peaks.precision == precision)]
                label = f"{name} peak ({unit})" if len(precisions) == 1 else f"{name}, {precision} ({unit})"
                row[label] = _peak_value(next(r.itertuples()), suffix) if len(r) else "not run"
        rows.append(row)
    return pd.DataFrame(rows)


def _fixed_state(peaks: pd.DataFrame, suffix: str) -> tuple[float, float]:
    """(parameters, parameters + gradients + AdamW state) in the table's unit."""
    params = float(peaks[f"parameters_{suffix}"].iloc[0])
    train = peaks[peaks["mode"] == "train-step"]
    state = float(train[f"optimizer_state_{suffix}"].iloc[0]) if len(train) else 2 * params
    return params, 2 * params + state


@builds_each_handout("memory_profiling.b")
def _peak_answer(results: Results, handout: str) -> Answer:
    peaks, suffix, unit = _peaks(results)
    model = _model(results, PROFILING, "memory_model")
    run = sorted(peaks.context_length.unique())
    contexts = _handout_contexts(run, handout)
    table = _peak_table(peaks, contexts, suffix, unit)
    fwd, train = table.columns[1], table.columns[2]
    params, fixed = _fixed_state(peaks, suffix)
    text = (
        f"Peak memory of {_model_name(model, handout)} in fp32 at batch {int(model.get('batch', 4))}, measured "
        f"{_on(results, PROFILING)}: for a forward pass {and_join(_fmt_peak(v, unit) for v in table[fwd])} and for a "
        f"full training step {and_join(_fmt_peak(v, unit) for v in table[train])} at {_contexts(contexts)}."
    )
    ok = [(c, v) for c, v in zip(contexts, table[train]) if not isinstance(v, str)]
    if ok:
        text += (
            f" Parameters take {params:.2f} {unit}, and parameters, gradients and AdamW state together {fixed:.2f} "
            f"{unit} at every context; the training step's peak is "
            f"{and_join(f'{v - fixed:.2f} {unit}' for _, v in ok)} "
            f"above that at {_contexts(c for c, _ in ok)}: what the step itself adds at its peak (saved activations "
            "and temporaries)."
        )
        text += _lower_at_longer(peaks, ok, suffix, unit)
    text += _out_of_memory(peaks, contexts, suffix, unit)
    caveat = _caveat(
        _missing_2026(run) if handout == "2026" else "",
        _estimate_2048(peaks, model, run, handout, unit),
        _model_caveat(model, handout),
    )
    return Answer(text=text, table=table, caveat=caveat)


def _out_of_memory(peaks: pd.DataFrame, contexts, suffix: str, unit: str, precisions=("fp32",)) -> str:
    """A sentence for the training steps that ran out of memory, with the analytic model's peak for them."""
    train = peaks[
        (peaks["mode"] == "train-step") & peaks.context_length.isin(contexts) & peaks.precision.isin(precisions)
    ]
    failed = train[train.status != "ok"]
    if failed.empty:
        return ""
    at = sorted(failed.context_length.unique())
    predicted = and_join(
        f"{float(r[f'predicted_{suffix}']):,.1f} {unit}" + (f" ({r.precision})" if len(precisions) > 1 else "")
        for _, r in failed.sort_values(["context_length", "precision"], ascending=[True, False]).iterrows()
    )
    return (
        f" At {_contexts(at)} the training step ran out of the GPU's memory"
        + (" in both precisions" if len(precisions) > 1 and len(failed) == len(at) * len(precisions) else "")
        + f"; the analytic model puts its peak at {predicted}."
    )


def _lower_at_longer(peaks: pd.DataFrame, ok: list, suffix: str, unit: str) -> str:
    """A sentence for a training-step peak lower at a longer context than at a shorter one, from the table."""
    for (c1, v1), (c2, v2) in zip(ok, ok[1:]):
        if v2 < v1:
            train = peaks[(peaks["mode"] == "train-step") & (peaks.precision == "fp32")].set_index("context_length")
            p1, p2 = (float(train.loc[c, f"predicted_{suffix}"]) for c in (c1, c2))
            return (
                f" At {c1} and {c2} the peaks differ by only {v1 - v2:.2f} {unit} ({100 * (v1 / v2 - 1):.1f}%), the "
                f"longer context the lower: both are set mostly by the fixed state, and the analytic model, which puts "
                f"the peak in the {train.loc[c1, 'peak_at']} at {c1} and in the {train.loc[c2, 'peak_at']} at {c2}, "
                f"predicts them {abs(p2 - p1):.2f} {unit} apart."
            )
    return ""


def _estimate_2048(peaks: pd.DataFrame, model: dict, run, handout: str, unit: str) -> str:
    """For a 2026 answer whose run lacks context 2048: what the notebook's analytic model puts there."""
    if handout != "2026" or 2048 in set(run) or not _same(model, XL_2026):
        return ""
    from cs336_systems.accounting.memory import memory_estimate
    from cs336_systems.model import ModelConfig

    config = ModelConfig(**{k: int(model[k]) for k in MODEL_KEYS})
    batch = int(model.get("batch", 4))
    scale = GIB if unit == "GiB" else MIB
    fwd, train = (memory_estimate(config, batch, 2048, mode)["peak"] / scale for mode in ("forward", "train-step"))
    ok = peaks[peaks.status == "ok"]
    worst = 100 * float(ok["error"].abs().max())
    return (
        f"The notebook's analytic memory model, within {worst:.1f}% of every peak measured here, puts context 2048 "
        f"at {fwd:.1f} {unit} for the forward pass and {train:.1f} {unit} for the training step."
    )


def _peak_past_activations(ok: pd.DataFrame, contexts: list) -> str:
    """Where the analytic model puts the training step's peak after the backward (the optimizer step) in both
    precisions: the saved activations are freed by then, so a change in them does not move the peak."""
    if "peak_at" not in ok:
        return ""
    where = ok[ok["mode"] == "train-step"].set_index(["context_length", "precision"])["peak_at"]
    late = [c for c in contexts if all(where.get((c, p)) == "optimizer step" for p in ("fp32", "bf16"))]
    if not late:
        return ""
    return (
        f" At {_contexts(late)} the analytic model puts the training step's peak in the optimizer step in both "
        "precisions, after the backward has freed the saved activations, so their change does not reach the peak."
    )


@builds_each_handout("memory_profiling.c")
def _mixed_answer(results: Results, handout: str) -> Answer:
    peaks, suffix, unit = _peaks(results)
    if "bf16" not in set(peaks.precision):
        raise NotAnswered("this run measured no bf16 mixed-precision peaks")
    model = _model(results, PROFILING, "memory_model")
    run = sorted(peaks.context_length.unique())
    contexts = _handout_contexts(run, handout)
    table = _peak_table(peaks, contexts, suffix, unit, precisions=("fp32", "bf16"))
    ok = peaks[(peaks.status == "ok") & peaks.context_length.isin(contexts)]
    value = ok.set_index(["context_length", "mode", "precision"])[f"measured_{suffix}"]
    act = ok[ok["mode"] == "train-step"].set_index(["context_length", "precision"])[f"activations_{suffix}"]
    both = {
        m: [c for c in contexts if all((c, m, p) in value.index for p in ("fp32", "bf16"))]
        for m in ("forward", "train-step")
    }
    if not both["forward"] and not both["train-step"]:
        raise NotAnswered("no context has both its fp32 and bf16 peaks measured in this run")
    _, fixed = _fixed_state(peaks, suffix)

    def listed(mode: str, precision: str) -> str:
        return and_join(f"{value[(c, mode, precision)]:.2f}" for c in both[mode])

    def activations(precision: str) -> str:
        return and_join(f"{act[(c, precision)]:.2f}" for c in both["train-step"])

    same = both["forward"] == both["train-step"]
    parts = [
        f"{listed(m, 'bf16')} {unit} for {name} (fp32: {listed(m, 'fp32')})"
        + ("" if same else f" at {_contexts(both[m])}")
        for m, name in (("forward", "a forward pass"), ("train-step", "a training step"))
        if both[m]
    ]
    text = (
        f"With bf16 autocast, {_model_name(model, handout)} peaks at {' and at '.join(parts)}"
        + (f" at {_contexts(both['forward'])}" if same else "")
        + f", measured {_on(results, PROFILING)}"
    )
    train = both["train-step"]
    if train:
        change = {c: value[(c, "train-step", "bf16")] / value[(c, "train-step", "fp32")] - 1 for c in train}
        text += (
            f": a change of {and_join(f'{100 * change[c]:+.1f}%' for c in train)} for the training step. "
            + (
                "Mixed precision does not change memory much here"
                if max(map(abs, change.values())) < 0.10
                else "Mixed precision changes memory noticeably here"
            )
            + f": the fp32 parameters, gradients and AdamW state ({fixed:.2f} {unit}) stay as they are and only the "
            f"saved activations change, from {activations('fp32')} to {activations('bf16')} {unit} in the analytic "
            "count, since bf16 halves each activation but autocast also saves a bf16 copy of every weight for the "
            "backward." + _peak_past_activations(ok, train)
        )
    else:
        text += "."
    text += _out_of_memory(peaks, contexts, suffix, unit, precisions=("fp32", "bf16"))
    caveat = _caveat(_missing_2026(run) if handout == "2026" else "", _model_caveat(model, handout))
    return Answer(text=text, table=table, caveat=caveat)


# ---------------------------------------------------------------- (d) residual stream


@builds_each_handout("memory_profiling.d")
def _residual_answer(results: Results, handout: str) -> Answer:
    residual = results.table("residual_stream_size")
    model = _model(results, PROFILING, "memory_model")
    d = int(model["d_model"])
    per_context = residual.set_index("context_length")["elements"] // residual.set_index("context_length").index
    batch = int(per_context.iloc[0]) // d
    contexts = (
        _handout_contexts(residual.context_length, "2025") if handout == "2025" else sorted(set(CONTEXTS_2026) | {512})
    )
    rows = [
        dict(context=c, elements=batch * c * d, bytes=4 * batch * c * d, MiB=4 * batch * c * d / MIB) for c in contexts
    ]
    table = pd.DataFrame(rows)
    first = rows[-1] if handout == "2025" else next(r for r in rows if r["context"] == 512)
    others = [r for r in rows if r is not first]
    text = (
        f"A residual-stream activation of {_model_name(model, handout)} holds batch × context × d_model "
        f"single-precision numbers of 4 bytes: at context {first['context']}, {batch} × {first['context']} × {d} × 4 = "
        f"{first['bytes']:,} bytes = {first['bytes']:,} / 1024² = **{_num(first['bytes'] / MIB)} MiB**"
        + (
            f"; at {_contexts(r['context'] for r in others)}, {and_join(_mib(r) for r in others)} MiB."
            if others
            else "."
        )
    )
    if handout == "2026":
        text += " (The 2026 handout's default context is 512; its memory profiles use 128 and 2048.)"
    return Answer(text=text, table=table, caveat=_model_caveat(model, handout))


def _mib(row: dict) -> str:
    return _num(row["bytes"] / MIB)


# ---------------------------------------------------------------- (e) largest allocations


@builds_each_handout("memory_profiling.e")
def _largest_answer(results: Results, handout: str) -> Answer:
    if not results.has("largest_allocations_forward"):
        raise NotAnswered(
            "the largest allocations are read from a CUDA memory snapshot of a forward pass, and this run "
            "recorded none (it had no GPU, or the snapshot ran out of memory)"
        )
    model = _model(results, PROFILING, "memory_model")
    every = _with_contexts(results.table("largest_allocations_forward"), results, model)
    contexts = timeline_contexts(every.context, handout)
    context = contexts[-1]  # the longest, in detail; the others in a sentence each
    largest = every[every.context == context]
    top_size = largest.size_mib.max()
    top = largest[largest.size_mib == top_size]
    nxt = largest[largest.size_mib < top_size].drop_duplicates("size_mib").head(2)
    text = (
        f"In the forward-pass snapshot of {_model_name(model, handout)} at batch {int(model.get('batch', 4))}, context "
        f"{context}, recorded {_on(results, PROFILING)}, the largest allocations are **{top_size:,.1f} MiB** each"
        + _made_by(top)
        + "."
    )
    if len(nxt):
        text += (
            " Next come "
            + and_join(
                f"{r.size_mib:,.1f} MiB ({_tensor_words(r.looks_like)})"
                if isinstance(r.looks_like, str) and r.looks_like
                else f"{r.size_mib:,.1f} MiB"
                for r in nxt.itertuples()
            )
            + "."
        )
    for c in contexts[:-1]:
        rows = every[every.context == c]
        first = rows[rows.size_mib == rows.size_mib.max()]
        text += f" At context {c} the largest are {rows.size_mib.max():,.1f} MiB each" + _made_by(first) + "."
    shown = every[every.context.isin(contexts)].sort_values("context", ascending=False, kind="stable")
    table = shown.drop(columns=[] if len(contexts) > 1 and "context" in shown else ["context"]).rename(
        columns={
            "size_mib": "size (MiB)",
            "label": "made at",
            "count": "allocations",
            "looks_like": "tensor it matches",
            "code": "source line",
        }
    )
    table["size (MiB)"] = table["size (MiB)"].round(2)
    context_note = ""
    if handout == "2026" and not set(CONTEXTS_2026) <= set(contexts):
        context_note = (
            f"The snapshot is at {_contexts(contexts)}; the 2026 handout's contexts are {and_join(CONTEXTS_2026)}."
        )
    return Answer(text=text, table=table, caveat=_caveat(context_note, _model_caveat(model, handout)))


def _made_by(top: pd.DataFrame) -> str:
    """', fp32 B×H×S×S (attention scores / probabilities) tensors; their stack traces lead to `naive.py:20 …` (…) (64
    times)' for the rows of one allocation size."""
    shapes = [_tensor_words(s) for s in dict.fromkeys(top.looks_like.fillna("")) if s]
    made = and_join(
        f"`{r.label}`"
        + (f" (`{r.code.strip()}`)" if isinstance(getattr(r, "code", None), str) else "")
        + f" ({r.count} times)"
        for r in top.itertuples()
    )
    return (f", {' or '.join(shapes)} tensors" if shapes else "") + f"; their stack traces lead to {made}"


def _tensor_words(looks_like: str) -> str:
    """'B×S×F (SwiGLU hidden), fp32' -> 'fp32 B×S×F (SwiGLU hidden)'."""
    shape, _, dtype = looks_like.rpartition(", ")
    return f"{dtype} {shape}" if shape else looks_like


# ---------------------------------------------------------------- (f) one block's saved tensors and gradients


@builds("memory_profiling.f")
def block_saved(results: Results) -> Answer:
    if not results.has("block_memory"):
        raise NotAnswered(
            "the per-block saved-tensor table was added to the notebook after this run; the CPU report answers it"
        )
    summary = results.table("block_memory")
    ops = results.table("block_saved_by_operation")
    row = summary.iloc[(summary.context - 2048).abs().argmin()] if len(summary) > 1 else summary.iloc[0]
    context = int(row.context)
    top = ops[ops.context == context].sort_values("bytes", ascending=False).head(5).reset_index(drop=True)
    saved = row.saved_bytes / MIB
    direct = (row.parameter_gradient_bytes + row.input_gradient_bytes) / MIB
    inferred = row.inferred_gradient_bytes / MIB
    gap = inferred / direct - 1
    model = {k: int(row[k]) for k in ("d_model", "d_ff", "num_heads")}
    text = (
        f"One fp32 TransformerBlock (d_model {model['d_model']}, d_ff {model['d_ff']}, {model['num_heads']} heads, "
        f"naive attention) at batch {int(row.batch)}, context {context} saves **{_num(saved)} MiB** for the backward, "
        f"measured {_on(results, PROFILING)} with autograd's saved-tensor hooks (the analytic count gives "
        f"{_num(row.analytic_saved_bytes / MIB)} MiB). The five largest contributions, by the operation that made the "
        "tensor, are "
        + and_join(f"`{r.operation}` ({_num(r.bytes / MIB)} MiB, {100 * r.share:.1f}%)" for r in top.itertuples())
        + f", together {100 * top.share.sum():.1f}% of it.\n\n"
        f"Over the block's backward, allocated memory changes by {'+' if row.backward_change_bytes >= 0 else '-'}"
        f"{_num(abs(row.backward_change_bytes) / MIB)} MiB while the {_num(row.saved_freed_bytes / MIB)} MiB of saved "
        "tensors other than the block's input (still held as the previous block's output) are freed, so the gradients "
        f"it makes take {_num(inferred)} MiB. We expect the parameters' gradients, as large as the fp32 parameters "
        f"({_num(row.parameter_gradient_bytes / MIB)} MiB), plus the input's gradient, one residual-stream tensor "
        f"({_num(row.input_gradient_bytes / MIB)} MiB): {_num(direct)} MiB, "
        + (
            f"which the measurement matches {_relative(inferred - direct, gap)}."
            if abs(gap) < 0.02
            else f"while the measurement is {_num(abs(inferred - direct))} MiB ({abs(100 * gap):.1f}%) "
            f"{'more' if gap > 0 else 'less'}, so it does not match."
        )
    )
    table = top.assign(MiB=(top.bytes / MIB).round(3), share=(100 * top.share).round(1))[
        ["operation", "tensors", "shapes", "MiB", "share"]
    ].rename(
        columns={
            "operation": "made by (module: operation)",
            "tensors": "tensors saved",
            "shapes": "shapes",
            "share": "share of the block's saved memory (%)",
        }
    )
    caveat = (
        "Measured with autograd's saved-tensor hooks and the allocator's counters around one block run on its own, "
        "rather than read from Nsight Systems memory traces; the block is not compiled."
    )
    if not _same(dict(model, num_layers=32), XL_2026):
        caveat += f" The block has this run's model width, not the 2026 xl's ({_dims(dict(XL_2026))})."
    return Answer(text=text, table=table, caveat=caveat)


def _relative(difference_mib: float, gap: float) -> str:
    if abs(gap) < 0.0005:
        return "to within 0.05%"
    return f"to within {_num(abs(difference_mib))} MiB ({abs(100 * gap):.2f}%)"


# ---------------------------------------------------------------- gradient_checkpointing

CHAIN_SKETCH = """```python
def run_chain(blocks, x):  # peak: one block's activations; N(N+1)/2 block forwards
    if len(blocks) == 1:
        return blocks[0](x)
    y = checkpoint(run_chain, blocks[:-1], x, use_reentrant=False)
    return blocks[-1](y)
```"""


@builds("gradient_checkpointing.a")
def nested_checkpoints(results: Results) -> Answer:
    peak = results.table("strategy_peak_mib").set_index("blocks")
    work = results.table("strategy_block_forwards").set_index("blocks")
    lo, hi = int(peak.index.min()), int(peak.index.max())
    text = (
        "Nest the checkpoints as a chain: block N runs on `checkpoint(prefix of blocks 1…N−1)(x)`, and the prefix is "
        "built the same way inside, so the backward through block j first re-runs blocks 1…j−1 from the stored input "
        "without keeping their activations. At any time only one block's saved tensors exist, plus the stored input "
        "and the gradient flowing down: **O(1) peak activation memory in N**, the least possible since a block's "
        "backward needs its own activations, for **O(N²) compute** (N(N+1)/2 block forwards instead of N); binary "
        "nesting (checkpoint each half, recursively) is the middle ground at O(log N) memory and O(N log N) "
        "compute.\n\n" + CHAIN_SKETCH + "\n\n"
        f"Measured {_on(results, CHECKPOINTING)} on stacks of {lo} to {hi} TransformerBlocks (weights frozen, so the "
        f"peak is activations only): the chain's peak {_from_to(peak.loc[lo, 'chain'], peak.loc[hi, 'chain'])} MiB "
        f"while no checkpointing's goes from {_num(peak.loc[lo, 'none'])} to {_num(peak.loc[hi, 'none'])} MiB, and at "
        f"N = {hi} the chain ran {int(work.loc[hi, 'chain'])} block forwards (N(N+1)/2 = {hi * (hi + 1) // 2})."
    )
    table = pd.DataFrame(
        {
            "blocks N": peak.index,
            "peak, no checkpoints (MiB)": peak["none"].round(1).to_numpy(),
            "peak, groups of √N (MiB)": peak["every"].round(1).to_numpy(),
            "peak, binary nesting (MiB)": peak["binary"].round(1).to_numpy(),
            "peak, chain nesting (MiB)": peak["chain"].round(1).to_numpy(),
            "block forwards, binary": work.loc[peak.index, "binary"].to_numpy(),
            "block forwards, chain": work.loc[peak.index, "chain"].to_numpy(),
        }
    )
    return Answer(text=text, table=table)


def _from_to(first: float, last: float) -> str:
    if _num(first) == _num(last):
        return f"stays at {_num(first)}"
    return f"goes from {_num(first)} to {_num(last)}"


def _checkpoint_model(results: Results) -> dict:
    """The model, batch, context and step of (b): the notebook's table, else its headline and the notebook's
    defaults."""
    if results.has("checkpoint_model"):
        return results.table("checkpoint_model").iloc[0].to_dict()
    model = _headline_model(results, CHECKPOINTING)
    model.update(mode="forward-backward", context=model["context"] or 2048)
    return model


def _block_and_checkpoint_mib(model: dict) -> tuple[float, float]:
    """(a, c): one block's saved activations and one checkpoint (a residual-stream tensor), MiB, fp32."""
    if "block_saved_mib" in model:
        return float(model["block_saved_mib"]), float(model["checkpoint_mib"])
    from cs336_systems.accounting.memory import block_saved_tensors, residual_stream_bytes
    from cs336_systems.model import ModelConfig

    config = ModelConfig(**{k: int(model[k]) for k in MODEL_KEYS})
    batch, context = int(model["batch"]), int(model["context"])
    a = block_saved_tensors(config, batch, context)["bytes"].sum() / MIB
    return float(a), residual_stream_bytes(batch, context, config.d_model) / MIB


@builds("gradient_checkpointing.b")
def checkpoint_block_size(results: Results) -> Answer:
    sizes = results.table("checkpoint_block_sizes")
    model = _checkpoint_model(results)
    suffix, unit = _unit(sizes, "measured")
    col, pred = f"measured_{suffix}", f"predicted_{suffix}"
    n, batch, context = int(model["num_layers"]), int(model["batch"]), int(model["context"])
    a, c = _block_and_checkpoint_mib(model)
    k_star = math.sqrt(n * c / a)
    ok = sizes[sizes.status == "ok"].set_index("checkpoint")
    if ok.empty:
        raise NotAnswered("every checkpoint size this run tried ran out of memory")
    best = ok[col].idxmin()
    block_sizes = [k for k in ok.index if k.startswith("k = ")]
    one = "k = 1" if "k = 1" in ok.index else (block_sizes[0] if block_sizes else best)
    failed = sizes[sizes.status != "ok"]
    text = (
        f"For {_model_name(model, '2026')} at batch {batch}, context {context}, one block saves a = {_num(a)} MiB for "
        f"the backward and a checkpoint (the block's input) is c = {_num(c)} MiB, so with one level of groups of k "
        f"blocks the memory (N/k)·c + k·a is smallest at k = √(N·c/a) = {k_star:.2f} (N = {n}): "
        + (
            "a block's activations outweigh its checkpoint so much that the best single-level strategy is the smallest "
            "group, **a checkpoint around every block**, and each part of a block (attention, feed-forward) is the "
            "next smaller size. "
            if k_star < 1.5
            else f"groups of about **{round(k_star)} blocks** balance the two terms. "
        )
        + f"Measured {_on(results, CHECKPOINTING)} "
        f"({str(model.get('mode', 'forward-backward')).replace('-', ' and ')}): "
        + "; ".join(f"{_size_words(name)} {r[col]:.2f} {unit}" for name, r in ok.iterrows())
        + (
            f"; {and_join(_size_words(r.checkpoint) for r in failed.itertuples())} ran out of memory"
            if len(failed)
            else ""
        )
        + f". The lowest measured peak is {_size_words(best)} ({ok.loc[best, col]:.2f} {unit})"
        + (
            f", {_num(ok.loc[one, col] - ok.loc[best, col])} {unit} "
            f"({100 * (1 - ok.loc[best, col] / ok.loc[one, col]):.1f}%) "
            f"below {_size_words(one)}."
            if best != one
            else ", and the next smaller and larger sizes measure higher."
        )
        + _per_block_step(ok, col, unit, a)
    )
    table = sizes.assign(
        measured=sizes[col].round(2),
        predicted=sizes[pred].round(2),
        checkpoint=[_size_words(k) for k in sizes.checkpoint],
    )[["checkpoint", "status", "measured", "predicted"]].rename(
        columns={
            "checkpoint": "checkpoint around",
            "status": "run",
            "measured": f"measured peak ({unit})",
            "predicted": f"analytic peak ({unit})",
        }
    )
    table["run"] = table["run"].replace({"ok": "ran", "OOM": "out of memory"})
    caveat = (
        ""
        if _same(model, XL_2026)
        else (f"This run used {_model_name(model, '2026')}; the 2026 handout's xl is {_dims(dict(XL_2026))}.")
    )
    return Answer(text=text, table=table, caveat=caveat)


def _per_block_step(ok: pd.DataFrame, col: str, unit: str, a_mib: float) -> str:
    """How much each further block per group adds to the measured peak, next to one block's activations."""
    ks = sorted(int(k.removeprefix("k = ")) for k in ok.index if k.startswith("k = "))
    steps = [ok.loc[f"k = {k2}", col] - ok.loc[f"k = {k1}", col] for k1, k2 in zip(ks, ks[1:]) if k2 == k1 + 1]
    if not steps:
        return ""
    scale = 1024 if unit == "GiB" else 1
    words = [f"{_num(v)} {unit}" for v in steps]
    added = f"{words[0]}{' each time' if len(words) > 1 else ''}" if len(set(words)) == 1 else and_join(words)
    return (
        f" Each further block per group adds {added} to the peak, against "
        f"a = {_num(a_mib / scale)} {unit} of one block's saved activations."
    )


def _size_words(name: str) -> str:
    if name == "none":
        return "no checkpointing"
    if name == "half block":
        return "each half block"
    k = int(name.removeprefix("k = "))
    return "every block" if k == 1 else f"every {k} blocks"
