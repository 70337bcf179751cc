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
# # Problem `pytorch_attention` — naive attention: time and memory against sequence length
# Spring 2025 handout §1.2.1. The attention of `attention/naive.py`,
# softmax(Q Kᵀ/√d) V with every intermediate materialised, at batch 8 and without a head
# dimension: Q, K, V of shape (8, seq, d) for d ∈ {16, 32, 64, 128} × seq ∈ {256, 1024, 4096, 8192, 16384}.
# Each configuration: 100 timed forwards, the memory in use before the backward, 100 timed backwards,
# after warm-up and with a synchronize after every step. Past the grid, the sequence length keeps
# doubling until the first out-of-memory, so "at what size" has a measured answer.

# %% tags=["parameters"]
profile = None            # cpu or gpu, None picks gpu when CUDA is available
d_models = None           # head dimensions, None means the default of the profile
seq_lens = None           # sequence lengths of the grid, None means the default of the profile
batch = 8
warmup = None             # untimed steps before each timed series
steps = None              # timed forwards and timed backwards per configuration
memory_budget_mib = None  # None means the whole device on GPU, the cpu profile simulates a small budget
max_seq_len = 2**18       # the doubling past the grid stops here at the latest
isolate = None            # fresh processes per head dimension and after each OOM, None means on GPU only

# %%
from cs336_systems.report import setup_notebook

ctx = setup_notebook("07_pytorch_attention", profile=profile)
d_models = ctx.pick(d_models, cpu=[16, 32], gpu=[16, 32, 64, 128])
seq_lens = ctx.pick(seq_lens, cpu=[32, 64, 128], gpu=[256, 1024, 4096, 8192, 16384])
warmup = ctx.pick(warmup, cpu=1, gpu=5)
steps = ctx.pick(steps, cpu=3, gpu=100)
memory_budget_mib = ctx.pick(memory_budget_mib, cpu=4, gpu=None)

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch

from cs336_systems.experiments.answers import give
from cs336_systems.experiments.attention_benchmark import (
    MiB,
    attention_sweep,
    naive_attention_memory,
    quadratic_fit,
    seq_len_axis,
)
from cs336_systems.report.tables import fmt_ms

budget_bytes = None if memory_budget_mib is None else int(memory_budget_mib * MiB)
if ctx.device.type == "cuda":
    limit_bytes = budget_bytes or torch.cuda.get_device_properties(ctx.device).total_memory
    memory_limit = f"{limit_bytes / 2**30:.1f} GiB of the {torch.cuda.get_device_name(ctx.device)}"
else:
    limit_bytes = budget_bytes
    memory_limit = f"a simulated budget of {memory_budget_mib} MiB, as the CPU has no allocator limit to hit"
unit, unit_name = (2**30, "GiB") if limit_bytes >= 2**30 else (MiB, "MiB")
ctx.md(f"Memory limit of this run: {memory_limit}.")

# %% [markdown]
# ## Timings and memory per configuration
# `forward_ms` / `backward_ms`: mean (and standard deviation) over the timed steps. `memory before
# backward`: on a GPU the caching allocator's `memory_allocated()` right after a forward, minus what
# it held before Q, K, V were created; on a CPU the bytes of the distinct tensors alive then (Q, K, V,
# O and what autograd saved). On a GPU the grid of each head dimension runs in a fresh Python
# process, and every configuration after an out-of-memory in another fresh one, so memory an OOM
# leaves behind on the device cannot shrink what the next configuration may use.
# `saved for backward`: what autograd keeps for the backward, measured with saved-tensor hooks.
# Rows marked `extended` are the doubling past the handout's grid.

# %%
df = attention_sweep(
    {"naive": "naive"}, d_models, seq_lens, batch=batch, device=ctx.device, warmup=warmup, steps=steps,
    memory_budget_bytes=budget_bytes, max_seq_len=max_seq_len, isolate=isolate,
)
ctx.save_table(df, "attention_sweep_raw", show=False)
columns = ["d_model", "seq_len", "status", "forward_ms", "forward_std_ms", "backward_ms", "backward_std_ms",
           "memory_before_backward_mib", "saved_for_backward_mib", "extended"]
