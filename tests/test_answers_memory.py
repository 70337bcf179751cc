"""The answers of notebooks 05 (memory_profiling) and 06 (gradient_checkpointing), and the per-block
saved-tensor measurement behind memory_profiling (f)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cs336_systems.experiments.answers import Results, build
from cs336_systems.model import ModelConfig
from cs336_systems.profiling.saved_tensors import block_memory
from cs336_systems.report.writeup import jargon

GPU_RESULTS = Path(__file__).resolve().parents[1] / "reports" / "gpu" / "results"
KEYS = [
    "memory_profiling.a",
    "memory_profiling.b",
    "memory_profiling.c",
    "memory_profiling.d",
    "memory_profiling.e",
    "memory_profiling.a.2026",
    "memory_profiling.b.2026",
    "memory_profiling.c.2026",
    "memory_profiling.d.2026",
    "memory_profiling.e.2026",
    "gradient_checkpointing.a",
    "gradient_checkpointing.b",
]


@pytest.mark.parametrize("key", KEYS)
def test_committed_gpu_results_answer(key):
    answer = build(key, Results(GPU_RESULTS))
    assert answer.reason == ""
    assert jargon(answer.text) == [] and jargon(answer.caveat) == []
    if ".d" not in key:  # the residual-stream size is a derivation, not a measurement
        assert _machine_of_run("05_memory_profiling" if "memory" in key else "06_gradient_checkpointing") in answer.text


def _machine_of_run(notebook: str) -> str:
    """The GPU its committed run names in runs.json ("1 × NVIDIA H200 (140 GiB, 132 SMs)" -> "NVIDIA H200")."""
    import json

    runs = {r["name"]: r for r in json.loads((GPU_RESULTS.parent / "runs.json").read_text())}
    return runs[notebook]["machine"].split(" × ", 1)[1].split(" (", 1)[0]


def _committed_tables(tmp_path) -> Path:
    """A copy of the committed GPU run's tables and records, to take parts away from."""
    import shutil

    for p in GPU_RESULTS.iterdir():
        if p.suffix in (".csv", ".json"):
            shutil.copy(p, tmp_path / p.name)
    return tmp_path


def test_a_run_without_the_per_block_table_says_so_plainly(tmp_path):
    results = _committed_tables(tmp_path)
    (results / "block_memory.csv").unlink()
    answer = build("memory_profiling.f", Results(results))
    assert not answer.answered and "added to the notebook after this run" in answer.reason


def test_2026_answers_say_which_contexts_the_run_lacks(tmp_path):
    results = _committed_tables(tmp_path)
    peaks = pd.read_csv(results / "peak_memory.csv")
    peaks[peaks.context_length != 2048].to_csv(results / "peak_memory.csv", index=False)
    answer = build("memory_profiling.b.2026", Results(results))
    assert "2048" in answer.caveat and "missing" in answer.caveat
    assert list(answer.table["context"]) == [128]


def test_checkpointing_names_the_size_used_and_says_when_it_is_not_the_2026_xl(tmp_path):
    results = _committed_tables(tmp_path)
    assert "d_model 2560" in build("gradient_checkpointing.b", Results(results)).text
    model = pd.read_csv(results / "checkpoint_model.csv")
    model.assign(size="xl", d_model=1600, d_ff=6400, num_layers=48, num_heads=25).to_csv(
        results / "checkpoint_model.csv", index=False
    )
    answer = build("gradient_checkpointing.b", Results(results))
    assert "d_model 1600" in answer.text and "48 layers" in answer.caveat


def _peak_rows(contexts, train_fp32, unit="mib", bf16_scale=0.9):
    rows = []
    for c, train in zip(contexts, train_fp32):
        for precision, scale in (("fp32", 1.0), ("bf16", bf16_scale)):
            rows.append(
                dict(
                    context_length=c,
                    mode="forward",
                    precision=precision,
                    status="ok",
                    **{
                        f"measured_{unit}": 10.0 * scale,
                        f"predicted_{unit}": 10.0,
                        f"parameters_{unit}": 8.0,
                        f"optimizer_state_{unit}": 0.0,
                        f"activations_{unit}": 0.0,
                    },
                    peak_at="inside a layer's forward",
                    error=0.0,
                )
            )
            rows.append(
                dict(
                    context_length=c,
                    mode="train-step",
                    precision=precision,
                    status="ok",
                    **{
                        f"measured_{unit}": train * scale,
                        f"predicted_{unit}": train,
                        f"parameters_{unit}": 8.0,
                        f"optimizer_state_{unit}": 16.0,
                        f"activations_{unit}": 1.5 * scale,
                    },
                    peak_at="optimizer step",
                    error=0.0,
                )
            )
    return pd.DataFrame(rows)


