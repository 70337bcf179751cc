"""The training step of `cs336_systems.training` against the plain model, on CPU under the Triton
interpreter (conftest sets TRITON_INTERPRET=1), at a tiny size: vocab 97, d_model 32, 2 heads, d_ff 64,
3 layers, context 16, batch 2, fp32.

The reference is the same model's weights in a second TransformerLM with attention="naive",
`F.cross_entropy` on the full logits and torch.optim.AdamW. Tolerances (fp32 throughout):
- loss and gradients: rtol 1e-5, atol 1e-6. Both sides compute the same function in fp32 with
  different summation orders (tiled online-softmax attention, chunked loss with a Triton log-sum-exp):
  a few ulps (~1e-7 relative) per op, a few dozen ops deep, stays well under 1e-5;
- parameters after one AdamW step from the same gradients (ours copied into the reference's `.grad`):
  rtol 2.4e-7 (two fp32 ulps), atol 1e-7, with lr 1e-3. The two optimizers do the same fp32 arithmetic on
  the same inputs, possibly in another order: an update of size ~lr = 1e-3 differs by a few ulps (~1e-10),
  the parameters by at most a rounding or two. (Not from each side's own gradients: on the
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

from cs336_systems.attention.api import DEFAULTS
from cs336_systems.attention.naive import naive_attention
from cs336_systems.model import TransformerLM
from cs336_systems.training import PlanDoesNotFit, StepConfig, build_train_step
from cs336_systems.training.memory_plan import (
    MemoryTerms,
    measure_block_activation_bytes,
    plan_recompute,
    recompute_cost,
    states_fetch_block,
)
from cs336_systems.training.step import phase_times, torch_native_step

VOCAB, D_MODEL, HEADS, D_FF, LAYERS, CONTEXT, BATCH = 97, 32, 2, 64, 3, 16, 2
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture
def small_tiles(monkeypatch):
    """16x16 Triton attention tiles (the context is 16); monkeypatch puts the class default back after."""
    monkeypatch.setattr(DEFAULTS, "tiles", (16, 16))


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


def mixed_budget(step, x, monkeypatch, keep_attention):
    """A budget with which the last block keeps its activations and the others recompute. At this tiny size
    the gradients outweigh the activations, so the measured block is made 1 MB (the plan is what is tested
    here; the measurement has its own test): then cost(1) fits and cost(2) does not."""
    from cs336_systems.training import memory_plan

    monkeypatch.setattr(memory_plan, "measure_block_memory", lambda block, h: (1 << 20, 0))
    return recompute_cost(LAYERS, 1, step.memory_terms(x, keep_attention), keep_attention)


def counted_attention_forwards(monkeypatch) -> list:
    """Patch the forward the kept-output attention runs; each call appends to the returned list."""
    from cs336_systems.training import kept_attention

    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return forward(*args, **kwargs)

    forward = kept_attention.flash_forward_with_route
    monkeypatch.setattr(kept_attention, "flash_forward_with_route", counting)
    return calls


@pytest.mark.parametrize("keep_attention", [True, False], ids=["keep_attention", "whole_blocks"])
@pytest.mark.parametrize("recompute", ["all", "none", "mixed"])
def test_loss_and_gradients_match_plain_model(small_tiles, monkeypatch, recompute, keep_attention):
    """Every gradient equals the plain model's whichever blocks recompute; with `keep_attention` the
    recomputed blocks run the attention forward once (their recompute reuses O and L), the others not at
    all through the keeper."""
    fast, plain = make_models()
    forwards = counted_attention_forwards(monkeypatch)
    x, y = batch()
    config = StepConfig(recompute="plan" if recompute == "mixed" else recompute, keep_attention=keep_attention)
    step = build_train_step(fast, config)
    if recompute == "mixed":
        step.config.memory_budget_bytes = mixed_budget(step, x, monkeypatch, keep_attention)
    loss = step.forward_backward(x, y)
    expected_plan = {"all": (True,) * LAYERS, "none": (False,) * LAYERS, "mixed": (True, True, False)}[recompute]
    plan = step.plans[(BATCH, CONTEXT)]
    assert plan.recompute == expected_plan
    assert plan.keep_attention == (keep_attention and recompute != "none")
    recomputed = sum(expected_plan) if plan.keep_attention else 0
    assert len(forwards) == recomputed, "one attention forward per recomputed block, none in its recompute"
    assert sorted(step.keepers) == [i for i, r in enumerate(expected_plan) if r and plan.keep_attention]
    assert all(k.reuses == 1 and k.kept is None for k in step.keepers.values())
    assert loss.dtype == torch.float32 and loss.dim() == 0 and not loss.requires_grad

    ref = plain_loss(plain, x, y)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=RTOL, atol=ATOL)
    for (name, p), (_, q) in zip(fast.named_parameters(), plain.named_parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("recompute", ["all", "none"])
def test_step_runs_our_model_through_its_final_hidden_states(small_tiles, monkeypatch, recompute):
    """The step does not walk our model itself: each forward is one call of the model's own
    `final_hidden_states`, given the plan's block runner, and the embedding, every block and the final norm run
    once in the forward, inside it. Loss and every gradient are the plain model's."""
    fast, plain = make_models()
    own = fast.final_hidden_states
    calls, inside = [], [False]

    def counting(token_ids, run_block=None):
        calls.append(run_block)
        inside[0] = True
        try:
            return own(token_ids, run_block=run_block)
        finally:
            inside[0] = False

    monkeypatch.setattr(fast, "final_hidden_states", counting)
    runs = {name: [] for name in ("token_embeddings", "ln_final", *(f"layers.{i}" for i in range(LAYERS)))}
    for name, runs_of in runs.items():
        fast.get_submodule(name).register_forward_hook(lambda *_, runs_of=runs_of: runs_of.append(inside[0]))
    x, y = batch()
    step = build_train_step(fast, StepConfig(recompute=recompute, keep_attention=True))
    loss = step.forward_backward(x, y)
    assert len(calls) == 1 and callable(calls[0])
    assert runs["token_embeddings"] == runs["ln_final"] == [True]
    for i in range(LAYERS):  # once in the forward (a checkpointed block's recompute comes in the backward)
        assert runs[f"layers.{i}"][:1] == [True] and runs[f"layers.{i}"].count(True) == 1

    ref = plain_loss(plain, x, y)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=RTOL, atol=ATOL)
    for (name, p), (_, q) in zip(fast.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")


def test_the_model_is_changed_in_one_place():
    """Compiling blocks, checkpointing them and swapping their attention function are written in
    `training/parallelize.py` alone: no other module of the step calls `.compile(...)` or `checkpoint(...)`
    or assigns an `.attention`."""
    import ast
    from pathlib import Path

    from cs336_systems import training

    found = {}
    for path in sorted(Path(training.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            called = node.func if isinstance(node, ast.Call) else None
            name = getattr(called, "attr", getattr(called, "id", None))
            assigned = [t.attr for t in getattr(node, "targets", []) if isinstance(t, ast.Attribute)]
            if name in ("compile", "checkpoint") or "attention" in assigned:
                found.setdefault(path.name, set()).add(name or "attention =")
    assert found == {"parallelize.py": {"compile", "checkpoint", "attention ="}}


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
    """25 steps on one batch (the loss falls from 4.7 to 0.002) follow the plain model's curve: with fp32
    AdamW states within rtol 2e-4 (measured at most 4.4e-5), with bf16 states stochastically rounded within
    2e-3 (measured at most 4.0e-4: 8-bit mantissas, unbiased rounding, so the error does not build up)."""
    fast, plain = make_models(layers=2)
    x, y = batch()
    hyper = dict(lr=2e-2, weight_decay=0.01)
    step = build_train_step(fast, StepConfig(**hyper, recompute="none", state_dtype=state_dtype))
    reference = torch.optim.AdamW(plain.parameters(), **hyper)
    ours, theirs = [], []
    for _ in range(25):
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


def plan(n, budget, **terms):
    return plan_recompute(n, MemoryTerms(**terms), budget)


def test_plan_all_fit():
    assert plan(4, 10_000, fixed=1000, block=100).recompute == (False,) * 4


def test_plan_none_fit_raises():
    with pytest.raises(PlanDoesNotFit, match="fewer layers.*bigger GPU") as err:
        plan(4, 1050, fixed=1000, block=100, checkpoint=10)
    # the cheapest plan: fixed, 3 checkpoints held while one block is rebuilt
    assert (err.value.need_bytes, err.value.budget_bytes, err.value.would_fit) == (1000 + 30 + 100, 1050, {})
    # whole through pickle (a worker process's error reaching its parent)
    import pickle

    again = pickle.loads(pickle.dumps(PlanDoesNotFit("no room", 5, 4, {"layers": 2})))
    assert (str(again), again.need_bytes, again.budget_bytes, again.would_fit) == ("no room", 5, 4, {"layers": 2})


def test_plan_keeping_one_block_can_cost_less_than_keeping_none():
    # cost(k) = max(1000 + 100 k + 10 (4 - k), 1000 + 10 (4 - k) + 100): k = 0 costs 1140, k = 1 costs 1130
    # (the kept block's activations are gone before any recompute), k = 2 costs 1220
    assert plan(4, 1140, fixed=1000, block=100, checkpoint=10).recompute == (True, True, True, False)
    assert plan(4, 1130, fixed=1000, block=100, checkpoint=10).kept_blocks == 1
    with pytest.raises(ValueError, match="does not fit its memory budget with any recompute plan"):
        plan(4, 1125, fixed=1000, block=100, checkpoint=10)


def test_plan_partial_keeps_last_blocks():
    # end of forward: 1000 - G + 100 k + 10 (5 - k) <= 1390  ->  k <= 3 with G = 0, k <= 4 with G = 90
    assert plan(5, 1390, fixed=1000, block=100, checkpoint=10).recompute == (True, True, False, False, False)
    assert plan(5, 1390, fixed=1000, block=100, checkpoint=10, backward_gradients=90).kept_blocks == 4
    # a transient is paid once, at the peak
    assert plan(5, 1390, fixed=1000, block=100, checkpoint=10, transient=90).kept_blocks == 2


def test_recompute_cost_is_the_later_of_two_moments():
    terms = MemoryTerms(fixed=1000, block=100, checkpoint=10, attention=5, backward_gradients=300, transient=7)
    # all kept: the end of the forward, before the backward's 300 bytes of gradients
    assert recompute_cost(4, 4, terms) == 1000 - 300 + 400 + 7
    # all recomputed, attention kept: a recomputed block's backward, the gradients made
    assert recompute_cost(4, 0, terms, keep_attention=True) == 1000 + 4 * 15 + 100 + 7


def test_plan_keeps_attention_outputs_first():
    # with o = 40 kept by each recomputed block: max(1000 + 100 k + 50 (5 - k), 1000 + 50 (5 - k) + 100)
    # <= 1300  ->  k = 1
    got = plan(5, 1300, fixed=1000, block=100, checkpoint=10, attention=40)
    assert got.recompute == (True, True, True, True, False) and got.keep_attention
    assert (got.kept_blocks, got.recomputed_blocks) == (1, 4)
    # without keeping them, 2 blocks would fit; the plan still keeps the outputs (more time per byte)
    assert plan(5, 1300, fixed=1000, block=100, checkpoint=10).kept_blocks == 2
    # with the outputs nothing fits 1200 (1300 at the least): whole-block recompute, one block kept
    got = plan(5, 1200, fixed=1000, block=100, checkpoint=10, attention=40)
    assert not got.keep_attention and got.kept_blocks == 1
    # everything kept: nothing recomputes, so nothing keeps attention outputs
    assert not plan(5, 10_000, fixed=1000, block=100, checkpoint=10, attention=40).keep_attention


def test_kept_attention_outside_the_step_is_the_plain_attention(small_tiles, monkeypatch):
    """After a step, the keepers left in the recomputed blocks hold nothing and the model computes what the
    plain model does (no stale output reused); a failed step leaves nothing kept either."""
    fast, plain = make_models()
    x, y = batch()
    step = build_train_step(fast, StepConfig(recompute="all"))
    step.forward_backward(x, y)
    assert len(step.keepers) == LAYERS
    x2 = batch(seed=5)[0]
    with torch.no_grad():
        torch.testing.assert_close(fast(x2), plain(x2), rtol=RTOL, atol=ATOL)

    from cs336_systems.training import step as step_module

    def failing_loss(*args, **kwargs):
        raise RuntimeError("loss failed")

    monkeypatch.setattr(step_module, "linear_cross_entropy", failing_loss)
    with pytest.raises(RuntimeError, match="loss failed"):
        step.forward_backward(x, y)
    assert all(k.kept is None and not k.armed for k in step.keepers.values())


def test_kept_attention_refuses_an_output_of_another_shape(small_tiles):
    from cs336_systems.training.kept_attention import KeptAttentionOutput

    keeper = KeptAttentionOutput(naive_attention)
    q = torch.randn(1, 2, 16, 16)
    keeper.arm()
    keeper(q, q, q, True)
    assert keeper.kept is not None and not keeper.armed
    with pytest.raises(RuntimeError, match="does not belong to this call"):
        keeper(q[:, :, :8], q[:, :, :8], q[:, :, :8], True)


def test_activation_memory_budget_is_set_while_the_blocks_run(small_tiles, monkeypatch):
    """The compiled blocks' partitioner budget is in force whenever a block runs in the step (where they
    compile and where the plan measures block 0), and only then. (The blocks are not compiled here: under
    the interpreter nothing compiles; what is tested is that the setting reaches them.)"""
    import torch._functorch.config as functorch_config

    fast, _ = make_models()
    seen = []
    for block in fast.layers:
        forward = block.forward
        monkeypatch.setattr(
            block,
            "forward",
            lambda h, forward=forward: seen.append(functorch_config.activation_memory_budget) or forward(h),
        )
    config = StepConfig(
        recompute="plan", memory_budget_bytes=1 << 40, compile_blocks=True, activation_memory_budget=0.5
    )
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: None)  # nothing compiles on the interpreter
    before = functorch_config.activation_memory_budget
    build_train_step(fast, config).forward_backward(*batch())
    assert seen and set(seen) == {0.5} and functorch_config.activation_memory_budget == before
    with pytest.raises(ValueError, match="activation_memory_budget must be in"):
        StepConfig(compile_blocks=True, activation_memory_budget=1.5)
    with pytest.raises(ValueError, match="compile_blocks=True"):
        StepConfig(activation_memory_budget=0.5)


def test_cpu_plan_without_budget_keeps_all(small_tiles):
    fast, _ = make_models()
    step = build_train_step(fast, StepConfig(recompute="plan"))
    assert step.plan_for(batch()[0]).recompute == (False,) * LAYERS


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


@pytest.mark.parametrize(
    "field, value, error, match",
    [
        ("lr", "0.1", TypeError, "StepConfig.lr must be a real number, got str"),
        ("lr", -1e-3, ValueError, "StepConfig.lr must be non-negative, got -0.001"),
        ("eps", None, TypeError, "StepConfig.eps must be a real number, got NoneType"),
        ("weight_decay", float("nan"), ValueError, "StepConfig.weight_decay must be non-negative, got nan"),
        ("betas", 0.9, TypeError, "StepConfig.betas must be a pair of floats, got 0.9"),
        ("betas", (0.9, 1.0), ValueError, r"StepConfig.betas\[1\] must be in \[0, 1\), got 1.0"),
        ("memory_budget_bytes", 1.5e9, TypeError, "StepConfig.memory_budget_bytes must be an int or None, got float"),
        ("loss_chunk_tokens", "4096", TypeError, "StepConfig.loss_chunk_tokens must be an int or None, got str"),
        ("bucket_size_mb", 0, ValueError, "StepConfig.bucket_size_mb must be positive, got 0"),
        ("compile_blocks", "yes", TypeError, "StepConfig.compile_blocks must be a bool, got str"),
        ("check_token_ids", None, TypeError, "StepConfig.check_token_ids must be a bool, got NoneType"),
        ("keep_attention", 1, TypeError, "StepConfig.keep_attention must be a bool, got int"),
        ("activation_memory_budget", "0.5", TypeError, "StepConfig.activation_memory_budget must be a real number"),
        ("offload_optimizer_states", "yes", TypeError, "StepConfig.offload_optimizer_states must be a bool, got str"),
    ],
    ids=[
        "lr-str",
        "lr-negative",
        "eps-none",
        "weight-decay-nan",
        "betas-float",
        "beta2-one",
        "budget-float",
        "chunk-str",
        "bucket-zero",
        "compile-str",
        "check-none",
        "keep-int",
        "activation-budget-str",
        "offload-str",
    ],
)
def test_bad_config_field_raises_naming_it(field, value, error, match):
    with pytest.raises(error, match=match):
        StepConfig(**{field: value})


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compile_blocks", [False, True], ids=["eager", "compiled"])
def test_gpu_kept_attention_matches_whole_block_recompute(compile_blocks):
    """bf16 on the GPU at d_head 128 (the 8B model's), every block recomputed: keeping attention's output
    gives the gradients whole-block recompute gives. The same kernels run on the same inputs (the kept O and
    L are the forward's, which the recompute would reproduce bit for bit); what may differ is the fusion a
    compiled block does around the keeper (it runs outside the graphs), so bf16 roundings of RoPE's and the
    projections' outputs: relative errors within 2e-2 (bf16 has 8 significant bits, 3.9e-3 per rounding)."""
    torch.manual_seed(0)
    models = [TransformerLM(1000, 1024, 512, 3, 4, 1024, attention="flash_triton", device="cuda", dtype=torch.bfloat16)]
    models.append(copy.deepcopy(models[0]))
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randint(0, 1000, (2, 1024), device="cuda", generator=g)
    y = torch.randint(0, 1000, (2, 1024), device="cuda", generator=g)
    losses = []
    for model, keep in zip(models, (True, False)):
        step = build_train_step(model, StepConfig(recompute="all", keep_attention=keep, compile_blocks=compile_blocks))
        losses.append(step.forward_backward(x, y))
        assert step.plans[(2, 1024)].keep_attention == keep
        assert all(k.reuses == 1 for k in step.keepers.values()) and len(step.keepers) == (3 if keep else 0)
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-3, atol=0)
    for (name, p), (_, q) in zip(models[0].named_parameters(), models[1].named_parameters()):
        err = (p.grad.float() - q.grad.float()).norm() / q.grad.float().norm()
        assert err <= 2e-2, f"{name}: relative error {err:.3g}"


def test_a_step_that_does_not_fit_names_what_would(monkeypatch):
    """With no plan within the budget the error names, from the plan's memory model, the layers, the context
    and the GPUs that would fit; building the step with the layers or the context it names then plans."""
    import re

    from cs336_systems.training import memory_plan

    monkeypatch.setattr(memory_plan, "measure_block_memory", lambda block, h: (h.shape[1] << 16, 0))
    fast, _ = make_models()
    x, _ = batch()
    config = StepConfig(recompute="plan")
    step = build_train_step(fast, config)
    budget = memory_plan.least_cost(LAYERS, step.memory_terms(x)) - 1  # one byte short of the cheapest plan
    config = StepConfig(recompute="plan", memory_budget_bytes=budget)
    with pytest.raises(ValueError, match="does not fit its memory budget") as err:
        build_train_step(fast, config).plan_for(x)
    message = str(err.value)
    layers = int(re.search(r"(\d+) of the 3 layers", message).group(1))
    context = int(re.search(r"a context of ([\d,]+) tokens", message).group(1).replace(",", ""))
    assert 1 <= layers < LAYERS and context < CONTEXT and "2 GPUs of this memory" in message
    fewer, _ = make_models(layers=layers)
    assert build_train_step(fewer, config).plan_for(x).recompute  # plans, no error
    shorter, _ = batch(seq=context)
    assert build_train_step(make_models()[0], config).plan_for(shorter).recompute


def test_the_refusal_names_bf16_states_only_where_the_states_are_fp32(monkeypatch):
    """Halving fp32 states is offered where it would fit; with bf16 states already it is not offered at all
    (the refusal used to name it whatever the states were). The refusal carries its numbers: the least need,
    the budget, and each change that would fit, which the message names."""
    from cs336_systems.training import memory_plan

    monkeypatch.setattr(memory_plan, "measure_block_memory", lambda block, h: (h.shape[1] << 16, 0))
    fast, _ = make_models()
    x, _ = batch()
    for dtype in (torch.float32, torch.bfloat16):
        terms = build_train_step(fast, StepConfig(state_dtype=dtype)).memory_terms(x)
        states = memory_plan.optimizer_state_bytes(fast, dtype, 1)
        budget = memory_plan.least_cost(LAYERS, terms) - 1  # one byte short: half the fp32 states fit
        config = StepConfig(state_dtype=dtype, memory_budget_bytes=budget)
        with pytest.raises(PlanDoesNotFit) as err:
            build_train_step(fast, config).plan_for(x)
        fits, message = err.value.would_fit, str(err.value)
        assert (err.value.need_bytes, err.value.budget_bytes) == (budget + 1, budget)
        assert fits.get("bf16_states", False) == (dtype == torch.float32) and states > 2
        assert ("bf16 optimizer states" in message) == (dtype == torch.float32)
        assert f"{fits['layers']} of the {LAYERS} layers" in message and f"a context of {fits['context']:,}" in message


def test_offloaded_states_count_out_of_the_forward_and_come_back_when_room_is_freed():
    # the end of the forward, 1000 + 100 k + 10 (8 - k) <= 1400: k = 3; with S = 250 away through the forward,
    # 250 less: k = 6. The end of the backward (fixed + a) is counted once they are back
    terms = dict(fixed=1000, block=100, checkpoint=10)
    assert plan(8, 1400, **terms).kept_blocks == 3
    offloaded = plan(8, 1400, **terms, offloaded=250)
    assert offloaded.kept_blocks == 6
    assert recompute_cost(8, 8, MemoryTerms(**terms, offloaded=1200)) == 1000 + 100
    # back once the blocks above have freed 250: 3 kept blocks of 100 (2 would free 200), so block 8-1-3
    assert offloaded.fetch_states_at == 4
    # each block's backward allocates G / n = 40 of gradients: 60 freed per block, 5 blocks, but only 6 kept
    assert plan(8, 1400, **terms, offloaded=250, backward_gradients=320).fetch_states_at == 2
    # needing more than the kept blocks free: right after them, where the recomputed blocks' term counts them
    assert states_fetch_block(8, 2, MemoryTerms(**terms, offloaded=350)) == 8 - 1 - 2
    assert states_fetch_block(8, 8, MemoryTerms(**terms, offloaded=5000)) == 0
    assert plan(8, 10_000, **terms).fetch_states_at is None  # nothing offloaded


def test_a_plan_short_of_memory_suggests_offloading_the_states(monkeypatch):
    """Where the cheapest plan's peak is the end of the forward, the error names the states in host memory
    among what would fit (a block of 75 KB against the tiny model's 136 KB of gradients made in the
    backward and 297 KB of fp32 states: keeping all 3 blocks is then the cheapest plan, by its forward)."""
    from cs336_systems.training import memory_plan

    monkeypatch.setattr(memory_plan, "measure_block_memory", lambda block, h: (76_800, 0))
    fast, _ = make_models()
    x, _ = batch()
    terms = build_train_step(fast, StepConfig()).memory_terms(x)
    budget = memory_plan.least_cost(LAYERS, terms) - 1
    with pytest.raises(ValueError, match=r"optimizer states in host memory through the forward \(StepConfig") as err:
        build_train_step(fast, StepConfig(memory_budget_bytes=budget)).plan_for(x)
    assert "StepConfig.offload_optimizer_states" in str(err.value)
    # on CPU the states stay where they are, so the plan does not count them away: it still does not fit
    with pytest.raises(ValueError, match="does not fit"):
        build_train_step(fast, StepConfig(memory_budget_bytes=budget, offload_optimizer_states=True)).plan_for(x)


@pytest.mark.parametrize("recompute, fetch_at", [("all", LAYERS - 1), ("none", LAYERS // 2), ("mixed", 1)])
def test_offloaded_states_are_fetched_when_the_backward_reaches_the_plans_block(
    small_tiles, monkeypatch, recompute, fetch_at
):
    """The step asks for the states back once the blocks above the plan's block have run their backward,
    before that block's own; the loss and gradients are those of the step without offloading."""
    from cs336_systems.training import memory_plan

    fast, plain = make_models()
    x, y = batch()
    config = StepConfig(recompute="none" if recompute == "mixed" else recompute, offload_optimizer_states=True)
    step = build_train_step(fast, config)
    if recompute == "mixed":
        step.plans[(BATCH, CONTEXT)] = memory_plan.RecomputePlan((True, True, False), True, fetch_states_at=1)
        step.parallel.use_plan(step.plans[(BATCH, CONTEXT)])
    assert step.plan_for(x).fetch_states_at == fetch_at
    events = []
    for i, block in enumerate(fast.layers):
        block.register_full_backward_pre_hook(lambda module, grad, i=i: events.append(("backward", i)))
    monkeypatch.setattr(step.offload, "fetch", lambda: events.append(("fetch", None)))
    loss = step.forward_backward(x, y)
    backward = [i for kind, i in events if kind == "backward"]
    assert backward == list(range(LAYERS - 1, -1, -1))
    assert events.index(("fetch", None)) == backward.index(fetch_at)  # after the blocks above, before its own
    ref = plain_loss(plain, x, y)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=RTOL, atol=ATOL)
    for p, q in zip(fast.parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL)