ctx.save_table(df[[c for c in columns if c in df]], "attention_sweep");

# %%
ok, oom = df[df.status == "ok"], df[df.status == "OOM"]
largest = ok.sort_values(["seq_len", "d_model"]).iloc[-1]
ctx.md(
    f"{len(ok)} of {len(df)} configurations ran. The largest that ran, d = {largest.d_model} at sequence length "
    f"{largest.seq_len}, takes {fmt_ms(largest.forward_ms)} per forward and {fmt_ms(largest.backward_ms)} per backward "
    f"({largest.backward_ms / largest.forward_ms:.1f}× the forward), with {largest.memory_before_backward_mib:,.1f} MiB "
    f"in use before the backward."
)
if len(oom):
    first_oom = oom.groupby("d_model").seq_len.min()
    ctx.md(
        "**At what size does it run out of memory?** "
        + "; ".join(f"d = {d}: first at sequence length {n:,}" for d, n in first_oom.items())
        + f" (batch {batch}; limit: {memory_limit}). "
        + ("The head dimension barely moves the threshold: the quadratic terms (batch × seq²) dominate."
           if first_oom.nunique() == 1 else "A larger head dimension lowers the threshold only where the linear terms matter.")
    )
    ctx.headline(f"naive attention first OOM (batch {batch}, d={first_oom.index[0]})", int(first_oom.iloc[0]), "tokens")
else:
    ctx.md(f"No configuration ran out of memory up to sequence length {df.seq_len.max():,}.")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
for ax, col, title in zip(axes, ["forward_ms", "backward_ms"], ["forward", "backward"]):
    sns.lineplot(data=ok, x="seq_len", y=col, hue="d_model", marker="o", palette="viridis", ax=ax)
    ax.set(yscale="log", ylabel="time (ms)", title=f"Naive attention, {title}")
    seq_len_axis(ax, ok.seq_len)
ctx.save_figure(fig, "attention_timings")

# %% [markdown]
# ## Memory accounting for the smallest configuration that runs out of memory
# For Q, K, V of shape (B, N, d) in fp32 (4 bytes per element), the naive attention keeps alive before
# the backward:
#
# | tensor | elements | why it is alive |
# |---|---|---|
# | Q, K, V, O | 4·B·N·d | inputs (saved by the two matmuls) and the output |
# | S = QKᵀ/√d | B·N² | saved by the max of the stable softmax |
# | exp(S − max S) | B·N² | saved by exp and by the normalising division |
# | P = softmax(S) | B·N² | saved by the product P V |
# | row max, row sum | 2·B·N | saved by the max and the division |
#
# so about 3·B·N²·4 bytes, quadratic in N and independent of d. The backward then needs, at its
# peak, the gradients of P and of S on top (2·B·N² more). The table checks the formula against the
# measured rows and prices the smallest failing configuration.

# %%
if len(oom):
    smallest = oom.sort_values(["seq_len", "d_model"]).iloc[0]
    b, n, d = batch, int(smallest.seq_len), int(smallest.d_model)
    parts = naive_attention_memory(b, n, d)
    accounting = pd.DataFrame(
        [dict(item=name.replace("_", " "), **{unit_name: v / unit}) for name, v in parts.items()]
        + [dict(item="memory limit of this run", **{unit_name: limit_bytes / unit})]
    )
    ctx.save_table(accounting, "oom_accounting")
    quadratic = parts["scores"] + parts["exp_scores"] + parts["probabilities"]
    need = parts["before_backward"] + parts["backward_extra"]
    ctx.md(
        f"Smallest failing configuration: d = {d}, sequence length {n:,} (failed in the {smallest.oom_phase}). "
        f"The forward needs {parts['before_backward'] / unit:.2f} {unit_name} before the backward "
        f"({quadratic / unit:.2f} {unit_name} of it the three {b}×{n}×{n} score-sized tensors) and the backward "
        f"{parts['backward_extra'] / unit:.2f} {unit_name} more, against {limit_bytes / unit:.2f} {unit_name} available: "
        + (f"{need / limit_bytes:.1f}× the limit." if need > limit_bytes else
           f"only {need / limit_bytes:.2f}× the limit, so something this accounting does not count (the allocator's "
           f"rounding and fragmentation, temporaries of the backward) made up the rest.")
    )
