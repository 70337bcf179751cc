"""Which kernels run a FlashAttention call, and the Python host path that runs them.

From a problem (the tensors' shapes, strides, dtype, device; causality; a `tiles` override) to a route:
the forward is the Gluon kernel (`GLUON`, where `gluon_forward_applies`: the rules of `heuristics` and the
tensors' own facts) or the Triton kernel by a launch plan; the backward is the fused Gluon kernel, the two
Triton kernels by their plans (`BackwardRoute`), or None for inputs that the kernels cannot read in place
or a non-dense upstream gradient (the caller copies and decides in full). Eager calls keep each geometry's
route in `launch.plans.LAUNCHES` (the key holds everything a decision reads), because at short sequences
deriving it costs as much host time as the launches.

`flash_forward_with_route` and `flash_backward_triton` run a call's routes: the Python autograd.Function
(`api.FlashAttentionTriton`) and the kept-output attention of the training step call them; the C++ node
(`launch.native`) replays the same routes' launches without Python. One host path serves eager and compiled
calls: while torch.compile traces, these two functions put the custom ops `cs336::flash_forward` and
`cs336::flash_backward` into the graph (with fake implementations for the shapes), and each op runs this
same path when the graph runs, so a compiled call takes the kernels, configurations and plans an eager one
takes, and Dynamo never traces the launches (no graph break: `fullgraph=True` holds).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cs336_systems.attention.configs import KernelConfig, config_for, device_facts
from cs336_systems.attention.heuristics import gluon_backward_eligible, gluon_forward_eligible
from cs336_systems.attention.launch.gluon import flash_backward_gluon, launch_forward_gluon
from cs336_systems.attention.launch.layout import INTERPRETED, as_rows, head_dim_tile, read_in_place, tma_compatible
from cs336_systems.attention.launch.plans import LAUNCHES, LaunchPlan, launch_dkdv, launch_dq
from cs336_systems.attention.validation import check_is_causal, check_triton_inputs

GLUON = "gluon"
_UNSEEN = object()


def tma_readable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the Gluon kernels' descriptors can read q, k and v in place."""
    for t in (q, k, v):
        rows, strides = as_rows(t)
        if rows is not t or not tma_compatible(rows, strides):  # in place, through descriptors, or not at all
            return False
    return True


