"""One process per rank, the same worker code under `torch.multiprocessing.spawn` and `torchrun`.

A worker is a module-level function `worker(dist: DistContext, *args) -> result`. `spawn(worker,
world_size, args)` starts the ranks on this machine (free port chosen automatically) and
returns every rank's result; `launch_from_env(worker, args)` is the entry point under torchrun,
which sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT (multi-node included).

NCCL with one GPU per rank (`torch.cuda.set_device(local_rank)`), gloo on CPU. Every process
group has a timeout, and an exception in one rank ends all ranks with that rank's traceback:
`torch.multiprocessing` terminates the survivors, and the wall-clock `timeout_s` bounds the rest.
A rank killed by a signal is reported with the stacks faulthandler wrote when it died; one that
dies only while shutting down, after every rank saved its result, leaves the results intact (a
RuntimeWarning says so). Ranks meet at a barrier before tearing the process group down.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import socket
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401 - imported before any process group exists, see below
import torch.multiprocessing as mp

# torch.distributed.nn.functional binds `group=group.WORLD` as default arguments when it is first
# imported (torch._dynamo imports it, so torch.compile does too). Imported while a process group
# is live, those defaults keep that group alive after destroy_process_group(); its gloo threads
# then outlive the interpreter and a rank can abort at exit ("terminate called without an active
# exception"). Importing it here, before init_process_group, binds None instead.

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.local_rank])
        else:
            dist.barrier()


_CTA_LIMITED_GROUPS: dict[int, dist.ProcessGroup] = {}


def nccl_cta_limit_supported() -> bool:
    """Whether this torch build can give a communicator its own NCCL config (`max_ctas`)."""
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    return nccl is not None and hasattr(nccl, "Options") and hasattr(nccl.Options(), "config")


def cta_limited_group(max_ctas: int) -> dist.ProcessGroup:
    """A communicator over all ranks whose NCCL kernels use at most `max_ctas` thread blocks.

    An all-reduce that overlaps the backward pass runs its kernels on SMs the backward's kernels
    would otherwise use (NCCL takes one thread block per channel, up to 32 of an H100's 132 SMs by
    default). Capping the blocks trades bandwidth for compute. Collective: every rank must call it
    with the same value; the group is created once per process and value, then reused.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("cta_limited_group needs an initialized process group")
    if dist.get_backend() != "nccl":
        raise ValueError(f"max_ctas limits NCCL's thread blocks; this process group runs {dist.get_backend()}")
    if not isinstance(max_ctas, int) or max_ctas < 1:
        raise ValueError(f"max_ctas must be a positive number of thread blocks, got {max_ctas!r}")
    if not nccl_cta_limit_supported():
        raise ValueError(
            "this torch build cannot pass an NCCL config to a process group (ProcessGroupNCCL.Options.config)"
        )
    if max_ctas not in _CTA_LIMITED_GROUPS:
        options = dist.ProcessGroupNCCL.Options()
        config = options.config
        config.min_ctas, config.max_ctas = 1, max_ctas
        options.config = config
        _CTA_LIMITED_GROUPS[max_ctas] = dist.new_group(backend="nccl", pg_options=options)
    return _CTA_LIMITED_GROUPS[max_ctas]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_backend(backend: str | None, world_size: int) -> str:
    """`None`/"auto": NCCL when every rank can have its own GPU, else gloo."""
    if backend in (None, "auto"):
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)} or 'auto'")
    if backend == "nccl":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < world_size:
            raise ValueError(f"NCCL with world size {world_size} needs {world_size} GPUs, this machine has {have}")
    return backend


def init_process_group(rank: int, world_size: int, local_rank: int, backend: str, timeout_s: float) -> DistContext:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    kwargs = dict(backend=backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    if backend == "nccl":
        kwargs["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(**kwargs)
    return DistContext(rank, world_size, local_rank, backend)


def _spawned_entry(local_rank, worker, world_size, backend, port, timeout_s, result_dir, args):
    # A rank killed by a signal (a C++ abort in a collective, say) leaves no Python exception:
    # faulthandler writes every thread's stack to this file, and spawn() reports it.
    fault_log = open(Path(result_dir) / f"rank{local_rank}.faults", "w")  # noqa: SIM115 - open until exit
    faulthandler.enable(file=fault_log, all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "gloo":
        # ranks share the CPU: more intra-op threads than cores makes OpenMP spin and slows all ranks
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    ctx = init_process_group(local_rank, world_size, local_rank, backend, timeout_s)
    try:
        result = worker(ctx, *args)
        torch.save(result, Path(result_dir) / f"rank{local_rank}.pt")
        ctx.barrier()  # no rank tears its connections down while a peer still uses them
    finally:
        dist.destroy_process_group()


def spawn(
    worker: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    backend: str | None = "auto",
    timeout_s: float = 300.0,
) -> list[Any]:
    """Run `worker(ctx, *args)` on `world_size` local processes; return the per-rank results."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    backend = resolve_backend(backend, world_size)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="cs336_spawn_") as result_dir:
        context = mp.start_processes(
            _spawned_entry,
            args=(worker, world_size, backend, port, timeout_s, result_dir, args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        results = [Path(result_dir) / f"rank{r}.pt" for r in range(world_size)]
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    for p in context.processes:
                        if p.is_alive():
                            p.terminate()
                    raise TimeoutError(
                        f"distributed job {worker.__name__} (world size {world_size}) exceeded {timeout_s:.0f} s"
                    )
        except mp.ProcessExitedException as err:
            faults = (Path(result_dir) / f"rank{err.error_index}.faults").read_text().strip()
            where = f"; its stacks when it died:\n{faults[-4000:]}" if faults else ""
            how = err.signal_name or f"exit code {err.exit_code}"
            if not all(r.exists() for r in results):
                raise RuntimeError(
                    f"rank {err.error_index} of distributed job {worker.__name__} (world size {world_size}) "
                    f"died with {how}{where}"
                ) from err
            warnings.warn(
                f"rank {err.error_index} of {worker.__name__} died with {how} while shutting down, "
                f"after every rank had saved its result; the results are kept{where}",
                RuntimeWarning,
                stacklevel=2,
            )
        return [torch.load(r, weights_only=False) for r in results]


def launch_from_env(
    worker: Callable[..., Any], args: tuple = (), backend: str | None = "auto", timeout_s: float = 600.0
) -> Any:
    """Entry point under torchrun: rank and world size come from the environment torchrun sets."""
    try:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except KeyError as err:
        raise ValueError(f"launch_from_env needs torchrun's environment; {err.args[0]} is not set") from None
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if backend in (None, "auto"):
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    ctx = init_process_group(rank, world_size, local_rank, backend, timeout_s)
    try:
        result = worker(ctx, *args)
        ctx.barrier()
        return result
    finally:
        dist.destroy_process_group()


def gather_timings(values: list[float]) -> list[list[float]]:
    """Every rank's list of timings, on every rank (all_gather_object)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, values)
    return out
