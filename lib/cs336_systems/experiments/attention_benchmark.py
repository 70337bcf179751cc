"""Attention benchmarks for notebooks 07-09: time, memory, out-of-memory rows, accuracy.

One configuration (`benchmark_attention`) is a batch of random Q, K, V of shape
(batch, seq, d) (no head dimension, as in the handout's `pytorch_attention`):

  1. one forward under `SavedForBackward`, which counts the bytes autograd keeps for the
     backward; the memory in use before the backward is then read (CUDA: the caching
     allocator's `memory_allocated`; CPU: the distinct storages of Q, K, V, O and the saved
     tensors), and one backward runs (for a compiled function this first call compiles);
  2. `warmup` + `steps` forwards, then `warmup` + `steps` backwards (each after an untimed
     forward), synchronizing after every step, timed with timeit.default_timer.

The memory before the backward is counted from the allocator's state before Q, K, V exist.
A configuration that runs out of memory becomes a row with status "OOM" and the phase it failed
in. A memory budget can be imposed: on CUDA through the allocator's per-process memory fraction
(a real OOM), on CPU by `SavedForBackward` raising the same torch.OutOfMemoryError once the inputs
plus the saved tensors pass the budget, so the OOM path runs in the CPU profile too.

Around it: `attention_sweep` (the grid, then doubling the sequence length until OOM; on CUDA each
d_model's grid in a fresh process and a fresh process after every OOM, see `attention_benchmark_worker`),
`naive_attention_memory` (the analytic accounting) and `quadratic_fit` for notebook 07,
`merge_compiled` for notebook 08, `peak_memory_sweep` and `accuracy_table` (errors of O, L,
dQ, dK, dV against float64) for notebook 09.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from cs336_systems.attention import AttentionFn, get_attention
from cs336_systems.attention.reference import TOLERANCE, reference_gradients, relative_error
from cs336_systems.benchmarking.harness import free_device_memory, is_out_of_memory, synchronize
from cs336_systems.profiling.peak_memory import SavedTensorCounter, count_saved_tensors
from cs336_systems.profiling.ranges import annotated

MiB = 2**20


def random_qkv(
    shape_q: Sequence[int],
    shape_kv: Sequence[int] | None = None,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    requires_grad: bool = True,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard-normal Q (shape_q) and K, V (shape_kv, default shape_q), drawn on the CPU for reproducibility."""
    gen = torch.Generator().manual_seed(seed)
    shapes = (shape_q, shape_kv or shape_q, shape_kv or shape_q)
    return tuple(
        torch.randn(*s, generator=gen).to(device=device, dtype=dtype).requires_grad_(requires_grad) for s in shapes
    )


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


class SavedForBackward:
    """Context manager counting the bytes of the tensors autograd saves for the backward
    (`profiling.peak_memory.count_saved_tensors`: each storage once, a view and its base share one).
    With `budget_bytes`, entering counts `resident` (tensors already alive, e.g. Q, K, V) and a save that
    takes the total past the budget raises torch.OutOfMemoryError, as the allocator would.
    """

    def __init__(self, resident: Iterable[torch.Tensor] = (), budget_bytes: int | None = None):
        self.budget_bytes = budget_bytes
        self._resident = {t.untyped_storage().data_ptr(): _storage_bytes(t) for t in resident}
        self._counting = count_saved_tensors(on_save=lambda counter: self.check_budget())
        self._counter: SavedTensorCounter | None = None

    @property
    def saved_bytes(self) -> int:
        return self._counter.total_bytes if self._counter is not None else 0

    def live_bytes(self, *extra: torch.Tensor) -> int:
        """Resident plus saved plus `extra` tensors, each storage once."""
        saved = self._counter.storages if self._counter is not None else {}
        storages = {**self._resident, **saved, **{t.untyped_storage().data_ptr(): _storage_bytes(t) for t in extra}}
        return sum(storages.values())

    def check_budget(self, *extra: torch.Tensor) -> None:
        used = self.live_bytes(*extra)
        if self.budget_bytes is not None and used > self.budget_bytes:
            raise torch.OutOfMemoryError(
                f"out of memory (simulated budget): {used / MiB:.1f} MiB needed, "
                f"budget {self.budget_bytes / MiB:.1f} MiB"
            )

    def __enter__(self) -> SavedForBackward:
        self._counter = self._counting.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._counting.__exit__(*exc)


