"""Encoder-decoder translator (Vaswani et al. 2017) built from the block library."""

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


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016); a hypothesis' summed
    log-probability is divided by it, so alpha > 0 favours longer outputs and alpha = 0 leaves raw sums."""
    return ((5 + length) / 6) ** alpha


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
        """Source or target tokens plus positions, by the convention of all families
        (``models.embedding``): no sqrt(d_model) multiplier, token : position RMS 1 : 1 at init."""
        return self.drop(embed(self.tok_emb(tokens), self.positions, offset))

    def encode(self, src: torch.Tensor, src_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(self._embed(src), padding_mask=src_padding_mask, positional=self.positions)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_padding_mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
        *,
        tgt_padding_mask: torch.Tensor | None = None,
        head: bool = True,
    ) -> torch.Tensor:
        """Decoder logits for ``tgt`` (or with ``head=False`` its final hidden states); with
        ``caches``, ``tgt`` holds only the tokens after the cached ones. ``tgt_padding_mask`` (B, T),
        True = padding, keeps right padding out of the decoder's MoE routing."""
        # Right-padded targets need no self-attention padding mask: the causal mask already hides
        # later (padding) positions from every real token, and padded positions carry no loss.
        # Only the feed-forward gets it: an MoE must not give padding expert capacity.
        offset = caches[0].self_attn.length if caches else 0
        x = self.decoder(
            self._embed(tgt, offset), caches=caches, memory=memory, memory_padding_mask=src_padding_mask,
            ffn_padding_mask=tgt_padding_mask, positional=self.positions,
        )
        return self.lm_head(x) if head else x

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_padding_mask: torch.Tensor | None = None,
        *,
        tgt_padding_mask: torch.Tensor | None = None,
        head: bool = True,
    ) -> torch.Tensor:
        """Teacher forcing: ``src`` (B, S), ``tgt`` (B, T) decoder input -> logits (B, T, vocab)
        (or with ``head=False`` the decoder's final hidden states (B, T, D))."""
        memory = self.encode(src, src_padding_mask)
        return self.decode(tgt, memory, src_padding_mask, tgt_padding_mask=tgt_padding_mask, head=head)

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
        the (B, T, vocab) logits in training (``models.loss.linear_cross_entropy``).
        ``tgt_padding_mask`` marks the positions of ``tgt_in`` that are padding (see ``decode``)."""
        hidden = self(src, tgt_in, src_padding_mask, tgt_padding_mask=tgt_padding_mask, head=False)
        return linear_cross_entropy(
            hidden, self.lm_head.weight, tgt_out, ignore_index=ignore_index, label_smoothing=label_smoothing,
            reduction=reduction,
        )

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

    @torch.no_grad()
    def beam_search(
        self,
        src: torch.Tensor,
        *,
        bos_id: int,
        eos_id: int,
        max_len: int,
        beam_size: int = 4,
        length_penalty: float = 0.6,
        src_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Batched beam search (fairseq, HF ``generate(num_beams=...)``); output as ``greedy_decode``'s.

        Every sentence keeps ``beam_size`` alive beams ranked by their summed token log-probability.
        Each step feeds one token per beam (KV caches), scores all beam x vocab continuations, takes
        the sentence's best ``2 * beam_size`` with one topk, moves those that end in EOS *and* rank
        among the first ``beam_size`` into the sentence's pool of finished hypotheses, continues with
        the best ``beam_size`` others and reorders the caches to follow them. Finished hypotheses are
        ranked by ``sum_logprob / gnmt_length_penalty(len, length_penalty)``, ``len`` counting the
        generated tokens with EOS, without BOS. A sentence is done once ``beam_size`` hypotheses have
        finished (fairseq's rule, HF's ``early_stopping=True``); the search stops when all are done or
        after ``max_len`` tokens. Each sentence returns its best finished hypothesis or, if none
        finished, its best beam of ``max_len`` tokens. With ``beam_size=1`` this is greedy decoding.
        """
        if beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {beam_size}")
        batch, vocab, device = src.shape[0], self.cfg.vocab_size, src.device
        memory = self.encode(src, src_padding_mask).repeat_interleave(beam_size, dim=0)  # row b * beam_size + k
        if src_padding_mask is not None:
            src_padding_mask = src_padding_mask.repeat_interleave(beam_size, dim=0)
        caches = self.decoder.new_caches()
        score_dtype = torch.promote_types(memory.dtype, torch.float32)  # sums of log-probs: never below float32
        neg_inf = float("-inf")

        alive_tokens = torch.full((batch, beam_size, 1), bos_id, dtype=torch.long, device=device)  # BOS first
        # the beams start identical: only the first is expanded, or step 1 would pick the same token beam_size times
        alive_scores = torch.full((batch, beam_size), neg_inf, dtype=score_dtype, device=device)
        alive_scores[:, 0] = 0.0
        # each sentence's finished hypotheses, best first; score -inf = empty slot (probability-0 ones never count)
        finished_tokens = torch.full((batch, beam_size, max_len), eos_id, dtype=torch.long, device=device)
        finished_scores = torch.full((batch, beam_size), neg_inf, dtype=score_dtype, device=device)
        first_row = torch.arange(batch, device=device)[:, None] * beam_size  # flat row of each sentence's beam 0
        n_candidates = min(2 * beam_size, beam_size * vocab)  # at most one EOS per beam: >= beam_size others

        for step in range(1, max_len + 1):  # step = tokens generated, including this one
            done = finished_scores[:, -1].isfinite()
            if done.all():
                break
            logits = self.decode(alive_tokens[:, :, -1].reshape(-1, 1), memory, src_padding_mask, caches)[:, -1]
            log_probs = F.log_softmax(logits.to(score_dtype), dim=-1).view(batch, beam_size, vocab)
            candidate_scores = (alive_scores[:, :, None] + log_probs).view(batch, beam_size * vocab)
            top_scores, top_ids = candidate_scores.topk(n_candidates, dim=1)
            top_beams, top_tokens = top_ids // vocab, top_ids % vocab
            parents = alive_tokens.gather(1, top_beams[:, :, None].expand(-1, -1, step))
            top_sequences = torch.cat([parents, top_tokens[:, :, None]], dim=2)  # (B, n_candidates, step + 1)

            ends = top_tokens == eos_id
            finishing = ends & ~done[:, None]
            finishing[:, beam_size:] = False  # an EOS ranked below beam_size does not finish (fairseq, HF)
            new_scores = (top_scores / gnmt_length_penalty(step, length_penalty)).masked_fill(~finishing, neg_inf)
            new_tokens = F.pad(top_sequences[:, :, 1:], (0, max_len - step), value=eos_id)
            finished_scores, keep = torch.cat([finished_scores, new_scores], dim=1).topk(beam_size, dim=1)
            pool = torch.cat([finished_tokens, new_tokens], dim=1)
            finished_tokens = pool.gather(1, keep[:, :, None].expand(-1, -1, max_len))

            alive_scores, keep = top_scores.masked_fill(ends, neg_inf).topk(beam_size, dim=1)
            alive_tokens = top_sequences.gather(1, keep[:, :, None].expand(-1, -1, step + 1))
            parent_rows = (first_row + top_beams.gather(1, keep)).flatten()
            for cache in caches:
                cache.reorder(parent_rows)

        best = finished_tokens[:, 0]
        none_finished = finished_scores[:, 0].isneginf()
        if none_finished.any():  # then no early stop: the beams hold max_len tokens, all equally penalised
            best = torch.where(none_finished[:, None], alive_tokens[:, 0, 1:], best)
        is_eos = (best == eos_id).long()
        in_hypothesis = is_eos.cumsum(dim=1) - is_eos == 0  # up to and including the first EOS
        return best[:, : int(in_hypothesis.any(dim=0).sum())]  # the longest hypothesis
