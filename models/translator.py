"""Encoder-decoder translator (Vaswani et al. 2017) built from the block library."""

from __future__ import annotations

import torch
from torch import nn

from .block import LayerCache, TransformerStack, init_weights
from .config import ModelConfig
from .embedding import embed
from .loss import linear_cross_entropy
from .position import PositionalEncoding, build_positional
from .registry import FAMILIES


@FAMILIES.register("encoder_decoder", "encoder-decoder translator with cross-attention, shared vocabulary")
class EncoderDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.require("vocab_size")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)  # shared by source, target and output
        self.positions = build_positional(cfg, cfg.max_seq_len)  # the source's, and the target's unless below
        # an encoding whose parameters mean other things in a causal stack gets a second instance (T5's bias)
        self.target_positions = build_positional(cfg, cfg.max_seq_len) if self.positions.one_per_stack else None
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

    def decoder_positions(self) -> PositionalEncoding:
        """The decoder's positional encoding: its own where the encoding has ``one_per_stack``, else
        the encoder's (one table of absolute positions serves source and target)."""
        return self.positions if self.target_positions is None else self.target_positions

    def _embed(self, tokens: torch.Tensor, positions: PositionalEncoding, offset: int = 0) -> torch.Tensor:
        """Source or target tokens plus positions, by the convention of all families
        (``models.embedding``): no sqrt(d_model) multiplier, token : position RMS 1 : 1 at init."""
        return self.drop(embed(self.tok_emb(tokens), positions, offset))

    def encode(self, src: torch.Tensor, src_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(self._embed(src, self.positions), padding_mask=src_padding_mask, positional=self.positions)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_padding_mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
        *,
        tgt_padding_mask: torch.Tensor | None = None,
        head: bool = True,
        block_outputs: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Decoder logits for ``tgt`` (or with ``head=False`` its final hidden states); with
        ``caches`` (from ``new_caches``), ``tgt`` holds only the tokens after the cached ones: the one
        incremental step that ``models.decoding``'s searches repeat. ``tgt_padding_mask`` (B, T),
        True = padding, keeps right padding out of the decoder's MoE routing. With ``block_outputs``,
        also every decoder block's output, first block first: ``(logits or hidden states, outputs)``."""
        # Right-padded targets need no self-attention padding mask: the causal mask already hides
        # later (padding) positions from every real token, and padded positions carry no loss.
        # Only the feed-forward gets it: an MoE must not give padding expert capacity.
        offset = caches[0].self_attn.length if caches else 0
        positions = self.decoder_positions()
        x = self.decoder(
            self._embed(tgt, positions, offset),
            caches=caches,
            memory=memory,
            memory_padding_mask=src_padding_mask,
            ffn_padding_mask=tgt_padding_mask,
            positional=positions,
            block_outputs=block_outputs,
        )
        if block_outputs:
            x, outputs = x
            return (self.lm_head(x) if head else x), outputs
        return self.lm_head(x) if head else x

    def new_caches(self) -> list[LayerCache]:
        """Empty decoder KV caches for incremental ``decode`` (``models.decoding``)."""
        return self.decoder.new_caches()

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_padding_mask: torch.Tensor | None = None,
        *,
        tgt_padding_mask: torch.Tensor | None = None,
        head: bool = True,
        block_outputs: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Teacher forcing: ``src`` (B, S), ``tgt`` (B, T) decoder input -> logits (B, T, vocab)
        (or with ``head=False`` the decoder's final hidden states (B, T, D)); with ``block_outputs``,
        also every decoder block's output (the logit lens), as ``decode`` returns them."""
        memory = self.encode(src, src_padding_mask)
        return self.decode(
            tgt, memory, src_padding_mask, tgt_padding_mask=tgt_padding_mask, head=head, block_outputs=block_outputs
        )

    def loss(
        self,
        src: torch.Tensor,
        tgt_in: torch.Tensor,
        tgt_out: torch.Tensor,
        *,
        src_padding_mask: torch.Tensor | None = None,
        tgt_padding_mask: torch.Tensor | None = None,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
    ) -> torch.Tensor:
        """Teacher-forcing cross-entropy of ``tgt_out`` given ``src`` and ``tgt_in``, without holding
        the (B, T, vocab) logits in training on a CPU (``models.loss.linear_cross_entropy``); compiled
        with the forward under ``compile: true`` (``models.build.compile_model``).
        ``tgt_padding_mask`` marks the positions of ``tgt_in`` that are padding (see ``decode``)."""
        hidden = self(src, tgt_in, src_padding_mask, tgt_padding_mask=tgt_padding_mask, head=False)
        return linear_cross_entropy(
            hidden,
            self.lm_head.weight,
            tgt_out,
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            reduction=reduction,
        )
