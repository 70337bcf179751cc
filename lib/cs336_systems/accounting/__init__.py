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

from cs336_systems.accounting.ffn_stack import *  # noqa: F403
from cs336_systems.accounting.memory import *  # noqa: F403
from cs336_systems.accounting.mesh import *  # noqa: F403
from cs336_systems.accounting.parallelism import *  # noqa: F403
from cs336_systems.accounting.parallelism_answers import *  # noqa: F403
from cs336_systems.accounting.rings import *  # noqa: F403
from cs336_systems.accounting.sharded_ffn import *  # noqa: F403
from cs336_systems.accounting.symbolic import *  # noqa: F403
from cs336_systems.accounting.sharding import *  # noqa: F403
from cs336_systems.accounting.flops import *  # noqa: F403
