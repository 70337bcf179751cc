"""Triton utilities that are not specific to one kernel: the interpreter's detection and repairs
(`interpreter`) and a launcher without Triton's per-call argument binding (`launch`)."""
