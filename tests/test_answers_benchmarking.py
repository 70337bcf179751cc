"""The answers of notebooks 01-04: every key answered from the committed GPU report, in a grader's words,
and the words follow the numbers on small hand-made results folders."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from cs336_systems.experiments.answers import BUILDERS, Results, build
from cs336_systems.experiments.answers.benchmarking import layer_bound, step_flops, times, versus
from cs336_systems.report.deliverables import DELIVERABLES
from cs336_systems.report.writeup import jargon

REPO = Path(__file__).resolve().parents[1]
GPU_RESULTS = REPO / "reports" / "gpu" / "results"
NOTEBOOKS = (
    "01_benchmarking_script",
    "02_nsys_profile",
    "03_mixed_precision_accumulation",
    "04_benchmarking_mixed_precision",
)
KEYS = sorted({d.answer for d in DELIVERABLES if d.notebook in NOTEBOOKS})


def test_every_key_of_the_notebooks_has_a_builder():
    assert KEYS and all(key in BUILDERS for key in KEYS)


@pytest.mark.skipif(not GPU_RESULTS.exists(), reason="no committed GPU report")
@pytest.mark.parametrize("key", KEYS)
def test_answered_from_the_gpu_report_without_jargon(key):
    a = build(key, Results(GPU_RESULTS))
    assert a.reason == "", a.reason
    assert jargon(a.text) == [] and jargon(a.caveat) == []
    assert not re.search(r"(?<![\d.])0×", a.text) and "within 5%" not in a.text
    assert a.text.count(". ") <= 3


@pytest.mark.skipif(not GPU_RESULTS.exists(), reason="no committed GPU report")
def test_gpu_answers_say_when_small_models_are_launch_bound():
    """The committed runs measured the regime (profiler busy share, CUDA-graph replay): the answers state it."""
    results = Results(GPU_RESULTS)
    for key in ("benchmarking_script.b", "benchmarking_script.b.2026", "benchmarking_mixed_precision.c"):
        text = build(key, results).text
        assert "The profiler and CUDA graphs show these steps launch-bound" in text, key
    assert "tensor cores" not in build("nsys_profile.e", results).text


def _raw(rows: list[tuple], **common) -> pd.DataFrame:
    base = dict(
        context_length=256, batch_size=4, precision="fp32", warmup=5, steps=10, status="ok", peak_memory_mib=100.0
    )
    return pd.DataFrame(
        [{**base, **common, "size": s, "mode": m, "mean_ms": mean, "std_ms": std} for s, m, mean, std in rows]
    )


def test_timing_numbers_come_from_the_table(tmp_path):
    _raw(
        [
            ("small", "forward", 12.3456, 0.1),
            ("small", "forward-backward", 40.0, 0.2),
            ("2.7B", "forward", 170.0, 0.5),
            ("2.7B", "forward-backward", 510.0, 1.0),
        ]
    ).to_csv(tmp_path / "by_size_raw.csv", index=False)
    a = build("benchmarking_script.b", Results(tmp_path))
    assert a.answered
    assert "12.35 ms (small)" in a.text and "170 ms (2.7B)" in a.text
    assert "27.65 ms to 340 ms" in a.text  # backward = forward+backward − forward
    assert "at most 0.8% of the mean for every size" in a.text
    assert "layers" not in a.text  # two sizes: no claim about what the times follow


def test_launch_bound_sizes_are_named_when_time_per_layer_is_flat(tmp_path):
    # The same time per layer (2 ms) for three sizes whose FLOPs per layer grow ~2.8x: launch-bound.
    rows = []
    for size in ("small", "medium", "large"):
        n = {"small": 12, "medium": 24, "large": 36}[size]
        rows += [(size, "forward", 2.0 * n, 0.01), (size, "forward-backward", 6.0 * n, 0.01)]
    _raw(rows).to_csv(tmp_path / "by_size_raw.csv", index=False)
    text = build("benchmarking_script.b", Results(tmp_path)).text
    assert "For small, medium and large the forward takes 2.00 ms per layer" in text
    assert "not the model's compute time" in text


def test_two_sizes_give_no_trend(tmp_path):
    rows = [
        (s, m, ms * (1 if p == "fp32" else f), 0.1, p)
        for s, ms, f in (("nano", 10.0, 1.3), ("tiny", 20.0, 0.9))
        for m in ("forward", "forward-backward")
        for p in ("fp32", "bf16")
    ]
    raw = pd.DataFrame(
        [
            dict(
                size=s,
                mode=m,
                mean_ms=ms,
                std_ms=sd,
                precision=p,
                context_length=32,
                batch_size=4,
                status="ok",
                peak_memory_mib=float("nan"),
            )
            for s, m, ms, sd, p in rows
        ]
    )
    raw.to_csv(tmp_path / "precision_raw.csv", index=False)
    a = build("benchmarking_mixed_precision.c", Results(tmp_path))
    assert a.answered
    for word in ("trend", "grows", "shrinks", "Spearman", "correlat", "median"):
        assert word not in a.text
    assert "from 10.00 ms to 13.00 ms for nano (1.30× slower)" in a.text
    assert "from 20.00 ms to 18.00 ms for tiny (1.11× faster)" in a.text
    assert "the CPU" in a.text


def test_warmup_words_follow_the_numbers(tmp_path):
    """Words that follow the numbers: 829 and 299 ms are not 'within 5% of' 800 ms, and a first step shorter
    than a steady one is not '0×' of it."""
    pd.DataFrame(
        [
            dict(size="nano", warmup=w, steps=4, mean_ms=m, std_ms=s, median_ms=m, min_ms=m)
            for w, m, s in ((0, 900.0, 300.0), (1, 829.0, 40.0), (2, 299.0, 30.0), (5, 800.0, 20.0))
        ]
    ).to_csv(tmp_path / "warmup.csv", index=False)
    pd.DataFrame(
        [dict(warmup=0, step=0, ms=344.0, phase="measured")]
        + [dict(warmup=5, step=i, ms=800.0, phase="measured" if i >= 5 else "warm-up") for i in range(9)]
    ).to_csv(tmp_path / "warmup_steps.csv", index=False)
    text = build("benchmarking_script.c", Results(tmp_path)).text
    assert "within 5%" not in text and not re.search(r"(?<![\d.])0×", text)
    assert "829 ms and 299 ms, 4% above and 0.37× the 5-step mean" in text
    assert "above it by more than one standard deviation" in text
    assert "344 ms, 0.43× a steady step (800 ms)" in text


def test_warmup_answer_explains_the_same_step_timed_slower_in_the_size_sweep(tmp_path):
    """The warmed-up step ran in a fresh process at 50 ms, the size sweep's same step at 75 ms: the answer states
    both and, the sweep's probe finding it launch-bound, why they differ; within a fifth it says nothing."""
    pd.DataFrame(
        [
            dict(size="small", warmup=w, steps=10, mean_ms=m, std_ms=4.0, median_ms=m, min_ms=m)
            for w, m in ((0, 85.0), (1, 47.0), (2, 52.0), (5, 50.0))
        ]
    ).to_csv(tmp_path / "warmup.csv", index=False)

    def sweep(mean_ms):
        return pd.DataFrame(
            [
                dict(size="small", mode="forward-backward", precision="fp32", status="ok", context_length=256,
                     batch_size=4, warmup=5, steps=10, mean_ms=mean_ms, std_ms=4.0, busy_ms=0.38 * mean_ms,
                     busy_on="GPU kernels", graphed_ms=29.0),
                dict(size="small", mode="forward-backward", precision="fp32", status="ok", context_length=256,
                     batch_size=4, warmup=2, steps=10, mean_ms=200.0, std_ms=4.0, busy_ms=70.0,
                     busy_on="GPU kernels", graphed_ms=29.0),
            ]
        )  # fmt: skip

    sweep(75.0).to_csv(tmp_path / "by_size_raw.csv", index=False)
    text = build("benchmarking_script.c", Results(tmp_path)).text
    assert "took 75.00 ms in the notebook's size sweep (same context and batch), 1.50× the 50.00 ms here" in text
    assert "this launch-bound step (the GPU busy 38% of it in the sweep) runs at the pace" in text
    sweep(55.0).to_csv(tmp_path / "by_size_raw.csv", index=False)
    assert "size sweep" not in build("benchmarking_script.c", Results(tmp_path)).text


