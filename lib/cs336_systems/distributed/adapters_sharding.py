"""The CS336 test-harness adapters for optimizer state sharding and FSDP, with the course's names."""

from __future__ import annotations

from typing import Any

import torch

from cs336_systems.distributed.fsdp import FSDP
from cs336_systems.distributed.sharded_optimizer import ShardedOptimizer


def get_sharded_optimizer(params, optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any) -> torch.optim.Optimizer:
    return ShardedOptimizer(params, optimizer_cls, **kwargs)


def get_fsdp(module: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> FSDP:
    return FSDP(module, compute_dtype=compute_dtype)


def fsdp_on_after_backward(fsdp_model: FSDP, optimizer: torch.optim.Optimizer) -> None:
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model: FSDP) -> dict[str, torch.Tensor]:
    return fsdp_model.gather_full_params()
