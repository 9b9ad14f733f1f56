"""Real-image classification with a ViT (``task.name: image_classification``).

The images come from a local ``.npz``, an image folder, a HF hub dataset or torchvision's
CIFAR-10/100 (``task.data.source``); ``tasks.data.images`` reads and decodes them once into the
blockbench disk cache.

Training images are augmented per item with ``torchvision.transforms.v2`` (random crop with
padding, horizontal flip, RandAugment) and optionally mixed per batch (MixUp/CutMix, giving soft
targets); validation images are only normalized. Metric: top-1 validation accuracy; baseline:
always predicting the class most frequent in the training labels.

``task.tuning_fraction`` of the training images, picked by a fixed permutation
(``base.held_out_for_tuning``), is always held out as the tuning split: never trained on, not in
the normalization statistics, and scored instead of the validation images with
``task.eval_split: tuning``.

The task's config, ``ImageTaskConfig``, is in ``tasks.configs.vision`` (validation imports it
without this module's Lightning code); ``build_image_classification`` below is the builder its
``build`` looks up (``tasks.builders``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate
from torchvision.transforms import v2

from blockbench.models import ModelConfig

from .base import TaskDataModule, WorkerRngState, held_out_for_tuning, with_data_fields
from .baselines import majority_class_accuracy
from .builders import builds
from .configs.base import OptimizerConfig
from .configs.vision import AugmentConfig, ImageTaskConfig
from .data.images import PreparedImages, channel_stats, prepare_images
from .vision import VisionTask

# --------------------------------------------------------------------------- datamodule


class ImageDataset(WorkerRngState, Dataset):
    """uint8 (N, C, H, W) images passed through ``transform`` per item (augmentation, then
    ToDtype + Normalize), with int64 labels. In DataLoader workers, their random generators are
    part of the loader's checkpoint (``WorkerRngState``), so augmentation resumes exactly."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor]):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.images[index]), self.labels[index]


class MixBatch:
    """DataLoader collate: stack the items, then MixUp/CutMix the batch (labels become soft targets)."""

    def __init__(self, mix: Callable[..., tuple[torch.Tensor, torch.Tensor]]):
        self.mix = mix

    def __call__(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mix(*default_collate(items))


def normalization(mean: list[float], std: list[float]) -> list[v2.Transform]:
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]


def augmentation(augment: AugmentConfig, image_size: int) -> list[v2.Transform]:
    steps: list[v2.Transform] = []
    if augment.random_crop_padding:
        steps.append(v2.RandomCrop(image_size, padding=augment.random_crop_padding))
    if augment.horizontal_flip:
        steps.append(v2.RandomHorizontalFlip())
    if augment.randaugment:
        steps.append(v2.RandAugment(num_ops=augment.randaugment_num_ops, magnitude=augment.randaugment_magnitude))
    return steps


def batch_mixing(augment: AugmentConfig, n_classes: int) -> v2.Transform | None:
    mixers = []
    if augment.mixup_alpha:
        mixers.append(v2.MixUp(alpha=augment.mixup_alpha, num_classes=n_classes))
    if augment.cutmix_alpha:
        mixers.append(v2.CutMix(alpha=augment.cutmix_alpha, num_classes=n_classes))
    if not mixers:
        return None
    return mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)


class ImageDataModule(TaskDataModule):
    def __init__(self, cfg: ImageTaskConfig, batch_size: int):
        super().__init__(batch_size)
        self.cfg = cfg
        self.images: PreparedImages | None = None
        #: whether the decoded images came from the disk cache (None until loaded)
        self.cache_hit: bool | None = None
        self.train_set: ImageDataset | None = None
        self.load_for(num_workers=0, pin_memory=False)

    def load_for(self, *, num_workers: int, pin_memory: bool) -> None:
        """As every task loads, with ``task.num_workers`` where set instead of ``num_workers``."""
        super().load_for(
            num_workers=num_workers if self.cfg.num_workers is None else self.cfg.num_workers, pin_memory=pin_memory
        )

    def load(self) -> PreparedImages:
        """Decode the images (or read them from the disk cache) once."""
        if self.images is None:
            self.images, self.cache_hit = prepare_images(
                self.cfg.data, image_size=self.cfg.image_size, channels=self.cfg.channels
            )
        return self.images

    def prepare_data(self) -> None:
        self.load()

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images = self.load()
        #: the dataset's training images this task trains on, and those it holds out for tuning (indices)
        self.train_rows, self.tuning_rows = held_out_for_tuning(len(images.train_labels), self.cfg.tuning_fraction)
        if len(self.train_rows) < self.batch_size:
            raise ValueError(
                f"{len(self.train_rows)} training images (after holding out task.tuning_fraction="
                f"{self.cfg.tuning_fraction}), fewer than one batch (trainer.batch_size={self.batch_size}); "
                "lower the batch size or add images"
            )
        train_images, self.train_labels = images.train_images[self.train_rows], images.train_labels[self.train_rows]
        if self.cfg.eval_split == "validation":
            val_images, self.val_labels = images.val_images, images.val_labels
        else:
            val_images, self.val_labels = images.train_images[self.tuning_rows], images.train_labels[self.tuning_rows]
        #: per-channel statistics of the images trained on (the tuning images left out)
        self.mean, self.std = channel_stats(train_images)
        normalize = normalization(self.mean, self.std)
        self.train_set = self._dataset(
            train_images, self.train_labels, augmentation(self.cfg.augment, self.cfg.image_size) + normalize
        )
        self.val_set = self._dataset(val_images, self.val_labels, normalize)

    @staticmethod
    def _dataset(images: np.ndarray, labels: np.ndarray, steps: list[v2.Transform]) -> ImageDataset:
        pixels = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
        return ImageDataset(pixels, torch.from_numpy(labels), v2.Compose(steps))

    def train_dataloader(self) -> DataLoader:
        mix = batch_mixing(self.cfg.augment, len(self.load().class_names))
        return self.training_loader(self.train_set, collate_fn=MixBatch(mix) if mix else None)

    def val_dataloader(self) -> DataLoader:
        return self.validation_loader(self.val_set)

    def data_summary(self) -> dict[str, Any]:
        self.setup()  # idempotent: the split into training and tuning images
        return {
            "n_classes": len(self.load().class_names),
            "train_images": len(self.train_labels),
            "val_images": len(self.val_labels),
            "tuning_images_held_out": len(self.tuning_rows),
        }

    def baselines(self) -> dict[str, float]:
        self.setup()
        return {"accuracy": majority_class_accuracy(self.train_labels, self.val_labels)}


@builds(ImageTaskConfig)
def build_image_classification(
    cfg: ImageTaskConfig,
    model: ModelConfig,
    optimizer: OptimizerConfig,
    *,
    max_steps: int,
    batch_size: int,
    seed: int = 0,
) -> tuple[VisionTask, ImageDataModule]:
    """The ``image_classification`` task's LightningModule and DataModule (``TaskConfig.build``): the
    images are decoded (or read from the cache) first, since the number of classes is the data's."""
    datamodule = ImageDataModule(cfg, batch_size)
    images = datamodule.load()  # decodes (or reads from the cache) to learn the number of classes
    model = with_data_fields(model, n_classes=len(images.class_names))
    return VisionTask(model, optimizer, max_steps), datamodule
