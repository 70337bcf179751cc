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
# # Problems `ddp_overlap_bucketed` and `ddp_bucketed_benchmarking` — bucketed, overlapping DDP
# Spring 2025 handout §2.3.3. `DDPBucketed(module, bucket_size_mb)`
# (`cs336_systems.distributed.ddp_bucketed`) packs the parameters, in reverse registration order,
# into buckets of at most `bucket_size_mb` (MB = 2^20 bytes, as torch DDP's `bucket_cap_mb`;
# `None` = one bucket). When the last gradient of a bucket arrives, a hook launches an asynchronous all-reduce of the
# bucket's flat buffer, into which each gradient was copied when it was ready and whose slices then
# serve as the gradients (`p.grad` is a view of the bucket, torch DDP's `gradient_as_bucket_view`),
# so `finish_gradient_synchronization()` only waits: nothing is copied back. On a GPU the copies and
# all-reduces are issued on a side stream, so the copies overlap the backward's kernels.
# `tail_bucket_mb` splits the first-registered parameters (the token embedding first), whose
# gradients come last, into a small final bucket, the one all-reduce that nothing can overlap. On
# NCCL a bucketed run can also cap the thread blocks (SMs) NCCL's kernels take from the backward
# pass they overlap (`max_ctas`, off by default; the `bucket_max_ctas` parameter sweeps it). On a GPU
# every flavour's steps run on a CUDA stream of higher priority than NCCL's
# (`cs336_systems.distributed.compute_stream`), so the overlapped all-reduces take the SMs the
# backward pass leaves free instead of competing for them. (a) sweeps the bucket size (the
# handout's 1, 10, 100, 1000 MB and 2000, 4000 MB, each also with a 256 MB tail bucket: the token
# embedding and the first block) on 1 node × 2 GPUs with the XL model and compares every flavour,
# `torch.nn.parallel.DistributedDataParallel` included, in one run; (a′) measures what the stream
# priority buys; (b) models DDP's overhead and the best bucket size, and fits the model to
# the measurements; (c) repeats the comparison at 2, 4 and 8 ranks with the per-rank batch held fixed.

# %% tags=["parameters"]
profile = None             # "cpu" | "gpu"; None picks gpu when CUDA is available
size = None                # model size; None = the profile's default (cpu: nano, gpu: xl)
context_length = None      # None = the profile's default (cpu: 32, gpu: 512)
global_batch_size = 4      # split evenly over the ranks
world_size = 2
bucket_sizes_mb = None     # None = the profile's default (cpu: sizes that split the nano model, gpu: 1, 10, 100, 1000, 2000, 4000)
bucket_tail_mb = None      # each bucket size also with a final bucket of at most this size; None = cpu: 0.01, gpu: 256
bucket_max_ctas = None     # each bucket size also with NCCL's kernels capped at these thread blocks; None = none
warmup = None
steps = None
tolerance = 1e-5           # largest weight difference accepted as "equal" (fp32 rounding)
scaling_world_sizes = None # part (c); None = the default of the profile (cpu: 2, 4; gpu: 2, 4, 8, sizes beyond the GPUs listed as not run)

# %%
from cs336_systems.experiments.answers import give
from cs336_systems.report import setup_notebook

ctx = setup_notebook("15_ddp_bucketed", profile=profile)
size = ctx.pick(size, cpu="nano", gpu="xl")
context_length = ctx.pick(context_length, cpu=32, gpu=512)
bucket_sizes_mb = ctx.pick(bucket_sizes_mb, cpu=[0.02, 0.2, 10], gpu=[1, 10, 100, 1000, 2000, 4000])
warmup = ctx.pick(warmup, cpu=1, gpu=3)
steps = ctx.pick(steps, cpu=3, gpu=10)
bucket_tail_mb = ctx.pick(bucket_tail_mb, cpu=[0.01], gpu=[256])
bucket_max_ctas = ctx.pick(bucket_max_ctas, cpu=[], gpu=[])
scaling_world_sizes = ctx.pick(scaling_world_sizes, cpu=[2, 4], gpu=[2, 4, 8])


# %%
import numpy as np

