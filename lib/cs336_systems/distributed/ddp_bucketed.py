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

`max_ctas` (NCCL only) all-reduces on a communicator whose kernels use at most that many thread
blocks (launch.cta_limited_group): fewer SMs taken from the backward pass it overlaps, at a lower
bandwidth.

With n_b buckets the step pays n_b per-call costs instead of one per parameter, and only the
last bucket's all-reduce must start after the backward pass ends (ddp_overhead_model.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from cs336_systems.distributed.ddp_base import DataParallel, all_reduce_mean
from cs336_systems.distributed.launch import cta_limited_group
from cs336_systems.distributed.weak_hooks import weak_method

BYTES_PER_MB = 2**20


def assign_buckets(params: Sequence[nn.Parameter], bucket_size_bytes: float | None) -> list[list[nn.Parameter]]:
    """Greedy packing in reverse order; a new bucket starts when the next parameter would
    overflow the cap or has another dtype or device (a bucket is one contiguous buffer)."""
    buckets: list[list[nn.Parameter]] = []
    current: list[nn.Parameter] = []
    current_bytes = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        fits = bucket_size_bytes is None or current_bytes + nbytes <= bucket_size_bytes
        same_kind = not current or (current[-1].dtype, current[-1].device) == (p.dtype, p.device)
        if current and not (fits and same_kind):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(p)
        current_bytes += nbytes
    if current:
        buckets.append(current)
    return buckets


class DDPBucketed(DataParallel):
    def __init__(self, module: nn.Module, bucket_size_mb: float | None, max_ctas: int | None = None):
        if bucket_size_mb is not None and not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be positive or None (one bucket), got {bucket_size_mb}")
        super().__init__(module)
        self.bucket_size_mb = bucket_size_mb
        self.max_ctas = max_ctas
        self._group = None if max_ctas is None else cta_limited_group(max_ctas)
        cap = None if bucket_size_mb is None else bucket_size_mb * BYTES_PER_MB
        self.buckets = assign_buckets(self.trainable_parameters(), cap)
        self.bucket_buffers = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device) for b in self.buckets]
        self._bucket_of: dict[int, int] = {}
        self._view_of: dict[int, torch.Tensor] = {}
        for i, (bucket, buffer) in enumerate(zip(self.buckets, self.bucket_buffers)):
            offset = 0
            for p in bucket:
                self._bucket_of[id(p)] = i
                self._view_of[id(p)] = buffer[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        self._waiting = [len(bucket) for bucket in self.buckets]
        self._next_bucket = 0
        self._arrived: set[int] = set()
        self._in_flight: list[dist.Work] = []
        for p in self.trainable_parameters():
            p.register_post_accumulate_grad_hook(weak_method(self._gradient_ready))

    @torch.no_grad()
    def _gradient_ready(self, p: torch.Tensor) -> None:
        if id(p) in self._arrived:
            raise RuntimeError(
                "a gradient was completed twice before finish_gradient_synchronization(); "
                "call it after every backward pass (gradient accumulation is not supported)"
            )
        self._arrived.add(id(p))
        view = self._view_of[id(p)]
        if p.grad.data_ptr() != view.data_ptr():  # a new gradient; zero_grad(set_to_none=False) keeps the view
            view.copy_(p.grad)
            p.grad = view
        self._waiting[self._bucket_of[id(p)]] -= 1
        while self._next_bucket < len(self.buckets) and self._waiting[self._next_bucket] == 0:
            self._launch(self._next_bucket)

    def _launch(self, index: int) -> None:
        self._next_bucket = index + 1
        if any(p.grad is not None for p in self.buckets[index]):
            self._in_flight.append(all_reduce_mean(self.bucket_buffers[index], async_op=True, group=self._group))

    def finish_gradient_synchronization(self) -> None:
        # Buckets holding a parameter that got no gradient this step never filled up; send them now.
        # (Such a parameter keeps grad None; its slice holds last step's average, the same on every rank.)
        while self._next_bucket < len(self.buckets):
            self._launch(self._next_bucket)
        for handle in self._in_flight:
            handle.wait()
        self._in_flight.clear()
        self._arrived.clear()
        self._waiting = [len(bucket) for bucket in self.buckets]
        self._next_bucket = 0
