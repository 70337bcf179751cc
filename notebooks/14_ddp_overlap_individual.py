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
# # Problem `ddp_overlap_individual_parameters` (+ benchmarking) — overlap the backward pass with communication
# Spring 2025 handout §2.3.2. `DDPIndividualParameters(module)`
# (`cs336_systems.distributed.ddp_individual`) registers a `register_post_accumulate_grad_hook`
# on every trainable parameter; the hook launches an asynchronous all-reduce
# (`async_op=True`) of that gradient the moment autograd has finished it, and
# `finish_gradient_synchronization()`, called before `optimizer.step()`, only waits for the
# calls still in flight. (a) compares its step time with naive and flat DDP on 1 node × 2 GPUs
# with the XL model of each handout in one run (the 2025 XL, d_model 1600 and 48 layers, and the
# 2026 xl, d_model 2560 and 32 layers, the shape the library calls `2.7B`); (b) draws profiler
# traces of one step of naive DDP and of this one at each size, to show whether each one's
# communication runs after the backward pass or during it. The larger model runs fewer warm-up
# and measured steps on a GPU (`later_warmup`, `later_steps`) to keep the notebook's run short;
# every table states the steps each size ran.

# %% tags=["parameters"]
profile = None             # "cpu" | "gpu"; None picks gpu when CUDA is available
sizes = None               # model sizes timed; None = the profile's default (cpu: nano; gpu: xl and 2.7B, both handouts' xl)
context_length = None      # None = the profile's default (cpu: 32, gpu: 512)
global_batch_size = 4      # split evenly over the ranks
world_size = 2
warmup = None              # warm-up steps per flavour at the first size (cpu: 1, gpu: 3)
steps = None               # measured steps per flavour at the first size (cpu: 3, gpu: 10)
later_warmup = None        # the same at the other sizes (cpu: as the first, gpu: 2)
later_steps = None         # (cpu: as the first, gpu: 6)
tolerance = 1e-5           # largest weight difference accepted as "equal" (fp32 rounding)

# %%
from cs336_systems.report import setup_notebook

ctx = setup_notebook("14_ddp_overlap_individual", profile=profile)
sizes = ctx.pick(sizes, cpu=["nano"], gpu=["xl", "2.7B"])
context_length = ctx.pick(context_length, cpu=32, gpu=512)
warmup = ctx.pick(warmup, cpu=1, gpu=3)
steps = ctx.pick(steps, cpu=3, gpu=10)
later_warmup = ctx.pick(later_warmup, cpu=warmup, gpu=2)
later_steps = ctx.pick(later_steps, cpu=steps, gpu=6)

# %%
import pandas as pd

from cs336_systems.distributed.launch import resolve_backend
from cs336_systems.experiments.answers import give
from cs336_systems.experiments.ddp_benchmark import (
    DDPBenchmarkConfig,
    benchmark_ddp_sizes,
    describe_setup,
    per_size,
    plot_step_breakdown,
)
from cs336_systems.experiments.ddp_equivalence import check_equivalence, summarize_equivalence
from cs336_systems.experiments.ddp_flavours import expand_flavours
from cs336_systems.experiments.ddp_timeline import communication_after, overlap_fraction, plot_timelines

backend = resolve_backend("auto", world_size)
if ctx.profile == "gpu" and backend != "nccl":
    ctx.not_run(f"{', '.join(sizes)} DDP benchmark on {world_size} GPUs", f"this machine has {ctx.num_gpus} GPU(s); the CPU settings ran on gloo instead")
    sizes, context_length = ["nano"], 32

# %% [markdown]
# ## Correctness
# As in notebook 13: every rank starts from different weights, trains 5 SGD steps on its slice of
# each global batch, and must end with the weights of one process trained on the whole batch. The
# tied weight of the second toy model gets its gradient from two uses; its hook fires once, after
# both have accumulated, so it is communicated once. The frozen parameter has no hook at all.

# %%
checks = summarize_equivalence(check_equivalence(expand_flavours(["individual"]), backend=backend), tolerance)
ctx.save_table(checks, "equivalence_individual");
give(ctx, "ddp_overlap_individual_parameters")
ctx.md(
    f"{int(checks.matches.sum())} of {len(checks)} models match single-process training on every rank "
    f"(largest weight difference {checks.max_abs_diff.max():.1e}, tolerance {tolerance:.0e}; weights moved by up to "
    f"{checks.max_update.max():.3g})."
)
ctx.headline("individual-parameter DDP matches single-process training", f"{int(checks.matches.sum())}/{len(checks)}")

# %% [markdown]
# ## (a) Step time against naive and flat DDP
# One distributed run times the four settings in sequence with the same batch, at every model
# size (a size that does not fit is a row with status `OOM`); the no-communication step is the
# baseline for overhead. "sync" is the time from the moment the backward pass's kernels are done
# until every gradient is averaged: for naive and flat that is all of the communication, for the
# overlapping flavour only what the backward pass did not hide. The 2025 answers read the 2025
# XL's rows, the 2026 answers the 2026 xl's.

