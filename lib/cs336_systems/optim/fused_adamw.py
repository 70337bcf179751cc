"""A fused, multi-tensor AdamW: a few Triton launches per step over all parameters, not one per tensor.

`FusedAdamW(params, lr, betas, eps, weight_decay, state_dtype)` is torch.optim.AdamW's update (the
math is in `cs336_systems.optim.fused_adamw_kernels`) with

- one launch per (param group, device, param dtype, grad dtype, state dtype, step count) per step:
  the kernel reads a device table of the tensors' addresses and a block table (program -> tensor,
  block), so hundreds of parameter tensors cost one launch. The step count is per parameter, as in
  torch (a parameter without a gradient is skipped and keeps its count), so the bias correction
  matches torch's; all of a group's parameters normally share one count, hence one launch.
- `state_dtype=torch.float32` (exact AdamW) or `torch.bfloat16` (half the state memory). With
  `stochastic_rounding=True` (the default) every bf16 store, the moments' and, for bf16 parameters,
  the parameter's, is stochastically rounded from the fp32 result with counter-based random bits
  keyed by (seed, step, element index): unbiased, and the same bits on every run for a given seed.
- hyperparameters read from the group at every step and passed as runtime scalars: changing lr
  (a schedule) recompiles nothing.
- per-parameter state in `self.state[p]` as tensors (`step`: a CPU float32 scalar as torch keeps it,
  `exp_avg`, `exp_avg_sq` in the state dtype), so `state_dict`/`load_state_dict` round-trip.

On a GPU the tables hold CUDA addresses. On CPU the same multi-tensor kernel runs under the Triton
interpreter (TRITON_INTERPRET=1 before triton is first imported), where it reads host addresses; only
the block size differs. Without the interpreter, CPU parameters are refused with an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from cs336_systems.optim.fused_adamw_kernels import (
    adamw_multi_tensor_kernel,
    block_size,
    kernels_interpreted,
    triton_dtype,
)
from cs336_systems.optim.hyperparameters import check_adamw_hyperparameters
from cs336_systems.triton_support.interpreter import NeedsTritonInterpreter

STATE_DTYPES = (torch.float32, torch.bfloat16)
PARAM_DTYPES = (torch.float32, torch.bfloat16)


@dataclass
class LaunchTables:
    """What one launch reads besides the scalars, kept on the tensors' device between steps."""

    addresses: tuple[int, ...]  # params, grads, exp_avg, exp_avg_sq: what `address_table` holds
    address_table: torch.Tensor  # int64 [4 * T]
    numels: torch.Tensor  # int64 [T]
    global_offsets: torch.Tensor  # int64 [T]
    block_table: torch.Tensor  # int32 [2 * n_blocks]: tensor index, block index
    n_blocks: int


