"""The §8 FFN run for real on small tensors: tensor-parallel passes and counted FLOPs per device.

    x1 = x W1,  x2 = x W2,  z = f(x1) * x2,  y = z W3,   f = SiLU

The tensor-parallel forward and backward follow the handout's equations shard by shard, with the
all-reduce done by the simulated ring of `rings.py`, so a test can check them against autograd on
the unsharded FFN. `flop_check_table` counts the matmul FLOPs each device of DP, FSDP, TP and
FSDP×TP runs on its shard (torch.utils.flop_counter) next to the closed forms of `parallelism.py`.
"""

from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from cs336_systems.accounting.parallelism import dp_flops, fsdp_flops, fsdp_tp_forward_flops, tp_flops
from cs336_systems.accounting.rings import simulate_ring_all_reduce


def ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """y = (SiLU(x W1) * x W2) W3."""
    return (F.silu(x @ w1) * (x @ w2)) @ w3


def silu_derivative(x: torch.Tensor) -> torch.Tensor:
    """f'(x) for f(x) = x σ(x):  σ(x) (1 + x (1 − σ(x)))."""
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def _all_reduce(partials: list[torch.Tensor]) -> torch.Tensor:
    """Sum over devices by the simulated ring (flattened, so any shape with N | numel works)."""
    flat = simulate_ring_all_reduce([p.reshape(-1) for p in partials]).outputs[0]
    return flat.reshape(partials[0].shape)


def _check_split(d_ff: int, n: int) -> None:
    if n < 1 or d_ff % n:
        raise ValueError(f"D_FF={d_ff} does not split over N_TP={n} devices")


def tensor_parallel_ffn_forward(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    n_tp: int,
) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
    """Eqs. 47–51: device i holds W1^(i), W2^(i) (columns) and W3^(i) (rows) of D_FF / N_TP hidden units.

        x1^(i) = x W1^(i),  x2^(i) = x W2^(i),  z^(i) = f(x1^(i)) * x2^(i),  y^(i) = z^(i) W3^(i),
        y = all-reduce(y^(i)).

    Returns y and what each device saves for backward (its weight shards and activations)."""
    _check_split(w1.shape[1], n_tp)
    saved = dict(w1=list(w1.chunk(n_tp, dim=1)), w2=list(w2.chunk(n_tp, dim=1)), w3=list(w3.chunk(n_tp, dim=0)))
    saved["x1"] = [x @ w for w in saved["w1"]]
    saved["x2"] = [x @ w for w in saved["w2"]]
    saved["z"] = [F.silu(a) * b for a, b in zip(saved["x1"], saved["x2"])]
    y = _all_reduce([z @ w for z, w in zip(saved["z"], saved["w3"])])
    return y, saved


def tensor_parallel_ffn_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    saved: dict[str, list[torch.Tensor]],
) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
    """The TP backward pass (tp_calcs a), on every device i, from the full dy (B, D):

        dz^(i)  = dy W3^(i)ᵀ                                  (B, D_FF/N_TP)
        dx2^(i) = dz^(i) * f(x1^(i))
        dx1^(i) = dz^(i) * f'(x1^(i)) * x2^(i)
        dW3^(i) = z^(i)ᵀ dy                                   (D_FF/N_TP, D)
        dW2^(i) = xᵀ dx2^(i),   dW1^(i) = xᵀ dx1^(i)          (D, D_FF/N_TP)
        dx      = all-reduce(dx1^(i) W1^(i)ᵀ + dx2^(i) W2^(i)ᵀ)   (B, D)

    Returns dx and the per-device lists dW1, dW2, dW3."""
    dw1, dw2, dw3, dx_partial = [], [], [], []
    for w1, w2, w3, x1, x2, z in zip(*(saved[k] for k in ("w1", "w2", "w3", "x1", "x2", "z"))):
        dz = dy @ w3.T
        dx2 = dz * F.silu(x1)
        dx1 = dz * silu_derivative(x1) * x2
        dw3.append(z.T @ dy)
        dw2.append(x.T @ dx2)
        dw1.append(x.T @ dx1)
        dx_partial.append(dx1 @ w1.T + dx2 @ w2.T)
    return _all_reduce(dx_partial), dict(w1=dw1, w2=dw2, w3=dw3)


