"""Real-image classification (tasks.image, its data in tasks.data.images) on the CIFAR-10 subset in
shared/data, through the same loaders users configure: npz, image folder, HF hub (monkeypatched,
offline), torchvision."""

from __future__ import annotations

import re
from pathlib import Path

import datasets
import lightning as L
import numpy as np
import pytest
import torch
from helpers import SHARED_DATA, TINY_MODEL
from PIL import Image

import blockbench.tasks.data.images
from blockbench.models import ModelConfig
from blockbench.tasks import TASK_PRESETS as IMAGE_PRESETS
from blockbench.tasks import OptimizerConfig
from blockbench.tasks.base import held_out_for_tuning
from blockbench.tasks.data import DataError
from blockbench.tasks.image import ImageTaskConfig

SUBSET = SHARED_DATA / "cifar10_subset" / "cifar10_subset.npz"
#: the tiny model with two layers, the default d_ff (4 x d_model) and 8-pixel patches (4 x 4 of 32 x 32 images)
VIT_MODEL = {**TINY_MODEL, "n_layers": 2, "d_ff": None, "patch_size": 8}
NO_AUGMENT = {"random_crop_padding": 0, "horizontal_flip": False}

pytestmark = pytest.mark.skipif(not SUBSET.is_file(), reason="needs ../shared/data (see its README)")


@pytest.fixture(scope="module")
def subset() -> dict[str, np.ndarray]:
    with np.load(SUBSET) as archive:
        return {key: archive[key] for key in archive.files}


def build(data: dict, batch_size: int = 8, **task_fields):
    cfg = ImageTaskConfig(data=data, **task_fields)
    model = ModelConfig(**VIT_MODEL, **cfg.model_overrides())
    return cfg.build(model, OptimizerConfig(), max_steps=2, batch_size=batch_size)


def write_small_npz(path: Path, subset: dict[str, np.ndarray], n_train: int = 64, n_val: int = 32, **replace) -> Path:
    arrays = {
        "x_train": subset["x_train"][:n_train],
        "y_train": subset["y_train"][:n_train],
        "x_test": subset["x_test"][:n_val],
        "y_test": subset["y_test"][:n_val],
        "class_names": subset["class_names"],
    }
    arrays.update(replace)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def write_image_folder(root: Path, subset: dict[str, np.ndarray], n_train: int = 40, n_val: int = 10) -> Path:
    """``root/{train,test}/<class>/<index>.png`` from the subset's first images."""
    names = subset["class_names"]
    for split, images, labels in (
        ("train", subset["x_train"][:n_train], subset["y_train"][:n_train]),
        ("test", subset["x_test"][:n_val], subset["y_test"][:n_val]),
    ):
        for index, (image, label) in enumerate(zip(images, labels, strict=True)):
            folder = root / split / str(names[label])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{index:04d}.png")
    return root


def image_label_pairs(images: np.ndarray, labels: np.ndarray, class_names) -> list[tuple[str, bytes]]:
    """(class name, pixel bytes) of every image, sorted: compares two sets independent of order."""
    return sorted((str(class_names[label]), image.tobytes()) for image, label in zip(images, labels, strict=True))


def cache_entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


# --------------------------------------------------------------------------- sources


def test_npz_loads_the_exact_pixels_labels_and_class_names(cache_dir, subset):
    module, datamodule = build({"source": "npz", "path": str(SUBSET)})
    images = datamodule.images
    assert datamodule.cache_hit is False
    assert images.train_images.shape == (4750, 32, 32, 3) and images.val_images.shape == (1000, 32, 32, 3)
    np.testing.assert_array_equal(images.train_images, subset["x_train"])
    np.testing.assert_array_equal(images.val_images, subset["x_test"])
    np.testing.assert_array_equal(images.train_labels, subset["y_train"])
    assert images.train_labels.dtype == np.int64
    assert images.class_names == [str(c) for c in subset["class_names"]]
    assert module.model_config.n_classes == 10 and module.model_config.in_channels == 3
    # the subset's training labels are balanced (475 per class), but 5% of them are held out for tuning
    # (task.tuning_fraction): the majority of the 4512 left, counted here, is scored on the validation labels
    kept = np.delete(subset["y_train"], held_out_for_tuning(4750, 0.05)[1])
    assert len(kept) == 4750 - 238
    counts = np.bincount(kept, minlength=10)
    majority = np.flatnonzero(counts == counts.max())
    expected = np.mean([(subset["y_test"] == c).mean() for c in majority])
    assert datamodule.baselines() == {"accuracy": pytest.approx(expected)}


