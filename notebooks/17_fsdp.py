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
# # Problems `fsdp`, `fsdp_accounting` — fully sharded data parallel training
# Spring 2026 handout §7. `FSDP(module, compute_dtype=None)` (`cs336_systems.distributed.fsdp`)
# wraps an unchanged model: every module's own trainable 2-D weight (Linear and Embedding here; any class) is flattened, padded to a multiple
# of the world size and split, one fp32 shard per rank; the norms' gains stay replicated (their
# gradients are all-reduced). Module hooks all-gather a weight, in the compute dtype, before its
# module runs — when module i starts its forward the gather of module i+1 is launched, so a
# gather begins only once the module two before it has finished — release it after use, gather
# again for the backward pass (prefetching in reverse order) and reduce-scatter the gradients to
# their owners. Below: equality with non-parallel training, the memory the analysis expects FSDP
# to save against what it saves, step time and peak memory next to PyTorch's FSDP2
# (`fully_shard`), and a profiled step showing whether each all-gather is ready in time.

# %% tags=["parameters"]
profile = None             # "cpu" | "gpu"; None picks gpu when CUDA is available
size = None                # model size; None = by profile (cpu: nano, gpu: xl)
context_length = None      # None = by profile (cpu: 32, gpu: 512)
vocab_size = None          # None = by profile (cpu: 1000, as bf16 matmuls are slow on CPUs; gpu: 10000)
global_batch_size = 4      # split evenly over the ranks
world_size = 2
warmup = None
steps = None
compute_dtype = "bf16"     # the low-precision dtype of the FSDP vs FSDP2 comparison and the profiled step
equality_dtypes = ["fp32", "fp16"]
equality_steps = 3
analysis_size = "xl"       # the model of the analytic table (always computed)
timeline_modules = 16      # modules drawn in the gather schedule

# %%
from cs336_systems.experiments.answers import give
from cs336_systems.report import setup_notebook

ctx = setup_notebook("17_fsdp", profile=profile)
size = ctx.pick(size, cpu="nano", gpu="xl")
context_length = ctx.pick(context_length, cpu=32, gpu=512)
vocab_size = ctx.pick(vocab_size, cpu=1000, gpu=10_000)
warmup = ctx.pick(warmup, cpu=1, gpu=3)
steps = ctx.pick(steps, cpu=3, gpu=10)

# %%
import pandas as pd

from cs336_systems.accounting.sharding import memory_table, setup_for_model
from cs336_systems.experiments.fsdp_benchmark import (
    FSDPBenchmarkConfig, expected_saving, measured_saving, plot_runs, run_fsdp_benchmark,
)
from cs336_systems.experiments.fsdp_timeline import forward_gather_timing, plot_gather_schedule
from cs336_systems.distributed.launch import resolve_backend
from cs336_systems.model import ModelConfig
from cs336_systems.profiling.timeline import plot_timeline

backend = resolve_backend("auto", world_size)
if backend != "nccl":
    ctx.not_run(f"{analysis_size} FSDP vs FSDP2 and the profiled step on {world_size} GPUs",
                f"this machine has {ctx.num_gpus} GPU(s); the same measurements ran on gloo with the {size} model")
config = FSDPBenchmarkConfig(
    size=size, global_batch_size=global_batch_size, context_length=context_length, vocab_size=vocab_size, warmup=warmup,
    steps=steps, world_size=world_size, backend=backend, equality_steps=equality_steps, equality_dtypes=tuple(equality_dtypes),
    runs=(("replicated", "fp32"), ("fsdp", "fp32"), ("fsdp2", "fp32"), ("fsdp", compute_dtype), ("fsdp2", compute_dtype)),
    profile_run=("fsdp", compute_dtype),
)
result = run_fsdp_benchmark(config)
measured = setup_for_model(ModelConfig.from_size(size, context_length=context_length, vocab_size=vocab_size), world_size)
ctx.save_table(pd.DataFrame([dict(size=size, parameters=measured.num_params, context_length=context_length,
                                  global_batch_size=global_batch_size, world_size=world_size, backend=backend,
                                  warmup=warmup, steps=steps)]), "fsdp_setup", show=False)

# %% [markdown]
# ## `fsdp`: FSDP training equals non-parallel training
# A small model trains a few AdamW steps with FSDP (each rank on its slice of every global batch)
# and, on every rank, without parallelism on the whole batch; the gathered FSDP weights are
# compared with the reference's. With a low compute dtype the reference is ordinary mixed
# precision (weights cast for forward and backward, fp32 gradients and update), and AdamW's eps
# is 1e-5: with 1e-8 a gradient component near zero becomes a ±lr update whatever its size, so
# the one-ulp differences between summing two rounded half-batch gradients and rounding the
# whole-batch one would move isolated weights by up to 2·lr.

