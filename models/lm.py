"""Decoder-only language model (GPT-style) built from the block library."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .block import LayerCache, TransformerStack, init_weights
from .config import ModelConfig
from .embedding import embed
from .loss import linear_cross_entropy
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
        self.stack = TransformerStack(cfg, cfg.n_layers, causal=True, architecture="decoder", stack="decoder")
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg.n_layers)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def forward(
        self,
        idx: torch.Tensor,
        padding_mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
        *,
        head: bool = True,
    ) -> torch.Tensor:
        """``idx``: (B, T) token ids -> logits (B, T, vocab), or with ``head=False`` the final hidden
        states (B, T, D). ``padding_mask`` (B, T) True marks padding. With ``caches`` (from
        ``new_caches``), ``idx`` holds only the tokens after the cached ones, and ``padding_mask``
        covers every key seen so far, cached and new: (B, cached + T), e.g. a left-padded prompt's
        mask extended by False for each generated token."""
        offset = caches[0].self_attn.length if caches else 0
        x = embed(self.tok_emb(idx), self.positions, offset)
        # attention masks every key, the feed-forward (MoE routing) sees only the new tokens
        new_padding = None if padding_mask is None else padding_mask[:, -idx.shape[1] :]
        x = self.stack(
            self.drop(x), caches=caches, padding_mask=padding_mask, ffn_padding_mask=new_padding,
            positional=self.positions,
        )
        return self.lm_head(x) if head else x

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy of predicting ``targets`` (B, T) from ``idx`` (B, T), without holding the
        (B, T, vocab) logits in training (``models.loss.linear_cross_entropy``)."""
        return linear_cross_entropy(self(idx, head=False), self.lm_head.weight, targets, reduction=reduction)

    def new_caches(self) -> list[LayerCache]:
        return self.stack.new_caches()

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` tokens; ``temperature=0`` is greedy decoding. With ``use_cache``
        each step feeds only the newest token through the model (same result, less work)."""
        caches = None
        for _ in range(max_new_tokens):
            if caches is not None and (self.positions.extrapolates or caches[0].self_attn.length < self.cfg.max_seq_len):
                logits = self(idx[:, -1:], caches=caches)[:, -1, :]
            else:  # first step, or learned positions used up: restart on the last max_seq_len tokens
                caches = self.new_caches() if use_cache else None
                context = idx if self.positions.extrapolates else idx[:, -self.cfg.max_seq_len :]
                logits = self(context, caches=caches)[:, -1, :]
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
