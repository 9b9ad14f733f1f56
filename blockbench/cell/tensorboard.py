"""TensorBoard views of a matrix: one run per cell, task-scoped curves, an HParams row per cell and
custom-scalar charts per task, all written by the cell's one writer.

What ends up under a matrix's ``tb/`` directory:

``tb/<task>/<short variant>/seed<k>/``
    One run per cell (``lm/post/seed0``, see ``blockbench.matrix.expand.tensorboard_run_names``), written by
    :class:`CellLogger`, Lightning's ``TensorBoardLogger`` with one event file per run and no
    ``hparams.yaml``. At the start the cell writes the matrix's views (:func:`log_views`): the
    HParams experiment (which hparams and metrics are the table's columns) and the Custom Scalars
    layout. Then its curves, with tags scoped by task (``val/lm/perplexity``, see below). At the end
    :func:`log_cell_hparams` adds the HParams session (the cell's hparams and its status) and its
    final metrics as single scalars tagged ``final/<metric>`` (``final/val/perplexity``...), its
    task's primary metric once more as ``final/primary_metric``, and the speed figures the runner
    passes the same way (``final/perf/mfu``..., see ``blockbench.cell.perf.final_figures``), a diverged
    cell's too.
``tb/views.json``
    The views every cell's run carries (:func:`matrix_views`), written by the runner before the
    first cell; no event file, so TensorBoard lists no run for it.

Why the views live in the cells' runs: TensorBoard lists every directory holding an event file as
a run, in every run selector, so a ``.hparams`` or ``.layout`` run of their own shows up next to the
cells. The HParams plugin takes the experiment from whichever run has one, and the Custom Scalars
plugin merges the layouts of all runs (a category's charts once each), so every cell's run carries
both, written before its first curve point.

The layout's charts: per task, one per validation metric and one of the training loss, and for a task
that logs the logit lens (``val/<task>/lens/layer{i}``, see ``tasks.lens``) one chart with a line per
block of each run, so variants can be compared in where their predictions form.

Why the tags name the task (``val/<task>/<metric>``, ``train/<task>/loss``, ``lr/<task>/decay``,
``perf/<task>/mfu``): TensorBoard draws one chart per tag with every run that has it; charts cannot be
limited to some runs. With plain ``val/loss`` every task's runs share one chart, in Time Series and
in Custom Scalars alike, and a perplexity of 7 sits next to a ViT loss of 1.6. The task goes second,
not first, because Time Series groups charts by the tag's first part: the ``val`` group then holds
every task's validation charts, one task each, and a tag filter such as ``val/`` still finds them.
Only the logger renames tags (:class:`CellLogger`), so ``trainer.callback_metrics`` keep Lightning's
``val/<metric>`` names that the trainer and the callbacks read. A cell trained alone with
``blockbench train`` (no ``--tb-scope``) keeps the plain tags. The ``final/*`` scalars are not scoped:
the HParams table reads them in each session's own run, and a shared tag is a shared column.

Why ``final/<metric>`` rather than the ``val/...`` curves: the HParams plugin shows, for each metric
tag, the last scalar logged under that tag in the session's run. Writing the final values under their
own tags keeps the curves untouched (no duplicate or out-of-place point), makes the shown value
exactly the cell's final metric, gives every task the same ``final/val/loss`` and
``final/primary_metric`` columns, and lets a diverged cell show no value instead of whatever its curve
last held.

The HParams table's defaults (tensorboard 2.21's frontend and ``backend_context.py``):

* Only the first 5 metric columns of the experiment are ticked (``_computeMetrics``), and the
  parallel-coordinates view draws only the rows that have a value in every ticked column. The experiment
  therefore lists first the columns every cell fills: ``final/primary_metric`` (when the tasks'
  primary metrics differ), the metrics every task has (``loss``; a one-task matrix: all of them),
  the speed figures; then the metrics of some tasks only, and the throughputs (their units differ).
  One experiment per task is not possible: the plugin shows one experiment per log dir.
* Hparam columns are sorted with those marked ``differs`` first, by name, and the first 5 are shown:
  an axis with more than one value is marked, ``status`` is not.
* Every number is shown with 5 significant digits (a seed as ``0.0000``; TensorBoard has no integer
  type), so hparams are written as their text (:func:`hparam_value`). Each column so has one type in
  the experiment and in every session, which its filter needs, and offers its values as checkboxes.

TensorBoard behaviour this module works with (tensorboard 2.21):

* TensorBoard keeps the *first* summary metadata it reads per (run, tag), and HParams data lives in
  metadata, so a run's first experiment is the one shown; the Custom Scalars plugin reads a run's
  last layout. When the matrix file changes (a seed, a variant or a task added), the runs of cells
  trained before carry the old views: the runner rewrites such runs with the new ones before the
  first cell starts (:func:`publish_views`). A running TensorBoard keeps what it read until
  restarted (rows and metric values of new cells still appear live); restart it after changing the
  matrix file. A cell run directory reused by a fresh run would keep its first session (hparams,
  status): the trainer deletes it before training a cell again from step 0.
* A running TensorBoard reads a run's event files in name order and stops reading the run for good
  if the file it is on is deleted. Only such a rewrite deletes event files.
* One writer per run: a finished cell's run is one event file. A cell resumed from a checkpoint
  adds one file per resumption (Lightning's writer cannot append to the earlier file), which starts
  by purging the points logged after that checkpoint (``purge_step``).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.custom_scalar import metadata as layout_metadata
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hp
from tensorboard.summary.writer.record_writer import RecordWriter
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import custom_scalars

from blockbench.tasks.lens import LENS_PREFIX

from ..layout import TB_VIEWS_FILE, write_json
from ..record import FINAL_FIGURES, throughput_tag

if TYPE_CHECKING:
    from blockbench.tasks.base import Metric

#: prefix of the scalars holding a cell's final metrics (the HParams table's metric columns)
FINAL_PREFIX = "final/"
#: the scalar holding a cell's primary metric (its task's first), a column every task fills
PRIMARY_METRIC_TAG = "final/primary_metric"
#: the hparam recording how a cell ended, and the values it takes
STATUS_HPARAM = "status"
STATUSES = ("ok", "diverged", "failed")
#: runs that older versions wrote the experiment and the layout to; the runner deletes them
LEGACY_VIEW_RUNS = (".hparams", ".layout")
#: the tags of the views in a run: the HParams experiment, the Custom Scalars layout
VIEW_TAGS = (metadata.EXPERIMENT_TAG, layout_metadata.CONFIG_SUMMARY_TAG)
#: the title of a task's logit-lens chart (one line per block of each run: ``val/<task>/lens/layer{i}``)
LENS_CHART = "val/lens: loss per block (logit lens)"
#: the loss-curve points' tag (see ``blockbench.cell.callbacks.LossCurve``)
CURVE_TAG = "val/curve_loss"
#: the order of the speed figures among the HParams columns: those every cell has first
SPEED_COLUMN_ORDER = (
    "perf/step_time_ms",
    "perf/peak_memory_mb",
    "perf/tflops_per_sec",
    "perf/mfu",
    "perf/data_wait_fraction",
)

Views = dict[str, Any]


def hparam_value(value: Any) -> str:
    """``value`` as the HParams table shows it: its text (``0`` -> ``"0"``, ``0.001`` -> ``"0.001"``,
    None -> ``"None"``). TensorBoard shows every number with 5 significant digits (a seed as
    ``0.0000``), a matrix axis takes a few discrete values, which a text column offers as checkboxes,
    and one type for every value keeps a column's type the same in the experiment and in each session
    (a filter compares values of one type)."""
    return str(value.item() if isinstance(value, np.generic) else value)


def final_metric_tag(metric: str) -> str:
    """``val/perplexity`` -> ``final/val/perplexity``: the scalar the HParams table reads."""
    return FINAL_PREFIX + metric


def scoped_tag(tag: str, scope: str) -> str:
    """``val/loss`` -> ``val/<scope>/loss``: the task after the tag's first part (Time Series groups
    charts by the first part); a tag without one gets it last (``epoch`` -> ``epoch/<scope>``)."""
    group, slash, rest = tag.partition("/")
    return f"{group}/{scope}/{rest}" if slash else f"{tag}/{scope}"


class CellLogger(TensorBoardLogger):
    """Lightning's ``TensorBoardLogger`` with one writer per run and tags scoped by ``scope`` (the task).

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
        if self.scope:
            metrics = {scoped_tag(tag, self.scope): value for tag, value in metrics.items()}
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

    Writes the session start (``hparams`` converted with :func:`hparam_value`, plus ``status``),
    each finite metric as a scalar ``final/<metric>`` at ``step`` (the cell's final global step;
    NaN and infinite values are left out, so the table shows no value), ``metrics[primary]`` once
    more as ``final/primary_metric``, and the session end (Success for ``status == "ok"``, Failure
    otherwise). Call it once per run, at the end.
    """
    values = {name: hparam_value(value) for name, value in hparams.items()}
    values[STATUS_HPARAM] = status
    run_name = Path(logger.log_dir).relative_to(logger.save_dir).as_posix()
    writer: SummaryWriter = logger.experiment
    file_writer = writer._get_file_writer()  # raw summaries, as Lightning's log_hyperparams writes them
    file_writer.add_summary(hp.hparams_pb(values, trial_id=run_name), step)
    finals = {final_metric_tag(name): value for name, value in metrics.items()}
    if primary is not None and primary in metrics:
        finals[PRIMARY_METRIC_TAG] = metrics[primary]
    for tag, value in finals.items():
        if value is not None and math.isfinite(value):
            writer.add_scalar(tag, float(value), step)
    end_info = plugin_data_pb2.SessionEndInfo(
        status=api_pb2.STATUS_SUCCESS if status == "ok" else api_pb2.STATUS_FAILURE, end_time_secs=time.time()
    )
    end_summary = _hparams_summary(
        metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end_info)
    )
    file_writer.add_summary(end_summary, step)
    writer.flush()


# --- the views of a matrix: HParams experiment and Custom Scalars layout -------------------------


def matrix_views(
    cell_hparams: Iterable[Mapping[str, Any]],
    tasks: Mapping[str, tuple[Sequence[Metric], str]],
    *,
    lens_tasks: Iterable[str] = (),
    curve_tasks: Iterable[str] = (),
) -> Views:
    """The HParams experiment and the Custom Scalars layout of a matrix, as JSON-able data.

    ``cell_hparams``: the hparams every cell passes to :func:`log_cell_hparams`; each name becomes
    a column whose filter offers the values it takes (``status`` is added). ``tasks``: task label ->
    (its metrics, primary first; its throughput unit), in the matrix's order. Metric columns come in
    the order the module docstring explains; the layout has a category per task with a chart per
    validation metric and one of the training loss, each holding that task's runs only. A task of
    ``lens_tasks`` (those whose cells log the logit lens, ``val/lens/layer{i}``) gets one more chart
    with a line per block and run: where in depth its variants' predictions form. A task of
    ``curve_tasks`` (whose cells log the loss curve, ``val/curve_loss``) gets its chart first: the
    chart with a point every few steps.
    """
    raw_by_name: dict[str, list[Any]] = {}
    for cell in cell_hparams:
        for name, value in cell.items():
            raw_by_name.setdefault(name, []).append(value)
    columns = [_hparam_column(name, raw) for name, raw in raw_by_name.items()]
    columns.append({"name": STATUS_HPARAM, "values": list(STATUSES), "differs": False})

    metrics_by_task = {task: list(metrics) for task, (metrics, _) in tasks.items()}
    metric_columns = _metric_columns(metrics_by_task, [unit for _, unit in tasks.values()])
    curve_tasks = set(curve_tasks)
    charts = {
        task: [
            *([CURVE_TAG] if task in curve_tasks else []),
            *(f"val/{metric.name}" for metric in metrics),
            "train/loss",
        ]
        for task, metrics in metrics_by_task.items()
    }
    # category -> [chart title, the regex of its tags]: the metric's tag in the task's runs
    layout = {task: [[tag, f"^{re.escape(scoped_tag(tag, task))}$"] for tag in tags] for task, tags in charts.items()}
    for task in dict.fromkeys(lens_tasks):
        lens_tag = scoped_tag(f"val/{LENS_PREFIX}", task)  # val/<task>/lens/layer
        layout.setdefault(task, []).append([LENS_CHART, f"^{re.escape(lens_tag)}\\d+$"])
    return {"experiment": {"hparams": columns, "metrics": metric_columns}, "layout": layout}


def _hparam_column(name: str, raw: list[Any]) -> dict[str, Any]:
    """An hparam column: its distinct values as :func:`hparam_value` writes them (numbers in numeric
    order, then the rest in text order), and whether they differ."""
    raw = [value.item() if isinstance(value, np.generic) else value for value in raw]
    shown = [hparam_value(value) for value in raw]
    numbers = {
        text: value
        for text, value in zip(shown, raw, strict=True)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    values = sorted(set(shown), key=lambda text: (0, numbers[text], "") if text in numbers else (1, 0, text))
    return {"name": name, "values": values, "differs": len(values) > 1}


def _metric_columns(metrics_by_task: Mapping[str, list[Metric]], units: Iterable[str]) -> list[dict[str, str]]:
    """The HParams metric columns (tag, display name, description), those every cell fills first."""
    by_name: dict[str, Metric] = {}
    for metrics in metrics_by_task.values():
        for metric in metrics:
            by_name.setdefault(metric.name, metric)
    in_every_task = [
        name
        for name in by_name
        if all(name in {metric.name for metric in metrics} for metrics in metrics_by_task.values())
    ]
    in_some_tasks = [name for name in by_name if name not in in_every_task]
    speed = sorted(
        FINAL_FIGURES,
        key=lambda tag: SPEED_COLUMN_ORDER.index(tag) if tag in SPEED_COLUMN_ORDER else len(FINAL_FIGURES),
    )
    descriptions = {f"val/{name}": metric.description for name, metric in by_name.items()} | dict(FINAL_FIGURES)
    tags = [*(f"val/{name}" for name in in_every_task), *speed, *(f"val/{name}" for name in in_some_tasks)]
    for unit in dict.fromkeys(units):
        tags.append(throughput_tag(unit))
        descriptions[throughput_tag(unit)] = f"training throughput, {unit}/s, all processes"
    columns = [{"tag": final_metric_tag(tag), "display_name": tag, "description": descriptions[tag]} for tag in tags]

    primaries = {task: metrics[0] for task, metrics in metrics_by_task.items() if metrics}
    if len({metric.name for metric in primaries.values()}) > 1:  # else the first column is already the primary metric
        each = "; ".join(
            f"{task}: {metric.name} ({'higher' if metric.higher_is_better else 'lower'} is better)"
            for task, metric in primaries.items()
        )
        columns.insert(
            0,
            {
                "tag": PRIMARY_METRIC_TAG,
                "display_name": "primary metric",
                "description": f"the task's primary metric (the first of its summary); {each}",
            },
        )
    return columns


def view_summaries(views: Views) -> list[Summary]:
    """The experiment and the layout summaries of :func:`matrix_views`' ``views``."""
    hparam_infos = []
    for column in views["experiment"]["hparams"]:
        info = api_pb2.HParamInfo(name=column["name"], differs=column["differs"])
        hp.Discrete(column["values"], dtype=str).update_hparam_info(info)
        hparam_infos.append(info)
    metric_infos = [
        hp.Metric(m["tag"], display_name=m["display_name"], description=m["description"]).as_proto()
        for m in views["experiment"]["metrics"]
    ]
    # no creation time: the same views give the same bytes, so an unchanged matrix rewrites no run
    experiment = api_pb2.Experiment(hparam_infos=hparam_infos, metric_infos=metric_infos)
    layout = {
        category: {title: ["Multiline", [regex]] for title, regex in charts}
        for category, charts in views["layout"].items()
        if charts
    }
    return [
        _hparams_summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)),
        custom_scalars(layout),
    ]