def _folder(tmp_path: Path, tables: dict[str, pd.DataFrame], size="tiny") -> Results:
    results = tmp_path / "results"
    results.mkdir()
    for name, df in tables.items():
        df.to_csv(results / f"{name}.csv", index=False)
    model = dict(size=size, d_model=64, d_ff=256, num_layers=2, num_heads=4, batch=4, snapshot_context=64)
    pd.DataFrame([model]).to_csv(results / "memory_model.csv", index=False)
    return Results(results)


def test_peak_numbers_come_from_the_table(tmp_path):
    results = _folder(tmp_path, {"peak_memory": _peak_rows([32, 64], [40.25, 47.5])})
    answer = build("memory_profiling.b", results)
    assert "40.25 MiB and 47.50 MiB" in answer.text
    assert "contexts 32 and 64" in answer.text
    assert "trend" not in answer.text
    assert "not the handout's 2.7B model" in answer.caveat
    # two sizes: the 2026 answer names the contexts it lacks
    assert "contexts 128 and 2048 are missing" in build("memory_profiling.b.2026", results).caveat


def test_a_lower_peak_at_a_longer_context_is_stated_with_both_numbers(tmp_path):
    results = _folder(tmp_path, {"peak_memory": _peak_rows([32, 64], [41.0, 40.5])})
    text = build("memory_profiling.b", results).text
    assert "At 32 and 64 the peaks differ by only 0.50 MiB" in text
    assert "increase" not in text and "trend" not in text


def test_mixed_precision_reports_measured_change(tmp_path):
    results = _folder(tmp_path, {"peak_memory": _peak_rows([32], [40.0], bf16_scale=0.75)})
    text = build("memory_profiling.c", results).text
    assert "-25.0%" in text and "changes memory noticeably" in text
    assert "context 32," in text  # one context: singular
    assert "the analytic model puts the training step's peak in the optimizer step in both precisions" in text


def test_mixed_precision_names_no_late_peak_where_the_backward_holds_it(tmp_path):
    rows = _peak_rows([32], [40.0], bf16_scale=0.75)
    rows.loc[rows["mode"] == "train-step", "peak_at"] = "backward of block 0's attention"
    text = build("memory_profiling.c", _folder(tmp_path, {"peak_memory": rows})).text
    assert "-25.0%" in text and "optimizer step in both precisions" not in text


def test_cpu_run_without_a_snapshot_is_not_answered(tmp_path):
    phases = pd.DataFrame([dict(phase="forward", events=3, run="example", start_mib=1.0, peak_mib=2.0, end_mib=1.0)])
    results = _folder(tmp_path, {"phase_memory": phases})
    assert "no GPU" in build("memory_profiling.a", results).reason
    assert "recorded none" in build("memory_profiling.e", results).reason


def test_block_answer_reads_the_five_largest(tmp_path):
    ops = pd.DataFrame(
        dict(
            operation=[f"op{i}" for i in range(7)],
            tensors=1,
            bytes=[7, 6, 5, 4, 3, 2, 1],
            shapes="4×64×64",
            share=[b / 28 for b in [7, 6, 5, 4, 3, 2, 1]],
            context=64,
        )
    )
    ops["bytes"] *= 2**20
    summary = pd.DataFrame(
        [
            dict(
                d_model=64,
                d_ff=256,
                num_heads=4,
                batch=4,
                context=64,
                saved_bytes=28 * 2**20,
                analytic_saved_bytes=28 * 2**20,
                forward_change_bytes=0,
                backward_change_bytes=-26 * 2**20,
                saved_freed_bytes=27 * 2**20,
                inferred_gradient_bytes=2**20,
                parameter_gradient_bytes=2**19,
                input_gradient_bytes=2**19,
                parameter_bytes=2**19,
            )
        ]
    )
    answer = build("memory_profiling.f", _folder(tmp_path, {"block_memory": summary, "block_saved_by_operation": ops}))
    assert "**28 MiB**" in answer.text
    assert "`op4` (3 MiB, 10.7%)" in answer.text and "op5" not in answer.text
    assert "together 89.3%" in answer.text and "which the measurement matches" in answer.text
    assert "matches to within 0.05%" in answer.text
    assert len(answer.table) == 5 and jargon(answer.text) == []