def test_second_load_is_a_cache_hit_and_does_not_decode(cache_dir, subset, monkeypatch):
    _, first = build({"source": "npz", "path": str(SUBSET)})

    def no_decoding(data, **shape):
        raise AssertionError("decoded again despite the cache")

    monkeypatch.setattr(blockbench.tasks.data.images, "decode_images", no_decoding)
    _, second = build({"source": "npz", "path": str(SUBSET)})
    assert (first.cache_hit, second.cache_hit) == (False, True)
    np.testing.assert_array_equal(second.images.val_images, subset["x_test"])
    assert second.images.mean == first.images.mean
    assert len(cache_entries(cache_dir)) == 1


def test_imagefolder_of_pngs_round_trips_the_pixels(cache_dir, subset, tmp_path):
    root = write_image_folder(tmp_path / "images", subset)
    module, datamodule = build({"source": "imagefolder", "path": str(root)})
    images = datamodule.images
    assert images.train_images.shape == (40, 32, 32, 3) and images.val_images.shape == (10, 32, 32, 3)
    names = subset["class_names"]
    assert image_label_pairs(images.train_images, images.train_labels, images.class_names) == image_label_pairs(
        subset["x_train"][:40], subset["y_train"][:40], names
    )
    assert image_label_pairs(images.val_images, images.val_labels, images.class_names) == image_label_pairs(
        subset["x_test"][:10], subset["y_test"][:10], names
    )
    assert images.class_names == sorted({str(names[y]) for y in [*subset["y_train"][:40], *subset["y_test"][:10]]})
    assert module.model_config.n_classes == len(images.class_names)


def fake_hub(subset: dict[str, np.ndarray], calls: list):
    """A stand-in for ``datasets.load_dataset`` serving a few subset images as PIL images."""
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=list(subset["class_names"]))}
    )

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        x, y = (
            (subset["x_train"][:24], subset["y_train"][:24])
            if split == "train"
            else (subset["x_test"][:8], subset["y_test"][:8])
        )
        return datasets.Dataset.from_dict(
            {"img": [Image.fromarray(i) for i in x], "label": y.tolist()}, features=features
        )

    return load_dataset


def test_hf_hub_source_through_the_cifar10_preset(cache_dir, subset, monkeypatch):
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", fake_hub(subset, calls))
    preset = IMAGE_PRESETS["cifar10"]
    assert "downloaded on first use" in preset.description
    _, datamodule = build(preset.task["data"], image_size=preset.task["image_size"])
    assert calls == [("uoft-cs/cifar10", None, "train"), ("uoft-cs/cifar10", None, "test")]
    images = datamodule.images
    np.testing.assert_array_equal(images.train_images, subset["x_train"][:24])
    np.testing.assert_array_equal(images.val_labels, subset["y_test"][:8])
    assert images.class_names == [str(c) for c in subset["class_names"]]
    # the hub is identified by path, name and splits: a second run reads the cache
    _, again = build(preset.task["data"])
    assert again.cache_hit and len(calls) == 2

    with pytest.raises(
        DataError,
        match=r"uoft-cs/cifar10, split 'train': no column 'fine_label' \(task.data.label_field\); "
        r"the columns are: img, label",
    ):
        build({**IMAGE_PRESETS["cifar100"].task["data"], "hf_path": "uoft-cs/cifar10"})


def test_images_of_another_size_are_resized_and_grayscale_converted(cache_dir, subset, tmp_path):
    path = write_small_npz(tmp_path / "small.npz", subset, n_train=16, n_val=8)
    _, datamodule = build({"source": "npz", "path": str(path)}, image_size=16, channels=1)
    assert datamodule.images.train_images.shape == (16, 16, 16, 1)
    assert len(datamodule.images.mean) == 1


# --------------------------------------------------------------------------- bad input