@rank_zero_only
def log_views(logger: TensorBoardLogger, views: Views) -> None:
    """Write the matrix's views into the cell's run, at step 0, before its first curve point."""
    writer: SummaryWriter = logger.experiment
    for summary in view_summaries(views):
        writer._get_file_writer().add_summary(summary, 0)
    writer.flush()


def publish_views(tb_dir: Path, views: Views, runs: Iterable[str], *, renamed: Mapping[str, str] | None = None) -> None:
    """Before a matrix's first cell: write ``views`` to ``tb_dir/views.json`` for the cells to log,
    delete the experiment and layout runs of older versions, move each run of ``renamed`` (its name
    in older versions -> its name now) to its new name (or delete it if the new run exists), and
    rewrite each existing run of ``runs`` whose first views differ (:func:`refresh_run_views`)."""
    write_json(tb_dir / TB_VIEWS_FILE, views)
    for legacy in LEGACY_VIEW_RUNS:
        shutil.rmtree(tb_dir / legacy, ignore_errors=True)
    for old, new in (renamed or {}).items():
        old_dir, new_dir = tb_dir / old, tb_dir / new
        if old_dir == new_dir or not old_dir.is_dir():
            continue
        if new_dir.exists():
            shutil.rmtree(old_dir)
        else:
            new_dir.parent.mkdir(parents=True, exist_ok=True)
            os.replace(old_dir, new_dir)
        for parent in old_dir.relative_to(tb_dir).parents[:-1]:  # folders left empty
            with contextlib.suppress(OSError):
                (tb_dir / parent).rmdir()
    summaries = view_summaries(views)
    for run in runs:
        refresh_run_views(tb_dir / run, summaries)