def test_ratio_words():
    assert times(0.003) == "0.003×" and times(0.43) == "0.43×" and times(16.2) == "16.2×" and times(684.0) == "684×"
    assert versus(829, 800) == "4% above" and versus(299, 800) == "0.37×" and versus(800, 800) == "equal to"
    assert versus(400, 800) == "50% below" and versus(2500, 800) == "3.12×"


def test_two_points_are_never_a_launch_bound_group():
    rows = pd.DataFrame(
        dict(
            size=["small", "medium"],
            ms=[24.0, 48.0],
            flops=[step_flops("small", 4, 256, "forward"), step_flops("medium", 4, 256, "forward")],
        )
    )
    assert layer_bound(rows) is None


def test_a_run_no_slower_without_warmup_is_called_noise(tmp_path):
    """A loaded CPU: the run without warm-up faster than the warmed-up one, the 1-step mean far below it."""
    pd.DataFrame(
        [
            dict(size="nano", warmup=w, steps=10, mean_ms=m, std_ms=s, median_ms=m, min_ms=m)
            for w, m, s in ((0, 887.0, 480.0), (1, 503.0, 200.0), (2, 927.0, 300.0), (5, 1424.0, 508.0))
        ]
    ).to_csv(tmp_path / "warmup.csv", index=False)
    text = build("benchmarking_script.c", Results(tmp_path)).text
    assert "a mean 38% below the warmed-up one" in text
    assert "lost in the step-to-step noise" in text and "pays one-time costs" not in text
    assert "and 503 ms lies more than one standard deviation below it" in text


