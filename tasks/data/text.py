"""Real text for the LM and translation tasks: HF hub datasets and local files, one code path.

A source is described by a pydantic section of the task config: either a hub dataset
(``hf_path``/``hf_name``, loaded with ``datasets.load_dataset``) or local files per split. Local
files are read here rather than by ``datasets`` so that bad input stops with the file and line:

- text corpora: ``.txt`` (the whole file is one document), ``.jsonl`` (one document per
  record, in ``text_field``), ``.parquet`` (column ``text_field``);
- parallel corpora: two line-aligned plain-text files, a ``.tsv`` with two columns (source,
  target), or ``.jsonl`` records with the two language fields (top level, or under
  ``translation`` as in HF translation datasets).

``.txt``, ``.tsv`` and ``.jsonl`` files may be gzip-compressed (``.gz``).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from . import DataError
from .cache import file_fingerprint

TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
PARALLEL_SUFFIXES = (".tsv", ".jsonl")
#: characters of a ``.txt`` file tokenized at a time (cut at line ends)
TXT_CHUNK_CHARS = 1 << 20


class TextData(BaseModel):
    """Where an LM's text comes from: a hub dataset or local files, with a training and a validation split."""

    model_config = ConfigDict(extra="forbid")

    hf_path: str | None = Field(None, description="HF hub dataset, e.g. Salesforce/wikitext")
    hf_name: str | None = Field(None, description="its configuration, e.g. wikitext-103-raw-v1")
    files: dict[str, str] | None = Field(
        None, description="split -> local .txt/.jsonl/.parquet file (.gz allowed for txt/jsonl)"
    )
    text_field: str = Field("text", description="record field (jsonl, parquet, hub) holding the text")
    train_split: str = Field("train", description="training split: a hub split or a key of files")
    val_split: str | None = Field(
        "validation", description="held-out split; null: hold out the last val_fraction of the training tokens"
    )
    val_fraction: float = Field(
        0.1, gt=0, lt=1, description="share of the training tokens held out when val_split is null"
    )
    end_of_document: bool = Field(
        True,
        description="append the end-of-text token after each record (off for line-per-record corpora such as WikiText)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> TextData:
        _check_source(
            self.hf_path, self.files, self.train_split, self.val_split, "a text file per split (.txt, .jsonl, .parquet)"
        )
        return self

    @property
    def splits(self) -> list[str]:
        return [self.train_split] + ([self.val_split] if self.val_split else [])

    def describe(self, split: str) -> dict[str, Any]:
        """What identifies the records of ``split`` (the cache key of their tokens)."""
        fields = {"text_field": self.text_field, "end_of_document": self.end_of_document}
        if self.files:
            return {"file": file_fingerprint(_existing(self.files[split], f"task.data.files.{split}")), **fields}
        return {"hf_path": self.hf_path, "hf_name": self.hf_name, "split": split, **fields}

    def documents(self, split: str) -> Iterator[tuple[str, bool]]:
        """The text of ``split`` as ``(text, ends_a_document)`` pieces: one per record; a .txt file
        is one document, read in pieces that end at line ends."""
        if self.hf_path:
            for record in _hub_records(self.hf_path, self.hf_name, split, [self.text_field]):
                yield record[self.text_field], True
            return
        path = _existing(self.files[split], f"task.data.files.{split}")
        suffix = _suffix(path, TEXT_SUFFIXES)
        if suffix == ".txt":
            yield from _txt_chunks(path)
        elif suffix == ".jsonl":
            yield from ((_field(record, self.text_field, path, line), True) for line, record in _jsonl_records(path))
        else:
            yield from ((text, True) for text in _parquet_column(path, self.text_field))


class ParallelFiles(BaseModel):
    """Two line-aligned plain-text files: line i of ``target`` translates line i of ``source``."""

    model_config = ConfigDict(extra="forbid")

    source: str
    target: str


class ParallelData(BaseModel):
    """Where a translation task's sentence pairs come from: a hub dataset or local files."""

    model_config = ConfigDict(extra="forbid")

    hf_path: str | None = Field(None, description="HF hub dataset, e.g. wmt/wmt14")
    hf_name: str | None = Field(None, description="its configuration, e.g. de-en")
    files: dict[str, ParallelFiles | str] | None = Field(
        None, description="split -> {source, target} aligned text files, or one .tsv/.jsonl file"
    )
    source_lang: str = Field("de", description="source field (jsonl, hub translation records)")
    target_lang: str = Field("en", description="target field")
    train_split: str = Field("train", description="training split: a hub split or a key of files")
    val_split: str = Field("validation", description="validation split: a hub split or a key of files")

    @model_validator(mode="after")
    def _one_source(self) -> ParallelData:
        _check_source(
            self.hf_path,
            self.files,
            self.train_split,
            self.val_split,
            "{source, target} files or a .tsv/.jsonl file per split",
        )
        return self

    @property
    def splits(self) -> list[str]:
        return [self.train_split, self.val_split]

    def describe(self, split: str) -> dict[str, Any]:
        langs = {"source_lang": self.source_lang, "target_lang": self.target_lang}
        if not self.files:
            return {"hf_path": self.hf_path, "hf_name": self.hf_name, "split": split, **langs}
        spec, key = self.files[split], f"task.data.files.{split}"
        if isinstance(spec, ParallelFiles):
            paths = {
                "source": _existing(spec.source, f"{key}.source"),
                "target": _existing(spec.target, f"{key}.target"),
            }
            return {name: file_fingerprint(p) for name, p in paths.items()}
        return {"file": file_fingerprint(_existing(spec, key)), **langs}

    def pairs(self, split: str) -> Iterator[tuple[str, str]]:
        """(source, target) sentence pairs of ``split``."""
        src, tgt = self.source_lang, self.target_lang
        if self.hf_path:
            for record in _hub_records(self.hf_path, self.hf_name, split, []):
                yield _translation_pair(record, src, tgt, where=f"HF dataset {self.hf_path} ({split})")
            return
        spec, key = self.files[split], f"task.data.files.{split}"
        if isinstance(spec, ParallelFiles):
            yield from _aligned_files(_existing(spec.source, f"{key}.source"), _existing(spec.target, f"{key}.target"))
            return
        path = _existing(spec, key)
        if _suffix(path, PARALLEL_SUFFIXES) == ".tsv":
            yield from _tsv_pairs(path)
        else:
            for line, record in _jsonl_records(path):
                yield _translation_pair(record, src, tgt, where=f"{path}: line {line}")


def _check_source(hf_path: str | None, files: dict | None, train_split: str, val_split: str | None, what: str) -> None:
    if bool(hf_path) == bool(files):
        raise ValueError(f"set exactly one of hf_path (a HF hub dataset) or files ({what})")
    if files:
        missing = [s for s in (train_split, val_split) if s and s not in files]
        if missing:
            raise ValueError(
                f"files has no entry for split(s) {', '.join(missing)} (it has: {', '.join(files) or 'none'}); "
                "add them, or rename train_split/val_split"
            )


# ---------------------------------------------------------------- local files


def _existing(name: str, key: str) -> Path:
    path = Path(name).expanduser()
    if not path.is_file():
        raise DataError(f"{path}: no such file ({key})")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: empty file ({key})")
    return path


def _suffix(path: Path, allowed: tuple[str, ...]) -> str:
    suffixes = path.suffixes
    suffix = (
        suffixes[-2]
        if suffixes and suffixes[-1] == ".gz" and len(suffixes) >= 2
        else (suffixes[-1] if suffixes else "")
    )
    if suffix not in allowed or (suffix == ".parquet" and path.suffix == ".gz"):
        raise DataError(
            f"{path}: unsupported file type '{''.join(suffixes)}'; use one of {', '.join(allowed)} "
            "(txt/tsv/jsonl may be .gz)"
        )
    return suffix


def _read_bytes(path: Path) -> bytes:
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read it: {exc}") from None
    if not data.strip():
        raise DataError(f"{path}: empty file (no text)")
    return data


def _read_text(path: Path) -> str:
    """The whole file as UTF-8 text; a non-UTF-8 file names the first bad line."""
    data = _read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}: line {line}: not UTF-8 ({exc.reason} at byte {exc.start}); convert the file to UTF-8 "
            f"(e.g. iconv -f latin1 -t utf-8)"
        ) from None


