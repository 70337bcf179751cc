"""DDP flavours against single-process training (gloo, 2 processes, CPU), bucketing, failure, overhead model."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import sympy as sp
import torch
import torch.nn as nn
from torch.multiprocessing import ProcessRaisedException

from cs336_systems.distributed import adapters_ddp
from cs336_systems.distributed.compute_stream import prioritized_compute
from cs336_systems.distributed.ddp_base import DataParallel
from cs336_systems.distributed.ddp_bucketed import BYTES_PER_MB, DDPBucketed, assign_buckets
from cs336_systems.distributed.ddp_individual import DDPIndividualParameters
from cs336_systems.distributed.launch import DistContext, spawn
from cs336_systems.experiments.ddp_benchmark import (
    add_overheads,
    describe_stream_priority_effect,
    stream_priority_effect,
)
from cs336_systems.experiments.ddp_equivalence import MODELS, train_and_compare
from cs336_systems.experiments.ddp_flavours import DDPFlavour, expand_flavours, flavour_of
from cs336_systems.experiments.ddp_overhead_model import derive, fit_overhead
from cs336_systems.experiments.ddp_timeline import communication_after, overlap_fraction, timeline_events
from cs336_systems.experiments.toy_models import IN_FEATURES, ToyModel, ToyModelWithTiedWeights

TOLERANCE = 1e-5


def _trainable_bytes(model: nn.Module) -> list[int]:
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


def _equivalence_cases(ctx: DistContext) -> list[dict]:
    """Every flavour on every model; bucket caps chosen per model to give 1, 2 and n buckets."""
    torch.set_num_threads(1)
    rows = []
    for model_name, build in MODELS.items():
        sizes = _trainable_bytes(build())
        # Reverse order puts the first-registered parameter last: a cap of everything but it
        # leaves it alone in a second bucket (also when it is larger than the cap).
        two_buckets_mb = (sum(sizes) - sizes[0]) / BYTES_PER_MB
        cases = [(f, None) for f in expand_flavours(["no-communication", "naive", "flat", "individual", "torch-ddp"])]
        cases += [
            (DDPFlavour("bucketed", None), 1),
            (DDPFlavour("bucketed", two_buckets_mb), 2),
            (DDPFlavour("bucketed", 1e-9), len(sizes)),
        ]
        for flavour, expected_buckets in cases:
            row = train_and_compare(ctx, flavour, model_name, steps=5)
            rows.append({**row, "kind": flavour.name, "expected_buckets": expected_buckets})
        row = train_and_compare(ctx, DDPFlavour("bucketed", None, tail_bucket_mb=1e-9), model_name, steps=5)
        rows.append({**row, "kind": "bucketed", "expected_buckets": 2})
        # Gradients zeroed in place stay bucket views, and autograd accumulates straight into them.
        row = train_and_compare(ctx, DDPFlavour("bucketed", two_buckets_mb), model_name, steps=5, set_to_none=False)
        rows.append({**row, "kind": "bucketed", "expected_buckets": 2})
    return rows


def _adapters_step(ctx: DistContext) -> list[bool]:
    """One step through the course adapters; afterwards every rank must hold the same gradients."""
    same = []
    for ddp, before, after in (
        (
            adapters_ddp.get_ddp_individual_parameters(ToyModelWithTiedWeights()),
            None,
            adapters_ddp.ddp_individual_parameters_on_after_backward,
        ),
        (adapters_ddp.get_ddp(ToyModelWithTiedWeights()), None, adapters_ddp.ddp_on_after_backward),  # the 2026 names
        (
            adapters_ddp.get_ddp_bucketed(ToyModelWithTiedWeights(), 1e-9),
            adapters_ddp.ddp_bucketed_on_train_batch_start,
            adapters_ddp.ddp_bucketed_on_after_backward,
        ),
    ):
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for _ in range(2):
            if before:
                before(ddp, optimizer)
            optimizer.zero_grad(set_to_none=True)
            ddp(torch.randn(4, 10)).pow(2).mean().backward()  # a different batch on each rank
            after(ddp, optimizer)
            grads = torch.cat([p.grad.flatten() for p in ddp.parameters() if p.grad is not None])
            gathered = [torch.empty_like(grads) for _ in range(ctx.world_size)]
            torch.distributed.all_gather(gathered, grads)
            same.append(all(torch.equal(g, gathered[0]) for g in gathered))
            optimizer.step()
    return same


def _correctness_checks(ctx: DistContext) -> tuple[list[dict], list[bool]]:
    return _equivalence_cases(ctx), _adapters_step(ctx)


@pytest.fixture(scope="module")
def correctness():
    """One 2-process gloo run for all correctness checks: process start-up is the expensive part."""
    results = spawn(_correctness_checks, 2, backend="gloo", timeout_s=240)
    return pd.DataFrame([row for rows, _ in results for row in rows]), [same for _, same in results]


@pytest.mark.multiprocess
def test_course_adapters_synchronize_gradients(correctness):
    _, same = correctness
    assert all(all(r) for r in same) and len(same[0]) == 6


def test_adapters_carry_both_course_suites_names():
    """`from cs336_systems.adapters import *` is the course's whole tests/adapters.py (2025 and 2026)."""
    import cs336_systems.adapters as adapters

    names = {
        "get_flashattention_autograd_function_pytorch",
        "get_flashattention_autograd_function_triton",
        "get_ddp_individual_parameters",
        "ddp_individual_parameters_on_after_backward",
        "get_ddp_bucketed",
        "ddp_bucketed_on_after_backward",
        "ddp_bucketed_on_train_batch_start",
        "get_sharded_optimizer",
        "get_ddp",
        "ddp_on_after_backward",
        "get_fsdp",
        "fsdp_on_after_backward",
        "fsdp_gather_full_params",
    }
    assert names <= set(adapters.__all__)
    namespace: dict = {}
    exec("from cs336_systems.adapters import *", namespace)
    assert all(callable(namespace[n]) for n in names)


