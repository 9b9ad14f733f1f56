"""Real images for the image classification task (``tasks.image``): sources, decoding, cache.

The images come from one of four sources (``task.data.source``; their config classes, which need
pydantic only, are in ``tasks.data.image_sources``):

- ``npz``: a local ``.npz`` with uint8 images (N, H, W, C) and integer labels per split
  (e.g. ``shared/data/cifar10_subset``);
- ``imagefolder``: a local folder with one subfolder per split and one class folder inside each,
  listed by HF ``datasets`` (the ``imagefolder`` builder works offline);
- ``hf``: a dataset on the HF hub (``uoft-cs/cifar10``); it downloads on first use and comes
  from the HF cache afterwards;
- ``torchvision``: CIFAR-10/100 through ``torchvision.datasets`` from a local root (torchvision
  checks the md5 of every official batch file).

Every source is decoded once into uint8 (N, S, S, C) arrays at ``image_size`` S and ``channels``
C (other sizes are resized with ``v2.Resize``, bilinear with antialiasing; RGB <-> grayscale is
converted) and stored, with the class names and the training set's per-channel mean and std, in
the blockbench disk cache (``tasks.data.cache``), so later runs skip decoding. Input that cannot
be used raises ``DataError`` naming the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchvision.transforms import v2

from . import DataError
from .cache import cached, file_fingerprint
from .image_sources import HFSource, ImageFolderSource, ImageSource, NpzSource, TorchvisionSource

log = logging.getLogger(__name__)

#: version of the cached layout; bump it when decoding changes so old cache folders are not reused
CACHE_FORMAT = 1


# --------------------------------------------------------------------------- decoding


@dataclass
class DecodedImages:
    """Both splits as uint8 (N, S, S, C) images and int64 labels indexing ``class_names``."""

    train_images: np.ndarray
    train_labels: np.ndarray
    val_images: np.ndarray
    val_labels: np.ndarray
    class_names: list[str]


@dataclass
class PreparedImages(DecodedImages):
    """Decoded images plus the training set's per-channel mean and std (pixels scaled to [0, 1])."""

    mean: list[float]
    std: list[float]


def decode_images(data: ImageSource, *, image_size: int, channels: int) -> DecodedImages:
    """Read and check the source, resized to ``image_size`` and converted to ``channels``."""
    if isinstance(data, NpzSource):
        decoded = read_npz(data)
    elif isinstance(data, ImageFolderSource):
        decoded = read_image_folder(data, channels, image_size)
    elif isinstance(data, HFSource):
        decoded = read_hf(data, channels, image_size)
    else:
        decoded = read_torchvision(data)
    for split in ("train", "val"):
        images = getattr(decoded, f"{split}_images")
        setattr(decoded, f"{split}_images", to_channels(resize(images, image_size), channels))
        setattr(decoded, f"{split}_labels", getattr(decoded, f"{split}_labels").astype(np.int64))
    return decoded


def read_npz(data: NpzSource) -> DecodedImages:
    path = Path(data.path)
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:  # garbage bytes, a pickle, a truncated zip
        raise DataError(f"{path}: not a readable .npz archive ({type(exc).__name__}: {exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(
            f"{path}: a single .npy array, not a .npz archive with named arrays (expected {data.train_images_key}, ...)"
        )
    with archive:
        present = sorted(archive.files)

        def array(key: str, field: str) -> np.ndarray:
            if key not in archive.files:
                raise DataError(
                    f"{path}: no array '{key}' (task.data.{field}); the file has: {', '.join(present) or 'no arrays'}"
                )
            try:
                return archive[key]
            except Exception as exc:
                raise DataError(f"{path}: array '{key}' cannot be read ({type(exc).__name__}: {exc})") from None

        splits = {}
        for split in ("train", "val"):
            images_key, labels_key = getattr(data, f"{split}_images_key"), getattr(data, f"{split}_labels_key")
            images = array(images_key, f"{split}_images_key")
            labels = array(labels_key, f"{split}_labels_key")
            check_images(images, where=f"{path}: '{images_key}'")
            check_labels(labels, len(images), where=f"{path}: '{labels_key}'", images_name=f"'{images_key}'")
            splits[split] = (images, labels)
        names = None
        if data.class_names_key and data.class_names_key in archive.files:
            names = [str(n) for n in array(data.class_names_key, "class_names_key").reshape(-1)]
    class_names = names or class_ids_as_names(splits["train"][1], splits["val"][1])
    for split, (_, labels) in splits.items():
        key = getattr(data, f"{split}_labels_key")
        check_label_range(labels, len(class_names), where=f"{path}: '{key}'")
    return DecodedImages(*splits["train"], *splits["val"], class_names=class_names)


