"""One training step of the unchanged `TransformerLM`: zero_grad, forward, loss, backward, AdamW.

    step = build_train_step(model, StepConfig(lr=3e-4, recompute="plan"))
    loss = step.step(x, y)          # x, y: (batch, seq) int64 token ids; loss: detached fp32 scalar

The model object is used as it is: its own modules (`token_embeddings`, each of `layers`, `ln_final`,
`lm_head.weight`) are called in the model's order, so its parameters, their names and shapes, and the
function it computes are unchanged. What the step changes is how that function is run:

- the LM head and the cross-entropy are one fused op (`cs336_systems.fused_loss.linear_cross_entropy`),
  which never holds the [N, V] logits (at the 8B leaderboard shape they would be 10 GB in bf16);
- each block either keeps its saved activations or runs under
  `torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)` (keeps only its input, recomputes
  its body before its backward), per `StepConfig.recompute`: "none", "all", or "plan" (as many blocks
  keep their activations as a memory budget allows, `plan_recompute`). `model.checkpoint_every` is
  not used: the plan replaces it;
- the optimizer is `cs336_systems.fused_adamw.FusedAdamW` over `model.parameters()`, one Triton
  launch per parameter group, fp32 or bf16 (stochastically rounded) states;
- `compile_blocks=True` wraps each block's forward with torch.compile (`block.compile()`, in place on
  the model's modules; the parameters are untouched). Off by default: under the Triton interpreter
  (CPU) nothing compiles.

The plan is made at the first step for each input shape (batch, seq), from one block's saved
activations measured on that step's real input (`measure_block_activation_bytes`: one extra forward
of block 0, outside autograd's graph), the analytic fixed memory (`fixed_memory_bytes`) and the budget:
`StepConfig.memory_budget_bytes`, or when None, on CUDA the memory this process can still get
(`torch.cuda.mem_get_info` free bytes plus what PyTorch's allocator already reserves) minus a 5 GiB
margin, and on CPU no budget at all: the host is assumed to have room, so every block keeps its
activations. (A budget given explicitly is honoured on CPU too; that is how the tests make a mixed plan.)

Host syncs inside `step()`: one for the token-id range check (`check_token_ids`, min/max of x and y
read back together; set it False to skip) and whatever the loss kernel needs; none other.

`TrainStep.forward_backward(x, y)` is the step without the optimizer: after it every parameter's
`.grad` holds this batch's gradient (what the tests compare), and `optimizer_step()` then applies it;
`step()` is the two together.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

from cs336_systems.fused_adamw import FusedAdamW
from cs336_systems.fused_loss import default_chunk_tokens, linear_cross_entropy
from cs336_systems.model import TransformerLM

GIB = 1 << 30
CUDA_MARGIN_BYTES = 5 * GIB
RECOMPUTE_MODES = ("plan", "all", "none")
LOSSES = ("fused", "cross_entropy")  # linear_cross_entropy, or the LM head then F.cross_entropy on full logits
OPTIMIZERS = ("fused_adamw", "torch_adamw")  # ours, or torch.optim.AdamW (fused on CUDA, foreach on CPU)
PHASES = ("forward", "loss", "backward", "optimizer")  # the step's torch.profiler ranges
IGNORE_INDEX = -100  # linear_cross_entropy's and F.cross_entropy's default: such targets add no loss


@dataclass
class StepConfig:
    """What the step does besides the model: AdamW's hyperparameters, its state dtype, the recompute
    policy ("plan" | "all" | "none") and the budget of "plan" (bytes; None: see the module docstring),
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
    bucket_size_mb: float = 1000.0  # data parallel only: DDPBucketed's bucket size

    def __post_init__(self):
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
        if self.loss_chunk_tokens is not None and self.loss_chunk_tokens < 1:
            raise ValueError(f"StepConfig.loss_chunk_tokens must be positive, got {self.loss_chunk_tokens}")