@pytest.mark.multiprocess
def test_every_flavour_matches_single_process_training(correctness):
    df, _ = correctness
    ddp = df[df.kind != "no-communication"]
    bad = ddp[ddp.max_abs_diff > TOLERANCE]
    assert bad.empty, (
        f"DDP weights differ from single-process training:\n{bad[['model', 'flavour', 'rank', 'max_abs_diff']]}"
    )
    assert (ddp.max_update > 1e-3).all(), "training must move the weights far more than the tolerance"
    assert (df.diff_after_wrap == 0).all(), "construction must broadcast rank 0's parameters and buffers"
    assert (df[df["rank"] == 1].diff_before_wrap > 0).all(), "rank 1 must start from different weights"
    bucketed = df[df.kind == "bucketed"]
    assert (bucketed.buckets == bucketed.expected_buckets).all(), bucketed[
        ["model", "flavour", "buckets", "expected_buckets"]
    ]
    # The negative control shows the comparison can fail: without averaging, ranks drift apart.
    assert (df[df.kind == "no-communication"].max_abs_diff > 1e-4).all()
    assert set(df["rank"]) == {0, 1} and len(ddp) == 2 * 3 * 9
    assert bucketed.grads_in_buckets.all() and (~bucketed.set_to_none).sum() == 2 * 3  # the optimizer read the buckets


def _rank_one_raises(ctx: DistContext) -> None:
    ddp = DDPBucketed(ToyModel(), bucket_size_mb=None)
    loss = ddp(torch.randn(4, 10)).sum()
    if ctx.rank == 1:
        raise RuntimeError("deliberate failure on rank 1")
    loss.backward()
    ddp.finish_gradient_synchronization()  # rank 0 waits here for a peer that is gone


