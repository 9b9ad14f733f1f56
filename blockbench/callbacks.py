"""Lightning callbacks of the runner."""

from __future__ import annotations

import math
import random
import time
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn

from .perf import (
    DataWaitProfiler,
    PeakFlops,
    StepTiming,
    count_training_flops,
    current_peak_memory_mb,
    peak_flops,
    step_statistics,
    synchronize,
)


class PerformanceMonitor(L.Callback):
    """Speed figures of the training steps (``result.json`` ``performance``, TensorBoard ``perf/*``).

    A step is one optimizer step with all its micro-batches. Its time runs from
    ``on_train_batch_start`` to ``on_train_batch_end``: forward, backward and optimizer, without
    fetching data, validation, checkpoints and logging between steps. Its data wait is the time
    the loop spent in ``next()`` on the training dataloader before its micro-batches, recorded by
    :attr:`data_wait` (pass it as ``Trainer(profiler=...)``). Model FLOPs are counted once, on the
    first batch of the run (see :func:`blockbench.perf.count_training_flops`); that count is not
    part of any step's time. The first ``warmup_steps`` steps after the start or a resume
    (allocation, torch.compile) are logged but left out of the statistics.

    Logged every ``log_every_n_steps`` (and after the first step): ``perf/step_time_ms``, ``perf/data_wait_fraction``,
    ``perf/tflops_per_sec`` and ``perf/mfu`` of that step, ``perf/peak_memory_mb`` so far, and
    ``perf/<unit>_per_sec`` (all processes) and ``..._per_process``, the mean over the timed steps
    so far; ``perf/flops_per_step`` once.
    """

    def __init__(self, unit: str, *, peak_tflops: float | None = None, warmup_steps: int = 3, count_flops: bool = True):
        self.unit = unit.replace(" ", "_")
        self.configured_peak_tflops = peak_tflops
        self.warmup_steps = warmup_steps
        self.count_flops = count_flops
        self.data_wait = DataWaitProfiler()
        self.peak: PeakFlops | None = None
        self.flops_per_batch: int | None = None
        self.accumulate_grad_batches = 1
        self.world_size = 1
        self.steps: list[StepTiming] = []
        self._flops_pending = False
        self._step = StepTiming()
        self._batch_start = 0.0
        self._last_global_step = 0

    # hooks ------------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.world_size = trainer.world_size
        self.accumulate_grad_batches = trainer.accumulate_grad_batches
        self.steps, self._step = [], StepTiming()
        self._last_global_step = trainer.global_step
        self._flops_pending = self.count_flops
        if self.peak is None:
            self.peak = peak_flops(self.configured_peak_tflops, pl_module.device, trainer.precision)
        self.data_wait.take()  # waits before the first step of this fit do not belong to it

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._step.data_wait += self.data_wait.take()
        if self._flops_pending:
            self._flops_pending = False
            self.flops_per_batch = self._count_flops(trainer, pl_module, batch)
        synchronize(pl_module.device)
        self._batch_start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        synchronize(pl_module.device)
        self._step.seconds += time.perf_counter() - self._batch_start
        self._step.items += pl_module.items_in_batch(batch)
        if trainer.global_step == self._last_global_step:
            return  # a micro-batch in the middle of a gradient accumulation window
        self._last_global_step = trainer.global_step
        step, self._step = self._step, StepTiming()
        self.steps.append(step)
        if trainer.global_step % trainer.log_every_n_steps == 0 or len(self.steps) == 1:
            self._log(trainer, pl_module, step)  # only what the logger writes: self.log costs time every call

    # figures ----------------------------------------------------------------------------------

    @property
    def flops_per_step(self) -> int | None:
        """Model FLOPs of one optimizer step of this process (all its micro-batches)."""
        return None if self.flops_per_batch is None else self.flops_per_batch * self.accumulate_grad_batches

    @property
    def timed_steps(self) -> list[StepTiming]:
        """The steps the statistics use: all but the warm-up steps (all, in a run that short)."""
        return self.steps[self.warmup_steps:] or self.steps

    @property
    def per_second_per_process(self) -> float:
        """This process's items per second over the timed steps (rank 0's, in the result)."""
        seconds = sum(s.seconds for s in self.timed_steps)
        return sum(s.items for s in self.timed_steps) / seconds if seconds else 0.0

    @property
    def per_second(self) -> float:
        """All processes together (each is assumed as fast as this one: they step in lockstep)."""
        return self.per_second_per_process * self.world_size

    def summary(self) -> dict[str, Any]:
        """The ``performance`` block of ``result.json``: see :func:`blockbench.perf.step_statistics`."""
        figures = step_statistics(self.steps, warmup_steps=self.warmup_steps, flops_per_step=self.flops_per_step,
                                  peak=self.peak)
        if self.steps and self.data_wait.fetches == 0:  # Lightning no longer reports the fetches as we expect
            figures["data_wait_ms"] = figures["data_wait_fraction"] = None
        if (figures.get("mfu") or 0) > 1:
            rank_zero_warn(f"MFU {figures['mfu']:.2f} is above 1: the peak of {figures['peak_tflops']} TFLOP/s "
                           f"({figures['peak_source']}) is too low, e.g. measured while the machine was busy; "
                           "set trainer.peak_tflops to the device's peak")
        return figures

    # internals --------------------------------------------------------------------------------

    def _count_flops(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> int | None:
        """FLOPs of ``training_loss`` on this batch, forward and backward. Under DDP this is the
        unwrapped module (no gradient sync); each process counts its own batch."""
        try:
            return count_training_flops(pl_module, lambda: pl_module.training_loss(batch),
                                        context=trainer.precision_plugin.train_step_context)
        except Exception as error:  # a figure is missing; training goes on
            rank_zero_warn(f"model FLOPs not counted ({type(error).__name__}: {error}); the result has no "
                           "flops_per_step, achieved_tflops or mfu")
            return None

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule, step: StepTiming) -> None:
        values = {"perf/step_time_ms": 1e3 * step.seconds,
                  "perf/peak_memory_mb": current_peak_memory_mb(pl_module.device)}
        if step.seconds + step.data_wait > 0:
            values["perf/data_wait_fraction"] = step.data_wait / (step.seconds + step.data_wait)
        if self.flops_per_step is not None and step.seconds > 0:
            values["perf/tflops_per_sec"] = self.flops_per_step / step.seconds / 1e12
            if self.peak is not None:
                values["perf/mfu"] = values["perf/tflops_per_sec"] / self.peak.tflops
        if len(self.steps) > self.warmup_steps:
            values[f"perf/{self.unit}_per_sec"] = self.per_second
            values[f"perf/{self.unit}_per_sec_per_process"] = self.per_second_per_process
        pl_module.log_dict(values, on_step=True, on_epoch=False)
        if len(self.steps) == 1 and self.flops_per_step is not None and trainer.is_global_zero:
            for logger in trainer.loggers:  # once, whatever log_every_n_steps is
                logger.log_metrics({"perf/flops_per_step": float(self.flops_per_step)}, step=trainer.global_step)


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
