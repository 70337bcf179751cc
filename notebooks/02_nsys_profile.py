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
# # Problem `nsys_profile` — where the time of a step goes, kernel by kernel
# Spring 2025 handout §1.1.4: profile the forward pass, the backward pass and the optimizer step of
# every model size at context 128, 256, 512 and 1024 (noting the ones that run out of memory). The
# spring 2026 handout (§2.1.4) asks the same of two sizes of its choice at three power-of-two contexts
# above 128, the largest being the longest that fits in memory. Both then answer (a) how long the
# forward pass takes next to the Python timer of the benchmarking script, (b) which kernel takes the
# most GPU time in the forward pass, how often it runs per forward pass and whether it also leads in
# forward+backward, (c) which non-matmul kernels take non-trivial time, (d) how the matmul share
# moves from inference to a full training step, and (e) how the softmax's time compares with the
# two matmuls around it, against their FLOPs.

# %% tags=["parameters"]
profile = None            # "cpu" | "gpu"; None picks gpu when CUDA is available
sizes = None              # model sizes of the grid; None means the 2025 handout's five on gpu
context_lengths = None    # contexts of the grid; None means 128, 256, 512, 1024 on gpu
longest_sizes = None      # sizes searched for the longest context that fits (2026); None means small and xl on gpu
longest_from = None       # the search doubles the context from here...
longest_cap = None        # ...up to this cap, which bounds the run time; None means 256 and 16384 on gpu
batch_size = 4
warmup = None             # warm-up steps; the last runs under the profiler and is filtered out by its range
steps = None              # profiled measured steps
timing_warmup = None      # settings of the benchmarking script for (a); None means 5 on gpu
timing_steps = None       # None means 10 on gpu
timeline_size = None      # the configuration whose trace is kept, drawn and exported for Perfetto
timeline_context = None
share_threshold = 0.01    # "non-trivial": at least this share of the forward pass's kernel time

# %%
from cs336_systems.report import setup_notebook

ctx = setup_notebook("02_nsys_profile", profile=profile)
sizes = ctx.pick(sizes, cpu=["nano", "tiny"], gpu=["small", "medium", "large", "xl", "2.7B"])
context_lengths = ctx.pick(context_lengths, cpu=[32], gpu=[128, 256, 512, 1024])
longest_sizes = ctx.pick(longest_sizes, cpu=sizes, gpu=["small", "2.7B"])  # the 2026 xl has the 2.7B's shape
longest_from = ctx.pick(longest_from, cpu=context_lengths[0], gpu=256)
longest_cap = ctx.pick(longest_cap, cpu=context_lengths[-1], gpu=16384)
warmup = ctx.pick(warmup, cpu=1, gpu=2)
steps = ctx.pick(steps, cpu=2, gpu=2)
timeline_size = ctx.pick(timeline_size, cpu=sizes[0], gpu="small")
timeline_context = ctx.pick(timeline_context, cpu=context_lengths[0], gpu=256)
timing_warmup = ctx.pick(timing_warmup, cpu=1, gpu=5)
timing_steps = ctx.pick(timing_steps, cpu=3, gpu=10)

# %%
from dataclasses import replace

import matplotlib.pyplot as plt
import pandas as pd

from cs336_systems.benchmarking import BenchmarkConfig, sweep, with_predicted_memory
from cs336_systems.experiments.answers import give
from cs336_systems.profiling.profile_sweep import (
    combine,
    context_ladder,
    longest_contexts,
    matmul_shares,
    profile_sweep,
    top_kernels,
)
from cs336_systems.profiling.timeline import CATEGORY_COLORS, plot_timeline, range_span
from cs336_systems.profiling.trace import load_trace, range_instances

