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
# every model size of both handouts' tables (2025: up to xl and 2.7B at context 256; 2026: xl is the
# 2.7B's shape, plus 10B, at context 512) in all three modes; (c) shows what skipping the warm-up
# does. Vocabulary 10,000, batch size 4.

# %% tags=["parameters"]
profile = None          # "cpu" or "gpu", None picks gpu when CUDA is available
sizes = None            # model sizes, None means the default of the profile
contexts = None         # contexts for part b, None means 256 (the 2025 default) and 512 (the 2026 default) on gpu
modes = None            # modes for part b, None means forward, forward+backward and the full AdamW step
context_sweep = None    # context lengths for the sweep, None means the default of the profile
batch_size = 4
warmup = 5
steps = 10
warmup_settings = [0, 1, 2, 5]
warmup_size = None      # model for part c, None means the default of the profile
launch_regime = True    # after each step of part b, profile it and replay it as a CUDA graph: launch-bound or GPU-bound
graph_steps = None      # graph replays timed per step, None means 3 on gpu (on cpu there are no CUDA graphs)

# %%
from cs336_systems.model import HANDOUT_SIZES
from cs336_systems.report import setup_notebook

ctx = setup_notebook("01_benchmarking_script", profile=profile)
# Both handouts' tables: small to 2.7B (the 2026 xl) and 10B, which does not fit one GPU for a backward.
sizes = ctx.pick(sizes, cpu=["nano", "tiny"], gpu=HANDOUT_SIZES)
context_sweep = ctx.pick(context_sweep, cpu=[32, 64], gpu=[128, 256, 512, 1024])
warmup_size = ctx.pick(warmup_size, cpu="nano", gpu="small")
contexts = ctx.pick(contexts, cpu=[64], gpu=[256, 512])
graph_steps = ctx.pick(graph_steps, cpu=1, gpu=3)
modes = ctx.pick(modes, cpu=["forward", "forward-backward", "train-step"], gpu=["forward", "forward-backward", "train-step"])
context_length = contexts[0]

# %%
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from cs336_systems.benchmarking import BenchmarkConfig, grid, run_isolated, sweep, with_predicted_memory
from cs336_systems.benchmarking.launch_bound import launch_probe, regime_table
from cs336_systems.experiments.answers import give
from cs336_systems.experiments.answers.launch_regime import regime_rule, regime_summary
from cs336_systems.report.tables import timing_pivot

# %% [markdown]
# ## (b) Forward, backward and optimizer time per model size
# The backward time is the forward+backward step minus the forward step, the optimizer step the full
# training step minus the forward+backward (same batch, same process). A step that does not fit is a
# row with status `OOM`; every row carries the analytic peak of its step (`accounting.memory`) and what
# parameters, gradients and AdamW state take of it, which say why. After its timed steps, each step is
# also profiled and replayed as a CUDA graph on the same model (below: launch-bound or GPU-bound).

# %%
base = BenchmarkConfig(context_length=context_length, batch_size=batch_size, warmup=warmup, steps=steps)
probe = launch_probe(graph_steps=graph_steps) if launch_regime else None
by_size = sweep(grid(base, context_length=contexts, size=sizes, mode=modes), desc="sizes", then=probe)
by_size = with_predicted_memory(by_size, ctx.device)
ctx.save_table(by_size.drop(columns=["warmup_times_ms", "step_times_ms"], errors="ignore"), "by_size_raw", show=False);
shown = by_size.assign(ms=by_size.mean_ms.round(2).astype(object).where(by_size.status == "ok", "OOM"),
                       predicted=by_size.predicted_peak_gib.round(1))
wide = shown.pivot_table(index=["context_length", "size"], columns="mode", values=["ms", "predicted"], aggfunc="first")
wide.columns = [f"{mode} (ms)" if v == "ms" else f"{mode} predicted peak (GiB)" for v, mode in wide.columns]
wide = wide.reset_index()
wide["size"] = pd.Categorical(wide["size"], sizes, ordered=True)
ctx.save_table(wide.sort_values(["context_length", "size"]), "by_size_table");
table = timing_pivot(by_size[by_size.context_length == context_length], index="size", order=sizes)
ctx.save_table(table, "by_size", show=False);

# %% [markdown]
# ### Launch-bound or GPU-bound?
# An eager step launches its kernels one by one from Python. When they are short, the GPU finishes each
# before the host has launched the next, and the step's time is the host's launch rate, not the model's
# work: it follows the number of layers rather than the FLOPs and moves with the host from run to run.
# Two measurements of each step above, on the same model right after its timed steps
# (`benchmarking.launch_bound`): the share of the step the GPU is busy (the union of its kernels'
# intervals in a profiled step, over the eager step time), and the step captured once as a CUDA graph
# and replayed, one launch for everything: what remains is the GPU's work. On a CPU there are no launches
# to wait for and no graphs: the share is the time spent inside PyTorch's operators.

# %%
if launch_regime:
    ctx.save_table(regime_table(by_size, sizes), "by_size_regime")
    ctx.md(regime_rule() + " " + regime_summary(by_size))

# %%
give(ctx, "benchmarking_script.a", "benchmarking_script.a.2026", "benchmarking_script.b")
ok = table.dropna(subset=["forward_mean_ms", "backward_ms"])
if len(ok):
    last = ok.iloc[-1]
    ctx.headline(f"{last['size']} forward, ctx {context_length}", round(last.forward_mean_ms, 2), "ms")
    ctx.headline(f"{last['size']} forward+backward, ctx {context_length}", round(last["forward-backward_mean_ms"], 2), "ms")
for _, r in by_size.query("status == 'OOM'").iterrows():
    ctx.md(f"Out of memory: {r['size']} {r['mode']} at context {r['context_length']}, predicted peak "
           f"{r.predicted_peak_gib:.0f} GiB, of which parameters, gradients and optimizer state {r.predicted_states_gib:.0f} GiB.")

# %% [markdown]
# ### Context-length sweep
# Every size at every context length; a configuration that does not fit is a row with status `OOM`.

# %%
ctx_sweep = sweep(grid(base, size=sizes, context_length=context_sweep, mode=["forward", "forward-backward"]), desc="contexts")
ctx_sweep = with_predicted_memory(ctx_sweep, ctx.device)
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
