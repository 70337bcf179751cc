"""The answers of the distributed notebooks (12-17): built from the committed GPU report's tables, and from
small hand-made results folders whose numbers the text must carry and whose comparisons it must word right."""

from pathlib import Path

import pandas as pd
import pytest

from cs336_systems.experiments.answers import BUILDERS, Results, build
from cs336_systems.report.deliverables import DELIVERABLES
from cs336_systems.report.writeup import jargon

REPO = Path(__file__).resolve().parents[1]
GPU_RESULTS = REPO / "reports" / "gpu" / "results"
NOTEBOOKS = {
    "12_distributed_communication",
    "13_naive_ddp",
    "14_ddp_overlap_individual",
    "15_ddp_bucketed",
    "16_optimizer_state_sharding",
    "17_fsdp",
}
KEYS = sorted({d.answer for d in DELIVERABLES if d.notebook in NOTEBOOKS})


def test_every_key_of_these_notebooks_has_a_builder():
    assert KEYS and [k for k in KEYS if k not in BUILDERS] == []


@pytest.mark.skipif(not GPU_RESULTS.exists(), reason="no committed GPU report")
@pytest.mark.parametrize("key", KEYS)
def test_answered_on_the_committed_gpu_report_without_jargon(key):
    answer = build(key, Results(GPU_RESULTS))
    assert answer.reason == ""
    assert jargon(answer.text) == [] and jargon(answer.caveat) == []
    assert "NVIDIA H200" in answer.text or key in {
        "optimizer_state_sharding_accounting.c",
        "ddp_bucketed_benchmarking.b",
    }


# The table each 2026 answer reads its model's rows from.
TABLE_OF_2026_KEY = {
    "naive_ddp_benchmarking.2026": "naive_flat_step",
    "minimal_ddp_flat_benchmarking.2026": "naive_flat_step",
    "ddp_overlap_individual_parameters_benchmarking.a.2026": "overlap_individual_step",
    "ddp_overlap_individual_parameters_benchmarking.b.2026": "timeline_overlap",
    "optimizer_state_sharding_accounting.a.2026": "sharding_memory_breakdown",
    "optimizer_state_sharding_accounting.b.2026": "sharding_step_time",
    "fsdp": "fsdp_runs",
}


def _has_2026_xl(results: Path, table: str) -> bool:
    from cs336_systems.model import handout_name

    path = results / f"{table}.csv"
    df = pd.read_csv(path) if path.exists() else pd.DataFrame()
    return "size" in df and any(handout_name(str(s), "2026") == "xl" for s in df["size"].unique())


def test_every_2026_key_of_these_notebooks_is_checked_for_its_model():
    assert set(TABLE_OF_2026_KEY) >= {k for k in KEYS if k.endswith(".2026")}


@pytest.mark.skipif(not GPU_RESULTS.exists(), reason="no committed GPU report")
@pytest.mark.parametrize("key", sorted(TABLE_OF_2026_KEY))
def test_2026_keys_name_the_2026_xl_exactly_when_the_run_lacks_it(key):
    caveat = build(key, Results(GPU_RESULTS)).caveat
    if _has_2026_xl(GPU_RESULTS, TABLE_OF_2026_KEY[key]):
        assert "d_model 2560" not in caveat, key
    else:
        assert "d_model 2560" in caveat and "2025 handout's XL" in caveat, key


@pytest.mark.skipif(not GPU_RESULTS.exists(), reason="no committed GPU report")
def test_the_committed_fsdp_profile_claims_overlap_only_where_the_gpu_was_busy():
    answer = build("fsdp_accounting.b", Results(GPU_RESULTS))
    profiles = GPU_RESULTS / "fsdp_forward_profiles.csv"
    if not profiles.exists():  # a run that profiled one step at the training batch, paced by the host
        assert "overlap" not in answer.text
        assert "host" in answer.text and "compute-bound" in answer.caveat
        return
    shown = pd.read_csv(profiles).query("shown").iloc[0]
    assert f"busy {100 * shown.busy_fraction:.0f}%" in answer.text
    assert ("compute-bound" in answer.caveat) == (not shown.gpu_bound)


