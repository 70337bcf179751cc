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
fused call, which compiling would not change. Each implementation gets the handout's 1 s of
warm-up and 10 s of timed runs, spread over rounds in which the implementations take turns
(`leaderboard_table`), so that the comparison does not depend on who ran first. While each is
timed, the GPU's SM clock and power are sampled (`CLOCK_COLUMNS`): at the board's power cap two
implementations' times differ by their clocks as well as their cycles (`clock_text`).

Floors of a configuration (`floors`): FLOPs / peak FLOP/s and least bytes / bandwidth.
"""

from __future__ import annotations

import re
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch

from cs336_systems.attention.launch.layout import head_views
from cs336_systems.attention.reference import TOLERANCE, reference_gradients
from cs336_systems.benchmarking.attention_registry import Implementation, implementation, relative_errors
from cs336_systems.benchmarking.gpu_telemetry import GpuTelemetry
from cs336_systems.benchmarking.harness import free_device_memory
from cs336_systems.benchmarking.timing import TimingSettings, measure_times_ms, round_orders
from cs336_systems.experiments.flash_benchmark import attention_flops, attention_min_bytes, failure_row

LEADERBOARD_IMPLS = ("triton", "sdpa_flash", "sdpa_cudnn")
LEADERBOARD_COLUMNS = ["impl", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "tflops", "device"]
# While an implementation was timed (`GpuTelemetry`): median SM clock (MHz) and power (W), and the share of
# samples at the board's power cap; NaN without nvidia-smi or a GPU
CLOCK_COLUMNS = ["sm_mhz", "power_w", "power_capped"]


@dataclass(frozen=True)
class LeaderboardConfig:
    """The timed shape: q, k, v of (heads, seq_len, head_dim) each (batch 1), causal.

    `layout` is where q, k, v live: "heads", the 2025 handout's one (3, heads, seq_len, head_dim) leaf
    (contiguous heads); "projections", a model's: one (3, 1, seq_len, heads * head_dim) leaf, each
    projection viewed as (1, heads, seq_len, head_dim), rows heads * head_dim apart (`views`)."""

    heads: int = 16
    seq_len: int = 16384
    head_dim: int = 64
    dtype: torch.dtype = torch.bfloat16
    is_causal: bool = True
    layout: str = "heads"

    def __post_init__(self) -> None:
        if self.layout not in ("heads", "projections"):
            raise ValueError(f"layout must be 'heads' or 'projections', got {self.layout!r}")

    def leaf_shape(self) -> tuple[int, ...]:
        if self.layout == "heads":
            return (3, self.heads, self.seq_len, self.head_dim)
        return (3, 1, self.seq_len, self.heads * self.head_dim)

    def views(self, leaf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of shape (heads, seq_len, head_dim) ("heads") or (1, heads, seq_len, head_dim)
        ("projections"), views of `leaf`."""
        if self.layout == "heads":
            return tuple(leaf)
        return tuple(head_views(t, self.heads) for t in leaf)

    def flops(self) -> dict[str, float]:
        return attention_flops(1, self.heads, self.seq_len, self.head_dim, self.is_causal)

    def min_bytes(self) -> dict[str, int]:
        return attention_min_bytes(1, self.heads, self.seq_len, self.head_dim, self.dtype)

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        layout = "; q, k, v views of (1, N, heads x d) projections" if self.layout == "projections" else ""
        return (
            f"batch 1, {self.heads} heads, sequence {self.seq_len:,}, head dimension {self.head_dim}, {dtype}"
            f"{', causal' if self.is_causal else ''}{layout}"
        )


LEADERBOARD = LeaderboardConfig()
CPU_SCALED_DOWN = LeaderboardConfig(heads=2, seq_len=128, head_dim=16)
# The spring-2026 leaderboard model's attention (d_model 4,096 in 32 heads, context 32,768), in its layout
LEADERBOARD_2026 = LeaderboardConfig(heads=32, seq_len=32768, head_dim=128, layout="projections")
CPU_SCALED_DOWN_2026 = LeaderboardConfig(heads=2, seq_len=128, head_dim=32, layout="projections")


