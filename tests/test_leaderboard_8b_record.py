"""Notebook 20's library (`experiments.leaderboard_8b_record`) on CPU at a toy size: the record's rows, the
committed CSV's columns, the per-rank memory plan, the kernel categories and a failed torchrun run."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from cs336_systems.experiments import leaderboard_8b_record as rec
from cs336_systems.model import TransformerLM
from cs336_systems.training.memory_plan import MemoryTerms, fixed_memory_bytes


@pytest.fixture
def tiny(monkeypatch):
    from cs336_systems.attention.api import DEFAULTS

    monkeypatch.setattr(DEFAULTS, "tiles", (16, 16))
    torch.manual_seed(0)
    model = TransformerLM(97, 16, 32, 2, 2, 64, attention="flash_triton")
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 97, (1, 16), generator=g) for _ in range(2))
    return model, x, y


def test_record_rows_one_change_each_and_the_committed_columns(tiny):
    model, x, y = tiny
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = [r for r in rec.RECORD if r.variant in ("torch_native", "ours")]
    df = rec.run_record(model, x, y, rows, compile_blocks=False, ceiling_tflops=2.0)
    assert list(df.columns) == rec.RECORD_COLUMNS and list(df.variant) == ["torch_native", "ours"]
    assert list(df.status) == ["ok", "ok"] and df.vs_baseline.iloc[0] == 1.0
    assert list(df.blocks_recomputed) == [2, 0]  # the baseline recomputes every block; on CPU the plan keeps all
    assert (df.ceiling_fraction == df.tflops / 2.0).all()
    out = rec.leaderboard_rows(df, 2.0, 1, "cpu", rep_ms=3000, warmup_ms=500)
    assert list(out.columns) == [
        "variant",
        "step_ms",
        "peak_gib",
        "tflops",
        "ceiling_tflops",
        "world_size",
        "device",
        "rep_ms",
        "warmup_ms",
    ]
    assert list(out.rep_ms) == [3000, 3000] and list(out.warmup_ms) == [500, 500]
    two = pd.DataFrame(
        [
            dict(
                variant="ours",
                ms=9.0,
                peak_gib=1.0,
                useful_tflops=3.0,
                world_size=2,
                device="gpu",
                rep_ms=30000,
                warmup_ms=10000,
                status="ok",
                note="",
            ),
            dict(variant="torch_native", world_size=2, status="failed", note="out of memory"),
        ]
    )
    both = rec.leaderboard_rows(df, 2.0, 1, "cpu", torchrun_results=two)
    assert list(both.world_size) == [1, 1, 2] and both.step_ms.iloc[-1] == 9.0 and both.tflops.iloc[-1] == 3.0
    assert both.rep_ms.iloc[-1] == 30000 and both.warmup_ms.iloc[-1] == 10000  # each run's own do_bench settings
    # the rows train the model (the record does not restore it), but never change its structure
    assert {n: p.shape for n, p in model.named_parameters()} == {n: p.shape for n, p in before.items()}
    # every row changes one thing from the one before it (torch's AdamW keeps its states in the parameters'
    # dtype, bf16 on the GPU: our bf16 states replacing them is part of the optimizer's change)
    for a, b in zip(rec.RECORD, rec.RECORD[1:]):
        changed = {k for k in set(a.options) | set(b.options) if a.options.get(k) != b.options.get(k)}
        if "torch_adamw" in (a.options.get("optimizer"), b.options.get("optimizer")):
            changed.discard("state_dtype")
        assert len(changed) + (a.attention != b.attention) == 1, (a.variant, b.variant, changed)


def test_a_row_that_does_not_fit_is_a_row(tiny, monkeypatch):
    model, x, y = tiny
    row = rec.RecordRow("tight", "a budget of one byte", "flash_triton", dict(recompute="plan", memory_budget_bytes=1))
    df = rec.run_record(model, x, y, [row], compile_blocks=False)
    assert df.status.iloc[0] == "does not fit" and "bigger GPU" in df.note.iloc[0]


def test_a_row_that_fails_otherwise_is_an_error_not_a_row(tiny, monkeypatch):
    """Only a plan that does not fit (`PlanDoesNotFit`) becomes a "does not fit" row; another ValueError (here
    the timing's) propagates, rather than being recorded as a size problem."""
    model, x, y = tiny

    def broken(*args, **kwargs):
        raise ValueError("a bug in the timing")

    monkeypatch.setattr(rec, "time_step", broken)
    row = rec.RecordRow("plain", "everything kept", "flash_triton", dict(recompute="none"))
    with pytest.raises(ValueError, match="a bug in the timing"):
        rec.run_record(model, x, y, [row], compile_blocks=False)


def test_sharded_plan_halves_each_rank_s_states(tiny):
    model = tiny[0]
    terms = MemoryTerms(fixed=0, block=10_000)
    plan = rec.kept_blocks_table(model, terms, batch=1, seq=16, budget_bytes=None, world_sizes=(1, 2))
    numel = sum(p.numel() for p in model.parameters())
    states = 2 * numel * 2  # bf16
    one, two = plan.fixed_gib_per_rank * 2**30
    # the tiny model's gradients are smaller than the three 1000 MB buckets in flight: only the states halve
    # (the gradients' share is tested in tests/test_train_step_data_parallel.py)
    assert one - two == pytest.approx(states / 2, abs=1) and list(plan.blocks_keeping_activations) == [2, 2]
    # within a budget, the rank's halved states leave room for kept blocks (2 layers; kept attention first)
    terms = MemoryTerms(fixed=0, block=10_000, checkpoint=100, attention=100)
    budget = fixed_memory_bytes(model, torch.bfloat16, 1, 16, world_size=2, bucket_bytes=1000 * 2**20) + 2 * 10_000
    plan = rec.kept_blocks_table(model, terms, batch=1, seq=16, budget_bytes=budget, world_sizes=(1, 2))
    assert plan.blocks_keeping_activations[1] == 2
    assert pd.isna(plan.blocks_keeping_activations[0]) or plan.blocks_keeping_activations[0] < 2


def test_kernel_categories():
    assert rec.kernel_category("flash_bwd_gluon_d128_kernel") == "attention"
    assert rec.kernel_category("sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul"
    assert rec.kernel_category("adamw_multi_tensor_kernel") == "optimizer"
    assert rec.kernel_category("triton_poi_fused_mul_silu_0") == "elementwise / other"


def test_a_failed_torchrun_run_is_a_row_with_its_reason():
    """Without a GPU the command refuses; the row says so instead of raising."""
    if torch.cuda.is_available():
        pytest.skip("checks the failure path without a GPU")
    row = rec.torchrun_step("ours", 1, layers=1, context=16, rep_ms=1, warmup_ms=1, compile_blocks=False, timeout_s=120)
    assert row["status"] == "failed" and "CUDA" in row["note"] and row["world_size"] == 1
    assert isinstance(pd.DataFrame([row]), pd.DataFrame)


def test_compiled_blocks_are_reset_when_the_partitioner_budget_changes(tiny, monkeypatch):
    """Compiled code stays on the blocks whatever budget partitioned it: the record drops it at its start and
    whenever a row's budget differs from the one the blocks were compiled under (the blocks are not really
    compiled here: under the interpreter nothing compiles)."""
    model, x, y = tiny
    resets = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: None)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(True))
    rows = [
        rec.RecordRow(f"r{i}", "", "flash_triton", dict(recompute="none", activation_memory_budget=b))
        for i, b in enumerate((None, None, 0.6, 0.6, None))
    ]
    rows = [
        rec.RecordRow(r.variant, "", r.attention, {k: v for k, v in r.options.items() if v is not None}) for r in rows
    ]
    df = rec.run_record(model, x, y, rows, compile_blocks=True)
    assert (df.status == "ok").all() and len(resets) == 3


