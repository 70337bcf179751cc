"""Benchmarking harness: build a model and batch, time warm-up and measured steps, sweep configurations."""

from cs336_systems.benchmarking.harness import (
    MODES,
    PRECISIONS,
    BenchmarkConfig,
    TrainingSetup,
    autocast_context,
    build,
    run_benchmark,
    synchronize,
    time_steps,
)
from cs336_systems.benchmarking.isolated import run_isolated
from cs336_systems.benchmarking.sweep import grid, save_results, sweep, with_predicted_memory

__all__ = [
    "MODES",
    "PRECISIONS",
    "BenchmarkConfig",
    "TrainingSetup",
    "autocast_context",
    "build",
    "grid",
    "run_benchmark",
    "run_isolated",
    "save_results",
    "sweep",
    "synchronize",
    "time_steps",
    "with_predicted_memory",
]