def _step_row(flavour, step, std, fwd_bwd, sync, calls):
    return dict(
        flavour=flavour,
        status="ok",
        all_reduce_calls=calls,
        step_ms=step,
        step_std_ms=std,
        fwd_bwd_ms=fwd_bwd,
        sync_ms=sync,
        sync_std_ms=0.1,
        optimizer_ms=step - fwd_bwd - sync,
        overhead_ms=0.0,
        sync_fraction=sync / step,
        rank_spread_ms=0.1,
    )


def _write(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / f"{name}.csv", index=False)


def _setup(folder: Path, name: str, size="xl", backend="nccl") -> None:
    _write(
        folder,
        name,
        [
            dict(
                size=size,
                parameters=1_998_235_200,
                gradient_bytes=4 * 1_998_235_200,
                context_length=512,
                global_batch_size=4,
                world_size=2,
                backend=backend,
                warmup=3,
                steps=10,
            )
        ],
    )


def test_naive_benchmarking_carries_the_tables_numbers(tmp_path):
    _write(
        tmp_path,
        "naive_flat_step",
        [
            _step_row("no-communication", 442.77, 1.1, 395.8, 0.36, 0),
            _step_row("naive", 480.31, 0.9, 395.7, 39.05, 435),
            _step_row("flat", 477.18, 1.0, 395.8, 35.79, 1),
        ],
    )
    _setup(tmp_path, "naive_flat_setup")
    answer = build("naive_ddp_benchmarking", Results(tmp_path))
    assert "480.3 ms" in answer.text and "39.0 ms" in answer.text and "435 calls" in answer.text
    assert "a global batch of 4 sequences of 512 tokens" in answer.text
    assert answer.caveat == ""
    assert "d_model 2560" in build("naive_ddp_benchmarking.2026", Results(tmp_path)).caveat


def test_steps_inside_their_spread_are_not_called_faster(tmp_path):
    _write(
        tmp_path,
        "naive_flat_step",
        [
            _step_row("no-communication", 440.0, 1.0, 395.0, 0.3, 0),
            _step_row("naive", 480.0, 6.0, 395.0, 39.0, 435),
            _step_row("flat", 478.0, 6.0, 395.0, 37.0, 1),
        ],
    )
    _setup(tmp_path, "naive_flat_setup")
    text = build("minimal_ddp_flat_benchmarking", Results(tmp_path)).text
    assert "does not separate" in text
    assert "faster" not in text and "slower" not in text


def test_flat_that_saves_nothing_is_not_credited_a_per_call_saving(tmp_path):
    _write(
        tmp_path,
        "naive_flat_step",
        [
            _step_row("no-communication", 100.0, 1.0, 80.0, 0.1, 0),
            _step_row("naive", 120.0, 1.0, 80.0, 20.0, 12),
            _step_row("flat", 130.0, 1.0, 80.0, 30.0, 1),
        ],
    )
    _setup(tmp_path, "naive_flat_setup", size="nano", backend="gloo")
    answer = build("minimal_ddp_flat_benchmarking", Results(tmp_path))
    assert "saves no communication time" in answer.text and "per call avoided" not in answer.text
    assert "CPU profile" in answer.caveat


def test_allreduce_with_two_sizes_states_values_not_a_trend(tmp_path):
    rows = [
        dict(
            backend="gloo",
            device="cpu",
            world_size=n,
            size=size,
            mean_ms=t,
            std_ms=0.1,
            rank_spread_ms=0.0,
            algbw_gbps=b,
            busbw_gbps=b * 2 * (n - 1) / n,
        )
        for n, size, t, b in [
            (2, "1 MB", 2.0, 0.5),
            (2, "10 MB", 11.0, 0.9),
            (4, "1 MB", 4.0, 0.25),
            (4, "10 MB", 22.0, 0.45),
        ]
    ]
    _write(tmp_path, "allreduce", rows)
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "allreduce_time_and_bandwidth.png").write_bytes(b"")
    answer = build("distributed_communication_single_node", Results(tmp_path))
    assert "trend" not in answer.text and "correlat" not in answer.text
    assert "11.0 ms with 2 processes to 22.0 ms with 4, 2.00×" in answer.text
    assert "per-call cost α of 1.00 ms" in answer.text  # α = (2·10 − 11·1)/9
    assert "no GPUs" in answer.caveat


