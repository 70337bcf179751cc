"""Analytic calculators: memory, FLOPs and communication, for the accounting problems and to
cross-check measurements.

Submodules, one concept each: `memory` (a TransformerLM's training memory: parameters, gradients,
AdamW state, saved activations), `sharding` (DDP / optimizer-state sharding / ZeRO / FSDP memory and
communication), `ffn_stack` (the XXL model of the communication-accounting problem), `parallelism`
(the DP / FSDP / TP / FSDP×TP formulas of the 2026 handout), `rings` (ring collectives: closed
forms and step-by-step simulations), `sharded_ffn` (tensor-parallel FFN checked against autograd
and the FLOP counter), `mesh` (the X×Y mesh model), `symbolic` (formulas usable with numbers or
sympy symbols), `parallelism_answers` (every 2026 answer as formula plus value).
"""

# The public API is the submodules; import their names from them, e.g.
# `from cs336_systems.accounting.memory import ...` or `from cs336_systems.accounting import rings`.
from cs336_systems.accounting import (
    ffn_stack,
    flops,
    memory,
    mesh,
    parallelism,
    parallelism_answers,
    rings,
    sharded_ffn,
    sharding,
    symbolic,
)

__all__ = [
    "ffn_stack",
    "flops",
    "memory",
    "mesh",
    "parallelism",
    "parallelism_answers",
    "rings",
    "sharded_ffn",
    "sharding",
    "symbolic",
]
