"""FSDP on a model built from layer classes it has never seen, against single-process training.

The layers below are defined here, related neither to `torch.nn`'s nor to the library's: what
FSDP shards is decided by structure (a module's own trainable 2-D `weight`), and whether a weight
is a lookup table or a linear map by its first forward's input. The setting is the course's
spring-2026 FSDP test: 2 ranks on gloo, deterministic algorithms, SGD with lr 0.01, a batch of 20
split 10/10 and reshuffled every step, 3 steps, every parameter compared after every step.

fp32: FSDP must equal, bit for bit, one process that averages the gradients of the two halves of
each batch — the arithmetic data parallelism prescribes — and stay close to one backward over
the whole batch (whose weight gradients sum all tokens in one matrix product, in the BLAS's order,
which no sum of the halves' products reproduces): each weight within one ulp of its largest element
per step (tests/tolerances.py). fp16 compute: within 1e-4 of mixed-precision training of the whole
batch.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from cs336_systems.distributed.adapters_sharding import fsdp_gather_full_params, fsdp_on_after_backward, get_fsdp
from cs336_systems.distributed.fsdp import shardable_weight
from cs336_systems.distributed.launch import spawn
from tolerances import eps_units

pytestmark = pytest.mark.multiprocess  # every test reads the one 2-rank job

VOCAB, D_MODEL, D_FF, SEQ, BATCH, STEPS, LR = 100, 64, 128, 8, 20, 3, 0.01


class RowTable(nn.Module):
    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(rows, dim))  # N(0, 1), as torch.nn.Embedding

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids]


class FeatureMap(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) * d_in**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight)


class Gain(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


class TileScale(nn.Module):
    """A 2-D weight that is neither a lookup nor a linear map: an elementwise scale of (SEQ, D_MODEL)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(SEQ, D_MODEL))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class Toy(nn.Module):
    def __init__(self, with_tile_scale: bool = False):
        super().__init__()
        self.embedding = RowTable(VOCAB, D_MODEL)
        self.scale = TileScale() if with_tile_scale else nn.Identity()
        self.norm1 = Gain(D_MODEL)
        self.linear1 = FeatureMap(D_MODEL, D_FF)
        self.norm2 = Gain(D_FF)
        self.linear2 = FeatureMap(D_FF, D_MODEL)
        self.lm_head = FeatureMap(D_MODEL, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm1(self.scale(self.embedding(ids)))
        x = self.norm2(torch.relu(self.linear1(x)))
        return self.lm_head(self.linear2(x))


def _loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(ids)[:, -1, :].float(), labels)


def _to_compute_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A working copy whose sharded weights are cast (what FSDP computes with under mixed precision)."""
    working = copy.deepcopy(model)
    for m in working.modules():
        if shardable_weight(m) is not None:
            m.weight.data = m.weight.data.to(dtype)
    return working


def _gradients(model: nn.Module, ids, labels, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    working = model if dtype is None else _to_compute_dtype(model, dtype)
    working.zero_grad(set_to_none=True)
    _loss(working, ids, labels).backward()
    return {n: p.grad.float() for n, p in working.named_parameters()}


def _sgd(model: nn.Module, grads: dict[str, torch.Tensor]) -> None:
    """torch.optim.SGD's step (the course test's optimizer) with the given gradients."""
    for n, p in model.named_parameters():
        p.grad = grads[n]
    torch.optim.SGD(model.parameters(), lr=LR).step()


def _train_side_by_side(dtype: torch.dtype | None, with_tile_scale: bool = False) -> dict:
    """FSDP and two single-process references, step by step; returns the largest differences."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(42)
    base = Toy(with_tile_scale)
    whole, halves = copy.deepcopy(base), copy.deepcopy(base)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fsdp = get_fsdp(copy.deepcopy(base), compute_dtype=dtype)
        optimizer = torch.optim.SGD(fsdp.parameters(), lr=LR)
        g = torch.Generator().manual_seed(123)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        labels = torch.randint(0, VOCAB, (BATCH,), generator=g)
        local = BATCH // world_size
        out = dict(
            equal_to_halves=[],
            diff_to_halves=[],
            diff_to_whole=[],
            units_to_whole=[],
            grads_ok=True,
            replicated_equal=True,
        )
        for step in range(STEPS):
            _sgd(whole, _gradients(whole, ids, labels, dtype))
            parts = [
                _gradients(halves, ids[r * local : (r + 1) * local], labels[r * local : (r + 1) * local], dtype)
                for r in range(world_size)
            ]
            _sgd(halves, {n: sum(p[n] for p in parts) / world_size for n in parts[0]})

            optimizer.zero_grad(set_to_none=True)
            mine = slice(rank * local, (rank + 1) * local)
            _loss(fsdp, ids[mine], labels[mine]).backward()
            fsdp_on_after_backward(fsdp, optimizer)
            for p in fsdp.module.parameters():
                out["grads_ok"] &= p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype
            for p in fsdp.replicated:
                gathered = [torch.empty_like(p.grad) for _ in range(world_size)]
                dist.all_gather(gathered, p.grad)
                out["replicated_equal"] &= all(torch.equal(gathered[0], x) for x in gathered)
            optimizer.step()

            full = fsdp_gather_full_params(fsdp)
            ref_halves, ref_whole = dict(halves.named_parameters()), dict(whole.named_parameters())
            assert sorted(full) == sorted(ref_whole), "gathered names must be the wrapped module's"
            out["equal_to_halves"].append(all(torch.equal(full[n], ref_halves[n]) for n in full))
            out["diff_to_halves"].append(max((full[n] - ref_halves[n]).abs().max().item() for n in full))
            out["diff_to_whole"].append(max((full[n] - ref_whole[n]).abs().max().item() for n in full))
            out["units_to_whole"].append(max(eps_units(full[n], ref_whole[n]) for n in full))

            perm = torch.randperm(BATCH, generator=torch.Generator().manual_seed(42 + step))
            ids, labels = ids[perm], labels[perm]
    out["sharded"] = sorted(w.name for w in fsdp.weights)
    out["replicated"] = sorted(fsdp.replicated_names)
    out["roles"] = {w.name: w.role for w in fsdp.weights}
    out["warnings"] = [str(w.message) for w in caught if "FSDP" in str(w.message)]
    return out