def _lines(path: Path) -> list[str]:
    return _read_text(path).splitlines()


def _txt_chunks(path: Path) -> Iterator[tuple[str, bool]]:
    text = _read_text(path)
    start = 0
    while start < len(text):
        end = text.find("\n", start + TXT_CHUNK_CHARS)
        end = len(text) if end < 0 else end + 1
        yield text[start:end], end == len(text)
        start = end


def _jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    found = False
    for number, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}: line {number}: expected a JSON object, got {type(record).__name__}")
        found = True
        yield number, record
    if not found:
        raise DataError(f"{path}: empty file (no records)")


def _field(record: dict[str, Any], field: str, path: Path | str, line: int) -> str:
    if field not in record:
        raise DataError(
            f"{path}: line {line}: record has no field '{field}' (fields: {', '.join(record) or 'none'}); "
            "set task.data.text_field"
        )
    value = record[field]
    if not isinstance(value, str):
        raise DataError(f"{path}: line {line}: field '{field}' is {type(value).__name__}, not text")
    return value


def _parquet_column(path: Path, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid and friends
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    columns = parquet.schema_arrow.names
    if field not in columns:
        raise DataError(f"{path}: no column '{field}' (columns: {', '.join(columns)}); set task.data.text_field")
    if parquet.metadata.num_rows == 0:
        raise DataError(f"{path}: empty file (no rows)")
    for batch in parquet.iter_batches(columns=[field]):
        yield from (value or "" for value in batch.column(0).to_pylist())


def _aligned_files(source: Path, target: Path) -> Iterator[tuple[str, str]]:
    src_lines, tgt_lines = _lines(source), _lines(target)
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"{source} has {len(src_lines)} lines but {target} has {len(tgt_lines)}; parallel files must be "
            "line-aligned (line i of the target translates line i of the source)"
        )
    yield from zip(src_lines, tgt_lines, strict=True)


