"""FSDP against non-parallel training, on gloo with 2 processes (and 3, where shards need padding).

Each rank trains its slice of every global batch with FSDP; a single-process reference trains
on the whole batch. fp32: after 3 AdamW steps each weight W must agree to 3·eps·max|W|, an ulp
of its largest element per step (tests/tolerances.py: a split and a whole batch sum their
gradients in different orders, which each BLAS picks). Low precision (fp16 compute): the
reference is ordinary mixed precision — a copy of the fp32 master weights cast to fp16 for the
forward and backward, fp32 gradients and AdamW update — and the weights must agree to 1e-4.
AdamW uses eps=1e-5: with eps=1e-8 the update lr·m/(sqrt(v)+eps) maps a gradient component near
zero to ±lr whatever its size, so the ulp differences between a split and a whole batch move
isolated weights far more than their own rounding — in fp16 by up to 2·lr (measured: 1.3e-3 at
lr=1e-3, while one rank reproduces the reference exactly), in fp32 by up to 27·eps·max|W| (40
seeds, two MKL code paths; at most 1.5 with eps=1e-5). eps=1e-5 bounds that amplification and
leaves the update Adam-like. Spawns are few (process start-up dominates): each runs several
checks and returns numbers; the asserts are here.
"""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from cs336_systems.accounting.sharding import is_sharded_by_fsdp, setup_for_model, transformer_parameter_shapes
from cs336_systems.distributed.adapters_sharding import fsdp_gather_full_params, fsdp_on_after_backward, get_fsdp
from cs336_systems.distributed.fsdp import FSDP, ShardedWeight, shardable_weight
from cs336_systems.distributed.launch import spawn
from cs336_systems.experiments.fsdp_timeline import forward_gather_timing
from cs336_systems.experiments.toy_models import IN_FEATURES, OUT_FEATURES, ToyModel
from cs336_systems.model import ModelConfig, TransformerLM, cross_entropy
from cs336_systems.optim import AdamW
from tolerances import eps_units

STEPS = 3
VOCAB, CONTEXT, PER_RANK_BATCH = 97, 12, 2
FP16_TOLERANCE = 1e-4
ADAM_EPS = 1e-5  # module docstring


def _transformer(checkpoint_every: int | None = None) -> nn.Module:
    torch.manual_seed(0)
    return TransformerLM.from_size("nano", context_length=CONTEXT, vocab_size=VOCAB, checkpoint_every=checkpoint_every)


def _toy() -> nn.Module:
    torch.manual_seed(0)
    return ToyModel()


