"""Decoder-only language model (GPT-style) built from the block library."""

from __future__ import annotations

import torch
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
        block_outputs: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """``idx``: (B, T) token ids -> logits (B, T, vocab), or with ``head=False`` the final hidden
        states (B, T, D). ``padding_mask`` (B, T) True marks padding. With ``caches`` (from
        ``new_caches``), ``idx`` holds only the tokens after the cached ones, and ``padding_mask``
        covers every key seen so far, cached and new: (B, cached + T), e.g. a left-padded prompt's
        mask extended by False for each generated token. With ``block_outputs``, also every block's
        output (B, T, D), first block first, as ``(logits or hidden states, outputs)``: what the logit
        lens decodes, from the same forward (a compiled model traces it as one more graph)."""
        offset = caches[0].self_attn.length if caches else 0
        x = embed(self.tok_emb(idx), self.positions, offset)
        # attention masks every key, the feed-forward (MoE routing) sees only the new tokens
        new_padding = None if padding_mask is None else padding_mask[:, -idx.shape[1] :]
        x = self.stack(
            self.drop(x),
            caches=caches,
            padding_mask=padding_mask,
            ffn_padding_mask=new_padding,
            positional=self.positions,
            block_outputs=block_outputs,
        )
        if block_outputs:
            x, outputs = x
            return (self.lm_head(x) if head else x), outputs
        return self.lm_head(x) if head else x

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy of predicting ``targets`` (B, T) from ``idx`` (B, T), without holding the
        (B, T, vocab) logits in training on a CPU (``models.loss.linear_cross_entropy``). Under
        ``compile: true`` it is compiled with the forward, as one graph (``models.build.compile_model``)."""
        return linear_cross_entropy(self(idx, head=False), self.lm_head.weight, targets, reduction=reduction)

    def new_caches(self) -> list[LayerCache]:
        """Empty KV caches for incremental ``forward`` (``models.decoding.generate``)."""
        return self.stack.new_caches()
