"""The names in a cell's TensorBoard run: its tag groups and tags, the final figures the HParams table
shows, and the hparams of its row, for the two writers of such a run, the cell itself (its live
writer, ``blockbench.tensorboard.writer``) and the rebuild from its ``result.json``
(:mod:`blockbench.tensorboard.rebuild`), so that a rebuilt run and a live one read the same.

Standard library only, so that ``blockbench.store.record`` can name the final figures without importing
TensorBoard or the trainer (the package's ``__init__`` imports nothing either).

**Tag groups.** Lightning logs ``val/loss``, ``train/loss``, ``lr/decay``, ``perf/mfu`` and ``epoch``.
TensorBoard's Time Series dashboard groups charts by a tag's part before the first ``/`` and orders
the groups by TensorBoard's tag comparison (digits before letters, numbers by value, then
character by character; ``compareTagNames`` in its frontend), and the charts of a group by the
same comparison of their whole tags, a page of them at a time. In Lightning's names the ``epoch``
group came first and the validation curves last, after one-point ``final`` charts. A run therefore
writes each known group under a name that sorts in the order a reader needs it (:data:`GROUPS`:
``1_val``, ``2_train``, ``3_lr``, ``4_perf``), the final figures under ``z_final/``, after every
group a letter starts, and no ``epoch`` scalar at all (:data:`DROPPED_TAGS`; a step-based run's epoch
says nothing). Before them all, ``0_main`` (:data:`MAIN_GROUP`) holds the two charts a reader opens
the dashboard for: the task's headline metric (:data:`HEADLINE_METRICS`) and the loss curve
(:data:`CURVE_TAG`). In ``1_val`` they would sort among the other metrics by name (an LM's
``agreement_acc``, ``curve_loss``, ``excess_loss``, ``gap_closed``, the logit lens's ``lens/layer{i}``,
``loss``, then ``perplexity``, past the first page).

Only the run's tags are renamed: ``trainer.callback_metrics`` and ``result.json`` keep
Lightning's ``val/<metric>``, which the trainer, the callbacks and the report read.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: each of Lightning's tag groups -> its name in a run: the order of the Time Series dashboard's groups
GROUPS = {"val": "1_val", "train": "2_train", "lr": "3_lr", "perf": "4_perf"}
#: the group that opens the Time Series dashboard: each task's headline metric and its loss curve
MAIN_GROUP = "0_main"
#: the validation metrics that go into :data:`MAIN_GROUP`: each task's primary metric (the first of its
#: metrics, which heads its summary), named here because the cell's writer knows only a tag and its
#: task label (tests/report/test_tensorboard_logdirs.py checks the list against every task)
HEADLINE_METRICS = frozenset({"perplexity", "bleu", "accuracy"})
#: tags Lightning logs that a run leaves out: ``epoch`` (a step-based run's epoch counter, whose group
#: would open the dashboard)
DROPPED_TAGS = frozenset({"epoch"})
#: prefix of the scalars holding a cell's final figures (the HParams table's metric columns): sorts after
#: every group name that starts with a digit or a lower-case letter
FINAL_PREFIX = "z_final/"
#: the scalar holding a cell's primary metric (its task's first), a column every task fills
PRIMARY_METRIC_TAG = FINAL_PREFIX + "primary_metric"
#: the hparam recording how a cell ended, and the values it takes
STATUS_HPARAM = "status"
STATUSES = ("ok", "diverged", "failed")
#: the HParams column that says whether a run tuned or is reported (a matrix with ``tune:``)
PHASE_HPARAM = "phase"
#: the loss-curve points' metric (see ``blockbench.cell.callbacks.LossCurve``; in a run ``1_val/<task>/curve_loss``)
CURVE_TAG = "val/curve_loss"
#: the arrows a column's name carries: which way is better
HIGHER, LOWER = "↑", "↓"

#: the final speed figures of a cell as TensorBoard scalars (``z_final/<tag>``, HParams columns), with
#: what each measures; every one of them is better lower, except those of :data:`HIGHER_IS_BETTER_FIGURES`
FINAL_FIGURES = {
    "perf/step_time_ms": "median training step time (ms): forward, backward, optimizer",
    "perf/tflops_per_sec": "achieved model TFLOP/s per device",
    "perf/mfu": "model FLOPs utilization: achieved / peak FLOP/s of a device",
    "perf/data_wait_fraction": "share of the training loop spent waiting for the next batch",
    "perf/peak_memory_mb": "peak memory (MB): CUDA max allocated on a GPU, RSS on a CPU",
}
#: the final speed figures that are better higher (a throughput, :func:`throughput_tag`, too)
HIGHER_IS_BETTER_FIGURES = frozenset({"perf/tflops_per_sec", "perf/mfu"})


def throughput_tag(unit: str) -> str:
    """``target tokens`` -> ``perf/target_tokens_per_sec``: the throughput scalar (all processes)."""
    return f"perf/{unit.replace(' ', '_')}_per_sec"


def figure_higher_is_better(tag: str) -> bool:
    """Whether a speed figure (a key of :data:`FINAL_FIGURES`, or a throughput) is better higher."""
    return tag in HIGHER_IS_BETTER_FIGURES or tag.endswith("_per_sec")


def arrow(higher_is_better: bool) -> str:
    """``↑`` for a figure that is better higher, else ``↓``: the direction a column's name states."""
    return HIGHER if higher_is_better else LOWER


