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
# # Problems `naive_ddp`, `naive_ddp_benchmarking`, `minimal_ddp_flat_benchmarking` — DDP without overlap
# Spring 2025 handout §2.2 and §2.3.1. Wrap an unchanged model so that rank 0's weights are
# broadcast at construction and, after the backward pass, every gradient is averaged over the
# ranks: **naive** issues one all-reduce per parameter (`cs336_systems.distributed.ddp_naive`),
# **flat** one all-reduce of all gradients concatenated with `_flatten_dense_tensors`
# (`ddp_flat`). First check that DDP training gives the weights of single-process training, then
# time a training step of the XL model on 1 node × 2 GPUs and the part of it spent communicating.

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
from cs336_systems.experiments.answers import give
from cs336_systems.report import setup_notebook

ctx = setup_notebook("13_naive_ddp", profile=profile)
sizes = ctx.pick(sizes, cpu=["nano"], gpu=["xl", "2.7B"])
context_length = ctx.pick(context_length, cpu=32, gpu=512)
warmup = ctx.pick(warmup, cpu=1, gpu=3)
steps = ctx.pick(steps, cpu=3, gpu=10)
later_warmup = ctx.pick(later_warmup, cpu=warmup, gpu=2)
later_steps = ctx.pick(later_steps, cpu=steps, gpu=6)

# %%
from cs336_systems.distributed.launch import resolve_backend
from cs336_systems.experiments.ddp_benchmark import (
    DDPBenchmarkConfig,
    benchmark_ddp_sizes,
    describe_setup,
    format_bytes,
    per_size,
    plot_step_breakdown,
)
from cs336_systems.experiments.ddp_equivalence import check_equivalence, summarize_equivalence
from cs336_systems.experiments.ddp_flavours import expand_flavours

backend = resolve_backend("auto", world_size)
if ctx.profile == "gpu" and backend != "nccl":
    ctx.not_run(f"{', '.join(sizes)} DDP benchmark on {world_size} GPUs", f"this machine has {ctx.num_gpus} GPU(s); the CPU settings ran on gloo instead")
    sizes, context_length = ["nano"], 32

# %% [markdown]
# ## `naive_ddp`: DDP training equals single-process training
# Each rank starts from its own random weights (only rank 0's equal the reference), so matching
# also proves the broadcast. Every step draws one global batch; rank r trains on its slice with
# DDP, a single-process copy trains on the whole batch; both take 5 SGD steps. Models: the toy
# model, the toy model with a tied weight, a frozen parameter and a random buffer, and a small
# Transformer LM. `no-communication` (the same wrapper without the all-reduce) is the negative
# control: it must *not* match.

# %%
checks = summarize_equivalence(check_equivalence(expand_flavours(["no-communication", "naive", "flat"]), backend=backend), tolerance)
ctx.save_table(checks, "equivalence_naive");
give(ctx, "naive_ddp")

# %%
ddp_rows, control = checks[checks.flavour != "no-communication"], checks[checks.flavour == "no-communication"]
ctx.md(
    f"{int(ddp_rows.matches.sum())} of {len(ddp_rows)} (model, flavour) pairs match single-process training on every rank: "
    f"the largest weight difference after any step is {ddp_rows.max_abs_diff.max():.1e} (tolerance {tolerance:.0e}), while the "
    f"weights moved by up to {ddp_rows.max_update.min():.3g}–{ddp_rows.max_update.max():.3g}. Before wrapping, rank 1's weights "
    f"differed from rank 0's by up to {ddp_rows.diff_before_wrap.max():.3g}; after, by {ddp_rows.diff_after_wrap.max():.1e}. "
    f"Without the all-reduce the weights drift by {control.max_abs_diff.min():.3g}–{control.max_abs_diff.max():.3g}, "
    f"so the check would catch a missing or wrong average."
)
ctx.headline("naive+flat DDP match single-process training", f"{int(ddp_rows.matches.sum())}/{len(ddp_rows)}")

# %% [markdown]
# ## `naive_ddp_benchmarking` and `minimal_ddp_flat_benchmarking`: where a step's time goes
# One distributed run times both flavours and the no-communication baseline at every model size
# (a size that does not fit is a row with status `OOM`). A step is split into forward+backward
# (until the compute stream is idle), gradient synchronization (for these flavours, all the
# communication) and the AdamW step, with a synchronize between phases. The 2025 answers read
# the 2025 XL's rows, the 2026 answers the 2026 xl's.