# %% [markdown]
# ## How the profile is taken
# Nsight Systems could not write a report on the GPU machines the repository's GPU report was made on,
# so this notebook takes the same measurements with PyTorch's own profiler; the `nsys` command for a
# machine where Nsight Systems works is at the end, and it shows the same named ranges.
#
# `cs336_systems.profiling.profile_sweep` runs the benchmarking harness under `torch.profiler`
# (CPU activity, plus CUDA activity through CUPTI, the same activity records Nsight Systems
# reads), exports each trace as Chrome/Perfetto JSON and reads it back as a table of events. The
# harness wraps every step in named ranges — `warmup step` / `measured step`, `forward`,
# `backward`, `optimizer step` — and the naive attention in `computing attention scores`,
# `computing softmax`, `final matmul`. Each range is both a `record_function` range (seen by
# torch.profiler) and an NVTX range (seen by `nsys`). A kernel belongs to a range when the CPU call
# that **launched** it lies inside the range, which is how Nsight Systems projects NVTX ranges onto
# the GPU rows; only the measured steps count. Each size and context is profiled twice: an
# inference forward pass, and a full training step (forward, cross-entropy, backward, AdamW).
#
# Two sweeps: the 2025 grid (every size at every context), then, for the 2026 handout, the search for
# the longest context that fits: each of `longest_sizes` goes up by doubling from `longest_from` and
# stops after the first context whose training step runs out of memory (its rows are kept, with the
# analytic peak that explains them) or at `longest_cap`. Configurations the grid profiled already are
# not profiled again.

# %%
base = BenchmarkConfig(batch_size=batch_size, warmup=warmup, steps=steps)
traces_dir = ctx.path("traces")
on_grid = profile_sweep(base, sizes, context_lengths, trace_for=(timeline_size, timeline_context), trace_dir=traces_dir)
ladder = context_ladder(longest_from, longest_cap)
searched = profile_sweep(base, longest_sizes, ladder, until_oom=True, known=on_grid.runs)
profiled = combine(on_grid, searched)
runs = with_predicted_memory(profiled.runs, ctx.device)
ctx.save_table(runs, "profiled_runs", show=False)
unit = profiled.unit
gpu = unit == "CUDA kernel"
oom = runs[runs.status != "ok"]
ctx.md(
    f"Profiled {len(runs)} runs ({len(sizes)} size{'s' * (len(sizes) > 1)} × {len(context_lengths)} context{'s' * (len(context_lengths) > 1)} "
    f"× forward / training step, and {len(searched.runs)} more in the search for the longest context), "
    f"batch {batch_size}, {warmup} warm-up and {steps} measured steps each. "
    + (f"Out of memory: {', '.join(f'{r.size} at {r.context_length} ({r.mode})' for r in oom.itertuples())}."
       if len(oom) else "Every configuration fit in memory.")
    + ("" if gpu else " **This machine has no GPU**, so the traces hold CPU operators only: below, every "
       "'kernel' is a CPU operator (aten::mm, aten::bmm, ...) timed by its self time (its duration minus "
       "that of the operators it calls), and every GPU time is CPU time.")
)

# %% [markdown]
# ### The longest context that fits
# Per searched size: the contexts at which a whole training step fits, the first whose training step
# ran out of memory, whether the forward alone still fits there, and the analytic peak of that
# training step (`cs336_systems.accounting.memory`) next to the GPU's memory.

# %%
ctx.save_table(longest_contexts(runs, longest_sizes, ladder), "longest_context");

# %% [markdown]
# ## (a) Forward time: profiler against the Python timer
# The benchmarking script's number (harness, `timeit.default_timer` around synchronized steps, no
# profiler) next to what the profile says about the same forward pass: the wall time of the
# `measured step` range (CPU side, includes the synchronize), and the time the device needed for
# the forward pass's kernels (from its first kernel's start to its last kernel's end).

# %%
timing = BenchmarkConfig(batch_size=batch_size, mode="forward", warmup=timing_warmup, steps=timing_steps)
forwards = runs[runs["mode"] == "forward"]
timed = sweep([replace(timing, size=s, context_length=c) for s, c in zip(forwards["size"], forwards.context_length)],
              desc="harness timing")
device_col = "forward_gpu_span_ms" if gpu else "forward_compute_ms"
fwd = runs[(runs["mode"] == "forward") & (runs.status == "ok")]
compare = timed[["size", "context_length", "status", "mean_ms", "std_ms"]].rename(
    columns={"mean_ms": "harness_ms", "std_ms": "harness_std_ms"}).merge(
    fwd[["size", "context_length", "profiled_step_ms", device_col]], on=["size", "context_length"], how="left")
compare["profiled_over_harness"] = compare[device_col] / compare["harness_ms"]
ctx.save_table(compare, "forward_time_vs_harness");

# %%
give(ctx, "nsys_profile.a", "nsys_profile.a.2026")
both = compare.dropna(subset=["harness_ms", device_col])
if len(both):
    detail = both[(both["size"] == timeline_size) & (both.context_length == timeline_context)]
    d = detail.iloc[0] if len(detail) else both.iloc[0]
    ctx.headline(f"{d['size']} ctx {d.context_length} forward, profiled", round(float(d[device_col]), 3), "ms")

