"""The Hugging Face Llama reference of notebook 08 has our architecture and steps like our model."""

import pytest
import torch

pytest.importorskip("transformers")

from transformers import LlamaForCausalLM  # noqa: E402

from cs336_systems.benchmarking import BenchmarkConfig  # noqa: E402
from cs336_systems.benchmarking.compiled import best_versus_llama  # noqa: E402
from cs336_systems.benchmarking.llama_reference import build_llama, llama_config, run_llama_benchmark  # noqa: E402
from cs336_systems.model import CPU_SIZES, HANDOUT_SIZES, ModelConfig, TransformerLM, count_parameters  # noqa: E402


@pytest.mark.parametrize("size", CPU_SIZES + HANDOUT_SIZES)
def test_llama_has_our_parameter_count_and_shapes(size):
    config = ModelConfig.from_size(size, context_length=256)
    with torch.device("meta"):
        llama = LlamaForCausalLM(llama_config(config))
    ours = TransformerLM.from_config(config, device="meta")
    assert count_parameters(llama) == count_parameters(ours)
    mlp = llama.model.layers[0].mlp
    assert (mlp.gate_proj.in_features, mlp.gate_proj.out_features) == (config.d_model, config.d_ff)
    assert len(llama.model.layers) == config.num_layers
    assert llama.lm_head.weight is not llama.model.embed_tokens.weight  # untied, like ours


def test_llama_train_step_returns_logits_and_updates_weights():
    config = BenchmarkConfig(
        size="nano", context_length=16, batch_size=2, warmup=0, steps=1, mode="train-step", device="cpu"
    )
    setup = build_llama(config)
    assert setup.model(setup.inputs).shape == (2, 16, config.model_config().vocab_size)
    before = [p.detach().clone() for p in setup.model.parameters()]
    setup.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, setup.model.parameters()))


def test_llama_stack_of_decoder_layers_is_what_block_compilation_compiles():
    from cs336_systems.benchmarking.harness import repeated_blocks

    setup = build_llama(
        BenchmarkConfig(
            size="nano",
            context_length=16,
            batch_size=2,
            mode="forward",
            device="cpu",
            model={"num_layers": 3},
            compile=True,
            compile_scope="blocks",
        )
    )
    blocks = repeated_blocks(setup.model)
    assert blocks is setup.model.llama.model.layers and len(blocks) == 3
    assert all(b._compiled_call_impl is not None for b in blocks)
    assert setup.model(setup.inputs).shape == (2, 16, 10_000)


def test_llama_benchmark_row_and_comparison():
    config = BenchmarkConfig(
        size="nano", context_length=16, batch_size=2, warmup=0, steps=2, mode="train-step", device="cpu"
    )
    row = run_llama_benchmark(config)
    assert row["status"] == "ok" and row["model"] == "llama" and len(row["step_times_ms"]) == 2
    summary, candidates = best_versus_llama(
        config, ["nano"], [16], ["naive", "sdpa"], ceiling_tflops=1.0, compile=False, progress=False
    )
    assert list(candidates.model) == ["ours", "ours", "llama"] and (candidates.status == "ok").all()
    r = summary.iloc[0]
    assert r.llama_status == "ok" and r.best_attention in {"naive", "sdpa"}
    assert r.ratio == pytest.approx(r.ours_ms / r.llama_ms) and r.passes == (r.ratio <= 0.8)


def test_best_configuration_is_ranked_eagerly_then_compiled_and_llama_compiled_where_asked():
    from cs336_systems.benchmarking.compiled import optimizer_comparison, step_phase_table

    config = BenchmarkConfig(size="nano", context_length=16, batch_size=2, warmup=1, steps=2, device="cpu")
    summary, candidates = best_versus_llama(
        config,
        ["nano"],
        [16],
        ["naive", "sdpa"],
        optimizer="adamw-foreach",
        compile=True,
        llama_compiled=[["nano", 16]],
        progress=False,
    )
    assert (candidates.status == "ok").all() and (candidates.optimizer == "adamw-foreach").all()
    assert list(zip(candidates.model, candidates["compile"])) == [
        ("ours", False),
        ("ours", False),
        ("ours", True),
        ("llama", False),
        ("llama", True),
    ]
    eager = candidates[(candidates.model == "ours") & ~candidates["compile"]]
    winner = eager.loc[eager.mean_ms.idxmin(), "attention"]
    r = summary.iloc[0]
    assert candidates.iloc[2].attention == winner == r.best_attention  # only the eager winner was compiled
    assert r.ours_ms == candidates.iloc[2].mean_ms and r.llama_compiled_ms == candidates.iloc[4].mean_ms
    assert r.ratio_vs_compiled == pytest.approx(r.ours_ms / r.llama_compiled_ms)
    assert list(candidates[candidates["compile"]].compile_scope) == [
        "blocks",
        "blocks",
    ]  # regional compilation, both models
    phases = step_phase_table(summary, candidates)
    assert list(phases.model.unique()) == ["ours (best)", "Llama eager", "Llama compiled"]
    assert (phases.groupby("model").phase.apply(list) == [["forward", "backward", "optimizer"]] * 3).all()
    assert (phases[["wall_ms", "compute_ms"]] > 0).all().all()
    ours_forward = phases[(phases.model == "ours (best)") & (phases.phase == "forward")].wall_ms.item()
    assert ours_forward == candidates.iloc[2].forward_wall_ms  # the compiled winner's profile, not an eager one's

    none_compiled, _ = best_versus_llama(
        config, ["nano"], [16], ["sdpa"], compile=True, llama_compiled=False, progress=False
    )
    assert "llama_compiled_ms" not in none_compiled

    optimizers = optimizer_comparison(config)
    assert (
        list(optimizers.optimizer) == ["adamw", "adamw-foreach", "torch-adamw-fused"]
        and (optimizers.status == "ok").all()
    )
    assert (optimizers.optimizer_compute_ms > 0).all()
