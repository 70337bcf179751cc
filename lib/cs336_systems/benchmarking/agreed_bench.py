"""`triton.testing.do_bench` for a step that runs collectives: the same calls, with counts every rank shares.

do_bench times `fn` five times for an estimate, then calls it `max(1, int(warmup / estimate))` times to
warm up and `max(1, int(rep / estimate))` times timed, each timed call after flushing the L2 with a
256 MiB write, and returns the mean of the timed calls. Each rank computes its own estimate. When the
step's collectives hold the ranks together their estimates differ only by when each rank started its
clock, but a quotient near an integer (a 4,999 ms and a 5,001 ms step at rep = 30,000 give 6 and 5)
makes one rank call the step once more than the others, and that rank then waits in its first
collective until the process group's timeout. `do_bench_agreed` takes the largest estimate of the
ranks, so every rank makes the same calls; on one process it is do_bench's algorithm unchanged.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist

L2_FLUSH_BYTES = 256 * 2**20  # what triton's get_empty_cache_for_benchmark allocates


def agreed_estimate(estimate_ms: float, group: dist.ProcessGroup | None = None) -> float:
    """The largest of the ranks' estimates (the estimate itself outside a process group)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return estimate_ms
    on = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    value = torch.tensor([estimate_ms], dtype=torch.float64, device=on)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return float(value.item())


def call_counts(estimate_ms: float, warmup_ms: float, rep_ms: float) -> tuple[int, int]:
    """(warm-up calls, timed calls) as do_bench derives them from its estimate."""
    if estimate_ms <= 0:
        raise ValueError(f"the step's estimated time must be positive, got {estimate_ms} ms")
    return max(1, int(warmup_ms / estimate_ms)), max(1, int(rep_ms / estimate_ms))


def do_bench_agreed(
    fn: Callable[[], object],
    warmup: float,
    rep: float,
    *,
    group: dist.ProcessGroup | None = None,
    device_interface=None,
    clear_cache: Callable[[], object] | None = None,
) -> float:
    """Mean ms of `fn` as `triton.testing.do_bench(fn, warmup, rep)` measures it, the call counts agreed by
    the ranks of `group` (module docstring). `device_interface` (default `torch.cuda`) gives `Event` and
    `synchronize`; `clear_cache` (default: zeroing a 256 MiB buffer on the current device) runs before the
    estimate's and the timed calls."""
    di = torch.cuda if device_interface is None else device_interface
    if clear_cache is None:
        flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        clear_cache = flush.zero_
    fn()
    di.synchronize()
    start, end = di.Event(enable_timing=True), di.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        clear_cache()
        fn()
    end.record()
    di.synchronize()
    estimate = agreed_estimate(start.elapsed_time(end) / 5, group)
    n_warmup, n_repeat = call_counts(estimate, warmup, rep)
    starts = [di.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [di.Event(enable_timing=True) for _ in range(n_repeat)]
    for _ in range(n_warmup):
        fn()
    for s, e in zip(starts, ends):
        clear_cache()
        s.record()
        fn()
        e.record()
    di.synchronize()
    return statistics.fmean(s.elapsed_time(e) for s, e in zip(starts, ends))