def run_tag(tag: str, scope: str | None = None) -> str:
    """Lightning's ``tag`` as a run writes it: its group renamed (:data:`GROUPS`; a headline metric and
    the loss curve into :data:`MAIN_GROUP`) and, with a ``scope`` (a matrix cell's task), the scope
    after the group: ``val/loss`` -> ``1_val/lm/loss``, ``val/perplexity`` -> ``0_main/lm/perplexity``,
    ``val/curve_loss`` -> ``0_main/lm/curve_loss``, ``perf/mfu`` -> ``4_perf/lm/mfu``; a tag without a
    group gets the scope last (``step`` -> ``step/lm``), a group of no known name keeps it
    (``grad/norm`` -> ``grad/lm/norm``).

    Why the task goes second: TensorBoard draws one chart per tag with every run that has it, and
    charts cannot be limited to some runs; with plain ``val/loss`` every task's runs share one chart
    (a perplexity of 7 next to a ViT loss of 1.6). Second, not first, because Time Series groups
    charts by the tag's first part: the validation group holds every task's charts, one task each."""
    group, slash, rest = tag.partition("/")
    if group == "val" and (rest in HEADLINE_METRICS or tag == CURVE_TAG):
        group = MAIN_GROUP
    group = GROUPS.get(group, group) if slash else group
    if not scope:
        return f"{group}/{rest}" if slash else group
    return f"{group}/{scope}/{rest}" if slash else f"{group}/{scope}"


#: a number as TensorBoard's tag order reads it: digits, a fraction, an exponent
_NUMBER = re.compile(r"\d+(?:\.\d*)?(?:[eE][+-]?\d+)?")


def compare_tag_names(a: str, b: str) -> int:
    """TensorBoard's order of tags (its frontend's ``compareTagNames``, which orders the Time Series
    dashboard's groups and the charts in each; TensorBoard has it in TypeScript only, so it is written
    out here): numbers compare by value, a ``/`` or a digit comes before any other character, other
    characters by their code (upper case before lower case). Negative, zero or positive as ``a``
    sorts before, with or after ``b``."""
    i = j = 0
    while True:
        if i == len(a) or j == len(b):
            return (i < len(a)) - (j < len(b))
        if a[i].isdigit() and b[j].isdigit():
            x, y = _NUMBER.match(a, i), _NUMBER.match(b, j)  # a digit starts a number: both match
            if float(x[0]) != float(y[0]):
                return -1 if float(x[0]) < float(y[0]) else 1
            i, j = x.end(), y.end()
            continue
        a_breaks, b_breaks = a[i] == "/" or a[i].isdigit(), b[j] == "/" or b[j].isdigit()
        if a_breaks != b_breaks:
            return -1 if a_breaks else 1
        if not a_breaks and a[i] != b[j]:
            return -1 if a[i] < b[j] else 1
        i, j = i + 1, j + 1


def time_series_order(tags: Iterable[str]) -> list[str]:
    """``tags`` in the order the Time Series dashboard shows their charts (:func:`compare_tag_names`),
    grouped by their part before the first ``/``, the group of the first chart first."""
    return sorted(tags, key=functools.cmp_to_key(compare_tag_names))


def final_metric_tag(metric: str) -> str:
    """``val/perplexity`` -> ``z_final/val/perplexity``: the scalar the HParams table reads."""
    return FINAL_PREFIX + metric


def hparam_value(value: Any) -> str:
    """``value`` as the HParams table shows it: its text (``0`` -> ``"0"``, ``0.001`` -> ``"0.001"``,
    None -> ``"None"``). TensorBoard shows every number with 5 significant digits (a seed as
    ``0.0000``), a matrix axis takes a few discrete values, which a text column offers as checkboxes,
    and one type for every value keeps a column's type the same in the experiment and in each session
    (a filter compares values of one type). A numpy scalar is shown as the number it holds."""
    return str(value.item() if hasattr(value, "item") else value)


def cell_hparams(
    task: str, axes: Mapping[str, Any], tuned: Mapping[str, Any] | None = None, phase: str | None = None
) -> dict[str, Any]:
    """A cell's row of the HParams table: its axes, a task axis shown by its label ``task`` (``lm``)
    rather than the mapping that configures it (``{name: lm, n_train_tokens: 100000}``); in a matrix
    with ``tune:``, also the tuned values and the phase (``tune`` or ``report``). The runner's cells
    (``blockbench.matrix.expand.Cell.hparams``) and the rebuild from cell.json both name it here."""
    hparams = {key: task if key in ("task", "task.name") else value for key, value in axes.items()}
    return {**hparams, **(tuned or {}), **({PHASE_HPARAM: phase} if phase else {})}