def _ms_stats(seconds: list[float]) -> tuple[float, float]:
    ms = [s * 1e3 for s in seconds]
    return statistics.fmean(ms), (statistics.stdev(ms) if len(ms) > 1 else 0.0)


def _time_forward(fn: AttentionFn, q, k, v, is_causal: bool, warmup: int, steps: int, device) -> list[float]:
    times = []
    for i in range(warmup + steps):
        start = timeit.default_timer()
        with annotated("forward"):
            fn(q, k, v, is_causal)
        synchronize(device)
        if i >= warmup:
            times.append(timeit.default_timer() - start)
    return times


def _time_backward(fn: AttentionFn, q, k, v, grad, is_causal: bool, warmup: int, steps: int, device) -> list[float]:
    times = []
    for i in range(warmup + steps):
        out = fn(q, k, v, is_causal)
        synchronize(device)
        start = timeit.default_timer()
        with annotated("backward"):
            out.backward(grad)
        synchronize(device)
        if i >= warmup:
            times.append(timeit.default_timer() - start)
        q.grad = k.grad = v.grad = None
    return times


def benchmark_attention(
    fn: AttentionFn,
    batch: int,
    seq_len: int,
    d_model: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    is_causal: bool = False,
    warmup: int = 5,
    steps: int = 100,
    memory_budget_bytes: int | None = None,
) -> dict:
    """One tidy row: timings in ms (mean, std), memory before the backward and saved for it, or OOM."""
    device = torch.device(device)
    row = dict(
        batch=batch, seq_len=seq_len, d_model=d_model, dtype=str(dtype).removeprefix("torch."), is_causal=is_causal
    )
    phase = "inputs"
    q = k = v = out = grad = None
    baseline = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    try:
        q, k, v = random_qkv((batch, seq_len, d_model), device=device, dtype=dtype)
        phase = "forward"
        synchronize(device)
        start = timeit.default_timer()
        budget = memory_budget_bytes if device.type == "cpu" else None
        with SavedForBackward(resident=(q, k, v), budget_bytes=budget) as saved:
            out = fn(q, k, v, is_causal)
        saved.check_budget(out)
        synchronize(device)
        first_call = timeit.default_timer() - start
        in_use = torch.cuda.memory_allocated(device) - baseline if device.type == "cuda" else saved.live_bytes(out)
        phase = "backward"
        grad = torch.randn_like(out)
        out.backward(grad)
        out = None
        q.grad = k.grad = v.grad = None
        phase = "forward"
        fwd = _time_forward(fn, q, k, v, is_causal, warmup, steps, device)
        phase = "backward"
        bwd = _time_backward(fn, q, k, v, grad, is_causal, warmup, steps, device)
    except Exception as err:  # noqa: BLE001 - only out-of-memory becomes a row
        if not is_out_of_memory(err):
            raise
        row.update(status="OOM", oom_phase=phase, error=str(err).splitlines()[0][:200])
        return row
    finally:
        del q, k, v, out, grad
        if device.type == "cuda":  # on CPU, dropping the references frees the memory
            free_device_memory()
    (fwd_ms, fwd_std), (bwd_ms, bwd_std) = _ms_stats(fwd), _ms_stats(bwd)
    row.update(
        status="ok",
        first_call_ms=first_call * 1e3,
        forward_ms=fwd_ms,
        forward_std_ms=fwd_std,
        backward_ms=bwd_ms,
        backward_std_ms=bwd_std,
        memory_before_backward_mib=in_use / MiB,
        saved_for_backward_mib=saved.saved_bytes / MiB,
    )
    return row


