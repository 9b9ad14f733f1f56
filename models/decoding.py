"""Decoding: the search algorithms that turn a trained model into token sequences.

The families hold the forward pass and the one incremental step these functions need (as
nanoGPT's model file does; litgpt keeps its ``generate/`` apart from ``model.py`` the same way):

- ``DecoderLM``: ``model(idx, caches=...)`` feeds the tokens after the cached ones, ``new_caches()``;
- ``EncoderDecoder``: ``encode(src, mask)`` once, then ``decode(tgt, memory, mask, caches)`` per step,
  ``new_caches()``.

Here are the loops around them: ``generate`` (prompt prefill, then one token per step, greedy or
temperature / top-k sampling) for the LM, ``greedy_decode`` and ``beam_search`` (with the GNMT
length penalty) for the translator.

    from blockbench.models import beam_search, generate
    sample = generate(lm, prompt, 20, temperature=0.8, top_k=50)
    translation = beam_search(translator, src, bos_id=1, eos_id=2, max_len=40, src_padding_mask=mask)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # annotations only
    from .lm import DecoderLM
    from .translator import EncoderDecoder


# --------------------------------------------------------------------------- decoder-only LM


def sample_next_token(
    logits: torch.Tensor, temperature: float, top_k: int | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One token per row (B, 1) from next-token ``logits`` (B, vocab): the argmax for
    ``temperature=0``, else a draw from softmax(logits / temperature), restricted to the ``top_k``
    largest logits if given (ties with the k-th are kept)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


@torch.no_grad()
def generate(
    model: DecoderLM,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """``idx`` (B, T) with ``max_new_tokens`` tokens appended; ``temperature=0`` is greedy decoding
    (see ``sample_next_token``). With ``use_cache`` the prompt is fed once (prefill) and then each
    step feeds only the newest token (same result, less work). Learned positions end at
    ``max_seq_len``: once the cache holds that many, the model restarts on the last ``max_seq_len``
    tokens (every step does so without the cache)."""
    extrapolates, window = model.positions.extrapolates, model.cfg.max_seq_len
    caches = None
    for _ in range(max_new_tokens):
        if caches is not None and (extrapolates or caches[0].self_attn.length < window):
            logits = model(idx[:, -1:], caches=caches)[:, -1, :]
        else:  # first step, or learned positions used up: restart on the last max_seq_len tokens
            caches = model.new_caches() if use_cache else None
            context = idx if extrapolates else idx[:, -window:]
            logits = model(context, caches=caches)[:, -1, :]
        idx = torch.cat([idx, sample_next_token(logits, temperature, top_k, generator)], dim=1)
    return idx


# --------------------------------------------------------------------------- encoder-decoder


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoder,
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
    memory = model.encode(src, src_padding_mask)
    out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    caches = model.new_caches() if use_cache else None
    for _ in range(max_len):
        step_input = out[:, -1:] if use_cache else out
        next_token = model.decode(step_input, memory, src_padding_mask, caches)[:, -1].argmax(-1)
        next_token = next_token.masked_fill(finished, eos_id)
        out = torch.cat([out, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return out[:, 1:]


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016); a hypothesis' summed
    log-probability is divided by it, so alpha > 0 favours longer outputs and alpha = 0 leaves raw sums."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(
    model: EncoderDecoder,
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
    batch, vocab, device = src.shape[0], model.cfg.vocab_size, src.device
    memory = model.encode(src, src_padding_mask).repeat_interleave(beam_size, dim=0)  # row b * beam_size + k
    if src_padding_mask is not None:
        src_padding_mask = src_padding_mask.repeat_interleave(beam_size, dim=0)
    caches = model.new_caches()
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
        logits = model.decode(alive_tokens[:, :, -1].reshape(-1, 1), memory, src_padding_mask, caches)[:, -1]
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
        finished_tokens, finished_scores = _keep_best(finished_tokens, finished_scores, new_tokens, new_scores)

        alive_scores, keep = top_scores.masked_fill(ends, neg_inf).topk(beam_size, dim=1)
        alive_tokens = top_sequences.gather(1, keep[:, :, None].expand(-1, -1, step + 1))
        parent_rows = (first_row + top_beams.gather(1, keep)).flatten()
        for cache in caches:
            cache.reorder(parent_rows)

    return _best_hypotheses(finished_tokens, finished_scores, alive_tokens, eos_id)


def _keep_best(
    tokens: torch.Tensor, scores: torch.Tensor, new_tokens: torch.Tensor, new_scores: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A sentence's pool of finished hypotheses (B, beam, max_len) with its new candidates: the best
    ``beam`` of both, best first (candidates that do not finish carry score -inf)."""
    scores, keep = torch.cat([scores, new_scores], dim=1).topk(tokens.shape[1], dim=1)
    pool = torch.cat([tokens, new_tokens], dim=1)
    return pool.gather(1, keep[:, :, None].expand(-1, -1, tokens.shape[2])), scores


def _best_hypotheses(
    finished_tokens: torch.Tensor, finished_scores: torch.Tensor, alive_tokens: torch.Tensor, eos_id: int
) -> torch.Tensor:
    """Each sentence's best finished hypothesis, or its best alive beam (without BOS) if none
    finished, cut to the longest hypothesis (EOS-padded after each row's first EOS)."""
    best = finished_tokens[:, 0]
    none_finished = finished_scores[:, 0].isneginf()
    if none_finished.any():  # then no early stop: the beams hold max_len tokens, all equally penalised
        best = torch.where(none_finished[:, None], alive_tokens[:, 0, 1:], best)
    is_eos = (best == eos_id).long()
    in_hypothesis = is_eos.cumsum(dim=1) - is_eos == 0  # up to and including the first EOS
    return best[:, : int(in_hypothesis.any(dim=0).sum())]  # the longest hypothesis