def read_image_folder(data: ImageFolderSource, channels: int, image_size: int) -> DecodedImages:
    """List ``path/<split>/<class>/*`` with HF ``imagefolder`` (classes: the union over both splits),
    then decode every file with PIL so that an undecodable one is reported by name."""
    import datasets

    folder = Path(data.path)
    for split in (data.train_split, data.val_split):
        if not (folder / split).is_dir():
            subfolders = sorted(p.name for p in folder.iterdir() if p.is_dir())
            raise DataError(
                f"{folder}: no split folder '{split}' (task.data.train_split / val_split); "
                f"it has: {', '.join(subfolders) or 'no subfolders'}"
            )
    files = {"train": str(folder / data.train_split / "**"), "validation": str(folder / data.val_split / "**")}
    with tempfile.TemporaryDirectory(prefix="blockbench-imagefolder-") as hf_cache:  # our cache keeps the result
        try:
            splits = datasets.load_dataset("imagefolder", data_files=files, cache_dir=hf_cache)
        except Exception as exc:
            raise DataError(f"{folder}: HF imagefolder cannot list the images ({type(exc).__name__}: {exc})") from None
        train, val = splits["train"], splits["validation"]
        if "label" not in train.column_names:
            raise DataError(f"{folder}: no class folders found; put the images in {folder}/<split>/<class name>/")
        class_names = list(train.features["label"].names)
        return DecodedImages(
            *decode_column(train, "image", "label", channels, image_size, where=f"{folder / data.train_split}"),
            *decode_column(val, "image", "label", channels, image_size, where=f"{folder / data.val_split}"),
            class_names=class_names,
        )


def read_hf(data: HFSource, channels: int, image_size: int) -> DecodedImages:
    import datasets

    where = f"HF dataset {data.hf_path}" + (f" ({data.hf_name})" if data.hf_name else "")
    splits = {}
    for split in (data.train_split, data.val_split):
        try:
            splits[split] = datasets.load_dataset(data.hf_path, data.hf_name, split=split)
        except Exception as exc:
            raise DataError(
                f"{where}, split '{split}': cannot load ({type(exc).__name__}: {exc}); hub datasets download on "
                "first use and need network access then, later runs read the HF cache"
            ) from None
    for split, dataset in splits.items():
        for field, key in ((data.image_field, "image_field"), (data.label_field, "label_field")):
            if field not in dataset.column_names:
                raise DataError(
                    f"{where}, split '{split}': no column '{field}' (task.data.{key}); "
                    f"the columns are: {', '.join(dataset.column_names)}"
                )
    train, val = splits[data.train_split], splits[data.val_split]
    label_feature = train.features[data.label_field]
    decoded_train = decode_column(
        train, data.image_field, data.label_field, channels, image_size, where=f"{where}, split '{data.train_split}'"
    )
    decoded_val = decode_column(
        val, data.image_field, data.label_field, channels, image_size, where=f"{where}, split '{data.val_split}'"
    )
    if isinstance(label_feature, datasets.ClassLabel):
        class_names = list(label_feature.names)
    else:
        class_names = class_ids_as_names(decoded_train[1], decoded_val[1])
    check_label_range(
        decoded_train[1], len(class_names), where=f"{where}, split '{data.train_split}', column '{data.label_field}'"
    )
    check_label_range(
        decoded_val[1], len(class_names), where=f"{where}, split '{data.val_split}', column '{data.label_field}'"
    )
    return DecodedImages(*decoded_train, *decoded_val, class_names=class_names)


