"""Without CUDA, Triton kernels run under its interpreter. The variable must be set before the first
`import triton` anywhere in the session, so it is set here, before any test module is imported.

Markers (registered in pyproject.toml): `slow` runs the notebooks, `multiprocess` starts a distributed
job in other processes; `make test-fast` leaves both out, `make test` (CI) runs everything."""

import os
import shutil
import sys

import pytest


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# A safety net for the marker: a test that starts torch.multiprocessing workers without it is named
# at the end of the run (it would slow `make test-fast` down), not failed.
_running: list = [None]
_unmarked_spawns: set[str] = set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running[0] = item
    try:
        return (yield)
    finally:
        _running[0] = None


def _watch(module, name: str) -> None:
    original = getattr(module, name, None)
    if original is None or getattr(original, "_watched", False):
        return

    def start_processes(*args, **kwargs):
        item = _running[0]
        if item is not None and item.get_closest_marker("multiprocess") is None:
            _unmarked_spawns.add(item.nodeid)
        return original(*args, **kwargs)

    start_processes._watched = True
    setattr(module, name, start_processes)


def pytest_collection_finish(session):
    for module_name in ("torch.multiprocessing", "torch.multiprocessing.spawn"):
        if module_name in sys.modules:  # imported by the collected tests; nothing spawns otherwise
            _watch(sys.modules[module_name], "start_processes")


def pytest_terminal_summary(terminalreporter):
    if _unmarked_spawns:
        terminalreporter.section("spawned processes without @pytest.mark.multiprocess")
        for nodeid in sorted(_unmarked_spawns):
            terminalreporter.write_line(f"{nodeid}: mark it multiprocess (make test-fast leaves those out)")
