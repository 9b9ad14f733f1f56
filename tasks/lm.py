"""Language modelling on the embedded agreement language (``task.name: lm``).

Metrics: validation loss, perplexity, and targeted agreement accuracy: on held-out sentences,
does the model give the verb form that agrees with the (distant) head noun a higher logit than
the other form? Baselines: the unigram perplexity and the majority verb form. With
``task.logit_lens`` (the default), validation also logs each block's logit-lens loss (``tasks.lens``).

The language's entropy floor is known exactly (``data.agreement_floor``): the loss of the true
conditional distribution on the validation rows, each token predicted from the earlier tokens of
its row as the model predicts it. It is recorded with the baselines (``loss_floor``,
``perplexity_floor``), and every validation logs the model's ``excess_loss`` over it and
``gap_closed``, the share of the way from the unigram baseline's loss down to the floor.

The task's config, ``LMTaskConfig``, is in ``tasks.configs.lm`` (validation imports it without this
module's Lightning code); ``build_lm`` below is the builder its ``build`` looks up (``tasks.builders``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric

from blockbench.models import ModelConfig, logit_lens_depth, logit_lens_losses

from .base import TaskDataModule, TaskModule
from .builders import builds
from .configs.base import OptimizerConfig
from .configs.lm import LMTaskConfig
from .data.agreement import AgreementCorpus, generate_agreement_corpus, unigram_entropy
from .data.agreement_floor import grammar_automaton
from .lens import LensLosses


@dataclass(frozen=True)
class LossFloor:
    """Where the LM's validation loss is measured from: the entropy floor of the validation rows
    (nats per target token of the true conditional distribution, given each token's earlier tokens
    in its row, as the model sees them), the same with the whole stream before each token in view
    (lower: a row's first tokens lack their sentence's start), and the unigram baseline's loss."""

    loss: float
    full_context: float
    unigram: float

    def excess(self, loss: torch.Tensor) -> torch.Tensor:
        """The validation loss above the floor (nats/token)."""
        return loss - self.loss

    def gap_closed(self, loss: torch.Tensor) -> torch.Tensor:
        """``(unigram - loss) / (unigram - floor)``: 0 at the unigram baseline, 1 at the floor."""
        return (self.unigram - loss) / (self.unigram - self.loss)


def _blocks(stream: np.ndarray, length: int) -> torch.Tensor:
    """Cut a token stream into non-overlapping rows of ``length`` tokens."""
    n = len(stream) // length
    return torch.from_numpy(stream[: n * length].reshape(n, length).astype(np.int64))


class AgreementDataModule(TaskDataModule):
    """The generated text of the ``lm`` task of a run with training seed ``seed``: drawn from the
    task's data seed for it (``data_seed_for``)."""

    def __init__(self, cfg: LMTaskConfig, batch_size: int, *, seed: int = 0):
        super().__init__(batch_size)
        self.cfg = cfg
        self.data_seed = cfg.data_seed_for(seed)
        self.corpus: AgreementCorpus | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.corpus is not None:
            return
        self.corpus = generate_agreement_corpus(
            n_train_tokens=self.cfg.n_train_tokens,
            n_val_tokens=self.cfg.n_val_tokens,
            n_probes=self.cfg.n_probes,
            max_depth=self.cfg.max_depth,
            probe_len=self.cfg.seq_len,
            seed=self.data_seed,
            held_out=self.cfg.eval_split,
        )
        # each row holds seq_len inputs and, shifted by one, seq_len targets
        self.train_rows = _blocks(self.corpus.train, self.cfg.seq_len + 1)
        self.val_rows = _blocks(self.corpus.val, (self.cfg.eval_seq_len or self.cfg.seq_len) + 1)
        corpus = self.corpus
        self.floor = self._loss_floor()
        self.probes = TensorDataset(
            *(
                torch.from_numpy(a)
                for a in (corpus.probes, corpus.probe_position, corpus.probe_correct, corpus.probe_wrong)
            )
        )

    def _loss_floor(self) -> LossFloor:
        """The entropy floor of the validation rows, exactly (``data.agreement_floor``)."""
        automaton = grammar_automaton(self.cfg.max_depth)
        rows = self.val_rows.numpy()
        n_rows, length = rows.shape
        in_view = automaton.stream_cross_entropy(self.corpus.val[: n_rows * length]).reshape(n_rows, length)[:, 1:]
        return LossFloor(
            loss=float(automaton.row_cross_entropy(rows).mean()),
            full_context=float(in_view.mean()),
            unigram=unigram_entropy(self.corpus.train, len(self.corpus.vocab)),
        )

    def train_dataloader(self) -> DataLoader:
        return self.training_loader(TensorDataset(self.train_rows))

    def val_dataloader(self) -> list[DataLoader]:
        return [self.validation_loader(TensorDataset(self.val_rows)), self.validation_loader(self.probes)]

    def baselines(self) -> dict[str, float]:
        assert self.corpus is not None, "call setup() first"
        entropy = self.floor.unigram
        # always choosing the verb form seen more often in training (agreement-blind)
        counts = np.bincount(self.corpus.train, minlength=len(self.corpus.vocab))
        majority_right = counts[self.corpus.probe_correct] >= counts[self.corpus.probe_wrong]
        return {
            "loss": entropy,
            "perplexity": float(np.exp(entropy)),
            "agreement_acc": float(majority_right.mean()),
            # not trivial baselines but the other end of the scale: the best possible model's figures
            "loss_floor": self.floor.loss,
            "perplexity_floor": float(np.exp(self.floor.loss)),
            "loss_floor_full_context": self.floor.full_context,
        }


