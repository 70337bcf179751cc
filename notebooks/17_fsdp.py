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
# (`fully_shard`), and profiled forward passes showing whether the all-gathers keep pace with
# compute. The handout's model is its xl (d_model 2560, 32 layers, the shape the library calls
# `2.7B`); the run also measures the 2025 handout's XL (d_model 1600, 48 layers) beside it. The
# larger model runs fewer warm-up and measured steps on a GPU (`later_warmup`, `later_steps`) to
# keep the notebook's run short; the tables state the steps each size ran.

# %% tags=["parameters"]
profile = None             # "cpu" | "gpu"; None picks gpu when CUDA is available
sizes = None               # model sizes measured; None = by profile (cpu: nano; gpu: xl and 2.7B, both handouts' xl)
context_length = None      # None = by profile (cpu: 32, gpu: 512)
vocab_size = None          # None = by profile (cpu: 1000, as bf16 matmuls are slow on CPUs; gpu: 10000)
global_batch_size = 4      # split evenly over the ranks
world_size = 2
warmup = None              # warm-up steps per strategy at the first size (cpu: 1, gpu: 3)
steps = None               # measured steps per strategy at the first size (cpu: 3, gpu: 10)
later_warmup = None        # the same at the other sizes (cpu: as the first, gpu: 2)
later_steps = None         # (cpu: as the first, gpu: 6)
compute_dtype = "bf16"     # the low-precision dtype of the FSDP vs FSDP2 comparison and the profiled forwards
equality_dtypes = ["fp32", "fp16"]
equality_steps = 3
analysis_sizes = ["xl", "2.7B"]  # the models of the analytic table (always computed): both handouts' xl
profile_size = None        # the model whose forward is profiled for (b); None = by profile (cpu: nano, gpu: 2.7B)
profile_batches = None     # per-rank batches of the profiled forwards; None = by profile (cpu: [2], gpu: [2, 16, 64, 128])
gpu_bound_at = 0.8         # GPU-busy fraction from which a profiled forward counts as paced by the GPU (and the series ends)
timeline_modules = 16      # modules drawn in the gather schedule

# %%
from cs336_systems.experiments.answers import give
from cs336_systems.report import setup_notebook

ctx = setup_notebook("17_fsdp", profile=profile)
sizes = ctx.pick(sizes, cpu=["nano"], gpu=["xl", "2.7B"])
context_length = ctx.pick(context_length, cpu=32, gpu=512)
vocab_size = ctx.pick(vocab_size, cpu=1000, gpu=10_000)
warmup = ctx.pick(warmup, cpu=1, gpu=3)
steps = ctx.pick(steps, cpu=3, gpu=10)
later_warmup = ctx.pick(later_warmup, cpu=warmup, gpu=2)
later_steps = ctx.pick(later_steps, cpu=steps, gpu=6)
profile_size = ctx.pick(profile_size, cpu="nano", gpu="2.7B")
profile_batches = ctx.pick(profile_batches, cpu=[2], gpu=[2, 16, 64, 128])

# %%
from cs336_systems.distributed.launch import resolve_backend
from cs336_systems.experiments.ddp_benchmark import per_size
from cs336_systems.experiments.fsdp_benchmark import (
    FSDPBenchmarkConfig,
    expected_saving,
    measured_saving,
    plot_runs,
    run_fsdp_benchmark,
)
from cs336_systems.experiments.fsdp_timeline import forward_gather_timing, plot_gather_schedule, summarize_profiles
from cs336_systems.experiments.sharding_benchmark import analysis_tables, run_setup
from cs336_systems.profiling.timeline import plot_timeline

backend = resolve_backend("auto", world_size)
if backend != "nccl":
    ctx.not_run(f"{', '.join(analysis_sizes)} FSDP vs FSDP2 and the profiled forwards on {world_size} GPUs",
                f"this machine has {ctx.num_gpus} GPU(s); the same measurements ran on gloo with the nano model")
    sizes, profile_size = ["nano"], "nano"
config = FSDPBenchmarkConfig(
    size=sizes[0], global_batch_size=global_batch_size, context_length=context_length, vocab_size=vocab_size, warmup=warmup,
    steps=steps, world_size=world_size, backend=backend, equality_steps=equality_steps, equality_dtypes=tuple(equality_dtypes),
    runs=(("replicated", "fp32"), ("fsdp", "fp32"), ("fsdp2", "fp32"), ("fsdp", compute_dtype), ("fsdp2", compute_dtype)),
    profile_run=("fsdp", compute_dtype), profile_size=profile_size, profile_batches=tuple(profile_batches),
    profile_until_busy=gpu_bound_at,
)
configs = per_size(config, sizes, later_warmup, later_steps)
result = run_fsdp_benchmark(configs)
ctx.save_table(run_setup(configs, backend), "fsdp_setup", show=False);

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
# the handout allows. The 2026 answer reads the 2026 xl's rows.

