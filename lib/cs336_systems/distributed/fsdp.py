"""Fully sharded data parallelism (ZeRO stage 3), applied by hooks to an unchanged model.

What is sharded is decided by structure, not by class (`shardable_weight`): every submodule that
registers a trainable 2-D floating-point `weight` of its own — `torch.nn`'s Linear and Embedding,
ours, a user's — whatever its forward does with it. Each such weight W (numel n) is flattened,
zero-padded to N·s elements with s = ceil(n / N), and cut into N shards: rank r keeps
W_r = flat(W)[r·s : (r+1)·s] in fp32 as the parameter the optimizer sees. Everything else (norm
gains, biases, frozen weights, weights of other ranks) is small or untrained and stays replicated.
With a `compute_dtype`, a sharded module's inputs and its other floating-point parameters (a
Linear's bias) are cast to it for its forward, so the module computes in one dtype; their
gradients come back through the cast in their own dtype.
For a forward or backward pass a module needs the whole weight:

    W = unflatten(all-gather(cast(W_0), ..., cast(W_{N-1}))[:n])     cast = to compute_dtype
    dW_r = (1/N) Σ_ranks (dW computed on that rank's batch)[r·s : (r+1)·s]     (reduce-scatter)

and replicated gradients are averaged with an all-reduce. Communication happens in the compute
dtype; the shards, their gradients and the optimizer update stay in the master dtype (fp32).

Schedule (module-level hooks, so the model's own code is untouched):
  forward  — when module i starts, wait for its gather and launch the asynchronous gather of
             module i+1 (the forward order of the previous call; registration order at first),
             so a gather starts only once module i-1, two before i+1, has finished; after module
             i the gathered weight's memory is released (storage resized to 0).
  backward — when the gradient of module i's output arrives, wait for its weight (gathered
             again; a lookup table needs only its indices) and launch the gather of module i-1;
             once dW is accumulated, release W and launch the reduce-scatter of dW.
`finish_gradient_synchronization()` waits for the last reduce-scatters, all-reduces the
replicated gradients and leaves every shard's .grad ready for the optimizer.

Lookup table or linear map: the module's role is read from its first forward. Integer inputs
make it a row lookup (W[ids]), whose gradient needs only the indices, so its weight is not
gathered again for the backward. Anything else keeps the weight gathered for the backward too,
which is correct for any use of the weight inside the module's own forward (a linear map
x @ W^T, whose input's last dimension is W's second, or something else, of which the wrapper
warns once). A weight read outside its module's forward (tied into a parent's F.linear) would
meet the flat shard and fail on its shape, never silently.

Numerics: with fp32 compute, the reduced gradient is (g_0 + ... + g_{N-1}) / N, each g_r the
mean-loss gradient of rank r's part of the batch. For N a power of two the division and the
copy into the shard are exact, so FSDP equals, bit for bit, one process that averages the
gradients of the same parts. It is not bit-equal to one backward over the whole batch: there a
weight gradient is one matrix product summing over all tokens, in the BLAS's own order, and
no way of adding the parts' sums reproduces that order (tests/test_fsdp.py measures both).

Autograd keeps (views of) the gathered parameter for the backward pass; releasing only its
storage, never the tensor, and gathering into a separate alias of the same storage (whose version
counter autograd does not watch) lets the backward pass find the re-gathered values in place.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from cs336_systems.distributed.ddp_base import check_same_parameters
from cs336_systems.distributed.weak_hooks import weak_method
from cs336_systems.profiling.ranges import annotated

# Reduce-scatters allowed in flight before the oldest is waited for (each holds one full gradient).
MAX_REDUCTIONS_IN_FLIGHT = 4

# `all_gather_single` / `reduce_scatter_single` are the current names; releases before 2.13 only
# have the `*_into_tensor` / `*_tensor` ones, which newer releases deprecate.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def shardable_weight(module: nn.Module) -> nn.Parameter | None:
    """The weight FSDP shards in `module`: its own trainable 2-D floating-point `weight`, else None."""
    weight = module._parameters.get("weight")
    if weight is None or weight.dim() != 2 or not weight.is_floating_point() or not weight.requires_grad:
        return None
    return weight


LOOKUP, LINEAR, OTHER = "lookup", "linear", "other"


def weight_role(inputs: tuple, output: Any, weight_shape: torch.Size) -> str:
    """How a module uses its 2-D weight (rows, cols), read from its first forward (module docstring).

    lookup: integer input ids -> output ids.shape + (cols,); linear: input (..., cols) -> output
    (..., rows); anything else: other."""
    x = inputs[0] if inputs and torch.is_tensor(inputs[0]) else None
    if x is None or not torch.is_tensor(output):
        return OTHER
    rows, cols = weight_shape
    if not (x.is_floating_point() or x.is_complex()) and x.dtype != torch.bool:
        return LOOKUP if output.shape == (*x.shape, cols) else OTHER
    if x.dim() >= 1 and x.shape[-1] == cols and output.shape == (*x.shape[:-1], rows):
        return LINEAR
    return OTHER


def _in_backward() -> bool:
    """True while autograd runs a backward pass (e.g. activation checkpointing re-running a forward)."""
    return torch._C._current_graph_task_id() != -1


class ShardedWeight:
    """One module's weight: this rank's shard (a Parameter) and the all-gather destination."""

    FREE, GATHERING, READY = "free", "gathering", "ready"

    def __init__(self, name: str, module: nn.Module, compute_dtype: torch.dtype | None):
        weight = module.weight
        self.name, self.module = name, module
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.shape, self.numel = weight.shape, weight.numel()
        self.shard_numel = math.ceil(self.numel / self.world_size)
        padded = F.pad(weight.detach().flatten(), (0, self.world_size * self.shard_numel - self.numel))
        self.shard = nn.Parameter(padded[self.rank * self.shard_numel : (self.rank + 1) * self.shard_numel].clone())
        self.compute_dtype = compute_dtype or weight.dtype
        # `full` is what the module computes with; `gathered` aliases its storage (padding included)
        # through a separate tensor, so writing into it does not bump `full`'s version counter.
        storage = torch.empty(self.world_size * self.shard_numel, dtype=self.compute_dtype, device=weight.device)
        self.full = nn.Parameter(storage[: self.numel].view(self.shape))
        self.gathered = torch.empty(0, dtype=self.compute_dtype, device=weight.device).set_(
            self.full.untyped_storage(), 0, (storage.numel(),)
        )
        self.companions = (
            {  # the module's other parameters, cast with it (module docstring)
                n: p
                for n, p in module._parameters.items()
                if n != "weight" and p is not None and p.is_floating_point() and p.dtype != self.compute_dtype
            }
            if compute_dtype is not None
            else {}
        )
        self.role: str | None = None  # read at the first forward (`weight_role`)
        self.state = self.FREE
        self.forward_range = None  # an open `annotated` range while the module's forward runs
        self._work: dist.Work | None = None
        self._source: torch.Tensor | None = None
        self._release()

    @property
    def needs_weight_in_backward(self) -> bool:
        """A row lookup's gradient needs only its indices; any other use needs the weight again."""
        return self.role != LOOKUP

    def use_full(self) -> None:
        """Let the module compute with the gathered weight and its other parameters in the compute dtype."""
        self.module._parameters["weight"] = self.full
        for name, p in self.companions.items():
            self.module._parameters[name] = p.to(self.compute_dtype)

    def use_shard(self) -> None:
        """Give the module back the shard (what the optimizer sees) and its own other parameters."""
        self.module._parameters["weight"] = self.shard
        self.module._parameters.update(self.companions)

    def _release(self) -> None:
        self.full.untyped_storage().resize_(0)
        self.state = self.FREE

    def start_gather(self) -> None:
        """Allocate the full weight and launch its asynchronous all-gather (no-op unless free)."""
        if self.state != self.FREE:
            return
        with annotated(f"fsdp all-gather {self.name}"):
            self.full.untyped_storage().resize_(self.gathered.numel() * self.gathered.element_size())
            self._source = self.shard.detach().to(self.compute_dtype)  # cast before communicating
            self._work = _all_gather(self.gathered, self._source, async_op=True)
        self.state = self.GATHERING

    def wait_gather(self) -> None:
        """Make the full weight usable (on a GPU: order the current stream after the gather)."""
        self.start_gather()
        if self.state == self.GATHERING:
            with annotated(f"fsdp wait {self.name}"):
                self._work.wait()
            self._work = self._source = None
            self.state = self.READY

    def free(self) -> None:
        if self.state == self.GATHERING:
            self._work.wait()  # never release memory a collective is still writing into
            self._work = self._source = None
        self._release()


