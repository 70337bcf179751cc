"""One training step of an unchanged language model: zero_grad, forward, loss, backward, AdamW.

    step = build_train_step(model, StepConfig(lr=3e-4, recompute="plan"))
    loss = step.step(x, y)          # x, y: (batch, seq) int64 token ids; loss: detached fp32 scalar

The model object is used as it is: its own modules run in the model's order (`final_hidden_states`: the
model's own method, or by structure for the course's `BasicsTransformerLM`, `model_structure`), so its
parameters, their names and shapes, and the function it computes are unchanged. What the step changes is how
that function is run:

- the LM head and the cross-entropy are one fused op (`cs336_systems.fused_loss.linear_cross_entropy`),
  which never holds the [N, V] logits (at the 8B leaderboard shape they would be 10 GB in bf16);
- each block either keeps its saved activations or is recomputed in the backward, per the plan of the
  input's shape (`memory_plan`; `model.checkpoint_every` is not used: the plan replaces it), and recomputed
  blocks may keep their attention's output (selective recompute); these, the blocks' compilation and the
  sharding over ranks are applied to the model in one place, `parallelize`;
- the optimizer is `cs336_systems.optim.FusedAdamW` over `model.parameters()`, one Triton launch per
  parameter group, fp32 or bf16 (stochastically rounded) states; with `StepConfig.offload_optimizer_states`
  those states go to host memory as each forward starts (`optim.StateOffload`), the backward starting their
  copy back at the plan's block (`RecomputePlan.fetch_states_at`), and the plan counts their device memory as
  the forward's.

The choices are a `StepConfig` (`config`); `torch_native_step` is the PyTorch baseline the step is compared
with (SDPA, every block checkpointed, full logits, torch.optim.AdamW): the same `TrainStep` with the
baseline's parts chosen in its config (`torch_native_config`).

Host syncs inside `step()`: one for the token-id range check (`check_token_ids`, min/max of x and y
read back together; set it False to skip) and whatever the loss kernel needs; none other.

`TrainStep.forward_backward(x, y)` is the step without the optimizer: after it every parameter's
`.grad` holds this batch's gradient (what the tests compare), and `optimizer_step()` then applies it;
`step()` is the two together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

from cs336_systems.fused_loss import linear_cross_entropy
from cs336_systems.optim import FusedAdamW, StateOffload
from cs336_systems.training.config import StepConfig, torch_native_config
from cs336_systems.training.kept_attention import KeptAttentionOutput
from cs336_systems.training.memory_plan import MemoryTerms, RecomputePlan, make_plan, memory_terms
from cs336_systems.training.model_structure import final_hidden_states, model_parts
from cs336_systems.training.parallelize import attention_keepable, parallelize

PHASES = ("forward", "loss", "backward", "optimizer")  # the step's torch.profiler ranges
IGNORE_INDEX = -100  # linear_cross_entropy's and F.cross_entropy's default: such targets add no loss


def check_batch(
    x: torch.Tensor, y: torch.Tensor, vocab_size: int, context_length: int | None, check_ids: bool = True
) -> None:
    """ValueError naming the problem: x, y must be (batch, seq) int64 of equal shapes, seq at most the
    context length (where known), x's ids in [0, vocab), y's in [0, vocab) or the ignore index -100. The id check
    reads min and max of both back in one host sync (skipped with check_ids=False)."""
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor of token ids, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must have shape (batch, seq), got {tuple(t.shape)}")
        if t.dtype != torch.int64:
            raise ValueError(f"{name} must hold int64 token ids, got {t.dtype}")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got x {tuple(x.shape)} and y {tuple(y.shape)}")
    if context_length is not None and x.shape[1] > context_length:
        raise ValueError(f"sequence length {x.shape[1]} exceeds the model's context_length {context_length}")
    if x.numel() == 0:
        raise ValueError(f"empty batch {tuple(x.shape)}")
    if check_ids:
        y_valid = torch.where(y == IGNORE_INDEX, 0, y)
        x_min, x_max, y_min, y_max = torch.stack([x.min(), x.max(), y_valid.min(), y_valid.max()]).tolist()
        if x_min < 0 or x_max >= vocab_size:
            raise ValueError(f"input token ids must be in [0, {vocab_size}), got ids in [{x_min}, {x_max}]")
        if y_min < 0 or y_max >= vocab_size:
            raise ValueError(
                f"target token ids must be in [0, {vocab_size}) or {IGNORE_INDEX}, got ids in [{y_min}, {y_max}]"
            )


class OptimizerStep:
    """`step(x, y) -> loss`: the subclass's `forward_backward` (leaves the gradients in `.grad`, returns the
    detached loss), then `optimizer_step`. (One subclass today, `TrainStep`; the split is what a
    data-parallel step needs: its gradients are reduced between the two.)"""

    optimizer: torch.optim.Optimizer

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def optimizer_step(self) -> None:
        self.optimizer.step()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step; returns the batch's mean cross-entropy (detached fp32 scalar) before the update."""
        loss = self.forward_backward(x, y)
        self.optimizer_step()
        return loss

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.step(x, y)


