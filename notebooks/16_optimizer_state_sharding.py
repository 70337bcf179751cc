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
# # Problems `optimizer_state_sharding`, `optimizer_state_sharding_accounting` — sharding AdamW's state
# Spring 2025 handout §3 (spring 2026 §6). `ShardedOptimizer(params, optimizer_cls, **kwargs)`
# (`cs336_systems.distributed.sharded_optimizer`) wraps any `torch.optim.Optimizer`: every
# parameter is owned by one rank (greedy: largest parameter first, to the least-loaded rank), each
# rank's wrapped optimizer holds state for its own parameters only, and after each step every
# parameter is sent from its owner to the other ranks. Below: equality with the unsharded optimizer; the peak
# memory of training on 2 GPUs after initialization, before and after the optimizer step, with
# and without sharding (and with PyTorch's `ZeroRedundancyOptimizer`), broken down and next to the
# analysis; the time per iteration; and how this differs from ZeRO stage 1. Each handout asks for
# its own XL model, so one run measures both: the 2025 XL (d_model 1600, 48 layers) and the 2026
# xl (d_model 2560, 32 layers, the shape the library calls `2.7B`); the analytic tables cover both
# always. The larger model runs fewer warm-up and measured steps on a GPU (`later_warmup`,
# `later_steps`) to keep the notebook's run short; the tables state the steps each size ran.

# %% tags=["parameters"]
profile = None             # "cpu" | "gpu"; None picks gpu when CUDA is available
sizes = None               # model sizes measured; None = by profile (cpu: nano; gpu: xl and 2.7B, both handouts' xl)
context_length = None      # None = by profile (cpu: 32, gpu: 512)
global_batch_size = 4      # split evenly over the ranks
world_size = 2
warmup = None              # untimed steps before the measured ones at the first size (the AdamW state is created here)
steps = None               # measured steps per optimizer at the first size
later_warmup = None        # the same at the other sizes (cpu: as the first, gpu: 2)
later_steps = None         # (cpu: as the first, gpu: 6)
equality_steps = 10
tolerance = 1e-6           # largest weight difference accepted as "equal"
analysis_sizes = ["xl", "2.7B"]  # the models of the analytic tables (always computed): both handouts' xl

# %%
from cs336_systems.experiments.answers import give
from cs336_systems.report import setup_notebook

ctx = setup_notebook("16_optimizer_state_sharding", profile=profile)
sizes = ctx.pick(sizes, cpu=["nano"], gpu=["xl", "2.7B"])
context_length = ctx.pick(context_length, cpu=32, gpu=512)
warmup = ctx.pick(warmup, cpu=1, gpu=3)
steps = ctx.pick(steps, cpu=3, gpu=10)
later_warmup = ctx.pick(later_warmup, cpu=warmup, gpu=2)
later_steps = ctx.pick(later_steps, cpu=steps, gpu=6)
unit = ctx.pick(None, cpu="MB", gpu="GB")

# %%
from cs336_systems.distributed.launch import resolve_backend
from cs336_systems.experiments.ddp_benchmark import per_size
from cs336_systems.experiments.sharding_benchmark import (
    ShardingBenchmarkConfig,
    analysis_tables,
    breakdown_table,
    plot_breakdown,
    plot_step_times,
    run_setup,
    run_sharding_benchmark,
)

backend = resolve_backend("auto", world_size)
if backend != "nccl":
    ctx.not_run(f"{', '.join(analysis_sizes)} memory and timing on {world_size} GPUs",
                f"this machine has {ctx.num_gpus} GPU(s); the same measurements ran on gloo with the nano model")
    sizes = ["nano"]
config = ShardingBenchmarkConfig(
    size=sizes[0], global_batch_size=global_batch_size, context_length=context_length, warmup=warmup, steps=steps,
    world_size=world_size, backend=backend, equality_steps=equality_steps,
)
configs = per_size(config, sizes, later_warmup, later_steps)
result = run_sharding_benchmark(configs)
ctx.save_table(run_setup(configs, backend), "sharding_setup", show=False);

