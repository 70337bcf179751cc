"""Sweeps over benchmark configurations: tidy DataFrames, OOM rows, saved with their configuration."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import product
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from cs336_systems.benchmarking.harness import BenchmarkConfig, TrainingSetup, run_benchmark


def grid(base: BenchmarkConfig, **axes: Iterable) -> list[BenchmarkConfig]:
    """Every combination of the given fields, e.g. grid(base, size=[...], context_length=[...])."""
    names = list(axes)
    return [replace(base, **dict(zip(names, values))) for values in product(*axes.values())]


def sweep(
    configs: Iterable[BenchmarkConfig],
    desc: str = "benchmark",
    progress: bool = True,
    then: Callable[[TrainingSetup], dict] | None = None,
) -> pd.DataFrame:
    """Run each configuration; out-of-memory ones become rows with status "OOM" and the sweep goes on.

    `then(setup)` runs after each configuration's timed steps on the same model and adds its keys to
    the row (`run_benchmark`), e.g. `launch_bound.launch_probe()`.
    """
    configs = list(configs)
    rows = []
    for config in tqdm(configs, desc=desc, disable=not progress, leave=False):
        rows.append(run_benchmark(config, then=then))
    df = pd.DataFrame(rows)
    for col in ("status", "mean_ms", "std_ms", "median_ms", "peak_memory_mib"):
        if col not in df:
            df[col] = pd.NA
    return df


def with_predicted_memory(df: pd.DataFrame, device) -> pd.DataFrame:
    """`df` with the analytic peak of each row's step and the part of it parameters, gradients and optimizer
    state take (`predicted_peak_gib`, `predicted_states_gib`), and on a GPU its capacity (`device_memory_gib`),
    so that an out-of-memory row carries its reason."""
    from cs336_systems.accounting.memory import predicted_peaks

    device = torch.device(device)
    out = pd.concat([df, predicted_peaks(df, "cuda" if device.type == "cuda" else "cpu")], axis=1)
    if device.type == "cuda":
        out["device_memory_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
    return out


def save_results(df: pd.DataFrame, path: str | Path, **metadata) -> Path:
    """`path.csv` (the table) and `path.json` (rows plus metadata), so a table can be rebuilt."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path.with_suffix(".csv"), index=False)
    payload = {"metadata": metadata, "rows": json.loads(df.to_json(orient="records"))}
    path.with_suffix(".json").write_text(json.dumps(payload, indent=2))
    return path.with_suffix(".csv")
