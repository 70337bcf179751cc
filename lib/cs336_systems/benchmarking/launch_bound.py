"""Is a step timed by its GPU work or by the host's kernel launches?

An eager PyTorch step launches one kernel per operation from Python. When the kernels are short (a
small model, a short context, bf16 matmuls on tensor cores) the GPU finishes each before the host has
launched the next, and the step's time is the host's: it follows the number of operations (the
layers), not the FLOPs, and moves with the host's pace from run to run. Two measurements of the same
step, on the same model, right after its timed steps, tell which:

    busy fraction   b = |U_k [start_k, end_k)| / t_eager
        the union of the intervals of the GPU kernels, copies and memsets of one step (torch.profiler)
        over the step's wall time timed without the profiler (the row's mean). The profiler adds its
        own cost to every launch, so its wall time would understate b exactly where launches set the
        pace, while the kernels' durations it records do not change. A union, not a sum, so that work
        running at the same time on two streams counts once. At most 1: a value above it is noise
        between the profiled and the timed steps.
    graphed step    t_graph: the same step (forward, loss, backward and optimizer step, on the same
        static batch) captured once as a CUDA graph and replayed, one launch for the whole step; what
        remains is the GPU's work and the short gaps a graph keeps between kernels. Speed-up
        s = t_eager / t_graph.

Regime, from both: launch-bound when b < BUSY_MAX and s >= GRAPH_GAIN_MIN (the GPU idles, and taking
the launches away recovers the idle time); GPU-bound when b >= BUSY_MAX and s < GRAPH_GAIN_MIN; unclear
when the two disagree; host-bound or GPU-bound from b alone where no graph could be captured (the
reason is the row's `graph_status`).

On a CPU there are no kernels to wait for and no CUDA graphs: the busy intervals are the ATen operators,
over the profiled steps' own wall time (the profiler's cost lands inside the operators it records, so
both sides carry it): the share of the step spent inside operators, the rest being Python and dispatch
between them. The graphed columns are empty with the reason, and the label is dispatch-bound or
operator-bound.

    rows = sweep(configs, then=launch_probe())     # harness rows plus busy_ms, graphed_ms and their statuses
    with_regime(rows)                              # plus busy_fraction, graph_speedup, regime
    regime_table(rows, sizes)                      # what a notebook shows
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cs336_systems.benchmarking.harness import TrainingSetup, free_device_memory, is_out_of_memory, time_steps
from cs336_systems.profiling.streams import merged_intervals
from cs336_systems.profiling.torch_profile import MEASURED, compute_events, profiler_activities
from cs336_systems.profiling.trace import GPU_KINDS, load_trace

# Below this busy fraction the GPU idles for more than 30% of the step, so the eager time overstates
# the GPU's work by more than 1 / 0.7 = 1.43x: more than the differences between sizes the timing
# tables are read for.
BUSY_MAX = 0.7
# Removing the launches can give back at most 1 / b (1.43x at b = 0.7); a replayed graph still leaves
# a few microseconds between kernels, so a speed-up of 1.3 already says the idle time was launches.
GRAPH_GAIN_MIN = 1.3
LAUNCH_BOUND, GPU_BOUND, HOST_BOUND, UNCLEAR = "launch-bound", "GPU-bound", "host-bound", "unclear"
DISPATCH_BOUND, OPERATOR_BOUND = "dispatch-bound", "operator-bound"
NOT_MEASURED = "not measured"
ON_GPU, ON_CPU = "GPU kernels", "CPU operators"
NO_GRAPH_ON_CPU = "not run: CUDA graphs need a GPU"


def union_length(starts, ends) -> float:
    """Total length of the union of the intervals [start, end)."""
    merged = merged_intervals(starts, ends)
    return float((merged[:, 1] - merged[:, 0]).sum())


def regime(busy: float, speedup: float, gpu: bool = True) -> str:
    """The label of a step from its busy fraction and its graph speed-up (NaN: not measured)."""
    if busy != busy:
        return NOT_MEASURED
    idle = busy < BUSY_MAX
    if not gpu:
        return DISPATCH_BOUND if idle else OPERATOR_BOUND
    if speedup != speedup:
        return HOST_BOUND if idle else GPU_BOUND
    gains = speedup >= GRAPH_GAIN_MIN
    if idle and gains:
        return LAUNCH_BOUND
    if not idle and not gains:
        return GPU_BOUND
    return UNCLEAR


# ------------------------------------------------------------------------------------ measurement


def busy_time(events: pd.DataFrame, steps: int = 1, within: str | None = MEASURED) -> dict:
    """From a trace (`load_trace`) of `steps` harness steps: the busy time per step (`busy_ms`), the union of
    the intervals of the GPU kernels, copies and memsets launched inside the `within` ranges (every one
    when None), or on a CPU trace of its operators (`busy_on` says which)."""
    work = compute_events(events, within=within)
    on_gpu = bool(work["kind"].isin(GPU_KINDS).any())
    return dict(busy_ms=union_length(work.ts_us, work.end_us) / steps / 1e3, busy_on=ON_GPU if on_gpu else ON_CPU)


def step_busy(setup: TrainingSetup, steps: int = 1) -> dict:
    """`busy_time` of `steps` more steps of `setup` under torch.profiler (CPU activity too on a GPU: the
    "measured step" ranges select the kernels, and the CPU side is what profiling.torch_profile records
    everywhere else), with the wall time of the profiled steps (`profiled_ms`)."""
    if steps < 1:
        raise ValueError(f"need at least one profiled step, got {steps}")
    with torch.profiler.profile(activities=profiler_activities(setup.device)) as prof:
        _, walls = time_steps(setup.step, 0, steps, setup.device)
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
        events = load_trace(Path(tmp) / "trace.json")
    busy = busy_time(events, steps)
    if setup.device.type == "cuda" and busy["busy_on"] != ON_GPU:
        raise RuntimeError("the profiler recorded no GPU kernels for the step")
    return {**busy, "profiled_ms": statistics.fmean(walls) * 1e3, "profiled_steps": steps}


def capture(graph: torch.cuda.CUDAGraph, step: Callable[[], None], device: torch.device) -> None:
    """Record one call of `step` into `graph`, after one call on the capture stream (PyTorch's recipe:
    lazily made per-stream state, cuBLAS workspaces for one, is made before the capture, not in it).
    The first error raised inside the capture is the one re-raised, not the capture's own that follows."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream(device).wait_stream(stream)
    inside: list[BaseException] = []

    def recorded() -> None:
        try:
            step()
        except Exception as err:
            inside.append(err)
            raise

    try:
        with torch.cuda.graph(graph, stream=stream):
            recorded()
    except Exception as err:
        raise (inside[0] if inside else err) from None


