"""The FlashAttention-2 leaderboard timing of the spring 2025 handout (§1.3.3), for ours and SDPA.

The handout's test, followed as written (batch 1, bf16, causal):

    q, k, v = torch.randn(3, n_heads, sequence_length, d_head, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    flash = torch.compile(FlashAttention2.apply)
    def flash_forward_backward():
        o = flash(q, k, v, True); loss = o.sum(); loss.backward()
    triton.testing.do_bench(flash_forward_backward, rep=10000, warmup=1000)

with n_heads 16, sequence_length 16384, d_head 64. q, k, v are views of one leaf, so every run
also accumulates into its gradient, as on the leaderboard. do_bench's default statistic is the
mean (`fwd_bwd_mean_ms`, the leaderboard's number); the tables use the median. The forward alone
is timed the same way; the backward is forward+backward minus forward (a compiled graph is
not re-entered for a second backward). SDPA runs eagerly with one backend allowed: a single
fused call, which compiling would not change.

Floors of a configuration (`floors`): FLOPs / peak FLOP/s and least bytes / bandwidth.
"""

from __future__ import annotations

import re
import statistics
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from cs336_systems.attention.flash_benchmark import (
    TOLERANCE,
    Implementation,
    TimingSettings,
    attention_flops,
    attention_min_bytes,
    failure_row,
    implementation,
    measure_times_ms,
    reference_gradients,
    relative_errors,
)
from cs336_systems.benchmarking.harness import free_device_memory

LEADERBOARD_IMPLS = ("triton", "sdpa_flash", "sdpa_cudnn")
LEADERBOARD_COLUMNS = ["impl", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "tflops", "device"]


@dataclass(frozen=True)
class LeaderboardConfig:
    """The timed shape: q, k, v of (heads, seq_len, head_dim) each (batch 1), causal."""

    heads: int = 16
    seq_len: int = 16384
    head_dim: int = 64
    dtype: torch.dtype = torch.bfloat16
    is_causal: bool = True

    def flops(self) -> dict[str, float]:
        return attention_flops(1, self.heads, self.seq_len, self.head_dim, self.is_causal)

    def min_bytes(self) -> dict[str, int]:
        return attention_min_bytes(1, self.heads, self.seq_len, self.head_dim, self.dtype)

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return (f"batch 1, {self.heads} heads, sequence {self.seq_len:,}, head dimension {self.head_dim}, {dtype}"
                f"{', causal' if self.is_causal else ''}")


LEADERBOARD = LeaderboardConfig()
CPU_SCALED_DOWN = LeaderboardConfig(heads=2, seq_len=128, head_dim=16)


def floors(config: LeaderboardConfig, peak_tflops: float, bandwidth_gb_s: float) -> pd.DataFrame:
    """Least time of each pass from compute (FLOPs / peak) and from memory traffic (bytes / bandwidth)."""
    flops, nbytes = config.flops(), config.min_bytes()
    rows = []
    for p in flops:
        compute_ms = flops[p] / (peak_tflops * 1e12) * 1e3
        memory_ms = nbytes[p] / (bandwidth_gb_s * 1e9) * 1e3
        rows.append({"pass": p, "GFLOP": flops[p] / 1e9, "MB": nbytes[p] / 1e6, "FLOP floor (ms)": compute_ms,
                     "byte floor (ms)": memory_ms, "FLOP per byte": flops[p] / nbytes[p]})
    return pd.DataFrame(rows)


def measure_copy_bandwidth(
    nbytes: int = 2**30,
    device: torch.device | str = "cuda",
    settings: TimingSettings = TimingSettings(warmup_ms=25, rep_ms=100),
) -> float:
    """Achieved memory bandwidth (GB/s) of a device-to-device copy of `nbytes`: read once, written once."""
    device = torch.device(device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 256)
    dst = torch.empty_like(src)
    ms = statistics.median(measure_times_ms(lambda: dst.copy_(src), device, settings))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def leaderboard_inputs(config: LeaderboardConfig, device: torch.device | str, seed: int = 0) -> torch.Tensor:
    """The handout's one leaf of shape (3, heads, seq_len, head_dim); q, k, v = its three slices."""
    gen = torch.Generator().manual_seed(seed)
    shape = (3, config.heads, config.seq_len, config.head_dim)
    return torch.randn(shape, generator=gen).to(device=device, dtype=config.dtype).requires_grad_()


def time_leaderboard(
    apply: Callable, qkv: torch.Tensor, is_causal: bool, settings: TimingSettings, fwd_settings: TimingSettings,
) -> dict[str, float]:
    """Median forward and forward+backward (ms), their difference, and do_bench's mean of forward+backward."""
    q, k, v = qkv

    def forward_backward() -> None:
        o = apply(q, k, v, is_causal)
        loss = o.sum()
        loss.backward()

    fwd_bwd = measure_times_ms(forward_backward, qkv.device, settings)
    fwd = measure_times_ms(lambda: apply(q, k, v, is_causal), qkv.device, fwd_settings)
    qkv.grad = None
    fwd_ms, fwd_bwd_ms = statistics.median(fwd), statistics.median(fwd_bwd)
    return dict(fwd_ms=fwd_ms, bwd_ms=fwd_bwd_ms - fwd_ms, fwd_bwd_ms=fwd_bwd_ms,
                fwd_bwd_mean_ms=statistics.fmean(fwd_bwd), runs=len(fwd_bwd))