# %% [markdown]
# ## `optimizer_state_sharding`: the sharded optimizer equals the unsharded one
# One data-parallel run per optimizer on a small model, the same global batches (each rank its
# slice, gradients all-reduced), `equality_steps` AdamW steps; the weights are compared with
# those of the unsharded AdamW on every rank. The tests (`tests/test_sharded_optimizer.py`) also
# cover SGD with momentum, 3 ranks (an uneven split), two parameter groups with different
# learning rates, tied weights, `add_param_group` during training and state-dict round trips.

# %%
equality = result["equality"]
ctx.save_table(equality, "sharding_equality");
eq = equality[equality.optimizer != "unsharded"]
worst = eq.groupby("optimizer").max_abs_diff.max()
ctx.md(
    f"After {eq.steps.iloc[0]} steps on the {eq['size'].iloc[0]} model the weights moved by up to "
    f"{eq.max_update.max():.3g}; the sharded optimizer differs from the unsharded one by at most "
    f"{worst.get('sharded', float('nan')):.1e} and PyTorch's ZeroRedundancyOptimizer by "
    f"{worst.get('zero', float('nan')):.1e} (tolerance {tolerance:.0e}): "
    + ("**equal**." if (worst <= tolerance).all() else "**not equal**.")
)
ctx.headline("sharded optimizer = unsharded (max |Δθ|)", float(worst.get("sharded", float("nan"))))
give(ctx, "optimizer_state_sharding")

# %% [markdown]
# ## The analysis: what each rank holds and sends, for both XL models on 2 ranks
# `accounting.sharding`, fp32 weights and gradients, AdamW (2 state elements per parameter).
# Ψ_own is the largest share a rank owns when whole parameters are assigned greedily.

# %%
analysis = analysis_tables(analysis_sizes, context_length, world_size)
ctx.save_table(analysis["memory"].drop(columns="strategy"), "sharding_analysis_memory");
ctx.save_table(analysis["communication"].drop(columns="strategy"), "sharding_analysis_communication");
for size, setup in analysis["setups"].items():
    m = analysis["memory"][analysis["memory"]["size"] == size].set_index("strategy")
    ctx.md(
        f"**{size}** has Ψ = {setup.num_params / 1e9:.3f} B parameters: {m.loc['ddp', 'parameters_GB']:.2f} GB of fp32 "
        f"weights, as many of gradients and {m.loc['ddp', 'optimizer_state_GB']:.2f} GB of AdamW state per rank without sharding "
        f"({m.loc['ddp', 'total_GB']:.2f} GB). Sharding the state over {world_size} ranks leaves "
        f"{m.loc['optimizer_sharding', 'optimizer_state_GB']:.2f} GB of it on the most loaded rank (it owns "
        f"{setup.own:,} elements; a perfect split would be {setup.num_params / world_size:,.0f}), "
        f"saving {m.loc['optimizer_sharding', 'saving_vs_ddp_GB']:.2f} GB."
    )

# %% [markdown]
# ## `optimizer_state_sharding_accounting` (a): peak memory, and where it goes
# The same model, batch and DDP wrapper (gradients all-reduced during the backward pass) with
# three optimizers, one after the other in one run, at each model size (a size or optimizer
# that does not fit is a row with status `OOM`). Probed in a step after warm-up (the AdamW
# state exists): `allocated` at each point, `peak` = the most the allocator held since the
# previous point, and the bytes of the live parameters, gradients and optimizer-state tensors,
# counted from the objects; `rest` = allocated − those (activations, temporaries, buffers).
# `expected_*` is the analysis for that rank.

# %%
table = breakdown_table(result["memory"], config, unit=unit)
ctx.save_table(table.rename(columns=lambda col: f"{col}_{unit}" if col not in ("size", "optimizer", "point", "rank") else col), "sharding_memory_breakdown");
give(ctx, "optimizer_state_sharding_accounting.a", "optimizer_state_sharding_accounting.a.2026")

