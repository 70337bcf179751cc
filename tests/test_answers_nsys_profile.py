"""The answers of notebook 02 (nsys_profile) on a hand-made results folder: the 2025 answers keep to the 2025
grid, the 2026 answers to what the search for the longest context found, and the search itself."""

from __future__ import annotations

import pandas as pd
import pytest

from cs336_systems.accounting.memory import predicted_peaks
from cs336_systems.benchmarking import BenchmarkConfig
from cs336_systems.experiments.answers import Results, build
from cs336_systems.profiling import profile_sweep as sweeps
from cs336_systems.profiling.torch_profile import ProfiledRun, profile_benchmark
from cs336_systems.report.writeup import jargon

GRID = [128, 256, 512, 1024]
LADDER = sweeps.context_ladder(256, 16384)
# (size, context, mode) that run out of memory: the 2.7B's training step from 1024, small's from 4096.
OOM = {("2.7B", 1024, "train-step"), ("small", 4096, "train-step")}


def _runs() -> pd.DataFrame:
    """The 2025 grid of small and 2.7B, then the search's rows of small (2048 fits, 4096 does not)."""
    configs = [(s, c) for s in ("small", "2.7B") for c in GRID] + [("small", 2048), ("small", 4096)]
    rows = []
    for size, context in configs:
        for mode in ("forward", "train-step"):
            ok = (size, context, mode) not in OOM
            rows.append(
                dict(
                    size=size,
                    context_length=context,
                    mode=mode,
                    status="ok" if ok else "OOM",
                    batch_size=4,
                    precision="fp32",
                    forward_compute_ms=context / 10 if ok else None,
                    forward_gpu_span_ms=context / 9 if ok else None,
                )
            )
    runs = pd.DataFrame(rows)
    return pd.concat([runs, predicted_peaks(runs)], axis=1).assign(device_memory_gib=79.2)


def _results(tmp_path) -> Results:
    runs = _runs()
    ok = runs[runs.status == "ok"]
    fwd = ok[ok["mode"] == "forward"][["size", "context_length"]].reset_index(drop=True)
    trained = {
        (s, c) for s, c in zip(ok[ok["mode"] == "train-step"]["size"], ok[ok["mode"] == "train-step"].context_length)
    }
    fit = [(s, c) in trained for s, c in zip(fwd["size"], fwd.context_length)]
    tables = {
        "profiled_runs": runs,
        "longest_context": sweeps.longest_contexts(runs, ["small", "2.7B"], LADDER),
        "forward_time_vs_harness": fwd.assign(
            status="ok",
            harness_ms=fwd.context_length / 9,
            harness_std_ms=0.1,
            profiled_step_ms=fwd.context_length / 9,
            forward_gpu_span_ms=fwd.context_length / 9,
        ),
        "top_kernels": fwd.assign(
            kernel="gemm_f32f32",
            share=0.5,
            calls_per_forward=85,
            kernel_fwd_bwd=["gemm_f32f32" if f else None for f in fit],
            share_fwd_bwd=[0.3 if f else None for f in fit],
            same_kernel=fit,
        ),
        "non_matmul_forward": pd.DataFrame(
            [
                dict(
                    size="small",
                    context_length=256,
                    kernel="softmax at 256",
                    category="softmax",
                    total_ms=1.0,
                    instances=24,
                    avg_us=40.0,
                    share=0.05,
                )
            ]
        ),
        "non_matmul_forward_all": fwd.assign(
            kernel=[f"softmax at {c}" for c in fwd.context_length],
            category="softmax",
            total_ms=1.0,
            instances=24,
            avg_us=40.0,
            share=0.05,
        ),
        "forward_category_shares": fwd.assign(matmul=0.8, elementwise=0.2),
        "category_shares_inference_vs_training": fwd.assign(
            **{
                "matmul (forward)": 0.8,
                "matmul (training step)": [0.6 if f else None for f in fit],
                "elementwise (forward)": 0.2,
                "elementwise (training step)": [0.4 if f else None for f in fit],
            }
        ),
        "softmax_vs_matmuls": fwd.assign(
            scores_ms=1.0,
            softmax_ms=0.6,
            final_matmul_ms=0.5,
            softmax_over_matmuls_time=0.4,
            softmax_over_matmuls_flops=0.02,
            time_ratio_over_flop_ratio=20.0,
        ),
    }
    for name, df in tables.items():
        df.to_csv(tmp_path / f"{name}.csv", index=False)
    return Results(tmp_path)


def _read(table: pd.DataFrame) -> set[tuple[str, int]]:
    return {(s, int(c)) for s, c in zip(table["size"], table["context"])}


def test_the_longest_context_is_read_from_the_rows():
    t = sweeps.longest_contexts(_runs(), ["small", "2.7B"], LADDER).set_index("size")
    assert t.loc["small", "fits"] == "256,512,1024,2048" and t.loc["small", "longest_fits"] == 2048
    assert t.loc["small", "out_of_memory"] == 4096 and t.loc["small", "forward_fits_there"]
    assert t.loc["2.7B", "fits"] == "256,512" and t.loc["2.7B", "out_of_memory"] == 1024
    assert t.loc["2.7B", "predicted_peak_gib"] == pytest.approx(125, abs=1)  # the analytic reason for the OOM row
    assert list(t.tried_from) == [256, 256] and list(t.tried_up_to) == [4096, 1024]


