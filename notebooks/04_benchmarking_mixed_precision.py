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
# for every model size of both handouts' tables, forward, forward+backward and the full AdamW step.

# %% tags=["parameters"]
profile = None          # "cpu" or "gpu", None picks gpu when CUDA is available
sizes = None            # model sizes for part c, None means the default of the profile
contexts = None         # None means 256 (the 2025 default) and 512 (the 2026 default) on gpu
batch_size = 4
warmup = None           # None means 5 on gpu
steps = None            # None means 10 on gpu
launch_regime = True    # after each step of part c, profile it and replay it as a CUDA graph: launch-bound or GPU-bound
graph_steps = None      # graph replays timed per step, None means 3 on gpu (on cpu there are no CUDA graphs)

# %%
from cs336_systems.model import HANDOUT_SIZES
from cs336_systems.report import setup_notebook

ctx = setup_notebook("04_benchmarking_mixed_precision", profile=profile)
sizes = ctx.pick(sizes, cpu=["nano", "tiny"], gpu=HANDOUT_SIZES)
contexts = ctx.pick(contexts, cpu=[32], gpu=[256, 512])
warmup = ctx.pick(warmup, cpu=2, gpu=5)
steps = ctx.pick(steps, cpu=4, gpu=10)
graph_steps = ctx.pick(graph_steps, cpu=1, gpu=3)

# %%
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
import torch

from cs336_systems.benchmarking import BenchmarkConfig, grid, sweep, with_predicted_memory
from cs336_systems.benchmarking.launch_bound import launch_probe, regime_table
from cs336_systems.experiments.answers import give
from cs336_systems.experiments.answers.launch_regime import regime_rule, regime_summary, same_steps_elsewhere
from cs336_systems.experiments.mixed_precision import layer_norm_sensitivity, observe_autocast_dtypes

# %% [markdown]
# ## (a) Dtypes under fp16 autocast
# `ToyModel` (fc1 → ReLU → LayerNorm → fc2) with fp32 parameters, run under
# `torch.autocast(dtype=torch.float16)`; forward hooks record what each layer actually returns.

# %%
dtypes = observe_autocast_dtypes(ctx.device, torch.float16)
ctx.save_table(dtypes.assign(device=ctx.device.type), "toy_model_dtypes");
give(ctx, "benchmarking_mixed_precision.a")

# %% [markdown]
# ## (b) Which parts of layer norm are sensitive to precision?
# Layer norm computes a mean, a variance (a mean of squares), adds ε and divides. Below, each step is
# computed in fp16, bf16 and fp32 for inputs of growing scale and with an offset, and compared with fp64.

# %%
ln = layer_norm_sensitivity()
ctx.save_table(ln, "layer_norm_sensitivity", precision=4);

# %%
give(ctx, "benchmarking_mixed_precision.b")

# %% [markdown]
# ## (c) fp32 vs bf16 autocast, every model size
# Forward, forward+backward and the full AdamW step, batch 4, at both handouts' default contexts. A step
# that does not fit is a row with status `OOM`; its analytic peak (`accounting.memory`) says why. After
# its timed steps, each step is also profiled and replayed as a CUDA graph on the same model (below).

# %%
ctx.md(f"Contexts {', '.join(map(str, contexts))}, batch {batch_size}, {warmup} warm-up and {steps} measured steps.")
base = BenchmarkConfig(batch_size=batch_size, warmup=warmup, steps=steps)
probe = launch_probe(graph_steps=graph_steps) if launch_regime else None
runs = sweep(grid(base, context_length=contexts, size=sizes, mode=["forward", "forward-backward", "train-step"],
                  precision=["fp32", "bf16"]), desc="precision", then=probe)
runs = with_predicted_memory(runs, ctx.device)
ctx.save_table(runs.drop(columns=["warmup_times_ms", "step_times_ms"], errors="ignore"), "precision_raw", show=False);
index = ["context_length", "size", "mode"]
wide = runs.pivot_table(index=index, columns="precision", values="mean_ms", aggfunc="first").reindex(
    runs[index].drop_duplicates()).reset_index()
wide["speedup"] = wide["fp32"] / wide["bf16"]
peaks = runs.pivot_table(index=index, columns="precision", values="predicted_peak_gib", aggfunc="first").round(1)
wide = wide.join(peaks.add_suffix(" predicted peak (GiB)"), on=index)
wide["size"] = pd.Categorical(wide["size"], sizes, ordered=True)
wide = wide.sort_values(["context_length", "mode", "size"])
ctx.save_table(wide.rename(columns={"fp32": "fp32_ms", "bf16": "bf16_ms"}), "precision");
for _, r in runs.query("status == 'OOM'").iterrows():
    ctx.md(f"Out of memory: {r['size']} {r['mode']} {r['precision']} at context {r['context_length']}, predicted peak "
           f"{r.predicted_peak_gib:.0f} GiB, of which parameters, gradients and optimizer state {r.predicted_states_gib:.0f} GiB.")

# %% [markdown]
# ### Launch-bound or GPU-bound?
# bf16 shortens the matmuls, so more of a step can be the host launching kernels rather than the GPU
# running them, and a speed-up measured on such a step is not the tensor cores' gain. Each step above is
# measured twice more on the same model (`benchmarking.launch_bound`, as in notebook 01): the share of
# the step the GPU is busy, from a profiled step, and the step replayed as one CUDA graph, one launch for
# everything, which leaves the GPU's work. Where notebook 01 timed the same fp32 step in this report, the
# two runs are compared. On a CPU the share is the time spent inside PyTorch's operators.

# %%
if launch_regime:
    ctx.save_table(regime_table(runs, sizes), "precision_regime")
    ctx.md(" ".join(filter(None, [regime_rule(), regime_summary(runs), same_steps_elsewhere(runs, ctx.results_dir, "by_size_raw", "notebook 01")])))

# %%
fig, ax = plt.subplots(figsize=(7, 4))
sns.barplot(data=wide[wide.context_length == contexts[-1]], x="size", y="speedup", hue="mode", ax=ax)
ax.axhline(1, color="k", lw=0.8)
ax.set(ylabel="fp32 time / bf16 time", title=f"Speed-up from bf16 autocast, context {contexts[-1]}")
ctx.save_figure(fig, "precision_speedup")

# %%
give(ctx, "benchmarking_mixed_precision.c", "benchmarking_mixed_precision.c.2026")
fb = wide[(wide["mode"] == "forward-backward") & (wide.context_length == contexts[-1])].dropna(subset=["speedup"])
if len(fb):
    best = fb.iloc[fb.speedup.argmax()]
    ctx.headline(f"bf16 speed-up, forward+backward ({best['size']})", round(best.speedup, 2), "×")
