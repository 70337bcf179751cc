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
# # Problem `distributed_communication_single_node` — all-reduce time and bandwidth
# Spring 2025 handout §2.1. Benchmark one all-reduce (sum) of float32 tensors of 1 MB, 10 MB,
# 100 MB and 1 GB with 2, 4 and 6 processes, for gloo on CPU and NCCL on GPU, and comment on how
# the factors interact. Each rank does 5 warm-up calls, then timed calls each preceded by a barrier
# and followed by a device synchronize; per-rank times are gathered with `all_gather_object`.
# The library code is `cs336_systems.experiments.allreduce_benchmark` (also runnable under
# `torchrun`). One launch per backend starts the largest world size; ranks 0..n−1 then measure
# each smaller n in turn while the others wait, so process start-up is paid once.

# %% tags=["parameters"]
profile = None        # "cpu" | "gpu"; None picks gpu when CUDA is available
backends = None       # None = the profile's default
world_sizes = None    # numbers of processes; None = the default of the profile (cpu: [2, 4], add 6 if you can wait; gpu: [2, 4, 6, 8])
sizes_mb = None       # tensor sizes in MB (10^6 bytes); None = the profile's default
warmup = 5
iters = 10

# %%
from cs336_systems.experiments.answers import give
from cs336_systems.report import setup_notebook

ctx = setup_notebook("12_distributed_communication", profile=profile)
backends = ctx.pick(backends, cpu=["gloo"], gpu=["gloo", "nccl"])
world_sizes = ctx.pick(world_sizes, cpu=[2, 4], gpu=[2, 4, 6, 8])
sizes_mb = ctx.pick(sizes_mb, cpu=[1, 10], gpu=[1, 10, 100, 1000])

# %%
from cs336_systems.experiments.allreduce_benchmark import MB, benchmark_allreduce, describe_allreduce, plot_allreduce

df, not_run = benchmark_allreduce(backends, world_sizes, [int(s * MB) for s in sizes_mb], warmup=warmup, iters=iters)
for part, reason in not_run:
    ctx.not_run(part, reason)
ctx.save_json(df.to_dict(orient="records"), "allreduce_per_rank")
columns = ["backend", "device", "world_size", "size", "mean_ms", "std_ms", "rank_spread_ms", "algbw_gbps", "busbw_gbps"]
ctx.save_table(df[columns], "allreduce");

# %% [markdown]
# `mean_ms ± std_ms` is over all ranks and timed calls; `rank_spread_ms` is the gap between the
# slowest and the fastest rank's mean. algbw = bytes / time; busbw = algbw · 2(n−1)/n is the
# traffic each rank's link carries in a ring all-reduce (reduce-scatter then all-gather, each
# n−1 steps of S/n bytes), the number to compare with a link's bandwidth and across n.

# %%
ctx.save_figure(plot_allreduce(df), "allreduce_time_and_bandwidth");
give(ctx, "distributed_communication_single_node")

# %% [markdown]
# ## What the measurements say

# %%
ctx.md(describe_allreduce(df))
for backend, g in df.groupby("backend"):
    ctx.headline(f"{backend} all-reduce, best bus bandwidth", round(g.busbw_gbps.max(), 3), unit="GB/s",
                 note=f"{g.loc[g.busbw_gbps.idxmax(), 'size']}, {g.loc[g.busbw_gbps.idxmax(), 'world_size']} processes")

# %% [markdown]
# **How the factors interact.** Time is roughly α + S/β: a fixed per-call latency α (process
# synchronization, kernel launch, protocol setup) plus the bytes over the achievable bandwidth β.
# Where α dominates (small tensors), bus bandwidth is low whatever the link; only where S/β
# dominates does it approach what the link sustains. More processes add ring steps (more latency
# terms) and raise each rank's traffic by 2(n−1)/n; gloo's processes also compete for the same
# CPU cores and memory bandwidth, whereas each NCCL rank drives its own GPU and its own links.