# %%
config = DDPBenchmarkConfig(
    size=sizes[0], global_batch_size=global_batch_size, context_length=context_length,
    flavours=("no-communication", "naive", "flat", "individual"), warmup=warmup, steps=steps, world_size=world_size,
    backend=backend, profile=("naive", "individual"),
)
df, timelines = benchmark_ddp_sizes(per_size(config, sizes, later_warmup, later_steps))
ctx.md(describe_setup(df))
columns = ["size", "flavour", "status", "all_reduce_calls", "step_ms", "step_std_ms", "fwd_bwd_ms", "sync_ms", "sync_std_ms",
           "optimizer_ms", "overhead_ms", "sync_fraction", "rank_spread_ms"]
ctx.save_table(df[[c for c in columns if c in df]], "overlap_individual_step");
setup_columns = ["size", "parameters", "gradient_bytes", "context_length", "global_batch_size", "world_size", "backend", "warmup", "steps"]
ctx.save_table(df[df.status == "ok"].drop_duplicates("size")[setup_columns], "overlap_individual_setup", show=False)
give(ctx, "ddp_overlap_individual_parameters_benchmarking.a", "ddp_overlap_individual_parameters_benchmarking.a.2026")
ctx.save_figure(plot_step_breakdown(df, f"{world_size} ranks ({backend}): overlapping individual all-reduces"), "individual_breakdown");

# %%
for size, rows in df.groupby("size", sort=False):
    ok = rows[rows.status == "ok"].set_index("flavour")
    if not {"no-communication", "naive", "flat", "individual"} <= set(ok.index):
        ctx.md(f"**{size}:** some flavours did not run (see the status column), so there is no comparison.")
        continue
    naive, flat, ind = ok.loc["naive"], ok.loc["flat"], ok.loc["individual"]
    best_plain = "naive" if naive.step_ms < flat.step_ms else "flat"
    ctx.md(
        f"**{size}:** overlapping individual all-reduces gives a step of {ind.step_ms:.1f} ± {ind.step_std_ms:.1f} ms, against "
        f"{naive.step_ms:.1f} ms for naive and {flat.step_ms:.1f} ms for flat DDP "
        f"({ind.step_ms / ok.loc[best_plain].step_ms:.2f}× the better of the two, {best_plain}). Only {ind.sync_ms:.1f} ms of "
        f"communication is left after the backward pass (naive: {naive.sync_ms:.1f} ms, flat: {flat.sync_ms:.1f} ms); the "
        f"overhead over the no-communication step is {ind.overhead_ms:.1f} ms versus {naive.overhead_ms:.1f} ms and "
        f"{flat.overhead_ms:.1f} ms{' (a negative value means the difference is below this run’s noise)' if min(ind.overhead_ms, naive.overhead_ms, flat.overhead_ms) < 0 else ''}. "
        + (f"The forward+backward phase itself grows from {ok.loc['no-communication'].fwd_bwd_ms:.1f} to {ind.fwd_bwd_ms:.1f} ms: "
           "launching from the hooks and running the communication alongside the backward computation is not free."
           if ind.fwd_bwd_ms > ok.loc["no-communication"].fwd_bwd_ms else "")
    )
    ctx.headline(f"individual-overlap DDP step ({size})", round(ind.step_ms, 1), unit="ms", note=f"{size}, {world_size} ranks, {backend}")

# %% [markdown]
# ## (b) Timelines: communication after, or during, the backward pass
# One extra step of each flavour, at each model size, is recorded with `torch.profiler` on rank 0
# and drawn from its trace (`cs336_systems.experiments.ddp_timeline`): the top lane holds the
# step's named ranges, the lanes below the spans that ran — on a GPU one lane per CUDA stream, so NCCL's kernels
# (orange) sit on their own stream below the compute kernels (blue); on a CPU the gloo threads
# that carry the all-reduces.

# %%
for size, flavours in timelines.items():
    if flavours:
        titles = {name: f"{name} DDP, {size} — one profiled step on rank 0" for name in flavours}
        ctx.save_figure(plot_timelines({titles[k]: v for k, v in flavours.items()}), f"timeline_naive_vs_individual_{size}")
rows = [dict(size=size, flavour=name, communication_spans=int((ev.kind == "communication").sum()),
             communication_ms=ev[ev.kind == "communication"].dur_us.sum() / 1e3,
             share_inside_backward=overlap_fraction(ev), after_backward_ms=communication_after(ev))
        for size, flavours in timelines.items() for name, ev in flavours.items()]
if rows:
    overlap = ctx.save_table(pd.DataFrame(rows), "timeline_overlap")
    give(ctx, "ddp_overlap_individual_parameters_benchmarking.b", "ddp_overlap_individual_parameters_benchmarking.b.2026")
    for size, o in overlap.groupby("size", sort=False):
        o = o.set_index("flavour")
        if not {"naive", "individual"} <= set(o.index):
            continue
        ctx.md(
            f"**{size}:** in the naive step, {100 * o.loc['naive', 'share_inside_backward']:.0f}% of the communication time falls "
            f"inside the backward range and the last all-reduce ends {o.loc['naive', 'after_backward_ms']:.1f} ms after it; with "
            f"per-parameter overlap, {100 * o.loc['individual', 'share_inside_backward']:.0f}% runs during the backward pass "
            f"and communication ends {o.loc['individual', 'after_backward_ms']:.1f} ms after it. (The profiler slows a step, so "
            f"these times are longer than the table's.)"
        )