def test_sharding_memory_states_the_measured_peaks_before_the_step(tmp_path):
    rows = []
    for optimizer, state, before, after in [("unsharded", 16.0, 41.88, 32.5), ("sharded", 8.0, 33.81, 24.37)]:
        for point, peak, grads, st in [
            ("after init", 8.19, 0.0, 0.0),
            ("before step", before, 8.0, state),
            ("after step", after, 8.0, state),
        ]:
            rows.append(
                dict(
                    optimizer=optimizer,
                    point=point,
                    rank=0,
                    allocated_GB=peak,
                    peak_GB=peak,
                    parameters_GB=8.0,
                    gradients_GB=grads,
                    optimizer_state_GB=st,
                    rest_GB=0.3,
                    expected_parameters_GB=8.0,
                    expected_gradients_GB=grads,
                    expected_optimizer_state_GB=st,
                )
            )
    _write(tmp_path, "sharding_memory_breakdown", rows)
    _setup(tmp_path, "sharding_setup")
    text = build("optimizer_state_sharding_accounting.a", Results(tmp_path)).text
    assert "41.88 GB → 33.81 GB directly before the optimizer step" in text
    assert "does not change" not in text


# ---- runs that time both handouts' XL models: the 2026 answers read the 2026 xl's rows --------------------

XL_2026_PARAMS = 3_406_809_600


def _two_sizes(folder: Path, name: str, rows_xl: list[dict], rows_2026: list[dict], setup: str | None = None) -> None:
    _write(folder, name, [dict(r, size="xl") for r in rows_xl] + [dict(r, size="2.7B") for r in rows_2026])
    if setup:
        _write(
            folder,
            setup,
            [
                dict(
                    size=s,
                    parameters=p,
                    gradient_bytes=4 * p,
                    context_length=512,
                    global_batch_size=4,
                    world_size=2,
                    backend="nccl",
                    warmup=w,
                    steps=n,
                )
                for s, p, w, n in [("xl", 1_998_235_200, 3, 10), ("2.7B", XL_2026_PARAMS, 2, 6)]
            ],
        )


def _naive_flat_rows(scale: float, status: str = "ok") -> list[dict]:
    rows = [
        _step_row("no-communication", 442.77 * scale, 1.1, 395.8 * scale, 0.36, 0),
        _step_row("naive", 480.31 * scale, 0.9, 395.7 * scale, 39.05 * scale, 435),
        _step_row("flat", 477.18 * scale, 1.0, 395.8 * scale, 35.79 * scale, 1),
    ]
    return [dict(r, status=status) for r in rows]


def test_2026_answers_read_the_2026_xl_rows_and_drop_the_caveat(tmp_path):
    _two_sizes(tmp_path, "naive_flat_step", _naive_flat_rows(1.0), _naive_flat_rows(1.5), "naive_flat_setup")
    for key in ("naive_ddp_benchmarking", "minimal_ddp_flat_benchmarking"):
        a2025, a2026 = build(key, Results(tmp_path)), build(f"{key}.2026", Results(tmp_path))
        assert "480.3 ms" in a2025.text and "720.5 ms" not in a2025.text and "2025 handout's XL" in a2025.text
        assert "720.5 ms" in a2026.text and "480.3 ms" not in a2026.text and "2026 handout's xl" in a2026.text
        assert a2025.caveat == "" and a2026.caveat == "", key
    assert "mean of 6 steps after 2 warm-up steps" in build("naive_ddp_benchmarking.2026", Results(tmp_path)).text


def test_2026_answers_keep_the_caveat_when_the_2026_xl_ran_out_of_memory(tmp_path):
    _two_sizes(
        tmp_path, "naive_flat_step", _naive_flat_rows(1.0), _naive_flat_rows(1.5, status="OOM"), "naive_flat_setup"
    )
    a2026 = build("naive_ddp_benchmarking.2026", Results(tmp_path))
    assert "480.3 ms" in a2026.text
    assert (
        "d_model 2560" in a2026.caveat and "ran out of memory" in a2026.caveat and "2025 handout's XL" in a2026.caveat
    )


def test_a_run_of_the_2026_xl_alone_answers_2025_with_a_caveat(tmp_path):
    _write(tmp_path, "naive_flat_step", [dict(r, size="2.7B") for r in _naive_flat_rows(1.5)])
    _setup(tmp_path, "naive_flat_setup", size="2.7B")
    assert build("naive_ddp_benchmarking.2026", Results(tmp_path)).caveat == ""
    caveat = build("naive_ddp_benchmarking", Results(tmp_path)).caveat
    assert "2025 handout asks for its XL model (d_model 1600" in caveat and "does not include" in caveat