def _two_gpus_tool():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "leaderboard_8b_two_gpus.py"
    spec = importlib.util.spec_from_file_location("leaderboard_8b_two_gpus", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_gpu_command_rows_compare_within_a_world_size():
    """tools/leaderboard_8b_two_gpus.py: each step against the torch-native step of its own world size; a
    failed run is a row with its reason and no ratio."""
    tool = _two_gpus_tool()
    results = [
        dict(
            variant="ours",
            world_size=2,
            batch=1,
            ms=4_800.0,
            status="ok",
            note="",
            wall_s=120.0,
            plan=[True, False, False],
            sm_mhz_by_gpu=[1590.0, 1545.0],
            power_capped_by_gpu=[0.5, 0.9],
        ),
        dict(
            variant="ours",
            world_size=1,
            batch=1,
            ms=4_700.0,
            status="ok",
            note="",
            wall_s=100.0,
            plan=[True, True, False],
        ),
        dict(variant="torch_native", world_size=2, batch=1, ms=6_000.0, status="ok", note="", wall_s=90.0, plan=None),
        dict(variant="torch_native", world_size=1, status="failed", note="out of memory", wall_s=30.0),
    ]
    rows = tool.command_rows(results, 30_000, 10_000, "abc1234").set_index(["variant", "world_size"])
    assert list(rows.columns) == [c for c in tool.COMMAND_COLUMNS if c not in ("variant", "world_size")]
    assert rows.loc[("ours", 2), "vs_torch_native"] == pytest.approx(0.8)
    assert pd.isna(rows.loc[("ours", 1), "vs_torch_native"])  # no one-GPU baseline ran
    assert rows.loc[("ours", 2), "command"].startswith("torchrun --nproc-per-node 2 -m cs336_systems.training")
    assert rows.loc[("ours", 1), "command"].startswith("python -m cs336_systems.training.leaderboard_8b")
    command = rows.loc[("ours", 2), "command"]
    assert "rep 30000, warmup 10000" in command and "abc1234" in command
    assert rows.loc[("torch_native", 1), "note"] == "out of memory"
    assert rows.loc[("ours", 2), "blocks_recomputed"] == 1 and rows.loc[("ours", 1), "blocks_recomputed"] == 2
    assert pd.isna(rows.loc[("torch_native", 2), "blocks_recomputed"])
    assert "offload-states" not in command  # a result from before the command said where its states were
    offloaded = tool.command_rows([dict(results[0], states_offloaded=True)], 30_000, 10_000, "abc1234")
    assert "--variant ours --offload-states (rep 30000" in offloaded.command.iloc[0]
    resident = tool.command_rows([dict(results[0], states_offloaded=False)], 30_000, 10_000, "abc1234")
    assert "--variant ours --no-offload-states (rep 30000" in resident.command.iloc[0]
    # the slowest GPU's clock sets a data-parallel step's pace; runs without telemetry have none
    assert rows.loc[("ours", 2), "sm_mhz"] == 1545.0 and rows.loc[("ours", 2), "power_capped"] == 0.9
    assert pd.isna(rows.loc[("ours", 1), "sm_mhz"])


def test_one_gpu_runs_follow_the_refusal_to_the_layers_that_fit(tmp_path, monkeypatch):
    """`--one-gpu`: where the plan refuses the whole model, ours runs again on the layers the refusal names,
    then the torch-native step on those layers; the refusal is a row with its need, budget and layers, and
    each step is compared only with the torch-native step of its own layer count."""
    import argparse

    tool = _two_gpus_tool()
    calls = []

    def fake_step(variant, nproc, layers, **kw):
        calls.append((variant, layers, kw["offload_states"]))
        if variant == "ours" and layers == 34:
            return dict(
                variant="ours",
                world_size=1,
                layers=34,
                status="does not fit",
                note="the step does not fit its memory budget",
                need_gib=75.5,
                budget_gib=73.5,
                would_fit={"layers": 32, "context": 16384},
                device="NVIDIA H100 80GB HBM3",
                wall_s=30.0,
            )
        ms = 4_700.0 if variant == "ours" else 6_000.0
        return dict(layers=layers, ms=ms, status="ok", note="", wall_s=90.0, device="NVIDIA H100 80GB HBM3")

    monkeypatch.setattr(tool, "torchrun_step", fake_step)
    args = argparse.Namespace(
        out=tmp_path, layers=34, context=32_768, rep=30_000, warmup=10_000, timeout=60.0, offload_states=True
    )
    tool.one_gpu_runs(args, "abc1234")
    assert calls == [("ours", 34, True), ("ours", 32, True), ("torch_native", 32, True)]
    rows = pd.read_csv(tmp_path / "leaderboard_8b_one_gpu_command.csv")
    refusal, ours, native = (row for _, row in rows.iterrows())
    assert refusal.status == "does not fit" and (refusal.need_gib, refusal.budget_gib, refusal.fits_layers) == (
        75.5,
        73.5,
        32,
    )
    assert "--layers 32" in ours.command and "--layers" not in refusal.command
    assert ours.vs_torch_native == pytest.approx(4_700 / 6_000) and pd.isna(refusal.vs_torch_native)


def test_a_refusal_the_command_wrote_is_its_row(monkeypatch):
    """`torchrun_step`: a command that exits 1 after writing its refusal (`--json`) is that row, not "failed"."""
    import json
    import subprocess

    def fake_run(cmd, **kw):
        out = cmd[cmd.index("--json") + 1]
        with open(out, "w") as f:
            json.dump(dict(status="does not fit", need_gib=75.5, budget_gib=73.5, would_fit={"layers": 32}), f)
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="leaderboard_8b: the step does not fit")

    monkeypatch.setattr(subprocess, "run", fake_run)
    row = rec.torchrun_step("ours", 1, layers=34, context=16, rep_ms=1, warmup_ms=1, compile_blocks=False)
    assert row["status"] == "does not fit" and row["would_fit"] == {"layers": 32} and row["wall_s"] >= 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the command needs a CUDA GPU")
