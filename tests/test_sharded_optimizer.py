"""ShardedOptimizer against the unsharded optimizer, on gloo with 2 and 3 processes (3: an uneven split).

Every rank trains a copy of the model with the sharded optimizer and, side by side, a reference
copy with the plain optimizer on the same batches (identical on all ranks, so both see the same
full gradients). After 10 steps the weights must agree, on every rank, and be bitwise equal across
ranks. One spawn per world size runs all the checks and returns numbers; the asserts are here.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from cs336_systems.accounting.sharding import (
    communication_table,
    memory_table,
    setup_for_model,
    transformer_parameter_shapes,
    zero_paper_memory,
)
from cs336_systems.distributed.adapters_sharding import get_sharded_optimizer
from cs336_systems.distributed.launch import spawn
from cs336_systems.distributed.sharded_optimizer import ShardedOptimizer, assign_greedy
from cs336_systems.experiments.sharding_benchmark import ShardingBenchmarkConfig, rank_owned_numel
from cs336_systems.experiments.toy_models import IN_FEATURES, OUT_FEATURES, ToyModelWithTiedWeights
from cs336_systems.model import ModelConfig, TransformerLM, cross_entropy
from cs336_systems.optim import AdamW

STEPS = 10
VOCAB, CONTEXT = 97, 12
OPTIMIZERS = {
    "adamw": (AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "torch-sgd-momentum": (torch.optim.SGD, dict(lr=1e-2, momentum=0.9)),
}
MODELS = ("toy-tied-frozen", "transformer")


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "transformer":
        return TransformerLM.from_size("nano", context_length=CONTEXT, vocab_size=VOCAB)
    return ToyModelWithTiedWeights()


def _loss(name: str, model: nn.Module, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    if name == "transformer":
        tokens = torch.randint(0, VOCAB, (4, CONTEXT + 1), generator=g)
        return cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
    x, y = torch.randn(8, IN_FEATURES, generator=g), torch.randn(8, OUT_FEATURES, generator=g)
    return ((model(x) - y) ** 2).mean()


def _two_groups(model: nn.Module, lr: float) -> list[dict]:
    """Two groups with different learning rates; the tied parameter appears once (parameters() dedups)."""
    params = list(model.parameters())
    return [{"params": params[::2]}, {"params": params[1::2], "lr": 3 * lr}]


def _train(model_name: str, pairs: list[tuple[nn.Module, torch.optim.Optimizer]], steps: range) -> None:
    for step in steps:
        for model, optimizer in pairs:
            optimizer.zero_grad()
            _loss(model_name, model, step).backward()
            optimizer.step()


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def _same_on_all_ranks(model: nn.Module) -> bool:
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, flat)
    return all(torch.equal(g, flat) for g in gathered)


def _state_dicts_equal(a: dict, b: dict) -> bool:
    if sorted(a["state"]) != sorted(b["state"]) or len(a["param_groups"]) != len(b["param_groups"]):
        return False
    for ga, gb in zip(a["param_groups"], b["param_groups"]):
        if {k: v for k, v in ga.items()} != {k: gb.get(k) for k in ga}:
            return False
    for i in a["state"]:
        for key, value in a["state"][i].items():
            other = b["state"][i][key]
            if torch.is_tensor(value) and not torch.allclose(value.float(), torch.as_tensor(other).float(), atol=1e-7):
                return False
    return True


def _equality(model_name: str, optimizer_name: str) -> dict:
    cls, kwargs = OPTIMIZERS[optimizer_name]
    model = _model(model_name)
    reference = copy.deepcopy(model)
    sharded = get_sharded_optimizer(_two_groups(model, kwargs["lr"]), cls, **kwargs)
    plain = cls(_two_groups(reference, kwargs["lr"]), **kwargs)
    _train(model_name, [(model, sharded), (reference, plain)], range(STEPS))
    owned = {p for p, r in sharded.owner.items() if r == sharded.rank}
    out = dict(
        max_diff=_max_diff(model, reference),
        moved=_max_diff(reference, _model(model_name)),
        same_on_all_ranks=_same_on_all_ranks(model),
        state_only_for_owned=all(p in owned for p in sharded.local_optimizer.state),
        rank_numel=list(sharded.rank_numel),
        largest_numel=max(p.numel() for p in model.parameters()),
        owners=[sharded.owner[p] for g in sharded.param_groups for p in g["params"]],
    )
    sharded.zero_grad()
    out["zero_grad_cleared"] = all(p.grad is None for p in model.parameters())

    # Checkpoints: the consolidated state equals the unsharded optimizer's; loading it (or this
    # rank's own shard) into fresh sharded optimizers resumes training identically.
    full = sharded.consolidated_state_dict(to=0)
    out["consolidated_equals_unsharded"] = _state_dicts_equal(plain.state_dict(), full) if sharded.rank == 0 else True
    box = [full]
    dist.broadcast_object_list(box, src=0)
    resumed_from_full, resumed_from_shard = copy.deepcopy(model), copy.deepcopy(model)
    opt_full = ShardedOptimizer(_two_groups(resumed_from_full, kwargs["lr"]), cls, **kwargs)
    opt_full.load_state_dict(box[0])
    opt_shard = ShardedOptimizer(_two_groups(resumed_from_shard, kwargs["lr"]), cls, **kwargs)
    opt_shard.load_state_dict(sharded.state_dict())
    more = range(STEPS, STEPS + 3)
    _train(model_name, [(resumed_from_full, opt_full), (resumed_from_shard, opt_shard), (reference, plain)], more)
    out["resumed_from_full_diff"] = _max_diff(resumed_from_full, reference)
    out["resumed_from_shard_diff"] = _max_diff(resumed_from_shard, reference)
    return out


def _add_param_group_later() -> dict:
    """Start with the blocks only, add the embeddings and head with their own lr after 4 steps."""
    model = _model("transformer")
    reference = copy.deepcopy(model)

    def split(m):
        late = [m.token_embeddings.weight, m.lm_head.weight]
        return [p for p in m.parameters() if all(p is not q for q in late)], late

    early, late = split(model)
    ref_early, ref_late = split(reference)
    sharded = ShardedOptimizer(early, AdamW, lr=1e-2)
    plain = AdamW(ref_early, lr=1e-2)
    _train("transformer", [(model, sharded), (reference, plain)], range(4))
    sharded.add_param_group({"params": late, "lr": 5e-3, "weight_decay": 0.0})
    plain.add_param_group({"params": ref_late, "lr": 5e-3, "weight_decay": 0.0})
    _train("transformer", [(model, sharded), (reference, plain)], range(4, STEPS))
    # An LR schedule edits param_groups; the change must reach the wrapped optimizer.
    for opt in (sharded, plain):
        opt.param_groups[0]["lr"] = 2e-3
    _train("transformer", [(model, sharded), (reference, plain)], range(STEPS, STEPS + 2))
    return dict(
        max_diff=_max_diff(model, reference),
        late_owned_somewhere=all(p in sharded.owner for p in late),
        hyperparameters=[(g["lr"], g["weight_decay"]) for g in sharded.param_groups],
        same_on_all_ranks=_same_on_all_ranks(model),
    )


def _errors() -> dict:
    model = _model("toy-tied-frozen")
    out = {}
    try:
        ShardedOptimizer(model.parameters(), object, lr=1.0)
        out["bad_class"] = "no error"
    except ValueError as err:
        out["bad_class"] = str(err)
    try:
        ShardedOptimizer(model.parameters(), AdamW, lr=1e-3, exchange_round_bytes=0)
        out["bad_round_bytes"] = "no error"
    except ValueError as err:
        out["bad_round_bytes"] = str(err)
    try:
        ShardedOptimizer(model.parameters(), AdamW, lr=1e-3).consolidated_state_dict(to=dist.get_world_size())
        out["bad_rank"] = "no error"
    except ValueError as err:
        out["bad_rank"] = str(err)
    return out


def _exchange(round_bytes: int = 256 * 2**20) -> dict:
    """One step's parameter exchange as this rank issues it, round by round: (send or recv, peer, parameter
    index) per operation, and the parameters each round carries."""
    model = _model("transformer")
    params = list(model.parameters())
    opt = ShardedOptimizer(params, AdamW, lr=1e-3, exchange_round_bytes=round_bytes)
    index = {id(p): i for i, p in enumerate(params)}
    rounds = opt.exchange_rounds()
    return {
        "ops": [
            [("send" if op.op is dist.isend else "recv", op.peer, index[id(op.tensor)]) for op in r] for _, r in rounds
        ],
        "carried": [[index[id(p)] for p in carried] for carried, _ in rounds],
        "owners": [opt.owner[p] for p in params],
        "bytes": [p.numel() * p.element_size() for p in params],
    }


def _exchange_in_flight() -> dict:
    """Steps with the exchange left in flight (`step(wait=False)`), in small rounds: after
    `wait_for_parameters(first block)` those parameters equal the unsharded optimizer's; after the next steps
    (each waiting for the last one's rounds first) and `wait_for_exchange`, all of them do."""
    model, reference = _model("transformer"), _model("transformer")
    sharded = ShardedOptimizer(model.parameters(), AdamW, lr=1e-3, exchange_round_bytes=4096)
    plain = AdamW(reference.parameters(), lr=1e-3)
    rounds = len(sharded.exchange_rounds())
    in_flight = first_diff = None
    for step in range(3):
        sharded.wait_for_parameters(model.parameters())  # what the forward reads (a training step: by block)
        for opt, m in ((sharded, model), (plain, reference)):
            opt.zero_grad()
            _loss("transformer", m, step).backward()
        plain.step()
        sharded.step(wait=False)
        if step == 0:
            in_flight = sharded.rounds_in_flight
            first = list(model.layers[0].parameters())
            sharded.wait_for_parameters(first)
            first_diff = max((a - b).abs().max().item() for a, b in zip(first, reference.layers[0].parameters()))
    sharded.wait_for_exchange()
    return dict(
        rounds=rounds,
        in_flight=in_flight,
        first_diff=first_diff,
        max_diff=_max_diff(model, reference),
        same_on_all_ranks=_same_on_all_ranks(model),
        left=sharded.rounds_in_flight,
    )


def _worker(ctx) -> dict:
    torch.set_num_threads(1)  # ranks share 2 cores; more threads per rank only contend
    results = {(m, o): _equality(m, o) for m in MODELS for o in OPTIMIZERS}
    results["add_param_group"] = _add_param_group_later()
    results["errors"] = _errors()
    results["exchange"] = _exchange()
    results["exchange_small_rounds"] = _exchange(round_bytes=4096)
    results["exchange_in_flight"] = _exchange_in_flight()
    results["one_group_rank_numel"] = ShardedOptimizer(_model("transformer").parameters(), AdamW, lr=1e-3).rank_numel
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}proc")
def ranks(request) -> list[dict]:
    return spawn(_worker, request.param, backend="gloo", timeout_s=120)


