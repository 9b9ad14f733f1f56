"""Absolute positional encodings added to the token embeddings (``model.pos_encoding``).

Each class maps a sequence length to a ``(length, d_model)`` table that the family adds to
its embeddings.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .registry import POSITIONAL


@POSITIONAL.register("learned", "learned absolute position embeddings (GPT-2, BERT, ViT)")
class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.zeros(max_len, dim))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        if offset + length > self.max_len:
            raise ValueError(
                f"sequence of length {offset + length} exceeds the learned positions "
                f"(model.max_seq_len={self.max_len}); learned absolute positions cannot extrapolate"
            )
        return self.weight[offset : offset + length]


def sinusoidal_table(length: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """``PE[p, 2i] = sin(p / base^(2i/dim))``, ``PE[p, 2i+1] = cos(p / base^(2i/dim))`` (Vaswani et al.)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(base) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: dim // 2])
    return table


@POSITIONAL.register("sinusoidal", "fixed sinusoidal encodings (Vaswani et al. 2017), no parameters")
class SinusoidalPositionalEncoding(nn.Module):
    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.dim = dim
        self.register_buffer("table", sinusoidal_table(max_len, dim), persistent=False)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        if offset + length > self.table.shape[0]:  # grows on demand: sinusoids are defined everywhere
            self.table = sinusoidal_table(offset + length, self.dim).to(self.table)  # keep device and dtype
        return self.table[offset : offset + length]


def build_positional(name: str, max_len: int, dim: int) -> nn.Module:
    return POSITIONAL.get(name)(max_len, dim)