def block_table(numels: list[int], block: int) -> torch.Tensor:
    """int32 [2 * n_blocks]: for each program, the index of its tensor, then its block in that tensor."""
    counts = torch.tensor([-(-n // block) for n in numels], dtype=torch.int64)
    n_blocks = int(counts.sum())
    if n_blocks >= 2**31:
        raise ValueError(f"FusedAdamW: {n_blocks} blocks of {block} do not fit one launch's grid")
    tensor_index = torch.repeat_interleave(torch.arange(len(numels)), counts)
    first_block = torch.cumsum(counts, 0) - counts
    block_index = torch.arange(n_blocks) - torch.repeat_interleave(first_block, counts)
    return torch.cat([tensor_index, block_index]).to(torch.int32)


class FusedAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update in one Triton launch per group of like tensors (module docstring)."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        state_dtype: torch.dtype = torch.float32,
        *,
        stochastic_rounding: bool = True,
        seed: int = 0,
    ):
        check_adamw_hyperparameters("FusedAdamW", lr, betas, eps, weight_decay)
        if not 0 <= seed < 2**31:
            raise ValueError(f"FusedAdamW: seed must be in [0, 2**31), got {seed}")
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            state_dtype=state_dtype,
            stochastic_rounding=stochastic_rounding,
            seed=seed,
        )
        self._tables: dict[tuple, LaunchTables] = {}
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        merged = {**self.defaults, **param_group}
        check_adamw_hyperparameters("FusedAdamW", merged["lr"], merged["betas"], merged["eps"], merged["weight_decay"])
        super().add_param_group(param_group)
        check_group(self.param_groups[-1], len(self.param_groups) - 1)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        launches: dict[tuple, list[tuple]] = {}
        global_offset = 0  # position of each parameter's first element among all parameters
        for index, group in enumerate(self.param_groups):
            check_group(group, index)
            state_dtype = group["state_dtype"]
            for i, p in enumerate(group["params"]):
                offset, global_offset = global_offset, global_offset + p.numel()
                if p.grad is None:
                    continue
                grad = check_grad(p, index)
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros(p.shape, dtype=state_dtype, device=p.device)
                    state["exp_avg_sq"] = torch.zeros(p.shape, dtype=state_dtype, device=p.device)
                shape = p.shape
                for key in ("exp_avg", "exp_avg_sq"):  # a group's state_dtype changed, or a foreign state
                    moment = state[key]
                    if (
                        moment.shape != shape
                        or moment.dtype != state_dtype
                        or moment.device != p.device
                        or not moment.is_contiguous()
                    ):
                        # the kernel reads p.numel() elements of the state: another shape must not reach it
                        check_state_shape(moment, p, key, i, index)
                        state[key] = moment.to(
                            device=p.device, dtype=state_dtype, memory_format=torch.contiguous_format
                        )
                state["step"] += 1
                kind = (index, p.device, p.dtype, grad.dtype, state_dtype, int(state["step"].item()))
                launches.setdefault(kind, []).append((p, grad, state["exp_avg"], state["exp_avg_sq"], offset))
        for kind, members in launches.items():
            self._launch(kind, members)
        return loss

    def _launch(self, kind: tuple, members: list[tuple]) -> None:
        index, device, param_dtype, _, state_dtype, t = kind
        group = self.param_groups[index]
        if device.type == "cpu" and not kernels_interpreted():
            raise NeedsTritonInterpreter(
                "FusedAdamW: CPU parameters need the Triton interpreter "
                "(set TRITON_INTERPRET=1 before triton is imported)"
            )
        if device.type != "cpu" and kernels_interpreted():
            raise RuntimeError(
                f"FusedAdamW: the Triton interpreter is on (TRITON_INTERPRET=1) but the parameters are on {device}"
            )
        block = block_size(device, max(p.numel() for p, *_ in members))
        tables = self._tables_for(kind[:5], members, block)
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        seed = (group["seed"] << 32) | (t & 0xFFFFFFFF)
        adamw_multi_tensor_kernel[(tables.n_blocks,)](
            tables.address_table,
            tables.numels,
            tables.global_offsets,
            tables.block_table,
            len(members),
            tables.n_blocks,
            1.0 - lr * wd,
            1.0 - b1,
            b2,
            1.0 - b2,
            eps,
            lr / (1.0 - b1**t),
            math.sqrt(1.0 - b2**t),
            seed,
            P_DTYPE=triton_dtype(param_dtype),
            S_DTYPE=triton_dtype(state_dtype),
            STOCHASTIC=bool(group["stochastic_rounding"]),
            BLOCK=block,
        )

    def _tables_for(self, layout: tuple, members: list[tuple], block: int) -> LaunchTables:
        """The launch's tables: rebuilt when the parameters (sizes or order) change; the address
        table alone when only storage moved (gradients set to None and reallocated, say)."""
        numels = [p.numel() for p, *_ in members]
        offsets = [member[4] for member in members]
        key = (*layout, tuple(numels), tuple(offsets))
        addresses = tuple(t.data_ptr() for column in range(4) for t in (member[column] for member in members))
        device = members[0][0].device
        tables = self._tables.get(key)
        if tables is None:
            if len(self._tables) >= 64:  # parameter sets that come and go: keep the cache small
                self._tables.clear()
            table = block_table(numels, block)
            tables = LaunchTables(
                addresses=(),
                address_table=torch.empty(0),
                numels=torch.tensor(numels, dtype=torch.int64).to(device),
                global_offsets=torch.tensor(offsets, dtype=torch.int64).to(device),
                block_table=table.to(device),
                n_blocks=table.numel() // 2,
            )
            self._tables[key] = tables
        if tables.addresses != addresses:
            tables.address_table = torch.tensor(addresses, dtype=torch.int64).to(device)
            tables.addresses = addresses
        return tables

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch's, but the moments keep the state dtype (torch would cast them to the parameter's)."""
        saved = state_dict["state"]
        # Checked before anything is loaded: a state of another shape would reach the kernel.
        for index, (group, saved_group) in enumerate(zip(self.param_groups, state_dict["param_groups"])):
            for i, (p, saved_id) in enumerate(zip(group["params"], saved_group["params"])):
                for key, moment in (saved.get(saved_id) or {}).items():
                    if key in ("exp_avg", "exp_avg_sq") and isinstance(moment, torch.Tensor):
                        check_state_shape(moment, p, key, i, index)
        super().load_state_dict(state_dict)
        position = {id(p): i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if not state:
                    continue
                original = saved.get(position[id(p)])
                for key in ("exp_avg", "exp_avg_sq"):
                    source = original[key] if original is not None else state[key]
                    state[key] = source.to(
                        device=p.device, dtype=group["state_dtype"], memory_format=torch.contiguous_format
                    ).clone()
                state["step"] = state["step"].detach().to("cpu", torch.float32).clone()
        self._tables.clear()


def check_state_shape(moment: torch.Tensor, p: torch.Tensor, key: str, param: int, index: int) -> None:
    """ValueError where a state tensor's shape is not its parameter's (as torch.optim.AdamW's step refuses it);
    `param` is the parameter's position in its group `index`."""
    if moment.shape != p.shape:
        raise ValueError(
            f"FusedAdamW: state {key!r} of parameter {param} in group {index} has shape "
            f"{tuple(moment.shape)}, the parameter {tuple(p.shape)}"
        )


def check_group(group: dict, index: int) -> None:
    """Clear errors for what the kernels cannot take."""
    if group["state_dtype"] not in STATE_DTYPES:
        raise TypeError(f"FusedAdamW: state_dtype must be torch.float32 or torch.bfloat16, not {group['state_dtype']}")
    device_types = sorted({p.device.type for p in group["params"]})
    if len(device_types) > 1:
        raise ValueError(
            f"FusedAdamW: parameter group {index} has parameters on several device types ({', '.join(device_types)}); "
            "put each device type's parameters in a group of its own"
        )
    for p in group["params"]:
        if p.dtype not in PARAM_DTYPES:
            raise TypeError(f"FusedAdamW: parameters must be float32 or bfloat16; group {index} has one of {p.dtype}")
        if not p.is_contiguous():
            raise ValueError(
                f"FusedAdamW: parameters must be contiguous; "
                f"group {index} has one of shape {tuple(p.shape)} that is not"
            )


def check_grad(p: torch.Tensor, index: int) -> torch.Tensor:
    """The gradient of `p` as the kernel reads it (contiguous), or a clear error."""
    grad = p.grad
    if grad.is_sparse:
        raise RuntimeError("FusedAdamW does not support sparse gradients (use torch.optim.SparseAdam)")
    if grad.dtype != p.dtype:
        raise TypeError(
            f"FusedAdamW: a gradient's dtype ({grad.dtype}) differs from its parameter's ({p.dtype}) in group {index}"
        )
    if grad.device != p.device:
        raise ValueError(f"FusedAdamW: a gradient is on {grad.device}, its parameter on {p.device}")
    if grad.shape != p.shape:
        raise ValueError(
            f"FusedAdamW: a gradient's shape {tuple(grad.shape)} differs from its parameter's {tuple(p.shape)}"
        )
    return grad if grad.is_contiguous() else grad.contiguous()
