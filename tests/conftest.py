"""Without CUDA, Triton kernels run under its interpreter. The variable must be set before the first
`import triton` anywhere in the session, so it is set here, before any test module is imported."""

import os
import shutil


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")
