"""Measuring memory on any device: saved-for-backward tensors, and the peak of a training step.

- `count_saved_tensors()` hooks autograd's pack step (torch.autograd.graph.saved_tensors_hooks)
  and adds up the *distinct storages* saved for backward, leaving out parameters (and views of
  them, e.g. `weight.T`). It works on CPU and GPU alike and is what the analytic activation
  model of accounting/memory.py is checked against.
- `peak_allocated_bytes(fn, device)` is the peak of memory allocated while `fn` runs, above what
  was allocated when it started: the CUDA caching allocator's counters on a GPU; on CPU the
  running sum of the "[memory]" events that torch.profiler(profile_memory=True) records.
- `measure_peak_memory(config)` runs the harness's warm-up steps, then one measured step, and
  reports the peak (bytes live before the step + the step's peak above them). On CPU the bytes
  live before the step are counted from the tensors that stay alive between steps: parameters,
  gradients, optimizer state and the batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from cs336_systems.benchmarking.harness import (
    BenchmarkConfig,
    TrainingSetup,
    build,
    free_device_memory,
    is_out_of_memory,
)
from cs336_systems.profiling.trace import load_trace


@dataclass
class SavedTensorCounter:
    """Distinct storages saved for backward while the hooks were active."""

    excluded_storages: set[int]
    storages: dict[int, int] = field(default_factory=dict)  # data_ptr -> nbytes
    records: list[dict] = field(default_factory=list)
    # Names the operation that made a saved tensor; by default its grad_fn's class.
    made_by: Callable[[torch.Tensor], str] | None = None
    # Called after each newly counted storage (a budget check may raise from it).
    on_save: Callable[[SavedTensorCounter], None] | None = None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        new = ptr not in self.storages and ptr not in self.excluded_storages
        if new:
            self.storages[ptr] = storage.nbytes()
            if self.on_save is not None:
                self.on_save(self)
        made_by = self.made_by(t) if self.made_by else type(t.grad_fn).__name__ if t.grad_fn is not None else "leaf"
        self.records.append(
            dict(
                shape=tuple(t.shape),
                dtype=str(t.dtype).removeprefix("torch."),
                bytes=storage.nbytes(),
                made_by=made_by,
                counted=new,
            )
        )
        return t

    @property
    def total_bytes(self) -> int:
        return sum(self.storages.values())


@contextlib.contextmanager
def count_saved_tensors(
    exclude: Iterable[torch.Tensor] = (),
    made_by: Callable[[torch.Tensor], str] | None = None,
    on_save: Callable[[SavedTensorCounter], None] | None = None,
) -> Iterator[SavedTensorCounter]:
    """Count the bytes autograd saves for backward inside the block (storages in `exclude` not counted);
    `made_by` names each saved tensor's maker in the records; `on_save(counter)` runs after each new
    storage is counted."""
    counter = SavedTensorCounter({t.untyped_storage().data_ptr() for t in exclude}, made_by=made_by, on_save=on_save)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
        yield counter


def recorded_trace(fn: Callable[[], object]):
    """`fn()` recorded by torch.profiler on the CPU with its memory events, as `trace.load_trace`'s table
    (its "[memory]" events are allocations and frees, by bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        path = Path(tmp) / "memory_trace.json"
        prof.export_chrome_trace(str(path))
        return load_trace(path)


def peak_allocated_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated while `fn()` runs, above the bytes allocated when it started."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    memory = recorded_trace(fn)
    memory = memory[memory["kind"] == "memory"]
    if memory.empty:
        return 0
    return int(max(memory["bytes"].astype("int64").cumsum().max(), 0))


def live_training_bytes(setup: TrainingSetup) -> int:
    """Bytes of the tensors that live between steps: parameters, gradients, optimizer state, batch."""
    storages: dict[int, int] = {}

    def add(t: torch.Tensor | None) -> None:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()

    for p in setup.model.parameters():
        add(p)
        add(p.grad)
    if setup.optimizer is not None:
        for state in setup.optimizer.state.values():
            for value in state.values():
                add(value)
    add(setup.inputs)
    add(setup.targets)
    return sum(storages.values())


def measure_peak_memory(config: BenchmarkConfig, wrap: Callable[[nn.Module], nn.Module] | None = None) -> dict:
    """One row: the configuration, status, bytes live before the measured step, and the step's peak.

    `peak_bytes` = live-before + the peak allocated above it during one step, after `config.warmup`
    warm-up steps (so AdamW's state exists, as in steady training). OOM becomes status "OOM".
    `wrap` replaces the built model by a wrapper around it (same parameters), e.g. a checkpointing one.
    """
    row = config.label()
    device = config.resolved_device()
    setup = None
    try:
        setup = build(config)
        if wrap is not None:
            setup = dataclasses.replace(setup, model=wrap(setup.model))
        for _ in range(config.warmup):
            setup.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            live = torch.cuda.memory_allocated(device)
        else:
            live = live_training_bytes(setup)
        above = peak_allocated_bytes(setup.step, device)
    except Exception as err:  # noqa: BLE001 - only out-of-memory becomes a row
        if not is_out_of_memory(err):
            raise
        row.update(status="OOM", error=str(err).splitlines()[0][:200])
        return row
    finally:
        del setup
        free_device_memory()
    row.update(status="ok", live_bytes=live, step_peak_bytes=above, peak_bytes=live + above)
    return row
