"""``build_model``: a plain ``nn.Module`` for any family from a config mapping or ``ModelConfig``."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .config import ModelConfig
from .registry import FAMILIES


def build_model(config: ModelConfig | Mapping[str, Any]) -> nn.Module:
    """Build the model that ``config`` describes (the same mapping as a YAML ``model:`` section);
    with ``compile: true`` its calls and its training loss run through ``torch.compile``
    (:func:`compile_model`).

    >>> model = build_model({"family": "decoder_lm", "vocab_size": 100, "norm_placement": "post"})
    """
    cfg = config if isinstance(config, ModelConfig) else ModelConfig.model_validate(dict(config))
    if cfg.family is None:
        raise ValueError(f"model.family is not set; choose one of: {', '.join(FAMILIES.names())}")
    model = FAMILIES.get(cfg.family)(cfg)
    if cfg.compile:
        compile_model(model)
    return model


def compile_model(model: nn.Module) -> None:
    """Compile ``model`` in place: its calls (``nn.Module.compile``) and its ``loss`` method, the
    training step's forward and loss, which dynamo traces as one graph (the forward inlined), so that
    the loss (on a GPU ``F.cross_entropy(F.linear(...))``, ``models.loss``) is compiled with the model
    instead of running eagerly after a compiled forward. Parameter names and state_dict keys stay those
    of the eager model. Every family has a ``loss``. To run a compiled model eagerly (validation,
    which would otherwise compile graphs of its own), wrap the calls in
    ``torch.compiler.set_stance("force_eager")``."""
    model.compile()
    # bound to the model as a method (not a compiled bound method): a deep copy binds the copy
    model.loss = types.MethodType(torch.compile(type(model).loss), model)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, tied weights counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
