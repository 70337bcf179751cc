"""FlashAttention-2's eager autograd node in C++ (`csrc/flash_autograd.cpp`): the same Triton and Gluon kernels,
launched without Python on the host path.

Why: at short sequences an eager call's latency is its host time, and a Python `autograd.Function`
pays twice there: its backward runs Python on autograd's device thread (measured in
docs/flash_attention_tuning.md; tools/flash_host_probe.py). The C++ node launches the
kernels' loaded functions (`cuLaunchKernel`) with the parameters Triton's own launcher would pass,
allocates through PyTorch's caching allocator, and takes no GIL in the backward.

A *program* holds, per input geometry, each launch's function, grid, threads, shared memory and
parameters (`launch_spec`), derived here once from the Python path's own route (`launch.dispatch.route_of`)
and the compiled kernels (Triton's `warmup`): the kernels,
configurations and launch plans are the Python path's, so both paths compute the same thing (tests/test_flash_native.py
checks the parameters against Triton's launcher on compiled kernels, and on a GPU the gradients).
The program covers inputs the kernels read in place (contiguous, or views whose leading dimensions merge
into one stride, such as a model's (1, h, N, d) views of its projections; the gradients then have the
views' strides): its forward is the Triton kernel or the Gluon kernel, its backward the two Triton kernels or
the fused Gluon kernel between its two conversions (D and the zeroed fp32 dQ accumulator before it, dQ in
the inputs' dtype after it; `launch.gluon.KernelLaunch`), as `launch.dispatch` decides. The Gluon kernels' TMA
descriptors the node encodes at each launch with the compiled kernel's swizzle and block
(`compiled_launch_spec`, `tensor_map`). Every other call takes `FlashAttentionTriton` (the Python
autograd.Function): CPU tensors, the interpreter, torch.compile, tensor subclasses, a `tiles` override, the
PyTorch backward, Triton launch hooks (profilers that read them), and streams capturing a CUDA graph.

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
from typing import NamedTuple

import torch

from cs336_systems.attention.configs import register_answer_cache
from cs336_systems.attention.launch.dispatch import GluonBackward, GluonForward, forward_outputs, route_of
from cs336_systems.attention.launch.gluon import backward_launch, dq_copy_launch, forward_launch, preprocess_launch
from cs336_systems.attention.launch.layout import INTERPRETED
from cs336_systems.attention.launch.plans import LAUNCHES
from cs336_systems.triton_support.launch import grid3, launch_hooks_set

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

            print(
                f"cs336_systems: loading the FlashAttention autograd node ({SOURCE.name}; its first build for this "
                f"source and PyTorch takes about a minute)",
                file=sys.stderr,
                flush=True,
            )
            module = build(name=EXTENSION_NAME, sources=[str(SOURCE)], extra_cflags=["-O2"], verbose=verbose)
        except Exception as err:  # no compiler, no ninja, no headers: the Python path serves
            lines = str(err).strip().splitlines()
            # a compiler's first error says more than ninja's closing "build stopped"
            reason = next((line for line in lines if "error:" in line), lines[-1] if lines else "")
            _failure = f"{type(err).__name__}: {reason.strip()}"[:400]
            print(
                f"cs336_systems: the FlashAttention autograd node could not be built ({_failure}); eager calls "
                f"take the Python autograd.Function",
                file=sys.stderr,
                flush=True,
            )
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


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, tiles: tuple[int, int] | None = None
) -> torch.Tensor | None:
    """O of an eager call through the C++ node, or None where the call belongs to the Python path
    (`api.FlashAttentionTriton` then takes it): among others, a `tiles` override of the kernels'
    configurations. `is_causal` is a bool, as the API has checked (a registered program's lookup reads it)."""
    if torch.compiler.is_compiling() or type(q) is not torch.Tensor or not q.is_cuda:
        return None
    if tiles is not None or launch_hooks_set():
        return None
    native = _module if _module is not None else load()
    if native is None:
        return None
    out = native.forward(q, k, v, is_causal)
    if out is None:
        register(native, q, k, v, is_causal)
        out = native.forward(q, k, v, is_causal)
    return None if out is False or out is None else out


class Unsupported(Exception):
    """A launch the C++ node does not make (the call then takes the Python path)."""


def register(native, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> None:
    """Derive and register the program of this geometry, or mark it as the Python path's.
    Bad inputs raise the Python path's ValueError (`launch.dispatch.decide`)."""
    try:
        program = derive_program(native, q, k, v, is_causal)
    except Unsupported:
        program = None
    if program is None:
        native.register_program(q, k, v, is_causal, None, None, [], [], 0)
    else:
        native.register_program(q, k, v, is_causal, *program)


def derive_program(native, q, k, v, is_causal: bool):
    """(forward launch specs, backward launch specs, held tensors, zeroed gradient slots, fp32 elements of the
    dQ accumulator) of this geometry for the extension `native` (its slots, parameter kinds and driver), or
    None where the Python path serves it (module docstring): the launches of the Python path's route
    (`launch.dispatch.route_of`), the Gluon ones built first, then each as the node makes it."""
    route = route_of(q, k, v, is_causal, None)
    gluon_forward, gluon_backward = type(route.forward) is GluonForward, type(route.backward) is GluonBackward
    if (
        INTERPRETED
        or route.backward is None
        or not all(t.data_ptr() % 16 == 0 for t in (q, k, v))
        or (not gluon_forward and True in route.forward.copies)
        or ((gluon_forward or gluon_backward) and not native.tensor_maps_supported())
    ):
        return None
    # Distinct objects even where the caller passed one tensor twice: a Gluon launch's arguments name their
    # slots by the identity of their tensors (`kernel_launch_spec`).
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = forward_outputs(q)
    grad_out = torch.empty_like(out)  # the C++ node makes every upstream gradient contiguous and aligned
    delta, grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (lse, q, k, v))
    is_causal = route.is_causal
    forward_launches = [forward_launch(q, k, v, out, lse, is_causal, route.forward.section)] if gluon_forward else []
    backward_launches, dq_acc = [], None
    if gluon_backward:
        n, d = q.shape[-2:]
        dq_acc = torch.empty((q.numel() // (n * d), n, d), dtype=torch.float32, device=q.device)
        backward_launches = [
            preprocess_launch(out, grad_out, delta, dq_acc),
            backward_launch(q, k, v, grad_out, lse, delta, grad_k, grad_v, dq_acc, is_causal, route.backward.section),
            dq_copy_launch(grad_q, dq_acc),
        ]
        if backward_launches[-1] is None:
            return None
    s = native.SLOTS
    tensors = dict(
        q=q, k=k, v=v, out=out, lse=lse, grad_out=grad_out, delta=delta, grad_q=grad_q, grad_k=grad_k, grad_v=grad_v
    )
    slots = {id(t): s[name] for name, t in tensors.items()}
    if dq_acc is not None:
        slots[id(dq_acc)] = s["dq_acc"]
    held = []
    if gluon_forward:
        forward = [kernel_launch_spec(launch, slots, kinds=native) for launch in forward_launches]
    else:
        plan = route.forward
        if plan.workspace:
            held = list(LAUNCHES.split_workspace(q.device, plan.workspace))
            forward_slots, workspace = (s["held"], s["held"] + 1), tuple(held)
        else:
            forward_slots, workspace = (s["out"], s["lse"]), (out, lse)
        forward = [
            launch_spec(
                "forward",
                plan,
                (q, k, v, out, lse, *workspace),
                (s["q"], s["k"], s["v"], s["out"], s["lse"], *forward_slots),
                kinds=native,
            )
        ]
    if gluon_backward:
        backward = [kernel_launch_spec(launch, slots, kinds=native) for launch in backward_launches]
        return forward, backward, held, [], dq_acc.numel()
    dq, dkdv = route.backward
    backward = [
        launch_spec(
            "dq",
            dq,
            (q, k, v, out, grad_out, lse, delta, grad_q),
            (s["q"], s["k"], s["v"], s["out"], s["grad_out"], s["lse"], s["delta"], s["grad_q"]),
            kinds=native,
        ),
        launch_spec(
            "dkdv",
            dkdv,
            (q, k, v, grad_out, lse, delta, grad_k, grad_v),
            (s["q"], s["k"], s["v"], s["grad_out"], s["lse"], s["delta"], s["grad_k"], s["grad_v"]),
            kinds=native,
        ),
    ]
    # a kernel that splits its loop adds into its gradients, as `KernelLaunches.run` zeroes them for
    zeroed = ([s["grad_q"]] if dq.meta["SPLIT"] else []) + ([s["grad_k"], s["grad_v"]] if dkdv.meta["SPLIT"] else [])
    return forward, backward, held, zeroed, 0


# Triton's scalar parameter types as the C++ node packs them (Triton's launcher: `ty_to_cpp`).
_SCALAR_KINDS = {"i32": "I32", "u32": "I32", "i64": "I64", "u64": "I64", "i1": "I8", "i8": "I8", "u1": "I8", "u8": "I8"}
# The C++ node takes its scratch from PyTorch's caching allocator, whose blocks are 512-byte aligned.
MAX_SCRATCH_ALIGN = 512


class TensorSlot(NamedTuple):
    """A pointer argument: the tensor in this slot of the call (`SLOTS`)."""

    slot: int


class TensorMapArg(NamedTuple):
    """A Gluon kernel's tensor-descriptor argument: the tensor in `slot` read as `shape` with `strides`
    (elements), as the C++ node encodes it at each launch (a CUtensorMap: only the address changes)."""

    slot: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    padding: str


def launch_spec(kernel: str, plan, tensors: tuple, tensor_slots: tuple, compiled=None, kinds=None) -> dict:
    """One launch of the Triton kernel `kernel` (a `launch.plans.ROLES` name) by `plan` on `tensors`, as
    the C++ node makes it (`compiled_launch_spec`). `compiled` defaults to the kernel Triton compiles for
    these arguments; `kinds` to the extension's parameter kinds (tests pass both)."""
    if len(tensors) != len(tensor_slots):
        raise ValueError(f"{kernel}: {len(tensors)} tensors but {len(tensor_slots)} slots")
    if compiled is None:
        compiled = LAUNCHES.launchers[kernel].compiled(plan.grid, tensors, plan.scalars, plan.meta)
    args = (*(TensorSlot(int(slot)) for slot in tensor_slots), *plan.scalars)
    return compiled_launch_spec(kernel, compiled, plan.grid, args, kinds)


def kernel_launch_spec(launch, slots: dict[int, int], compiled=None, kinds=None) -> dict:
    """A launch of the Gluon route (`launch.gluon.KernelLaunch`) as the C++ node makes it (`compiled_launch_spec`):
    each tensor argument the slot of its tensor, each descriptor a tensor map of its tensor's slot. `slots`:
    the slot of each tensor by `id`; a view (d = 128's dQ planes) names the tensor it views."""

    def slot_of(t: torch.Tensor) -> int:
        for candidate in (t, t._base):
            if candidate is not None and id(candidate) in slots:
                return slots[id(candidate)]
        raise Unsupported(f"a tensor of shape {tuple(t.shape)} in no slot of the call")

    args = []
    for arg in launch.args:
        if isinstance(arg, torch.Tensor):
            args.append(TensorSlot(slot_of(arg)))
        elif hasattr(arg, "block_shape"):  # a tensor descriptor
            args.append(TensorMapArg(slot_of(arg.base), tuple(arg.shape), tuple(arg.strides), arg.padding))
        else:
            args.append(arg)
    name = getattr(getattr(launch.kernel, "fn", launch.kernel), "__name__", "kernel")
    return compiled_launch_spec(name, compiled if compiled is not None else launch.compiled(), launch.grid, args, kinds)


def compiled_launch_spec(kernel: str, compiled, grid: tuple, args, kinds=None) -> dict:
    """One launch of a compiled kernel on `args` (its runtime arguments in order: `TensorSlot`s, `TensorMapArg`s,
    integers) as the C++ node makes it: the compiled kernel's function, grid, threads, shared memory, and its
    parameters in the order of Triton's launcher (`triton/backends/nvidia/driver.py`, `make_launcher`): each
    runtime argument that the compilation did not turn into a constant (a pointer as its tensor's slot, an
    integer by its specialized type, a descriptor as a tensor map followed by its shape as i32 and its strides
    as i64), then the global scratch pointer and the profiler's scratch pointer. A tensor map is what
    `make_tensordesc_arg` and the launcher's `fillTMADescriptor` encode: the compiled kernel's swizzle, element
    type and block size (`metadata.tensordesc_meta`), dimensions innermost first, strides in bytes."""
    if kinds is None:
        kinds = load()
    md = compiled.metadata
    if md.num_ctas != 1 or md.launch_cooperative_grid or md.launch_pdl:
        raise Unsupported(f"{kernel}: clusters, cooperative or programmatic-dependent launches")
    if md.profile_scratch_size or md.global_scratch_align > MAX_SCRATCH_ALIGN:
        raise Unsupported(f"{kernel}: profiler scratch, or scratch aligned past {MAX_SCRATCH_ALIGN} bytes")
    types_ = list(compiled.src.signature.values())
    if any(ty != "constexpr" for ty in types_[len(args) :]):
        raise Unsupported(f"{kernel}: runtime parameters after the {len(args)} given")
    descriptor_meta = list(getattr(md, "tensordesc_meta", None) or [])
    params, maps = [], []
    for i, (ty, value) in enumerate(zip(types_, args)):
        if ty == "constexpr":
            continue
        if not isinstance(ty, str):
            raise Unsupported(f"{kernel}: parameter {i} of type {ty!r}")
        if ty.startswith("tensordesc"):
            if not isinstance(value, TensorMapArg):
                raise Unsupported(f"{kernel}: descriptor parameter {i} given {value!r}")
            if len(maps) >= len(descriptor_meta):
                raise Unsupported(f"{kernel}: descriptor parameter {i} was not lowered to a TMA descriptor")
            maps.append(tensor_map(value, descriptor_meta[len(maps)]))
            params.append((kinds.TENSOR_MAP, len(maps) - 1))
            params.extend((kinds.I32, int(x)) for x in value.shape)
            params.extend((kinds.I64, int(x)) for x in value.strides)
        elif ty.startswith("*"):
            if not isinstance(value, TensorSlot):
                raise Unsupported(f"{kernel}: pointer parameter {i} given {value!r}, not a tensor")
            params.append((kinds.TENSOR, value.slot))
        elif ty in _SCALAR_KINDS and isinstance(value, int):
            params.append((getattr(kinds, _SCALAR_KINDS[ty]), int(value)))
        else:
            raise Unsupported(f"{kernel}: parameter {i} of type {ty}")
    gx, gy, gz = grid3(grid)
    params.append((kinds.SCRATCH, 0) if md.global_scratch_size else (kinds.NULL_POINTER, 0))
    params.append((kinds.NULL_POINTER, 0))
    spec = dict(
        name=compiled.name,
        function=compiled.function or 0,
        grid=[gx, gy, gz],
        threads=32 * md.num_warps,
        shared=md.shared,
        scratch_bytes=gx * gy * gz * md.global_scratch_size,
        params=params,
    )
    if maps:
        spec["maps"] = maps
    return spec


def tensor_map(arg: TensorMapArg, meta: dict) -> dict:
    """The CUtensorMap fields of a descriptor argument, as Triton 3.6's launcher encodes them
    (`make_tensordesc_arg`, `fillTMADescriptor`): the driver's data type, the dimensions and the box
    innermost first, the strides of all but the innermost dimension in bytes, the compiled swizzle, and
    out-of-bounds reads as zeros (NaN where the descriptor asks for "nan" padding)."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    if meta.get("fp4_padded"):
        raise Unsupported("a padded fp4 descriptor")
    if arg.strides[-1] != 1:
        raise Unsupported(f"a descriptor with innermost stride {arg.strides[-1]}")
    size = meta["elem_size"]
    return dict(
        slot=arg.slot,
        dtype=TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
        dims=[int(x) for x in reversed(arg.shape)],
        strides=[size * int(x) for x in reversed(arg.strides[:-1])],
        box=[int(x) for x in reversed(meta["block_size"])],
        swizzle=int(meta["swizzle"]),
        fill=1 if arg.padding == "nan" else 0,
    )
