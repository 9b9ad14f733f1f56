"""Translation between two generated languages (``task.name: translation``).

The encoder-decoder is trained with teacher forcing and label smoothing and evaluated by greedy
decoding. Metrics: corpus BLEU with sacrebleu (its signature is recorded) and exact match.
Baseline: the BLEU and exact match of copying the source sentence as the translation.
"""

from __future__ import annotations

from typing import Any, Literal

from sacrebleu.metrics import BLEU
import torch
import torch.nn.functional as F
from pydantic import Field
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric

from models import ModelConfig

from .base import Metric, OptimizerConfig, TaskConfig, TaskDataModule, TaskModule
from .data.synthetic_translation import (
    BOS_ID,
    EOS_ID,
    MAX_SENTENCE_WORDS,
    PAD_ID,
    ParallelCorpus,
    generate_parallel_corpus,
    translation_vocab,
)


def corpus_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
    """sacrebleu corpus BLEU (default 13a tokenization, one reference) and its signature string."""
    bleu = BLEU()
    return bleu.corpus_score(hypotheses, [references]).score, str(bleu.get_signature())


def exact_match(hypotheses: list[str], references: list[str]) -> float:
    return sum(h == r for h, r in zip(hypotheses, references, strict=True)) / max(1, len(references))


class TranslationTaskConfig(TaskConfig):
    family = "encoder_decoder"
    throughput_unit = "target tokens"
    description = "encoder-decoder translation between two generated languages with reordering and agreement"
    baseline_description = (
        "copying the source sentence as its translation"
    )
    metrics = (
        Metric(name="bleu", higher_is_better=True, description="corpus BLEU (sacrebleu), greedy decoding"),
        Metric(name="exact_match", higher_is_better=True, description="share of translations exactly right"),
        Metric(name="loss", higher_is_better=False, description="validation cross-entropy (teacher forcing)"),
    )

    name: Literal["translation"] = "translation"
    n_train: int = Field(40_000, gt=0, description="training sentence pairs")
    n_val: int = Field(512, gt=0, description="validation sentence pairs (greedy-decoded for BLEU)")
    max_len: int = Field(
        24, ge=MAX_SENTENCE_WORDS + 2, description="padded tokens per sentence, BOS/EOS included"
    )
    label_smoothing: float = Field(0.1, ge=0, lt=1)

    def model_overrides(self) -> dict[str, Any]:
        return {"family": self.family, "vocab_size": len(translation_vocab()), "max_seq_len": self.max_len}

    def build(self, model: ModelConfig, optimizer: OptimizerConfig, *, max_steps: int, batch_size: int):
        task = TranslationTask(model, optimizer, max_steps, label_smoothing=self.label_smoothing, max_len=self.max_len)
        return task, ParallelDataModule(self, batch_size)


class ParallelDataModule(TaskDataModule):
    def __init__(self, cfg: TranslationTaskConfig, batch_size: int):
        super().__init__(batch_size)
        self.cfg = cfg
        self.corpus: ParallelCorpus | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.corpus is not None:
            return
        self.corpus = generate_parallel_corpus(
            n_train=self.cfg.n_train, n_val=self.cfg.n_val, max_len=self.cfg.max_len, seed=self.cfg.data_seed
        )

    def _dataset(self, split: str) -> TensorDataset:
        assert self.corpus is not None, "call setup() first"
        pairs = getattr(self.corpus, split)
        # the row index lets validation look up the reference text of each pair
        return TensorDataset(torch.from_numpy(pairs.src), torch.from_numpy(pairs.tgt), torch.arange(len(pairs.src)))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self._dataset("train"), batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._dataset("val"), batch_size=self.batch_size)

    def baselines(self) -> dict[str, float]:
        assert self.corpus is not None, "call setup() first"
        val = self.corpus.val
        return {
            "bleu": corpus_bleu(val.src_text, val.tgt_text)[0],
            "exact_match": exact_match(val.src_text, val.tgt_text),
        }


class TranslationTask(TaskModule):
    def __init__(self, model: ModelConfig, optimizer: OptimizerConfig, max_steps: int, *, label_smoothing: float, max_len: int):
        super().__init__(model, optimizer, max_steps)
        self.label_smoothing = label_smoothing
        self.max_len = max_len
        self.val_loss = MeanMetric()
        self.hypotheses: list[str] = []
        self.bleu_signature = ""
        self.references: list[str] = []

    def items_in_batch(self, batch: Any) -> int:
        return int((batch[1][:, 1:] != PAD_ID).sum())

    def _loss(self, src: torch.Tensor, tgt: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        logits = self.model(src, tgt[:, :-1], src_padding_mask=src == PAD_ID)
        return F.cross_entropy(
            logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD_ID, label_smoothing=label_smoothing
        )

    def training_loss(self, batch: Any) -> torch.Tensor:
        src, tgt, _ = batch
        return self._loss(src, tgt, self.label_smoothing)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        src, tgt, index = batch
        self.val_loss.update(self._loss(src, tgt, 0.0), weight=(tgt[:, 1:] != PAD_ID).sum())
        decoded = self.model.greedy_decode(
            src, bos_id=BOS_ID, eos_id=EOS_ID, max_len=self.max_len, src_padding_mask=src == PAD_ID
        )
        corpus = self.trainer.datamodule.corpus
        self.hypotheses += [corpus.decode(row) for row in decoded.tolist()]
        self.references += [corpus.val.tgt_text[i] for i in index.tolist()]

    def result_extras(self) -> dict[str, Any]:
        return {**super().result_extras(), "bleu_signature": self.bleu_signature}

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        bleu, self.bleu_signature = corpus_bleu(self.hypotheses, self.references)
        self.log_validation(
            {
                "loss": self.val_loss.compute(),
                "bleu": bleu,
                "exact_match": exact_match(self.hypotheses, self.references),
            }
        )
        self.val_loss.reset()
        self.hypotheses, self.references = [], []
