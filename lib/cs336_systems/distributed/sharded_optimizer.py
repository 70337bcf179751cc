"""Optimizer state sharding: each rank keeps the optimizer state of about 1/N of the parameters.

Every parameter is owned by exactly one rank. Ownership balances the number of elements with
the greedy rule "largest parameter first, to the least-loaded rank" (ties go to the lowest
rank), which is deterministic, so every rank computes the same assignment without talking.
A rank's wrapped optimizer (`optimizer_cls`) sees only the parameters it owns, so the state
it allocates (two moments per element for AdamW) is about 1/N of the unsharded optimizer's.

One step: every rank holds the full, already averaged gradients (data parallelism); each rank
updates its own parameters; then every parameter is sent from its owner to the others, so all ranks end
the step with identical weights. Per step and rank that moves (N-1)/N of the parameter bytes on
top of the gradient all-reduce (see `accounting.sharding` for the comparison with ZeRO stage 1).

The exchange is one batch of point-to-point operations (`dist.batch_isend_irecv`, one NCCL group): each
owner sends its updated parameters to every other rank and each rank receives the others' from their
owners, all issued together, so every rank sends and receives at once: on two GPUs both directions of the
link carry bytes together, where one broadcast after another uses one direction at a time. (A process
group per owner, the owners broadcasting side by side, was faster still, but NCCL does not support
communicators in use at the same time, and a step built that way hung; docs/leaderboard_8b_record.md.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

_NOT_HYPERPARAMETERS = ("params", "param_names")


def _hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k not in _NOT_HYPERPARAMETERS}


def assign_greedy(numels: list[int], loads: list[int]) -> list[int]:
    """Owner rank of each tensor: largest first, each to the least-loaded rank (ties: lowest rank).

    `loads` (elements already owned per rank) is updated in place; equal sizes keep their order.
    """
    owners = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: -numels[i]):
        rank = min(range(len(loads)), key=lambda r: (loads[r], r))
        owners[i] = rank
        loads[rank] += numels[i]
    return owners


def assign_contiguous(numels: list[int], world_size: int) -> list[int]:
    """Owner rank of each tensor such that each rank owns one contiguous run, of about 1/N of the elements:
    a tensor goes to the rank whose share of the running total holds the tensor's middle element. (What
    `DDPShardedGradients` wants: parameters next to each other share an owner, so a bucket of gradients
    completed together goes to one rank.)"""
    if world_size < 1:
        raise ValueError(f"world_size must be positive, got {world_size}")
    total, before, owners = sum(numels), 0, []
    for n in numels:
        middle = before + n / 2
        owners.append(min(world_size - 1, int(middle * world_size // total)) if total else 0)
        before += n
    return owners


class ShardedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer_cls` so each rank holds the state of its own shard of the parameters only.

    `params` is an iterable of parameters or of parameter groups (dicts with their own
    hyperparameters); `kwargs` go to `optimizer_cls`. Every rank must construct it (and call
    `add_param_group`, `step`, `consolidated_state_dict`) with the same parameters in the same
    order. Hyperparameters changed in `self.param_groups` (an LR schedule) take effect at the next
    `step`. `state_dict()` is this rank's shard only; `consolidated_state_dict(to)` is the full one.
    `owners` (parameter -> rank, the same on every rank) replaces the greedy assignment, for a gradient
    wrapper that reduces each gradient to its owner only (`DDPShardedGradients`): the other ranks then hold
    no gradient for it, and need none.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        optimizer_cls: type[torch.optim.Optimizer],
        *,
        owners: Mapping[torch.Tensor, int] | None = None,
        **kwargs: Any,
    ):
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "ShardedOptimizer needs an initialized process group (torch.distributed.init_process_group)"
            )
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_cls must be a torch.optim.Optimizer subclass, got {optimizer_cls!r}")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.backend = dist.get_backend()
        self.owner: dict[torch.Tensor, int] = {}
        self.rank_numel = [0] * self.world_size
        self.local_optimizer: torch.optim.Optimizer | None = None
        self.given_owners = owners
        self._pending_local_groups: list[dict[str, Any]] = []
        # The base constructor calls add_param_group once per group; the wrapped optimizer is
        # built afterwards from the local halves of those groups, so it never sees foreign params.
        super().__init__(params, dict(kwargs))
        self.local_optimizer = optimizer_cls(self._pending_local_groups, **kwargs)
        del self._pending_local_groups
        self.defaults = dict(self.local_optimizer.defaults)
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups):
            for key, value in _hyperparameters(local_group).items():
                group.setdefault(key, value)

    # ---- ownership -------------------------------------------------------------------------
    def _check_parameter(self, p: torch.Tensor) -> None:
        if self.backend == "nccl" and p.device.type != "cuda":
            raise ValueError(f"NCCL broadcasts need CUDA parameters, got one on {p.device}")
        if not p.is_contiguous():
            raise ValueError(
                f"a parameter of shape {tuple(p.shape)} is not contiguous and cannot be broadcast in place"
            )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Adds the group here (all parameters) and its locally owned part to the wrapped optimizer."""
        super().add_param_group(param_group)  # validates, fills defaults, rejects duplicates
        group = self.param_groups[-1]
        try:
            for p in group["params"]:
                self._check_parameter(p)
        except ValueError:
            self.param_groups.pop()
            raise
        if self.given_owners is None:
            owners = assign_greedy([p.numel() for p in group["params"]], self.rank_numel)
        else:
            missing = [tuple(p.shape) for p in group["params"] if p not in self.given_owners]
            if missing or any(not 0 <= self.given_owners[p] < self.world_size for p in group["params"]):
                self.param_groups.pop()
                raise ValueError(
                    f"owners must map every parameter to a rank in [0, {self.world_size}); "
                    f"parameters without one: shapes {missing[:5]}"
                )
            owners = [self.given_owners[p] for p in group["params"]]
            for p, rank in zip(group["params"], owners):
                self.rank_numel[rank] += p.numel()
        for p, rank in zip(group["params"], owners):
            self.owner[p] = rank
        mine = [i for i, p in enumerate(group["params"]) if self.owner[p] == self.rank]
        local_group = {**_hyperparameters(group), "params": [group["params"][i] for i in mine]}
        if "param_names" in group:
            local_group["param_names"] = [group["param_names"][i] for i in mine]
        if self.local_optimizer is None:
            self._pending_local_groups.append(local_group)
        else:
            self.local_optimizer.add_param_group(local_group)
            for key, value in _hyperparameters(self.local_optimizer.param_groups[-1]).items():
                group.setdefault(key, value)

    # ---- the step --------------------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups):
            local_group.update(_hyperparameters(group))
        loss = self.local_optimizer.step(closure, **kwargs)
        self._exchange_parameters()
        return loss

    def exchange_operations(self) -> list[dist.P2POp]:
        """This rank's side of the parameter exchange (module docstring): a send of each parameter it owns to
        every other rank and a receive of each other parameter from its owner, in parameter order (every rank
        lists the same pairs in the same order, so each send meets its receive)."""
        ops = []
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                owner = self.owner[p]
                if owner != self.rank:
                    ops.append(dist.P2POp(dist.irecv, p, owner))
                    continue
                ops += [dist.P2POp(dist.isend, p, peer) for peer in range(self.world_size) if peer != self.rank]
        return ops

    @torch.no_grad()
    def _exchange_parameters(self) -> None:
        # In place (no flat copy of the model is ever allocated); one batch, then wait for all of it.
        ops = self.exchange_operations()
        if not ops:
            return
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    # ---- checkpoints -----------------------------------------------------------------------
    def _global_to_local_index(self) -> dict[int, int]:
        """Index of each owned parameter in the unsharded state_dict -> index in the wrapped one."""
        mapping, global_index, local_index = {}, 0, 0
        for group in self.param_groups:
            for p in group["params"]:
                if self.owner[p] == self.rank:
                    mapping[global_index] = local_index
                    local_index += 1
                global_index += 1
        return mapping

    def _param_groups_description(self) -> list[dict[str, Any]]:
        out, start = [], 0
        for group in self.param_groups:
            n = len(group["params"])
            out.append({**_hyperparameters(group), "params": list(range(start, start + n))})
            start += n
        return out

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard, in the unsharded optimizer's format.

        `param_groups` lists every parameter (indices in order of appearance, as
        `torch.optim.Optimizer.state_dict` numbers them); `state` holds the entries of the
        parameters this rank owns only, under those same global indices.
        """
        local = self.local_optimizer.state_dict()["state"]
        state = {g: local[i] for g, i in self._global_to_local_index().items() if i in local}
        return {"state": state, "param_groups": self._param_groups_description()}

    def consolidated_state_dict(self, to: int = 0) -> dict[str, Any] | None:
        """The full state dict (tensors on CPU) on rank `to`, None elsewhere; every rank must call it."""
        if not 0 <= to < self.world_size:
            raise ValueError(f"consolidated_state_dict(to={to}) is outside the world size {self.world_size}")
        shard = self.state_dict()
        shard["state"] = {
            i: {k: v.cpu() if torch.is_tensor(v) else v for k, v in entry.items()}
            for i, entry in shard["state"].items()
        }
        shards: list[Any] | None = [None] * self.world_size if self.rank == to else None
        dist.gather_object(shard, shards, dst=to)
        if self.rank != to:
            return None
        state = {i: entry for s in shards for i, entry in s["state"].items()}
        return {"state": dict(sorted(state.items())), "param_groups": shard["param_groups"]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a shard or a consolidated (or unsharded optimizer's) state dict; keeps the owned entries."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(
                "state_dict parameter groups have sizes "
                f"{[len(g['params']) for g in groups]}, "
                f"this optimizer's have {[len(g['params']) for g in self.param_groups]}"
            )
        for group, saved in zip(self.param_groups, groups):
            group.update(_hyperparameters(saved))
        saved_state = {int(k): v for k, v in state_dict["state"].items()}
        local_state = {i: saved_state[g] for g, i in self._global_to_local_index().items() if g in saved_state}
        local_groups, start = [], 0
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups):
            n = len(local_group["params"])
            local_groups.append({**_hyperparameters(group), "params": list(range(start, start + n))})
            start += n
        self.local_optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})
