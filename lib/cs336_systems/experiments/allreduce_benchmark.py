"""All-reduce latency and bandwidth on one node: backend x number of processes x tensor size.

Each rank all-reduces (sum) a float32 tensor of S bytes: `warmup` untimed calls, then `iters`
timed ones, each preceded by a barrier (so ranks start together) and followed by a device
synchronize (an NCCL call returns once queued, not once done). Per-rank times are gathered
with all_gather_object. From the mean time t over ranks and iterations:

    algbw = S / t                      bytes of the input per second ("algorithm bandwidth")
    busbw = algbw * 2 (n - 1) / n      bytes per second each rank's link carries

A ring all-reduce sends and receives 2 (n-1)/n * S bytes per rank (reduce-scatter, then
all-gather, each n-1 steps of S/n), so busbw is comparable across n and against the hardware
link bandwidth, as in nccl-tests. Sizes are decimal (1 MB = 10^6 bytes), bandwidths GB/s = 10^9 B/s.

    torchrun --nproc-per-node 4 -m cs336_systems.experiments.allreduce_benchmark --sizes-mb 1 10 100 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import timeit
from collections.abc import Sequence

import pandas as pd
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from cs336_systems.benchmarking.harness import synchronize
from cs336_systems.distributed.launch import DistContext, launch_from_env, spawn

MB = 10**6
BYTES_PER_FLOAT32 = 4


def bus_bandwidth(algbw: float, world_size: int) -> float:
    return algbw * ring_traffic(world_size)


def ring_traffic(world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce, per byte of input: 2 (n - 1) / n."""
    return 2 * (world_size - 1) / world_size


def size_label(size_bytes: int) -> str:
    return f"{size_bytes / 1e9:g} GB" if size_bytes >= 10**9 else f"{size_bytes / MB:g} MB"


def _group_barrier(ctx: DistContext, group: dist.ProcessGroup) -> None:
    if ctx.backend == "nccl":
        dist.barrier(group=group, device_ids=[ctx.local_rank])
    else:
        dist.barrier(group=group)


def time_all_reduce(
    ctx: DistContext, group: dist.ProcessGroup, size_bytes: int, warmup: int, iters: int
) -> list[float]:
    """This rank's seconds per synchronized all-reduce over `group` of `size_bytes` of float32."""
    if size_bytes % BYTES_PER_FLOAT32:
        raise ValueError(f"size {size_bytes} bytes is not a whole number of float32 elements")
    data = torch.rand(size_bytes // BYTES_PER_FLOAT32, device=ctx.device)
    for _ in range(warmup):
        dist.all_reduce(data, group=group)
    synchronize(ctx.device)
    times = []
    for _ in range(iters):
        _group_barrier(ctx, group)
        start = timeit.default_timer()
        dist.all_reduce(data, group=group)
        synchronize(ctx.device)
        times.append(timeit.default_timer() - start)
    return times


def _summarize(ctx: DistContext, world_size: int, size: int, per_rank: list[list[float]], warmup: int) -> dict:
    every = [t for times in per_rank for t in times]
    mean = statistics.fmean(every)
    rank_means = [statistics.fmean(times) for times in per_rank]
    return dict(
        backend=ctx.backend,
        device=ctx.device.type,
        world_size=world_size,
        size_bytes=size,
        size=size_label(size),
        mean_ms=mean * 1e3,
        std_ms=statistics.stdev(every) * 1e3 if len(every) > 1 else 0.0,
        min_ms=min(every) * 1e3,
        max_ms=max(every) * 1e3,
        rank_spread_ms=(max(rank_means) - min(rank_means)) * 1e3,
        algbw_gbps=size / mean / 1e9,
        busbw_gbps=bus_bandwidth(size / mean, world_size) / 1e9,
        warmup=warmup,
        iters=len(per_rank[0]),
        per_rank_ms=[[t * 1e3 for t in times] for times in per_rank],
    )


def _allreduce_worker(
    ctx: DistContext, world_sizes: Sequence[int], sizes_bytes: Sequence[int], warmup: int, iters: int
) -> list[dict]:
    """Ranks 0..n-1 of one launch measure each world size n in turn (one process start-up for all
    of them); the other ranks wait at a barrier meanwhile."""
    if ctx.device.type == "cpu":
        torch.set_num_threads(1)
    rows = []
    for n in world_sizes:
        group = dist.new_group(list(range(n)))
        if ctx.rank < n:
            for size in sizes_bytes:
                per_rank: list = [None] * n
                dist.all_gather_object(per_rank, time_all_reduce(ctx, group, size, warmup, iters), group=group)
                rows.append(_summarize(ctx, n, size, per_rank, warmup))
        ctx.barrier()
    return rows


def max_world_size(backend: str) -> int | None:
    """How many ranks this machine can run for `backend` (None: no limit but CPU time)."""
    if backend == "nccl":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return None


def benchmark_allreduce(
    backends: Sequence[str], world_sizes: Sequence[int], sizes_bytes: Sequence[int], warmup: int = 5, iters: int = 10
) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """One launch per backend. Returns the table and the (setting, reason) pairs not run."""
    if not world_sizes or min(world_sizes) < 1:
        raise ValueError(f"world sizes must be positive numbers of processes, got {list(world_sizes)}")
    bad = [s for s in sizes_bytes if s <= 0 or s % BYTES_PER_FLOAT32]
    if bad:
        raise ValueError(f"sizes must be positive whole numbers of float32 elements (multiples of 4 bytes), got {bad}")
    rows, not_run = [], []
    for backend in tqdm(backends, desc="all-reduce", leave=False):
        limit = max_world_size(backend)
        feasible = [n for n in world_sizes if limit is None or n <= limit]
        not_run += [
            (f"{backend} with {n} processes", f"needs {n} GPUs, this machine has {limit}")
            for n in world_sizes
            if n not in feasible
        ]
        if feasible:
            rows += spawn(
                _allreduce_worker,
                max(feasible),
                args=(sorted(feasible), list(sizes_bytes), warmup, iters),
                backend=backend,
                timeout_s=1800,
            )[0]
    return pd.DataFrame(rows), not_run


def plot_allreduce(df: pd.DataFrame):
    """Time (mean ± std) and bus bandwidth against size, one line per (backend, world size)."""
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(11, 4))
    for (backend, n), g in df.sort_values("size_bytes").groupby(["backend", "world_size"]):
        style = dict(marker="o", linestyle="-" if backend == "nccl" else "--", label=f"{backend}, {n} processes")
        ax_t.errorbar(g.size_bytes / MB, g.mean_ms, yerr=g.std_ms, capsize=3, **style)
        ax_bw.plot(g.size_bytes / MB, g.busbw_gbps, **style)
    for ax, label in ((ax_t, "time per all-reduce (ms)"), (ax_bw, "bus bandwidth (GB/s)")):
        ax.set(xscale="log", yscale="log", xlabel="tensor size (MB of float32)", ylabel=label)
    ax_t.set_title("all-reduce time (mean ± std over ranks and iterations)")
    ax_bw.set_title("bus bandwidth = algbw · 2(n−1)/n")
    ax_bw.legend(fontsize=8)
    fig.tight_layout()
    return fig


