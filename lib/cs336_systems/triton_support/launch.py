"""Launching a Triton kernel without Triton's per-call argument binding.

`kernel[grid](*args, **meta)` (Triton's `JITFunction.run`) binds every argument, computes each
one's specialization, builds a cache key from them and only then reaches the compiled kernel's
launcher. For our kernels (20-30 arguments) that costs several times the launcher's own host time,
and at short sequences the host is the latency (docs/flash_attention_tuning.md, "Short sequences").

`CachedLauncher(kernel)` does Triton's lookup once per *launch signature* and afterwards calls
the compiled kernel's launcher directly, with the arguments Triton's JIT ends in (grid, stream,
the loaded function, its packed metadata, the launch hooks, the kernel's arguments): no closure
per call as `CompiledKernel[grid]` builds. The signature holds everything a compilation is
specialized on: the current device, the constexpr arguments and launch options (warps, stages),
the value of every integer argument — a superset of Triton's rules (equal to 1, divisible by 16,
32 or 64 bits), so none of them is restated here — and every tensor argument's dtype and
whether its address is 16-byte aligned. A caller that has already derived the launch from such
a superset (`attention.launch.plans.KernelLaunches.plan`, one plan per geometry) passes its own small signature
instead, and no second key is built. Calls with one signature get one compiled kernel from
Triton's JIT too, so the direct launch runs exactly the kernel `kernel[grid]` would.

Triton's JIT path remains for a signature's first call (it compiles, or finds the compilation in
Triton's cache), under the interpreter (nothing is compiled) and while torch.compile traces
(Dynamo understands `kernel[grid]`, not the compiled kernel). Read once per signature, as Triton
reads them per compilation: TRITON_DEBUG and the other options Triton takes from the environment.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import NamedTuple

import torch
from triton import knobs

# Distinct shapes each add a signature; past this many the cache starts over (Triton keeps the
# compilations, so a forgotten signature costs one JIT-path launch, not a compile).
MAX_SIGNATURES = 4096


def current_device_and_stream() -> tuple[int, int]:
    """The current CUDA device and its current stream, as Triton's driver reads them, minus its
    Python layers (`torch.cuda.current_device` checks lazy initialization on every call)."""
    device = torch._C._cuda_getDevice()
    return device, torch._C._cuda_getCurrentRawStream(device)


class _Bound(NamedTuple):
    """A compiled kernel's launcher and what each launch passes it besides the grid and stream."""

    compiled: object
    run: Callable
    function: int
    packed_metadata: object
    constexpr_values: tuple