def _rows_2026_with_oom(precisions=("fp32",)) -> pd.DataFrame:
    """small and the 2026 xl (run as 2.7B) at 512 in three modes, 10B out of memory past its forward."""
    rows = []
    for p in precisions:
        f = 1.0 if p == "fp32" else 0.5
        for size, ms in (("small", 20.0), ("2.7B", 300.0)):
            rows += [
                dict(size=size, mode=m, mean_ms=ms * k * f, std_ms=0.1, precision=p, status="ok")
                for m, k in (("forward", 1), ("forward-backward", 3), ("train-step", 3.5))
            ]
        rows += [dict(size="10B", mode="forward", mean_ms=1400.0 * f, std_ms=1.0, precision=p, status="ok")]
        rows += [dict(size="10B", mode=m, precision=p, status="OOM") for m in ("forward-backward", "train-step")]
    common = dict(context_length=512, batch_size=4, warmup=5, steps=10, peak_memory_mib=100.0, device_memory_gib=79.2)
    return pd.DataFrame([{**common, **r} for r in rows])


def test_2026_timing_names_the_optimizer_step_and_the_reason_for_out_of_memory(tmp_path):
    _rows_2026_with_oom().to_csv(tmp_path / "by_size_raw.csv", index=False)
    a = build("benchmarking_script.b.2026", Results(tmp_path))
    assert a.answered and jargon(a.text) == [] and jargon(a.caveat) == []
    assert "training step with AdamW" in a.text and "70.00 ms (small) to 1,050 ms (xl)" in a.text
    assert (
        "the optimizer step, the training step less the forward+backward, adds 10.00 ms (small) to 150 ms (xl), 14% "
        "of the step" in a.text
    )
    assert (
        "10B runs out of memory for the forward+backward and training step: the analytic peak of its fp32 training "
        "step is 206 GiB, of which the parameters, gradients and AdamW state alone take 191 GiB before any activation, "
        "more than the GPU's 79 GiB; its forward fits (1,400 ms)."
    ) in a.text
    assert "optimizer step is not timed" not in a.caveat and "no 10B" not in a.caveat
    assert "training step (ms)" in a.table and "optimizer step (ms)" in a.table


