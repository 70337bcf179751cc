"""The Transformer language model of CS336 assignment 1, kept plain.

Pre-norm blocks  x + Attn(RMSNorm(x)),  h + SwiGLU(RMSNorm(h)),  RoPE on queries and keys,
untied output head after a final RMSNorm. The attention kernel is a constructor argument
(`attention="naive" | "sdpa" | "flash_pytorch" | "flash_triton"` or any callable
`f(q, k, v, is_causal) -> out`), so the benchmarks swap kernels without touching the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from cs336_systems.attention import AttentionFn, get_attention

# Table 1 of the handouts; the tiny ones make the CPU profile fast. "xl" keeps the 2025 meaning
# (committed results and the course adapters use it); the 2026 handout's xl has the 2.7B's shape,
# so "xl-2026" is that shape under its 2026 name.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "small": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": dict(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": dict(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": dict(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
    "xl-2026": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
    "10B": dict(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
    # CPU profile sizes
    "nano": dict(d_model=32, d_ff=128, num_layers=1, num_heads=2),
    "tiny": dict(d_model=64, d_ff=256, num_layers=2, num_heads=4),
    "mini": dict(d_model=128, d_ff=512, num_layers=4, num_heads=4),
}
# Each handout's Table 1: the name it prints -> our key in MODEL_SIZES.
SIZE_TABLES: dict[str, dict[str, str]] = {
    "2025": {"small": "small", "medium": "medium", "large": "large", "xl": "xl", "2.7B": "2.7B"},
    "2026": {"small": "small", "medium": "medium", "large": "large", "xl": "xl-2026", "10B": "10B"},
}
# Every shape of both tables once, smallest first (the 2026 xl runs as 2.7B, the name earlier runs have).
HANDOUT_SIZES = ["small", "medium", "large", "xl", "2.7B", "10B"]
CPU_SIZES = ["nano", "tiny", "mini"]
VOCAB_SIZE = 10_000
# run_block(i, block, x) -> the block's output: how `TransformerLM.final_hidden_states` runs block i when given.
BlockRunner = Callable[[int, nn.Module, torch.Tensor], torch.Tensor]


def handout_name(size: str, handout: str) -> str | None:
    """The name `handout`'s size table gives the shape of `size` ("2.7B" is the 2026 xl), or None."""
    dims = MODEL_SIZES.get(size)
    return next((name for name, key in SIZE_TABLES[handout].items() if MODEL_SIZES[key] == dims), None)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = VOCAB_SIZE
    context_length: int = 256
    d_model: int = 768
    num_layers: int = 12
    num_heads: int = 12
    d_ff: int = 3072
    rope_theta: float = 10000.0

    @classmethod
    def from_size(cls, size: str, **overrides) -> ModelConfig:
        if size not in MODEL_SIZES:
            raise ValueError(f"unknown model size {size!r}; known sizes: {', '.join(MODEL_SIZES)}")
        return cls(**{**MODEL_SIZES[size], **overrides})

    def to_dict(self) -> dict:
        return asdict(self)


class Linear(nn.Module):
    """y = x W^T, W of shape (d_out, d_in), no bias, W ~ N(0, 2/(d_in+d_out)) truncated at 3 sigma."""

    def __init__(self, d_in: int, d_out: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in, device=device, dtype=dtype))
        std = math.sqrt(2.0 / (d_in + d_out))
        nn.init.trunc_normal_(self.weight, std=std, a=-3 * std, b=3 * std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T

    def extra_repr(self) -> str:
        return f"d_in={self.weight.shape[1]}, d_out={self.weight.shape[0]}"


class Embedding(nn.Module):
    """Row lookup in a (vocab_size, d_model) table initialised N(0, 1) truncated at 3."""

    def __init__(self, vocab_size: int, d_model: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, std=1.0, a=-3.0, b=3.0)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * g, computed in fp32 and cast back to the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.float()
        rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x * rms * self.weight.float()).to(in_dtype)