def decode_column(
    dataset: Any, image_field: str, label_field: str, channels: int, image_size: int, *, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """Decode an HF image column with PIL (mode ``RGB`` or ``L``) into uint8 (N, S, S, C) at
    ``image_size`` S. An undecodable image raises DataError naming its file (or row)."""
    import datasets
    from PIL import Image

    mode = "RGB" if channels == 3 else "L"
    column = dataset.select_columns([image_field, label_field]).cast_column(image_field, datasets.Image(decode=False))
    images: list[np.ndarray] = []
    labels: list[Any] = []
    for batch in column.iter(batch_size=1024):
        for encoded, label in zip(batch[image_field], batch[label_field], strict=True):
            name = encoded.get("path") or f"{where}, row {len(images)}"
            try:
                source = io.BytesIO(encoded["bytes"]) if encoded.get("bytes") is not None else encoded["path"]
                with Image.open(source) as image:
                    pixels = np.asarray(image.convert(mode))
            except Exception as exc:
                raise DataError(
                    f"{name}: cannot decode the image ({type(exc).__name__}: {exc}); replace or remove it"
                ) from None
            pixels = pixels.reshape(*pixels.shape[:2], channels)
            images.append(resize(pixels[None], image_size)[0])
            labels.append(label)
    if not images:
        raise DataError(f"{where}: no images")
    label_array = np.asarray(labels)
    check_labels(label_array, len(images), where=f"{where}, column '{label_field}'", images_name="images")
    return np.stack(images), label_array


def read_torchvision(data: TorchvisionSource) -> DecodedImages:
    dataset_class = torchvision_dataset_class(data)
    folder = Path(data.root) / dataset_class.base_folder
    if not data.download and not folder.is_dir():
        raise DataError(f"{folder}: no such folder; {missing_torchvision_hint(data)}")
    try:
        train = dataset_class(data.root, train=True, download=data.download)
        val = dataset_class(data.root, train=False, download=data.download)
    except Exception as exc:  # "Dataset not found or corrupted" (md5 check), download failures
        raise DataError(
            f"{folder}: {data.dataset} cannot be loaded ({type(exc).__name__}: {exc}); {missing_torchvision_hint(data)}"
        ) from None
    return DecodedImages(
        train.data, np.asarray(train.targets), val.data, np.asarray(val.targets), class_names=list(train.classes)
    )


def torchvision_dataset_class(data: TorchvisionSource) -> type:
    import torchvision.datasets

    return getattr(torchvision.datasets, data.dataset)


def missing_torchvision_hint(data: TorchvisionSource) -> str:
    folder = torchvision_dataset_class(data).base_folder
    return (
        f"set task.data.download: true to download {data.dataset} into task.data.root, or point task.data.root "
        f"at the folder that contains the extracted official '{folder}' (torchvision checks each file's md5)"
    )


def check_images(images: np.ndarray, *, where: str) -> None:
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3) or len(images) == 0:
        raise DataError(
            f"{where}: expected non-empty uint8 images of shape (N, H, W, C) with C 1 or 3; "
            f"got {images.dtype} of shape {images.shape}"
        )


def check_labels(labels: np.ndarray, n_images: int, *, where: str, images_name: str) -> None:
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(
            f"{where}: expected integer class ids of shape (N,); got {labels.dtype} of shape {labels.shape}"
        )
    if len(labels) != n_images:
        raise DataError(
            f"{where}: {len(labels)} labels for {n_images} {images_name}; both must have one entry per image"
        )


def check_label_range(labels: np.ndarray, n_classes: int, *, where: str) -> None:
    if n_classes < 2:
        raise DataError(f"{where}: only {n_classes} class; classification needs at least 2")
    if labels.min() < 0 or labels.max() >= n_classes:
        raise DataError(f"{where}: labels range over {labels.min()}..{labels.max()}, but there are {n_classes} classes")


def class_ids_as_names(*label_arrays: np.ndarray) -> list[str]:
    """Class names "0", "1", ... when the source has none (one per id up to the largest label)."""
    return [str(i) for i in range(int(max(labels.max() for labels in label_arrays)) + 1)]


def resize(images: np.ndarray, height: int, width: int | None = None, chunk: int = 4096) -> np.ndarray:
    """uint8 (N, H, W, C) images at (height, width) via ``v2.functional.resize`` (bilinear, antialias)."""
    width = width or height
    if images.shape[1:3] == (height, width):
        return images
    out = []
    for start in range(0, len(images), chunk):
        batch = torch.from_numpy(np.ascontiguousarray(images[start : start + chunk])).permute(0, 3, 1, 2)
        out.append(v2.functional.resize(batch, [height, width], antialias=True).permute(0, 2, 3, 1).numpy())
    return np.concatenate(out)