from cs336_systems.distributed.launch import nccl_cta_limit_supported, resolve_backend
from cs336_systems.experiments.ddp_benchmark import (
    DDPBenchmarkConfig,
    benchmark_ddp,
    describe_setup,
    describe_stream_priority_effect,
    format_bytes,
    plot_bucket_sweep,
    plot_step_breakdown,
    stream_priority_effect,
)
from cs336_systems.experiments.ddp_equivalence import check_equivalence, summarize_equivalence
from cs336_systems.experiments.ddp_flavours import FLAVOURS, expand_flavours, flavour_of
from cs336_systems.experiments.ddp_overhead_model import fit_overhead, latex_equations, plot_overhead_fit

backend = resolve_backend("auto", world_size)
if ctx.profile == "gpu" and backend != "nccl":
    ctx.not_run(f"{size} DDP benchmark on {world_size} GPUs", f"this machine has {ctx.num_gpus} GPU(s); the CPU settings ran on gloo instead")
    size, context_length, bucket_sizes_mb = "nano", 32, [0.02, 0.2, 10]
if bucket_max_ctas and not (backend == "nccl" and nccl_cta_limit_supported()):
    ctx.not_run("bucketed DDP with NCCL's thread blocks capped", f"needs NCCL and a torch that passes it a config; this run uses {backend}")
    bucket_max_ctas = []

# %% [markdown]
# ## Correctness
# Same check as notebooks 13 and 14, for one bucket (`None`), a cap of 0.0005 MB (a few buckets on
# the toy models, many on the Transformer) and 10⁻⁹ MB (one parameter per bucket). The `buckets`
# column is the number of buckets each model was split into.

# %%
checks = summarize_equivalence(check_equivalence(expand_flavours(["bucketed"], [None, 0.0005, 1e-9]), backend=backend), tolerance)
ctx.save_table(checks, "equivalence_bucketed");
give(ctx, "ddp_overlap_bucketed")
ctx.md(
    f"{int(checks.matches.sum())} of {len(checks)} (model, bucket size) pairs match single-process training on every rank, "
    f"with {int(checks.buckets.min())} to {int(checks.buckets.max())} buckets (largest weight difference "
    f"{checks.max_abs_diff.max():.1e}, tolerance {tolerance:.0e})."
)
ctx.headline("bucketed DDP matches single-process training", f"{int(checks.matches.sum())}/{len(checks)}")

# %% [markdown]
# ## (a) Every flavour in one run, bucket sizes swept
# Same model, batch and phases as in notebooks 13 and 14; `torch-ddp` is PyTorch's
# `DistributedDataParallel` with its defaults (25 MB buckets, averaging inside `backward()`, so
# its sync column is empty and its communication shows in forward+backward).

# %%
config = DDPBenchmarkConfig(
    size=size, global_batch_size=global_batch_size, context_length=context_length, flavours=FLAVOURS,
    bucket_sizes_mb=tuple(bucket_sizes_mb), bucket_max_ctas=(None, *bucket_max_ctas),
    bucket_tail_mb=(None, *bucket_tail_mb), warmup=warmup, steps=steps, world_size=world_size, backend=backend,
)
df, _ = benchmark_ddp(config)
ctx.md(describe_setup(df))
columns = ["flavour", "status", "all_reduce_calls", "step_ms", "step_std_ms", "fwd_bwd_ms", "sync_ms", "sync_std_ms",
           "optimizer_ms", "overhead_ms", "sync_fraction", "rank_spread_ms"]
ctx.save_table(df[[c for c in columns if c in df]], "all_flavours");
setup_columns = ["size", "parameters", "gradient_bytes", "context_length", "global_batch_size", "world_size", "backend", "warmup", "steps"]
ctx.save_table(df[df.status == "ok"][setup_columns].head(1), "all_flavours_setup", show=False)

# %%
ctx.save_figure(plot_step_breakdown(df, f"{size}, {world_size} ranks ({backend}): every DDP flavour"), "all_flavours_breakdown");
ctx.save_figure(plot_bucket_sweep(df), "bucket_sweep");
give(ctx, "ddp_bucketed_benchmarking.a")

