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
# # Problem `benchmarking_mixed_precision` — autocast dtypes, layer norm, and bf16 speed-ups
#
# Spring 2025 handout §1.1.5: (a) the dtypes inside a toy model under fp16 autocast, observed with
# hooks; (b) which parts of layer normalization are precision sensitive; (c) fp32 vs bf16 timings
# for every model size.

# %% tags=["parameters"]
profile = None          # "cpu" or "gpu", None picks gpu when CUDA is available
sizes = None            # model sizes for part c, None means the default of the profile
context_length = None   # None means 256 on gpu
batch_size = 4
warmup = None           # None means 5 on gpu
steps = None            # None means 10 on gpu

# %%
from cs336_systems.report import setup_notebook

ctx = setup_notebook("04_benchmarking_mixed_precision", profile=profile)
sizes = ctx.pick(sizes, cpu=["nano", "tiny"], gpu=["small", "medium", "large", "xl", "2.7B"])
context_length = ctx.pick(context_length, cpu=32, gpu=256)
warmup = ctx.pick(warmup, cpu=2, gpu=5)
steps = ctx.pick(steps, cpu=4, gpu=10)

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch

from cs336_systems.benchmarking import BenchmarkConfig, grid, sweep
from cs336_systems.mixed_precision import layer_norm_sensitivity, observe_autocast_dtypes
from cs336_systems.report.tables import fmt_ms

# %% [markdown]
# ## (a) Dtypes under fp16 autocast
# `ToyModel` (fc1 → ReLU → LayerNorm → fc2) with fp32 parameters, run under
# `torch.autocast(dtype=torch.float16)`; forward hooks record what each layer actually returns.

# %%
dtypes = observe_autocast_dtypes(ctx.device, torch.float16)
ctx.save_table(dtypes, "toy_model_dtypes");
d = dict(zip(dtypes.component, dtypes.dtype))
ctx.md(
    f"On {ctx.device.type.upper()}: the parameters stay **{d['model parameters inside autocast (fc1.weight)']}** "
    f"(autocast casts copies for each op, it never changes the stored weights); fc1's output is **{d['output of fc1']}**; "
    f"the layer norm's output is **{d['output of ln']}**; the logits are **{d['logits']}**; the loss is **{d['loss']}**; "
    f"the gradients are **{d['gradients (all parameters)']}**, the dtype of the parameters they belong to."
    + (" Layer norm is on autocast's fp32 list on CUDA, so its output is fp32 even though its input is fp16."
       if d["output of ln"] == "float32" else
       " On this device autocast runs layer norm in the low-precision dtype (CUDA's autocast keeps it in fp32).")
)

# %% [markdown]
# ## (b) Which parts of layer norm are sensitive to precision?
# Layer norm computes a mean, a variance (a mean of squares), adds ε and divides. Below, each step is
# computed in fp16, bf16 and fp32 for inputs of growing scale and with an offset, and compared with fp64.

# %%
ln = layer_norm_sensitivity()
ctx.save_table(ln, "layer_norm_sensitivity", precision=4);

# %%
fp16 = ln[ln.dtype == "fp16"]
bf16 = ln[ln.dtype == "bf16"]
centred = fp16[fp16.input_offset == 0]
first_overflow = centred[~np.isfinite(centred.sum_of_squares_rel_error)].input_scale.min()
var_overflow = centred[~np.isfinite(centred.variance_rel_error)].input_scale.min()
ctx.md(
    f"The **reductions** are the sensitive part. In fp16 the sum of squares already overflows (65504 is fp16's largest "
    f"value) for zero-mean inputs of scale {first_overflow:g} over d = 1024 (and for any input with an offset of 100), and the variance itself from scale {var_overflow:g}, after which "
    f"the normalised output is wrong everywhere (relative error {fp16[fp16.input_scale >= var_overflow].output_rel_error.max():.2f}). "
    f"ε = 1e-5 is below fp16's smallest normal number ({torch.finfo(torch.float16).tiny:.1e}), so it is stored with reduced precision. "
    f"bf16 has fp32's exponent range, so nothing overflows (largest output error {bf16.output_rel_error.max():.1e}), "
    f"but with 8 significant bits its means and variances are only accurate to ~{bf16.variance_rel_error.median():.0e}, and an "
    f"offset input (mean ≫ std) loses up to {bf16.output_rel_error.max():.0%} in the output through cancellation in x − mean. "
    "So with bf16 the overflow reason disappears, but the reductions should still be accumulated in fp32 — which is why "
    "autocast keeps layer norm (and our RMSNorm computes) in fp32 for bf16 too."
)

# %% [markdown]
# ## (c) fp32 vs bf16 autocast, every model size
# Forward and forward+backward, batch 4.

# %%
ctx.md(f"Context {context_length}, batch {batch_size}, {warmup} warm-up and {steps} measured steps.")
base = BenchmarkConfig(context_length=context_length, batch_size=batch_size, warmup=warmup, steps=steps)
runs = sweep(grid(base, size=sizes, mode=["forward", "forward-backward"], precision=["fp32", "bf16"]), desc="precision")
ctx.save_table(runs.drop(columns=["warmup_times_ms", "step_times_ms"], errors="ignore"), "precision_raw", show=False);
wide = runs.pivot_table(index=["size", "mode"], columns="precision", values="mean_ms", aggfunc="first").reset_index()
wide["speedup"] = wide["fp32"] / wide["bf16"]
wide["size"] = pd.Categorical(wide["size"], sizes, ordered=True)
wide = wide.sort_values(["mode", "size"])
ctx.save_table(wide.rename(columns={"fp32": "fp32_ms", "bf16": "bf16_ms"}), "precision");

# %%
fig, ax = plt.subplots(figsize=(7, 4))
sns.barplot(data=wide, x="size", y="speedup", hue="mode", ax=ax)
ax.axhline(1, color="k", lw=0.8)
ax.set(ylabel="fp32 time / bf16 time", title="Speed-up from bf16 autocast")
ctx.save_figure(fig, "precision_speedup")

# %%
fb = wide[wide["mode"] == "forward-backward"].dropna(subset=["speedup"])
params = runs.drop_duplicates("size").set_index("size")["parameters"]
# Spearman rank correlation = Pearson correlation of the ranks
rho = pd.Series(fb.speedup.values).rank().corr(pd.Series(params.reindex(fb["size"].astype(str)).values.astype(float)).rank())
trend = "grows with model size" if rho > 0.5 else "shrinks with model size" if rho < -0.5 else "shows no clear trend with model size"
ctx.md(
    f"bf16 autocast speeds forward+backward up by {fb.speedup.min():.2f}× ({fb['size'].iloc[fb.speedup.argmin()]}) to "
    f"{fb.speedup.max():.2f}× ({fb['size'].iloc[fb.speedup.argmax()]}); the speed-up {trend} "
    f"(Spearman ρ = {rho:.2f} between speed-up and log parameter count). "
    + ("Larger models spend a larger share of their time in big matmuls, which bf16 tensor cores run several times faster "
       "than fp32; small models are dominated by elementwise kernels and launch overhead, where bf16 helps little "
       "(autocast even adds cast kernels)." if ctx.profile == "gpu" else
       "On this CPU bf16 has no fast matmul units, so autocast mostly adds casts — the GPU report shows the real effect.")
)
if len(fb):
    best = fb.iloc[fb.speedup.argmax()]
    ctx.headline(f"bf16 speed-up, forward+backward ({best['size']})", round(best.speedup, 2), "×")
