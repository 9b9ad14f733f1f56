"""The views of a matrix's TensorBoard runs and the HParams records of a cell, as TensorBoard's own
protocol buffers: what the cell's live writer (``blockbench.tensorboard.writer``) and the rebuild from
``result.json`` (:mod:`blockbench.tensorboard.rebuild`) both write, built here once so that the two
read the same in TensorBoard.

The views are the HParams experiment (which hparams and which metrics are the table's columns) and
the Custom Scalars layout (a category per task, a chart per metric holding that task's runs) of a
log folder (a task's, ``tb/<task>``, see ``blockbench.store.layout.tensorboard_runs``), kept as JSON-able
data (:func:`matrix_views`, the runner's ``tb/<task>/views.json``) and turned into summaries by
:func:`view_summaries`. A cell's row of the table is a session: its start (the hparams, its status)
and its end (:func:`session_start`, :func:`session_end`).

The HParams table's defaults (tensorboard 2.21's frontend and ``backend_context.py``):

* Only the first 5 metric columns of the experiment are ticked (``_computeMetrics``), and the
  parallel-coordinates view draws only the rows that have a value in every ticked column. The experiment
  therefore lists first the columns every cell fills: the primary metric (when the tasks' primary
  metrics differ), the metrics every task has (``loss``; a one-task matrix: all of them), the speed
  figures; then the metrics of some tasks only, and the throughputs (their units differ). The plugin
  shows one experiment per log dir, which is why each task's runs have a log folder of their own
  (a task's folder: its metrics, its headline first, then the speed figures).
* Every metric column's name says which way is better and, for a metric of some tasks only, which
  tasks have it (``perplexity ↓ (lm)``, ``bleu ↑ (translation)``, ``step_time_ms ↓``). The primary
  metric's column mixes the tasks' headline metrics, whose directions differ (a perplexity is better
  lower, BLEU and accuracy higher): its name lists each task's metric and direction, and a sort by it
  means something only within one task (filter the ``task`` column).
* Hparam columns are sorted with those marked ``differs`` first, by name, and the first 5 are shown:
  an axis with more than one value is marked, ``status`` is not.
* Every number is shown with 5 significant digits (a seed as ``0.0000``; TensorBoard has no integer
  type), so hparams are written as their text (``blockbench.tensorboard.names.hparam_value``). Each column so
  has one type in the experiment and in every session, which its filter needs, and offers its
  values as checkboxes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hp
from torch.utils.tensorboard.summary import custom_scalars

from blockbench.tasks.configs.lens import LENS_PREFIX

from .names import (
    CURVE_TAG,
    FINAL_FIGURES,
    PRIMARY_METRIC_TAG,
    STATUS_HPARAM,
    STATUSES,
    arrow,
    figure_higher_is_better,
    final_metric_tag,
    hparam_value,
    run_tag,
    throughput_tag,
)

if TYPE_CHECKING:
    from blockbench.tasks import Metric

#: the title of a task's logit-lens chart (one line per block of each run: ``1_val/<task>/lens/layer{i}``)
LENS_CHART = "val/lens: loss per block (logit lens)"
#: the order of the speed figures among the HParams columns: those every cell has first
SPEED_COLUMN_ORDER = (
    "perf/step_time_ms",
    "perf/peak_memory_mb",
    "perf/tflops_per_sec",
    "perf/mfu",
    "perf/data_wait_fraction",
)

Views = dict[str, Any]


def matrix_views(
    cell_hparams: Iterable[Mapping[str, Any]],
    tasks: Mapping[str, tuple[Sequence[Metric], str]],
    *,
    lens_tasks: Iterable[str] = (),
    curve_tasks: Iterable[str] = (),
) -> Views:
    """The HParams experiment and the Custom Scalars layout of a matrix, as JSON-able data.

    ``cell_hparams``: the hparams of every cell's session; each name becomes a column whose filter
    offers the values it takes (``status`` is added). ``tasks``: task label -> (its metrics, primary
    first; its throughput unit), in the matrix's order. Metric columns come in the order the module
    docstring explains; the layout has a category per task with a chart per validation metric and one
    of the training loss, each holding that task's runs only. A task of ``lens_tasks`` (those whose
    cells log the logit lens, ``val/lens/layer{i}``) gets one more chart with a line per block and
    run: where in depth its variants' predictions form. A task of ``curve_tasks`` (whose cells log the
    loss curve, ``val/curve_loss``) gets its chart first: the chart with a point every few steps.
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
    layout = {task: [[tag, f"^{re.escape(run_tag(tag, task))}$"] for tag in tags] for task, tags in charts.items()}
    for task in dict.fromkeys(lens_tasks):
        lens_tag = run_tag(f"val/{LENS_PREFIX}", task)  # 1_val/<task>/lens/layer
        layout.setdefault(task, []).append([LENS_CHART, f"^{re.escape(lens_tag)}\\d+$"])
    return {"experiment": {"hparams": columns, "metric_columns": metric_columns}, "layout": layout}


