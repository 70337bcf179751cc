"""The DDP functions of the CS336 test harness (tests/adapters.py of the course), with its names."""

from __future__ import annotations

import torch

from cs336_systems.distributed.ddp_bucketed import DDPBucketed
from cs336_systems.distributed.ddp_individual import DDPIndividualParameters


def get_ddp_individual_parameters(module: torch.nn.Module) -> DDPIndividualParameters:
    return DDPIndividualParameters(module)


def ddp_individual_parameters_on_after_backward(ddp_model: DDPIndividualParameters, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module: torch.nn.Module, bucket_size_mb: float | None) -> DDPBucketed:
    return DDPBucketed(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model: DDPBucketed, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model: DDPBucketed, optimizer: torch.optim.Optimizer) -> None:
    """Nothing to do: finish_gradient_synchronization() already reset the per-step state."""
