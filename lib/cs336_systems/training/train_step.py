"""One training step of the unchanged `TransformerLM`: zero_grad, forward, loss, backward, AdamW.

    step = build_train_step(model, StepConfig(lr=3e-4, recompute="plan"))
    loss = step.step(x, y)          # x, y: (batch, seq) int64 token ids; loss: detached fp32 scalar

The model object is used as it is: its own modules (`token_embeddings`, each of `layers`, `ln_final`,
`lm_head.weight`) are called in the model's order, so its parameters, their names and shapes, and the
function it computes are unchanged. The model is read by structure, not class (`model_parts`): this
library's `TransformerLM`, or the course's `cs336_basics.model.BasicsTransformerLM` (same names and shapes,
its own classes). On a model whose blocks compute attention in their own code (the course's calls its
module-level `scaled_dot_product_attention` with a mask tensor) the step applies all that works on any
block: the fused loss, FusedAdamW, the recompute plan over whole blocks, `compile_blocks`; the attention
stays the block's own and no block keeps its attention output. Swapping it is left out on purpose: the
course's function is one module global that every model of that module calls, and whether its mask is
causal can only be known by reading the tensor. A model built with a pluggable `attn.attention` set to our
FlashAttention gets that too. What the step changes is how that function is run:

- the LM head and the cross-entropy are one fused op (`cs336_systems.fused_loss.linear_cross_entropy`),
  which never holds the [N, V] logits (at the 8B leaderboard shape they would be 10 GB in bf16);
- each block either keeps its saved activations or runs under
  `torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)` (keeps only its input, recomputes
  its body before its backward), per `StepConfig.recompute`: "none", "all", or "plan" (as many blocks
  keep their activations as a memory budget allows, `plan_recompute`). `model.checkpoint_every` is
  not used: the plan replaces it. Selective recompute (`StepConfig.keep_attention`, where the model's
  attention is our FlashAttention): a recomputed block keeps its attention's output and logsumexp and
  its recompute skips the attention forward (`kept_attention.KeptAttentionOutput`, put in place of the
  recomputed blocks' attention function when the plan is made);
- the optimizer is `cs336_systems.fused_adamw.FusedAdamW` over `model.parameters()`, one Triton
  launch per parameter group, fp32 or bf16 (stochastically rounded) states;
- `activation_memory_budget` (with `compile_blocks`): the compiled blocks' partitioner saves less and
  recomputes more inside each block's backward (`torch._functorch.config.activation_memory_budget`, a
  fraction between recomputing everything, 0, and saving everything the backward reads, 1); smaller
  blocks let the plan keep more of them. Set while the blocks compile and run (`forward_backward`); it
  shapes the blocks when they compile, so blocks compiled earlier under another budget keep their
  partition until `torch._dynamo.reset()` (the record does that between rows);
- `compile_blocks=True` wraps each block's forward with torch.compile (`block.compile()`, in place on
  the model's modules; the parameters are untouched). Off by default: under the Triton interpreter
  (CPU) nothing compiles.

The plan is made at the first step for each input shape (batch, seq), from one block's memory measured
on that step's real input (`measure_block_memory`: one extra forward and backward of block 0, compiled
when the blocks are, its graph dropped at once), the analytic fixed memory (`fixed_memory_bytes`), the
peak model of `recompute_cost` and the budget: `StepConfig.memory_budget_bytes`, or when None, on
CUDA the memory this process can still get (`torch.cuda.mem_get_info` free bytes plus what PyTorch's
allocator already reserves, capped by `torch.cuda.set_per_process_memory_fraction`'s share of the card,
`process_memory_cap_bytes`) minus a 5 GiB margin, and on CPU no budget at all: the host is assumed to
have room, so every block keeps its activations. (A budget given explicitly is honoured on CPU too; that is how the tests make a mixed plan.)

Host syncs inside `step()`: one for the token-id range check (`check_token_ids`, min/max of x and y
read back together; set it False to skip) and whatever the loss kernel needs; none other.

`TrainStep.forward_backward(x, y)` is the step without the optimizer: after it every parameter's
`.grad` holds this batch's gradient (what the tests compare), and `optimizer_step()` then applies it;
`step()` is the two together.
"""

