"""Correctness of a DDP flavour: training with it must give the weights of single-process training.

Each rank starts from its own random initialisation (rank 0's equals the reference model's), so
the check also proves that construction broadcast rank 0's parameters and buffers. Every step
draws one global batch, identical on all ranks; rank r trains on its slice of batch/n examples
with DDP, and a single-process reference trains on the whole batch. Because the loss is a mean
over examples, the average of the n slice gradients is the whole-batch gradient, so after each
SGD step the two models must agree up to float rounding, on every rank:

    max_t max |theta_ddp,t - theta_ref,t|   <<   max_t max |theta_ref,t - theta_ref,0|   (the update)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import pandas as pd
import torch
import torch.nn as nn

from cs336_systems.distributed.compute_stream import prioritized_compute
from cs336_systems.distributed.ddp_bucketed import DDPBucketed
from cs336_systems.distributed.launch import DistContext, spawn
from cs336_systems.experiments.ddp_flavours import DDPFlavour
from cs336_systems.experiments.toy_models import IN_FEATURES, OUT_FEATURES, ToyModel, ToyModelWithTiedWeights
from cs336_systems.model import TransformerLM, cross_entropy

TRANSFORMER_VOCAB, TRANSFORMER_CONTEXT = 256, 16


def _transformer() -> nn.Module:
    return TransformerLM.from_size("nano", context_length=TRANSFORMER_CONTEXT, vocab_size=TRANSFORMER_VOCAB)


MODELS: dict[str, Callable[[], nn.Module]] = {
    "toy": ToyModel,
    "toy-tied-frozen": ToyModelWithTiedWeights,
    "transformer-nano": _transformer,
}


def _batch(model_name: str, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if model_name.startswith("transformer"):
        tokens = torch.randint(0, TRANSFORMER_VOCAB, (batch_size, TRANSFORMER_CONTEXT + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]
    return torch.randn(batch_size, IN_FEATURES, generator=generator), torch.randn(
        batch_size, OUT_FEATURES, generator=generator
    )


def _loss(model_name: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if model_name.startswith("transformer"):
        return cross_entropy(output, target)
    return nn.functional.mse_loss(output, target)


def _max_difference(a: nn.Module, b: nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max((sa[k].float() - sb[k].float()).abs().max().item() for k in sa)


def train_and_compare(
    ctx: DistContext,
    flavour: DDPFlavour,
    model_name: str,
    steps: int = 5,
    batch_per_rank: int = 4,
    lr: float = 0.1,
    seed: int = 0,
    set_to_none: bool = True,
) -> dict:
    """Train `steps` SGD steps with `flavour` and with one process; this rank's differences.

    `set_to_none=False` zeroes the gradients in place between steps instead of dropping them (the
    bucketed flavour's gradients then stay views of its buckets, and autograd accumulates into
    them). `grads_in_buckets` says, for the bucketed flavour, whether every gradient the
    optimizer read was a view of a bucket buffer."""
    if model_name not in MODELS:
        raise ValueError(f"unknown model {model_name!r}; choose one of {', '.join(MODELS)}")
    build = MODELS[model_name]
    torch.manual_seed(seed)
    reference = build().to(ctx.device)
    torch.manual_seed(seed + 1000 * ctx.rank)
    local = build().to(ctx.device)
    diff_before_wrap = _max_difference(local, reference)
    ddp = flavour.wrap(local)
    diff_after_wrap = _max_difference(local, reference)
    initial = copy.deepcopy(reference)

    ddp_optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    mine = slice(ctx.rank * batch_per_rank, (ctx.rank + 1) * batch_per_rank)
    max_diff = 0.0
    in_buckets = isinstance(ddp, DDPBucketed) or None
    for _ in range(steps):
        x, y = (t.to(ctx.device) for t in _batch(model_name, batch_per_rank * ctx.world_size, generator))
        for model, optimizer, xs, ys, sync in (
            (ddp, ddp_optimizer, x[mine], y[mine], True),
            (reference, ref_optimizer, x, y, False),
        ):
            optimizer.zero_grad(set_to_none=set_to_none)
            _loss(model_name, model(xs), ys).backward()
            if sync:
                model.finish_gradient_synchronization()
                if isinstance(model, DDPBucketed):
                    in_buckets = in_buckets and _grads_in_buckets(model)
            optimizer.step()
        max_diff = max(max_diff, _max_difference(local, reference))
    return dict(
        model=model_name,
        flavour=flavour.label,
        rank=ctx.rank,
        steps=steps,
        set_to_none=set_to_none,
        buckets=len(ddp.buckets) if isinstance(ddp, DDPBucketed) else None,
        grads_in_buckets=in_buckets,
        diff_before_wrap=diff_before_wrap,
        diff_after_wrap=diff_after_wrap,
        max_abs_diff=max_diff,
        max_update=_max_difference(reference, initial),
    )


def _grads_in_buckets(ddp: DDPBucketed) -> bool:
    storages = {b.untyped_storage().data_ptr() for b in ddp.bucket_buffers}
    return all(p.grad.untyped_storage().data_ptr() in storages for p in ddp.parameters() if p.grad is not None)


def _equivalence_worker(
    ctx: DistContext, flavours: Sequence[DDPFlavour], model_names: Sequence[str], steps: int
) -> list[dict]:
    if ctx.device.type == "cpu":
        torch.set_num_threads(1)
    # On a GPU, on the prioritized stream the benchmarks run on: the hooks then fire on that stream.
    with prioritized_compute(ctx.device):
        return [train_and_compare(ctx, f, m, steps) for m in model_names for f in flavours]


def check_equivalence(
    flavours: Sequence[DDPFlavour],
    model_names: Sequence[str] = tuple(MODELS),
    steps: int = 5,
    world_size: int = 2,
    backend: str | None = "auto",
) -> pd.DataFrame:
    """One row per (model, flavour, rank): weight differences to single-process training."""
    results = spawn(_equivalence_worker, world_size, args=(list(flavours), list(model_names), steps), backend=backend)
    return pd.DataFrame([row for rank_rows in results for row in rank_rows])


def summarize_equivalence(df: pd.DataFrame, tolerance: float = 1e-5) -> pd.DataFrame:
    """One row per (model, flavour): worst rank's differences and whether it matches within `tolerance`."""
    worst = (
        df.groupby(["model", "flavour"], sort=False)
        .agg(
            ranks=("rank", "nunique"),
            buckets=("buckets", "first"),
            diff_before_wrap=("diff_before_wrap", "max"),
            diff_after_wrap=("diff_after_wrap", "max"),
            max_abs_diff=("max_abs_diff", "max"),
            max_update=("max_update", "max"),
        )
        .reset_index()
    )
    worst["matches"] = (worst.max_abs_diff <= tolerance) & (worst.diff_after_wrap == 0)
    return worst
