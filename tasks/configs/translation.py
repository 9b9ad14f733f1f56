"""The configs of the two translation tasks: ``translation`` (two generated languages) and
``translation_text`` (real parallel text), their shared decoding settings, and the margin and
saturation of their headline BLEU. Their Lightning code is in ``tasks.translation`` and
``tasks.translation_text``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..data.synthetic_translation import MAX_SENTENCE_WORDS, translation_vocab
from ..data.text import ParallelData
from ..data.tokenizer import TokenizerConfig
from ..metrics import Margin, Metric, Saturation
from .base import EmbeddedTaskConfig, RealDataTaskConfig, TaskConfig
from .lens import LogitLensConfig

#: the margin and the saturation of the translation tasks' headline BLEU (``translation`` and ``translation_text``)
BLEU_MARGIN = Margin(
    value=1.0,
    relative=False,
    reason="one BLEU point: smaller BLEU differences often disagree with human judgements of the translations "
    "(Mathur et al. 2020), so they are not counted as improvements",
)
BLEU_SATURATION = Saturation(
    distance=0.5,
    of="best",
    reason="within half a BLEU point of 100 both models translate nearly every sentence exactly: BLEU cannot rank them",
)


class DecodingConfig(LogitLensConfig, TaskConfig):
    """Evaluation shared by the translation tasks: greedy (beam 1) or beam search decoding, the logit lens."""

    beam_size: int = Field(1, ge=1, description="1: greedy decoding; more: beam search")
    length_penalty: float = Field(
        0.6, ge=0, description="beam search: GNMT length penalty exponent (0: raw log-probability)"
    )


class TranslationTaskConfig(DecodingConfig, EmbeddedTaskConfig):
    family = "encoder_decoder"
    throughput_unit = "target tokens"
    description = "encoder-decoder translation between two generated languages with reordering and agreement"
    baseline_description = (
        "word-by-word translation: each source word into its target form most frequent in training, "
        "in the source's word order (no reordering, no agreement)"
    )
    metrics = (
        Metric(
            name="bleu", higher_is_better=True, low=0, high=100, description="corpus BLEU (sacrebleu), greedy decoding"
        ),
        Metric(
            name="exact_match", higher_is_better=True, low=0, high=1, description="share of translations exactly right"
        ),
        Metric(name="loss", higher_is_better=False, description="validation cross-entropy (teacher forcing)", low=0),
    )

    margin = BLEU_MARGIN
    saturation = BLEU_SATURATION
    harder = "nested relative clauses (task.max_depth: 2 with task.max_len: 40)"

    name: Literal["translation"] = "translation"
    n_train: int = Field(40_000, gt=0, description="training sentence pairs")
    n_val: int = Field(
        512, gt=0, description="validation sentence pairs (greedy-decoded for BLEU); the tuning split has as many"
    )
    max_len: int = Field(
        24,
        ge=MAX_SENTENCE_WORDS + 2,
        description="padded tokens per sentence, BOS/EOS included (with relative clauses, longer pairs are redrawn)",
    )
    max_depth: int = Field(
        0, ge=0, description="nesting depth of relative clauses (0: none; harder: more, with a larger max_len)"
    )
    label_smoothing: float = Field(
        0.1, ge=0, lt=1, description="label smoothing of the training loss (not of validation)"
    )

    def model_overrides(self) -> dict[str, Any]:
        vocab = translation_vocab(relative_clauses=self.max_depth > 0)
        return {"family": self.family, "vocab_size": len(vocab), "max_seq_len": self.max_len}


class TextTranslationTaskConfig(DecodingConfig, RealDataTaskConfig):
    family = "encoder_decoder"
    throughput_unit = "target tokens"
    description = (
        "encoder-decoder translation of real parallel text (HF hub dataset or local files), shared tiktoken BPE"
    )
    baseline_description = "copying the source sentence as its translation"
    metrics = (
        Metric(
            name="bleu",
            higher_is_better=True,
            low=0,
            high=100,
            description="corpus BLEU (sacrebleu) of the detokenized output",
        ),
        Metric(name="loss", higher_is_better=False, description="validation cross-entropy (teacher forcing)", low=0),
    )
    data_decided_fields = ("vocab_size",)
    margin = BLEU_MARGIN
    saturation = BLEU_SATURATION

    name: Literal["translation_text"] = "translation_text"
    data: ParallelData
    tokenizer: TokenizerConfig = TokenizerConfig()
    max_len: int = Field(
        128, ge=3, description="tokens per sentence, BOS/EOS included; longer training pairs are dropped"
    )
    label_smoothing: float = Field(
        0.1, ge=0, lt=1, description="label smoothing of the training loss (not of validation)"
    )
    max_val_pairs: int | None = Field(
        None, gt=0, description="decode at most this many validation (or tuning) pairs (null: all)"
    )
    beam_size: int = Field(4, ge=1, description="1: greedy decoding; more: beam search")

    def model_overrides(self) -> dict[str, Any]:
        return {"family": self.family, "max_seq_len": self.max_len}