from __future__ import annotations

import contextlib
import numbers
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
from cs336_systems.training.kept_attention import KeptAttentionOutput

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
    bucket_size_mb: float = 1000.0  # data parallel only: DDPShardedGradients' bucket size
    keep_attention: bool = True  # recomputed blocks keep attention's O and L (only with our FlashAttention)
    activation_memory_budget: float | None = None  # compiled blocks' partitioner budget in (0, 1]; None: torch's

    @property
    def bucket_bytes(self) -> int:
        """`bucket_size_mb` in bytes (MiB, as DDP's `bucket_cap_mb`)."""
        return int(self.bucket_size_mb * 2**20)

    def __post_init__(self):
        for name in ("lr", "eps", "weight_decay", "bucket_size_mb"):
            if not _is_real(getattr(self, name)):
                raise TypeError(f"StepConfig.{name} must be a real number, got {type(getattr(self, name)).__name__}")
        if not (isinstance(self.betas, (tuple, list)) and len(self.betas) == 2 and all(map(_is_real, self.betas))):
            raise TypeError(f"StepConfig.betas must be a pair of floats, got {self.betas!r}")
        for name in ("compile_blocks", "check_token_ids", "keep_attention"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"StepConfig.{name} must be a bool, got {type(getattr(self, name)).__name__}")
        for name in ("memory_budget_bytes", "loss_chunk_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool)):
                raise TypeError(f"StepConfig.{name} must be an int or None, got {type(value).__name__}")
        if self.activation_memory_budget is not None and not _is_real(self.activation_memory_budget):
            raise TypeError(f"StepConfig.activation_memory_budget must be a real number or None, "
                            f"got {type(self.activation_memory_budget).__name__}")
        for name in ("lr", "eps", "weight_decay"):
            if not 0.0 <= getattr(self, name):  # NaN fails too
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
                raise ValueError(f"StepConfig.activation_memory_budget must be in (0, 1], got {self.activation_memory_budget}")
            if not self.compile_blocks:
                raise ValueError("StepConfig.activation_memory_budget applies to compiled blocks: set compile_blocks=True")
        if self.loss_chunk_tokens is not None and self.loss_chunk_tokens < 1:
            raise ValueError(f"StepConfig.loss_chunk_tokens must be positive, got {self.loss_chunk_tokens}")


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class ModelParts:
    """What the step reads from a model, found by name and shape (`model_parts`): the sizes its checks and
    memory model use. `context_length` and `num_heads` are None where the model does not say them."""

    vocab_size: int
    d_model: int
    context_length: int | None
    num_heads: int | None


def model_parts(model: nn.Module) -> ModelParts:
    """The structure the step runs, checked: `token_embeddings` (a module with a (vocab, d_model) `weight`),
    `layers` (a sequence of modules, each (batch, seq, d_model) -> same), `ln_final` (a module) and `lm_head`
    (a module whose only parameter is a (vocab, d_model) `weight`, used as h @ weight^T by the fused loss).
    This library's `TransformerLM` and the course's `BasicsTransformerLM` both have it, with the same
    parameter names and shapes; their classes are not looked at (as `distributed.fsdp` shards by structure).
    A head that is not h @ weight^T is found at the first step: loss and gradients would differ from the
    model's own forward, so `lm_head` is probed once here (one one-hot row, exact in any dtype). TypeError
    naming what is missing."""
    def fail(problem: str):
        raise TypeError(f"build_train_step needs a language model with token_embeddings, layers, ln_final and a "
                        f"bias-free lm_head (as cs336_systems.model.TransformerLM and the course's "
                        f"BasicsTransformerLM): {type(model).__name__} {problem}")

    if not isinstance(model, nn.Module):
        fail("is not an nn.Module")
    for name in ("token_embeddings", "layers", "ln_final", "lm_head"):
        if not isinstance(getattr(model, name, None), nn.Module):
            fail(f"has no module `{name}`")
    embedding, head = getattr(model.token_embeddings, "weight", None), getattr(model.lm_head, "weight", None)
    if not (isinstance(embedding, torch.Tensor) and embedding.dim() == 2):
        fail("has no 2-D token_embeddings.weight")
    if not (isinstance(head, torch.Tensor) and head.shape == embedding.shape):
        fail(f"has no lm_head.weight of token_embeddings.weight's shape {tuple(embedding.shape)}")
    if [name for name, _ in model.lm_head.named_parameters()] != ["weight"]:
        fail("has an lm_head with parameters besides its weight (a bias): the fused loss computes h @ weight^T")
    if not all(isinstance(block, nn.Module) for block in model.layers):
        fail("has layers that are not modules")
    _check_head_is_linear(model.lm_head, head, fail)
    return ModelParts(head.shape[0], head.shape[1], _config_value(model, "context_length"), _num_heads(model))


def _check_head_is_linear(lm_head: nn.Module, weight: torch.Tensor, fail) -> None:
    # lm_head(e_0) is weight[:, 0] for h @ weight^T: one product with a single one, exact in any dtype
    # (TF32 rounds fp32 weights, hence the loose tolerance: a scaled or shifted head is far off it)
    if weight.is_meta:
        return
    probe = torch.zeros(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    probe[0, 0] = 1
    with torch.no_grad():
        out = lm_head(probe)
    expected = weight[:, 0].unsqueeze(0)
    if out.shape != expected.shape or not torch.allclose(out.float(), expected.float(), rtol=1e-2, atol=1e-6):
        fail("has an lm_head that does not compute h @ lm_head.weight^T")


def _config_value(model: nn.Module, name: str) -> int | None:
    """`name` from the model's config (our `ModelConfig`, or the course's dict of constructor arguments) or
    the model itself."""
    config = getattr(model, "config", None)
    value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
    return value if value is not None else getattr(model, name, None)


def _num_heads(model: nn.Module) -> int | None:
    """The config's `num_heads`, else the first block's `attn.num_heads`."""
    blocks = list(model.layers)
    first = getattr(getattr(blocks[0], "attn", None), "num_heads", None) if blocks else None
    return _config_value(model, "num_heads") or first


def attention_of(block: nn.Module):
    """The block's pluggable attention function (`block.attn.attention`, as our `TransformerLM`'s), or None
    where its attention is its own code."""
    return getattr(getattr(block, "attn", None), "attention", None)


@dataclass(frozen=True)
class RecomputePlan:
    """Per block, whether it recomputes (True) or keeps its saved activations (False); and whether the
    recomputed blocks keep their attention's output and logsumexp (`kept_attention`)."""

    recompute: tuple[bool, ...]
    keep_attention: bool = False

    @property
    def kept_blocks(self) -> int:
        return self.recompute.count(False)

    @property
    def recomputed_blocks(self) -> int:
        return self.recompute.count(True)


@dataclass(frozen=True)
class MemoryTerms:
    """The byte counts of the plan's model of a step's memory (`recompute_cost`)."""

    fixed: int  # parameters, all their gradients, optimizer states, loss workspace, residual streams
    block: int  # a: what one block that keeps its activations holds (saved tensors and its output)
    checkpoint: int = 0  # c: what a recomputed block holds (its input; 0 when counted elsewhere)
    attention: int = 0  # o: attention's O and L, held by a recomputed block that keeps them
    backward_gradients: int = 0  # G: the gradients that only the backward allocates (part of `fixed`)
    transient: int = 0  # t: a block's working memory beyond `block` while it runs, forward or backward


def recompute_cost(n_layers: int, kept: int, terms: MemoryTerms, keep_attention: bool = False) -> int:
    """Peak bytes of a step whose last `kept` blocks keep their activations, the others recompute (keeping
    attention's output when `keep_attention`). With r = n - kept recomputed blocks holding
    h = c (+ o) each, the larger of
      the end of the forward:  fixed - G + kept a + r h   (the backward has not allocated G yet)
      a recomputed block's backward:  fixed + r h + a     (the kept blocks' activations are gone by then)
    plus t. In between, the backward of a kept block frees its a and allocates its share of G, which is
    far smaller, so the peak is at one of the two."""
    recomputed = n_layers - kept
    held = recomputed * (terms.checkpoint + (terms.attention if keep_attention else 0))
    end_of_forward = terms.fixed - terms.backward_gradients + kept * terms.block + held
    recompute = terms.fixed + held + terms.block if recomputed else 0
    return max(end_of_forward, recompute) + terms.transient


def plan_recompute(n_layers: int, terms: MemoryTerms, budget_bytes: int) -> RecomputePlan:
    """Which blocks recompute and which keep their saved activations; whether recomputed blocks keep their
    attention's output: the most kept blocks whose `recompute_cost` fits `budget_bytes`.

    Attention first: with `terms.attention` > 0 the recomputed blocks keep their attention output whenever
    that fits, and the kept blocks are then the most that fit with it. One (N, d_model) tensor buys back
    the attention forward, which at the contexts where memory runs short (N of the order of d_model and
    more) is a larger share of a block's forward than one tensor is of the dozen or so (N, d_model)-sized
    tensors a block saves; so per byte it buys back more time than keeping a whole block does.

    The kept blocks are the LAST ones: the backward runs the last block first, so kept activations are
    freed at the start of the backward, before any recomputed block's activations are rebuilt.

    ValueError when no plan fits.
    """
    if n_layers < 0 or min(vars(terms).values()) < 0:
        raise ValueError("plan_recompute: layer count and byte counts must be non-negative")
    for keep_attention in ((True, False) if terms.attention else (False,)):
        fits = [k for k in range(n_layers + 1) if recompute_cost(n_layers, k, terms, keep_attention) <= budget_bytes]
        if fits:
            kept = max(fits)
            return RecomputePlan((True,) * (n_layers - kept) + (False,) * kept, keep_attention and kept < n_layers)
    need = min(recompute_cost(n_layers, k, terms) for k in range(n_layers + 1))
    raise ValueError(
        f"the step does not fit its memory budget with any recompute plan: the least it needs is about "
        f"{need / GIB:.2f} GiB ({terms.fixed / GIB:.2f} GiB of parameters, gradients, optimizer states "
        f"and loss workspace, {n_layers} checkpointed block inputs and one block's "
        f"{terms.block / GIB:.2f} GiB of activations) but the budget is {budget_bytes / GIB:.2f} GiB; "
        f"use fewer layers, a shorter context or smaller batch, bf16 optimizer states "
        f"(StepConfig.state_dtype=torch.bfloat16), or a bigger GPU")


def measure_block_activation_bytes(block: nn.Module, x: torch.Tensor) -> int:
    """Bytes one forward of `block` on `x` (its input, (batch, seq, d_model)) leaves alive for its backward
    (`measure_block_memory`'s first number)."""
    return measure_block_memory(block, x)[0]


def measure_block_memory(block: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(saved, transient) bytes of `block` on `x`: what one forward leaves alive for its backward, and the
    most working memory beyond that while the block's forward or backward runs; the graph is dropped.

    On CUDA, read from the allocator: `saved` is the growth of the allocated bytes over the forward, its
    output held (the output is the next block's input: a block that keeps its activations adds it to the
    stream); this is what the block really holds, compiled or not (a compiled block saves what the
    compiler's partition chose, which autograd's saved-tensor hooks do not see). `transient` is the peak
    over the forward and over a backward to the input (weight gradients not made: they are counted with
    the gradients) less `saved`. Resets the device's peak-memory statistics. Elsewhere: `saved` is the
    sum of the unique storages' nbytes packed by `saved_tensors_hooks`, leaving out the block's own
    parameters and buffers (the block's input is among them; its output, the same size, is not), and
    `transient` is 0."""
    inp = x.detach().requires_grad_(True)
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)
        before = torch.cuda.memory_allocated(x.device)
        torch.cuda.reset_peak_memory_stats(x.device)
        with torch.enable_grad():
            out = block(inp)
        torch.cuda.synchronize(x.device)
        saved = torch.cuda.memory_allocated(x.device) - before
        peak = torch.cuda.max_memory_allocated(x.device)
        upstream = torch.ones_like(out)
        torch.cuda.reset_peak_memory_stats(x.device)
        (grad,) = torch.autograd.grad(out, inp, upstream)
        torch.cuda.synchronize(x.device)
        peak = max(peak, torch.cuda.max_memory_allocated(x.device))
        del out, upstream, grad
        return saved, max(0, peak - before - saved)
    own = {t.untyped_storage().data_ptr() for t in list(block.parameters()) + list(block.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in own:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(inp)
    del out
    return sum(seen.values()), 0


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def fixed_memory_bytes(model: nn.Module, state_dtype: torch.dtype, batch: int, seq: int,
                       loss_chunk_tokens: int | None = None, world_size: int = 1, bucket_bytes: int = 0) -> int:
    """Memory of a step that does not depend on the recompute plan, counted from the shapes:
    parameters; their gradients (same dtype; when data parallel, a rank's 1/world_size of them plus three
    buckets of `bucket_bytes` being filled or reduced, `DDPShardedGradients`); AdamW's two moments
    (`state_dtype`; 1/world_size of them on each rank when data parallel); the loss's workspace (one chunk
    of fp32 logits, the fp32 accumulator of the LM head's weight gradient and the hidden gradient the fused
    loss makes in its forward); and four (batch, seq, d_model) streams (the embedding output, the final
    norm's input and output, the gradient flowing back)."""
    weight = model.lm_head.weight
    vocab, d_model = weight.shape
    elt = weight.element_size()
    numel = sum(p.numel() for p in model.parameters())
    params = param_bytes(model)
    states = -(-2 * numel * torch.tensor([], dtype=state_dtype).element_size() // world_size)
    tokens = batch * seq
    chunk = loss_chunk_tokens if loss_chunk_tokens is not None else default_chunk_tokens(vocab)
    # fused loss: a chunk of logits, the fp32 accumulator of the head's weight gradient (V x D, converted to
    # the head's dtype at the end of the loss: the head's own gradient is counted with the gradients) and
    # the hidden states' gradient
    loss = min(chunk, tokens) * vocab * 4 + vocab * d_model * 4 + tokens * d_model * elt
    streams = 4 * tokens * d_model * elt
    return params + gradient_bytes(model, world_size, bucket_bytes) + states + loss + streams


def gradient_bytes(model: nn.Module, world_size: int = 1, bucket_bytes: int = 0) -> int:
    """A rank's gradients at their most: all of them on one rank; with N ranks its 1/N share (a contiguous
    run of parameters, `assign_contiguous`) and three buckets in flight, capped at all of them."""
    params = param_bytes(model)
    if world_size == 1:
        return params
    return min(params, -(-params // world_size) + 3 * bucket_bytes)


def kept_attention_bytes(model: nn.Module, batch: int, seq: int) -> int:
    """What a recomputed block keeps when it keeps its attention's output: O, (batch, seq, d_model) in the
    parameters' dtype, and L, (batch, heads, seq) fp32."""
    weight = model.lm_head.weight
    return batch * seq * (weight.shape[1] * weight.element_size() + _num_heads(model) * 4)


def process_memory_cap_bytes(device: torch.device) -> int:
    """The bytes this process's caching allocator may hold on `device`: the card's total memory times the
    per-process fraction (`torch.cuda.set_per_process_memory_fraction`, 1 when never set), which is how a
    smaller card is simulated on a larger one; past it the allocator raises out-of-memory however much the
    card has free. A torch without `get_per_process_memory_fraction` reads as uncapped."""
    total = torch.cuda.get_device_properties(device).total_memory
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    fraction = get_fraction(device) if get_fraction is not None else 1.0
    return int(total * fraction)


def default_budget_bytes(device: torch.device) -> int | None:
    """On CUDA: what this process can still get, the smaller of the free device memory plus what PyTorch
    already reserves and the process's cap (`process_memory_cap_bytes`; the cap bounds the reserved bytes,
    so it includes them), minus a 5 GiB margin; None on CPU."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    available = min(free + torch.cuda.memory_reserved(device), process_memory_cap_bytes(device))
    return available - CUDA_MARGIN_BYTES


def check_batch(x: torch.Tensor, y: torch.Tensor, vocab_size: int, context_length: int | None,
                check_ids: bool = True) -> None:
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
    each rank steps on its own (x, y); rank 0's weights are broadcast at construction; each rank owns one
    contiguous run of about 1/N of the parameters (`assign_contiguous`); the gradients are averaged onto
    their owners by `DDPShardedGradients` (bucketed reduces launched from gradient hooks as the backward
    completes them, so they overlap it; a rank keeps only its own parameters' gradients, ZeRO stage 2); the
    optimizer is `ShardedOptimizer` around the chosen one with the same owners, each rank keeping the AdamW
    states of its parameters and broadcasting them updated. After `forward_backward` a rank's `.grad` is
    set for its own parameters only. The returned loss is the rank's own batch's. With one rank none of
    this is built."""

    def __init__(self, model: nn.Module, config: StepConfig):
        self.model = model
        self.parts = model_parts(model)
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
            from cs336_systems.distributed import DDPShardedGradients, ShardedOptimizer
            from cs336_systems.distributed.sharded_optimizer import assign_contiguous

            params = list(model.parameters())
            owners = dict(zip(params, assign_contiguous([p.numel() for p in params], self.world_size)))
            self.ddp = DDPShardedGradients(model, owners, bucket_size_mb=config.bucket_size_mb)
            self.optimizer = ShardedOptimizer(params, optimizer_cls, owners=owners, **hyper)
        else:
            self.optimizer = optimizer_cls(model.parameters(), **hyper)
        self.plans: dict[tuple[int, int], RecomputePlan] = {}
        # layer index -> the KeptAttentionOutput put in place of that layer's attention function
        self.keepers: dict[int, KeptAttentionOutput] = {}
        # Set to a list to have each step append (phase, time mark) at the phases' boundaries: CUDA events on
        # the model's device (recorded on the current stream), else perf_counter seconds; `phase_times` reads them.
        self.phase_marks: list | None = None
        if config.compile_blocks:
            for block in model.layers:
                block.compile()

    def plan_for(self, x: torch.Tensor) -> RecomputePlan:
        """The recompute plan for x's shape (made and cached at the first step of that shape); where it
        keeps attention outputs, its recomputed blocks' attention functions become `KeptAttentionOutput`s."""
        shape = (x.shape[0], x.shape[1])
        if shape not in self.plans:
            plan = self.plans[shape] = self.make_plan(x)
            if plan.keep_attention:
                for i, recompute in enumerate(plan.recompute):
                    attn = self.model.layers[i].attn
                    if recompute and i not in self.keepers:
                        self.keepers[i] = attn.attention = KeptAttentionOutput(attn.attention)
        return self.plans[shape]

    def attention_keepable(self) -> bool:
        """Whether recomputed blocks can keep their attention's output: asked for, and every layer runs our
        FlashAttention (the keeping reuses its output and logsumexp) through a pluggable `attn.attention`.
        A block whose attention is its own code (the course's module-level function) never does."""
        from cs336_systems.attention import get_attention
        from cs336_systems.attention.api import flash_attention

        ours = (get_attention("flash_triton"), flash_attention)
        return self.config.keep_attention and all(
            isinstance(attention_of(block), KeptAttentionOutput) or attention_of(block) in ours
            for block in self.model.layers)

    def make_plan(self, x: torch.Tensor) -> RecomputePlan:
        n = len(self.model.layers)
        mode = self.config.recompute
        keep_attention = self.attention_keepable()
        if mode == "all":
            return RecomputePlan((True,) * n, keep_attention=keep_attention and n > 0)
        if mode == "none" or n == 0:
            return RecomputePlan((False,) * n)
        device = self.model.lm_head.weight.device
        budget = self.config.memory_budget_bytes
        if budget is None:
            budget = default_budget_bytes(device)
        if budget is None:  # CPU without an explicit budget: the host is assumed to have room
            return RecomputePlan((False,) * n)
        return plan_recompute(n, self.memory_terms(x, keep_attention), budget)

    def memory_terms(self, x: torch.Tensor, keep_attention: bool = True) -> MemoryTerms:
        """The plan's byte counts for x's shape: block 0's memory measured on x's embedding
        (`measure_block_memory`), the rest counted from the shapes (`fixed_memory_bytes`, one residual stream
        per recomputed block, `kept_attention_bytes`). The gradients only the backward allocates are all
        but the LM head's when the fused loss makes that one in the forward."""
        batch, seq = x.shape
        model = self.model
        with torch.no_grad():
            h = model.token_embeddings(x)
        with self.partitioner_budget():  # a compiled block's saved set depends on it
            saved, transient = measure_block_memory(model.layers[0], h)
        del h
        head = model.lm_head.weight
        state_dtype = self.config.state_dtype if self.config.optimizer == "fused_adamw" else head.dtype
        bucket = self.config.bucket_bytes
        grads = gradient_bytes(model, self.world_size, bucket)
        backward_gradients = grads - (head.numel() * head.element_size() if self.config.loss == "fused" else 0)
        return MemoryTerms(
            fixed=fixed_memory_bytes(model, state_dtype, batch, seq, self.config.loss_chunk_tokens,
                                     world_size=self.world_size, bucket_bytes=bucket),
            block=saved, checkpoint=batch * seq * head.shape[1] * head.element_size(),
            attention=kept_attention_bytes(model, batch, seq) if keep_attention else 0,
            backward_gradients=backward_gradients, transient=transient)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """zero_grad, forward, loss, backward; the gradients are left in `.grad`. Returns the detached loss
        (fp32). The phases are torch.profiler ranges (`PHASES`)."""
        with self.partitioner_budget():
            return self._forward_backward(x, y)

    def partitioner_budget(self):
        """The compiled blocks' activation memory budget, set while they compile (at their first call, the
        plan's measurement included) and run; a no-op without one."""
        budget = self.config.activation_memory_budget
        if budget is None:
            return contextlib.nullcontext()
        import torch._functorch.config as functorch_config  # torch.compile's partitioner settings

        if not hasattr(functorch_config, "activation_memory_budget"):
            raise ValueError("StepConfig.activation_memory_budget needs a torch whose compiler has it (2.4 or later)")
        return functorch_config.patch(activation_memory_budget=budget)

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        model = self.model
        check_batch(x, y, self.parts.vocab_size, self.parts.context_length, self.config.check_token_ids)
        plan = self.plan_for(x)
        self.optimizer.zero_grad(set_to_none=True)
        try:
            self._mark("forward")
            with record_function("forward"):
                h = model.token_embeddings(x)
                for i, (block, recompute) in enumerate(zip(model.layers, plan.recompute)):
                    if not recompute:
                        h = block(h)
                        continue
                    if plan.keep_attention:
                        self.keepers[i].arm()
                    h = checkpoint(block, h, use_reentrant=False)
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
        finally:  # each recompute took its block's kept output; a step that failed midway leaves none behind
            for keeper in self.keepers.values():
                keeper.release()
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


def build_train_step(model: nn.Module, config: StepConfig | None = None) -> TrainStep:
    """The step for `model`: this library's `TransformerLM`, or any model of its structure (`model_parts`),
    such as the course's `cs336_basics.model.BasicsTransformerLM`; TypeError naming what is missing."""
    model_parts(model)
    return TrainStep(model, config if config is not None else StepConfig())


def torch_native_config(lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
                        weight_decay: float = 0.01, compile_blocks: bool = False) -> StepConfig:
    """The PyTorch baseline's step: every block checkpointed, the LM head then F.cross_entropy on the full
    logits, torch.optim.AdamW (fused on CUDA, foreach on CPU); with `compile_blocks`, each block compiled.
    The attention is the model's own: build the model with attention="sdpa" for the baseline."""
    return StepConfig(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, recompute="all",
                      loss="cross_entropy", optimizer="torch_adamw", compile_blocks=compile_blocks,
                      keep_attention=False)


def torch_native_step(model: nn.Module, lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999),
                      eps: float = 1e-8, weight_decay: float = 0.01, compile_blocks: bool = False) -> TrainStep:
    """`build_train_step` with `torch_native_config`."""
    return build_train_step(model, torch_native_config(lr, betas, eps, weight_decay, compile_blocks))
