"""Distributed training: launching, the DDP wrappers, sharded gradients, the sharded optimizer and FSDP.

Their benchmarks, timelines and toy models live in `cs336_systems.experiments`.
"""

from cs336_systems.distributed.ddp_base import DataParallel
from cs336_systems.distributed.ddp_bucketed import DDPBucketed
from cs336_systems.distributed.ddp_flat import DDPFlat
from cs336_systems.distributed.ddp_individual import DDPIndividualParameters
from cs336_systems.distributed.ddp_naive import DDPNaive
from cs336_systems.distributed.ddp_sharded_gradients import DDPShardedGradients
from cs336_systems.distributed.fsdp import FSDP
from cs336_systems.distributed.launch import DistContext, free_port, gather_timings, launch_from_env, spawn
from cs336_systems.distributed.sharded_optimizer import ShardedOptimizer

__all__ = [
    "DDPBucketed",
    "DDPFlat",
    "DDPShardedGradients",
    "DDPIndividualParameters",
    "DDPNaive",
    "DataParallel",
    "DistContext",
    "FSDP",
    "ShardedOptimizer",
    "free_port",
    "gather_timings",
    "launch_from_env",
    "spawn",
]
