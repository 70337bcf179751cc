"""What one TransformerBlock saves for its backward, operation by operation, and the gradients it makes.

`saved_by_operation(block, x)` runs the block's forward under
`torch.autograd.graph.saved_tensors_hooks` and names every saved tensor by the operation that made
it, as an NVTX range around each operation would in a memory trace: the block's submodule running
at that moment (e.g. `ffn.w1`, `attn`) and the torch function called (e.g. `matmul`, `sigmoid`,
`masked_fill`), tracked with a `TorchFunctionMode`. A storage saved several times (x is saved by
`pow` and by `mul`) is counted once; parameters (and views of them such as `weight.T`) are left
out, as the handout's hook does.

`block_memory(config, batch, context, device)` measures one block of the model at `config`: the
saved bytes by operation, then a backward from the block's output, reading the change of allocated
memory over it (the CUDA allocator's counters on a GPU, torch.profiler's memory events on a CPU).
During the backward the saved tensors are freed while the gradients appear, so

    gradients made = change over the backward + saved tensors freed

which is compared with the gradients counted directly (the parameters' and the input's) and with
the analytic count of `accounting.memory.block_saved_tensors`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pandas as pd
import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from cs336_systems.accounting.memory import block_saved_tensors
from cs336_systems.model import ModelConfig, TransformerBlock
from cs336_systems.profiling.peak_memory import count_saved_tensors, recorded_trace


class _Producers(TorchFunctionMode):
    """Names, by storage, the operation that made each tensor: the submodule running (from `modules`)
    and the outermost torch function called. `current` is the operation being called right now."""

    def __init__(self, modules: list[str]) -> None:
        super().__init__()
        self.modules = modules
        self.current = ""
        self.made_by: dict[int, tuple[str, StorageWeakRef]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = f"{self.modules[-1] if self.modules else 'block'}: {getattr(func, '__name__', str(func)).strip('_')}"
        outer, self.current = self.current, name
        try:
            result = func(*args, **kwargs)
        finally:
            self.current = outer
        inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
        for t in _tensors(result):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in inputs:  # a view or an in-place result keeps its maker
                self.made_by[ptr] = (name, StorageWeakRef(t.untyped_storage()))
        return result

    def maker(self, t: torch.Tensor) -> str:
        """The operation that made `t`'s storage; while an operation runs, what it saves of its own result
        is packed before it returns, so an unknown (or reused, freed) address means the current one."""
        name, ref = self.made_by.get(t.untyped_storage().data_ptr(), ("", None))
        return name if ref is not None and not ref.expired() else self.current


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


@contextlib.contextmanager
def _module_stack(root: nn.Module) -> Iterator[list[str]]:
    """A list that holds the qualified names of the submodules of `root` whose forward is running."""
    stack: list[str] = []

    def enter(name: str) -> Callable:
        def hook(module, args) -> None:
            stack.append(name or "block")

        return hook

    def leave(module, args, output) -> None:
        stack.pop()

    handles = []
    for name, module in root.named_modules():
        handles += [module.register_forward_pre_hook(enter(name)), module.register_forward_hook(leave)]
    try:
        yield stack
    finally:
        for h in handles:
            h.remove()


def saved_by_operation(block: nn.Module, x: torch.Tensor) -> tuple[pd.DataFrame, torch.Tensor, torch.Tensor]:
    """One row per distinct storage `block(x)` saves for backward: the operation that made it, shape,
    dtype, bytes. Returns the table, the block's input (requires grad) and its output (graph kept)."""
    inp = x.detach().requires_grad_(True)
    source = inp.untyped_storage().data_ptr()

    def made_by(t: torch.Tensor) -> str:
        return "block input" if t.untyped_storage().data_ptr() == source else producers.maker(t)

    with _module_stack(block) as modules, torch.enable_grad():
        producers = _Producers(modules)
        with count_saved_tensors(exclude=block.parameters(), made_by=made_by) as counter, producers:
            out = block(inp)
    rows = [
        dict(operation=r["made_by"], shape="×".join(map(str, r["shape"])), dtype=r["dtype"], bytes=r["bytes"])
        for r in counter.records
        if r["counted"]
    ]
    return pd.DataFrame(rows, columns=["operation", "shape", "dtype", "bytes"]), inp, out


