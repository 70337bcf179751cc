"""Attention implementations and the registry the model picks them from.

`get_attention(name)` returns `f(q, k, v, is_causal) -> out` for tensors `(..., seq, d)`:
`naive` (materialised, in PyTorch), `sdpa` (torch.nn.functional.scaled_dot_product_attention),
`flash_pytorch` and `flash_triton` (FlashAttention-2 autograd functions). `flash_attention(q, k, v,
is_causal=False)` is the library's one entry to FlashAttention-2 (Triton kernels, the C++ autograd node
for eager CUDA calls; `api.py` draws the layers under it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from cs336_systems.attention.naive import naive_attention

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]

__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "AttentionFn",
    "FlashAttentionPytorch",
    "FlashAttentionTriton",
    "flash_attention",
    "get_attention",
    "naive_attention",
    "sdpa_attention",
]


def sdpa_attention(q, k, v, is_causal: bool = False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _flash_pytorch(q, k, v, is_causal: bool = False):
    from cs336_systems.attention.pytorch import FlashAttentionPytorch

    return FlashAttentionPytorch.apply(q, k, v, is_causal)


def _flash_triton(q, k, v, is_causal: bool = False):
    from cs336_systems.attention.api import flash_attention

    return flash_attention(q, k, v, is_causal)


ATTENTION_IMPLEMENTATIONS: dict[str, AttentionFn] = {
    "naive": naive_attention,
    "sdpa": sdpa_attention,
    "flash_pytorch": _flash_pytorch,
    "flash_triton": _flash_triton,
}


def get_attention(attention: str | AttentionFn) -> AttentionFn:
    if callable(attention):
        return attention
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTION_IMPLEMENTATIONS)}")
    return ATTENTION_IMPLEMENTATIONS[attention]


def __getattr__(name: str):
    # FlashAttention classes load lazily: importing Triton costs seconds and needs a compiler.
    if name == "FlashAttentionPytorch":
        from cs336_systems.attention.pytorch import FlashAttentionPytorch

        return FlashAttentionPytorch
    if name in ("FlashAttentionTriton", "flash_attention"):
        from cs336_systems.attention import api

        return getattr(api, name)
    raise AttributeError(name)
