"""Activation checkpointing strategies for a stack of N blocks, applied by wrapping an unchanged model.

A checkpointed function keeps only its input during the forward and recomputes its body just
before that body's backward (torch.utils.checkpoint, non-reentrant, which may be nested). With
a = one block's saved activations and c = one checkpoint (the residual stream, B x S x d):

    strategy   arrangement                                          peak activations   block forwards
    none       plain forward                                        N a                N
    every k    groups of k blocks, each one checkpoint              (N/k) c + k a      2N   (best k = sqrt(N c / a))
    binary     checkpoint each half, recursively (log2 N levels)    a + 2 log2(N) c    2N + (N/2)(log2 N - 1)
    chain      prefix(j) = block_j(checkpoint(prefix(j-1), x))       a + c              N (N + 1) / 2

The blocks are deterministic (no dropout), so checkpoints do not save the RNG state, which
would otherwise be a few KB of bookkeeping per checkpoint.
(Block forwards with PyTorch's early stopping: a recomputation stops once the tensors its
backward needs exist, so re-running a region split in two halves only re-runs the first half.)

"chain" is the memory-optimal arrangement when compute is free: every backward step re-runs the
stack from the input, so besides one block's activations only the input is kept; "binary"
gives up a log factor of memory for N log N compute. `checkpoint_every` of TransformerLM is the
one-level "every k" strategy; `CheckpointedLM` wraps a TransformerLM to apply any of them to its
blocks, or to its sublayers (attention and feed-forward halves, two per block).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from cs336_systems.model import TransformerLM

if TYPE_CHECKING:
    import pandas as pd

Layer = Callable[[torch.Tensor], torch.Tensor]
STRATEGIES = ("none", "every", "binary", "chain")


def run_plain(layers: Sequence[Layer], x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = layer(x)
    return x


def run_every(layers: Sequence[Layer], x: torch.Tensor, k: int) -> torch.Tensor:
    """One level: groups of k consecutive layers, each group under one checkpoint."""
    if k < 1:
        raise ValueError(f"checkpoint group size must be positive, got {k}")
    for start in range(0, len(layers), k):
        x = checkpoint(run_plain, layers[start : start + k], x, use_reentrant=False, preserve_rng_state=False)
    return x


def run_binary(layers: Sequence[Layer], x: torch.Tensor) -> torch.Tensor:
    """Nested halves: each half under a checkpoint, recursively, so log2 N checkpoints are alive at once."""
    if len(layers) == 1:
        return layers[0](x)
    mid = len(layers) // 2
    y = checkpoint(run_binary, layers[:mid], x, use_reentrant=False, preserve_rng_state=False)
    return checkpoint(run_binary, layers[mid:], y, use_reentrant=False, preserve_rng_state=False)


def run_chain(layers: Sequence[Layer], x: torch.Tensor) -> torch.Tensor:
    """prefix(j) = layer_j(checkpoint(prefix(j-1), x)): only x and one layer's activations stay alive."""
    if len(layers) == 1:
        return layers[0](x)
    y = checkpoint(run_chain, layers[:-1], x, use_reentrant=False, preserve_rng_state=False)
    return layers[-1](y)


def run_strategy(layers: Sequence[Layer], x: torch.Tensor, strategy: str, k: int | None = None) -> torch.Tensor:
    if strategy == "none" or not torch.is_grad_enabled():
        return run_plain(layers, x)
    if strategy == "every":
        return run_every(layers, x, k if k is not None else max(1, round(math.sqrt(len(layers)))))
    if strategy == "binary":
        return run_binary(layers, x)
    if strategy == "chain":
        return run_chain(layers, x)
    raise ValueError(f"unknown checkpointing strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


class _AttentionHalf(nn.Module):
    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block.attn(self.block.ln1(x))


class _FeedForwardHalf(nn.Module):
    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block.ffn(self.block.ln2(x))


class CheckpointedLM(nn.Module):
    """A TransformerLM whose blocks (unit="block") or sublayers (unit="sublayer") run under `strategy`.

    Same parameters and outputs as the wrapped model; only what is kept for backward changes.
    `k` is the group size of the "every" strategy, in units.
    """

    def __init__(self, model: TransformerLM, strategy: str = "every", k: int | None = None, unit: str = "block"):
        super().__init__()
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown checkpointing strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if unit not in ("block", "sublayer"):
            raise ValueError(f"unit must be 'block' or 'sublayer', got {unit!r}")
        if model.checkpoint_every:
            raise ValueError("the wrapped model already checkpoints (checkpoint_every is set); wrap a plain one")
        self.model, self.strategy, self.k, self.unit = model, strategy, k, unit
        if unit == "block":
            self.units = list(model.layers)
        else:
            self.units = [half for block in model.layers for half in (_AttentionHalf(block), _FeedForwardHalf(block))]

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        m = self.model
        if token_ids.dim() != 2:
            raise ValueError(f"expected token ids of shape (batch, seq), got {tuple(token_ids.shape)}")
        x = run_strategy(self.units, m.token_embeddings(token_ids), self.strategy, self.k)
        return m.lm_head(m.ln_final(x))


class CountingLayer(nn.Module):
    """Counts forward calls (recomputations included) of the layer it wraps."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.layer(x)


def strategy_costs(
    depths: Sequence[int],
    strategies: Sequence[str] = STRATEGIES,
    d_model: int = 64,
    num_heads: int = 4,
    d_ff: int = 256,
    batch: int = 2,
    context: int = 128,
    device: torch.device | str = "cpu",
) -> pd.DataFrame:
    """Peak activation memory and block forwards of one forward+backward through N blocks, per strategy.

    The blocks' weights are frozen and the input requires grad, so the measured peak (above what
    was allocated before) is activations and their gradients only, not weight gradients.
    """
    import pandas as pd

    from cs336_systems.model import TransformerBlock
    from cs336_systems.profiling.peak_memory import peak_allocated_bytes

    device = torch.device(device)
    rows = []
    for n in depths:
        torch.manual_seed(0)
        blocks = [
            CountingLayer(TransformerBlock(d_model, num_heads, d_ff, context, device=device)).requires_grad_(False)
            for _ in range(n)
        ]
        x = torch.randn(batch, context, d_model, device=device, requires_grad=True)
        for strategy in strategies:
            for b in blocks:
                b.calls = 0

            def step(blocks: list[CountingLayer] = blocks, x: torch.Tensor = x, strategy: str = strategy) -> None:
                run_strategy(blocks, x, strategy).sum().backward()
                x.grad = None

            peak = peak_allocated_bytes(step, device)
            rows.append(dict(blocks=n, strategy=strategy, peak_bytes=peak, block_forwards=sum(b.calls for b in blocks)))
    df = pd.DataFrame(rows)
    df["peak_mib"] = df["peak_bytes"] / 2**20
    return df
