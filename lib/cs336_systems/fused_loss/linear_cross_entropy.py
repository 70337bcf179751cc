"""The LM head and cross-entropy fused, chunk by chunk, so the whole [N, V] logits never exist.

`linear_cross_entropy(hidden, weight, targets)` equals
`F.cross_entropy((hidden @ weight.T).float().view(-1, V), targets.view(-1))` in value and in the
gradients of `hidden` and `weight`. The FORWARD does all the work, C token rows at a time:

    logits_c = hidden_c @ weight^T              torch.mm, input dtype (fp32 accumulate), into one reused (C, V) buffer
    loss_c, logits_c <- d loss / d logits_c     one Triton kernel (`cross_entropy_kernels`), in place
    grad_hidden_c = logits_c @ weight           into the preallocated (N, D) grad_hidden
    grad_weight  += logits_c^T @ hidden_c       fp32 accumulator (V, D)

and the BACKWARD only multiplies the saved grad_hidden and grad_weight by the incoming scalar
grad_output: no second pass over the vocabulary. Extra memory is one (C, V) buffer in the input dtype,
an (N,) fp32 loss vector, grad_hidden (N, D) and the fp32 grad_weight accumulator (V, D); the
default C keeps the chunk's logits, counted in fp32, within `LOGITS_BUDGET_BYTES` (1 GiB).

Why 1 GiB: every chunk reads and writes the whole (V, D) fp32 accumulator once, so small chunks make
grad_weight's GEMM memory-bound (measured in docs/lm_head_loss_record.md).

torch.compile: the public function is marked `@torch.compiler.disable`, so a compiled model
graph-breaks at the call and runs it eagerly (it syncs once with the host to check the targets).
"""

from __future__ import annotations

import torch

from cs336_systems.fused_loss.cross_entropy_kernels import kernel_interpreted, launch_cross_entropy_rows
from cs336_systems.triton_support.interpreter import NeedsTritonInterpreter, repair_interpreter

if kernel_interpreted():
    repair_interpreter()  # the kernel's loops over V run to a runtime bound

LOGITS_BUDGET_BYTES = 2**30
CHUNK_MULTIPLE = 16
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
REDUCTIONS = ("mean", "sum")


def default_chunk_tokens(vocab_size: int, budget_bytes: int = LOGITS_BUDGET_BYTES) -> int:
    """Token rows per chunk: the most whose fp32 logits fit in `budget_bytes`, a multiple of 16 (at least 16)."""
    rows = budget_bytes // (4 * max(vocab_size, 1))
    return max(CHUNK_MULTIPLE, rows // CHUNK_MULTIPLE * CHUNK_MULTIPLE)


def check_inputs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, reduction: str, chunk_tokens: int | None
) -> None:
    """ValueError naming the problem for shapes, dtypes, devices and options the function does not take."""
    for name, t in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (V, D) as Linear stores it, got shape {tuple(weight.shape)}")
    if hidden.dim() < 1:
        raise ValueError("hidden must have a last dimension D: shape (..., D), got a 0-d tensor")
    if hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"hidden's last dimension D={hidden.shape[-1]} does not match weight's D={weight.shape[1]} "
            f"(weight is (V, D) = {tuple(weight.shape)})"
        )
    if weight.shape[0] == 0:
        raise ValueError("weight has V = 0 rows: a vocabulary needs at least one class")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"targets shape {tuple(targets.shape)} must equal hidden's leading shape {tuple(hidden.shape[:-1])}"
        )
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must hold integer class ids (int64), got dtype {targets.dtype}")
    if hidden.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"hidden dtype {hidden.dtype} is not supported; use float32, bfloat16 or float16")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must have the same dtype")
    if not (hidden.device == weight.device == targets.device):
        raise ValueError(
            f"hidden, weight and targets must be on one device, got {hidden.device}, {weight.device}, {targets.device}"
        )
    if hidden.device.type != "cuda" and not kernel_interpreted():
        error = NeedsTritonInterpreter if hidden.device.type == "cpu" else ValueError
        raise error(
            f"tensors on {hidden.device}: the Triton kernel needs CUDA tensors "
            f"(or TRITON_INTERPRET=1 set before triton is imported)"
        )
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if chunk_tokens is not None and (not isinstance(chunk_tokens, int) or chunk_tokens < 1):
        raise ValueError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}")


def count_targets(targets: torch.Tensor, vocab_size: int, ignore_index: int) -> int:
    """Number of non-ignored targets; ValueError naming an id outside [0, V) that is not `ignore_index`.

    One host sync for both answers (a count and a count of bad ids, on the device)."""
    kept = targets != ignore_index
    bad = kept & ((targets < 0) | (targets >= vocab_size))
    n_kept, n_bad = torch.stack([kept.sum(), bad.sum()]).tolist()
    if n_bad:
        first = int(targets[bad][0])
        raise ValueError(
            f"target id {first} is out of range for vocabulary size V={vocab_size}: ids must be in "
            f"[0, {vocab_size}) or equal ignore_index={ignore_index} ({n_bad} bad target(s))"
        )
    return int(n_kept)


def accumulate_grad_weight(acc: torch.Tensor, dlogits: torch.Tensor, hidden_c: torch.Tensor) -> None:
    """acc (V, D, fp32) += dlogits^T @ hidden_c. 16-bit operands on CUDA: the GEMM writes fp32 into acc
    (out_dtype); elsewhere the 16-bit product is rounded once, then added in fp32."""
    if dlogits.dtype == torch.float32:
        acc.addmm_(dlogits.T, hidden_c)
    elif acc.is_cuda:
        torch.addmm(acc, dlogits.T, hidden_c, out_dtype=torch.float32, out=acc)
    else:
        acc.add_(torch.mm(dlogits.T, hidden_c))


