"""Position-wise feed-forward network with the activation selected by name (``model.activation``)."""

from __future__ import annotations

import torch
from torch import nn

from .registry import ACTIVATIONS

ACTIVATIONS.register("relu", "ReLU (Vaswani et al. 2017)")(nn.ReLU)
ACTIVATIONS.register("gelu", "GELU, exact erf form (Hendrycks & Gimpel 2016; GPT-2, BERT, ViT)")(nn.GELU)


class FeedForward(nn.Module):
    """``Linear(d_model, d_ff) -> activation -> dropout -> Linear(d_ff, d_model)``."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)
        self.act = ACTIVATIONS.get(activation)()
        self.dropout = nn.Dropout(dropout)
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.dropout(self.act(self.fc_in(x))))
