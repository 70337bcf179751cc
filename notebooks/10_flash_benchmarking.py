# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Problem `flash_benchmarking` — FlashAttention-2 (Triton) against PyTorch attention
# Spring 2025 handout §1.3.2 (`flash_benchmarking`). Forward, backward and forward+backward latencies
# of (i) our FlashAttention-2 (Triton forward and backward kernels), (ii) the materialised PyTorch
# attention softmax(Q Kᵀ/√d) V of `attention/naive.py`, and (iii) PyTorch's
# `scaled_dot_product_attention` with its fastest backend at each point (flash, cuDNN or
# memory-efficient, each timed alone under `sdpa_kernel`). Batch 1, one head, causal masking; every
# power of two from 128 to 65,536 for the sequence length; head dimension 16, 32, 64, 128;
# bfloat16 and float32. Inputs are drawn before timing starts. Each timed configuration is also
# checked against a float64 reference in the same run.

# %% tags=["parameters"]
profile = None          # "cpu" | "gpu"; None picks gpu when CUDA is available
seq_lens = None         # None: 128 ... 65536 (gpu), 64, 128 (cpu)
head_dims = None        # None: 16, 32, 64, 128 (gpu), 16, 32 (cpu)
dtypes = None           # names, e.g. ["bfloat16", "float32"]; None: both (gpu), float32 (cpu)
impls = None            # None: triton, pytorch, sdpa_flash, sdpa_cudnn, sdpa_efficient
warmup_ms = 5           # do_bench warm-up time per measurement (gpu)
rep_ms = 20             # do_bench measuring time per measurement (gpu); stretched for slow points
min_runs = 3            # measured runs per latency, at least
rounds = None           # interleaved timing rounds per configuration; None: 3 (gpu), 1 (cpu)
cpu_steps = 2           # timed calls per measurement on CPU (after one untimed call)
memory_fraction = 0.4   # the materialised attention is skipped above this share of GPU memory
ceiling_n = None        # matmul size of the ceiling: 8192 (gpu), 512 (cpu)

# %%
import os

import torch

from cs336_systems.report import resolve_profile, setup_notebook

if resolve_profile(profile) == "cpu":
    # Our kernels then run in the Triton interpreter, which must be chosen before triton is imported.
    os.environ["TRITON_INTERPRET"] = "1"

ctx = setup_notebook("10_flash_benchmarking", profile=profile)
seq_lens = ctx.pick(seq_lens, cpu=[64, 128], gpu=[2**i for i in range(7, 17)])
head_dims = ctx.pick(head_dims, cpu=[16, 32], gpu=[16, 32, 64, 128])
dtypes = ctx.pick(dtypes, cpu=["float32"], gpu=["bfloat16", "float32"])
ceiling_n = ctx.pick(ceiling_n, cpu=512, gpu=8192)
rounds = ctx.pick(rounds, cpu=1, gpu=3)

# %%
import pandas as pd
import seaborn as sns

from cs336_systems.attention.reference import TOLERANCE
from cs336_systems.benchmarking.attention_registry import IMPLEMENTATIONS
from cs336_systems.benchmarking.ceiling import measure_matmul_tflops
from cs336_systems.benchmarking.timing import TimingSettings
from cs336_systems.experiments.answers import give
from cs336_systems.experiments.answers.words import times_span as ratio_span
from cs336_systems.experiments.attention_benchmark import seq_len_axis
from cs336_systems.experiments.flash_benchmark import (
    IMPL_LABELS,
    compare_latencies,
    comparison_table,
    eager_and_device,
    flash_benchmark,
    latencies_long,
    latency_pivot,
)
from cs336_systems.report.tables import fmt_ms

