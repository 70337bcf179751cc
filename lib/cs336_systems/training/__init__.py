"""A whole training step of the unchanged `TransformerLM`, built from the library's fast parts.

`build_train_step(model, StepConfig(...))` (this library's `TransformerLM` or any model of its structure, the
course's `BasicsTransformerLM` included: `model_parts`) returns a `TrainStep` whose `step(x, y) -> loss` runs
zero_grad, the model's own modules in its order (each block plain or under activation checkpointing,
per a memory plan), the fused LM head + cross-entropy (`linear_cross_entropy`, never the [N, V]
logits), backward, and one `FusedAdamW` step. `torch_native_step` is the PyTorch baseline it is
compared with (SDPA, every block checkpointed, full logits, torch.optim.AdamW): the same `TrainStep`
with the baseline's parts chosen in its `StepConfig` (`torch_native_config`).
Under a process group of several ranks the step is data parallel (`TrainStep`'s docstring).
`leaderboard_8b` times it on the spring-2026 leaderboard's 8B configuration, on one GPU or under torchrun.
"""

from cs336_systems.training.train_step import (
    MemoryTerms,
    ModelParts,
    RecomputePlan,
    StepConfig,
    TrainStep,
    build_train_step,
    fixed_memory_bytes,
    measure_block_activation_bytes,
    measure_block_memory,
    model_parts,
    plan_recompute,
    process_memory_cap_bytes,
    recompute_cost,
    torch_native_config,
    torch_native_step,
)

__all__ = [
    "MemoryTerms",
    "ModelParts",
    "RecomputePlan",
    "StepConfig",
    "TrainStep",
    "build_train_step",
    "fixed_memory_bytes",
    "measure_block_activation_bytes",
    "measure_block_memory",
    "model_parts",
    "plan_recompute",
    "process_memory_cap_bytes",
    "recompute_cost",
    "torch_native_config",
    "torch_native_step",
]