def describe_allreduce(df: pd.DataFrame) -> str:
    """Commentary computed from the table: best bandwidth per backend, effect of n and of size."""
    lines = []
    for backend, g in df.groupby("backend"):
        best = g.loc[g.busbw_gbps.idxmax()]
        small = g[g.size_bytes == g.size_bytes.min()]
        lines.append(
            f"- **{backend}** ({best.device}) reaches its highest bus bandwidth, {best.busbw_gbps:.2f} GB/s, at "
            f"{best['size']} with {best.world_size} processes; at the smallest size ({small['size'].iloc[0]}) it "
            f"manages only {small.busbw_gbps.min():.2f}–{small.busbw_gbps.max():.2f} GB/s, because a fixed per-call "
            f"latency ({small.mean_ms.min():.3f} ms at least) dominates small messages."
        )
        largest = g[g.size_bytes == g.size_bytes.max()].sort_values("world_size")
        if len(largest) > 1:
            lo, hi = largest.iloc[0], largest.iloc[-1]
            ratio = hi.mean_ms / lo.mean_ms
            ring = ring_traffic(hi.world_size) / ring_traffic(lo.world_size)
            verdict = "close to" if abs(ratio / ring - 1) < 0.25 else "above" if ratio > ring else "below"
            why = {
                "close to": "so the ring's bandwidth cost explains the change",
                "above": (
                    "so the ranks slow each other beyond the extra traffic "
                    "(shared links, memory bandwidth or CPU cores)"
                ),
                "below": (
                    "so something other than bandwidth sets the time here "
                    "(fixed per-call latency, or noise from sharing the machine)"
                ),
            }[verdict]
            lines.append(
                f"- At {lo['size']}, going from {lo.world_size} to {hi.world_size} {backend} processes "
                f"changes the time from {lo.mean_ms:.2f} ms to {hi.mean_ms:.2f} ms ({ratio:.2f}×); "
                f"a ring all-reduce's traffic per rank grows {ring:.2f}×, "
                f"and the measured factor is {verdict} that, {why}."
            )
    shared = set(df[df.backend == "gloo"].size_bytes) & set(df[df.backend == "nccl"].size_bytes)
    if shared:
        size = max(shared)
        both = df[df.size_bytes == size].groupby("backend").busbw_gbps.max()
        lines.append(
            f"- At {size_label(size)}, NCCL on GPUs sustains {both['nccl'] / both['gloo']:.1f}× the bus bandwidth of "
            f"gloo on CPUs ({both['nccl']:.1f} vs {both['gloo']:.2f} GB/s)."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="all-reduce benchmark under torchrun")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument(
        "--world-sizes", type=int, nargs="+", help="subsets of the launched ranks to measure (default: all)"
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", default="allreduce.csv")
    a = parser.parse_args()
    sizes = [int(s * MB) for s in a.sizes_mb]
    world_sizes = a.world_sizes or [int(os.environ.get("WORLD_SIZE", "1"))]
    rows = launch_from_env(_allreduce_worker, (sorted(world_sizes), sizes, a.warmup, a.iters))
    if int(os.environ.get("RANK", "0")) == 0:
        df = pd.DataFrame(rows)
        df.to_csv(a.out, index=False)
        print(df[["backend", "world_size", "size", "mean_ms", "algbw_gbps", "busbw_gbps"]].to_string(index=False))


if __name__ == "__main__":
    main()