def _tsv_pairs(path: Path) -> Iterator[tuple[str, str]]:
    for number, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(
                f"{path}: line {number}: expected 2 tab-separated fields (source, target), found {len(fields)}"
            )
        yield fields[0], fields[1]


def _translation_pair(record: dict[str, Any], src: str, tgt: str, *, where: str) -> tuple[str, str]:
    """HF translation records nest the languages under ``translation``; flat records have them on top."""
    pair = record.get("translation", record)
    missing = [lang for lang in (src, tgt) if lang not in pair]
    if missing or not isinstance(pair, dict):
        raise DataError(
            f"{where}: record has no field {', '.join(repr(m) for m in missing)} (fields: {', '.join(pair)}); "
            "set task.data.source_lang/target_lang"
        )
    return _text(pair[src], where, src), _text(pair[tgt], where, tgt)


def _text(value: Any, where: str, field: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{field}' is {type(value).__name__}, not text")
    return value


# ---------------------------------------------------------------- HF hub


def _hub_records(path: str, name: str | None, split: str, required: list[str]) -> Iterator[dict[str, Any]]:
    import datasets

    try:
        dataset = datasets.load_dataset(path, name, split=split)
    except Exception as exc:  # network, unknown dataset or split: say which and how to go offline
        raise DataError(
            f"HF dataset {path}" + (f" ({name})" if name else "") + f", split '{split}': cannot load it: "
            f"{type(exc).__name__}: {exc}. Without network access, point task.data.files at local files."
        ) from None
    missing = [f for f in required if f not in dataset.column_names]
    if missing:
        raise DataError(
            f"HF dataset {path}, split '{split}': no column {', '.join(missing)} "
            f"(columns: {', '.join(dataset.column_names)}); set task.data.text_field"
        )
    if len(dataset) == 0:
        raise DataError(f"HF dataset {path}, split '{split}': no records")
    yield from dataset
