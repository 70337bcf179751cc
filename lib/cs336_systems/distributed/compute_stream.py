"""Run the training step's compute on a CUDA stream that outranks NCCL's.

An all-reduce that overlaps the backward pass runs NCCL kernels whose thread blocks hold their SMs
for the whole collective. Whenever a backward kernel ends, the block scheduler fills the freed
SMs with pending thread blocks; at equal stream priority NCCL's blocks compete for them with the
next matmul's, which then runs on fewer SMs (a whole extra wave when its grid was sized for all
of them). CUDA dispatches the pending blocks of higher-priority streams first, so compute on a
stream of higher priority than ProcessGroupNCCL's (created with the default, lowest priority)
leaves NCCL the SMs that compute does not claim. The collectives still make progress: every
compute kernel finishes and frees its SMs, and a kernel's tail wave leaves SMs idle.

The autograd engine runs each backward op on the stream its forward op ran on, so a forward pass
inside the context puts the backward pass, and the gradient hooks it calls, on the same stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

HIGHEST_PRIORITY = -(2**16)  # torch maps a priority beyond the device's range to the highest it has


@contextlib.contextmanager
def prioritized_compute(device: torch.device | str) -> Iterator[torch.cuda.Stream | None]:
    """Within the block, CUDA work on `device` is queued on a stream of the highest priority.

    The stream first waits for the caller's current stream, and the caller's stream waits for it
    on exit, so work before, inside and after the block stays in order. Tensors allocated inside
    belong to the new stream's memory pool: keep their whole life inside the block (or call
    `record_stream` when another stream uses them). On a CPU device this is a no-op (yields None).
    """
    device = torch.device(device)
    if device.type != "cuda":
        yield None
        return
    caller = torch.cuda.current_stream(device)
    stream = torch.cuda.Stream(device, priority=HIGHEST_PRIORITY)
    stream.wait_stream(caller)
    try:
        with torch.cuda.stream(stream):
            yield stream
    finally:
        caller.wait_stream(stream)