def floors(config: LeaderboardConfig, peak_tflops: float, bandwidth_gb_s: float) -> pd.DataFrame:
    """Least time of each pass from compute (FLOPs / peak) and from memory traffic (bytes / bandwidth)."""
    flops, nbytes = config.flops(), config.min_bytes()
    rows = []
    for p in flops:
        compute_ms = flops[p] / (peak_tflops * 1e12) * 1e3
        memory_ms = nbytes[p] / (bandwidth_gb_s * 1e9) * 1e3
        rows.append(
            {
                "pass": p,
                "GFLOP": flops[p] / 1e9,
                "MB": nbytes[p] / 1e6,
                "FLOP floor (ms)": compute_ms,
                "byte floor (ms)": memory_ms,
                "FLOP per byte": flops[p] / nbytes[p],
            }
        )
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
    """The one leaf q, k, v are views of (`LeaderboardConfig.views`): the handout's (3, heads, seq_len,
    head_dim), or a model's (3, 1, seq_len, heads * head_dim) projections."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(config.leaf_shape(), generator=gen).to(device=device, dtype=config.dtype).requires_grad_()


def time_leaderboard(
    apply: Callable,
    qkv: torch.Tensor,
    is_causal: bool,
    settings: TimingSettings,
    fwd_settings: TimingSettings,
    config: LeaderboardConfig = LEADERBOARD,
) -> dict[str, list[float]]:
    """Every measured run (ms) of forward+backward ("fwd_bwd") and of the forward alone ("fwd"), q, k, v
    the views of the leaf `qkv` in `config`'s layout."""
    q, k, v = config.views(qkv)

    def forward_backward() -> None:
        o = apply(q, k, v, is_causal)
        loss = o.sum()
        loss.backward()

    try:
        fwd_bwd = measure_times_ms(forward_backward, qkv.device, settings)
        fwd = measure_times_ms(lambda: apply(q, k, v, is_causal), qkv.device, fwd_settings)
    finally:
        qkv.grad = None
    return dict(fwd_bwd=list(fwd_bwd), fwd=list(fwd))


def pooled_latencies(rounds: Sequence[dict[str, list[float]]]) -> dict[str, float]:
    """Medians over the runs of all rounds (backward = forward+backward minus forward), do_bench's mean of
    forward+backward over them, and the lowest and highest of the rounds' forward+backward medians."""
    fwd_bwd = [t for r in rounds for t in r["fwd_bwd"]]
    fwd = [t for r in rounds for t in r["fwd"]]
    fwd_ms, fwd_bwd_ms = statistics.median(fwd), statistics.median(fwd_bwd)
    per_round = [statistics.median(r["fwd_bwd"]) for r in rounds]
    return dict(
        fwd_ms=fwd_ms,
        bwd_ms=fwd_bwd_ms - fwd_ms,
        fwd_bwd_ms=fwd_bwd_ms,
        fwd_bwd_mean_ms=statistics.fmean(fwd_bwd),
        runs=len(fwd_bwd),
        rounds=len(rounds),
        fwd_bwd_round_min_ms=min(per_round),
        fwd_bwd_round_max_ms=max(per_round),
    )


def leaderboard_implementation(name: str, compile: bool) -> Implementation:
    """`implementation(name)`; ours with `torch.compile(FlashAttentionTriton.apply)` when `compile`."""
    if name == "triton" and compile:
        from cs336_systems.attention.api import FlashAttentionTriton

        return Implementation(name, torch.compile(FlashAttentionTriton.apply))
    return implementation(name)


class LeaderboardRuns(NamedTuple):
    table: pd.DataFrame  # one row per implementation (LEADERBOARD_COLUMNS first)
    rounds: pd.DataFrame  # one row per implementation and round: its place in the round and medians


