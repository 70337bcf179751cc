"""The CS336 test-harness adapters, with the course's names (spring 2025 and spring 2026 suites), so
the course's own test suite can be pointed at this library: its `tests/adapters.py` becomes the one
line `from cs336_systems.adapters import *` (docs/library.md, "The course's test suites")."""

from __future__ import annotations

from typing import Any

import torch


def get_flashattention_autograd_function_pytorch() -> type[torch.autograd.Function]:
    from cs336_systems.attention.pytorch import FlashAttentionPytorch

    return FlashAttentionPytorch


def get_flashattention_autograd_function_triton() -> type[torch.autograd.Function]:
    from cs336_systems.attention.api import FlashAttentionTriton

    return FlashAttentionTriton


def __getattr__(name: str) -> Any:
    # The distributed adapters live beside their implementations; loaded on first use.
    from cs336_systems.distributed import adapters_ddp, adapters_sharding

    for module in (adapters_ddp, adapters_sharding):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module 'cs336_systems.adapters' has no attribute {name!r}")


__all__ = [
    "get_flashattention_autograd_function_pytorch",
    "get_flashattention_autograd_function_triton",
    "get_ddp",
    "ddp_on_after_backward",
    "get_ddp_individual_parameters",
    "ddp_individual_parameters_on_after_backward",
    "get_ddp_bucketed",
    "ddp_bucketed_on_after_backward",
    "ddp_bucketed_on_train_batch_start",
    "get_sharded_optimizer",
    "get_fsdp",
    "fsdp_on_after_backward",
    "fsdp_gather_full_params",
]
