"""TensorBoard views of a matrix: an HParams row per cell, custom-scalar charts per task.

What ends up under a matrix's ``tb/`` directory:

``tb/<task>/<variant>/seed<k>/``
    One run per cell, written by Lightning's ``TensorBoardLogger``. At the end of the cell
    :func:`log_cell_hparams` adds the HParams session (the cell's hparams and its status) and its
    final metrics as single scalars tagged ``final/<metric>`` (``final/val/perplexity``...); the
    runner passes the cell's speed figures the same way (``final/perf/mfu``..., see
    ``blockbench.perf.final_figures``), a diverged cell's too.
``tb/.hparams/``
    The HParams experiment of the whole matrix (:func:`write_hparams_experiment`): which hparams
    and metrics are the table's columns, and the values each hparam's filter offers.
``tb/.layout/``
    The Custom Scalars layout (:func:`write_custom_scalars_layout`): one chart per task and metric.

Why ``final/<metric>`` rather than the ``val/<metric>`` curves: the HParams plugin shows, for each
metric tag, the last scalar logged under that tag in the session's run. Writing the final values
under their own tags keeps the ``val/*`` curves untouched (no duplicate or out-of-place point), makes
the shown value exactly the cell's final metric, and lets a diverged cell show no value instead of
whatever its curve last held.

TensorBoard behaviour this module works with (tensorboard 2.21):

* The HParams plugin uses one experiment, the first it finds in any run, so cells write none (as
  Lightning's ``log_hyperparams`` would): the matrix writes one. Without it TensorBoard derives the
  columns from the cells' sessions and lists every scalar tag of the runs (``train/loss``, ``lr-*``,
  ``final/*`` and ``val/*``...) as a metric column.
* TensorBoard keeps the *first* summary metadata it reads per (run, tag), and HParams data lives in
  metadata. A running TensorBoard keeps the experiment it first read until restarted (rows and
  metric values still appear live), and a cell run directory reused by a rerun keeps its first
  session (hparams, status): delete a cell's run directory before training it again.
* A running TensorBoard reads a run's event files in name order and stops reading the run for
  good if the file it is on is deleted. So a superseded layout file is deleted only a minute after
  (the newest layout wins meanwhile), and rewriting an unchanged experiment or layout leaves the
  files alone.
* Custom-scalar charts match tags with a regular expression in every run; runs are not part of the
  match. A metric tag that several tasks share (``val/loss``) therefore shows the runs of all of
  them; such charts say so in their title, and the dashboard's run filter (e.g. ``^lm/``) narrows
  them down.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hp
from tensorboard.summary.writer.record_writer import RecordWriter
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import custom_scalars

#: prefix of the scalars holding a cell's final metrics (the HParams table's metric columns)
FINAL_PREFIX = "final/"
#: runs (directories under the TensorBoard log dir) holding the matrix's experiment and layout
EXPERIMENT_RUN = ".hparams"
LAYOUT_RUN = ".layout"
#: the hparam recording how a cell ended, and the values it takes
STATUS_HPARAM = "status"
STATUSES = ("ok", "diverged", "failed")
#: how long a superseded layout file stays for TensorBoards still reading it (they reload every 5 s)
SUPERSEDED_FILE_GRACE_S = 60.0

HParamValue = bool | int | float | str


def hparam_value(value: Any) -> HParamValue:
    """``value`` as the HParams plugin accepts it: bools, finite numbers and strings stay as they
    are; anything else (None, NaN, lists, dicts) becomes its string (``"None"``)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else str(value)
    return str(value)


def final_metric_tag(metric: str) -> str:
    """``val/perplexity`` -> ``final/val/perplexity``: the scalar the HParams table reads."""
    return FINAL_PREFIX + metric


@rank_zero_only
def log_cell_hparams(
    logger: TensorBoardLogger,
    hparams: Mapping[str, Any],
    metrics: Mapping[str, float],
    *,
    status: str = "ok",
    step: int | None = None,
) -> None:
    """Record a finished cell for the HParams dashboard, in the cell's own run.

    Writes the session start (``hparams`` converted with :func:`hparam_value`, plus ``status``),
    each finite metric as a scalar ``final/<metric>`` at ``step`` (the cell's final global step;
    NaN and infinite values are left out, so the table shows no value), and the session end
    (Success for ``status == "ok"``, Failure otherwise). Call it once per run, at the end.
    """
    values = {name: hparam_value(value) for name, value in hparams.items()}
    values[STATUS_HPARAM] = status
    run_name = Path(logger.log_dir).relative_to(logger.save_dir).as_posix()
    writer: SummaryWriter = logger.experiment
    file_writer = writer._get_file_writer()  # raw summaries, as Lightning's log_hyperparams writes them
    file_writer.add_summary(hp.hparams_pb(values, trial_id=run_name), step)
    for name, value in metrics.items():
        if value is not None and math.isfinite(value):
            writer.add_scalar(final_metric_tag(name), float(value), step)
    end_info = plugin_data_pb2.SessionEndInfo(
        status=api_pb2.STATUS_SUCCESS if status == "ok" else api_pb2.STATUS_FAILURE, end_time_secs=time.time()
    )
    end_summary = _hparams_summary(
        metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end_info)
    )
    file_writer.add_summary(end_summary, step)
    writer.flush()


