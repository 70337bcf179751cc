"""The fused LM head + cross-entropy (`cs336_systems.fused_loss`) against F.cross_entropy in float64.

Without CUDA the Triton kernel runs in the Triton interpreter (conftest.py sets TRITON_INTERPRET=1
before triton is imported). Shapes are tiny, chunks 16 rows and the kernel's step over the
vocabulary 256 logits, so several chunks run and every row takes several ragged steps
(V = 1000 and 997, N = 37 and 64 are multiples of neither). The `gpu` test runs a larger bf16
shape on the real kernel.

Tolerances. fp32: 1e-5 relative (the only differences are fp32 roundoff in the matmuls and the
kernel's exp2/log2). 16-bit: the logits are rounded to the input dtype (unit roundoff u = 2^-9 for
bf16, 2^-11 for fp16), so each row's lse and target logit are off by at most u * max|z|, the loss by
at most 2u * max|z| = 2^-8 max|z| (bf16). The gradients go through three roundings to 16 bits (d
logits stored in place, the product, the result) and the logits' own error inside softmax, each
about u relative: expected normwise error a few u (docs/measurements_record.md), bound 2^-6 = 8u.
"""

from __future__ import annotations

import importlib
import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from cs336_systems.fused_loss import LinearCrossEntropy, default_chunk_tokens, linear_cross_entropy

# the package's attribute `linear_cross_entropy` is the function; the module by its full name:
lce_module = importlib.import_module("cs336_systems.fused_loss.linear_cross_entropy")

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"  # the interpreter runs CPU tensors; a real kernel needs CUDA ones
IGNORE = -100
GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 2**-6, torch.float16: 2**-6}
UNIT_ROUNDOFF = {torch.float32: 2**-24, torch.bfloat16: 2**-9, torch.float16: 2**-11}


@pytest.fixture(autouse=True)
def small_steps(monkeypatch):
    """One thread (tiny tensors, busy 2-core machine) and a 256-logit kernel step (several per row)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(LinearCrossEntropy, "block_v", 256)
    yield
    torch.set_num_threads(threads)


def make_inputs(lead: tuple[int, ...], V: int, D: int, dtype: torch.dtype, seed: int = 0, device: str = DEVICE):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*lead, D, generator=g).to(device=device, dtype=dtype).requires_grad_()
    weight = (torch.randn(V, D, generator=g) / D**0.5 * 2).to(device=device, dtype=dtype).requires_grad_()
    targets = torch.randint(0, V, lead, generator=g).to(device)
    return hidden, weight, targets


def reference(hidden, weight, targets, reduction):
    """F.cross_entropy on the materialised logits, in float64: (loss, grad hidden, grad weight, max |logit|)."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    logits = h @ w.T
    loss = F.cross_entropy(logits.view(-1, w.shape[0]), targets.view(-1), reduction=reduction, ignore_index=IGNORE)
    loss.backward()
    return loss.detach(), h.grad, w.grad, logits.detach().abs().max().item()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


CASES = {
    # lead dims, V, chunk_tokens, reduction
    "N37_V1000_chunk16_mean": ((37,), 1000, 16, "mean"),
    "B2T32_V997_chunk16_sum": ((2, 32), 997, 16, "sum"),
    "B2T32_V1000_chunk16_mean": ((2, 32), 1000, 16, "mean"),
    "N37_V997_default_chunk_mean": ((37,), 997, None, "mean"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_reference(case, dtype):
    lead, V, chunk, reduction = CASES[case]
    D = 24
    hidden, weight, targets = make_inputs(lead, V, D, dtype)
    flat = targets.view(-1)
    flat[16:32] = IGNORE  # the second chunk of 16 rows: every target ignored
    flat[3] = IGNORE
    flat[-1] = IGNORE
    loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk, reduction=reduction, ignore_index=IGNORE)
    loss.backward()
    ref_loss, ref_dh, ref_dw, max_logit = reference(hidden, weight, targets, reduction)

    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert hidden.grad.dtype == dtype and weight.grad.dtype == dtype
    assert hidden.grad.shape == hidden.shape and weight.grad.shape == weight.shape
    if dtype == torch.float32:
        torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=0)
    else:
        bound = 2 * UNIT_ROUNDOFF[dtype] * max_logit * (1 if reduction == "mean" else flat.ne(IGNORE).sum().item())
        assert abs(loss.item() - ref_loss.item()) <= bound, (loss.item(), ref_loss.item(), bound)
    assert rel_err(hidden.grad, ref_dh) <= GRAD_TOL[dtype]
    assert rel_err(weight.grad, ref_dw) <= GRAD_TOL[dtype]
    # ignored rows get exactly zero gradient
    assert hidden.grad.reshape(-1, D)[16:32].abs().max().item() == 0


