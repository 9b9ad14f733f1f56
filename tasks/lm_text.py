"""Language modelling on real text (``task.name: lm_text``): a hub dataset or local files.

The text is tokenized with tiktoken (``task.tokenizer``), cached, concatenated and cut into
blocks of ``seq_len + 1`` tokens (inputs and next-token targets). Metrics: validation loss,
perplexity and bits per byte (loss per UTF-8 byte of the targets, which, unlike perplexity, does
not depend on the tokenizer). Baseline: an add-one unigram model of the training tokens.

The last ``task.tuning_fraction`` of the training tokens is always held out as the tuning split
(one contiguous stretch: blocks cut from the middle of the text would leave each held-out block's
context in training); ``task.eval_split: tuning`` validates on it instead of the validation split.

The task's config, ``TextLMTaskConfig``, is in ``tasks.configs.lm`` (validation imports it without this
module's Lightning code); ``build_lm_text`` below is the builder its ``build`` looks up (``tasks.builders``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchmetrics import SumMetric

from blockbench.models import ModelConfig, logit_lens_depth

from .base import TaskDataModule, TaskModule, with_data_fields
from .builders import builds
from .configs.base import OptimizerConfig
from .configs.lm import TextLMTaskConfig
from .data.tokenizer import Tokenizer, bits_per_byte, tokenized_documents, unigram_cross_entropy
from .lens import LensLosses
from .lm import next_token_lens, next_token_loss


class TokenBlocks(Dataset):
    """Consecutive blocks of ``length + 1`` tokens of a stream (the last token of a block starts the next)."""

    def __init__(self, stream: np.ndarray, length: int):
        self.stream, self.length = stream, length
        self.n_blocks = (len(stream) - 1) // length

    def __len__(self) -> int:
        return self.n_blocks

    def __getitem__(self, i: int) -> torch.Tensor:
        start = i * self.length
        return torch.from_numpy(self.stream[start : start + self.length + 1].astype(np.int64))


class TextLMDataModule(TaskDataModule):
    def __init__(self, cfg: TextLMTaskConfig, batch_size: int):
        super().__init__(batch_size)
        self.cfg = cfg
        self.tokenizer: Tokenizer | None = None
        #: per split: whether its tokens came from the cache (set by prepare_data)
        self.cache_hits: dict[str, bool] = {}
        self._loaded_streams: dict[str, np.ndarray] | None = None

    def _streams(self) -> dict[str, np.ndarray]:
        """The encoding's token ids of every split (tokenized once, then from the cache), loaded once."""
        if self._loaded_streams is None:
            data, tokenizer = self.cfg.data, self.cfg.tokenizer
            self._loaded_streams = {}
            for split in data.splits:
                self._loaded_streams[split], self.cache_hits[split] = tokenized_documents(
                    "lm-tokens",
                    data.describe(split),
                    lambda split=split: data.documents(split),
                    tokenizer.encoding,
                    end_of_document=data.end_of_document,
                )
        return self._loaded_streams

    def prepare_data(self) -> None:
        self._streams()

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        data, seq_len = self.cfg.data, self.cfg.seq_len
        streams = self._streams()
        train = streams[data.train_split]
        if data.val_split:
            val = streams[data.val_split]
        else:  # hold out the end of the training text, as nanoGPT does for Shakespeare
            cut = int(len(train) * (1 - data.val_fraction))
            train, val = train[:cut], train[cut:]
        # the tuning split: the end of what is left, held out whatever eval_split says
        cut = len(train) - min(max(1, round(len(train) * self.cfg.tuning_fraction)), len(train) - 1)
        train, tuning = train[:cut], train[cut:]
        held_out = ("validation", val) if self.cfg.eval_split == "validation" else ("tuning", tuning)
        for split, stream in (("training", train), held_out):
            if len(stream) <= seq_len:
                raise ValueError(
                    f"the {split} text has {len(stream)} tokens, fewer than one block of task.seq_len={seq_len} + 1; "
                    "use more text or a shorter task.seq_len"
                    + (", or raise task.tuning_fraction" if split == "tuning" else "")
                )
        self.tokenizer = Tokenizer.for_training_tokens(
            self.cfg.tokenizer.encoding, self.cfg.tokenizer.compact_vocab, [train]
        )
        self.train_tokens = self.tokenizer.compact(train) if self.tokenizer.original_ids is not None else train
        self.n_tuning_tokens = len(tuning)
        scored = held_out[1]
        #: the held-out tokens validation scores: the validation split's or (eval_split: tuning) the tuning split's
        self.val_tokens = self.tokenizer.compact(scored)[: (self.cfg.max_val_tokens or len(scored)) + 1]

    def train_dataloader(self) -> DataLoader:
        return self.training_loader(TokenBlocks(self.train_tokens, self.cfg.seq_len))

    def val_dataloader(self) -> DataLoader:
        return self.validation_loader(TokenBlocks(self.val_tokens, self.cfg.seq_len))

    def data_summary(self) -> dict[str, Any]:
        return {
            "encoding": self.tokenizer.encoding_name,
            "vocab_size": self.tokenizer.vocab_size,
            "train_tokens": len(self.train_tokens),
            "val_tokens": len(self.val_tokens),
            "tuning_tokens_held_out": self.n_tuning_tokens,
        }

    def baselines(self) -> dict[str, float]:
        assert self.tokenizer is not None, "call setup() first"
        blocks = TokenBlocks(self.val_tokens, self.cfg.seq_len)
        targets = np.asarray(self.val_tokens[1 : blocks.n_blocks * self.cfg.seq_len + 1], dtype=np.int64)
        loss = unigram_cross_entropy(np.asarray(self.train_tokens, dtype=np.int64), targets, self.tokenizer.vocab_size)
        n_bytes = int(self.tokenizer.bytes_per_token()[targets].sum())
        return {
            "loss": loss,
            "perplexity": math.exp(loss),
            "bits_per_byte": bits_per_byte(loss * len(targets), n_bytes),
        }