# %%
ok = df[df.status == "ok"].set_index("flavour")
sweep = ok[(ok.kind == "bucketed") & ok.bucket_size_mb.notna()]
needed = {"no-communication", "naive", "flat", "individual", "torch-ddp"}
if len(sweep) and needed <= set(ok.index):
    base, naive, flat, ind, tddp = (ok.loc[k] for k in ("no-communication", "naive", "flat", "individual", "torch-ddp"))
    best_label = sweep.step_ms.idxmin()
    best, worst = sweep.loc[best_label], sweep.loc[sweep.step_ms.idxmax()]
    runner_up = sweep.drop(index=best_label).sort_values("step_ms").iloc[0] if len(sweep) > 1 else best
    gap = runner_up.step_ms - best.step_ms
    # standard error of each mean: its steps' standard deviation over sqrt(steps); two of them, combined
    noise = float(np.hypot(best.step_std_ms, runner_up.step_std_ms)) / np.sqrt(best.steps)
    beats = [name for name, row in (("individual", ind), ("flat", flat), ("naive", naive)) if best.step_ms < row.step_ms]
    ctx.md(
        f"Across bucket sizes the step takes {sweep.step_ms.min():.1f}–{sweep.step_ms.max():.1f} ms: best at "
        f"**{best_label}** ({int(best.all_reduce_calls)} bucket{'s' if best.all_reduce_calls != 1 else ''}, {best.step_ms:.1f} ± {best.step_std_ms:.1f} ms, "
        f"{best.sync_ms:.1f} ms of exposed communication), worst at {sweep.step_ms.idxmax()} ({int(worst.all_reduce_calls)} "
        f"bucket{'s' if worst.all_reduce_calls != 1 else ''}, {worst.step_ms:.1f} ms). For comparison: individual overlap {ind.step_ms:.1f} ms ({int(ind.all_reduce_calls)} "
        f"calls), flat {flat.step_ms:.1f} ms, naive {naive.step_ms:.1f} ms, torch DDP {tddp.step_ms:.1f} ms, and no communication "
        f"{base.step_ms:.1f} ms. The best bucket size "
        + (f"beats {' and '.join([', '.join(beats[:-1]), beats[-1]] if len(beats) > 1 else beats)}" if beats else "beats none of the other flavours")
        + (f". The runner-up, {runner_up.name}, is {gap:.1f} ms slower, {'more' if gap > 2 * noise else 'less'} than twice the "
           f"combined standard error of the two means ({noise:.2f} ms)"
           + ("." if gap > 2 * noise else ": this run does not separate the two.") if len(sweep) > 1 else ".")
    )
    ratio_ddp = best.step_ms / tddp.step_ms
    naive_over, best_over = naive.step_ms - base.step_ms, best.step_ms - base.step_ms
    share = best_over / naive_over if naive_over > 0 else float("nan")
    slowdown, exposed = best.fwd_bwd_ms - base.fwd_bwd_ms, best.sync_ms - base.sync_ms
    text = (f"**Where the best bucketed overhead goes.** Of its {best_over:.1f} ms, {slowdown:.1f} ms is a slower forward+backward "
            f"({best.fwd_bwd_ms:.1f} against {base.fwd_bwd_ms:.1f} ms without communication: the copies into the buckets, and the "
            f"all-reduces taking SMs and memory bandwidth from the backward they overlap) and {exposed:.1f} ms is communication "
            f"left after the backward. The per-parameter flavour, which copies nothing, slows the forward+backward by "
            f"{ind.fwd_bwd_ms - base.fwd_bwd_ms:.1f} ms, and torch DDP by {tddp.fwd_bwd_ms - base.fwd_bwd_ms:.1f} ms.")
    if min(slowdown, exposed) < 0:
        text += " (A negative part is below this run's noise.)"
    tailed = sweep[sweep.tail_bucket_mb.notna() & sweep.max_ctas.isna()]
    if len(tailed):
        plain = sweep[sweep.tail_bucket_mb.isna() & sweep.max_ctas.isna()]
        pairs = [(t, plain[plain.bucket_size_mb == t.bucket_size_mb].iloc[0]) for _, t in tailed.iterrows()
                 if (plain.bucket_size_mb == t.bucket_size_mb).any()]
        text += (" With a tail bucket of " + ", ".join(f"{m:g} MB" for m in sorted(tailed.tail_bucket_mb.unique()))
                 + ", step and exposed communication per bucket size: "
                 + "; ".join(f"{t.bucket_size_mb:g} MB {p.step_ms:.1f} → {t.step_ms:.1f} ms (sync {p.sync_ms:.1f} → {t.sync_ms:.1f} ms)"
                             for t, p in pairs) + ".")
    capped = sweep[sweep.max_ctas.notna()] if "max_ctas" in sweep else sweep.iloc[:0]
    if len(capped):
        default = sweep[sweep.max_ctas.isna()]
        text += (f" Capping NCCL's thread blocks ({', '.join(str(int(k)) for k in sorted(capped.max_ctas.unique()))}) did "
                 + ("not help" if capped.step_ms.min() >= default.step_ms.min() else "help")
                 + f": the best capped step is {capped.step_ms.min():.1f} ms ({capped.step_ms.idxmin()}), its forward+backward "
                 f"{capped.loc[capped.step_ms.idxmin(), 'fwd_bwd_ms']:.1f} ms, against {default.step_ms.min():.1f} ms uncapped.")
    ctx.md(text)
    ctx.headline("best bucket size", best.bucket_size_mb, unit="MB",
                 note=f"{size}, {world_size} ranks, {backend}" + ("" if best.tail_bucket_mb != best.tail_bucket_mb else f", tail bucket {best.tail_bucket_mb:g} MB") + ("" if best.max_ctas != best.max_ctas or best.max_ctas is None else f", NCCL capped at {int(best.max_ctas)} CTAs"))
    ctx.headline("bucketed (best) / torch DDP step", round(ratio_ddp, 3), unit="×", note=f"{size}, {world_size} ranks, {backend}")
    ctx.headline("bucketed (best) / naive overhead", round(100 * share, 1) if share == share else "n/a", unit="%", note=f"{size}, {world_size} ranks, {backend}")
