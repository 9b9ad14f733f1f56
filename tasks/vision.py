"""Image classification of procedurally rendered shapes with a ViT (``task.name: vit``).

Metric: top-1 accuracy on a held-out set rendered from another seed. Baseline: always
predicting the class most frequent in the training labels.

The task's config, ``VisionTaskConfig``, is in ``tasks.configs.vision`` (validation imports it without this
module's Lightning code); ``build_vit`` below is the builder its ``build`` looks up (``tasks.builders``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from blockbench.models import ModelConfig

from .base import TaskDataModule, TaskModule
from .baselines import majority_class_accuracy
from .builders import builds
from .configs.base import OptimizerConfig
from .configs.vision import VisionTaskConfig
from .data.shapes import ShapesDataset, generate_shapes


def to_tensor_dataset(data: ShapesDataset, mean: torch.Tensor, std: torch.Tensor) -> TensorDataset:
    """uint8 (N, H, W, C) images -> normalized float (N, C, H, W), labels as int64."""
    images = torch.from_numpy(data.images).permute(0, 3, 1, 2).float().div_(255)
    return TensorDataset((images - mean) / std, torch.from_numpy(data.labels))


class ShapesDataModule(TaskDataModule):
    """The rendered images of the ``vit`` task of a run with training seed ``seed``: drawn from the
    task's data seed for it (``data_seed_for``)."""

    def __init__(self, cfg: VisionTaskConfig, batch_size: int, *, seed: int = 0):
        super().__init__(batch_size)
        self.cfg = cfg
        self.data_seed = cfg.data_seed_for(seed)
        self.train_set: TensorDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        # training, validation and tuning images come from independent seeds derived from the data seed
        # (generate_state(3)'s first two are generate_state(2)'s: a fixed seed draws what it drew before)
        train_seed, val_seed, tuning_seed = np.random.SeedSequence(self.data_seed).generate_state(3)
        held_out_seed = val_seed if self.cfg.eval_split == "validation" else tuning_seed
        cfg = self.cfg
        train, self.val_data = (
            generate_shapes(
                n_images=n,
                seed=int(seed),
                image_size=cfg.image_size,
                max_shapes=cfg.max_shapes,
                pixel_noise_std=cfg.pixel_noise,
            )
            for n, seed in ((cfg.n_train, train_seed), (cfg.n_val, held_out_seed))
        )
        pixels = torch.from_numpy(train.images).float().div_(255)
        mean, std = pixels.mean(dim=(0, 1, 2))[:, None, None], pixels.std(dim=(0, 1, 2))[:, None, None]
        self.train_labels = train.labels  # the majority-class baseline picks its class from these
        self.train_set = to_tensor_dataset(train, mean, std)
        self.val_set = to_tensor_dataset(self.val_data, mean, std)

    def train_dataloader(self) -> DataLoader:
        return self.training_loader(self.train_set)

    def val_dataloader(self) -> DataLoader:
        return self.validation_loader(self.val_set)

    def baselines(self) -> dict[str, float]:
        return {"accuracy": majority_class_accuracy(self.train_labels, self.val_data.labels)}


def classification_loss(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's class logits; ``labels`` are class ids or (MixUp/CutMix) class
    probabilities (the model's ``loss``: compiled with its forward under ``model.compile: true``)."""
    return model.loss(images, labels)


class VisionTask(TaskModule):
    def __init__(self, model: ModelConfig, optimizer: OptimizerConfig, max_steps: int):
        super().__init__(model, optimizer, max_steps)
        self.val_loss = MeanMetric()
        self.val_accuracy = MulticlassAccuracy(num_classes=model.n_classes, average="micro")

    def items_in_batch(self, batch: Any) -> int:
        return len(batch[0])

    def training_loss(self, batch: Any) -> torch.Tensor:
        return classification_loss(self.model, *batch)

    def validation_loss(self, batch: Any) -> tuple[torch.Tensor, int]:
        images, labels = batch
        return F.cross_entropy(self.model(images), labels), len(labels)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels = batch
        logits = self.model(images)
        self.val_loss.update(F.cross_entropy(logits, labels), weight=len(labels))
        self.val_accuracy.update(logits, labels)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self.log_validation({"loss": self.val_loss.compute(), "accuracy": self.val_accuracy.compute()})
        self.val_loss.reset()
        self.val_accuracy.reset()


@builds(VisionTaskConfig)
def build_vit(
    cfg: VisionTaskConfig,
    model: ModelConfig,
    optimizer: OptimizerConfig,
    *,
    max_steps: int,
    batch_size: int,
    seed: int = 0,
) -> tuple[VisionTask, ShapesDataModule]:
    """The ``vit`` task's LightningModule and DataModule (``TaskConfig.build``)."""
    return VisionTask(model, optimizer, max_steps), ShapesDataModule(cfg, batch_size, seed=seed)
