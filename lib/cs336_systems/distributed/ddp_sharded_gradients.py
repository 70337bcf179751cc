"""Gradients sharded over the ranks (ZeRO stage 2's gradients): each bucket is averaged onto one rank.

With `ShardedOptimizer`, rank r updates only the parameters it owns, so it needs only their gradients.
`DDPShardedGradients` buckets the gradients as `DDPBucketed` does (reverse order, a cap in MiB, launched
from gradient hooks as the backward completes each bucket, on a side stream), with one more rule: a
bucket holds the parameters of one owner. Each bucket is reduced to its owner instead of all-reduced,

    flat_b  <-  (1/n) sum_r flat_b,r      on owner(b); undefined elsewhere

and a rank that does not own a bucket lets go of it once its reduce is done: its buffer is allocated at
the bucket's first gradient of the step and freed after the reduce (at most `in_flight` reduces are
waited on later than their launch), the parameters' `.grad` set back to None. Per rank, the gradients
then take about 1/n of their size (the owned buckets, which live until the optimizer's zero_grad) plus
the buckets in flight, against all of them under `DDPBucketed`'s persistent buffers. A reduce moves
about half the bytes of an all-reduce; the optimizer then sends the owners' updated parameters to the
other ranks (an all-gather's bytes), so a step moves what DDP with a sharded optimizer moves.

`owners` maps every trainable parameter to a rank; `ShardedOptimizer(..., owners=the same)` must use the
same map. `sharded_optimizer.assign_contiguous` gives each rank one contiguous run of parameters, so the
buckets are as large as the cap allows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
import torch.nn as nn

from cs336_systems.distributed.ddp_base import reduce_mean
from cs336_systems.distributed.ddp_bucketed import DDPBucketed


class DDPShardedGradients(DDPBucketed):
    """`DDPBucketed` whose buckets are reduced to their parameters' owners (module docstring)."""

    def __init__(
        self, module: nn.Module, owners: Mapping[nn.Parameter, int], bucket_size_mb: float | None, in_flight: int = 2
    ):
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "DDPShardedGradients needs an initialized process group (torch.distributed.init_process_group)"
            )
        world = dist.get_world_size()
        trainable = [p for p in module.parameters() if p.requires_grad]
        bad = [tuple(p.shape) for p in trainable if p not in owners or not 0 <= owners[p] < world]
        if bad:
            raise ValueError(
                f"owners must map every trainable parameter to a rank in [0, {world}); "
                f"parameters without one: shapes {bad[:5]}"
            )
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, got {in_flight}")
        self.owner_of = {id(p): owners[p] for p in trainable}  # before DDPBucketed forms the buckets
        super().__init__(module, bucket_size_mb)
        self.rank = dist.get_rank()
        self.in_flight = in_flight
        self.bucket_owner = [self.owner_of[id(bucket[0])] for bucket in self.buckets]
        self._launched: list[tuple[int, dist.Work]] = []

    def bucket_group(self) -> Callable[[nn.Parameter], object]:
        return lambda p: self.owner_of[id(p)]

    def keeps_buffers(self) -> bool:
        return False

    @torch.no_grad()
    def _gradient_ready(self, p: torch.Tensor) -> None:
        index = self._bucket_of[id(p)]
        if self.bucket_buffers[index] is None:
            # Allocated on the compute stream (zeros: a parameter without a gradient this step adds nothing),
            # used on the side stream: recorded there, so its memory is not reused before that use is done.
            buffer = self.allocate_bucket(index, torch.zeros)
            if self._side_stream is not None:
                buffer.record_stream(self._side_stream)
        super()._gradient_ready(p)

    def _launch(self, index: int) -> None:
        self._next_bucket = index + 1
        buffer = self.bucket_buffers[index]
        if buffer is None:  # no parameter of the bucket got a gradient (on every rank alike)
            return
        self._launched.append((index, reduce_mean(buffer, self.bucket_owner[index], async_op=True, group=self._group)))
        while len(self._launched) > self.in_flight:
            self._retire(*self._launched.pop(0))

    def _retire(self, index: int, handle: dist.Work) -> None:
        """Wait for bucket `index`'s reduce (on a GPU: the side stream waits); a rank that does not own it
        drops the buffer and its parameters' gradients."""
        handle.wait()
        if self.bucket_owner[index] != self.rank:
            for p in self.buckets[index]:
                p.grad = None
        self.bucket_buffers[index] = None  # the owner's gradients keep theirs alive until zero_grad
        for p in self.buckets[index]:
            self._view_of.pop(id(p), None)

    def finish_gradient_synchronization(self) -> None:
        with self._on_side_stream():
            while self._next_bucket < len(self.buckets):
                self._launch(self._next_bucket)
            while self._launched:
                self._retire(*self._launched.pop(0))
        if self._side_stream is not None:
            torch.cuda.current_stream(self._side_stream.device).wait_stream(self._side_stream)
        self._arrived.clear()
        self._waiting = [len(bucket) for bucket in self.buckets]
        self._next_bucket = 0