class RotaryEmbedding(nn.Module):
    """Rotates each pair (x_{2k}, x_{2k+1}) at position i by angle i * theta^(-2k/d)."""

    def __init__(self, d_head: int, context_length: int, theta: float = 10000.0, device=None):
        super().__init__()
        if d_head % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {d_head}")
        inv_freq = theta ** (-torch.arange(0, d_head, 2, device=device, dtype=torch.float32) / d_head)
        angles = torch.outer(torch.arange(context_length, device=device, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[positions].to(x.dtype), self.sin[positions].to(x.dtype)
        x_even, x_odd = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
        return rotated.flatten(-2)


class SwiGLU(nn.Module):
    """W2 (SiLU(W1 x) * W3 x)."""

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype)
        self.w2 = Linear(d_ff, d_model, device=device, dtype=dtype)
        self.w3 = Linear(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.w1(x)
        return self.w2(a * torch.sigmoid(a) * self.w3(x))


class CausalMultiHeadSelfAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        context_length: int,
        rope_theta: float = 10000.0,
        attention: str | AttentionFn = "naive",
        device=None,
        dtype=None,
    ):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.q_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.k_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.v_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.rope = RotaryEmbedding(d_model // num_heads, context_length, rope_theta, device=device)
        self.attention_name = attention if isinstance(attention, str) else getattr(attention, "__name__", "custom")
        self.attention: AttentionFn = get_attention(attention)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.num_heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        positions = torch.arange(s, device=x.device)
        q = self.rope(self._split_heads(self.q_proj(x)), positions)
        k = self.rope(self._split_heads(self.k_proj(x)), positions)
        v = self._split_heads(self.v_proj(x))
        out = self.attention(q, k, v, True)
        return self.output_proj(out.transpose(1, 2).reshape(b, s, d))


class TransformerBlock(nn.Module):
    def __init__(
        self, d_model, num_heads, d_ff, context_length, rope_theta=10000.0, attention="naive", device=None, dtype=None
    ):
        super().__init__()
        self.ln1 = RMSNorm(d_model, device=device, dtype=dtype)
        self.attn = CausalMultiHeadSelfAttention(
            d_model, num_heads, context_length, rope_theta, attention, device, dtype
        )
        self.ln2 = RMSNorm(d_model, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab). The ids are int64 or int32 in [0, vocab): an eager
    call checks their range (on a GPU without a host sync), a call under torch.compile does not.

    `checkpoint_every=k` recomputes activations in the backward pass: the blocks are run in
    groups of k under `torch.utils.checkpoint`, so only each group's input is kept.
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        d_ff: int,
        rope_theta: float = 10000.0,
        attention: str | AttentionFn = "naive",
        checkpoint_every: int | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if checkpoint_every is not None and checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be a positive number of blocks, got {checkpoint_every}")
        self.config = ModelConfig(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta)
        self.checkpoint_every = checkpoint_every
        self.token_embeddings = Embedding(vocab_size, d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, context_length, rope_theta, attention, device, dtype)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device=device, dtype=dtype)

    @classmethod
    def from_config(cls, config: ModelConfig, **kwargs) -> TransformerLM:
        return cls(**config.to_dict(), **kwargs)

    @classmethod
    def from_size(cls, size: str, context_length: int = 256, vocab_size: int = VOCAB_SIZE, **kwargs) -> TransformerLM:
        return cls.from_config(
            ModelConfig.from_size(size, context_length=context_length, vocab_size=vocab_size), **kwargs
        )

    def _run_blocks(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        for layer in self.layers[start:stop]:
            x = layer(x)
        return x

    def check_token_ids(self, token_ids: torch.Tensor) -> None:
        """Raise (CPU) or assert on the device (GPU) unless every id is in [0, vocab_size)."""
        vocab = self.config.vocab_size
        low, high = torch.aminmax(token_ids)
        if token_ids.device.type == "cpu":
            if low < 0 or high >= vocab:
                raise ValueError(f"token ids must be in [0, {vocab}), got ids in [{int(low)}, {int(high)}]")
            return
        torch._assert_async((low >= 0) & (high < vocab), f"token ids must be in [0, {vocab})")

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if token_ids.dim() != 2:
            raise ValueError(f"TransformerLM expects token ids of shape (batch, seq), got {tuple(token_ids.shape)}")
        if token_ids.shape[1] > self.config.context_length:
            raise ValueError(
                f"sequence length {token_ids.shape[1]} exceeds the model's context_length {self.config.context_length}"
            )
        if token_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"TransformerLM expects int64 or int32 token ids, got {token_ids.dtype}")
        # The lookup would take id -1 as the last row. On the CPU the values are at hand; on a GPU reading them
        # back would stall the launches of every step, so the check is a device-side assert, which stops the
        # process at the next synchronisation with this message. Not while torch.compile traces.
        if not torch.compiler.is_compiling() and token_ids.numel():
            self.check_token_ids(token_ids)
        return self.lm_head(self.final_hidden_states(token_ids))

    def final_hidden_states(self, token_ids: torch.Tensor, run_block: BlockRunner | None = None) -> torch.Tensor:
        """(batch, seq, d_model): the last block's output after the final norm, what the LM head multiplies.
        The ids are not checked here (`forward` checks them; a training step checks its batch itself).

        `run_block(i, block, x)`, where given, runs each block i in its place and returns its output: how a
        training step runs some blocks under activation checkpointing (`cs336_systems.training`), while the
        order of the model's modules stays the model's. Without it, `checkpoint_every` applies."""
        x = self.token_embeddings(token_ids)
        k = self.checkpoint_every
        if run_block is not None:
            for i, block in enumerate(self.layers):
                x = run_block(i, block, x)
        elif k and torch.is_grad_enabled():
            for start in range(0, len(self.layers), k):
                x = checkpoint(self._run_blocks, x, start, start + k, use_reentrant=False)
        else:
            x = self._run_blocks(x, 0, len(self.layers))
        return self.ln_final(x)


def set_attention(model: nn.Module, attention: str | AttentionFn) -> None:
    """Every attention layer of `model` runs `attention` from now on (parameters untouched): the same
    model timed with another kernel."""
    layers = [m for m in model.modules() if isinstance(m, CausalMultiHeadSelfAttention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no CausalMultiHeadSelfAttention layer")
    fn = get_attention(attention)
    for layer in layers:
        layer.attention = fn
        layer.attention_name = attention if isinstance(attention, str) else getattr(attention, "__name__", "custom")


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The language model's loss, written out as in assignment 1: the mean over all positions of
    -log softmax(logits)[target] = logsumexp(logits) - logits[target].

    `logits` has shape (..., vocab) and `targets` shape (...). Computed in fp32 whatever the
    input dtype, because logsumexp over a 10k vocabulary loses digits in bf16.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"cross_entropy: logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}")
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    target_logit = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (lse - target_logit).mean()
