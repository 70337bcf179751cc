"""Which kernels run a FlashAttention call, and the Python host path that runs them.

`decide` reads a problem once, in one order: the inputs checked into a `validation.Problem`, each Triton
kernel's tuned configuration (`configs.kernel_configs`), every rule applied at once (`heuristics.choose`,
told whether the tensors allow the Gluon kernels at all), then the launch plans built from those choices
(`launch.plans`). Its `Route` holds the forward (the Gluon kernel, `GluonForward`, or the Triton kernel's
plan) and the backward (the fused Gluon kernel, `GluonBackward`; the two Triton kernels' plans,
`BackwardRoute`; or None where q, k or v would need a copy, which the backward then makes before deciding
for the copies). The backward's plans are derived for the upstream gradient that autograd nearly always
passes, dense and aligned; any other takes a dense copy first. Eager calls keep each geometry's route in
`launch.plans.LAUNCHES` (the key holds everything a decision reads), because at short sequences deriving
it costs as much host time as the launches.

`flash_forward_with_route` and `flash_backward_triton` run a call's route: the Python autograd.Function
(`api.FlashAttentionTriton`) and the kept-output attention of the training step call them; the C++ node
(`launch.native`) replays the same routes' launches without Python. One host path serves eager and compiled
calls: while torch.compile traces, these two functions put the custom ops `cs336::flash_forward` and
`cs336::flash_backward` into the graph (with fake implementations for the shapes and FLOP formulas for the
partitioner), and each op runs this
same path when the graph runs, so a compiled call takes the kernels, configurations and plans an eager one
takes, and Dynamo never traces the launches (no graph break: `fullgraph=True` holds).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.utils.flop_counter import register_flop_formula

from cs336_systems.attention.configs import KernelConfigs, device_facts, kernel_configs, sm_count
from cs336_systems.attention.heuristics import Choices, choose
from cs336_systems.attention.launch.gluon import flash_backward_gluon, launch_forward_gluon
from cs336_systems.attention.launch.layout import INTERPRETED, as_rows, read_in_place, tma_compatible
from cs336_systems.attention.launch.plans import LAUNCHES, LaunchPlan
from cs336_systems.attention.validation import check_is_causal, check_triton_inputs


class GluonForward(NamedTuple):
    """The forward runs the Gluon kernel, its CTAs `section` heads per section."""

    section: int


class GluonBackward(NamedTuple):
    """The backward runs the fused Gluon kernel, its CTAs `section` heads per section."""

    section: int


class BackwardRoute(NamedTuple):
    """The two Triton backward kernels' launch plans (dQ and D first, then dK/dV)."""

    dq: LaunchPlan
    dkdv: LaunchPlan


class Route(NamedTuple):
    """The kernels and launch plans of one geometry (`decide`)."""

    is_causal: bool
    forward: GluonForward | LaunchPlan
    backward: GluonBackward | BackwardRoute | None  # None: q, k or v needs a copy first


def tma_readable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the Gluon kernels' descriptors can read q, k and v in place."""
    for t in (q, k, v):
        rows, strides = as_rows(t)
        if rows is not t or not tma_compatible(rows, strides):  # in place, through descriptors, or not at all
            return False
    return True


def decide(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, tiles: tuple[int, int] | None) -> Route:
    """The route of these (..., N, d) inputs (module docstring); bad inputs raise the check's ValueError.
    `tiles` overrides every Triton kernel's tiles and keeps the call on the Triton kernels."""
    configs, choices = rule_choices(q, k, v, is_causal, tiles)
    # The outputs and gradients as every call allocates them (contiguous, or empty_like's strides; aligned):
    # the plans read only their geometry, so meta tensors stand in for them.
    out = torch.empty(q.shape, dtype=q.dtype, device="meta")
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device="meta")
    grad_out, delta, grad_q, grad_k, grad_v = (torch.empty_like(t, device="meta") for t in (out, lse, q, k, v))
    in_place = all(read_in_place(t) for t in (q, k, v))
    if choices.gluon_forward:
        forward = GluonForward(choices.forward_section)
    else:
        forward = LAUNCHES.plan(
            "forward", (q, k, v, out, lse), is_causal, configs.forward, choices.kv_chunk, choices.forward_by_tma
        )
    if not in_place:
        backward = None
    elif choices.gluon_backward:
        backward = GluonBackward(choices.backward_section)
    else:
        backward = BackwardRoute(
            LAUNCHES.plan("dq", (q, k, v, out, grad_out, lse, delta, grad_q), is_causal, configs.dq, choices.dq_split),
            LAUNCHES.plan(
                "dkdv", (q, k, v, grad_out, lse, delta, grad_k, grad_v), is_causal, configs.dkdv, choices.dkdv_split
            ),
        )
    return Route(bool(is_causal), forward, backward)


