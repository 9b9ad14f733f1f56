"""Decoder-only language model (GPT-style) built from the block library."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .block import TransformerStack, init_weights
from .config import ModelConfig
from .position import build_positional
from .registry import FAMILIES


@FAMILIES.register("decoder_lm", "decoder-only causal language model (GPT), tied embeddings")
class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.require("vocab_size")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positions = build_positional(cfg, cfg.max_seq_len)
        self.drop = nn.Dropout(cfg.dropout)
        self.stack = TransformerStack(cfg, cfg.n_layers, causal=True)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg.n_layers)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def forward(self, idx: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``idx``: (B, T) token ids -> logits (B, T, vocab). ``padding_mask`` True marks padding."""
        x = self.tok_emb(idx)
        table = self.positions.embedding(idx.shape[1])
        if table is not None:
            x = x + table
        x = self.stack(self.drop(x), padding_mask=padding_mask, positional=self.positions)
        return self.lm_head(x)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` tokens; ``temperature=0`` is greedy decoding."""
        for _ in range(max_new_tokens):
            context = idx if self.positions.extrapolates else idx[:, -self.cfg.max_seq_len :]
            logits = self(context)[:, -1, :]
            if temperature == 0:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_token = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, next_token], dim=1)
        return idx
