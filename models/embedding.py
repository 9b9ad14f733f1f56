"""The input embedding of every family: one convention for the token signal and the position table.

Each family turns its input into a token signal (B, T, D) (the token table of ``DecoderLM`` and
``EncoderDecoder``, the patch projection after a CLS token of ``VisionTransformer``), and ``embed``
adds the positional table of ``model.pos_encoding``, with no multiplier on either side. Every
additive table (learned, sinusoidal, sincos2d) gets the RMS of the token signal it is added to
(``position.build_positional(cfg, max_len, rms)``), so every positional variant in every family
starts from token : position RMS 1 : 1; rope, alibi, relative and nope add no table. The token
signal keeps its family's usual scale (``models.init_scale``): token tables N(0, ``EMBEDDING_STD``
= 0.02), GPT-2's init, shared by the tied output layer; the ViT's patch projection at RMS
``PATCH_RMS`` = 1/sqrt(2) on normalized pixels, the order of timm's and MAE's, and its CLS token,
which takes no position, at the same RMS.
Evidence: docs/decisions/embedding-scale.md.
"""

from __future__ import annotations

import torch

from .init_scale import EMBEDDING_STD, PATCH_RMS
from .position import PositionalEncoding

__all__ = ["EMBEDDING_STD", "PATCH_RMS", "embed"]  # the convention's scales live in models.init_scale


def embed(signal: torch.Tensor, positions: PositionalEncoding, offset: int = 0) -> torch.Tensor:
    """``signal`` (B, T, D), the token signal at positions ``offset .. offset + T - 1``, plus the
    position table, if the encoding has one. The one place where a family's input meets its
    positions: no family rescales either side (the module docstring states the convention)."""
    return positions.add_to(signal, offset)