class CudaMemoryCap:
    """While active, caps the CUDA memory this process may reserve at what its live tensors hold on entry
    plus `budget_bytes` (then lifts the cap); a no-op elsewhere. What is live on entry (cuBLAS's workspaces
    from `allocate_library_workspaces`, the caller's tensors) is not the configurations' to spend, so the
    budget is theirs alone, as the CPU's simulated one is (`SavedForBackward`). The allocator cannot hand
    back a segment that still holds a live block, and the free room inside such segments is room a
    configuration may use beyond its budget: exact in a fresh process (an isolated sweep, the default),
    looser in one that ran earlier work."""

    def __init__(self, device: torch.device, budget_bytes: int | None):
        self.device, self.budget_bytes = torch.device(device), budget_bytes
        self.capped = self.device.type == "cuda" and budget_bytes is not None

    def __enter__(self):
        if self.capped:
            # set_per_process_memory_fraction needs a device index, and the sweeps name the device "cuda"
            self.index = torch.cuda.current_device() if self.device.index is None else self.device.index
            # cached free blocks count as reserved, and a configuration reuses them without asking the
            # allocator for more; garbage (a dropped CUDA graph's private pool) would be freed mid-sweep.
            # Both released first, or a process that ran earlier work has a looser cap than its budget
            free_device_memory()
            total = torch.cuda.get_device_properties(self.index).total_memory
            held = torch.cuda.memory_reserved(self.index)
            torch.cuda.set_per_process_memory_fraction(min(1.0, (held + self.budget_bytes) / total), self.index)

    def __exit__(self, *exc):
        if self.capped:
            torch.cuda.set_per_process_memory_fraction(1.0, self.index)


def allocate_library_workspaces(device: torch.device) -> None:
    """One tiny matmul forward and backward, so that cuBLAS's per-thread workspaces (tens of MiB,
    from the caching allocator, one for the main thread and one for autograd's) exist before a
    configuration's memory is read instead of being counted in the first one."""
    if device.type != "cuda":
        return
    x = torch.ones(16, 16, device=device, requires_grad=True)
    (x @ x).sum().backward()
    synchronize(device)


def resolve_implementation(spec: str | AttentionFn) -> AttentionFn:
    """A callable as is; a registry name of `get_attention`; "compiled:NAME" for
    torch.compile(NAME, dynamic=True), one symbolic-shape graph for every sequence length and head
    dimension, so a sweep compiles once and never reaches the recompilation limit."""
    if callable(spec):
        return spec
    name = spec.removeprefix("compiled:")
    fn = get_attention(name)
    return torch.compile(fn, dynamic=True) if name != spec else fn


Run = tuple[int, str]  # (seq_len, implementation label)


def run_in_process(
    implementations: Mapping[str, AttentionFn], d_model: int, runs: Sequence[Run], settings: dict
) -> Iterator[dict]:
    """Rows of `runs` in order, stopping after the first out-of-memory row."""
    for n, label in runs:
        row = dict(
            implementation=label, **benchmark_attention(implementations[label], seq_len=n, d_model=d_model, **settings)
        )
        yield row
        if row["status"] == "OOM":
            return


def run_in_subprocess(specs: Mapping[str, str], d_model: int, runs: Sequence[Run], settings: dict) -> Iterator[dict]:
    """`run_in_process` in a fresh Python process (`attention_benchmark_worker`), rows streamed back as JSON lines.

    Whatever an out-of-memory leaves behind on the device (the worker stops at the first) dies with
    the process, so it cannot change the memory or the threshold of the next configuration.
    """
    job = dict(
        implementations=dict(specs),
        d_model=d_model,
        runs=[list(r) for r in runs],
        settings={
            **settings,
            "device": str(settings["device"]),
            "dtype": str(settings["dtype"]).removeprefix("torch."),
        },
    )
    env = os.environ.copy()
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "cs336_systems.experiments.attention_benchmark_worker", json.dumps(job)]
    with tempfile.TemporaryFile(mode="w+") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        received = 0
        for line in proc.stdout:
            if line.startswith("{"):
                received += 1
                yield json.loads(line)
        proc.wait()
        if proc.returncode != 0 or received == 0:
            stderr.seek(0)
            raise RuntimeError(
                f"attention benchmark subprocess (d_model={d_model}, runs={runs}) failed with exit code "
                f"{proc.returncode} after {received} rows: {stderr.read().strip()[-2000:]}"
            )