impls = impls or list(IMPLEMENTATIONS)
settings = TimingSettings(warmup_ms=warmup_ms, rep_ms=rep_ms, min_runs=min_runs, cpu_steps=cpu_steps, rounds=rounds)
if ctx.device.type == "cuda":
    ctx.md(
        f"Timing: `triton.testing.do_bench`, median of the runs, {warmup_ms} ms of warm-up and {rep_ms} ms of "
        f"measurement per latency (at least {min_runs} runs however slow), L2 cache flushed before every run; "
        f"each configuration's implementations timed in {rounds} interleaved rounds (each starting with another "
        f"implementation, {rep_ms / rounds:.3g} ms each), the median taken over all rounds' runs. "
        f"fp32 matmul precision: `{torch.get_float32_matmul_precision()}`."
    )
    from cs336_systems.attention.launch import native as flash_native

    flash_native.load()
    ctx.md("Ours is called as `flash_attention_triton`: where the C++ autograd node of `attention/launch/native.py` "
           "serves the geometry, its eager calls launch the same Triton kernels from C++ "
           f"(node here: {flash_native.status()}); elsewhere they take the Python `autograd.Function`.")
else:
    ctx.md(
        f"Timing on this CPU: `do_bench` needs a GPU, so each latency is the median of {cpu_steps} calls timed "
        "with `timeit.default_timer` after one untimed call. Our kernels run in the **Triton interpreter** "
        "(NumPy, one program at a time): the CPU profile exercises every code path, table and figure, and "
        "its timings say nothing about the GPU."
    )
    ctx.not_run("the handout's grid on an H100 (sequence 128-65,536, d 16-128, bf16 and fp32)",
                "needs a GPU; this CPU profile runs a tiny fp32 grid under the Triton interpreter")

# %% [markdown]
# **What is timed.** Forward: `o = f(q, k, v)` with autograd recording, as in training. Backward:
# `o.backward(dO, retain_graph=True)` on one recorded forward, measured directly (not as
# forward+backward minus forward). Forward+backward: `f(q, k, v).backward(dO)`. Gradients of q, k, v
# are reset to None before every run, so no accumulation is timed. **Correctness:** before timing,
# one forward and backward of every implementation is compared with a float64 reference (SDPA's math
# backend over chunks of query rows, on the same rounded inputs); the worst norm-wise relative error
# of O, dQ, dK, dV above the tolerance of the dtype marks the row `wrong`. Other statuses: `OOM`,
# `no kernel` (an SDPA backend without a kernel for this dtype or device, with torch's reason), and
# `skipped: memory` (the materialised attention where its predicted peak — five N×N tensors — would
# pass the memory budget; decided from the shape, nothing is allocated).
#
# **FLOPs** (for TFLOP/s): causal forward 4·B·H·N²·d / 2 (two matmuls of 2·N²·d, half of them masked),
# backward 2.5× that (five matmuls), forward+backward 3.5×.

# %%
ceilings = {name: measure_matmul_tflops(getattr(torch, name), n=ceiling_n, device=ctx.device) for name in dtypes}
ctx.save_table(pd.DataFrame([dict(dtype=k, n=ceiling_n, matmul_tflops=v) for k, v in ceilings.items()]), "flash_matmul_ceiling");

# %%
raw = flash_benchmark(
    seq_lens, head_dims, [getattr(torch, name) for name in dtypes], impls, device=ctx.device,
    settings=settings, memory_fraction=memory_fraction,
)
ctx.save_table(raw, "flash_benchmarking_all_backends", show=False)
table = comparison_table(raw)
ctx.save_table(table, "flash_benchmarking", show=False)
ctx.md(f"## Latencies (ms)\n{len(table) // max(1, table.impl.nunique())} configurations × "
       f"{table.impl.nunique()} implementations; full rows (statuses, TFLOP/s, errors) in `flash_benchmarking.csv`, "
       f"every SDPA backend in `flash_benchmarking_all_backends.csv`.")
ctx.save_table(latency_pivot(table), "flash_benchmarking_wide");

# %%
give(ctx, "flash_benchmarking.a")