# %% [markdown]
# ## (b) The kernel with the most time in the forward pass
# Per configuration: the forward pass's top kernel (share of the forward pass's kernel time and
# invocations per forward pass) and the top kernel of forward+backward (the training step without
# its optimizer range).

# %%
fwd_top = top_kernels(profiled, "forward")
fb_top = top_kernels(profiled, "forward+backward")
top = fwd_top.merge(fb_top, on=["size", "context_length"], how="outer", suffixes=("", "_fwd_bwd"))
top["same_kernel"] = top["name"] == top["name_fwd_bwd"]
top_table = top[["size", "context_length", "kernel", "share", "instances_per_range", "kernel_fwd_bwd", "share_fwd_bwd", "same_kernel"]]
ctx.save_table(top_table.rename(columns={"instances_per_range": "calls_per_forward"}), "top_kernels");

# %%
give(ctx, "nsys_profile.b", "nsys_profile.b.2026")
if len(top):
    row = top[(top["size"] == timeline_size) & (top.context_length == timeline_context)]
    r = row.iloc[0] if len(row) else top.iloc[0]
    ctx.headline(f"{r['size']} ctx {r.context_length}: top forward {unit} share", round(100 * float(r.share), 1), "%")

# %% [markdown]
# ## (c) Non-matmul kernels with non-trivial time in the forward pass
# Every non-matmul kernel with at least `share_threshold` of the forward pass's kernel time, for
# the detailed configuration (all configurations' are saved beside it); then the category shares for
# all configurations.

# %%
k = profiled.kernels
columns = ["size", "context_length", "kernel", "category", "total_ms", "instances", "avg_us", "share"]
forward_k = k[k.scope == "forward"]
non_matmul_all = forward_k[(forward_k.category != "matmul") & (forward_k.share >= share_threshold)][columns]
ctx.save_table(non_matmul_all, "non_matmul_forward_all", show=False)
non_matmul = non_matmul_all[(non_matmul_all["size"] == timeline_size) & (non_matmul_all.context_length == timeline_context)]
ctx.save_table(non_matmul, "non_matmul_forward");
shares = matmul_shares(profiled)
fwd_cat = shares.pivot_table(index=["size", "context_length"], columns="category", values="forward").reset_index()
ctx.save_table(fwd_cat, "forward_category_shares");

# %%
give(ctx, "nsys_profile.c", "nsys_profile.c.2026")

# %% [markdown]
# ## (d) Matmul share: inference against a full training step

# %%
wide = shares.pivot_table(index=["size", "context_length"], columns="category", values=["forward", "training step"])
wide.columns = [f"{cat} ({scope})" for scope, cat in wide.columns]
ctx.save_table(wide.reset_index(), "category_shares_inference_vs_training");
fig, axes = plt.subplots(1, 2, figsize=(13, 4), sharey=True)
for ax, scope in zip(axes, ["forward", "training step"]):
    pivot = shares.pivot_table(index=["size", "context_length"], columns="category", values=scope)
    pivot.index = [f"{s}\n{c}" for s, c in pivot.index]
    pivot.plot(kind="bar", stacked=True, ax=ax, width=0.8, legend=ax is axes[-1], color=[CATEGORY_COLORS[c] for c in pivot.columns])
    ax.set(title=f"{scope}: share of {unit} time", ylabel="share")
    ax.tick_params(axis="x", labelsize=7)
axes[-1].legend(loc="upper left", bbox_to_anchor=(1, 1), fontsize=8)
ctx.save_figure(fig, "category_shares")

# %%
give(ctx, "nsys_profile.d", "nsys_profile.d.2026")
mm = shares[shares.category == "matmul"]
if len(mm):
    ctx.headline("matmul share, inference → training step (median)",
                 f"{100 * mm.forward.median():.0f}% → {100 * mm['training step'].median():.0f}%")

# %% [markdown]
# ## (e) Softmax against the two attention matmuls
# Inside one naive attention, per layer and forward pass: the time of each named range and its
# FLOPs from the shapes — Q Kᵀ and P V do 2·B·H·S²·d_h each, the softmax about 5·B·H·S² (max,
# subtract, exp, sum, divide per score).

