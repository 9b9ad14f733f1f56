"""Encoder-decoder translator (Vaswani et al. 2017) built from the block library."""

from __future__ import annotations

import torch
from torch import nn

from .block import LayerCache, TransformerStack, init_weights
from .config import ModelConfig
from .position import build_positional
from .registry import FAMILIES


@FAMILIES.register("encoder_decoder", "encoder-decoder translator with cross-attention, shared vocabulary")
class EncoderDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.require("vocab_size")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)  # shared by source, target and output
        self.positions = build_positional(cfg, cfg.max_seq_len)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = TransformerStack(
            cfg, cfg.encoder_layers, causal=False, architecture="encoder_decoder", stack="encoder"
        )
        self.decoder = TransformerStack(
            cfg, cfg.decoder_layers, causal=True, cross_attention=True, architecture="encoder_decoder", stack="decoder"
        )
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg.encoder_layers + cfg.decoder_layers)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def _embed(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = self.tok_emb(tokens) * self.cfg.d_model**0.5
        return self.drop(self.positions.add_to(x, offset))

    def encode(self, src: torch.Tensor, src_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(self._embed(src), padding_mask=src_padding_mask, positional=self.positions)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_padding_mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
    ) -> torch.Tensor:
        """Decoder logits for ``tgt``; with ``caches``, ``tgt`` holds only the tokens after the cached ones."""
        # Right-padded targets need no self-attention padding mask: the causal mask already hides
        # later (padding) positions from every real token, and padded positions carry no loss.
        offset = caches[0].self_attn.length if caches else 0
        x = self.decoder(
            self._embed(tgt, offset), caches=caches, memory=memory, memory_padding_mask=src_padding_mask,
            positional=self.positions,
        )
        return self.lm_head(x)

    def forward(
        self, src: torch.Tensor, tgt: torch.Tensor, src_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Teacher forcing: ``src`` (B, S), ``tgt`` (B, T) decoder input -> logits (B, T, vocab)."""
        return self.decode(tgt, self.encode(src, src_padding_mask), src_padding_mask)

    @torch.no_grad()
    def greedy_decode(
        self,
        src: torch.Tensor,
        *,
        bos_id: int,
        eos_id: int,
        max_len: int,
        src_padding_mask: torch.Tensor | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Greedy decoding; returns (B, <= max_len) token ids without BOS. Rows that finished are
        filled with ``eos_id`` after their first EOS. ``use_cache`` feeds one token per step."""
        memory = self.encode(src, src_padding_mask)
        out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
        finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        caches = self.decoder.new_caches() if use_cache else None
        for _ in range(max_len):
            step_input = out[:, -1:] if use_cache else out
            next_token = self.decode(step_input, memory, src_padding_mask, caches)[:, -1].argmax(-1)
            next_token = next_token.masked_fill(finished, eos_id)
            out = torch.cat([out, next_token[:, None]], dim=1)
            finished |= next_token == eos_id
            if finished.all():
                break
        return out[:, 1:]