def plan_recompute(n_layers: int, block_activation_bytes: int, fixed_bytes: int, budget_bytes: int,
                   checkpoint_bytes: int = 0) -> list[bool]:
    """Which blocks recompute (True) and which keep their saved activations (False).

    Memory with k blocks keeping theirs: fixed + k a + (n - k) c + (a if any block recomputes), with
    a = `block_activation_bytes`, c = `checkpoint_bytes` (what a recomputed block keeps: its input;
    0 when that input is counted elsewhere), the last term being the one block whose activations are
    rebuilt during the backward. k is the largest that fits `budget_bytes`.

    The kept blocks are the LAST k: the backward runs the last block first, so kept activations are
    freed at the start of the backward, and the recomputed blocks' transient activations are rebuilt
    when the kept ones are already gone; the peak is then at the end of the forward, which is what the
    formula counts. (Keeping the first blocks instead would hold their activations during the whole
    backward of the recomputed ones, the same peak here, but no earlier release.)

    ValueError when even recomputing every block does not fit.
    """
    if n_layers < 0 or block_activation_bytes < 0 or fixed_bytes < 0 or checkpoint_bytes < 0:
        raise ValueError("plan_recompute: layer count and byte counts must be non-negative")

    def cost(kept: int) -> int:
        recomputed = n_layers - kept
        return (fixed_bytes + kept * block_activation_bytes + recomputed * checkpoint_bytes
                + (block_activation_bytes if recomputed else 0))

    if cost(0) > budget_bytes:
        raise ValueError(
            f"the step does not fit its memory budget even with every block recomputed: it needs about "
            f"{cost(0) / GIB:.2f} GiB ({fixed_bytes / GIB:.2f} GiB of parameters, gradients, optimizer states "
            f"and loss workspace, {n_layers} checkpointed block inputs and one block's "
            f"{block_activation_bytes / GIB:.2f} GiB of activations) but the budget is {budget_bytes / GIB:.2f} GiB; "
            f"use fewer layers, a shorter context or smaller batch, bf16 optimizer states "
            f"(StepConfig.state_dtype=torch.bfloat16), or a bigger GPU")
    kept = max(k for k in range(n_layers + 1) if cost(k) <= budget_bytes)
    return [True] * (n_layers - kept) + [False] * kept