def run_views(run_dir: Path) -> list[bytes | None]:
    """The experiment and the layout a TensorBoard shows of the run (serialized summary values), None
    where absent: the first experiment (metadata: the first read wins) and the last layout (the Custom
    Scalars plugin reads a run's newest)."""
    found: dict[str, list[bytes]] = {tag: [] for tag in VIEW_TAGS}
    for path in _event_files(run_dir):
        for record in RawEventFileLoader(str(path)).Load():
            if not any(tag.encode() in record for tag in VIEW_TAGS):  # most records: no need to parse them
                continue
            for value in Event.FromString(record).summary.value:
                if value.tag in found:
                    found[value.tag].append(value.SerializeToString())
    experiments, layouts = (found[tag] for tag in VIEW_TAGS)
    return [experiments[0] if experiments else None, layouts[-1] if layouts else None]


def refresh_run_views(run_dir: Path, summaries: Sequence[Summary]) -> bool:
    """Make ``summaries`` (experiment, layout) the views of the run ``run_dir``: unless they are
    already its first ones, write its events into one new event file that starts with them and
    holds every other record in its order (a resumption's purge marker included), then delete the
    old files. Returns whether it rewrote the run."""
    files = _event_files(run_dir)
    wanted = [value.SerializeToString() for summary in summaries for value in summary.value]
    if not files or run_views(run_dir) == wanted:
        return False
    records = []
    for path in files:
        for record in RawEventFileLoader(str(path)).Load():
            event = Event.FromString(record)
            if event.HasField("file_version"):
                continue
            if any(value.tag in VIEW_TAGS for value in event.summary.value):
                kept = [value for value in event.summary.value if value.tag not in VIEW_TAGS]
                if not kept:
                    continue
                del event.summary.value[:]
                event.summary.value.extend(kept)
                record = event.SerializeToString()
            records.append(record)
    wall_time = time.time()
    views = [Event(wall_time=wall_time, step=0, summary=summary).SerializeToString() for summary in summaries]
    _write_event_file(run_dir, [*views, *records], after=files[-1])
    for path in files:
        path.unlink(missing_ok=True)
    return True


