"""DDP that overlaps communication with the backward pass, one all-reduce per parameter.

A hook registered with `register_post_accumulate_grad_hook` fires as soon as a parameter's
gradient is complete (for a shared parameter, after all of its uses have accumulated into it)
and launches an asynchronous all-reduce of that gradient, p.grad <- (1/n) sum_r p.grad_r, while
autograd goes on computing the gradients of earlier layers. `finish_gradient_synchronization()`
only waits for the calls still in flight. The order of the calls is the order in which autograd
completes the gradients, which is the same on every rank because every rank runs the same graph.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from cs336_systems.distributed.ddp_base import DataParallel, all_reduce_mean
from cs336_systems.distributed.weak_hooks import weak_method


class DDPIndividualParameters(DataParallel):
    def __init__(self, module: nn.Module):
        super().__init__(module)
        self._handles: list[dist.Work] = []
        self._reduced: set[int] = set()
        for p in self.trainable_parameters():
            p.register_post_accumulate_grad_hook(weak_method(self._launch_all_reduce))

    def _launch_all_reduce(self, p: torch.Tensor) -> None:
        if id(p) in self._reduced:
            raise RuntimeError(
                "a gradient was completed twice before finish_gradient_synchronization(); "
                "call it after every backward pass (gradient accumulation is not supported)"
            )
        self._reduced.add(id(p))
        self._handles.append(all_reduce_mean(p.grad, async_op=True))

    def finish_gradient_synchronization(self) -> None:
        for handle in self._handles:
            handle.wait()
        self._handles.clear()
        self._reduced.clear()
