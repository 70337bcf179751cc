"""`do_bench_agreed`: do_bench's algorithm with call counts every rank shares.

The clock is a stand-in device interface (events read `time.perf_counter`), so the ranks' estimates
differ by what their step takes: rank 0's 10 ms and rank 1's 13 ms step give do_bench's own counts
(2, 10) and (1, 7) at warmup 25, rep 100. A rank with one call more than the others would wait in its
step's first collective until the process group's timeout; here every rank must make the same calls.
"""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from cs336_systems.benchmarking.agreed_bench import call_counts, do_bench_agreed
from cs336_systems.distributed import spawn


class _Event:
    def __init__(self, enable_timing: bool = True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end: _Event) -> float:
        return (end.t - self.t) * 1e3


class PerfCounterDevice:
    """`Event` and `synchronize`, as `torch.cuda` gives them, on the host clock."""

    Event = _Event

    @staticmethod
    def synchronize():
        pass


def counted_step(sleep_ms: float):
    calls = []

    def step():
        calls.append(1)
        time.sleep(sleep_ms / 1e3)

    return step, calls


def test_call_counts_are_do_bench_s():
    assert call_counts(4_999.0, 10_000, 30_000) == (2, 6)
    assert call_counts(5_001.0, 10_000, 30_000) == (1, 5)
    assert call_counts(50_000.0, 10_000, 30_000) == (1, 1)  # at least one of each
    with pytest.raises(ValueError, match="positive"):
        call_counts(0.0, 10, 10)


def test_one_process_is_do_bench_s_algorithm():
    step, calls = counted_step(10.0)
    flushes = []
    ms = do_bench_agreed(
        step, warmup=25, rep=100, device_interface=PerfCounterDevice, clear_cache=lambda: flushes.append(1)
    )
    n_warmup, n_repeat = call_counts(ms, 25, 100)
    # one call, 5 for the estimate, then warm-up and timed calls; the L2 flushed before each estimated and timed call
    assert len(calls) == 1 + 5 + n_warmup + n_repeat
    assert len(flushes) == 5 + n_repeat
    assert 10.0 <= ms < 40.0


def _rank_calls(ctx):
    step, calls = counted_step(10.0 if ctx.rank == 0 else 13.0)
    do_bench_agreed(step, warmup=25, rep=100, device_interface=PerfCounterDevice, clear_cache=lambda: None)
    counts = [None] * ctx.world_size
    dist.all_gather_object(counts, len(calls))
    return counts


@pytest.mark.multiprocess
def test_ranks_with_different_estimates_make_the_same_calls():
    counts = spawn(_rank_calls, 2, backend="gloo", timeout_s=120)[0]
    # rank 1's (slower) estimate wins: 1 + 5 + 1 warm-up + 7 timed calls on both ranks
    assert counts == [14, 14]