def test_the_command_writes_its_refusal_as_a_result(tmp_path):
    """A step whose plan cannot fit exits 1 with the refusal in `--json`: its need, its budget and what would fit
    (here a 6 GiB cap: one block with the 8B model's vocabulary, 2.7 GiB of bf16 parameters, fits; its
    gradients and states do not fit the 1 GiB the plan's 5 GiB margin leaves)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "refusal.json"
    cmd = [sys.executable, "-m", "cs336_systems.training.leaderboard_8b", "--layers", "1", "--context", "64"]
    cmd += ["--memory-gib", "6", "--rep", "1", "--warmup", "1", "--json", str(out)]
    env = dict(os.environ, PYTHONPATH=str(root / "lib"))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 1 and "does not fit its memory budget" in proc.stderr, proc.stderr[-2000:]
    refusal = json.loads(out.read_text())
    assert refusal["status"] == "does not fit" and refusal["budget_gib"] < refusal["need_gib"]
    assert refusal["layers"] == 1 and refusal["device"] == torch.cuda.get_device_name(0)
    assert refusal["date"].endswith(" UTC")  # the command tables' `date`: when the run ended


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure path without a GPU")
def test_two_gpu_tool_records_each_failed_run_and_goes_on(tmp_path):
    """Without a GPU every command refuses: the tool still writes all three rows, each with its reason."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root / "lib"))
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "tools" / "leaderboard_8b_two_gpus.py"),
            "--out",
            str(tmp_path),
            "--layers",
            "1",
            "--context",
            "16",
            "--rep",
            "1",
            "--warmup",
            "1",
            "--timeout",
            "120",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = pd.read_csv(tmp_path / "leaderboard_8b_two_gpus_command.csv")
    assert list(zip(rows.variant, rows.world_size)) == [("ours", 2), ("ours", 1), ("torch_native", 2)]
    assert (rows.status == "failed").all() and rows.note.str.contains("CUDA").all()
    assert not (tmp_path / "leaderboard_8b_two_gpus_streams.csv").exists()  # no trace, no stream tables


