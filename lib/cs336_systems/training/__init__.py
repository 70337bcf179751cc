"""A whole training step of an unchanged language model, built from the library's fast parts.

    from cs336_systems.training import StepConfig, build_train_step

    step = build_train_step(model, StepConfig(lr=3e-4, state_dtype=torch.bfloat16, compile_blocks=True))
    loss = step.step(x, y)

`build_train_step(model, StepConfig(...))` (this library's `TransformerLM` or any model of its structure, the
course's `BasicsTransformerLM` included) returns a `TrainStep` whose `step(x, y) -> loss` runs zero_grad,
the model's own modules in its order (each block plain or under activation checkpointing, per a memory
plan), the fused LM head + cross-entropy (never the [N, V] logits), backward, and one `FusedAdamW` step;
`step.plans` holds the `RecomputePlan` of each input shape. Under a process group of several ranks the step
is data parallel. The modules, one concept each:

- `config`: `StepConfig`, and `torch_native_config`, the PyTorch baseline's choice of it;
- `model_structure`: what the step reads from a model, by name and shape (`model_parts`), and how it runs the
  model's modules in order (`final_hidden_states`);
- `memory_plan`: the memory model and the recompute plan (`plan_recompute`, `fixed_memory_bytes`,
  `measure_block_memory`, the budget under a per-process memory cap);
- `parallelize`: everything the step changes on the model (sharding, compilation, recompute, kept attention);
- `kept_attention`: selective recompute, a recomputed block's attention output kept from its forward;
- `step`: `TrainStep`, `build_train_step`, `torch_native_step`;
- `leaderboard_8b`: times the step on the spring-2026 leaderboard's 8B configuration, on one GPU or under torchrun.
"""

from cs336_systems.training.config import StepConfig
from cs336_systems.training.memory_plan import PlanDoesNotFit, RecomputePlan
from cs336_systems.training.step import build_train_step

__all__ = ["PlanDoesNotFit", "RecomputePlan", "StepConfig", "build_train_step"]
