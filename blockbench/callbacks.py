"""Lightning callbacks of the runner."""

from __future__ import annotations

import time
from typing import Any

import lightning as L


class TrainingThroughput(L.Callback):
    """Items (tokens or images) per second of training steps: forward, backward and optimizer step,
    excluding data loading, validation and logging between steps. Logged as ``perf/<unit>_per_sec``."""

    def __init__(self, unit: str):
        self.unit = unit.replace(" ", "_")
        self.items = 0
        self.seconds = 0.0
        self._start = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.seconds += time.perf_counter() - self._start
        self.items += pl_module.items_in_batch(batch) * trainer.world_size
        pl_module.log(f"perf/{self.unit}_per_sec", self.per_second, on_step=True, on_epoch=False)

    @property
    def per_second(self) -> float:
        return self.items / self.seconds if self.seconds else 0.0
