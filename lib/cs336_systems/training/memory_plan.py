"""The step's memory model and the recompute plan made from it: which blocks keep their activations.

At the first step of each input shape (batch, seq) `make_plan` decides, per `StepConfig.recompute`: "all"
(every block recomputes), "none" (every block keeps its activations) or "plan": as many blocks keep their
activations as a memory budget allows (`plan_recompute`), from

- one block's memory measured on that step's real input (`measure_block_memory`: one extra forward and
  backward of block 0, compiled when the blocks are, its graph dropped at once);
- the memory that does not depend on the plan, counted from the shapes (`fixed_memory_bytes`);
- the peak model of `recompute_cost` (the end of the forward, or a recomputed block's backward);
- the budget: `StepConfig.memory_budget_bytes`, or when None, on CUDA the memory this process can still get
  (`torch.cuda.mem_get_info` free bytes plus what PyTorch's allocator already reserves, capped by
  `torch.cuda.set_per_process_memory_fraction`'s share of the card, `process_memory_cap_bytes`) minus a
  5 GiB margin (`default_budget_bytes`), and on CPU no budget at all: the host is assumed to have room, so
  every block keeps its activations. (A budget given explicitly is honoured on CPU too; that is how the
  tests make a mixed plan.)

Selective recompute: where every block's attention is our FlashAttention (`parallelize.attention_keepable`),
the recomputed blocks may keep their attention's output and logsumexp, which the plan counts
(`kept_attention_bytes`) and prefers (`plan_recompute`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from cs336_systems.fused_loss import default_chunk_tokens
from cs336_systems.training.config import StepConfig
from cs336_systems.training.model_structure import ModelParts

GIB = 1 << 30
CUDA_MARGIN_BYTES = 5 * GIB


class PlanDoesNotFit(ValueError):
    """No recompute plan fits the memory budget; the message says what would (fewer layers, a shorter
    context, more GPUs). Its own type, so that a sweep can record such a row and still fail on other errors.
    `need_bytes`: the least peak of any plan; `budget_bytes`: what it had; `would_fit`: each change that would
    fit by the same memory model (`would_fit`'s keys; empty where the plan alone was asked)."""

    def __init__(self, message: str, need_bytes: int, budget_bytes: int, would_fit: dict | None = None):
        super().__init__(message)
        self.need_bytes, self.budget_bytes, self.would_fit = need_bytes, budget_bytes, dict(would_fit or {})

    def __reduce__(self):  # whole across processes (an exception pickles only its message by default)
        return type(self), (str(self), self.need_bytes, self.budget_bytes, self.would_fit)


@dataclass(frozen=True)
class RecomputePlan:
    """Per block, whether it recomputes (True) or keeps its saved activations (False); and whether the
    recomputed blocks keep their attention's output and logsumexp (`kept_attention`)."""

    recompute: tuple[bool, ...]
    keep_attention: bool = False
    # With the optimizer's states in host memory between steps (`StepConfig.offload_optimizer_states`): the
    # block whose output's gradient starts their copy back, once the backward has freed the activations of
    # the blocks above it (`states_fetch_block`); None: at the optimizer step.
    fetch_states_at: int | None = None

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
    offloaded: int = 0  # S: optimizer states in host memory through the forward (part of `fixed`)


def recompute_cost(n_layers: int, kept: int, terms: MemoryTerms, keep_attention: bool = False) -> int:
    """Peak bytes of a step whose last `kept` blocks keep their activations, the others recompute (keeping
    attention's output when `keep_attention`). With r = n - kept recomputed blocks holding
    h = c (+ o) each, the largest of
      the end of the forward:  fixed - G - S + kept a + r h   (the backward has not allocated G yet; the
                                                               offloaded optimizer states S are on the host)
      a recomputed block's backward:  fixed + r h + a     (the kept blocks' activations are gone by then)
      with S > 0, the end of the backward:  fixed + a     (the states back, before the update)
    plus t. In between, the backward of a kept block frees its a and allocates its share of G, which is
    far smaller, so the peak is at one of these; the states come back once enough is freed
    (`states_fetch_block`)."""
    recomputed = n_layers - kept
    held = recomputed * (terms.checkpoint + (terms.attention if keep_attention else 0))
    end_of_forward = terms.fixed - terms.backward_gradients - terms.offloaded + kept * terms.block + held
    recompute = terms.fixed + held + terms.block if recomputed else 0
    end_of_backward = terms.fixed + terms.block if terms.offloaded else 0
    return max(end_of_forward, recompute, end_of_backward) + terms.transient


def states_fetch_block(n_layers: int, kept: int, terms: MemoryTerms) -> int | None:
    """Where the backward starts bringing the offloaded optimizer states back: the block whose output's
    gradient is the signal, so that the m blocks above it have run their backward, m the fewest whose freed
    activations, less the gradients their backward allocates (G / n each), hold the states S; at most the
    kept blocks (past them, `recompute_cost`'s recomputed-block term already counts the states). The
    earliest such point leaves the most backward to hide the copy under. None without offloaded states or
    blocks."""
    if not terms.offloaded or n_layers == 0:
        return None
    freed = terms.block - terms.backward_gradients / n_layers
    above = -(-terms.offloaded // freed) if freed > 0 else n_layers
    return max(0, n_layers - 1 - min(int(above), kept))


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

    PlanDoesNotFit (a ValueError) when no plan fits.
    """
    if n_layers < 0 or min(vars(terms).values()) < 0:
        raise ValueError("plan_recompute: layer count and byte counts must be non-negative")
    for keep_attention in (True, False) if terms.attention else (False,):
        fits = [k for k in range(n_layers + 1) if recompute_cost(n_layers, k, terms, keep_attention) <= budget_bytes]
        if fits:
            kept = max(fits)
            return RecomputePlan(
                (True,) * (n_layers - kept) + (False,) * kept,
                keep_attention and kept < n_layers,
                states_fetch_block(n_layers, kept, terms),
            )
    need = least_cost(n_layers, terms)
    raise PlanDoesNotFit(
        f"the step does not fit its memory budget with any recompute plan: the least it needs is about "
        f"{need / GIB:.2f} GiB ({terms.fixed / GIB:.2f} GiB of parameters, gradients, optimizer states "
        f"and loss workspace, {n_layers} checkpointed block inputs and one block's "
        f"{terms.block / GIB:.2f} GiB of activations) but the budget is {budget_bytes / GIB:.2f} GiB; "
        "use fewer layers, a shorter context or smaller batch, or a bigger GPU",
        need_bytes=need,
        budget_bytes=budget_bytes,
    )


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
    sum of the unique storages' nbytes saved for the backward (`profiling.peak_memory.count_saved_tensors`),
    leaving out the block's own parameters and buffers (the block's input is among them; its output, the
    same size, is not), and `transient` is 0."""
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
    from cs336_systems.profiling.peak_memory import count_saved_tensors  # the CPU branch alone needs it

    own = list(block.parameters()) + list(block.buffers())
    with torch.enable_grad(), count_saved_tensors(exclude=own) as counter:
        out = block(inp)
    del out
    return counter.total_bytes, 0


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def fixed_memory_bytes(
    model: nn.Module,
    state_dtype: torch.dtype,
    batch: int,
    seq: int,
    loss_chunk_tokens: int | None = None,
    world_size: int = 1,
    bucket_bytes: int = 0,
) -> int:
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
    params = param_bytes(model)
    states = optimizer_state_bytes(model, state_dtype, world_size)
    tokens = batch * seq
    chunk = loss_chunk_tokens if loss_chunk_tokens is not None else default_chunk_tokens(vocab)
    # fused loss: a chunk of logits, the fp32 accumulator of the head's weight gradient (V x D, converted to
    # the head's dtype at the end of the loss: the head's own gradient is counted with the gradients) and
    # the hidden states' gradient
    loss = min(chunk, tokens) * vocab * 4 + vocab * d_model * 4 + tokens * d_model * elt
    streams = 4 * tokens * d_model * elt
    return params + gradient_bytes(model, world_size, bucket_bytes) + states + loss + streams


def optimizer_state_bytes(module: nn.Module, state_dtype: torch.dtype, world_size: int = 1) -> int:
    """A rank's AdamW moments of `module` (the model, or one block): two per parameter element in `state_dtype`,
    1/world_size of them per rank."""
    numel = sum(p.numel() for p in module.parameters())
    return -(-2 * numel * state_dtype.itemsize // world_size)


def gradient_bytes(model: nn.Module, world_size: int = 1, bucket_bytes: int = 0) -> int:
    """A rank's gradients at their most: all of them on one rank; with N ranks its 1/N share (a contiguous
    run of parameters, `assign_contiguous`) and three buckets in flight, capped at all of them."""
    params = param_bytes(model)
    if world_size == 1:
        return params
    return min(params, -(-params // world_size) + 3 * bucket_bytes)


def kept_attention_bytes(parts: ModelParts, batch: int, seq: int) -> int:
    """What a recomputed block keeps when it keeps its attention's output: O, (batch, seq, d_model) in the
    parameters' dtype, and L, (batch, heads, seq) fp32."""
    weight = parts.head_weight
    return batch * seq * (weight.shape[1] * weight.element_size() + parts.num_heads * 4)


def process_memory_cap_bytes(device: torch.device) -> int:
    """The bytes this process's caching allocator may hold on `device`: the card's total memory times the
    per-process fraction (`torch.cuda.set_per_process_memory_fraction`, 1 when never set), which is how a
    smaller card is simulated on a larger one; past it the allocator raises out-of-memory however much the
    card has free. A torch without `get_per_process_memory_fraction` reads as uncapped. `device` may be a bare
    "cuda" (the current device): torch's fraction getter takes only an indexed device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    fraction = get_fraction(index) if get_fraction is not None else 1.0
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


def make_plan(
    model: nn.Module, parts: ModelParts, config: StepConfig, x: torch.Tensor, keep_attention: bool, world_size: int = 1
) -> RecomputePlan:
    """The recompute plan for x's shape under `config.recompute` (module docstring); `keep_attention`: whether
    the recomputed blocks can keep their attention's output (`parallelize.attention_keepable`)."""
    n = len(parts.layers)
    mode = config.recompute
    fetch = None
    if config.offload_optimizer_states and n > 0:
        # Offloaded states without a measured plan: with every block recomputed the backward's memory is about
        # flat, so they come back as it starts; with every block kept, halfway (half the activations freed).
        fetch = n - 1 if mode == "all" else n // 2
    if mode == "all":
        return RecomputePlan((True,) * n, keep_attention=keep_attention and n > 0, fetch_states_at=fetch)
    if mode == "none" or n == 0:
        return RecomputePlan((False,) * n, fetch_states_at=fetch)
    budget = config.memory_budget_bytes
    if budget is None:
        budget = default_budget_bytes(parts.device)
    if budget is None:  # CPU without an explicit budget: the host is assumed to have room
        return RecomputePlan((False,) * n, fetch_states_at=fetch)
    terms = memory_terms(model, parts, config, x, keep_attention, world_size)
    try:
        return plan_recompute(n, terms, budget)
    except PlanDoesNotFit as err:
        fits = would_fit(model, parts, config, x, terms, budget, world_size)
        raise PlanDoesNotFit(
            f"{err}. {what_would_fit(fits, len(parts.layers), tuple(x.shape))}",
            need_bytes=err.need_bytes,
            budget_bytes=err.budget_bytes,
            would_fit=fits,
        ) from None


def least_cost(n_layers: int, terms: MemoryTerms) -> int:
    """The least peak of any plan for `n_layers` blocks (`recompute_cost`, attention kept or not)."""
    return min(recompute_cost(n_layers, k, terms, keep) for k in range(n_layers + 1) for keep in (False, True))


def would_fit(
    model: nn.Module,
    parts: ModelParts,
    config: StepConfig,
    x: torch.Tensor,
    terms: MemoryTerms,
    budget: int,
    world_size: int = 1,
    max_world_size: int = 8,
) -> dict[str, int | bool]:
    """What would fit `budget` where this step does not, each change alone, from the plan's own memory model:
    `layers`, the most layers (a block's parameters, gradients and states, and its checkpoint, come off);
    `offload_states`, the optimizer states in host memory through the forward (where they are not already);
    `bf16_states`, AdamW's states in bf16 (where they are fp32: half their bytes); `context`, the longest
    power-of-two context (the activations, checkpoints, kept attention outputs, streams and the loss's
    workspace scale with the tokens; parameters and states do not); `gpus`, the fewest GPUs up to
    `max_world_size` (gradients and optimizer states sharded over the ranks, as `TrainStep` does under a
    process group). Only the changes that fit are keys."""
    n = len(parts.layers)
    batch, seq = x.shape
    head = parts.head_weight
    state_dtype = config.state_dtype if config.optimizer == "fused_adamw" else head.dtype
    block_numel = sum(p.numel() for p in parts.layers[0].parameters())
    elt = head.element_size()
    block_grads = -(-block_numel * elt // world_size)
    block_states = optimizer_state_bytes(parts.layers[0], state_dtype, world_size)
    per_block = block_numel * elt + block_grads + block_states
    fits: dict[str, int | bool] = {}
    layers = [
        k
        for k in range(n - 1, 0, -1)
        if least_cost(
            k,
            MemoryTerms(
                **{
                    **vars(terms),
                    "fixed": terms.fixed - (n - k) * per_block,
                    "backward_gradients": max(0, terms.backward_gradients - (n - k) * block_grads),
                    "offloaded": max(0, terms.offloaded - (n - k) * block_states) if terms.offloaded else 0,
                }
            ),
        )
        <= budget
    ]
    if layers:
        fits["layers"] = layers[0]
    all_states = optimizer_state_bytes(model, state_dtype, world_size)
    if not terms.offloaded and least_cost(n, MemoryTerms(**{**vars(terms), "offloaded": all_states})) <= budget:
        fits["offload_states"] = True
    if state_dtype == torch.float32:  # bf16 moments: half the bytes, wherever they wait
        half = all_states // 2
        smaller = MemoryTerms(
            **{
                **vars(terms),
                "fixed": terms.fixed - half,
                "offloaded": terms.offloaded - half if terms.offloaded else 0,
            }
        )
        if least_cost(n, smaller) <= budget:
            fits["bf16_states"] = True
    fixed_at = {
        t: fixed_memory_bytes(
            model,
            state_dtype,
            batch,
            t,
            config.loss_chunk_tokens,
            world_size=world_size,
            bucket_bytes=config.bucket_bytes,
        )
        for t in (seq, 1)
    }
    per_token = (fixed_at[seq] - fixed_at[1]) / max(seq - 1, 1)
    t = 1 << (seq - 1).bit_length() - 1 if seq > 1 else 0
    while t >= 1:
        if t < seq:
            f = t / seq
            scaled = MemoryTerms(
                fixed=int(fixed_at[1] + per_token * (t - 1)),
                block=int(terms.block * f),
                checkpoint=int(terms.checkpoint * f),
                attention=int(terms.attention * f),
                backward_gradients=terms.backward_gradients,
                transient=int(terms.transient * f),
                offloaded=terms.offloaded,
            )
            if least_cost(n, scaled) <= budget:
                fits["context"] = t
                break
        t //= 2
    for gpus in (2, 4, 8):
        if world_size < gpus <= max_world_size:
            fixed = fixed_memory_bytes(
                model,
                state_dtype,
                batch,
                seq,
                config.loss_chunk_tokens,
                world_size=gpus,
                bucket_bytes=config.bucket_bytes,
            )
            grads = gradient_bytes(model, gpus, config.bucket_bytes)
            sharded = MemoryTerms(
                **{
                    **vars(terms),
                    "fixed": fixed,
                    "backward_gradients": max(0, grads - (head.numel() * elt if config.loss == "fused" else 0)),
                    "offloaded": optimizer_state_bytes(model, state_dtype, gpus) if terms.offloaded else 0,
                }
            )
            if least_cost(n, sharded) <= budget:
                fits["gpus"] = gpus
                break
    return fits


def what_would_fit(fits: dict[str, int | bool], n_layers: int, shape: tuple[int, int]) -> str:
    """`would_fit`'s changes in words, for the refusal's message."""
    batch, seq = shape
    options = []
    if "layers" in fits:
        options.append(f"{fits['layers']} of the {n_layers} layers")
    if fits.get("offload_states"):
        options.append("the optimizer states in host memory through the forward (StepConfig.offload_optimizer_states)")
    if fits.get("bf16_states"):
        options.append("bf16 optimizer states (StepConfig.state_dtype=torch.bfloat16)")
    if "context" in fits:
        options.append(f"a context of {fits['context']:,} tokens (now {seq:,})")
    if "gpus" in fits:
        gpus = fits["gpus"]
        options.append(
            f"{gpus} GPUs of this memory, batch {batch} each (`torchrun --nproc-per-node {gpus}`: "
            f"gradients and optimizer states sharded)"
        )
    if not options:
        return (
            "No single change among fewer layers, a shorter context, the optimizer states' dtype or place, or up to "
            "8 GPUs fits this budget; a bigger GPU would."
        )
    return "Each of these would fit, by the same memory model: " + "; or ".join(options) + "."


def memory_terms(
    model: nn.Module,
    parts: ModelParts,
    config: StepConfig,
    x: torch.Tensor,
    keep_attention: bool = True,
    world_size: int = 1,
) -> MemoryTerms:
    """The plan's byte counts for x's shape: block 0's memory measured on x's embedding
    (`measure_block_memory`, under the compiled blocks' partitioner budget), the rest counted from the shapes
    (`fixed_memory_bytes`, one residual stream per recomputed block, `kept_attention_bytes`). The gradients
    only the backward allocates are all but the LM head's when the fused loss makes that one in the forward."""
    batch, seq = x.shape
    with torch.no_grad():
        h = parts.token_embeddings(x)
    with config.partitioner_budget():  # a compiled block's saved set depends on it
        saved, transient = measure_block_memory(parts.layers[0], h)
    del h
    head = parts.head_weight
    state_dtype = config.state_dtype if config.optimizer == "fused_adamw" else head.dtype
    bucket = config.bucket_bytes
    grads = gradient_bytes(model, world_size, bucket)
    backward_gradients = grads - (head.numel() * head.element_size() if config.loss == "fused" else 0)
    states = optimizer_state_bytes(model, state_dtype, world_size)
    return MemoryTerms(
        fixed=fixed_memory_bytes(
            model, state_dtype, batch, seq, config.loss_chunk_tokens, world_size=world_size, bucket_bytes=bucket
        ),
        block=saved,
        checkpoint=batch * seq * head.shape[1] * head.element_size(),
        attention=kept_attention_bytes(parts, batch, seq) if keep_attention else 0,
        backward_gradients=backward_gradients,
        transient=transient,
        offloaded=states if config.offload_optimizer_states and parts.device.type == "cuda" else 0,
    )
