"""Materialised scaled dot-product attention: softmax(Q K^T / sqrt(d) + mask) V.

Every intermediate (scores, probabilities) is an (..., N_q, N_k) tensor kept for the backward,
which is why its memory grows quadratically with sequence length. The named ranges let a
profile separate the two matmuls from the softmax.
"""

from __future__ import annotations

import math

import torch

from cs336_systems.attention.validation import check_is_causal
from cs336_systems.profiling.ranges import annotated


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x); the max keeps exp from overflowing."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    exp = torch.exp(shifted)
    return exp / exp.sum(dim=dim, keepdim=True)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    check_is_causal(is_causal)
    with annotated("computing attention scores"):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if is_causal:
            # Query i sees keys j <= i (upper-left aligned, as scaled_dot_product_attention's is_causal).
            mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
    with annotated("computing softmax"):
        probs = softmax(scores, dim=-1)
    with annotated("final matmul"):
        return probs @ v
