"""Sharded gradients (`DDPShardedGradients` with `ShardedOptimizer(owners=...)`, ZeRO stage 2) against
single-process training: gloo, 2 processes, CPU, a toy MLP over several steps.

Each rank trains on its half of every batch; the reference trains on the whole batch in one process with
torch.optim.AdamW. Tolerance 1e-5 on weights and gradients (fp32; the mean of two half-batch means is the
whole batch's mean, only the summation order differs; AdamW's updates of size lr = 1e-2 differ by ulps).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from cs336_systems.distributed import DDPShardedGradients, ShardedOptimizer, spawn
from cs336_systems.distributed.ddp_bucketed import BYTES_PER_MB, assign_buckets
from cs336_systems.distributed.sharded_optimizer import assign_contiguous

STEPS, TOLERANCE = 3, 1e-5


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(STEPS)]


def _rank(ctx, bucket_size_mb, in_flight):
    torch.set_num_threads(1)
    model = mlp()
    if ctx.rank == 1:  # the wrapper must broadcast rank 0's weights
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    params = list(model.parameters())
    owners = dict(zip(params, assign_contiguous([p.numel() for p in params], ctx.world_size)))
    ddp = DDPShardedGradients(model, owners, bucket_size_mb, in_flight=in_flight)
    opt = ShardedOptimizer(params, torch.optim.AdamW, owners=owners, lr=1e-2)
    half = slice(3 * ctx.rank, 3 * ctx.rank + 3)
    grads, held = [], []
    for x, y in batches():
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x[half]), y[half]).backward()
        ddp.finish_gradient_synchronization()
        grads.append([None if p.grad is None else p.grad.clone() for p in params])
        held.append(sum(b is not None for b in ddp.bucket_buffers))
        opt.step()
    errors = []
    for bad in ({}, {params[0]: 5}):
        try:
            DDPShardedGradients(mlp(), bad, None)
        except ValueError as err:
            errors.append(str(err))
    return dict(
        owners=[owners[p] for p in params],
        grads=grads,
        held=held,
        buckets=len(ddp.buckets),
        params=[p.detach().clone() for p in params],
        errors=errors,
    )


def reference():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    grads = []
    for x, y in batches():
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return grads, [p.detach().clone() for p in model.parameters()]


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "bucket_size_mb, in_flight",
    [(None, 2), (1e-9, 1), (300 * 4 / BYTES_PER_MB, 2)],
    ids=["one_bucket_per_owner", "one_per_parameter", "capped"],
)
def test_sharded_gradients_train_like_one_process(bucket_size_mb, in_flight):
    ranks = spawn(_rank, 2, backend="gloo", timeout_s=300, args=(bucket_size_mb, in_flight))
    ref_grads, ref_params = reference()
    owners = ranks[0]["owners"]
    assert owners == ranks[1]["owners"] and set(owners) == {0, 1}
    for step in range(STEPS):
        for i, owner in enumerate(owners):
            for rank, r in enumerate(ranks):
                if rank == owner:
                    torch.testing.assert_close(r["grads"][step][i], ref_grads[step][i], rtol=TOLERANCE, atol=TOLERANCE)
                else:
                    assert r["grads"][step][i] is None, f"step {step}: rank {rank} kept parameter {i}'s gradient"
    for i, p in enumerate(ref_params):
        assert torch.equal(ranks[0]["params"][i], ranks[1]["params"][i])
        torch.testing.assert_close(ranks[0]["params"][i], p, rtol=TOLERANCE, atol=TOLERANCE)
    assert all(h == 0 for r in ranks for h in r["held"]), "no bucket buffer is referenced after the step"
    assert all(len(r["errors"]) == 2 and "owners must map every trainable parameter" in r["errors"][0] for r in ranks)
    if bucket_size_mb == 1e-9:
        assert ranks[0]["buckets"] == len(owners)


def test_contiguous_owners_balance_the_elements():
    assert assign_contiguous([10, 10, 10, 10], 2) == [0, 0, 1, 1]
    assert assign_contiguous([100, 1, 1, 1], 2) == [
        0,
        1,
        1,
        1,
    ]  # one run each, the big tensor's middle in rank 0's half
    assert assign_contiguous([5, 5, 5], 1) == [0, 0, 0]
    owners = assign_contiguous([3, 7, 2, 9, 4, 4, 8, 1], 3)
    assert owners == sorted(owners) and set(owners) == {0, 1, 2}
    with pytest.raises(ValueError, match="world_size"):
        assign_contiguous([1], 0)


def test_buckets_never_mix_owners():
    params = [nn.Parameter(torch.zeros(n)) for n in (4, 4, 4, 4)]
    owner = {id(p): r for p, r in zip(params, (0, 0, 1, 1))}
    buckets = assign_buckets(params, None, group_of=lambda p: owner[id(p)])
    assert [[owner[id(p)] for p in b] for b in buckets] == [[1, 1], [0, 0]]