class TextLMTask(TaskModule):
    def __init__(
        self,
        model: ModelConfig,
        optimizer: OptimizerConfig,
        max_steps: int,
        *,
        bytes_per_token: np.ndarray,
        logit_lens: bool = True,
    ):
        super().__init__(model, optimizer, max_steps)
        self.register_buffer("bytes_per_token", torch.from_numpy(bytes_per_token), persistent=False)
        # sums, reduced over all processes: the metrics cover the whole validation set
        self.val_nats = SumMetric()
        self.val_targets = SumMetric()
        self.val_bytes = SumMetric()
        self.lens = LensLosses(logit_lens_depth(self.model)) if logit_lens else None

    def items_in_batch(self, batch: torch.Tensor) -> int:
        return batch[:, 1:].numel()

    def training_loss(self, batch: torch.Tensor) -> torch.Tensor:
        return next_token_loss(self.model, batch)

    def validation_loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        return next_token_loss(self.model, batch), batch[:, 1:].numel()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        targets = batch[:, 1:]
        if self.lens is None:
            nats = next_token_loss(self.model, batch, reduction="sum")
        else:  # the same forward: the last block's lens loss is the validation loss
            lens = next_token_lens(self.model, batch, reduction="sum")
            self.lens.update([layer_nats / targets.numel() for layer_nats in lens], weight=targets.numel())
            nats = lens[-1]
        self.val_nats.update(nats)
        self.val_targets.update(targets.numel())
        self.val_bytes.update(self.bytes_per_token[targets].sum())

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        nats, n_targets, n_bytes = (m.compute() for m in (self.val_nats, self.val_targets, self.val_bytes))
        loss = nats / n_targets
        lens = self.lens.pop() if self.lens is not None else {}
        self.log_validation(
            {"loss": loss, "perplexity": loss.exp(), "bits_per_byte": nats / math.log(2) / n_bytes, **lens}
        )
        for metric in (self.val_nats, self.val_targets, self.val_bytes):
            metric.reset()


@builds(TextLMTaskConfig)
def build_lm_text(
    cfg: TextLMTaskConfig,
    model: ModelConfig,
    optimizer: OptimizerConfig,
    *,
    max_steps: int,
    batch_size: int,
    seed: int = 0,
) -> tuple[TextLMTask, TextLMDataModule]:
    """The ``lm_text`` task's LightningModule and DataModule (``TaskConfig.build``): the data are
    tokenized (or read from the cache) first, since the vocabulary size is the data's."""
    datamodule = TextLMDataModule(cfg, batch_size)
    datamodule.prepare_data()
    datamodule.setup()
    model = with_data_fields(model, vocab_size=datamodule.tokenizer.vocab_size)
    task = TextLMTask(
        model,
        optimizer,
        max_steps,
        bytes_per_token=datamodule.tokenizer.bytes_per_token(),
        logit_lens=cfg.logit_lens,
    )
    return task, datamodule