def test_an_optimizer_step_within_the_timings_spread_is_not_read_off_as_a_time(tmp_path):
    """small's training step is 4 ms longer than its forward+backward, but the two timings each vary by 4 ms
    (a launch-bound step): the difference is not the optimizer's time, and the range starts at xl."""
    raw = _rows_2026_with_oom()
    small = raw["size"] == "small"
    raw.loc[small & (raw["mode"] == "train-step"), "mean_ms"] = 64.0
    raw.loc[small & raw["mode"].isin(["forward-backward", "train-step"]), "std_ms"] = 4.0
    raw.to_csv(tmp_path / "by_size_raw.csv", index=False)
    a = build("benchmarking_script.b.2026", Results(tmp_path))
    assert "adds 150 ms (xl), 14% of the step" in a.text
    assert (
        "for small that difference (4.00 ms) is no larger than the run-to-run spread of the two timings it is taken "
        "from (5.66 ms, their standard deviations combined), so these runs cannot time their optimizer step."
    ) in a.text


def test_2025_timing_keeps_to_the_2025_sizes_and_context(tmp_path):
    raw = _rows_2026_with_oom()
    pd.concat([raw, raw.assign(context_length=256)]).to_csv(tmp_path / "by_size_raw.csv", index=False)
    a = build("benchmarking_script.b", Results(tmp_path))
    assert "at context 256" in a.text and "10B" not in a.text and "training step" not in a.text
    assert list(a.table["size"]) == ["small", "2.7B"]


def test_2026_precision_names_the_training_step_and_the_reason_for_out_of_memory(tmp_path):
    _rows_2026_with_oom(("fp32", "bf16")).to_csv(tmp_path / "precision_raw.csv", index=False)
    a = build("benchmarking_mixed_precision.c.2026", Results(tmp_path))
    assert a.answered and jargon(a.text) == [] and jargon(a.caveat) == []
    assert "The full training step with AdamW changes from 70.00 ms to 35.00 ms for small (2.00× faster)" in a.text
    assert "10B runs out of memory for the forward+backward and training step in fp32 and bf16" in a.text
    assert "206 GiB in fp32 and 209 GiB in bf16" in a.text and "bf16 autocast keeps them in fp32" in a.text
    assert "no 10B" not in a.caveat
    assert "10B" not in build("benchmarking_mixed_precision.c", Results(tmp_path)).text


# ------------------------------------------------------------------ the launch measurement in the answers


def _with_probe(raw: pd.DataFrame, launch: dict, on: str = "GPU kernels") -> pd.DataFrame:
    """`raw` with launch_probe's columns: for (size, context, precision, mode) in `launch`, the busy share of the
    eager step and the graphed ms given there; every other step that ran GPU-bound (busy 95%, graph no faster)."""
    out = raw.copy()
    keys = list(zip(out["size"], out.context_length, out.precision, out["mode"]))
    share = [launch.get(k, (0.95, None))[0] for k in keys]
    graphed = [launch.get(k, (0.95, None))[1] or m for k, m in zip(keys, out.mean_ms)]
    ran = out.status == "ok"
    out["busy_ms"] = (out.mean_ms * pd.Series(share, index=out.index)).where(ran)
    out["busy_on"] = on
    out["profiled_ms"] = out.mean_ms * 1.2
    out["graphed_ms"] = pd.Series(graphed, index=out.index).where(ran & (on == "GPU kernels"))
    out["graph_status"] = "ok" if on == "GPU kernels" else "not run: CUDA graphs need a GPU"
    return out


def _flat_per_layer(context=256, **common) -> pd.DataFrame:
    rows = []
    for size in ("small", "medium", "large"):
        n = {"small": 12, "medium": 24, "large": 36}[size]
        rows += [(size, "forward", 2.0 * n, 0.01), (size, "forward-backward", 6.0 * n, 0.01)]
    return _raw(rows, context_length=context, **common)