def failure(err: BaseException) -> str:
    """A row's status for an exception: "OOM", or "failed: Type: first line"."""
    if is_out_of_memory(err):
        return "OOM"
    return f"failed: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}".rstrip(": ")


def graphed_step(setup: TrainingSetup, warmup: int = 1, steps: int = 3) -> dict:
    """The step of `setup` captured as one CUDA graph and replayed `warmup` + `steps` times, each replay
    synchronized (harness.time_steps): `graphed_ms`, `graphed_std_ms`, `graph_status` ("ok", "OOM",
    "failed: ..." or why it did not run)."""
    nan = float("nan")
    if setup.device.type != "cuda":
        return dict(graphed_ms=nan, graphed_std_ms=nan, graph_status=NO_GRAPH_ON_CPU)
    graph = torch.cuda.CUDAGraph()
    try:
        capture(graph, setup.step, setup.device)
        _, measured = time_steps(graph.replay, warmup, steps, setup.device)
    except Exception as err:  # noqa: BLE001 - a configuration that cannot be captured is a row
        return dict(graphed_ms=nan, graphed_std_ms=nan, graph_status=failure(err))
    finally:
        graph.reset()
        setup.model.zero_grad(set_to_none=True)
        free_device_memory()
    ms = [t * 1e3 for t in measured]
    return dict(
        graphed_ms=statistics.fmean(ms), graphed_std_ms=statistics.stdev(ms) if len(ms) > 1 else 0.0, graph_status="ok"
    )