def bad_npz_cases(tmp_path: Path, subset) -> dict[str, tuple[Path, str]]:
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip archive at all")
    return {
        "missing": (tmp_path / "absent.npz", "no such file"),
        "empty": (empty, "the file is empty"),
        "garbage": (garbage, "not a readable .npz archive"),
        "missing key": (
            write_small_npz(tmp_path / "nokey.npz", subset, x_train=None),
            r"no array 'x_train' \(task.data.train_images_key\); the file has: class_names, x_test, y_test, y_train",
        ),
        "wrong shape": (
            write_small_npz(tmp_path / "flat.npz", subset, x_train=subset["x_train"][:64].reshape(64, -1)),
            r"'x_train': expected non-empty uint8 images of shape \(N, H, W, C\) with C 1 or 3; "
            r"got uint8 of shape \(64, 3072\)",
        ),
        "wrong dtype": (
            write_small_npz(tmp_path / "float.npz", subset, x_test=subset["x_test"][:32].astype(np.float32)),
            "'x_test': expected non-empty uint8 images .* got float32",
        ),
        "label count": (
            write_small_npz(tmp_path / "count.npz", subset, y_train=subset["y_train"][:60]),
            "'y_train': 60 labels for 64 'x_train'",
        ),
        "label range": (
            write_small_npz(tmp_path / "range.npz", subset, y_test=np.full(32, 10)),
            r"'y_test': labels range over 10..10, but there are 10 classes",
        ),
    }


@pytest.mark.parametrize(
    "case", ["missing", "empty", "garbage", "missing key", "wrong shape", "wrong dtype", "label count", "label range"]
)
def test_bad_npz_names_the_file_and_leaves_no_cache(cache_dir, subset, tmp_path, case):
    path, message = bad_npz_cases(tmp_path, subset)[case]
    with pytest.raises(DataError, match=re.escape(str(path)) + ": " + message):
        build({"source": "npz", "path": str(path)})
    assert cache_entries(cache_dir) == []


def test_after_a_failed_preparation_the_fixed_file_prepares_cleanly(cache_dir, subset, tmp_path):
    path = write_small_npz(tmp_path / "data.npz", subset, y_train=None)
    with pytest.raises(DataError, match="no array 'y_train'"):
        build({"source": "npz", "path": str(path)})
    assert cache_entries(cache_dir) == []
    write_small_npz(path, subset)
    _, datamodule = build({"source": "npz", "path": str(path)})
    assert datamodule.cache_hit is False
    np.testing.assert_array_equal(datamodule.images.train_labels, subset["y_train"][:64])
    (entry,) = cache_entries(cache_dir)
    assert ".tmp-" not in entry and (cache_dir / entry / "manifest.json").is_file()


def test_corrupt_png_in_an_imagefolder_is_named(cache_dir, subset, tmp_path):
    root = write_image_folder(tmp_path / "images", subset, n_train=12, n_val=4)
    corrupt = root / "train" / "cat" / "broken.png"
    corrupt.write_bytes(b"\x89PNG garbage, not an image")
    with pytest.raises(DataError, match=re.escape(str(corrupt)) + ": cannot decode the image"):
        build({"source": "imagefolder", "path": str(root)})
    assert cache_entries(cache_dir) == []
    corrupt.unlink()
    _, datamodule = build({"source": "imagefolder", "path": str(root)})
    assert len(datamodule.images.train_images) == 12

    with pytest.raises(DataError, match=re.escape(str(root)) + ": no split folder 'val'.*it has: test, train"):
        build({"source": "imagefolder", "path": str(root), "val_split": "val"})


def test_torchvision_root_without_the_dataset_files_says_how_to_fix(cache_dir, tmp_path):
    with pytest.raises(
        DataError,
        match=re.escape(str(tmp_path / "cifar-10-batches-py")) + ": no such folder; "
        "set task.data.download: true .* point task.data.root at the folder that contains "
        "the extracted official 'cifar-10-batches-py'",
    ):
        build({"source": "torchvision", "dataset": "CIFAR10", "root": str(tmp_path)})
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"truncated")
    with pytest.raises(
        DataError, match=r"cifar-10-batches-py: CIFAR10 cannot be loaded \(RuntimeError: Dataset not found or corrupted"
    ):
        build({"source": "torchvision", "dataset": "CIFAR10", "root": str(tmp_path)})
    assert cache_entries(cache_dir) == []


# --------------------------------------------------------------------------- augmentation


