"""The production reference: Hugging Face `LlamaForCausalLM` with our model's architecture.

Same shapes as TransformerLM: vocabulary 10,000, d_model, d_ff as the SwiGLU intermediate size,
layers, heads (no grouped-query attention), RMSNorm eps 1e-5, RoPE theta 10,000, no biases,
untied output head, SDPA attention. (Llama rotates the two halves of each head, ours rotates
interleaved pairs: the same cost.) The parameter count is checked against ours, so a mismatch
in architecture fails loudly instead of skewing the comparison.

It is stepped by the harness's own TrainingSetup (same batch, autocast, cross-entropy, AdamW and
ranges) through a thin module that returns the logits, so only the model differs.
`transformers` is optional (the `llama` extra): `transformers_available()` says whether it is installed,
and it is imported only when a Llama is built.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable

import torch
import torch.nn as nn

from cs336_systems.benchmarking.harness import BenchmarkConfig, TrainingSetup, compile_fresh, run_benchmark
from cs336_systems.model import ModelConfig, TransformerLM, count_parameters
from cs336_systems.optim import make_optimizer

INSTALL_HINT = "pip install -e '.[llama]' (make setup installs it)"


def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def require_transformers() -> None:
    """A clear error where the Llama reference is asked for and `transformers` is missing."""
    if not transformers_available():
        raise ImportError(
            f"the Llama reference needs the 'transformers' package, which is not installed: {INSTALL_HINT}"
        )


def llama_config(config: ModelConfig, attention: str = "sdpa"):
    """A transformers.LlamaConfig with the shapes of `config` (rope given the way the installed version takes it)."""
    require_transformers()
    from transformers import LlamaConfig

    kwargs = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        head_dim=config.d_model // config.num_heads,
        hidden_act="silu",
        max_position_embeddings=config.context_length,
        rms_norm_eps=1e-5,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        use_cache=False,
        attention_dropout=0.0,
    )
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": config.rope_theta}
    else:
        kwargs["rope_theta"] = config.rope_theta
    llama = LlamaConfig(**kwargs)
    llama._attn_implementation = attention
    return llama


class LlamaLogits(nn.Module):
    """token ids (batch, seq) -> logits (batch, seq, vocab), like TransformerLM."""

    def __init__(self, llama: nn.Module):
        super().__init__()
        self.llama = llama

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.llama(input_ids=token_ids, use_cache=False).logits


def build_llama(config: BenchmarkConfig, attention: str = "sdpa") -> TrainingSetup:
    """The harness's TrainingSetup around a LlamaForCausalLM of the same architecture as `config`'s model."""
    require_transformers()
    from transformers import LlamaForCausalLM

    config.validate()
    device = config.resolved_device()
    torch.manual_seed(config.seed)
    mcfg = config.model_config()
    llama = LlamaForCausalLM(llama_config(mcfg, attention)).to(device)
    ours = count_parameters(TransformerLM.from_config(mcfg, device="meta"))
    theirs = count_parameters(llama)
    if ours != theirs:
        raise ValueError(f"Llama reference has {theirs:,} parameters, TransformerLM {ours:,}: the architectures differ")
    model: nn.Module = LlamaLogits(llama)
    optimizer = make_optimizer(config.optimizer, model.parameters(), lr=1e-4) if config.mode == "train-step" else None
    if config.compile:
        model = compile_fresh(model, config.compile_scope)
    tokens = torch.randint(0, mcfg.vocab_size, (config.batch_size, config.context_length + 1), device=device)
    return TrainingSetup(config, model, optimizer, tokens[:, :-1], tokens[:, 1:], device, theirs)


def run_llama_benchmark(
    config: BenchmarkConfig, attention: str = "sdpa", then: Callable[[TrainingSetup], dict] | None = None
) -> dict:
    """One row like harness.run_benchmark's, for the Llama reference (model="llama")."""
    row = run_benchmark(config, builder=lambda c: build_llama(c, attention), then=then)
    return {**row, "model": "llama", "attention": attention}
