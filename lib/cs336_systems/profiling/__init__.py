"""Profiling helpers: named ranges, torch.profiler summaries, timelines and memory snapshots."""

from cs336_systems.profiling.ranges import annotated

__all__ = ["annotated"]
