"""The attention benchmark functions: rows and columns, OOM rows from a forced budget, the
sweep's continuation until OOM, the memory accounting against what autograd really saves."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from cs336_systems.attention import FlashAttentionPytorch
from cs336_systems.attention.naive import naive_attention
from cs336_systems.experiments.attention_benchmark import (
    CudaMemoryCap,
    MiB,
    SavedForBackward,
    accuracy_table,
    attention_errors,
    attention_sweep,
    benchmark_attention,
    merge_compiled,
    naive_attention_memory,
    peak_memory_sweep,
    quadratic_fit,
    resolve_implementation,
    run_in_subprocess,
    saved_logsumexp,
)

TIMING_COLUMNS = ["forward_ms", "forward_std_ms", "backward_ms", "backward_std_ms", "first_call_ms"]
LIB = Path(__file__).resolve().parents[1] / "lib"
MEMORY_COLUMNS = ["memory_before_backward_mib", "saved_for_backward_mib"]


def flash_pytorch(q, k, v, is_causal=False):
    return FlashAttentionPytorch.apply(q, k, v, is_causal)


@pytest.fixture(autouse=True)
def uncompiled_flash_backward_on_one_thread(monkeypatch):
    """No compile (seconds on a CPU); one thread, as tiny tensors gain nothing from two and a busy
    2-core machine makes threads wait on each other."""
    monkeypatch.setattr(FlashAttentionPytorch, "compile_backward", False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_benchmark_row_has_timings_and_memory():
    row = benchmark_attention(naive_attention, 2, 32, 16, warmup=1, steps=3)
    assert row["status"] == "ok"
    for col in TIMING_COLUMNS + MEMORY_COLUMNS:
        assert row[col] >= 0, col
    assert row["forward_ms"] > 0 and row["backward_ms"] > 0
    assert (row["batch"], row["seq_len"], row["d_model"], row["dtype"]) == (2, 32, 16, "float32")


@pytest.mark.parametrize("batch, seq, d", [(2, 32, 16), (8, 64, 32), (1, 100, 8)])
def test_accounting_matches_what_autograd_saves(batch, seq, d):
    row = benchmark_attention(naive_attention, batch, seq, d, warmup=0, steps=1)
    predicted = naive_attention_memory(batch, seq, d)
    assert row["saved_for_backward_mib"] * MiB == predicted["saved_for_backward"]
    assert row["memory_before_backward_mib"] * MiB == predicted["before_backward"]
    # By hand for (2, 32, 16): 4·2·32·16 + 3·2·32² + 2·2·32 floats.
    if (batch, seq, d) == (2, 32, 16):
        assert predicted["before_backward"] == 4 * (4 * 1024 + 3 * 2048 + 128)


def test_flash_saves_linear_memory():
    naive = benchmark_attention(naive_attention, 2, 128, 16, warmup=0, steps=1)
    flash = benchmark_attention(flash_pytorch, 2, 128, 16, warmup=0, steps=1)
    # Q, K, V, O (4 · 2·128·16 floats) plus L (2·128 floats): nothing quadratic.
    assert flash["saved_for_backward_mib"] * MiB == 4 * (4 * 2 * 128 * 16 + 2 * 128)
    assert naive["saved_for_backward_mib"] > 5 * flash["saved_for_backward_mib"]


def test_forced_budget_gives_an_oom_row():
    need = naive_attention_memory(4, 128, 16)["before_backward"]
    row = benchmark_attention(naive_attention, 4, 128, 16, warmup=0, steps=1, memory_budget_bytes=need - 1)
    assert row["status"] == "OOM" and row["oom_phase"] == "forward"
    assert "out of memory" in row["error"]
    assert (
        benchmark_attention(naive_attention, 4, 128, 16, warmup=0, steps=1, memory_budget_bytes=need)["status"] == "ok"
    )


def test_other_errors_are_not_swallowed():
    def broken(q, k, v, is_causal=False):
        raise ValueError("not an OOM")

    with pytest.raises(ValueError, match="not an OOM"):
        benchmark_attention(broken, 1, 16, 16, warmup=0, steps=1)


def test_sweep_continues_past_oom_and_extends_until_oom():
    # Budget between seq 64 and seq 128 of the naive attention, batch 2, d 16.
    budget = (
        naive_attention_memory(2, 64, 16)["before_backward"] + naive_attention_memory(2, 128, 16)["before_backward"]
    ) // 2
    df = attention_sweep(
        {"naive": naive_attention, "flash": flash_pytorch},
        [16, 32],
        [32, 128, 64],
        batch=2,
        warmup=0,
        steps=1,
        memory_budget_bytes=budget,
        max_seq_len=512,
        progress=False,
    )
    assert {"implementation", "d_model", "seq_len", "status", "extended", *TIMING_COLUMNS, *MEMORY_COLUMNS} <= set(
        df.columns
    )
    naive16 = df[(df.implementation == "naive") & (df.d_model == 16)].set_index("seq_len")
    assert naive16.status.to_dict() == {32: "ok", 64: "ok", 128: "OOM"}  # OOM inside the grid: no extension for naive
    flash16 = df[(df.implementation == "flash") & (df.d_model == 16)].set_index("seq_len")
    # Flash keeps doubling past the grid until its first OOM (or max_seq_len).
    assert list(flash16.index) == [32, 64, 128, 256, 512]
    assert flash16.extended.tolist() == [s > 128 for s in flash16.index]
    assert (flash16.status == "ok").all()
    assert set(df.d_model) == {16, 32}


def test_sweep_extension_stops_at_first_oom():
    budget = naive_attention_memory(1, 256, 16)["before_backward"]
    df = attention_sweep(
        {"naive": naive_attention},
        [16],
        [64, 128],
        batch=1,
        warmup=0,
        steps=1,
        memory_budget_bytes=budget,
        progress=False,
    )
    assert df.seq_len.tolist() == [64, 128, 256, 512]
    assert df.status.tolist() == ["ok", "ok", "ok", "OOM"]
    assert df.extended.tolist() == [False, False, True, True]


def test_isolated_sweep_restarts_after_oom_and_matches_in_process():
    """Isolated: (64, naive), (64, sdpa), (128, naive) OOM end the first process; (128, sdpa) runs in a second."""
    budget = (
        naive_attention_memory(2, 64, 16)["before_backward"] + naive_attention_memory(2, 128, 16)["before_backward"]
    ) // 2
    specs = {"naive": "naive", "sdpa": "sdpa"}  # sdpa saves O(N) on CPU, and unlike flash_pytorch compiles nothing
    kwargs = dict(batch=2, warmup=0, steps=1, memory_budget_bytes=budget, max_seq_len=128, progress=False)
    isolated = attention_sweep(specs, [16], [64, 128], isolate=True, **kwargs)
    in_process = attention_sweep(specs, [16], [64, 128], isolate=False, **kwargs)
    keys = ["implementation", "seq_len", "status", "memory_before_backward_mib", "saved_for_backward_mib"]
    pd.testing.assert_frame_equal(isolated[keys], in_process[keys])
    assert isolated.status.tolist() == ["ok", "ok", "OOM", "ok"]


def test_isolated_sweep_needs_specs():
    with pytest.raises(ValueError, match="specs"):
        attention_sweep({"naive": naive_attention}, [16], [64], isolate=True)


def test_resolve_implementation():
    assert resolve_implementation("naive") is naive_attention
    assert resolve_implementation(flash_pytorch) is flash_pytorch
    compiled = resolve_implementation("compiled:naive")  # not called: compiling costs seconds
    assert callable(compiled) and compiled is not naive_attention
    with pytest.raises(ValueError, match="unknown attention 'nope'"):
        resolve_implementation("compiled:nope")


def test_failing_worker_raises_with_its_error():
    settings = dict(
        batch=1, device="cpu", dtype=torch.float32, is_causal=False, warmup=0, steps=1, memory_budget_bytes=None
    )
    with pytest.raises(RuntimeError, match="unknown attention 'nope'"):
        list(run_in_subprocess({"x": "nope"}, 16, [(32, "x")], settings))


def test_sweep_rejects_empty_grid():
    with pytest.raises(ValueError, match="at least one"):
        attention_sweep({"naive": naive_attention}, [], [64])


def test_saved_for_backward_counts_each_storage_once_and_enforces_budget():
    x = torch.randn(64, 64, requires_grad=True)
    with SavedForBackward() as saved:
        y = x * x  # saves x twice: one storage
    assert saved.saved_bytes == 64 * 64 * 4
    assert saved.live_bytes(y) == 2 * 64 * 64 * 4
    with (
        pytest.raises(torch.OutOfMemoryError, match="simulated budget"),
        SavedForBackward(resident=[x], budget_bytes=64 * 64 * 4 + 1),
    ):
        (x * 2).exp()  # exp saves its 16 KiB output


def test_quadratic_fit_recovers_coefficients():
    n = np.array([64, 128, 256, 512])
    a, b, c = quadratic_fit(n, 96 * n**2 + 12 * n + 7)
    assert a == pytest.approx(96) and b == pytest.approx(12) and c == pytest.approx(7, abs=1e-4)
    with pytest.raises(ValueError, match="at least 3"):
        quadratic_fit([1, 2], [1, 4])


def test_merge_compiled_side_by_side():
    base = dict(status="ok", first_call_ms=1.0, memory_before_backward_mib=1.0, saved_for_backward_mib=1.0)
    df = pd.DataFrame(
        [
            dict(implementation="eager", d_model=16, seq_len=64, forward_ms=4.0, backward_ms=9.0, **base),
            dict(implementation="compiled", d_model=16, seq_len=64, forward_ms=2.0, backward_ms=3.0, **base),
            dict(implementation="eager", d_model=16, seq_len=128, **{**base, "status": "OOM"}),
        ]
    )
    wide = merge_compiled(df, "eager", "compiled")
    assert wide.loc[0, "forward_speedup"] == 2.0 and wide.loc[0, "backward_speedup"] == 3.0
    assert wide.loc[1, "status_eager"] == "OOM" and np.isnan(wide.loc[1, "forward_speedup"])


def test_peak_memory_sweep_rows():
    df = peak_memory_sweep({"naive": naive_attention, "flash": flash_pytorch}, [64, 128], d_model=16, progress=False)
    assert set(df.columns) >= {"implementation", "seq_len", "status", "saved_for_backward_mib", "peak_mib"}
    assert (df.status == "ok").all()
    at128 = df[df.seq_len == 128].set_index("implementation").saved_for_backward_mib
    assert at128["naive"] > 5 * at128["flash"]
    budgeted = peak_memory_sweep({"naive": naive_attention}, [512], d_model=16, memory_budget_bytes=MiB, progress=False)
    assert budgeted.status.tolist() == ["OOM"]


def test_accuracy_table_passes_a_correct_kernel_and_flags_a_wrong_one():
    cases = [dict(shape_q=(2, 40, 16), shape_kv=(2, 40, 16), dtype=torch.float32, is_causal=True)]
    table = accuracy_table({"flash_pytorch": flash_pytorch}, cases)
    assert table.tensor.tolist() == ["O", "L", "dQ", "dK", "dV"]
    assert table.passes.all() and (table.relative_error < 1e-5).all()

    def ignores_the_mask(q, k, v, is_causal):
        return FlashAttentionPytorch.apply(q, k, v, False)

    wrong = accuracy_table({"no mask": ignores_the_mask}, cases)
    assert not wrong.passes.any()


def test_errors_need_a_saved_logsumexp():
    with pytest.raises(ValueError, match="exactly one saved tensor"):
        attention_errors(naive_attention, (1, 16, 16), (1, 16, 16), dtype=torch.float32, is_causal=False)
    q = torch.randn(1, 16, 16, requires_grad=True)
    assert saved_logsumexp(flash_pytorch(q, q, q), q).shape == (1, 16)


OOM_ROW_IN_A_FRESH_PROCESS = """
import json, sys, torch
from cs336_systems.attention.naive import naive_attention
from cs336_systems.experiments.attention_benchmark import MiB, allocate_library_workspaces, attention_sweep
isolate = sys.argv[1] == "isolate"
implementation = "naive" if isolate else naive_attention  # a process is handed a spec, not a callable
allocate_library_workspaces(torch.device("cuda"))  # what the sweep holds before its cap, held here too
before = torch.cuda.memory_allocated()
df = attention_sweep({"naive": implementation}, [16], [2048], batch=8, warmup=1, steps=2, device="cuda",
                     memory_budget_bytes=64 * MiB, until_oom=False, isolate=isolate, progress=False)
