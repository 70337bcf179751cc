"""Run one benchmark in a fresh Python process, so one-time costs (CUDA context, cuBLAS handles,
kernel selection, allocator growth) land in that run's first steps and not in an earlier run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cs336_systems.benchmarking.harness import BenchmarkConfig


def cli_arguments(config: BenchmarkConfig) -> list[str]:
    if config.size is None or config.model:
        raise ValueError("run_isolated takes size-named models only (no hyperparameter overrides)")
    args = [
        "--size",
        config.size,
        "--context-length",
        str(config.context_length),
        "--batch-size",
        str(config.batch_size),
        "--mode",
        config.mode,
        "--precision",
        config.precision,
        "--warmup",
        str(config.warmup),
        "--steps",
        str(config.steps),
        "--attention",
        config.attention,
        "--json",
    ]
    if config.compile:
        args.append("--compile")
    if config.checkpoint_every:
        args += ["--checkpoint-every", str(config.checkpoint_every)]
    if config.device:
        args += ["--device", config.device]
    return args


def run_isolated(config: BenchmarkConfig, timeout_s: float = 1800) -> dict:
    cmd = [sys.executable, "-m", "cs336_systems.benchmarking", *cli_arguments(config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"benchmark subprocess failed (exit {proc.returncode}): {proc.stderr.strip()[-1000:]}")
    return json.loads(lines[-1])
