"""The answers of notebooks 07-11: naive and compiled attention, FlashAttention-2 (code, benchmark)
and the FlashAttention-2 leaderboard."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from cs336_systems.experiments.answers import Results, build
from cs336_systems.experiments.answers.words import times as ratio
from cs336_systems.experiments.answers.words import times_span as span
from cs336_systems.report.answers import MAX_SUPPORT_ROWS
from cs336_systems.report.writeup import jargon

GPU_RESULTS = Path(__file__).resolve().parents[1] / "reports" / "gpu" / "results"
KEYS = [
    "pytorch_attention.a",
    "torch_compile.a",
    "torch_compile.b",
    "torch_compile.b.2026",
    "flash_forward.a",
    "flash_forward.b",
    "flash_forward.c",
    "flash_backward",
    "flash_benchmarking.a",
    "leaderboard",
]
H100 = "1 × NVIDIA H100 80GB HBM3 (79 GiB, 132 SMs)"


@pytest.mark.parametrize("key", KEYS)
def test_committed_gpu_results_answer(key):
    answer = build(key, Results(GPU_RESULTS))
    assert answer.reason == ""
    assert jargon(answer.text) == [] and jargon(answer.caveat) == []
    assert "NVIDIA H" in answer.text
    assert answer.table is None or len(answer.table) <= MAX_SUPPORT_ROWS
    for word in ("trend", " 0×", "within 5%", "(median"):
        assert word not in answer.text


def test_leaderboard_states_both_shapes_against_cudnn_and_flash():
    answer = build("leaderboard", Results(GPU_RESULTS))
    lb = pd.read_csv(GPU_RESULTS / "leaderboard.csv").set_index("impl")
    assert f"{lb.loc['triton'].fwd_bwd_mean_ms:.2f} ms" in answer.text
    assert (
        f"ours / cuDNN = {lb.loc['triton'].fwd_bwd_mean_ms / lb.loc['sdpa_cudnn'].fwd_bwd_mean_ms:.2f}×" in answer.text
    )
    assert "N = 16,384, d = 64" in answer.text and "N = 32,768, d = 128" in answer.text
    assert "H200" in answer.caveat


def test_2026_compile_answer_maps_our_2_7b_to_the_2026_xl():
    answer = build("torch_compile.b.2026", Results(GPU_RESULTS))
    assert "xl (2026; our 2.7B)" in set(answer.table["size"])
    assert "10B" in answer.caveat and "512" in answer.caveat


def test_ratio_keeps_small_values_readable():
    assert ratio(0.0025) == "0.0025×"
    assert ratio(0.93) == "0.93×"
    assert ratio(683.6) == "684×"
    assert ratio(float("nan")) == "–" and ratio(0.0) == "–"
    assert span([0.77, 2.52]) == "0.77–2.52×"
    assert span([1.5, 1.5]) == "1.50×"


def _results(tmp_path: Path, tables: dict[str, pd.DataFrame], machine: str = H100) -> Results:
    folder = tmp_path / "results"
    folder.mkdir()
    for name, df in tables.items():
        df.to_csv(folder / f"{name}.csv", index=False)
    (tmp_path / "runs.json").write_text(
        json.dumps(
            [
                {"name": nb, "machine": machine, "status": "ok"}
                for nb in ("07_pytorch_attention", "08_torch_compile", "10_flash_benchmarking", "11_leaderboard")
            ]
        )
    )
    return Results(folder)


def _compiled_row(d, n, fwd_eager, fwd_compiled, status="ok"):
    return dict(
        d_model=d,
        seq_len=n,
        status_eager=status,
        status_compiled=status,
        forward_ms_eager=fwd_eager,
        forward_ms_compiled=fwd_compiled,
        forward_speedup=fwd_eager / fwd_compiled,
        backward_ms_eager=2.0,
        backward_ms_compiled=1.0,
        backward_speedup=2.0,
        saved_for_backward_mib_eager=3.0,
        saved_for_backward_mib_compiled=2.0,
        first_call_ms_compiled=1000.0,
    )


def test_two_configurations_give_their_two_values_not_a_median(tmp_path):
    """Two points spanning 0.0025× to 684×: the text says both values, and no median or trend."""
    wide = pd.DataFrame([_compiled_row(16, 64, 0.2144, 86.77), _compiled_row(16, 128, 229.32, 0.3354)])
    answer = build("torch_compile.a", _results(tmp_path, {"compiled_vs_eager": wide}))
    assert "0.0025–684×" in answer.text
    assert "at N = 128 the forward is 684×" in answer.text and "at N = 64" in answer.text
    assert "median" not in answer.text and "trend" not in answer.text
    assert re.search(r"(?<![\d.])0×", answer.text) is None
    assert "one NVIDIA H100 80GB HBM3" in answer.text


def test_saved_memory_growth_is_generated_from_the_sweep(tmp_path):
    rows = [
        dict(
            d_model=16,
            seq_len=n,
            status="ok",
            forward_ms=1.0,
            forward_std_ms=0.1,
            backward_ms=2.0,
            backward_std_ms=0.1,
            memory_before_backward_mib=mib + 0.5,
            saved_for_backward_mib=mib,
            extended=False,
        )
        for n, mib in ((256, 6.0), (512, 24.0))
    ]
    rows.append(dict(d_model=16, seq_len=1024, status="OOM", extended=True))
    answer = build("pytorch_attention.a", _results(tmp_path, {"attention_sweep": pd.DataFrame(rows)}))
    assert "all 2 configurations of the grid ran" in answer.text
    assert "grows 4.00× from N = 256 to 512" in answer.text
    assert "first out-of-memory comes at sequence length 1,024" in answer.text
    assert list(answer.table["status"]) == ["ran", "ran", "out of memory"]


def test_leaderboard_ratio_is_ours_over_the_fastest_backend(tmp_path):
    def row(impl, mean, status="ok"):
        return dict(
            impl=impl,
            fwd_ms=mean / 3,
            bwd_ms=2 * mean / 3,
            fwd_bwd_ms=mean,
            tflops=100.0,
            device="NVIDIA H100",
            fwd_bwd_mean_ms=mean,
            ceiling_fraction=0.5,
            max_rel_error=0.002,
            status=status,
        )

    table = pd.DataFrame([row("triton", 4.0), row("sdpa_flash", 8.0), row("sdpa_cudnn", 5.0)])
    answer = build("leaderboard", _results(tmp_path, {"leaderboard": table}))
    assert "**4.00 ms**" in answer.text
    assert "5.00 ms for PyTorch's fastest, SDPA with its cuDNN backend (ours / cuDNN = 0.80×)" in answer.text
    assert "ours / SDPA flash = 0.50×" in answer.text
    assert answer.caveat == ""  # an H100, as the handout's leaderboard


def _model_row(size, mode, vanilla, compiled, scope="blocks", **probe):
    return dict(
        size=size, mode=mode, context_length=256, scope=scope, vanilla_ms=vanilla, vanilla_std_ms=0.1,
        compiled_ms=compiled, compiled_std_ms=0.1, speedup=vanilla / compiled, compiled_first_call_s=3.0,
        status="ok", **probe,
    )  # fmt: skip


def test_compile_answer_says_which_vanilla_steps_are_launch_bound_from_its_own_probe(tmp_path):
    rows = [
        _model_row("small", "forward", 16.0, 8.0, busy_fraction=0.45, graph_speedup=1.9, regime="launch-bound"),
        _model_row("xl", "forward", 120.0, 110.0, busy_fraction=0.95, graph_speedup=1.02, regime="GPU-bound"),
    ]
    answer = build("torch_compile.b", _results(tmp_path, {"compiled_model": pd.DataFrame(rows)}))
    assert "launch-bound" in answer.text and "small's forward (45% busy, 1.90× as a CUDA graph)" in answer.text
    assert "xl's forward" not in answer.text and "notebook 01" not in answer.text


def test_compile_answer_without_a_probe_names_no_regime_but_the_same_step_timed_twice(tmp_path):
    rows = [
        _model_row("small", "forward", 13.4, 8.1, busy_fraction=float("nan"), graph_speedup=float("nan"), regime=""),
        _model_row("xl", "forward", 126.0, 110.0, busy_fraction=float("nan"), graph_speedup=float("nan"), regime=""),
        _model_row("small", "forward", 25.5, 8.1, scope="model"),
    ]
    answer = build("torch_compile.b", _results(tmp_path, {"compiled_model": pd.DataFrame(rows)}))
    assert "busy" not in answer.text and "notebook 01" not in answer.text
    assert "13.40 ms in the block-by-block sweep and 25.50 ms in the whole-model sweep (1.90× apart)" in answer.text


def test_the_tolerance_in_the_answers_is_the_tests_own_table(monkeypatch):
    import torch

    from cs336_systems.attention import reference
    from cs336_systems.experiments.answers.attention import TOLERANCE_TEXT, tolerance_text

    assert TOLERANCE_TEXT == "norm-wise relative error; tolerance 10⁻³ in fp32, 10⁻² in fp16 and bf16"
    changed = {**reference.TOLERANCE, torch.float16: reference.Tolerance(checks=2e-3, sweeps=1e-2)}
    monkeypatch.setattr(reference, "TOLERANCE", changed)
    assert tolerance_text() == "norm-wise relative error; tolerance 10⁻³ in fp32, 0.002 in fp16, 10⁻² in bf16"
