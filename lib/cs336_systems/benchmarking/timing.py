"""Timing on the device: latency of eager calls and device time of their kernels, and interleaved rounds.

`measure_times_ms` times synchronized calls: the median of `triton.testing.do_bench` on CUDA (L2
cleared before every run), `timeit` around synchronized calls elsewhere (do_bench needs a GPU).
`measure_device_ms` captures one call in a CUDA graph and times the graph's replays, so only its
kernels are timed: where an eager call's host work (Python, dispatch, launches) takes longer than
its kernels, the latency measures that host work and the device time what the kernels take.
`round_orders` rotates the order in which several implementations are timed, round after round.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from cs336_systems.benchmarking.harness import synchronize


@dataclass(frozen=True)
class TimingSettings:
    """do_bench's warm-up and measuring time in ms (CUDA); calls timed by timeit on CPU.

    `min_runs`: a configuration slower than rep_ms / min_runs gets its measuring time stretched
    so that do_bench still takes at least that many runs.
    """

    warmup_ms: float = 5.0
    rep_ms: float = 20.0
    min_runs: int = 3
    cpu_steps: int = 3
    # `flash_benchmark` times a configuration's implementations in this many interleaved rounds, each
    # with a share of rep_ms (and of cpu_steps), and takes the median over all rounds' runs (see there)
    rounds: int = 1


def measure_times_ms(
    fn: Callable[[], object],
    device: torch.device,
    settings: TimingSettings = TimingSettings(),
    grad_to_none: Sequence[torch.Tensor] = (),
) -> list[float]:
    """Milliseconds of each measured run of `fn` (its first call, e.g. compilation, is never timed)."""

    def reset_grads() -> None:
        for t in grad_to_none:
            t.grad = None

    reset_grads()
    fn()
    synchronize(device)
    if device.type != "cuda":
        times = []
        for _ in range(settings.cpu_steps):
            reset_grads()
            start = timeit.default_timer()
            fn()
            synchronize(device)
            times.append((timeit.default_timer() - start) * 1e3)
        return times
    import triton.testing

    reset_grads()
    start = timeit.default_timer()
    fn()
    synchronize(device)
    estimate_ms = (timeit.default_timer() - start) * 1e3
    rep = max(settings.rep_ms, (settings.min_runs + 1) * estimate_ms)
    return triton.testing.do_bench(
        fn, warmup=settings.warmup_ms, rep=rep, grad_to_none=list(grad_to_none) or None, return_mode="all"
    )


def measure_device_ms(
    fn: Callable[[], object],
    settings: TimingSettings = TimingSettings(),
    grad_to_none: Sequence[torch.Tensor] = (),
) -> list[float]:
    """Milliseconds of each replay of a CUDA graph holding one call of `fn`: its kernels' time without
    the host's (measuring time stretched for slow calls as in `measure_times_ms`). Gradients in
    `grad_to_none` are None when the call is captured, so the graph allocates them (from its own pool)
    rather than accumulating. The warm-up calls run on a side stream before capture, as
    torch.cuda.graph asks."""
    import triton.testing

    def reset_grads() -> None:
        for t in grad_to_none:
            t.grad = None

    caller = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(caller)
    with torch.cuda.stream(side):
        for _ in range(2):
            reset_grads()
            fn()
    caller.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    reset_grads()
    torch.cuda.empty_cache()  # the warm-up's freed blocks, so that the graph's own pool finds the memory
    generator = torch.cuda.default_generators[side.device.index]  # the one a capture takes over
    before_capture = generator.clone_state()
    try:
        # Captured on the warm-up's stream, whose cuBLAS workspace then exists already; "thread_local": only
        # this thread's calls can invalidate the capture (not, say, a notebook's IO threads).
        try:
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                fn()
        except BaseException:
            # A capture that fails stops before handing the device's default generator back: it stays marked
            # as capturing, and every later random draw on the device raises "Offset increment outside graph
            # capture encountered unexpectedly". Its state from before the capture takes its place.
            generator.graphsafe_set_state(before_capture)
            raise
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        rep = max(settings.rep_ms, (settings.min_runs + 1) * start.elapsed_time(end))  # as measure_times_ms
        return triton.testing.do_bench(graph.replay, warmup=settings.warmup_ms, rep=rep, return_mode="all")
    finally:
        # A capture that fails leaves torch.cuda.graph's stream current (its __exit__ stops at capture_end):
        # every later call would run on the failed capture's stream.
        torch.cuda.set_stream(caller)
        reset_grads()
        del graph
        torch.cuda.empty_cache()  # the graph's pool, released once nothing allocated in it is alive


def round_orders(names: Sequence, rounds: int) -> list[list]:
    """Round r times the implementations in `names` rotated by r: each takes every place equally often
    (over len(names) rounds), so none is always timed on a GPU that the others have just heated."""
    names = list(names)
    return [names[r % len(names) :] + names[: r % len(names)] for r in range(rounds)] if names else []


def median_table(
    rows: Sequence[dict], out: str, keys: Sequence[str], column: str, ratios: Sequence[tuple[str, str]], digits: int = 3
) -> pd.DataFrame:
    """Writes the timing `rows` to the CSV file `out` and prints, and returns, their median "ms" per `keys`
    with one column per value of `column`, and for each (a, b) in `ratios` the column "a/b"."""
    df = pd.DataFrame(rows)
    df.to_csv(out, index=False)
    med = df.groupby(list(keys)).ms.median().unstack(column)
    for a, b in ratios:
        med[f"{a}/{b}"] = med[a] / med[b]
    with pd.option_context("display.max_rows", 500, "display.width", 250):
        print(med.round(digits).to_string())
    return med
