"""DDP that overlaps communication with the backward pass, one all-reduce per bucket of gradients.

Parameters are packed into buckets of at most `bucket_size_mb` MiB (2^20 bytes, the unit of torch
DDP's `bucket_cap_mb`), walking `module.parameters()` in reverse because the backward pass
completes gradients roughly from the last layer to the first. A parameter larger than the cap
gets a bucket of its own; `bucket_size_mb=None` puts everything in one bucket. A hook on each
parameter counts the gradients a bucket still waits for; when the last one arrives, the bucket's
gradients are flattened into one buffer and all-reduced asynchronously,

    flat_b = concat(vec(p.grad) for p in b)      flat_b <- (1/n) sum_r flat_b,r

and `finish_gradient_synchronization()` waits for the buffers and copies each slice back into
its gradient. Buckets are launched in bucket order (a bucket that completes early waits for
the ones before it, as in torch DDP), so every rank issues the same sequence of collectives.

With n_b buckets the step pays n_b per-call costs instead of one per parameter, and only the
last bucket's all-reduce must start after the backward pass ends (ddp_overhead_model.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cs336_systems.distributed.ddp_base import DataParallel, all_reduce_mean
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
    def __init__(self, module: nn.Module, bucket_size_mb: float | None):
        if bucket_size_mb is not None and not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be positive or None (one bucket), got {bucket_size_mb}")
        super().__init__(module)
        self.bucket_size_mb = bucket_size_mb
        cap = None if bucket_size_mb is None else bucket_size_mb * BYTES_PER_MB
        self.buckets = assign_buckets(self.trainable_parameters(), cap)
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self._waiting = [len(bucket) for bucket in self.buckets]
        self._next_bucket = 0
        self._arrived: set[int] = set()
        self._in_flight: list[tuple[dist.Work, torch.Tensor, list[torch.Tensor]]] = []
        for p in self.trainable_parameters():
            p.register_post_accumulate_grad_hook(weak_method(self._gradient_ready))

    def _gradient_ready(self, p: torch.Tensor) -> None:
        if id(p) in self._arrived:
            raise RuntimeError(
                "a gradient was completed twice before finish_gradient_synchronization(); "
                "call it after every backward pass (gradient accumulation is not supported)"
            )
        self._arrived.add(id(p))
        self._waiting[self._bucket_of[id(p)]] -= 1
        while self._next_bucket < len(self.buckets) and self._waiting[self._next_bucket] == 0:
            self._launch(self._next_bucket)

    def _launch(self, index: int) -> None:
        self._next_bucket = index + 1
        grads = [p.grad for p in self.buckets[index] if p.grad is not None]
        if grads:
            flat = _flatten_dense_tensors(grads)
            self._in_flight.append((all_reduce_mean(flat, async_op=True), flat, grads))

    def finish_gradient_synchronization(self) -> None:
        # Buckets holding a parameter that got no gradient this step never filled up; send them now.
        while self._next_bucket < len(self.buckets):
            self._launch(self._next_bucket)
        for handle, flat, grads in self._in_flight:
            handle.wait()
            for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(synced)
        self._in_flight.clear()
        self._arrived.clear()
        self._waiting = [len(bucket) for bucket in self.buckets]
        self._next_bucket = 0
