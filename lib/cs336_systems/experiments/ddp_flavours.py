"""The data-parallel flavours compared in the notebooks, by name, and how to wrap a module in one.

no-communication  the same step with the gradient all-reduce skipped: the overhead baseline
naive             one blocking all-reduce per parameter after backward   (ddp_naive.py)
flat              one blocking all-reduce of all gradients concatenated (ddp_flat.py)
individual        one async all-reduce per parameter, launched by hooks  (ddp_individual.py)
bucketed          one async all-reduce per bucket of `bucket_size_mb`    (ddp_bucketed.py),
                  optionally with a small final bucket (`tail_bucket_mb`) and on NCCL
                  kernels of at most `max_ctas` thread blocks
torch-ddp         torch.nn.parallel.DistributedDataParallel, default settings (25 MiB buckets)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from cs336_systems.distributed.ddp_base import DataParallel
from cs336_systems.distributed.ddp_bucketed import DDPBucketed
from cs336_systems.distributed.ddp_flat import DDPFlat
from cs336_systems.distributed.ddp_individual import DDPIndividualParameters
from cs336_systems.distributed.ddp_naive import DDPNaive

FLAVOURS = ("no-communication", "naive", "flat", "individual", "bucketed", "torch-ddp")


class NoCommunication(DataParallel):
    """Same initial broadcast, no gradient averaging: what a step costs without communication."""

    def finish_gradient_synchronization(self) -> None:
        pass


class TorchDDP(DistributedDataParallel):
    """torch DDP averages inside `backward()` (its reducer waits in an autograd callback)."""

    def finish_gradient_synchronization(self) -> None:
        pass


@dataclass(frozen=True)
class DDPFlavour:
    name: str
    bucket_size_mb: float | None = None  # bucketed only; None = one bucket
    max_ctas: int | None = None  # bucketed only; None = NCCL's default number of thread blocks
    tail_bucket_mb: float | None = None  # bucketed only; None = the final bucket is what the packing leaves

    def __post_init__(self):
        if self.name not in FLAVOURS:
            raise ValueError(f"unknown DDP flavour {self.name!r}; choose one of {', '.join(FLAVOURS)}")
        for option in ("bucket_size_mb", "max_ctas", "tail_bucket_mb"):
            if getattr(self, option) is not None and self.name != "bucketed":
                raise ValueError(f"{option} only applies to the bucketed flavour, not {self.name!r}")

    @property
    def label(self) -> str:
        if self.name != "bucketed":
            return self.name
        label = "bucketed (one bucket)" if self.bucket_size_mb is None else f"bucketed {self.bucket_size_mb:g} MB"
        if self.tail_bucket_mb is not None:
            label += f", tail {self.tail_bucket_mb:g} MB"
        return label if self.max_ctas is None else f"{label}, {self.max_ctas} CTAs"

    def wrap(self, module: nn.Module) -> nn.Module:
        """The module inside this flavour's wrapper (rank 0's state broadcast to all ranks)."""
        if self.name == "torch-ddp":
            device = next(module.parameters()).device
            return TorchDDP(module, device_ids=[device.index] if device.type == "cuda" else None)
        if self.name == "bucketed":
            return DDPBucketed(module, self.bucket_size_mb, self.max_ctas, self.tail_bucket_mb)
        wrappers = {
            "no-communication": NoCommunication,
            "naive": DDPNaive,
            "flat": DDPFlat,
            "individual": DDPIndividualParameters,
        }
        return wrappers[self.name](module)


def flavour_of(row) -> DDPFlavour:
    """The flavour a row of a benchmark table (`kind` and option columns) was measured with;
    empty (NaN) option cells read as None."""

    def option(name: str):
        value = row.get(name)
        return None if value is None or value != value else value

    ctas = option("max_ctas")
    return DDPFlavour(
        row["kind"], option("bucket_size_mb"), None if ctas is None else int(ctas), option("tail_bucket_mb")
    )


def expand_flavours(
    names: Iterable[str],
    bucket_sizes_mb: Iterable[float | None] = (None,),
    max_ctas: Iterable[int | None] = (None,),
    tail_bucket_mb: Iterable[float | None] = (None,),
) -> list[DDPFlavour]:
    """One DDPFlavour per name, and one per (bucket size, tail bucket, CTA limit) for "bucketed"."""
    out = []
    for name in names:
        if name == "bucketed":
            out += [
                DDPFlavour(name, size, ctas, tail)
                for ctas in max_ctas
                for tail in tail_bucket_mb
                for size in bucket_sizes_mb
            ]
        else:
            out.append(DDPFlavour(name))
    return out
