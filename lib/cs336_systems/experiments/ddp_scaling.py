"""DDP at several world sizes with the per-rank batch held fixed (weak scaling).

Each world size n is one `benchmark_ddp` run of the same model, per-rank batch and flavours
(global batch = n x per-rank batch). The no-communication step is then the same work per rank
at every n, so what the other flavours add on top of it is what communication costs at that n.
A ring all-reduce sends and receives 2(n-1)/n of the gradient bytes per rank, which grows from
1x at n = 2 to 1.75x at n = 8 (fixed bandwidth per link), so naive DDP's overhead should grow
with n and an overlapping flavour's should stay hidden as long as the backward pass outlasts it.

    scaling efficiency(n) = step(no-communication, n) / step(flavour, n)

is the fraction of perfect linear speed-up the flavour keeps (1 = communication fully hidden).
World sizes that need more GPUs than the machine has become rows with status "not run".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pandas as pd
import torch

from cs336_systems.distributed.launch import resolve_backend
from cs336_systems.experiments.ddp_benchmark import DDPBenchmarkConfig, benchmark_ddp

SCALING_FLAVOURS = ("no-communication", "naive", "bucketed", "torch-ddp")


def benchmark_scaling(
    base: DDPBenchmarkConfig,
    world_sizes: Sequence[int],
    per_rank_batch: int,
    bucket_size_mb: float | None,
    flavours: Sequence[str] = SCALING_FLAVOURS,
    backend: str | None = None,
    max_ctas: int | None = None,
    tail_bucket_mb: float | None = None,
) -> pd.DataFrame:
    """One row per (world size, flavour), the `benchmark_ddp` columns plus `efficiency`; world sizes
    the machine cannot run are rows with status "not run" and the reason in `note`. The bucketed
    flavour uses `bucket_size_mb`, `tail_bucket_mb` and `max_ctas` (NCCL thread-block cap, None for
    NCCL's default)."""
    if per_rank_batch < 1:
        raise ValueError(f"per-rank batch must be at least 1, got {per_rank_batch}")
    if any(n < 2 for n in world_sizes):
        raise ValueError(f"world sizes must be at least 2 (data parallelism needs peers), got {list(world_sizes)}")
    backend = backend or base.backend or "auto"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # One rank per GPU for NCCL; and on a GPU machine "auto" must not fall back to CPU ranks for large n.
    limit = gpus if backend == "nccl" or (backend == "auto" and gpus) else None
    frames = []
    for n in sorted(set(world_sizes)):
        if limit is not None and n > limit:
            frames.append(
                pd.DataFrame(
                    [
                        dict(
                            world_size=n, flavour=f, status="not run", note=f"needs {n} GPUs, this machine has {limit}"
                        )
                        for f in flavours
                    ]
                )
            )
            continue
        config = replace(
            base,
            world_size=n,
            global_batch_size=per_rank_batch * n,
            flavours=tuple(flavours),
            bucket_sizes_mb=(bucket_size_mb,),
            bucket_max_ctas=(max_ctas,),
            bucket_tail_mb=(tail_bucket_mb,),
            backend=resolve_backend(backend, n),
            profile=(),
        )
        df, _ = benchmark_ddp(config)
        frames.append(df.assign(note=""))
    out = pd.concat(frames, ignore_index=True)
    if "step_ms" not in out:  # nothing ran
        return out.assign(step_ms=float("nan"), overhead_ms=float("nan"), efficiency=float("nan"))
    base_step = out[(out.flavour == "no-communication") & (out.status == "ok")].set_index("world_size").step_ms
    out["efficiency"] = out.world_size.map(base_step) / out.step_ms
    return out


def scaling_table(df: pd.DataFrame) -> pd.DataFrame:
    """World size x flavour: step ms, overhead ms and efficiency side by side (runs that happened)."""
    ok = df[df.status == "ok"]
    wide = ok.pivot_table(
        index="world_size", columns="flavour", values=["step_ms", "overhead_ms", "efficiency"], sort=False
    )
    wide.columns = [
        f"{flavour} {value.removesuffix('_ms')}{' (ms)' if value.endswith('_ms') else ''}"
        for value, flavour in wide.columns
    ]
    order = [c for f in ok.flavour.unique() for c in wide.columns if c.startswith(f + " ")]
    return wide[order].reset_index()


def plot_scaling(df: pd.DataFrame, title: str = ""):
    """Left: step time per flavour against world size; right: scaling efficiency."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    ok = df[df.status == "ok"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    sns.lineplot(data=ok, x="world_size", y="step_ms", hue="flavour", marker="o", ax=left)
    left.set(
        xlabel="ranks (GPUs)", ylabel="time per training step (ms)", xticks=sorted(ok.world_size.unique()), title=title
    )
    sns.lineplot(
        data=ok[ok.flavour != "no-communication"], x="world_size", y="efficiency", hue="flavour", marker="o", ax=right
    )
    right.axhline(1.0, color="grey", lw=1, ls="--")
    right.set(
        xlabel="ranks (GPUs)",
        ylabel="no-communication step / step",
        xticks=sorted(ok.world_size.unique()),
        title="scaling efficiency (1 = communication hidden)",
    )
    return fig
