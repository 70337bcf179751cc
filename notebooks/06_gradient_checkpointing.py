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
# # Problem `gradient_checkpointing` — trading recomputation for activation memory
# Spring 2026 handout §3.2. (a) For a stack of N identical blocks, which arrangement of (possibly
# nested) `torch.utils.checkpoint` calls minimises peak activation memory when compute is free, with
# its asymptotic memory and compute — confirmed by running it on a small stack. (b) For the xl
# model at batch 4 and context 2048 with a single level of recomputation (no nesting): predict the
# best checkpoint block size, then measure the peak memory of it and of the next smaller and larger
# sizes. The 2026 handout's xl (d_model 2560, d_ff 10240, 32 layers, 32 heads) is the size the
# library calls "2.7B" (its "xl" is the 2025 handout's, d_model 1600 with 48 layers).

# %% tags=["parameters"]
profile = None            # "cpu" | "gpu"; None picks gpu when CUDA is available
depths = None             # (a) stack depths N; None means the profile's default
stack_d_model = None      # (a) width of the blocks of the small stack
stack_context = None      # (a) sequence length through the small stack
stack_batch = 2
size = None               # (b) model size; None means the 2026 xl (the library's "2.7B") on gpu
model_overrides = None    # (b) hyperparameter overrides of that size (the cpu profile shrinks it)
batch_size = None         # (b) None means 4 on gpu
context_length = None     # (b) None means 2048 on gpu
mode = "forward-backward" # (b) the step whose peak is measured; train-step adds the constant AdamW state
larger = 2                # (b) how many block sizes above the predicted best to measure

# %%
from cs336_systems.report import setup_notebook

ctx = setup_notebook("06_gradient_checkpointing", profile=profile)
depths = ctx.pick(depths, cpu=[2, 4, 8, 16], gpu=[2, 4, 8, 16, 32])
stack_d_model = ctx.pick(stack_d_model, cpu=64, gpu=1024)
stack_context = ctx.pick(stack_context, cpu=64, gpu=1024)
size = ctx.pick(size, cpu="tiny", gpu="2.7B")
model_overrides = ctx.pick(model_overrides, cpu={"num_layers": 8, "vocab_size": 500}, gpu={})
batch_size = ctx.pick(batch_size, cpu=2, gpu=4)
context_length = ctx.pick(context_length, cpu=128, gpu=2048)

# %%
import math

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.ticker import NullFormatter, ScalarFormatter

from cs336_systems.accounting.memory import block_saved_tensors, memory_estimate, residual_stream_bytes
from cs336_systems.benchmarking import BenchmarkConfig
from cs336_systems.experiments.answers import give
from cs336_systems.experiments.checkpointing import CheckpointedLM, strategy_costs
from cs336_systems.profiling.peak_memory import measure_peak_memory

MIB, GIB = 2**20, 2**30
unit, scale = ("GiB", GIB) if ctx.device.type == "cuda" else ("MiB", MIB)

# %% [markdown]
# ## (a) The memory-optimal arrangement
# A checkpointed function keeps only its input during the forward and re-runs its body just before
# that body's backward; checkpoints may nest. Let a be one block's saved activations and c one
# checkpoint (a residual-stream tensor), with a ≫ c.
#
# - **No checkpointing**: all N blocks' activations are alive at the start of the backward: N·a.
# - **One level, groups of k** (`TransformerLM(checkpoint_every=k)`): N/k checkpoints plus one
#   group re-run at a time, (N/k)·c + k·a, smallest at k = √(N·c/a): O(√N) memory for 2N forwards.
# - **Binary nesting**: checkpoint each half, and inside each half each quarter, and so on. At any
#   time one block is materialised plus at most two checkpoints per level: a + 2·log₂N·c, O(log N)
#   memory for O(N log N) forwards.
# - **Chain nesting — the memory optimum**: prefix(j) = block_j(checkpoint(prefix(j−1), x)). The
#   backward through block j re-runs blocks 0…j−1 from the stored input x without keeping anything,
#   so besides one block's activations only x and the gradient flowing down exist: a + O(c), i.e.
#   **O(1) in N** — no arrangement can do with less than one block's activations, since a block's
#   backward needs them — at the price of N(N+1)/2 block forwards, **O(N²) compute**.
#
# ```python
# def run_chain(blocks, x):                 # O(1) activation memory, O(N^2) compute
#     if len(blocks) == 1:
#         return blocks[0](x)
#     y = checkpoint(run_chain, blocks[:-1], x, use_reentrant=False)
#     return blocks[-1](y)
#
# def run_binary(blocks, x):                # O(log N) memory, O(N log N) compute
#     if len(blocks) == 1:
#         return blocks[0](x)
#     mid = len(blocks) // 2
#     y = checkpoint(run_binary, blocks[:mid], x, use_reentrant=False)
#     return checkpoint(run_binary, blocks[mid:], y, use_reentrant=False)
# ```
#
# Both are in `cs336_systems.experiments.checkpointing` and run below on a stack of TransformerBlocks (weights
# frozen, so the peak is activations and their gradients only), counting block forwards.

