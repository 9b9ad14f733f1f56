"""The live writer of a training cell's TensorBoard run: one run per cell, task-scoped curves, an
HParams row per cell and custom-scalar charts per task, all written by the cell's one writer.

What ends up under a matrix's ``tb/`` directory:

``tb/<task>/<short variant>/seed<k>/``
    One run per cell (``lm/post/seed0``, see ``blockbench.store.tbruns.tensorboard_run_names``), written
    by :class:`CellLogger`, Lightning's ``TensorBoardLogger`` with one event file per run and no
    ``hparams.yaml``. At the start the cell writes the matrix's views (:func:`log_views`): the
    HParams experiment (which hparams and metrics are the table's columns) and the Custom Scalars
    layout (see :mod:`blockbench.tensorboard.views`). Then its curves, with tags named by
    :func:`blockbench.tensorboard.names.run_tag`
    (``1_val/lm/perplexity``, ``2_train/lm/loss``, ``3_lr/lm/decay``, ``4_perf/lm/mfu``; no ``epoch``).
    At the end :func:`log_cell_hparams` adds the HParams session (the cell's hparams and its status)
    and its final metrics as single scalars tagged ``z_final/<metric>`` (``z_final/val/perplexity``...),
    its task's primary metric once more as ``z_final/primary_metric``, and the speed figures the
    runner passes the same way (``z_final/perf/mfu``..., see ``blockbench.cell.perf.final_figures``),
    a diverged cell's too.
``tb/<task>/views.json``
    The views every cell's run of that log folder carries (``blockbench.tensorboard.views.matrix_views``),
    written by the runner before the first cell; no event file, so TensorBoard lists no run for it.

A matrix's committed results hold no ``tb/``: ``blockbench report --tensorboard`` writes the same
runs from the cells' ``result.json`` (``blockbench.tensorboard.rebuild``), with the names and views
built by the same functions (``blockbench.tensorboard.names``, ``blockbench.tensorboard.views``).

Why the views live in the cells' runs: TensorBoard lists every directory holding an event file as
a run, in every run selector, so a ``.hparams`` or ``.layout`` run of their own shows up next to the
cells. The HParams plugin takes the experiment from whichever run has one, and the Custom Scalars
plugin merges the layouts of all runs (a category's charts once each), so every cell's run carries
both, written before its first curve point.

The layout's charts: per task, one per validation metric and one of the training loss, and for a task
that logs the logit lens (``1_val/<task>/lens/layer{i}``, see ``tasks.lens``) one chart with a line per
block of each run, so variants can be compared in where their predictions form.

Why the tag groups are renamed and the task named in the tags: see ``blockbench.tensorboard.names``. Only the
logger renames tags (:class:`CellLogger`), so ``trainer.callback_metrics`` keep Lightning's
``val/<metric>`` names that the trainer and the callbacks read. A cell trained alone with
``blockbench train`` (no ``--tb-scope``) has no task in its tags (``1_val/loss``). The ``z_final/*``
scalars are not scoped: the HParams table reads them in each session's own run, and a shared tag is a
shared column.

Why ``z_final/<metric>`` rather than the validation curves: the HParams plugin shows, for each metric
tag, the last scalar logged under that tag in the session's run. Writing the final values under their
own tags keeps the curves untouched (no duplicate or out-of-place point), makes the shown value
exactly the cell's final metric, gives every task the same ``z_final/val/loss`` and
``z_final/primary_metric`` columns, and lets a diverged cell show no value instead of whatever its
curve last held. Their group sorts after the curves' in the Time Series dashboard.

TensorBoard behaviour this module works with (tensorboard 2.21):

* TensorBoard keeps the *first* summary metadata it reads per (run, tag), and HParams data lives in
  metadata, so a run's first experiment is the one shown; the Custom Scalars plugin reads a run's
  last layout. When the matrix file changes (a seed, a variant or a task added), the runs of cells
  trained before carry the old views: the runner rewrites such runs with the new ones before the
  first cell starts (:func:`blockbench.tensorboard.logdirs.publish_views`). A running TensorBoard
  keeps what it read until restarted (rows and metric values of new cells still appear live);
  restart it after changing the matrix file. A cell run directory reused by a fresh run would keep
  its first session (hparams, status): the trainer deletes it before training a cell again from
  step 0.
* A running TensorBoard reads a run's event files in name order and stops reading the run for good
  if the file it is on is deleted. Only such a rewrite deletes event files.
* One writer per run: a finished cell's run is one event file. A cell resumed from a checkpoint
  adds one file per resumption (Lightning's writer cannot append to the earlier file), which starts
  by purging the points logged after that checkpoint (``purge_step``).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.tensorboard import SummaryWriter

from .events import event_files
from .names import DROPPED_TAGS, PRIMARY_METRIC_TAG, final_metric_tag, run_tag
from .views import Views, session_end, session_start, view_summaries

__all__ = ["CellLogger", "log_cell_hparams", "log_views", "wait_to_sort_last"]


class CellLogger(TensorBoardLogger):
    """Lightning's ``TensorBoardLogger`` with one writer per run, tags named by
    ``blockbench.tensorboard.names.run_tag`` (groups renamed into reading order, scoped by ``scope``, the task)
    and no ``epoch`` scalar.

    Lightning closes the writer at the end of ``fit`` (``finalize``), and the next write (the final
    ``validate``, :func:`log_cell_hparams`) opens a second event file; here ``finalize`` only
    flushes and :meth:`close` ends the run. ``save`` writes no ``hparams.yaml``: a cell's settings are
    its ``config.yaml``, its varied keys the HParams session.
    """

    def __init__(
        self, save_dir: str | Path, name: str, version: str, *, scope: str | None = None, purge_step: int | None = None
    ):
        super().__init__(
            save_dir=str(save_dir), name=name, version=version, default_hp_metric=False, purge_step=purge_step
        )
        self.scope = scope

    @property
    @rank_zero_experiment
    def experiment(self) -> SummaryWriter:
        """The run's writer; a new one (a resumed run's) starts in a later second than the run's
        existing event files, so that its file sorts after theirs (see :func:`wait_to_sort_last`)."""
        if self._experiment is None:
            wait_to_sort_last(Path(self.log_dir))
        return super().experiment

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log ``metrics`` under their run tags (``val/loss`` -> ``1_val/<scope>/loss``), leaving out
        the tags a run does not keep (Lightning adds ``epoch`` to every call)."""
        metrics = {run_tag(tag, self.scope): value for tag, value in metrics.items() if tag not in DROPPED_TAGS}
        if metrics:
            super().log_metrics(metrics, step)

    @rank_zero_only
    def log_hyperparams(self, params: Any, metrics: Any = None, step: int | None = None) -> None:
        """Nothing: Lightning's would start an HParams session here, and the first one read is the
        one shown; :func:`log_cell_hparams` writes the cell's, with its status, at the end."""

    @rank_zero_only
    def save(self) -> None:
        if self._experiment is not None:
            self._experiment.flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.save()

    @rank_zero_only
    def close(self) -> None:
        """Flush and close the run's event file; call it once, after the last write."""
        if self._experiment is not None:
            self._experiment.close()