def test_overlapping_ddp_answers_read_their_handouts_rows_and_figures(tmp_path):
    def rows(scale):
        return _naive_flat_rows(scale) + [_step_row("individual", 460.0 * scale, 1.0, 420.0 * scale, 3.0, 435)]

    _two_sizes(tmp_path, "overlap_individual_step", rows(1.0), rows(2.0), "overlap_individual_setup")
    timeline = [
        dict(
            flavour=f,
            communication_spans=435,
            communication_ms=40.0,
            share_inside_backward=share,
            after_backward_ms=after,
        )
        for f, share, after in [("naive", 0.0, 39.0), ("individual", 0.93, 2.5)]
    ]
    _two_sizes(
        tmp_path,
        "timeline_overlap",
        timeline,
        [dict(r, after_backward_ms=r["after_backward_ms"] * 2) for r in timeline],
    )
    (tmp_path / "figures").mkdir()
    for size in ("xl", "2.7B"):
        (tmp_path / "figures" / f"timeline_naive_vs_individual_{size}.png").write_bytes(b"")
    a = build("ddp_overlap_individual_parameters_benchmarking.a.2026", Results(tmp_path))
    assert "920.0 ms" in a.text and a.caveat == ""
    b2025 = build("ddp_overlap_individual_parameters_benchmarking.b", Results(tmp_path))
    b2026 = build("ddp_overlap_individual_parameters_benchmarking.b.2026", Results(tmp_path))
    assert b2025.figure.endswith("_xl.png") and b2026.figure.endswith("_2.7B.png")
    assert "ends 5.00 ms after it" in b2026.text and "ends 2.50 ms after it" in b2025.text
    assert "d_model 2560" not in b2026.caveat


def _sharding_memory_rows(scale: float) -> list[dict]:
    rows = []
    for optimizer, state, before, after in [("unsharded", 16.0, 41.88, 32.5), ("sharded", 8.0, 33.81, 24.37)]:
        for point, peak, grads, st in [
            ("after init", 8.19, 0.0, 0.0),
            ("before step", before, 8.0, state),
            ("after step", after, 8.0, state),
        ]:
            rows.append(
                dict(
                    optimizer=optimizer,
                    point=point,
                    rank=0,
                    allocated_GB=peak * scale,
                    peak_GB=peak * scale,
                    parameters_GB=8.0 * scale,
                    gradients_GB=grads * scale,
                    optimizer_state_GB=st * scale,
                    rest_GB=0.3,
                    expected_parameters_GB=8.0 * scale,
                    expected_gradients_GB=grads * scale,
                    expected_optimizer_state_GB=st * scale,
                )
            )
    return rows


def test_sharding_answers_read_their_handouts_rows(tmp_path):
    _two_sizes(
        tmp_path, "sharding_memory_breakdown", _sharding_memory_rows(1.0), _sharding_memory_rows(1.5), "sharding_setup"
    )
    timing = [
        dict(
            optimizer=o,
            status="ok",
            step_ms=t,
            step_std_ms=1.0,
            fwd_bwd_ms=400.0,
            sync_ms=5.0,
            optimizer_ms=t - 405.0,
            rank_spread_ms=0.1,
        )
        for o, t in [("unsharded", 467.7), ("sharded", 477.8)]
    ]
    _two_sizes(tmp_path, "sharding_step_time", timing, [dict(r, step_ms=r["step_ms"] + 200) for r in timing])
    a2025 = build("optimizer_state_sharding_accounting.a", Results(tmp_path))
    a2026 = build("optimizer_state_sharding_accounting.a.2026", Results(tmp_path))
    assert "41.88 GB → 33.81 GB" in a2025.text and "62.82 GB → 50.72 GB" in a2026.text
    assert a2026.caveat == "" and "3,406.8 M parameters" in a2026.text
    b2026 = build("optimizer_state_sharding_accounting.b.2026", Results(tmp_path))
    assert "677.8 ms" in b2026.text and "467.7 ms" not in b2026.text and b2026.caveat == ""


