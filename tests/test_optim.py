import pytest
import torch

from cs336_systems.optim import AdamW, clip_gradients


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_torch_adamw(weight_decay):
    torch.manual_seed(0)
    ref_model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    model.load_state_dict(ref_model.state_dict())
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    ours, ref = AdamW(model.parameters(), **kw), torch.optim.AdamW(ref_model.parameters(), **kw)
    for _step in range(20):
        x = torch.randn(8, 6)
        for m, opt in ((model, ours), (ref_model, ref)):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(lr=-1), ValueError, "learning rate"),
        (dict(weight_decay=-0.1), ValueError, "weight_decay"),
        (dict(betas=0.9), TypeError, "betas must be a pair"),
        (dict(betas=(0.9, 1.0)), ValueError, "beta parameter at index 1"),
        (dict(eps="1e-8"), TypeError, "eps must be a real number"),
    ],
)
def test_adamw_rejects_bad_hyperparameters(kwargs, error, match):
    with pytest.raises(error, match=match):
        AdamW([torch.nn.Parameter(torch.zeros(1))], **kwargs)


def test_gradient_clipping_matches_torch():
    a = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        g = torch.randn_like(p) * 10
        p.grad, q.grad = g.clone(), g.clone()
    clip_gradients(a, 1.0)
    torch.nn.utils.clip_grad_norm_(b, 1.0)
    for p, q in zip(a, b):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("middle_dtype", [torch.float32, torch.bfloat16])
def test_foreach_adamw_takes_the_same_steps_as_the_per_tensor_loop(weight_decay, middle_dtype):
    def make():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 4), torch.nn.Linear(4, 2))
        m[2].to(middle_dtype)  # bf16: a second dtype, and the foreach path groups tensors by (device, dtype)
        m[3].bias.requires_grad_(False)  # never gets a gradient: skipped by both
        return m

    def forward(m, x):
        return m[3](m[2](m[1](m[0](x)).to(middle_dtype)).float())

    loop_model, foreach_model = make(), make()
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    loop_opt, foreach_opt = AdamW(loop_model.parameters(), **kw), AdamW(foreach_model.parameters(), foreach=True, **kw)
    for m, opt in ((loop_model, loop_opt), (foreach_model, foreach_opt)):
        torch.manual_seed(1)
        for _ in range(12):
            opt.zero_grad(set_to_none=True)
            forward(m, torch.randn(8, 6)).pow(2).mean().backward()
            opt.step()
    moved = 0
    for (name, p), q in zip(loop_model.named_parameters(), foreach_model.parameters()):
        if middle_dtype == torch.float32:  # the same operations in the same order: bit for bit
            torch.testing.assert_close(q, p, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
        else:  # torch's CPU _foreach_mul_ rounds the scalar to bf16 first (beta1 0.9 -> 0.898); mul_ does not
            torch.testing.assert_close(q.float(), p.float(), rtol=2e-2, atol=1e-3, msg=lambda m: f"{name}: {m}")
        moved += int(not torch.equal(p, make().get_parameter(name)))
    assert moved == 5  # every trainable tensor was updated, the frozen bias was not
    assert foreach_opt.state[foreach_model[0].weight]["step"] == 12