def _hparams_summary(tag: str, plugin_data: plugin_data_pb2.HParamsPluginData) -> Summary:
    """A summary carrying HParams plugin data, as ``tensorboard.plugins.hparams.summary_v2`` writes them."""
    summary = Summary()
    summary.value.add(tag=tag, metadata=metadata.create_summary_metadata(plugin_data), tensor=metadata.NULL_TENSOR)
    return summary


def _event_files(run_dir: Path) -> list[Path]:
    """The run's event files, oldest first (the order TensorBoard reads them in)."""
    return sorted(path for path in run_dir.iterdir() if "tfevents" in path.name) if run_dir.is_dir() else []


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
        for path in _event_files(run_dir)
        if (match := re.match(r"events\.out\.tfevents\.(\d+)\.", path.name))
    ]
    later = max(stamps, default=0) + 1  # the first second that sorts after every file
    if later - time.time() <= 2:  # a file from further ahead (a clock set back) cannot be waited for
        while time.time() < later:
            time.sleep(later - time.time())


def _write_event_file(run_dir: Path, records: Sequence[bytes], *, after: Path) -> Path:
    """A new event file in ``run_dir`` holding ``records`` (serialized events), named to sort right
    after ``after`` and before the files of later writers (a resumption's, named after its start
    time); complete before it gets its event-file name, so TensorBoard never reads half of it."""
    name = f"{after.name}.views"
    partial = run_dir / f".writing.{os.getpid()}"  # no "tfevents" in the name: TensorBoard ignores it
    with open(partial, "wb") as stream:
        writer = RecordWriter(stream)
        writer.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        for record in records:
            writer.write(record)
    os.replace(partial, run_dir / name)
    return run_dir / name