def leaderboard_table(
    impls: Iterable[str] = LEADERBOARD_IMPLS,
    config: LeaderboardConfig = LEADERBOARD,
    *,
    device: torch.device | str = "cuda",
    compile: bool = True,
    settings: TimingSettings = TimingSettings(warmup_ms=1000, rep_ms=10000),
    fwd_settings: TimingSettings = TimingSettings(warmup_ms=200, rep_ms=2000),
    ceiling_tflops: float | None = None,
    rounds: int = 6,
) -> LeaderboardRuns:
    """Latencies, achieved TFLOP/s of forward+backward, correctness and status of each implementation.

    `compile` wraps ours in torch.compile as the leaderboard does; `ceiling_tflops` (the measured
    matmul ceiling) adds the fraction of it reached. Every implementation is first checked against
    the float64 reference (O, dQ, dK, dV, norm-wise; this first call also compiles): above
    TOLERANCE the status is "wrong". The timing is interleaved: `rounds` rounds in `round_orders`,
    each implementation taking 1/rounds of the warm-up and measuring time of `settings` and
    `fwd_settings` per round, and the table pools the runs of all rounds. Timed one after another,
    an implementation's latency depends on its place: on an H100 the power-capped clock falls as the
    GPU heats up over the first tens of seconds (docs/flash_attention_tuning.md, timing in turns). The table
    and the rounds also hold `CLOCK_COLUMNS`, from the samples taken while the implementation (or that round
    of it) ran.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    device = torch.device(device)
    qkv = leaderboard_inputs(config, device)
    gen = torch.Generator().manual_seed(1)
    views = config.views(qkv.detach())
    grad_out = torch.randn(views[0].shape, generator=gen).to(device=device, dtype=config.dtype)
    reference = reference_gradients(*views, grad_out, config.is_causal)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows: dict[str, dict] = {}
    checked: dict[str, Implementation] = {}
    for name in impls:
        impl = leaderboard_implementation(name, compile)
        row = rows[name] = dict(impl=name, device=device_name, compiled=compile and name == "triton")
        q, k, v = (t.detach().requires_grad_() for t in config.views(qkv))  # leaves, for the check's gradients
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                errors = relative_errors(impl, q, k, v, grad_out, config.is_causal, reference)
        except Exception as err:  # noqa: BLE001 - failure_row decides which failures become rows
            failure = failure_row(err, impl, caught)
            if failure is None:
                raise
            row.update(failure)
        else:
            row["max_rel_error"] = max(errors.values())
            row["status"] = "ok" if all(e <= TOLERANCE[config.dtype].sweeps for e in errors.values()) else "wrong"
            checked[name] = impl
        del q, k, v
        free_device_memory()

    def share(s: TimingSettings) -> TimingSettings:
        return replace(s, warmup_ms=s.warmup_ms / rounds, rep_ms=s.rep_ms / rounds)

    runs: dict[str, list[dict[str, list[float]]]] = {name: [] for name in checked}
    spans: dict[str, list[tuple[float, float]]] = {name: [] for name in checked}  # when each was timed
    per_round = []
    with GpuTelemetry(device) as telemetry:
        for r, order in enumerate(round_orders(list(checked), rounds)):
            for place, name in enumerate(n for n in order if n in checked):
                impl = checked[name]
                start = time.time()
                try:
                    with impl.context():
                        times = time_leaderboard(
                            impl.apply, qkv, config.is_causal, share(settings), share(fwd_settings), config
                        )
                except Exception as err:  # noqa: BLE001 - as above; a failed implementation leaves the rounds
                    failure = failure_row(err, impl)
                    if failure is None:
                        raise
                    rows[name].update(failure)
                    del checked[name], runs[name], spans[name]
                    free_device_memory()
                    continue
                runs[name].append(times)
                spans[name].append((start, time.time()))
                fwd_ms, fwd_bwd_ms = statistics.median(times["fwd"]), statistics.median(times["fwd_bwd"])
                per_round.append(
                    dict(
                        impl=name,
                        round=r,
                        place=place,
                        fwd_ms=fwd_ms,
                        fwd_bwd_ms=fwd_bwd_ms,
                        bwd_ms=fwd_bwd_ms - fwd_ms,
                        runs=len(times["fwd_bwd"]),
                        span=spans[name][-1],
                    )
                )
    for entry in per_round:
        entry.update({k: v for k, v in telemetry.window(*entry.pop("span")).items() if k in CLOCK_COLUMNS})
    fwd_bwd_flops = config.flops()["forward_backward"]
    for name, timed in runs.items():
        row = rows[name]
        row.update(pooled_latencies(timed))
        row.update({k: v for k, v in telemetry.windows(spans[name]).items() if k in CLOCK_COLUMNS})
        row["tflops"] = fwd_bwd_flops / (row["fwd_bwd_ms"] * 1e-3) / 1e12
        if ceiling_tflops:
            row["ceiling_fraction"] = row["tflops"] / ceiling_tflops
    free_device_memory()
    df = pd.DataFrame(list(rows.values()))
    columns = [
        *LEADERBOARD_COLUMNS,
        "fwd_bwd_mean_ms",
        "ceiling_fraction",
        "max_rel_error",
        "runs",
        "rounds",
        "fwd_bwd_round_min_ms",
        "fwd_bwd_round_max_ms",
        *CLOCK_COLUMNS,
        "compiled",
        "status",
        "note",
    ]
    for col in columns:
        if col not in df:
            df[col] = pd.NA
    return LeaderboardRuns(
        df[columns],
        pd.DataFrame(
            per_round, columns=["impl", "round", "place", "fwd_ms", "fwd_bwd_ms", "bwd_ms", "runs", *CLOCK_COLUMNS]
        ),
    )


# (latency column, baseline implementation, largest allowed ratio ours / baseline)
LEADERBOARD_BARS = (
    ("fwd_bwd_ms", "sdpa_cudnn", 0.95),
    ("fwd_bwd_ms", "sdpa_flash", 0.70),
    ("fwd_ms", "sdpa_cudnn", 1.00),
)
# the 2026 model's attention (d = 128): the backward as fast as cuDNN's, the forward too, the sum 5% faster
LEADERBOARD_2026_BARS = (
    ("bwd_ms", "sdpa_cudnn", 1.00),
    ("fwd_ms", "sdpa_cudnn", 1.00),
    ("fwd_bwd_ms", "sdpa_cudnn", 0.95),
)


def leaderboard_bars(
    df: pd.DataFrame,
    per_round: pd.DataFrame | None = None,
    ours: str = "triton",
    bars: Iterable[tuple[str, str, float]] = LEADERBOARD_BARS,
) -> pd.DataFrame:
    """Each bar: ours / baseline against its limit; "pass", "fail", or "not measured" with the reason.

    With `per_round` (`leaderboard_table`'s rounds) also the ratio of each round's medians: the
    lowest and highest, and in how many rounds it is within the limit."""
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
            if per_round is not None and len(per_round):
                wide = per_round.pivot(index="round", columns="impl", values=column)
                if {ours, baseline} <= set(wide.columns):
                    ratios = (wide[ours] / wide[baseline]).dropna()
                    row.update(
                        round_ratio_min=ratios.min(),
                        round_ratio_max=ratios.max(),
                        rounds_within=int((ratios <= limit).sum()),
                        rounds=len(ratios),
                    )
        rows.append(row)
    return pd.DataFrame(
        rows,
        columns=[
            "bar",
            "ours_ms",
            "baseline_ms",
            "ratio",
            "limit",
            "verdict",
            "round_ratio_min",
            "round_ratio_max",
            "rounds_within",
            "rounds",
        ],
    )


def leaderboard_bars_text(bars: pd.DataFrame) -> str:
    """`leaderboard_bars` as the report's sentence: each bar's verdict, the two medians and their ratio, and
    the ratios round by round where the rounds were kept."""
    from cs336_systems.report.tables import fmt_ms

    parts = []
    for b in bars.itertuples():
        part = f"**{b.bar}: {b.verdict}**"
        if b.ratio == b.ratio:  # not NaN: both were measured
            detail = f"{fmt_ms(b.ours_ms)} vs {fmt_ms(b.baseline_ms)}, {b.ratio:.3f}×"
            if b.rounds == b.rounds:
                detail += (
                    f"; round by round {b.round_ratio_min:.3f}–{b.round_ratio_max:.3f}×, within the limit in "
                    f"{b.rounds_within:.0f} of {b.rounds:.0f} rounds"
                )
            part += f" ({detail})"
        parts.append(part)
    return "; ".join(parts) + "."


def clock_text(df: pd.DataFrame, ours: str = "triton", baseline: str = "sdpa_cudnn", column: str = "fwd_bwd_ms") -> str:
    """The report's sentence on the clocks `leaderboard_table` sampled: each one's median SM clock and power
    while timed, how often at the power cap, and the ratio of `column` in clock cycles (time × clock) next to
    the ratio in time; "" where either was not timed or no clock was sampled."""
    by_impl = df.set_index("impl")
    if not {ours, baseline} <= set(by_impl.index):
        return ""
    mine, theirs = by_impl.loc[ours], by_impl.loc[baseline]
    values = [mine.sm_mhz, theirs.sm_mhz, mine[column], theirs[column]]
    if any(pd.isna(v) for v in values):
        return ""
    time_ratio = mine[column] / theirs[column]
    cycle_ratio = time_ratio * mine.sm_mhz / theirs.sm_mhz
    what = column.removesuffix("_ms").replace("_", "+")
    return (
        f"While timed, the GPU's SM clock had a median of **{mine.sm_mhz:.0f} MHz for {ours}** and "
        f"**{theirs.sm_mhz:.0f} MHz for {baseline}**, at {mine.power_w:.0f} and {theirs.power_w:.0f} W, with the "
        f"clock held down by the board's power cap in {mine.power_capped:.0%} and {theirs.power_capped:.0%} of "
        f"the samples. In clock cycles (time × clock), {ours}'s {what} took {cycle_ratio:.3f}× {baseline}'s; "
        f"in time, {time_ratio:.3f}×."
    )


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