else:
    ctx.md("Some flavours did not run (see the status column), so there is no comparison.")

# %% [markdown]
# **Expectations, and the mechanisms that can make measurements disagree.** Bucketing should
# combine the two earlier improvements: fewer calls than per-parameter all-reduces and, unlike the
# flat buffer, most of them overlapped with the backward pass; very small buckets degenerate into
# the per-parameter flavour and one huge bucket into flat DDP (its all-reduce can only start after
# the last gradient), so the best size should lie between. What the simple picture leaves out:
# (1) the overlapped all-reduces hide communication only up to the length of the backward pass, so
# where the link is fast relative to compute there is little left to hide; (2) buckets are launched
# in order, and the gradients of the first layers (the token embedding, registered first, hence in
# the *last* bucket) are produced last, so the final bucket is always exposed; (3) bucketing copies
# every gradient into its bucket, which the per-parameter flavour does not (the copy back is gone:
# the buckets' slices are the gradients); (4) NCCL runs collectives one after another on one
# stream, so many small calls queue behind each other; (5) NCCL's kernels use SMs and memory
# bandwidth that the backward kernels would otherwise use. Communication that is expensive relative
# to compute (more ranks or nodes, slower links, a smaller per-rank batch, faster compute) is where
# the textbook picture applies.

# %% [markdown]
# ## (a′) What the stream priority buys
# (a) queued every step on a CUDA stream of higher priority than NCCL's. Here no communication,
# naive, the best bucketed configuration of (a) and torch DDP run again, in one run with the same
# settings, at the default priority, where compute and NCCL's kernels compete for SMs as equals.
# Naive DDP's all-reduces run after the backward pass, beside no compute, so there the priority has
# nothing to arbitrate; it can matter only where communication overlaps the backward pass.

# %%
from dataclasses import replace

if backend != "nccl":
    ctx.not_run("DDP at the default vs the highest compute-stream priority", f"needs CUDA streams and NCCL; this run uses {backend}")
elif len(sweep) == 0 or not needed <= set(ok.index):
    ctx.md("(a) has no best bucketed configuration to compare.")
else:
    best_flavour = flavour_of(sweep.loc[sweep.step_ms.idxmin()])
    at_default, _ = benchmark_ddp(replace(
        config, prioritize_compute=False, flavours=("no-communication", "naive", "bucketed", "torch-ddp"),
        bucket_sizes_mb=(best_flavour.bucket_size_mb,), bucket_max_ctas=(best_flavour.max_ctas,), bucket_tail_mb=(best_flavour.tail_bucket_mb,),
    ))
    priority_effect = stream_priority_effect(df, at_default)
    ctx.save_table(priority_effect, "stream_priority");
    ctx.md(describe_stream_priority_effect(priority_effect))