# %%
for size in table["size"].unique():
    ctx.save_figure(plot_breakdown(table, rank=0, unit=unit, size=size,
                                   title=f"{size}, {world_size} ranks ({backend}): memory at the three points, rank 0"),
                    f"sharding_memory_breakdown_{size}");

# %%
gpu_peaks = table["peak"].notna().all()
for size, rows in table.groupby("size", sort=False, observed=True):
    t = rows.groupby(["optimizer", "point"], observed=True).max(numeric_only=True)

    def at(kind, point, col, t=t):
        return t.loc[(kind, point), col]

    lines = []
    for kind in ("unsharded", "sharded", "zero"):
        if (kind, "after step") not in t.index:
            continue
        if gpu_peaks:
            lines.append(
                f"- **{kind}**: peak {at(kind, 'after init', 'peak'):.2f} {unit} after initialization, "
                f"{at(kind, 'before step', 'peak'):.2f} {unit} up to the optimizer step (forward and backward), "
                f"{at(kind, 'after step', 'peak'):.2f} {unit} during the step; after it the rank holds "
                f"{at(kind, 'after step', 'parameters'):.2f} {unit} of parameters, {at(kind, 'after step', 'gradients'):.2f} of gradients, "
                f"{at(kind, 'after step', 'optimizer_state'):.2f} of optimizer state (expected "
                f"{at(kind, 'after step', 'expected_optimizer_state'):.2f}) and {at(kind, 'after step', 'rest'):.2f} of other tensors."
            )
        else:
            lines.append(
                f"- **{kind}**: {at(kind, 'after init', 'parameters'):.3f} {unit} of parameters after initialization; after the "
                f"step {at(kind, 'after step', 'gradients'):.3f} {unit} of gradients and {at(kind, 'after step', 'optimizer_state'):.3f} "
                f"{unit} of optimizer state on the most loaded rank (expected {at(kind, 'after step', 'expected_optimizer_state'):.3f})."
            )
    ctx.md(f"**{size}**, worst rank, per optimizer:\n\n" + ("\n".join(lines) or "- no optimizer fitted in memory."))
if not gpu_peaks:
    ctx.md("On a CPU there is no allocator to ask for peaks: the table counts the live tensors only.")

# %% [markdown]
# How the parts come and go: the parameters (4Ψ bytes) exist from initialization; the gradients
# (4Ψ bytes, all of them on every rank, as DDP needs them) from the first backward pass; AdamW's
# state (8Ψ bytes unsharded, about 8Ψ/N with sharding) is created at the first optimizer step and
# then lives across steps, so after warm-up it is held through the forward and backward passes as
# well as the step. The activations come and go within each forward and backward pass.

# %% [markdown]
# ## (b) Time per iteration
# Forward+backward, the exposed part of the gradient all-reduce, and the optimizer step (for the
# sharded optimizers including the exchange of the updated parameters), each synchronized.

# %%
timing = result["timing"]
columns = ["size", "optimizer", "status", "step_ms", "step_std_ms", "fwd_bwd_ms", "sync_ms", "optimizer_ms", "rank_spread_ms"]
ctx.save_table(timing[[col for col in columns if col in timing]], "sharding_step_time");
ctx.save_figure(plot_step_times(timing, f"{world_size} ranks ({backend}): time per iteration"), "sharding_step_time");
give(ctx, "optimizer_state_sharding_accounting.b", "optimizer_state_sharding_accounting.b.2026")