print(json.dumps(dict(status=df.status.tolist(), oom_phase=df.oom_phase.tolist(),
                      kept=torch.cuda.memory_allocated() - before)))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("isolate", [True, False], ids=["own-process", "in-process"])
def test_gpu_budget_gives_a_real_oom_row(isolate):
    # the inputs (1 MiB each) fit a 64 MiB budget, a (8, 2048, 2048) fp32 score matrix (128 MiB) does not.
    # Run from a fresh process: after earlier GPU tests this one holds segments with free room inside
    # that no cap can take back (CudaMemoryCap's docstring), and the in-process cap would not bind
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(LIB), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [sys.executable, "-c", OOM_ROW_IN_A_FRESH_PROCESS, "isolate" if isolate else "in-process"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == ["OOM"]
    assert result["oom_phase"] == ["forward"]  # the budget is the configuration's, beside the workspaces
    assert result["kept"] < MiB  # in process: the OOM's tensors were released


def test_cuda_memory_cap_adds_the_budget_to_what_the_process_holds(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=1000 * MiB))
    cache = {"released": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: cache.update(released=True))
    # the live workspaces, and before the cache is released 4 GiB of free blocks from earlier work
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: (100 if cache["released"] else 4196) * MiB)

    def set_fraction(fraction, device):
        if not isinstance(device, int) and torch.device(device).index is None:  # PyTorch's refuses it too
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        calls.append(fraction)

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with CudaMemoryCap(torch.device("cuda"), 64 * MiB):  # the name the sweeps give the device
        assert calls == [pytest.approx(0.164)]
    assert calls[-1] == 1.0  # lifted
    with CudaMemoryCap(torch.device("cuda", 0), 2000 * MiB):
        assert calls[-1] == 1.0  # a budget past the device is the whole device
    with CudaMemoryCap(torch.device("cpu"), 64 * MiB), CudaMemoryCap(torch.device("cuda", 0), None):
        pass
    assert len(calls) == 4  # neither the CPU nor a None budget touches the allocator