def counted_flops(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs that FlopCounterMode sees for one device's FFN shard."""
    x, w1, w2, w3 = (t.detach().requires_grad_(True) for t in (x, w1, w2, w3))
    with FlopCounterMode(display=False) as forward:
        y = ffn(x, w1, w2, w3)
    with FlopCounterMode(display=False) as backward:
        y.backward(torch.ones_like(y))
    return forward.get_total_flops(), backward.get_total_flops()


def flop_check_table(batch: int, d_model: int, d_ff: int, n: int, seed: int = 0) -> pd.DataFrame:
    """Per-device counted vs formula FLOPs for DP, FSDP and TP over n devices and FSDP×TP on an n × n grid.

    Each device runs its own shard: DP/FSDP B/N rows with all weights (FSDP after its all-gather),
    TP all B rows with D_FF/N hidden units, FSDP×TP B/N rows with D_FF/N hidden units.
    """
    if batch % n or d_ff % n:
        raise ValueError(f"B={batch} and D_FF={d_ff} must both split over N={n} devices")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, d_model, generator=gen)
    w1, w2 = torch.randn(d_model, d_ff, generator=gen), torch.randn(d_model, d_ff, generator=gen)
    w3 = torch.randn(d_ff, d_model, generator=gen)
    rows_shard, hidden_shard = batch // n, d_ff // n
    full_weights = (w1, w2, w3)
    weight_shards = (w1[:, :hidden_shard], w2[:, :hidden_shard], w3[:hidden_shard])
    shape = (batch, d_model, d_ff)
    cases = [  # strategy, one device's (x, W1, W2, W3), forward formula, backward formula (None: not asked)
        ("DP", (x[:rows_shard], *full_weights), dp_flops(*shape, n, backward=False), dp_flops(*shape, n)),
        ("FSDP", (x[:rows_shard], *full_weights), fsdp_flops(*shape, n, backward=False), fsdp_flops(*shape, n)),
        ("TP", (x, *weight_shards), tp_flops(*shape, n, backward=False), tp_flops(*shape, n)),
        ("FSDP×TP", (x[:rows_shard], *weight_shards), fsdp_tp_forward_flops(*shape, n, n), None),
    ]
    rows = []
    for strategy, shard, forward_formula, backward_formula in cases:
        forward, backward = counted_flops(*shard)
        rows.append({"strategy": strategy, "pass": "forward", "counted": forward, "formula": forward_formula})
        if backward_formula is not None:
            rows.append({"strategy": strategy, "pass": "backward", "counted": backward, "formula": backward_formula})
    return pd.DataFrame(rows)


def tensor_parallel_check(batch: int, d_model: int, d_ff: int, n_tp: int, seed: int = 0) -> pd.DataFrame:
    """The TP forward and backward passes against autograd on the unsharded FFN, in float64:
    one row per result (y, dx, dW1, dW2, dW3) with its shape and largest absolute difference."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(batch, d_model), (d_model, d_ff), (d_model, d_ff), (d_ff, d_model)]
    x, w1, w2, w3 = (torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes)
    y = ffn(x, w1, w2, w3)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    y.backward(dy)
    with torch.no_grad():
        y_tp, saved = tensor_parallel_ffn_forward(x, w1, w2, w3, n_tp)
        dx, dw = tensor_parallel_ffn_backward(dy, x, saved)
    pairs = {
        "y": (y_tp, y.detach()),
        "dx": (dx, x.grad),
        "dW1": (torch.cat(dw["w1"], dim=1), w1.grad),
        "dW2": (torch.cat(dw["w2"], dim=1), w2.grad),
        "dW3": (torch.cat(dw["w3"], dim=0), w3.grad),
    }
    return pd.DataFrame(
        [
            dict(result=name, shape=tuple(ours.shape), max_abs_difference=(ours - ref).abs().max().item())
            for name, (ours, ref) in pairs.items()
        ]
    )