def fused_forward(
    hidden2d: torch.Tensor,
    weight: torch.Tensor,
    targets1d: torch.Tensor,
    *,
    chunk_tokens: int,
    reduction: str,
    ignore_index: int,
    grad_hidden: bool,
    grad_weight: bool,
    block_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(loss, d loss/d hidden2d in hidden's dtype or None, d loss/d weight in fp32 or None), chunk by chunk.

    hidden2d (N, D), weight (V, D), targets1d (N,) contiguous; inputs already checked."""
    N, D = hidden2d.shape
    V = weight.shape[0]
    n_kept = count_targets(targets1d, V, ignore_index)
    if reduction == "mean":
        scale = 1.0 / n_kept if n_kept else float("nan")  # all ignored: nan loss, zero gradient, as F.cross_entropy
    else:
        scale = 1.0
    write_grad = grad_hidden or grad_weight
    device, dtype = hidden2d.device, hidden2d.dtype

    losses = torch.empty(N, dtype=torch.float32, device=device)
    d_hidden = torch.empty((N, D), dtype=dtype, device=device) if grad_hidden else None
    single_chunk = chunk_tokens >= N
    d_weight = None
    if grad_weight and not single_chunk:
        d_weight = torch.zeros((V, D), dtype=torch.float32, device=device)
    buffer = torch.empty((min(chunk_tokens, N), V), dtype=dtype, device=device)
    weight_t = weight.T
    for start in range(0, N, chunk_tokens):
        stop = min(start + chunk_tokens, N)
        hidden_c = hidden2d[start:stop]
        logits = buffer[: stop - start]
        torch.mm(hidden_c, weight_t, out=logits)
        launch_cross_entropy_rows(
            logits, targets1d[start:stop], losses[start:stop], scale, ignore_index, write_grad, block_v
        )
        if grad_hidden:
            torch.mm(logits, weight, out=d_hidden[start:stop])
        if grad_weight:
            if single_chunk:  # one GEMM, fp32 accumulation inside it, no (V, D) fp32 accumulator
                d_weight = torch.mm(logits.T, hidden_c)
            else:
                accumulate_grad_weight(d_weight, logits, hidden_c)
    total = losses.sum()
    loss = total / n_kept if reduction == "mean" else total
    return loss, d_hidden, d_weight


class LinearCrossEntropy(torch.autograd.Function):
    """cross_entropy(hidden @ weight^T, targets) with both gradients computed in the forward.

    `apply(hidden2d, weight, targets1d, chunk_tokens, reduction, ignore_index, grad_hidden, grad_weight)`;
    the class attribute `block_v` (None: `cross_entropy_kernels.block_v_for`'s default) overrides the
    kernel's step over the vocabulary (the interpreter tests use a small one, so rows take several steps).
    """

    block_v: int | None = None

    @staticmethod
    def forward(ctx, hidden2d, weight, targets1d, chunk_tokens, reduction, ignore_index, grad_hidden, grad_weight):
        loss, d_hidden, d_weight = fused_forward(
            hidden2d,
            weight,
            targets1d,
            chunk_tokens=chunk_tokens,
            reduction=reduction,
            ignore_index=ignore_index,
            grad_hidden=grad_hidden,
            grad_weight=grad_weight,
            block_v=LinearCrossEntropy.block_v,
        )
        # saved (not ctx attributes) so autograd frees them after the backward, unless the graph is retained
        ctx.save_for_backward(d_hidden, d_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        saved_hidden, saved_weight = ctx.saved_tensors
        d_hidden = d_weight = None
        if ctx.needs_input_grad[0] and saved_hidden is not None:
            d_hidden = saved_hidden * grad_output  # a 0-d fp32 factor keeps the 16-bit dtype, multiplies in fp32
        if ctx.needs_input_grad[1] and saved_weight is not None:
            # straight into the weight's dtype: one rounding, no second (V, D) fp32 tensor
            d_weight = torch.empty(saved_weight.shape, dtype=ctx.weight_dtype, device=saved_weight.device)
            torch.mul(saved_weight, grad_output, out=d_weight)
        return d_hidden, d_weight, None, None, None, None, None, None


@torch.compiler.disable
def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int | None = None,
    reduction: str = "mean",
    ignore_index: int = -100,
) -> torch.Tensor:
    """Cross-entropy of the logits hidden @ weight^T against targets, never materialising [N, V].

    hidden (..., D) fp32/bf16/fp16; weight (V, D), the LM head's `Linear` weight, same dtype;
    targets (...) int64 ids in [0, V) or `ignore_index`. reduction "mean" (over non-ignored targets)
    or "sum". Returns the fp32 scalar loss; gradients flow to hidden and weight (in their dtypes),
    computed only for those that require grad, and not at all under torch.no_grad.
    chunk_tokens: token rows per chunk (default `default_chunk_tokens(V)`).
    """
    check_inputs(hidden, weight, targets, reduction, chunk_tokens)
    V, D = weight.shape
    hidden2d = hidden.reshape(-1, D)
    targets1d = targets.reshape(-1).contiguous()
    chunk = chunk_tokens if chunk_tokens is not None else default_chunk_tokens(V)
    grad_enabled = torch.is_grad_enabled()
    grad_hidden = grad_enabled and hidden.requires_grad
    grad_weight = grad_enabled and weight.requires_grad
    loss = LinearCrossEntropy.apply(
        hidden2d, weight, targets1d, chunk, reduction, ignore_index, grad_hidden, grad_weight
    )
    return loss