@rank_zero_only
def log_cell_hparams(
    logger: TensorBoardLogger,
    hparams: Mapping[str, Any],
    metrics: Mapping[str, float],
    *,
    primary: str | None = None,
    status: str = "ok",
    step: int | None = None,
) -> None:
    """Record a finished cell for the HParams dashboard, in the cell's own run.

    Writes the session start (``hparams`` converted with :func:`hparam_value`, plus ``status``; see
    ``blockbench.tensorboard.views.session_start``), each finite metric as a scalar ``z_final/<metric>`` at
    ``step`` (the cell's final global step; NaN and infinite values are left out, so the table shows
    no value), ``metrics[primary]`` once more as ``z_final/primary_metric``, and the session end
    (Success for ``status == "ok"``, Failure otherwise). Call it once per run, at the end.
    """
    run_name = Path(logger.log_dir).relative_to(logger.save_dir).as_posix()
    writer: SummaryWriter = logger.experiment
    file_writer = writer._get_file_writer()  # raw summaries, as Lightning's log_hyperparams writes them
    file_writer.add_summary(session_start(hparams, status, run_name), step)
    finals = {final_metric_tag(name): value for name, value in metrics.items()}
    if primary is not None and primary in metrics:
        finals[PRIMARY_METRIC_TAG] = metrics[primary]
    for tag, value in finals.items():
        if value is not None and math.isfinite(value):
            writer.add_scalar(tag, float(value), step)
    file_writer.add_summary(session_end(status), step)
    writer.flush()


# --- the views of a matrix (built in blockbench.tensorboard.views) in its runs ---------------------------------


@rank_zero_only
def log_views(logger: TensorBoardLogger, views: Views) -> None:
    """Write the matrix's views into the cell's run, at step 0, before its first curve point."""
    writer: SummaryWriter = logger.experiment
    for summary in view_summaries(views):
        writer._get_file_writer().add_summary(summary, 0)
    writer.flush()


def wait_to_sort_last(run_dir: Path) -> None:
    """Sleep until the clock's second is past the timestamp of every event file in ``run_dir``.

    TensorBoard reads a run's files in name order, and a writer names its file
    ``events.out.tfevents.<second>.<host>.<pid>.<counter>``: a file started in the same second as an
    earlier one sorts by pid and counter as text (``...10`` before ``...9``), so a resumption's points
    could be read before the points it continues, and its purge would drop the wrong ones. Waiting
    (at most a second, only when a run resumes within the second it started) orders them by time.
    """
    stamps = [
        int(match[1])
        for path in event_files(run_dir)
        if (match := re.match(r"events\.out\.tfevents\.(\d+)\.", path.name))
    ]
    later = max(stamps, default=0) + 1  # the first second that sorts after every file
    if later - time.time() <= 2:  # a file from further ahead (a clock set back) cannot be waited for
        while time.time() < later:
            time.sleep(later - time.time())
