"""The C++ autograd node of FlashAttention (attention/launch/native.py, attention/launch/csrc/flash_autograd.cpp).

On CPU: the extension builds against this PyTorch and leaves CPU tensors to the Python path, and the
launch parameters it is given follow Triton's own launcher (the order `make_launcher` packs them in).
On a GPU: the node's outputs and gradients are the Python path's, for the geometries it serves, and
the calls it does not serve take the Python path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cs336_systems.attention.launch import native as flash_native  # noqa: E402
from cs336_systems.attention.launch.layout import head_views  # noqa: E402
from cs336_systems.attention.reference import TOLERANCE, reference_gradients, relative_error  # noqa: E402
from cs336_systems.benchmarking.attention_registry import implementation, relative_errors  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
gpu = pytest.mark.gpu  # `pytest -m gpu` runs the real kernels' tests (README)
KINDS = SimpleNamespace(TENSOR=0, I32=1, I64=2, I8=3, SCRATCH=4, NULL_POINTER=5, TENSOR_MAP=6)


@pytest.fixture(scope="module")
def native():
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build the extension with")
    module = flash_native.load()
    assert module is not None, flash_native.status()
    return module


def test_extension_builds_and_leaves_cpu_tensors_to_python(native):
    assert flash_native.status() == "loaded"
    q = torch.randn(1, 2, 8, 16)
    assert native.forward(q, q, q, True) is False
    assert flash_native.attention(q, q, q, True) is None
    # the parameter kinds and tensor slots Python packs are the extension's
    assert {name: getattr(native, name) for name in vars(KINDS)} == vars(KINDS)
    assert native.SLOTS["q"] == 0 and native.SLOTS["held"] == len(native.SLOTS) - 1


def test_an_extension_that_cannot_be_built_leaves_the_python_path(monkeypatch, capsys):
    from torch.utils import cpp_extension

    def failing_build(**kwargs):
        raise RuntimeError(
            "Error building extension 'x': [1/2] c++ -c flash_autograd.cpp\n"
            "flash_autograd.cpp:3:1: error: expected declaration\nninja: build stopped: subcommand failed."
        )

    monkeypatch.setattr(flash_native, "_module", None)
    monkeypatch.setattr(flash_native, "_failure", None)
    monkeypatch.setattr(cpp_extension, "load", failing_build)
    assert flash_native.load() is None
    assert flash_native.status() == "RuntimeError: flash_autograd.cpp:3:1: error: expected declaration"
    assert "eager calls take the Python autograd.Function" in capsys.readouterr().err
    monkeypatch.setattr(flash_native, "_failure", None)
    monkeypatch.setenv("CS336_FLASH_NATIVE", "0")
    assert flash_native.load() is None and flash_native.status() == "disabled by CS336_FLASH_NATIVE=0"


def _compiled(signature: dict, **metadata) -> SimpleNamespace:
    md = dict(
        num_ctas=1,
        launch_cooperative_grid=False,
        launch_pdl=False,
        profile_scratch_size=0,
        global_scratch_align=128,
        global_scratch_size=0,
        num_warps=4,
        shared=2048,
    )
    md.update(metadata)
    return SimpleNamespace(
        metadata=SimpleNamespace(**md), src=SimpleNamespace(signature=signature), name="kernel", function=0x1234
    )


def _triton_launcher_params(signature: dict) -> list[str]:
    """The kernel parameters Triton's generated launcher passes, in order (`void *params[] = {...}`)."""
    from triton.backends.nvidia.driver import make_launcher

    source = make_launcher({}, signature, None)
    return re.search(r"void \*params\[\] = \{ (.*?) \};", source).group(1).split(", ")