# %%
analysis = analysis_tables(analysis_sizes, context_length, world_size)
memory = analysis["memory"][analysis["memory"]["strategy"].isin(["ddp", "fsdp"])].reset_index(drop=True)
ctx.save_table(memory, "fsdp_analysis_memory");
for size, setup in analysis["setups"].items():
    m = memory[memory["size"] == size].set_index("strategy")
    ctx.md(
        f"For **{size}** on {world_size} ranks: {m.loc['ddp', 'total_GB']:.2f} GB of weights, gradients and AdamW state per "
        f"rank without sharding, {m.loc['fsdp', 'total_GB']:.2f} GB with FSDP — an expected saving of "
        f"**{m.loc['fsdp', 'saving_vs_ddp_GB']:.2f} GB** from the peak ({m.loc['fsdp', 'saving_vs_ddp_GB'] / m.loc['ddp', 'total_GB']:.2%} "
        f"of the model state: all but the norms' {setup.fsdp_replicated_params:,} parameters is split {world_size} ways)."
    )
    ctx.headline(f"FSDP expected saving ({size}, {world_size} ranks)", round(float(m.loc["fsdp", "saving_vs_ddp_GB"]), 2), unit="GB")

# %%
expected = expected_saving(configs)
ctx.save_table(expected, "fsdp_expected_saving_measured_model");
for size, rows in expected.groupby("size", sort=False):
    saving = measured_saving(result["runs"], size)
    if saving["state_GB"] != saving["state_GB"]:  # NaN: the replicated baseline or FSDP (fp32) did not run
        ctx.md(f"The measured run ({size}): the replicated baseline or FSDP did not run in fp32 (see the status column).")
        continue
    unit, scale = ("GB", 1.0) if rows.total_GB.max() > 1 else ("MB", 1e3)
    text = (
        f"The measured run ({size}, {backend}): the analysis expects FSDP to save {rows.saving_GB.iloc[1] * scale:.3f} {unit} per rank; "
        f"the live parameters, gradients and optimizer state after a step differ by {saving['state_GB'] * scale:.3f} {unit} "
        f"between the replicated baseline and FSDP (fp32)."
    )
    if saving["peak_GB"] == saving["peak_GB"]:  # not NaN: a GPU run with allocator peaks
        text += (f" The allocator's peak over the measured steps drops by {saving['peak_GB'] * scale:.3f} {unit} "
                 f"({saving['peak_GB'] / rows.saving_GB.iloc[1]:.0%} of the expected saving; the peak also holds what the "
                 f"analysis leaves out, the gathered weights and gradient buffers of the modules in flight).")
    ctx.md(text)

# %% [markdown]
# ## Step time and memory next to FSDP2
# One run, each strategy on a fresh model with the same seed, batch and the project's AdamW, at
# each model size (a size or strategy that does not fit is a row with status `OOM`): the
# replicated baseline (DDP, fp32), this FSDP, and FSDP2 (`fully_shard` on every
# TransformerBlock, then on the root; with a low dtype `MixedPrecisionPolicy(param_dtype,
# reduce_dtype)` set to it). FSDP2 shards whole blocks and stores DTensors, so the per-tensor
# AdamW runs through DTensor dispatch there: the optimizer phase is shown on its own.

# %%
runs = result["runs"]
columns = ["size", "strategy", "compute_dtype", "status", "step_ms", "step_std_ms", "fwd_bwd_ms", "sync_ms", "optimizer_ms",
           "peak", "after_init_allocated", "parameters", "gradients", "optimizer_state"]
ctx.save_table(runs[[c for c in columns if c in runs]], "fsdp_runs");
ctx.save_figure(plot_runs(runs, f"{world_size} ranks ({backend})"), "fsdp_runs");

# %%
for size, rows in runs.groupby("size", sort=False):
    ok = rows[rows.status == "ok"].set_index(["strategy", "compute_dtype"])
    for dtype in rows.compute_dtype.unique():
        if ("fsdp", dtype) in ok.index and ("fsdp2", dtype) in ok.index:
            ratio = ok.loc[("fsdp", dtype), "step_ms"] / ok.loc[("fsdp2", dtype), "step_ms"]
            ctx.headline(f"FSDP / FSDP2 step time ({size}, {dtype})", round(float(ratio), 3), unit="×", note=f"{size}, {backend}")
give(ctx, "fsdp", "fsdp_accounting.a")

