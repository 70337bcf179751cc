"""Named ranges that show up in torch.profiler traces and in Nsight Systems alike.

`annotated("forward")` opens a `torch.profiler.record_function` range (seen by torch.profiler)
and, on CUDA, an NVTX range (seen by `nsys profile`), so the same code is profiled by either
tool unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def annotated(name: str) -> Iterator[None]:
    if torch.compiler.is_compiling():  # ranges cannot be traced into a compiled graph
        yield
        return
    nvtx = torch.cuda.is_available() and torch.cuda.is_initialized()
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()
