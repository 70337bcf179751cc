"""`optim.StateOffload`: an optimizer's states in pinned host memory between steps. On a GPU: a round trip is
a copy bit for bit (the steps of an offloaded FusedAdamW and torch.optim.AdamW equal those of one that keeps
its states), the states' device memory is given back, checkpoints between steps read the moments, and a
training step brings them back during its backward. On CPU: nothing moves and the steps are unchanged."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.optim import FusedAdamW, StateOffload

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (pinned host memory, streams)")


def params(device, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 33), (129,), (7, 5, 3)]
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(device, dtype)) for s in shapes]


def set_grads(ps, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g).to(p.device, p.dtype)


def run(make_optimizer, device, steps=3, offload=False, dtype=torch.float32):
    ps = params(device, dtype=dtype)
    opt = make_optimizer(ps)
    mover = StateOffload(opt) if offload else None
    for k in range(steps):
        set_grads(ps, k)
        if mover is not None and k % 2:
            mover.fetch()  # brought back ahead of the step on odd steps, by the step's own hook on even ones
        opt.step()
    return ps, opt, mover


def test_refuses_what_is_not_an_optimizer():
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        StateOffload(object())
    with pytest.raises(TypeError, match="after_step must be a bool"):
        StateOffload(torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))]), after_step=1)


def test_on_cpu_nothing_moves_and_the_steps_are_unchanged():
    ps, opt, mover = run(lambda ps: torch.optim.AdamW(ps, lr=1e-2), "cpu", offload=True)
    ref, _, _ = run(lambda ps: torch.optim.AdamW(ps, lr=1e-2), "cpu")
    assert mover.away == [] and mover.offloaded_bytes == 0 and mover.host is None
    for p, q in zip(ps, ref):
        assert torch.equal(p, q)
    assert all(s["exp_avg"].device.type == "cpu" for s in opt.state.values())


OPTIMIZERS = {
    "fused_adamw_bf16": lambda ps: FusedAdamW(ps, lr=1e-2, state_dtype=torch.bfloat16),
    "fused_adamw_fp32": lambda ps: FusedAdamW(ps, lr=1e-2),
    "torch_adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
}


@cuda
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_steps_equal_those_of_states_kept_on_the_gpu(name):
    ps, opt, mover = run(OPTIMIZERS[name], "cuda", offload=True)
    ref, ref_opt, _ = run(OPTIMIZERS[name], "cuda")
    for p, q in zip(ps, ref):
        assert torch.equal(p, q)
    mover.settle()
    for p, q in zip(ps, ref):
        for key in ("exp_avg", "exp_avg_sq"):
            moment = opt.state[p][key]
            assert moment.device.type == "cpu" and moment.is_pinned()
            assert torch.equal(moment, ref_opt.state[q][key].cpu())
    expected = sum(2 * p.numel() * opt.state[p]["exp_avg"].element_size() for p in ps)
    assert mover.offloaded_bytes == expected


@cuda
def test_the_states_device_memory_is_given_back():
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    p = torch.nn.Parameter(torch.zeros(1 << 22, device="cuda"))  # 16 MiB; its moments 8 MiB each in bf16
    opt = FusedAdamW([p], lr=1e-3, state_dtype=torch.bfloat16)
    StateOffload(opt)
    p.grad = torch.ones_like(p)
    opt.step()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    # the parameter and its gradient (and the optimizer's small launch tables); the moments are on the host
    assert 0 <= held - 2 * p.numel() * 4 < 1 << 20
    opt.step()  # back for the update, away again after it
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before == held


@cuda
def test_checkpoints_between_steps_read_the_moments_and_load_back():
    make = OPTIMIZERS["fused_adamw_bf16"]
    ps, opt, _ = run(make, "cuda", offload=True)
    ref, ref_opt, _ = run(make, "cuda")
    saved = opt.state_dict()  # waits for the copies in flight
    for i, q in enumerate(ref):
        assert torch.equal(saved["state"][i]["exp_avg_sq"].cuda(), ref_opt.state[q]["exp_avg_sq"])
    fresh = params("cuda")
    for p, q in zip(fresh, ps):
        p.data.copy_(q)
    loaded = make(fresh)
    mover = StateOffload(loaded)
    loaded.load_state_dict(saved)
    assert mover.away == [] and all(s["exp_avg"].is_cuda for s in loaded.state.values())
    set_grads(fresh, 3)
    set_grads(ref, 3)
    loaded.step()
    ref_opt.step()
    for p, q in zip(fresh, ref):
        assert torch.equal(p, q)


@cuda
def test_a_training_step_brings_the_states_back_during_its_backward():
    """Away through each forward (sent as it starts, after the batch check); back on the GPU once the backward
    passes the plan's block, before the update; the losses and parameters equal those of a step that keeps
    the states on the GPU."""
    from cs336_systems.model import TransformerLM
    from cs336_systems.training import StepConfig, build_train_step

    def make(offload):
        torch.manual_seed(0)
        model = TransformerLM(101, 32, 64, 4, 4, 128, attention="naive", device="cuda")
        config = StepConfig(recompute="none", state_dtype=torch.bfloat16, offload_optimizer_states=offload)
        return model, build_train_step(model, config)

    g = torch.Generator(device="cuda").manual_seed(1)
    x, y = (torch.randint(0, 101, (2, 32), device="cuda", generator=g) for _ in range(2))
    (model, step), (ref_model, ref_step) = make(True), make(False)
    away_in_forward = []
    model.layers[0].register_forward_pre_hook(lambda *_: away_in_forward.append(step.offload.offloaded_bytes))
    for _ in range(3):
        assert torch.equal(step.step(x, y), ref_step.step(x, y))
        step.forward_backward(x, y)
        assert step.offload.away == [] and all(s["exp_avg"].is_cuda for s in step.optimizer.state.values())
        step.optimizer_step()
        ref_step.forward_backward(x, y)
        ref_step.optimizer_step()
    states = sum(s["exp_avg"].numel() * 2 * 2 for s in step.optimizer.state.values())
    assert away_in_forward == [0] + [states] * 5  # none before the first update
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)