# %% [markdown]
# ## (b) A model of DDP's overhead and the best bucket size
# Let the gradients total **s** bytes in **n_b** equal buckets; one all-reduce costs a fixed **o**
# seconds plus its bytes over the algorithm bandwidth **w**: o + s/(n_b w). Assume, as the handout
# says, that computing one bucket's gradients takes as long as communicating it, τ = s/(n_b w).
# Bucket k (k = 1…n_b) is ready at kτ. The all-reduces run one after another; bucket 1 ends at
# 2τ + o, and since each next bucket is ready exactly τ later while the stream needs τ + o for
# it, every call's o delays all later ones: bucket k ends at (k+1)τ + k·o. The backward pass ends
# at n_b τ and the last bucket at (n_b+1)τ + n_b o, so the time added after the backward pass is
#
# $$ \mathrm{overhead}(n_b) = \frac{s}{n_b\, w} + n_b\, o . $$
#
# Few buckets leave a large last transfer exposed; many buckets pay many per-call costs. At n_b = 1
# nothing overlaps (s/w + o, flat DDP). Setting the derivative to zero (sympy, below):

# %%
ctx.md(latex_equations())

# %% [markdown]
# The best bucket size b* = √(s w o) grows with the model, the bandwidth and the per-call cost.
# **Fit.** The model is linear in (o, 1/w), so least squares over the measured points
# (overhead = step − no-communication step; n_b = the number of all-reduce calls per step) of the
# overlapping flavours — the bucketed sizes and the per-parameter flavour — gives o and w.

# %%
# NCCL's default thread blocks (a capped run has another bandwidth w) and equal buckets, as the model assumes
points_df = ok[ok.kind.isin(["bucketed", "individual"]) & ok.max_ctas.isna() & ok.tail_bucket_mb.isna()].dropna(subset=["all_reduce_calls", "overhead_ms"])
if len(points_df) >= 2:
    bucketed = points_df[points_df.kind == "bucketed"]  # two points include at least one bucketed flavour
    best = bucketed.loc[bucketed.step_ms.idxmin()]
    gradient_bytes = float(points_df.gradient_bytes.iloc[0])
    fit = fit_overhead(points_df.all_reduce_calls, points_df.overhead_ms / 1e3, gradient_bytes)
    points = {label: (row.all_reduce_calls, row.overhead_ms / 1e3) for label, row in points_df.iterrows()}
    table = points_df[["all_reduce_calls", "overhead_ms"]].assign(model_ms=fit.predict(points_df.all_reduce_calls) * 1e3).reset_index()
    ctx.save_table(table, "overhead_model_fit");
    ctx.save_figure(plot_overhead_fit(fit, points), "overhead_model_fit");
    if fit.per_call_s == 0 and fit.bandwidth_bytes_per_s == float("inf"):
        ctx.md(
            f"Least squares finds neither a positive per-call cost nor a bandwidth term: the measured overheads "
            f"({points_df.overhead_ms.min():.1f} to {points_df.overhead_ms.max():.1f} ms) do not grow with n_b or 1/n_b beyond "
            f"this run's noise, so the model cannot be fitted here."
        )
    else:
        ctx.md(
            f"Fitted on {len(points_df)} points with s = {format_bytes(gradient_bytes)}: per-call cost o = {fit.per_call_s * 1e6:.1f} µs, "
            f"bandwidth w = " + (f"{fit.bandwidth_bytes_per_s / 1e9:.3g} GB/s" if fit.bandwidth_bytes_per_s != float("inf") else "unbounded (no bandwidth term)")
            + f"; R² = {fit.r_squared:.2f} (RMS error {fit.rms_error_s * 1e3:.2f} ms). "
            + (f"The model's optimum is n_b* = {fit.optimal_buckets:.1f} buckets, i.e. b* ≈ {fit.optimal_bucket_bytes / 2**20:.3g} MB, "
               f"against the measured best of {best.bucket_size_mb:g} MB. " if fit.per_call_s > 0 and fit.bandwidth_bytes_per_s != float("inf") else
               "With one coefficient clamped to zero the model has no interior optimum here. ")
            + ("That is a poor fit: step-to-step noise and the costs the model leaves out (the copies into the buckets, communication competing "
               "with the backward pass for compute, in-order launch behind the embedding's late gradient) weigh as much as o and w."
               if fit.r_squared < 0.5 else "")
        )
    ctx.headline("fitted per-call all-reduce cost o", round(fit.per_call_s * 1e6, 1), unit="µs")
else:
    ctx.md("Fewer than two overlapping flavours ran, so there is nothing to fit.")
give(ctx, "ddp_bucketed_benchmarking.b")

# %%
from dataclasses import replace

from cs336_systems.experiments.ddp_flavours import DDPFlavour
from cs336_systems.experiments.ddp_scaling import benchmark_scaling, plot_scaling, scaling_table