def test_launch_spec_follows_triton_launcher():
    # Two tensors, then integers as Triton specializes them: i32, a stride equal to 1 (a constant, not
    # passed), i64 past 2^31, then the constexprs.
    signature = {"q": "*bf16", "lse": "*fp32", "stride": "i32", "unit": "constexpr", "big": "i64", "D": "constexpr"}
    plan = SimpleNamespace(grid=(3, 2), scalars=(64, 1, 2**40))
    spec = flash_native.launch_spec(
        "dq", plan, ("q", "lse"), (0, 4), compiled=_compiled(signature, global_scratch_size=128), kinds=KINDS
    )
    assert spec["params"] == [
        (KINDS.TENSOR, 0),
        (KINDS.TENSOR, 4),
        (KINDS.I32, 64),
        (KINDS.I64, 2**40),
        (KINDS.SCRATCH, 0),
        (KINDS.NULL_POINTER, 0),
    ]
    launcher = _triton_launcher_params(signature)
    assert launcher == ["&arg0", "&arg1", "&arg2", "&arg4", "&global_scratch", "&profile_scratch"]
    assert len(spec["params"]) == len(launcher)
    assert spec["grid"] == [3, 2, 1] and spec["threads"] == 128 and spec["shared"] == 2048
    assert spec["scratch_bytes"] == 3 * 2 * 128 and spec["function"] == 0x1234
    # no global scratch: a null pointer in its place
    spec = flash_native.launch_spec("dq", plan, ("q", "lse"), (0, 4), compiled=_compiled(signature), kinds=KINDS)
    assert spec["params"][-2:] == [(KINDS.NULL_POINTER, 0), (KINDS.NULL_POINTER, 0)]


@pytest.mark.parametrize(
    "signature, metadata",
    [
        ({"q": "*bf16", "scale": "fp32"}, {}),  # a runtime float
        ({"q": "*bf16", "n": "i32"}, {"num_ctas": 2}),  # a cluster launch
        ({"q": "*bf16", "n": "i32"}, {"launch_pdl": True}),
        ({"q": "*bf16", "n": "i32"}, {"profile_scratch_size": 64}),
        ({"q": "*bf16", "n": "i32", "extra": "i32"}, {}),  # a runtime parameter the plan does not give
    ],
)
def test_launch_spec_refuses_what_the_node_does_not_launch(signature, metadata):
    plan = SimpleNamespace(grid=(1,), scalars=(0.5,) if "scale" in signature else (8,))
    with pytest.raises(flash_native.Unsupported):
        flash_native.launch_spec("dq", plan, ("q",), (0,), compiled=_compiled(signature, **metadata), kinds=KINDS)