def _worker(ctx) -> dict:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    return {
        "fp32": _train_side_by_side(None),
        "fp16": _train_side_by_side(torch.float16),
        "tile-scale": _train_side_by_side(None, with_tile_scale=True),
    }


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn(_worker, 2, backend="gloo", timeout_s=150)


def test_foreign_layers_are_sharded_by_structure(ranks):
    r = ranks[0]["fp32"]
    assert r["sharded"] == ["embedding.weight", "linear1.weight", "linear2.weight", "lm_head.weight"]
    assert r["replicated"] == ["norm1.weight", "norm2.weight"]
    assert r["roles"] == {
        "embedding.weight": "lookup",
        "linear1.weight": "linear",
        "linear2.weight": "linear",
        "lm_head.weight": "linear",
    }
    assert r["warnings"] == [], "a lookup table and linear maps must not warn"


def test_fp32_equals_data_parallel_arithmetic_bit_for_bit(ranks):
    for rank, results in enumerate(ranks):
        r = results["fp32"]
        assert r["equal_to_halves"] == [True] * STEPS, f"rank {rank}: differences {r['diff_to_halves']}"
        # In eps·max|W| units: each step rounds w - lr·g on either side to within half an ulp (<= 1 unit apart);
        # the gradients differ by ulps of g, which lr = 0.01 scales far below that; the differences add up.
        assert max(r["units_to_whole"]) <= STEPS, f"rank {rank}: {r['units_to_whole']} (absolute {r['diff_to_whole']})"


def test_fp16_compute_is_within_1e4_of_mixed_precision_training(ranks):
    for rank, results in enumerate(ranks):
        r = results["fp16"]
        # fp16 gradients of a split and a whole batch differ by about an fp16 ulp (1e-3 relative) of gradients
        # below 1; lr = 0.01 and 3 steps make that at most 3e-5, whatever the BLAS
        assert max(r["diff_to_whole"]) <= 1e-4, f"rank {rank}: {r['diff_to_whole']}"


@pytest.mark.parametrize("case", ["fp32", "fp16", "tile-scale"])
def test_gradients_after_the_hook(ranks, case):
    for results in ranks:
        assert results[case]["grads_ok"], "every parameter needs a gradient of its data's shape and dtype (fp32)"
        assert results[case]["replicated_equal"], "replicated gradients must be equal on every rank"


def test_a_weight_of_unknown_use_warns_once_and_stays_correct(ranks):
    r = ranks[0]["tile-scale"]
    assert "scale.weight" in r["sharded"] and r["roles"]["scale.weight"] == "other"
    assert len(r["warnings"]) == 1 and "scale.weight" in r["warnings"][0]
    assert r["equal_to_halves"] == [True] * STEPS, r["diff_to_halves"]
