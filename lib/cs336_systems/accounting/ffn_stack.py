"""Memory of a stack of two-layer FFN blocks: the XXL model of the spring 2025 handout, §2.4.

Each of the L blocks is  x → x W_in → (x W_in) W_out  with W_in: (D, F), W_out: (F, D) — attention,
embeddings, the output layer and the activation function are left out, since for very large models
nearly all FLOPs and parameters sit in the FFNs. Then

    parameters             P = 2 D F L
    training state         P · (4 + 4 + 4 + 4) bytes: FP32 master weights, accumulated gradients,
                           AdamW first and second moments
    saved for backward     each linear keeps its input, so T tokens save T L (D + F) BF16 values

Byte sizes come from the dtypes (`torch.float32.itemsize`), and units are explicit: GB = 10⁹ bytes,
GiB = 2³⁰ bytes. The functions are plain arithmetic, so they take numbers or sympy symbols.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import sympy as sp
import torch

from cs336_systems.accounting.symbolic import Quantity, crossing, positive_fraction

GB = 10**9
GiB = 2**30


@dataclass(frozen=True)
class FFNStack:
    """L = num_blocks blocks of W_in (d_model × d_ff) then W_out (d_ff × d_model); fields may be sympy symbols."""

    d_model: int
    d_ff: int
    num_blocks: int

    def __post_init__(self):
        for name in ("d_model", "d_ff", "num_blocks"):
            value = getattr(self, name)
            if isinstance(value, (int, float)) and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")

    @property
    def num_parameters(self) -> int:
        """P = 2 D F L: W_in (D × F) and W_out (F × D) in each of the L blocks."""
        return 2 * self.d_model * self.d_ff * self.num_blocks

    def saved_values_per_token(self, tp_degree: Quantity = 1) -> Quantity:
        """L (D + F/N_TP): the inputs of W_in (D values) and of W_out (F values, split over TP devices)."""
        return self.num_blocks * (self.d_model + self.d_ff / tp_degree)


XXL = FFNStack(d_model=16384, d_ff=53248, num_blocks=126)


@dataclass(frozen=True)
class Accelerator:
    """What the accounting needs of a chip: memory (bytes), dense BF16 FLOP/s, link bandwidth (bytes/s)."""

    name: str
    memory_bytes: float
    flops_per_s: float
    bandwidth: float


# The handout's numbers for TPU v5p (from the TPU Scaling Book): W_ici = 2 · 9·10¹⁰ bytes/s bidirectional.
TPU_V5P = Accelerator("TPU v5p", memory_bytes=95 * GB, flops_per_s=4.6e14, bandwidth=2 * 9e10)
# H100 SXM data sheet: 80 GB HBM3, 989 TFLOP/s dense BF16, NVLink 4 at 900 GB/s both ways = 450 GB/s egress.
H100 = Accelerator("H100 SXM 80GB", memory_bytes=80 * GB, flops_per_s=989e12, bandwidth=450 * GB)


def training_state_bytes(stack: FFNStack, dtype: torch.dtype = torch.float32) -> dict[str, int]:
    """Bytes of each per-parameter tensor of mixed-precision AdamW training: P · itemsize each."""
    per_tensor = stack.num_parameters * dtype.itemsize
    return {
        "master weights": per_tensor,
        "accumulated gradients": per_tensor,
        "AdamW first moment": per_tensor,
        "AdamW second moment": per_tensor,
    }


def stack_saved_activation_bytes(
    stack: FFNStack,
    tokens: Quantity,
    dtype: torch.dtype = torch.bfloat16,
    tp_degree: Quantity = 1,
) -> Quantity:
    """T L (D + F/N_TP) · itemsize: what autograd keeps for the weight gradients of T tokens."""
    return tokens * stack.saved_values_per_token(tp_degree) * dtype.itemsize


def in_units(num_bytes: float) -> dict[str, float]:
    """The same size in GB (10⁹ bytes) and GiB (2³⁰ bytes)."""
    return {"GB": num_bytes / GB, "GiB": num_bytes / GiB}


def training_state_table(stack: FFNStack, dtype: torch.dtype = torch.float32) -> pd.DataFrame:
    """One row per training-state tensor and their total, with bytes per parameter, GB and GiB."""
    parts = training_state_bytes(stack, dtype)
    parts["total"] = sum(parts.values())
    return pd.DataFrame(
        [
            dict(
                component=name,
                dtype=str(dtype).removeprefix("torch."),
                bytes_per_parameter=b / stack.num_parameters,
                bytes=b,
                **in_units(b),
            )
            for name, b in parts.items()
        ]
    )


def devices_worth(num_bytes: float, accelerator: Accelerator) -> float:
    """How many devices' memory `num_bytes` fills (fractional; round up to fit)."""
    return num_bytes / accelerator.memory_bytes


