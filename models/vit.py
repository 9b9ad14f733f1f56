"""Vision Transformer (Dosovitskiy et al. 2021) built from the block library."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .block import TransformerStack, init_weights
from .config import ModelConfig
from .embedding import embed
from .init_scale import PATCH_RMS
from .position import build_positional
from .registry import FAMILIES


class PatchEmbedding(nn.Module):
    """Split an image into non-overlapping patches and project each to ``d_model``.

    The projection is N(0, PATCH_RMS / sqrt(fan_in)) with a zero bias, so on unit-variance
    (normalized) pixels each output feature has RMS ``PATCH_RMS``, that of the position table
    (``models.embedding``)."""

    def __init__(self, in_channels: int, patch_size: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        nn.init.normal_(self.proj.weight, std=PATCH_RMS / math.sqrt(in_channels * patch_size**2))
        nn.init.zeros_(self.proj.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, n_patches, D)


@FAMILIES.register("vit", "Vision Transformer: patch embedding, CLS token, classification head")
class VisionTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.require("image_size", "n_classes")
        self.cfg = cfg
        self.n_patches = (cfg.image_size // cfg.patch_size) ** 2
        self.patch_embed = PatchEmbedding(cfg.in_channels, cfg.patch_size, cfg.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        # A table covers the patches only, at their RMS: the CLS token has no place in the image
        # (timm's no_embed_class, MAE's zero CLS row), and a learned CLS position would only repeat
        # the learned CLS token. rope, alibi and relative still see CLS as position 0. The CLS token
        # is a token of the signal, at the patches' RMS (why not 0.02: docs/decisions/embedding-scale.md).
        self.positions = build_positional(cfg, self.n_patches, rms=PATCH_RMS)
        self.drop = nn.Dropout(cfg.dropout)
        self.stack = TransformerStack(cfg, cfg.n_layers, causal=False, architecture="encoder", stack="encoder")
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        init_weights(self, cfg.n_layers)
        nn.init.normal_(self.cls_token, std=PATCH_RMS)
        # The head keeps init_weights' N(0, 0.02) weight and zero bias, as timm's default
        # (init_weights_vit_timm) and HF's ViTForImageClassification draw it. A zero head is the JAX
        # fine-tuning recipe (timm's weight_init="jax"): it fits a fixed batch far slower from scratch
        # (benchmarks/init_parity.py).

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``images``: (B, C, H, W) -> class logits (B, n_classes)."""
        x = embed(self.patch_embed(images), self.positions)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.stack(self.drop(x), positional=self.positions)
        return self.head(x[:, 0])

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the class logits of ``images``; ``labels`` are class ids (B,) or class
        probabilities (B, n_classes) (MixUp, CutMix). Under ``compile: true`` it is compiled with the
        forward, as one graph (``models.build.compile_model``)."""
        return F.cross_entropy(self(images), labels)