def test_checkpoint_answer_from_a_small_table(tmp_path):
    sizes = pd.DataFrame(
        dict(
            checkpoint=["half block", "k = 1", "k = 2", "none"],
            status=["ok", "ok", "ok", "OOM"],
            measured_MiB=[10.0, 9.5, 12.0, float("nan")],
            predicted_MiB=[10.0, 9.4, 12.0, 30.0],
            peak_at="x",
            error=0.0,
        )
    )
    model = pd.DataFrame(
        [
            dict(
                size="tiny",
                d_model=64,
                d_ff=256,
                num_layers=8,
                num_heads=4,
                batch=2,
                context=128,
                mode="forward-backward",
                block_saved_mib=4.0,
                checkpoint_mib=0.0625,
                predicted_best_k=1,
            )
        ]
    )
    answer = build(
        "gradient_checkpointing.b", _folder(tmp_path, {"checkpoint_block_sizes": sizes, "checkpoint_model": model})
    )
    assert "every block 9.50 MiB" in answer.text and "no checkpointing ran out of memory" in answer.text
    assert "The lowest measured peak is every block (9.50 MiB), and the next smaller and larger" in answer.text
    assert "the 2026 handout's xl is d_model 2560" in answer.caveat


def test_block_memory_matches_the_analytic_count_and_its_gradients():
    ops, summary = block_memory(ModelConfig.from_size("nano", context_length=16), batch=2, context=16)
    assert summary["saved_bytes"] == summary["analytic_saved_bytes"]
    assert ops["bytes"].sum() == summary["saved_bytes"] and ops["share"].sum() == pytest.approx(1.0)
    direct = summary["parameter_gradient_bytes"] + summary["input_gradient_bytes"]
    assert summary["parameter_gradient_bytes"] == summary["parameter_bytes"]
    assert abs(summary["inferred_gradient_bytes"] - direct) <= 64
    assert "block input" in set(ops["operation"])


# ---------------------------------------------------------------- timelines and snapshots at each handout's contexts

XL = dict(size="2.7B", d_model=2560, d_ff=10240, num_layers=32, num_heads=32, batch=4)


def _phase(run, context, phase, start, peak, end):
    return dict(phase=phase, events=10, run=run, context=context, start_gib=start, peak_gib=peak, end_gib=end)