# The Gluon route's launches compiled for sm_90a on this machine (tools/gluon_sm90_build.py's stand-in driver,
# in a subprocess: the test session sets TRITON_INTERPRET, under which nothing compiles), their launch specs,
# and what Triton's own launcher makes of the same compiled kernels: the C parameter list, and the
# descriptors' encode calls (`make_tensordesc_arg` calls `fill_tma_descriptor`, recorded here, not encoded).
GLUON_SPEC_SCRIPT = r"""
import json, re, sys
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])
import torch, triton
from gluon_sm90_build import HopperStandIn
from triton.backends.nvidia import driver as nvidia
from cs336_systems.attention.launch import gluon as flash_gluon
from cs336_systems.attention import heuristics
from cs336_systems.attention.launch import native as flash_native
from cs336_systems.attention.launch.layout import head_views

triton.runtime.driver.set_active(HopperStandIn())
kinds = SimpleNamespace(**json.loads(sys.argv[2]))
is_causal = sys.argv[3] == "causal"
names = ["q", "k", "v", "out", "lse", "grad_out", "delta", "grad_q", "grad_k", "grad_v", "dq_acc"]
heads, n, d = 4, 4100, 128  # a model's head views; a ragged N
q, k, v, grad_q, grad_k, grad_v = (head_views(torch.empty(1, n, heads * d, dtype=torch.bfloat16), heads)
                                   for _ in range(6))
out, grad_out = torch.empty(q.shape, dtype=q.dtype), torch.empty(q.shape, dtype=q.dtype)
lse, delta, dq_acc = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1]), torch.empty(heads, n, d)
tensors = dict(zip(names, (q, k, v, out, lse, grad_out, delta, grad_q, grad_k, grad_v, dq_acc)))
slots = {id(t): i for i, t in enumerate(tensors.values())}
sections = heuristics.gluon_sections(n, d, 2, heads, is_causal)
launches = [flash_gluon.forward_launch(q, k, v, out, lse, is_causal, sections[0]),
            flash_gluon.preprocess_launch(out, grad_out, delta, dq_acc),
            flash_gluon.backward_launch(q, k, v, grad_out, lse, delta, grad_k, grad_v, dq_acc, is_causal,
                                        sections[1]),
            flash_gluon.dq_copy_launch(grad_q, dq_acc)]
addresses = {t.data_ptr(): i for i, t in enumerate(tensors.values())}
found = []
for launch in launches:
    compiled = launch.kernel.warmup(*launch.args, grid=launch.grid, **launch.options)
    spec = flash_native.kernel_launch_spec(launch, slots, compiled=compiled, kinds=kinds)
    md = compiled.metadata
    source = nvidia.make_launcher({}, compiled.src.signature, md.tensordesc_meta)
    declared = re.search(r"static void _launch\((.*?)\) \{", source).group(1).split(", ")
    types = {p.rsplit(" ", 1)[1]: p.rsplit(" ", 1)[0] for p in declared}
    params = re.search(r"void \*params\[\] = \{ (.*?) \};", source).group(1).split(", ")
    assert params[-2:] == ["&global_scratch", "&profile_scratch"], params
    calls = []
    triton.runtime.driver.active.utils.fill_tma_descriptor = lambda *a: calls.append(a) or "map"
    descriptors = [a for a in launch.args if hasattr(a, "block_shape")]
    expanded = [nvidia.make_tensordesc_arg(a, m) for a, m in zip(descriptors, md.tensordesc_meta or [])]
    pointers = [addresses[a.data_ptr()] for a in launch.args if isinstance(a, torch.Tensor)]
    found.append(dict(spec=spec, launcher=[types.get(p[1:], p[1:]) for p in params], pointers=pointers,
                      calls=[[addresses[c[0]], *c[1:]] for c in calls], trailing=[e[1:] for e in expanded],
                      threads=32 * md.num_warps, shared=md.shared, grid=list(launch.grid)))
print(json.dumps(found))
"""
SLOT_NAMES = ["q", "k", "v", "out", "lse", "grad_out", "delta", "grad_q", "grad_k", "grad_v", "dq_acc"]


def _fill_tma_descriptor(address_slot, swizzle, elem_size, elem_type, block_size, shape, strides, padding) -> dict:
    """The CUtensorMap fields Triton 3.6's `fillTMADescriptor` (driver.c) passes to cuTensorMapEncodeTiled for
    these arguments: dims and box reversed, strides but the innermost reversed and in bytes, OOB fill NaN
    for padding 1."""
    rank = len(block_size)
    return dict(
        slot=address_slot,
        dtype=elem_type,
        dims=shape[::-1],
        box=block_size[::-1],
        strides=[elem_size * strides[i] for i in reversed(range(rank - 1))],
        swizzle=swizzle,
        fill=padding,
    )


@pytest.fixture(scope="module", params=["causal", "full"])
def gluon_route_specs(request):
    if not (Path(__import__("triton").__file__).parent / "backends/nvidia/bin/ptxas").exists():
        pytest.skip("triton's bundled ptxas is missing (not a Linux wheel)")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root / "lib") + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", GLUON_SPEC_SCRIPT, str(root / "tools"), json.dumps(vars(KINDS)), request.param],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(causal=request.param == "causal", launches=json.loads(result.stdout.strip().splitlines()[-1]))