class TrainStep(OptimizerStep):
    """`step(x, y) -> loss`; built by `build_train_step`. `plans` maps each input shape seen to its plan.

    Data parallel when a process group of more than one rank is initialised (torchrun, `distributed.launch`):
    each rank steps on its own (x, y); the model is sharded by `parallelize` (rank 0's weights broadcast,
    each parameter's gradient reduced onto its owning rank as the backward completes it); the optimizer is
    `ShardedOptimizer` around the chosen one with the same owners, each rank keeping the AdamW states of its
    parameters and sending them updated to the other ranks (with `StepConfig.exchange_in_forward`, in flight
    until the next step's forward needs them: `wait_for_exchange` before reading the parameters between
    steps). After `forward_backward` a rank's `.grad` is set for its own parameters only. The returned loss
    is the rank's own batch's. With one rank none of this is built."""

    def __init__(self, model: nn.Module, config: StepConfig):
        self.model = model
        self.parts = model_parts(model)
        self.config = config
        self.world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.parallel = parallelize(model, self.parts, config, self.world_size)
        self.optimizer = build_optimizer(model, config, self.parts.device, self.parallel.owners)
        # The states live in the wrapped optimizer where the step is sharded (each rank's own).
        stateful = getattr(self.optimizer, "local_optimizer", self.optimizer)
        # Sent to the host after the next batch's check (`_forward_backward`), not at the end of the update: the
        # check's read-back would queue behind them on the copy engine.
        self.offload = StateOffload(stateful, after_step=False) if config.offload_optimizer_states else None
        self.plans: dict[tuple[int, int], RecomputePlan] = {}
        # Set to a list to have each step append (phase, time mark) at the phases' boundaries: CUDA events on
        # the model's device (recorded on the current stream), else perf_counter seconds; `phase_times` reads them.
        self.phase_marks: list | None = None

    @property
    def keepers(self) -> dict[int, KeptAttentionOutput]:
        """Layer index -> the `KeptAttentionOutput` in place of that layer's attention function."""
        return self.parallel.keepers

    def plan_for(self, x: torch.Tensor) -> RecomputePlan:
        """The recompute plan for x's shape, made at the first step of that shape (`memory_plan.make_plan`)
        and applied to the model (`Parallelized.use_plan`)."""
        shape = (x.shape[0], x.shape[1])
        if shape not in self.plans:
            plan = self.plans[shape] = self.make_plan(x)
            self.parallel.use_plan(plan)
        return self.plans[shape]

    def attention_keepable(self) -> bool:
        """Whether recomputed blocks can keep their attention's output (`parallelize.attention_keepable`)."""
        return attention_keepable(self.parts, self.config)

    def make_plan(self, x: torch.Tensor) -> RecomputePlan:
        return make_plan(self.model, self.parts, self.config, x, self.attention_keepable(), self.world_size)

    def memory_terms(self, x: torch.Tensor, keep_attention: bool = True) -> MemoryTerms:
        """The plan's byte counts for x's shape (`memory_plan.memory_terms`)."""
        return memory_terms(self.model, self.parts, self.config, x, keep_attention, self.world_size)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """zero_grad, forward, loss, backward; the gradients are left in `.grad`. Returns the detached loss
        (fp32). The phases are torch.profiler ranges (`PHASES`)."""
        with self.config.partitioner_budget():
            return self._forward_backward(x, y)

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        parts, config = self.parts, self.config
        check_batch(x, y, parts.vocab_size, parts.context_length, config.check_token_ids)
        if self.offload is not None:  # the last update's states: the forward gets their memory once copied
            self.offload.offload()
        plan = self.plan_for(x)
        self.optimizer.zero_grad(set_to_none=True)
        try:
            self._mark("forward")
            with record_function("forward"):
                h = self._forward(x, plan)
            self._mark("loss")
            with record_function("loss"):
                if config.loss == "fused":
                    loss = linear_cross_entropy(h, parts.head_weight, y, chunk_tokens=config.loss_chunk_tokens)
                else:
                    logits = parts.lm_head(h)
                    loss = F.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX
                    )
            self._mark("backward")
            with record_function("backward"):
                loss.backward()
                if self.parallel.ddp is not None:
                    self.parallel.ddp.finish_gradient_synchronization()
        finally:
            self.parallel.release()
        return loss.detach().float()

    def _forward(self, x: torch.Tensor, plan: RecomputePlan) -> torch.Tensor:
        before_block = self._exchange_waits() if self.sharded else None
        run_block = self.parallel.block_runner(plan, before_block)
        fetch_at = plan.fetch_states_at
        if self.offload is None or fetch_at is None or not torch.is_grad_enabled():
            return final_hidden_states(self.model, x, run_block)
        fetch = self.offload.fetch

        def run_and_mark(i: int, block: nn.Module, h: torch.Tensor) -> torch.Tensor:
            out = run_block(i, block, h)
            if i == fetch_at and out.requires_grad:
                # its gradient exists once the blocks above have run their backward and freed their activations
                out.register_hook(lambda grad: fetch())
            return out

        return final_hidden_states(self.model, x, run_and_mark)

    def _exchange_waits(self) -> Callable[[int], None]:
        """The last step's parameter exchange may be in flight (`StepConfig.exchange_in_forward`): each part
        waits for its own parameters just before it runs, so the rest of the exchange overlaps its compute.
        Waits for the embedding's now; returns the wait before each block."""
        exchange, layers = self.optimizer, self.parts.layers
        exchange.wait_for_parameters(self.parts.token_embeddings.parameters())
        if len(layers) == 0:
            exchange.wait_for_exchange()

        def before_block(i: int) -> None:
            if i == len(layers) - 1:  # the final norm and the head run after the last block
                exchange.wait_for_exchange()
            else:
                exchange.wait_for_parameters(layers[i].parameters())

        return before_block

    def optimizer_step(self) -> None:
        self._mark("optimizer")
        with record_function("optimizer"):
            if self.sharded:
                self.optimizer.step(wait=not self.config.exchange_in_forward)
            else:
                self.optimizer.step()
        self._mark("end")

    @property
    def sharded(self) -> bool:
        """Whether the step is data parallel: the optimizer a `ShardedOptimizer`, its parameters exchanged."""
        return self.parallel.owners is not None

    def wait_for_exchange(self) -> None:
        """Complete the last step's parameter exchange where `StepConfig.exchange_in_forward` left it in flight:
        after this every rank's model holds the updated parameters (the next step does it block by block)."""
        if self.sharded:
            self.optimizer.wait_for_exchange()

    def _mark(self, phase: str) -> None:
        if self.phase_marks is None:
            return
        if self.parts.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.phase_marks.append((phase, event))
        else:
            self.phase_marks.append((phase, time.perf_counter()))


