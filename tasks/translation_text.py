"""Translation on real parallel corpora (``task.name: translation_text``).

Sentence pairs come from a HF hub dataset or local files (``tasks.data.text.ParallelData``) and
share one tiktoken vocabulary for source and target (``task.tokenizer``, optionally compacted).
Training pairs longer than ``max_len`` tokens (BOS/EOS included) on either side are dropped;
validation pairs are all kept (sources truncated to ``max_len``), and BLEU compares the
detokenized output with the untouched reference text. Batches group pairs of similar length.
The LightningModule is the same ``TranslationTask`` as the embedded task's.

``task.tuning_fraction`` of the training pairs, picked by a fixed permutation
(``base.held_out_for_tuning``), is always held out as the tuning split: never trained on, and
scored like the validation split (all kept, sorted by length) with ``task.eval_split: tuning``.

The task's config, ``TextTranslationTaskConfig``, is in ``tasks.configs.translation`` (validation
imports it without this module's Lightning code); ``build_translation_text`` below is the builder
its ``build`` looks up (``tasks.builders``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from blockbench.models import ModelConfig

from .base import held_out_for_tuning, with_data_fields
from .builders import builds
from .configs.base import OptimizerConfig
from .configs.translation import TextTranslationTaskConfig
from .data.tokenizer import Tokenizer, tokenized_pairs
from .translation import (
    SpecialIds,
    TranslationDataModule,
    TranslationTask,
    corpus_bleu,
)


def select_pairs(arrays: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The tokenized pairs ``rows`` of ``arrays`` (flat ids and offsets per side, as ``tokenized_pairs``
    gives them), in that order, as arrays of the same form."""
    selected = {}
    for side in ("src", "tgt"):
        offsets = arrays[f"{side}_offsets"]
        starts, lengths = offsets[rows], np.diff(offsets)[rows]
        # every id of the chosen rows: each row's start repeated over its length, plus 0, 1, 2, ... within it
        within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        selected[side] = arrays[side][np.repeat(starts, lengths) + within]
        selected[f"{side}_offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return selected


class TokenizedPairs(Dataset):
    """Sentence pairs as flat id arrays with offsets; item i is (source + EOS, BOS + target + EOS, i),
    each side cut to ``max_len`` tokens."""

    def __init__(
        self,
        src: np.ndarray,
        src_offsets: np.ndarray,
        tgt: np.ndarray,
        tgt_offsets: np.ndarray,
        ids: SpecialIds,
        max_len: int,
        rows: np.ndarray | None = None,
    ):
        self.src, self.src_offsets, self.tgt, self.tgt_offsets = src, src_offsets, tgt, tgt_offsets
        self.ids, self.max_len = ids, max_len
        self.rows = np.arange(len(src_offsets) - 1) if rows is None else rows

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        """Padded length of each item (the longer side), for grouping batches."""
        src = np.diff(self.src_offsets)[self.rows] + 1
        tgt = np.diff(self.tgt_offsets)[self.rows] + 2
        return np.minimum(np.maximum(src, tgt), self.max_len)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        row = int(self.rows[i])
        src = self.src[self.src_offsets[row] : self.src_offsets[row + 1]][: self.max_len - 1]
        tgt = self.tgt[self.tgt_offsets[row] : self.tgt_offsets[row + 1]][: self.max_len - 2]
        source = torch.tensor([*src, self.ids.eos], dtype=torch.long)
        target = torch.tensor([self.ids.bos, *tgt, self.ids.eos], dtype=torch.long)
        return source, target, row


class LengthGroupedBatchSampler(Sampler[list[int]]):
    """Batches of similar length (the bucketing of fairseq and torchtext): indices drawn from
    ``sampler`` (this process's shuffled share of the epoch) are pooled ``pool_batches`` batches at
    a time, sorted by length within a pool and cut into batches, whose order is then shuffled with
    a generator seeded by ``seed`` and the epoch. Its state (epoch, batches yielded) is saved in
    checkpoints, so a run resumed mid-epoch sees the same batches as an uninterrupted one."""

    def __init__(
        self,
        sampler: Sampler[int],
        batch_size: int,
        *,
        drop_last: bool,
        lengths: np.ndarray,
        seed: int,
        pool_batches: int = 50,
    ):
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self.lengths, self.seed, self.pool_batches = lengths, seed, pool_batches
        self.epoch, self.yielded, self._skip = 0, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_epoch(state["epoch"])
        self._skip = state["yielded"]

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _epoch_batches(self) -> list[list[int]]:
        # any seed torch gives (an unseeded process's initial_seed is a random 64-bit number) fits manual_seed
        generator = torch.Generator().manual_seed((self.seed * 100_003 + self.epoch) % 2**63)
        order = list(self.sampler)
        pool_size = self.batch_size * self.pool_batches
        batches: list[list[int]] = []
        for start in range(0, len(order), pool_size):
            pool = sorted(order[start : start + pool_size], key=lambda i: self.lengths[i])
            pool_batches = [pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
            if self.drop_last and len(pool_batches[-1]) < self.batch_size:
                pool_batches.pop()
            batches += [pool_batches[b] for b in torch.randperm(len(pool_batches), generator=generator).tolist()]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches, self.yielded, self._skip = self._epoch_batches(), self._skip, 0  # resume where a checkpoint stopped
        for batch in batches[self.yielded :]:
            self.yielded += 1
            yield batch


class TextTranslationDataModule(TranslationDataModule):
    def __init__(self, cfg: TextTranslationTaskConfig, batch_size: int):
        super().__init__(batch_size)
        self.cfg = cfg
        self.tokenizer: Tokenizer | None = None
        self.cache_hits: dict[str, bool] = {}
        self._loaded_splits: dict[str, tuple[dict[str, np.ndarray], dict[str, list[str]]]] | None = None

    def _tokenized(self) -> dict[str, tuple[dict[str, np.ndarray], dict[str, list[str]]]]:
        """Every split's tokenized pairs (tokenized once, then from the cache), loaded once."""
        if self._loaded_splits is None:
            data, encoding = self.cfg.data, self.cfg.tokenizer.encoding
            # the texts of the scored split: the tuning split's references are training pairs
            scored = data.val_split if self.cfg.eval_split == "validation" else data.train_split
            self._loaded_splits = {}
            for split in data.splits:
                arrays, texts, self.cache_hits[split] = tokenized_pairs(
                    "translation-tokens",
                    data.describe(split),
                    lambda split=split: data.pairs(split),
                    encoding,
                    keep_texts=split == scored,
                )
                self._loaded_splits[split] = arrays, texts
        return self._loaded_splits

    def prepare_data(self) -> None:
        self._tokenized()

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        cfg = self.cfg
        splits = self._tokenized()
        every_train, train_texts = splits[cfg.data.train_split]
        train_rows, tuning_rows = held_out_for_tuning(len(every_train["src_offsets"]) - 1, cfg.tuning_fraction)
        train = select_pairs(every_train, train_rows)
        if cfg.eval_split == "validation":
            val, self.val_texts = splits[cfg.data.val_split]
        else:
            val = select_pairs(every_train, tuning_rows)
            self.val_texts = {side: [texts[i] for i in tuning_rows] for side, texts in train_texts.items()}
        self.n_tuning_pairs = len(tuning_rows)
        self.tokenizer = Tokenizer.for_training_tokens(
            cfg.tokenizer.encoding, cfg.tokenizer.compact_vocab, [train["src"], train["tgt"]]
        )
        tok = self.tokenizer
        self.special_ids = SpecialIds(
            pad=tok.pad_id, bos=tok.eot_id, eos=tok.eot_id
        )  # GPT-style: end-of-text opens and closes

        # training: every training id is in the vocabulary, so compaction keeps the offsets
        train_set = TokenizedPairs(
            tok.compact(train["src"]),
            train["src_offsets"],
            tok.compact(train["tgt"]),
            train["tgt_offsets"],
            self.special_ids,
            cfg.max_len,
        )
        fits = (np.diff(train["src_offsets"]) + 1 <= cfg.max_len) & (np.diff(train["tgt_offsets"]) + 2 <= cfg.max_len)
        self.n_train_dropped = int((~fits).sum())
        if not fits.any():
            raise ValueError(f"no training pair fits task.max_len={cfg.max_len} tokens; raise task.max_len")
        train_set.rows = np.flatnonzero(fits)
        self.train_set = train_set

        # validation (or tuning): held-out ids may fall back to bytes, so compact sentence by sentence
        n_val = min(len(val["src_offsets"]) - 1, cfg.max_val_pairs or len(val["src_offsets"]))
        sides = {}
        for side in ("src", "tgt"):
            rows = [
                tok.compact(val[side][val[f"{side}_offsets"][i] : val[f"{side}_offsets"][i + 1]]) for i in range(n_val)
            ]
            sides[side] = np.concatenate(rows) if rows else np.zeros(0, np.int64)
            sides[f"{side}_offsets"] = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
        val_set = TokenizedPairs(
            sides["src"], sides["src_offsets"], sides["tgt"], sides["tgt_offsets"], self.special_ids, cfg.max_len
        )
        val_set.rows = np.argsort(val_set.lengths(), kind="stable")  # similar lengths decode together
        self.val_set = val_set
        self.val_texts = {k: v[:n_val] for k, v in self.val_texts.items()}

    def _collate(
        self, items: list[tuple[torch.Tensor, torch.Tensor, int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pad = self.special_ids.pad
        sources, targets, rows = zip(*items, strict=True)
        src = torch.nn.utils.rnn.pad_sequence(sources, batch_first=True, padding_value=pad)
        tgt = torch.nn.utils.rnn.pad_sequence(targets, batch_first=True, padding_value=pad)
        return src, tgt, torch.tensor(rows)

    def train_dataloader(self) -> DataLoader:
        # seeded by the run (Lightning's seed_everything sets torch.initial_seed)
        batches = LengthGroupedBatchSampler(
            self.training_sampler(self.train_set),
            self.batch_size,
            drop_last=True,
            lengths=self.train_set.lengths(),
            seed=torch.initial_seed(),
        )
        return self.training_loader(self.train_set, batch_sampler=batches, collate_fn=self._collate)

    def val_dataloader(self) -> DataLoader:
        return self.validation_loader(self.val_set, collate_fn=self._collate)

    def hypothesis_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def reference_text(self, index: int) -> str:
        return self.val_texts["target"][index]

    def data_summary(self) -> dict[str, Any]:
        return {
            "encoding": self.tokenizer.encoding_name,
            "vocab_size": self.tokenizer.vocab_size,
            "train_pairs": len(self.train_set),
            "train_pairs_dropped_over_max_len": self.n_train_dropped,
            "val_pairs": len(self.val_set),
            "tuning_pairs_held_out": self.n_tuning_pairs,
        }

    def baselines(self) -> dict[str, float]:
        return {"bleu": corpus_bleu(self.val_texts["source"], self.val_texts["target"])[0]}


@builds(TextTranslationTaskConfig)
def build_translation_text(
    cfg: TextTranslationTaskConfig,
    model: ModelConfig,
    optimizer: OptimizerConfig,
    *,
    max_steps: int,
    batch_size: int,
    seed: int = 0,
) -> tuple[TranslationTask, TextTranslationDataModule]:
    """The ``translation_text`` task's LightningModule and DataModule (``TaskConfig.build``): the pairs
    are tokenized (or read from the cache) first, since the vocabulary size is the data's."""
    datamodule = TextTranslationDataModule(cfg, batch_size)
    datamodule.prepare_data()
    datamodule.setup()
    task = TranslationTask(
        with_data_fields(model, vocab_size=datamodule.tokenizer.vocab_size),
        optimizer,
        max_steps,
        label_smoothing=cfg.label_smoothing,
        max_len=cfg.max_len,
        special_ids=datamodule.special_ids,
        beam_size=cfg.beam_size,
        length_penalty=cfg.length_penalty,
        logit_lens=cfg.logit_lens,
    )
    return task, datamodule
