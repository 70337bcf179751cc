import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import cs336_systems.benchmarking.harness as harness
from cs336_systems.benchmarking import BenchmarkConfig, grid, run_benchmark, save_results, sweep

TINY = dict(size="nano", context_length=16, batch_size=2, warmup=1, steps=3, device="cpu")


@pytest.mark.parametrize("mode", ["forward", "forward-backward", "train-step"])
def test_run_benchmark_row_has_statistics(mode):
    row = run_benchmark(BenchmarkConfig(**TINY, mode=mode))
    assert row["status"] == "ok"
    assert len(row["step_times_ms"]) == 3 and len(row["warmup_times_ms"]) == 1
    times = row["step_times_ms"]
    assert row["mean_ms"] == pytest.approx(sum(times) / 3)
    mean = sum(times) / 3
    assert row["std_ms"] == pytest.approx((sum((t - mean) ** 2 for t in times) / 2) ** 0.5)
    assert row["parameters"] > 0


def test_train_step_changes_the_weights():
    setup = harness.build(BenchmarkConfig(**TINY, mode="train-step"))
    before = [p.detach().clone() for p in setup.model.parameters()]
    setup.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, setup.model.parameters()))


def test_every_compiled_configuration_is_compiled_however_many_came_before():
    # With the recompile limit at 1, a second configuration of the same forward() would run
    # eagerly if the first one's cache entry were still there.
    from torch._dynamo.utils import counters

    one_step = {**TINY, "warmup": 0, "steps": 1, "compile": True}
    configs = [BenchmarkConfig(**one_step), BenchmarkConfig(**one_step, mode="forward")]
    with torch._dynamo.config.patch(recompile_limit=1):
        for config in configs:
            before = counters["stats"]["unique_graphs"]
            assert run_benchmark(config)["status"] == "ok"
            assert counters["stats"]["unique_graphs"] > before, f"{config.mode} ran without a compiled graph"


def test_block_compilation_compiles_one_block_for_the_whole_stack():
    # Four identical blocks, one compiled graph per grad mode: the first block's code serves the
    # others. Were each block its own compilation, the limit of one entry would leave three eager.
    from torch._dynamo.utils import counters

    config = BenchmarkConfig(
        **{**TINY, "warmup": 0, "steps": 1}, model={"num_layers": 4}, compile=True, compile_scope="blocks"
    )
    eager = harness.build(replace(config, compile=False))
    setup = harness.build(config)
    assert setup.model is not None and not isinstance(setup.model, torch._dynamo.eval_frame.OptimizedModule)
    setup.model.load_state_dict(eager.model.state_dict())
    with torch._dynamo.config.patch(recompile_limit=1):
        counters.clear()
        loss = torch.nn.functional.cross_entropy(setup.model(setup.inputs).flatten(0, 1), setup.targets.flatten())
        loss.backward()
        assert counters["stats"]["unique_graphs"] == 1 and counters["frames"]["ok"] == 1
        assert not counters["recompiles"] and not counters["unimplemented"]
    expected = torch.nn.functional.cross_entropy(eager.model(eager.inputs).flatten(0, 1), eager.targets.flatten())
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown compile scope 'layers'"):
        run_benchmark(replace(config, compile_scope="layers"))
    with pytest.raises(ValueError, match="Linear has no ModuleList of identical blocks"):
        harness.compile_fresh(torch.nn.Linear(2, 2), "blocks")


def test_then_runs_on_the_setup_that_was_timed_and_adds_to_the_row():
    seen = []
    row = run_benchmark(BenchmarkConfig(**TINY), then=lambda setup: seen.append(setup) or {"extra_ms": 1.5})
    assert row["extra_ms"] == 1.5 and len(seen) == 1 and row["parameters"] == seen[0].num_parameters
    calls = []
    row = run_benchmark(BenchmarkConfig(**TINY), builder=lambda c: calls.append(c) or harness.build(c))
    assert row["status"] == "ok" and len(calls) == 1


def test_optimizer_choice_is_validated_and_used():
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        run_benchmark(BenchmarkConfig(**TINY, mode="train-step", optimizer="sgd"))
    for name, kind in [("adamw", "AdamW"), ("adamw-foreach", "AdamW"), ("torch-adamw-fused", "AdamW")]:
        setup = harness.build(BenchmarkConfig(**TINY, mode="train-step", optimizer=name))
        assert type(setup.optimizer).__name__ == kind
        assert bool(setup.optimizer.defaults.get("foreach")) == (name == "adamw-foreach")
        assert bool(setup.optimizer.defaults.get("fused")) == (name == "torch-adamw-fused")
        setup.step()


def test_time_steps_synchronizes_after_every_step(monkeypatch):
    calls = []
    monkeypatch.setattr(harness, "synchronize", lambda device: calls.append(device))
    harness.time_steps(lambda: None, warmup=2, steps=3, device=torch.device("cpu"))
    assert len(calls) == 5


def test_out_of_memory_becomes_a_row_and_the_sweep_goes_on(monkeypatch):
    real_build = harness.build

    def build_that_runs_out_of_memory(config):
        if config.context_length == 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_build(config)

    monkeypatch.setattr(harness, "build", build_that_runs_out_of_memory)
    df = sweep(grid(BenchmarkConfig(**TINY), context_length=[16, 32]), progress=False)
    assert df.status.tolist() == ["ok", "OOM"]
    assert df.mean_ms.notna().tolist() == [True, False]


def test_other_errors_are_not_swallowed(monkeypatch):
    monkeypatch.setattr(harness, "build", lambda config: (_ for _ in ()).throw(KeyError("bug")))
    with pytest.raises(KeyError):
        run_benchmark(BenchmarkConfig(**TINY))