def write_hparams_experiment(
    tb_dir: Path, cell_hparams: Iterable[Mapping[str, Any]], metrics: Mapping[str, str]
) -> None:
    """Declare the HParams table's columns for the whole matrix, in ``tb_dir/.hparams``.

    ``cell_hparams``: the hparams every cell passes to :func:`log_cell_hparams`; each name becomes
    a column whose filter offers the values it takes (``status`` is added). ``metrics``: metric
    (as passed to :func:`log_cell_hparams`, e.g. ``val/perplexity``) -> description. Write it
    before the first cell; a changed experiment replaces the old one (a running TensorBoard shows
    it after a restart), an unchanged one is left as it is.
    """
    values_by_name: dict[str, list[HParamValue]] = {}
    for cell in cell_hparams:
        for name, value in cell.items():
            values_by_name.setdefault(name, []).append(hparam_value(value))
    values_by_name[STATUS_HPARAM] = list(STATUSES)
    columns = [hp.HParam(name, _discrete_domain(values)) for name, values in values_by_name.items()]
    metric_columns = [
        hp.Metric(final_metric_tag(name), display_name=name, description=description)
        for name, description in metrics.items()
    ]
    experiment = hp.hparams_config_pb(columns, metric_columns)  # no creation time: same columns, same bytes
    _publish_summaries(Path(tb_dir) / EXPERIMENT_RUN, [experiment], keep_for_running_readers=False)


def write_custom_scalars_layout(tb_dir: Path, charts: Mapping[str, Sequence[str]]) -> None:
    """Write the Custom Scalars layout in ``tb_dir/.layout``; the newest layout is the one shown.

    ``charts``: category (the task, as in the run names) -> metric tags (``val/perplexity``...).
    Each tag gets a chart holding that exact tag from every run, so one chart compares all
    variants and seeds of a task. A tag listed under several categories matches the runs of all
    of them, which the chart's title says. Call it at the start of a matrix, after every cell or
    at the end: an unchanged layout is left as it is.
    """
    categories_by_tag: dict[str, list[str]] = {}
    for category, tags in charts.items():
        for tag in tags:
            categories_by_tag.setdefault(tag, []).append(category)

    def title(tag: str) -> str:
        shared = categories_by_tag[tag]
        return tag if len(shared) == 1 else f"{tag} (runs of {', '.join(shared)})"

    layout = {
        category: {title(tag): ["Multiline", [f"^{re.escape(tag)}$"]] for tag in tags}
        for category, tags in charts.items()
        if tags
    }
    _publish_summaries(Path(tb_dir) / LAYOUT_RUN, [custom_scalars(layout)], keep_for_running_readers=True)


def _discrete_domain(values: list[HParamValue]) -> hp.Discrete:
    """The distinct values as a TensorBoard domain; mixed types (``"None"`` and ``64``) become strings."""
    if all(isinstance(v, bool) for v in values):
        return hp.Discrete(sorted(set(values)), dtype=bool)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return hp.Discrete(sorted({float(v) for v in values}), dtype=float)
    return hp.Discrete(sorted({str(v) for v in values}), dtype=str)


def _hparams_summary(tag: str, plugin_data: plugin_data_pb2.HParamsPluginData) -> Summary:
    """A summary carrying HParams plugin data, as ``tensorboard.plugins.hparams.summary_v2`` writes them."""
    summary = Summary()
    summary.value.add(tag=tag, metadata=metadata.create_summary_metadata(plugin_data), tensor=metadata.NULL_TENSOR)
    return summary


def _event_files(run_dir: Path) -> list[Path]:
    """The run's event files, oldest first (the order TensorBoard reads them in)."""
    return sorted(path for path in run_dir.iterdir() if "tfevents" in path.name) if run_dir.is_dir() else []


def _summaries_in(event_file: Path) -> list[bytes]:
    summaries = (Event.FromString(record).summary for record in RawEventFileLoader(str(event_file)).Load())
    return [summary.SerializeToString() for summary in summaries if summary.value]


def _publish_summaries(run_dir: Path, summaries: Sequence[Summary], *, keep_for_running_readers: bool) -> None:
    """Make ``summaries`` the content of the run ``run_dir``: unless its newest event file already
    holds exactly them, write a new one that sorts after the others; then delete the older files.

    ``keep_for_running_readers`` spares the files superseded less than a minute ago: a running
    TensorBoard reads a run's files in name order and would stop reading the run if the file it
    is on were deleted; within a reload (every 5 s by default) it moves on to the newest. Only
    right for data whose newest value wins (the layout), not for the metadata-borne experiment.
    """
    files = _event_files(run_dir)
    if not files or _summaries_in(files[-1]) != [summary.SerializeToString() for summary in summaries]:
        files.append(_write_event_file(run_dir, summaries, after=files[-1] if files else None))
    if keep_for_running_readers:
        superseded_before = time.time() - SUPERSEDED_FILE_GRACE_S
        stale = [path for path, successor in zip(files, files[1:]) if successor.stat().st_mtime < superseded_before]
    else:
        stale = files[:-1]
    for path in stale:
        path.unlink(missing_ok=True)


def _write_event_file(run_dir: Path, summaries: Sequence[Summary], *, after: Path | None) -> Path:
    """A new event file in ``run_dir`` holding ``summaries``, named to sort after ``after``; complete
    before it gets its event-file name, so TensorBoard never reads half of it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"events.out.tfevents.{time.time_ns():020d}.{run_dir.name.lstrip('.')}"
    if after is not None and name <= after.name:  # a clock gone backwards: still sort last
        name = after.name + "1"
    partial = run_dir / f".writing.{os.getpid()}"  # no "tfevents" in the name: TensorBoard ignores it
    wall_time = time.time()
    with open(partial, "wb") as stream:
        records = RecordWriter(stream)
        records.write(Event(wall_time=wall_time, file_version="brain.Event:2").SerializeToString())
        for summary in summaries:
            records.write(Event(wall_time=wall_time, step=0, summary=summary).SerializeToString())
    os.replace(partial, run_dir / name)
    return run_dir / name
