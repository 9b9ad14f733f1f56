"""The input embedding of every family: one convention for the token signal and the position table.

Each family turns its input into a "token signal" of shape (B, T, D): the token table
(``DecoderLM``, ``EncoderDecoder``) or the patch projection after a CLS token
(``VisionTransformer``). ``embed`` then adds the positional table of ``model.pos_encoding``.
The convention, for all three families:

- **token : position RMS is 1 : 1 at init** for every additive variant (learned, sinusoidal,
  sincos2d): ``position.build_positional(cfg, max_len, rms)`` gives the table the RMS of the
  token signal it is added to. Learned tables are N(0, rms); the fixed sine-cosine tables are
  scaled from unit amplitude (``position.fixed_table_scale``). A comparison of positional
  encodings thus starts every variant, in every family, from the same signal ratio. rope, alibi,
  relative and nope add no table.
- **No multiplier** on either side (no sqrt(d_model)): what the first block sees is the sum.
- **The token signal keeps its family's usual scale.** Token tables are N(0, ``EMBEDDING_STD``
  = 0.02), GPT-2's init, which the tied output layer shares (``block.init_weights``). The ViT's
  patch projection is N(0, ``PATCH_RMS`` / sqrt(fan_in)) with a zero bias: RMS 1/sqrt(2) on
  unit-variance (normalized) pixels, the order of timm's and MAE's patch projections, at which
  the ViT's sine-cosine tables keep the unit amplitude of MAE. Its CLS token, a token of the
  signal too, is N(0, ``PATCH_RMS``) and takes no position: the ViT's tables cover the patches
  only (timm's ``no_embed_class``; MAE's sincos2d CLS row is zero).

Why the ViT's own scale: on the embedded vit task (learned positions, 300 steps, seeds 0-2) its
accuracy was 0.75 with patches and positions at 1/sqrt(2), 0.69 with the former convention
(PyTorch's default patch projection, positions N(0, 0.02): token : position 29 : 1) and 0.52 with
patches and positions both at 0.02. The LM and translator train well at GPT-2's 0.02.

Why the CLS token at the patches' RMS, not timm's or HF's 0.02 (seeds 0-3, learned positions,
``pos_encoding=learned`` vit cells of 300 steps): accuracy 0.80, 0.74, 0.79, 0.79 at 1/sqrt(2)
against 0.73, 0.60, 0.71, 0.69 at 0.02 (higher on every seed, by 0.10 on average). At 1/sqrt(2)
the ViT fits a *random-label* batch slower than timm's and HF's (``benchmarks/init_parity.py``,
whose ablation row ``blockbench_vit_cls_002`` fits like them): a documented gap, kept because the
benchmark scores the task, not the memorisation of noise. Until issue 12 the CLS token had a
learned position row at that RMS on top of a 0.02 token, the same start through two redundant
parameters; it scored 0.76, 0.74, 0.76, 0.88 on the same seeds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # position.py imports EMBEDDING_STD from here
    from .position import PositionalEncoding

#: std at init of token tables (GPT-2's 0.02), hence the RMS of their position tables
EMBEDDING_STD = 0.02
#: RMS at init of the ViT's patch projection on unit-variance pixels, hence of its position table
PATCH_RMS = 2**-0.5


def embed(signal: torch.Tensor, positions: "PositionalEncoding", offset: int = 0) -> torch.Tensor:
    """``signal`` (B, T, D), the token signal at positions ``offset .. offset + T - 1``, plus the
    position table, if the encoding has one. The one place where a family's input meets its
    positions: no family rescales either side (see the module docstring for the convention)."""
    return positions.add_to(signal, offset)