def test_the_measured_regime_replaces_the_inference_from_the_table(tmp_path):
    launch = {
        ("small", 256, "fp32", "forward"): (0.3, 8.0),
        ("medium", 256, "fp32", "forward"): (0.4, 20.0),
        ("small", 256, "fp32", "forward-backward"): (0.5, 40.0),
    }
    _with_probe(_flat_per_layer(), launch).to_csv(tmp_path / "by_size_raw.csv", index=False)
    a = build("benchmarking_script.b", Results(tmp_path))
    assert (
        "The profiler and CUDA graphs show these steps launch-bound: the forward of small and medium (the GPU busy "
        "30–40%; as one CUDA graph 8.00–20.00 ms against 24.00–48.00 ms eager) and the forward+backward of small "
        "(the GPU busy 50%; as one CUDA graph 40.00 ms against 72.00 ms eager); the other 3 are GPU-bound (the GPU "
        "busy 95% of the step; as one CUDA graph 1.00× as fast)."
    ) in a.text
    assert "follows the number of layers" not in a.text  # measured, not inferred
    assert a.text.count(". ") <= 3 and jargon(a.text) == []
    assert list(a.table["forward regime"]) == ["launch-bound", "launch-bound", "GPU-bound"]
    assert list(a.table["forward+backward regime"]) == ["launch-bound", "GPU-bound", "GPU-bound"]


def test_no_regime_claim_without_a_gpu_measurement(tmp_path):
    for raw in (_flat_per_layer(), _with_probe(_flat_per_layer(peak_memory_mib=float("nan")), {}, on="CPU operators")):
        raw.to_csv(tmp_path / "by_size_raw.csv", index=False)
        a = build("benchmarking_script.b", Results(tmp_path))
        assert "CUDA graph" not in a.text and "launch-bound" not in a.text and "GPU-bound" not in a.text
        assert "forward regime" not in a.table


def test_a_forward_faster_at_the_longer_context_is_explained_by_its_graphs(tmp_path):
    raw = pd.concat([_flat_per_layer(256), _flat_per_layer(512)], ignore_index=True)
    raw.loc[(raw["size"] == "small") & (raw["mode"] == "forward") & (raw.context_length == 512), "mean_ms"] = 22.0
    launch = {("small", 256, "fp32", "forward"): (0.3, 7.0), ("small", 512, "fp32", "forward"): (0.5, 11.0)}
    _with_probe(raw, launch).to_csv(tmp_path / "by_size_raw.csv", index=False)
    text = build("benchmarking_script.b.2026", Results(tmp_path)).text
    assert (
        "small's forward is shorter eager at context 512 (22.00 ms) than at 256 (24.00 ms) although its FLOPs grow "
        "2.08×, while as CUDA graphs it takes 7.00 ms at 256 and 11.00 ms at 512, in the order of its FLOPs"
    ) in text
    assert text.count(". ") <= 3


def test_the_precision_answer_measures_the_inversion_and_the_graphed_speed_up(tmp_path):
    """The 48-layer xl's bf16 forward+backward slower eager than the 32-layer 2.7B's, as once in notebook 04."""
    rows = [
        (s, m, ms, 0.1)
        for s, ms in (("xl", 126.0), ("2.7B", 173.0))
        for m, ms in (("forward", ms), ("forward-backward", 3 * ms))
    ]
    fp32 = _raw(rows)
    bf16 = fp32.assign(precision="bf16", mean_ms=[60.0, 180.0, 58.0, 175.0])
    launch = {
        ("xl", 256, "bf16", "forward-backward"): (0.3, 60.0),
        ("2.7B", 256, "bf16", "forward-backward"): (0.55, 100.0),
        ("xl", 256, "fp32", "forward-backward"): (0.95, 378.0),
        ("2.7B", 256, "fp32", "forward-backward"): (0.95, 519.0),
    }
    _with_probe(pd.concat([fp32, bf16], ignore_index=True), launch).to_csv(tmp_path / "precision_raw.csv", index=False)
    a = build("benchmarking_mixed_precision.c", Results(tmp_path))
    assert (
        "the bf16 forward+backward of xl and 2.7B (the GPU busy 30–55%; as one CUDA graph 60.00–100 ms against "
        "175–180 ms eager)" in a.text
    )
    assert (
        "the 48-layer xl's bf16 forward+backward is slower eager than the 32-layer 2.7B's (180 ms against 175 ms) "
        "although it is the smaller model, while as CUDA graphs they take 60.00 ms and 100 ms, "
        "in the order of their sizes"
    ) in a.text
    assert "as CUDA graphs, bf16 runs the forward+backward 6.30× (xl) and 5.19× (2.7B) as fast as fp32" in a.text
    assert "bound by kernel launches" not in a.text and a.text.count(". ") <= 3
    assert list(a.table["fwd+bwd speed-up as CUDA graphs"]) == [6.3, 5.19]
    assert list(a.table["fwd+bwd bf16 regime"]) == ["launch-bound", "launch-bound"]