def _snapshot_results(tmp_path) -> Results:
    """Snapshots at 128, 256 and 2048: every step fits but the training step at 2048, whose warm-up ran out of
    memory; it was recorded again from a fresh model and ran out in its forward."""
    phases = []
    for c, rise in ((128, 0.1), (256, 0.2), (2048, 8.5)):
        phases.append(_phase("forward", c, "forward", 12.85, 12.85 + rise, 12.85))
        if c < 2048:
            phases += [
                _phase("train-step", c, "forward", 38.35, 50.8, 50.8),
                _phase("train-step", c, "backward", 50.8, 51.2 + c / 1000, 51.0),
                _phase("train-step", c, "optimizer step", 51.0, 51.1, 38.35),
            ]
    phases.append(_phase("train-step", 2048, "forward", 12.8, 79.0, 79.0))
    snapshots = pd.DataFrame(
        [
            dict(
                context_length=c,
                mode=m,
                status="ok",
                snapshot=f"s_{c}_{m}.pickle",
                warmup=1,
                failed_phase="",
                predicted_peak_gib=50.0,
                device_memory_gib=79.2,
            )
            for c in (128, 256, 2048)
            for m in ("forward", "train-step")
        ]
    )
    oom = (snapshots.context_length == 2048) & (snapshots["mode"] == "train-step")
    snapshots.loc[oom, ["status", "warmup", "failed_phase", "predicted_peak_gib"]] = ["OOM", 0, "forward", 311.84]
    largest = pd.DataFrame(
        [
            dict(
                size_mib=40.0 * c / 256,
                label="model.py:131 forward",
                count=96,
                looks_like="B×S×F (SwiGLU hidden), fp32",
                code="return self.w2(...)",
                context=c,
            )
            for c in (128, 256)
        ]
        + [
            dict(
                size_mib=2048.0,
                label="naive.py:20 naive_attention",
                count=64,
                looks_like="B×H×S×S (attention scores / probabilities), fp32",
                code="scores = q @ k",
                context=2048,
            ),
            dict(
                size_mib=320.0,
                label="model.py:131 forward",
                count=96,
                looks_like="B×S×F (SwiGLU hidden), fp32",
                code="return self.w2(...)",
                context=2048,
            ),
        ]
    )
    results = tmp_path / "results"
    (results / "figures").mkdir(parents=True)
    for name in ("active_memory_timelines_ctx256", "active_memory_timelines_ctx128_2048"):
        (results / "figures" / f"{name}.png").write_bytes(b"")
    for name, df in {
        "phase_memory": pd.DataFrame(phases),
        "memory_snapshots": snapshots,
        "memory_model": pd.DataFrame([XL]),
        "largest_allocations_forward": largest,
    }.items():
        df.to_csv(results / f"{name}.csv", index=False)
    return Results(results)


def test_2026_timelines_are_at_its_contexts_and_say_which_phase_does_not_fit(tmp_path):
    results = _snapshot_results(tmp_path)
    a = build("memory_profiling.a.2026", results)
    assert a.answered and a.caveat == "" and jargon(a.text) == []
    assert a.figure == "figures/active_memory_timelines_ctx128_2048.png"
    assert (
        "Timelines of the xl model (d_model 2560, d_ff 10240, 32 layers, 32 heads) at contexts 128 and 2048" in a.text
    )
    assert (
        "rises by at most 102 MiB at context 128 and 8,704 MiB at context 2048 in one short spike per layer" in a.text
    )
    assert "At context 128, in a training step the forward ramps from 38.35 to 50.80 GiB" in a.text
    assert (
        "At context 2048 the training step does not fit: it ran out of memory in its forward, after memory had "
        "reached 79.00 GiB (recorded from a fresh model without a warm-up step, so with no gradients or AdamW state "
        "yet); the analytic model puts the whole step's peak at 311.8 GiB, against the GPU's 79 GiB."
    ) in a.text
    # the 2025 answer keeps its one context
    a25 = build("memory_profiling.a", results)
    assert "at context 256," in a25.text and "2048" not in a25.text and "128" not in a25.text
    assert a25.figure == "figures/active_memory_timelines_ctx256.png"


def test_2026_largest_allocations_are_read_at_2048_and_128(tmp_path):
    results = _snapshot_results(tmp_path)
    e = build("memory_profiling.e.2026", results)
    assert e.answered and e.caveat == ""
    assert (
        "context 2048, recorded on this machine, the largest allocations are **2,048.0 MiB** each, fp32 B×H×S×S"
        in e.text
    )
    assert "Next come 320.0 MiB (fp32 B×S×F (SwiGLU hidden))." in e.text
    assert "At context 128 the largest are 20.0 MiB each, fp32 B×S×F (SwiGLU hidden) tensors" in e.text
    assert set(e.table["context"]) == {128, 2048}
    e25 = build("memory_profiling.e", results)
    assert "context 256" in e25.text and "2048" not in e25.text and "context" not in e25.table


def test_timeline_contexts_fall_back_to_what_the_run_recorded():
    from cs336_systems.experiments.answers.memory import timeline_contexts

    assert timeline_contexts([128, 256, 2048], "2025") == [256]
    assert timeline_contexts([128, 256, 2048], "2026") == [128, 2048]
    assert timeline_contexts([256], "2026") == [256]
    assert timeline_contexts([32, 64], "2026") == [32, 64] and timeline_contexts([64], "2025") == [64]
