"""Distributed training: launching, DDP flavours, the sharded optimizer, FSDP and their benchmarks."""

from cs336_systems.distributed.launch import DistContext, free_port, gather_timings, launch_from_env, spawn

__all__ = ["DistContext", "free_port", "gather_timings", "launch_from_env", "spawn"]
