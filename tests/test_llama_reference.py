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
    config = BenchmarkConfig(size="nano", context_length=16, batch_size=2, warmup=0, steps=1, mode="train-step", device="cpu")
    setup = build_llama(config)
    assert setup.model(setup.inputs).shape == (2, 16, config.model_config().vocab_size)
    before = [p.detach().clone() for p in setup.model.parameters()]
    setup.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, setup.model.parameters()))


def test_llama_benchmark_row_and_comparison():
    config = BenchmarkConfig(size="nano", context_length=16, batch_size=2, warmup=0, steps=2, mode="train-step", device="cpu")
    row = run_llama_benchmark(config)
    assert row["status"] == "ok" and row["model"] == "llama" and len(row["step_times_ms"]) == 2
    summary, candidates = best_versus_llama(config, ["nano"], [16], ["naive", "sdpa"], ceiling_tflops=1.0, compile=False, progress=False)
    assert list(candidates.model) == ["ours", "ours", "llama"] and (candidates.status == "ok").all()
    r = summary.iloc[0]
    assert r.llama_status == "ok" and r.best_attention in {"naive", "sdpa"}
    assert r.ratio == pytest.approx(r.ours_ms / r.llama_ms) and r.passes == (r.ratio <= 0.8)
