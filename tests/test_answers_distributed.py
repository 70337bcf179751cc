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
NOTEBOOKS = {"12_distributed_communication", "13_naive_ddp", "14_ddp_overlap_individual", "15_ddp_bucketed",
             "16_optimizer_state_sharding", "17_fsdp"}
KEYS = sorted({d.answer for d in DELIVERABLES if d.notebook in NOTEBOOKS})


def test_every_key_of_these_notebooks_has_a_builder():
    assert KEYS and [k for k in KEYS if k not in BUILDERS] == []


@pytest.mark.skipif(not GPU_RESULTS.exists(), reason="no committed GPU report")
@pytest.mark.parametrize("key", KEYS)
def test_answered_on_the_committed_gpu_report_without_jargon(key):
    answer = build(key, Results(GPU_RESULTS))
    assert answer.reason == ""
    assert jargon(answer.text) == [] and jargon(answer.caveat) == []
    assert "NVIDIA H200" in answer.text or key in {"optimizer_state_sharding_accounting.c", "ddp_bucketed_benchmarking.b"}


@pytest.mark.skipif(not GPU_RESULTS.exists(), reason="no committed GPU report")
def test_2026_keys_name_the_missing_2026_xl():
    for key in [k for k in KEYS if k.endswith(".2026")] + ["fsdp_accounting.b"]:
        caveat = build(key, Results(GPU_RESULTS)).caveat
        assert "d_model 2560" in caveat and "2025 handout's XL" in caveat, key


@pytest.mark.skipif(not GPU_RESULTS.exists(), reason="no committed GPU report")
def test_fsdp_profile_answer_does_not_claim_overlap():
    answer = build("fsdp_accounting.b", Results(GPU_RESULTS))
    assert "overlap" not in answer.text
    assert "host" in answer.text and "compute-bound" in answer.caveat


def _step_row(flavour, step, std, fwd_bwd, sync, calls):
    return dict(flavour=flavour, status="ok", all_reduce_calls=calls, step_ms=step, step_std_ms=std, fwd_bwd_ms=fwd_bwd,
                sync_ms=sync, sync_std_ms=0.1, optimizer_ms=step - fwd_bwd - sync, overhead_ms=0.0,
                sync_fraction=sync / step, rank_spread_ms=0.1)


def _write(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / f"{name}.csv", index=False)


def _setup(folder: Path, name: str, size="xl", backend="nccl") -> None:
    _write(folder, name, [dict(size=size, parameters=1_998_235_200, gradient_bytes=4 * 1_998_235_200, context_length=512,
                               global_batch_size=4, world_size=2, backend=backend, warmup=3, steps=10)])


def test_naive_benchmarking_carries_the_tables_numbers(tmp_path):
    _write(tmp_path, "naive_flat_step", [_step_row("no-communication", 442.77, 1.1, 395.8, 0.36, 0),
                                         _step_row("naive", 480.31, 0.9, 395.7, 39.05, 435),
                                         _step_row("flat", 477.18, 1.0, 395.8, 35.79, 1)])
    _setup(tmp_path, "naive_flat_setup")
    answer = build("naive_ddp_benchmarking", Results(tmp_path))
    assert "480.3 ms" in answer.text and "39.0 ms" in answer.text and "435 calls" in answer.text
    assert "a global batch of 4 sequences of 512 tokens" in answer.text
    assert answer.caveat == ""
    assert "d_model 2560" in build("naive_ddp_benchmarking.2026", Results(tmp_path)).caveat


def test_steps_inside_their_spread_are_not_called_faster(tmp_path):
    _write(tmp_path, "naive_flat_step", [_step_row("no-communication", 440.0, 1.0, 395.0, 0.3, 0),
                                         _step_row("naive", 480.0, 6.0, 395.0, 39.0, 435),
                                         _step_row("flat", 478.0, 6.0, 395.0, 37.0, 1)])
    _setup(tmp_path, "naive_flat_setup")
    text = build("minimal_ddp_flat_benchmarking", Results(tmp_path)).text
    assert "does not separate" in text
    assert "faster" not in text and "slower" not in text


def test_flat_that_saves_nothing_is_not_credited_a_per_call_saving(tmp_path):
    _write(tmp_path, "naive_flat_step", [_step_row("no-communication", 100.0, 1.0, 80.0, 0.1, 0),
                                         _step_row("naive", 120.0, 1.0, 80.0, 20.0, 12),
                                         _step_row("flat", 130.0, 1.0, 80.0, 30.0, 1)])
    _setup(tmp_path, "naive_flat_setup", size="nano", backend="gloo")
    answer = build("minimal_ddp_flat_benchmarking", Results(tmp_path))
    assert "saves no communication time" in answer.text and "per call avoided" not in answer.text
    assert "CPU profile" in answer.caveat


def test_allreduce_with_two_sizes_states_values_not_a_trend(tmp_path):
    rows = [dict(backend="gloo", device="cpu", world_size=n, size=size, mean_ms=t, std_ms=0.1, rank_spread_ms=0.0,
                 algbw_gbps=b, busbw_gbps=b * 2 * (n - 1) / n)
            for n, size, t, b in [(2, "1 MB", 2.0, 0.5), (2, "10 MB", 11.0, 0.9), (4, "1 MB", 4.0, 0.25),
                                  (4, "10 MB", 22.0, 0.45)]]
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
        for point, peak, grads, st in [("after init", 8.19, 0.0, 0.0), ("before step", before, 8.0, state),
                                       ("after step", after, 8.0, state)]:
            rows.append(dict(optimizer=optimizer, point=point, rank=0, allocated_GB=peak, peak_GB=peak, parameters_GB=8.0,
                             gradients_GB=grads, optimizer_state_GB=st, rest_GB=0.3, expected_parameters_GB=8.0,
                             expected_gradients_GB=grads, expected_optimizer_state_GB=st))
    _write(tmp_path, "sharding_memory_breakdown", rows)
    _setup(tmp_path, "sharding_setup")
    text = build("optimizer_state_sharding_accounting.a", Results(tmp_path)).text
    assert "41.88 GB → 33.81 GB directly before the optimizer step" in text
    assert "does not change" not in text
