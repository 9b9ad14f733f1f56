"""What a training loop may ask of a built model besides its outputs, as public functions.

The MoE layers compute their auxiliary losses and routing statistics on every forward and keep
them as attributes; attention layers know the share of (query, key) pairs a sparse pattern lets
them attend; positional encodings know whether they extrapolate. Code outside the block library
(the tasks) reads these through the functions here, so the layers' attributes stay internal:

    layers = moe_layers(model)                     # once, after building the model
    loss, logged = add_auxiliary_losses(task_loss, layers, model_config)
    expert_load(layers)                            # {"moe/layer0/expert0_token_share": ..., ...}
    attended_fraction(model)                       # None without a sparse attention pattern
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .attention import MultiHeadAttention
from .config import ModelConfig
from .moe import MoEFeedForward
from .registry import POSITIONAL


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


def expert_load(layers: Sequence[MoEFeedForward]) -> dict[str, float]:
    """Per layer, each expert's share of the routed assignments and the assignments dropped over
    capacity in the last forward, named for logging (``moe/layer{i}/expert{j}_token_share``,
    ``moe/layer{i}/dropped_tokens``; ``i`` counts the MoE layers in module order)."""
    load: dict[str, float] = {}
    for i, layer in enumerate(layers):
        for j, share in enumerate(layer.tokens_per_expert.tolist()):
            load[f"moe/layer{i}/expert{j}_token_share"] = share
        load[f"moe/layer{i}/dropped_tokens"] = float(layer.dropped_tokens)
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
