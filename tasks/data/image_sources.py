"""Where the images of the image classification task come from: ``task.data``, one of four sources
picked by ``task.data.source`` (``npz``, ``imagefolder``, ``hf``, ``torchvision``; see
``tasks.data.images``, which reads and decodes them). Apart from the decoding so that validating a
config's ``task.data`` needs pydantic only, not torch or torchvision.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Source(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NpzSource(_Source):
    """A local ``.npz``: uint8 images (N, H, W, C) with C 1 or 3, and integer labels (N,) per split."""

    source: Literal["npz"] = "npz"
    path: str = Field(description="the .npz file")
    train_images_key: str = Field("x_train", description="array of the training images")
    train_labels_key: str = Field("y_train", description="array of the training labels")
    val_images_key: str = Field("x_test", description="array of the validation images")
    val_labels_key: str = Field("y_test", description="array of the validation labels")
    class_names_key: str | None = Field(
        "class_names", description="array of class names; when the file has none, classes are named by their ids"
    )


class ImageFolderSource(_Source):
    """A local folder ``path/<split>/<class>/<image>`` (PNG, JPEG, ...), listed by HF ``imagefolder``."""

    source: Literal["imagefolder"] = "imagefolder"
    path: str = Field(description="folder holding one subfolder per split")
    train_split: str = Field("train", description="subfolder with the training images")
    val_split: str = Field("test", description="subfolder with the validation images")


class HFSource(_Source):
    """A dataset on the HF hub, loaded with ``datasets.load_dataset`` (downloads on first use)."""

    source: Literal["hf"] = "hf"
    hf_path: str = Field(description="hub dataset id, e.g. uoft-cs/cifar10")
    hf_name: str | None = Field(None, description="dataset configuration name, if it has several")
    image_field: str = Field("img", description="record field holding the image")
    label_field: str = Field("label", description="record field holding the integer class label")
    train_split: str = Field("train", description="hub split with the training images")
    val_split: str = Field("test", description="hub split with the validation images")


class TorchvisionSource(_Source):
    """CIFAR-10/100 through ``torchvision.datasets`` from a local root."""

    source: Literal["torchvision"] = "torchvision"
    dataset: Literal["CIFAR10", "CIFAR100"] = Field(description="which torchvision dataset")
    root: str = Field(description="folder that contains the extracted cifar-10-batches-py / cifar-100-python")
    download: bool = Field(False, description="download into root when the files are missing")


ImageSource = Annotated[NpzSource | ImageFolderSource | HFSource | TorchvisionSource, Field(discriminator="source")]
IMAGE_SOURCES = tuple(
    cls.model_fields["source"].default for cls in (NpzSource, ImageFolderSource, HFSource, TorchvisionSource)
)