def by_operation(saved: pd.DataFrame) -> pd.DataFrame:
    """Saved bytes summed per operation, largest first, with each one's share of the total."""
    table = (
        saved.groupby("operation", sort=False)
        .agg(tensors=("bytes", "size"), bytes=("bytes", "sum"), shapes=("shape", lambda s: ", ".join(dict.fromkeys(s))))
        .sort_values("bytes", ascending=False)
        .reset_index()
    )
    table["share"] = table["bytes"] / table["bytes"].sum()
    return table


def allocation_changes(steps: dict[str, Callable[[], object]], device: torch.device) -> dict[str, int]:
    """For each named step, run in order: bytes allocated after it less bytes allocated before it
    (negative when it frees more). The CUDA allocator's counters on a GPU; on a CPU the "[memory]"
    events of one torch.profiler recording of all the steps, summed inside each step's range."""
    if device.type == "cuda":
        changes = {}
        for name, fn in steps.items():
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            fn()
            torch.cuda.synchronize(device)
            changes[name] = torch.cuda.memory_allocated(device) - before
        return changes

    def all_steps() -> None:
        for name, fn in steps.items():
            with torch.profiler.record_function(name):
                fn()

    trace = recorded_trace(all_steps)
    memory = trace[trace["kind"] == "memory"]
    changes = {}
    for name in steps:
        span = trace[(trace["kind"] == "range") & (trace["name"] == name)].iloc[0]
        inside = memory[(memory["ts_us"] >= span["ts_us"]) & (memory["ts_us"] <= span["end_us"])]
        changes[name] = int(inside["bytes"].astype("int64").sum())
    return changes


def block_memory(
    config: ModelConfig, batch: int, context: int, device: torch.device | str = "cpu", seed: int = 0
) -> tuple[pd.DataFrame, dict]:
    """One fp32 TransformerBlock of `config` on a (batch, context, d_model) input: the saved bytes by
    operation (`by_operation`'s table) and a summary: saved bytes measured and counted analytically,
    the change of allocated memory over the forward and over the backward, the gradients the latter
    implies, and the gradients counted directly (the parameters' and the input's)."""
    device = torch.device(device)
    torch.manual_seed(seed)
    block = TransformerBlock(config.d_model, config.num_heads, config.d_ff, context, config.rope_theta, device=device)
    x = torch.randn(batch, context, config.d_model, device=device)
    # One unmeasured forward and backward first, the same as the measured one, so that allocations
    # kept from one step to the next (cuBLAS's workspace for the backward's thread) are not counted.
    warm = block(x.detach().requires_grad_(True))
    warm.backward(torch.ones_like(warm))
    del warm
    block.zero_grad(set_to_none=True)
    run: dict = {}

    def forward() -> None:
        run["saved"], run["inp"], run["out"] = saved_by_operation(block, x)
        run["upstream"] = torch.ones_like(run["out"])

    def backward() -> None:
        run["out"].backward(run["upstream"])

    changes = allocation_changes({"block forward": forward, "block backward": backward}, device)
    saved, inp = run["saved"], run["inp"]
    saved_bytes = int(saved["bytes"].sum())
    # The input stays referenced after the backward (in a model it is the previous block's output).
    freed = saved_bytes - inp.untyped_storage().nbytes()
    summary = dict(
        d_model=config.d_model,
        d_ff=config.d_ff,
        num_heads=config.num_heads,
        batch=batch,
        context=context,
        saved_bytes=saved_bytes,
        analytic_saved_bytes=int(block_saved_tensors(config, batch, context)["bytes"].sum()),
        forward_change_bytes=changes["block forward"],
        backward_change_bytes=changes["block backward"],
        saved_freed_bytes=freed,
        inferred_gradient_bytes=changes["block backward"] + freed,
        parameter_gradient_bytes=sum(p.grad.untyped_storage().nbytes() for p in block.parameters()),
        input_gradient_bytes=inp.grad.untyped_storage().nbytes(),
        parameter_bytes=sum(p.numel() * p.element_size() for p in block.parameters()),
    )
    return by_operation(saved), summary