per_rank_batch = global_batch_size // world_size
scaled_flavour = flavour_of(sweep.loc[sweep.step_ms.idxmin()]) if len(sweep) else DDPFlavour("bucketed", bucket_sizes_mb[-1])
scaling = benchmark_scaling(config, scaling_world_sizes, per_rank_batch, scaled_flavour.bucket_size_mb, backend=backend,
                            max_ctas=scaled_flavour.max_ctas, tail_bucket_mb=scaled_flavour.tail_bucket_mb)
for n, note in scaling[scaling.status == "not run"].groupby("world_size").note.first().items():
    ctx.not_run(f"{size} DDP at {n} ranks ({backend})", note)
ctx.save_table(scaling[[c for c in ["world_size", "flavour", "status", "global_batch_size", "step_ms", "step_std_ms",
                                    "overhead_ms", "efficiency", "note"] if c in scaling]], "scaling_raw", show=False)
scaled = scaling[scaling.status == "ok"]
if scaled.world_size.nunique() >= 2:
    ctx.md(
        "## (c) Scaling with the number of GPUs\n"
        "Weak scaling: the per-rank batch of (a) stays fixed and the global batch grows with the ranks, so the "
        "no-communication step does the same work per rank at every size and whatever the other flavours add is the "
        "cost of communication at that size. A ring all-reduce moves 2(n−1)/n of the gradient bytes in and out of every "
        "rank (1× at 2 ranks, 1.5× at 4, 1.75× at 8), so the bytes each rank sends grow with n; the overlapping flavours "
        "can hide them as long as the backward pass lasts longer than their communication. Scaling efficiency = "
        "no-communication step / step (1 = perfectly hidden). The bucketed flavour uses the best bucket size of (a)."
    )
if scaled.world_size.nunique() >= 1:
    ctx.save_table(scaling_table(scaling), "scaling", show=scaled.world_size.nunique() >= 2);


# %%
ran = sorted(scaled.world_size.unique())
if len(ran) >= 2:
    ctx.save_figure(plot_scaling(scaling, f"{size}, {per_rank_batch} sequences per rank, {backend}"), "scaling");
    lo, hi = ran[0], ran[-1]
    at = scaled.set_index(["flavour", "world_size"])
    base_lo, base_hi = at.loc[("no-communication", lo)], at.loc[("no-communication", hi)]

    def ring(n):
        return 2 * (n - 1) / n

    parts = []
    for flavour in [f for f in scaled.flavour.unique() if f != "no-communication"]:
        a, b = at.loc[(flavour, lo)], at.loc[(flavour, hi)]
        parts.append(f"{flavour} {a.overhead_ms:.1f} → {b.overhead_ms:.1f} ms of overhead (efficiency {a.efficiency:.2f} → {b.efficiency:.2f})")
    naive_lo, naive_hi = at.loc[("naive", lo)].overhead_ms, at.loc[("naive", hi)].overhead_ms
    ctx.md(
        f"From {lo} to {hi} ranks ({per_rank_batch} sequences each) the no-communication step goes from {base_lo.step_ms:.1f} to "
        f"{base_hi.step_ms:.1f} ms; " + "; ".join(parts) + ". "
        f"The ring's traffic per rank grows {ring(hi) / ring(lo):.2f}× over this range; naive DDP's overhead grew "
        + (f"{naive_hi / naive_lo:.2f}×" if naive_lo > 0 else "from a value within noise")
        + (", more than the traffic alone: per-call latency and contention grow with the ranks as well."
           if naive_lo > 0 and naive_hi / naive_lo > 1.15 * ring(hi) / ring(lo) else
           ", about as the traffic predicts." if naive_lo > 0 and naive_hi / naive_lo > 0.85 * ring(hi) / ring(lo) else
           ", less than the traffic: at this size the per-call costs, not the bytes, dominate.")
        + (f" The no-communication step itself grew {base_hi.step_ms / base_lo.step_ms:.2f}×: these ranks share one machine's "
           f"cores and memory bandwidth, so the efficiencies here mix compute contention with communication."
           if base_hi.step_ms > 1.15 * base_lo.step_ms else "")
    )
    best_flavour = scaled[(scaled.world_size == hi) & (scaled.flavour != "no-communication")].sort_values("step_ms").iloc[0]
    ctx.headline(f"DDP scaling efficiency at {hi} ranks (best flavour)", round(float(best_flavour.efficiency), 3),
                 note=f"{best_flavour.flavour}, {size}, {backend}")