def gluon_forward_applies(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool,
    interpreted: bool,
    tiles: tuple[int, int] | None = None,
) -> bool:
    """Whether the forward of these (..., N, d) inputs runs the Gluon kernel: compiled kernels on a CUDA
    device, no override of the Triton kernels' tiles, `heuristics.gluon_forward_eligible`, rows the
    descriptors read in place."""
    if interpreted or q.device.type != "cuda" or tiles is not None:
        return False
    (n_q, d), n_k = q.shape[-2:], k.shape[-2]
    if not gluon_forward_eligible(d, n_q, n_k, q.dtype, q.numel() // (n_q * d), *device_facts(q.device), is_causal):
        return False
    return tma_readable(q, k, v)


def gluon_backward_applies(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool,
    interpreted: bool,
    tiles: tuple[int, int] | None = None,
) -> bool:
    """Whether the backward of these inputs runs the fused Gluon kernel (as `gluon_forward_applies`, with
    `heuristics.gluon_backward_eligible`)."""
    if interpreted or q.device.type != "cuda" or tiles is not None:
        return False
    (n_q, d), n_k = q.shape[-2:], k.shape[-2]
    if not gluon_backward_eligible(d, n_q, n_k, q.dtype, q.numel() // (n_q * d), *device_facts(q.device), is_causal):
        return False
    return tma_readable(q, k, v)


def kernel_config(
    kernel: str, q: torch.Tensor, n_k: int, is_causal: bool, tiles: tuple[int, int] | None = None
) -> KernelConfig:
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


def geometry_key(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, tiles: tuple[int, int] | None
) -> tuple:
    """What every routing decision of a call reads: shapes, strides, dtypes, devices and 16-byte alignment
    of q, k, v, causality, the fp32 matmul precision and the tiles (configurations enter through
    `config_for`, whose table changes clear the routes). Bad inputs raise the check's ValueError."""
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
    except AttributeError:  # not a tensor: the check says which
        check_triton_inputs(q, k, v, is_causal, INTERPRETED)
        raise


def decide_forward(q, k, v, out, lse, is_causal: bool, tiles: tuple[int, int] | None) -> str | LaunchPlan:
    """GLUON, or the Triton forward's launch plan for these tensors; checks the inputs first."""
    check_triton_inputs(q, k, v, is_causal, INTERPRETED)
    if gluon_forward_applies(q, k, v, is_causal, INTERPRETED, tiles):
        return GLUON
    return LAUNCHES.plan(
        "forward", (q, k, v, out, lse), is_causal, kernel_config("forward", q, k.shape[-2], is_causal, tiles)
    )


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


def decide_backward(
    q, k, v, out, grad_out, lse, is_causal: bool, tiles: tuple[int, int] | None
) -> str | BackwardRoute | None:
    """GLUON, the Triton kernels' plans, or None (the general path) where q, k or v would need a copy
    (`launch.layout.read_in_place`) or the upstream gradient or L is not contiguous. The gradients the plans
    write have the inputs' strides (`empty_like`)."""
    if not (all(read_in_place(t) for t in (q, k, v)) and grad_out.is_contiguous() and lse.is_contiguous()):
        return None
    if gluon_backward_applies(q, k, v, is_causal, INTERPRETED, tiles):
        return GLUON
    n_k = k.shape[-2]
    # D and the gradients as every call allocates them (contiguous, aligned): the plans read their geometry
    delta, grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (lse, q, k, v))
    return BackwardRoute(
        LAUNCHES.plan(
            "dq", (q, k, v, out, grad_out, lse, delta, grad_q), is_causal, kernel_config("dq", q, n_k, is_causal, tiles)
        ),
        LAUNCHES.plan(
            "dkdv",
            (q, k, v, grad_out, lse, delta, grad_k, grad_v),
            is_causal,
            kernel_config("dkdv", q, n_k, is_causal, tiles),
        ),
    )


def backward_route(
    forward_key: tuple, q, k, v, out, grad_out, lse, is_causal: bool, tiles: tuple[int, int] | None
) -> str | BackwardRoute | None:
    """`decide_backward`, decided once per forward geometry and upstream-gradient layout. O and L are the
    forward's own contiguous outputs, so the forward's key and the gradient's strides and alignment fix it."""
    key = (forward_key, grad_out.stride(), grad_out.data_ptr() % 16)
    route = LAUNCHES.backward_routes.get(key, _UNSEEN)
    if route is _UNSEEN:
        route = LAUNCHES.remember(
            LAUNCHES.backward_routes, key, decide_backward(q, k, v, out, grad_out, lse, is_causal, tiles)
        )
    return route


def flash_forward_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, tiles: tuple[int, int] | None = None
):
    """O and L (q.shape[:-1], fp32) of (..., N, d) inputs, eagerly: the Gluon kernel where
    `gluon_forward_applies`, else `flash_fwd_kernel`; bad inputs raise a ValueError that names the problem."""
    return flash_forward_with_route(q, k, v, is_causal, tiles)[:2]


def flash_forward_with_route(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, tiles: tuple[int, int] | None = None
):
    """`flash_forward_triton`'s O and L, and the key of the inputs' geometry under which
    `flash_backward_triton(..., route_key=key)` finds its route (the model's strided layout without copies).
    While torch.compile traces, the call is the custom op `cs336::flash_forward` (the same host path, run
    when the graph runs; O and L allocated in the graph) and the key None."""
    check_is_causal(is_causal)  # on every call: a route found by its key skips the inputs' checks
    if torch.compiler.is_compiling():
        check_triton_inputs(q, k, v, is_causal, INTERPRETED)  # a bad input fails the trace with its own message
        out, lse = forward_outputs(q)
        torch.ops.cs336.flash_forward(q, k, v, out, lse, is_causal, tile_list(tiles))
        return out, lse, None
    key = geometry_key(q, k, v, is_causal, tiles)
    out, lse = forward_outputs(q)
    forward_into(key, q, k, v, out, lse, is_causal, tiles)
    return out, lse, key


def forward_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty O (q's shape and dtype, contiguous) and L (q.shape[:-1], fp32) for a forward to write."""
    return (
        torch.empty(q.shape, dtype=q.dtype, device=q.device),
        torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device),
    )


