"""The attention implementations that benchmarks compare, each called as f(q, k, v, is_causal).

  triton          ours, `flash_attention_triton` (attention/api.py): FlashAttentionTriton's kernels,
                  eager calls through the C++ autograd node of attention/launch/native.py where it applies
  pytorch         the materialised softmax(Q Kᵀ/√d) V of attention/naive.py
  sdpa_flash      torch's scaled_dot_product_attention restricted with `sdpa_kernel` to one backend
  sdpa_cudnn
  sdpa_efficient

`relative_errors` checks one of them against the float64 reference (attention/reference.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention import AttentionFn
from cs336_systems.attention.naive import naive_attention
from cs336_systems.attention.reference import relative_error

SDPA_BACKENDS = {
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
}
IMPLEMENTATIONS = ("triton", "pytorch", *SDPA_BACKENDS)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    if q.dim() == 3:  # the fused backends take (batch, heads, seq, d) only
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=is_causal)[0]
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    from cs336_systems.attention.api import flash_attention_triton

    return flash_attention_triton(q, k, v, is_causal)


# Each CUDA-graph capture of the materialised attention left its graph's memory pool reserved (a little in it
# stayed allocated, likely cuBLAS's workspace) until a sweep ran out of memory; ours and the SDPA backends, which
# do not call cuBLAS, did not (docs/flash_attention_tuning.md).
NAIVE_NO_DEVICE_TIME = "each CUDA-graph capture kept its memory pool reserved, which exhausted the GPU over a sweep"


@dataclass(frozen=True)
class Implementation:
    """An attention function and the SDPA backend it is restricted to (None: no restriction)."""

    name: str
    apply: AttentionFn
    backend: SDPBackend | None = None
    # Why its device time is not measured (`measure_device_ms`), or None where it is.
    no_device_time: str | None = None

    def context(self) -> contextlib.AbstractContextManager:
        return sdpa_kernel(self.backend) if self.backend is not None else contextlib.nullcontext()


def implementation(name: str) -> Implementation:
    if name == "triton":
        return Implementation(name, _triton)
    if name == "pytorch":
        return Implementation(name, naive_attention, no_device_time=NAIVE_NO_DEVICE_TIME)
    if name in SDPA_BACKENDS:
        return Implementation(name, _sdpa, SDPA_BACKENDS[name])
    raise ValueError(f"unknown implementation {name!r}; choose among {', '.join(IMPLEMENTATIONS)}")


def is_no_kernel(err: BaseException) -> bool:
    """SDPA's refusal when the allowed backends cannot run these inputs (CUDA and CPU wordings)."""
    msg = str(err).lower()
    return isinstance(err, RuntimeError) and ("no available kernel" in msg or "no viable backend" in msg)


def relative_errors(
    impl: Implementation,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    is_causal: bool,
    reference: dict[str, torch.Tensor],
) -> dict[str, float]:
    """‖x − ref‖ / ‖ref‖ of O, dQ, dK, dV after one forward and backward of `impl` (NaN stays NaN), against
    `reference`, the dict of `reference_gradients` for the same inputs and upstream gradient."""
    q.grad = k.grad = v.grad = None
    with impl.context():
        out = impl.apply(q, k, v, is_causal)
        out.backward(grad_out)
    found = dict(O=out, dQ=q.grad, dK=k.grad, dV=v.grad)
    # A gradient that never arrived is as wrong as a NaN.
    errors = {name: float("nan") if x is None else relative_error(x, reference[name]) for name, x in found.items()}
    q.grad = k.grad = v.grad = None
    return errors