def to_channels(images: np.ndarray, channels: int) -> np.ndarray:
    """uint8 (N, H, W, C) images with ``channels`` channels (RGB <-> grayscale)."""
    if images.shape[-1] == channels:
        return images
    if channels == 3:
        return np.repeat(images, 3, axis=-1)
    gray = v2.functional.rgb_to_grayscale(torch.from_numpy(images).permute(0, 3, 1, 2))
    return gray.permute(0, 2, 3, 1).numpy()


def channel_stats(images: np.ndarray, chunk: int = 4096) -> tuple[list[float], list[float]]:
    """Per-channel mean and (population) std of uint8 images, scaled to [0, 1]."""
    total = np.zeros(images.shape[-1])
    squares = np.zeros(images.shape[-1])
    for start in range(0, len(images), chunk):
        pixels = images[start : start + chunk].reshape(-1, images.shape[-1]).astype(np.float64) / 255
        total += pixels.sum(axis=0)
        squares += (pixels**2).sum(axis=0)
    count = images.size / images.shape[-1]
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 1e-12))
    return mean.tolist(), std.tolist()


# --------------------------------------------------------------------------- cache


ARRAYS = ("train_images", "train_labels", "val_images", "val_labels")


def folder_fingerprint(folder: Path) -> dict[str, Any]:
    """What identifies a folder's content cheaply: every file's relative path, size and mtime."""
    digest = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    for file in files:
        stat = file.stat()
        digest.update(f"{file.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return {"path": str(folder.resolve()), "files": len(files), "listing_sha256": digest.hexdigest()}


def source_description(data: ImageSource, *, image_size: int, channels: int) -> dict[str, Any]:
    """Everything that shapes the decoded arrays: the cache key. Local inputs are fingerprinted
    (a changed file is decoded again); hub datasets are identified by path, name and splits.
    Missing or empty local inputs raise DataError here, before any cache folder exists."""
    description: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "image_size": image_size,
        "channels": channels,
        **data.model_dump(exclude={"download"}),
    }
    if isinstance(data, NpzSource):
        path = Path(data.path)
        if not path.is_file():
            problem = "a folder, not a file" if path.is_dir() else "no such file"
            raise DataError(f"{path}: {problem}; set task.data.path to a .npz with uint8 images and integer labels")
        if path.stat().st_size == 0:
            raise DataError(f"{path}: the file is empty; expected a .npz archive (numpy.savez) with images and labels")
        description["file"] = file_fingerprint(path)
    elif isinstance(data, ImageFolderSource):
        folder = Path(data.path)
        if not folder.is_dir():
            raise DataError(
                f"{folder}: no such folder; set task.data.path to a folder laid out as <split>/<class>/<image>"
            )
        description["folder"] = folder_fingerprint(folder)
    elif isinstance(data, TorchvisionSource):
        folder = Path(data.root) / torchvision_dataset_class(data).base_folder
        if not folder.is_dir() and not data.download:
            raise DataError(f"{folder}: no such folder; {missing_torchvision_hint(data)}")
        description["folder"] = folder_fingerprint(folder) if folder.is_dir() else None
    return description


def save_prepared(decoded: DecodedImages, folder: Path) -> None:
    for name in ARRAYS:
        np.save(folder / f"{name}.npy", getattr(decoded, name))
    mean, std = channel_stats(decoded.train_images)
    (folder / "meta.json").write_text(
        json.dumps({"class_names": decoded.class_names, "mean": mean, "std": std}, indent=2)
    )


def load_prepared(folder: Path) -> PreparedImages:
    meta = json.loads((folder / "meta.json").read_text())
    arrays = {name: np.load(folder / f"{name}.npy") for name in ARRAYS}
    return PreparedImages(**arrays, class_names=meta["class_names"], mean=meta["mean"], std=meta["std"])


def prepare_images(data: ImageSource, *, image_size: int, channels: int) -> tuple[PreparedImages, bool]:
    """The images of ``data`` at ``image_size`` with ``channels`` from the disk cache, decoding them
    on first use; and whether they came from the cache."""
    shape = {"image_size": image_size, "channels": channels}
    description = source_description(data, **shape)
    folder, hit = cached("images", description, lambda tmp: save_prepared(decode_images(data, **shape), tmp))
    log.info("images %s cache folder %s", "from" if hit else "decoded into", folder)
    return load_prepared(folder), hit