def forward_into(key: tuple, q, k, v, out, lse, is_causal: bool, tiles: tuple[int, int] | None) -> None:
    """O and L into `out` and `lse` by the route of `key` (`geometry_key`)."""
    route = forward_route(key, q, k, v, out, lse, is_causal, tiles)
    if route is GLUON:
        launch_forward_gluon(q, k, v, out, lse, is_causal)
    else:
        LAUNCHES.run("forward", route, (q, k, v, out, lse))


def tile_list(tiles: tuple[int, int] | None) -> list[int] | None:
    """`tiles` as a custom op's argument (an int list); `tile_pair` reads it back."""
    return None if tiles is None else list(tiles)


def tile_pair(tiles: list[int] | None) -> tuple[int, int] | None:
    return None if tiles is None else (tiles[0], tiles[1])


@torch.library.custom_op("cs336::flash_forward", mutates_args=("out", "lse"))
def flash_forward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
    tiles: list[int] | None,
) -> None:
    """O and L into `out` and `lse` (`flash_forward_with_route`'s host path): what a compiled graph calls."""
    tiles = tile_pair(tiles)
    forward_into(geometry_key(q, k, v, is_causal, tiles), q, k, v, out, lse, is_causal, tiles)


@flash_forward_op.register_fake
def _(q, k, v, out, lse, is_causal, tiles) -> None:
    return None


def flash_backward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    grad_out: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
    route_key: tuple | None = None,
    tiles: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (shapes and dtypes of q, k, v) from the two Triton kernels or, where
    `gluon_backward_applies`, the fused Gluon kernel. `route_key`: the key `flash_forward_with_route` returned with
    `out` and `lse`, under which the route is kept (None: decided in full). While torch.compile traces, the
    call is the custom op `cs336::flash_backward` (this host path, run when the graph runs)."""
    if torch.compiler.is_compiling():
        # the dense copy (below) in the graph, where the compiler can fuse it into the gradient's producer
        grad_out, lse = grad_out.contiguous(), lse.contiguous()
        return torch.ops.cs336.flash_backward(q, k, v, out, grad_out, lse, is_causal, tile_list(tiles))
    if route_key is not None:
        route = backward_route(route_key, q, k, v, out, grad_out, lse, is_causal, tiles)
        if route is GLUON:
            return flash_backward_gluon(q, k, v, out, grad_out, lse, is_causal)
        if route is not None:
            delta = torch.empty_like(lse)
            grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
            LAUNCHES.run("dq", route.dq, (q, k, v, out, grad_out, lse, delta, grads[0]))
            LAUNCHES.run("dkdv", route.dkdv, (q, k, v, grad_out, lse, delta, grads[1], grads[2]))
            return grads
    shapes = (q.shape, k.shape, v.shape)
    # One copy, not one per kernel, where the leading dimensions do not merge.
    q, k, v = (t if t.is_contiguous() else as_rows(t)[0] for t in (q, k, v))
    # An upstream gradient can be a broadcast (o.sum() gives stride-0 ones). The kernels could read it in
    # place, but streaming stride-0 tiles slowed the dK/dV kernel at the leaderboard shape; the
    # dense copy costs far less.
    grad_out, lse = grad_out.contiguous(), lse.contiguous()
    if gluon_backward_applies(q, k, v, is_causal, INTERPRETED, tiles):
        grads = flash_backward_gluon(q, k, v, out, grad_out, lse, is_causal)
        return tuple(grad.view(shape) for grad, shape in zip(grads, shapes))
    delta = torch.empty_like(lse)  # written by the dQ kernel, read by the dK/dV kernel
    # empty_like where it gives the shape: less host time than torch.empty
    grad_q, grad_k, grad_v = (
        torch.empty_like(t) if t.shape == shape else torch.empty(shape, dtype=t.dtype, device=t.device)
        for t, shape in zip((q, k, v), shapes)
    )
    n_k = k.shape[-2]
    launch_dq(q, k, v, out, grad_out, lse, delta, grad_q, is_causal, kernel_config("dq", q, n_k, is_causal, tiles))
    launch_dkdv(
        q, k, v, grad_out, lse, delta, grad_k, grad_v, is_causal, kernel_config("dkdv", q, n_k, is_causal, tiles)
    )
    return grad_q, grad_k, grad_v


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