def test_gluon_route_specs_follow_triton_launcher(gluon_route_specs):
    """The forward, the preprocess, the fused d = 128 backward and the dQ conversion of a model's head views
    at a ragged N: one parameter per parameter of Triton's launcher, of the same kind (each descriptor a
    CUtensorMap by value, then its shape as i32 and strides as i64; pointers; integers; both scratch
    pointers), each pointer and tensor map the slot of its tensor, each tensor map what Triton's launcher
    would encode, and the launch geometry of the compiled kernel."""
    kind_of = {"CUtensorMap": KINDS.TENSOR_MAP, "int32_t": KINDS.I32, "int64_t": KINDS.I64, "CUdeviceptr": KINDS.TENSOR}
    slot = {name: i for i, name in enumerate(SLOT_NAMES)}
    expected_maps = [["q", "k", "v", "out"], [], ["q", "k", "v", "grad_out", "grad_k", "grad_v", "dq_acc"], []]
    expected_pointers = [["lse"], ["out", "grad_out", "delta", "dq_acc"], ["lse", "delta"], ["dq_acc", "grad_q"]]
    for found, maps, pointers in zip(gluon_route_specs["launches"], expected_maps, expected_pointers):
        spec = found["spec"]
        assert [kind for kind, _ in spec["params"][:-2]] == [kind_of[ty] for ty in found["launcher"][:-2]], spec["name"]
        assert found["launcher"][-2:] == ["CUdeviceptr", "CUdeviceptr"]  # global and profile scratch
        assert spec["params"][-2:] == [[KINDS.NULL_POINTER, 0], [KINDS.NULL_POINTER, 0]]
        params = [tuple(p) for p in spec["params"]]
        assert [value for kind, value in params[:-2] if kind == KINDS.TENSOR] == [slot[p] for p in pointers]
        assert found["pointers"] == [slot[p] for p in pointers]
        assert spec.get("maps", []) == [_fill_tma_descriptor(*call) for call in found["calls"]]
        assert [m["slot"] for m in spec.get("maps", [])] == [slot[m] for m in maps]
        starts = [i for i, (kind, _) in enumerate(params) if kind == KINDS.TENSOR_MAP]
        assert [params[i][1] for i in starts] == list(range(len(maps)))
        assert [[value for _, value in params[i + 1 : i + 7]] for i in starts] == found["trailing"]
        assert spec["threads"] == found["threads"] and spec["shared"] == found["shared"]
        assert spec["grid"] == [*found["grid"], 1, 1][:3]
    forward, _, backward, _ = (found["spec"] for found in gluon_route_specs["launches"])
    # head views: (batch, N, d) with batch stride d and row stride h·d, read in 64-column (128-byte) boxes
    assert forward["maps"][0]["dims"] == [128, 4100, 4] and forward["maps"][0]["strides"] == [4 * 128 * 2, 128 * 2]
    assert forward["maps"][0]["box"] == [64, 64, 1] and forward["maps"][1]["box"] == [64, 128, 1]
    # causal: two heads' 2 MiB of K and V per section, heaviest first in one dimension (flash_gluon_schedule);
    # full: the (query block, head) grid
    blocks = -(-4100 // 128)
    assert forward["threads"] == 384
    assert forward["grid"] == ([blocks * 4, 1, 1] if gluon_route_specs["causal"] else [blocks, 4, 1])
    assert backward["grid"] == forward["grid"]  # 128 key rows per CTA, Q and dO as large as K and V
    # the dQ accumulator as (batch·2, N, 64) fp32 planes, 32-column (128-byte) boxes
    assert backward["maps"][-1]["dims"] == [64, 4100, 8] and backward["maps"][-1]["strides"] == [64 * 4, 4100 * 64 * 4]
    assert (
        backward["maps"][-1]["dtype"] == 7 and backward["maps"][-1]["box"][0] == 32
    )  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32


def test_compiled_launch_spec_refuses_descriptors_it_cannot_encode():
    desc = flash_native.TensorMapArg(0, (2, 64, 64), (4096, 64, 1), "zero")
    signature = {"q_desc": "tensordesc<bf16[1, 64, 64],NVMMASharedLayout()>", "n": "i32"}
    meta = dict(swizzle=3, elem_size=2, elem_type=10, block_size=[1, 64, 64], fp4_padded=False)
    spec = flash_native.compiled_launch_spec("k", _compiled(signature, tensordesc_meta=[meta]), (1,), (desc, 64), KINDS)
    assert spec["params"][:8] == [
        (KINDS.TENSOR_MAP, 0),
        (KINDS.I32, 2),
        (KINDS.I32, 64),
        (KINDS.I32, 64),
        (KINDS.I64, 4096),
        (KINDS.I64, 64),
        (KINDS.I64, 1),
        (KINDS.I32, 64),
    ]
    for compiled, args in (
        (_compiled(signature, tensordesc_meta=None), (desc, 64)),  # lowered to a pointer, not a TMA descriptor
        (_compiled(signature, tensordesc_meta=[{**meta, "fp4_padded": True}]), (desc, 64)),
        (_compiled(signature, tensordesc_meta=[meta]), (flash_native.TensorSlot(0), 64)),  # a pointer for a descriptor
        (_compiled(signature, tensordesc_meta=[meta]), (desc._replace(strides=(4096, 1, 64)), 64)),
    ):
        with pytest.raises(flash_native.Unsupported):
            flash_native.compiled_launch_spec("k", compiled, (1,), args, KINDS)


# --- GPU ------------------------------------------------------------------------------------------------------

GEOMETRIES = [
    ((1, 1, 1024, 64), torch.bfloat16, True),
    ((1, 1, 4096, 128), torch.bfloat16, True),
    ((2, 3, 333, 32), torch.float16, False),
    ((1, 2, 1000, 16), torch.bfloat16, True),
    ((1, 1, 512, 64), torch.float32, True),
    ((2, 4, 2048, 64), torch.bfloat16, False),
]


def _inputs(shape, dtype, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(shape, device="cuda", dtype=dtype, generator=generator).requires_grad_() for _ in range(3)]


def _run(fn, q, k, v, is_causal, grad_out):
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v, is_causal)
    out.backward(grad_out)
    return out, q.grad, k.grad, v.grad


