"""Translation between two generated languages (``task.name: translation``).

The encoder-decoder is trained with teacher forcing and label smoothing and evaluated by greedy
decoding (or beam search: ``task.beam_size``). Metrics: corpus BLEU with sacrebleu (its
signature is recorded) and exact match. Baseline: the BLEU and exact match of word-by-word
translation (each source word into its most frequent target form, source order kept); copying
the source would score zero, as the two languages share no word. With ``task.logit_lens`` (the
default), validation also logs each decoder block's logit-lens loss (``tasks.lens``).

``TranslationTask`` (the LightningModule) also serves the real-data task
(``tasks.translation_text``): a datamodule provides ``special_ids``, ``hypothesis_text`` and
``reference_text``.

The task's config, ``TranslationTaskConfig``, is in ``tasks.configs.translation`` (validation imports it without this
module's Lightning code); ``build_translation`` below is the builder its ``build`` looks up (``tasks.builders``).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, NamedTuple

import torch
from sacrebleu.metrics import BLEU
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric

from blockbench.models import ModelConfig, beam_search, greedy_decode, logit_lens_depth, logit_lens_losses

from .base import TaskDataModule, TaskModule
from .builders import builds
from .configs.base import OptimizerConfig
from .configs.translation import TranslationTaskConfig
from .data.synthetic_translation import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    ParallelCorpus,
    generate_parallel_corpus,
    word_by_word_translations,
)
from .lens import LensLosses


def teacher_forcing_loss(
    model: torch.nn.Module,
    src: torch.Tensor,
    tgt: torch.Tensor,
    *,
    pad_id: int,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of predicting ``tgt[:, 1:]`` from ``src`` and ``tgt[:, :-1]`` (BOS first), padding
    ``pad_id`` masked in the source and ignored in the targets.

    The decoder inputs without a target (padding, and the EOS that a row shorter than the batch
    feeds) are the decoder's padding: its MoE layers route only the others, exactly the inputs a
    row alone would feed."""
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    return model.loss(
        src,
        tgt_in,
        tgt_out,
        src_padding_mask=src == pad_id,
        tgt_padding_mask=tgt_out == pad_id,
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
        reduction=reduction,
    )


def teacher_forcing_lens(
    model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor, *, pad_id: int, reduction: str = "mean"
) -> list[torch.Tensor]:
    """The logit lens of :func:`teacher_forcing_loss` without label smoothing: its loss at the output of
    every decoder block, with the same inputs, masks and ignored targets; the last block's is the loss."""
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    return logit_lens_losses(
        model,
        src,
        tgt_in,
        src == pad_id,
        tgt_padding_mask=tgt_out == pad_id,
        targets=tgt_out,
        ignore_index=pad_id,
        reduction=reduction,
    )


def corpus_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
    """sacrebleu corpus BLEU (default 13a tokenization, one reference) and its signature string."""
    bleu = BLEU()
    return bleu.corpus_score(hypotheses, [references]).score, str(bleu.get_signature())


def exact_match(hypotheses: list[str], references: list[str]) -> float:
    return sum(h == r for h, r in zip(hypotheses, references, strict=True)) / max(1, len(references))


class SpecialIds(NamedTuple):
    pad: int
    bos: int
    eos: int


class TranslationDataModule(TaskDataModule):
    """What ``TranslationTask`` needs from its data: batches ``(src, tgt, index)`` padded with
    ``special_ids.pad`` (tgt starts with BOS and ends with EOS) and the texts for BLEU."""

    @abstractmethod
    def hypothesis_text(self, ids: list[int]) -> str:
        """Detokenized text of decoded ids (up to the first EOS)."""

    @abstractmethod
    def reference_text(self, index: int) -> str:
        """The reference translation of validation pair ``index``."""


class ParallelDataModule(TranslationDataModule):
    """The generated sentence pairs of the ``translation`` task of a run with training seed ``seed``:
    drawn from the task's data seed for it (``data_seed_for``)."""

    def __init__(self, cfg: TranslationTaskConfig, batch_size: int, *, seed: int = 0):
        super().__init__(batch_size)
        self.cfg = cfg
        self.data_seed = cfg.data_seed_for(seed)
        self.corpus: ParallelCorpus | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.corpus is not None:
            return
        self.corpus = generate_parallel_corpus(
            n_train=self.cfg.n_train,
            n_val=self.cfg.n_val,
            max_len=self.cfg.max_len,
            seed=self.data_seed,
            held_out=self.cfg.eval_split,
            max_depth=self.cfg.max_depth,
        )

    def _dataset(self, split: str) -> TensorDataset:
        assert self.corpus is not None, "call setup() first"
        pairs = getattr(self.corpus, split)
        # the row index lets validation look up the reference text of each pair
        return TensorDataset(torch.from_numpy(pairs.src), torch.from_numpy(pairs.tgt), torch.arange(len(pairs.src)))

    def train_dataloader(self) -> DataLoader:
        return self.training_loader(self._dataset("train"))

    def val_dataloader(self) -> DataLoader:
        return self.validation_loader(self._dataset("val"))

    def hypothesis_text(self, ids: list[int]) -> str:
        return self.corpus.decode(ids)

    def reference_text(self, index: int) -> str:
        return self.corpus.val.tgt_text[index]

    def baselines(self) -> dict[str, float]:
        assert self.corpus is not None, "call setup() first"
        hypotheses, references = word_by_word_translations(self.corpus), self.corpus.val.tgt_text
        return {"bleu": corpus_bleu(hypotheses, references)[0], "exact_match": exact_match(hypotheses, references)}


