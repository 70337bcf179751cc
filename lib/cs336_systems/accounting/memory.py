"""Analytic memory of a TransformerLM step: parameters, gradients, AdamW state, saved activations.

Notation: B batch, S context, d d_model, H heads, d_h = d/H, F d_ff, V vocab, L layers,
N parameters. fp32 master weights in every case; "bf16" means torch.autocast(bfloat16).

    parameters     4N bytes          N = V d + L (4 d^2 + 3 d F + 2 d) + d + d V   (untied head)
    gradients      4N bytes          (modes with a backward pass)
    AdamW state    8N bytes          m and v, fp32 (train-step)
    activations    what autograd saves for backward, enumerated tensor by tensor below from
                   the code of model.py and attention/naive.py (checked against
                   torch.autograd.graph.saved_tensors_hooks in tests/test_memory_model.py)

Per block, fp32, naive attention (E = 4 bytes), the saved tensors are
    RMSNorm x2:     input, x*rms, output (B S d each), rms (B S)
    RoPE:           cos and sin rows for q and k (S d_h/2 each, 4 tensors)
    attention:      q, k, v (B S d), causal mask (S^2 bool), masked scores, exp, probs (B H S^2),
                    row max and row sum (B H S), the merged heads fed to W_o (B S d)
    SwiGLU:         W1 x, sigmoid(W1 x), SiLU(W1 x), W3 x, their product (B S F each)
    = E (10 BSd + 2 BS + 2 S d_h + 2 BHS + 3 BHS^2 + 5 BSF) + S^2 bytes.
Under bf16 autocast the matmul inputs are bf16 copies (one per projection: autocast caches only
weight casts, not activation casts), every weight gets a bf16 copy that its matmul saves, and on
CUDA exp and sum run in fp32 (autocast's fp32 list), so the attention saves 8 bytes per score
element instead of 12 (6 with CPU autocast, which keeps exp/sum in bf16).
Flash-style attention (sdpa, flash_pytorch, flash_triton) saves q, k, v, the output and the
logsumexp (B H S, fp32) instead of the S^2 tensors.

Peak of a step (steady state, after the first optimizer step; P parameters, O AdamW state):
    forward (no_grad)   P + batch + the largest set of temporaries alive inside one layer
    with backward       P + batch + O + the largest of
                          - the start of the backward: all saved activations + the loss's four
                            (B, S, V) fp32 gradient temporaries,
                          - each sublayer's backward, walking down the stack: the activations
                            still saved + the gradients already made + that sublayer's temporaries
                            (for naive attention, five score-sized tensors in the softmax's backward),
                          - the end: all gradients + AdamW's one parameter-sized temporary.
With recomputation (`checkpoint_every=k` blocks, or `checkpoint_sublayers=s` halves of blocks)
only each segment's input (B S d, fp32) is saved, and a segment's activations exist only while
its backward runs. Checked against measured peaks on CPU in tests/test_memory_model.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from cs336_systems.model import ModelConfig

__all__ = [
    "FUSED_ATTENTION",
    "Dims",
    "batch_bytes",
    "block_saved_tensors",
    "describe_size",
    "head_saved_tensors",
    "memory_estimate",
    "parameter_count",
    "predicted_peaks",
    "residual_stream_bytes",
    "saved_activation_bytes",
    "tensor_shapes",
]

FUSED_ATTENTION = ("sdpa", "flash_pytorch", "flash_triton")
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Dims:
    B: int
    S: int
    d: int
    H: int
    F: int
    V: int
    L: int

    @property
    def d_h(self) -> int:
        return self.d // self.H

    @classmethod
    def of(cls, config: ModelConfig, batch: int, context: int) -> Dims:
        if batch < 1 or context < 1:
            raise ValueError(f"batch and context must be positive, got batch={batch}, context={context}")
        if config.d_model % config.num_heads:
            raise ValueError(f"d_model={config.d_model} is not divisible by num_heads={config.num_heads}")
        return cls(batch, context, config.d_model, config.num_heads, config.d_ff, config.vocab_size, config.num_layers)


def parameter_count(config: ModelConfig) -> int:
    """N = V d (embedding) + L (4 d^2 + 3 d F + 2 d) + d (final norm) + d V (untied head)."""
    d, F, V, L = config.d_model, config.d_ff, config.vocab_size, config.num_layers
    return V * d + L * (4 * d * d + 3 * d * F + 2 * d) + d + d * V


def residual_stream_bytes(batch: int, context: int, d_model: int, bytes_per_element: int = 4) -> int:
    """One activation of the residual stream: B x S x d_model elements."""
    return batch * context * d_model * bytes_per_element


def _check(precision: str, attention: str, autocast_device: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if attention != "naive" and attention not in FUSED_ATTENTION:
        raise ValueError(f"unknown attention {attention!r}; choose naive or one of {', '.join(FUSED_ATTENTION)}")
    if autocast_device not in ("cuda", "cpu"):
        raise ValueError(f"autocast_device must be 'cuda' or 'cpu', got {autocast_device!r}")


def block_saved_tensors(
    config: ModelConfig,
    batch: int,
    context: int,
    precision: str = "fp32",
    attention: str = "naive",
    autocast_device: str = "cuda",
) -> pd.DataFrame:
    """Tensors one TransformerBlock saves for backward: tensor, part, elements, bytes per element, bytes.

    `part` says when the backward releases them: "feed-forward" (RMSNorm 2 and SwiGLU) and
    "attention output" (probs, W_o's input) go before the softmax's backward, "attention" after.
    """
    _check(precision, attention, autocast_device)
    n = Dims.of(config, batch, context)
    BSd, BS, BSF, BHS, BHSS = n.B * n.S * n.d, n.B * n.S, n.B * n.S * n.F, n.B * n.H * n.S, n.B * n.H * n.S * n.S
    bf16 = precision == "bf16"
    act = 2 if bf16 else 4  # matmul inputs/outputs
    att, out, ffn = "attention", "attention output", "feed-forward"
    rows = [
        ("RMSNorm input, x*rms", att, 2 * BSd, 4),
        ("RMSNorm rms", att, BS, 4),
        ("RMSNorm input, x*rms", ffn, 2 * BSd, 4),
        ("RMSNorm rms", ffn, BS, 4),
        ("RoPE cos/sin rows", att, 2 * n.S * n.d_h, act),
    ]
    if bf16:
        rows += [
            ("bf16 copies of RMSNorm output (q, k, v)", att, 3 * BSd, 2),
            ("bf16 copies of RMSNorm output (W1, W3)", ffn, 2 * BSd, 2),
            ("bf16 copies of W_q, W_k, W_v", att, 3 * n.d * n.d, 2),
            ("bf16 copy of W_o", out, n.d * n.d, 2),
            ("bf16 copies of W1, W2, W3", ffn, 3 * n.d * n.F, 2),
        ]
    else:
        rows += [("RMSNorm output", att, BSd, 4), ("RMSNorm output", ffn, BSd, 4)]
    rows += [("q, k (after RoPE), v", att, 3 * BSd, act), ("merged heads (W_o input)", out, BSd, act)]
    if attention == "naive":
        exp_bytes = 4 if not bf16 or autocast_device == "cuda" else 2
        rows += [
            ("causal mask", att, n.S * n.S, 1),
            ("masked scores", att, BHSS, act),
            ("exp(scores - max)", att, BHSS, exp_bytes),
            ("probs (input of probs @ V)", out, BHSS, act),
            ("row max", att, BHS, act),
            ("row sum", att, BHS, exp_bytes),
        ]
    else:
        rows += [("attention output", att, BSd, act), ("logsumexp", att, BHS, 4)]
    rows += [("SwiGLU W1 x, sigmoid, SiLU, W3 x, product", ffn, 5 * BSF, act)]
    df = pd.DataFrame(rows, columns=["tensor", "part", "elements", "bytes_per_element"])
    df["bytes"] = df["elements"] * df["bytes_per_element"]
    return df


def head_saved_tensors(config: ModelConfig, batch: int, context: int, precision: str = "fp32") -> pd.DataFrame:
    """Saved outside the blocks: final RMSNorm, LM head input/weight copy, fp32 logits and logsumexp of the loss."""
    n = Dims.of(config, batch, context)
    BSd, BS = n.B * n.S * n.d, n.B * n.S
    rows = [("final RMSNorm input, x*rms", 2 * BSd, 4), ("final RMSNorm rms", BS, 4)]
    if precision == "bf16":
        rows += [("bf16 copy of final RMSNorm output", BSd, 2), ("bf16 copy of LM head weight", n.V * n.d, 2)]
    else:
        rows += [("final RMSNorm output", BSd, 4)]
    rows += [("logits, fp32 (loss input)", BS * n.V, 4), ("logsumexp of the loss", BS, 4)]
    df = pd.DataFrame(rows, columns=["tensor", "elements", "bytes_per_element"])
    df["bytes"] = df["elements"] * df["bytes_per_element"]
    return df


def batch_bytes(batch: int, context: int) -> int:
    """The int64 token batch: inputs and targets are views of one (B, S+1) tensor."""
    return batch * (context + 1) * 8


def _segments(num_layers: int, checkpoint_every: int | None, checkpoint_sublayers: int | None) -> int | None:
    """Recomputation segment length in sublayers (attention, feed-forward: two per block), or None."""
    if checkpoint_every is not None and checkpoint_sublayers is not None:
        raise ValueError("give checkpoint_every (blocks) or checkpoint_sublayers, not both")
    if checkpoint_every is not None:
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be a positive number of blocks, got {checkpoint_every}")
        return 2 * min(checkpoint_every, num_layers)
    if checkpoint_sublayers is not None:
        if checkpoint_sublayers < 1:
            raise ValueError(f"checkpoint_sublayers must be positive, got {checkpoint_sublayers}")
        return min(checkpoint_sublayers, 2 * num_layers)
    return None


def saved_activation_bytes(
    config: ModelConfig,
    batch: int,
    context: int,
    precision: str = "fp32",
    attention: str = "naive",
    checkpoint_every: int | None = None,
    autocast_device: str = "cuda",
    checkpoint_sublayers: int | None = None,
) -> int:
    """Bytes saved for backward at the end of the forward pass (the batch not included)."""
    head = int(head_saved_tensors(config, batch, context, precision)["bytes"].sum())
    segment = _segments(config.num_layers, checkpoint_every, checkpoint_sublayers)
    if segment:
        groups = math.ceil(2 * config.num_layers / segment)
        return groups * residual_stream_bytes(batch, context, config.d_model) + head
    block = int(block_saved_tensors(config, batch, context, precision, attention, autocast_device)["bytes"].sum())
    return config.num_layers * block + head


def _forward_temporaries(n: Dims, precision: str, attention: str, autocast_device: str) -> int:
    """Largest set of tensors alive at once inside one layer of an inference forward."""
    act = 2 if precision == "bf16" else 4
    BSd, BSF, BHSS = n.B * n.S * n.d, n.B * n.S * n.F, n.B * n.H * n.S * n.S
    residual = 2 * BSd * 4  # the residual stream and the RMSNorm output
    if attention == "naive":
        # scores, scores - max, exp, exp / sum are alive together inside softmax.
        exp_bytes = 4 if precision == "fp32" or autocast_device == "cuda" else 2
        attention_peak = 3 * BSd * act + BHSS * (2 * act + 2 * exp_bytes)
    else:
        attention_peak = 4 * BSd * act
    ffn_peak = 4 * BSF * act  # W1 x, sigmoid, SiLU, W3 x
    head_peak = n.B * n.S * n.V * act
    if precision == "bf16":  # the bf16 copy of the weight being multiplied is a temporary too
        attention_peak += n.d * n.d * 2
        ffn_peak += n.d * n.F * 2
        head_peak += n.V * n.d * 2
    return residual + max(attention_peak, ffn_peak, head_peak)


def _loss_backward_temporaries(n: Dims) -> int:
    """The loss's backward holds four (B, S, V) fp32 tensors besides the saved logits: exp(logits - lse),
    the logsumexp gradient, the gather's scattered gradient and their sum (measured on CPU)."""
    return 4 * n.B * n.S * n.V * 4


def _sublayers(
    config: ModelConfig, batch: int, context: int, precision: str, attention: str, autocast_device: str
) -> list[dict]:
    """Per sublayer of one block, bottom to top: bytes saved, parameter-gradient bytes, and the bytes
    above its saved tensors (and the gradients of everything above it) at the peak of its backward.

    Attention (naive): the peak is the softmax's division backward; the attention-output tensors
    (probs, W_o's input) are freed by then, W_o's gradient exists, and the probabilities' gradient
    plus four score-sized temporaries (grad / sum, exp / sum, negation, product) are alive.
    Attention (fused): dq, dk, dv. Feed-forward: two (B, S, F) gradients inside SwiGLU's backward.
    """
    n = Dims.of(config, batch, context)
    act = 2 if precision == "bf16" else 4
    table = block_saved_tensors(config, batch, context, precision, attention, autocast_device)
    by_part = table.groupby("part")["bytes"].sum()
    attn_saved = int(by_part.get("attention", 0) + by_part.get("attention output", 0))
    ffn_saved = int(by_part.get("feed-forward", 0))
    if attention == "naive":
        div_bytes = 4 if precision == "fp32" or autocast_device == "cuda" else 2
        # On CUDA the bf16 gradient of the probabilities is cast back to fp32 for the fp32 division.
        temps = n.B * n.H * n.S * n.S * (div_bytes + 4 * div_bytes)
        attn_extra = 4 * n.d * n.d + temps - int(by_part.get("attention output", 0))
    else:
        attn_extra = 4 * n.d * n.d + 3 * n.B * n.S * n.d * 4
    return [
        dict(name="attention", saved=attn_saved, grads=4 * (4 * n.d * n.d + n.d), extra=attn_extra),
        dict(name="feed-forward", saved=ffn_saved, grads=4 * (3 * n.d * n.F + n.d), extra=2 * n.B * n.S * n.F * act),
    ]


def _backward_peak(
    config: ModelConfig,
    batch: int,
    context: int,
    precision: str,
    attention: str,
    autocast_device: str,
    segment: int | None,
) -> tuple[int, str]:
    """Walk the backward pass top to bottom, tracking saved activations and gradients; return the
    largest total (above parameters, batch and optimizer state) and where it happens.

    Without recomputation every sublayer's saved tensors exist from the start; with segments of
    `segment` sublayers only each segment's input (B S d, fp32) is kept, and a segment's tensors
    are recomputed just before its backward.
    """
    n = Dims.of(config, batch, context)
    sublayers = _sublayers(config, batch, context, precision, attention, autocast_device) * n.L
    head = int(head_saved_tensors(config, batch, context, precision)["bytes"].sum())
    checkpoint = residual_stream_bytes(batch, context, n.d)
    starts = list(range(0, len(sublayers), segment)) if segment else [0]
    live = (len(starts) * checkpoint if segment else sum(s["saved"] for s in sublayers)) + head
    peak, where = live + _loss_backward_temporaries(n), "start of backward"
    live -= head
    grads = 4 * (n.V * n.d + n.d)  # LM head and final RMSNorm
    for first in reversed(starts):
        group = sublayers[first : first + segment] if segment else sublayers
        recomputed = sum(s["saved"] for s in group) if segment else 0
        for i in reversed(range(len(group))):
            sub = group[i]
            total = live + recomputed + grads + sub["extra"]
            if total > peak:
                peak = total
                where = f"backward of block {(first + i) // 2}'s {sub['name']}" + (" (recomputed)" if segment else "")
            if segment:
                recomputed -= sub["saved"]
            else:
                live -= sub["saved"]
            grads += sub["grads"]
        if segment:
            live -= checkpoint
    return peak, where


def memory_estimate(
    config: ModelConfig,
    batch: int,
    context: int,
    mode: str = "train-step",
    precision: str = "fp32",
    attention: str = "naive",
    checkpoint_every: int | None = None,
    autocast_device: str = "cuda",
    checkpoint_sublayers: int | None = None,
) -> dict:
    """Bytes per component and the predicted peak of one steady-state step of `mode`.

    peak = parameters + batch + optimizer_state + step_peak, where step_peak is what the step adds
    at its peak (`peak_at` names the moment); `gradients` and `activations` are the full sizes.
    """
    if mode not in ("forward", "forward-backward", "train-step"):
        raise ValueError(f"unknown mode {mode!r}; choose forward, forward-backward or train-step")
    _check(precision, attention, autocast_device)
    n = Dims.of(config, batch, context)
    N = parameter_count(config)
    params, tokens = 4 * N, batch_bytes(batch, context)
    out = dict(parameters=params, batch=tokens, optimizer_state=0, gradients=0, activations=0)
    if mode == "forward":
        out["step_peak"] = _forward_temporaries(n, precision, attention, autocast_device)
        out["peak"] = params + tokens + out["step_peak"]
        out["peak_at"] = "inside a layer's forward"
        return out
    grads = 4 * N
    optimizer = 8 * N if mode == "train-step" else 0
    segment = _segments(n.L, checkpoint_every, checkpoint_sublayers)
    acts = saved_activation_bytes(config, batch, context, precision, attention, None, autocast_device, segment)
    step_peak, peak_at = _backward_peak(config, batch, context, precision, attention, autocast_device, segment)
    # AdamW's sqrt(v) + eps is one temporary the size of the parameter being updated.
    end = grads + (4 * max(n.V * n.d, n.d * n.F) if mode == "train-step" else 0)
    if end > step_peak:
        step_peak, peak_at = end, "end of backward" if mode == "forward-backward" else "optimizer step"
    out.update(optimizer_state=optimizer, gradients=grads, activations=acts, step_peak=step_peak)
    out["peak"] = params + tokens + optimizer + step_peak
    out["peak_at"] = peak_at
    return out


def tensor_shapes(config: ModelConfig, batch: int, context: int) -> dict[str, int]:
    """Element counts of the model's recurring tensors, to name an allocation by its size."""
    n = Dims.of(config, batch, context)
    return {
        "B×H×S×S (attention scores / probabilities)": n.B * n.H * n.S * n.S,
        "B×S×V (logits)": n.B * n.S * n.V,
        "B×S×F (SwiGLU hidden)": n.B * n.S * n.F,
        "B×S×d (residual stream)": n.B * n.S * n.d,
        "V×d (embedding / LM head weight)": n.V * n.d,
        "d×F (SwiGLU weight)": n.d * n.F,
        "d×d (attention projection weight)": n.d * n.d,
    }


def describe_size(size_bytes: int, config: ModelConfig, batch: int, context: int) -> str:
    """Which recurring tensor (and dtype) an allocation of `size_bytes` is, or "" if none fits.

    The CUDA caching allocator rounds requests up to a multiple of 512 bytes, so a size matches a
    tensor of e elements and b bytes per element when e*b <= size < e*b + 512.
    """
    for name, elements in tensor_shapes(config, batch, context).items():
        for dtype, width in (("fp32", 4), ("bf16", 2)):
            if elements * width <= size_bytes < elements * width + 512:
                return f"{name}, {dtype}"
    return ""


def predicted_peaks(rows: pd.DataFrame, autocast_device: str = "cuda") -> pd.DataFrame:
    """Per benchmark row (size, context_length, batch_size, mode, precision[, attention, checkpoint_every]):
    `predicted_peak_gib`, the analytic peak of its step, and `predicted_states_gib`, what parameters,
    gradients and optimizer state take of it before any activation. NaN for rows without a size name."""
    from cs336_systems.model import MODEL_SIZES

    def one(r) -> tuple[float, float]:
        if r.get("size") not in MODEL_SIZES:
            return math.nan, math.nan
        every = r.get("checkpoint_every")
        config = ModelConfig.from_size(r["size"], context_length=int(r["context_length"]))
        m = memory_estimate(
            config,
            int(r["batch_size"]),
            int(r["context_length"]),
            r["mode"],
            r.get("precision", "fp32"),
            r.get("attention", "naive"),
            None if pd.isna(every) else int(every),
            autocast_device,
        )
        return m["peak"] / 2**30, (m["parameters"] + m["gradients"] + m["optimizer_state"]) / 2**30

    values = [one(r) for r in rows.to_dict("records")]
    return pd.DataFrame(values, columns=["predicted_peak_gib", "predicted_states_gib"], index=rows.index)