@dataclass
class _Reduction:
    weight: ShardedWeight
    work: dist.Work
    output: torch.Tensor  # this rank's slice of the summed gradient, once `work` is done
    buffer: torch.Tensor  # the input, kept alive until the collective is done


class FSDP(nn.Module):
    """Shards every trainable 2-D `weight` of `module`'s submodules over the default process group.

    Build it on each rank from the same model on the rank's device (rank 0's values are broadcast
    first), then build the optimizer over `fsdp.parameters()`: the weight shards and the
    replicated parameters. Each rank feeds its own part of the batch; call
    `finish_gradient_synchronization()` between `backward()` and `optimizer.step()`.
    `gather_full_params()` returns the unsharded weights by name. Weights shared between two
    sharded modules (tied embeddings) are not supported.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("FSDP needs an initialized process group (torch.distributed.init_process_group)")
        if compute_dtype is not None and not compute_dtype.is_floating_point:
            raise ValueError(f"compute_dtype must be a floating-point dtype, got {compute_dtype}")
        self.module = module
        self.compute_dtype = compute_dtype
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.backend = dist.get_backend()
        self._check_devices()
        check_same_parameters(module)
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=0)

        self.weights: list[ShardedWeight] = []
        owners: dict[nn.Parameter, str] = {}
        for name, sub in module.named_modules():
            weight = shardable_weight(sub)
            if weight is None:
                continue
            if weight in owners:
                raise ValueError(f"tied weights are not supported: {name}.weight is {owners[weight]}")
            owners[weight] = f"{name}.weight"
            self.weights.append(ShardedWeight(f"{name}.weight", sub, compute_dtype))
        if not self.weights:
            raise ValueError(
                f"{type(module).__name__} has no submodule with a trainable 2-D weight to shard "
                f"(FSDP shards each module's own 2-D `weight` parameter: linear maps and lookup tables)"
            )
        self._by_shard = {w.shard: w for w in self.weights}
        for w in self.weights:
            w.use_shard()
            w.module.register_forward_pre_hook(partial(weak_method(self._before_forward), w), with_kwargs=True)
            w.module.register_forward_hook(partial(weak_method(self._after_forward), w))
            w.full.register_post_accumulate_grad_hook(partial(weak_method(self._after_backward), w))
        self.replicated = [p for p in module.parameters() if p not in self._by_shard]
        self.replicated_names = [n for n, p in module.named_parameters() if p not in self._by_shard]

        self._order = list(self.weights)  # forward execution order, refined by every forward
        self._position = {w: i for i, w in enumerate(self._order)}
        self._recording: list[ShardedWeight] | None = None
        self._reductions: deque[_Reduction] = deque()

    def _check_devices(self) -> None:
        if self.backend != dist.Backend.NCCL:
            return
        off_gpu = [n for n, p in self.module.named_parameters() if p.device.type != "cuda"]
        if off_gpu:
            raise ValueError(
                f"NCCL needs the module on this rank's GPU; parameters not on CUDA: {', '.join(off_gpu[:5])}"
            )

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        self._recording = []
        try:
            output = self.module(*inputs, **kwargs)
        finally:
            if self._recording:
                self._order = self._recording
                self._position = {}
                for i, w in enumerate(self._order):
                    self._position.setdefault(w, i)
            self._recording = None
        # The last module's weight is the first the backward pass needs: gather it during the loss.
        if torch.is_grad_enabled() and self._order[-1].needs_weight_in_backward:
            self._order[-1].start_gather()
        return output

    def _neighbour(self, w: ShardedWeight, step: int) -> ShardedWeight | None:
        i = self._position.get(w)
        if i is None or not 0 <= i + step < len(self._order):
            return None
        other = self._order[i + step]
        return None if other is w else other

    def _cast_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def cast(x):
            return x.to(self.compute_dtype) if torch.is_tensor(x) and x.is_floating_point() else x

        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    def _before_forward(self, w: ShardedWeight, module: nn.Module, args: tuple, kwargs: dict):
        recomputing = _in_backward()
        if self._recording is not None and not recomputing:
            self._recording.append(w)
        w.wait_gather()
        nxt = None if recomputing else self._neighbour(w, +1)
        if nxt is not None:
            nxt.start_gather()
        w.use_full()
        if not recomputing:  # the range a profiler timeline checks the gather against
            w.forward_range = annotated(f"fsdp forward {w.name}")
            w.forward_range.__enter__()
        if self.compute_dtype is not None:
            args, kwargs = self._cast_inputs(args, kwargs)
        return args, kwargs

    def _after_forward(self, w: ShardedWeight, module: nn.Module, args: tuple, output: Any) -> None:
        w.use_shard()
        if _in_backward():
            return  # a checkpointed segment re-ran this forward for the backward pass in progress
        if w.forward_range is not None:
            w.forward_range.__exit__(None, None, None)
            w.forward_range = None
        if w.role is None:
            w.role = weight_role(args, output, w.shape)
            if w.role == OTHER:
                warnings.warn(
                    f"FSDP: {w.name} {tuple(w.shape)} is neither a lookup table (integer ids -> rows) nor a "
                    f"linear map ((..., {w.shape[1]}) -> (..., {w.shape[0]})) in its first forward. It stays "
                    f"sharded, gathered for its forward and again for its backward, which is right for any "
                    f"use of the weight inside that forward.",
                    stacklevel=2,
                )
        w.free()
        if torch.is_tensor(output) and output.requires_grad:  # a linear map or lookup returns one tensor
            output.register_hook(partial(weak_method(self._before_backward), w))

    # ---- backward ----------------------------------------------------------------------------
    def _before_backward(self, w: ShardedWeight, grad: torch.Tensor) -> None:
        if w.needs_weight_in_backward:
            w.wait_gather()
        prev = self._neighbour(w, -1)
        if prev is not None and prev.needs_weight_in_backward:
            prev.start_gather()

    def _after_backward(self, w: ShardedWeight, full: nn.Parameter) -> None:
        grad, full.grad = full.grad, None
        # A checkpointed segment's re-run forward may stop early, skipping `_after_forward`.
        w.use_shard()
        w.free()
        flat = grad.reshape(-1)
        padding = w.world_size * w.shard_numel - w.numel
        if padding:
            flat = F.pad(flat, (0, padding))
        with annotated(f"fsdp reduce-scatter {w.name}"):
            if self.backend == dist.Backend.NCCL:
                output = flat.new_empty(w.shard_numel)
                work = _reduce_scatter(output, flat, op=dist.ReduceOp.SUM, async_op=True)
            else:
                # Gloo: all-reduce, then keep our slice. Older gloo builds lack reduce_scatter_tensor,
                # and the doubled traffic does not matter on the CPU profile.
                work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
                output = flat[w.rank * w.shard_numel : (w.rank + 1) * w.shard_numel]
        self._reductions.append(_Reduction(w, work, output, flat))
        while len(self._reductions) > MAX_REDUCTIONS_IN_FLIGHT:
            self._complete_oldest_reduction()

    def _complete_oldest_reduction(self) -> None:
        r = self._reductions.popleft()
        r.work.wait()
        grad = r.output.to(r.weight.shard.dtype, copy=True).div_(self.world_size)
        shard = r.weight.shard
        if shard.grad is None:
            shard.grad = grad
        else:
            shard.grad.add_(grad)

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Wait for the reduce-scatters, average the replicated gradients, release gathered weights."""
        while self._reductions:
            self._complete_oldest_reduction()
        with_grad = [p for p in self.replicated if p.grad is not None]
        for dtype in sorted({p.grad.dtype for p in with_grad}, key=str):  # the same order on every rank
            grads = [p.grad for p in with_grad if p.grad.dtype == dtype]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(self.world_size)
            for g, reduced in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(reduced.view_as(g))
        for w in self.weights:
            w.use_shard()
            w.free()

    # ---- full weights ------------------------------------------------------------------------
    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter of the wrapped model by its name there, unsharded, in the master dtype."""
        out = {}
        for name, p in self.module.named_parameters():
            w = self._by_shard.get(p)
            if w is None:
                out[name] = p.detach().clone()
                continue
            flat = p.new_empty(w.world_size * w.shard_numel)
            _all_gather(flat, p.detach())
            out[name] = flat[: w.numel].view(w.shape).clone()
        return out
