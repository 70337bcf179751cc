"""Everything the training step changes on a model, in one place (the role of torchtitan's `parallelize_llama`).

The model's class stays plain; what the step applies to its instance is done here and nowhere else:

1. sharding, under a process group of more than one rank: rank 0's weights broadcast, each rank owning one
   contiguous run of about 1/N of the parameters (`assign_contiguous`), their gradients averaged onto the
   owners by `DDPShardedGradients`' bucketed reduces, launched from gradient hooks as the backward makes
   them (ZeRO stage 2; the step's optimizer keeps the owners' states, `ShardedOptimizer`);
2. compile (`StepConfig.compile_blocks`, off by default: under the Triton interpreter nothing compiles): each
   block's forward compiled in place (`block.compile()`: the module and its parameters' names unchanged).
   With `StepConfig.activation_memory_budget` the compiled blocks' partitioner saves less and recomputes
   more inside each block's backward (`torch._functorch.config.activation_memory_budget`, a fraction between
   recomputing everything, 0, and saving everything the backward reads, 1); smaller blocks let the plan keep
   more of them. The step holds it while the blocks compile and run (`StepConfig.partitioner_budget`); it
   shapes a block when it compiles, so blocks compiled earlier under another budget keep their partition
   until `torch._dynamo.reset()` (the optimisation record does that between rows);
3. recompute, per input shape's plan (`memory_plan.make_plan`): `Parallelized.block_runner(plan)` runs each
   block plainly or under `torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)` (keeps only its
   input, recomputes its body before its backward), handed to the model's `final_hidden_states`;
4. selective recompute (`Parallelized.use_plan`): where a plan keeps attention outputs, each recomputed
   block's attention function becomes a `KeptAttentionOutput` (kept_attention.py), which keeps O and L from
   the block's forward for its recompute; only where every block runs our FlashAttention through a pluggable
   `attn.attention` (`attention_keepable`). A block whose attention is its own code (the course's
   module-level function) keeps it: swapping that function would change every model of its module, and
   whether its mask is causal can only be known by reading the tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from cs336_systems.model import BlockRunner
from cs336_systems.training.config import StepConfig
from cs336_systems.training.kept_attention import KeptAttentionOutput
from cs336_systems.training.memory_plan import RecomputePlan
from cs336_systems.training.model_structure import ModelParts, attention_of

if TYPE_CHECKING:
    from cs336_systems.distributed import DDPShardedGradients


@dataclass
class Parallelized:
    """What `parallelize` applied to a model, and how its blocks run under a recompute plan. `owners` maps
    each parameter to the rank that keeps its gradient and optimizer states (None on one rank); `keepers`
    maps a layer index to the `KeptAttentionOutput` put in place of that layer's attention function."""

    parts: ModelParts
    owners: dict[nn.Parameter, int] | None = None
    ddp: DDPShardedGradients | None = None
    keepers: dict[int, KeptAttentionOutput] = field(default_factory=dict)

    def use_plan(self, plan: RecomputePlan) -> None:
        """Make the model ready to run `plan`: where it keeps attention outputs, each recomputed block's
        attention function becomes a `KeptAttentionOutput` (once; a keeper that is not armed is the plain
        attention, so blocks of another shape's plan run unchanged)."""
        if not plan.keep_attention:
            return
        for i, recompute in enumerate(plan.recompute):
            attn = self.parts.layers[i].attn
            if recompute and i not in self.keepers:
                self.keepers[i] = attn.attention = KeptAttentionOutput(attn.attention)

    def block_runner(self, plan: RecomputePlan, before_block: Callable[[int], None] | None = None) -> BlockRunner:
        """`run_block(i, block, h)` for the model's `final_hidden_states`: block i plainly where the plan keeps
        its activations, else under non-reentrant checkpointing (its keeper armed just before, where the plan
        keeps attention outputs); `before_block(i)`, where given, first (outside any compiled region)."""
        keepers = self.keepers

        def run_block(i: int, block: nn.Module, h: torch.Tensor) -> torch.Tensor:
            if before_block is not None:
                before_block(i)
            if not plan.recompute[i]:
                return block(h)
            if plan.keep_attention:
                keepers[i].arm()
            return checkpoint(block, h, use_reentrant=False)

        return run_block

    def release(self) -> None:
        """Drop whatever the keepers hold: each recompute took its block's kept output, and a step that failed
        midway leaves none behind."""
        for keeper in self.keepers.values():
            keeper.release()


def parallelize(model: nn.Module, parts: ModelParts, config: StepConfig, world_size: int = 1) -> Parallelized:
    """Apply sharding (world_size > 1) and compilation (`config.compile_blocks`) to `model` (module docstring);
    recompute and kept attention follow each plan (`Parallelized.use_plan`, `Parallelized.block_runner`)."""
    applied = Parallelized(parts)
    if world_size > 1:
        from cs336_systems.distributed import DDPShardedGradients
        from cs336_systems.distributed.sharded_optimizer import assign_contiguous

        params = list(model.parameters())
        applied.owners = dict(zip(params, assign_contiguous([p.numel() for p in params], world_size)))
        applied.ddp = DDPShardedGradients(model, applied.owners, bucket_size_mb=config.bucket_size_mb)
    if config.compile_blocks:
        for block in parts.layers:
            block.compile()
    return applied


def attention_keepable(parts: ModelParts, config: StepConfig) -> bool:
    """Whether recomputed blocks can keep their attention's output: asked for, and every layer runs our
    FlashAttention (the keeping reuses its output and logsumexp) through a pluggable `attn.attention`.
    A block whose attention is its own code (the course's module-level function) never does."""
    from cs336_systems.attention import get_attention
    from cs336_systems.attention.api import flash_attention

    ours = (get_attention("flash_triton"), flash_attention)
    return config.keep_attention and all(
        isinstance(attention_of(block), KeptAttentionOutput) or attention_of(block) in ours for block in parts.layers
    )
