"""FlashAttention-2 (PyTorch and Triton) against a float64 reference built from torch built-ins.

Without CUDA the Triton kernels run in the Triton interpreter: TRITON_INTERPRET must be set
before the kernels are first imported, hence at the top of this file. Shapes are kept tiny and
tiles 16x16 there; the `gpu` tests run the real kernels with the default tiles.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cs336_systems.attention import (  # noqa: E402
    FlashAttentionPytorch,
    FlashAttentionTriton,
    flash_attention,  # noqa: E402
)
from cs336_systems.attention.api import DEFAULTS  # noqa: E402
from cs336_systems.attention.heuristics import gluon_backward_eligible, gluon_forward_eligible  # noqa: E402
from cs336_systems.attention.launch import dispatch as flash_dispatch  # noqa: E402
from cs336_systems.attention.launch import native as flash_native  # noqa: E402
from cs336_systems.attention.launch.dispatch import gluon_kernels  # noqa: E402
from cs336_systems.attention.launch.layout import head_views, kernels_interpreted, reads_by_tma, tma_compatible  # noqa: E402
from cs336_systems.attention.naive import naive_attention  # noqa: E402
from cs336_systems.attention.reference import TOLERANCE, reference_attention, reference_gradients  # noqa: E402
from cs336_systems.attention.reference import relative_error as rel_error  # noqa: E402
from cs336_systems.attention.validation import check_triton_inputs  # noqa: E402
from cs336_systems.model import TransformerLM  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
TOL = {dtype: tolerance.checks for dtype, tolerance in TOLERANCE.items()}

# (shape of q, shape of k and v): 3-D and 4-D, lengths on and off the 16-tile, N_q != N_k
SHAPES = {
    "3d_tiled": ((2, 32, 16), (2, 32, 16)),
    "3d_ragged": ((2, 37, 16), (2, 37, 16)),
    "4d_ragged_d24": ((1, 2, 23, 24), (1, 2, 23, 24)),
    "q_shorter_than_k": ((2, 20, 32), (2, 45, 32)),
}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from two threads, and on a busy 2-core machine threads wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def small_tiles(monkeypatch):
    """16x16 tiles everywhere (several tiles even on tiny shapes), the PyTorch backward uncompiled."""
    monkeypatch.setattr(FlashAttentionPytorch, "q_tile", 16)
    monkeypatch.setattr(FlashAttentionPytorch, "k_tile", 16)
    monkeypatch.setattr(FlashAttentionPytorch, "compile_backward", False)
    monkeypatch.setattr(DEFAULTS, "tiles", (16, 16))


@pytest.fixture
def triton_device():
    if HAS_CUDA:
        return "cuda"
    if not kernels_interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set, and there is no GPU")
    return "cpu"


def reference(q, k, v, is_causal):
    """float64 O and logsumexp of the library's reference, and the float64 leaves (for their .grad)."""
    leaves = tuple(t.detach().double().requires_grad_() for t in (q, k, v))
    return (*reference_attention(*leaves, is_causal), leaves)


def check_against_reference(apply, shape_q, shape_kv, dtype, is_causal, device, tol=None):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(shape_q, generator=gen).to(device, dtype).requires_grad_()
    k, v = (torch.randn(shape_kv, generator=gen).to(device, dtype).requires_grad_() for _ in range(2))
    grad = torch.randn(shape_q[:-1] + shape_kv[-1:], generator=gen).to(device, dtype)

    out = apply(q, k, v, is_causal)
    saved = out.grad_fn.saved_tensors
    lse = [t for t in saved if t.shape == q.shape[:-1]]
    assert len(lse) == 1, (
        f"expected one saved tensor of shape {tuple(q.shape[:-1])}, got {[tuple(t.shape) for t in saved]}"
    )
    n_q, n_k = shape_q[-2], shape_kv[-2]
    assert not any(tuple(t.shape[-2:]) in {(n_q, n_k), (n_k, n_q)} for t in saved), "a seq x seq tensor was saved"
    assert out.grad_fn.is_causal == is_causal
    out.backward(grad)

    ref_out, ref_lse, (q64, k64, v64) = reference(q, k, v, is_causal)
    ref_out.backward(grad.double())
    errors = {
        "O": rel_error(out, ref_out),
        "L": rel_error(lse[0], ref_lse),
        "dQ": rel_error(q.grad, q64.grad),
        "dK": rel_error(k.grad, k64.grad),
        "dV": rel_error(v.grad, v64.grad),
    }
    tol = tol or TOL[dtype]
    bad = {name: e for name, e in errors.items() if not e < tol}  # NaN fails here too
    assert not bad, f"errors above {tol}: {bad} (all: {errors})"
    assert out.dtype == dtype and out.shape == q.shape
    assert q.grad.dtype == dtype and k.grad.shape == k.shape and v.grad.shape == v.shape


# ---------------------------------------------------------------- PyTorch implementation (CPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_pytorch_matches_float64(small_tiles, shape, is_causal, dtype):
    check_against_reference(FlashAttentionPytorch.apply, *shape, dtype, is_causal, "cpu")


def test_pytorch_compiled_backward_matches_float64(monkeypatch):
    monkeypatch.setattr(FlashAttentionPytorch, "compile_backward", True)
    check_against_reference(FlashAttentionPytorch.apply, (2, 40, 16), (2, 40, 16), torch.float32, True, "cpu")


def test_pytorch_rejects_tiles_under_16(monkeypatch):
    monkeypatch.setattr(FlashAttentionPytorch, "q_tile", 8)
    with pytest.raises(ValueError, match="at least 16"):
        FlashAttentionPytorch.apply(*(torch.randn(1, 32, 16) for _ in range(3)))


@pytest.mark.parametrize("flash", [FlashAttentionPytorch, FlashAttentionTriton], ids=["pytorch", "triton"])
def test_large_scores_do_not_overflow(small_tiles, triton_device, flash):
    # Online softmax: scores of ~1e4 would overflow exp() without the running max.
    device = "cpu" if flash is FlashAttentionPytorch else triton_device
    q = torch.full((1, 20, 16), 30.0, device=device)
    k = torch.randn(1, 40, 16, device=device) * 30
    v = torch.randn(1, 40, 16, device=device)
    out = flash.apply(q, k, v)
    ref, _, _ = reference(q, k, v, False)
    assert torch.isfinite(out).all() and rel_error(out, ref) < 1e-4


# ---------------------------------------------------------------- Triton (interpreter on CPU, real on GPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_triton_matches_float64(small_tiles, triton_device, shape, is_causal, dtype):
    check_against_reference(FlashAttentionTriton.apply, *shape, dtype, is_causal, triton_device)


# Lengths that leave full tiles, causal-diagonal tiles and a ragged edge in each kernel's loops.
UNEVEN_SHAPES = {
    "ragged_70": ((2, 70, 16), (2, 70, 16)),
    "tiled_64": ((1, 64, 16), (1, 64, 16)),
    "q40_k90": ((1, 40, 16), (1, 90, 16)),
    "q90_k40": ((1, 90, 16), (1, 40, 16)),
}


