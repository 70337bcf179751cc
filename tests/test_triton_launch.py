"""CachedLauncher: which launches go through Triton's JIT and which reuse a compiled kernel.

The launch logic is tested with a stand-in kernel (no GPU needed); test_flash_attention.py's GPU
tests run the real kernels through it, including a signature that differs only in alignment.
"""

from types import SimpleNamespace

import pytest
import torch

from cs336_systems.triton_support import launch as triton_launch
from cs336_systems.triton_support.launch import CachedLauncher

STREAM = 1234


class StandInCompiled:
    """What `kernel[grid](...)` returns: its launcher `run`, called as Triton's JIT calls it (grid, stream,
    function, packed metadata, launch metadata, the two launch hooks, then every kernel argument)."""

    function, packed_metadata = 77, ("packed",)

    def __init__(self):
        self.launches = []
        self.metadata_asked = []

    def run(self, gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args):
        assert (function, packed_metadata) == (self.function, self.packed_metadata)
        self.launches.append(((gx, gy, gz), args, stream, launch_metadata, enter_hook, exit_hook))

    def launch_metadata(self, grid, stream, *args):
        self.metadata_asked.append((grid, stream, args))
        return {"name": "stand-in"}


class StandInKernel:
    """A @triton.jit function's surface: `params` (name, is_constexpr) and `kernel[grid](*args, **meta)`."""

    def __init__(self, names_and_constexpr):
        self.params = [SimpleNamespace(name=n, is_constexpr=c) for n, c in names_and_constexpr]
        self.jit_calls = []

    def __getitem__(self, grid):
        def run(*args, **meta):
            compiled = StandInCompiled()
            self.jit_calls.append((grid, args, meta, compiled))
            return compiled

        return run


def cuda_tensor(dtype=torch.bfloat16, address=4096):
    """What the launcher reads of a tensor: device, dtype, address."""
    return SimpleNamespace(device=torch.device("cuda"), dtype=dtype, data_ptr=lambda: address)


def kernel_and_launcher(device=0):
    kernel = StandInKernel(
        [("X", False), ("Y", False), ("stride", False), ("N", False), ("BLOCK", True), ("FLAG", True)]
    )
    return kernel, CachedLauncher(kernel, device_and_stream=lambda: (device, STREAM))


def launch(launcher, x=None, y=None, n=100, block=64, warps=4):
    return launcher(
        (3,), (x or cuda_tensor(), y or cuda_tensor()), (16, n), dict(FLAG=True, BLOCK=block, num_warps=warps)
    )


def test_second_call_of_a_signature_launches_the_compiled_kernel():
    kernel, launcher = kernel_and_launcher()
    x, y = cuda_tensor(), cuda_tensor()
    first = launcher((3,), (x, y), (16, 100), dict(FLAG=True, BLOCK=64, num_warps=4))
    assert len(kernel.jit_calls) == 1 and first is kernel.jit_calls[0][3]
    second = launcher((3,), (x, y), (16, 100), dict(FLAG=True, BLOCK=64, num_warps=4))
    assert second is first and len(kernel.jit_calls) == 1, "no second trip through the JIT"
    # the grid padded to three dimensions; constexprs in parameter order, not in the order given; no hook set
    # tensors passed as their addresses, which Triton's launcher takes without a driver call
    assert first.launches == [((3, 1, 1), (4096, 4096, 16, 100, 64, True), STREAM, None, None, None)]
    assert not first.metadata_asked


def test_launch_hooks_get_their_metadata_as_through_the_jit():
    """A profiler's launch hook (Triton's knobs) sees direct launches too, with their metadata."""
    kernel, launcher = kernel_and_launcher()
    launch(launcher)

    def enter(metadata):
        return None

    hooks = triton_launch.knobs.runtime.launch_enter_hook
    hooks.add(enter)
    try:
        compiled = launch(launcher)
    finally:
        hooks.remove(enter)
    assert compiled.metadata_asked == [((3, 1, 1), STREAM, (compiled.launches[0][1]))]
    assert compiled.launches[0][3:6] == ({"name": "stand-in"}, hooks, None)


def test_a_callers_signature_replaces_the_derived_key():
    """`KernelLaunches.launch` names its plan: one signature, one trip through the JIT, whatever the
    arguments (the caller vouches that they specialize alike); another name goes through the JIT."""
    kernel, launcher = kernel_and_launcher()
    launcher((3,), (cuda_tensor(), cuda_tensor()), (16, 100), dict(FLAG=True, BLOCK=64), signature=7)
    compiled = launcher((5,), (cuda_tensor(), cuda_tensor()), (32, 200), dict(FLAG=True, BLOCK=64), signature=7)
    assert len(kernel.jit_calls) == 1 and compiled.launches[0][0] == (5, 1, 1)
    assert compiled.launches[0][1][2:4] == (32, 200)
    launcher((3,), (cuda_tensor(), cuda_tensor()), (16, 100), dict(FLAG=True, BLOCK=64), signature=8)
    assert len(kernel.jit_calls) == 2


