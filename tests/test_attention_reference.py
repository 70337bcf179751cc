"""The float64 attention reference (attention/reference.py): chunked equals whole, and both equal
PyTorch's scaled_dot_product_attention in float64, causal included (upper-left alignment)."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention.reference import TOLERANCE, reference_attention, reference_gradients, relative_error


def _inputs(n_q, n_k, d=8):
    gen = torch.Generator().manual_seed(n_q * 100 + n_k)
    return [torch.randn(2, n, d, generator=gen) for n in (n_q, n_k, n_k, n_q)]


@pytest.mark.parametrize("n_q, n_k", [(13, 21), (21, 13), (1, 5), (5, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_chunked_reference_matches_sdpa_in_float64(is_causal, n_q, n_k):
    q, k, v, g = _inputs(n_q, n_k)
    ref = reference_gradients(q, k, v, g, is_causal, chunk_elements=2 * 2 * n_k)  # 2 query rows per chunk
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    mask = torch.ones(n_q, n_k, dtype=torch.bool).tril() if is_causal else None
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask)
    out.backward(g.double())
    expected = dict(O=out, dQ=q64.grad, dK=k64.grad, dV=v64.grad)
    for name, want in expected.items():
        torch.testing.assert_close(ref[name], want.detach(), rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("is_causal", [False, True])
def test_chunked_logsumexp_and_output_equal_the_whole_reference(is_causal):
    q, k, v, g = _inputs(21, 13)
    whole_out, whole_lse = reference_attention(q, k, v, is_causal)
    chunked = reference_gradients(q, k, v, g, is_causal, chunk_elements=2 * 3 * 13)
    torch.testing.assert_close(chunked["O"], whole_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked["L"], whole_lse, rtol=1e-12, atol=1e-12)
    assert chunked["L"].dtype == torch.float64 and chunked["L"].shape == q.shape[:-1]


def test_one_tolerance_per_dtype_and_use():
    """Sweeps (long sequences, every implementation) never ask for less than checks; both stay far below the
    errors of order 1 that a wrong kernel makes."""
    assert set(TOLERANCE) == {torch.float32, torch.float16, torch.bfloat16}
    for tolerance in TOLERANCE.values():
        assert 0 < tolerance.checks <= tolerance.sweeps <= 0.1


def test_relative_error_is_normwise_and_keeps_nan():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert relative_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert relative_error(torch.tensor([float("nan"), 4.0]), ref) != relative_error(
        torch.tensor([float("nan"), 4.0]), ref
    )