def attention_sweep(
    implementations: Mapping[str, AttentionFn | str],
    d_models: Sequence[int],
    seq_lens: Sequence[int],
    *,
    batch: int = 8,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    is_causal: bool = False,
    warmup: int = 5,
    steps: int = 100,
    memory_budget_bytes: int | None = None,
    until_oom: bool = True,
    max_seq_len: int = 2**18,
    isolate: bool | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Every implementation at every (d_model, seq_len); OOM rows; then, per d_model, sequence
    lengths keep doubling past the grid (`extended` rows) until each implementation has run out
    of memory (or `max_seq_len`), so "at what size" has a measured answer.

    `implementations` maps a label to a callable or to a spec of `resolve_implementation`
    ("naive", "compiled:naive"). With `isolate` (default: on CUDA) the configurations run in fresh
    processes: the grid of one d_model in one, and after every out-of-memory the remaining ones in
    a new one, so one configuration's OOM cannot change the next one's memory. Isolation needs
    specs (a process cannot receive a callable). In one process, resolved specs are shared by all
    configurations (a compiled one compiles in its first call).
    """
    device = torch.device(device)
    if not implementations or not d_models or not seq_lens:
        raise ValueError("attention_sweep needs at least one implementation, one d_model and one seq_len")
    isolate = device.type == "cuda" if isolate is None else isolate
    if isolate and not all(isinstance(spec, str) for spec in implementations.values()):
        raise ValueError(
            "isolated sweeps need implementation specs (names such as 'naive' or 'compiled:naive'), not callables"
        )
    settings = dict(
        batch=batch,
        device=device,
        dtype=dtype,
        is_causal=is_causal,
        warmup=warmup,
        steps=steps,
        memory_budget_bytes=memory_budget_bytes,
    )
    if isolate:

        def run(d: int, runs: Sequence[Run]) -> Iterator[dict]:
            return run_in_subprocess(implementations, d, runs, settings)
    else:
        resolved = {label: resolve_implementation(spec) for label, spec in implementations.items()}
        allocate_library_workspaces(device)

        def run(d: int, runs: Sequence[Run]) -> Iterator[dict]:
            with CudaMemoryCap(device, memory_budget_bytes):
                yield from run_in_process(resolved, d, runs, settings)

    rows = []
    bar = tqdm(desc="attention", disable=not progress, leave=False)
    fitting: set[str] = set()

    def run_all(d: int, runs: list[Run], extended: bool) -> None:
        while runs:  # a batch of runs ends early at an OOM: the rest go to a fresh run
            bar.set_postfix_str(f"d={d} seq={runs[0][0]}")
            done = 0
            for row in run(d, runs):
                rows.append(dict(row, extended=extended))
                done += 1
                bar.update()
                if row["status"] == "OOM":
                    fitting.discard(row["implementation"])
            runs = runs[done:]

    for d in d_models:
        fitting = set(implementations)
        run_all(d, [(n, label) for n in sorted(seq_lens) for label in implementations], extended=False)
        n = max(seq_lens)
        while until_oom and fitting and 2 * n <= max_seq_len:
            n *= 2
            run_all(d, [(n, label) for label in implementations if label in fitting], extended=True)
    bar.close()
    return pd.DataFrame(rows)


def naive_attention_memory(batch: int, seq_len: int, d_model: int, bytes_per_element: int = 4) -> dict[str, int]:
    """Bytes of the materialised attention softmax(Q K^T / sqrt(d)) V (no mask), from what it keeps alive.

    Before the backward (what autograd saves, each storage once, plus the output):
      Q, K, V, O:            4 · B·N·d
      scores S = QK^T/√d:    B·N²   (kept by the max of the stable softmax)
      exp(S - max):          B·N²   (kept by exp and by the division)
      probabilities P:       B·N²   (kept by the product P V)
      row max and row sum:   2 · B·N
    The backward adds, at its peak, dP and dS (2 · B·N², the gradients of P and S) on top.
    """
    n_sq, n_d = batch * seq_len * seq_len, batch * seq_len * d_model
    parts = dict(
        inputs_and_output=4 * n_d,
        scores=n_sq,
        exp_scores=n_sq,
        probabilities=n_sq,
        row_statistics=2 * batch * seq_len,
    )
    out = {name: count * bytes_per_element for name, count in parts.items()}
    out["before_backward"] = sum(out.values())
    out["saved_for_backward"] = out["before_backward"] - d_model * batch * seq_len * bytes_per_element  # O is not saved
    out["backward_extra"] = 2 * n_sq * bytes_per_element
    return out


def quadratic_fit(seq_lens: Sequence[float], values: Sequence[float]) -> np.ndarray:
    """Least-squares a, b, c of values ≈ a·N² + b·N + c."""
    if len(seq_lens) < 3:
        raise ValueError(f"a quadratic fit needs at least 3 sequence lengths, got {len(seq_lens)}")
    return np.polyfit(np.asarray(seq_lens, dtype=float), np.asarray(values, dtype=float), 2)


def merge_compiled(df: pd.DataFrame, eager: str, compiled: str) -> pd.DataFrame:
    """Eager and compiled rows of one sweep side by side, with speed-ups (eager ms / compiled ms)."""
    keys = ["d_model", "seq_len"]
    cols = [
        "status",
        "first_call_ms",
        "forward_ms",
        "backward_ms",
        "memory_before_backward_mib",
        "saved_for_backward_mib",
    ]
    a = df[df.implementation == eager][keys + cols]
    b = df[df.implementation == compiled][keys + cols]
    wide = a.merge(b, on=keys, how="outer", suffixes=(f"_{eager}", f"_{compiled}"))
    wide["forward_speedup"] = wide[f"forward_ms_{eager}"] / wide[f"forward_ms_{compiled}"]
    wide["backward_speedup"] = wide[f"backward_ms_{eager}"] / wide[f"backward_ms_{compiled}"]
    return wide.sort_values(keys, ignore_index=True)


def peak_memory_sweep(
    implementations: Mapping[str, AttentionFn],
    seq_lens: Sequence[int],
    *,
    batch: int = 1,
    d_model: int = 64,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    is_causal: bool = True,
    memory_budget_bytes: int | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Memory of one forward+backward per implementation and sequence length, or an OOM row.

    `saved_for_backward_mib` is measured on any device (SavedForBackward); `peak_mib` is the CUDA
    allocator's peak during forward+backward above what was allocated before (NaN on CPU, which
    keeps no allocator statistics).
    """
    device = torch.device(device)
    rows = []
    with CudaMemoryCap(device, memory_budget_bytes):
        for n in tqdm(sorted(seq_lens), desc="peak memory", disable=not progress, leave=False):
            for name, fn in implementations.items():
                row = dict(
                    implementation=name,
                    batch=batch,
                    seq_len=n,
                    d_model=d_model,
                    dtype=str(dtype).removeprefix("torch."),
                )
                q = k = v = out = None
                try:
                    q, k, v = random_qkv((batch, n, d_model), device=device, dtype=dtype)
                    if device.type == "cuda":
                        synchronize(device)
                        torch.cuda.reset_peak_memory_stats(device)
                    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
                    budget = memory_budget_bytes if device.type == "cpu" else None
                    with SavedForBackward(resident=(q, k, v), budget_bytes=budget) as saved:
                        out = fn(q, k, v, is_causal)
                    saved.check_budget(out)
                    out.backward(torch.ones_like(out))
                    synchronize(device)
                    peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else float("nan")
                    row.update(status="ok", saved_for_backward_mib=saved.saved_bytes / MiB, peak_mib=peak / MiB)
                except Exception as err:  # noqa: BLE001 - only out-of-memory becomes a row
                    if not is_out_of_memory(err):
                        raise
                    row.update(status="OOM", error=str(err).splitlines()[0][:200])
                finally:
                    del q, k, v, out
                    if device.type == "cuda":
                        free_device_memory()
                rows.append(row)
    return pd.DataFrame(rows)


def saved_logsumexp(out: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The one tensor of shape q.shape[:-1] among those saved by `out`'s autograd node."""
    saved = getattr(out.grad_fn, "saved_tensors", ())
    found = [t for t in saved if t.shape == q.shape[:-1]]
    if len(found) != 1:
        raise ValueError(f"expected exactly one saved tensor of shape {tuple(q.shape[:-1])}, found {len(found)}")
    return found[0]


def attention_errors(
    apply: AttentionFn,
    shape_q: Sequence[int],
    shape_kv: Sequence[int],
    *,
    dtype: torch.dtype,
    is_causal: bool,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> list[dict]:
    """Max absolute and norm-wise relative error ‖x − ref‖ / ‖ref‖ of O, L, dQ, dK, dV against float64.

    The reference runs on the same (rounded) inputs; NaN anywhere makes the error NaN.
    """
    q, k, v = random_qkv(shape_q, shape_kv, device=device, dtype=dtype, seed=seed)
    out = apply(q, k, v, is_causal)
    lse = saved_logsumexp(out, q)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(device=device, dtype=dtype)
    out.backward(grad)
    ref = reference_gradients(q, k, v, grad, is_causal)
    found = dict(O=out, L=lse, dQ=q.grad, dK=k.grad, dV=v.grad)
    rows = []
    for name, x in found.items():
        diff = x.detach().double() - ref[name]
        rows.append(
            dict(tensor=name, max_abs_error=diff.abs().max().item(), relative_error=relative_error(x, ref[name]))
        )
    return rows


def accuracy_table(
    implementations: Mapping[str, AttentionFn],
    cases: Iterable[dict],
    *,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> pd.DataFrame:
    """One row per implementation × case × tensor; `cases` hold shape_q, shape_kv, dtype, is_causal.

    `passes` applies the tests' tolerance (`TOLERANCE[dtype].checks` of attention/reference.py; a NaN
    never passes). `progress` prints a line per case (with its seconds, kernel compilation
    included), so a run cut off by a time limit shows how far it got.
    """
    rows = []
    cases = list(cases)
    for name, apply in implementations.items():
        for case in cases:
            dtype = case["dtype"]
            start = timeit.default_timer()
            errors = attention_errors(
                apply, case["shape_q"], case["shape_kv"], dtype=dtype, is_causal=case["is_causal"], device=device
            )
            if progress:
                worst = max(e["relative_error"] for e in errors)
                print(
                    f"{name}: q {tuple(case['shape_q'])}, k/v {tuple(case['shape_kv'])}, "
                    f"{str(dtype).removeprefix('torch.')}, causal={case['is_causal']}: "
                    f"worst relative error {worst:.1e}, {timeit.default_timer() - start:.1f} s",
                    flush=True,
                )
            for err in errors:
                rows.append(
                    dict(
                        implementation=name,
                        shape_q=str(tuple(case["shape_q"])),
                        shape_kv=str(tuple(case["shape_kv"])),
                        dtype=str(dtype).removeprefix("torch."),
                        is_causal=case["is_causal"],
                        **err,
                        passes=bool(err["relative_error"] < TOLERANCE[dtype].checks),
                    )
                )
    return pd.DataFrame(rows)


def seq_len_axis(ax, seq_lens: Iterable[int], label: str = "sequence length N") -> None:
    """Log-2 x axis with one plain tick per sequence length measured."""
    from matplotlib.ticker import NullLocator

    ticks = sorted(set(int(n) for n in seq_lens))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ticks, [f"{n:,}" for n in ticks], rotation=45 if len(ticks) > 5 else 0)
    ax.set_xlabel(label)
