"""Without CUDA, Triton kernels run under its interpreter. The variable must be set before the first
`import triton` anywhere in the session, so it is set here, before any test module is imported. With CUDA
they are compiled for the GPU, and a test that hands them CPU tensors is skipped, saying so (below).

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
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


# With a GPU the kernels are compiled for it, and a test that hands them CPU tensors cannot run in this
# session: the library says so with one exception type (`NeedsTritonInterpreter`; in a spawned rank, its
# name in the traceback the parent receives). Such a test is skipped with the reason, not failed; any
# other error fails it as before. A machine without a GPU runs them under the interpreter (CI does).
def _skipping_tests_that_need_the_interpreter():
    """The body of the setup and call hook wrappers below (`yield from` it)."""
    try:
        return (yield)
    except Exception as err:
        if not _INTERPRETED:
            from torch.multiprocessing import ProcessRaisedException

            from cs336_systems.triton_support.interpreter import NeedsTritonInterpreter

            spawned = isinstance(err, ProcessRaisedException) and NeedsTritonInterpreter.__name__ in str(err)
            if isinstance(err, NeedsTritonInterpreter) or spawned:
                pytest.skip(
                    "runs Triton kernels on CPU tensors, which needs TRITON_INTERPRET=1 (this session compiles them)"
                )
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _skipping_tests_that_need_the_interpreter())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _skipping_tests_that_need_the_interpreter())


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
