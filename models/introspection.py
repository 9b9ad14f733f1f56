"""What a training loop may ask of a built model besides its outputs, as public functions.

The MoE layers compute their auxiliary losses and routing statistics on every forward and keep
them as attributes; attention layers know the share of (query, key) pairs a sparse pattern lets
them attend; positional encodings know whether they extrapolate. Code outside the block library
(the tasks) reads these through the functions here, so the layers' attributes stay internal:

    layers = moe_layers(model)                     # once, after building the model
    loss, logged = add_auxiliary_losses(task_loss, layers, model_config)
    expert_load(layers)                            # {"moe/layer0/expert0_token_share": ..., ...}
    attended_fraction(model)                       # None without a sparse attention pattern

The logit lens (nostalgebraist 2020) reads a model rather than a layer: ``logit_lens_losses`` decodes
the output of every block of the stack that feeds the vocabulary head, as the model decodes its last
one, and returns the loss each would give.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .attention import MultiHeadAttention
from .block import TransformerStack
from .config import ModelConfig
from .lm import DecoderLM
from .loss import linear_cross_entropy
from .moe import MoEFeedForward
from .registry import POSITIONAL
from .translator import EncoderDecoder


def moe_layers(model: nn.Module) -> list[MoEFeedForward]:
    """The model's MoE feed-forward layers in module order; empty for a dense model. Find them once
    and keep the list: walking the modules on every step costs a fraction of a millisecond."""
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


def add_auxiliary_losses(
    loss: torch.Tensor, layers: Sequence[MoEFeedForward], cfg: ModelConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``loss`` plus the auxiliary losses of the MoE ``layers`` from their last forward, weighted
    by ``cfg.moe_aux_loss_weight`` (Switch load balancing) and ``cfg.moe_z_loss_weight`` (router
    z-loss); and the two unweighted losses, each the mean over the layers, to log under
    ``moe/aux_loss`` and ``moe/z_loss``. Without MoE layers: ``loss`` itself and nothing to log.

    The task loss comes in so that the sum is always formed in one order,
    ``(loss + w_aux * aux) + w_z * z``: floating-point addition is not associative."""
    if not layers:
        return loss, {}
    aux = torch.stack([m.aux_loss for m in layers]).mean()
    z = torch.stack([m.z_loss for m in layers]).mean()
    total = loss + cfg.moe_aux_loss_weight * aux + cfg.moe_z_loss_weight * z
    return total, {"moe/aux_loss": aux, "moe/z_loss": z}


def expert_load(layers: Sequence[MoEFeedForward]) -> dict[str, torch.Tensor]:
    """Per layer, each expert's share of the routed assignments and the assignments dropped over
    capacity in the last forward, named for logging (``moe/layer{i}/expert{j}_token_share``,
    ``moe/layer{i}/dropped_tokens``; ``i`` counts the MoE layers in module order). The values are
    0-dim float tensors on the model's device: nothing is read on the host here (on a GPU a read
    waits for it); the logger reads them when it writes (Lightning: every ``log_every_n_steps``)."""
    load: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(layers):
        for j, share in enumerate(layer.tokens_per_expert.unbind()):
            load[f"moe/layer{i}/expert{j}_token_share"] = share
        load[f"moe/layer{i}/dropped_tokens"] = layer.dropped_assignments.float()
    return load


def attended_fraction(model: nn.Module) -> float | None:
    """Mean over the attention layers with a sparse pattern of the share of (query, key) pairs it
    let their last forward attend (causal mask included, padding not); None if no layer has one."""
    fractions = [
        m.attended_fraction
        for m in model.modules()
        if isinstance(m, MultiHeadAttention) and m.attended_fraction is not None
    ]
    return sum(fractions) / len(fractions) if fractions else None


def extrapolating_pos_encodings() -> list[str]:
    """The ``model.pos_encoding`` names that are defined beyond the training length, so a model
    with one of them can be evaluated on longer sequences than it was trained on (sorted)."""
    return [entry.name for entry in POSITIONAL if entry.target.extrapolates]


def _lens_stack(model: nn.Module) -> TransformerStack:
    """The stack whose output the model's vocabulary head decodes: the LM's blocks, the translator's
    decoder. A model without a vocabulary head (the ViT classifies from its CLS token) has none."""
    if isinstance(model, DecoderLM):
        return model.stack
    if isinstance(model, EncoderDecoder):
        return model.decoder
    raise TypeError(
        f"the logit lens decodes hidden states with a vocabulary head; {type(model).__name__} has none "
        "(it works for DecoderLM and EncoderDecoder)"
    )


def logit_lens_depth(model: nn.Module) -> int:
    """How many losses :func:`logit_lens_losses` returns for ``model``: the blocks of its decoding
    stack (``n_layers`` of the LM, the translator's decoder layers). TypeError for a model without a
    vocabulary head."""
    return len(_lens_stack(model).blocks)


def logit_lens_losses(
    model: nn.Module,
    *inputs: Any,
    targets: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    **kwargs: Any,
) -> list[torch.Tensor]:
    """The logit lens (nostalgebraist 2020): the cross-entropy of ``targets`` when the output of each
    block of the decoding stack is decoded as the model decodes its last block's: through the stack's
    final norm (pre-norm and sandwich have one; post-norm and DeepNorm end every block with a norm and
    have none) and the model's own head (``lm_head``, tied to the embedding or not). One scalar per
    block, the first block's first; the last is the model's own loss on these inputs, computed by
    the same operations (``model.loss`` with label smoothing 0).

    ``inputs`` and ``kwargs`` are the model's forward arguments, called once as
    ``model(*inputs, head=False, block_outputs=True, **kwargs)``: ``idx`` for a ``DecoderLM``; ``src, tgt_in,
    src_padding_mask, tgt_padding_mask=...`` for an ``EncoderDecoder``. ``ignore_index`` and
    ``reduction`` ("mean" or "sum") are those of ``F.cross_entropy``. The model returns its blocks'
    outputs from the same forward (``block_outputs=True``), so the stack is the one training runs, and
    a compiled model (``model.compile: true``) traces the call as one more graph, compiled once: no
    forward hooks, which dynamo does not guard (hooks added after compiling are silently skipped).
    The logits are formed one block at a time, never all blocks' at once. Call it under
    ``torch.no_grad()`` to measure (validation)."""
    stack = _lens_stack(model)
    final, outputs = model(*inputs, head=False, block_outputs=True, **kwargs)
    if len(outputs) != len(stack.blocks):
        raise RuntimeError(f"logit lens: {len(stack.blocks)} blocks ran {len(outputs)} times in one forward")
    weight = model.lm_head.weight
    losses = [
        linear_cross_entropy(stack.final_norm(hidden), weight, targets, ignore_index=ignore_index, reduction=reduction)
        for hidden in outputs[:-1]
    ]
    # the last block's output through the final norm is what the model returned: its own loss
    losses.append(linear_cross_entropy(final, weight, targets, ignore_index=ignore_index, reduction=reduction))
    return losses