def next_token_loss(model: torch.nn.Module, rows: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of predicting ``rows[:, 1:]`` from ``rows[:, :-1]`` (both LM tasks)."""
    return model.loss(rows[:, :-1], rows[:, 1:], reduction=reduction)


def next_token_lens(model: torch.nn.Module, rows: torch.Tensor, reduction: str = "mean") -> list[torch.Tensor]:
    """The logit lens of :func:`next_token_loss`: its loss at the output of every block, the last
    block's being ``next_token_loss`` itself (both LM tasks)."""
    return logit_lens_losses(model, rows[:, :-1], targets=rows[:, 1:], reduction=reduction)


class LMTask(TaskModule):
    def __init__(self, model: ModelConfig, optimizer: OptimizerConfig, max_steps: int, *, logit_lens: bool = True):
        super().__init__(model, optimizer, max_steps)
        self.val_loss = MeanMetric()
        self.agreement = MeanMetric()
        self.lens = LensLosses(logit_lens_depth(self.model)) if logit_lens else None

    def items_in_batch(self, batch: Any) -> int:
        return batch[0][:, 1:].numel()

    def training_loss(self, batch: Any) -> torch.Tensor:
        return next_token_loss(self.model, batch[0])

    def validation_loss(self, batch: Any) -> tuple[torch.Tensor, int]:
        rows = batch[0]
        return next_token_loss(self.model, rows), rows[:, 1:].numel()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if dataloader_idx == 0:
            rows = batch[0]
            n_targets = rows[:, 1:].numel()
            if self.lens is None:
                loss, _ = self.validation_loss(batch)
            else:  # the same forward: the last block's lens loss is the validation loss
                lens = next_token_lens(self.model, rows)
                self.lens.update(lens, weight=n_targets)
                loss = lens[-1]
            self.val_loss.update(loss, weight=n_targets)
            return
        probes, position, correct, wrong = batch
        logits = self.model(probes)
        at_verb = logits[torch.arange(len(probes), device=probes.device), position - 1]
        prefers_correct = at_verb.gather(1, correct[:, None]) > at_verb.gather(1, wrong[:, None])
        self.agreement.update(prefers_correct.float().squeeze(1))

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        loss = self.val_loss.compute()
        lens = self.lens.pop() if self.lens is not None else {}
        floor: LossFloor = self.trainer.datamodule.floor
        self.log_validation(
            {
                "loss": loss,
                "perplexity": loss.exp(),
                "agreement_acc": self.agreement.compute(),
                "excess_loss": floor.excess(loss),
                "gap_closed": floor.gap_closed(loss),
                **lens,
            }
        )
        self.val_loss.reset()
        self.agreement.reset()


@builds(LMTaskConfig)
def build_lm(
    cfg: LMTaskConfig, model: ModelConfig, optimizer: OptimizerConfig, *, max_steps: int, batch_size: int, seed: int = 0
) -> tuple[LMTask, AgreementDataModule]:
    """The ``lm`` task's LightningModule and DataModule (``TaskConfig.build``)."""
    datamodule = AgreementDataModule(cfg, batch_size, seed=seed)
    return LMTask(model, optimizer, max_steps, logit_lens=cfg.logit_lens), datamodule
