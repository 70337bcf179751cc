"""What every data-parallel wrapper here shares.

A wrapper takes an unchanged `nn.Module`, copies rank 0's parameters and buffers to every rank
at construction (so all replicas start equal), runs `forward` on the module, and after the
backward pass makes every rank's gradients the average over the n ranks,

    g  <-  (1/n) * sum_r g_r        (one all-reduce per tensor or bucket)

so that the optimizer steps of all ranks apply the same update and the replicas stay equal.
`finish_gradient_synchronization()` must be called between `loss.backward()` and
`optimizer.step()`; how much of the communication it still has to do is what distinguishes the
flavours. Only parameters with `requires_grad` are communicated, and only those that received a
gradient in this step: every rank must agree on which ones did (as with torch DDP's default
`find_unused_parameters=False`), because collectives are matched by the order they are issued in.
A parameter used on some ranks only is not detected (that would cost a collective every step): the
ranks' collectives stop matching, and the job stalls until the process group's timeout.

For the same reason every rank must wrap the same model. That is checked at construction, with one
small collective (`check_same_parameters`), before the broadcast, which would otherwise copy rank 0's
tensors over other ranks' tensors of other sizes.
"""

from __future__ import annotations

import abc

import torch
import torch.distributed as dist
import torch.nn as nn


def require_process_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "data-parallel wrappers need an initialized process group (torch.distributed.init_process_group)"
        )


def all_reduce_mean(
    tensor: torch.Tensor, async_op: bool = False, group: dist.ProcessGroup | None = None
) -> dist.Work | None:
    """`tensor <- mean over ranks` (of `group`, default all), in place; with `async_op` returns the handle to wait on.

    NCCL averages in the collective (ReduceOp.AVG). Gloo has no AVG, so each rank divides its
    contribution by n first: sum_r (g_r / n) is the mean, exactly so when n is a power of two.
    """
    if dist.get_backend(group) == dist.Backend.NCCL:
        return dist.all_reduce(tensor, op=dist.ReduceOp.AVG, group=group, async_op=async_op)
    tensor.div_(dist.get_world_size(group))
    return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


def reduce_mean(
    tensor: torch.Tensor, dst: int, async_op: bool = False, group: dist.ProcessGroup | None = None
) -> dist.Work | None:
    """`tensor <- mean over ranks` on rank `dst` only (the others' copies are left undefined); in place, as
    `all_reduce_mean` (NCCL's AVG, or each rank's contribution divided by n first on gloo)."""
    if dist.get_backend(group) == dist.Backend.NCCL:
        return dist.reduce(tensor, dst=dst, op=dist.ReduceOp.AVG, group=group, async_op=async_op)
    tensor.div_(dist.get_world_size(group))
    return dist.reduce(tensor, dst=dst, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


def _describe(entry: tuple | None) -> str:
    return "missing" if entry is None else f"{entry[2]} {entry[3]}{entry[4]}"


def check_same_parameters(module: nn.Module) -> None:
    """Raise a ValueError on every rank unless every rank's `module` has the same parameters and buffers
    (names, shapes, dtypes, requires_grad) in the same order; a collective, every rank must call it.

    The error names the first tensor that differs and what each rank has there."""
    mine = [
        ("parameter", n, tuple(p.shape), str(p.dtype), "" if p.requires_grad else ", frozen")
        for n, p in module.named_parameters()
    ]
    mine += [("buffer", n, tuple(b.shape), str(b.dtype), "") for n, b in module.named_buffers()]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if all(theirs == everyone[0] for theirs in everyone):
        return
    i = next(
        i
        for i in range(max(map(len, everyone)))
        if len({theirs[i] if i < len(theirs) else None for theirs in everyone}) > 1
    )
    at = [theirs[i] if i < len(theirs) else None for theirs in everyone]
    kind, name = next(entry[:2] for entry in at if entry is not None)
    ranks = "; ".join(
        f"rank {r}: {_describe(entry)}"
        + ("" if entry is None or entry[:2] == (kind, name) else f" ({entry[0]} {entry[1]!r})")
        for r, entry in enumerate(at)
    )
    raise ValueError(
        f"the ranks' models differ at {kind} {name!r} ({ranks}); every rank must wrap the same model, "
        f"with the same parameters and buffers (names, shapes, dtypes) in the same order"
    )


@torch.no_grad()
def broadcast_module_state(module: nn.Module, src: int = 0) -> None:
    """Overwrite every parameter (trainable or frozen) and buffer with rank `src`'s values."""
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor, src=src)


def check_module_devices(module: nn.Module) -> None:
    if dist.get_backend() != dist.Backend.NCCL:
        return
    on_cpu = [name for name, p in module.named_parameters() if p.device.type != "cuda"]
    if on_cpu:
        raise ValueError(f"NCCL needs the module on this rank's GPU; parameters not on CUDA: {', '.join(on_cpu[:5])}")


class DataParallel(nn.Module, abc.ABC):
    """Base of the DDP flavours: broadcast at construction, forward delegated to `self.module`."""

    def __init__(self, module: nn.Module):
        super().__init__()
        require_process_group()
        check_module_devices(module)
        self.module = module
        self.world_size = dist.get_world_size()
        check_same_parameters(module)
        broadcast_module_state(module)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters that get gradients, each once even when shared (`parameters()` dedups)."""
        return [p for p in self.module.parameters() if p.requires_grad]

    @abc.abstractmethod
    def finish_gradient_synchronization(self) -> None:
        """Return once every gradient holds the average over ranks (queued, on a GPU)."""