def test_2026_answers_name_the_longest_context_and_read_the_three_longest_that_fit(tmp_path):
    results = _results(tmp_path)
    a = build("nsys_profile.a.2026", results)
    assert a.answered and jargon(a.text) == [] and jargon(a.caveat) == []
    assert a.text.startswith(
        "Doubling the context from 256, small's whole training step fits up to 2048 (at 4096 it runs out of memory: "
        "analytic peak 137 GiB against the GPU's 79 GiB, while the forward alone fits) and xl's up to 512 (at 1024 it "
        "runs out of memory: analytic peak 125 GiB against the GPU's 79 GiB, while the forward alone fits)."
    )
    assert "the forward pass of small at context 2048" in a.text and a.text.count(". ") <= 3  # a 1-2 sentence answer
    assert _read(a.table) == {("small", 512), ("small", 1024), ("small", 2048), ("xl", 256), ("xl", 512)}
    assert "these answers read small at 512, 1024 and 2048 and xl at 256 and 512" in a.caveat
    assert "Above 128, the training step of xl fits at only two contexts." in a.caveat
    assert "Nsight Systems" in a.caveat and "`nsys` command" in a.caveat
    for part in "bcde":
        answer = build(f"nsys_profile.{part}.2026", results)
        assert answer.answered and "4096" not in answer.text
        # how the sizes and contexts were chosen is said once, in (a); the other parts point to it
        assert "The same sizes and contexts as (a)" in answer.caveat and "these answers read" not in answer.caveat
        if "context" in answer.table:
            assert _read(answer.table) <= {("small", 512), ("small", 1024), ("small", 2048), ("xl", 256), ("xl", 512)}
    assert "In the forward pass of small at context 2048" in build("nsys_profile.c.2026", results).text
    assert "`softmax at 2048`" in build("nsys_profile.c.2026", results).text
    assert "For small at context 2048" in build("nsys_profile.b.2026", results).text


def test_2025_answers_keep_to_the_2025_grid(tmp_path):
    results = _results(tmp_path)
    a = build("nsys_profile.a", results)
    assert _read(a.table) == {(s, c) for s in ("small", "2.7B") for c in GRID}
    assert "Doubling" not in a.text and "Nsight Systems" in a.caveat  # said once, in part (a), of a GPU run
    assert not any("Nsight" in build(f"nsys_profile.{p}", results).caveat for p in "bcde")
    assert "the forward pass of small at context 256" in a.text
    assert "`softmax at 256`" in build("nsys_profile.c", results).text
    d = build("nsys_profile.d", results)
    assert d.caveat == "Out of memory for the training step: 2.7B at 1024." and "4096" not in d.text
    assert "Over the 8 configurations" in build("nsys_profile.c", results).text


def test_a_run_without_the_search_says_so(tmp_path):
    results = _results(tmp_path)
    (tmp_path / "longest_context.csv").unlink()
    a = build("nsys_profile.a.2026", results)
    assert a.answered and "It did not look for the longest context that fits." in a.caveat


def test_the_search_stops_a_size_after_its_first_training_step_out_of_memory(monkeypatch):
    """Real CPU profiles of the nano model, with out-of-memory made up from context 32's training step on."""
    calls = []

    def profile(config, trace_path=None):
        calls.append((config.size, config.context_length, config.mode))
        if config.context_length >= 32 and config.mode == "train-step":
            return ProfiledRun(config, "OOM")
        return profile_benchmark(config, trace_path=trace_path)

    monkeypatch.setattr(sweeps, "profile_benchmark", profile)
    base = BenchmarkConfig(batch_size=1, warmup=1, steps=1, device="cpu")
    known = pd.DataFrame([dict(size="nano", context_length=8, mode=m, status="ok") for m in ("forward", "train-step")])
    ladder = sweeps.context_ladder(8, 128)
    assert ladder == [8, 16, 32, 64, 128]
    found = sweeps.profile_sweep(base, ["nano"], ladder, progress=False, until_oom=True, known=known)
    # context 8 is known (not profiled again); 32's training step runs out of memory, so 64 and 128 are not tried
    assert calls == [
        ("nano", 16, "forward"),
        ("nano", 16, "train-step"),
        ("nano", 32, "forward"),
        ("nano", 32, "train-step"),
    ]
    assert list(found.runs.status) == ["ok", "ok", "ok", "OOM"] and found.unit == "CPU operator"
    both = sweeps.combine(sweeps.ProfileSweep(known, pd.DataFrame(), pd.DataFrame(), pd.DataFrame()), found)
    assert len(both.runs) == 6 and both.unit == "CPU operator" and set(both.kernels.context_length) == {16, 32}
    t = sweeps.longest_contexts(both.runs, ["nano"], ladder).iloc[0]
    assert (t.fits, t.longest_fits, t.out_of_memory, t.forward_fits_there) == ("8,16", 16, 32, True)


def test_the_ladder_is_powers_of_two_up_to_the_cap():
    assert sweeps.context_ladder(256, 16384) == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert sweeps.context_ladder(256, 3000) == [256, 512, 1024, 2048]
    with pytest.raises(ValueError, match="power of two"):
        sweeps.context_ladder(300, 1024)
