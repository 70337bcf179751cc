"""The analytic memory model (accounting/memory.py) and FLOP counts (accounting/flops.py), checked
against hand-computed numbers and against memory measured on CPU (saved-tensor hooks, profiler)."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.accounting.flops import attention_flops, forward_flops, matmul_parameter_count, mfu, model_flops
from cs336_systems.accounting.memory import (
    batch_bytes,
    block_saved_tensors,
    memory_estimate,
    parameter_count,
    residual_stream_bytes,
    saved_activation_bytes,
)
from cs336_systems.benchmarking import BenchmarkConfig, autocast_context
from cs336_systems.model import ModelConfig, TransformerLM, count_parameters, cross_entropy
from cs336_systems.profiling.peak_memory import count_saved_tensors, measure_peak_memory

SMALL = 128_625_408


def test_parameter_bytes_of_small_by_hand():
    small = ModelConfig.from_size("small")
    assert parameter_count(small) == SMALL
    est = memory_estimate(small, batch=4, context=256, mode="train-step")
    assert est["parameters"] == SMALL * 4
    assert est["gradients"] == SMALL * 4
    assert est["optimizer_state"] == 2 * SMALL * 4  # AdamW's m and v
    assert memory_estimate(small, 4, 256, mode="forward-backward")["optimizer_state"] == 0


@pytest.mark.parametrize("size", ["nano", "tiny", "medium", "2.7B"])
def test_parameter_count_matches_the_model(size):
    config = ModelConfig.from_size(size)
    assert parameter_count(config) == count_parameters(TransformerLM.from_config(config, device="meta"))


def test_residual_stream_size_by_hand():
    # 2.7B, batch 4, context 512, fp32: 4 * 512 * 2560 * 4 bytes = 20 MiB
    assert residual_stream_bytes(4, 512, 2560) == 20 * 2**20
    assert residual_stream_bytes(4, 2048, 1600, bytes_per_element=2) == 4 * 2048 * 1600 * 2


def test_block_activations_by_hand():
    # B=2, S=16, d=32, H=4, F=48 fp32: 4 (10 BSd + 2 BS + 2 S d_h + 2 BHS + 3 BHS^2 + 5 BSF) + S^2
    c = ModelConfig(vocab_size=100, context_length=16, d_model=32, num_layers=1, num_heads=4, d_ff=48)
    B, S, d, H, F = 2, 16, 32, 4, 48
    expected = (
        4 * (10 * B * S * d + 2 * B * S + 2 * S * (d // H) + 2 * B * H * S + 3 * B * H * S * S + 5 * B * S * F) + S * S
    )
    assert block_saved_tensors(c, B, S)["bytes"].sum() == expected


def _measured_saved_bytes(config: ModelConfig, batch: int, precision: str) -> int:
    torch.manual_seed(0)
    model = TransformerLM.from_config(config)
    tokens = torch.randint(0, config.vocab_size, (batch, config.context_length + 1))
    with (
        count_saved_tensors(exclude=list(model.parameters())) as saved,
        autocast_context(precision, torch.device("cpu")),
    ):
        cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
    return saved.total_bytes


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("dims", [(100, 16, 32, 1, 4, 48, 2), (300, 24, 48, 2, 3, 80, 3)])
def test_saved_activations_match_autograd(precision, dims):
    vocab, context, d, layers, heads, d_ff, batch = dims
    c = ModelConfig(vocab_size=vocab, context_length=context, d_model=d, num_layers=layers, num_heads=heads, d_ff=d_ff)
    predicted = saved_activation_bytes(c, batch, context, precision, autocast_device="cpu") + batch_bytes(
        batch, context
    )
    assert predicted == _measured_saved_bytes(c, batch, precision)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_saved_activations_match_autograd_under_cuda_autocast():
    c = ModelConfig(vocab_size=300, context_length=24, d_model=48, num_layers=2, num_heads=3, d_ff=80)
    torch.manual_seed(0)
    model = TransformerLM.from_config(c, device="cuda")
    tokens = torch.randint(0, c.vocab_size, (3, 25), device="cuda")
    with count_saved_tensors(exclude=list(model.parameters())) as saved, autocast_context("bf16", torch.device("cuda")):
        cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
    assert saved.total_bytes == saved_activation_bytes(c, 3, 24, "bf16", autocast_device="cuda") + batch_bytes(3, 24)


@pytest.mark.parametrize(
    "mode, precision, model, context, batch, checkpoint_every",
    [
        ("forward", "fp32", {}, 32, 2, None),
        ("train-step", "fp32", {}, 32, 2, None),  # peak at the loss's backward (vocab 10k)
        ("forward-backward", "bf16", {}, 32, 2, None),
        ("train-step", "fp32", {"vocab_size": 50}, 128, 2, None),  # peak inside the top block's attention backward
        ("forward-backward", "fp32", {"vocab_size": 50}, 8, 1, None),  # peak at the end: gradients dominate
        ("forward-backward", "fp32", {"vocab_size": 300, "num_layers": 4}, 128, 2, 1),
        ("forward-backward", "fp32", {"vocab_size": 300, "num_layers": 4}, 128, 2, 2),
    ],
)
def test_peak_estimate_matches_cpu_measurement(mode, precision, model, context, batch, checkpoint_every):
    config = BenchmarkConfig(
        size="tiny",
        context_length=context,
        batch_size=batch,
        mode=mode,
        precision=precision,
        warmup=1,
        steps=1,
        device="cpu",
        model=model,
        checkpoint_every=checkpoint_every,
    )
    measured = measure_peak_memory(config)
    assert measured["status"] == "ok"
    predicted = memory_estimate(
        config.model_config(), batch, context, mode, precision, checkpoint_every=checkpoint_every, autocast_device="cpu"
    )
    assert predicted["peak"] == pytest.approx(measured["peak_bytes"], rel=0.02)


def test_checkpointing_keeps_one_residual_per_group():
    xl = ModelConfig.from_size("xl", context_length=2048)
    head = saved_activation_bytes(xl, 4, 2048, checkpoint_every=48) - residual_stream_bytes(4, 2048, 1600)
    for k, groups in [(1, 48), (5, 10), (48, 1)]:
        assert (
            saved_activation_bytes(xl, 4, 2048, checkpoint_every=k)
            == groups * residual_stream_bytes(4, 2048, 1600) + head
        )
    with pytest.raises(ValueError, match="not both"):
        memory_estimate(xl, 4, 2048, checkpoint_every=1, checkpoint_sublayers=1)


def test_bad_arguments():
    c = ModelConfig.from_size("tiny")
    with pytest.raises(ValueError, match="unknown mode"):
        memory_estimate(c, 1, 8, mode="inference")
    with pytest.raises(ValueError, match="unknown precision"):
        memory_estimate(c, 1, 8, precision="fp16")
    with pytest.raises(ValueError, match="batch and context must be positive"):
        memory_estimate(c, 0, 8)


def test_flops_by_hand():
    small = ModelConfig.from_size("small")
    n_mm = 12 * (4 * 768**2 + 3 * 768 * 3072) + 768 * 10_000
    assert matmul_parameter_count(small) == n_mm
    assert forward_flops(small, 4, 256) == 2 * n_mm * 4 * 256 + 4 * 12 * 4 * 256**2 * 768
    assert model_flops(small, 4, 256, "train-step") == 3 * forward_flops(small, 4, 256)
    parts = attention_flops(small, 4, 256)
    assert parts["computing attention scores"] == 2 * 4 * 12 * 256**2 * 64
    ratio = (parts["computing attention scores"] + parts["final matmul"]) / parts["computing softmax"]
    assert ratio == pytest.approx(4 * 64 / 5)
    assert mfu(1e12, 1.0, 2e12) == 0.5