@gpu
@needs_cuda
@pytest.mark.parametrize("shape, dtype, is_causal", GEOMETRIES)
def test_native_node_matches_python_path_and_float64(native, shape, dtype, is_causal):
    from cs336_systems.attention.api import FlashAttentionTriton, flash_attention_triton

    q, k, v = _inputs(shape, dtype)
    grad_out = torch.randn_like(q)
    out = flash_attention_triton(q, k, v, is_causal)
    assert out.grad_fn.name() == "FlashAttentionNativeBackward"
    assert FlashAttentionTriton.apply(q, k, v, is_causal).grad_fn.name() == "FlashAttentionNativeBackward"
    assert FlashAttentionTriton.python_apply(q, k, v, is_causal).grad_fn.name() == "FlashAttentionTritonBackward"
    ours = _run(flash_attention_triton, q, k, v, is_causal, grad_out)
    python = _run(FlashAttentionTriton.python_apply, q, k, v, is_causal, grad_out)
    for name, a, b in zip(("O", "dQ", "dK", "dV"), ours, python):
        torch.testing.assert_close(a, b, msg=lambda m, name=name: f"{name}: {m}")
    reference = reference_gradients(q, k, v, grad_out, is_causal)
    errors = relative_errors(implementation("triton"), q, k, v, grad_out, is_causal, reference)
    assert max(errors.values()) < TOLERANCE[dtype].sweeps, errors


@gpu
@needs_cuda
def test_native_node_shows_its_saved_tensors_as_the_python_function_does(native):
    """grad_fn.saved_tensors: (L, Q, K, V, O), exactly one of them of shape q.shape[:-1] (the course's
    tests look for L there), equal to the Python path's; released by the backward."""
    from cs336_systems.attention.api import FlashAttentionTriton

    q, k, v = _inputs((2, 3, 1000, 64), torch.bfloat16)
    out = FlashAttentionTriton.apply(q, k, v, True)
    python = FlashAttentionTriton.python_apply(q, k, v, True)
    assert out.grad_fn.name() == "FlashAttentionNativeBackward" and out.grad_fn.is_causal is True
    saved, expected = out.grad_fn.saved_tensors, python.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved] == [tuple(t.shape) for t in expected]
    assert [t for t in saved if t.shape == q.shape[:-1]] == [saved[0]] and saved[0].dtype == torch.float32
    torch.testing.assert_close(saved[0], expected[0])
    for mine, theirs in zip(saved[1:4], (q, k, v)):
        assert mine.data_ptr() == theirs.data_ptr()
    torch.testing.assert_close(saved[4], out.detach())
    out.backward(torch.ones_like(out))
    with pytest.raises(RuntimeError):
        _ = out.grad_fn.saved_tensors


