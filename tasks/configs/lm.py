"""The configs of the two language-modelling tasks: ``lm`` (the embedded agreement language) and
``lm_text`` (real text), and the margin of their headline perplexity. Their Lightning code is in
``tasks.lm`` and ``tasks.lm_text``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from blockbench.models import ModelConfig, extrapolating_pos_encodings

from ..data.agreement import agreement_vocab
from ..data.text import TextData
from ..data.tokenizer import TokenizerConfig
from ..metrics import Margin, Metric, Saturation
from .base import EmbeddedTaskConfig, RealDataTaskConfig
from .lens import LogitLensConfig

#: the margin of the LM tasks' headline perplexity (``lm`` and ``lm_text``)
PERPLEXITY_MARGIN = Margin(
    value=0.01,
    relative=True,
    reason="a 1% perplexity ratio, 0.01 nats per token: language-modelling work does not count smaller gains as "
    "improvements, and none would be a reason to choose one block over another",
)


class LMTaskConfig(LogitLensConfig, EmbeddedTaskConfig):
    family = "decoder_lm"
    throughput_unit = "tokens"
    description = "decoder-only LM on a generated language with long-range subject-verb agreement"
    baseline_description = (
        "a unigram model (perplexity = exp of the unigram entropy of the training tokens) and, "
        "for agreement, always choosing the verb form that is more frequent in training; beside them the "
        "entropy floor, the loss and perplexity of the true conditional distribution (the best possible model)"
    )
    metrics = (
        Metric(name="perplexity", higher_is_better=False, description="validation perplexity", low=1, exp_of_loss=True),
        Metric(name="agreement_acc", higher_is_better=True, description="agreeing verb form preferred", low=0, high=1),
        Metric(name="loss", higher_is_better=False, description="validation cross-entropy (nats/token)", low=0),
        Metric(
            name="excess_loss",
            higher_is_better=False,
            description="validation loss above the language's entropy floor (nats/token; 0: the best possible model)",
        ),
        Metric(
            name="gap_closed",
            higher_is_better=True,
            description="share of the gap from the unigram baseline's loss to the entropy floor the model closed",
        ),
    )

    margin = PERPLEXITY_MARGIN
    harder = (
        "a deeper grammar (task.max_depth: 4), or real text, which never saturates (an lm_text entry read "
        "byte by byte, as in configs/matrix/prenorm_vs_postnorm_ladder.yaml)"
    )
    saturation = Saturation(
        distance=0.03,
        of="floor",
        reason="within 0.03 nats per token (3% perplexity) of the grammar's entropy floor both models are close to "
        "the true distribution: the little loss left cannot rank them",
    )

    name: Literal["lm"] = "lm"
    seq_len: int = Field(64, gt=1, description="training context length")
    eval_seq_len: int | None = Field(
        None, gt=1, description="validation context length; longer than seq_len tests length extrapolation"
    )
    n_train_tokens: int = Field(400_000, gt=0, description="tokens of generated training text")
    n_val_tokens: int = Field(
        16_384, gt=0, description="tokens of generated validation text (another stream; the tuning text is as long)"
    )
    n_probes: int = Field(512, gt=0, description="held-out sentences for the agreement accuracy")
    max_depth: int = Field(2, ge=1, description="nesting depth of relative clauses / prepositional phrases")

    def model_overrides(self) -> dict[str, Any]:
        return {"family": self.family, "vocab_size": len(agreement_vocab()), "max_seq_len": self.seq_len}

    def check_model(self, model: ModelConfig) -> None:
        usable = extrapolating_pos_encodings()
        if self.eval_seq_len and self.eval_seq_len > self.seq_len and model.pos_encoding not in usable:
            raise ValueError(
                f"task.eval_seq_len={self.eval_seq_len} exceeds task.seq_len={self.seq_len}, but "
                f"model.pos_encoding={model.pos_encoding} cannot extrapolate beyond its training length; "
                f"use one of: {', '.join(usable)}"
            )


class TextLMTaskConfig(LogitLensConfig, RealDataTaskConfig):
    family = "decoder_lm"
    throughput_unit = "tokens"
    description = "decoder-only LM on real text (HF hub dataset or local files), tiktoken BPE"
    baseline_description = "an add-one unigram model of the training tokens, scored on the validation tokens"
    metrics = (
        Metric(
            name="perplexity",
            higher_is_better=False,
            description="validation perplexity (per token)",
            low=1,
            exp_of_loss=True,
        ),
        Metric(
            name="bits_per_byte", higher_is_better=False, low=0, description="validation loss in bits per UTF-8 byte"
        ),
        Metric(name="loss", higher_is_better=False, description="validation cross-entropy (nats/token)", low=0),
    )
    data_decided_fields = ("vocab_size",)
    margin = PERPLEXITY_MARGIN  # real text has no known entropy floor: its perplexity is never saturated

    name: Literal["lm_text"] = "lm_text"
    data: TextData
    tokenizer: TokenizerConfig = TokenizerConfig()
    seq_len: int = Field(256, gt=1, description="training and validation context length")
    max_val_tokens: int | None = Field(
        1_000_000, gt=0, description="validate on at most this many held-out tokens (null: all of them), tuning too"
    )

    def model_overrides(self) -> dict[str, Any]:
        return {"family": self.family, "max_seq_len": self.seq_len}
