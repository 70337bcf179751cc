"""DDP that overlaps communication with the backward pass, one all-reduce per bucket of gradients.

Parameters are packed into buckets of at most `bucket_size_mb` MiB (2^20 bytes, the unit of torch
DDP's `bucket_cap_mb`), walking `module.parameters()` in reverse because the backward pass
completes gradients roughly from the last layer to the first. A parameter larger than the cap
gets a bucket of its own; `bucket_size_mb=None` puts everything in one bucket. Each bucket owns
one flat buffer for the whole run, and each of its parameters a slice of it. A hook on each
parameter copies the gradient into its slice as soon as it is complete and makes the slice the
gradient (`p.grad` becomes a view of the buffer, torch DDP's `gradient_as_bucket_view`); when a
bucket's last gradient arrives, its buffer is all-reduced asynchronously,

    flat_b = [vec(p.grad) for p in b]      flat_b <- (1/n) sum_r flat_b,r

and `finish_gradient_synchronization()` only waits: the averaged values are already where the
optimizer reads them, so there is no copy back, and each gradient produced by autograd is freed
as soon as it is copied (one copy of the gradients lives at the end of the backward, not two).
Buckets are launched in bucket order (a bucket that completes early waits for the ones before
it, as in torch DDP), so every rank issues the same sequence of collectives.

On a GPU the copies and all-reduces are issued on a side stream, so the copies overlap the
backward's kernels instead of queueing between them. `tail_bucket_mb` splits the
first-registered parameters (the token embedding first), whose gradients come last, into a small
final bucket: its all-reduce is the one that cannot overlap anything. `max_ctas` (NCCL only)
all-reduces on a communicator whose kernels use at most that many thread
blocks (launch.cta_limited_group): fewer SMs taken from the backward pass it overlaps, at a lower
bandwidth. Better, as notebook 15 measures: leave NCCL's blocks alone and run the step on
a stream that outranks NCCL's (compute_stream.prioritized_compute), so its blocks take only the SMs
the backward's kernels leave free.

With n_b buckets the step pays n_b per-call costs instead of one per parameter, and only the
last bucket's all-reduce must start after the backward pass ends (ddp_overhead_model.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from cs336_systems.distributed.ddp_base import DataParallel, all_reduce_mean
from cs336_systems.distributed.launch import cta_limited_group
from cs336_systems.distributed.weak_hooks import weak_method

BYTES_PER_MB = 2**20


def assign_buckets(
    params: Sequence[nn.Parameter],
    bucket_size_bytes: float | None,
    tail_bucket_bytes: float | None = None,
    group_of: Callable[[nn.Parameter], object] | None = None,
) -> list[list[nn.Parameter]]:
    """Greedy packing in reverse order; a new bucket starts when the next parameter would
    overflow the cap or has another dtype or device (a bucket is one contiguous buffer), or, with
    `group_of`, another group (`DDPShardedGradients`: another owner rank).

    `tail_bucket_bytes` splits the first-registered parameters, whose gradients the backward
    pass completes last, off the final bucket into a bucket of at most that size (at least one
    parameter): only the final bucket's all-reduce cannot overlap the backward, so a small one
    leaves less communication after it."""
    nbytes = lambda p: p.numel() * p.element_size()  # noqa: E731
    buckets: list[list[nn.Parameter]] = []
    current: list[nn.Parameter] = []
    current_bytes = 0
    for p in reversed(params):
        fits = bucket_size_bytes is None or current_bytes + nbytes(p) <= bucket_size_bytes
        kind = lambda q: (q.dtype, q.device, group_of(q) if group_of else None)  # noqa: E731
        same_kind = not current or kind(current[-1]) == kind(p)
        if current and not (fits and same_kind):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(p)
        current_bytes += nbytes(p)
    if current:
        buckets.append(current)
    if tail_bucket_bytes is not None and buckets:
        final = buckets[-1]
        split = len(final) - 1  # the tail is final[split:], at least the first-registered parameter
        tail_bytes = nbytes(final[split])
        while split > 0 and tail_bytes + nbytes(final[split - 1]) <= tail_bucket_bytes:
            split -= 1
            tail_bytes += nbytes(final[split])
        if split > 0:
            buckets[-1:] = [final[:split], final[split:]]
    return buckets


class DDPBucketed(DataParallel):
    def __init__(
        self,
        module: nn.Module,
        bucket_size_mb: float | None,
        max_ctas: int | None = None,
        tail_bucket_mb: float | None = None,
    ):
        for name, value in (("bucket_size_mb", bucket_size_mb), ("tail_bucket_mb", tail_bucket_mb)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive or None, got {value}")
        super().__init__(module)
        self.bucket_size_mb = bucket_size_mb
        self.tail_bucket_mb = tail_bucket_mb
        self.max_ctas = max_ctas
        self._group = None if max_ctas is None else cta_limited_group(max_ctas)
        cap = None if bucket_size_mb is None else bucket_size_mb * BYTES_PER_MB
        tail = None if tail_bucket_mb is None else tail_bucket_mb * BYTES_PER_MB
        self.buckets = assign_buckets(self.trainable_parameters(), cap, tail, self.bucket_group())
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.bucket_buffers: list[torch.Tensor | None] = [None] * len(self.buckets)
        self._view_of: dict[int, torch.Tensor] = {}
        for i in range(len(self.buckets)):
            if self.keeps_buffers():
                self.allocate_bucket(i, torch.zeros)
        self._waiting = [len(bucket) for bucket in self.buckets]
        self._next_bucket = 0
        self._arrived: set[int] = set()
        self._in_flight: list[dist.Work] = []
        device = self.buckets[0][0].device if self.buckets else torch.device("cpu")
        self._side_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        for p in self.trainable_parameters():
            p.register_post_accumulate_grad_hook(weak_method(self._gradient_ready))

    def bucket_group(self) -> Callable[[nn.Parameter], object] | None:
        """What else than dtype and device must be equal within a bucket (`assign_buckets`'s `group_of`)."""
        return None

    def keeps_buffers(self) -> bool:
        """Whether the bucket buffers live for the whole run (here) or are allocated per step (a subclass)."""
        return True

    def allocate_bucket(self, index: int, alloc=torch.empty) -> torch.Tensor:
        """Bucket `index`'s flat buffer and each of its parameters' views into it."""
        bucket = self.buckets[index]
        buffer = alloc(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
        self.bucket_buffers[index] = buffer
        offset = 0
        for p in bucket:
            self._view_of[id(p)] = buffer[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        return buffer

    @torch.no_grad()
    def _gradient_ready(self, p: torch.Tensor) -> None:
        if id(p) in self._arrived:
            raise RuntimeError(
                "a gradient was completed twice before finish_gradient_synchronization(); "
                "call it after every backward pass (gradient accumulation is not supported)"
            )
        self._arrived.add(id(p))
        with self._on_side_stream():
            view = self._view_of[id(p)]
            if p.grad.data_ptr() != view.data_ptr():  # a new gradient; zero_grad(set_to_none=False) keeps the view
                view.copy_(p.grad)
                if self._side_stream is not None:
                    p.grad.record_stream(self._side_stream)  # not reused before the copy has read it
                p.grad = view
            self._waiting[self._bucket_of[id(p)]] -= 1
            while self._next_bucket < len(self.buckets) and self._waiting[self._next_bucket] == 0:
                self._launch(self._next_bucket)

    def _on_side_stream(self):
        """On a GPU, the copies into the buckets and the all-reduces are issued on a side stream
        that first waits for the backward's stream: the copies then overlap the backward's next
        kernels instead of queueing between them. The optimizer reads the gradients only after
        finish_gradient_synchronization() made the current stream wait for the all-reduces."""
        if self._side_stream is None:
            return contextlib.nullcontext()
        self._side_stream.wait_stream(torch.cuda.current_stream(self._side_stream.device))
        return torch.cuda.stream(self._side_stream)

    def _launch(self, index: int) -> None:
        self._next_bucket = index + 1
        if any(p.grad is not None for p in self.buckets[index]):
            self._in_flight.append(all_reduce_mean(self.bucket_buffers[index], async_op=True, group=self._group))

    def finish_gradient_synchronization(self) -> None:
        # Buckets holding a parameter that got no gradient this step never filled up; send them now.
        # (Such a parameter keeps grad None; its slice holds last step's average, the same on every rank.)
        with self._on_side_stream():
            while self._next_bucket < len(self.buckets):
                self._launch(self._next_bucket)
        for handle in self._in_flight:
            handle.wait()
        self._in_flight.clear()
        self._arrived.clear()
        self._waiting = [len(bucket) for bucket in self.buckets]
        self._next_bucket = 0
