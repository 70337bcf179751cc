import pytest
import torch

from cs336_systems.nn_utils import clip_gradients
from cs336_systems.optim import AdamW


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_torch_adamw(weight_decay):
    torch.manual_seed(0)
    ref_model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    model.load_state_dict(ref_model.state_dict())
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    ours, ref = AdamW(model.parameters(), **kw), torch.optim.AdamW(ref_model.parameters(), **kw)
    for step in range(20):
        x = torch.randn(8, 6)
        for m, opt in ((model, ours), (ref_model, ref)):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_adamw_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match="learning rate"):
        AdamW([torch.nn.Parameter(torch.zeros(1))], lr=-1)


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
