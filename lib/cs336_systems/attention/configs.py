"""The tuned table: launch configurations of the three FlashAttention-2 Triton kernels, per device and problem.

A configuration is (Q_TILE, K_TILE, warps, pipeline stages) for one kernel: `forward`, `dkdv`
(backward, one program per key tile) or `dq` (backward, one program per query tile). The best
one depends on the GPU, the head dimension, the dtype, causality and (less) the sequence length,
so configurations are looked up by `ProblemKey` in a table per device name. A key also says
whether the launch is latency-bound, its grid at 64-row tiles having fewer programs than the GPU
has SMs (`heuristics.is_small_grid`, e.g. one head at N <= 8,192 on 132 SMs): there one program's loop is the
latency, and the tiles that fill the GPU best lose (docs/flash_small_grid_h100.csv).

1. the user's cache (`$CS336_FLASH_CONFIGS`, default ~/.cache/cs336_systems/flash_configs.json),
   written by `cs336_systems.attention.tuning.tune_flash_attention`;
2. the table shipped with the package (flash_configs.json beside this file): the results of that
   same tuning on the GPUs this project was measured on; a GPU with another's SMs (`SAME_SMS`: the
   H200 the H100's) takes that GPU's entries for the problems its own table lacks;
3. `default_config`, which runs everywhere (the untuned start of the tuning record).

A key missing from a table falls back to the same problem at the nearest tuned sequence length,
in the same grid class where the table has one.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from cs336_systems.attention.heuristics import is_small_grid
from cs336_systems.attention.validation import Problem, head_dim_tile

KERNELS = ("forward", "dkdv", "dq")
SHIPPED_TABLE = Path(__file__).with_name("flash_configs.json")
# Devices whose SMs are another device's: a problem the device's own table lacks takes that device's entry.
# The H200 is the H100 SXM's chip (GH100, 132 SMs, the same shared memory and registers) with more and faster
# memory; untuned, its Triton kernels took `default_config`, which at one head and short sequences was far
# slower than the H100's small-grid entries (docs/flash_attention_tuning.md).
SAME_SMS = {"NVIDIA H200": "NVIDIA H100 80GB HBM3"}


def check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")


def user_cache_path() -> Path:
    env = os.environ.get("CS336_FLASH_CONFIGS")
    return Path(env) if env else Path.home() / ".cache" / "cs336_systems" / "flash_configs.json"


@dataclass(frozen=True)
class KernelConfig:
    q_tile: int
    k_tile: int
    num_warps: int
    num_stages: int

    def __post_init__(self):
        for name in ("q_tile", "k_tile"):
            t = getattr(self, name)
            if t < 16 or t & (t - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {t}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be a power of two up to 16, got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")

    def label(self) -> str:
        return f"{self.q_tile}x{self.k_tile} w{self.num_warps} s{self.num_stages}"


@dataclass(frozen=True)
class ProblemKey:
    kernel: str
    head_dim_tile: int
    dtype: str
    is_causal: bool
    seq_bucket: int
    small_grid: bool = False  # `is_small_grid`

    @classmethod
    def of(
        cls,
        kernel: str,
        head_dim_tile: int,
        dtype: torch.dtype,
        is_causal: bool,
        n_q: int,
        n_k: int,
        small_grid: bool = False,
    ) -> ProblemKey:
        return cls.at_bucket(kernel, head_dim_tile, dtype, is_causal, seq_bucket(max(n_q, n_k)), small_grid)

    @classmethod
    def at_bucket(
        cls, kernel: str, head_dim_tile: int, dtype: torch.dtype, is_causal: bool, bucket: int, small_grid: bool = False
    ) -> ProblemKey:
        check_kernel(kernel)
        return cls(kernel, head_dim_tile, str(dtype).removeprefix("torch."), bool(is_causal), bucket, bool(small_grid))

    def to_str(self) -> str:
        mask = "causal" if self.is_causal else "full"
        text = f"{self.kernel}|d{self.head_dim_tile}|{self.dtype}|{mask}|n{self.seq_bucket}"
        return text + "|small-grid" if self.small_grid else text

    @classmethod
    def from_str(cls, text: str) -> ProblemKey:
        kernel, d, dtype, causal, n, *grid = text.split("|")
        if grid not in ([], ["small-grid"]):
            raise ValueError(f"configuration key {text!r}: unknown grid class {'|'.join(grid)!r}")
        return cls(kernel, int(d[1:]), dtype, causal == "causal", int(n[1:]), bool(grid))


def seq_bucket(n: int) -> int:
    """The power of two >= n (at least 16) whose tuned configurations serve sequence length n."""
    bucket = 16
    while n > bucket:
        bucket *= 2
    return bucket


def default_config(kernel: str, head_dim_tile: int, element_size: int) -> KernelConfig:
    """Untuned tiles that fit the shared memory of any recent NVIDIA GPU (the tuning record's start).

    The backward keeps two (K_TILE, D) tiles resident and streams two (Q_TILE, D) tiles per stage.
    fp32 tiles take twice the shared memory of 16-bit ones, so from d = 128 on they are halved.
    """
    if head_dim_tile <= 64:
        q_tile, k_tile, warps = 64, 64, 4
    elif head_dim_tile <= 128:
        q_tile, k_tile, warps = (64, 32, 4) if element_size <= 2 else (32, 32, 4)
    else:
        q_tile, k_tile, warps = (32, 32, 8) if element_size <= 2 else (16, 32, 4)
    return KernelConfig(q_tile, k_tile, warps, 2)


# What the tuner tries besides the default, per kernel. Shapes follow where each kernel's work sits:
# the forward and dQ programs keep a query tile resident (large Q_TILE), the dK/dV program a key
# tile (large K_TILE) while query tiles stream through. The forward's 32-row tiles are for small grids,
# where one program's latency is the kernel's (docs/flash_small_grid_h100.csv).
_CANDIDATES_16BIT = {
    "forward": [
        (64, 64, 4, 3),
        (128, 64, 4, 3),
        (128, 64, 8, 3),
        (128, 64, 8, 4),
        (128, 128, 8, 3),
        (64, 64, 4, 4),
        (64, 128, 4, 3),
        (128, 128, 8, 4),
        (32, 128, 4, 2),
        (32, 64, 4, 3),
    ],
    "dkdv": [
        (32, 64, 4, 3),
        (32, 128, 4, 3),
        (32, 128, 4, 5),
        (64, 128, 8, 3),
        (64, 64, 4, 3),
        (32, 64, 4, 4),
        (64, 128, 8, 4),
        (64, 64, 4, 4),
    ],
    "dq": [
        (128, 32, 4, 3),
        (64, 128, 4, 3),
        (128, 64, 8, 3),
        (128, 64, 4, 3),
        (64, 64, 4, 3),
        (128, 128, 8, 3),
        (64, 64, 4, 4),
        (128, 64, 4, 4),
    ],
}
# fp32 at d = 128: tiles whose fp32 operands, twice the bytes, still fit Hopper's 227 KiB with two
# stages, and 16-row tiles for short sequences, where one head's grid has fewer programs than SMs.
_CANDIDATES_FP32_D128 = {
    "forward": [
        (64, 32, 4, 2),
        (64, 64, 4, 2),
        (64, 64, 8, 2),
        (128, 32, 8, 2),
        (64, 32, 4, 3),
        (128, 64, 8, 1),
        (32, 64, 4, 2),
        (16, 64, 4, 2),
    ],
    "dkdv": [
        (32, 64, 4, 2),
        (64, 64, 8, 2),
        (64, 32, 4, 2),
        (32, 64, 4, 3),
        (16, 64, 4, 2),
        (64, 64, 4, 1),
        (32, 128, 8, 1),
        (32, 16, 4, 2),
        (64, 16, 4, 2),
    ],
    "dq": [
        (64, 32, 4, 2),
        (64, 64, 8, 2),
        (128, 32, 8, 2),
        (64, 32, 4, 3),
        (32, 64, 4, 2),
        (64, 64, 4, 1),
        (128, 64, 8, 1),
        (16, 32, 4, 2),
        (16, 64, 4, 2),
    ],
}


def candidate_configs(kernel: str, head_dim_tile: int, element_size: int) -> list[KernelConfig]:
    """What the tuner tries, the default first (`_CANDIDATES_16BIT`; fp32 at d >= 128 smaller tiles)."""
    check_kernel(kernel)
    shapes = (_CANDIDATES_FP32_D128 if element_size >= 4 and head_dim_tile >= 128 else _CANDIDATES_16BIT)[kernel]
    if head_dim_tile > 128:
        shapes = [s for s in shapes if s[0] * s[1] <= (64 * 64 if element_size <= 2 else 32 * 64)]
    configs = [default_config(kernel, head_dim_tile, element_size)]
    configs += [KernelConfig(*s) for s in shapes if KernelConfig(*s) not in configs]
    return configs


class ConfigTable:
    """{device name: {ProblemKey string: KernelConfig}} read from JSON files, user cache over shipped table."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.entries: dict[str, dict[ProblemKey, KernelConfig]] = {}
        for path in paths:  # later files win
            if path.is_file():
                for device, table in json.loads(path.read_text()).items():
                    self.entries.setdefault(device, {}).update(
                        {ProblemKey.from_str(k): KernelConfig(**v) for k, v in table.items()}
                    )

    def lookup(self, device: str, key: ProblemKey) -> KernelConfig | None:
        """The device's entry for `key` (or for its nearest tuned length), else that of the device with the same
        SMs (`SAME_SMS`), else None."""
        found = self._lookup_in(self.entries.get(device, {}), key)
        if found is None and device in SAME_SMS:
            found = self._lookup_in(self.entries.get(SAME_SMS[device], {}), key)
        return found

    @staticmethod
    def _lookup_in(table: dict[ProblemKey, KernelConfig], key: ProblemKey) -> KernelConfig | None:
        if key in table:
            return table[key]
        same = [
            k
            for k in table
            if (k.kernel, k.head_dim_tile, k.dtype, k.is_causal)
            == (key.kernel, key.head_dim_tile, key.dtype, key.is_causal)
        ]
        if not same:
            return None
        same = [k for k in same if k.small_grid == key.small_grid] or same
        nearest = min(same, key=lambda k: (abs(math.log2(k.seq_bucket) - math.log2(key.seq_bucket)), -k.seq_bucket))
        return table[nearest]

    def store(self, device: str, key: ProblemKey, config: KernelConfig, path: Path) -> None:
        """Remember `config` and merge it into the JSON file at `path`."""
        self.entries.setdefault(device, {})[key] = config
        forget_answers()
        data = json.loads(path.read_text()) if path.is_file() else {}
        data.setdefault(device, {})[key.to_str()] = asdict(config)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {dev: dict(sorted(table.items())) for dev, table in sorted(data.items())}
        path.write_text(json.dumps(data, indent=1) + "\n")


_TABLE: ConfigTable | None = None


def config_table() -> ConfigTable:
    global _TABLE
    if _TABLE is None:
        _TABLE = ConfigTable([SHIPPED_TABLE, user_cache_path()])
    return _TABLE


def reload_config_table() -> ConfigTable:
    global _TABLE
    _TABLE = None
    forget_answers()
    return config_table()


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


_DEVICE_FACTS: dict[int, tuple[int, int]] = {}


def device_facts(device: torch.device) -> tuple[int, int]:
    """(compute capability major, SM count) of a CUDA device, read once per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _DEVICE_FACTS:
        props = torch.cuda.get_device_properties(index)
        _DEVICE_FACTS[index] = (props.major, props.multi_processor_count)
    return _DEVICE_FACTS[index]


def sm_count(device: torch.device) -> int:
    """The device's streaming multiprocessors; 0 off CUDA, where no grid is small."""
    return device_facts(device)[1] if device.type == "cuda" else 0


# Eager calls' answers by their arguments (ConfigTable.store and reload_config_table clear them):
# every attention call asks for one to three configurations, and a table lookup costs tens of
# microseconds, as much host time as a Triton launch.
_ANSWERS: dict[tuple, KernelConfig] = {}


def config_for(
    kernel: str,
    head_dim_tile: int,
    dtype: torch.dtype,
    is_causal: bool,
    n_q: int,
    n_k: int,
    device: torch.device,
    batch: int | None = None,
) -> KernelConfig:
    """The tuned configuration of `kernel` for this problem on `device`, else the default. `batch`
    (batch·heads) decides whether the grid is small (`is_small_grid`); None: not small."""
    key = (kernel, head_dim_tile, dtype, is_causal, n_q, n_k, device, batch)
    if (config := _ANSWERS.get(key)) is not None:
        return config
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    small = batch is not None and is_small_grid(kernel, batch, n_q, n_k, sm_count(device))
    problem = ProblemKey.at_bucket(kernel, head_dim_tile, dtype, is_causal, seq_bucket(max(n_q, n_k)), small)
    config = config_table().lookup(device_name(device), problem) or default_config(
        kernel, head_dim_tile, dtype.itemsize
    )
    _ANSWERS[key] = config
    return config


class KernelConfigs(NamedTuple):
    """The configuration of each of the three Triton kernels for one problem (`kernel_configs`)."""

    forward: KernelConfig
    dq: KernelConfig
    dkdv: KernelConfig


def kernel_configs(problem: Problem, tiles: tuple[int, int] | None = None) -> KernelConfigs:
    """The device's tuned configuration of each kernel for `problem` (`config_for`), its tiles replaced by
    `tiles` where given (a (Q_TILE, K_TILE) pair of powers of two >= 16; same warps and stages)."""
    n_q, n_k, d, batch, dtype, device, is_causal = problem
    d_tile = head_dim_tile(d)
    configs = []
    for kernel in ("forward", "dq", "dkdv"):
        config = config_for(kernel, d_tile, dtype, is_causal, n_q, n_k, device, batch)
        if tiles is not None:
            try:
                config = KernelConfig(tiles[0], tiles[1], config.num_warps, config.num_stages)
            except ValueError as err:
                raise ValueError(f"tiles = {tiles}: {err}") from None
        configs.append(config)
    return KernelConfigs(*configs)


# Caches of what is derived from the answers (`answer_cache`; and the C++ node's programs, `launch.native`),
# cleared with them: anything with a clear().
_ANSWER_CACHES: list = [_ANSWERS]


def register_answer_cache(cache):
    """Have `cache.clear()` called whenever the configuration answers are forgotten (a table store or
    reload): for callers that keep what they derive from `config_for`. Returns `cache`."""
    _ANSWER_CACHES.append(cache)
    return cache


def answer_cache() -> dict:
    """A new dict registered with `register_answer_cache`."""
    return register_answer_cache({})


def forget_answers() -> None:
    """Clear every cache registered with `register_answer_cache` (routes, launch plans, the C++ node's
    programs): what callers derived from the configurations and the routing limits. A table store or reload
    does it; so must a caller that changes those limits (a test lifting `heuristics`' size floors)."""
    for cache in _ANSWER_CACHES:
        cache.clear()