# %%
equality = result["equality"]
ctx.save_table(equality, "fsdp_equality");
worst = equality.groupby("compute_dtype", sort=False).agg(max_abs_diff=("max_abs_diff", "max"), tolerance=("tolerance", "first"),
                                                          max_update=("max_update", "max"))
ctx.md("\n".join(
    f"- compute dtype **{d}**: weights differ by at most {r.max_abs_diff:.1e} after {equality.steps.iloc[0]} steps "
    f"(they moved by up to {r.max_update:.3g}); tolerance {r.tolerance:.0e}: **{'equal' if r.max_abs_diff <= r.tolerance else 'not equal'}**."
    for d, r in worst.iterrows()
))
for d, r in worst.iterrows():
    ctx.headline(f"FSDP = non-parallel ({d}, max |Δθ|)", float(r.max_abs_diff))

# %% [markdown]
# ## `fsdp_accounting` (a): the memory FSDP should save
# From the analysis of notebook 16 (`accounting.sharding`): without sharding a rank holds the
# fp32 weights, their gradients and AdamW's two moments, 16 bytes per parameter. FSDP keeps 1/N
# of each for the sharded weights (padding included) and all of it for the replicated norms.
# Activations do not change (each rank still processes its own slice of the batch), and the
# gathered weights — at most two modules' worth at a time in the forward pass — are ignored, as
# the handout allows.

# %%
analysis = setup_for_model(ModelConfig.from_size(analysis_size, context_length=context_length), world_size)
xl = memory_table(analysis, ("ddp", "fsdp")).set_index("strategy")
ctx.save_table(xl.reset_index(), "fsdp_analysis_memory");
ctx.md(
    f"For {analysis_size} on {world_size} ranks: {xl.loc['ddp', 'total_GB']:.2f} GB of weights, gradients and AdamW state per "
    f"rank without sharding, {xl.loc['fsdp', 'total_GB']:.2f} GB with FSDP — an expected saving of "
    f"**{xl.loc['fsdp', 'saving_vs_ddp_GB']:.2f} GB** from the peak ({xl.loc['fsdp', 'saving_vs_ddp_GB'] / xl.loc['ddp', 'total_GB']:.2%} "
    f"of the model state: all but the norms' {analysis.fsdp_replicated_params:,} parameters is split {world_size} ways)."
)
ctx.headline(f"FSDP expected saving ({analysis_size}, {world_size} ranks)", round(float(xl.loc["fsdp", "saving_vs_ddp_GB"]), 2), unit="GB")
# the 2026 handout's xl (d_model 2560, d_ff 10240, 32 layers, 32 heads), whose section 6 analysis this part builds on
xl_2026 = memory_table(setup_for_model(ModelConfig.from_size("2.7B", context_length=context_length), world_size), ("ddp", "fsdp"))
ctx.save_table(xl_2026, "fsdp_analysis_memory_2026_xl", show=False)

# %%
expected = expected_saving(config)
ctx.save_table(expected, "fsdp_expected_saving_measured_model");
saving = measured_saving(result["runs"])
unit, scale = ("GB", 1.0) if expected.total_GB.max() > 1 else ("MB", 1e3)
text = (
    f"The measured run ({size}, {backend}): the analysis expects FSDP to save {expected.saving_GB.iloc[1] * scale:.3f} {unit} per rank; "
    f"the live parameters, gradients and optimizer state after a step differ by {saving['state_GB'] * scale:.3f} {unit} "
    f"between the replicated baseline and FSDP (fp32)."
)
if saving["peak_GB"] == saving["peak_GB"]:  # not NaN: a GPU run with allocator peaks
    text += (f" The allocator's peak over the measured steps drops by {saving['peak_GB'] * scale:.3f} {unit} "
             f"({saving['peak_GB'] / expected.saving_GB.iloc[1]:.0%} of the expected saving; the peak also holds what the "
             f"analysis leaves out, the gathered weights and gradient buffers of the modules in flight).")
ctx.md(text)