@pytest.mark.multiprocess
def test_a_rank_that_raises_fails_the_job_instead_of_hanging():
    start = time.monotonic()
    # Whichever rank's error arrives first (rank 1's, or rank 0's broken connection to it), the
    # job ends with a rank's exception, not with the launcher's wall-clock TimeoutError.
    with pytest.raises(ProcessRaisedException, match="deliberate failure on rank 1|Connection reset|Connection closed"):
        spawn(_rank_one_raises, 2, backend="gloo", timeout_s=60)
    assert time.monotonic() - start < 60


def _rank_one_aborts_while_reducing(ctx: DistContext) -> None:
    if ctx.rank == 1:
        os.abort()  # what a C++ failure inside a collective looks like: a signal, no Python exception
    torch.distributed.all_reduce(torch.ones(1))


def _rank_one_aborts_at_exit(ctx: DistContext) -> int:
    import atexit

    if ctx.rank == 1:
        atexit.register(os.abort)  # dies in interpreter shutdown, after its result is saved
    return 10 + ctx.rank


@pytest.mark.multiprocess
def test_a_rank_killed_by_a_signal_is_reported_with_its_stack():
    with pytest.raises(
        RuntimeError,
        match=r"(?s)rank 1 of distributed job _rank_one_aborts_while_reducing .*died with SIGABRT.*"
        r"_rank_one_aborts_while_reducing",
    ):
        spawn(_rank_one_aborts_while_reducing, 2, backend="gloo", timeout_s=60)


@pytest.mark.multiprocess
def test_a_rank_dying_after_its_result_is_saved_keeps_the_results():
    with pytest.warns(RuntimeWarning, match="rank 1 of _rank_one_aborts_at_exit died with SIGABRT while shutting down"):
        assert spawn(_rank_one_aborts_at_exit, 2, backend="gloo", timeout_s=60) == [10, 11]


