"""Naive DDP: after the backward pass, one blocking all-reduce per parameter gradient.

    for each parameter p:  p.grad <- (1/n) sum_r p.grad_r

Nothing overlaps: the whole communication time, including a fixed per-call cost for each of
the model's parameter tensors, is added to every training step.
"""

from __future__ import annotations

from cs336_systems.distributed.ddp_base import DataParallel, all_reduce_mean


class DDPNaive(DataParallel):
    def finish_gradient_synchronization(self) -> None:
        for p in self.trainable_parameters():
            if p.grad is not None:
                all_reduce_mean(p.grad)