def rule_choices(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool,
    tiles: tuple[int, int] | None,
    interpreted: bool = INTERPRETED,
) -> tuple[KernelConfigs, Choices]:
    """The Triton kernels' configurations and the rules' choices for these inputs, after their checks: the
    Gluon kernels are allowed only to compiled kernels on a CUDA device reading the rows in place through
    descriptors, without a tiles override."""
    problem = check_triton_inputs(q, k, v, is_causal, interpreted)
    configs = kernel_configs(problem, tiles)
    major = device_facts(q.device)[0] if q.is_cuda else 0
    gluon_readable = q.is_cuda and not interpreted and tiles is None and tma_readable(q, k, v)
    return configs, choose(problem, configs, major, sm_count(q.device), gluon_readable)


def gluon_kernels(q, k, v, is_causal: bool, interpreted: bool = INTERPRETED) -> tuple[bool, bool]:
    """Whether these inputs' forward runs the Gluon kernel and their backward the fused Gluon kernel, as the
    current rules decide (not the kept routes); `interpreted=False` asks what compiled kernels would do."""
    choices = rule_choices(q, k, v, is_causal, None, interpreted)[1]
    return choices.gluon_forward, choices.gluon_backward


def geometry_key(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, tiles: tuple[int, int] | None
) -> tuple | None:
    """What every routing decision of a call reads: shapes, strides, dtypes, devices and 16-byte alignment
    of q, k, v, causality, the fp32 matmul precision and the tiles (configurations enter through
    `config_for`, whose table changes clear the routes); None where an input is not a tensor."""
    try:
        return (
            q.shape,
            q.stride(),
            q.dtype,
            q.device,
            q.data_ptr() % 16,
            k.shape,
            k.stride(),
            k.dtype,
            k.device,
            k.data_ptr() % 16,
            v.shape,
            v.stride(),
            v.dtype,
            v.device,
            v.data_ptr() % 16,
            bool(is_causal),
            torch.get_float32_matmul_precision(),
            tiles,
        )
    except AttributeError:  # not a tensor: `decide`'s check says which
        return None


def route_of(q, k, v, is_causal: bool, tiles: tuple[int, int] | None) -> Route:
    """`decide`, decided once per `geometry_key`."""
    key = geometry_key(q, k, v, is_causal, tiles)
    route = LAUNCHES.routes.get(key)
    if route is None:
        route = decide(q, k, v, is_causal, tiles)
        LAUNCHES.remember(LAUNCHES.routes, key, route)
    return route


def flash_forward_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, tiles: tuple[int, int] | None = None
):
    """O and L (q.shape[:-1], fp32) of (..., N, d) inputs, eagerly: the Gluon kernel or `flash_fwd_kernel`, as
    `decide` routes them; bad inputs raise a ValueError that names the problem."""
    return flash_forward_with_route(q, k, v, is_causal, tiles)[:2]


def flash_forward_with_route(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, tiles: tuple[int, int] | None = None
):
    """`flash_forward_triton`'s O and L, and the inputs' `Route`, which `flash_backward_triton(..., route=route)`
    follows (the model's strided layout without copies). While torch.compile traces, the call is the custom
    op `cs336::flash_forward` (the same host path, run when the graph runs) and the route None."""
    check_is_causal(is_causal)  # on every call: a route found by its key skips the inputs' checks
    if torch.compiler.is_compiling():
        check_triton_inputs(q, k, v, is_causal, INTERPRETED)  # a bad input fails the trace with its own message
        out, lse = torch.ops.cs336.flash_forward(q, k, v, is_causal, tile_list(tiles))
        return out, lse, None
    route = route_of(q, k, v, is_causal, tiles)
    out, lse = forward_outputs(q)
    forward_into(route, q, k, v, out, lse)
    return out, lse, route


def forward_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty O (q's shape and dtype, contiguous) and L (q.shape[:-1], fp32) for a forward to write."""
    return (
        torch.empty(q.shape, dtype=q.dtype, device=q.device),
        torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device),
    )


def forward_into(route: Route, q, k, v, out, lse) -> None:
    """O and L into `out` and `lse` (`forward_outputs`) by `route`."""
    if type(route.forward) is GluonForward:
        launch_forward_gluon(q, k, v, out, lse, route.is_causal, route.forward.section)
    else:
        LAUNCHES.run("forward", route.forward, (q, k, v, out, lse))


def tile_list(tiles: tuple[int, int] | None) -> list[int] | None:
    """`tiles` as a custom op's argument (an int list); `tile_pair` reads it back."""
    return None if tiles is None else list(tiles)


def tile_pair(tiles: list[int] | None) -> tuple[int, int] | None:
    return None if tiles is None else (tiles[0], tiles[1])


@torch.library.custom_op("cs336::flash_forward", mutates_args=())
def flash_forward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, tiles: list[int] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """O and L (`flash_forward_with_route`'s host path): what a compiled graph calls."""
    out, lse = forward_outputs(q)
    forward_into(route_of(q, k, v, is_causal, tile_pair(tiles)), q, k, v, out, lse)
    return out, lse


@flash_forward_op.register_fake
def _(q, k, v, is_causal, tiles):
    return forward_outputs(q)


