"""What the training step reads from a language model, found by name and shape, not by class.

The step runs this library's `TransformerLM` and any model of its structure, the course's
`cs336_basics.model.BasicsTransformerLM` included: `token_embeddings`, `layers` (blocks, each
(batch, seq, d_model) -> same), `ln_final` and a bias-free `lm_head` whose `weight` the fused loss
multiplies (`model_parts` checks them, as `distributed.fsdp` shards by structure). Two models of it have
the same parameter names and shapes, so a state dict moves between them unchanged.

`final_hidden_states` is how the step runs a model's modules in order: through the model's own
`final_hidden_states` method where it has one (`TransformerLM`), else walked by structure as the course's
`BasicsTransformerLM.forward` walks itself. It is the one place the step walks a model; the course's model
cannot be given the method, which is why the walk is kept, here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from cs336_systems.model import BlockRunner


@dataclass(frozen=True)
class ModelParts:
    """The model's parts the step reads, found by name and shape (`model_parts`): its sizes (those the checks
    and the memory model use; `context_length` and `num_heads` are None where the model does not say them)
    and its modules."""

    vocab_size: int
    d_model: int
    context_length: int | None
    num_heads: int | None
    token_embeddings: nn.Module = field(repr=False, compare=False)
    layers: nn.Module = field(repr=False, compare=False)  # a sequence of blocks (an nn.ModuleList)
    ln_final: nn.Module = field(repr=False, compare=False)
    lm_head: nn.Module = field(repr=False, compare=False)

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's (vocab, d_model) weight: logits = h @ head_weight^T."""
        return self.lm_head.weight

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device


def model_parts(model: nn.Module) -> ModelParts:
    """The structure the step runs, checked: `token_embeddings` (a module with a (vocab, d_model) `weight`),
    `layers` (a sequence of modules, each (batch, seq, d_model) -> same), `ln_final` (a module) and `lm_head`
    (a module whose only parameter is a (vocab, d_model) `weight`, used as h @ weight^T by the fused loss).
    This library's `TransformerLM` and the course's `BasicsTransformerLM` both have it, with the same
    parameter names and shapes; their classes are not looked at (as `distributed.fsdp` shards by structure).
    A head that is not h @ weight^T is found at the first step: loss and gradients would differ from the
    model's own forward, so `lm_head` is probed once here (one one-hot row, exact in any dtype). TypeError
    naming what is missing."""

    def fail(problem: str):
        raise TypeError(
            f"build_train_step needs a language model with token_embeddings, layers, ln_final and a "
            f"bias-free lm_head (as cs336_systems.model.TransformerLM and the course's "
            f"BasicsTransformerLM): {type(model).__name__} {problem}"
        )

    if not isinstance(model, nn.Module):
        fail("is not an nn.Module")
    for name in ("token_embeddings", "layers", "ln_final", "lm_head"):
        if not isinstance(getattr(model, name, None), nn.Module):
            fail(f"has no module `{name}`")
    embedding, head = getattr(model.token_embeddings, "weight", None), getattr(model.lm_head, "weight", None)
    if not (isinstance(embedding, torch.Tensor) and embedding.dim() == 2):
        fail("has no 2-D token_embeddings.weight")
    if not (isinstance(head, torch.Tensor) and head.shape == embedding.shape):
        fail(f"has no lm_head.weight of token_embeddings.weight's shape {tuple(embedding.shape)}")
    if [name for name, _ in model.lm_head.named_parameters()] != ["weight"]:
        fail("has an lm_head with parameters besides its weight (a bias): the fused loss computes h @ weight^T")
    if not all(isinstance(block, nn.Module) for block in model.layers):
        fail("has layers that are not modules")
    _check_head_is_linear(model.lm_head, head, fail)
    return ModelParts(
        head.shape[0],
        head.shape[1],
        _config_value(model, "context_length"),
        _num_heads(model),
        model.token_embeddings,
        model.layers,
        model.ln_final,
        model.lm_head,
    )


def final_hidden_states(
    model: nn.Module, token_ids: torch.Tensor, run_block: BlockRunner | None = None
) -> torch.Tensor:
    """(batch, seq, d_model): the last block's output after the final norm, with `run_block(i, block, x)`
    running each block i where given (`TransformerLM.final_hidden_states`'s contract). The model's own method
    where it has one; else by structure, in the order of the course's `BasicsTransformerLM.forward`:
    token_embeddings, each of layers, ln_final."""
    own = getattr(model, "final_hidden_states", None)
    if callable(own):
        return own(token_ids, run_block=run_block)
    x = model.token_embeddings(token_ids)
    for i, block in enumerate(model.layers):
        x = run_block(i, block, x) if run_block is not None else block(x)
    return model.ln_final(x)


def attention_of(block: nn.Module):
    """The block's pluggable attention function (`block.attn.attention`, as our `TransformerLM`'s), or None
    where its attention is its own code."""
    return getattr(getattr(block, "attn", None), "attention", None)


def _check_head_is_linear(lm_head: nn.Module, weight: torch.Tensor, fail) -> None:
    # lm_head(e_0) is weight[:, 0] for h @ weight^T: one product with a single one, exact in any dtype
    # (TF32 rounds fp32 weights, hence the loose tolerance: a scaled or shifted head is far off it)
    if weight.is_meta:
        return
    probe = torch.zeros(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    probe[0, 0] = 1
    with torch.no_grad():
        out = lm_head(probe)
    expected = weight[:, 0].unsqueeze(0)
    if out.shape != expected.shape or not torch.allclose(out.float(), expected.float(), rtol=1e-2, atol=1e-6):
        fail("has an lm_head that does not compute h @ lm_head.weight^T")


def _config_value(model: nn.Module, name: str) -> int | None:
    """`name` from the model's config (our `ModelConfig`, or the course's dict of constructor arguments) or
    the model itself."""
    config = getattr(model, "config", None)
    value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
    return value if value is not None else getattr(model, name, None)


def _num_heads(model: nn.Module) -> int | None:
    """The config's `num_heads`, else the first block's `attn.num_heads`."""
    blocks = list(model.layers)
    first = getattr(getattr(blocks[0], "attn", None), "num_heads", None) if blocks else None
    return _config_value(model, "num_heads") or first
