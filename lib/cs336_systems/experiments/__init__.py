"""Experiments: code only the notebooks and tools need — benchmarks, sweeps, timelines, fits, prose builders.

These modules import the core (model, kernels, DDP/FSDP/sharding wrappers, optimizer, launch,
benchmarking harness, profiling, accounting, report plumbing) and are never imported by it; one
module per experiment. Import the submodules directly, e.g.
`from cs336_systems.experiments.ddp_benchmark import benchmark_ddp`.
"""

__all__ = [
    "allreduce_benchmark",
    "attention_benchmark",
    "attention_benchmark_worker",
    "ddp_benchmark",
    "ddp_equivalence",
    "ddp_flavours",
    "ddp_overhead_model",
    "ddp_scaling",
    "ddp_timeline",
    "flash_benchmark",
    "flash_leaderboard",
    "fsdp_benchmark",
    "fsdp_timeline",
    "leaderboard_kernels",
    "sharding_benchmark",
    "toy_models",
]