def _batch(model: nn.Module, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    if isinstance(model, ToyModel):
        return torch.randn(batch_size, IN_FEATURES, generator=g), torch.randn(batch_size, OUT_FEATURES, generator=g)
    tokens = torch.randint(0, VOCAB, (batch_size, CONTEXT + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if target.is_floating_point():
        return ((output.float() - target) ** 2).mean()
    return cross_entropy(output, target)


def _reference_step(master: nn.Module, optimizer: torch.optim.Optimizer, inputs, targets, dtype: torch.dtype) -> None:
    """One non-parallel step; with a low dtype, Linear/Embedding weights are cast copies (mixed precision)."""
    working = master if dtype == torch.float32 else copy.deepcopy(master)
    if working is not master:
        for m in working.modules():
            if shardable_weight(m) is not None:
                m.weight.data = m.weight.data.to(dtype)
        if inputs.is_floating_point():
            inputs = inputs.to(dtype)
    _loss(working(inputs), targets).backward()
    if working is not master:
        for p, q in zip(master.parameters(), working.parameters()):
            p.grad = q.grad.float()
    optimizer.step()
    optimizer.zero_grad()


def _compare(make_model, dtype: torch.dtype, probe: bool = False) -> dict:
    """Train FSDP and the reference side by side for STEPS steps; return the differences."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    reference = make_model()
    fsdp = get_fsdp(make_model(), compute_dtype=None if dtype == torch.float32 else dtype)
    opt_ref = AdamW(reference.parameters(), lr=1e-3, eps=ADAM_EPS)
    opt = AdamW(fsdp.parameters(), lr=1e-3, eps=ADAM_EPS)
    live_during_forward: list[list[str]] = []
    if probe:  # registered after FSDP's hooks, so it sees the state right after the prefetch
        for w in fsdp.weights:
            w.module.register_forward_pre_hook(
                lambda m, a, w=w: live_during_forward.append(
                    [v.name for v in fsdp.weights if v.state != ShardedWeight.FREE]
                )
            )
    start = copy.deepcopy(reference)
    for step in range(STEPS):
        live_during_forward.clear()
        inputs, targets = _batch(reference, step, PER_RANK_BATCH * world_size)
        _reference_step(reference, opt_ref, inputs, targets, dtype)
        mine = slice(rank * PER_RANK_BATCH, (rank + 1) * PER_RANK_BATCH)
        _loss(fsdp(inputs[mine]), targets[mine]).backward()
        fsdp_on_after_backward(fsdp, opt)
        opt.step()
        opt.zero_grad()
    full = fsdp_gather_full_params(fsdp)
    expected = dict(reference.named_parameters())
    return dict(
        names_match=sorted(full) == sorted(expected),
        max_diff=max((full[n] - expected[n]).abs().max().item() for n in expected),
        max_eps_units=max(eps_units(full[n], expected[n]) for n in expected),
        moved=max((p - q).abs().max().item() for p, q in zip(reference.parameters(), start.parameters())),
        dtypes={str(v.dtype) for v in full.values()},
        shard_dtypes={str(p.dtype) for p in fsdp.parameters()},
        gathered_dtypes={str(w.gathered.dtype) for w in fsdp.weights},
        all_released=all(w.full.untyped_storage().nbytes() == 0 for w in fsdp.weights),
        shard_sizes={w.name: (w.numel, w.shard_numel, w.shard.numel()) for w in fsdp.weights},
        order=[w.name for w in fsdp._order],
        live_during_forward=[list(x) for x in live_during_forward],
    )


def _tied_transformer() -> nn.Module:
    model = _transformer()
    model.lm_head.weight = model.token_embeddings.weight  # both (vocab, d_model)
    return model


def _errors() -> dict:
    out = {}
    for label, build in {
        "no_layers": lambda: FSDP(nn.Sequential(nn.LayerNorm(4))),
        "int_dtype": lambda: FSDP(_toy(), compute_dtype=torch.int32),
        "tied": lambda: FSDP(_tied_transformer()),
    }.items():
        try:
            build()
            out[label] = "no error"
        except ValueError as err:
            out[label] = str(err)
    return out


def _freed_after_drop() -> bool:
    """A wrapped model trained one step, then dropped, must be freed (its hooks hold FSDP weakly)."""
    import gc
    import weakref

    model = _transformer()
    fsdp = FSDP(model)
    optimizer = AdamW(fsdp.parameters(), lr=1e-3)
    inputs, targets = _batch(model, 0, PER_RANK_BATCH)
    _loss(fsdp(inputs), targets).backward()
    fsdp.finish_gradient_synchronization()
    optimizer.step()
    ref = weakref.ref(model)
    del model, fsdp, optimizer
    gc.collect()
    return ref() is None


def _worker(ctx, full: bool) -> dict:
    torch.set_num_threads(1)  # ranks share 2 cores; more threads per rank only contend
    if not full:  # 3 ranks: every shard of the nano model needs padding; fp32 suffices
        return {"fp32": _compare(_transformer, torch.float32)}
    return {
        "fp32": _compare(_transformer, torch.float32, probe=True),
        "fp16": _compare(_transformer, torch.float16),
        "toy-fp32": _compare(_toy, torch.float32),
        "checkpointed-fp32": _compare(lambda: _transformer(checkpoint_every=1), torch.float32),
        "errors": _errors(),
        "freed": _freed_after_drop(),
    }


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    return spawn(_worker, 2, args=(True,), backend="gloo", timeout_s=150)


@pytest.fixture(scope="module")
def three_ranks() -> list[dict]:
    return spawn(_worker, 3, args=(False,), backend="gloo", timeout_s=150)


def _check_equal(ranks: list[dict], case: str) -> None:
    for rank, results in enumerate(ranks):
        r = results[case]
        assert r["names_match"]
        assert r["moved"] > 1e-3, "the weights must actually change for the comparison to mean anything"
        differs = f"rank {rank}, {case}: FSDP differs from non-parallel training by {r['max_diff']:.3g}"
        if case == "fp16":
            assert r["max_diff"] <= FP16_TOLERANCE, differs
        else:  # per step: w - update rounds to within half an ulp on either side (<= 1 eps·max|W| apart), and
            # eps = 1e-5 keeps Adam's amplification of the gradients' ulp differences below that
            assert r["max_eps_units"] <= STEPS, f"{differs} ({r['max_eps_units']:.2f} eps·max|W|)"
        assert r["dtypes"] == {"torch.float32"} and r["shard_dtypes"] == {"torch.float32"}, (
            "master weights must stay fp32"
        )
        assert r["all_released"], "gathered weights must be released after the step"
        expected = "torch.float16" if case == "fp16" else "torch.float32"
        assert r["gathered_dtypes"] == {expected}, "weights are gathered (communicated) in the compute dtype"


@pytest.mark.parametrize("case", ["fp32", "fp16", "toy-fp32", "checkpointed-fp32"])
@pytest.mark.multiprocess
def test_matches_non_parallel_training(two_ranks, case):
    _check_equal(two_ranks, case)


def _check_shards(ranks: list[dict]) -> None:
    world_size = len(ranks)
    sizes = ranks[0]["fp32"]["shard_sizes"]
    assert sizes and all(shard == -(-numel // world_size) == stored for numel, shard, stored in sizes.values())


@pytest.mark.multiprocess
def test_shards_are_equal_sized(two_ranks):
    _check_shards(two_ranks)


@pytest.mark.multiprocess
def test_uneven_split_is_padded_and_exact(three_ranks):
    _check_shards(three_ranks)
    assert all(numel % 3 for numel, _, _ in three_ranks[0]["fp32"]["shard_sizes"].values()), "every shard needs padding"
    _check_equal(three_ranks, "fp32")


@pytest.mark.multiprocess
def test_prefetches_one_module_ahead(two_ranks):
    """In the last forward, module i starts with exactly itself and module i+1 gathered."""
    r = two_ranks[0]["fp32"]
    order, live = r["order"], r["live_during_forward"]
    assert order[0] == "token_embeddings.weight" and order[-1] == "lm_head.weight"
    assert order.index("layers.0.ffn.w3.weight") < order.index("layers.0.ffn.w2.weight"), (
        "order must be the execution order"
    )
    assert len(live) == len(order)
    for i, names in enumerate(live):
        assert set(names) == set(order[i : i + 2]), f"at {order[i]}: gathered {names}"


@pytest.mark.multiprocess
def test_dropped_fsdp_frees_its_model(two_ranks):
    assert all(r["freed"] for r in two_ranks), "a dropped FSDP model stayed alive (a hook cycle through its parameters)"


@pytest.mark.multiprocess
def test_bad_arguments_are_value_errors(two_ranks):
    errors = two_ranks[0]["errors"]
    assert "no submodule with a trainable 2-D weight" in errors["no_layers"]
    assert "floating-point" in errors["int_dtype"]
    assert "tied weights are not supported" in errors["tied"]


def test_needs_a_process_group():
    with pytest.raises(ValueError, match="process group"):
        FSDP(_toy())


# ---- the analysis of a profiled step, on a hand-made GPU trace (no processes needed) -----------------


def _event(name, kind, ts, dur, lane="CPU thread 1", launch=None):
    return dict(
        name=name,
        kind=kind,
        ts_us=float(ts),
        dur_us=float(dur),
        end_us=float(ts + dur),
        lane=lane,
        launch_ts_us=float(ts if launch is None else launch),
        source="",
        host_pid=1,
    )


def _gpu_trace(with_launches: bool = True) -> pd.DataFrame:
    """Two modules. A's gather (prefetched) ends at 50 while the stream computes until 60: in time.
    B's gather is launched at A's start but ends at 130 while the stream is free from 100: 30 µs exposed."""
    compute, comm = "GPU 0 stream 7", "GPU 0 stream 20"
    rows = [
        _event("fsdp all-gather A", "range", 0, 5),
        _event("fsdp all-gather B", "range", 20, 5),
        _event("fsdp forward A", "range", 30, 10),
        _event("fsdp forward B", "range", 50, 10),
        _event("ncclDevKernel_AllGather_RING_LL", "kernel", 10, 40, comm, launch=2 if with_launches else 500),
        _event("ncclDevKernel_AllGather_RING_LL", "kernel", 60, 70, comm, launch=22 if with_launches else 501),
        _event("previous_gemm", "kernel", 20, 40, compute, launch=1),
        _event("gemm_A", "kernel", 60, 40, compute, launch=32),  # A: starts right after 60
        _event("gemm_B", "kernel", 130, 20, compute, launch=52),  # B: waited for its gather until 130
    ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("with_launches", [True, False], ids=["by-launch", "by-order"])
def test_gather_timing_on_a_gpu_trace(with_launches):
    t = forward_gather_timing(_gpu_trace(with_launches)).set_index("module")
    assert list(t.index) == ["A", "B"] and t.clock.iloc[0] == "GPU kernels" and t.gather_found.all()
    assert t.loc["A", "in_time"] and t.loc["A", "exposed_ms"] == 0
    assert not t.loc["B", "in_time"] and t.loc["B", "exposed_ms"] == pytest.approx(0.030)
    assert t.loc["B", "ready_ms"] == pytest.approx((100 - 10) / 1e3)  # origin: A's gather start, 10 µs
    assert t.loc["B", "gather_end_ms"] == pytest.approx((130 - 10) / 1e3)


def test_fsdp_accounting_counts_padding():
    config = ModelConfig.from_size("nano", vocab_size=VOCAB, context_length=CONTEXT)
    s = setup_for_model(config, world_size=3)
    weights = [math.prod(shape) for name, shape in transformer_parameter_shapes(config) if is_sharded_by_fsdp(name)]
    assert s.fsdp_sharded_params == sum(-(-n // 3) * 3 for n in weights) > sum(weights)
    assert s.fsdp_replicated_params == 3 * 32  # ln1, ln2, ln_final of one block