def test_the_zero1_comparison_covers_both_models(tmp_path):
    from cs336_systems.experiments.sharding_benchmark import analysis_tables

    tables = analysis_tables(["xl", "2.7B"], 512, 2)
    tables["memory"].drop(columns="strategy").to_csv(tmp_path / "sharding_analysis_memory.csv", index=False)
    tables["communication"].drop(columns="strategy").to_csv(
        tmp_path / "sharding_analysis_communication.csv", index=False
    )
    tables["zero_paper"].to_csv(tmp_path / "sharding_zero_paper_mixed_precision.csv", index=False)
    answer = build("optimizer_state_sharding_accounting.c", Results(tmp_path))
    assert "the 2025 handout's XL model (1.998 B parameters)" in answer.text
    assert "the 2026 handout's xl model (3.407 B parameters)" in answer.text
    assert answer.table["model"].tolist() == ["2025 XL"] * 3 + ["2026 xl"] * 3


def _fsdp_runs(scale: float) -> list[dict]:
    return [
        dict(
            strategy=s,
            compute_dtype=d,
            status="ok",
            step_ms=t * scale,
            step_std_ms=1.0,
            fwd_bwd_ms=0.9 * t * scale,
            sync_ms=1.0,
            optimizer_ms=0.1 * t * scale,
            peak=p * scale,
            after_init_allocated=1e9,
            parameters=4e9 * scale / f,
            gradients=4e9 * scale / f,
            optimizer_state=8e9 * scale / f,
        )
        for s, d, t, p, f in [
            ("replicated", "fp32", 465.5, 41.9e9, 1),
            ("fsdp", "fp32", 592.1, 29.7e9, 2),
            ("fsdp2", "fp32", 554.5, 30.0e9, 2),
            ("fsdp", "bf16", 497.7, 21.8e9, 2),
            ("fsdp2", "bf16", 625.1, 21.9e9, 2),
        ]
    ]


def _fsdp_folder(folder: Path, with_2026: bool = True) -> None:
    from cs336_systems.experiments.fsdp_benchmark import FSDPBenchmarkConfig, expected_saving
    from cs336_systems.experiments.sharding_benchmark import analysis_tables

    sizes = ["xl", "2.7B"] if with_2026 else ["xl"]
    _write(
        folder,
        "fsdp_equality",
        [
            dict(
                compute_dtype="fp32",
                rank=r,
                size="nano",
                steps=3,
                adam_eps=1e-8,
                max_abs_diff=1e-7,
                max_update=1e-3,
                tolerance=1e-6,
            )
            for r in (0, 1)
        ],
    )
    if with_2026:
        _two_sizes(folder, "fsdp_runs", _fsdp_runs(1.0), _fsdp_runs(1.4), "fsdp_setup")
    else:
        _write(folder, "fsdp_runs", [dict(r, size="xl") for r in _fsdp_runs(1.0)])
        _setup(folder, "fsdp_setup")
    memory = analysis_tables(["xl", "2.7B"], 512, 2)["memory"]
    memory[memory.strategy.isin(["ddp", "fsdp"])].to_csv(folder / "fsdp_analysis_memory.csv", index=False)
    configs = [FSDPBenchmarkConfig(size=s) for s in sizes]
    expected_saving(configs).to_csv(folder / "fsdp_expected_saving_measured_model.csv", index=False)


def test_fsdp_answers_read_the_2026_xl_rows(tmp_path):
    _fsdp_folder(tmp_path)
    answer = build("fsdp", Results(tmp_path))
    assert "2026 handout's xl model" in answer.text and "696.8 ms" in answer.text and answer.caveat == ""
    a = build("fsdp_accounting.a", Results(tmp_path))
    assert "the 2026 handout's xl model (d_model 2560" in a.text and "Measured with the 2026 handout's xl" in a.text
    assert a.caveat == ""


def test_fsdp_answers_keep_the_caveat_without_the_2026_xl(tmp_path):
    _fsdp_folder(tmp_path, with_2026=False)
    assert "d_model 2560" in build("fsdp", Results(tmp_path)).caveat
    a = build("fsdp_accounting.a", Results(tmp_path))
    assert "the 2026 handout's xl model (d_model 2560" in a.text and "Measured with the 2025 handout's XL" in a.text