@pytest.mark.multiprocess
@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_equals_unsharded_optimizer(ranks, model_name, optimizer_name):
    for rank, results in enumerate(ranks):
        r = results[(model_name, optimizer_name)]
        assert r["moved"] > 1e-3, "the weights must actually change for the comparison to mean anything"
        assert r["max_diff"] <= 1e-6, f"rank {rank}: sharded vs unsharded differ by {r['max_diff']}"
        assert r["same_on_all_ranks"], f"rank {rank}: weights differ between ranks"


@pytest.mark.multiprocess
@pytest.mark.parametrize("model_name", MODELS)
def test_ownership_partitions_and_balances(ranks, model_name):
    world_size = len(ranks)
    r0 = ranks[0][(model_name, "adamw")]
    for results in ranks:
        r = results[(model_name, "adamw")]
        assert r["owners"] == r0["owners"], "every rank must compute the same assignment"
        assert r["state_only_for_owned"], "a rank holds optimizer state for a parameter it does not own"
    loads = r0["rank_numel"]
    assert len(loads) == world_size and sum(loads) > 0
    assert max(loads) - min(loads) <= r0["largest_numel"], f"greedy balance violated: {loads}"
    assert set(r0["owners"]) == set(range(world_size)), "some rank owns nothing"


@pytest.mark.multiprocess
@pytest.mark.parametrize("model_name", MODELS)
def test_state_dict_round_trips(ranks, model_name):
    for rank, results in enumerate(ranks):
        r = results[(model_name, "adamw")]
        assert r["zero_grad_cleared"]
        assert r["consolidated_equals_unsharded"], "consolidated state differs from the unsharded optimizer's"
        assert r["resumed_from_full_diff"] <= 1e-6, f"rank {rank}: resuming from the consolidated state diverged"
        assert r["resumed_from_shard_diff"] <= 1e-6, f"rank {rank}: resuming from the rank's shard diverged"


