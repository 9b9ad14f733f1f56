"""``build_model``: a plain ``nn.Module`` for any family from a config mapping or ``ModelConfig``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .config import ModelConfig
from .registry import FAMILIES


def build_model(config: ModelConfig | Mapping[str, Any]) -> nn.Module:
    """Build the model that ``config`` describes (the same mapping as a YAML ``model:`` section);
    with ``compile: true`` its calls run through ``torch.compile``.

    >>> model = build_model({"family": "decoder_lm", "vocab_size": 100, "norm_placement": "post"})
    """
    cfg = config if isinstance(config, ModelConfig) else ModelConfig.model_validate(dict(config))
    if cfg.family is None:
        raise ValueError(f"model.family is not set; choose one of: {', '.join(FAMILIES.names())}")
    model = FAMILIES.get(cfg.family)(cfg)
    if cfg.compile:
        model.compile()  # in place: parameter names and state_dict keys stay those of the eager model
    return model


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, tied weights counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
