"""The training step of `cs336_systems.training` against the plain model, on CPU under the Triton
interpreter (conftest sets TRITON_INTERPRET=1), at a tiny size: vocab 97, d_model 32, 2 heads, d_ff 64,
3 layers, context 16, batch 2, fp32.

The reference is the same model's weights in a second TransformerLM with attention="naive",
`F.cross_entropy` on the full logits and torch.optim.AdamW. Tolerances (fp32 throughout):
- loss and gradients: rtol 1e-5, atol 1e-6. Both sides compute the same function in fp32 with
  different summation orders (tiled online-softmax attention, chunked loss with a Triton log-sum-exp):
  a few ulps (~1e-7 relative) per op, a few dozen ops deep, stays well under 1e-5;
- parameters after one AdamW step from the same gradients (ours copied into the reference's `.grad`):
  rtol 2.4e-7 (two fp32 ulps), atol 1e-7, with lr 1e-3. The two optimizers do the same fp32 arithmetic on the same inputs, possibly
  in another order: an update of size ~lr = 1e-3 differs by a few ulps (~1e-10), the parameters
  by at most a rounding or two. (Not from each side's own gradients: on the
  first step m/sqrt(v) = g/(|g|+eps), so a gradient of ~1e-8, comparable with eps, turns its 1e-5
  relative difference into an update difference of up to ~lr/2; one lm_head entry does that here);
- 50 training steps on one batch: the losses agree within 2e-4 relative with fp32 AdamW states, 2e-3
  with bf16 states (the test's docstring has the measured values). AdamW normalises the gradient, so
  small differences do not grow fast at lr 1e-2.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from cs336_systems.attention import FlashAttentionTriton
from cs336_systems.attention.naive import naive_attention
from cs336_systems.model import TransformerLM
from cs336_systems.training import (
    StepConfig,
    build_train_step,
    fixed_memory_bytes,
    measure_block_activation_bytes,
    plan_recompute,
    torch_native_step,
)
from cs336_systems.training.train_step import phase_times

VOCAB, D_MODEL, HEADS, D_FF, LAYERS, CONTEXT, BATCH = 97, 32, 2, 64, 3, 16, 2
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture
def small_tiles(monkeypatch):
    """16x16 Triton attention tiles (the context is 16); monkeypatch puts the class default back after."""
    monkeypatch.setattr(FlashAttentionTriton, "tiles", (16, 16))


def make_models(layers=LAYERS, seed=0):
    torch.manual_seed(seed)
    fast = TransformerLM(VOCAB, CONTEXT, D_MODEL, layers, HEADS, D_FF, attention="flash_triton")
    plain = copy.deepcopy(fast)
    for block in plain.layers:
        block.attn.attention = naive_attention
    return fast, plain


def batch(seed=1, seq=CONTEXT):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (BATCH, seq), generator=g)
    y = torch.randint(0, VOCAB, (BATCH, seq), generator=g)
    return x, y


def plain_loss(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def mixed_budget(fast, x):
    """A budget that keeps exactly one block's activations (the last) and recomputes the others."""
    h = fast.token_embeddings(x).detach()
    a = measure_block_activation_bytes(fast.layers[0], h)
    c = h.numel() * h.element_size()
    fixed = fixed_memory_bytes(fast, torch.float32, *x.shape)
    # cost(k) = fixed + k a + (n - k) c + a; one kept block fits, two do not
    return fixed + a + (LAYERS - 1) * c + a + (a // 2)


@pytest.mark.parametrize("recompute", ["all", "none", "mixed"])
def test_loss_and_gradients_match_plain_model(small_tiles, recompute):
    fast, plain = make_models()
    x, y = batch()
    if recompute == "mixed":
        config = StepConfig(recompute="plan", memory_budget_bytes=mixed_budget(fast, x))
    else:
        config = StepConfig(recompute=recompute)
    step = build_train_step(fast, config)
    loss = step.forward_backward(x, y)
    expected_plan = {"all": [True] * LAYERS, "none": [False] * LAYERS, "mixed": [True, True, False]}[recompute]
    assert step.plans[(BATCH, CONTEXT)] == expected_plan
    assert loss.dtype == torch.float32 and loss.dim() == 0 and not loss.requires_grad

    ref = plain_loss(plain, x, y)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=RTOL, atol=ATOL)
    for (name, p), (_, q) in zip(fast.named_parameters(), plain.named_parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")


def test_one_step_parameters_match_torch_adamw(small_tiles):
    fast, plain = make_models()
    x, y = batch()
    hyper = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    step = build_train_step(fast, StepConfig(**hyper, recompute="all"))
    reference = torch.optim.AdamW(plain.parameters(), **hyper)
    step.forward_backward(x, y)
    for p, q in zip(fast.parameters(), plain.parameters()):  # the same gradients on both sides
        q.grad = p.grad.clone()
    step.optimizer_step()
    reference.step()
    for (name, p), (_, q) in zip(fast.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(p, q, rtol=2.4e-7, atol=1e-7, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("state_dtype, rtol", [(torch.float32, 2e-4), (torch.bfloat16, 2e-3)], ids=["fp32", "bf16"])
def test_training_follows_plain_loss_curve(small_tiles, state_dtype, rtol):
    """50 steps on one batch (the loss falls from 4.7 to 0.004) follow the plain model's curve: with fp32
    AdamW states within rtol 2e-4 (measured at most 4.6e-5), with bf16 states stochastically rounded within
    2e-3 (measured at most 3.4e-4: 8-bit mantissas, unbiased rounding, so the error does not build up)."""
    fast, plain = make_models(layers=2)
    x, y = batch()
    hyper = dict(lr=1e-2, weight_decay=0.01)
    step = build_train_step(fast, StepConfig(**hyper, recompute="none", state_dtype=state_dtype))
    reference = torch.optim.AdamW(plain.parameters(), **hyper)
    ours, theirs = [], []
    for _ in range(50):
        ours.append(step.step(x, y).item())
        reference.zero_grad(set_to_none=True)
        loss = plain_loss(plain, x, y)
        loss.backward()
        reference.step()
        theirs.append(loss.item())
    assert theirs[-1] < theirs[0] / 100  # it does learn the batch
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=rtol, atol=0)


def test_torch_native_step_matches_plain_model():
    fast, plain = make_models(layers=2)
    for block in fast.layers:  # the baseline runs whatever attention the model has: naive here
        block.attn.attention = naive_attention
    x, y = batch()
    step = torch_native_step(fast, lr=1e-3)
    loss = step.step(x, y)
    ref = plain_loss(plain, x, y)
    torch.testing.assert_close(loss, ref.detach(), rtol=RTOL, atol=ATOL)


def test_plan_all_fit():
    assert plan_recompute(4, 100, 1000, 10_000) == [False] * 4


def test_plan_none_fit_raises():
    with pytest.raises(ValueError, match="fewer layers.*bigger GPU"):
        plan_recompute(4, 100, 1000, 1050, checkpoint_bytes=10)


def test_plan_only_recompute_fits():
    # fixed 1000 + 4 checkpoints of 10 + one transient block of 100 = 1140: nothing kept
    assert plan_recompute(4, 100, 1000, 1140, checkpoint_bytes=10) == [True] * 4


def test_plan_partial_keeps_last_blocks():
    # k kept: 1000 + 100 k + 10 (5 - k) + 100 <= 1420  ->  k <= 3
    assert plan_recompute(5, 100, 1000, 1420, checkpoint_bytes=10) == [True, True, False, False, False]


def test_cpu_plan_without_budget_keeps_all(small_tiles):
    fast, _ = make_models()
    step = build_train_step(fast, StepConfig(recompute="plan"))
    assert step.plan_for(batch()[0]) == [False] * LAYERS


def test_measure_block_activation_bytes_grows_with_seq():
    fast, _ = make_models()
    fast.layers[0].attn.attention = naive_attention
    sizes = []
    for seq in (4, 8, 16):
        h = torch.randn(BATCH, seq, D_MODEL)
        sizes.append(measure_block_activation_bytes(fast.layers[0], h))
    assert sizes[0] > 0 and sizes[0] < sizes[1] < sizes[2]


@pytest.mark.parametrize(
    "x, y, match",
    [
        (torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 7, dtype=torch.long), "same shape"),
        (torch.zeros(16, dtype=torch.long), torch.zeros(16, dtype=torch.long), r"\(batch, seq\)"),
        (torch.zeros(2, 8, dtype=torch.int32), torch.zeros(2, 8, dtype=torch.int32), "int64"),
        (torch.zeros(2, 32, dtype=torch.long), torch.zeros(2, 32, dtype=torch.long), "context_length"),
        (torch.full((2, 8), VOCAB, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long), "input token ids"),
        (torch.zeros(2, 8, dtype=torch.long), torch.full((2, 8), -1, dtype=torch.long), "target token ids"),
    ],
    ids=["shape-mismatch", "1d", "int32", "too-long", "x-out-of-range", "y-negative"],
)
def test_bad_inputs_raise(x, y, match):
    fast, _ = make_models(layers=1)
    step = build_train_step(fast, StepConfig(recompute="none"))
    with pytest.raises(ValueError, match=match):
        step.step(x, y)


def test_bad_config_raises():
    with pytest.raises(ValueError, match="recompute"):
        StepConfig(recompute="some")
    with pytest.raises(ValueError, match="state_dtype"):
        StepConfig(state_dtype=torch.float16)
    with pytest.raises(ValueError, match="loss must be one of"):
        StepConfig(loss="mse")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        StepConfig(optimizer="sgd")


def test_each_part_swaps_alone_and_the_step_shows_its_phases(small_tiles):
    """One change at a time (the optimisation record's rows): the fused loss with torch's AdamW, and the
    full-logits loss with ours, give the plain model's loss; a step shows the four phases to the profiler."""
    x, y = batch()
    for loss, optimizer in (("fused", "torch_adamw"), ("cross_entropy", "fused_adamw")):
        fast, plain = make_models(layers=2)
        step = build_train_step(fast, StepConfig(lr=1e-3, loss=loss, optimizer=optimizer))
        assert isinstance(step.optimizer, torch.optim.AdamW) == (optimizer == "torch_adamw")
        torch.testing.assert_close(step.step(x, y), plain_loss(plain, x, y).detach(), rtol=RTOL, atol=ATOL)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step.step(x, y)
    names = {e.name for e in prof.events()}
    assert {"forward", "loss", "backward", "optimizer"} <= names
    step.phase_marks = []
    step.step(x, y)
    times = phase_times(step.phase_marks)
    assert list(times) == ["forward", "loss", "backward", "optimizer"] and all(t > 0 for t in times.values())


def test_leaderboard_useful_flops_match_handout_figure():
    from cs336_systems.training.leaderboard_8b import CONTEXT, D_FF, D_MODEL, HEADS, LAYERS, VOCAB, useful_flops

    model = TransformerLM(VOCAB, CONTEXT, D_MODEL, LAYERS, HEADS, D_FF, device="meta")
    matmul_params = sum(p.numel() for p in model.parameters()) - model.token_embeddings.weight.numel()
    assert useful_flops(matmul_params, LAYERS, CONTEXT, CONTEXT) == pytest.approx(2.522e15, rel=1e-3)


def test_leaderboard_under_torchrun_needs_a_gpu_per_rank(monkeypatch):
    """Under torchrun the command runs data parallel (tests/test_train_step_data_parallel.py has the step);
    more ranks than GPUs is refused with the counts."""
    from cs336_systems.training import leaderboard_8b

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(SystemExit, match="WORLD_SIZE=4 but this machine has 2 GPU"):
        leaderboard_8b.main(["--layers", "1"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_leaderboard_needs_cuda(monkeypatch):
    from cs336_systems.training import leaderboard_8b

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit, match="CUDA"):
        leaderboard_8b.main(["--layers", "1"])
