"""The training step data parallel (`TrainStep` under a process group of 2 ranks, gloo, CPU, our kernels in
Triton's interpreter) against the same step in one process on the whole batch.

Each rank steps on its half of a batch of 4 sequences. Tolerances (fp32): the averaged gradients equal the
whole batch's within rtol 1e-5, atol 1e-6 (the mean of two half-batch means is the whole batch's mean; only
the summation order differs, as in tests/test_train_step.py); after the optimizer step every rank holds
the same weights bit for bit (each parameter broadcast from its owner), within 1e-6 of the one-process
step (the two updates start from gradients that differ by ulps: AdamW's first step is m / sqrt(v) =
g / |g| up to eps, so only the few gradients near eps could move further; lr 1e-3, eps 1e-3 keeps them far);
and each rank's AdamW holds the states of its own parameters only, together all of them, once; and each
gradient is left on its owner only (sharded gradients, `DDPShardedGradients`).
"""

from __future__ import annotations

import pytest
import torch

from cs336_systems.distributed import spawn
from cs336_systems.model import TransformerLM
from cs336_systems.training import StepConfig, build_train_step
from cs336_systems.training.memory_plan import fixed_memory_bytes

VOCAB, D_MODEL, HEADS, D_FF, LAYERS, CONTEXT = 97, 32, 2, 64, 2, 16
CONFIG = dict(lr=1e-3, eps=1e-3, weight_decay=0.0, state_dtype=torch.float32, recompute="none")


def model_and_batch():
    from cs336_systems.attention.api import DEFAULTS

    DEFAULTS.tiles = (16, 16)  # the context is 16
    torch.manual_seed(0)
    model = TransformerLM(VOCAB, CONTEXT, D_MODEL, LAYERS, HEADS, D_FF, attention="flash_triton")
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (4, CONTEXT), generator=g)
    y = torch.randint(0, VOCAB, (4, CONTEXT), generator=g)
    return model, x, y


def one_step(model, x, y):
    step = build_train_step(model, StepConfig(**CONFIG))
    step.forward_backward(x, y)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    step.optimizer_step()
    return step, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _rank(ctx):
    model, x, y = model_and_batch()
    if ctx.rank == 1:  # a different start on rank 1: the step must broadcast rank 0's weights first
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    half = slice(2 * ctx.rank, 2 * ctx.rank + 2)
    step, grads, params = one_step(model, x[half], y[half])
    local = step.optimizer.local_optimizer
    owned = {n for n, p in model.named_parameters() if any(p is q for g in local.param_groups for q in g["params"])}
    states = {n for n, p in model.named_parameters() if p in local.state and len(local.state[p])}
    return dict(world=step.world_size, grads=grads, params=params, owned=owned, states=states)


