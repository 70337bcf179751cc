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
# # Problem `benchmarking_script` — end-to-end timing of the Transformer LM
#
# Spring 2025 handout §1.1.3. (a) is the harness itself, `cs336_systems.benchmarking`
# (a model from a size name or hyperparameters, a random batch, `w` warm-up steps, `n` timed steps
# of forward, forward+backward or a full AdamW step, a synchronize after every step). (b) times
# every model size; (c) shows what skipping the warm-up does. Vocabulary 10,000, batch size 4.

# %% tags=["parameters"]
profile = None          # "cpu" or "gpu", None picks gpu when CUDA is available
sizes = None            # model sizes, None means the default of the profile
context_length = None   # context for part b, None means 256 on gpu
context_sweep = None    # context lengths for the sweep, None means the default of the profile
batch_size = 4
warmup = 5
steps = 10
warmup_settings = [0, 1, 2, 5]
warmup_size = None      # model for part c, None means the default of the profile

# %%
from cs336_systems.report import setup_notebook

ctx = setup_notebook("01_benchmarking_script", profile=profile)
sizes = ctx.pick(sizes, cpu=["nano", "tiny"], gpu=["small", "medium", "large", "xl", "2.7B"])
context_sweep = ctx.pick(context_sweep, cpu=[32, 64], gpu=[128, 256, 512, 1024])
warmup_size = ctx.pick(warmup_size, cpu="nano", gpu="small")
context_length = ctx.pick(context_length, cpu=64, gpu=256)

# %%
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from cs336_systems.benchmarking import BenchmarkConfig, grid, run_isolated, sweep
from cs336_systems.experiments.answers import give
from cs336_systems.report.tables import timing_pivot

# %% [markdown]
# ## (b) Forward and backward time per model size
# The backward time is the forward+backward step minus the forward step (same batch, same process).

# %%
base = BenchmarkConfig(context_length=context_length, batch_size=batch_size, warmup=warmup, steps=steps)
by_size = sweep(grid(base, size=sizes, mode=["forward", "forward-backward"]), desc="sizes")
ctx.save_table(by_size.drop(columns=["warmup_times_ms", "step_times_ms"], errors="ignore"), "by_size_raw", show=False);
table = timing_pivot(by_size, index="size", order=sizes)
ctx.save_table(table, "by_size");

# %%
give(ctx, "benchmarking_script.a", "benchmarking_script.a.2026", "benchmarking_script.b")
ok = table.dropna(subset=["forward_mean_ms", "backward_ms"])
if len(ok):
    last = ok.iloc[-1]
    ctx.headline(f"{last['size']} forward, ctx {context_length}", round(last.forward_mean_ms, 2), "ms")
    ctx.headline(f"{last['size']} forward+backward, ctx {context_length}", round(last["forward-backward_mean_ms"], 2), "ms")
oom = table[table.isna().any(axis=1)]["size"].tolist()
if oom:
    ctx.md(f"Out of memory at context {context_length}: {', '.join(oom)}.")

# %% [markdown]
# ### Context-length sweep
# Every size at every context length; a configuration that does not fit is a row with status `OOM`.

# %%
ctx_sweep = sweep(grid(base, size=sizes, context_length=context_sweep, mode=["forward", "forward-backward"]), desc="contexts")
ctx.save_table(ctx_sweep.drop(columns=["warmup_times_ms", "step_times_ms"], errors="ignore"), "context_sweep_raw", show=False);
wide = ctx_sweep.pivot_table(index=["size", "context_length"], columns="mode", values="mean_ms", aggfunc="first")
status = ctx_sweep.pivot_table(index=["size", "context_length"], columns="mode", values="status", aggfunc="first")
wide = wide.reindex(columns=["forward", "forward-backward"]).round(2).astype(object).where(status == "ok", "OOM").reset_index()
wide["size"] = pd.Categorical(wide["size"], sizes, ordered=True)
ctx.save_table(wide.sort_values(["size", "context_length"]), "context_sweep");

# %%
fig, ax = plt.subplots(figsize=(7, 4))
sns.lineplot(data=ctx_sweep.query("status == 'ok'"), x="context_length", y="mean_ms", hue="size", style="mode",
             hue_order=sizes, marker="o", ax=ax)
ax.set(xscale="log", yscale="log", xlabel="context length", ylabel="time per step (ms)", title="Step time vs context length")
ax.set_xticks(context_sweep, [str(c) for c in context_sweep])
ctx.save_figure(fig, "context_sweep")
n_oom = int((ctx_sweep.status == "OOM").sum())
ctx.md(f"{n_oom} of {len(ctx_sweep)} configurations ran out of memory" + (
    ": " + ", ".join(f"{r['size']}@{r['context_length']} ({r['mode']})" for _, r in ctx_sweep.query("status == 'OOM'").iterrows())
    if n_oom else "."))
give(ctx, "benchmarking_script.b.2026")

# %% [markdown]
# ## (c) Warm-up steps
# Each setting runs in a **fresh process**, so one-time costs (CUDA context and cuBLAS handle
# creation, kernel selection, the caching allocator growing to its working set) land in that run and
# not in an earlier one. Below, every step is plotted, warm-up steps included.

# %%
wbase = BenchmarkConfig(size=warmup_size, context_length=context_length, batch_size=batch_size, steps=steps, mode="forward-backward")
warm_rows = [run_isolated(BenchmarkConfig(**{**wbase.__dict__, "warmup": w})) for w in warmup_settings]
warm = pd.DataFrame(warm_rows)
ctx.save_table(warm[["size", "warmup", "steps", "mean_ms", "std_ms", "median_ms", "min_ms"]], "warmup");

# %%
per_step = pd.DataFrame([
    dict(warmup=r["warmup"], step=i, ms=t, phase="warm-up" if i < r["warmup"] else "measured")
    for r in warm_rows for i, t in enumerate(r["warmup_times_ms"] + r["step_times_ms"])
])
fig, ax = plt.subplots(figsize=(7, 4))
sns.lineplot(data=per_step, x="step", y="ms", hue="warmup", marker="o", ax=ax, palette="viridis")
ax.set(yscale="log", xlabel="step index (warm-up steps first)", ylabel="step time (ms)",
       title=f"{warmup_size}: every step, by number of warm-up steps")
ctx.save_table(per_step, "warmup_steps", show=False)
ctx.save_figure(fig, "warmup_steps")

# %%
give(ctx, "benchmarking_script.c", "benchmarking_script.c.2026")

# %% [markdown]
# **Why.** The first step of a process pays one-time costs that are not part of the model's
# steady-state work: creating the CUDA context and library handles, loading and selecting kernels
# (cuBLAS heuristics, autotuning), and the caching allocator requesting memory from the driver. Some
# of it can come later than the first step: the allocator grows again when the backward and the
# optimizer allocate new buffers on their first call, clocks ramp up under sustained load, and on the
# CPU side the first calls populate Python and dispatcher caches. This is why one or two warm-up steps
# may leave the mean different from a run with more, and why the handout asks for several.