def test_leaderboard_answer_states_how_each_row_was_timed(tmp_path):
    """The 2026 leaderboard answer names the do_bench settings of the rows it reads: the handout's where the
    notebook ran its two-GPU steps that way, the shorter ones otherwise, never the handout's by assumption."""
    from cs336_systems.experiments.answers import Results, build

    def answer(rep, warmup):
        pd.DataFrame(
            [
                dict(
                    variant="ours",
                    step_ms=4500.0,
                    peak_gib=120.0,
                    tflops=500.0,
                    ceiling_tflops=700.0,
                    world_size=2,
                    device="NVIDIA H200",
                    rep_ms=rep,
                    warmup_ms=warmup,
                ),
                dict(
                    variant="torch_native",
                    step_ms=5600.0,
                    peak_gib=90.0,
                    tflops=400.0,
                    ceiling_tflops=700.0,
                    world_size=2,
                    device="NVIDIA H200",
                    rep_ms=rep,
                    warmup_ms=warmup,
                ),
            ]
        ).to_csv(tmp_path / "leaderboard_8b.csv", index=False)
        return build("leaderboard.2026", Results(tmp_path))

    handout = answer(30000, 10000)
    assert "4,500.0 ms" in handout.text and "rep=30000, warmup=10000)`, as the handout times it" in handout.text
    assert "0.804×" in handout.text and not handout.caveat
    shorter = answer(3000, 500)
    assert "rep=3000, warmup=500)`, shorter than the handout's" in shorter.text