@pytest.mark.parametrize(
    "change",
    [
        dict(n=101),
        dict(n=96),
        dict(block=128),
        dict(warps=8),
        dict(x=cuda_tensor(dtype=torch.float16)),
        dict(x=cuda_tensor(address=4096 + 2)),
        dict(y=cuda_tensor(address=4096 + 8)),
    ],
    ids=[
        "int value",
        "int multiple of 16",
        "constexpr",
        "launch option",
        "dtype",
        "misaligned 2 bytes",
        "misaligned 8 bytes",
    ],
)
def test_any_change_triton_specializes_on_goes_through_the_jit(change):
    kernel, launcher = kernel_and_launcher()
    launch(launcher)
    launch(launcher)
    assert len(kernel.jit_calls) == 1
    launch(launcher, **change)
    assert len(kernel.jit_calls) == 2
    launch(launcher, **change)
    assert len(kernel.jit_calls) == 2, "the new signature is remembered too"


def test_aligned_addresses_share_a_signature():
    kernel, launcher = kernel_and_launcher()
    launch(launcher, x=cuda_tensor(address=4096))
    launch(launcher, x=cuda_tensor(address=8192 + 16))
    assert len(kernel.jit_calls) == 1


def test_another_device_goes_through_the_jit():
    kernel = StandInKernel(
        [("X", False), ("Y", False), ("stride", False), ("N", False), ("BLOCK", True), ("FLAG", True)]
    )
    device = [0]
    launcher = CachedLauncher(kernel, device_and_stream=lambda: (device[0], STREAM))
    launch(launcher)
    device[0] = 1
    launch(launcher)
    assert len(kernel.jit_calls) == 2


def test_cpu_tensors_interpreter_and_tracing_take_the_jit_path(monkeypatch):
    kernel, launcher = kernel_and_launcher()
    cpu = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32, data_ptr=lambda: 0)
    for _ in range(2):
        launch(launcher, x=cpu)
    assert len(kernel.jit_calls) == 2 and not launcher.signatures

    interpreted = StandInKernel([])
    del interpreted.params  # the interpreter's kernels describe no parameters
    launcher = CachedLauncher(interpreted)
    for _ in range(2):
        launch(launcher)
    assert len(interpreted.jit_calls) == 2

    kernel, launcher = kernel_and_launcher()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for _ in range(2):
        launch(launcher)
    assert len(kernel.jit_calls) == 2 and not launcher.signatures


def test_signature_cache_starts_over_when_full(monkeypatch):
    monkeypatch.setattr(triton_launch, "MAX_SIGNATURES", 3)
    kernel, launcher = kernel_and_launcher()
    for n in range(4):
        launch(launcher, n=n)
    assert len(launcher.signatures) == 1 and len(kernel.jit_calls) == 4


def test_constexpr_before_a_runtime_parameter_is_refused():
    kernel = StandInKernel([("X", False), ("BLOCK", True), ("N", False)])
    with pytest.raises(ValueError, match="constexpr parameter after the runtime ones"):
        CachedLauncher(kernel)


def test_wrong_number_of_runtime_arguments_is_refused():
    kernel, launcher = kernel_and_launcher()
    with pytest.raises(ValueError, match="takes 4 runtime arguments, got 2 tensors and 1 scalars"):
        launcher((3,), (cuda_tensor(), cuda_tensor()), (16,), dict(FLAG=True, BLOCK=64))


def test_every_kernel_family_refuses_cpu_tensors_with_one_error_type(monkeypatch):
    """Compiled kernels (the interpreter reported off) handed CPU tensors: attention, the fused loss and
    FusedAdamW all raise `NeedsTritonInterpreter` (a ValueError), the type a GPU machine's test session skips
    on (tests/conftest.py), naming what to do."""
    import importlib

    from cs336_systems.attention.launch.dispatch import gluon_kernels
    from cs336_systems.fused_loss import linear_cross_entropy
    from cs336_systems.optim import FusedAdamW
    from cs336_systems.triton_support.interpreter import NeedsTritonInterpreter

    # (the packages export functions of their modules' names: the modules themselves, by name)
    loss_module = importlib.import_module("cs336_systems.fused_loss.linear_cross_entropy")
    adamw_module = importlib.import_module("cs336_systems.optim.fused_adamw")
    q = torch.randn(1, 16, 16)
    with pytest.raises(NeedsTritonInterpreter, match="TRITON_INTERPRET=1"):
        gluon_kernels(q, q, q, True, interpreted=False)
    monkeypatch.setattr(loss_module, "kernel_interpreted", lambda: False)
    hidden, weight = torch.randn(4, 8), torch.randn(10, 8)
    with pytest.raises(NeedsTritonInterpreter, match="TRITON_INTERPRET=1"):
        linear_cross_entropy(hidden, weight, torch.zeros(4, dtype=torch.int64))
    monkeypatch.setattr(adamw_module, "kernels_interpreted", lambda: False)
    p = torch.nn.Parameter(torch.randn(8))
    p.grad = torch.randn(8)
    with pytest.raises(NeedsTritonInterpreter, match="TRITON_INTERPRET=1"):
        FusedAdamW([p], lr=1e-3).step()
    assert issubclass(NeedsTritonInterpreter, ValueError)