@pytest.mark.parametrize("tiles", [(32, 16), (16, 32)], ids=["q32_k16", "q16_k32"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", UNEVEN_SHAPES.values(), ids=UNEVEN_SHAPES.keys())
def test_triton_unequal_tiles_match_float64(small_tiles, triton_device, monkeypatch, tiles, is_causal, shape):
    """Q_TILE != K_TILE moves the boundary between the full and the masked loops off the tile grid of the other side."""
    monkeypatch.setattr(DEFAULTS, "tiles", tiles)
    check_against_reference(FlashAttentionTriton.apply, *shape, torch.float32, is_causal, triton_device)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_triton_with_pytorch_backward(small_tiles, triton_device, monkeypatch, is_causal):
    monkeypatch.setattr(DEFAULTS, "backward_impl", "pytorch")
    check_against_reference(
        FlashAttentionTriton.apply, *SHAPES["q_shorter_than_k"], torch.float32, is_causal, triton_device
    )


@pytest.mark.parametrize("flash", [FlashAttentionPytorch, FlashAttentionTriton], ids=["pytorch", "triton"])
def test_two_dimensional_inputs(small_tiles, triton_device, flash):
    device = "cpu" if flash is FlashAttentionPytorch else triton_device
    check_against_reference(flash.apply, (37, 16), (40, 16), torch.float32, True, device)


def test_triton_and_pytorch_forward_agree(small_tiles, triton_device):
    q, k, v = (torch.randn(3, 2, 29, 16, device=triton_device) for _ in range(3))
    torch.testing.assert_close(
        FlashAttentionTriton.apply(q, k, v, True), FlashAttentionPytorch.apply(q, k, v, True), atol=1e-5, rtol=1e-5
    )


def test_triton_accepts_strided_inputs(small_tiles, triton_device):
    # As in the model: (batch, seq, heads, d) viewed as (batch, heads, seq, d), not contiguous.
    q, k, v = (torch.randn(2, 33, 2, 16, device=triton_device).transpose(1, 2) for _ in range(3))
    ref, _, _ = reference(q, k, v, True)
    assert rel_error(FlashAttentionTriton.apply(q, k, v, True), ref) < 1e-3


def test_tma_compatible():
    x = torch.empty(2, 40, 64, dtype=torch.bfloat16)
    assert tma_compatible(x)
    assert not tma_compatible(x.transpose(1, 2)), "last stride not 1"
    assert not tma_compatible(torch.empty(2, 40, 20, dtype=torch.bfloat16)), "rows of 40 bytes"
    assert tma_compatible(torch.empty(2, 40, 20, dtype=torch.float32)), "rows of 80 bytes"
    assert not tma_compatible(torch.empty(2 * 40 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 40, 64)), (
        "start off by 2 bytes"
    )
    if kernels_interpreted() or (HAS_CUDA and torch.cuda.get_device_capability()[0] >= 9):
        device = "cuda" if HAS_CUDA else "cpu"
        assert reads_by_tma(torch.empty(2, 40, 64, dtype=torch.bfloat16, device=device))
        assert not reads_by_tma(torch.empty(2, 40, 64, dtype=torch.float32, device=device)), "fp32 keeps block pointers"


@pytest.mark.parametrize(
    "d, n_q, n_k, dtype, batch, major, is_causal, expected",
    [
        (64, 16384, 16384, torch.bfloat16, 16, 9, True, True),  # the leaderboard on an H100
        (128, 65536, 65536, torch.float16, 1, 9, True, True),
        (64, 4096, 4096, torch.bfloat16, 64, 9, True, False),  # short: the launch's host time outweighs the gain
        (128, 4096, 4096, torch.bfloat16, 16, 9, True, True),  # d = 128 from N = 4,096
        (128, 4096, 4096, torch.bfloat16, 4, 9, True, True),  # 128 CTAs: from 4 heads on with the mask
        (128, 8192, 8192, torch.bfloat16, 2, 9, True, False),  # 2 heads: the Triton kernel's causal grid was faster
        (128, 8192, 8192, torch.bfloat16, 2, 9, False, True),  # without the mask from 2 heads on
        (128, 4096, 4096, torch.bfloat16, 1, 9, False, False),  # 32 CTAs: the Triton kernel's split keys
        (128, 2048, 2048, torch.bfloat16, 64, 9, True, False),  # shorter: not measured
        (128, 16384, 16384, torch.bfloat16, 1, 9, True, True),  # d = 128 from 16,384 at any grid (128 CTAs)
        (128, 8192, 8192, torch.bfloat16, 1, 9, True, False),  # 64 CTAs, shorter: the Triton kernel's split keys
        (64, 16384, 16384, torch.bfloat16, 1, 9, True, False),  # 128 CTAs for 132 SMs: the Triton kernel's finer grid
        (64, 16384, 16384, torch.bfloat16, 16, 8, True, False),  # no warpgroup matmuls before Hopper
        (64, 16384, 16384, torch.bfloat16, 16, 10, True, False),  # nor Hopper's on Blackwell
        (64, 16384, 16384, torch.float32, 16, 9, True, False),
        (32, 16384, 16384, torch.bfloat16, 16, 9, True, False),  # head dimensions 64 and 128 only
        (64, 16384, 8192, torch.bfloat16, 16, 9, True, False),  # N_q != N_k
    ],
)
def test_gluon_forward_eligible(d, n_q, n_k, dtype, batch, major, is_causal, expected):
    assert gluon_forward_eligible(d, n_q, n_k, dtype, batch, major, 132, is_causal) is expected


def test_gluon_forward_never_applies_off_gpu(triton_device):
    q = torch.randn(16, 4096, 64, dtype=torch.bfloat16)
    if triton_device == "cpu":  # the interpreter: CPU tensors pass the checks
        assert gluon_kernels(q, q, q, True) == (False, False)
    with pytest.raises(ValueError, match="the Triton kernels got CPU tensors"):  # compiled kernels: refused
        gluon_kernels(q, q, q, True, interpreted=False)


@pytest.mark.parametrize(
    "d, n, dtype, batch, major, is_causal, expected",
    [
        (64, 16384, torch.bfloat16, 16, 9, True, True),  # the leaderboard on an H100
        (64, 65536, torch.float16, 1, 9, True, True),
        (64, 16384, torch.bfloat16, 16, 9, False, False),  # without the mask it did not gain at d = 64
        (128, 32768, torch.bfloat16, 32, 9, True, True),  # the 2026 leaderboard model's attention
        (128, 32768, torch.bfloat16, 32, 9, False, True),  # d = 128 gains without the mask too
        (128, 32768, torch.float32, 32, 9, True, False),
        (128, 16384, torch.bfloat16, 1, 9, True, True),  # d = 128 from N = 16,384 on, one head too
        (128, 8192, torch.bfloat16, 1, 9, True, False),  # 64 CTAs: the Triton kernels were faster
        (128, 4096, torch.bfloat16, 2, 9, False, False),  # 64 CTAs
        (128, 8192, torch.bfloat16, 32, 9, True, True),  # 2,048 CTAs
        (128, 4096, torch.bfloat16, 32, 9, True, True),  # shorter: 1,024 CTAs
        (128, 4096, torch.bfloat16, 4, 9, True, True),  # 128 CTAs: from about one per SM on
        (128, 8192, torch.bfloat16, 2, 9, False, True),  # 128 CTAs
        (128, 32768, torch.bfloat16, 32, 8, True, False),
        (96, 32768, torch.bfloat16, 32, 9, True, False),
        (64, 4096, torch.bfloat16, 64, 9, True, False),  # the forward's limits
        (64, 16384, torch.bfloat16, 16, 8, True, False),
        (64, 16384, torch.float32, 16, 9, True, False),
    ],
)
def test_gluon_backward_eligible(d, n, dtype, batch, major, is_causal, expected):
    assert gluon_backward_eligible(d, n, n, dtype, batch, major, 132, is_causal) is expected


@pytest.mark.parametrize("layout", ["contiguous", "head views"])
def test_dq_planes_back_to_rows(layout):
    """d = 128's dQ accumulator holds (batch, 2, N, 64) planes in (batch, N, 128)'s memory; the conversion
    puts plane c's row r at columns [64 c, 64 c + 64) of row r, into a gradient of any strides (a model's
    (1, h, N, d) views of its projections keep theirs)."""
    from cs336_systems.attention.launch.gluon import copy_dq

    heads, n = 3, 5
    planes = torch.randn(heads, 2, n, 64)
    if layout == "contiguous":
        grad_q = torch.empty(1, heads, n, 128, dtype=torch.float64)
    else:
        grad_q = head_views(torch.empty(1, n, heads * 128, dtype=torch.float64), heads)
    strides = grad_q.stride()
    copy_dq(grad_q, planes.reshape(heads, n, 128))
    assert grad_q.stride() == strides
    assert torch.equal(grad_q[0], torch.cat([planes[:, 0], planes[:, 1]], dim=-1).double())


@pytest.mark.skipif(not (HAS_CUDA or kernels_interpreted()), reason="needs a CUDA device or the Triton interpreter")
@pytest.mark.parametrize(
    "layout, by_kernel",
    [
        ("a model's head views", True),
        ("padded rows", True),
        ("two batches of head views", False),
        ("columns apart", False),
    ],
)
def test_dq_planes_back_to_rows_by_the_kernel_where_rows_allow(layout, by_kernel, monkeypatch):
    """Rows the kernel can address (unit column stride, leading dimensions merging into one stride) are
    written by `dq_from_planes_kernel`, ragged rows included; others by PyTorch's copy; both put plane c's
    row r at columns [64 c, 64 c + 64)."""
    from cs336_systems.attention.kernels import triton_backward as flash_triton_backward
    from cs336_systems.attention.launch.gluon import copy_dq

    device = "cuda" if HAS_CUDA else "cpu"
    heads, n = 3, 37  # not a multiple of the kernel's rows
    batch = 1 if layout == "a model's head views" else 2
    planes = torch.randn(batch, heads, 2, n, 64, device=device)
    if layout.endswith("head views"):  # (b, h, N, d) views of (b, N, h d) projections: they merge only at b = 1
        grad_q = head_views(torch.empty(batch, n, heads * 128, dtype=torch.bfloat16, device=device), heads)
    elif layout == "padded rows":  # rows 136 apart
        grad_q = torch.empty(batch, heads, n, 136, dtype=torch.bfloat16, device=device)[..., :128]
    else:  # a column stride of 2
        grad_q = torch.empty(batch, heads, n, 256, dtype=torch.bfloat16, device=device)[..., ::2]
    launched = []
    kernel = flash_triton_backward.dq_from_planes_kernel

    class Recording:
        def __getitem__(self, grid):
            launched.append(grid)
            return kernel[grid]

    monkeypatch.setattr(flash_triton_backward, "dq_from_planes_kernel", Recording())
    copy_dq(grad_q, planes.reshape(batch * heads, n, 128))
    assert len(launched) == int(by_kernel)
    expected = torch.cat([planes[:, :, 0], planes[:, :, 1]], dim=-1)
    if HAS_CUDA or not by_kernel:
        assert torch.equal(grad_q, expected.to(torch.bfloat16))
    else:  # Triton's interpreter rounds fp32 to bf16 toward zero, the GPU to nearest: within one bf16 step
        torch.testing.assert_close(grad_q.float(), expected, rtol=2**-7, atol=0)


@pytest.mark.skipif(not (HAS_CUDA or kernels_interpreted()), reason="needs a CUDA device or the Triton interpreter")
@pytest.mark.parametrize("n", [64, 100])
def test_backward_preprocess_kernel(n):
    """D = rowsum(dO * O) per row and the fp32 dQ accumulator zeroed, ragged rows included."""
    from cs336_systems.attention.kernels.triton_backward import flash_bwd_preprocess_kernel

    device = "cuda" if HAS_CUDA else "cpu"
    gen = torch.Generator().manual_seed(0)
    out, do = (torch.randn(2, 3, n, 16, generator=gen).to(device, torch.bfloat16) for _ in range(2))
    delta = torch.full((2, 3, n), float("nan"), device=device)
    dq_acc = torch.full((6, n, 16), float("nan"), device=device)
    flash_bwd_preprocess_kernel[(-(-n // 32), 6)](
        out, do, delta, dq_acc, n * 16, 16, n * 16, 16, n, 1, n, D=16, ROWS=32
    )
    torch.testing.assert_close(delta, (out.float() * do.float()).sum(-1), rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(dq_acc) == 0


def test_as_rows_reads_in_place_where_leading_dimensions_merge():
    from cs336_systems.attention.launch.layout import as_rows, output_strides

    x = torch.empty(2, 3, 40, 16)
    assert as_rows(x)[0] is x and as_rows(x)[1] == (40 * 16, 16, 1)
    assert as_rows(x[:, 1])[0].data_ptr() == x[:, 1].data_ptr() and as_rows(x[:, 1])[1] == (3 * 40 * 16, 16, 1)
    assert as_rows(x[0])[1] == (40 * 16, 16, 1) and as_rows(x[0, 0])[1] == (40 * 16, 16, 1), "3-D, and 2-D: one batch"
    assert as_rows(x[:1, :1])[1] == (40 * 16, 16, 1), "size-1 leading dimensions step nowhere"
    model_view = (
        torch.arange(2 * 40 * 3 * 16.0).view(2, 40, 3, 16).transpose(1, 2)
    )  # (batch, seq, heads, d) as heads-first
    rows, strides = as_rows(model_view)
    assert rows.shape == (6, 40, 16) and strides == (40 * 16, 16, 1) and rows.is_contiguous(), (
        "copied: 2 and 3 do not merge"
    )
    assert torch.equal(rows, model_view.reshape(6, 40, 16))
    assert as_rows(x.transpose(-1, -2))[1] == (40 * 16, 1, 16), "row and column strides are kept as they are"
    lse = torch.empty(2, 3, 40)
    assert as_rows(lse, row_dims=1)[1] == (40, 1)
    with pytest.raises(ValueError, match=r"output of shape \(2, 3, 40, 16\).*merge into one batch stride"):
        output_strides(torch.empty(2, 40, 3, 16).transpose(1, 2))


def test_head_views_split_projections_in_place_as_a_model_does():
    from cs336_systems.attention.launch.layout import read_in_place

    projections = torch.arange(2 * 40 * 3 * 16.0).view(2, 40, 48)
    views = head_views(projections, 3)
    assert views.shape == (2, 3, 40, 16) and views.stride() == (40 * 48, 16, 48, 1)
    assert views.data_ptr() == projections.data_ptr() and torch.equal(views[1, 2, 5], projections[1, 5, 32:])
    assert read_in_place(head_views(projections[:1], 3)) and not read_in_place(views), "in place at batch 1 only"
    with pytest.raises(ValueError, match="width 48 do not split into 5 heads"):
        head_views(projections, 5)


def forward_plans(launches) -> list:
    """The forward's launch plans in the order they were derived (each route also plans its backward)."""
    return [plan for key, plan in launches.plans.items() if key[0] == "forward"]


def test_launch_plans_are_kept_per_geometry(small_tiles, triton_device, monkeypatch):
    """A launch plan (grid, strides, copies, constexprs) is derived once per geometry and reused;
    the same shape with other strides, another fp32 matmul precision or a misaligned start gets
    its own plan, and every call stays correct."""
    from cs336_systems.attention.configs import sm_count
    from cs336_systems.attention.heuristics import is_small_grid
    from cs336_systems.attention.launch.plans import LAUNCHES

    monkeypatch.setattr(LAUNCHES, "plans", {})
    monkeypatch.setattr(LAUNCHES, "routes", {})
    gen = torch.Generator().manual_seed(0)
    contiguous = [torch.randn(2, 3, 40, 16, generator=gen).to(triton_device) for _ in range(3)]
    # (batch, seq, heads, d) viewed heads-first: same shape, leading dimensions that do not merge
    model_view = [torch.randn(2, 40, 3, 16, generator=gen).to(triton_device).transpose(1, 2) for _ in range(3)]
    for inputs, plans_after in ((contiguous, 1), (contiguous, 1), (model_view, 2), (contiguous, 2)):
        out = FlashAttentionTriton.apply(*inputs, True)
        assert len(forward_plans(LAUNCHES)) == plans_after
        assert rel_error(out, reference(*inputs, True)[0]) < 1e-3
    plans = forward_plans(LAUNCHES)
    assert plans[0].copies == (False,) * 5 and plans[1].copies == (True, True, True, False, False)
    assert plans[0].scalars[:3] == (40 * 16, 16, 1) and plans[1].scalars[:3] == (40 * 16, 16, 1), "the copy's strides"

    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        FlashAttentionTriton.apply(*contiguous, True)
    finally:
        torch.set_float32_matmul_precision(previous)
    assert forward_plans(LAUNCHES)[-1].meta["INPUT_PRECISION"] == "tf32" != plans[0].meta["INPUT_PRECISION"]

    leaves = [torch.randn(2 * 40 * 64 + 1, generator=gen).to(triton_device, torch.bfloat16) for _ in range(3)]
    for offset in (0, 1):
        q, k, v = (t[offset : offset + 2 * 40 * 64].view(2, 40, 64) for t in leaves)
        out = FlashAttentionTriton.apply(q, k, v, False)
        small = is_small_grid(
            "forward", 2, 40, 40, sm_count(q.device)
        )  # a small grid's forward reads by block pointers
        assert forward_plans(LAUNCHES)[-1].meta["USE_TMA"] == (
            offset == 0 and reads_by_tma(leaves[0][:64]) and not small
        )
        assert rel_error(out, reference(q, k, v, False)[0]) < 1e-2


def test_forward_route_is_decided_once_per_geometry(small_tiles, triton_device, monkeypatch):
    """The forward checks its inputs and picks its kernel and launch plan once per geometry: a second call
    of one geometry re-derives nothing, another geometry, causality or `tiles` override gets its own route,
    a configuration table reload forgets them all, and bad inputs still get the checks' errors."""
    from cs336_systems.attention.configs import reload_config_table
    from cs336_systems.attention.launch.plans import LAUNCHES

    LAUNCHES.routes.clear()  # the cache itself: a reload must clear it
    checks = []
    check = flash_dispatch.check_triton_inputs
    monkeypatch.setattr(
        flash_dispatch, "check_triton_inputs", lambda *args: (checks.append(args[0].shape), check(*args))[1]
    )
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 40, 16, generator=gen).to(triton_device) for _ in range(3))
    for _ in range(2):
        out = FlashAttentionTriton.apply(q, k, v, True)
        assert rel_error(out, reference(q, k, v, True)[0]) < 1e-3
    assert len(checks) == 1 and len(LAUNCHES.routes) == 1
    FlashAttentionTriton.apply(q, k, v, False)
    FlashAttentionTriton.apply(q[:, :24], k, v, True)
    assert len(checks) == 3 and len(LAUNCHES.routes) == 3
    monkeypatch.setattr(DEFAULTS, "tiles", (32, 16))
    out = FlashAttentionTriton.apply(q, k, v, True)
    assert len(LAUNCHES.routes) == 4 and rel_error(out, reference(q, k, v, True)[0]) < 1e-3
    assert {route.forward.meta["Q_TILE_SIZE"] for route in LAUNCHES.routes.values()} == {16, 32}
    reload_config_table()
    assert not LAUNCHES.routes
    with pytest.raises(ValueError, match="q, k and v must share the last"):
        FlashAttentionTriton.apply(q, k, v[..., :8], True)
    with pytest.raises(ValueError, match="k must be a torch.Tensor, got list"):
        FlashAttentionTriton.apply(q, [[0.0]], v, True)


def test_backward_route_is_decided_once_per_geometry(small_tiles, triton_device, monkeypatch):
    """The backward follows the route its forward decided (each kernel's configuration and launch plan read once
    per geometry): a second backward of one geometry re-derives nothing and gives the same gradients, a
    non-dense upstream gradient is copied and takes the same route, inputs the kernels cannot read in place
    have a route without a backward and the backward decides for their copies, views they read in place (a
    model's batch-1 heads-first views) get gradients in the views' strides, and a configuration table reload
    forgets the routes."""
    from cs336_systems.attention.configs import reload_config_table
    from cs336_systems.attention.launch.plans import LAUNCHES

    LAUNCHES.routes.clear()  # the cache itself: a reload must clear it
    configs = []
    kernel_configs = flash_dispatch.kernel_configs
    monkeypatch.setattr(
        flash_dispatch, "kernel_configs", lambda *args: (configs.append(args[0]), kernel_configs(*args))[1]
    )
    gen = torch.Generator().manual_seed(4)
    q, k, v, do = (torch.randn(2, 40, 16, generator=gen).to(triton_device) for _ in range(4))
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        FlashAttentionTriton.apply(*leaves, True).backward(do)
        grads.append([t.grad for t in leaves])
    assert len(configs) == 1 and len(LAUNCHES.routes) == 1
    assert all(torch.equal(a, b) for a, b in zip(*grads))

    def expected(grad_out, inputs=(q, k, v)):
        out64, _, leaves64 = reference(*inputs, True)
        out64.backward(grad_out.double())
        return [t.grad for t in leaves64]

    for grad, ref in zip(grads[0], expected(do)):
        assert rel_error(grad, ref) < 1e-3
    route = next(iter(LAUNCHES.routes.values()))
    assert (
        isinstance(route.backward, flash_dispatch.BackwardRoute) and route.backward.dq.grid and route.backward.dkdv.grid
    )

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    strided_do = torch.randn(2, 16, 40, generator=gen).to(triton_device).transpose(1, 2)
    FlashAttentionTriton.apply(*leaves, True).backward(strided_do)  # copied dense: the same geometry's route
    assert len(configs) == 1 and len(LAUNCHES.routes) == 1
    for grad, ref in zip([t.grad for t in leaves], expected(strided_do)):
        assert rel_error(grad, ref) < 1e-3
    # (batch, seq, heads, d) viewed heads-first: inputs whose leading dimensions do not merge
    model_view = [torch.randn(2, 40, 3, 16, generator=gen).to(triton_device).transpose(1, 2) for _ in range(3)]
    leaves = [t.detach().requires_grad_() for t in model_view]
    do = torch.randn(2, 3, 40, 16, generator=gen).to(triton_device)
    FlashAttentionTriton.apply(*leaves, True).backward(do)
    views_route, copies_route = list(LAUNCHES.routes.values())[-2:]
    assert len(LAUNCHES.routes) == 3 and views_route.backward is None
    assert isinstance(copies_route.backward, flash_dispatch.BackwardRoute)
    for grad, ref in zip([t.grad for t in leaves], expected(do, model_view)):
        assert rel_error(grad, ref) < 1e-3
    # batch 1: the heads-first views' leading dimensions merge, the kernels read them in place
    model_view = [torch.randn(1, 40, 3, 16, generator=gen).to(triton_device).transpose(1, 2) for _ in range(3)]
    leaves = [t.detach().requires_grad_() for t in model_view]
    do = torch.randn(1, 3, 40, 16, generator=gen).to(triton_device)
    grads = torch.autograd.grad(FlashAttentionTriton.apply(*leaves, True), leaves, do)  # as the kernels wrote them
    route = list(LAUNCHES.routes.values())[-1]
    assert len(LAUNCHES.routes) == 4 and isinstance(route.backward, flash_dispatch.BackwardRoute)
    assert [g.stride() for g in grads] == [t.stride() for t in leaves]
    for grad, ref in zip(grads, expected(do, model_view)):
        assert rel_error(grad, ref) < 1e-3
    reload_config_table()
    assert not LAUNCHES.routes


def test_launch_rejects_per_row_vectors_with_different_strides(triton_device):
    from cs336_systems.attention.configs import KernelConfig
    from cs336_systems.attention.launch.plans import launch_dq

    q = torch.randn(2, 40, 16, device=triton_device)
    lse, delta = torch.zeros(2, 40, device=triton_device), torch.zeros(40, 2, device=triton_device).t()
    with pytest.raises(ValueError, match=r"per-row vectors with one set of strides.*\(40, 1\) and \(1, 2\)"):
        launch_dq(q, q, q, q, q, lse, delta, torch.empty_like(q), False, KernelConfig(16, 16, 4, 1))


def _forward_with_chunk(q, k, v, is_causal, kv_chunk, config):
    from cs336_systems.attention.launch.plans import launch_forward

    out, lse = torch.empty_like(q), torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    launch_forward(q, k, v, out, lse, is_causal, config, kv_chunk)
    return out, lse


@pytest.mark.parametrize(
    "shape_q, shape_kv, is_causal, chunk_tiles",
    [
        ((2, 70, 16), (2, 70, 16), True, 1),
        ((1, 64, 24), (1, 100, 24), True, 2),
        ((3, 50, 16), (3, 90, 16), False, 2),
        ((1, 2, 40, 16), (1, 2, 40, 16), True, 3),
        ((1, 90, 16), (1, 40, 16), True, 1),
    ],
    ids=["causal-ragged-1", "causal-nq<nk-d24-2", "full-2", "causal-4d-3", "causal-nq>nk-1"],
)
def test_split_key_forward_matches_float64(triton_device, shape_q, shape_kv, is_causal, chunk_tiles):
    """Each query tile's keys split over programs (chunks of `chunk_tiles` 16-key tiles), partials merged
    by the last program: O and L match float64, and the workspace's arrival counts are back at zero,
    so a second launch reuses it uncleared and is right again."""
    from cs336_systems.attention.configs import KernelConfig
    from cs336_systems.attention.launch.plans import LAUNCHES

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(shape_q, generator=gen).to(triton_device)
    k, v = (torch.randn(shape_kv, generator=gen).to(triton_device) for _ in range(2))
    ref_out, ref_lse, _ = reference(q, k, v, is_causal)
    config = KernelConfig(16, 16, 4, 1)
    for _ in range(2):
        out, lse = _forward_with_chunk(q, k, v, is_causal, 16 * chunk_tiles, config)
        plan = list(LAUNCHES.plans.values())[-1]
        # causal: query tile i stops at key 16(i + 1), so no chunk lies past the last query tile's keys
        n_q, n_k = shape_q[-2], shape_kv[-2]
        keys = min(n_k, -(-n_q // 16) * 16) if is_causal else n_k
        assert plan.meta["SPLIT_KV"] and plan.grid[2] == -(-keys // (16 * chunk_tiles))
        assert rel_error(out, ref_out) < 1e-5 and rel_error(lse, ref_lse) < 1e-5
        partials, arrivals = LAUNCHES.split_workspace(q.device, plan.workspace)
        assert arrivals[: plan.workspace[1]].eq(0).all(), "an arrival count was left non-zero"
    unsplit, _ = _forward_with_chunk(q, k, v, is_causal, 0, config)
    assert not list(LAUNCHES.plans.values())[-1].meta["SPLIT_KV"]
    assert rel_error(out, unsplit.double()) < 1e-6


@pytest.mark.parametrize(
    "shape_q, shape_kv, is_causal",
    [
        ((1, 100, 16), (1, 100, 16), True),
        ((2, 64, 24), (2, 80, 24), True),
        ((1, 70, 16), (1, 70, 16), False),
        ((1, 1, 64, 32), (1, 1, 64, 32), True),
        ((1, 80, 16), (1, 64, 16), True),
    ],
    ids=["causal-ragged", "causal-nq<nk-d24", "full", "causal-4d", "causal-nq>nk"],
)
def test_split_backward_matches_float64(small_tiles, triton_device, monkeypatch, shape_q, shape_kv, is_causal):
    """fp32 on a grid smaller than the SMs (`backward_split`): the dQ kernel's key tiles and the dK/dV
    kernel's query tiles split over programs that add into zeroed gradients. Here the device is given 64
    SMs, so these tiny problems split; their gradients match float64, twice (the zeroing is per call)."""
    from cs336_systems.attention.launch.plans import LAUNCHES

    monkeypatch.setattr(flash_dispatch, "sm_count", lambda device: 64)
    for cache in (LAUNCHES.plans, LAUNCHES.routes):  # derived with the real SM count
        cache.clear()
    try:
        for _ in range(2):
            check_against_reference(
                FlashAttentionTriton.apply, shape_q, shape_kv, torch.float32, is_causal, triton_device
            )
        plans = {key[0]: plan for key, plan in LAUNCHES.plans.items()}
        assert plans["dq"].meta["SPLIT"] and plans["dq"].grid[2] > 1
        assert plans["dkdv"].meta["SPLIT"] and plans["dkdv"].grid[2] > 1
    finally:
        for cache in (LAUNCHES.plans, LAUNCHES.routes):
            cache.clear()


def test_backward_split_policy():
    from cs336_systems.attention.heuristics import backward_split

    # one head, N = 2,048, 64-row tiles on 132 SMs: 32 programs, 32 loop tiles -> 4 chunks of 8 tiles
    assert backward_split("dkdv", 1, 2048, 2048, 64, 64, 132) == (512, 4)
    assert backward_split("dq", 1, 2048, 2048, 64, 64, 132) == (512, 4)
    # a full grid, or too few loop tiles to keep MIN_SPLIT_TILES each: no split
    assert backward_split("dq", 8, 2048, 2048, 64, 64, 132) == (0, 1)
    assert backward_split("dkdv", 1, 128, 128, 64, 64, 132) == (0, 1)
    # the chunks cover the loop: chunks x rows >= N
    chunk, splits = backward_split("dkdv", 1, 1000, 3000, 32, 64, 132)
    assert splits > 1 and chunk % 32 == 0 and chunk * splits >= 1000 and chunk * (splits - 1) < 1000


def test_split_key_forward_rejects_a_chunk_off_the_key_tile(triton_device):
    from cs336_systems.attention.configs import KernelConfig

    q = torch.randn(1, 40, 16, device=triton_device)
    for chunk in (24, -16):
        with pytest.raises(
            ValueError, match=rf"kv_chunk must be 0 \(no split\) or a positive multiple of K_TILE = 16, got {chunk}"
        ):
            _forward_with_chunk(q, q, q, True, chunk, KernelConfig(16, 16, 4, 1))


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_triton_descriptor_and_pointer_reads_agree(small_tiles, triton_device, is_causal):
    """The same problem read through tensor descriptors (aligned inputs) and through block pointers
    (inputs starting 2 bytes off alignment): same outputs and gradients, ragged length and padded d."""
    gen = torch.Generator().manual_seed(0)
    shape = (2, 37, 24)
    size = torch.Size(shape).numel()
    results = []
    for offset in (0, 1):
        leaves = [torch.randn(size + offset, generator=gen).to(triton_device, torch.bfloat16) for _ in range(3)]
        q, k, v = (t[offset:].view(shape).requires_grad_() for t in leaves)
        if offset:  # same values as the aligned run
            with torch.no_grad():
                for t, aligned in zip((q, k, v), results[0][1]):
                    t.copy_(aligned)
        assert reads_by_tma(q, k, v) == (
            offset == 0 and (HAS_CUDA and torch.cuda.get_device_capability()[0] >= 9 or not HAS_CUDA)
        )
        out = FlashAttentionTriton.apply(q, k, v, is_causal)
        out.backward(torch.ones_like(out))
        results.append(([out.detach(), q.grad, k.grad, v.grad], [q.detach(), k.detach(), v.detach()]))
    for name, a, b in zip(("O", "dQ", "dK", "dV"), results[0][0], results[1][0]):
        torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2, msg=name)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_triton_sum_backward_reads_the_broadcast_gradient(small_tiles, triton_device, is_causal):
    # The leaderboard's o.sum().backward(): dO arrives as stride-0 ones and is read in place,
    # and q, k, v are slices of one leaf, as in the handout's timing.
    qkv = torch.randn(3, 2, 37, 16, device=triton_device).requires_grad_()
    out = FlashAttentionTriton.apply(*qkv, is_causal)
    out.sum().backward()
    ref_out, _, leaves = reference(*qkv, is_causal)
    ref_out.sum().backward()
    for name, got, want in zip("qkv", qkv.grad, leaves):
        assert rel_error(got, want.grad) < 1e-3, name


def test_triton_backward_impl_is_chosen_per_call(small_tiles, triton_device):
    q = torch.randn(1, 20, 16, device=triton_device, requires_grad=True)
    grads = []
    for impl in ("triton", "pytorch"):
        out = FlashAttentionTriton.apply(q, q, q, True, impl)
        assert out.grad_fn.backward_impl == impl
        (grad,) = torch.autograd.grad(out.square().sum(), q)
        grads.append(grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="backward_impl 'cuda'"):
        FlashAttentionTriton.apply(q, q, q, False, "cuda")


def test_triton_rejects_bad_tiles(triton_device, monkeypatch):
    monkeypatch.setattr(DEFAULTS, "tiles", (16, 24))
    with pytest.raises(ValueError, match=r"tiles = \(16, 24\): k_tile must be a power of two >= 16, got 24"):
        FlashAttentionTriton.apply(*(torch.randn(1, 16, 16, device=triton_device) for _ in range(3)))


@pytest.mark.parametrize("attention", ["flash_pytorch", "flash_triton"])
def test_model_with_flash_attention_matches_naive(small_tiles, triton_device, attention):
    """TransformerLM hands (batch, heads, seq, d) q, k, v to the attention; logits and grads match naive."""
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 24), device=triton_device)
    results = []
    for name in ("naive", attention):
        torch.manual_seed(1)
        model = TransformerLM(100, 32, d_model=32, num_layers=1, num_heads=2, d_ff=64, attention=name).to(triton_device)
        logits = model(ids)
        logits.square().mean().backward()
        results.append((logits, model.layers[0].attn.q_proj.weight.grad))
    (ref_logits, ref_grad), (logits, grad) = results
    assert rel_error(logits, ref_logits.double()) < 1e-4
    assert rel_error(grad, ref_grad.double()) < 1e-3


# ---------------------------------------------------------------- is_causal as in scaled_dot_product_attention
# Upper-left alignment: query i sees keys j <= i (mask ones(N_q, N_k).tril(0)), so with N_q > N_k the
# queries i >= N_k see every key, and with N_k > N_q the keys j >= N_q are seen by no query (dK = dV = 0).


def check_causal_against_sdpa(apply, shape_q, shape_kv, dtype, device, tol):
    """O and the gradients of q, k, v (random upstream gradient) against the causal float64 reference (which
    equals SDPA's causal attention in float64, tests/test_attention_reference.py);
    the rows of keys that no query sees get gradients of exactly zero."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(shape_q, generator=gen).to(device, dtype).requires_grad_()
    k, v = (torch.randn(shape_kv, generator=gen).to(device, dtype).requires_grad_() for _ in range(2))
    grad = torch.randn(shape_q, generator=gen).to(device, dtype)
    out = apply(q, k, v, True)
    out.backward(grad)
    found = dict(O=out, dQ=q.grad, dK=k.grad, dV=v.grad)
    # relative to the reference's norm; absolute below 1, as for one query or one key, where dQ = dK = 0
    errors = {
        name: ((found[name].detach().double() - ref).norm() / ref.norm().clamp_min(1)).item()
        for name, ref in reference_gradients(q, k, v, grad, True).items()
        if name in found
    }
    bad = {name: e for name, e in errors.items() if not e < tol}  # NaN fails here too
    assert not bad, f"errors above {tol}: {bad} (all: {errors})"
    n_q = shape_q[-2]
    assert k.grad[..., n_q:, :].eq(0).all() and v.grad[..., n_q:, :].eq(0).all(), "a key no query sees got a gradient"
    return out


# (N_q, N_k): fewer and more queries than keys, lengths off every tile, and a single query or key
CAUSAL_RAGGED = {"q37_k100": (37, 100), "q100_k37": (100, 37), "q1_k65": (1, 65), "q65_k1": (65, 1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n_q, n_k", CAUSAL_RAGGED.values(), ids=CAUSAL_RAGGED.keys())
def test_pytorch_causal_matches_sdpa(small_tiles, n_q, n_k, dtype):
    check_causal_against_sdpa(
        FlashAttentionPytorch.apply, (2, n_q, 32), (2, n_k, 32), dtype, "cpu", 1e-5 if dtype == torch.float32 else 1e-12
    )


@pytest.mark.parametrize("tiles", [(16, 16), (32, 16), (16, 32)], ids=["q16_k16", "q32_k16", "q16_k32"])
@pytest.mark.parametrize("n_q, n_k", CAUSAL_RAGGED.values(), ids=CAUSAL_RAGGED.keys())
def test_triton_causal_matches_sdpa(small_tiles, triton_device, monkeypatch, n_q, n_k, tiles):
    monkeypatch.setattr(DEFAULTS, "tiles", tiles)
    check_causal_against_sdpa(
        FlashAttentionTriton.apply, (2, n_q, 16), (2, n_k, 16), torch.float32, triton_device, 1e-5
    )


@pytest.mark.parametrize("n_q, n_k", [(70, 150), (150, 70)], ids=["q70_k150", "q150_k70"])
def test_triton_split_causal_matches_sdpa(small_tiles, triton_device, monkeypatch, n_q, n_k):
    """The split-keys forward and the split fp32 backward kernels (64 SMs given: these one-head grids are
    small), N_q != N_k."""
    from cs336_systems.attention.launch.plans import LAUNCHES

    monkeypatch.setattr(flash_dispatch, "sm_count", lambda device: 64)
    caches = (LAUNCHES.plans, LAUNCHES.routes)  # derived with the real SM count
    for cache in caches:
        cache.clear()
    try:
        check_causal_against_sdpa(
            FlashAttentionTriton.apply, (1, n_q, 16), (1, n_k, 16), torch.float32, triton_device, 1e-5
        )
        plans = {key[0]: plan for key, plan in LAUNCHES.plans.items()}
        assert plans["forward"].meta["SPLIT_KV"] and plans["forward"].grid[2] > 1
        assert plans["dq"].meta["SPLIT"] and plans["dq"].grid[2] > 1
        assert plans["dkdv"].meta["SPLIT"] and plans["dkdv"].grid[2] > 1
    finally:
        for cache in caches:
            cache.clear()


@pytest.mark.parametrize("tiles", [(16, 16), (32, 16), (16, 32)], ids=["q16_k16", "q32_k16", "q16_k32"])
def test_triton_keys_no_query_sees_get_zero_gradients(small_tiles, triton_device, monkeypatch, tiles):
    """N_k > N_q: key tiles wholly past the last query run empty loops and must still store their zero dK, dV
    (the gradients are allocated uninitialised: here filled with NaN, so a skipped store shows)."""
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: empty_like(t, **kw).fill_(float("nan")))
    monkeypatch.setattr(DEFAULTS, "tiles", tiles)
    check_causal_against_sdpa(FlashAttentionTriton.apply, (1, 20, 16), (1, 90, 16), torch.float32, triton_device, 1e-5)


# ---------------------------------------------------------------- input validation


def _qkv(q_shape=(2, 16, 16), kv_shape=None, **kw):
    return torch.randn(q_shape, **kw), torch.randn(kv_shape or q_shape, **kw), torch.randn(kv_shape or q_shape, **kw)


@pytest.mark.parametrize("apply", [FlashAttentionPytorch.apply, FlashAttentionTriton.apply], ids=["pytorch", "triton"])
@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: _qkv((2, 16, 16), (2, 16, 32)), "last \\(head\\) dimension"),
        (lambda: _qkv((2, 16, 16), (3, 16, 16)), "leading"),
        (lambda: (torch.randn(2, 16, 16), torch.randn(2, 16, 16), torch.randn(2, 8, 16)), "same sequence length"),
        (lambda: (torch.randn(2, 16, 16), torch.randn(2, 16, 16).half(), torch.randn(2, 16, 16)), "one dtype"),
        (lambda: (torch.randn(2, 16, 16), torch.randn(2, 16, 16, device="meta"), torch.randn(2, 16, 16)), "one device"),
        (lambda: tuple(t.int() for t in _qkv()), "not supported"),
        (lambda: (torch.randn(16), torch.randn(16), torch.randn(16)), "shape \\(..., seq, d\\)"),
        (lambda: _qkv((2, 0, 16)), "empty"),
    ],
    ids=["head-dim", "leading-dims", "kv-lengths", "dtypes", "devices", "int-dtype", "1-d", "empty"],
)
def test_bad_inputs_raise_value_error(apply, make, message):
    with pytest.raises(ValueError, match=message):
        apply(*make())


@pytest.mark.parametrize("flash", [FlashAttentionPytorch, FlashAttentionTriton], ids=["pytorch", "triton"])
def test_causal_with_more_queries_than_keys_is_accepted(small_tiles, triton_device, flash):
    """Every query sees key 0, so N_q > N_k is no input error: queries i >= N_k see every key."""
    q, k, v = _qkv((1, 32, 16), (1, 16, 16), device="cpu" if flash is FlashAttentionPytorch else triton_device)
    out = flash.apply(q, k, v, True)
    torch.testing.assert_close(out[:, 16:], F.scaled_dot_product_attention(q, k, v)[:, 16:], atol=1e-5, rtol=1e-5)


NOT_BOOLS = ["False", 0, 1, None, np.bool_(True), torch.tensor(False)]


@pytest.mark.parametrize(
    "apply",
    [
        FlashAttentionPytorch.apply,
        FlashAttentionTriton.apply,
        FlashAttentionTriton.python_apply,
        flash_attention,
        naive_attention,
    ],
    ids=["pytorch", "triton", "triton-python", "flash_attention", "naive"],
)
def test_non_bool_is_causal_raises_type_error(small_tiles, triton_device, monkeypatch, apply):
    """As scaled_dot_product_attention: only a bool, so a truthy "False" cannot switch the mask on; refused
    also after a valid call of the same geometry (whose route or C++ program is then cached)."""
    if HAS_CUDA:  # the default tiles: a tiles override keeps eager calls off the C++ node
        monkeypatch.setattr(DEFAULTS, "tiles", None)
    on_cpu = apply in (FlashAttentionPytorch.apply, naive_attention)
    q, k, v = _qkv((1, 16, 16), device="cpu" if on_cpu else triton_device)
    apply(q, k, v, True)
    for is_causal in NOT_BOOLS:
        with pytest.raises(TypeError, match=f"is_causal must be a bool, not {type(is_causal).__name__}"):
            apply(q, k, v, is_causal)


def test_is_causal_is_checked_before_the_native_node(monkeypatch):
    """The C++ node looks its programs up by is_causal: `FlashAttentionTriton.apply` refuses a non-bool before
    the node sees it (whatever the tensors, CPU ones included)."""
    monkeypatch.setattr(flash_native, "attention", lambda *args: pytest.fail("the node saw a non-bool is_causal"))
    with pytest.raises(TypeError, match="is_causal must be a bool, not str"):
        FlashAttentionTriton.apply(*_qkv(), "False")


def test_triton_rejects_head_dim_over_256():
    with pytest.raises(ValueError, match="head dimension 320"):
        FlashAttentionTriton.apply(*_qkv((1, 16, 320)))


def test_triton_rejects_float64():
    with pytest.raises(ValueError, match="float64 is not supported"):
        FlashAttentionTriton.apply(*_qkv(dtype=torch.float64))


def test_triton_rejects_cpu_tensors_without_interpreter():
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        check_triton_inputs(*_qkv(), False, interpreted=False)


# ---------------------------------------------------------------- GPU (real kernels, default tiles)
# Each new (head dim, dtype, causal, fp32 precision, length alignment) compiles three Triton kernels
# (seconds each): the cases share head dimension 64, except the test about head dimensions.

GPU_CASES = [
    ((4, 1024, 64), (4, 1024, 64), torch.float32, True),
    ((2, 4, 1000, 64), (2, 4, 1000, 64), torch.bfloat16, True),
    ((2, 4, 777, 64), (2, 4, 1500, 64), torch.float16, True),
    ((2, 513, 64), (2, 513, 64), torch.bfloat16, False),
]


@gpu
@needs_cuda
@pytest.mark.parametrize("shape_q, shape_kv, dtype, is_causal", GPU_CASES)
def test_triton_on_gpu(shape_q, shape_kv, dtype, is_causal):
    check_against_reference(FlashAttentionTriton.apply, shape_q, shape_kv, dtype, is_causal, "cuda")


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "shape, dtype, is_causal",
    [
        (((1, 2, 300, 80), (1, 2, 300, 80)), torch.bfloat16, True),
        (((1, 2, 384, 256), (1, 2, 384, 256)), torch.float32, False),
    ],
    ids=["d80-padded", "d256-fp32-one-stage"],
)
def test_triton_head_dims_on_gpu(shape, dtype, is_causal):
    check_against_reference(FlashAttentionTriton.apply, *shape, dtype, is_causal, "cuda")


@gpu
@needs_cuda
@pytest.mark.parametrize("shape_q, shape_kv, dtype, is_causal", GPU_CASES[1:3])
def test_triton_with_pytorch_backward_on_gpu(monkeypatch, shape_q, shape_kv, dtype, is_causal):
    """The forward kernels of test_triton_on_gpu, the backward equations in (uncompiled) PyTorch."""
    monkeypatch.setattr(FlashAttentionPytorch, "compile_backward", False)
    monkeypatch.setattr(DEFAULTS, "backward_impl", "pytorch")
    check_against_reference(FlashAttentionTriton.apply, shape_q, shape_kv, dtype, is_causal, "cuda")


@gpu
@needs_cuda
@pytest.mark.parametrize("d", [64, 128])
def test_triton_fp32_is_fp32_accurate_on_gpu(d):
    """Under torch's default "highest" the products are tf32x3: fp32 rounding errors (about 1e-6 on an
    H100), where one TF32 product would leave about 1e-3."""
    assert torch.get_float32_matmul_precision() == "highest"
    check_against_reference(
        FlashAttentionTriton.apply, (2, 4, 1024, d), (2, 4, 1024, d), torch.float32, True, "cuda", tol=1e-5
    )


@gpu
@needs_cuda
@pytest.mark.parametrize("level", ["high", "medium"])
def test_triton_fp32_single_tf32_on_gpu(level):
    """torch's "high" and "medium": one TF32 product (10 mantissa bits), so the bar is that of 16-bit inputs."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(level)
    try:
        check_against_reference(
            FlashAttentionTriton.apply, (2, 4, 1024, 64), (2, 4, 1024, 64), torch.float32, True, "cuda", tol=1e-2
        )
    finally:
        torch.set_float32_matmul_precision(previous)


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "n, d, dtype",
    [(4096, 64, torch.bfloat16), (2000, 128, torch.bfloat16), (2048, 64, torch.float32)],
    ids=["bf16-d64", "bf16-d128-ragged", "fp32-d64"],
)
def test_split_key_forward_on_gpu(n, d, dtype):
    """One head leaves most SMs idle: the forward splits its keys where `kv_split_chunk` says so, and
    the result (backward included, which reads the merged L) matches float64 and the unsplit kernel."""
    from cs336_systems.attention.configs import kernel_configs, sm_count
    from cs336_systems.attention.heuristics import kv_split_chunk
    from cs336_systems.attention.launch.plans import LAUNCHES
    from cs336_systems.attention.validation import Problem, head_dim_tile

    shape = (1, 1, n, d)
    check_against_reference(FlashAttentionTriton.apply, shape, shape, dtype, True, "cuda")
    plan = next(p for key, p in LAUNCHES.plans.items() if key[0] == "forward" and key[-5][0] == shape)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(shape, generator=gen).to("cuda", dtype) for _ in range(3))
    config = kernel_configs(Problem.of(q, k, True)).forward
    chunk = kv_split_chunk(1, n, n, True, config.q_tile, config.k_tile, head_dim_tile(d), sm_count(q.device))
    assert chunk is not None, "one head on a GPU with this many SMs should split"
    assert plan.meta["SPLIT_KV"] and plan.scalars[-1] == chunk and plan.grid[2] == -(-n // chunk)
    assert not plan.meta["USE_TMA"], "a small grid's forward reads by block pointers"
    split, split_lse = _forward_with_chunk(q, k, v, True, None, config)
    unsplit, unsplit_lse = _forward_with_chunk(q, k, v, True, 0, config)
    assert rel_error(split, unsplit.double()) < (1e-6 if dtype == torch.float32 else 5e-3)
    assert (split_lse - unsplit_lse).abs().max().item() < 1e-4


@gpu
@needs_cuda
def test_split_key_forward_in_a_cuda_graph_on_gpu():
    """Captured into a CUDA graph, a split-key forward gets its own workspace, its arrival counts a slice
    of the slab zeroed before the capture (no memset in the graph): every replay is right, and so is
    an eager launch on the stream's own workspace in between."""
    from cs336_systems.attention.launch.plans import LAUNCHES

    shape = (1, 1, 4096, 64)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(shape, generator=gen).to("cuda", torch.bfloat16) for _ in range(3))
    ref_out, _, _ = reference(q, k, v, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        FlashAttentionTriton.apply(q, k, v, True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    carved = LAUNCHES.graph_arrivals[torch.cuda.current_device()][1]
    with torch.cuda.graph(graph):
        captured = FlashAttentionTriton.apply(q, k, v, True)
    plan = next(p for key, p in LAUNCHES.plans.items() if key[0] == "forward" and key[-5][0] == shape)
    assert (
        plan.meta["SPLIT_KV"] and LAUNCHES.graph_arrivals[torch.cuda.current_device()][1] == carved + plan.workspace[1]
    )
    for _ in range(3):
        captured.zero_()
        graph.replay()
        eager = FlashAttentionTriton.apply(q, k, v, True)
        torch.cuda.synchronize()
        assert rel_error(captured, ref_out) < TOL[torch.bfloat16] and rel_error(eager, ref_out) < TOL[torch.bfloat16]


@gpu
@needs_cuda
def test_triton_compiled_at_several_lengths_on_gpu():
    """torch.compile traces the kernels at the first length, then again with the length symbolic
    (dynamic shapes) at the next: every length, also across configuration buckets, stays correct."""
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(FlashAttentionTriton.apply)
    gen = torch.Generator().manual_seed(0)
    for n in (256, 384, 1000, 4096):
        q, k, v = (
            torch.randn(1, 4, n, 64, generator=gen).to("cuda", torch.bfloat16).requires_grad_() for _ in range(3)
        )
        grad = torch.randn(1, 4, n, 64, generator=gen).to("cuda", torch.bfloat16)
        out = compiled(q, k, v, True)
        out.backward(grad)
        ref_out, _, (q64, k64, v64) = reference(q, k, v, True)
        ref_out.backward(grad.double())
        errors = {
            name: rel_error(x, ref)
            for name, x, ref in (
                ("O", out, ref_out),
                ("dQ", q.grad, q64.grad),
                ("dK", k.grad, k64.grad),
                ("dV", v.grad, v64.grad),
            )
        }
        assert all(e < TOL[torch.bfloat16] for e in errors.values()), (n, errors)
    torch._dynamo.reset()


@gpu
@needs_cuda
def test_triton_launches_skip_the_jit_once_compiled_on_gpu(monkeypatch):
    """A launch signature's first call goes through Triton's JIT, later ones launch the compiled
    kernel directly (`triton_launch.CachedLauncher`); inputs of the same shape whose addresses
    Triton specializes differently (fp32 rows starting 4 bytes past 16-byte alignment: no
    vectorized loads) go through the JIT again. Every result matches float64."""
    from cs336_systems.attention.launch.plans import LAUNCHES

    jit_runs = []
    for launcher in LAUNCHES.launchers.values():
        monkeypatch.setattr(launcher, "signatures", {})
        run = launcher.kernel.run
        monkeypatch.setattr(launcher.kernel, "run", lambda *a, _run=run, **kw: (jit_runs.append(1), _run(*a, **kw))[1])
    shape = (2, 3, 300, 64)
    size = torch.Size(shape).numel()
    gen = torch.Generator().manual_seed(0)
    for offset, jit_runs_after in ((0, 3), (0, 3), (1, 6), (1, 6)):
        q, k, v = (
            torch.randn(size + offset, generator=gen).to("cuda")[offset:].view(shape).requires_grad_() for _ in range(3)
        )
        grad = torch.randn(shape, generator=gen).to("cuda")
        out = FlashAttentionTriton.apply(q, k, v, True)
        out.backward(grad)
        assert len(jit_runs) == jit_runs_after, (offset, len(jit_runs))
        ref_out, _, (q64, k64, v64) = reference(q, k, v, True)
        ref_out.backward(grad.double())
        for name, x, ref in (
            ("O", out, ref_out),
            ("dQ", q.grad, q64.grad),
            ("dK", k.grad, k64.grad),
            ("dV", v.grad, v64.grad),
        ):
            assert rel_error(x, ref) < TOL[torch.float32], (offset, name, rel_error(x, ref))


def test_fp32_input_precision_follows_torch():
    from cs336_systems.attention.launch.layout import input_precision

    previous = torch.get_float32_matmul_precision()
    try:
        seen = {}
        for level in ("highest", "high", "medium"):
            torch.set_float32_matmul_precision(level)
            seen[level] = (input_precision(torch.float32), input_precision(torch.bfloat16))
    finally:
        torch.set_float32_matmul_precision(previous)
    assert seen == {"highest": ("tf32x3", "tf32"), "high": ("tf32", "tf32"), "medium": ("tf32", "tf32")}


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_forward_on_gpu(monkeypatch, d, is_causal, dtype):
    """The Gluon forward (then the Gluon backward where it applies, else the Triton kernels) against
    float64 at a ragged N, the size limits lifted."""
    from cs336_systems.attention import heuristics

    monkeypatch.setattr(heuristics, "MIN_SEQ_LEN", {64: 0, 128: 0})
    monkeypatch.setattr(heuristics, "MIN_CTAS_PER_SM", {64: 0, 128: 0})
    monkeypatch.setattr(heuristics, "MIN_BATCH", {64: {True: 0, False: 0}, 128: {True: 0, False: 0}})
    shape = (2, 3, 1000, d)
    probe = torch.empty(shape, device="cuda", dtype=dtype)
    if not gluon_kernels(probe, probe, probe, is_causal, interpreted=False)[0]:
        pytest.skip(f"the Gluon forward does not run on {torch.cuda.get_device_name()}")
    check_against_reference(FlashAttentionTriton.apply, shape, shape, dtype, is_causal, "cuda")
    strided = probe.transpose(-1, -2).contiguous().transpose(-1, -2)  # unit stride along N: no descriptor reads it
    assert not gluon_kernels(strided, probe, probe, is_causal, interpreted=False)[0]


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "shape",
    [(2, 3, 1000, 64), (1, 4, 2048, 64), (1, 2, 960, 64), (1, 1, 1090, 64)],
    ids=["ragged", "tiled", "last_rows_past_n", "two_keys_in_last_half"],
)
def test_gluon_backward_on_gpu(monkeypatch, shape, dtype):
    """The fused Gluon backward (dQ by TMA reduce-add, summed over a CTA's two key halves) against float64,
    eager and under torch.compile (its custom op), the size limits lifted. At N = 960 the last key block's
    second warpgroup has all its keys past N (no paired tiles); at 1,090 it has 2."""
    from cs336_systems.attention import heuristics

    monkeypatch.setattr(heuristics, "MIN_SEQ_LEN", {64: 0, 128: 0})
    monkeypatch.setattr(heuristics, "MIN_CTAS_PER_SM", {64: 0, 128: 0})
    monkeypatch.setattr(heuristics, "MIN_BATCH", {64: {True: 0, False: 0}, 128: {True: 0, False: 0}})
    probe = torch.empty(shape, device="cuda", dtype=dtype)
    if not gluon_kernels(probe, probe, probe, True, interpreted=False)[1]:
        pytest.skip(f"the Gluon backward does not run on {torch.cuda.get_device_name()}")
    assert not gluon_kernels(probe, probe, probe, False, interpreted=False)[1], "causal only"
    check_eager_and_compiled_on_gpu(shape, dtype, True)


def check_eager_and_compiled_on_gpu(shape, dtype, is_causal):
    """`FlashAttentionTriton.apply` against float64 eagerly, then under torch.compile with the leaderboard's
    upstream gradient (`out.sum()`: a stride-0 broadcast)."""
    import torch._dynamo

    check_against_reference(FlashAttentionTriton.apply, shape, shape, dtype, is_causal, "cuda")
    torch._dynamo.reset()
    try:
        gen = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(shape, generator=gen).to("cuda", dtype).requires_grad_() for _ in range(3))
        out = torch.compile(FlashAttentionTriton.apply)(q, k, v, is_causal)
        out.sum().backward()
        ref_out, _, (q64, k64, v64) = reference(q, k, v, is_causal)
        ref_out.sum().backward()
        errors = {
            name: rel_error(x, ref)
            for name, x, ref in (
                ("O", out, ref_out),
                ("dQ", q.grad, q64.grad),
                ("dK", k.grad, k64.grad),
                ("dV", v.grad, v64.grad),
            )
        }
        assert all(e < TOL[dtype] for e in errors.values()), errors
    finally:
        torch._dynamo.reset()


