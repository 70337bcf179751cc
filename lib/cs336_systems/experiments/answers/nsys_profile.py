"""Answers of notebook 02 (`nsys_profile`, both handouts): the kernel profile of forward passes and training steps.

The 2025 handout asks for every size of its table at contexts 128 to 1024; the 2026 handout for two sizes
at three power-of-two contexts above 128, the largest the longest that fits in memory. The notebook
profiles the 2025 grid and then searches each of two sizes for the longest context whose training step
fits (its `longest_context` table); the 2026 answers read, per size, the three longest contexts above 128
that fit. A run without that search (one made before it existed) is read as before: the smallest and the
largest 2026 size at the contexts above 128, with a caveat that says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from cs336_systems.experiments.answers import NotAnswered, Results, builds_each_handout
from cs336_systems.experiments.answers.benchmarking import (
    NB_PROFILE,
    cpu_caveat,
    join_caveats,
    layers,
    machine,
    naming_2026,
    size_2026,
    size_flops,
    size_label,
    span,
)
from cs336_systems.experiments.answers.words import and_join, pct
from cs336_systems.model import handout_name
from cs336_systems.report.answers import Answer
from cs336_systems.report.tables import fmt_ms

CONTEXTS_2025 = (128, 256, 512, 1024)
NUMBER_WORDS = {1: "one", 2: "two"}
# A profiled pass whose kernels fill at least this share of its GPU span keeps the GPU busy.
BUSY = 0.9
# Where the profiles come from, said once per writeup (in part a).
PROFILER_NOTE = (
    "These profiles are PyTorch's profiler's, not Nsight Systems' (which could not write a report on the GPU "
    "machines used for this workbook's GPU report): its GPU activity comes from CUPTI, as Nsight Systems' "
    "does, and every step carries the same named ranges; notebook 02 gives the `nsys` command for a machine "
    "where Nsight Systems works."
)


def _profile_unit(results: Results) -> tuple[bool, str]:
    runs = results.table("profiled_runs")
    gpu = "forward_gpu_span_ms" in runs and runs["forward_gpu_span_ms"].notna().any()
    return gpu, "CUDA kernel" if gpu else "CPU operator"


# ---------------------------------------------------------------------------------- which rows


@dataclass
class Search:
    """What the search for the longest context found (the `longest_context` table), per size."""

    table: pd.DataFrame

    @property
    def sizes(self) -> list[str]:
        return sorted(self.table["size"], key=size_flops)

    def fits(self, size: str) -> list[int]:
        """The contexts at which the size's whole training step fits, ascending."""
        value = self.table.set_index("size").loc[size, "fits"]
        return [] if pd.isna(value) else sorted(int(c) for c in str(value).split(",") if c.strip())

    def read(self, size: str) -> list[int]:
        """The contexts a 2026 answer reads: the three longest above 128 that fit (all that fit when none is)."""
        fits = self.fits(size)
        return ([c for c in fits if c > 128] or fits)[-3:]


def search(results: Results) -> Search | None:
    return Search(results.table("longest_context")) if results.has("longest_context") else None


SAME_AS_A = "The same sizes and contexts as (a), which says how they were chosen."


def _select(df: pd.DataFrame, results: Results, handout: str, first: bool = False) -> tuple[pd.DataFrame, str]:
    """The rows a handout's answer reads, and a caveat saying how they depart from what it asks: in full in the
    `first` sub-part, which the others point to."""
    if handout == "2025":
        keep = df["size"].map(lambda s: handout_name(s, "2025")).notna() & df.context_length.isin(CONTEXTS_2025)
        return (df[keep] if keep.any() else df), ""
    sel, caveat = _select_2026(df, results)
    return sel, caveat if first or not caveat else SAME_AS_A