# The formula against the measurement, on the configurations that ran (the large ones, where the
# N² terms dominate, say whether it is right; tiny ones are a few hundred KiB).
if len(ok):
    check = ok.assign(predicted_mib=[naive_attention_memory(batch, int(r.seq_len), int(r.d_model))["before_backward"] / MiB
                                     for r in ok.itertuples()])
    check["ratio"] = check.memory_before_backward_mib / check.predicted_mib
    big = check[check.seq_len == check.seq_len.max()]
    ctx.md(
        f"On the {len(check)} configurations that ran, measured memory before the backward / formula is "
        f"{check.ratio.min():.3f}–{check.ratio.max():.3f} (median {check.ratio.median():.3f}); at the longest sequence "
        f"that ran ({int(big.seq_len.iloc[0]):,}) it is {big.ratio.min():.3f}–{big.ratio.max():.3f}."
    )
else:
    ctx.md("No configuration ran out of memory, so there is no failing configuration to account for.")

# %% [markdown]
# ### The answer to (a)
# The timings table, where the memory runs out, the accounting and the remedy, from the tables above.

# %%
give(ctx, "pytorch_attention.a")

# %% [markdown]
# ## How the memory saved for the backward grows with the sequence length
# Measured saved-for-backward bytes against N, with a least-squares fit a·N² + b·N + c per head dimension.

# %%
fits = {}
fig, ax = plt.subplots(figsize=(7, 4.5))
palette = sns.color_palette("viridis", len(d_models))
for color, (d, grp) in zip(palette, ok.groupby("d_model")):
    if grp.seq_len.nunique() < 3:
        continue
    fits[d] = quadratic_fit(grp.seq_len, grp.saved_for_backward_mib * MiB)
    ax.plot(grp.seq_len, grp.saved_for_backward_mib, "o", color=color, label=f"d={d} measured")
    n = np.geomspace(grp.seq_len.min(), grp.seq_len.max(), 100)
    ax.plot(n, np.polyval(fits[d], n) / MiB, "-", color=color, alpha=0.6, label=f"d={d} fit a·N²+b·N+c")
seq_len_axis(ax, ok.seq_len)
ax.set(yscale="log", ylabel="saved for backward (MiB)",
       title=f"Naive attention, batch {batch}: memory saved for the backward")
ax.legend(fontsize=8)
ctx.save_figure(fig, "saved_memory_growth")
if fits:
    a_fit = np.mean([f[0] for f in fits.values()])
    ratios = ok.sort_values("seq_len").groupby("d_model").apply(
        lambda g: (g.saved_for_backward_mib.iloc[-1] / g.saved_for_backward_mib.iloc[-2]) / (g.seq_len.iloc[-1] / g.seq_len.iloc[-2]),
        include_groups=False)
    ctx.md(
        f"The fitted quadratic coefficient is a = {a_fit:.1f} bytes per N² (mean over d), against "
        f"3·B·4 = {3 * batch * 4} bytes predicted by the accounting (three fp32 B×N×N tensors): the saved memory is "
        f"quadratic in the sequence length. Between the two longest sequences that ran, doubling N multiplies it by "
        f"{2 * ratios.min():.2f}–{2 * ratios.max():.2f} (4 for a pure N² term)."
    )
    ctx.headline("naive attention saved bytes per N² (fit)", round(a_fit, 1), "B")

# %% [markdown]
# **What would remove this cost.** The N² terms are the score matrix and its softmax, kept only so that
# the backward can read P. Nothing forces that: the backward can recompute P tile by tile from Q, K and
# the per-row logsumexp L (one number per query), as FlashAttention-2 does. The forward is computed in
# tiles with an online softmax (running max and sum), so no N×N matrix ever exists in memory, only
# L, Q, K, V, O are saved (memory linear in N), and the whole computation is fused into one kernel so
# the tiles never leave on-chip memory. Notebook 09 measures exactly this.