# %% [markdown]
# ## Step time and memory next to FSDP2
# One run, each strategy on a fresh model with the same seed, batch and the project's AdamW:
# the replicated baseline (DDP, fp32), this FSDP, and FSDP2 (`fully_shard` on every
# TransformerBlock, then on the root; with a low dtype `MixedPrecisionPolicy(param_dtype,
# reduce_dtype)` set to it). FSDP2 shards whole blocks and stores DTensors, so the per-tensor
# AdamW runs through DTensor dispatch there: the optimizer phase is shown on its own.

# %%
runs = result["runs"]
columns = ["strategy", "compute_dtype", "status", "step_ms", "step_std_ms", "fwd_bwd_ms", "sync_ms", "optimizer_ms",
           "peak", "after_init_allocated", "parameters", "gradients", "optimizer_state"]
ctx.save_table(runs[[c for c in columns if c in runs]], "fsdp_runs");
ctx.save_figure(plot_runs(runs, f"{size}, {world_size} ranks ({backend})"), "fsdp_runs");

# %%
ok = runs[runs.status == "ok"].set_index(["strategy", "compute_dtype"])
for dtype in runs.compute_dtype.unique():
    if ("fsdp", dtype) in ok.index and ("fsdp2", dtype) in ok.index:
        ratio = ok.loc[("fsdp", dtype), "step_ms"] / ok.loc[("fsdp2", dtype), "step_ms"]
        ctx.headline(f"FSDP / FSDP2 step time ({dtype})", round(float(ratio), 3), unit="×", note=f"{size}, {backend}")
give(ctx, "fsdp", "fsdp_accounting.a")

# %% [markdown]
# ## `fsdp_accounting` (b): does each all-gather finish before its module needs it?
# One step of FSDP with the low compute dtype runs under `torch.profiler` (rank 0's trace). The
# hooks open named ranges: `fsdp all-gather <module>` around each launch, `fsdp wait <module>`
# around the wait, `fsdp forward <module>` around the module's forward. On a GPU the NCCL kernel
# launched in a gather range gives the gather's start and end on the GPU clock, the first kernel
# launched in the forward range the moment the module's compute started, and the compute
# stream's previous kernel the moment it could have started; the gather was late by the part of
# that gap it still occupied (`exposed_ms`; late if above 1 µs). On a CPU (gloo) the time blocked
# in the wait is the exposed time (late if above 0.1 ms: the wait call itself costs tens of µs
# under the profiler). The table and the schedule below cover the forward pass.

# %%
events = result["events"]
timing = forward_gather_timing(events)
ctx.save_table(timing.drop(columns=["origin_us"]), "fsdp_forward_gathers", show=False)
ctx.save_table(timing.head(timeline_modules).drop(columns=["origin_us"]), "fsdp_forward_gathers_first");
ctx.save_figure(plot_gather_schedule(timing, first=timeline_modules,
                                     title=f"{size}, {compute_dtype}, rank 0: forward all-gathers vs the modules' compute"),
                "fsdp_gather_schedule");

# %%
origin = timing.origin_us.iloc[0]
shown = timing.head(timeline_modules)
window = (origin + 1e3 * min(shown.gather_start_ms.min(), shown.compute_start_ms.min()), origin + 1e3 * shown.compute_end_ms.max())
ctx.save_figure(plot_timeline(events, ranges=["forward"], window=window,
                              title=f"profiler timeline, first {len(shown)} modules of the forward pass ({timing.clock.iloc[0]})"),
                "fsdp_profiler_timeline");

# %%
late = timing[~timing.in_time & timing.gather_found]
unmatched = int((~timing.gather_found).sum())
forward_ms = timing.compute_end_ms.max() - timing.compute_start_ms.min()
ctx.md(
    f"Of the {len(timing)} weights gathered in the forward pass ({timing.clock.iloc[0]}), **{int(timing.in_time.sum())} were ready "
    f"before their module needed them**"
    + (f" ({unmatched} gathers had no NCCL kernel in the trace to time them by)" if unmatched else "")
    + f"; {len(late)} were late, by {late.exposed_ms.sum():.2f} ms in total "
    f"({late.exposed_ms.sum() / forward_ms:.1%} of the {forward_ms:.1f} ms forward pass)"
    + (f", the worst {late.exposed_ms.max():.2f} ms at `{late.loc[late.exposed_ms.idxmax(), 'module']}`." if len(late) else ".")
    + (" The first module's gather cannot be prefetched: nothing runs before it."
       if len(late) and late.position.min() == 0 else "")
)
ctx.headline("forward all-gathers in time", f"{int(timing.in_time.sum())}/{len(timing)}", note=f"{size}, {compute_dtype}, {backend}")
give(ctx, "fsdp_accounting.b")
