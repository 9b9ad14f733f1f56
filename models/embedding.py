"""The input embedding of every family: one convention for the token signal and the position table.

Each family turns its input into a "token signal" of shape (B, T, D): the token table
(``DecoderLM``, ``EncoderDecoder``) or the patch projection plus the CLS token (``VisionTransformer``).
``embed`` then adds the positional table of ``model.pos_encoding``. The convention, GPT-2's
(nanoGPT's), holds for all three families:

- the token signal has RMS ``EMBEDDING_STD`` (0.02) at init and no sqrt(d_model) multiplier:
  token tables are N(0, 0.02) (``block.init_weights``); the ViT's patch projection is
  N(0, 0.02 / sqrt(fan_in)) with a zero bias, so on unit-variance (normalized) pixels its output
  has RMS 0.02 too, and its CLS token is N(0, 0.02);
- every additive position table has RMS ``EMBEDDING_STD`` at init: learned tables are N(0, 0.02),
  the fixed sinusoidal and 2D sine-cosine tables are scaled from unit amplitude to RMS 0.02
  (``position.fixed_table_scale``);
- so token : position RMS is 1 : 1 at init for every additive variant (learned, sinusoidal,
  sincos2d) in every family, and a comparison of positional encodings starts from the same
  token-to-position signal ratio. rope, alibi, relative and nope add no table.

Why scale the fixed tables rather than the tokens: the LM head is tied to the token table, which
thus keeps the init of every other weight, and a pre-norm stack's first norm sees only the ratio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # position.py imports EMBEDDING_STD from here
    from .position import PositionalEncoding

#: RMS at init of every input signal: token tables, the patch projection's output, position tables
EMBEDDING_STD = 0.02


def embed(signal: torch.Tensor, positions: "PositionalEncoding", offset: int = 0) -> torch.Tensor:
    """``signal`` (B, T, D), the token signal at positions ``offset .. offset + T - 1``, plus the
    position table, if the encoding has one. The one place where a family's input meets its
    positions: no family rescales either side (see the module docstring for the convention)."""
    return positions.add_to(signal, offset)
