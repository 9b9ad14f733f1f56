"""Where the norm sits around each residual sublayer (``model.norm_placement``).

A placement wraps one sublayer (attention or feed-forward) and owns its norm:

- ``pre``:  ``x = x + Sublayer(Norm(x))``; the stack ends with a final norm.
- ``post``: ``x = Norm(x + Sublayer(x))`` (the original Transformer); no final norm.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .norm import build_norm
from .registry import PLACEMENTS


class Residual(nn.Module):
    """Base class: one residual connection around ``sublayer`` with its norm."""

    #: whether a stack built from this placement needs a norm after its last block
    final_norm: bool = False

    def __init__(self, sublayer: nn.Module, norm: str, dim: int, eps: float, bias: bool, dropout: float):
        super().__init__()
        self.sublayer = sublayer
        self.norm = build_norm(norm, dim, eps=eps, bias=bias)
        self.dropout = nn.Dropout(dropout)


@PLACEMENTS.register("pre", "pre-norm: x + Sublayer(Norm(x)), final norm after the stack")
class PreNormResidual(Residual):
    final_norm = True

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return x + self.dropout(self.sublayer(self.norm(x), *args, **kwargs))


@PLACEMENTS.register("post", "post-norm (Vaswani et al. 2017): Norm(x + Sublayer(x))")
class PostNormResidual(Residual):
    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.norm(x + self.dropout(self.sublayer(x, *args, **kwargs)))
