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

The exchange is point-to-point (`dist.batch_isend_irecv`, one NCCL group per round): each owner sends its
updated parameters to every other rank and each rank receives the others' from their owners, all issued
together, so every rank sends and receives at once: on two GPUs both directions of the link carry bytes
together, where one broadcast after another uses one direction at a time. (A process group per owner, the
owners broadcasting side by side, was faster still, but NCCL does not support communicators in use at the
same time, and a step built that way hung; docs/leaderboard_8b_record.md.)

It runs in rounds of about `exchange_round_bytes` per owner: round k carries each owner's k-th run of its
parameters, in parameter order. `step(wait=False)` leaves the rounds in flight, so that a training step can
overlap them with its next forward: `wait_for_parameters(params)` waits (the current CUDA stream on NCCL,
the host on gloo) for the rounds that bring this rank any of `params`, in order; `wait_for_exchange()` for
all of them. Until then the parameters this rank does not own may still be being written. The next `step`,
and every state-dict method, waits for the rest first.
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
        exchange_round_bytes: int = 256 * 2**20,
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
        if isinstance(exchange_round_bytes, bool) or not isinstance(exchange_round_bytes, int):
            raise ValueError(f"exchange_round_bytes must be an int, got {type(exchange_round_bytes).__name__}")
        if exchange_round_bytes < 1:
            raise ValueError(f"exchange_round_bytes must be positive, got {exchange_round_bytes}")
        self.exchange_round_bytes = exchange_round_bytes
        # Rounds issued and not yet waited for, in order: (ids of the parameters the round brings this rank,
        # its works).
        self._in_flight: list[tuple[set[int], list[Any]]] = []
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
            raise ValueError(f"NCCL sends and receives need CUDA parameters, got one on {p.device}")
        if not p.is_contiguous():
            raise ValueError(
                f"a parameter of shape {tuple(p.shape)} is not contiguous and cannot be sent and received in place"
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

    # ---- the step ----------------------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None, *, wait: bool = True) -> Any:
        """The owned parameters' update, then the exchange; with `wait=False` the exchange is left in flight
        (module docstring: `wait_for_parameters`, `wait_for_exchange`)."""
        self.wait_for_exchange()  # the update writes parameters an earlier round may still be sending
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups):
            local_group.update(_hyperparameters(group))
        loss = self.local_optimizer.step(closure)
        self._start_exchange()
        if wait:
            self.wait_for_exchange()
        return loss

    def exchange_rounds(self) -> list[tuple[list[torch.Tensor], list[dist.P2POp]]]:
        """This rank's side of the parameter exchange (module docstring), round by round: (the parameters the
        round carries, this rank's operations). Each owner's trainable parameters, in parameter order, are
        cut into runs that close once they reach `exchange_round_bytes`; round k carries every owner's k-th
        run: a send of each parameter the rank owns to every other rank, a receive of each other one from
        its owner. Every rank lists the same pairs in the same order, so each send meets its receive."""
        runs: list[list[list[torch.Tensor]]] = [[[]] for _ in range(self.world_size)]
        run_bytes = [0] * self.world_size
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                owner = self.owner[p]
                if run_bytes[owner] >= self.exchange_round_bytes:
                    runs[owner].append([])
                    run_bytes[owner] = 0
                runs[owner][-1].append(p)
                run_bytes[owner] += p.numel() * p.element_size()
        rounds = []
        for k in range(max(len(r) for r in runs)):
            params, ops = [], []
            for owner in range(self.world_size):
                for p in runs[owner][k] if k < len(runs[owner]) else []:
                    params.append(p)
                    if owner != self.rank:
                        ops.append(dist.P2POp(dist.irecv, p, owner))
                        continue
                    ops += [dist.P2POp(dist.isend, p, peer) for peer in range(self.world_size) if peer != self.rank]
            if ops:
                rounds.append((params, ops))
        return rounds

    @torch.no_grad()
    def _start_exchange(self) -> None:
        # In place: each parameter is sent from and received into its own storage (no flat copy).
        for params, ops in self.exchange_rounds():
            received = {id(p) for p in params if self.owner[p] != self.rank}
            self._in_flight.append((received, dist.batch_isend_irecv(ops)))

    @property
    def rounds_in_flight(self) -> int:
        """How many rounds of the exchange were issued and not yet waited for."""
        return len(self._in_flight)

    def in_flight(self, params: Iterable[torch.Tensor]) -> bool:
        """Whether a round not yet waited for brings this rank any of `params`."""
        wanted = {id(p) for p in params}
        return any(received & wanted for received, _ in self._in_flight)

    def wait_for_parameters(self, params: Iterable[torch.Tensor]) -> None:
        """Wait for the rounds in flight up to the last one that brings this rank any of `params` (on NCCL the
        current CUDA stream waits; on gloo the host): after this, they hold the last step's values."""
        wanted = {id(p) for p in params}
        last = max((k for k, (received, _) in enumerate(self._in_flight) if received & wanted), default=-1)
        self._wait_rounds(last + 1)

    def wait_for_exchange(self) -> None:
        """Wait for every round in flight: every parameter holds the last step's values on every rank."""
        self._wait_rounds(len(self._in_flight))

    def _wait_rounds(self, count: int) -> None:
        for _, works in self._in_flight[:count]:
            for work in works:
                work.wait()
        del self._in_flight[:count]

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
        self.wait_for_exchange()
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
        self.wait_for_exchange()
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