def attention_flops(q_shape, k_shape, is_causal: bool) -> int:
    """Multiply-add FLOPs of the forward's two products, S = Q K^T and O = P V (2 · 2 · N_q · N_k · d per
    head), over the (query, key) pairs the mask keeps: causal query i sees keys j <= i."""
    *lead, n_q, d = q_shape
    n_k = k_shape[-2]
    if is_causal:
        seen = min(n_q, n_k)
        pairs = seen * (seen + 1) // 2 + max(0, n_q - n_k) * n_k
    else:
        pairs = n_q * n_k
    return 4 * math.prod(lead) * pairs * d


# The FLOPs of the custom ops, for torch.utils.flop_counter and so for the min-cut partitioner, whose
# activation-memory budget trades saved activations against recompute by counted FLOPs: an op without a
# formula counts as free, and the partitioner recomputed the attention forward in the backward (its O and L
# are small beside the work). The backward is five products of the forward's size (S, dP, dV, dQ, dK).
@register_flop_formula(torch.ops.cs336.flash_forward)
def _(q_shape, k_shape, v_shape, is_causal, tiles, *args, **kwargs) -> int:
    return attention_flops(q_shape, k_shape, is_causal)


def is_dense(t: torch.Tensor) -> bool:
    """Whether `t` is contiguous and 16-byte aligned, as the routes' plans assume every O, L and upstream
    gradient is."""
    return t.is_contiguous() and t.data_ptr() % 16 == 0


def dense(t: torch.Tensor) -> torch.Tensor:
    """`t` if `is_dense`, else a contiguous copy."""
    return t if is_dense(t) else t.clone(memory_format=torch.contiguous_format)


def flash_backward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    grad_out: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
    route: Route | None = None,
    tiles: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (shapes and dtypes of q, k, v) from the two Triton kernels or the fused Gluon kernel, as
    the route decides. `route`: the one `flash_forward_with_route` returned with `out` and `lse` (None:
    decided here). While torch.compile traces, the call is the custom op `cs336::flash_backward` (this host
    path, run when the graph runs)."""
    if torch.compiler.is_compiling():
        # the dense copy (below) in the graph, where the compiler can fuse it into the gradient's producer
        grad_out, lse = grad_out.contiguous(), lse.contiguous()
        return torch.ops.cs336.flash_backward(q, k, v, out, grad_out, lse, is_causal, tile_list(tiles))
    if route is not None and route.backward is not None and is_dense(grad_out) and is_dense(lse):
        return backward_into(route, q, k, v, out, grad_out, lse)
    shapes = (q.shape, k.shape, v.shape)
    if not (read_in_place(q) and read_in_place(k) and read_in_place(v)):
        # (batch, N, d) rows, one copy (not one per kernel) where the leading dimensions do not merge, a view
        # where they do
        q, k, v = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    # An upstream gradient can be a broadcast (o.sum() gives stride-0 ones). The kernels could read it in
    # place, but streaming stride-0 tiles slowed the dK/dV kernel at the leaderboard shape; the
    # dense copy costs far less.
    out, grad_out, lse = dense(out), dense(grad_out), dense(lse)
    grads = backward_into(route_of(q, k, v, is_causal, tiles), q, k, v, out, grad_out, lse)
    return tuple(grad if grad.shape == shape else grad.view(shape) for grad, shape in zip(grads, shapes))


def backward_into(route: Route, q, k, v, out, grad_out, lse) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (the strides `empty_like` gives q, k, v) by `route`, whose backward is not None."""
    if type(route.backward) is GluonBackward:
        return flash_backward_gluon(q, k, v, out, grad_out, lse, route.is_causal, route.backward.section)
    delta = torch.empty_like(lse)  # written by the dQ kernel, read by the dK/dV kernel
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    LAUNCHES.run("dq", route.backward.dq, (q, k, v, out, grad_out, lse, delta, grads[0]))
    LAUNCHES.run("dkdv", route.backward.dkdv, (q, k, v, grad_out, lse, delta, grads[1], grads[2]))
    return grads


@torch.library.custom_op("cs336::flash_backward", mutates_args=())
def flash_backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    grad_out: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
    tiles: list[int] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (`flash_backward_triton`'s host path, decided in full): what a compiled graph calls. Each
    gradient has the strides `torch.empty_like` gives its input, as the fake below says: the kernels write
    rows where the input had to be copied, and those gradients are copied back into that layout."""
    grads = flash_backward_triton(q, k, v, out, grad_out, lse, is_causal, None, tile_pair(tiles))
    return tuple(in_layout_of(grad, t) for grad, t in zip(grads, (q, k, v)))


def in_layout_of(grad: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """`grad` in the strides `torch.empty_like(t)` gives (t's own where t is dense, else contiguous), copied
    only where they differ."""
    if grad.stride() == t.stride():
        return grad
    like = torch.empty_like(t)
    return grad if like.stride() == grad.stride() else like.copy_(grad)


@flash_backward_op.register_fake
def _(q, k, v, out, grad_out, lse, is_causal, tiles):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@register_flop_formula(torch.ops.cs336.flash_backward)
def _(q_shape, k_shape, v_shape, out, grad_out, lse, is_causal, tiles, *args, **kwargs) -> int:
    return 5 * attention_flops(q_shape, k_shape, is_causal) // 2