# %%
statuses = raw.pivot_table(index="impl", columns="status", values="seq_len", aggfunc="count", fill_value=0)
ctx.save_table(statuses.reset_index(), "flash_status_counts")
not_ok = raw[raw.status != "ok"]
if len(not_ok):
    ctx.save_table(not_ok[["impl", "dtype", "head_dim", "seq_len", "status", "max_rel_error", "note"]], "flash_not_ok_rows",
                   show=False)
    # torch's messages, one line per distinct reason: the "... not used because:" lines only announce the next one
    reasons = not_ok.assign(reason=not_ok.note.fillna("").str.split(" | ", regex=False)).explode("reason")
    reasons["reason"] = reasons.reason.str.replace(r"\s*\(Triggered internally at [^)]*\)\.?", "", regex=True).str.strip()
    reasons = reasons[(reasons.reason != "") & ~reasons.reason.str.endswith("because:")]
    summary = reasons.groupby(["status", "reason"], sort=False).agg(
        rows=("seq_len", "size"), implementations=("impl", lambda s: ", ".join(dict.fromkeys(s))),
        dtypes=("dtype", lambda s: ", ".join(dict.fromkeys(s)))).reset_index()
    ctx.md(f"{len(not_ok)} rows did not produce a correct timing. Their reasons, one line per distinct message with "
           "the number of rows that gave it (every row, with its full message, is in `flash_not_ok_rows.csv`):")
    ctx.save_table(summary, "flash_not_ok_reasons")
worst = raw[raw.status.isin(["ok", "wrong"])].groupby(["impl", "dtype"]).max_rel_error.max()
ctx.md("Worst relative error against float64 per implementation and dtype (tolerance "
       + ", ".join(f"{str(k).removeprefix('torch.')} {v.sweeps:g}" for k, v in TOLERANCE.items() if str(k).removeprefix("torch.") in dtypes)
       + "): " + "; ".join(f"{i} {d}: {e:.1e}" for (i, d), e in worst.items()) + ".")

# %%
sdpa = table[(table.impl == "sdpa") & (table.status == "ok")]
if len(sdpa):
    wins = sdpa.groupby("dtype").backend.value_counts()
    ctx.md("**SDPA's fastest backend** (lowest forward+backward at each point): " + "; ".join(
        f"{dt}: " + ", ".join(f"{b} at {c} of {sdpa[sdpa.dtype == dt].shape[0]} points" for (_, b), c in grp.items())
        for dt, grp in wins.groupby(level=0)) + ".")
no_kernel = raw[raw.status == "no kernel"].groupby(["impl", "dtype"]).note.first()
if len(no_kernel):
    ctx.md("Backends with no kernel: " + "; ".join(f"`{i}` in {d} ({n[:160]})" for (i, d), n in no_kernel.items()) + ".")

# %% [markdown]
# ## Latency against sequence length

# %%
long = latencies_long(table)
g = sns.relplot(data=long, x="seq_len", y="ms", hue="implementation", style="dtype", row="pass", col="head_dim",
                kind="line", marker="o", height=2.6, aspect=1.15, facet_kws=dict(sharey="row"),
                hue_order=[IMPL_LABELS[i] for i in IMPL_LABELS if IMPL_LABELS[i] in set(long.implementation)])
for ax in g.axes.flat:
    ax.set_yscale("log")
    seq_len_axis(ax, long.seq_len, label="sequence length")
g.set_titles("{row_name}, d = {col_name}")
g.set_ylabels("latency (ms)")
ctx.save_figure(g.figure, "flash_latency_vs_seq_len");

# %% [markdown]
# ## Achieved TFLOP/s against the measured matmul ceiling
# The horizontal line is the rate of an n×n matmul in the same dtype, measured in this run.

# %%
long_tf = latencies_long(table, value="tflops")
g = sns.relplot(data=long_tf, x="seq_len", y="tflops", hue="implementation", style="pass", row="dtype", col="head_dim",
                kind="line", marker="o", height=2.8, aspect=1.15, facet_kws=dict(sharey="row"))