def _profiles(folder: Path, busy: list[float], threshold: float = 0.8) -> None:
    rows = []
    for batch, b in zip((2, 16, 64), busy):
        rows.append(
            dict(
                size="2.7B",
                strategy="fsdp",
                compute_dtype="bf16",
                batch_per_rank=batch,
                context_length=512,
                status="ok",
                tokens_per_rank=batch * 512,
                forward_ms=60.0 * batch**0.5,
                busy_fraction=b,
                gather_ms=20.0,
                hidden_ms=19.0,
                hidden_fraction=0.95,
                exposed_ms=1.0,
                gathers=226,
                gathers_in_time=225,
                late_ms=0.4,
                busy_threshold=threshold,
                gpu_bound=b >= threshold,
                shown=False,
            )
        )
    bound = [i for i, r in enumerate(rows) if r["gpu_bound"]]
    rows[bound[0] if bound else max(range(len(rows)), key=lambda i: rows[i]["busy_fraction"])]["shown"] = True
    _write(folder, "fsdp_forward_profiles", rows)
    _write(
        folder,
        "fsdp_forward_gathers",
        [
            dict(
                module=f"m{i}",
                position=i,
                gather_start_ms=0.0,
                gather_end_ms=0.1,
                ready_ms=0.2,
                compute_start_ms=0.3,
                compute_end_ms=0.5,
                exposed_ms=0.4 if i == 0 else 0.0,
                gather_found=True,
                in_time=i != 0,
                clock="GPU kernels",
            )
            for i in range(226)
        ],
    )
    (folder / "figures").mkdir(exist_ok=True)
    (folder / "figures" / "fsdp_profiler_timeline.png").write_bytes(b"")


def test_fsdp_profile_answer_states_overlap_where_the_gpu_was_the_bottleneck(tmp_path):
    _fsdp_folder(tmp_path)
    _profiles(tmp_path, busy=[0.12, 0.91, 0.97])
    answer = build("fsdp_accounting.b", Results(tmp_path))
    assert "At 16 sequences of 512 tokens per rank the GPU was busy 91%" in answer.text
    assert (
        "the GPU, not the host, set the pace" in answer.text and "95.0% of it while a compute kernel ran" in answer.text
    )
    assert "overlap compute and finish in time" in answer.text and "busy only 12%" in answer.text
    assert "idle" not in answer.caveat and "d_model 2560" not in answer.caveat
    assert jargon(answer.text) == [] and jargon(answer.caveat) == []


def test_fsdp_profile_answer_keeps_the_idle_caveat_where_the_host_set_the_pace(tmp_path):
    _fsdp_folder(tmp_path)
    _profiles(tmp_path, busy=[0.12, 0.35, 0.55])
    answer = build("fsdp_accounting.b", Results(tmp_path))
    assert "At 64 sequences" in answer.text and "below the 80%" in answer.text
    assert "overlap compute and finish in time" not in answer.text
    assert "busy only 55%" in answer.caveat and "compute-bound" in answer.caveat


def test_a_run_whose_profiled_size_did_not_fit_says_so(tmp_path):
    from cs336_systems.experiments.fsdp_timeline import summarize_profiles

    _fsdp_folder(tmp_path)
    summarize_profiles([]).to_csv(tmp_path / "fsdp_forward_profiles.csv", index=False)
    answer = build("fsdp_accounting.b", Results(tmp_path))
    assert not answer.answered and "no forward pass could be profiled" in answer.reason


def test_sharded_optimizer_equality_reads_as_identical_or_as_a_bound(tmp_path):
    """Zero differences read 'bit-identical', not 'at most 0.0e+00'; a nonzero one keeps its bound."""
    results = tmp_path / "results"
    results.mkdir()

    def answer(sharded: float, zero: float) -> str:
        rows = [
            dict(optimizer=o, rank=r, size="nano", steps=10, max_abs_diff=d, max_update=0.1)
            for o, d in (("unsharded", 0.0), ("sharded", sharded), ("zero", zero))
            for r in (0, 1)
        ]
        pd.DataFrame(rows).to_csv(results / "sharding_equality.csv", index=False)
        return build("optimizer_state_sharding", Results(results)).text

    assert (
        "the sharded optimizer's weights and PyTorch's ZeroRedundancyOptimizer's are bit-identical to the unsharded "
        "AdamW's." in answer(0.0, 0.0)
    )
    text = answer(0.0, 3e-7)
    assert "the sharded optimizer's weights are bit-identical to the unsharded AdamW's and PyTorch's " in text
    assert "ZeroRedundancyOptimizer's differ from the unsharded AdamW's by at most 3.0e-07." in text
    assert "0.0e+00" not in text