@pytest.mark.multiprocess
def test_destroying_the_process_group_stops_its_threads_even_after_compile_imports():
    # A fresh interpreter, so the import order is the one a worker sees: the group is created,
    # then torch._dynamo is imported (torch.compile does this), then the group is destroyed.
    script = """
import os, gc
from cs336_systems.distributed.launch import free_port, init_process_group
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
init_process_group(0, 1, 0, "gloo", 60)
import torch._dynamo
dist.destroy_process_group()
gc.collect()
print(sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gloo" not in done.stdout, f"gloo threads outlived destroy_process_group: {done.stdout}"


@pytest.mark.multiprocess
def test_ddp_benchmark_runs_under_torchrun(tmp_path):
    out = tmp_path / "ddp.csv"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "cs336_systems.experiments.ddp_benchmark",
        "--size",
        "nano",
        "--context-length",
        "16",
        "--bucket-sizes-mb",
        "0.01",
        "--warmup",
        "0",
        "--steps",
        "2",
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    df = pd.read_csv(out)
    assert list(df.flavour) == ["no-communication", "naive", "flat", "individual", "bucketed 0.01 MB", "torch-ddp"]
    assert (df.status == "ok").all() and (df.step_ms > 0).all()
    assert df.loc[df.flavour == "no-communication", "overhead_ms"].item() == 0
    assert (
        df.loc[df.flavour == "naive", "all_reduce_calls"].item()
        == df.loc[df.flavour == "individual", "all_reduce_calls"].item()
    )
    assert df.loc[df.flavour == "flat", "all_reduce_calls"].item() == 1
    assert (df.compute_priority == "n/a (no CUDA streams)").all()


@pytest.mark.multiprocess
def test_scaling_holds_the_per_rank_batch_and_measures_each_world_size():
    from cs336_systems.experiments.ddp_benchmark import DDPBenchmarkConfig
    from cs336_systems.experiments.ddp_scaling import benchmark_scaling, scaling_table

    base = DDPBenchmarkConfig(size="nano", context_length=16, warmup=0, steps=2, backend="gloo")
    df = benchmark_scaling(base, [3, 2], per_rank_batch=1, bucket_size_mb=0.01)
    assert (df.status == "ok").all()
    assert list(df.world_size) == [2] * 4 + [3] * 4  # sorted, four flavours each
    assert (df.global_batch_size == df.world_size).all()  # 1 sequence per rank at every size
    assert list(df.flavour[:4]) == ["no-communication", "naive", "bucketed 0.01 MB", "torch-ddp"]
    base_rows = df[df.flavour == "no-communication"]
    assert (base_rows.efficiency == 1).all() and (base_rows.overhead_ms == 0).all()
    naive = df[df.flavour == "naive"].set_index("world_size")
    expected = base_rows.set_index("world_size").step_ms / naive.step_ms
    assert np.allclose(naive.efficiency, expected)
    table = scaling_table(df)
    assert list(table.world_size) == [2, 3] and "naive step (ms)" in table and "torch-ddp efficiency" in table


def test_scaling_lists_world_sizes_beyond_the_gpus_as_not_run():
    from cs336_systems.experiments.ddp_benchmark import DDPBenchmarkConfig
    from cs336_systems.experiments.ddp_scaling import benchmark_scaling

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    beyond = max(have + 1, 2)
    df = benchmark_scaling(
        DDPBenchmarkConfig(size="nano"), [beyond], per_rank_batch=1, bucket_size_mb=None, backend="nccl"
    )
    assert (df.status == "not run").all() and len(df) == 4
    assert df.note.iloc[0] == f"needs {beyond} GPUs, this machine has {have}"
    with pytest.raises(ValueError, match="world sizes must be at least 2"):
        benchmark_scaling(DDPBenchmarkConfig(size="nano"), [1, 2], per_rank_batch=1, bucket_size_mb=None)
    with pytest.raises(ValueError, match="per-rank batch"):
        benchmark_scaling(DDPBenchmarkConfig(size="nano"), [2], per_rank_batch=0, bucket_size_mb=None)


# --- no process group needed below ---------------------------------------------------------------


def test_buckets_follow_reverse_order_and_respect_the_cap():
    params = [nn.Parameter(torch.zeros(n)) for n in (10, 3, 4, 20, 1)]  # 40, 12, 16, 80, 4 bytes
    buckets = assign_buckets(params, bucket_size_bytes=32)
    assert [[p.numel() for p in b] for b in buckets] == [[1], [20], [4, 3], [10]]
    assert [p for b in buckets for p in b] == params[::-1]
    assert len(assign_buckets(params, None)) == 1
    assert len(assign_buckets(params, 1)) == len(params)


def test_a_tail_bucket_splits_the_first_registered_parameters_off_the_last_bucket():
    params = [nn.Parameter(torch.zeros(n)) for n in (10, 3, 4, 20, 1)]  # 40, 12, 16, 80, 4 bytes
    sizes = lambda buckets: [[p.numel() for p in b] for b in buckets]  # noqa: E731
    assert sizes(assign_buckets(params, None, tail_bucket_bytes=60)) == [[1, 20, 4], [3, 10]]
    assert sizes(assign_buckets(params, None, tail_bucket_bytes=16)) == [[1, 20, 4, 3], [10]]  # at least one parameter
    assert sizes(assign_buckets(params, 32, tail_bucket_bytes=16)) == [[1], [20], [4, 3], [10]]  # already small enough
    assert sizes(assign_buckets(params, None, tail_bucket_bytes=1e9)) == [[1, 20, 4, 3, 10]]
    with pytest.raises(ValueError, match="tail_bucket_mb must be positive"):
        DDPBucketed(ToyModel(), None, tail_bucket_mb=0)


def test_buckets_never_mix_dtypes():
    params = [
        nn.Parameter(torch.zeros(2)),
        nn.Parameter(torch.zeros(2, dtype=torch.float64)),
        nn.Parameter(torch.zeros(2)),
    ]
    assert [len(b) for b in assign_buckets(params, None)] == [1, 1, 1]


def test_tied_and_frozen_parameters_are_communicated_once_and_never():
    model = ToyModelWithTiedWeights()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sum(p is model.fc2.weight for p in trainable) == 1
    assert all(p is not model.no_grad_fixed_param for p in trainable)
    assert len(assign_buckets(trainable, None)[0]) == len(trainable)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="bucket_size_mb"):
        DDPBucketed(ToyModel(), bucket_size_mb=0)
    with pytest.raises(ValueError, match="process group"):
        DDPFlavour("naive").wrap(ToyModel())
    with pytest.raises(ValueError, match="unknown DDP flavour"):
        DDPFlavour("zero")
    with pytest.raises(ValueError, match="only applies to the bucketed"):
        DDPFlavour("flat", 10)
    with pytest.raises(ValueError, match="max_ctas only applies to the bucketed flavour, not 'individual'"):
        DDPFlavour("individual", max_ctas=8)
    assert issubclass(DDPBucketed, DataParallel)


def _cta_cap_on_gloo(ctx) -> str:
    try:
        DDPFlavour("bucketed", 10, max_ctas=8).wrap(ToyModel())
    except ValueError as err:
        return str(err)
    return "accepted"


@pytest.mark.multiprocess
def test_nccl_thread_block_caps_are_flavours_and_refused_off_nccl():
    flavours = expand_flavours(["naive", "bucketed"], [10, 100], [None, 8])
    assert [f.label for f in flavours] == [
        "naive",
        "bucketed 10 MB",
        "bucketed 100 MB",
        "bucketed 10 MB, 8 CTAs",
        "bucketed 100 MB, 8 CTAs",
    ]
    assert [f.label for f in expand_flavours(["bucketed"], [100], tail_bucket_mb=[None, 64])] == [
        "bucketed 100 MB",
        "bucketed 100 MB, tail 64 MB",
    ]
    errors = spawn(_cta_cap_on_gloo, 2, backend="gloo", timeout_s=60)
    assert errors == ["max_ctas limits NCCL's thread blocks; this process group runs gloo"] * 2


def test_a_flavour_is_recovered_from_its_benchmark_row():
    for flavour in [
        DDPFlavour("naive"),
        DDPFlavour("bucketed", 100.0),
        DDPFlavour("bucketed", 10.0, 8, 64.0),
        DDPFlavour("bucketed", None),
    ]:
        row = pd.Series(
            dict(
                kind=flavour.name,
                bucket_size_mb=flavour.bucket_size_mb,
                max_ctas=flavour.max_ctas,
                tail_bucket_mb=flavour.tail_bucket_mb,
            )
        )
        assert flavour_of(row) == flavour
    table = pd.DataFrame(
        [
            dict(kind="bucketed", bucket_size_mb=1000.0, max_ctas=None, tail_bucket_mb=None),
            dict(kind="bucketed", bucket_size_mb=2000.0, max_ctas=16, tail_bucket_mb=256.0),
        ]
    )
    assert [flavour_of(r) for _, r in table.iterrows()] == [
        DDPFlavour("bucketed", 1000.0),
        DDPFlavour("bucketed", 2000.0, 16, 256.0),
    ]
    assert isinstance(flavour_of(table.iloc[1]).max_ctas, int)  # NaN-padded columns come back as floats


def test_stream_priority_effect_compares_each_run_with_its_own_naive():
    def run(base, naive, bucketed, fwd_bwd):
        df = pd.DataFrame(
            [
                dict(
                    flavour="no-communication",
                    kind="no-communication",
                    status="ok",
                    step_ms=base,
                    fwd_bwd_ms=100.0,
                    sync_ms=0.0,
                ),
                dict(flavour="naive", kind="naive", status="ok", step_ms=naive, fwd_bwd_ms=100.0, sync_ms=naive - base),
                dict(
                    flavour="bucketed 1000 MB",
                    kind="bucketed",
                    status="ok",
                    step_ms=bucketed,
                    fwd_bwd_ms=fwd_bwd,
                    sync_ms=1.0,
                ),
                dict(
                    flavour="flat",
                    kind="flat",
                    status="OOM",
                    step_ms=float("nan"),
                    fwd_bwd_ms=float("nan"),
                    sync_ms=float("nan"),
                ),
            ]
        )
        return add_overheads(df)

    effect = stream_priority_effect(run(200.0, 240.0, 210.0, 108.0), run(201.0, 241.0, 221.0, 118.0))
    assert list(effect.flavour) == ["no-communication", "naive", "bucketed 1000 MB"]  # the OOM row is in neither
    row = effect.set_index("flavour").loc["bucketed 1000 MB"]
    assert row.overhead_ms_default == pytest.approx(20.0) and row.overhead_ms_highest == pytest.approx(10.0)
    assert row.share_of_naive_default == pytest.approx(0.5) and row.share_of_naive_highest == pytest.approx(0.25)
    text = describe_stream_priority_effect(effect)
    assert "bucketed 1000 MB overhead 20.0 → 10.0 ms (50% → 25% of naive's)" in text
    assert "naive overhead 40.0 → 40.0 ms;" in text
    assert "no-communication step moved -1.0 ms (201.0 → 200.0 ms)" in text
    assert "bucketed 1000 MB 18.0 → 8.0 ms" in text


def test_prioritized_compute_is_a_no_op_off_cuda():
    with prioritized_compute("cpu") as stream:
        assert stream is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prioritized_compute_outranks_the_default_stream_keeps_order_and_runs_the_backward():
    x = torch.zeros(1 << 22, device="cuda")
    x.add_(1)  # queued on the caller's stream before the block
    w = nn.Parameter(torch.ones(8, device="cuda"))
    hook_streams = []
    w.register_post_accumulate_grad_hook(lambda p: hook_streams.append(torch.cuda.current_stream()))
    caller = torch.cuda.current_stream()
    with prioritized_compute("cuda") as stream:
        assert torch.cuda.current_stream() == stream and stream.priority < caller.priority
        x.mul_(3)
        (w * 2).sum().backward()
    x.add_(1)  # after the block, on the caller's stream again
    assert torch.cuda.current_stream() == caller
    assert x[0].item() == 4 and x[-1].item() == 4  # (0 + 1) * 3 + 1: the three kernels ran in order
    assert hook_streams == [stream], "the gradient hook did not run on the stream of the forward pass"
    assert torch.equal(w.grad, torch.full_like(w, 2.0))


def test_overhead_model_optimum_matches_brute_force():
    e = derive()
    s, w, o, n_b = sp.symbols("s w o n_b", positive=True)
    assert sp.simplify(e["optimal_buckets"] - sp.sqrt(s / (w * o))) == 0
    assert sp.simplify(e["optimal_bucket_bytes"] - sp.sqrt(s * w * o)) == 0
    values = {s: 8e9, w: 2e11, o: 5e-4}
    grid = np.linspace(0.5, 200, 400_000)
    overhead = values[s] / (grid * values[w]) + grid * values[o]
    assert float(e["optimal_buckets"].subs(values)) == pytest.approx(grid[np.argmin(overhead)], rel=1e-3)
    assert float(e["least_overhead"].subs(values)) == pytest.approx(overhead.min(), rel=1e-6)
    # One bucket: nothing overlaps, all bytes plus one call are exposed.
    assert float(e["overhead"].subs({**values, n_b: 1})) == pytest.approx(8e9 / 2e11 + 5e-4)


def test_overhead_fit_recovers_known_parameters():
    nb = np.array([1, 4, 16, 64, 300])
    s, w, o = 8e9, 1.5e11, 2e-4
    fit = fit_overhead(nb, s / (nb * w) + nb * o, s)
    assert fit.per_call_s == pytest.approx(o, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(w, rel=1e-9)
    assert fit.optimal_buckets == pytest.approx(np.sqrt(s / (w * o)), rel=1e-9)
    # Overhead falling with n_b everywhere has no per-call cost: clamped to zero, not negative.
    clamped = fit_overhead(nb, s / (nb * w) - nb * 1e-6, s)
    assert clamped.per_call_s == 0 and np.isinf(clamped.optimal_buckets)
    with pytest.raises(ValueError, match="at least two"):
        fit_overhead([4], [0.1], s)


def test_timeline_lanes_and_overlap_from_a_gpu_chrome_trace():
    def launch(ts, corr):
        return {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 2,
            "ts": ts,
            "dur": 1,
            "args": {"correlation": corr},
        }

    def kernel(name, stream, ts, dur, corr):
        return {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "pid": 0,
            "tid": stream,
            "ts": ts,
            "dur": dur,
            "args": {"correlation": corr},
        }

    trace = {
        "traceEvents": [
            # The CPU range ends long before its kernels run; one kernel is launched from another thread.
            {"ph": "X", "cat": "user_annotation", "name": "backward", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
            launch(12, 1),
            {**launch(20, 2), "tid": 3},
            launch(25, 3),
            launch(40, 4),
            kernel("sgemm", 7, 100, 50, 1),
            kernel("sgemm", 7, 150, 50, 2),
            kernel("ncclDevKernel_AllReduce_Sum_f32", 21, 150, 100, 3),  # launched in backward, must not stretch it
            kernel("adam", 7, 260, 10, 4),  # launched after the backward range
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 11, "dur": 5},
        ]
    }
    ev = timeline_events(trace)
    assert set(ev.lane) == {"step phases", "GPU 0 stream 7", "GPU 0 stream 21"}
    phase = ev[ev.kind == "phase"].iloc[0]
    assert (phase["name"], phase.start_us, phase.dur_us) == (
        "backward",
        0.0,
        100.0,
    )  # its kernels, 100..200 (the origin)
    assert ev.set_index("name").loc["ncclDevKernel_AllReduce_Sum_f32", "kind"] == "communication"
    assert overlap_fraction(ev) == pytest.approx(0.5)  # NCCL 150..250 against backward 100..200
    assert communication_after(ev) == pytest.approx(0.05)  # ends 50 us after the backward kernels


def test_timeline_of_a_cpu_trace_uses_gloo_threads():
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "backward", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 9, "ts": 80, "dur": 40},
            {"ph": "X", "cat": "user_annotation", "name": "computing softmax", "pid": 1, "tid": 1, "ts": 5, "dur": 5},
        ]
    }
    ev = timeline_events(trace)
    assert sorted(ev.lane) == ["step phases", "thread 9"]
    assert overlap_fraction(ev) == pytest.approx(0.5) and communication_after(ev) == pytest.approx(0.02)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.multiprocess
def test_every_flavour_matches_single_process_training_on_nccl():
    from cs336_systems.experiments.ddp_equivalence import check_equivalence, summarize_equivalence

    flavours = expand_flavours(["naive", "flat", "individual", "bucketed", "torch-ddp"], [None, 1e-9])
    checks = summarize_equivalence(check_equivalence(flavours, backend="nccl"), TOLERANCE)
    assert checks.matches.all(), checks


def _freed_after_drop(ctx: DistContext) -> dict[str, bool]:
    """Each hook-based wrapper, trained one step and dropped, must free its model."""
    import gc
    import weakref

    torch.set_num_threads(1)
    freed = {}
    for name, wrap in {"individual": DDPIndividualParameters, "bucketed": lambda m: DDPBucketed(m, None)}.items():
        model = ToyModel()
        ddp = wrap(model)
        ddp(torch.randn(4, IN_FEATURES)).sum().backward()
        ddp.finish_gradient_synchronization()
        ref = weakref.ref(model)
        del model, ddp
        gc.collect()
        freed[name] = ref() is None
    return freed


@pytest.mark.multiprocess
def test_dropped_wrappers_free_their_models():
    for rank in spawn(_freed_after_drop, 2, backend="gloo", timeout_s=120):
        assert rank == {"individual": True, "bucketed": True}, f"a dropped DDP wrapper kept its model alive: {rank}"
