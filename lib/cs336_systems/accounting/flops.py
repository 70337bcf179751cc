"""Model FLOPs of a TransformerLM step, and the FLOPs of the three parts of naive attention.

Matmul FLOPs count 2 per multiply-add. With N_mm = L (4 d^2 + 3 d F) + d V the parameters that
take part in matmuls (the embedding is a lookup, the norms are elementwise) and T = B S tokens:

    forward           2 N_mm T + 4 L B S^2 d          (Q K^T and P V, every score counted, as in PaLM's MFU)
    forward+backward  3 x forward                     (the backward does two matmuls per forward one)
                      = 6 N_mm T + 12 L B S^2 d

Inside one naive attention (per layer, H heads of size d_h = d / H):
    scores   Q K^T            2 B H S^2 d_h
    softmax  max, subtract, exp, sum, divide per score: 5 B H S^2
    output   P V              2 B H S^2 d_h
so the two matmuls do 4 d_h / 5 times the softmax's FLOPs (51x at d_h = 64).
"""

from __future__ import annotations

from cs336_systems.model import ModelConfig

__all__ = [
    "SOFTMAX_FLOPS_PER_SCORE",
    "attention_flops",
    "forward_flops",
    "matmul_parameter_count",
    "mfu",
    "model_flops",
]

SOFTMAX_FLOPS_PER_SCORE = 5
MODES = ("forward", "forward-backward", "train-step")


def matmul_parameter_count(config: ModelConfig) -> int:
    d, F, V, L = config.d_model, config.d_ff, config.vocab_size, config.num_layers
    return L * (4 * d * d + 3 * d * F) + d * V


def forward_flops(config: ModelConfig, batch: int, context: int) -> float:
    tokens = batch * context
    return 2.0 * matmul_parameter_count(config) * tokens + 4.0 * config.num_layers * batch * context**2 * config.d_model


def model_flops(config: ModelConfig, batch: int, context: int, mode: str) -> float:
    """FLOPs of one step of `mode`; the AdamW update (a few FLOPs per parameter) is not counted."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    return forward_flops(config, batch, context) * (1 if mode == "forward" else 3)


def attention_flops(config: ModelConfig, batch: int, context: int) -> dict[str, float]:
    """FLOPs of one layer's naive attention forward, by part (keys match the profiling ranges)."""
    heads, d_h = config.num_heads, config.d_model // config.num_heads
    scores = batch * heads * context * context
    return {
        "computing attention scores": 2.0 * scores * d_h,
        "computing softmax": float(SOFTMAX_FLOPS_PER_SCORE * scores),
        "final matmul": 2.0 * scores * d_h,
    }


def mfu(flops: float, seconds: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the ceiling."""
    if seconds <= 0 or peak_flops_per_second <= 0:
        raise ValueError(f"need positive time and ceiling, got {seconds} s and {peak_flops_per_second} FLOP/s")
    return flops / seconds / peak_flops_per_second