def leaderboard_implementation(name: str, compile: bool) -> Implementation:
    """`implementation(name)`; ours with `torch.compile(FlashAttentionTriton.apply)` when `compile`."""
    if name == "triton" and compile:
        from cs336_systems.attention.flash_triton import FlashAttentionTriton

        return Implementation(name, torch.compile(FlashAttentionTriton.apply))
    return implementation(name)


def leaderboard_table(
    impls: Iterable[str] = LEADERBOARD_IMPLS,
    config: LeaderboardConfig = LEADERBOARD,
    *,
    device: torch.device | str = "cuda",
    compile: bool = True,
    settings: TimingSettings = TimingSettings(warmup_ms=1000, rep_ms=10000),
    fwd_settings: TimingSettings = TimingSettings(warmup_ms=200, rep_ms=2000),
    ceiling_tflops: float | None = None,
) -> pd.DataFrame:
    """One row per implementation: latencies, achieved TFLOP/s of forward+backward, correctness, status.

    `compile` wraps ours in torch.compile as the leaderboard does; `ceiling_tflops` (the measured
    matmul ceiling) adds the fraction of it reached. Every implementation is first checked against
    the float64 reference (O, dQ, dK, dV, norm-wise; this first call also compiles): above
    TOLERANCE the status is "wrong".
    """
    device = torch.device(device)
    qkv = leaderboard_inputs(config, device)
    gen = torch.Generator().manual_seed(1)
    grad_out = torch.randn(qkv.shape[1:], generator=gen).to(device=device, dtype=config.dtype)
    reference = reference_gradients(*qkv.detach(), grad_out, config.is_causal)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    fwd_bwd_flops = config.flops()["forward_backward"]
    rows = []
    for name in impls:
        impl = leaderboard_implementation(name, compile)
        row = dict(impl=name, device=device_name, compiled=compile and name == "triton")
        q, k, v = (t.detach().requires_grad_() for t in qkv)  # leaves, for the check's gradients
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                errors = relative_errors(impl, q, k, v, grad_out, config.is_causal, reference)
            with impl.context():
                row.update(time_leaderboard(impl.apply, qkv, config.is_causal, settings, fwd_settings))
        except Exception as err:  # noqa: BLE001 - failure_row decides which failures become rows
            failure = failure_row(err, impl, caught)
            if failure is None:
                raise
            row.update(failure)
        else:
            row["max_rel_error"] = max(errors.values())
            row["status"] = "ok" if all(e <= TOLERANCE[config.dtype] for e in errors.values()) else "wrong"
            row["tflops"] = fwd_bwd_flops / (row["fwd_bwd_ms"] * 1e-3) / 1e12
            if ceiling_tflops:
                row["ceiling_fraction"] = row["tflops"] / ceiling_tflops
        qkv.grad = None
        del q, k, v
        free_device_memory()
        rows.append(row)
    df = pd.DataFrame(rows)
    columns = [*LEADERBOARD_COLUMNS, "fwd_bwd_mean_ms", "ceiling_fraction", "max_rel_error", "runs", "compiled", "status",
               "note"]
    for col in columns:
        if col not in df:
            df[col] = pd.NA
    return df[columns]


# (latency column, baseline implementation, largest allowed ratio ours / baseline)
LEADERBOARD_BARS = (
    ("fwd_bwd_ms", "sdpa_cudnn", 0.95),
    ("fwd_bwd_ms", "sdpa_flash", 0.70),
    ("fwd_ms", "sdpa_cudnn", 1.00),
)


def leaderboard_bars(
    df: pd.DataFrame, ours: str = "triton", bars: Iterable[tuple[str, str, float]] = LEADERBOARD_BARS
) -> pd.DataFrame:
    """Each bar: ours / baseline against its limit; "pass", "fail", or "not measured" with the reason."""
    by_impl = df.set_index("impl")
    rows = []
    for column, baseline, limit in bars:
        row = {"bar": f"{column.removesuffix('_ms').replace('_', '+')} ≤ {limit:g} × {baseline}", "limit": limit}
        mine = by_impl.loc[ours] if ours in by_impl.index else None
        theirs = by_impl.loc[baseline] if baseline in by_impl.index else None
        if mine is None or mine.status != "ok":
            row["verdict"] = f"fail (ours: {'not run' if mine is None else mine.status})"
        elif theirs is None or theirs.status != "ok":
            row["verdict"] = f"not measured ({baseline}: {'not run' if theirs is None else theirs.status})"
        else:
            row.update(ours_ms=float(mine[column]), baseline_ms=float(theirs[column]))
            row["ratio"] = row["ours_ms"] / row["baseline_ms"]
            row["verdict"] = "pass" if row["ratio"] <= limit else "fail"
        rows.append(row)
    return pd.DataFrame(rows, columns=["bar", "ours_ms", "baseline_ms", "ratio", "limit", "verdict"])


def read_tuning_record(path: str | Path) -> pd.DataFrame:
    """The first Markdown pipe table of `path` as a DataFrame (header row = columns, all cells text)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("|")), None)
    if start is None:
        raise ValueError(f"{path} has no Markdown table")
    block = []
    for line in lines[start:]:
        if not line.lstrip().startswith("|"):
            break
        block.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))])
    header, rows = block[0], [r for r in block[1:] if not all(re.fullmatch(r":?-+:?", c) for c in r)]
    if any(len(r) != len(header) for r in rows):
        raise ValueError(f"the table of {path} has rows whose cell count differs from its header ({len(header)})")
    return pd.DataFrame(rows, columns=header)
