"""FlashAttention under torch.compile: one graph (`fullgraph=True`), through the custom ops
`cs336::flash_forward` and `cs336::flash_backward`, which run the eager host path when the graph runs.

Without CUDA the kernels run in the Triton interpreter (set before the kernels are first imported);
the shapes are tiny.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch._dynamo  # noqa: E402

from cs336_systems.attention import flash_attention  # noqa: E402
from cs336_systems.attention.api import flash_attention_triton  # noqa: E402
from cs336_systems.attention.launch.dispatch import flash_forward_with_route  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(layout: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k, v and an upstream gradient, (batch, heads, N, d) in three layouts: rows ("heads"), a model's
    (1, h, N, d) views of its projections ("model": leading dimensions merge), and leading dimensions that
    do not merge ("crossed": the kernels read a copy, and write the gradients as rows)."""
    g = torch.Generator().manual_seed(seed)

    def one():
        if layout == "heads":
            t = torch.randn(2, 2, 40, 16, generator=g)
        elif layout == "model":
            t = torch.randn(1, 40, 2, 16, generator=g).transpose(1, 2)
        else:
            t = torch.randn(3, 40, 2, 16, generator=g).permute(2, 0, 1, 3)
        return t.to(DEVICE)

    q, k, v, grad = one(), one(), one(), one()
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad


def run(fn, q, k, v, grad):
    """O and the three gradients of one forward and backward."""
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v)
    out.backward(grad)
    return out.detach(), *(t.grad for t in (q, k, v))


@pytest.mark.parametrize("layout", ["heads", "model", "crossed"])
def test_flash_attention_compiles_as_one_graph_and_computes_what_eager_does(layout):
    q, k, v, grad = inputs(layout)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(flash_attention)(q, k, v, True)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    eager = run(lambda *a: flash_attention(*a, True), q, k, v, grad)
    compiled_fn = torch.compile(flash_attention, backend="aot_eager", fullgraph=True)
    compiled = run(lambda *a: compiled_fn(*a, True), q, k, v, grad)
    for name, a, b in zip(("O", "dQ", "dK", "dV"), eager, compiled):
        assert torch.equal(a, b), name  # the same kernels by the same host path
        assert a.stride() == b.stride(), name
    torch._dynamo.reset()


def test_a_tiles_override_reaches_the_compiled_call():
    q, k, v, grad = inputs("heads", seed=1)
    torch._dynamo.reset()
    compiled_fn = torch.compile(flash_attention_triton, backend="aot_eager", fullgraph=True)
    for tiles in ((16, 16), (32, 16)):
        eager = run(lambda *a, tiles=tiles: flash_attention_triton(*a, False, tiles=tiles), q, k, v, grad)
        compiled = run(lambda *a, tiles=tiles: compiled_fn(*a, False, tiles=tiles), q, k, v, grad)
        assert all(torch.equal(a, b) for a, b in zip(eager, compiled)), tiles
    torch._dynamo.reset()


@pytest.mark.parametrize("layout", ["model", "crossed"])
def test_the_custom_ops_pass_opcheck(layout):
    """Schema, fake implementations (shapes and strides: where the kernels wrote rows, the op hands back the
    layout its fake promises) and their use by AOT autograd, as torch.library checks them."""
    q, k, v, grad = (t.detach() for t in inputs(layout, seed=2))
    out, lse, _ = flash_forward_with_route(q, k, v, True)
    torch.library.opcheck(torch.ops.cs336.flash_backward.default, (q, k, v, out, grad, lse, True, None))
    torch.library.opcheck(torch.ops.cs336.flash_forward.default, (q, k, v, True, [16, 16]))


@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
def test_the_custom_ops_count_their_flops(is_causal):
    """torch.utils.flop_counter (and so the partitioner's runtime estimate) sees each op's products: the
    forward's two, 4 · N_q · N_k · d per head over the (query, key) pairs the mask keeps, the backward's five."""
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v, grad = (t.detach() for t in inputs("heads"))  # (2, 2, 40, 16)
    pairs = 40 * 41 // 2 if is_causal else 40 * 40
    with FlopCounterMode(display=False) as forward:
        out, lse = torch.ops.cs336.flash_forward(q, k, v, is_causal, None)
    with FlopCounterMode(display=False) as backward:
        torch.ops.cs336.flash_backward(q, k, v, out, grad, lse, is_causal, None)
    assert forward.get_total_flops() == 4 * 4 * pairs * 16
    assert backward.get_total_flops() == 5 * forward.get_total_flops() // 2


def test_a_compiled_block_under_the_steps_memory_budget_saves_the_attention_forward(monkeypatch):
    """Under the training step's partitioner budget a compiled block runs the attention forward once per
    forward and backward: the partitioner saves its O and L instead of recomputing it in the backward (which
    it chose at this budget without `training.partitioner`'s pass)."""
    from cs336_systems.attention.launch import dispatch
    from cs336_systems.training.config import StepConfig

    calls = []
    forward_into = dispatch.forward_into
    monkeypatch.setattr(dispatch, "forward_into", lambda *args: (calls.append(1), forward_into(*args))[1])

    class Block(torch.nn.Module):
        def __init__(self, d: int = 64, heads: int = 4):
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
            self.out = torch.nn.Linear(d, d, bias=False)
            self.ffn = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

        def forward(self, x):
            b, n, d = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            x = x + self.out(flash_attention(q, k, v, True).transpose(1, 2).reshape(b, n, d))
            return x + self.ffn(x)

    torch.manual_seed(0)
    block = Block().to(DEVICE)
    block.compile()
    x = torch.randn(1, 64, 64, device=DEVICE, requires_grad=True)
    torch._dynamo.reset()
    try:
        with StepConfig(compile_blocks=True, activation_memory_budget=0.6).partitioner_budget():
            block(x).sum().backward()
            calls.clear()
            block(x).sum().backward()
    finally:
        torch._dynamo.reset()
    assert len(calls) == 1
