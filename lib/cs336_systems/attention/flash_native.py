"""FlashAttention-2's eager autograd node in C++ (`csrc/flash_autograd.cpp`): the same Triton kernels,
launched without Python on the host path.

Why: at short sequences an eager call's latency is its host time, and a Python `autograd.Function`
pays twice there: its backward runs Python on autograd's device thread (measured in
docs/flash_attention_tuning.md, v15-v16; tools/flash_host_probe.py). The C++ node launches the
kernels' loaded functions (`cuLaunchKernel`) with the parameters Triton's own launcher would pass,
allocates through PyTorch's caching allocator, and takes no GIL in the backward.

A *program* holds, per input geometry, each launch's function, grid, threads, shared memory and
parameters (`launch_spec`), derived here once from the Python path's own decisions (`flash_dispatch`'s
`decide_forward`, `decide_backward`) and the compiled kernels (Triton's `warmup`): the kernels,
configurations and launch plans are the Python path's, so both paths compute the same thing (tests/test_flash_native.py
checks the parameters against Triton's launcher on compiled kernels, and on a GPU the gradients).
The program covers the Triton kernels' route: inputs the kernels read in place (contiguous, or views whose
leading dimensions merge into one stride, such as a model's (1, h, N, d) views of its projections; the
gradients then have the views' strides) whose forward is not the Gluon kernel's
(`flash_gluon.gluon_forward_applies`: long sequences with work for three CTAs per SM, where the host
time is hidden anyway). Every other call takes `FlashAttentionTriton` (the Python autograd.Function): CPU
tensors, the interpreter, torch.compile, tensor subclasses, a `tiles` override, the PyTorch backward,
Triton launch hooks (profilers that read them), and streams capturing a CUDA graph.

The extension is built on first use with `torch.utils.cpp_extension.load` (a C++ compiler and ninja;
about a minute, cached per source and PyTorch version). Where it cannot be built, or with
CS336_FLASH_NATIVE=0, eager calls take the Python path, and `status()` says why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import types
from pathlib import Path

import torch

from cs336_systems.attention.flash_configs import register_answer_cache
from cs336_systems.attention.flash_dispatch import GLUON, decide_backward, decide_forward
from cs336_systems.attention.flash_launch import LAUNCHES
from cs336_systems.attention.flash_layout import INTERPRETED, read_in_place
from cs336_systems.attention.triton_launch import grid3, launch_hooks_set
from cs336_systems.attention.validation import check_triton_inputs

SOURCE = Path(__file__).with_name("csrc") / "flash_autograd.cpp"
EXTENSION_NAME = "cs336_flash_autograd"

_lock = threading.Lock()
_module = None
_failure: str | None = None


def enabled_by_environment() -> bool:
    return os.environ.get("CS336_FLASH_NATIVE", "1") != "0"


def load(verbose: bool = False):
    """The built extension module, building it where needed; None where it cannot be (see `status`)."""
    global _module, _failure
    if _module is not None or _failure is not None:
        return _module
    with _lock:
        if _module is not None or _failure is not None:
            return _module
        if not enabled_by_environment():
            _failure = "disabled by CS336_FLASH_NATIVE=0"
            return None
        if shutil.which("ninja") is None:  # the ninja package's binary, where this interpreter's bin/ is not on PATH
            with contextlib.suppress(ImportError):
                import ninja

                os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        try:
            from torch.utils.cpp_extension import load as build

            print(f"cs336_systems: loading the FlashAttention autograd node ({SOURCE.name}; its first build for this "
                  f"source and PyTorch takes about a minute)", file=sys.stderr, flush=True)
            module = build(name=EXTENSION_NAME, sources=[str(SOURCE)], extra_cflags=["-O2"], verbose=verbose)
        except Exception as err:  # no compiler, no ninja, no headers: the Python path serves
            lines = str(err).strip().splitlines()
            # a compiler's first error says more than ninja's closing "build stopped"
            reason = next((line for line in lines if "error:" in line), lines[-1] if lines else "")
            _failure = f"{type(err).__name__}: {reason.strip()}"[:400]
            print(f"cs336_systems: the FlashAttention autograd node could not be built ({_failure}); eager calls "
                  f"take the Python autograd.Function", file=sys.stderr, flush=True)
            return None
        # Programs embed configurations: a table store or reload forgets them with the other derived answers.
        register_answer_cache(types.SimpleNamespace(clear=module.clear))
        _module = module
        return module


def status() -> str:
    """'loaded', 'not built yet', or why the extension is not used."""
    if _module is not None:
        return "loaded"
    return _failure or "not built yet"


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              tiles: tuple[int, int] | None = None) -> torch.Tensor | None:
    """O of an eager call through the C++ node (with the Triton backward), or None where the call belongs
    to the Python path (`flash_triton.flash_attention_triton` then takes it): among others, a `tiles`
    override of the kernels' configurations."""
    if torch.compiler.is_compiling() or type(q) is not torch.Tensor or not q.is_cuda:
        return None
    if tiles is not None or launch_hooks_set():
        return None
    native = _module if _module is not None else load()
    if native is None:
        return None
    is_causal = bool(is_causal)
    out = native.forward(q, k, v, is_causal)
    if out is None:
        register(native, q, k, v, is_causal)
        out = native.forward(q, k, v, is_causal)
    return None if out is False or out is None else out


class Unsupported(Exception):
    """A launch the C++ node does not make (the call then takes the Python path)."""


