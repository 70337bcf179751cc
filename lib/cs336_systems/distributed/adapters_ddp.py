"""The DDP functions of the CS336 test harness (tests/adapters.py of the course), with its names.

Spring 2025 names the per-parameter overlapping DDP `get_ddp_individual_parameters`; spring 2026
names the same container `get_ddp` (each parameter's gradient all-reduced as soon as it is ready
in the backward). Both suites' names are here."""

from __future__ import annotations

import torch

from cs336_systems.distributed.ddp_bucketed import DDPBucketed
from cs336_systems.distributed.ddp_individual import DDPIndividualParameters


def get_ddp_individual_parameters(module: torch.nn.Module) -> DDPIndividualParameters:
    return DDPIndividualParameters(module)


def ddp_individual_parameters_on_after_backward(
    ddp_model: DDPIndividualParameters, optimizer: torch.optim.Optimizer
) -> None:
    ddp_model.finish_gradient_synchronization()


def get_ddp(module: torch.nn.Module) -> DDPIndividualParameters:
    """The spring-2026 suite's name for `get_ddp_individual_parameters`."""
    return DDPIndividualParameters(module)


def ddp_on_after_backward(ddp_model: DDPIndividualParameters, optimizer: torch.optim.Optimizer) -> None:
    """After the backward, before the optimizer step: wait for every parameter's all-reduce."""
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module: torch.nn.Module, bucket_size_mb: float | None) -> DDPBucketed:
    return DDPBucketed(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model: DDPBucketed, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model: DDPBucketed, optimizer: torch.optim.Optimizer) -> None:
    """Nothing to do: finish_gradient_synchronization() already reset the per-step state."""