def fsdp_memory_per_device(
    state_bytes: Quantity,
    activation_bytes: Quantity,
    n_fsdp: Quantity,
    sharded_activation_fraction: Quantity = 0.5,
) -> Quantity:
    """M = (S + a A) / N_FSDP + (1 − a) A: the training state S and a fraction a of the activations A
    (the handout: half, every second layer) are sharded over N_FSDP devices, the rest is replicated."""
    sharded = state_bytes + sharded_activation_fraction * activation_bytes
    return sharded / n_fsdp + (1 - sharded_activation_fraction) * activation_bytes


def fsdp_devices_to_fit(
    state_bytes: Quantity,
    activation_bytes: Quantity,
    capacity_bytes: Quantity,
    sharded_activation_fraction: Quantity = 0.5,
) -> Quantity:
    """The N_FSDP at which the per-device memory equals the capacity M (solved by sympy); it fits above it.

    N = (S + a A) / (M − (1 − a) A); no N fits once the replicated part (1 − a) A alone fills M.
    """
    headroom = sp.sympify(capacity_bytes - (1 - sharded_activation_fraction) * activation_bytes)
    if headroom.is_number and headroom <= 0:
        raise ValueError(
            f"the replicated activations alone fill the {capacity_bytes / GB:.1f} GB device: no N_FSDP fits"
        )
    return crossing(
        lambda n: fsdp_memory_per_device(state_bytes, activation_bytes, n, sharded_activation_fraction),
        lambda n: capacity_bytes,
        "N_FSDP",
        form=positive_fraction,
    )


def fsdp_fit_table(stack: FFNStack, token_counts: list[int], accelerator: Accelerator) -> pd.DataFrame:
    """Smallest integer N_FSDP that fits the state plus the saved activations of T tokens, per T."""
    state = sum(training_state_bytes(stack).values())
    rows = []
    for tokens in token_counts:
        activations = stack_saved_activation_bytes(stack, tokens)
        try:
            n = math.floor(fsdp_devices_to_fit(state, activations, accelerator.memory_bytes)) + 1
            per_device = float(fsdp_memory_per_device(state, activations, n))
        except ValueError:
            n, per_device = None, None
        rows.append(
            dict(
                tokens=tokens,
                activations_GB=activations / GB,
                min_N_FSDP=n,
                per_device_GB=None if per_device is None else per_device / GB,
            )
        )
    return pd.DataFrame(rows)


def stack_memory_per_device(stack: FFNStack, tokens: Quantity, strategy: str, n: Quantity) -> Quantity:
    """Bytes per device for T tokens of a global batch on n devices (state in FP32, activations in BF16):

    DP    S + A(T/N)                   state replicated, batch split
    FSDP  S/N + A(T/N)                 state and batch split
    TP    S/N + T L (D + F/N) · 2      state split, every device sees all T tokens and keeps the
                                       full input of W_in but only its F/N slice of W_out's input
    """
    state = sum(training_state_bytes(stack).values())
    if strategy == "DP":
        return state + stack_saved_activation_bytes(stack, tokens / n)
    if strategy == "FSDP":
        return state / n + stack_saved_activation_bytes(stack, tokens / n)
    if strategy == "TP":
        return state / n + stack_saved_activation_bytes(stack, tokens, tp_degree=n)
    raise ValueError(f"unknown strategy {strategy!r}; choose DP, FSDP or TP")


def devices_table(sizes: dict[str, float], accelerator: Accelerator) -> pd.DataFrame:
    """Each named size in GB and GiB and as a count of the accelerator's memory (fractional and rounded up)."""
    return pd.DataFrame(
        [
            dict(
                quantity=name,
                **in_units(b),
                devices=devices_worth(b, accelerator),
                whole_devices=math.ceil(devices_worth(b, accelerator)),
            )
            for name, b in sizes.items()
        ]
    )