def test_leaderboard_answer_reads_the_latest_command_run_and_compares_only_within_a_run(tmp_path):
    """The command table gains a row per run (`tools/leaderboard_8b_two_gpus.py --append-json`): the answer
    leads with the latest uncapped run of our step, takes its torch-native ratio only from one run (one commit),
    and states the capped run (an 80 GB card simulated) apart, not as the leaderboard time."""
    from cs336_systems.experiments.answers import Results, build

    def row(variant, ms, commit, cap=None, recomputed=None):
        return dict(
            variant=variant, batch=1, world_size=2, layers=34, ms=ms, peak_gib=100.0, device="NVIDIA H200",
            seconds_to_first_timed_step=60.0, blocks_recomputed=recomputed, memory_cap_gib=cap, commit=commit,
            status="ok",
        )  # fmt: skip

    pd.DataFrame(
        [
            row("ours", 4600.0, "aaa"),
            row("torch_native", 5750.0, "aaa"),
            row("ours", 4500.0, "bbb", recomputed=7),
            row("ours", 5000.0, "bbb", cap=78.0, recomputed=29),
        ]
    ).to_csv(tmp_path / "leaderboard_8b_two_gpus_command.csv", index=False)
    answer = build("leaderboard.2026", Results(tmp_path))
    assert "**4,500.0 ms**" in answer.text  # the latest uncapped run, not the capped one
    assert "0.800×" in answer.text and "in an earlier run of both" in answer.text  # 4600 / 5750, never 4500 / 5750
    assert "0.783×" not in answer.text
    assert "capped at 78 GiB" in answer.text
    assert "recomputes 29 of 34 blocks and the step takes 5,000.0 ms" in answer.text
    assert "1.11× an uncapped command run of the same code (4,500.0 ms, 7 blocks recomputed)." in answer.text
    two = "two NVIDIA H200s"
    assert list(answer.table.run) == [f"{two}, {run}" for run in ("latest run", "earlier run", "earlier run")] + [
        f"{two}, capped at 78 GiB"
    ]


def test_leaderboard_answer_from_the_notebooks_run_keeps_the_capped_command_run(tmp_path):
    """Where the notebook itself ran on two GPUs, its rows lead (their recompute counts read from its two-GPU
    plans), and a capped command run beside it is still stated, apart, against the uncapped run of its own code."""
    from cs336_systems.experiments.answers import Results, build

    def step(variant, ms):
        return dict(
            variant=variant, step_ms=ms, peak_gib=120.0, tflops=500.0, ceiling_tflops=700.0, world_size=2,
            device="NVIDIA H200", rep_ms=30000, warmup_ms=10000,
        )  # fmt: skip

    pd.DataFrame([step("torch_native", 5600.0), step("ours", 4480.0)]).to_csv(
        tmp_path / "leaderboard_8b.csv", index=False
    )
    plan = lambda n: str([True] * n + [False] * (34 - n))  # noqa: E731
    pd.DataFrame(
        [dict(variant="torch_native", world_size=2, plan=plan(34)), dict(variant="ours", world_size=2, plan=plan(8))]
    ).to_csv(tmp_path / "leaderboard_8b_two_gpus.csv", index=False)
    command = dict(batch=1, world_size=2, layers=34, device="NVIDIA H200", status="ok", commit="ccc", variant="ours")
    pd.DataFrame(
        [
            dict(command, ms=4520.0, peak_gib=127.0, blocks_recomputed=7),
            dict(command, ms=4972.0, peak_gib=68.0, blocks_recomputed=29, memory_cap_gib=78.0),
        ]
    ).to_csv(tmp_path / "leaderboard_8b_two_gpus_command.csv", index=False)
    answer = build("leaderboard.2026", Results(tmp_path))
    assert "**4,480.0 ms**" in answer.text and "0.800×" in answer.text and not answer.caveat
    assert "as the handout times it; its memory plan recomputes 8 of 34 blocks." in answer.text
    assert "recomputes 29 of 34 blocks and the step takes 4,972.0 ms" in answer.text
    assert "1.10× an uncapped command run of the same code (4,520.0 ms, 7 blocks recomputed)." in answer.text
    two = "two NVIDIA H200s"
    assert list(answer.table.run) == [f"{two}, latest run", f"{two}, latest run", f"{two}, capped at 78 GiB"]
    assert list(answer.table["blocks recomputed"][:2]) == [8, 34]


