"""Input checks shared by the FlashAttention-2 implementations.

Both take q of shape (..., N_q, d) and k, v of shape (..., N_k, d) with the same leading
dimensions, device and dtype, and a bool is_causal. A bad input raises a ValueError (a TypeError for
is_causal) that names what is wrong, before any kernel runs (a Triton kernel fed a wrong shape fails
far less legibly, or silently).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cs336_systems.triton_support.interpreter import NeedsTritonInterpreter

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TRITON_MAX_HEAD_DIM = 256


def head_dim_tile(d: int) -> int:
    """The kernels' on-chip head dimension: the next power of two, at least 16 (tl.dot's smallest)."""
    return max(16, 1 << (d - 1).bit_length())  # triton.next_power_of_2 is a JIT helper, far slower per call


def _describe(name: str, t: torch.Tensor) -> str:
    return f"{name} {tuple(t.shape)} {t.dtype} on {t.device}"


def check_is_causal(is_causal: bool) -> None:
    """TypeError unless `is_causal` is a Python bool, as scaled_dot_product_attention requires: a string
    "False" or a tensor would otherwise be read by its truth value."""
    if is_causal is not True and is_causal is not False:
        raise TypeError(f"is_causal must be a bool, not {type(is_causal).__name__}")


def check_attention_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool,
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
) -> None:
    """Shapes (..., N_q, d) / (..., N_k, d) / (..., N_k, d), one device, one dtype among `dtypes`; a bool
    `is_causal`."""
    check_is_causal(is_causal)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    # Read once: every attribute access builds a new Python object, and this runs on every call.
    qs, ks, vs = q.shape, k.shape, v.shape
    for name, shape in (("q", qs), ("k", ks), ("v", vs)):
        if len(shape) < 2:
            raise ValueError(f"{name} must have shape (..., seq, d), got {tuple(shape)}")
        if shape[-2] == 0 or shape[-1] == 0:
            raise ValueError(f"{name} has an empty sequence or head dimension: {tuple(shape)}")

    # Described only on failure: formatting three tensors costs as much as a short kernel.
    def described() -> str:
        return ", ".join(_describe(n, t) for n, t in (("q", q), ("k", k), ("v", v)))

    if not (qs[-1] == ks[-1] == vs[-1]):
        raise ValueError(f"q, k and v must share the last (head) dimension; got {described()}")
    if not (qs[:-2] == ks[:-2] == vs[:-2]):
        raise ValueError(f"q, k and v must share the leading (batch, head) dimensions; got {described()}")
    if ks[-2] != vs[-2]:
        raise ValueError(f"k and v must have the same sequence length; got {described()}")
    device, dtype = q.device, q.dtype
    if not (device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device; got {described()}")
    if not (dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must have one dtype; got {described()}")
    if dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"dtype {dtype} is not supported here (supported: {names})")


class Problem(NamedTuple):
    """The numbers of a checked attention call that every routing decision reads (`check_triton_inputs`):
    (..., N_q, d) queries against (..., N_k, d) keys, `batch` the product of the leading dimensions."""

    n_q: int
    n_k: int
    d: int
    batch: int
    dtype: torch.dtype
    device: torch.device
    is_causal: bool

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, is_causal: bool) -> Problem:
        """The problem of (..., N_q, d) queries `q` and keys `k`, unchecked."""
        n_q, d = q.shape[-2:]
        return cls(n_q, k.shape[-2], d, q.numel() // (n_q * d), q.dtype, q.device, is_causal)


def check_triton_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, interpreted: bool
) -> Problem:
    """The general checks, plus what the Triton kernels need: head dim <= 256, a GPU or the interpreter;
    returns the call's `Problem`."""
    check_attention_inputs(q, k, v, is_causal)
    problem = Problem.of(q, k, is_causal)
    d = problem.d
    if d > TRITON_MAX_HEAD_DIM:
        raise ValueError(
            f"head dimension {d} is not supported by the Triton kernels: any d <= {TRITON_MAX_HEAD_DIM} works "
            f"(padded on chip to the next power of two, at least 16)"
        )
    device_type = q.device.type
    if device_type == "cuda":
        return problem
    if device_type == "cpu" and not interpreted:
        raise NeedsTritonInterpreter(
            "the Triton kernels got CPU tensors: move q, k, v to a CUDA device, or set TRITON_INTERPRET=1 "
            "before triton is first imported to run them in the (slow) Triton interpreter"
        )
    if device_type != "cpu":
        raise ValueError(f"the Triton kernels run on CUDA devices (or the CPU interpreter), got {q.device}")
    return problem