for (dt, _), ax in g.axes_dict.items():
    ax.axhline(ceilings[dt], color="black", lw=1, ls=":")
    ax.set_yscale("log")
    seq_len_axis(ax, long_tf.seq_len, label="sequence length")
    ax.text(ax.get_xlim()[0], ceilings[dt], f" {dt} matmul {ceilings[dt]:.3g}", va="bottom", fontsize=8)
g.set_titles("{row_name}, d = {col_name}")
g.set_ylabels("TFLOP/s")
ctx.save_figure(g.figure, "flash_tflops_vs_seq_len");

# %%
best = table[(table.impl == "triton") & (table.status == "ok")]
if len(best):
    top = best.loc[best.forward_backward_tflops.astype(float).idxmax()]
    dt, rate = top["dtype"], float(top.forward_backward_tflops)
    ctx.md(f"Our best forward+backward rate: {rate:.3g} TFLOP/s ({dt}, d = {top.head_dim}, N = {top.seq_len:,}), "
           f"{rate / ceilings[dt]:.0%} of the {dt} matmul ceiling ({ceilings[dt]:.3g} TFLOP/s).")
    ctx.headline(f"ours best fwd+bwd rate ({dt})", round(rate, 3), "TFLOP/s")

# %% [markdown]
# ## Where ours beats and loses to SDPA

# %%
vs_sdpa = compare_latencies(table, "triton", "sdpa")
for dt, grp in vs_sdpa.groupby("dtype"):
    fb = grp[grp["pass"] == "forward_backward"]
    faster, slower = fb[fb.ratio < 1], fb[fb.ratio >= 1]
    text = (f"**{dt}**, forward+backward: ours is faster than SDPA's fastest backend at {len(faster)} of {len(fb)} points"
            + (f" (down to {fb.ratio.min():.2f}× its latency at d = {fb.loc[fb.ratio.idxmin()].head_dim}, "
               f"N = {fb.loc[fb.ratio.idxmin()].seq_len:,})" if fb.ratio.notna().any() else ""))
    if len(slower):
        text += "; slower at " + ", ".join(f"d = {r.head_dim} N = {r.seq_len:,} ({r.ratio:.2f}×)" for r in slower.head(12).itertuples())
        text += " …" if len(slower) > 12 else ""
    ctx.md(text + ".")

# %% [markdown]
# ## Ours against SDPA's flash backend and the materialised attention, pass by pass
# Ours / baseline for the forward, the backward and the forward+backward at every point where both
# ran: against SDPA's flash backend on the bf16 grid from sequence length 1,024, and against the
# materialised PyTorch attention everywhere. The point-passes where ours took more than 1.1× the
# flash backend's time, or more than the materialised attention's, are listed (a point where ours
# did not run correctly would be listed too).


# %%
def ratio_summary(name: str, cmp: pd.DataFrame, factor: float, shown: int = 15) -> str:
    """One comparison of `compare_latencies` in words: the range of ours / baseline, and the point-passes
    above `factor` (first `shown`)."""
    measured = cmp.dropna(subset=["ratio"])
    if measured.empty:
        return f"**{name}**: no point of this run's grid has both measurements."
    slower = cmp[cmp.slower]
    text = (f"**{name}**: {ratio_span(measured.ratio)} over {len(measured)} point-passes "
            f"({measured.drop_duplicates(['dtype', 'head_dim', 'seq_len']).shape[0]} points, up to 3 passes each)")
    if slower.empty:
        return text + f"; none above {factor:g}×."
    return text + f"; above {factor:g}× at {len(slower)}: " + ", ".join(
        f"{r['dtype']} d = {r['head_dim']} N = {r['seq_len']:,} {r['pass'].replace('_', '+')}: "
        + (f"{fmt_ms(r['ms'])} vs {fmt_ms(r['baseline_ms'])} ({r['ratio']:.2f}×)" if r["status"] == "ok" else f"ours {r['status']}")
        for r in slower.head(shown).to_dict("records")) + (" …" if len(slower) > shown else "") + "."