# %%
costs = strategy_costs(depths, d_model=stack_d_model, num_heads=max(1, stack_d_model // 64), d_ff=4 * stack_d_model,
                       batch=stack_batch, context=stack_context, device=ctx.device)
ctx.save_table(costs.pivot(index="blocks", columns="strategy", values="peak_mib").reset_index(), "strategy_peak_mib");
ctx.save_table(costs.pivot(index="blocks", columns="strategy", values="block_forwards").reset_index(), "strategy_block_forwards");
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
sns.lineplot(data=costs, x="blocks", y="peak_mib", hue="strategy", marker="o", ax=axes[0])
axes[0].set(xscale="log", yscale="log", xlabel="blocks N", ylabel="peak activation memory (MiB)", title="Memory")
sns.lineplot(data=costs, x="blocks", y="block_forwards", hue="strategy", marker="o", ax=axes[1])
axes[1].set(xscale="log", yscale="log", xlabel="blocks N", ylabel="block forwards per step", title="Compute")
for ax in axes:
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
ctx.save_figure(fig, "strategies")
give(ctx, "gradient_checkpointing.a")

# %%
lo, hi = min(depths), max(depths)
grow = costs.pivot(index="blocks", columns="strategy", values="peak_bytes")
work = costs.pivot(index="blocks", columns="strategy", values="block_forwards")
ctx.md(
    f"From N = {lo} to N = {hi} blocks ({hi // lo}× deeper), peak activation memory grows "
    + ", ".join(f"{grow.loc[hi, s] / grow.loc[lo, s]:.2f}× with **{s}**" for s in ["none", "every", "binary", "chain"])
    + f" (√ of the depth ratio is {math.sqrt(hi / lo):.2f}, log₂N goes from {math.log2(lo):.0f} to {math.log2(hi):.0f}); "
    + "block forwards grow " + ", ".join(f"{work.loc[hi, s] / work.loc[lo, s]:.1f}× with {s}" for s in ["none", "every", "binary", "chain"])
    + f". At N = {hi}, chain nesting needs {grow.loc[hi, 'chain'] / grow.loc[hi, 'none']:.1%} of the memory of no "
    f"checkpointing for {work.loc[hi, 'chain'] / work.loc[hi, 'none']:.0f}× the forwards."
)

# %% [markdown]
# ## (b) One level of recomputation for the xl model
# Only groups of k consecutive blocks under one checkpoint each (no nesting). The analytic model
# (`cs336_systems.accounting.memory.memory_estimate`, checked against measurements on CPU in the
# tests) walks the backward pass group by group: the checkpoints still held, the gradients of
# everything above, the recomputed group's activations and its backward's temporaries.

# %%
base = BenchmarkConfig(size=size, model=model_overrides, context_length=context_length, batch_size=batch_size, mode=mode, warmup=1, steps=1)
config = base.model_config()
N = config.num_layers
a = int(block_saved_tensors(config, batch_size, context_length)["bytes"].sum())
c = residual_stream_bytes(batch_size, context_length, config.d_model)
predicted = pd.DataFrame([
    dict(k=k, predicted=memory_estimate(config, batch_size, context_length, mode, checkpoint_every=k)["peak"] / scale)
    for k in range(1, N + 1)
])
best_k = int(predicted.loc[predicted.predicted.idxmin(), "k"])
best_at = memory_estimate(config, batch_size, context_length, mode, checkpoint_every=best_k)["peak_at"]
half = memory_estimate(config, batch_size, context_length, mode, checkpoint_sublayers=1)["peak"] / scale
none = memory_estimate(config, batch_size, context_length, mode)["peak"] / scale
half_vs_best = half / predicted.predicted.min() - 1
ctx.save_table(pd.DataFrame([dict(size=size, d_model=config.d_model, d_ff=config.d_ff, num_layers=N, num_heads=config.num_heads,
                                  batch=batch_size, context=context_length, mode=mode, block_saved_mib=a / MIB,
                                  checkpoint_mib=c / MIB, predicted_best_k=best_k)]), "checkpoint_model");
ctx.md(
    f"{size} (d_model {config.d_model}, d_ff {config.d_ff}, {N} layers, {config.num_heads} heads): N = {N} blocks; one block saves a = {a / MIB:,.1f} MiB for the backward, one checkpoint is "
    f"c = {batch_size} × {context_length} × {config.d_model} × 4 bytes = {c / MIB:,.1f} MiB. The first-order trade-off "
    f"(N/k)·c + k·a is smallest at k = √(N·c/a) = {math.sqrt(N * c / a):.2f}: a block's activations are "
    f"{a / c:.0f}× a checkpoint, so " + ("the balance tips all the way to **the smallest groups**. " if math.sqrt(N * c / a) < 1.5
                                       else f"groups of about {round(math.sqrt(N * c / a))} blocks balance the two terms. ")
    + f"The full model predicts "
    f"{predicted.predicted.min():.2f} {unit} at k = {best_k} block{'s' if best_k > 1 else ''} per checkpoint, against "
    f"{none:.2f} {unit} without checkpointing, with the peak in the {best_at}. Checkpointing half-blocks (attention and "
    f"feed-forward separately, the next size below one block) is predicted at {half:.2f} {unit} ({100 * half_vs_best:+.1f}%)"
    + (": by the time the backward reaches the bottom blocks almost every gradient exists and almost every checkpoint "
       "is freed, so the peak there is one sublayer's recomputed activations either way." if abs(half_vs_best) < 0.01 else ".")
)

# %%
candidates = [("half block", None, 1)] if best_k == 1 else [(f"k = {best_k - 1}", best_k - 1, None)]
candidates += [(f"k = {k}", k, None) for k in range(best_k, min(N, best_k + larger) + 1)] + [("none", None, None)]
rows = []
for label, k, sublayers in candidates:
    wrap = (lambda m: CheckpointedLM(m, "every", k=1, unit="sublayer")) if sublayers else None
    measured = measure_peak_memory(BenchmarkConfig(**{**base.__dict__, "checkpoint_every": k}), wrap=wrap)
    est = memory_estimate(config, batch_size, context_length, mode, checkpoint_every=k, checkpoint_sublayers=sublayers)
    rows.append(dict(checkpoint=label, status=measured["status"], measured=measured.get("peak_bytes", float("nan")) / scale,
                     predicted=est["peak"] / scale, peak_at=est["peak_at"]))
result = pd.DataFrame(rows).rename(columns={"measured": f"measured_{unit}", "predicted": f"predicted_{unit}"})
result["error"] = result[f"predicted_{unit}"] / result[f"measured_{unit}"] - 1
ctx.save_table(result, "checkpoint_block_sizes");
give(ctx, "gradient_checkpointing.b")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(predicted.k, predicted.predicted, marker=".", color="grey", label="predicted (analytic)")
measured_k = result[result.checkpoint.str.startswith("k = ") & (result.status == "ok")]
ax.scatter(measured_k.checkpoint.str[4:].astype(int), measured_k[f"measured_{unit}"], color="C3", zorder=3, label="measured")
half_row = result[(result.checkpoint == "half block") & (result.status == "ok")]
if len(half_row):
    ax.scatter([0.5], half_row[f"measured_{unit}"], color="C3", marker="D", zorder=3, label="measured, half block (x = ½)")
ax.set(xlabel="blocks per checkpoint k", ylabel=f"peak memory ({unit})", title=f"{size}, batch {batch_size}, context {context_length}: {mode}")
ax.legend()
ctx.save_figure(fig, "peak_vs_block_size")

# %%
ok = result[result.status == "ok"].set_index("checkpoint")
if len(ok):
    lowest = ok.index[ok[f"measured_{unit}"] <= ok[f"measured_{unit}"].min() * 1.01].tolist()
    holds = ok.loc[f"k = {best_k}", f"measured_{unit}"] <= ok[f"measured_{unit}"].min() * 1.01 if f"k = {best_k}" in ok.index else False
    ctx.md(
        "Measured peak memory: " + "; ".join(f"{name}: {r[f'measured_{unit}']:.2f} {unit} (predicted {r[f'predicted_{unit}']:.2f})"
                                             for name, r in ok.iterrows())
        + (f"; without checkpointing: {result.loc[result.checkpoint == 'none', 'status'].iloc[0]}" if "none" not in ok.index else "")
        + f". The lowest measured peak{'s (within 1%) are' if len(lowest) > 1 else ' is'} **{' and '.join(lowest)}**; the prediction (k = {best_k}) "
        + ("holds: no neighbouring block size measures lower (within 1%)." if holds else "does not hold on this machine.")
        + f" The analytic peaks are within {100 * ok.error.abs().max():.1f}% of the measured ones."
    )
    ctx.headline(f"{size} ctx {context_length} peak, checkpoint every block", round(float(ok.loc[f'k = {best_k}', f'measured_{unit}']), 2), unit)
