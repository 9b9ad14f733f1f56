"""What a training cell prints: one progress line counted in optimizer steps, nothing else unless
something is wrong.

Lightning's own bar counts the batches of the current epoch (``Epoch 0: 0/192`` while the budget is
300 optimizer steps), redraws itself into log files, and comes with "GPU available" lines and
advertisements. :class:`StepProgress` replaces it: on a terminal a tqdm bar toward ``max_steps``
(resumed cells start where they stopped) with the loss and the latest validation metric; anywhere
else (CI, ``nohup``, ``--jobs`` log files) a plain line every N steps. :func:`quiet_lightning`
silences Lightning's informational notices; its warnings still show.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from typing import Any, TextIO

import lightning as L
from lightning.pytorch.callbacks import ProgressBar
from tqdm import tqdm

from .durations import format_duration

#: how many plain lines a cell prints over its budget when its output is not a terminal
PLAIN_LINES_PER_RUN = 10

#: Lightning's informational loggers: device lines ("GPU available: False"), tips, "`Trainer.fit` stopped"
LIGHTNING_INFO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
#: warnings about Lightning's own code, which a user of blockbench cannot act on
LIGHTNING_INTERNAL_WARNINGS = (
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",  # lightning/pytorch/utilities/_pytree.py on torch >= 2.9
)


#: Lightning's notices that are advice about the run, kept among the informational ones: on a GPU with
#: tensor cores, that float32 matmuls run without TF32 (``trainer.tf32: false`` or ``trainer.deterministic``)
LIGHTNING_ADVICE = ("set_float32_matmul_precision",)


def _warning_or_advice(record: logging.LogRecord) -> bool:
    """A logging filter: a record at WARNING or above, or one of :data:`LIGHTNING_ADVICE`."""
    return record.levelno >= logging.WARNING or any(text in record.getMessage() for text in LIGHTNING_ADVICE)


def quiet_lightning() -> None:
    """Keep Lightning's informational notices (device lines, litlogger/litmodels tips, why ``fit``
    stopped) and its warnings about its own internals out of the output; warnings about the run stay,
    and so does the advice of :data:`LIGHTNING_ADVICE`."""
    for name in LIGHTNING_INFO_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)  # the advice is logged at INFO; the filter drops the other notices
        logger.addFilter(_warning_or_advice)  # once: a filter already there is not added again
    for message in LIGHTNING_INTERNAL_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


class StepProgress(ProgressBar):
    """A progress display in optimizer steps toward ``trainer.max_steps``, with the training loss and
    the latest value of ``headline`` (``val/perplexity``); rank 0 alone prints.

    ``stream`` (default: stdout) decides the form: a terminal gets a tqdm bar; anything else a plain
    line every ``every_n_steps`` steps (default: :data:`PLAIN_LINES_PER_RUN` lines over the budget)
    and at the last step, e.g. ``step 150/300 (50%)  loss 3.912  val/perplexity 50.09  1:02 elapsed,
    ETA 1:02``.
    """

    def __init__(
        self,
        headline: str,
        *,
        every_n_steps: int | None = None,
        stream: TextIO | None = None,
        interactive: bool | None = None,
    ):
        super().__init__()
        self.headline = headline
        self.every_n_steps = every_n_steps
        self.stream = stream
        self.interactive = interactive
        self._enabled = True
        self._bar: tqdm | None = None
        self._shown_step = -1
        self._start_time = 0.0
        self._start_step = 0

    # ProgressBar's interface ------------------------------------------------------------------

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self.trainer.is_global_zero

    # hooks --------------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.is_enabled:
            return
        out = self.stream or sys.stdout
        if self.interactive is None:
            self.interactive = out.isatty()
        if self.every_n_steps is None:
            self.every_n_steps = max(1, math.ceil(trainer.max_steps / PLAIN_LINES_PER_RUN))
        self._start_time, self._start_step = time.perf_counter(), trainer.global_step
        self._shown_step = trainer.global_step
        if self.interactive:
            self._bar = tqdm(
                total=trainer.max_steps,
                initial=trainer.global_step,
                unit="step",
                file=out,
                dynamic_ncols=True,
                leave=True,
            )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if not self.is_enabled or step == self._shown_step:  # a micro-batch of gradient accumulation
            return
        self._shown_step = step
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix_str(self.status(trainer), refresh=False)
            self._bar.refresh()
        elif step % self.every_n_steps == 0 and step < trainer.max_steps:
            self._print_line(trainer)  # the last step's line comes at the end, after its validation

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._bar is not None and not trainer.sanity_checking:
            self._bar.set_postfix_str(f"{self.status(trainer)}  validating...")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self.status(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self.status(trainer))
            self._bar.close()
            self._bar = None
        elif self.is_enabled and trainer.global_step > self._start_step:
            self._print_line(trainer)

    # text ---------------------------------------------------------------------------------------

    def status(self, trainer: L.Trainer) -> str:
        """``loss 3.912  val/perplexity 50.09``: the latest training loss and headline value."""
        metrics = trainer.callback_metrics
        parts = [
            f"{name} {float(metrics[key]):.4g}"
            for name, key in (("loss", "train/loss"), (self.headline,) * 2)
            if key in metrics
        ]
        return "  ".join(parts)

    def _print_line(self, trainer: L.Trainer) -> None:
        step, total = trainer.global_step, trainer.max_steps
        elapsed = time.perf_counter() - self._start_time
        done = step - self._start_step
        eta = elapsed / done * (total - step) if done > 0 else math.nan
        timing = f"{format_duration(elapsed)} elapsed" + (f", ETA {format_duration(eta)}" if math.isfinite(eta) else "")
        parts = [f"step {step}/{total} ({100 * step / total:.0f}%)", self.status(trainer), timing]
        print("  ".join(part for part in parts if part), file=self.stream or sys.stdout, flush=True)
