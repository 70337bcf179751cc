"""How the step's compiled blocks are partitioned into a forward and a backward graph.

Under an activation memory budget (`torch._functorch.config.activation_memory_budget` < 1) the min-cut
partitioner trades saved activations against recomputation, by its runtime estimate of each candidate. It
would recompute the FlashAttention forward (`cs336::flash_forward`) in the backward: the attention's output
and row logsumexp are small beside the other activations, and the recompute costs a whole attention
forward. The step decides recomputation itself (`memory_plan`, `kept_attention`), with the budget chosen
for the partitioner's remaining choices, so its compiled blocks always save the attention forward's outputs:
an Inductor joint-graph pass marks that op MUST_SAVE (`SaveAttentionForward`).
"""

from __future__ import annotations

import contextlib

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.utils.checkpoint import CheckpointPolicy

import cs336_systems.attention.launch.dispatch  # noqa: F401  (registers the op cs336::flash_forward)


class SaveAttentionForward(CustomGraphPass):
    """Inductor joint-graph pass: the partitioner saves what each FlashAttention forward returns (O and L)
    and never recomputes the op; `inner`, a pass that was already set, runs first."""

    def __init__(self, inner=None):
        self.inner = inner

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.inner is not None:
            self.inner(graph)
        forward = torch.ops.cs336.flash_forward.default
        for node in graph.nodes:
            if node.op == "call_function" and node.target is forward:
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE

    def uuid(self):
        inner = None if self.inner is None else self.inner.uuid()
        return (get_hash_for_files((__file__,)), inner)


def partitioned_under(activation_memory_budget: float):
    """A context in which torch.compile partitions under `activation_memory_budget`, the attention forward
    saved (`SaveAttentionForward`)."""
    import torch._functorch.config as functorch_config  # torch.compile's partitioner settings
    import torch._inductor.config as inductor_config

    if not hasattr(functorch_config, "activation_memory_budget"):
        raise ValueError("an activation memory budget needs a torch whose compiler has it (2.4 or later)")
    stack = contextlib.ExitStack()
    stack.enter_context(functorch_config.patch(activation_memory_budget=activation_memory_budget))
    existing = inductor_config.joint_custom_post_pass
    stack.enter_context(inductor_config.patch(joint_custom_post_pass=SaveAttentionForward(existing)))
    return stack