@gpu
@needs_cuda
def test_native_node_reads_a_broadcast_gradient_and_keeps_one_program_per_geometry(native):
    from cs336_systems.attention.api import flash_attention_triton

    q, k, v = _inputs((1, 2, 1024, 64), torch.bfloat16)
    before = native.size()
    for _ in range(3):
        for t in (q, k, v):
            t.grad = None
        flash_attention_triton(q, k, v, True).sum().backward()  # stride-0 upstream gradient
    assert native.size() == before + 1
    expected = reference_gradients(q, k, v, torch.ones_like(q), True)
    for grad, ref in zip((q.grad, k.grad, v.grad), (expected["dQ"], expected["dK"], expected["dV"])):
        assert relative_error(grad, ref) < TOLERANCE[torch.bfloat16].sweeps


@gpu
@needs_cuda
def test_native_node_guards_its_saved_tensors(native):
    from cs336_systems.attention.api import flash_attention_triton

    q, k, v = _inputs((1, 1, 1024, 64), torch.bfloat16)
    out = flash_attention_triton(q, k, v, True)
    with torch.no_grad():
        out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(torch.ones_like(out))
    # create_graph: the gradients exist, and a second backward through them fails when taken
    out = flash_attention_triton(q, k, v, True)
    (grad_q,) = torch.autograd.grad(out, q, torch.randn_like(out), create_graph=True)
    with pytest.raises(RuntimeError, match="not differentiable twice"):
        grad_q.sum().backward()
    # no grad: no node
    with torch.no_grad():
        assert flash_attention_triton(q, k, v, True).grad_fn is None
    # only k requires grad: one gradient, through the node
    q2, v2 = q.detach(), v.detach()
    out = flash_attention_triton(q2, k, v2, True)
    k.grad = None
    out.backward(torch.ones_like(out))
    assert k.grad is not None and q2.grad is None


