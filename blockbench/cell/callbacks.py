"""Lightning callbacks of the runner."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from blockbench.tasks.rng import capture_rng, restore_rng

from ..store.record import Hardware
from ..tensorboard.names import CURVE_TAG
from ..walltime import WallClock
from .perf import (
    DataWaitProfiler,
    PeakFlops,
    StepTiming,
    WallTimeProfiler,
    count_training_flops,
    current_peak_memory_mb,
    elapsed_seconds,
    peak_flops,
    record_event,
    runs_ahead,
    step_statistics,
)


class PerformanceMonitor(L.Callback):
    """Speed figures of the training steps (``result.json`` ``performance``, TensorBoard ``perf/*``).

    A step is one optimizer step with all its micro-batches. Its time runs from
    ``on_train_batch_start`` to ``on_train_batch_end``: forward, backward and optimizer, without
    fetching data, validation, checkpoints and logging between steps. On a CPU it is the host's
    clock; on a GPU, where the host runs ahead of the work it queues (:func:`blockbench.cell.perf.runs_ahead`),
    it is the GPU's, from a pair of CUDA events recorded at those two hooks and read only when the
    figures are logged and at the end of training: the host never waits for the GPU inside a step
    (as nanoGPT and litgpt time it). Its data wait is the time
    the loop spent in ``next()`` on the training dataloader before its micro-batches, recorded by
    :attr:`data_wait` (pass it as ``Trainer(profiler=...)``). Model FLOPs are counted once, on the
    first batch of the run (see :func:`blockbench.cell.perf.count_training_flops`); that count is not
    part of any step's time. The first ``warmup_steps`` steps after the start or a resume
    (allocation, torch.compile) are logged but left out of the statistics. MFU divides by
    :func:`blockbench.cell.peak.peak_flops`: ``trainer.peak_tflops``, the datasheet peak of a known GPU,
    or this machine's cached probe for the run's compute dtype and intra-op threads, one figure for
    every cell that trains like this.

    Logged every ``log_every_n_steps`` (and, on a CPU, after the first step): ``perf/step_time_ms``,
    ``perf/data_wait_fraction``, ``perf/tflops_per_sec`` and ``perf/mfu`` of that step (no
    ``perf/mfu`` in a step above the peak), ``perf/peak_memory_mb`` so far, and
    ``perf/<unit>_per_sec`` (all processes) and ``..._per_process``, the mean over the timed steps
    so far; ``perf/flops_per_step`` once.

    With a ``clock``, each step's host time also counts as its ``train_steps`` part and :attr:`data_wait`
    is a :class:`WallTimeProfiler` that tells it the other parts (``result.json`` ``wall_time_breakdown``);
    this callback marks the end of Lightning's fit set-up (``fit_setup``, at ``on_train_start``), the FLOP
    count (``flop_count``), the training loop between the steps (``loop``) and, from ``on_train_end``, the
    ``teardown``; :meth:`first_step_excess` is the first step's host time beyond the steady steps' median.
    (On a GPU, work still queued when a step's hooks return counts in the part that waits for it.)
    """

    def __init__(
        self,
        unit: str,
        *,
        peak_tflops: float | None = None,
        warmup_steps: int = 3,
        count_flops: bool = True,
        clock: WallClock | None = None,
    ):
        self.unit = unit.replace(" ", "_")
        self.configured_peak_tflops = peak_tflops
        self.warmup_steps = warmup_steps
        self.count_flops = count_flops
        self.clock = clock
        self.data_wait = DataWaitProfiler() if clock is None else WallTimeProfiler(clock)
        self.peak: PeakFlops | None = None
        self.flops_per_batch: int | None = None
        self.accumulate_grad_batches = 1
        self.world_size = 1
        self.steps: list[StepTiming] = []
        self._flops_pending = False
        self._step = StepTiming()
        self._batch_start = 0.0
        self._last_global_step = 0
        self._events = False  # steps timed by CUDA events (on a GPU), else by the host's clock
        self._start_event: Any = None
        self._step_spans: list[tuple[Any, Any]] = []  # this step's micro-batches' (start, end) events
        self._unread: list[tuple[StepTiming, list[tuple[Any, Any]]]] = []  # steps whose events are not read yet
        self._host_seconds: list[float] = []  # each training batch's host time in this fit (the wall clock's)

    # hooks ------------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.world_size = trainer.world_size
        self.accumulate_grad_batches = trainer.accumulate_grad_batches
        self.steps, self._step = [], StepTiming()
        self._step_spans, self._unread = [], []
        self._events = runs_ahead(pl_module.device)
        self._last_global_step = trainer.global_step
        self._flops_pending = self.count_flops
        if self.peak is None:  # the cached probe (measured here only if nothing measured it before)
            self.peak = peak_flops(self.configured_peak_tflops, pl_module.device, trainer.precision)
        self.data_wait.take()  # waits before the first step of this fit do not belong to it
        self._host_seconds = []
        if self.clock is not None:
            self.clock.exit("fit_setup")
            self.clock.enter("loop")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step.data_wait += self.data_wait.take()
        if self._flops_pending:
            self._flops_pending = False
            if self.clock is not None:
                self.clock.enter("flop_count")
            self.flops_per_batch = self._count_flops(trainer, pl_module, batch)
            if self.clock is not None:
                self.clock.exit("flop_count")
        self._batch_start = time.perf_counter()
        if self._events:
            self._start_event = record_event()
        if self.clock is not None:
            self.clock.enter("train_steps", at=self._batch_start)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        end = time.perf_counter()
        self._host_seconds.append(end - self._batch_start)
        if self._events:
            self._step_spans.append((self._start_event, record_event()))
        else:
            self._step.seconds += end - self._batch_start
        if self.clock is not None:
            self.clock.exit("train_steps", at=end)
        items = pl_module.items_in_batch(batch)  # a count, or a tensor of one on the device (read with the times)
        self._step.items += int(items) if isinstance(items, torch.Tensor) and not self._events else items
        if trainer.global_step == self._last_global_step:
            return  # a micro-batch in the middle of a gradient accumulation window
        self._last_global_step = trainer.global_step
        step, self._step = self._step, StepTiming()
        self.steps.append(step)
        if self._events:
            self._unread.append((step, self._step_spans))
            self._step_spans = []
        log_step = trainer.global_step % trainer.log_every_n_steps == 0
        if log_step or (len(self.steps) == 1 and not self._events):
            self.read_step_times()  # on a GPU the one wait for it in log_every_n_steps steps
            self._log(trainer, pl_module, step)  # only what the logger writes: self.log costs time every call
        if len(self.steps) == 1 and self.flops_per_step is not None and trainer.is_global_zero:
            for logger in trainer.loggers:  # once, whatever log_every_n_steps is
                logger.log_metrics({"perf/flops_per_step": float(self.flops_per_step)}, step=trainer.global_step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.clock is not None:
            self.clock.exit("loop")
            self.clock.enter("teardown")
        self.read_step_times()

    def first_step_excess(self) -> float:
        """Host seconds of this fit's first training batch beyond the median of the others: the first
        call of each kernel (allocations, cuDNN's execution plans for new shapes, lazy set-up); 0 with
        fewer than two batches."""
        if len(self._host_seconds) < 2:
            return 0.0
        first, *rest = self._host_seconds
        return max(0.0, first - statistics.median(rest))

    def read_step_times(self) -> None:
        """Fill in the seconds (and item counts) of the steps timed by CUDA events since the last read:
        one host synchronisation, a wait for the GPU to reach the last of them; nothing to do on a CPU."""
        if self._unread:
            seconds = iter(elapsed_seconds([span for _, spans in self._unread for span in spans]))
            for step, spans in self._unread:
                step.seconds += sum(next(seconds) for _ in spans)
                step.items = int(step.items)
            self._unread = []

    # figures ----------------------------------------------------------------------------------

    @property
    def flops_per_step(self) -> int | None:
        """Model FLOPs of one optimizer step of this process (all its micro-batches)."""
        return None if self.flops_per_batch is None else self.flops_per_batch * self.accumulate_grad_batches

    @property
    def timed_steps(self) -> list[StepTiming]:
        """The steps the statistics use: all but the warm-up steps (all, in a run that short)."""
        return self.steps[self.warmup_steps :] or self.steps

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
        """The ``performance`` block of ``result.json``: see :func:`blockbench.cell.perf.step_statistics`."""
        self.read_step_times()
        figures = step_statistics(
            self.steps, warmup_steps=self.warmup_steps, flops_per_step=self.flops_per_step, peak=self.peak
        )
        if self.steps and self.data_wait.fetches == 0:  # Lightning no longer reports the fetches as we expect
            figures["data_wait_ms"] = figures["data_wait_fraction"] = None
        if figures.get("mfu_above_peak"):
            why = (
                "or the model FLOPs are counted too high (a datasheet peak is the device's)"
                if str(figures["peak_source"]).startswith("datasheet")
                else "e.g. measured while the machine was busy; run `blockbench peak --remeasure` on a quiet "
                "machine or set trainer.peak_tflops to the device's peak"
            )
            rank_zero_warn(
                f"MFU {figures['mfu_raw']:.2f} is above 1, so the result has none: the peak of "
                f"{figures['peak_tflops']} TFLOP/s ({figures['peak_source']}) is too low, {why}"
            )
        return figures

    # internals --------------------------------------------------------------------------------

    def _count_flops(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> int | None:
        """FLOPs of ``training_loss`` on this batch, forward and backward. Under DDP this is the
        unwrapped module (no gradient sync); each process counts its own batch."""
        try:
            return count_training_flops(
                pl_module, lambda: pl_module.training_loss(batch), context=trainer.precision_plugin.train_step_context
            )
        except Exception as error:  # a figure is missing; training goes on
            rank_zero_warn(
                f"model FLOPs not counted ({type(error).__name__}: {error}); the result has no "
                "flops_per_step, achieved_tflops or mfu"
            )
            return None

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule, step: StepTiming) -> None:
        values = {
            "perf/step_time_ms": 1e3 * step.seconds,
            "perf/peak_memory_mb": current_peak_memory_mb(pl_module.device),
        }
        if step.seconds + step.data_wait > 0:
            values["perf/data_wait_fraction"] = step.data_wait / (step.seconds + step.data_wait)
        if self.flops_per_step is not None and step.seconds > 0:
            values["perf/tflops_per_sec"] = self.flops_per_step / step.seconds / 1e12
            mfu = values["perf/tflops_per_sec"] / self.peak.tflops if self.peak is not None else None
            if mfu is not None and mfu <= 1:  # above 1 the peak is wrong: no figure (not clipped to 1 either)
                values["perf/mfu"] = mfu
        if len(self.steps) > self.warmup_steps:
            values[f"perf/{self.unit}_per_sec"] = self.per_second
            values[f"perf/{self.unit}_per_sec_per_process"] = self.per_second_per_process
        pl_module.log_dict(values, on_step=True, on_epoch=False)


class ValidationHistory(L.Callback):
    """Every validation's metrics with its optimizer step and the seconds since training started
    (``result.json`` ``history``: the curves behind plots and time-to-target). Saved in checkpoints.

    A validation records the task's metrics (``metric_names``), then every other ``val/`` value the
    task logged, e.g. the logit lens's ``lens/layer{i}`` (see ``tasks.lens``)."""

    def __init__(self, metric_names: list[str]):
        self.metric_names = metric_names
        self.history: list[dict[str, Any]] = []
        self.elapsed_before = 0.0  # training seconds of the runs this one resumes
        self._start = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()
        if self.history and self.history[-1]["step"] == trainer.global_step and trainer.is_global_zero:
            # resumed from a checkpoint written after this validation: TensorBoard drops the points
            # from the resumed step on (purge_step), this one too, and it is not validated again
            last = self.history[-1]
            for logger in trainer.loggers:
                logger.log_metrics({f"val/{name}": value for name, value in last["metrics"].items()}, step=last["step"])

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self._start

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or (self.history and self.history[-1]["step"] == trainer.global_step):
            return
        logged = trainer.callback_metrics
        others = [key.removeprefix("val/") for key in logged if key.startswith("val/")]
        names = [*self.metric_names, *(name for name in others if name not in self.metric_names)]
        metrics = {name: float(logged[f"val/{name}"]) for name in names if f"val/{name}" in logged}
        self.history.append({"step": trainer.global_step, "time_s": round(self.elapsed(), 2), "metrics": metrics})

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "elapsed": self.elapsed()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history, self.elapsed_before = state["history"], state["elapsed"]


class LossCurve(L.Callback):
    """The validation loss on a fixed sample of the validation set (``n_items`` items spread evenly
    over it, see ``TaskDataModule.curve_loader``), before the first step, every ``every_n_steps``
    optimizer steps and at the last: the points of the loss curve between the full validations,
    which run over the whole set and decode, probe or score it (the loss on a sample between
    evaluations, as nanoGPT's ``estimate_loss``, but on the same items every time, drawing no random
    numbers).

    Logged as ``val/curve_loss`` (in a task's run ``1_val/<task>/curve_loss``), kept in ``result.json``
    ``curve`` and in checkpoints. Its time counts as validation. Every process computes the whole
    sample with its own (unwrapped) model: no collective calls, the same value everywhere; rank 0
    logs it. So it needs the whole model in every process: not with a sharding strategy (FSDP,
    DeepSpeed), which the run config rejects.
    """

    def __init__(self, every_n_steps: int, n_items: int, clock: WallClock | None = None):
        self.every_n_steps = every_n_steps
        self.n_items = n_items
        self.clock = clock
        self.points: list[tuple[int, float]] = []
        self.sample_size = 0
        self._loader: Any = None
        self._last_step = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._loader = trainer.datamodule.curve_loader(self.n_items)
        self.sample_size = len(self._loader.dataset) if self._loader is not None else 0
        self._last_step = trainer.global_step
        if self._loader is None:
            return  # no validation data: no points, as Lightning then skips every validation
        if trainer.global_step == 0:
            self._measure(trainer, pl_module)
        elif self.points and self.points[-1][0] == trainer.global_step:
            # resumed from a checkpoint of a point's step: TensorBoard drops the points from there on (purge_step)
            self._log(trainer, *self.points[-1])

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._last_step:
            return  # a micro-batch in the middle of a gradient accumulation window
        self._last_step = step
        if self._loader is not None and (step % self.every_n_steps == 0 or step == trainer.max_steps):
            self._measure(trainer, pl_module)

    def _measure(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        def prepare(batch: Any) -> Any:  # what Lightning's evaluation loop does to a batch before the step
            batch = trainer.precision_plugin.convert_input(batch)
            batch = pl_module._on_before_batch_transfer(batch, dataloader_idx=0)
            return trainer.strategy.batch_to_device(batch, dataloader_idx=0)

        if self.clock is not None:
            self.clock.enter("validation")
        try:
            with trainer.precision_plugin.val_step_context():
                loss = pl_module.sample_loss(self._loader, prepare)
        finally:
            if self.clock is not None:
                self.clock.exit("validation")
        if math.isfinite(loss):  # a diverging run's loss is its DivergenceGuard's record
            self.points.append((trainer.global_step, loss))
            self._log(trainer, trainer.global_step, loss)

    @staticmethod
    def _log(trainer: L.Trainer, step: int, loss: float) -> None:
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({CURVE_TAG: loss}, step=step)

    def record(self) -> dict[str, Any]:
        """``result.json`` ``curve``: the sample's size and every (step, loss) point."""
        return {
            "every_n_steps": self.every_n_steps,
            "items": self.sample_size,
            "points": [[step, round(loss, 6)] for step, loss in self.points],
        }

    def state_dict(self) -> dict[str, Any]:
        return {"points": self.points}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.points = [tuple(point) for point in state["points"]]


class DivergenceGuard(L.Callback):
    """Stops training when the training loss is not finite or exceeds ``threshold``, and remembers
    the step and the last finite loss: a diverged cell is a finding, recorded as such.

    Under DDP every process decides on the losses of all processes (one all-gather), as Lightning's
    EarlyStopping reduces its decision: a process that stopped on its own loss would leave the
    others waiting in the next gradient all-reduce forever. All processes so record the same step
    and loss: the diverging loss is NaN if any process's is, else the largest, and the last finite
    loss is the mean over the processes (the logged ``train/loss``).

    When the losses are read: on a CPU after every micro-batch, so training stops at the step that
    diverged. On a GPU reading a loss waits for the GPU (:func:`blockbench.cell.perf.runs_ahead`),
    so each micro-batch's loss stays on the device and they are read together, in one all-gather,
    at the steps the logger writes (``log_every_n_steps``) and at the end of training: the record
    is the same (the first diverging micro-batch's step and loss, the last finite loss before it),
    but training stops at the next log step, up to ``log_every_n_steps - 1`` steps after the
    divergence (a checkpoint written in between holds the diverged weights).
    """

    def __init__(self, threshold: float | None):
        self.threshold = threshold
        self.diverged_at_step: int | None = None
        self.diverging_loss: float | None = None
        self.last_finite_loss: float | None = None
        self._unread: list[tuple[int, torch.Tensor]] = []  # (step, this process's loss) of micro-batches not read
        self._last_global_step = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._unread, self._last_global_step = [], trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.diverged:
            return  # the first divergence is the finding (every process knows it: no all-gather is left unpaired)
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self._unread.append((trainer.global_step, loss.detach().float()))
        stepped, self._last_global_step = trainer.global_step != self._last_global_step, trainer.global_step
        if not runs_ahead(pl_module.device) or (stepped and trainer.global_step % trainer.log_every_n_steps == 0):
            self._read(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.diverged:
            self._read(trainer)  # the micro-batches since the last log step (on a GPU)

    def _read(self, trainer: L.Trainer) -> None:
        """Decide on the unread micro-batches in their order, on the losses of all processes."""
        if not self._unread:
            return
        steps = [step for step, _ in self._unread]
        local = torch.stack([loss for _, loss in self._unread])
        self._unread = []
        gathered = trainer.strategy.all_gather(local).reshape(-1, len(steps)).tolist()  # a row per process
        for i, step in enumerate(steps):
            losses = [row[i] for row in gathered]  # every process's loss
            bad = [value for value in losses if not self._acceptable(value)]
            if not bad:
                self.last_finite_loss = sum(losses) / len(losses)
                continue
            nans = [value for value in bad if math.isnan(value)]
            self.diverged_at_step, self.diverging_loss = step, nans[0] if nans else max(bad)
            trainer.should_stop = True
            return

    def _acceptable(self, value: float) -> bool:
        return math.isfinite(value) and (self.threshold is None or value <= self.threshold)

    @property
    def diverged(self) -> bool:
        return self.diverged_at_step is not None


class ResumeState(L.Callback):
    """What a checkpoint needs beyond Lightning's own state for an exact resume: the run's config
    hash, code fingerprint and hardware (a checkpoint of another config, other code, another kind of
    device or another precision is never resumed) and the random number generators of this process.

    The generators are restored in ``on_train_start``: after Lightning has created the training
    dataloader's iterator (which draws a seed) and before it fetches the first batch, so random
    crops, flips, RandAugment, MixUp and dropout after the resume draw what an uninterrupted run
    draws. (Restored any later, the first batches would already be augmented from the wrong state.)
    DataLoader workers keep their own generators in the loader's state (``tasks.base.WorkerRngState``).
    """

    def __init__(self, config_hash: str, code_fingerprint: str, hardware: Hardware):
        #: what a checkpoint must have been written by to be resumed
        self.identity = {
            "config_hash": config_hash,
            "code_fingerprint": code_fingerprint,
            "hardware": hardware.model_dump(),
        }
        self._pending_rng: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**self.identity, "rng": capture_rng()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, ours in self.identity.items():
            if state.get(key) != ours:
                raise ValueError(f"checkpoint of {key} {state.get(key)}, not of this run's ({ours})")
        self._pending_rng = state["rng"]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending_rng is not None:
            restore_rng(self._pending_rng)
            self._pending_rng = None


class StepCheckpoint(L.Callback):
    """Writes ``last.ckpt`` every ``every_n_steps`` optimizer steps, for resuming an interrupted run.

    Two steps are moved so that a resumed run repeats an uninterrupted one exactly (Lightning's
    ModelCheckpoint does neither):

    - when a validation follows the step, the checkpoint is written after it. Lightning does not
      validate the checkpoint's step again on resume, so a checkpoint taken before that validation
      would lose its metrics and the random numbers its dataloader draws;
    - a step that ends an epoch is checkpointed one step later. Lightning resumes a checkpoint taken
      on an epoch's last batch one epoch too far (it counts the finished epoch twice), so the next
      epoch's shuffle would differ. Only with one-batch epochs is such a checkpoint kept.

    Every process calls ``trainer.save_checkpoint``; rank 0 writes it (to a temporary file, then
    renamed: a killed run leaves the previous checkpoint intact).
    """

    FILE = "last.ckpt"

    def __init__(self, dirpath: Path, every_n_steps: int):
        self.path = Path(dirpath) / self.FILE
        self.every_n_steps = every_n_steps
        self._last_step = 0
        self._deferred = False  # a due checkpoint waits for the step after an epoch's end
        self._after_validation = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step  # the step resumed from is saved already

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._last_step:
            return  # a micro-batch in the middle of a gradient accumulation window
        self._last_step = trainer.global_step
        if trainer.global_step % self.every_n_steps and not self._deferred:
            return
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch and not self._deferred:
            self._deferred = True
            return
        self._deferred = False
        if validation_follows(trainer):
            self._after_validation = True
        else:
            trainer.save_checkpoint(self.path, weights_only=False)  # all of it (optimizer, callbacks), said explicitly

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._after_validation and not trainer.sanity_checking:
            self._after_validation = False
            trainer.save_checkpoint(self.path, weights_only=False)


def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after the current training batch: its own decision (a
    private method; the resume tests compare validation histories, so a change shows there)."""
    loop = trainer.fit_loop
    return bool(trainer.enable_validation and loop.epoch_loop._should_check_val_fx(loop._data_fetcher))
