"""Lightning callbacks of the runner."""

from __future__ import annotations

import math
import random
import time
from typing import Any

import lightning as L
import numpy as np
import torch


class TrainingThroughput(L.Callback):
    """Items (tokens or images) per second of training steps: forward, backward and optimizer step,
    excluding data loading, validation and logging between steps. Logged as ``perf/<unit>_per_sec``."""

    def __init__(self, unit: str):
        self.unit = unit.replace(" ", "_")
        self.items = 0
        self.seconds = 0.0
        self.world_size = 1
        self._start = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.seconds += time.perf_counter() - self._start
        self.items += pl_module.items_in_batch(batch)
        self.world_size = trainer.world_size
        pl_module.log(f"perf/{self.unit}_per_sec", self.per_second, on_step=True, on_epoch=False)
        pl_module.log(f"perf/{self.unit}_per_sec_per_process", self.per_second_per_process, on_step=True, on_epoch=False)

    @property
    def per_second_per_process(self) -> float:
        """This process's items per second (rank 0's, in the logs)."""
        return self.items / self.seconds if self.seconds else 0.0

    @property
    def per_second(self) -> float:
        """All processes together (each is assumed as fast as this one: they step in lockstep)."""
        return self.per_second_per_process * self.world_size


class ValidationHistory(L.Callback):
    """Every validation's metrics with its optimizer step and the seconds since training started
    (``result.json`` ``history``: the curves behind plots and time-to-target). Saved in checkpoints."""

    def __init__(self, metric_names: list[str]):
        self.metric_names = metric_names
        self.history: list[dict[str, Any]] = []
        self.elapsed_before = 0.0  # training seconds of the runs this one resumes
        self._start = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self._start

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or (self.history and self.history[-1]["step"] == trainer.global_step):
            return
        metrics = {name: float(trainer.callback_metrics[f"val/{name}"]) for name in self.metric_names
                   if f"val/{name}" in trainer.callback_metrics}
        self.history.append({"step": trainer.global_step, "time_s": round(self.elapsed(), 2), "metrics": metrics})

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "elapsed": self.elapsed()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history, self.elapsed_before = state["history"], state["elapsed"]


class DivergenceGuard(L.Callback):
    """Stops training when the training loss is not finite or exceeds ``threshold``, and remembers
    the step and the last finite loss: a diverged cell is a finding, recorded as such."""

    def __init__(self, threshold: float | None):
        self.threshold = threshold
        self.diverged_at_step: int | None = None
        self.diverging_loss: float | None = None
        self.last_finite_loss: float | None = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        value = float(loss.detach())
        if math.isfinite(value) and (self.threshold is None or value <= self.threshold):
            self.last_finite_loss = value
            return
        self.diverged_at_step, self.diverging_loss = trainer.global_step, value
        trainer.should_stop = True

    @property
    def diverged(self) -> bool:
        return self.diverged_at_step is not None


class ResumeState(L.Callback):
    """What a checkpoint needs beyond Lightning's own state for an exact resume: the run's config
    hash (a checkpoint of another config is never resumed) and the random number generators
    (restored just before the first resumed step)."""

    def __init__(self, config_hash: str):
        self.config_hash = config_hash
        self._pending_rng: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"config_hash": self.config_hash, "rng": _capture_rng()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["config_hash"] != self.config_hash:
            raise ValueError(f"checkpoint of config {state['config_hash']}, not of this run ({self.config_hash})")
        self._pending_rng = state["rng"]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._pending_rng is not None:
            _restore_rng(self._pending_rng)
            self._pending_rng = None


def _capture_rng() -> dict[str, Any]:
    """RNG states as tensors and plain values, so the checkpoint loads with ``weights_only=True``."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    numpy_state = [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gaussian]
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, position, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
