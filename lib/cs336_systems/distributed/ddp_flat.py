"""Flat DDP: after the backward pass, all gradients are concatenated and all-reduced in one call.

    flat = concat(vec(p.grad) for p)      flat <- (1/n) sum_r flat_r      p.grad <- its slice of flat

One call instead of one per parameter removes the per-call overhead, at the price of copying
every gradient twice (into the flat buffer and back) and a buffer as large as the gradients.
Gradients of different dtypes cannot share a buffer, so each dtype gets its own (one call for a
model of a single dtype).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cs336_systems.distributed.ddp_base import DataParallel, all_reduce_mean


class DDPFlat(DataParallel):
    def finish_gradient_synchronization(self) -> None:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
        for p in self.trainable_parameters():
            if p.grad is not None:
                by_dtype[p.grad.dtype].append(p.grad)
        for grads in by_dtype.values():
            flat = _flatten_dense_tensors(grads)
            all_reduce_mean(flat)
            for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(synced)