def test_bad_configurations_raise_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="unknown model size 'gigantic'"):
        run_benchmark(BenchmarkConfig(**{**TINY, "size": "gigantic"}))
    with pytest.raises(ValueError, match="context length 64 is above the model's context_length 32"):
        run_benchmark(BenchmarkConfig(**{**TINY, "context_length": 64}, model_context_length=32))
    monkeypatch.setattr(harness, "bf16_supported", lambda device: False)
    with pytest.raises(ValueError, match="bf16 was requested but device cpu does not support bfloat16"):
        run_benchmark(BenchmarkConfig(**TINY, precision="bf16"))


def test_results_are_saved_with_their_configuration(tmp_path):
    df = sweep([BenchmarkConfig(**TINY)], progress=False)
    csv = save_results(df, tmp_path / "run", machine="test")
    payload = json.loads((tmp_path / "run.json").read_text())
    assert csv.exists() and payload["metadata"]["machine"] == "test"
    assert payload["rows"][0]["size"] == "nano" and payload["rows"][0]["context_length"] == 16


def test_cli_prints_the_row():
    cmd = [
        sys.executable,
        "-m",
        "cs336_systems.benchmarking",
        "--size",
        "nano",
        "--context-length",
        "16",
        "--batch-size",
        "2",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--device",
        "cpu",
        "--json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["status"] == "ok" and row["size"] == "nano" and row["mean_ms"] > 0


def test_cli_reports_bad_input():
    cmd = [sys.executable, "-m", "cs336_systems.benchmarking", "--size", "nope", "--device", "cpu"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown model size 'nope'" in out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--context-length", "-5"], "argument --context-length: must be a positive integer, got '-5'"),
        (["--batch-size", "0"], "argument --batch-size: must be a positive integer, got '0'"),
        (["--steps", "0"], "argument --steps: must be a positive integer, got '0'"),
        (["--warmup", "-1"], "argument --warmup: must be a non-negative integer, got '-1'"),
        (["--checkpoint-every", "0"], "argument --checkpoint-every: must be a positive integer, got '0'"),
        (["--device", "meta"], "argument --device: meta tensors hold no data"),
        (["--device", "cuda"], "argument --device: cuda was asked for but torch sees no CUDA device"),
        (["--device", "cuda:7"], "argument --device: cuda was asked for but torch sees no CUDA device"),
        (["--device", "gpu"], "argument --device: 'gpu' is not a device"),
    ],
)
def test_cli_rejects_bad_arguments_by_name(monkeypatch, capsys, args, message):
    from cs336_systems.benchmarking.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exited:
        main(["--size", "nano", "--context-length", "16", "--batch-size", "1", "--warmup", "0", "--steps", "1", *args])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_accepts_a_cuda_device_index_only_below_the_device_count(monkeypatch, capsys):
    from cs336_systems.benchmarking.cli import parse_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parse_args(["--device", "cuda:1"]).device == "cuda:1" and parse_args(["--device", "cuda"]).device == "cuda"
    with pytest.raises(SystemExit):
        parse_args(["--device", "cuda:2"])
    assert "argument --device: cuda:2 is not one of the 2 CUDA devices torch sees" in capsys.readouterr().err


def test_compile_comparison_builds_and_compiles_each_model_once_for_all_modes(monkeypatch):
    import cs336_systems.benchmarking.compiled as compiled

    builds, compiles = [], []
    real_build = harness.build
    monkeypatch.setattr(compiled, "build", lambda config: builds.append(config) or real_build(config))
    monkeypatch.setattr(harness, "compile_fresh", lambda model, scope: compiles.append(scope) or model)
    table = compiled.compile_comparison(BenchmarkConfig(**TINY), ["nano"], progress=False)
    assert table["mode"].tolist() == list(harness.MODES)
    assert (table.status == "ok").all() and table.speedup.gt(0).all()
    assert [c.compile for c in builds] == [False, True] and compiles == ["model"]
    assert (table.scope == "model").all() and table.compiled_first_call_s.gt(0).all()
    assert all(c.mode == "train-step" for c in builds)  # one optimizer, made for the train step


def test_compile_comparison_measures_the_vanilla_steps_regime(monkeypatch):
    """Each vanilla (size, mode) is probed once after its timed steps (busy share, graphed step), the
    compiled model never; the table carries the vanilla step's busy share and regime."""
    import cs336_systems.benchmarking.compiled as compiled

    probed = []

    def probe():
        def then(setup):
            probed.append((setup.config.mode, setup.config.compile))
            return dict(busy_ms=0.5 * 1.0, busy_on="CPU operators", profiled_ms=1.0, graphed_ms=float("nan"))

        return then

    monkeypatch.setattr(compiled, "launch_probe", probe)
    table = compiled.compile_comparison(BenchmarkConfig(**TINY), ["nano"], progress=False)
    assert probed == [(mode, False) for mode in harness.MODES]
    assert table.busy_fraction.tolist() == [0.5] * len(harness.MODES)
    assert table.regime.notna().all()
    plain = compiled.compile_comparison(BenchmarkConfig(**TINY), ["nano"], progress=False, probe=False)
    assert "regime" not in plain and len(probed) == len(harness.MODES)


def test_time_modes_keeps_an_out_of_memory_mode_as_a_row(monkeypatch):
    import cs336_systems.benchmarking.compiled as compiled

    real_step = harness.TrainingSetup.step

    def step(self):
        if self.config.mode == "forward-backward":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        real_step(self)

    monkeypatch.setattr(harness.TrainingSetup, "step", step)
    rows = compiled.time_modes(BenchmarkConfig(**TINY), harness.MODES)
    assert [(r["mode"], r["status"]) for r in rows] == [
        ("forward", "ok"),
        ("forward-backward", "OOM"),
        ("train-step", "ok"),
    ]
