"""Optimizers: AdamW written out as in assignment 1 (`adamw`), the fused multi-tensor AdamW of the training
step (`fused_adamw`, its Triton kernels in `fused_adamw_kernels`), an optimizer's states kept in host memory
between steps (`state_offload`), the hyperparameter check both share with
torch.optim.AdamW's messages (`hyperparameters`), and gradient clipping (`gradient_clipping`).

    from cs336_systems.optim import AdamW, FusedAdamW
"""

from cs336_systems.optim.adamw import OPTIMIZERS, AdamW, make_optimizer
from cs336_systems.optim.fused_adamw import FusedAdamW
from cs336_systems.optim.gradient_clipping import clip_gradients
from cs336_systems.optim.hyperparameters import check_adamw_hyperparameters
from cs336_systems.optim.state_offload import StateOffload

__all__ = [
    "OPTIMIZERS",
    "AdamW",
    "FusedAdamW",
    "StateOffload",
    "check_adamw_hyperparameters",
    "clip_gradients",
    "make_optimizer",
]