def _hparam_column(name: str, raw: list[Any]) -> dict[str, Any]:
    """An hparam column: its distinct values as :func:`hparam_value` writes them (numbers in numeric
    order, then the rest in text order), and whether they differ."""
    raw = [value.item() if hasattr(value, "item") else value for value in raw]
    shown = [hparam_value(value) for value in raw]
    numbers = {
        text: value
        for text, value in zip(shown, raw, strict=True)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    values = sorted(set(shown), key=lambda text: (0, numbers[text], "") if text in numbers else (1, 0, text))
    return {"name": name, "values": values, "differs": len(values) > 1}


def _metric_columns(metrics_by_task: Mapping[str, list[Metric]], units: Iterable[str]) -> list[dict[str, str]]:
    """The HParams metric columns (tag, display name with the direction, description), those every
    cell fills first."""
    by_name: dict[str, Metric] = {}
    tasks_of: dict[str, list[str]] = {}
    for task, metrics in metrics_by_task.items():
        for metric in metrics:
            by_name.setdefault(metric.name, metric)
            tasks_of.setdefault(metric.name, []).append(task)
    in_every_task = [name for name in by_name if set(tasks_of[name]) == set(metrics_by_task)]
    in_some_tasks = [name for name in by_name if name not in in_every_task]
    speed = sorted(
        FINAL_FIGURES,
        key=lambda tag: SPEED_COLUMN_ORDER.index(tag) if tag in SPEED_COLUMN_ORDER else len(FINAL_FIGURES),
    )
    names = {f"val/{name}": f"{name} {arrow(metric.higher_is_better)}" for name, metric in by_name.items()}
    names |= {f"val/{name}": f"{names[f'val/{name}']} ({', '.join(tasks_of[name])})" for name in in_some_tasks}
    descriptions = {f"val/{name}": metric.description for name, metric in by_name.items()} | dict(FINAL_FIGURES)
    tags = [*(f"val/{name}" for name in in_every_task), *speed, *(f"val/{name}" for name in in_some_tasks)]
    for unit in dict.fromkeys(units):
        tags.append(throughput_tag(unit))
        descriptions[throughput_tag(unit)] = f"training throughput, {unit}/s, all processes"
    for tag in tags:
        if tag.startswith("perf/"):
            names[tag] = f"{tag.removeprefix('perf/')} {arrow(figure_higher_is_better(tag))}"
    columns = [
        {"tag": final_metric_tag(tag), "display_name": names[tag], "description": descriptions[tag]} for tag in tags
    ]

    primaries = {task: metrics[0] for task, metrics in metrics_by_task.items() if metrics}
    if len({metric.name for metric in primaries.values()}) > 1:  # else the first column is already the primary metric
        by_metric: dict[tuple[str, bool], list[str]] = {}
        for task, metric in primaries.items():
            by_metric.setdefault((metric.name, metric.higher_is_better), []).append(task)
        shown = ", ".join(f"{name} {arrow(higher)} ({', '.join(tasks)})" for (name, higher), tasks in by_metric.items())
        each = "; ".join(
            f"{task}: {metric.name} ({'higher' if metric.higher_is_better else 'lower'} is better)"
            for task, metric in primaries.items()
        )
        columns.insert(
            0,
            {
                "tag": PRIMARY_METRIC_TAG,
                "display_name": f"primary: {shown}",
                "description": f"each task's primary metric (the first of its summary); {each}. The directions "
                "differ between tasks: sort by this column within one task (filter the task column)",
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
        for m in views["experiment"]["metric_columns"]
    ]
    # no creation time: the same views give the same bytes, so an unchanged matrix rewrites no run
    experiment = api_pb2.Experiment(hparam_infos=hparam_infos, metric_infos=metric_infos)
    layout = {
        category: {title: ["Multiline", [regex]] for title, regex in charts}
        for category, charts in views["layout"].items()
        if charts
    }
    return [
        hparams_summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)),
        custom_scalars(layout),
    ]


def session_start(hparams: Mapping[str, Any], status: str, run: str, start_time: float | None = None) -> Summary:
    """A cell's row of the HParams table: ``hparams`` as text (:func:`hparam_value`) and its ``status``,
    in a session named after its ``run`` (one row per cell), started at ``start_time`` (seconds
    since the epoch; now if None)."""
    values = {name: hparam_value(value) for name, value in hparams.items()}
    values[STATUS_HPARAM] = status
    return hp.hparams_pb(values, trial_id=run, start_time_secs=start_time)


def session_end(status: str, end_time: float | None = None) -> Summary:
    """The end of a cell's session: Success for ``status == "ok"``, else Failure, at ``end_time``
    (seconds since the epoch; now if None)."""
    end_info = plugin_data_pb2.SessionEndInfo(
        status=api_pb2.STATUS_SUCCESS if status == "ok" else api_pb2.STATUS_FAILURE,
        end_time_secs=time.time() if end_time is None else end_time,
    )
    return hparams_summary(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end_info))


def hparams_summary(tag: str, plugin_data: plugin_data_pb2.HParamsPluginData) -> Summary:
    """A summary carrying HParams plugin data, as ``tensorboard.plugins.hparams.summary_v2`` writes them."""
    summary = Summary()
    summary.value.add(tag=tag, metadata=metadata.create_summary_metadata(plugin_data), tensor=metadata.NULL_TENSOR)
    return summary