def measure_block_activation_bytes(block: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd saves during one forward of `block` on `x` (its input, (batch, seq, d_model)):
    the sum of the unique storages' nbytes packed by `saved_tensors_hooks`, leaving out the block's own
    parameters and buffers (they are kept anyway). Works on any device; the graph is dropped at once."""
    own = {t.untyped_storage().data_ptr() for t in list(block.parameters()) + list(block.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in own:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
        return t

    inp = x.detach().requires_grad_(True)
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(inp)
    del out
    return sum(seen.values())


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def fixed_memory_bytes(model: TransformerLM, state_dtype: torch.dtype, batch: int, seq: int,
                       loss_chunk_tokens: int | None = None, world_size: int = 1) -> int:
    """Memory of a step that does not depend on the recompute plan, counted from the shapes:
    parameters, their gradients (same dtype), AdamW's two moments (`state_dtype`; 1/world_size of them on
    each rank when data parallel), the loss's workspace (one chunk of fp32 logits, the LM head's weight
    gradient and the hidden gradient the fused loss makes in its forward), and four (batch, seq, d_model)
    streams (the embedding output, the final norm's input and output, the gradient flowing back)."""
    weight = model.lm_head.weight
    vocab, d_model = weight.shape
    elt = weight.element_size()
    numel = sum(p.numel() for p in model.parameters())
    params = param_bytes(model)
    states = -(-2 * numel * torch.tensor([], dtype=state_dtype).element_size() // world_size)
    tokens = batch * seq
    chunk = loss_chunk_tokens if loss_chunk_tokens is not None else default_chunk_tokens(vocab)
    loss = min(chunk, tokens) * vocab * 4 + vocab * d_model * elt + tokens * d_model * elt
    streams = 4 * tokens * d_model * elt
    return 2 * params + states + loss + streams


def default_budget_bytes(device: torch.device) -> int | None:
    """On CUDA: free device memory plus what PyTorch already reserves, minus a 5 GiB margin; None on CPU."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - CUDA_MARGIN_BYTES


def check_batch(x: torch.Tensor, y: torch.Tensor, vocab_size: int, context_length: int,
                check_ids: bool = True) -> None:
    """ValueError naming the problem: x, y must be (batch, seq) int64 of equal shapes, seq at most the
    context length, x's ids in [0, vocab), y's in [0, vocab) or the ignore index -100. The id check
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
    if x.shape[1] > context_length:
        raise ValueError(f"sequence length {x.shape[1]} exceeds the model's context_length {context_length}")
    if x.numel() == 0:
        raise ValueError(f"empty batch {tuple(x.shape)}")
    if check_ids:
        y_valid = torch.where(y == IGNORE_INDEX, 0, y)
        x_min, x_max, y_min, y_max = torch.stack([x.min(), x.max(), y_valid.min(), y_valid.max()]).tolist()
        if x_min < 0 or x_max >= vocab_size:
            raise ValueError(f"input token ids must be in [0, {vocab_size}), got ids in [{x_min}, {x_max}]")
        if y_min < 0 or y_max >= vocab_size:
            raise ValueError(f"target token ids must be in [0, {vocab_size}) or {IGNORE_INDEX}, "
                             f"got ids in [{y_min}, {y_max}]")


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
    each rank steps on its own (x, y); rank 0's weights are broadcast at construction; the gradients are
    averaged by `DDPBucketed` (bucketed all-reduces launched from gradient hooks as the backward completes
    them, so they overlap it); the optimizer is `ShardedOptimizer` around the chosen one, each rank keeping
    the AdamW states of about 1/N of the parameters (ZeRO stage 1) and broadcasting its updated
    parameters. The returned loss is the rank's own batch's. With one rank none of this is built."""

    def __init__(self, model: TransformerLM, config: StepConfig):
        self.model = model
        self.config = config
        self.world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if config.optimizer == "fused_adamw":
            optimizer_cls, options = FusedAdamW, dict(state_dtype=config.state_dtype)
        else:
            cuda = model.lm_head.weight.device.type == "cuda"
            optimizer_cls, options = torch.optim.AdamW, ({"fused": True} if cuda else {"foreach": True})
        hyper = dict(lr=config.lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay, **options)
        self.ddp = None
        if self.world_size > 1:
            from cs336_systems.distributed import DDPBucketed, ShardedOptimizer

            self.ddp = DDPBucketed(model, bucket_size_mb=config.bucket_size_mb)
            self.optimizer = ShardedOptimizer(model.parameters(), optimizer_cls, **hyper)
        else:
            self.optimizer = optimizer_cls(model.parameters(), **hyper)
        self.plans: dict[tuple[int, int], list[bool]] = {}
        # Set to a list to have each step append (phase, time mark) at the phases' boundaries: CUDA events on
        # the model's device (recorded on the current stream), else perf_counter seconds; `phase_times` reads them.
        self.phase_marks: list | None = None
        if config.compile_blocks:
            for block in model.layers:
                block.compile()

    def plan_for(self, x: torch.Tensor) -> list[bool]:
        """The recompute plan for x's shape (made and cached at the first step of that shape)."""
        shape = (x.shape[0], x.shape[1])
        if shape not in self.plans:
            self.plans[shape] = self.make_plan(x)
        return self.plans[shape]

    def make_plan(self, x: torch.Tensor) -> list[bool]:
        n = len(self.model.layers)
        mode = self.config.recompute
        if mode == "all":
            return [True] * n
        if mode == "none" or n == 0:
            return [False] * n
        device = self.model.lm_head.weight.device
        budget = self.config.memory_budget_bytes
        if budget is None:
            budget = default_budget_bytes(device)
        if budget is None:  # CPU without an explicit budget: the host is assumed to have room
            return [False] * n
        batch, seq = x.shape
        with torch.no_grad():
            h = self.model.token_embeddings(x)
        activation = measure_block_activation_bytes(self.model.layers[0], h)
        del h
        state_dtype = self.config.state_dtype if self.config.optimizer == "fused_adamw" else self.model.lm_head.weight.dtype
        fixed = fixed_memory_bytes(self.model, state_dtype, batch, seq, self.config.loss_chunk_tokens,
                                   world_size=self.world_size)
        stream = batch * seq * self.model.lm_head.weight.shape[1] * self.model.lm_head.weight.element_size()
        return plan_recompute(n, activation, fixed, budget, checkpoint_bytes=stream)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """zero_grad, forward, loss, backward; the gradients are left in `.grad`. Returns the detached loss
        (fp32). The phases are torch.profiler ranges (`PHASES`)."""
        model = self.model
        check_batch(x, y, model.config.vocab_size, model.config.context_length, self.config.check_token_ids)
        plan = self.plan_for(x)
        self.optimizer.zero_grad(set_to_none=True)
        self._mark("forward")
        with record_function("forward"):
            h = model.token_embeddings(x)
            for block, recompute in zip(model.layers, plan):
                h = checkpoint(block, h, use_reentrant=False) if recompute else block(h)
            h = model.ln_final(h)
        self._mark("loss")
        with record_function("loss"):
            if self.config.loss == "fused":
                loss = linear_cross_entropy(h, model.lm_head.weight, y, chunk_tokens=self.config.loss_chunk_tokens)
            else:
                logits = model.lm_head(h)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX)
        self._mark("backward")
        with record_function("backward"):
            loss.backward()
            if self.ddp is not None:
                self.ddp.finish_gradient_synchronization()
        return loss.detach().float()

    def optimizer_step(self) -> None:
        self._mark("optimizer")
        with record_function("optimizer"):
            self.optimizer.step()
        self._mark("end")

    def _mark(self, phase: str) -> None:
        if self.phase_marks is None:
            return
        if self.model.lm_head.weight.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.phase_marks.append((phase, event))
        else:
            self.phase_marks.append((phase, time.perf_counter()))


def phase_times(marks: list) -> dict[str, float]:
    """Milliseconds of each phase from a step's `TrainStep.phase_marks` (consecutive marks; the last is "end")."""
    if marks and isinstance(marks[0][1], torch.cuda.Event):
        marks[-1][1].synchronize()
        return {a: s.elapsed_time(e) for (a, s), (_, e) in zip(marks, marks[1:])}
    return {a: (e - s) * 1e3 for (a, s), (_, e) in zip(marks, marks[1:])}


def build_train_step(model: TransformerLM, config: StepConfig | None = None) -> TrainStep:
    if not isinstance(model, TransformerLM):
        raise TypeError(f"build_train_step takes a cs336_systems.model.TransformerLM, got {type(model).__name__}")
    return TrainStep(model, config if config is not None else StepConfig())


def torch_native_config(lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
                        weight_decay: float = 0.01, compile_blocks: bool = False) -> StepConfig:
    """The PyTorch baseline's step: every block checkpointed, the LM head then F.cross_entropy on the full
    logits, torch.optim.AdamW (fused on CUDA, foreach on CPU); with `compile_blocks`, each block compiled.
    The attention is the model's own: build the model with attention="sdpa" for the baseline."""
    return StepConfig(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, recompute="all",
                      loss="cross_entropy", optimizer="torch_adamw", compile_blocks=compile_blocks)


def torch_native_step(model: TransformerLM, lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999),
                      eps: float = 1e-8, weight_decay: float = 0.01, compile_blocks: bool = False) -> TrainStep:
    """`build_train_step` with `torch_native_config`."""
    return build_train_step(model, torch_native_config(lr, betas, eps, weight_decay, compile_blocks))