class TranslationTask(TaskModule):
    def __init__(
        self,
        model: ModelConfig,
        optimizer: OptimizerConfig,
        max_steps: int,
        *,
        label_smoothing: float,
        max_len: int,
        special_ids: SpecialIds,
        beam_size: int = 1,
        length_penalty: float = 0.6,
        logit_lens: bool = True,
    ):
        super().__init__(model, optimizer, max_steps)
        self.label_smoothing = label_smoothing
        self.max_len = max_len
        self.ids = special_ids
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        self.val_loss = MeanMetric()
        self.lens = LensLosses(logit_lens_depth(self.model)) if logit_lens else None
        #: (validation pair index, detokenized translation) of this process's share of the set
        self.translations: list[tuple[int, str]] = []
        self.bleu_signature = ""

    def items_in_batch(self, batch: Any) -> torch.Tensor:
        """Target tokens, as a device tensor: the speed monitor reads it at log steps (no host sync per step)."""
        return (batch[1][:, 1:] != self.ids.pad).sum()

    def _loss(
        self, src: torch.Tensor, tgt: torch.Tensor, label_smoothing: float, reduction: str = "mean"
    ) -> torch.Tensor:
        return teacher_forcing_loss(
            self.model, src, tgt, pad_id=self.ids.pad, label_smoothing=label_smoothing, reduction=reduction
        )

    def translate(self, src: torch.Tensor) -> torch.Tensor:
        """Decoded target ids (no BOS; EOS-padded after the first EOS): greedy or beam search."""
        ids, mask = self.ids, src == self.ids.pad
        if self.beam_size == 1:
            return greedy_decode(
                self.model, src, bos_id=ids.bos, eos_id=ids.eos, max_len=self.max_len, src_padding_mask=mask
            )
        return beam_search(
            self.model,
            src,
            bos_id=ids.bos,
            eos_id=ids.eos,
            max_len=self.max_len,
            beam_size=self.beam_size,
            length_penalty=self.length_penalty,
            src_padding_mask=mask,
        )

    def training_loss(self, batch: Any) -> torch.Tensor:
        src, tgt, _ = batch
        if self._trainer is None or self.trainer.world_size == 1:
            return self._loss(src, tgt, self.label_smoothing)
        # Processes hold different numbers of target tokens: normalise by the global count (as
        # fairseq does), so that DDP's mean over processes is the mean over every token of the
        # global batch, as with one process.
        tokens = (tgt[:, 1:] != self.ids.pad).sum()
        global_tokens = self.trainer.strategy.reduce(tokens.float(), reduce_op="sum")
        return self._loss(src, tgt, self.label_smoothing, reduction="sum") * self.trainer.world_size / global_tokens

    def validation_loss(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        src, tgt, _ = batch
        return self._loss(src, tgt, 0.0), (tgt[:, 1:] != self.ids.pad).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        src, tgt, index = batch
        n_targets = (tgt[:, 1:] != self.ids.pad).sum()
        if self.lens is None:
            loss, _ = self.validation_loss(batch)
        else:  # the same forward: the last decoder block's lens loss is the validation loss
            lens = teacher_forcing_lens(self.model, src, tgt, pad_id=self.ids.pad)
            self.lens.update(lens, weight=n_targets)
            loss = lens[-1]
        self.val_loss.update(loss, weight=n_targets)
        data: TranslationDataModule = self.trainer.datamodule
        for i, row in zip(index.tolist(), self.translate(src).tolist(), strict=True):
            self.translations.append(
                (i, data.hypothesis_text(row[: row.index(self.ids.eos)] if self.ids.eos in row else row))
            )

    def result_extras(self) -> dict[str, Any]:
        return {**super().result_extras(), "bleu_signature": self.bleu_signature}

    def _all_translations(self) -> list[tuple[int, str]]:
        """Every process's translations, in validation order: BLEU is over the whole set."""
        translations = self.translations
        if self.trainer.world_size > 1:
            shares: list[list[tuple[int, str]]] = [[] for _ in range(self.trainer.world_size)]
            torch.distributed.all_gather_object(shares, translations)
            translations = [pair for share in shares for pair in share]
        return sorted(translations)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        data: TranslationDataModule = self.trainer.datamodule
        translations = self._all_translations()
        hypotheses = [text for _, text in translations]
        references = [data.reference_text(i) for i, _ in translations]
        bleu, self.bleu_signature = corpus_bleu(hypotheses, references)
        lens = self.lens.pop() if self.lens is not None else {}
        self.log_validation(
            {"loss": self.val_loss.compute(), "bleu": bleu, "exact_match": exact_match(hypotheses, references), **lens}
        )
        self.val_loss.reset()
        self.translations = []


@builds(TranslationTaskConfig)
def build_translation(
    cfg: TranslationTaskConfig,
    model: ModelConfig,
    optimizer: OptimizerConfig,
    *,
    max_steps: int,
    batch_size: int,
    seed: int = 0,
) -> tuple[TranslationTask, ParallelDataModule]:
    """The ``translation`` task's LightningModule and DataModule (``TaskConfig.build``)."""
    task = TranslationTask(
        model,
        optimizer,
        max_steps,
        label_smoothing=cfg.label_smoothing,
        max_len=cfg.max_len,
        special_ids=SpecialIds(PAD_ID, BOS_ID, EOS_ID),
        beam_size=cfg.beam_size,
        length_penalty=cfg.length_penalty,
        logit_lens=cfg.logit_lens,
    )
    return task, ParallelDataModule(cfg, batch_size, seed=seed)