def launch_probe(
    profiled_steps: int = 1, graph_warmup: int = 1, graph_steps: int = 3
) -> Callable[[TrainingSetup], dict]:
    """`then` for `run_benchmark` / `sweep`: after a configuration's timed steps, its busy time
    (`step_busy`) and its graphed step (`graphed_step`) on the same model. A profile that fails (out of
    memory, say) leaves the busy time empty with the reason in `busy_status`, a graph that fails its
    in `graph_status`; the timed row stands either way."""

    def probe(setup: TrainingSetup) -> dict:
        try:
            busy = {**step_busy(setup, profiled_steps), "busy_status": "ok"}
        except Exception as err:  # noqa: BLE001 - the timed row stands; the table says why this part is empty
            setup.model.zero_grad(set_to_none=True)
            free_device_memory()
            busy = dict(
                busy_ms=float("nan"),
                busy_on=ON_GPU if setup.device.type == "cuda" else ON_CPU,
                profiled_ms=float("nan"),
                profiled_steps=profiled_steps,
                busy_status=failure(err),
            )
        return {**busy, **graphed_step(setup, graph_warmup, graph_steps)}

    return probe


# ------------------------------------------------------------------------------------------ tables


def with_regime(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` (harness rows with `launch_probe`'s columns) plus `busy_fraction`, `graph_speedup`
    (mean_ms / graphed_ms) and `regime`. Rows without a probe or that did not run have NaN and
    "not measured".

    The busy fraction of GPU kernels is over the eager mean_ms, timed without the profiler (whose cost
    per launch would lengthen exactly the idle gaps measured); that of CPU operators is over the
    profiled steps' own wall time (profiled_ms), because the profiler's cost lands inside the operators
    it records, in the numerator as in that denominator. At most 1 either way."""
    out = rows.copy()
    for col in ("busy_ms", "graphed_ms", "mean_ms", "profiled_ms"):
        if col not in out:
            out[col] = np.nan
    if "busy_on" not in out:
        out["busy_on"] = None
    ran = out["status"] == "ok" if "status" in out else pd.Series(True, index=out.index)
    eager = pd.to_numeric(out["mean_ms"], errors="coerce").where(ran)
    wall = eager.where(out["busy_on"] != ON_CPU, pd.to_numeric(out["profiled_ms"], errors="coerce"))
    busy = pd.to_numeric(out["busy_ms"], errors="coerce")
    out["busy_fraction"] = (busy / wall).clip(upper=1.0).where(wall > 0)
    out["graph_speedup"] = eager / pd.to_numeric(out["graphed_ms"], errors="coerce")
    out["regime"] = [regime(b, s, on != ON_CPU) for b, s, on in zip(out.busy_fraction, out.graph_speedup, out.busy_on)]
    return out


def regime_table(rows: pd.DataFrame, order: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per configuration: size, context, precision (when the rows have several), pass, eager and
    graphed ms, the graph's speed-up, the busy fraction and the regime; a step that did not fit shows
    OOM, a graph that could not be captured its status."""
    d = with_regime(rows)
    ok = d["status"] == "ok"
    on_cpu = ok.any() and (d.loc[ok, "busy_on"] == ON_CPU).all()
    busy_name = "inside operators (share of step)" if on_cpu else "GPU busy (share of step)"
    table = pd.DataFrame({"size": d["size"], "context": d["context_length"]})
    if "precision" in d and d["precision"].nunique() > 1:
        table["precision"] = d["precision"]
    table["pass"] = d["mode"]
    table["eager (ms)"] = d["mean_ms"].round(2).astype(object).where(ok, d["status"])
    status = d["graph_status"] if "graph_status" in d else pd.Series("ok", index=d.index)
    # A failed capture shows why; a graph that could not run on this device is empty (the summary says why).
    shown = status.where(~status.isin(["ok", NO_GRAPH_ON_CPU]), np.nan)
    table["graphed (ms)"] = d["graphed_ms"].round(2).astype(object).where(status == "ok", shown).where(ok, np.nan)
    table["graph speed-up"] = d["graph_speedup"].round(2)
    table[busy_name] = d["busy_fraction"].round(2)
    busy_status = d["busy_status"].fillna("ok") if "busy_status" in d else pd.Series("ok", index=d.index)
    regimes = d["regime"].where(busy_status == "ok", NOT_MEASURED + ": " + busy_status.astype(str))
    table["regime"] = regimes.where(ok, d["status"])
    if order is not None:
        table["size"] = pd.Categorical(table["size"], list(order), ordered=True)
    if "precision" in table:
        table["precision"] = pd.Categorical(table["precision"], list(dict.fromkeys(table["precision"])), ordered=True)
    keys = [c for c in ("precision", "context", "pass", "size") if c in table]
    return table.sort_values(keys, kind="stable").reset_index(drop=True)
