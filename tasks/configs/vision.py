"""The configs of the two image classification tasks: ``vit`` (rendered shapes) and
``image_classification`` (real images) with its augmentation, and the margin and saturation of their
headline accuracy. Their Lightning code is in ``tasks.vision`` and ``tasks.image``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..data.image_sources import ImageSource
from ..data.shapes import DEFAULT_MAX_SHAPES, DEFAULT_PIXEL_NOISE_STD, MAX_SHAPES
from ..metrics import Margin, Metric, Saturation
from .base import EmbeddedTaskConfig, RealDataTaskConfig

#: the margin and the saturation of the image tasks' headline accuracy (``vit`` and ``image_classification``)
ACCURACY_MARGIN = Margin(
    value=0.01,
    relative=False,
    reason="one point of top-1 accuracy (20 of vit's 2,000 validation images; on an image task, one hundredth of "
    "the images it scores), as one BLEU point for the translator: a smaller difference is no reason to choose one "
    "block over another",
)
ACCURACY_SATURATION = Saturation(
    distance=0.0025,
    of="best",
    reason="within a quarter point of 100% accuracy the images left wrong are a handful (5 of vit's 2,000): "
    "accuracy cannot rank the two models",
)


class VisionTaskConfig(EmbeddedTaskConfig):
    family = "vit"
    throughput_unit = "images"
    description = "ViT classification of rendered shapes whose label needs global context"
    baseline_description = "always predicting the class most frequent in training (scored on the validation set)"
    metrics = (
        Metric(name="accuracy", higher_is_better=True, description="top-1 validation accuracy", low=0, high=1),
        Metric(name="loss", higher_is_better=False, description="validation cross-entropy", low=0),
    )

    margin = ACCURACY_MARGIN
    saturation = ACCURACY_SATURATION
    harder = "more shapes and more pixel noise (task.max_shapes: 9, task.pixel_noise: 24)"

    name: Literal["vit"] = "vit"
    n_train: int = Field(20_000, gt=0, description="training images")
    n_val: int = Field(
        2_000, gt=0, description="validation images (rendered from another seed); the tuning split has as many"
    )
    image_size: int = Field(32, gt=0, description="side of the rendered images in pixels")
    max_shapes: int = Field(
        DEFAULT_MAX_SHAPES,
        gt=1,
        le=MAX_SHAPES,
        description="the most shapes an image shows, and so the number of classes (harder: more)",
    )
    pixel_noise: float = Field(
        DEFAULT_PIXEL_NOISE_STD, ge=0, description="standard deviation of the pixel noise in grey levels (harder: more)"
    )

    def model_overrides(self) -> dict[str, Any]:
        return {"family": self.family, "image_size": self.image_size, "in_channels": 3, "n_classes": self.max_shapes}


class AugmentConfig(BaseModel):
    """Training-time augmentation (``torchvision.transforms.v2``); validation images are never augmented."""

    model_config = ConfigDict(extra="forbid")

    random_crop_padding: int = Field(4, ge=0, description="pad by this many pixels, then crop back at random; 0 = off")
    horizontal_flip: bool = Field(True, description="flip left-right with probability 0.5")
    randaugment: bool = Field(False, description="RandAugment (Cubuk et al. 2020) after crop and flip")
    randaugment_num_ops: int = Field(2, ge=1, description="RandAugment: operations applied to each image")
    randaugment_magnitude: int = Field(9, ge=0, le=30, description="RandAugment: strength of every operation (0 to 30)")
    mixup_alpha: float = Field(0.0, ge=0, description="MixUp Beta(alpha, alpha) per batch; 0 = off")
    cutmix_alpha: float = Field(
        0.0, ge=0, description="CutMix Beta(alpha, alpha) per batch; 0 = off (both on: one at random)"
    )


class ImageTaskConfig(RealDataTaskConfig):
    family = "vit"
    throughput_unit = "images"
    description = "ViT classification of real images (npz, image folder, HF hub or torchvision CIFAR)"
    baseline_description = "always predicting the class most frequent in training (scored on the validation set)"
    metrics = (
        Metric(name="accuracy", higher_is_better=True, description="top-1 validation accuracy", low=0, high=1),
        Metric(name="loss", higher_is_better=False, description="validation cross-entropy", low=0),
    )
    data_decided_fields = ("n_classes",)
    seed_also_varies = "the order of the training data, augmentation, the initialisation and dropout"
    margin = ACCURACY_MARGIN
    saturation = ACCURACY_SATURATION

    name: Literal["image_classification"] = "image_classification"
    data: ImageSource = Field(description="where the images come from: task.data.source picks the kind of source")
    image_size: int = Field(32, gt=0, description="images of another size are resized to image_size x image_size")
    channels: Literal[1, 3] = Field(3, description="3 = RGB, 1 = grayscale; images are converted when decoded")
    augment: AugmentConfig = AugmentConfig()
    num_workers: int | None = Field(
        None, ge=0, description="DataLoader worker processes for the training set (null: trainer.num_workers)"
    )

    def model_overrides(self) -> dict[str, Any]:
        return {"family": self.family, "image_size": self.image_size, "in_channels": self.channels}
