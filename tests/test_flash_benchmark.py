"""The FlashAttention-2 benchmark and leaderboard harness: formulas, statuses, the correctness check.

CPU only and tiny: our Triton kernels run in the Triton interpreter, so TRITON_INTERPRET is set
before anything imports triton (hence at the top of this file).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings  # noqa: E402

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from cs336_systems.attention.launch.layout import kernels_interpreted  # noqa: E402
from cs336_systems.benchmarking import attention_registry as registry  # noqa: E402
from cs336_systems.benchmarking import ceiling, timing  # noqa: E402
from cs336_systems.experiments import flash_benchmark as fb  # noqa: E402
from cs336_systems.experiments import flash_leaderboard as lb  # noqa: E402
from cs336_systems.experiments.attention_benchmark import SavedForBackward  # noqa: E402
from cs336_systems.report.environment import repo_root  # noqa: E402

FAST = timing.TimingSettings(cpu_steps=1)


@pytest.fixture
def triton_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("these tests run the CPU path; the GPU path is covered by the notebooks")
    if not kernels_interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set")


def tiny_sweep(impls, **kwargs):
    return fb.flash_benchmark([32], [16], [torch.float32], impls, device="cpu", settings=FAST, progress=False, **kwargs)


# --- formulas -----------------------------------------------------------------------------------


def counted_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_forward_flops_match_torch_flop_counter_of_the_two_matmuls():
    b, h, n, d = 2, 3, 64, 16
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    counted = counted_flops(lambda: torch.softmax(q @ k.transpose(-1, -2), -1) @ v)
    assert fb.attention_flops(b, h, n, d, is_causal=False)["forward"] == counted == 4 * b * h * n * n * d
    assert fb.attention_flops(b, h, n, d, is_causal=True)["forward"] == counted / 2


def test_backward_flops_are_the_materialised_backward_plus_the_recomputed_scores():
    b, h, n, d = 1, 2, 32, 16
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    out = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    backward = counted_flops(lambda: out.backward(torch.ones_like(out)))  # dP, dV, dQ, dK: 4 matmuls
    recompute_scores = counted_flops(lambda: q.detach() @ k.detach().transpose(-1, -2))
    flops = fb.attention_flops(b, h, n, d, is_causal=False)
    assert flops["backward"] == backward + recompute_scores
    assert flops["forward_backward"] == flops["forward"] + flops["backward"]


def test_leaderboard_floors_by_hand():
    # causal forward 4 * 16 * 16384^2 * 64 / 2; fwd+bwd 3.5x that
    assert lb.LEADERBOARD.flops()["forward"] == 549_755_813_888
    assert lb.LEADERBOARD.flops()["forward_backward"] == 1_924_145_348_608
    # bf16 tensor 16*16384*64*2 = 33,554,432 B; L fp32 16*16384*4 = 1,048,576 B
    assert lb.LEADERBOARD.min_bytes() == dict(
        forward=4 * 33_554_432 + 1_048_576,
        backward=8 * 33_554_432 + 1_048_576,
        forward_backward=12 * 33_554_432 + 2 * 1_048_576,
    )
    table = lb.floors(lb.LEADERBOARD, peak_tflops=1000.0, bandwidth_gb_s=2000.0).set_index("pass")
    assert table.loc["forward_backward", "FLOP floor (ms)"] == pytest.approx(1.924145348608)
    assert table.loc["forward", "byte floor (ms)"] == pytest.approx((4 * 33_554_432 + 1_048_576) / 2e12 * 1e3)


def test_naive_peak_is_five_score_matrices_plus_the_linear_terms():
    b, h, n, d = 1, 2, 1024, 64
    peak = fb.naive_peak_bytes(b, h, n, d, torch.bfloat16)
    assert peak == 2 * (5 * b * h * n * n + 4 * b * h * n * d + 2 * b * h * n)


# --- timing ---------------------------------------------------------------------------------------


def test_cpu_timing_skips_the_first_call_and_resets_gradients():
    x = torch.ones(3, requires_grad=True)
    calls, grads_seen = [], []

    def step():
        grads_seen.append(x.grad)
        calls.append(1)
        (2 * x).sum().backward()

    times = timing.measure_times_ms(step, torch.device("cpu"), timing.TimingSettings(cpu_steps=4), grad_to_none=[x])
    assert len(times) == 4 and len(calls) == 5 and all(t >= 0 for t in times)
    assert all(g is None for g in grads_seen)


def test_matmul_ceiling_is_a_positive_rate():
    assert ceiling.measure_matmul_tflops(torch.float32, n=64, device="cpu", settings=FAST) > 0


# --- statuses ---------------------------------------------------------------------------------------


def test_every_implementation_runs_and_passes_the_check_on_cpu(triton_on_cpu):
    df = tiny_sweep(["triton", "pytorch", "sdpa_flash"])
    assert list(df.status) == ["ok", "ok", "ok"], df[["impl", "status", "max_rel_error", "note"]]
    assert (df.max_rel_error < 1e-5).all()
    assert (df[[f"{p}_ms" for p in fb.PASSES]].astype(float) > 0).all().all()
    assert df[[f"{p}_device_ms" for p in fb.PASSES]].isna().all().all()  # CUDA graphs: GPU only
    flops = fb.attention_flops(1, 1, 32, 16)["forward_backward"]
    row = df.iloc[0]
    assert row.forward_backward_tflops == pytest.approx(flops / (row.forward_backward_ms * 1e-3) / 1e12)


def test_a_wrong_kernel_is_caught(monkeypatch):
    monkeypatch.setattr(
        registry, "naive_attention", lambda q, k, v, is_causal: torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    )
    df = tiny_sweep(["pytorch", "sdpa_flash"])  # the first ignores the causal mask and the 1/sqrt(d) scale
    wrong, right = df.iloc[0], df.iloc[1]
    assert wrong.status == "wrong" and wrong.max_rel_error > 0.05 and wrong.forward_ms > 0
    assert right.status == "ok"


def test_nan_output_is_wrong(monkeypatch):
    monkeypatch.setattr(registry, "naive_attention", lambda q, k, v, is_causal: q * float("nan"))
    assert tiny_sweep(["pytorch"]).status.item() == "wrong"


def test_an_out_of_memory_becomes_a_row_and_the_sweep_goes_on(monkeypatch):
    real = registry.naive_attention

    def under_a_tiny_budget(q, k, v, is_causal):
        with SavedForBackward(resident=(q, k, v), budget_bytes=q.nbytes * 3 + 1024):  # no room for the scores
            return real(q, k, v, is_causal)

    monkeypatch.setattr(registry, "naive_attention", under_a_tiny_budget)
    df = tiny_sweep(["pytorch", "sdpa_flash"])
    assert list(df.status) == ["OOM", "ok"]
    assert "out of memory" in df.note.iloc[0] and pd.isna(df.forward_ms.iloc[0])


def test_the_memory_budget_skips_the_materialised_attention_from_its_shape():
    peak = fb.naive_peak_bytes(1, 1, 32, 16, torch.float32)
    df = tiny_sweep(["pytorch", "sdpa_flash"], memory_budget_bytes=peak - 1)
    assert list(df.status) == ["skipped: memory", "ok"]
    assert tiny_sweep(["pytorch"], memory_budget_bytes=peak).status.item() == "ok"


def test_no_kernel_becomes_a_row_with_torchs_reason(monkeypatch):
    def refuses(q, k, v, is_causal):
        warnings.warn("Flash attention kernel not used because: dtype float32 is not supported", stacklevel=2)
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(registry, "_sdpa", refuses)
    row = tiny_sweep(["sdpa_flash"]).iloc[0]
    assert row.status == "no kernel" and "dtype float32 is not supported" in row.note


def test_a_real_cpu_no_kernel_row():
    assert tiny_sweep(["sdpa_cudnn"]).status.item() == "no kernel"


def test_a_failing_library_backend_is_a_row_but_our_failure_stops_the_sweep(monkeypatch, triton_on_cpu):
    def broken(*args):
        raise RuntimeError("cuDNN Frontend error: graph did not build")

    monkeypatch.setattr(registry, "_sdpa", broken)
    assert tiny_sweep(["sdpa_cudnn"]).status.item() == "backend error"
    monkeypatch.setattr(registry, "_triton", broken)
    with pytest.raises(RuntimeError, match="graph did not build"):
        tiny_sweep(["triton"])


def test_unknown_implementation_is_a_value_error():
    with pytest.raises(ValueError, match="unknown implementation 'flash3'"):
        tiny_sweep(["flash3"])


# --- tables -----------------------------------------------------------------------------------------


def result_row(impl, status="ok", seq_len=1024, fwd=1.0, bwd=2.0, dtype="bfloat16"):
    return dict(
        impl=impl,
        batch=1,
        heads=1,
        seq_len=seq_len,
        head_dim=64,
        dtype=dtype,
        is_causal=True,
        status=status,
        forward_ms=fwd,
        backward_ms=bwd,
        forward_backward_ms=fwd + bwd,
    )


def test_fastest_sdpa_keeps_the_lowest_forward_backward_that_passed():
    df = fb._tidy(
        pd.DataFrame(
            [
                result_row("triton"),
                result_row("sdpa_flash", fwd=1.0, bwd=2.0),
                result_row("sdpa_cudnn", fwd=1.5, bwd=1.0),
                result_row("sdpa_efficient", status="wrong", fwd=0.1, bwd=0.1),
                result_row("sdpa_flash", status="no kernel", seq_len=2048),
                result_row("sdpa_cudnn", status="OOM", seq_len=2048),
            ]
        )
    )
    best = fb.fastest_sdpa(df).set_index("seq_len")
    assert best.loc[1024, "backend"] == "cudnn" and best.loc[1024, "forward_backward_ms"] == 2.5
    assert best.loc[2048, "status"] == "no backend ran" and "sdpa_cudnn: OOM" in best.loc[2048, "note"]
    table = fb.comparison_table(df)
    assert list(table.impl) == ["triton", "sdpa", "sdpa"]


def test_compare_latencies_flags_slow_points_and_failures():
    df = fb._tidy(
        pd.DataFrame(
            [
                result_row("triton", seq_len=512, fwd=5.0),
                result_row("sdpa_flash", seq_len=512),  # below min_seq_len
                result_row("triton", seq_len=1024, fwd=1.05, bwd=2.5),
                result_row("sdpa_flash", seq_len=1024),
                result_row("triton", seq_len=2048, status="wrong"),
                result_row("sdpa_flash", seq_len=2048),
                result_row("triton", seq_len=4096),
                result_row("sdpa_flash", seq_len=4096, status="no kernel"),
            ]
        )
    )
    cmp = fb.compare_latencies(df, "triton", "sdpa_flash", 1.10, min_seq_len=1024, dtypes=["bfloat16"])
    assert sorted(cmp.seq_len.unique()) == [1024, 2048]  # 4096: the baseline did not run
    slow = cmp[cmp.slower]
    assert set(zip(slow.seq_len, slow["pass"])) == {
        (1024, "backward"),
        (1024, "forward_backward"),
        (2048, "forward"),
        (2048, "backward"),
        (2048, "forward_backward"),
    }
    assert cmp.set_index(["seq_len", "pass"]).loc[(1024, "backward"), "ratio"] == pytest.approx(1.25)


def test_compare_latencies_on_device_time_and_the_eager_overhead():
    def with_device(row, fwd, bwd):
        return {**row, "forward_device_ms": fwd, "backward_device_ms": bwd, "forward_backward_device_ms": fwd + bwd}

    df = fb._tidy(
        pd.DataFrame(
            [
                with_device(result_row("triton", fwd=3.0, bwd=4.0), 0.5, 1.0),
                with_device(result_row("sdpa_flash", fwd=1.0, bwd=2.0), 0.5, 0.8),
                result_row("triton", seq_len=2048),
                result_row("sdpa_flash", seq_len=2048),  # device times not measured
            ]
        )
    )
    eager = fb.compare_latencies(df, "triton", "sdpa_flash", 1.10)
    device = fb.compare_latencies(df, "triton", "sdpa_flash", 1.10, value="device_ms").set_index(["seq_len", "pass"])
    assert eager.slower.sum() == 3
    assert device.loc[(1024, "forward"), "ratio"] == 1.0 and device.loc[(1024, "backward"), "ratio"] == 1.25
    assert list(device[device.slower].index) == [(1024, "backward"), (1024, "forward_backward")]
    assert device.loc[2048].ratio.isna().all() and not device.loc[2048].slower.any()
    assert fb.bar_verdict("on device time", device.reset_index())[0] == "FAIL"
    unmeasured = fb.compare_latencies(df[df.seq_len == 2048], "triton", "sdpa_flash", value="device_ms")
    assert fb.bar_verdict("on device time", unmeasured)[0] == "not checked"
    assert registry.implementation("pytorch").no_device_time and not registry.implementation("triton").no_device_time
    both = fb.eager_and_device(df).set_index(["impl", "pass"])
    assert len(both) == 6  # the 2048 rows have no device time
    assert both.loc[("triton", "backward"), "outside_ms"] == 3.0
    assert both.loc[("sdpa_flash", "forward_backward"), "outside_ms"] == pytest.approx(3.0 - 1.3)


@pytest.mark.gpu
def test_device_time_replays_the_eager_kernels_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    impl = registry.implementation("triton")
    q, k, v = (torch.randn(1, 2, 1000, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn_like(q)
    impl.apply(q, k, v, True).backward(grad_out)
    eager = [t.grad.clone() for t in (q, k, v)]
    captured = {}

    def forward_backward():
        impl.apply(q, k, v, True).backward(grad_out)
        captured["grads"] = [t.grad for t in (q, k, v)]

    times = timing.measure_device_ms(
        forward_backward, timing.TimingSettings(warmup_ms=1, rep_ms=5), grad_to_none=(q, k, v)
    )
    assert times and min(times) > 0
    assert q.grad is None  # reset after the measurement
    for replayed, expected in zip(captured["grads"], eager):  # what the last replay wrote
        torch.testing.assert_close(replayed, expected)


@pytest.mark.gpu
def test_device_passes_capture_a_backward_recorded_on_the_default_stream_on_gpu():
    """From the default stream, as a notebook calls it: the backward of a forward recorded there is captured
    too (a forward on the legacy stream cannot join a capture), and the caller's stream is current after."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    torch.cuda.set_stream(torch.cuda.default_stream())
    q, k, v = (torch.randn(1, 1, 128, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    times = fb.device_passes(
        registry.implementation("triton"),
        q,
        k,
        v,
        torch.randn_like(q),
        True,
        timing.TimingSettings(warmup_ms=1, rep_ms=5),
    )
    assert set(times) == set(fb.PASSES) and all(min(t) > 0 for t in times.values())
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


@pytest.mark.gpu
def test_a_failed_capture_leaves_the_callers_stream_current_and_random_draws_working_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    before = torch.cuda.current_stream()
    with pytest.raises(RuntimeError):
        timing.measure_device_ms(lambda: torch.cuda.synchronize(), timing.TimingSettings(warmup_ms=1, rep_ms=5))
    assert torch.cuda.current_stream() == before
    # the default generator is not left marked as capturing ("Offset increment outside graph capture"): after
    # a sweep records a failed capture, the process's later draws on the device (a model's dropout) still work
    assert torch.randn(4, device="cuda").isfinite().all()


# --- leaderboard ------------------------------------------------------------------------------------


def test_leaderboard_table_has_the_columns_and_one_row_per_implementation(triton_on_cpu):
    config = lb.LeaderboardConfig(heads=1, seq_len=32, head_dim=16)
    df, rounds = lb.leaderboard_table(
        lb.LEADERBOARD_IMPLS,
        config,
        device="cpu",
        compile=False,
        settings=FAST,
        fwd_settings=FAST,
        ceiling_tflops=1.0,
        rounds=2,
    )
    assert list(df.columns[:6]) == lb.LEADERBOARD_COLUMNS
    assert list(df.impl) == ["triton", "sdpa_flash", "sdpa_cudnn"]
    assert list(df.status) == ["ok", "ok", "no kernel"]
    ours = df.iloc[0]
    assert ours.bwd_ms == pytest.approx(ours.fwd_bwd_ms - ours.fwd_ms)
    assert ours.tflops == pytest.approx(config.flops()["forward_backward"] / (ours.fwd_bwd_ms * 1e-3) / 1e12)
    assert ours.ceiling_fraction == pytest.approx(ours.tflops) and ours.device == "cpu"
    assert ours.rounds == 2 and ours.runs == 2 * FAST.cpu_steps
    assert ours.fwd_bwd_round_min_ms <= ours.fwd_bwd_ms <= ours.fwd_bwd_round_max_ms
    # the implementation without a kernel is not timed; the other two take turns in first place
    assert rounds[["impl", "round", "place"]].values.tolist() == [
        ["triton", 0, 0],
        ["sdpa_flash", 0, 1],
        ["sdpa_flash", 1, 0],
        ["triton", 1, 1],
    ]
    # no GPU, so no clock: the columns are there, empty, and the report's clock sentence is left out
    for table in (df, rounds):
        assert set(lb.CLOCK_COLUMNS) <= set(table.columns) and table[lb.CLOCK_COLUMNS].isna().all().all()
    assert lb.clock_text(df, baseline="sdpa_flash") == ""


def test_the_clock_sentence_splits_a_time_ratio_into_cycles_and_clocks():
    df = pd.DataFrame(
        [
            dict(impl="triton", fwd_bwd_ms=54.5, sm_mhz=1590.0, power_w=697.6, power_capped=1.0),
            dict(impl="sdpa_cudnn", fwd_bwd_ms=55.2, sm_mhz=1620.0, power_w=697.4, power_capped=0.98),
        ]
    )
    text = lb.clock_text(df)
    assert "**1590 MHz for triton**" in text and "**1620 MHz for sdpa_cudnn**" in text
    assert "698 and 697 W" in text and "in 100% and 98% of the samples" in text
    assert f"took {54.5 / 55.2 * 1590 / 1620:.3f}× sdpa_cudnn's" in text and f"in time, {54.5 / 55.2:.3f}×" in text
    assert lb.clock_text(df, baseline="sdpa_flash") == ""  # not timed
    assert lb.clock_text(df.assign(sm_mhz=[1590.0, float("nan")])) == ""  # no clock sampled


def test_the_projections_layout_times_strided_views_of_one_model_leaf(triton_on_cpu):
    """The 2026 row's layout: q, k, v are (1, heads, N, d) views of (1, N, heads * d) projections (rows
    heads * d apart, not copied), checked and timed like the 2025 row; their gradients land in the leaf."""
    config = lb.LeaderboardConfig(heads=2, seq_len=32, head_dim=16, layout="projections")
    leaf = lb.leaderboard_inputs(config, "cpu")
    q, k, v = config.views(leaf)
    assert leaf.shape == (3, 1, 32, 32) and q.shape == (1, 2, 32, 16) and q.stride() == (1024, 16, 32, 1)
    assert q.data_ptr() == leaf.data_ptr() and torch.equal(q[0, 1, 5], leaf[0, 0, 5, 16:])
    df, _ = lb.leaderboard_table(
        ["triton", "sdpa_flash"], config, device="cpu", compile=False, settings=FAST, fwd_settings=FAST, rounds=1
    )
    assert list(df.status) == ["ok", "ok"] and (df.max_rel_error < 1e-2).all()
    with pytest.raises(ValueError, match="layout must be"):
        lb.LeaderboardConfig(layout="rows")
    assert "views of (1, N, heads x d) projections" in lb.LEADERBOARD_2026.describe()


def test_an_implementation_that_fails_in_a_later_round_becomes_a_row_and_leaves_the_rounds(triton_on_cpu, monkeypatch):
    config = lb.LeaderboardConfig(heads=1, seq_len=32, head_dim=16)
    timed = lb.time_leaderboard
    calls = []

    def flaky(apply, qkv, *args):
        calls.append(apply)
        if len(calls) == 3:  # the first implementation of round 1: sdpa_flash
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return timed(apply, qkv, *args)

    monkeypatch.setattr(lb, "time_leaderboard", flaky)
    df, rounds = lb.leaderboard_table(
        ["triton", "sdpa_flash"], config, device="cpu", compile=False, settings=FAST, fwd_settings=FAST, rounds=3
    )
    assert list(df.status) == ["ok", "OOM"] and "2.00 GiB" in df.note.iloc[1]
    assert pd.isna(df.fwd_bwd_ms.iloc[1]) and df.rounds.iloc[0] == 3
    assert rounds[["impl", "round"]].values.tolist() == [["triton", 0], ["sdpa_flash", 0], ["triton", 1], ["triton", 2]]


def test_rounds_rotate_the_order_and_pool_the_runs():
    assert timing.round_orders(["a", "b", "c"], 4) == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert timing.round_orders([], 3) == []
    pooled = lb.pooled_latencies([dict(fwd_bwd=[4.0, 5.0, 9.0], fwd=[1.0]), dict(fwd_bwd=[6.0], fwd=[2.0, 3.0])])
    assert pooled["fwd_bwd_ms"] == 5.5 and pooled["fwd_ms"] == 2.0 and pooled["bwd_ms"] == 3.5
    assert pooled["fwd_bwd_mean_ms"] == 6.0 and pooled["runs"] == 4 and pooled["rounds"] == 2
    assert (pooled["fwd_bwd_round_min_ms"], pooled["fwd_bwd_round_max_ms"]) == (5.0, 6.0)
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        lb.leaderboard_table(["triton"], device="cpu", rounds=0)


def test_sweep_times_in_interleaved_rounds(triton_on_cpu, monkeypatch):
    """`flash_benchmark` checks every implementation, then times them in interleaved rounds
    (`timed_in_rounds`): each round starts with another implementation and the runs of all rounds are
    pooled (one CPU call per round here: cpu_steps / rounds)."""
    timed, calls = fb.time_passes, []

    def recording(impl, *args):
        calls.append(impl.name)
        return timed(impl, *args)

    monkeypatch.setattr(fb, "time_passes", recording)
    df = fb.flash_benchmark(
        [32],
        [16],
        [torch.float32],
        ["triton", "pytorch"],
        device="cpu",
        settings=timing.TimingSettings(cpu_steps=3, rounds=3),
        progress=False,
    )
    assert calls == ["triton", "pytorch", "pytorch", "triton", "triton", "pytorch"]
    assert list(df.status) == ["ok", "ok"] and (df.runs == 3).all()


def test_a_failure_in_a_later_round_becomes_the_row(triton_on_cpu, monkeypatch):
    timed, calls = fb.time_passes, []

    def flaky(impl, *args):
        calls.append(impl.name)
        if impl.name == "pytorch" and calls.count("pytorch") == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")
        return timed(impl, *args)

    monkeypatch.setattr(fb, "time_passes", flaky)
    df = fb.flash_benchmark(
        [32],
        [16],
        [torch.float32],
        ["triton", "pytorch"],
        device="cpu",
        settings=timing.TimingSettings(cpu_steps=3, rounds=3),
        progress=False,
    ).set_index("impl")
    assert calls == ["triton", "pytorch", "pytorch", "triton", "triton"]  # pytorch leaves the rounds
    assert df.loc["pytorch", "status"] == "OOM" and "3.00 GiB" in df.loc["pytorch", "note"]
    assert pd.isna(df.loc["pytorch", "forward_ms"]) and df.loc["triton", "runs"] == 3
    assert df.loc["triton", "status"] == "ok"


def test_leaderboard_bars():
    df = pd.DataFrame(
        [
            dict(impl="triton", status="ok", fwd_ms=1.0, fwd_bwd_ms=3.0),
            dict(impl="sdpa_cudnn", status="ok", fwd_ms=0.9, fwd_bwd_ms=4.0),
            dict(impl="sdpa_flash", status="no kernel", fwd_ms=float("nan"), fwd_bwd_ms=float("nan")),
        ]
    )
    bars = lb.leaderboard_bars(df)
    assert list(bars.verdict) == ["pass", "not measured (sdpa_flash: no kernel)", "fail"]
    assert bars.ratio.iloc[0] == pytest.approx(0.75) and bars.ratio.iloc[2] == pytest.approx(1 / 0.9)
    assert bars.rounds_within.isna().all()
    per_round = pd.DataFrame(
        [
            dict(impl="triton", round=0, fwd_ms=1.0, fwd_bwd_ms=3.9),
            dict(impl="sdpa_cudnn", round=0, fwd_ms=1.0, fwd_bwd_ms=4.0),
            dict(impl="sdpa_cudnn", round=1, fwd_ms=0.9, fwd_bwd_ms=4.0),
            dict(impl="triton", round=1, fwd_ms=0.9, fwd_bwd_ms=3.6),
        ]
    )
    with_rounds = lb.leaderboard_bars(df, per_round)
    assert list(with_rounds.verdict) == list(bars.verdict)
    cudnn = with_rounds.iloc[0]
    assert (cudnn.round_ratio_min, cudnn.round_ratio_max) == (pytest.approx(0.9), pytest.approx(0.975))
    assert cudnn.rounds_within == 1 and cudnn.rounds == 2
    assert with_rounds.iloc[2].rounds_within == 2  # forward 1.0x in both rounds: within a 1.0 limit
    assert lb.leaderboard_bars_text(with_rounds) == (
        "**fwd+bwd ≤ 0.95 × sdpa_cudnn: pass** (3.00 ms vs 4.00 ms, 0.750×; round by round 0.900–0.975×, within the "
        "limit in 1 of 2 rounds); **fwd+bwd ≤ 0.7 × sdpa_flash: not measured (sdpa_flash: no kernel)**; "
        "**fwd ≤ 1 × sdpa_cudnn: fail** (1.00 ms vs 0.900 ms, 1.111×; round by round 1.000–1.000×, within the limit "
        "in 2 of 2 rounds)."
    )
    assert lb.leaderboard_bars_text(bars).endswith("**fwd ≤ 1 × sdpa_cudnn: fail** (1.00 ms vs 0.900 ms, 1.111×).")
    df.loc[0, "status"] = "wrong"
    assert set(lb.leaderboard_bars(df).verdict) == {"fail (ours: wrong)"}


def test_the_tuning_record_parses(tmp_path):
    record = lb.read_tuning_record(repo_root() / "docs" / "flash_attention_tuning.md")
    assert list(record.columns) == ["version", "change", "predicted", "measured"] and len(record) >= 1
    p = tmp_path / "r.md"
    p.write_text("# notes\n\n| a | b |\n|:--|--:|\n| 1 | x \\| y |\n| 2 | z |\n\nafter\n")
    assert lb.read_tuning_record(p).to_dict("list") == {"a": ["1", "2"], "b": ["x \\| y", "z"]}
    p.write_text("no table here\n")
    with pytest.raises(ValueError, match="no Markdown table"):
        lb.read_tuning_record(p)


def test_median_table_writes_every_row_and_divides_the_medians(tmp_path, capsys):
    rows = [
        dict(shape=s, impl=i, round=r, ms=ms)
        for s, i, r, ms in [
            ("a", "ours", 0, 1.0),
            ("a", "ours", 1, 3.0),
            ("a", "ours", 2, 2.0),
            ("a", "cudnn", 0, 4.0),
            ("a", "cudnn", 1, 4.0),
            ("b", "ours", 0, 1.0),
            ("b", "cudnn", 0, 2.0),
        ]
    ]
    med = timing.median_table(rows, str(tmp_path / "t.csv"), ["shape", "impl"], "impl", [("ours", "cudnn")])
    assert len(pd.read_csv(tmp_path / "t.csv")) == len(rows)
    assert med.loc["a", "ours"] == 2.0 and med.loc["a", "ours/cudnn"] == 0.5 and med.loc["b", "ours/cudnn"] == 0.5
    assert "ours/cudnn" in capsys.readouterr().out