@gpu
@needs_cuda
@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "shape",
    [(2, 3, 1000, 128), (1, 4, 2048, 128), (1, 2, 960, 128), (1, 1, 1090, 128)],
    ids=["ragged", "tiled", "last_rows_past_n", "two_keys_in_last_half"],
)
def test_gluon_backward_d128_on_gpu(monkeypatch, shape, dtype, is_causal):
    """d = 128's fused backward (each warpgroup adds a column half of dQ, query tiles last to first) against
    float64, eager and under torch.compile, the size limits lifted; N_q != N_k stays with the Triton kernels."""
    from cs336_systems.attention import heuristics

    monkeypatch.setattr(heuristics, "D128_BWD_MIN_SEQ_LEN", 0)
    monkeypatch.setattr(heuristics, "D128_BWD_MIN_CTAS_PER_SM", 0)
    probe = torch.empty(shape, device="cuda", dtype=dtype)
    if not gluon_kernels(probe, probe, probe, is_causal, interpreted=False)[1]:
        pytest.skip(f"the Gluon backward does not run on {torch.cuda.get_device_name()}")
    assert not gluon_kernels(probe, probe[..., :-1, :], probe[..., :-1, :], is_causal, interpreted=False)[1]
    check_eager_and_compiled_on_gpu(shape, dtype, is_causal)