# %% [markdown]
# ## `fsdp_accounting` (b): do the all-gathers keep pace with the forward pass?
# Forward passes of the `profile_size` model with FSDP in the low compute dtype run under
# `torch.profiler` (rank 0's trace), one per per-rank batch of `profile_batches` up to the first
# that keeps the GPU busy at least `gpu_bound_at` of the pass (a larger batch would only confirm
# it, or not fit; one that does not fit is a row with status `OOM` and ends the series). They run
# without gradients (`torch.no_grad`): FSDP's hooks gather and prefetch exactly as in training,
# and a batch far larger than the training one fits. That matters: at a small batch the forward
# can be paced by the host (each module's hooks and launches taking longer than its kernels);
# the GPU then idles between modules and any gather looks "in time". Only where the GPU is the
# bottleneck does the profile say whether communication keeps pace with compute.
#
# Measured on the GPU clock, per forward: the **busy fraction** (the union of the compute
# kernels' intervals over the forward's span; at least `gpu_bound_at` counts as GPU-bound), the
# all-gather kernels' time, the part of it during which a compute kernel ran on the compute
# stream (**hidden**) and the rest (**exposed**: the GPU only communicated). Per module, the hooks
# open named ranges — `fsdp all-gather <module>` around each launch, `fsdp wait <module>` around
# the wait, `fsdp forward <module>` around the module's forward — so the NCCL kernel launched in a
# gather range gives the gather's start and end, the first kernel launched in the forward range
# the moment the module's compute started, and the compute stream's previous kernel the moment it
# could have started; the gather was late by the part of that gap it still occupied (late if
# above 1 µs). On a CPU (gloo) there are no kernels: the time blocked in the wait is the exposed
# time (late if above 0.1 ms: the wait call itself costs tens of µs under the profiler). The
# table, schedule and timeline below show the first GPU-bound forward (else the busiest).

# %%
profiles = summarize_profiles(result["profiles"], busy_threshold=gpu_bound_at)
ctx.save_table(profiles, "fsdp_forward_profiles");
for _, p in profiles.iterrows():
    ctx.md(
        f"- {p['size']}, {p.batch_per_rank} sequences of {p.context_length} tokens per rank: " + (
            "out of memory." if p.status != "ok" else
            f"forward {p.forward_ms:.1f} ms on the GPU clock, GPU busy {p.busy_fraction:.0%} of it; all-gather kernels "
            f"{p.gather_ms:.1f} ms, {p.hidden_fraction:.0%} of it beside compute, {p.exposed_ms:.2f} ms exposed; "
            f"{int(p.gathers_in_time)} of {int(p.gathers)} gathers ready before their module's compute."
            if p.busy_fraction == p.busy_fraction else
            f"{int(p.gathers_in_time)} of {int(p.gathers)} gathers ready before their module's forward needed them "
            "(a CPU trace: no GPU clock to measure busy time or overlap on).")
    )

# %%
shown = profiles.index[profiles["shown"]]
if len(shown):
    p = profiles.loc[shown[0]]
    events = result["profiles"][shown[0]]["events"]
    timing = forward_gather_timing(events)
    ctx.save_table(timing.drop(columns=["origin_us"]), "fsdp_forward_gathers", show=False)
    ctx.save_table(timing.head(timeline_modules).drop(columns=["origin_us"]), "fsdp_forward_gathers_first");
    label = f"{p['size']}, {compute_dtype}, {p.batch_per_rank} × {p.context_length} tokens per rank, rank 0"
    ctx.save_figure(plot_gather_schedule(timing, first=timeline_modules, title=f"{label}: forward all-gathers vs the modules' compute"),
                    "fsdp_gather_schedule");
    origin = timing.origin_us.iloc[0]
    first = timing.head(timeline_modules)
    window = (origin + 1e3 * min(first.gather_start_ms.min(), first.compute_start_ms.min()), origin + 1e3 * first.compute_end_ms.max())
    ctx.save_figure(plot_timeline(events, ranges=["forward"], window=window,
                                  title=f"profiler timeline, first {len(first)} modules of the forward pass ({label})"),
                    "fsdp_profiler_timeline");
    late = timing[~timing.in_time & timing.gather_found]
    unmatched = int((~timing.gather_found).sum())
    forward_ms = timing.compute_end_ms.max() - timing.compute_start_ms.min()
    ctx.md(
        f"In the forward shown ({label}), of the {len(timing)} weights gathered ({timing.clock.iloc[0]}), **{int(timing.in_time.sum())} "
        f"were ready before their module needed them**"
        + (f" ({unmatched} gathers had no NCCL kernel in the trace to time them by)" if unmatched else "")
        + f"; {len(late)} were late, by {late.exposed_ms.sum():.2f} ms in total "
        f"({late.exposed_ms.sum() / forward_ms:.1%} of the {forward_ms:.1f} ms forward pass)"
        + (f", the worst {late.exposed_ms.max():.2f} ms at `{late.loc[late.exposed_ms.idxmax(), 'module']}`." if len(late) else ".")
        + (" The first module's gather cannot be prefetched: nothing runs before it."
           if len(late) and late.position.min() == 0 else "")
    )
    ctx.headline("forward all-gathers in time", f"{int(timing.in_time.sum())}/{len(timing)}", note=f"{p['size']}, {compute_dtype}, {backend}")
else:
    ctx.md("No forward pass could be profiled here (see the status column).")
give(ctx, "fsdp_accounting.b")