def test_leaderboard_answer_leads_with_command_runs_made_after_the_notebooks(tmp_path):
    """Command runs dated after the notebook's own run (runs.json) are later code: the answer leads with the
    latest of them and its same-run torch-native ratio, and says what the notebook's run took; command runs
    from before it leave the notebook's rows in the lead."""
    import json

    from cs336_systems.experiments.answers import Results, build

    folder = tmp_path / "results"
    folder.mkdir()
    (tmp_path / "runs.json").write_text(json.dumps([dict(name="20_leaderboard_8b", date="2026-11-27 11:33 UTC")]))
    step = dict(peak_gib=120.0, tflops=500.0, ceiling_tflops=700.0, world_size=2, device="NVIDIA H200")
    pd.DataFrame(
        [dict(step, variant="torch_native", step_ms=5616.1), dict(step, variant="ours", step_ms=4513.1)]
    ).to_csv(folder / "leaderboard_8b.csv", index=False)
    command = dict(batch=1, world_size=2, layers=34, device="NVIDIA H200", status="ok", peak_gib=130.0)

    def answer(date):
        pd.DataFrame(
            [
                dict(command, variant="ours", ms=4438.2, blocks_recomputed=2, commit="ddd", date=date),
                dict(command, variant="torch_native", ms=5689.0, blocks_recomputed=34, commit="ddd", date=date),
            ]
        ).to_csv(folder / "leaderboard_8b_two_gpus_command.csv", index=False)
        return build("leaderboard.2026", Results(folder))

    later = answer("2026-11-27 16:37 UTC")
    assert "**4,438.2 ms**" in later.text and "recomputes 2 of 34 blocks" in later.text
    assert "0.780×" in later.text and "the notebook's own two-GPU run took 4,513.1 ms" in later.caveat
    earlier = answer("2026-11-27 09:00 UTC")
    assert "**4,513.1 ms**" in earlier.text and "0.804×" in earlier.text and not earlier.caveat