def test_grad_output_scales_saved_gradients():
    hidden, weight, targets = make_inputs((37,), 1000, 16, torch.float32, seed=1)
    loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=16)
    (3.0 * loss).backward(retain_graph=True)
    dh, dw = hidden.grad.clone(), weight.grad.clone()
    _, ref_dh, ref_dw, _ = reference(hidden, weight, targets, "mean")
    assert rel_err(dh, 3 * ref_dh) <= 1e-5 and rel_err(dw, 3 * ref_dw) <= 1e-5
    hidden.grad = weight.grad = None
    (-0.5 * loss).backward()  # a second backward on the retained graph sees the saved gradients unchanged
    assert rel_err(hidden.grad, -0.5 * ref_dh) <= 1e-5 and rel_err(weight.grad, -0.5 * ref_dw) <= 1e-5


def test_only_required_gradients_are_computed(monkeypatch):
    calls = []
    launch = lce_module.launch_cross_entropy_rows

    def recording_launch(logits, targets, loss, scale, ignore_index, write_grad, block_v=None):
        calls.append(write_grad)
        launch(logits, targets, loss, scale, ignore_index, write_grad, block_v)

    monkeypatch.setattr(lce_module, "launch_cross_entropy_rows", recording_launch)
    hidden, weight, targets = make_inputs((37,), 997, 16, torch.float32, seed=2)
    ref_loss, ref_dh, ref_dw, _ = reference(hidden, weight, targets, "mean")

    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=16)
    assert calls == [False, False, False] and loss.grad_fn is None
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=0)

    calls.clear()
    frozen_weight = weight.detach()
    loss = linear_cross_entropy(hidden, frozen_weight, targets, chunk_tokens=16)
    loss.backward()
    assert calls == [True, True, True]
    assert rel_err(hidden.grad, ref_dh) <= 1e-5

    hidden.grad = None
    loss = linear_cross_entropy(hidden.detach(), weight, targets, chunk_tokens=16)
    loss.backward()
    assert rel_err(weight.grad, ref_dw) <= 1e-5 and hidden.grad is None


def test_all_targets_ignored_matches_torch():
    hidden, weight, targets = make_inputs((20,), 300, 16, torch.float32, seed=3)
    targets.fill_(IGNORE)
    for reduction in ("mean", "sum"):
        hidden.grad = weight.grad = None
        loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=16, reduction=reduction)
        loss.backward()
        ref_loss, ref_dh, ref_dw, _ = reference(hidden, weight, targets, reduction)
        torch.testing.assert_close(loss.double(), ref_loss, equal_nan=True)  # mean: nan, as torch
        assert hidden.grad.abs().max() == 0 and weight.grad.abs().max() == 0
        assert ref_dh.abs().max() == 0 and ref_dw.abs().max() == 0


def with_target(targets: torch.Tensor, value: int) -> torch.Tensor:
    targets = targets.clone()
    targets[5] = value
    return targets


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda h, w, t: (h, w, with_target(t, 1000)), r"target id 1000 .*V=1000"),
        (lambda h, w, t: (h, w, with_target(t, -7)), r"target id -7 .*V=1000"),
        (lambda h, w, t: (h[:, :15], w, t), r"D=15 does not match weight's D=16"),
        (lambda h, w, t: (h, w.reshape(-1), t), r"weight must be 2-D"),
        (lambda h, w, t: (h, w.unsqueeze(0), t), r"weight must be 2-D"),
        (lambda h, w, t: (h, w, t.float()), r"targets must hold integer class ids .*float32"),
        (lambda h, w, t: (h, w, t[:-1]), r"targets shape \(36,\) must equal"),
        (lambda h, w, t: (h, w.double(), t), r"same dtype"),
        (lambda h, w, t: (h.double(), w.double(), t), r"float64 is not supported"),
    ],
    ids=[
        "target_too_big",
        "target_negative",
        "mismatched_D",
        "weight_1d",
        "weight_3d",
        "float_targets",
        "targets_shape",
        "dtype_mismatch",
        "float64",
    ],
)
def test_bad_inputs_raise_value_errors(mutate, message):
    hidden, weight, targets = make_inputs((37,), 1000, 16, torch.float32)
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(*mutate(hidden.detach(), weight.detach(), targets))


