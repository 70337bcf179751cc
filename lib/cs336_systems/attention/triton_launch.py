"""Launching a Triton kernel without Triton's per-call argument binding.

`kernel[grid](*args, **meta)` (Triton's `JITFunction.run`) binds every argument, computes each
one's specialization, builds a cache key from them and only then reaches the compiled kernel's
launcher. For our kernels (20-30 arguments) that is 48-64 µs of host time per launch on the
H100 hosts we measured, against about 13 µs for the launcher it ends in, and at short sequences
the host is the latency: at N = 1,024, d = 64, one head, our whole forward took 94-115 µs of
host time per call and SDPA-flash's 23-30 µs, for GPU kernels of 12 and 10 µs.

`CachedLauncher(kernel)` does Triton's lookup once per *launch signature* and afterwards calls
the compiled kernel directly, through `CompiledKernel[grid](*args, stream=...)`, the launch that
Triton's JIT ends in (launch hooks included). The signature holds everything a compilation is
specialized on: the current device, the constexpr arguments and launch options (warps, stages),
the value of every integer argument — a superset of Triton's rules (equal to 1, divisible by 16,
32 or 64 bits), so none of them is restated here — and every tensor argument's dtype and
whether its address is 16-byte aligned. Calls with one signature get one compiled kernel from
Triton's JIT too, so the direct launch runs exactly the kernel `kernel[grid]` would.

Triton's JIT path remains for a signature's first call (it compiles, or finds the compilation in
Triton's cache), under the interpreter (nothing is compiled) and while torch.compile traces
(Dynamo understands `kernel[grid]`, not the compiled kernel). Read once per signature, as Triton
reads them per compilation: TRITON_DEBUG and the other options Triton takes from the environment.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# Distinct shapes each add a signature; past this many the cache starts over (Triton keeps the
# compilations, so a forgotten signature costs one JIT-path launch, not a compile).
MAX_SIGNATURES = 4096


def _current_device_and_stream() -> tuple[int, int]:
    from triton.runtime import driver

    device = driver.active.get_current_device()
    return device, driver.active.get_current_stream(device)


class CachedLauncher:
    """Launches `kernel` (a `@triton.jit` function whose constexpr parameters all come last).

    `launcher(grid, tensors, scalars, meta)` launches `kernel[grid](*tensors, *scalars, **meta)`:
    `tensors` the pointer arguments, `scalars` the integer and float arguments after them,
    `meta` the constexpr arguments by name plus launch options (num_warps, num_stages).
    Returns the compiled kernel (under the interpreter, what its `kernel[grid]` returns).
    """

    def __init__(self, kernel, device_and_stream: Callable[[], tuple[int, int]] = _current_device_and_stream):
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
                raise ValueError(f"{self.name}: CachedLauncher needs every constexpr parameter after the runtime ones, "
                                 f"got {[(p.name, 'constexpr' if p.is_constexpr else 'runtime') for p in params]}")
            self.runtime_params = first
            self.constexpr_names = tuple(p.name for p in params[first:])
        self.signatures: dict[tuple, tuple] = {}

    def __call__(self, grid: tuple[int, ...], tensors: tuple[torch.Tensor, ...], scalars: tuple, meta: dict):
        if not (self.direct and tensors[0].device.type == "cuda" and not torch.compiler.is_compiling()):
            return self.kernel[grid](*tensors, *scalars, **meta)
        if len(tensors) + len(scalars) != self.runtime_params:
            raise ValueError(f"{self.name} takes {self.runtime_params} runtime arguments, "
                             f"got {len(tensors)} tensors and {len(scalars)} scalars")
        device, stream = self.device_and_stream()
        key = (device, *meta.items(), *scalars, *(t.dtype for t in tensors), *(t.data_ptr() % 16 == 0 for t in tensors))
        entry = self.signatures.get(key)
        if entry is None:
            compiled = self.kernel[grid](*tensors, *scalars, **meta)
            if len(self.signatures) >= MAX_SIGNATURES:
                self.signatures.clear()
            self.signatures[key] = (compiled, tuple(meta[name] for name in self.constexpr_names))
            return compiled
        compiled, constexpr_values = entry
        compiled[_grid3(grid)](*tensors, *scalars, *constexpr_values, stream=stream)
        return compiled


def _grid3(grid: tuple[int, ...]) -> tuple[int, int, int]:
    return (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)