# %%
for size, rows in timing.groupby("size", sort=False):
    ok = rows[rows.status == "ok"].set_index("optimizer")
    if not {"unsharded", "sharded"} <= set(ok.index):
        ctx.md(f"**{size}:** the unsharded and sharded optimizers did not both run (see the status column).")
        continue
    u, s = ok.loc["unsharded"], ok.loc["sharded"]
    text = (
        f"**{size}:** an iteration takes {u.step_ms:.1f} ± {u.step_std_ms:.1f} ms with the unsharded AdamW and "
        f"{s.step_ms:.1f} ± {s.step_std_ms:.1f} ms with the sharded one ({s.step_ms / u.step_ms:.2f}×). "
        f"The optimizer phase goes from {u.optimizer_ms:.1f} ms to {s.optimizer_ms:.1f} ms: each rank updates only its "
        f"own parameters, then sends them to the other ranks."
    )
    if "zero" in ok.index:
        z = ok.loc["zero"]
        text += f" PyTorch's ZeroRedundancyOptimizer, in the same run: {z.step_ms:.1f} ± {z.step_std_ms:.1f} ms (optimizer phase {z.optimizer_ms:.1f} ms)."
    ctx.md(text)
    ctx.headline(f"sharded / unsharded iteration time ({size})", round(s.step_ms / u.step_ms, 3), unit="×", note=f"{size}, {backend}")

# %% [markdown]
# ## (c) How this differs from ZeRO stage 1, computed for both XL models
# ZeRO-DP P_os also gives each rank 1/N of the optimizer state, but it partitions the flat
# gradient and parameter buffers into equal contiguous slices, and it replaces the all-reduce of
# the gradients: a reduce-scatter delivers each rank the summed gradients of its slice only, the
# rank updates its slice, and an all-gather returns the updated parameters. Our optimizer keeps
# the DDP all-reduce (every rank receives every summed gradient, though it updates only its own
# parameters) and then sends the parameters from their owners — the all-gather's traffic on top of the
# all-reduce's. ZeRO's paper counts mixed-precision training, where the fp32 master weights are
# optimizer state too, and shards them as well.

# %%
ctx.save_table(analysis["zero_paper"], "sharding_zero_paper_mixed_precision");
for size in analysis_sizes:
    m = analysis["memory"][analysis["memory"]["size"] == size].set_index("strategy")
    c = analysis["communication"][analysis["communication"]["size"] == size].set_index("strategy")
    zp = analysis["zero_paper"][analysis["zero_paper"]["size"] == size].set_index("strategy")
    ctx.md(
        f"Per step and rank, for **{size}** on {world_size} ranks: DDP sends {c.loc['ddp', 'sent_per_rank_GB']:.2f} GB "
        f"(all-reduce of the fp32 gradients); our optimizer state sharding sends {c.loc['optimizer_sharding', 'sent_per_rank_GB']:.2f} GB "
        f"({c.loc['optimizer_sharding', 'relative_to_ddp']:.2f}× DDP: the same all-reduce plus "
        f"{c.loc['optimizer_sharding', 'sent_per_rank_GB'] - c.loc['ddp', 'sent_per_rank_GB']:.2f} GB of parameter broadcasts); "
        f"ZeRO stage 1 sends {c.loc['zero1', 'sent_per_rank_GB']:.2f} GB ({c.loc['zero1', 'relative_to_ddp']:.2f}× DDP: reduce-scatter "
        f"plus all-gather), so ours moves {c.loc['optimizer_sharding', 'sent_per_rank_GB'] - c.loc['zero1', 'sent_per_rank_GB']:.2f} GB "
        f"more per step. In memory, with fp32 training, both hold {m.loc['zero1', 'parameters_GB']:.2f} GB of weights and as much of "
        f"gradients; ZeRO-1's state is exactly 1/{world_size} of AdamW's, {m.loc['zero1', 'optimizer_state_GB']:.3f} GB per rank, "
        f"while ours holds {(m.loc['optimizer_sharding', 'optimizer_state_GB'] - m.loc['zero1', 'optimizer_state_GB']) * 1e6:,.1f} kB "
        f"more on the most loaded rank, because it shards whole parameters. "
        f"In ZeRO's mixed-precision accounting (fp16 weights and gradients, K = 12 bytes of fp32 state per parameter) P_os needs "
        f"{zp.loc['zero1', 'total_GB']:.2f} GB per rank instead of DDP's {zp.loc['ddp', 'total_GB']:.2f} GB, the saving including "
        f"the sharded fp32 master weights."
    )
give(ctx, "optimizer_state_sharding_accounting.c")