def _select_2026(df: pd.DataFrame, results: Results) -> tuple[pd.DataFrame, str]:
    found = search(results)
    if found is None:
        return _select_without_search(df)
    pairs = {(s, c) for s in found.sizes for c in found.read(s)}
    sel = df[[(s, int(c)) in pairs for s, c in zip(df["size"], df.context_length)]]
    caveat = (
        "The 2026 handout asks for two sizes at three power-of-two contexts above 128, the largest the longest "
        "that fits: these answers read "
        + and_join([f"{size_label(s, '2026')} at {and_join([str(c) for c in found.read(s)])}" for s in found.sizes])
        + ", for each size the three longest contexts above 128 at which its whole training step fits."
    )
    for s in found.sizes:
        above = [c for c in found.fits(s) if c > 128]
        if not above:
            caveat += (
                f" No context above 128 fits the training step of {size_label(s, '2026')} in this run, so the "
                "longest that fit are read."
            )
        elif len(above) < 3:
            caveat += (
                f" Above 128, the training step of {size_label(s, '2026')} fits at only {NUMBER_WORDS[len(above)]} "
                f"context{'s' * (len(above) > 1)}."
            )
    return sel, join_caveats(caveat, naming_2026(found.sizes))


def _select_without_search(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """A run that did not search for the longest context: the smallest and the largest 2026 size of the run at
    the contexts above 128, and a caveat saying how it departs from the handout."""
    sizes = [s for s in dict.fromkeys(df["size"]) if size_2026(s)]
    chosen = sizes if len(sizes) <= 2 else [min(sizes, key=size_flops), max(sizes, key=size_flops)]
    if not chosen:
        chosen = list(dict.fromkeys(df["size"]))
    contexts = sorted(c for c in set(df.context_length) if c > 128) or sorted(set(df.context_length))
    sel = df[df["size"].isin(chosen) & df.context_length.isin(contexts)]
    labels = and_join([size_label(s, "2026") for s in chosen])
    all_contexts = sorted(set(df.context_length))
    caveat = (
        f"The 2026 handout asks for two sizes and three power-of-two contexts above 128; this answer reads "
        f"{labels} at contexts {and_join([str(c) for c in contexts])}, from a run that profiled "
        f"{len(set(df['size']))} sizes at contexts {and_join([str(c) for c in all_contexts])}."
    )
    if len([c for c in contexts if c > 128]) < 3:
        caveat += " This run has fewer than three contexts above 128."
    caveat += " It did not look for the longest context that fits."
    caveat = join_caveats(caveat, naming_2026(chosen))
    return sel, caveat


def _detail(results: Results, handout: str = "2025") -> tuple[str, int] | None:
    """The configuration an answer looks at in detail. 2025: the one notebook 02 drew (from the non-matmul table,
    else the kept trace's name); 2026, after the search: the smaller size at its longest context that fits."""
    found = search(results) if handout == "2026" else None
    if found is not None and found.read(found.sizes[0]):
        return found.sizes[0], found.read(found.sizes[0])[-1]
    if results.has("non_matmul_forward"):
        nm = results.table("non_matmul_forward")
        if {"size", "context_length"} <= set(nm) and len(nm):
            return str(nm["size"].iloc[0]), int(nm.context_length.iloc[0])
    for path in sorted((results.folder / "traces").glob("trace_*_ctx*_forward.json.gz")):
        size, ctx = path.name[len("trace_") : -len("_forward.json.gz")].rsplit("_ctx", 1)
        return size, int(ctx)
    return None


def _non_matmul(results: Results, detail: tuple[str, int] | None) -> tuple[pd.DataFrame, tuple[str, int] | None]:
    """The non-matmul kernels above the notebook's threshold for `detail` (every configuration's are in
    `non_matmul_forward_all`), else those of the configuration the notebook drew; with the configuration read."""
    if detail is not None and results.has("non_matmul_forward_all"):
        every = results.table("non_matmul_forward_all")
        mine = every[(every["size"] == detail[0]) & (every.context_length == detail[1])]
        if len(mine):
            return mine.reset_index(drop=True), detail
    nm = results.table("non_matmul_forward")
    if {"size", "context_length"} <= set(nm) and len(nm):
        return nm, (str(nm["size"].iloc[0]), int(nm.context_length.iloc[0]))
    return nm, detail


def _pick_row(df: pd.DataFrame, detail: tuple[str, int] | None) -> pd.Series:
    if detail is not None:
        row = df[(df["size"] == detail[0]) & (df.context_length == detail[1])]
        if len(row):
            return row.iloc[0]
    return df.iloc[0]


def longest_sentence(found: Search) -> str:
    """'Doubling the context from 256, small's whole training step fits up to 2048 (at 4096 it runs out of memory:
    analytic peak 137 GiB against the GPU's 79 GiB, while the forward alone fits) and xl's up to 512 (...).'"""
    t = found.table.set_index("size")
    parts = []
    for i, size in enumerate(found.sizes):
        r, fits = t.loc[size], found.fits(size)
        head = f"{size_label(size, '2026')}'s" + (" whole training step fits" if i == 0 else "")
        if pd.isna(r.out_of_memory):
            parts.append(f"{head} up to {int(r.tried_up_to)} (the search's cap: no longer context was tried)")
            continue
        why = ""
        if not pd.isna(r.get("predicted_peak_gib", float("nan"))):
            why = f": analytic peak {r.predicted_peak_gib:,.0f} GiB"
            if not pd.isna(r.get("device_memory_gib", float("nan"))):
                why += f" against the GPU's {r.device_memory_gib:.0f} GiB"
        forward = ", while the forward alone fits" if str(r.forward_fits_there).lower() == "true" else ""
        parts.append(
            f"{head} {f'up to {fits[-1]}' if fits else 'at no context tried'} "
            f"(at {int(r.out_of_memory)} it runs out of memory{why}{forward})"
        )
    return f"Doubling the context from {int(found.table.tried_from.min())}, {and_join(parts)}."


# ------------------------------------------------------------------------------------- answers


@builds_each_handout("nsys_profile.a")
def _nsys_a(results: Results, handout: str) -> Answer:
    compare = results.table("forward_time_vs_harness")
    gpu, unit = _profile_unit(results)
    runs = results.table("profiled_runs")
    device_col = "forward_gpu_span_ms" if gpu else "forward_compute_ms"
    both = compare.dropna(subset=["harness_ms", device_col]).copy()
    both, caveat = _select(both, results, handout, first=True)
    if both.empty:
        raise NotAnswered("no configuration has both a profiled and a Python-timer forward time")
    both["ratio"] = both[device_col] / both.harness_ms
    d = _pick_row(both, _detail(results, handout))
    where = machine(results, NB_PROFILE, gpu)
    text = (
        f"On {where}, the forward pass of {size_label(d['size'], handout)} at context {int(d.context_length)} takes "
        f"{fmt_ms(d[device_col])} in the profile ({'first to last kernel on the GPU' if gpu else 'CPU operator time'}) "
        f"against {fmt_ms(d.harness_ms)} ± {fmt_ms(d.harness_std_ms)} by the Python timer. Over the {len(both)} "
        f"configurations the profiled time is {span(both.ratio)}× the Python timer's"
    )
    table_cols = {
        "size": "size",
        "context_length": "context",
        "harness_ms": "Python timer (ms)",
        "harness_std_ms": "Python timer std (ms)",
        device_col: "profiled forward (ms)",
        "ratio": "profiled / timer",
    }

    def configurations(n: int) -> str:
        return f"{n} configuration" + ("" if n == 1 else "s")

    if gpu:
        fwd = runs[runs["mode"] == "forward"][["size", "context_length", "forward_compute_ms", "forward_gpu_span_ms"]]
        both = both.merge(
            fwd.rename(columns={"forward_gpu_span_ms": "_span"}), on=["size", "context_length"], how="left"
        )
        both["busy"] = both.forward_compute_ms / both._span
        busy, idle = both[both.busy >= BUSY], both[both.busy < BUSY]
        if len(busy) and len(idle):
            text += (
                f": where the kernels fill at least {BUSY:.0%} of the forward's span ({configurations(len(busy))}) "
                f"the two agree to {span(busy.ratio)}×, while where the GPU waits between kernels for the CPU to "
                f"launch them (kernels {span(100 * idle.busy, '{:.0f}', '%')} of the span, "
                f"{configurations(len(idle))}) "
                f"the profile runs {span(idle.ratio)}× the timer's time: the profiler's own cost per launch "
                f"lengthens those gaps."
            )
        else:
            text += "."
        table_cols["busy"] = "GPU busy (share of span)"
    else:
        text += (
            ": the profile counts only the operators' own time, while the Python timer also counts the interpreter "
            "and dispatch time between them."
            if both.ratio.max() < 1
            else "."
        )
    found = search(results) if handout == "2026" else None
    if found is not None:
        text = longest_sentence(found) + " " + text
    table = both[list(table_cols)].rename(columns=table_cols).round(3)
    table["size"] = [size_label(s, handout) for s in table["size"]]
    return Answer(
        text=text, table=table, caveat=join_caveats(caveat, cpu_caveat(gpu, both["size"]), PROFILER_NOTE if gpu else "")
    )


def _matmul_count(size: str) -> tuple[int, int]:
    n = layers(size)
    return 7 * n + 1, 2 * n


@builds_each_handout("nsys_profile.b")
def _nsys_b(results: Results, handout: str) -> Answer:
    top = results.table("top_kernels")
    gpu, unit = _profile_unit(results)
    top, caveat = _select(top, results, handout)
    if top.empty:
        raise NotAnswered("no configuration was profiled")
    r = _pick_row(top, _detail(results, handout))
    weight, attention = _matmul_count(r["size"])
    same = top.same_kernel.astype(str).str.lower() == "true"
    leaders = list(dict.fromkeys(top.kernel))
    text = (
        f"For {size_label(r['size'], handout)} at context {int(r.context_length)} the {unit} with the most forward "
        f"time is `{r.kernel}` ({pct(r.share)} of the forward's {unit} time), called {r.calls_per_forward:.0f} times "
        f"per forward pass (the model makes {weight} weight matmuls and {attention} attention matmuls per forward "
        "pass). "
    )
    if isinstance(r.kernel_fwd_bwd, str):
        leader = f"the same {unit}" if bool(same[r.name]) else f"`{r.kernel_fwd_bwd}`"
        text += f"With the backward included the leader is {leader} ({pct(r.share_fwd_bwd)}); "
    fb = top.dropna(subset=["kernel_fwd_bwd"])
    fp32_gemms = gpu and all(re.search(r"f32f32|sgemm", k) and not re.search(r"tf32|bf16|f16|hmma", k) for k in leaders)
    text += (
        f"over the {len(fb)} configurations that fit a training step, the forward and forward+backward leaders "
        f"coincide in {int(same[fb.index].sum())}"
    )
    differ = fb[~same[fb.index]]
    if len(differ):
        common = differ.kernel_fwd_bwd.value_counts()
        kind = "another GEMM" if all("gemm" in k for k in common.index) else "another kernel"
        text += f", and where they differ {kind} leads (`{common.index[0]}` in {int(common.iloc[0])} of them)"
    text += "."
    if fp32_gemms:
        text += (
            " Every forward leader is an fp32 GEMM run on the CUDA cores (FFMA/SIMT kernels: `f32f32` or "
            "`simt_sgemm` in the name), not on tensor cores (PyTorch's fp32 matmuls do not use TF32 by default)."
        )
    table = top[
        ["size", "context_length", "kernel", "share", "calls_per_forward", "kernel_fwd_bwd", "share_fwd_bwd"]
    ].copy()
    table["size"] = [size_label(s, handout) for s in table["size"]]
    table["share"] = (100 * table.share).round(1)
    table["share_fwd_bwd"] = (100 * table.share_fwd_bwd).round(1)
    table = table.rename(
        columns={
            "context_length": "context",
            "kernel": f"top forward {unit}",
            "share": "share of forward (%)",
            "calls_per_forward": "calls per forward",
            "kernel_fwd_bwd": f"top forward+backward {unit}",
            "share_fwd_bwd": "share of forward+backward (%)",
        }
    )
    return Answer(text=text, table=table, caveat=join_caveats(caveat, cpu_caveat(gpu, top["size"])))


@builds_each_handout("nsys_profile.c")
def _nsys_c(results: Results, handout: str) -> Answer:
    shares = results.table("forward_category_shares")
    gpu, unit = _profile_unit(results)
    shares, caveat = _select(shares, results, handout)
    nm, detail = _non_matmul(results, _detail(results, handout))
    where = f"{size_label(detail[0], handout)} at context {detail[1]}" if detail else "the detailed configuration"
    if nm.empty:
        raise NotAnswered("no non-matmul kernel reached the threshold share in the detailed configuration")
    by_cat = nm.groupby("category").share.sum().sort_values(ascending=False)
    listed = ", ".join(f"`{r.kernel}` ({pct(r.share)})" for r in nm.head(6).itertuples())
    non_matmul = 1 - shares["matmul"]
    lo, hi = shares.loc[non_matmul.idxmin()], shares.loc[non_matmul.idxmax()]
    text = (
        f"In the forward pass of {where}, {len(nm)} non-matmul {unit}s take {pct(nm.share.min())} or more of the "
        f"{unit} time each, {pct(nm.share.sum())} together: {listed}"
        + (f" and {len(nm) - 6} more" if len(nm) > 6 else "")
        + "; by category "
        + ", ".join(f"{c} {pct(v)}" for c, v in by_cat.items())
        + ". "
        f"Over the {len(shares)} configurations, non-matmul {unit}s take {pct(non_matmul.min())} "
        f"({size_label(lo['size'], handout)} at {int(lo.context_length)}) to {pct(non_matmul.max())} "
        f"({size_label(hi['size'], handout)} at {int(hi.context_length)}) of the forward's {unit} time."
    )
    table = nm[["kernel", "category", "total_ms", "instances", "avg_us", "share"]].copy()
    table["share"] = (100 * table.share).round(1)
    table = table.rename(
        columns={
            "kernel": unit,
            "total_ms": "time over the measured steps (ms)",
            "instances": "calls",
            "avg_us": "mean per call (µs)",
            "share": "share of forward (%)",
        }
    ).round(3)
    if handout == "2026" and detail and size_2026(detail[0]) is None:
        caveat += f" The listed {unit}s are those of {detail[0]}, which is not a 2026 size."
    return Answer(text=text, table=table, caveat=join_caveats(caveat, cpu_caveat(gpu, shares["size"])))


@builds_each_handout("nsys_profile.d")
def _nsys_d(results: Results, handout: str) -> Answer:
    wide = results.table("category_shares_inference_vs_training")
    gpu, unit = _profile_unit(results)
    wide, caveat = _select(wide, results, handout)
    fit = wide.dropna(subset=["matmul (training step)"])
    if fit.empty:
        raise NotAnswered("no training step fit in memory")
    f, t = fit["matmul (forward)"], fit["matmul (training step)"]
    drops = int((t < f).sum())
    direction = "falls" if drops == len(fit) else "rises" if drops == 0 else "moves"
    d = _pick_row(fit, _detail(results, handout))
    text = (
        f"The matmul share of {unit} time {direction} from {span(100 * f, '{:.0f}', '%')} in a forward pass to "
        f"{span(100 * t, '{:.0f}', '%')} in a full training step "
        + (
            (
                f"in all {len(fit)} configurations"
                if len(fit) > 2
                else "in both configurations"
                if len(fit) == 2
                else "in the one configuration"
            )
            + " that fit a training step"
            if drops in (0, len(fit))
            else f"(it falls in {drops} of the {len(fit)} configurations that fit a training step)"
        )
        + f" ({size_label(d['size'], handout)} at {int(d.context_length)}: {pct(d['matmul (forward)'])} → "
        f"{pct(d['matmul (training step)'])}). "
    )
    others = []
    for cat in ("elementwise", "copy", "reduction", "optimizer", "softmax"):
        fc, tc = f"{cat} (forward)", f"{cat} (training step)"
        if fc in fit and tc in fit and (fit[fc].max() > 0.005 or fit[tc].max() > 0.005):
            others.append((cat, fit[fc], fit[tc]))
    gain = max(others, key=lambda o: (o[2] - o[1]).median()) if others else None
    if gain is not None:
        cat, fc, tc = gain
        text += (
            f"{cat.capitalize()} {unit}s take most of the difference, from {span(100 * fc, '{:.0f}', '%')} to "
            f"{span(100 * tc, '{:.0f}', '%')}: the backward adds an elementwise gradient {unit} for every elementwise "
            f"operation of the forward, and AdamW updates every parameter and both moments with elementwise "
            f"{unit}s and no matmul"
        )
        rest = [o for o in others if o[0] != cat]
        if rest:
            text += "; " + ", ".join(
                f"{c} {span(100 * a, '{:.0f}', '%')} → {span(100 * b, '{:.0f}', '%')}" for c, a, b in rest
            )
        text += "."
    oom = wide[wide["matmul (training step)"].isna()]
    if len(oom):
        caveat = join_caveats(
            caveat,
            "Out of memory for the training step: "
            + and_join([f"{s} at {int(c)}" for s, c in zip(oom["size"], oom.context_length)])
            + ".",
        )
    cols = {
        "size": "size",
        "context_length": "context",
        "matmul (forward)": "matmul, forward (%)",
        "matmul (training step)": "matmul, training step (%)",
    }
    if gain is not None:
        cat = gain[0]
        cols.update({f"{cat} (forward)": f"{cat}, forward (%)", f"{cat} (training step)": f"{cat}, training step (%)"})
    table = wide[list(cols)].copy()
    for c in list(cols)[2:]:
        table[c] = (100 * table[c]).round(1)
    table = table.rename(columns=cols)
    table["size"] = [size_label(s, handout) for s in table["size"]]
    return Answer(text=text.strip(), table=table, caveat=join_caveats(caveat, cpu_caveat(gpu, wide["size"])))


@builds_each_handout("nsys_profile.e")
def _nsys_e(results: Results, handout: str) -> Answer:
    if not results.has("softmax_vs_matmuls"):
        reason = results.not_run(NB_PROFILE).get("(e) softmax against the matmuls")
        raise NotAnswered(reason or "this run has no `softmax_vs_matmuls` table")
    a = results.table("softmax_vs_matmuls")
    gpu, unit = _profile_unit(results)
    a, caveat = _select(a, results, handout)
    d = _pick_row(a, _detail(results, handout))
    text = (
        f"Inside one attention of the forward pass the softmax takes {span(a.softmax_over_matmuls_time)}× the time of "
        f"the two matmuls around it ({size_label(d['size'], handout)} at {int(d.context_length)}: "
        f"{fmt_ms(d.softmax_ms)} against {fmt_ms(d.scores_ms)} + {fmt_ms(d.final_matmul_ms)}) while doing only "
        f"{span(100 * a.softmax_over_matmuls_flops, '{:.1f}', '%')} of their FLOPs (5 per score against 4·d_head), so "
        f"per FLOP it is {span(a.time_ratio_over_flop_ratio, '{:.0f}')}× slower. "
    )
    text += (
        ""
        if not gpu
        else "The matmuls reuse every element they load from memory across a whole tile of products, while the "
        "softmax's max, subtract, exp, sum and divide read and write the batch × heads × context² score tensor with "
        "about one FLOP per element each, so its time is set by memory traffic, not arithmetic."
    )
    text = text.strip()
    table = a[
        [
            "size",
            "context_length",
            "scores_ms",
            "softmax_ms",
            "final_matmul_ms",
            "softmax_over_matmuls_time",
            "softmax_over_matmuls_flops",
            "time_ratio_over_flop_ratio",
        ]
    ].copy()
    table["softmax_over_matmuls_flops"] = 100 * table.softmax_over_matmuls_flops
    table["size"] = [size_label(s, handout) for s in table["size"]]
    table = table.rename(
        columns={
            "context_length": "context",
            "scores_ms": "Q·Kᵀ (ms)",
            "softmax_ms": "softmax (ms)",
            "final_matmul_ms": "P·V (ms)",
            "softmax_over_matmuls_time": "softmax / matmuls, time",
            "softmax_over_matmuls_flops": "softmax / matmuls, FLOPs (%)",
            "time_ratio_over_flop_ratio": "time ratio / FLOP ratio",
        }
    ).round(3)
    return Answer(text=text, table=table, caveat=join_caveats(caveat, cpu_caveat(gpu, a["size"])))