def build_optimizer(
    model: nn.Module, config: StepConfig, device: torch.device, owners: dict | None = None
) -> torch.optim.Optimizer:
    """The step's optimizer over `model.parameters()`: `FusedAdamW` (states in `config.state_dtype`) or
    torch.optim.AdamW (fused on CUDA, foreach on CPU), per `config.optimizer`; with `owners` (data parallel)
    a `ShardedOptimizer` around it, each rank stepping the parameters it owns."""
    if config.optimizer == "fused_adamw":
        optimizer_cls, options = FusedAdamW, dict(state_dtype=config.state_dtype)
    else:
        cuda = device.type == "cuda"
        optimizer_cls, options = torch.optim.AdamW, ({"fused": True} if cuda else {"foreach": True})
    hyper = dict(lr=config.lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay, **options)
    if owners is not None:
        from cs336_systems.distributed import ShardedOptimizer

        return ShardedOptimizer(list(model.parameters()), optimizer_cls, owners=owners, **hyper)
    return optimizer_cls(model.parameters(), **hyper)


def phase_times(marks: list) -> dict[str, float]:
    """Milliseconds of each phase from a step's `TrainStep.phase_marks` (consecutive marks; the last is "end")."""
    if marks and isinstance(marks[0][1], torch.cuda.Event):
        marks[-1][1].synchronize()
        return {a: s.elapsed_time(e) for (a, s), (_, e) in zip(marks, marks[1:])}
    return {a: (e - s) * 1e3 for (a, s), (_, e) in zip(marks, marks[1:])}


def build_train_step(model: nn.Module, config: StepConfig | None = None) -> TrainStep:
    """The step for `model`: this library's `TransformerLM`, or any model of its structure (`model_parts`),
    such as the course's `cs336_basics.model.BasicsTransformerLM`; TypeError naming what is missing."""
    model_parts(model)
    return TrainStep(model, config if config is not None else StepConfig())


def torch_native_step(
    model: nn.Module,
    lr: float = 1e-3,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    compile_blocks: bool = False,
) -> TrainStep:
    """`build_train_step` with `torch_native_config`."""
    return build_train_step(model, torch_native_config(lr, betas, eps, weight_decay, compile_blocks))
