"""What the training step does besides the model (`StepConfig`), and the torch-native baseline's choice of it.

`StepConfig` names every choice `build_train_step` makes: AdamW's hyperparameters and state dtype, the
recompute policy and its memory budget (`cs336_systems.training.memory_plan`), torch.compile of the blocks
and the compiled blocks' partitioner budget (`cs336_systems.training.parallelize`), the loss and the
optimizer (ours, or the PyTorch baseline's parts, so that one change at a time can be measured), where the
optimizer's states live between steps, and the data-parallel bucket size. Each field is checked when the
config is made (TypeError or ValueError naming it).
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

RECOMPUTE_MODES = ("plan", "all", "none")
LOSSES = ("fused", "cross_entropy")  # linear_cross_entropy, or the LM head then F.cross_entropy on full logits
OPTIMIZERS = ("fused_adamw", "torch_adamw")  # ours, or torch.optim.AdamW (fused on CUDA, foreach on CPU)


@dataclass
class StepConfig:
    """What the step does besides the model: AdamW's hyperparameters, its state dtype, the recompute
    policy ("plan" | "all" | "none") and the budget of "plan" (bytes; None: `memory_plan.default_budget_bytes`),
    torch.compile of the blocks, the loss's token rows per chunk (None: `default_chunk_tokens(V)`),
    whether step() checks the token ids' range (one host sync), and which loss and optimizer run
    (`LOSSES`, `OPTIMIZERS`: the defaults are ours; the others are the torch-native baseline's parts, so
    that one change at a time can be measured). torch.optim.AdamW keeps its states in the parameters'
    dtype, so `state_dtype` applies to ours only."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    state_dtype: torch.dtype = torch.float32
    recompute: str = "plan"
    memory_budget_bytes: int | None = None
    compile_blocks: bool = False
    loss_chunk_tokens: int | None = None
    check_token_ids: bool = True
    loss: str = "fused"
    optimizer: str = "fused_adamw"
    bucket_size_mb: float = 1000.0  # data parallel only: DDPShardedGradients' bucket size
    keep_attention: bool = True  # recomputed blocks keep attention's O and L (only with our FlashAttention)
    activation_memory_budget: float | None = None  # compiled blocks' partitioner budget in (0, 1]; None: torch's
    # Data parallel only: the parameter exchange after the update is left in flight and completes in the next
    # step's forward, each block waiting for its own parameters (`TrainStep.wait_for_exchange` before reading
    # the model's parameters between steps); False: every step ends with it complete.
    exchange_in_forward: bool = False
    # The optimizer's states in pinned host memory through the forward (`optim.StateOffload`): sent there as each
    # forward starts, brought back during the backward once its freed activations leave room
    # (`RecomputePlan.fetch_states_at`); the plan gives their device memory to the forward. CUDA states only:
    # on CPU nothing moves.
    offload_optimizer_states: bool = False

    @property
    def bucket_bytes(self) -> int:
        """`bucket_size_mb` in bytes (MiB, as DDP's `bucket_cap_mb`)."""
        return int(self.bucket_size_mb * 2**20)

    def partitioner_budget(self):
        """A context in which compiled blocks are partitioned under `activation_memory_budget`, the attention
        forward always saved (`training.partitioner`): the step holds it while its blocks compile (at their
        first call, the plan's measurement of block 0 included) and run, since the setting shapes a block when
        it compiles; a no-op without a budget."""
        if self.activation_memory_budget is None:
            return contextlib.nullcontext()
        from cs336_systems.training.partitioner import partitioned_under

        return partitioned_under(self.activation_memory_budget)

    def __post_init__(self):
        for name in ("lr", "eps", "weight_decay", "bucket_size_mb"):
            if not _is_real(getattr(self, name)):
                raise TypeError(f"StepConfig.{name} must be a real number, got {type(getattr(self, name)).__name__}")
        if not (isinstance(self.betas, (tuple, list)) and len(self.betas) == 2 and all(map(_is_real, self.betas))):
            raise TypeError(f"StepConfig.betas must be a pair of floats, got {self.betas!r}")
        for name in (
            "compile_blocks",
            "check_token_ids",
            "keep_attention",
            "exchange_in_forward",
            "offload_optimizer_states",
        ):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"StepConfig.{name} must be a bool, got {type(getattr(self, name)).__name__}")
        for name in ("memory_budget_bytes", "loss_chunk_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool)):
                raise TypeError(f"StepConfig.{name} must be an int or None, got {type(value).__name__}")
        if self.activation_memory_budget is not None and not _is_real(self.activation_memory_budget):
            raise TypeError(
                f"StepConfig.activation_memory_budget must be a real number or None, "
                f"got {type(self.activation_memory_budget).__name__}"
            )
        for name in ("lr", "eps", "weight_decay"):
            if not getattr(self, name) >= 0.0:  # NaN fails too
                raise ValueError(f"StepConfig.{name} must be non-negative, got {getattr(self, name)}")
        for i, beta in enumerate(self.betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"StepConfig.betas[{i}] must be in [0, 1), got {beta}")
        if not self.bucket_size_mb > 0:
            raise ValueError(f"StepConfig.bucket_size_mb must be positive, got {self.bucket_size_mb}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"StepConfig.recompute must be one of {RECOMPUTE_MODES}, got {self.recompute!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"StepConfig.loss must be one of {LOSSES}, got {self.loss!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"StepConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.state_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"StepConfig.state_dtype must be torch.float32 or torch.bfloat16, got {self.state_dtype}")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes <= 0:
            raise ValueError(f"StepConfig.memory_budget_bytes must be positive, got {self.memory_budget_bytes}")
        if self.activation_memory_budget is not None:
            if not 0 < self.activation_memory_budget <= 1:
                raise ValueError(
                    f"StepConfig.activation_memory_budget must be in (0, 1], got {self.activation_memory_budget}"
                )
            if not self.compile_blocks:
                raise ValueError(
                    "StepConfig.activation_memory_budget applies to compiled blocks: set compile_blocks=True"
                )
        if self.loss_chunk_tokens is not None and self.loss_chunk_tokens < 1:
            raise ValueError(f"StepConfig.loss_chunk_tokens must be positive, got {self.loss_chunk_tokens}")


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def torch_native_config(
    lr: float = 1e-3,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    compile_blocks: bool = False,
) -> StepConfig:
    """The PyTorch baseline's step: every block checkpointed, the LM head then F.cross_entropy on the full
    logits, torch.optim.AdamW (fused on CUDA, foreach on CPU); with `compile_blocks`, each block compiled.
    The attention is the model's own: build the model with attention="sdpa" for the baseline."""
    return StepConfig(
        lr=lr,
        betas=tuple(betas),
        eps=eps,
        weight_decay=weight_decay,
        recompute="all",
        loss="cross_entropy",
        optimizer="torch_adamw",
        compile_blocks=compile_blocks,
        keep_attention=False,
    )