def test_a_hand_run_result_joins_the_command_table(tmp_path):
    """`--append-json` adds a `leaderboard_8b --json` result as a row naming its command, cap and caches."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("two_gpus", root / "tools" / "leaderboard_8b_two_gpus.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    result = dict(
        variant="ours", batch=1, world_size=2, layers=34, context=32768, params=8, ms=5000.0, rep_ms=30000,
        warmup_ms=10000, peak_gib=67.8, useful_tflops=500.0, seconds_to_first_timed_step=64.0, memory_gib=78.0,
        plan=[True] * 29 + [False] * 5, attention_kept=True, device="NVIDIA H200",
    )  # fmt: skip
    table = tmp_path / "leaderboard_8b_two_gpus_command.csv"
    # short hashes that read as numbers (digits and one "e" as a float, all digits as an int) stay the text they are
    tool.append_result(table, dict(result, memory_gib=None), "4601e70", empty_caches=True).to_csv(table, index=False)
    rows = tool.append_result(table, result, "1234567", empty_caches=False)
    assert len(rows) == 2 and list(rows.commit) == ["4601e70", "1234567"]
    rows.to_csv(table, index=False)
    from cs336_systems.experiments.answers import Results

    assert list(Results(tmp_path).table("leaderboard_8b_two_gpus_command").commit) == ["4601e70", "1234567"]
    assert "empty caches" in rows.command[0] and "--memory-gib" not in rows.command[0]
    assert "--memory-gib 78 (rep 30000" in rows.command[1] and "empty caches" not in rows.command[1]
    assert rows.memory_cap_gib.isna()[0] and rows.memory_cap_gib[1] == 78.0
    assert list(rows.blocks_recomputed) == [29, 29]


def test_leaderboard_answer_names_the_slower_gpus_clock_where_the_run_recorded_it(tmp_path):
    """A run that recorded its GPUs' clocks (the command's `GpuTelemetry`) gets a sentence with the slower GPU's
    median SM clock and the share of samples at the power cap; a run without them gets none."""
    from cs336_systems.experiments.answers import Results, build

    def row(variant, ms, clock=None, capped=None):
        return dict(
            variant=variant, batch=1, world_size=2, layers=34, ms=ms, peak_gib=100.0, device="NVIDIA H200",
            commit="aaa", status="ok", sm_mhz=clock, power_capped=capped,
        )  # fmt: skip

    table = tmp_path / "leaderboard_8b_two_gpus_command.csv"
    pd.DataFrame([row("ours", 4400.0, 1560.0, 1.0), row("torch_native", 5600.0, 1575.0, 1.0)]).to_csv(table)
    text = build("leaderboard.2026", Results(tmp_path)).text
    assert "the slower GPU's SM clock was 1,560 MHz" in text and "in 100% of the samples" in text
    pd.DataFrame([row("ours", 4400.0), row("torch_native", 5600.0)]).to_csv(table)
    assert "SM clock" not in build("leaderboard.2026", Results(tmp_path)).text


def test_leaderboard_answer_states_the_one_gpu_runs_refusal_and_ratio(tmp_path):
    """The one-GPU command runs (`--one-gpu`): an 80 GB card's refusal with its need and budget, ours on the
    layers it names beside the torch-native step's out-of-memory, and a card that holds the whole model
    compared with the torch-native step of its own run; the per-layer difference explained by what the rows
    hold (blocks recomputed, clocks). The states offloaded are named where the command ran so."""
    from cs336_systems.experiments.answers import Results, build

    def row(variant, ms, world=2, status="ok", **kw):
        return dict(
            variant=variant, batch=1, world_size=world, layers=34, ms=ms, peak_gib=100.0, device="NVIDIA H200",
            commit="4601e70", status=status, command=f"... --variant {variant} --offload-states (rep 30000 ...)",
        ) | kw  # fmt: skip

    pd.DataFrame([row("ours", 4300.0, blocks_recomputed=0), row("torch_native", 5600.0)]).to_csv(
        tmp_path / "leaderboard_8b_two_gpus_command.csv", index=False
    )
    h100 = dict(device="NVIDIA H100 80GB HBM3", commit="be7e5ab")
    one = [
        row("ours", float("nan"), 1, "does not fit", need_gib=75.47, budget_gib=73.51, fits_layers=32, **h100),
        row("ours", 4740.0, 1, layers=32, blocks_recomputed=16, sm_mhz=1455.0, **h100),
        row("torch_native", float("nan"), 1, "failed", layers=32, note="OutOfMemoryError: CUDA out of memory", **h100),
        row("ours", 4350.0, 1, commit="be7e5ab", blocks_recomputed=0, sm_mhz=1560.0),
        row("torch_native", 5600.0, 1, commit="be7e5ab"),
    ]  # fmt: skip
    pd.DataFrame(one).to_csv(tmp_path / "leaderboard_8b_one_gpu_command.csv", index=False)
    answer = build("leaderboard.2026", Results(tmp_path))
    text = answer.text
    assert "AdamW's states waiting in host memory" in text
    assert "needs at least 75.5 GiB against its budget of 73.5 GiB (what the process can still get less a 5 GiB" in text
    assert "on 32 of its 34 layers" in text
    assert "takes 4,740.0 ms (16 of 32 blocks recomputed" in text and "32 layers runs out of memory" in text
    assert "5,600.0 ms in the same run: 0.777×" in text
    assert "recomputes 16 blocks, a second forward each, and its SM clock held at 1,455 MHz" in text
    assert "ours (does not fit)" in set(answer.table.variant) and "torch_native (failed)" in set(answer.table.variant)


def test_leaderboard_answer_names_the_previous_run_of_the_same_command(tmp_path):
    """Beside the latest run's clock, the run of the same command (flags and do_bench settings) before it,
    from another commit, with its time and clock; a run of another command (here the states on the GPU) is not
    that run."""
    from cs336_systems.experiments.answers import Results, build

    def row(variant, ms, commit, clock, flag=" --offload-states"):
        command = f"torchrun ... --variant {variant}{flag if variant == 'ours' else ''} (rep 30000, commit {commit})"
        return dict(
            variant=variant, batch=1, world_size=2, layers=34, ms=ms, peak_gib=100.0, device="NVIDIA H200",
            commit=commit, status="ok", sm_mhz=clock, power_capped=1.0, command=command,
        )  # fmt: skip

    rows = [row("ours", 4350.0, "aaa", 1545.0, " --no-offload-states"), row("torch_native", 5600.0, "aaa", 1560.0)]
    rows += [row("ours", 4300.0, "bbb", 1560.0), row("torch_native", 5620.0, "bbb", 1560.0)]
    rows += [row("ours", 4343.0, "ccc", 1515.0), row("torch_native", 5671.0, "ccc", 1560.0)]
    pd.DataFrame(rows).to_csv(tmp_path / "leaderboard_8b_two_gpus_command.csv", index=False)
    text = build("leaderboard.2026", Results(tmp_path)).text
    assert "**4,343.0 ms**" in text
    assert "The previous run of the same command took 4,300.0 ms, its slower GPU at 1,560 MHz." in text
    answer, clocks = text.split("\n\n")  # the answer in its own paragraph, what varies it in the next
    assert "**4,343.0 ms**" in answer and "0.766×" in answer and "MHz" not in answer
    assert clocks.startswith("While it was timed")
    assert "bbb" not in text  # commits belong in the tables, not the prose
    pd.DataFrame(rows[:2] + rows[4:]).to_csv(tmp_path / "leaderboard_8b_two_gpus_command.csv", index=False)
    assert "The previous run of the same command" not in build("leaderboard.2026", Results(tmp_path)).text


def test_leaderboard_answer_from_the_notebooks_run_reads_its_states_clocks_and_names_the_command_run(tmp_path):
    """The notebook's own two-GPU run leads with what it recorded beside its time (states in host memory, each
    GPU's clock and power-cap share): the slower GPU's clock, the states' clause, and the latest command run of
    the same configuration (offloaded like it; a run with the states on the GPU is another configuration)."""
    from cs336_systems.experiments.answers import Results, build

    step = dict(peak_gib=118.0, tflops=580.0, ceiling_tflops=690.0, world_size=2, device="NVIDIA H200")
    step.update(rep_ms=30000, warmup_ms=10000)
    pd.DataFrame(
        [dict(step, variant="torch_native", step_ms=5668.8), dict(step, variant="ours", step_ms=4344.6)]
    ).to_csv(tmp_path / "leaderboard_8b.csv", index=False)
    plan = lambda n: str([True] * n + [False] * (34 - n))  # noqa: E731
    notebook = dict(world_size=2, power_capped_by_gpu="[1.0, 0.5]")
    native = dict(notebook, variant="torch_native", plan=plan(34), states_offloaded=False)
    ours = dict(notebook, variant="ours", plan=plan(0), states_offloaded=True)
    pd.DataFrame([dict(native, sm_mhz_by_gpu="[1590.0, 1560.0]"), dict(ours, sm_mhz_by_gpu="[1575.0, 1545.0]")]).to_csv(
        tmp_path / "leaderboard_8b_two_gpus.csv", index=False
    )
    command = dict(batch=1, world_size=2, layers=34, device="NVIDIA H200", status="ok", peak_gib=118.0, variant="ours")

    def run(ms, clock, flag, commit):
        return dict(
            command, ms=ms, sm_mhz=clock, commit=commit, command=f"torchrun ... {flag} (rep 30000, empty caches)"
        )

    runs = [run(4342.9, 1515.0, "--offload-states", "aaa"), run(4356.8, 1560.0, "--no-offload-states", "bbb")]
    pd.DataFrame(runs).to_csv(tmp_path / "leaderboard_8b_two_gpus_command.csv", index=False)
    text = build("leaderboard.2026", Results(tmp_path)).text
    assert "**4,344.6 ms**" in text and "0.766×" in text
    assert "recomputes 0 of 34 blocks, AdamW's states waiting in host memory" in text
    assert "the slower GPU's SM clock was 1,545 MHz" in text and "in 100% of the samples" in text
    assert (
        "from empty compile caches), the same step took 4,342.9 ms in its latest run, its slower GPU at 1,515 MHz"
        in text
    )
    pd.DataFrame(runs[1:]).to_csv(tmp_path / "leaderboard_8b_two_gpus_command.csv", index=False)
    assert "Run on its own by the README's command" not in build("leaderboard.2026", Results(tmp_path)).text
