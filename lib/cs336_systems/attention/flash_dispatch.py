"""Which kernels run a FlashAttention call: the dispatch between the Gluon kernels and the Triton kernels.

From a problem (the tensors' shapes, strides, dtype, device; causality; a `tiles` override) to a route:
the forward is the Gluon kernel (`GLUON`, where `flash_gluon.gluon_forward_applies`) or the Triton
kernel by a launch plan; the backward is the fused Gluon kernel, the two Triton kernels by their plans
(`BackwardRoute`), or None for inputs that the kernels cannot read in place or a non-dense upstream gradient
(the caller copies and decides in full).
Eager calls keep each geometry's route in `flash_launch.LAUNCHES` (the key holds everything a decision
reads), because at short sequences deriving it costs as much host time as the launches.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cs336_systems.attention.flash_configs import KernelConfig, config_for
from cs336_systems.attention.flash_gluon import gluon_backward_applies, gluon_forward_applies
from cs336_systems.attention.flash_launch import LAUNCHES, LaunchPlan
from cs336_systems.attention.flash_layout import INTERPRETED, head_dim_tile, read_in_place
from cs336_systems.attention.validation import check_triton_inputs

GLUON = "gluon"
_UNSEEN = object()


def kernel_config(kernel: str, q: torch.Tensor, n_k: int, is_causal: bool,
                  tiles: tuple[int, int] | None = None) -> KernelConfig:
    """The device's tuned configuration of `kernel`, its tiles replaced by `tiles` where given
    (a (Q_TILE, K_TILE) pair of powers of two >= 16; same warps and stages)."""
    n_q, d = q.shape[-2:]
    config = config_for(kernel, head_dim_tile(d), q.dtype, is_causal, n_q, n_k, q.device, q.numel() // (n_q * d))
    if tiles is not None:
        try:
            config = KernelConfig(tiles[0], tiles[1], config.num_warps, config.num_stages)
        except ValueError as err:
            raise ValueError(f"tiles = {tiles}: {err}") from None
    return config


def geometry_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                 tiles: tuple[int, int] | None) -> tuple:
    """What every routing decision of a call reads: shapes, strides, dtypes, devices and 16-byte alignment
    of q, k, v, causality, the fp32 matmul precision and the tiles (configurations enter through
    `config_for`, whose table changes clear the routes). Bad inputs raise the check's ValueError."""
    try:
        return (q.shape, q.stride(), q.dtype, q.device, q.data_ptr() % 16, k.shape, k.stride(), k.dtype, k.device,
                k.data_ptr() % 16, v.shape, v.stride(), v.dtype, v.device, v.data_ptr() % 16, bool(is_causal),
                torch.get_float32_matmul_precision(), tiles)
    except AttributeError:  # not a tensor: the check says which
        check_triton_inputs(q, k, v, is_causal, INTERPRETED)
        raise


def decide_forward(q, k, v, out, lse, is_causal: bool, tiles: tuple[int, int] | None) -> str | LaunchPlan:
    """GLUON, or the Triton forward's launch plan for these tensors; checks the inputs first."""
    check_triton_inputs(q, k, v, is_causal, INTERPRETED)
    if gluon_forward_applies(q, k, v, is_causal, INTERPRETED, tiles):
        return GLUON
    return LAUNCHES.plan("forward", (q, k, v, out, lse), is_causal, kernel_config("forward", q, k.shape[-2], is_causal, tiles))


def forward_route(key: tuple, q, k, v, out, lse, is_causal: bool, tiles: tuple[int, int] | None) -> str | LaunchPlan:
    """`decide_forward`, decided once per `geometry_key`."""
    route = LAUNCHES.forward_routes.get(key, _UNSEEN)
    if route is _UNSEEN:
        route = LAUNCHES.remember(LAUNCHES.forward_routes, key, decide_forward(q, k, v, out, lse, is_causal, tiles))
    return route


class BackwardRoute(NamedTuple):
    """The two Triton backward kernels' launch plans (dQ and D first, then dK/dV)."""

    dq: LaunchPlan
    dkdv: LaunchPlan


def decide_backward(q, k, v, out, grad_out, lse, is_causal: bool,
                    tiles: tuple[int, int] | None) -> str | BackwardRoute | None:
    """GLUON, the Triton kernels' plans, or None (the general path) where q, k or v would need a copy
    (`flash_layout.read_in_place`) or the upstream gradient or L is not contiguous. The gradients the plans
    write have the inputs' strides (`empty_like`)."""
    if not (all(read_in_place(t) for t in (q, k, v)) and grad_out.is_contiguous() and lse.is_contiguous()):
        return None
    if gluon_backward_applies(q, k, v, is_causal, INTERPRETED, tiles):
        return GLUON
    n_k = k.shape[-2]
    # D and the gradients as every call allocates them (contiguous, aligned): the plans read their geometry
    delta, grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (lse, q, k, v))
    return BackwardRoute(
        LAUNCHES.plan("dq", (q, k, v, out, grad_out, lse, delta, grad_q), is_causal,
                      kernel_config("dq", q, n_k, is_causal, tiles)),
        LAUNCHES.plan("dkdv", (q, k, v, grad_out, lse, delta, grad_k, grad_v), is_causal,
                      kernel_config("dkdv", q, n_k, is_causal, tiles)),
    )


def backward_route(forward_key: tuple, q, k, v, out, grad_out, lse, is_causal: bool,
                   tiles: tuple[int, int] | None) -> str | BackwardRoute | None:
    """`decide_backward`, decided once per forward geometry and upstream-gradient layout. O and L are the
    forward's own contiguous outputs, so the forward's key and the gradient's strides and alignment fix it."""
    key = (forward_key, grad_out.stride(), grad_out.data_ptr() % 16)
    route = LAUNCHES.backward_routes.get(key, _UNSEEN)
    if route is _UNSEEN:
        route = LAUNCHES.remember(LAUNCHES.backward_routes, key,
                                  decide_backward(q, k, v, out, grad_out, lse, is_causal, tiles))
    return route