@gpu
@needs_cuda
@pytest.mark.parametrize("d", [64, 128])
def test_native_node_reads_a_models_head_views_in_place(native, d):
    """A model's (1, h, N, d) views of its (1, N, h d) projections go through the node: O and the gradients
    equal the Python path's and float64's, and the gradients have the views' strides."""
    gen = torch.Generator(device="cuda").manual_seed(d)
    q, k, v = (
        head_views(torch.randn(1, 1000, 4 * d, device="cuda", dtype=torch.bfloat16, generator=gen), 4).requires_grad_()
        for _ in range(3)
    )
    grad_out = torch.randn(1, 4, 1000, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    _check_the_node(q, k, v, True, grad_out)


def _check_the_node(q, k, v, is_causal, grad_out):
    """The node serves the call; its gradients have the inputs' strides; O and the gradients equal the Python
    path's, and float64's within the dtype's tolerance."""
    from cs336_systems.attention.api import FlashAttentionTriton, flash_attention_triton

    assert flash_attention_triton(q, k, v, is_causal).grad_fn.name() == "FlashAttentionNativeBackward"
    ours = _run(flash_attention_triton, q, k, v, is_causal, grad_out)
    raw = torch.autograd.grad(flash_attention_triton(q, k, v, is_causal), (q, k, v), grad_out)  # as the node wrote them
    assert [g.stride() for g in raw] == [t.stride() for t in (q, k, v)]
    python = _run(FlashAttentionTriton.python_apply, q, k, v, is_causal, grad_out)
    for name, a, b in zip(("O", "dQ", "dK", "dV"), ours, python):
        torch.testing.assert_close(a, b, msg=lambda m, name=name: f"{name}: {m}")
    reference = reference_gradients(q, k, v, grad_out, is_causal)
    errors = relative_errors(implementation("triton"), q, k, v, grad_out, is_causal, reference)
    assert max(errors.values()) < TOLERANCE[q.dtype].sweeps, errors


@gpu
@needs_cuda
def test_calls_the_node_does_not_serve_take_the_python_path(native):
    from cs336_systems.attention.api import flash_attention_triton

    q, k, v = _inputs((2, 1024, 2, 64), torch.bfloat16)
    strided = [t.transpose(1, 2) for t in (q, k, v)]  # (batch, heads, N, d) views the kernels cannot read in place
    assert flash_attention_triton(*strided, True).grad_fn.name() == "FlashAttentionTritonBackward"
    q, k, v = _inputs((1, 1, 1024, 64), torch.bfloat16)
    assert (
        flash_attention_triton(q, k, v, True, backward_impl="pytorch").grad_fn.name() == "FlashAttentionTritonBackward"
    )
    flash_attention_triton(q, k, v, True)  # registered, then captured: the capture takes the Python path
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.no_grad():
        flash_attention_triton(q, k, v, True)
        with torch.cuda.graph(graph, stream=stream):
            captured = flash_attention_triton(q, k, v, True)
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        torch.testing.assert_close(captured, flash_attention_triton(q, k, v, True))


@pytest.fixture
def gluon_limits(monkeypatch):
    """`lift(backward)`: the Gluon forward at any size, and the fused d = 128 backward at any size (True) or
    never (False); the routes decided afresh before and after."""
    from cs336_systems.attention import heuristics
    from cs336_systems.attention.configs import forget_answers

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernels run on Hopper")

    def lift(backward: bool) -> None:
        for name, value in (
            ("MIN_SEQ_LEN", {64: 0, 128: 0}),
            ("MIN_CTAS_PER_SM", {64: 0, 128: 0}),
            ("MIN_BATCH", {64: {True: 0, False: 0}, 128: {True: 0, False: 0}}),
        ):
            monkeypatch.setattr(heuristics, name, value)
        floor = 0 if backward else float("inf")
        monkeypatch.setattr(heuristics, "D128_BWD_MIN_SEQ_LEN", floor)
        monkeypatch.setattr(heuristics, "D128_BWD_MIN_CTAS_PER_SM", floor)
        forget_answers()

    yield lift
    monkeypatch.undo()
    forget_answers()


@gpu
@needs_cuda
@pytest.mark.parametrize("views", [False, True], ids=["contiguous", "head views"])
@pytest.mark.parametrize(
    "d, n, is_causal, gluon_backward",
    [
        (128, 4100, True, False),
        (128, 4096, False, False),  # the Gluon forward, the Triton backward kernels
        (128, 1000, True, True),
        (128, 1000, False, True),
        (64, 1000, True, True),  # the Gluon kernels both ways
    ],
)
def test_native_node_launches_the_gluon_kernels(native, gluon_limits, views, d, n, is_causal, gluon_backward):
    """Where the route holds Gluon kernels, the node launches them with descriptors it encodes itself (and the
    fused backward between its two conversions): O and L bit for bit the Python path's (the same kernel), the
    gradients the Python path's, and all of them float64's within the dtype's tolerance; contiguous inputs
    and a model's head views, ragged N included."""
    from cs336_systems.attention.api import FlashAttentionTriton, flash_attention_triton
    from cs336_systems.attention.launch.dispatch import gluon_kernels

    gluon_limits(backward=gluon_backward)
    heads = 4
    gen = torch.Generator(device="cuda").manual_seed(n + d)
    if views:
        q, k, v = (
            head_views(
                torch.randn(1, n, heads * d, device="cuda", dtype=torch.bfloat16, generator=gen), heads
            ).requires_grad_()
            for _ in range(3)
        )
    else:
        q, k, v = (
            torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
            for _ in range(3)
        )
    assert gluon_kernels(q, k, v, is_causal, False) == (True, gluon_backward)
    grad_out = torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = flash_attention_triton(q, k, v, is_causal)
    python = FlashAttentionTriton.python_apply(q, k, v, is_causal)
    assert torch.equal(out, python)
    assert torch.equal(out.grad_fn.saved_tensors[0], python.grad_fn.saved_tensors[0])  # L
    _check_the_node(q, k, v, is_causal, grad_out)