def register(native, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> None:
    """Derive and register the program of this geometry, or mark it as the Python path's.
    Bad inputs raise the Python path's ValueError (`check_triton_inputs`)."""
    try:
        program = derive_program(native.SLOTS, q, k, v, is_causal)
    except Unsupported:
        program = None
    if program is None:
        native.register_program(q, k, v, is_causal, None, None, [], [])
    else:
        native.register_program(q, k, v, is_causal, *program)


def derive_program(slots: dict, q, k, v, is_causal: bool):
    """(forward launch specs, backward launch specs, held tensors, zeroed gradient slots) of this geometry,
    or None where the Python path serves it (module docstring)."""
    check_triton_inputs(q, k, v, is_causal, INTERPRETED)
    if INTERPRETED or not all(read_in_place(t) and t.data_ptr() % 16 == 0 for t in (q, k, v)):
        return None
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    plan = decide_forward(q, k, v, out, lse, is_causal, None)
    if plan is GLUON:
        return None
    if True in plan.copies:
        return None
    s = slots
    if plan.workspace:
        held = list(LAUNCHES.split_workspace(q.device, plan.workspace))
        forward_slots, workspace = (s["held"], s["held"] + 1), tuple(held)
    else:
        held, forward_slots, workspace = [], (s["out"], s["lse"]), (out, lse)
    forward = [launch_spec("forward", plan, (q, k, v, out, lse, *workspace),
                           (s["q"], s["k"], s["v"], s["out"], s["lse"], *forward_slots))]
    grad_out = torch.empty_like(out)  # the C++ node makes every upstream gradient contiguous and aligned
    route = decide_backward(q, k, v, out, grad_out, lse, is_causal, None)
    if route is None or route is GLUON:
        return None
    delta, grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (lse, q, k, v))
    backward = [
        launch_spec("dq", route.dq, (q, k, v, out, grad_out, lse, delta, grad_q),
                    (s["q"], s["k"], s["v"], s["out"], s["grad_out"], s["lse"], s["delta"], s["grad_q"])),
        launch_spec("dkdv", route.dkdv, (q, k, v, grad_out, lse, delta, grad_k, grad_v),
                    (s["q"], s["k"], s["v"], s["grad_out"], s["lse"], s["delta"], s["grad_k"], s["grad_v"])),
    ]
    # a kernel that splits its loop adds into its gradients, as `KernelLaunches.run` zeroes them for
    zeroed = ([s["grad_q"]] if route.dq.meta["SPLIT"] else []) + (
        [s["grad_k"], s["grad_v"]] if route.dkdv.meta["SPLIT"] else [])
    return forward, backward, held, zeroed


# Triton's scalar parameter types as the C++ node packs them (Triton's launcher: `ty_to_cpp`).
_SCALAR_KINDS = {"i32": "I32", "u32": "I32", "i64": "I64", "u64": "I64", "i1": "I8", "i8": "I8", "u1": "I8",
                 "u8": "I8"}
# The C++ node takes its scratch from PyTorch's caching allocator, whose blocks are 512-byte aligned.
MAX_SCRATCH_ALIGN = 512


def launch_spec(kernel: str, plan, tensors: tuple, tensor_slots: tuple, compiled=None, kinds=None) -> dict:
    """One launch of `kernel` (a `flash_launch.ROLES` name) by `plan` on `tensors`, as the C++ node makes
    it: the compiled kernel's function, grid, threads, shared memory, and its parameters in the order of
    Triton's launcher (`triton/backends/nvidia/driver.py`, `make_launcher`): each runtime argument that
    the compilation did not turn into a constant (a pointer as its tensor's slot, an integer by its
    specialized type), then the global scratch pointer and the profiler's scratch pointer.
    `compiled` defaults to the kernel Triton compiles for these arguments; `kinds` to the extension's
    parameter kinds (tests pass both)."""
    if len(tensors) != len(tensor_slots):
        raise ValueError(f"{kernel}: {len(tensors)} tensors but {len(tensor_slots)} slots")
    if compiled is None:
        compiled = LAUNCHES.launchers[kernel].compiled(plan.grid, tensors, plan.scalars, plan.meta)
    if kinds is None:
        kinds = load()
    md = compiled.metadata
    if md.num_ctas != 1 or md.launch_cooperative_grid or md.launch_pdl:
        raise Unsupported(f"{kernel}: clusters, cooperative or programmatic-dependent launches")
    if md.profile_scratch_size or md.global_scratch_align > MAX_SCRATCH_ALIGN:
        raise Unsupported(f"{kernel}: profiler scratch, or scratch aligned past {MAX_SCRATCH_ALIGN} bytes")
    types_ = list(compiled.src.signature.values())
    args = (*tensor_slots, *plan.scalars)
    if any(ty != "constexpr" for ty in types_[len(args):]):
        raise Unsupported(f"{kernel}: runtime parameters after the {len(args)} given")
    params = []
    for i, (ty, value) in enumerate(zip(types_, args)):
        if ty == "constexpr":
            continue
        if not isinstance(ty, str):
            raise Unsupported(f"{kernel}: parameter {i} of type {ty!r}")
        if ty.startswith("*"):
            if i >= len(tensor_slots):
                raise Unsupported(f"{kernel}: pointer parameter {i} past the tensors")
            params.append((kinds.TENSOR, int(value)))
        elif ty in _SCALAR_KINDS and i >= len(tensor_slots):
            params.append((getattr(kinds, _SCALAR_KINDS[ty]), int(value)))
        else:
            raise Unsupported(f"{kernel}: parameter {i} of type {ty}")
    gx, gy, gz = grid3(plan.grid)
    params.append((kinds.SCRATCH, 0) if md.global_scratch_size else (kinds.NULL_POINTER, 0))
    params.append((kinds.NULL_POINTER, 0))
    return dict(name=compiled.name, function=compiled.function or 0, grid=[gx, gy, gz],
                threads=32 * md.num_warps, shared=md.shared,
                scratch_bytes=gx * gy * gz * md.global_scratch_size, params=params)