class CachedLauncher:
    """Launches `kernel` (a `@triton.jit` function whose constexpr parameters all come last).

    `launcher(grid, tensors, scalars, meta, signature=None)` launches
    `kernel[grid](*tensors, *scalars, **meta)`: `tensors` the pointer arguments, `scalars` the
    integer and float arguments after them, `meta` the constexpr arguments by name plus launch
    options (num_warps, num_stages). `signature`, where given, stands for everything the launch
    is specialized on but the device (module docstring); else it is derived from the arguments.
    Returns the compiled kernel (under the interpreter, what its `kernel[grid]` returns).
    """

    def __init__(self, kernel, device_and_stream: Callable[[], tuple[int, int]] = current_device_and_stream):
        self.kernel = kernel
        self.device_and_stream = device_and_stream
        self.name = getattr(getattr(kernel, "fn", kernel), "__name__", repr(kernel))
        # A JITFunction describes its parameters; the interpreter's InterpretedFunction does not, and
        # has no compiled kernel to launch: it always takes the JIT path.
        params = getattr(kernel, "params", None)
        self.direct = params is not None
        if self.direct:
            flags = [p.is_constexpr for p in params]
            first = flags.index(True) if True in flags else len(flags)
            if not all(flags[first:]):
                raise ValueError(
                    f"{self.name}: CachedLauncher needs every constexpr parameter after the runtime ones, "
                    f"got {[(p.name, 'constexpr' if p.is_constexpr else 'runtime') for p in params]}"
                )
            self.runtime_params = first
            self.constexpr_names = tuple(p.name for p in params[first:])
        self.signatures: dict[tuple, _Bound] = {}

    def __call__(
        self,
        grid: tuple[int, ...],
        tensors: tuple[torch.Tensor, ...],
        scalars: tuple,
        meta: dict,
        signature: Hashable | None = None,
    ):
        if not (self.direct and tensors[0].device.type == "cuda" and not torch.compiler.is_compiling()):
            return self.kernel[grid](*tensors, *scalars, **meta)
        device, stream = self.device_and_stream()
        if signature is None:
            if len(tensors) + len(scalars) != self.runtime_params:
                raise ValueError(
                    f"{self.name} takes {self.runtime_params} runtime arguments, "
                    f"got {len(tensors)} tensors and {len(scalars)} scalars"
                )
            key = (
                device,
                *meta.items(),
                *scalars,
                *(t.dtype for t in tensors),
                *(t.data_ptr() % 16 == 0 for t in tensors),
            )
        else:
            key = (device, signature)
        bound = self.signatures.get(key)
        if bound is None:
            compiled = self.kernel[grid](*tensors, *scalars, **meta)
            if len(self.signatures) >= MAX_SIGNATURES:
                self.signatures.clear()
            self.signatures[key] = _Bound(
                compiled,
                compiled.run,
                compiled.function,
                compiled.packed_metadata,
                tuple(meta[name] for name in self.constexpr_names),
            )
            return compiled
        gx, gy, gz = grid3(grid)
        # Launch hooks (profilers such as Proton) get what Triton's JIT gives them; with none set,
        # neither the metadata nor the calls into empty hook chains.
        enter, leave = active_hook(knobs.runtime.launch_enter_hook), active_hook(knobs.runtime.launch_exit_hook)
        if enter is not None or leave is not None:
            args = (*tensors, *scalars, *bound.constexpr_values)
            metadata = bound.compiled.launch_metadata((gx, gy, gz), stream, *args)
        else:
            # Addresses rather than tensors: for a tensor Triton's launcher calls its data_ptr() and then
            # cuPointerGetAttribute to check that the address is the device's, for an integer neither. The
            # tensors are CUDA tensors (checked above) and their addresses are what the JIT path passes.
            args = (*[t.data_ptr() for t in tensors], *scalars, *bound.constexpr_values)
            metadata = None
        bound.run(gx, gy, gz, stream, bound.function, bound.packed_metadata, metadata, enter, leave, *args)
        return bound.compiled

    def compiled(self, grid: tuple[int, ...], tensors: tuple[torch.Tensor, ...], scalars: tuple, meta: dict):
        """The compiled kernel that `self(grid, tensors, scalars, meta)` runs (`compiled_kernel`)."""
        return compiled_kernel(self.kernel, grid, (*tensors, *scalars), meta)


def compiled_kernel(kernel, grid: tuple[int, ...], args: tuple, options: dict):
    """The compiled kernel that `kernel[grid](*args, **options)` runs (a Triton or Gluon JIT function),
    compiled where new (not launched), its function loaded on the current device (`attention.launch.native` launches
    it from C++)."""
    compiled = kernel.warmup(*args, grid=grid, **options)
    compiled._init_handles()
    return compiled


def active_hook(hook):
    """A launch hook as the launcher takes it: None where none is set (Triton 3.6 keeps hooks in a
    `HookChain`, empty by default; the launcher skips a None hook)."""
    return hook if hook is not None and getattr(hook, "calls", True) else None


def launch_hooks_set() -> bool:
    """Whether a launch hook is set (a profiler that reads the launches, such as Proton)."""
    runtime = knobs.runtime
    return active_hook(runtime.launch_enter_hook) is not None or active_hook(runtime.launch_exit_hook) is not None


def grid3(grid: tuple[int, ...]) -> tuple[int, int, int]:
    return (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