def test_bad_options_raise_value_errors():
    hidden, weight, targets = make_inputs((8,), 100, 16, torch.float32)
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(hidden, weight, targets, reduction="none")
    with pytest.raises(ValueError, match="chunk_tokens"):
        linear_cross_entropy(hidden, weight, targets, chunk_tokens=0)


class AllocationRecorder(TorchDispatchMode):
    """Records the size in bytes of every tensor an operator returns (every allocation goes through one;
    the Triton interpreter's copies of the kernel's arguments are seen too)."""

    def __init__(self):
        super().__init__()
        self.sizes: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.sizes.append((str(func), t.numel() * t.element_size()))
        return out


def test_never_materialises_the_full_logits():
    N, V, D, C = 64, 1000, 4, 16  # D small: grad_weight's (V, D) fp32 accumulator stays below the chunk
    hidden, weight, targets = make_inputs((N,), V, D, torch.bfloat16, seed=4)
    recorder = AllocationRecorder()
    with recorder:
        loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=C)
        loss.backward()
    largest_op, largest = max(recorder.sizes, key=lambda s: s[1])
    # the chunk's (C, V) bf16 logits buffer is the largest tensor: 4x smaller than the [N, V] logits
    assert largest == C * V * 2 < N * V * 2, (largest_op, largest)
    assert default_chunk_tokens(151_936) == 1760  # leaderboard vocab: 1,760 rows, 1.0 GiB of fp32 logits
    assert default_chunk_tokens(151_936, budget_bytes=256 * 2**20) == 432
    assert all(
        default_chunk_tokens(v) % 16 == 0 and default_chunk_tokens(v) * v * 4 <= 2**30 for v in (1000, 32_000, 151_936)
    )


def test_torch_compile_graph_breaks_around_it():
    hidden, weight, targets = make_inputs((2, 9), 300, 16, torch.float32, seed=5)

    def step(h, w, t):
        return 2 * linear_cross_entropy(h * 1.0, w, t, chunk_tokens=16)

    compiled = torch.compile(step, backend="eager")
    loss = compiled(hidden, weight, targets)
    loss.backward()
    ref_loss, ref_dh, ref_dw, _ = reference(hidden, weight, targets, "mean")
    torch.testing.assert_close(loss.double(), 2 * ref_loss, rtol=1e-5, atol=0)
    assert rel_err(hidden.grad, 2 * ref_dh) <= 1e-5 and rel_err(weight.grad, 2 * ref_dw) <= 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_gpu_bf16_against_fp32_cross_entropy(monkeypatch):
    monkeypatch.setattr(LinearCrossEntropy, "block_v", None)  # the kernel's default step
    N, V, D = 4096, 32_000, 1024
    hidden, weight, targets = make_inputs((2, N // 2), V, D, torch.bfloat16, seed=6, device="cuda")
    targets.view(-1)[::7] = IGNORE
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=1024)  # 4 chunks
    loss.backward()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start

    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()
    ref = F.cross_entropy((h @ w.T).float().view(-1, V), targets.view(-1), ignore_index=IGNORE)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=2e-3, atol=2e-3)
    assert rel_err(hidden.grad.float(), h.grad.double()) <= GRAD_TOL[torch.bfloat16]
    assert rel_err(weight.grad.float(), w.grad.double()) <= GRAD_TOL[torch.bfloat16]
    print(f"fused linear cross-entropy, N={N} V={V} D={D} bf16: {elapsed * 1e3:.1f} ms (first call, with compile)")
