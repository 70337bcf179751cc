"""The float64 attention reference and the one tolerance table every check of an attention uses.

Reference: S = Q Kᵀ / √d (with −∞ where the causal mask hides key j from query i, i.e. j > i,
aligned to the upper left as in `scaled_dot_product_attention`), L = logsumexp_j S, O = softmax(S) V,
all in float64 on the (already rounded) inputs of the implementation under test. Its gradients
dQ, dK, dV come from autograd through the same expression.

An implementation passes where the norm-wise relative error ‖x − ref‖ / ‖ref‖ of each of O, L
(where it exposes L), dQ, dK and dV stays under its dtype's tolerance (`TOLERANCE`); a NaN never
passes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# Float64 scores per query chunk of `reference_gradients` (256 MiB), so N = 65,536 fits in a few GiB.
REFERENCE_CHUNK_ELEMENTS = 2**25


class Tolerance(NamedTuple):
    """Largest norm-wise relative error against the float64 reference that passes, by use.

    `checks`: unit tests and the accuracy tables, inputs of at most a few thousand positions.
    `sweeps`: benchmark sweeps and the leaderboard, up to 65,536 positions and every implementation,
    where the materialised softmax in bf16 reaches about 1e-2 at N = 2,048 and grows slowly with N,
    and fp32 matmuls under TF32 about 1e-3. Either stays far below the errors of order 1 that a wrong
    kernel makes.
    """

    checks: float
    sweeps: float


TOLERANCE = {
    torch.float32: Tolerance(checks=1e-3, sweeps=5e-3),
    torch.float16: Tolerance(checks=1e-2, sweeps=1e-2),
    torch.bfloat16: Tolerance(checks=1e-2, sweeps=5e-2),
}


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    first_row: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O and L in float64 (see the module docstring), differentiable in q, k, v.

    Tensors of shape (..., N, d); inputs of another dtype are converted, and gradients reach
    float64 leaves that the caller makes (``t.detach().double().requires_grad_()``). `first_row`:
    the position of q's first row among all queries, for a chunk of rows (the causal mask shifts).
    """
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if is_causal:
        hidden = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1 + first_row)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def reference_gradients(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    is_causal: bool = False,
    chunk_elements: int = REFERENCE_CHUNK_ELEMENTS,
) -> dict[str, torch.Tensor]:
    """O, L, dQ, dK, dV of `reference_attention` in float64 for the upstream gradient `grad_out`.

    Computed over chunks of query rows: rows are independent, so each chunk's O, L and dQ rows are
    exact and its dK, dV terms add up; a chunk holds at most `chunk_elements` scores.
    """
    k64, v64 = (t.detach().double().requires_grad_() for t in (k, v))
    q64, g64 = q.detach().double(), grad_out.detach().double()
    n_q, n_k = q.shape[-2], k.shape[-2]
    rows = max(1, chunk_elements // (n_k * q[..., 0, 0].numel()))
    out, grad_q = torch.empty_like(q64), torch.empty_like(q64)
    lse = torch.empty(q.shape[:-1], dtype=torch.float64, device=q.device)
    for start in range(0, n_q, rows):
        stop = min(start + rows, n_q)
        q_chunk = q64[..., start:stop, :].requires_grad_()
        o, chunk_lse = reference_attention(q_chunk, k64, v64, is_causal, first_row=start)
        o.backward(g64[..., start:stop, :])
        out[..., start:stop, :] = o.detach()
        lse[..., start:stop] = chunk_lse.detach()
        grad_q[..., start:stop, :] = q_chunk.grad
    return dict(O=out, L=lse, dQ=grad_q, dK=k64.grad, dV=v64.grad)


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖ in float64 (NaN stays NaN)."""
    return ((x.detach().double() - ref.detach()).norm() / ref.detach().norm()).item()