# %%
att = profiled.attention
if len(att):
    per = att.pivot_table(index=["size", "context_length"], columns="range", values="compute_ms")
    flops = att.pivot_table(index=["size", "context_length"], columns="range", values="flops_per_layer")
    matmul_ms = per["computing attention scores"] + per["final matmul"]
    attention_table = pd.DataFrame({
        "scores_ms": per["computing attention scores"], "softmax_ms": per["computing softmax"], "final_matmul_ms": per["final matmul"],
        "softmax_over_matmuls_time": per["computing softmax"] / matmul_ms,
        "softmax_over_matmuls_flops": flops["computing softmax"] / (flops["computing attention scores"] + flops["final matmul"]),
    }).reset_index()
    attention_table["time_ratio_over_flop_ratio"] = attention_table.softmax_over_matmuls_time / attention_table.softmax_over_matmuls_flops
    ctx.save_table(attention_table, "softmax_vs_matmuls")
    ctx.headline("softmax time / attention matmul time (median)",
                 round(float(attention_table.softmax_over_matmuls_time.median()), 2), "×")
else:
    ctx.not_run("(e) softmax against the matmuls", "the attention is not the naive one, so the three attention ranges are absent")
give(ctx, "nsys_profile.e", "nsys_profile.e.2026")

# %% [markdown]
# ## Timeline of one training step
# The kept trace (the measured steps of the detailed configuration), drawn from the profiler's
# events: one lane per GPU stream (CPU thread on a CPU-only machine), kernels coloured by
# category, ranges above. The `.json.gz` beside the report opens in https://ui.perfetto.dev.

# %%
key = (timeline_size, timeline_context, "train-step")
if key in profiled.traces:
    events = load_trace(profiled.traces[key])
    fig = plot_timeline(events, ranges=["forward", "backward", "optimizer step"], window="measured step",
                        title=f"{timeline_size}, context {timeline_context}: one measured training step")
    ctx.save_figure(fig, "timeline_training_step")
    if len(range_instances(events, "computing softmax")):
        measured = range_instances(events, "measured step").iloc[0]
        window = range_span(events, "computing attention scores", "final matmul", after_us=measured.ts_us, gpu=gpu)
        fig = plot_timeline(events, ranges=["computing attention scores", "computing softmax", "final matmul"],
                            window=window, title=f"{timeline_size}, context {timeline_context}: one attention (first layer)")
        ctx.save_figure(fig, "timeline_attention")
    ctx.md(f"Trace files: {', '.join(f'`{p.name}`' for p in profiled.traces.values())}, in the report's `results/traces/`.")
else:
    ctx.not_run("timeline", f"{timeline_size} at context {timeline_context} did not run (out of memory)")

# %% [markdown]
# ## The same run under Nsight Systems
# Nothing in the code depends on torch.profiler: `annotated()` opens NVTX ranges too, so
#
#     nsys profile -o result --trace=cuda,nvtx python -m cs336_systems.benchmarking \
#         --size small --context-length 256 --mode train-step --warmup 2 --steps 3
#
# shows the same `warmup step` / `measured step`, `forward`, `backward`, `optimizer step` and
# attention ranges; filter the CUDA GPU Kernel Summary on the `measured step` NVTX range to leave
# the warm-up out.
#
# ## Why the numbers look like this
# - **Non-matmul kernels**: each elementwise or reduction kernel (RMSNorm's square, mean, rsqrt and
#   scaling; RoPE's products; the residual additions; SiLU; the softmax's max, subtract, exp, sum,
#   divide; copies for reshapes) reads and writes whole activation tensors while doing one or two
#   FLOPs per element, so its time is set by memory bandwidth rather than arithmetic, and every
#   kernel, however short, also costs a launch.
# - **A training step against a forward pass**: the backward adds elementwise work (every
#   elementwise op has a gradient kernel, and gradients accumulate) next to its two matmuls per
#   forward matmul, and AdamW is a dozen elementwise passes over every parameter, gradient and
#   moment, with no matmul at all; the answer to (d) gives the resulting shares.
# - **Softmax versus matmuls**: the two matmuls do 4·d_h FLOPs per score for every 5 of the softmax.
#   A matmul reuses each element it loads from memory across a whole tile of products (in this fp32
#   run, on the CUDA cores rather than tensor cores: see the kernel names in (b)), while each of the
#   softmax's kernels streams the B·H·S² score tensor through memory at about one FLOP per element.
#   This is how a softmax can take a time out of proportion to its FLOPs, and the motivation for
#   fusing attention (FlashAttention, notebook 09).
