"""The logit lens of the token tasks (``task.logit_lens``): where in depth the prediction forms.

At each validation the LM tasks and the translation tasks decode every block of the stack that feeds
the vocabulary head (the LM's blocks, the translator's decoder) through the final norm and the output
head (``models.logit_lens_losses``), and log the validation loss each block's output would give as
``val/lens/layer{i}`` (block ``i``, counted from 0; the last is the model's own validation loss). The
forward pass is the one the validation loss needs anyway: the lens adds a head and a cross-entropy
per block before the last. The metric names and the ``task.logit_lens`` switch are in
``tasks.configs.lens``, which the report and the TensorBoard views read without torchmetrics.
"""

from __future__ import annotations

import torch
from torch import nn
from torchmetrics import MeanMetric

from .configs.lens import lens_metric


class LensLosses(nn.Module):
    """Each block's lens loss accumulated over the validation set, one torchmetrics ``MeanMetric``
    per block, weighted as the task weights its validation loss (the target tokens of a batch);
    reduced over all processes at ``compute``, as the task's own metrics are."""

    def __init__(self, depth: int):
        super().__init__()
        self.layers = nn.ModuleList(MeanMetric() for _ in range(depth))

    def update(self, losses: list[torch.Tensor], weight: torch.Tensor | float) -> None:
        """Add one batch: ``losses`` (its mean loss per block, first block first) over ``weight`` targets."""
        if len(losses) != len(self.layers):
            raise ValueError(f"logit lens: {len(losses)} losses for a stack of {len(self.layers)} blocks")
        for metric, loss in zip(self.layers, losses, strict=True):
            metric.update(loss, weight=weight)

    def compute(self) -> dict[str, torch.Tensor]:
        """``{"lens/layer0": loss, ...}`` over the whole validation set."""
        return {lens_metric(i): metric.compute() for i, metric in enumerate(self.layers)}

    def reset(self) -> None:
        for metric in self.layers:
            metric.reset()

    def pop(self) -> dict[str, torch.Tensor]:
        """:meth:`compute`, then :meth:`reset` for the next validation."""
        values = self.compute()
        self.reset()
        return values