comparisons = {
    "ours / SDPA flash backend, bf16, N ≥ 1,024": ("sdpa_flash", 1.10, dict(min_seq_len=1024, dtypes=["bfloat16"])),
    "ours / materialised PyTorch attention, every point": ("pytorch", 1.0, {}),
}
for name, (baseline, factor, where) in comparisons.items():
    cmp = compare_latencies(raw, "triton", baseline, factor, **where)
    ctx.md(ratio_summary(name, cmp, factor))
    if cmp.ratio.notna().any():
        # written when empty too, so a run without such points replaces the previous run's list
        ctx.save_table(cmp[cmp.slower], "flash_bar_offenders_" + ("sdpa_flash" if "flash" in baseline else "pytorch"), show=False)
        ctx.headline(f"largest {name}", round(float(cmp.ratio.max()), 3), "×")

# %% [markdown]
# ## Eager latency and device time
# `do_bench` times each eager call between two CUDA events and flushes the L2 cache (a 256 MiB
# memset) before every run; the host queues the next call while the flush runs, so host work up to
# the flush's length stays hidden. Past that, the latency measures the host's Python, dispatch and
# launches rather than the kernels, and the CPUs of the GPU hosts used here are slow at that (hence ours
# launches from a C++ autograd node, whose backward runs no Python on autograd's device thread; the host
# times that decided it are in `docs/flash_attention_tuning.md`). The **device time** replays the same
# call captured once in a CUDA graph (`measure_device_ms`), which leaves only the kernels. The
# comparisons above use the eager latency; here they are repeated on device time, which separates the
# kernels from the host path.

# %%
both = eager_and_device(raw)
if both.empty:
    ctx.md("Device times need CUDA graphs, hence a GPU: not measured in this profile.")
else:
    ctx.save_table(both, "flash_eager_and_device", show=False)
    for name, (baseline, factor, where) in comparisons.items():
        cmp = compare_latencies(raw, "triton", baseline, factor, value="device_ms", **where)
        ctx.md(ratio_summary(f"{name}, on device time", cmp, factor))
        if cmp.ratio.notna().any():
            ctx.save_table(cmp[cmp.slower], "flash_bar_offenders_device_" + ("sdpa_flash" if "flash" in baseline else "pytorch"),
                           show=False)
            ctx.headline(f"largest {name}, on device time", round(float(cmp.ratio.max()), 3), "×")
    short = both[(both.dtype == "bfloat16") & (both.seq_len <= 4096)]
    outside = short.groupby(["pass", "impl"]).outside_ms.median().unstack("impl")
    ctx.md("Median time the eager call spends beyond its kernels (eager latency − device time), bf16, N ≤ 4,096: "
           + "; ".join(f"{p.replace('_', '+')}: " + ", ".join(f"{IMPL_LABELS.get(i, i)} {fmt_ms(ms)}" for i, ms in row.items())
                       for p, row in outside.iterrows()) + ".")
    plot = both[(both.dtype == "bfloat16") & (both.head_dim == 64)].melt(
        id_vars=["impl", "seq_len", "pass"], value_vars=["ms", "device_ms"], var_name="time", value_name="latency")
    plot["time"] = plot.time.map({"ms": "eager latency", "device_ms": "device time"})
    plot["implementation"] = plot.impl.map({"triton": IMPL_LABELS["triton"], "sdpa_flash": "SDPA, flash backend"})
    g = sns.relplot(data=plot, x="seq_len", y="latency", hue="implementation", style="time", col="pass",
                    kind="line", marker="o", height=2.8, aspect=1.2)
    for ax in g.axes.flat:
        ax.set_yscale("log")
        seq_len_axis(ax, plot.seq_len, label="sequence length")
    g.set_titles("{col_name}, bf16, d = 64")
    g.set_ylabels("ms")
    ctx.save_figure(g.figure, "flash_eager_vs_device");
