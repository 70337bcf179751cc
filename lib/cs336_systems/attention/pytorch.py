"""FlashAttention-2 in plain PyTorch: the tiled forward of Algorithm 1, the recomputing backward.

Forward, for each query tile Q_i (B_q rows) and each key tile K^(j), V^(j) (B_k rows), with
scale = 1/sqrt(d) and m_i^(0) = -inf, l_i^(0) = 0, O_i^(0) = 0:

    S_i^(j) = Q_i K^(j)T * scale                        (+ -1e6 where a key is after the query)
    m_i^(j) = max(m_i^(j-1), rowmax S_i^(j))
    P~_i^(j) = exp(S_i^(j) - m_i^(j))
    l_i^(j) = exp(m_i^(j-1) - m_i^(j)) l_i^(j-1) + rowsum P~_i^(j)
    O_i^(j) = diag(exp(m_i^(j-1) - m_i^(j))) O_i^(j-1) + P~_i^(j) V^(j)
    O_i = O_i^(T_k) / l_i^(T_k),   L_i = m_i^(T_k) + log l_i^(T_k)   (the row logsumexp)

Only L, Q, K, V and O are saved. The backward recomputes P from L (equations 13-19):

    D = rowsum(O * dO)
    S = Q K^T * scale,  P = exp(S - L),  dV = P^T dO,  dP = dO V^T,
    dS = P * (dP - D),  dQ = dS K * scale,  dK = dS^T Q * scale

With `is_causal`, query i sees keys j <= i: the upper-left aligned mask
torch.ones(N_q, N_k).tril(0) of `scaled_dot_product_attention(is_causal=True)`, so queries
i >= N_k see every key and keys j >= N_q are seen by none. Decoding against a cache (the
lower-right alignment, query i at position i + N_k - N_q) is not offered. Key tiles entirely
after a query tile are skipped.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from cs336_systems.attention.validation import FLOAT_DTYPES, check_attention_inputs

MASKED_SCORE_OFFSET = -1e6
MIN_TILE = 16


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp32/fp16/bf16 inputs (running max, sum and output need the range), fp64 stays fp64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def flash_forward_tiles(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, q_tile: int = 64, k_tile: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1 on (B, N_q, d), (B, N_k, d), (B, N_k, d): returns O (q's dtype) and L (fp32, or fp64)."""
    if q_tile < MIN_TILE or k_tile < MIN_TILE:
        raise ValueError(f"tiles must be at least {MIN_TILE}x{MIN_TILE}, got {q_tile}x{k_tile}")
    batch, n_q, d = q.shape
    n_k = k.shape[-2]
    acc = accumulation_dtype(q.dtype)
    scale = d**-0.5
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, n_q, dtype=acc, device=q.device)
    key_pos = torch.arange(n_k, device=q.device)
    for q_start in range(0, n_q, q_tile):
        q_i = q[:, q_start : q_start + q_tile].to(acc)
        rows = q_i.shape[1]
        query_pos = torch.arange(q_start, q_start + rows, device=q.device)
        o_i = torch.zeros(batch, rows, d, dtype=acc, device=q.device)
        l_i = torch.zeros(batch, rows, dtype=acc, device=q.device)
        m_i = torch.full((batch, rows), float("-inf"), dtype=acc, device=q.device)
        # Under the causal mask, keys after the tile's last query contribute exactly nothing.
        k_stop = min(n_k, q_start + rows) if is_causal else n_k
        for k_start in range(0, k_stop, k_tile):
            k_j = k[:, k_start : k_start + k_tile].to(acc)
            v_j = v[:, k_start : k_start + k_tile].to(acc)
            s = q_i @ k_j.transpose(-1, -2) * scale
            if is_causal:
                after = key_pos[k_start : k_start + k_j.shape[1]][None, :] > query_pos[:, None]
                s = s + after * MASKED_SCORE_OFFSET
            m_new = torch.maximum(m_i, s.amax(dim=-1))
            p = torch.exp(s - m_new[..., None])
            rescale = torch.exp(m_i - m_new)
            l_i = rescale * l_i + p.sum(dim=-1)
            o_i = rescale[..., None] * o_i + p @ v_j
            m_i = m_new
        out[:, q_start : q_start + rows] = (o_i / l_i[..., None]).to(q.dtype)
        lse[:, q_start : q_start + rows] = m_i + torch.log(l_i)
    return out, lse


def flash_backward_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    grad_o: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Equations 13-19 on (..., N, d) tensors, in fp32 (fp64 for fp64); gradients in the inputs' dtype."""
    acc = accumulation_dtype(q.dtype)
    qf, kf, vf, of, dof = (t.to(acc) for t in (q, k, v, o, grad_o))
    scale = q.shape[-1] ** -0.5
    n_q, n_k = q.shape[-2], k.shape[-2]
    delta = (of * dof).sum(dim=-1, keepdim=True)
    p = torch.exp(qf @ kf.transpose(-1, -2) * scale - lse.to(acc)[..., None])
    if is_causal:
        after = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(diagonal=1)
        p = p.masked_fill(after, 0.0)
    grad_v = p.transpose(-1, -2) @ dof
    grad_p = dof @ vf.transpose(-1, -2)
    grad_s = p * (grad_p - delta)
    grad_q = grad_s @ kf * scale
    grad_k = grad_s.transpose(-1, -2) @ qf * scale
    return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype)


_compiled_backward = None


def flash_backward(*args, compiled: bool = True):
    """`flash_backward_reference`, through torch.compile unless `compiled=False` (compiled once, lazily)."""
    global _compiled_backward
    if not compiled:
        return flash_backward_reference(*args)
    if _compiled_backward is None:
        _compiled_backward = torch.compile(flash_backward_reference)
    return _compiled_backward(*args)


class FlashAttentionPytorch(torch.autograd.Function):
    """O = softmax(Q K^T / sqrt(d) [+ causal mask]) V for (..., N, d) inputs, tiled; saves L, Q, K, V, O.

    Class-level switches: `q_tile`, `k_tile` (>= 16) and `compile_backward` (tests turn it off
    because compiling costs seconds on a CPU).
    """

    q_tile: int = 64
    k_tile: int = 64
    compile_backward: bool = True

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        check_attention_inputs(q, k, v, is_causal, dtypes=(*FLOAT_DTYPES, torch.float64))
        lead, (n_q, d), n_k = q.shape[:-2], q.shape[-2:], k.shape[-2]
        out, lse = flash_forward_tiles(
            q.reshape(-1, n_q, d),
            k.reshape(-1, n_k, d),
            v.reshape(-1, n_k, d),
            is_causal,
            FlashAttentionPytorch.q_tile,
            FlashAttentionPytorch.k_tile,
        )
        out = out.view(q.shape)
        ctx.save_for_backward(lse.view(*lead, n_q), q, k, v, out)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        lse, q, k, v, out = ctx.saved_tensors
        grad_q, grad_k, grad_v = flash_backward(
            q, k, v, out, grad_out, lse, ctx.is_causal, compiled=FlashAttentionPytorch.compile_backward
        )
        return grad_q, grad_k, grad_v, None