# %%
config = DDPBenchmarkConfig(
    size=sizes[0], global_batch_size=global_batch_size, context_length=context_length, flavours=("no-communication", "naive", "flat"),
    warmup=warmup, steps=steps, world_size=world_size, backend=backend,
)
df, _ = benchmark_ddp_sizes(per_size(config, sizes, later_warmup, later_steps))
ctx.md(describe_setup(df))
columns = ["size", "flavour", "status", "all_reduce_calls", "step_ms", "step_std_ms", "fwd_bwd_ms", "sync_ms", "sync_std_ms",
           "optimizer_ms", "overhead_ms", "sync_fraction", "rank_spread_ms"]
ctx.save_table(df[[c for c in columns if c in df]], "naive_flat_step");
setup_columns = ["size", "parameters", "gradient_bytes", "context_length", "global_batch_size", "world_size", "backend", "warmup", "steps"]
ctx.save_table(df[df.status == "ok"].drop_duplicates("size")[setup_columns], "naive_flat_setup", show=False)
give(ctx, "naive_ddp_benchmarking", "naive_ddp_benchmarking.2026", "minimal_ddp_flat_benchmarking", "minimal_ddp_flat_benchmarking.2026")

# %%
ctx.save_figure(plot_step_breakdown(df, f"{world_size} ranks ({backend}): naive vs flat DDP"), "naive_flat_breakdown");

# %%
for size, rows in df.groupby("size", sort=False):
    ok = rows[rows.status == "ok"].set_index("flavour")
    if not {"naive", "flat", "no-communication"} <= set(ok.index):
        ctx.md(f"**{size}:** some flavours did not run (see the status column), so there is no comparison.")
        continue
    base, naive, flat = ok.loc["no-communication"], ok.loc["naive"], ok.loc["flat"]
    per_call_us = (naive.sync_ms - flat.sync_ms) / (naive.all_reduce_calls - flat.all_reduce_calls) * 1e3
    ctx.md(
        f"**{size}, naive DDP:** a training step takes {naive.step_ms:.1f} ± {naive.step_std_ms:.1f} ms, of which "
        f"{naive.sync_ms:.1f} ms ({100 * naive.sync_fraction:.1f}%) is spent communicating the gradients in "
        f"{int(naive.all_reduce_calls)} separate all-reduces; the same step without communication takes "
        f"{base.step_ms:.1f} ms, an overhead of {naive.overhead_ms:.1f} ms"
        f"{' (negative: the difference is below this run’s noise)' if naive.overhead_ms < 0 else ''}.\n\n"
        f"**{size}, flat DDP:** one all-reduce of all {format_bytes(naive.gradient_bytes)} of gradients takes {flat.sync_ms:.1f} ms "
        f"({100 * flat.sync_fraction:.1f}% of a {flat.step_ms:.1f} ± {flat.step_std_ms:.1f} ms step), an effective "
        f"{naive.gradient_bytes / flat.sync_ms / 1e6:.2f} GB/s including the copies into and out of the flat buffer. "
        f"Batching {'saves' if flat.sync_ms < naive.sync_ms else 'costs'} {abs(naive.sync_ms - flat.sync_ms):.1f} ms of "
        f"communication per step ({naive.sync_ms / flat.sync_ms:.2f}× naive's), i.e. about {per_call_us:.0f} µs per "
        f"all-reduce call avoided (net of the extra copies). "
        + ("The per-call cost matters little next to moving the bytes, which both flavours must do after the backward pass."
           if abs(naive.sync_ms - flat.sync_ms) < 0.2 * naive.sync_ms else
           "With this many small tensors, the fixed cost of each call is a large part of naive's communication time.")
    )
    ctx.headline(f"naive DDP step ({size})", round(naive.step_ms, 1), unit="ms", note=f"{size}, {world_size} ranks, {backend}")
    ctx.headline(f"naive DDP communication share ({size})", round(100 * naive.sync_fraction, 1), unit="%")
    ctx.headline(f"flat DDP step ({size})", round(flat.step_ms, 1), unit="ms", note=f"{size}, {world_size} ranks, {backend}")

# %% [markdown]
# Neither flavour overlaps anything: the all-reduces start only when `backward()` has returned,
# so every millisecond of communication is added to the step. Notebook 14 starts each gradient's
# all-reduce as soon as autograd has produced it.