@gpu
@needs_cuda
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_backward_gives_a_models_head_views_gradients_in_their_strides(monkeypatch, d):
    """On the fused backward's route, (1, h, N, d) views of (1, N, h d) projections get gradients in the
    views' strides (autograd then needs no copy), equal to float64's within tolerance."""
    from cs336_systems.attention import configs as flash_configs
    from cs336_systems.attention import heuristics
    from cs336_systems.attention.reference import TOLERANCE, reference_gradients
    from cs336_systems.benchmarking.attention_registry import implementation, relative_errors

    for name, value in (
        ("MIN_SEQ_LEN", {64: 0, 128: 0}),
        ("MIN_CTAS_PER_SM", {64: 0, 128: 0}),
        ("MIN_BATCH", {64: {True: 0, False: 0}, 128: {True: 0, False: 0}}),
        ("D128_BWD_MIN_SEQ_LEN", 0),
        ("D128_BWD_MIN_CTAS_PER_SM", 0),
    ):
        monkeypatch.setattr(heuristics, name, value)
    gen = torch.Generator(device="cuda").manual_seed(d)
    q, k, v = (
        head_views(torch.randn(1, 1000, 4 * d, device="cuda", dtype=torch.bfloat16, generator=gen), 4).requires_grad_()
        for _ in range(3)
    )
    if not gluon_kernels(q, k, v, True, interpreted=False)[1]:
        pytest.skip(f"the Gluon backward does not run on {torch.cuda.get_device_name()}")
    grad_out = torch.randn(1, 4, 1000, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    flash_configs.forget_answers()  # routes are kept per geometry: this one's, with the limits lifted, go after it
    try:
        raw = torch.autograd.grad(FlashAttentionTriton.python_apply(q, k, v, True), (q, k, v), grad_out)
        assert [g.stride() for g in raw] == [t.stride() for t in (q, k, v)]
        reference = reference_gradients(q, k, v, grad_out, True)
        errors = relative_errors(implementation("triton"), q, k, v, grad_out, True, reference)
        assert max(errors.values()) < TOLERANCE[torch.bfloat16].sweeps, errors
    finally:
        flash_configs.forget_answers()


@gpu
@needs_cuda
def test_pytorch_on_gpu():
    """The tiled forward and the torch.compile'd backward (compiled for this one case)."""
    check_against_reference(FlashAttentionPytorch.apply, (2, 2, 300, 64), (2, 2, 300, 64), torch.bfloat16, True, "cuda")


# (N_q, N_k) of one head, N_q != N_k: lengths off every tile, up to 16,384
GPU_CAUSAL_RAGGED = {
    "q1000_k3000": (1000, 3000),
    "q3000_k1000": (3000, 1000),
    "q4097_k16384": (4097, 16384),
    "q16384_k4097": (16384, 4097),
}


@gpu
@needs_cuda
@pytest.mark.parametrize("split", [False, True], ids=["as-planned", "split"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n_q, n_k", GPU_CAUSAL_RAGGED.values(), ids=GPU_CAUSAL_RAGGED.keys())
def test_causal_matches_sdpa_on_gpu(monkeypatch, n_q, n_k, d, dtype, split):
    """The real kernels against SDPA's causal attention, through the Python `autograd.Function`
    (`FlashAttentionTriton.python_apply`) and `FlashAttentionTriton.apply` (the C++ node where it builds).
    `split`: every forward splits its keys, in about 8 chunks of the longest query tile's, and (8,192 SMs
    given) every fp32 backward kernel splits its loop."""
    from cs336_systems.attention import configs as flash_configs
    from cs336_systems.attention import heuristics
    from cs336_systems.attention.launch import native as flash_native
    from cs336_systems.attention.launch.plans import LAUNCHES

    if split:
        monkeypatch.setattr(
            heuristics,
            "kv_split_chunk",
            lambda batch, n_q, n_k, is_causal, q_tile, k_tile, *rest: k_tile * -(-min(n_q, n_k) // (8 * k_tile)),
        )
        monkeypatch.setattr(flash_dispatch, "sm_count", lambda device: 8192)
    caches = (LAUNCHES.plans, LAUNCHES.routes)  # plans derived with the real SM count
    for cache in caches:
        cache.clear()
    flash_configs.forget_answers()  # the C++ node's programs too
    try:
        shape_q, shape_kv = (1, 1, n_q, d), (1, 1, n_k, d)
        check_causal_against_sdpa(FlashAttentionTriton.python_apply, shape_q, shape_kv, dtype, "cuda", TOL[dtype])
        plans = {key[0]: plan for key, plan in LAUNCHES.plans.items()}
        if split:
            assert plans["forward"].meta["SPLIT_KV"] and plans["forward"].grid[2] > 1
            if dtype == torch.float32:
                assert plans["dq"].meta["SPLIT"] and plans["dkdv"].meta["SPLIT"]
        out = check_causal_against_sdpa(FlashAttentionTriton.apply, shape_q, shape_kv, dtype, "cuda", TOL[dtype])
        if flash_native.load() is not None:
            assert out.grad_fn.name() == "FlashAttentionNativeBackward"
    finally:
        for cache in caches:
            cache.clear()
        flash_configs.forget_answers()


def test_attention_options_are_per_call_not_class_switches(triton_device, monkeypatch):
    """`tiles` and `backward_impl` are arguments of each call (else `DEFAULTS`'); the class-level switches of
    earlier versions are refused at the next call rather than silently ignored."""
    from cs336_systems.attention.api import flash_attention_triton

    q = torch.randn(1, 20, 16, device=triton_device, requires_grad=True)
    out = flash_attention_triton(q, q, q, True, tiles=(16, 32), backward_impl="pytorch")
    assert out.grad_fn.tiles == (16, 32) and out.grad_fn.backward_impl == "pytorch"
    monkeypatch.setattr(DEFAULTS, "tiles", (32, 16))
    assert FlashAttentionTriton.python_apply(q, q, q, True).grad_fn.tiles == (32, 16)
    with pytest.raises(ValueError, match=r"k_tile must be a power of two >= 16, got 24"):
        flash_attention_triton(q, q, q, tiles=(16, 24))
    monkeypatch.setattr(FlashAttentionTriton, "tiles", (16, 16), raising=False)
    with pytest.raises(AttributeError, match="not switches: pass them per call"):
        FlashAttentionTriton.apply(q, q, q)


def test_a_direct_function_call_takes_the_defaults_too(triton_device, monkeypatch):
    """torch.compile traces `forward` without our `apply` (dynamo calls the Function itself), so the forward
    fills unnamed options from `DEFAULTS` as `apply` does."""
    from torch.autograd import Function

    monkeypatch.setattr(DEFAULTS, "backward_impl", "pytorch")
    q = torch.randn(1, 20, 16, device=triton_device, requires_grad=True)
    out = Function.apply.__func__(FlashAttentionTriton, q, q, q, True)
    assert out.grad_fn.backward_impl == "pytorch"
