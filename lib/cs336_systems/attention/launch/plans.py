"""The launch layer of the Triton FlashAttention kernels: launch plans and the state they need, in one object.

A *launch plan* is what a launch derives from its tensors' geometry and the rules' choices for it (a split
of the kernel's loop, descriptor reads: `heuristics.Choices`, which the caller passes; `derive_plan`): grid,
strides, constexprs, whether an input is read from a contiguous copy, the split forward's workspace sizes. At
short sequences the host is the latency and deriving a plan took about as long as the launch itself, so
`KernelLaunches` keeps one plan per geometry, and with them the routes the dispatch decided per geometry,
the split forward's workspaces, the scratch memory of device-built tensor descriptors and the zeroed
arrival counts of CUDA-graph captures. Every cache is bounded (it starts over past `MAX_ENTRIES`), and
`clear()` empties the derived ones; a configuration table store or reload clears them
(`configs.answer_cache`). `LAUNCHES` is the process's one instance.

Below it: the kernels (`kernels.triton_forward`, `kernels.triton_backward`), `triton_support.launch` (Triton's launcher
without its per-call argument binding), `launch.layout` (shape and stride facts), `configs`, and `heuristics`
for the launches named by a configuration alone (`launch_forward`, `launch_dq`, `launch_dkdv`: the tuner's).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
import triton

from cs336_systems.attention.configs import KernelConfig, KernelConfigs, device_facts, register_answer_cache, sm_count
from cs336_systems.attention.heuristics import Choices, choose
from cs336_systems.attention.kernels.triton_backward import flash_bwd_dkdv_kernel, flash_bwd_dq_kernel
from cs336_systems.attention.kernels.triton_forward import flash_fwd_kernel
from cs336_systems.attention.launch.layout import (
    INTERPRETED,
    as_rows,
    input_precision,
    output_strides,
    tma_compatible,
    tma_device,
)
from cs336_systems.attention.validation import Problem, head_dim_tile
from cs336_systems.triton_support.launch import CachedLauncher, current_device_and_stream

MAX_ENTRIES = 4096
# A launch being captured into a CUDA graph takes its split forward's arrival counts from a slab per device
# zeroed outside any capture (`KernelLaunches.split_workspace`).
GRAPH_ARRIVAL_SLAB = 1 << 16

# Each kernel's tensor arguments in order, by role: "read" a (..., N, d) input, read in place where
# its leading dimensions merge (else from a contiguous copy) and through tensor descriptors where
# `reads_by_tma` allows; "write" a (..., N, d) output; "lse" a (..., N) vector of per-row values,
# "lse_like" one with the previous one's strides (the kernels take one pair for both).
ROLES = {
    "forward": ("read", "read", "read", "write", "lse"),
    "dkdv": ("read", "read", "read", "read", "lse", "lse_like", "write", "write"),
    "dq": ("read", "read", "read", "read", "read", "lse", "lse_like", "write"),
}


class LaunchPlan(NamedTuple):
    """What a launch derives from its tensors' geometry (`derive_plan`); `serial` names a cached plan
    to the launcher (`CachedLauncher`'s signature), unique among the plans made in this process."""

    serial: int
    grid: tuple[int, ...]
    copies: tuple[bool, ...]  # per tensor: read from a contiguous (batch, N, d) copy
    scalars: tuple[int, ...]  # the strides in the kernel's order, then N_QUERIES, N_KEYS (forward: KV_CHUNK)
    meta: dict  # constexprs and launch options
    workspace: tuple[int, int] | None = None  # split-key forward: fp32 partials, int32 arrival counts


def split_plan(q: torch.Tensor, n_k: int, is_causal: bool, config: KernelConfig, kv_chunk: int):
    """(keys per program, grid's split dimension, workspace sizes) of a forward launch whose programs take
    `kv_chunk` keys each (0: no split)."""
    if kv_chunk < 0 or kv_chunk % config.k_tile:
        raise ValueError(
            f"kv_chunk must be 0 (no split) or a positive multiple of K_TILE = {config.k_tile}, got {kv_chunk}"
        )
    if not kv_chunk:
        return 0, 1, None
    n_q, d = q.shape[-2:]
    query_tiles = q.numel() // (n_q * d) * -(-n_q // config.q_tile)
    # Causal query tiles stop at key (i + 1)·Q_TILE: no program of the last one's keys is idle.
    keys = min(n_k, -(-n_q // config.q_tile) * config.q_tile) if is_causal else n_k
    splits = -(-keys // kv_chunk)
    return kv_chunk, splits, (query_tiles * splits * config.q_tile * (head_dim_tile(d) + 2), query_tiles)


def derive_plan(
    kernel: str,
    tensors: tuple[torch.Tensor, ...],
    is_causal: bool,
    config: KernelConfig,
    serial: int = -1,
    split: int | tuple[int, int] = 0,
    by_tma: bool = True,
) -> LaunchPlan:
    """The launch plan of `kernel` on `tensors` (laid out as `ROLES[kernel]`), derived in full. `split` and
    `by_tma` are the rules' choices (`heuristics.Choices`): the forward's keys per program (0: no split) and
    whether it may read through descriptors; a backward kernel's (rows per chunk, chunks) of its loop."""
    roles = ROLES[kernel]
    if len(tensors) != len(roles):
        raise ValueError(f"the {kernel} kernel takes {len(roles)} tensors, got {len(tensors)}")
    q, k = tensors[0], tensors[1]
    (n_q, d), n_k = q.shape[-2:], k.shape[-2]
    copies, strides, use_tma = [], [], by_tma and tma_device(q)
    for t, role in zip(tensors, roles):
        copy = False
        if role == "read":
            rows, t_strides = as_rows(t)
            copy = rows is not t
            use_tma = use_tma and tma_compatible(rows, t_strides)
        elif role == "write":
            t_strides = output_strides(t)
        elif role == "lse":
            lse = t
            t_strides = lse_strides = output_strides(t, 1)
        else:
            if output_strides(t, 1) != lse_strides:
                raise ValueError(
                    f"the {kernel} kernel reads its per-row vectors with one set of strides: got shapes "
                    f"{tuple(lse.shape)} and {tuple(t.shape)}, strides {lse.stride()} and {t.stride()}"
                )
            t_strides = ()
        copies.append(copy)
        strides.extend(t_strides)
    rows_of_grid, tile = (n_k, config.k_tile) if kernel == "dkdv" else (n_q, config.q_tile)
    grid = (-(-rows_of_grid // tile), q.numel() // (n_q * d))  # triton.cdiv is a JIT helper: slow from Python
    scalars = (*strides, n_q, n_k)
    meta = dict(
        # scale is a constexpr: it follows from D, which the kernel is compiled for anyway
        scale=d**-0.5,
        D=d,
        D_TILE=head_dim_tile(d),
        Q_TILE_SIZE=config.q_tile,
        K_TILE_SIZE=config.k_tile,
        is_causal=bool(is_causal),
        INPUT_PRECISION=input_precision(q.dtype),
        USE_TMA=use_tma,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    workspace = None
    if kernel == "forward":
        chunk, splits, workspace = split_plan(q, n_k, is_causal, config, split)
        grid, scalars, meta["SPLIT_KV"] = (*grid, splits), (*scalars, chunk), bool(chunk)
        meta["MAX_SPLITS"] = max(2, 1 << (splits - 1).bit_length())
    else:
        chunk, splits = split
        grid, scalars, meta["SPLIT"] = (*grid, splits), (*scalars, chunk), splits > 1
    return LaunchPlan(serial, grid, tuple(copies), scalars, meta, workspace)


class KernelLaunches:
    """Launches of the three Triton kernels by plan, and every cache the launch layer keeps (module docstring).

    `plan` derives (or finds) a kernel's launch plan for some tensors, `run` launches by a plan, `launch`
    does both. `routes` are the dispatch's per-geometry decisions, kept here with the plans they point to
    (`launch.dispatch.route_of`)."""

    def __init__(self):
        self.launchers = {
            "forward": CachedLauncher(flash_fwd_kernel),
            "dkdv": CachedLauncher(flash_bwd_dkdv_kernel),
            "dq": CachedLauncher(flash_bwd_dq_kernel),
        }
        self.plans: dict[tuple, LaunchPlan] = {}
        self.routes: dict[tuple, object] = {}
        # Per (device, stream): the split forward's fp32 partials and int32 arrival counts, which each launch
        # leaves at zero, so launches on one stream, which run one after another, reuse them uncleared.
        self.split_workspaces: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        # Per device: [zeroed slab, first free element] of arrival counts for launches captured into CUDA
        # graphs (each slice serves one captured launch for good; zeros made during a capture would be a
        # memset node run at every replay).
        self.graph_arrivals: dict[int, list] = {}
        # Per (device, stream): the scratch memory in which the kernels build their tensor descriptors.
        self.descriptor_scratch: dict[tuple[int, int], torch.Tensor] = {}
        self._serials = itertools.count()  # never restarts: a serial names a plan to its launcher for good

    def clear(self) -> None:
        """Forget the derived answers (plans, routes); workspaces and scratch stay allocated."""
        self.plans.clear()
        self.routes.clear()

    @staticmethod
    def remember(cache: dict, key, value):
        """`cache[key] = value`, the cache starting over once it holds MAX_ENTRIES."""
        if len(cache) >= MAX_ENTRIES:
            cache.clear()
        cache[key] = value
        return value

    def plan(
        self,
        kernel: str,
        tensors: tuple[torch.Tensor, ...],
        is_causal: bool,
        config: KernelConfig,
        split: int | tuple[int, int] = 0,
        by_tma: bool = True,
    ) -> LaunchPlan:
        """The launch plan of `kernel` on `tensors` (laid out as `ROLES[kernel]`; `split`, `by_tma`: as
        `derive_plan`'s), kept per geometry.

        The plan's key holds everything it is derived from: the tensors' shapes, strides, dtypes and
        16-byte alignment of their addresses, the device (descriptor reads), the configuration, the
        rules' choices, causality and the fp32 matmul precision. That is also everything Triton
        specializes the compilation on, so the plan's serial number serves the launcher as the launch's
        signature."""
        key = (
            kernel,
            config,
            bool(is_causal),
            tensors[0].device,
            torch.get_float32_matmul_precision(),
            split,
            by_tma,
            *[(t.shape, t.stride(), t.dtype, t.data_ptr() % 16) for t in tensors],
        )
        plan = self.plans.get(key)
        if plan is None:
            plan = self.remember(
                self.plans, key, derive_plan(kernel, tensors, is_causal, config, next(self._serials), split, by_tma)
            )
        return plan

    def launch(
        self,
        kernel: str,
        tensors: tuple[torch.Tensor, ...],
        is_causal: bool,
        config: KernelConfig,
        split: int | tuple[int, int] = 0,
        by_tma: bool = True,
    ):
        """Launch `kernel` on `tensors` (laid out as `ROLES[kernel]`) by its plan; returns the compiled kernel."""
        return self.run(kernel, self.plan(kernel, tensors, is_causal, config, split, by_tma), tensors)

    def run(self, kernel: str, plan: LaunchPlan, tensors: tuple[torch.Tensor, ...]):
        """Launch `kernel` on `tensors` by `plan` (`plan` of tensors of this geometry)."""
        if True in plan.copies:
            tensors = tuple(as_rows(t)[0] if copy else t for t, copy in zip(tensors, plan.copies))
        if kernel == "forward":  # without a split, the output and L stand in for the workspace the kernel never reads
            tensors = (
                *tensors,
                *(self.split_workspace(tensors[0].device, plan.workspace) if plan.workspace else tensors[3:5]),
            )
        if plan.meta["USE_TMA"] and not INTERPRETED:
            # Descriptors built on the device need scratch memory from Triton's allocator: a per-thread
            # setting, and the backward runs on autograd's thread.
            triton.set_allocator(self._scratch)
        if kernel != "forward" and plan.meta["SPLIT"]:  # the chunks add into the gradients (`backward_split`)
            for grad in tensors[-1:] if kernel == "dq" else tensors[-2:]:
                grad.zero_()
        signature = None if True in plan.copies else plan.serial  # a copy's address is not in the key
        return self.launchers[kernel](plan.grid, tensors, plan.scalars, plan.meta, signature)

    def _scratch(self, size: int, alignment: int, stream: int | None) -> torch.Tensor:
        """Triton's allocator for device-built descriptors: kernels on one stream run one after another, so
        each launch reuses the last one's scratch (an allocation per launch cost host time a short call cannot spare);
        a launch captured into a CUDA graph gets its own, which lives as long as the graph."""
        if torch.cuda.is_current_stream_capturing():
            return torch.empty(size, dtype=torch.int8, device="cuda")
        key = (torch._C._cuda_getDevice(), stream)
        scratch = self.descriptor_scratch.get(key)
        if scratch is None or scratch.numel() < size:  # the allocator's blocks are aligned far past `alignment`
            scratch = self.descriptor_scratch[key] = torch.empty(size, dtype=torch.int8, device="cuda")
        return scratch

    def split_workspace(self, device: torch.device, sizes: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The split forward's (fp32 partials, int32 arrival counts at zero) for a launch on the current stream."""

        def fresh():
            return (
                torch.empty(sizes[0], dtype=torch.float32, device=device),
                torch.zeros(sizes[1], dtype=torch.int32, device=device),
            )

        if device.type != "cuda":
            key = (-1, 0)  # the interpreter runs synchronously
        else:
            key = current_device_and_stream()
            if torch.cuda.is_current_stream_capturing():
                slab = self.graph_arrivals.get(key[0])
                if slab is None or slab[1] + sizes[1] > slab[0].numel():
                    return fresh()  # before any eager split launch on the device, or once the slab is used up
                slab[1] += sizes[1]
                return torch.empty(sizes[0], dtype=torch.float32, device=device), slab[0][slab[1] - sizes[1] : slab[1]]
            if key[0] not in self.graph_arrivals:
                self.graph_arrivals[key[0]] = [torch.zeros(GRAPH_ARRIVAL_SLAB, dtype=torch.int32, device=device), 0]
        workspace = self.split_workspaces.get(key)
        if workspace is None or workspace[0].numel() < sizes[0] or workspace[1].numel() < sizes[1]:
            # the old one may still be in use by a queued launch: the stream-ordered allocator keeps it until then
            if workspace is not None:
                sizes = (max(sizes[0], workspace[0].numel()), max(sizes[1], workspace[1].numel()))
            workspace = self.split_workspaces[key] = fresh()
        return workspace


LAUNCHES = KernelLaunches()
register_answer_cache(LAUNCHES)  # plans and routes embed configurations


def launch_choices(q: torch.Tensor, k: torch.Tensor, is_causal: bool, config: KernelConfig) -> Choices:
    """The rules' choices for a launch named by its kernel's configuration alone (the tuner's and the tests'
    entry; a call's route asks `heuristics.choose` with each kernel's own configuration)."""
    major = device_facts(q.device)[0] if q.is_cuda else 0
    return choose(Problem.of(q, k, is_causal), KernelConfigs(config, config, config), major, sm_count(q.device), False)


def launch_forward(q, k, v, out, lse, is_causal: bool, config: KernelConfig, kv_chunk: int | None = None):
    """O and L of (..., N, d) inputs into `out` (q's shape) and `lse` (q.shape[:-1]): grid (query
    tiles, batch, key chunks), batch = the leading dimensions. `kv_chunk`: keys per program where
    each query tile's keys are split over programs; None: `heuristics.kv_split_chunk` decides, 0: no
    split. Returns the compiled kernel."""
    choices = launch_choices(q, k, is_causal, config)
    split = choices.kv_chunk if kv_chunk is None else kv_chunk
    return LAUNCHES.launch("forward", (q, k, v, out, lse), is_causal, config, split, choices.forward_by_tma)


def launch_dkdv(q, k, v, do, lse, delta, grad_k, grad_v, is_causal: bool, config: KernelConfig):
    """dK, dV of (..., N, d) tensors into `grad_k`, `grad_v`: grid (key tiles, batch). `lse` and
    `delta` (q.shape[:-1]) share strides. Returns the compiled kernel."""
    split = launch_choices(q, k, is_causal, config).dkdv_split
    return LAUNCHES.launch("dkdv", (q, k, v, do, lse, delta, grad_k, grad_v), is_causal, config, split)


def launch_dq(q, k, v, out, do, lse, delta, grad_q, is_causal: bool, config: KernelConfig):
    """dQ of (..., N, d) tensors into `grad_q` and D = rowsum(O * dO) into `delta` (strides of `lse`):
    grid (query tiles, batch). Returns the compiled kernel."""
    split = launch_choices(q, k, is_causal, config).dq_split
    return LAUNCHES.launch("dq", (q, k, v, out, do, lse, delta, grad_q), is_causal, config, split)