def test_the_2026_answers_stay_short_with_the_measurement_and_out_of_memory_rows(tmp_path):
    raw = _rows_2026_with_oom(("fp32", "bf16"))
    launch = {
        ("small", 512, p, m): (0.3, 5.0)
        for p in ("fp32", "bf16")
        for m in ("forward", "forward-backward", "train-step")
    }
    _with_probe(raw, launch).to_csv(tmp_path / "precision_raw.csv", index=False)
    _with_probe(raw[raw.precision == "fp32"], launch).to_csv(tmp_path / "by_size_raw.csv", index=False)
    for key in ("benchmarking_script.b.2026", "benchmarking_mixed_precision.c.2026"):
        a = build(key, Results(tmp_path))
        assert "launch-bound" in a.text and "runs out of memory" in a.text
        assert a.text.count(". ") <= 3 and jargon(a.text) == [], key


def test_the_same_launch_bound_step_in_two_notebooks_is_compared_by_its_graphs(tmp_path):
    """The small model's fp32 forward at 256, once 27.30 ms in notebook 01 and 15.29 ms in notebook 04."""
    from cs336_systems.experiments.answers.launch_regime import same_steps_elsewhere

    launch = {("small", 256, "fp32", "forward"): (0.3, 8.0)}
    there = _with_probe(_raw([("small", "forward", 27.30, 0.5), ("medium", "forward", 48.0, 0.5)]), launch)
    there.to_csv(tmp_path / "by_size_raw.csv", index=False)
    here = _with_probe(
        _raw([("small", "forward", 15.285, 0.2), ("medium", "forward", 48.5, 0.5)]),
        {("small", 256, "fp32", "forward"): (0.5, 8.2)},
    )
    text = same_steps_elsewhere(here, tmp_path, "by_size_raw", "notebook 01")
    assert text == (
        "The same fp32 forward of small at context 256 took 27.30 ms in notebook 01 and 15.29 ms here, as one "
        "CUDA graph 8.00 ms and 8.20 ms: the eager time of a launch-bound step is the pace at which the host "
        "launched its kernels in that run, while the GPU's work stays put."
    )
    assert same_steps_elsewhere(here, tmp_path, "absent_table", "notebook 01") == ""
    assert (
        same_steps_elsewhere(there, tmp_path, "by_size_raw", "notebook 01") == ""
    )  # the same times: nothing to explain


def test_harness_answer_names_the_sizes_by_each_handouts_table():
    """The run has the 2026 xl under its 2025 name 2.7B, and the 2025 xl, which the 2026 table lacks: each
    handout's answer names the sweep's sizes as its own table does."""
    results = Results(GPU_RESULTS)
    text_2026 = build("benchmarking_script.a.2026", results).text
    assert "the 2026 table's small, medium, large, xl and 10B, and the 2025 table's xl;" in text_2026
    assert "2.7B" not in text_2026
    text_2025 = build("benchmarking_script.a", results).text
    assert "the 2025 table's small, medium, large, xl and 2.7B, and the 2026 table's 10B;" in text_2025


def test_harness_answer_names_sizes_of_neither_table(tmp_path):
    """The CPU profile's sweep has sizes in neither handout's table: named as they are, never an empty list."""
    _raw([("tiny", "forward", 1.0, 0.1), ("small", "forward", 2.0, 0.1)]).to_csv(
        tmp_path / "by_size_raw.csv", index=False
    )
    for key in ("benchmarking_script.a", "benchmarking_script.a.2026"):
        assert "(small and tiny; forward)" in build(key, Results(tmp_path)).text