def normalized(datamodule, index: int, split: str = "train") -> torch.Tensor:
    """Item ``index`` of the training set (the dataset's training images less those held out for
    tuning) or of the validation set: its pixels scaled to [0, 1] and normalized by the channel
    statistics of the training set, computed here from its pixels."""
    images = datamodule.images
    source = images.train_images[datamodule.train_rows] if split == "train" else images.val_images
    trained = torch.from_numpy(images.train_images[datamodule.train_rows]).double() / 255
    mean, std = trained.mean(dim=(0, 1, 2)), trained.std(dim=(0, 1, 2), correction=0)
    pixels = torch.from_numpy(source[index]).permute(2, 0, 1).double() / 255
    return ((pixels - mean[:, None, None]) / std[:, None, None]).float()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, atol=1e-5)  # float rounding of the normalization


@pytest.fixture
def small_npz(cache_dir, subset, tmp_path) -> dict:
    return {"source": "npz", "path": str(write_small_npz(tmp_path / "small.npz", subset))}


def test_without_augmentation_train_items_are_the_normalized_pixels(small_npz):
    _, datamodule = build(small_npz, augment=NO_AUGMENT)
    datamodule.setup("fit")
    for index in (0, 5, 60):  # 61 of the 64 training images are trained on, 3 held out for tuning
        image, label = datamodule.train_set[index]
        torch.testing.assert_close(image, normalized(datamodule, index))
        assert label == int(datamodule.images.train_labels[datamodule.train_rows[index]])


def test_flip_and_crop_change_the_image_but_not_its_shape(small_npz):
    _, flipping = build(small_npz, augment={"random_crop_padding": 0, "horizontal_flip": True})
    flipping.setup("fit")
    plain = normalized(flipping, 7)
    torch.manual_seed(0)
    samples = [flipping.train_set[7][0] for _ in range(16)]
    flipped = [not same(s, plain) for s in samples]
    assert all(same(s, plain.flip(-1)) for s, f in zip(samples, flipped, strict=True) if f)
    assert any(flipped) and not all(flipped)

    _, cropping = build(small_npz, augment={"random_crop_padding": 4, "horizontal_flip": False, "randaugment": True})
    cropping.setup("fit")
    samples = [cropping.train_set[7][0] for _ in range(8)]
    assert all(s.shape == (3, 32, 32) for s in samples)
    assert any(not same(s, plain) for s in samples)
    for index in (0, 9):  # validation images are never augmented
        torch.testing.assert_close(cropping.val_set[index][0], normalized(cropping, index, "val"))


def test_training_batches_are_deterministic_given_the_seed(small_npz):
    _, datamodule = build(small_npz, augment={"randaugment": True})
    datamodule.setup("fit")
    batches = []
    for _ in range(2):
        L.seed_everything(3, verbose=False)
        batches.append(next(iter(datamodule.train_dataloader())))
    torch.testing.assert_close(batches[0], batches[1])


def test_mixup_and_cutmix_give_soft_targets_and_the_step_trains(small_npz):
    module, datamodule = build(small_npz, augment={"mixup_alpha": 0.4, "cutmix_alpha": 1.0})
    datamodule.setup("fit")
    module.log = module.log_dict = lambda *args, **kwargs: None  # no Trainer attached
    torch.manual_seed(0)
    images, targets = next(iter(datamodule.train_dataloader()))
    assert images.shape == (8, 3, 32, 32) and targets.shape == (8, 10) and targets.dtype == torch.float32
    torch.testing.assert_close(targets.sum(dim=1), torch.ones(8))
    assert (targets.max(dim=1).values < 1).any()  # mixed, not one-hot
    loss = module.training_step((images, targets), 0)
    assert torch.isfinite(loss)
    loss.backward()


# --------------------------------------------------------------------------- end to end


def test_lightning_fit_on_the_cifar10_subset_logs_validation_accuracy(cache_dir, tmp_path):
    L.seed_everything(0, verbose=False)
    module, datamodule = build({"source": "npz", "path": str(SUBSET)}, batch_size=32)
    trainer = L.Trainer(
        max_steps=2,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        limit_val_batches=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        accelerator="cpu",
    )
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 2 and module.last_validated_step == 2
    accuracy = float(trainer.callback_metrics["val/accuracy"])
    assert 0.0 <= accuracy <= 1.0 and torch.isfinite(trainer.callback_metrics["val/loss"])