@pytest.mark.multiprocess
def test_data_parallel_step_equals_the_whole_batch_in_one_process():
    ranks = spawn(_rank, 2, backend="gloo", timeout_s=300)
    model, x, y = model_and_batch()
    single, grads, params = one_step(model, x, y)
    assert single.world_size == 1 and single.parallel.ddp is None
    assert [r["world"] for r in ranks] == [2, 2]
    owned = [r["owned"] for r in ranks]
    for name, g in grads.items():  # the averaged gradient is on its owner only (sharded gradients)
        for r, mine in zip(ranks, owned):
            if name in mine:
                torch.testing.assert_close(r["grads"][name], g, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
            else:
                assert name not in r["grads"], f"{name}: a gradient on a rank that does not own it"
    for name, p in params.items():
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
        torch.testing.assert_close(ranks[0]["params"][name], p, rtol=0, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert owned[0].isdisjoint(owned[1]) and owned[0] | owned[1] == set(params) and all(owned)
    assert [r["states"] for r in ranks] == owned  # each rank's AdamW keeps its own parameters' states


def test_the_plan_counts_a_rank_s_share_of_the_states_and_gradients():
    model, x, _ = model_and_batch()
    one, two = (fixed_memory_bytes(model, torch.float32, *x.shape, world_size=w) for w in (1, 2))
    numel = sum(p.numel() for p in model.parameters())
    states, grads = 2 * numel * 4, numel * 4
    assert one - two == states // 2 + grads // 2
    # three buckets in flight on top of a rank's share, never more than all the gradients
    assert fixed_memory_bytes(model, torch.float32, *x.shape, world_size=2, bucket_bytes=1000) == two + 3000
    assert fixed_memory_bytes(model, torch.float32, *x.shape, world_size=2, bucket_bytes=1 << 30) == one - states // 2


STEPS_IN_FORWARD = 3


def _rank_exchange_in_forward(ctx):
    """Three steps with the exchange completing in the next forward, in rounds of 2 KiB (several per block):
    before each block runs, no round in flight still brings this rank its parameters; before the final norm,
    none at all."""
    model, x, y = model_and_batch()
    half = slice(2 * ctx.rank, 2 * ctx.rank + 2)
    step = build_train_step(model, StepConfig(**CONFIG, exchange_in_forward=True))
    step.optimizer.exchange_round_bytes = 2048
    seen = []

    def before(name, params):
        return lambda module, args: seen.append(
            (name, step.optimizer.in_flight(params), step.optimizer.rounds_in_flight)
        )

    for i, block in enumerate(model.layers):
        block.register_forward_pre_hook(before(f"block {i}", list(block.parameters())))
    model.ln_final.register_forward_pre_hook(before("ln_final", list(model.parameters())))
    rounds = []
    for _ in range(STEPS_IN_FORWARD):
        step.step(x[half], y[half])
        rounds.append(step.optimizer.rounds_in_flight)
    step.wait_for_exchange()
    return dict(seen=seen, rounds=rounds, params={n: p.detach().clone() for n, p in model.named_parameters()})


@pytest.mark.multiprocess
def test_exchange_in_forward_waits_block_by_block_and_ends_equal():
    ranks = spawn(_rank_exchange_in_forward, 2, backend="gloo", timeout_s=300)
    model, x, y = model_and_batch()
    single = build_train_step(model, StepConfig(**CONFIG))
    for _ in range(STEPS_IN_FORWARD):
        single.step(x, y)
    for rank, r in enumerate(ranks):
        assert all(n > 2 for n in r["rounds"]), f"rank {rank}: each step must leave its rounds in flight"
        assert not any(waiting for _, waiting, _ in r["seen"]), f"rank {rank}: a part ran before its parameters came"
    # Rank 0 owns the first blocks: it waits for nothing before block 0, so the later rounds are still in flight.
    later = ranks[0]["seen"][len(ranks[0]["seen"]) // STEPS_IN_FORWARD :]  # the steps after the first
    assert later[0][0] == "block 0" and later[0][2] > 0, "the exchange did not run into the forward"
    for name, p in model.named_parameters():
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
        torch.testing.assert_close(
            ranks[0]["params"][name], p.detach(), rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}"
        )


def _rank_offloaded_states(ctx):
    """With the states offloaded, each rank's mover serves its own AdamW (the sharded optimizer's local one)
    and is asked for them back in each step's backward; the steps equal those without it."""
    model, x, y = model_and_batch()
    half = slice(2 * ctx.rank, 2 * ctx.rank + 2)
    step = build_train_step(model, StepConfig(**CONFIG, offload_optimizer_states=True))
    fetches = []
    step.offload.fetch = lambda: fetches.append(len(fetches))
    for _ in range(2):
        step.step(x[half], y[half])
    return dict(
        mover_on_local=step.offload.optimizer is step.optimizer.local_optimizer,
        fetches=len(fetches),
        fetch_at=step.plans[(2, CONTEXT)].fetch_states_at,
        params={n: p.detach().clone() for n, p in model.named_parameters()},
    )


@pytest.mark.multiprocess
def test_offloaded_states_are_each_ranks_own_and_fetched_in_each_backward():
    ranks = spawn(_rank_offloaded_states, 2, backend="gloo", timeout_s=300)
    model, x, y = model_and_batch()
    single = build_train_step(model, StepConfig(**CONFIG))
    for _ in range(2):
        single.step(x, y)
    for rank, r in enumerate(ranks):
        # per step: once from the backward at the plan's block, once from the update's own check (where the
        # states are already back, a no-op)
        assert r["mover_on_local"] and r["fetches"] == 2 * 2 and r["fetch_at"] == LAYERS // 2, rank
    for name, p in model.named_parameters():
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
        torch.testing.assert_close(
            ranks[0]["params"][name], p.detach(), rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}"
        )