@pytest.mark.multiprocess
def test_add_param_group_during_training(ranks):
    for results in ranks:
        r = results["add_param_group"]
        assert r["late_owned_somewhere"]
        assert r["max_diff"] <= 1e-6
        assert r["same_on_all_ranks"]
        assert r["hyperparameters"] == [(2e-3, 0.01), (5e-3, 0.0)]


@pytest.mark.multiprocess
def test_bad_arguments_are_value_errors(ranks):
    errors = ranks[0]["errors"]
    assert "torch.optim.Optimizer subclass" in errors["bad_class"]
    assert "outside the world size" in errors["bad_rank"]
    assert "exchange_round_bytes must be positive, got 0" in errors["bad_round_bytes"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("key", ["exchange", "exchange_small_rounds"])
def test_owners_send_and_every_rank_receives_round_by_round(ranks, key):
    """The exchange: each rank sends the parameters it owns to every other rank and receives each other one
    from its owner; within each round, what rank a sends to b, in order, is what b receives from a, in order.
    Round k carries every owner's k-th run of its parameters, in parameter order, each run closing once it
    reaches the round's bytes (one round for this model at the default 256 MiB; several at 4 KiB)."""
    world_size = len(ranks)
    owners, sizes = ranks[0][key]["owners"], ranks[0][key]["bytes"]
    limit = 256 * 2**20 if key == "exchange" else 4096
    runs = {o: [[]] for o in range(world_size)}
    used = dict.fromkeys(range(world_size), 0)
    for i, o in enumerate(owners):
        if used[o] >= limit:
            runs[o].append([])
            used[o] = 0
        runs[o][-1].append(i)
        used[o] += sizes[i]
    expected = [
        sum((runs[o][k] for o in range(world_size) if k < len(runs[o])), [])
        for k in range(max(map(len, runs.values())))
    ]
    assert (len(expected) == 1) == (key == "exchange")
    for rank, results in enumerate(ranks):
        assert results[key]["carried"] == expected, f"rank {rank}: rounds carry other runs"
        ops = [op for r in results[key]["ops"] for op in r]
        received = sorted(i for kind, _, i in ops if kind == "recv")
        assert received == [i for i, o in enumerate(owners) if o != rank], f"rank {rank} misses a parameter"
        assert all(owners[i] == peer for kind, peer, i in ops if kind == "recv"), "received from a non-owner"
        for i, owner in enumerate(owners):
            if owner == rank:
                peers = sorted(peer for kind, peer, j in ops if kind == "send" and j == i)
                assert peers == [q for q in range(world_size) if q != rank], f"rank {rank} does not send {i} to all"
    for k in range(len(expected)):
        for a in range(world_size):
            for b in range(world_size):
                if a != b:
                    sent = [i for kind, peer, i in ranks[a][key]["ops"][k] if kind == "send" and peer == b]
                    got = [i for kind, peer, i in ranks[b][key]["ops"][k] if kind == "recv" and peer == a]
                    assert sent == got, f"round {k}: rank {a}'s sends to {b} do not meet {b}'s receives in order"


@pytest.mark.multiprocess
def test_exchange_left_in_flight_completes_by_parameter_and_in_full(ranks):
    for rank, results in enumerate(ranks):
        r = results["exchange_in_flight"]
        assert r["rounds"] > 2 and r["in_flight"] == r["rounds"], "the exchange must run in several rounds"
        assert r["first_diff"] <= 1e-6, f"rank {rank}: the first block's parameters were not waited for"
        assert r["max_diff"] <= 1e-6, f"rank {rank}: sharded vs unsharded differ by {r['max_diff']}"
        assert r["same_on_all_ranks"] and r["left"] == 0


def test_needs_a_process_group():
    with pytest.raises(ValueError, match="process group"):
        ShardedOptimizer([nn.Parameter(torch.zeros(2))], AdamW, lr=1e-3)


# ---- the greedy rule and the analysis (no processes needed) ----------------------------------------


def test_greedy_assignment_by_hand():
    loads = [0, 0]
    assert assign_greedy([5, 3, 3, 2], loads) == [0, 1, 1, 0]  # 5->r0; 3->r1; 3->r1 (3<5); 2->r0 (5<6)
    assert loads == [7, 6]
    loads = [0, 0, 0]
    assert assign_greedy([1, 1, 1, 1], loads) == [0, 1, 2, 0] and loads == [2, 1, 1]


def test_parameter_shapes_match_the_model():
    model = TransformerLM.from_size("tiny", context_length=CONTEXT, vocab_size=VOCAB)
    config = ModelConfig.from_size("tiny", context_length=CONTEXT, vocab_size=VOCAB)
    assert transformer_parameter_shapes(config) == [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def test_xl_memory_and_communication_by_hand():
    psi = 1_998_235_200  # 2·10000·1600 + 48·(4·1600² + 3·1600·6400 + 2·1600) + 1600
    s = setup_for_model(ModelConfig.from_size("xl"), world_size=2)
    assert s.num_params == psi and s.fsdp_replicated_params == 48 * 2 * 1600 + 1600
    assert psi // 2 <= s.own <= psi // 2 + 6400 * 1600  # greedy is within one parameter of perfect
    mem = memory_table(s).set_index("strategy")
    assert mem.loc["ddp", "total_GB"] == pytest.approx(16 * psi / 1e9)
    assert mem.loc["optimizer_sharding", "optimizer_state_GB"] == pytest.approx(8 * s.own / 1e9)
    assert mem.loc["zero1", "optimizer_state_GB"] == pytest.approx(4 * psi / 1e9)
    assert mem.loc["zero2", "total_GB"] == pytest.approx((4 + 2 + 4) * psi / 1e9)
    assert mem.loc["fsdp", "total_GB"] == pytest.approx(
        16 * ((psi - s.fsdp_replicated_params) / 2 + s.fsdp_replicated_params) / 1e9
    )
    comm = communication_table(s).set_index("strategy")
    assert comm.loc["ddp", "sent_per_rank_GB"] == pytest.approx(4 * psi / 1e9)  # 2·(N−1)/N·4Ψ, N = 2
    assert comm.loc["optimizer_sharding", "relative_to_ddp"] == pytest.approx(1.5)
    assert comm.loc["zero1", "relative_to_ddp"] == pytest.approx(1.0)


def test_zero_paper_numbers():
    """ZeRO paper, Figure 1: Ψ = 7.5B, N = 64, K = 12 -> 120 GB, 31.4 GB, 16.6 GB, 1.88 GB."""
    df = zero_paper_memory(7_500_000_000, 64).set_index("strategy")
    assert df.total_GB.round(2).to_dict() == {"ddp": 120.0, "zero1": 31.41, "zero2": 16.64, "fsdp": 1.88}


@pytest.mark.multiprocess
def test_analytic_breakdown_matches_the_optimizer(ranks):
    world_size = len(ranks)
    config = ShardingBenchmarkConfig(
        size="nano", context_length=CONTEXT, vocab_size=VOCAB, world_size=world_size, global_batch_size=2 * world_size
    )
    assert rank_owned_numel(config) == ranks[0]["one_group_rank_numel"]
