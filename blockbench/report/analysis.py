"""The statistics of a matrix, task by task: each variant's mean, spread and 95% interval per metric,
its difference from the baseline variant with a 95% interval and a Holm-adjusted p-value over the whole
matrix, and its time to the matrix's targets. :func:`analyze` is the one path from the cells to the
numbers; the summary (``section``, ``summary``) and the index of verdicts (``index``) only render what
it computed, so the two cannot disagree.

The rules that keep the statistics from flattering a variant:

- A diverged seed counts, with the worse of the task's trivial baseline and the task's worst
  finished seed (``stats.diverged_value``): an unstable variant is not judged by its good seeds.
- Seeds of different variants share the data order, so a variant with the baseline variant's
  seeds is compared by a paired t test on the seed-matched differences.
- Every difference of the matrix is one family: Holm's adjustment controls the chance of any
  false mark.
- Cells that failed (an error, not a finding) are left out of the statistics and listed.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockbench.tasks import TASK_CONFIGS, Metric

from ..record import SPEED_FIGURES
from .results import Group, MatrixSettings, load_groups
from .stats import (
    Difference,
    compare,
    diverged_value,
    holm_adjust,
    mean_std,
    t_confidence_interval,
    time_to_target,
    with_diverged,
)
from .verdicts import Side

LEVEL = 0.95  # confidence level of every interval in the summary
ALPHA = 1 - LEVEL  # a difference is marked when its Holm-adjusted p-value is below this


def direction(difference: float, metric: Metric) -> str:
    """``better`` or ``worse`` for a variant ``difference`` above its baseline (``same`` for zero)."""
    if difference == 0:
        return "same"
    return "better" if (difference > 0) == metric.higher_is_better else "worse"


@dataclass
class TargetOutcome:
    """How the seeds of one group did against one target."""

    reached: list[tuple[int, float | None]]  # (step, seconds) of each finished seed that reached it
    seeds_with_history: int  # finished seeds with a history, plus the diverged seeds (0 without any history)

    @property
    def mean_steps(self) -> float | None:
        return statistics.fmean(s for s, _ in self.reached) if self.reached else None

    @property
    def mean_seconds(self) -> float | None:
        times = [t for _, t in self.reached if t is not None]
        return statistics.fmean(times) if times and len(times) == len(self.reached) else None

    @property
    def fraction(self) -> str:
        return f"{len(self.reached)}/{self.seeds_with_history}"


@dataclass(frozen=True)
class MetricStats:
    """One group's statistics of one metric, computed once: summary.md and summary.csv both render
    these, so the two files cannot disagree."""

    metric: Metric
    #: seed -> value of every seed in the statistics: the finished seeds, and the diverged ones at the
    #: task's diverged value (see ``TaskAnalysis.diverged_values``)
    values: dict[Any, float]
    mean: float | None  # of ``values`` (None: no seed in the statistics)
    std: float | None
    interval: tuple[float, float] | None  # of the mean, inside the metric's range (None: fewer than two seeds)
    mean_finished: float | None  # of the finished seeds alone
    difference: Difference | None  # from the baseline variant (None: the baseline itself, or a side without seeds)
    p_holm: float | None  # the difference's Holm-adjusted p-value over the matrix's family of comparisons
    target: float | None  # the matrix's target for this metric
    outcome: TargetOutcome | None  # the seeds against ``target`` (None: no target, or no finished seed)

    @property
    def significant(self) -> bool:
        """Whether the difference's Holm-adjusted p-value is below ALPHA."""
        return self.p_holm is not None and self.p_holm < ALPHA

    @property
    def direction(self) -> str:
        """``better``, ``worse`` or ``same`` than the baseline variant; empty without a difference."""
        return direction(self.difference.difference, self.metric) if self.difference else ""


@dataclass(frozen=True)
class GroupStats:
    """One group's statistics: each metric's, and the figures of its finished seeds (None: no finished seed)."""

    group: Group
    metrics: dict[str, MetricStats]  # by metric name
    steps: int | None  # of the first finished seed (every seed of a group trains the same config)
    wall_time_s: float | None  # mean over the finished seeds
    parameters: int | None  # of the first finished seed
    throughput: float | None  # mean over the finished seeds
    throughput_unit: str | None
    speed: dict[str, float | None]  # each of SPEED_FIGURES: mean over the finished seeds that recorded it


class TaskAnalysis:
    """One task's statistics: which variant each is compared with, the values its seeds count with, the
    differences (on construction) and, once the matrix's family of comparisons is known, each group's
    :class:`GroupStats` (:meth:`summarize`)."""

    def __init__(
        self, matrix_dir: Path, task: str, groups: list[Group], baseline_variant: str | None, settings: MatrixSettings
    ) -> None:
        self.matrix_dir = matrix_dir
        self.task = task
        self.groups = groups
        self.task_cfg = TASK_CONFIGS[groups[0].task_name]
        self.metrics: tuple[Metric, ...] = self.task_cfg.metrics
        self.baseline_variant = baseline_variant
        #: whether each variant is compared with the baseline variant at its own budget (see BUDGET_AXIS)
        self.by_budget = any(g.budget is not None for g in groups) and any(g.design for g in groups)
        named = next((g for g in groups if g.variant == baseline_variant), None)
        #: the baseline variant's label, without the budget when comparisons are by budget
        self.baseline_label = (
            (named.design if named else baseline_variant or "") if self.by_budget else baseline_variant or ""
        )
        #: budget (None unless by budget) -> the baseline variant's group
        self.baselines: dict[Any, Group] = {
            (g.budget if self.by_budget else None): g
            for g in groups
            if (g.design == self.baseline_label if self.by_budget else g.variant == baseline_variant)
        }
        self.targets = settings.targets.get(task) or settings.targets.get(groups[0].task_name) or {}
        self.trivial_baselines: dict[str, float] = next(
            (r.baselines for g in groups for r in g.ok + g.diverged if r.baselines), {}
        )
        #: the value a diverged seed counts with, per metric (None: no baseline and no finished seed)
        self.diverged_values: dict[str, float | None] = {
            m.name: diverged_value(
                self.trivial_baselines.get(m.name),
                [v for g in groups for v in g.finished_values(m.name).values()],
                m.higher_is_better,
            )
            for m in self.metrics
        }
        #: (variant, metric) -> seed -> value of every seed in the statistics: the finished seeds, and the
        #: diverged ones at the value of :attr:`diverged_values`
        self.values: dict[tuple[str, str], dict[Any, float]] = {
            (g.variant, m.name): with_diverged(
                g.finished_values(m.name), g.diverged_seeds, self.diverged_values[m.name]
            )
            for g in groups
            for m in self.metrics
        }
        #: (variant, metric) -> its difference from the baseline variant
        self.differences: dict[tuple[str, str], Difference] = {
            (g.variant, m.name): d for g in groups for m in self.metrics if (d := self._difference(g, m)) is not None
        }
        #: variant -> its statistics (set by :meth:`summarize`, once the matrix's comparisons are known)
        self.stats: dict[str, GroupStats] = {}
        self.family_size = 0

    def baseline_of(self, group: Group) -> Group | None:
        """The group ``group`` is compared with: the baseline variant's (at ``group``'s budget when by budget)."""
        return self.baselines.get(group.budget if self.by_budget else None)

    def is_baseline(self, group: Group) -> bool:
        return any(group is baseline for baseline in self.baselines.values())

    def _difference(self, group: Group, metric: Metric) -> Difference | None:
        """``group`` minus the baseline variant, paired when their seeds match (see ``stats.compare``);
        None for the baseline itself or when a side has no seed in the statistics."""
        baseline = self.baseline_of(group)
        if baseline is None or group is baseline:
            return None
        values = self.values[group.variant, metric.name]
        baseline_values = self.values[baseline.variant, metric.name]
        if not values or not baseline_values:
            return None
        return compare(values, baseline_values, LEVEL, metric.span)

    def summarize(self, holm_p: dict[tuple[str, str], float], family_size: int) -> None:
        """Compute every group's statistics (:attr:`stats`), which the markdown and the CSV render.
        ``holm_p``: (variant, metric) -> the Holm-adjusted p-value of its difference over the matrix's
        family of ``family_size`` comparisons (every task's: known only once every task is analyzed)."""
        self.family_size = family_size
        self.stats = {g.variant: self._group_stats(g, holm_p) for g in self.groups}

    def _group_stats(self, group: Group, holm_p: dict[tuple[str, str], float]) -> GroupStats:
        first = group.ok[0] if group.ok else None
        return GroupStats(
            group,
            {m.name: self._metric_stats(group, m, holm_p.get((group.variant, m.name))) for m in self.metrics},
            steps=first.steps if first else None,
            wall_time_s=statistics.fmean(r.wall_time_s for r in group.ok) if group.ok else None,
            parameters=first.parameters if first else None,
            throughput=statistics.fmean(r.throughput for r in group.ok) if group.ok else None,
            throughput_unit=first.throughput_unit if first else None,
            speed={figure: group.speed_mean(figure) for figure in SPEED_FIGURES},
        )

    def _metric_stats(self, group: Group, metric: Metric, p_holm: float | None) -> MetricStats:
        values = self.values[group.variant, metric.name]
        finished = list(group.finished_values(metric.name).values())
        mean, std = mean_std(list(values.values())) if values else (None, None)
        target = self.targets.get(metric.name)
        return MetricStats(
            metric,
            values,
            mean,
            std,
            interval=t_confidence_interval(list(values.values()), LEVEL, metric.low, metric.high) if values else None,
            mean_finished=statistics.fmean(finished) if finished else None,
            difference=self.differences.get((group.variant, metric.name)),
            p_holm=p_holm,
            target=target,
            outcome=self._target_outcome(group, metric, target) if target is not None and group.ok else None,
        )

    @property
    def any_diverged(self) -> bool:
        return any(g.diverged for g in self.groups)

    def _target_outcome(self, group: Group, metric: Metric, target: float) -> TargetOutcome:
        """The finished seeds that reached ``target``, out of the finished seeds with a history and the
        diverged seeds (which count as not reaching it: they left no usable model)."""
        histories = [r.history for r in group.ok if r.history]
        reached = [hit for h in histories if (hit := time_to_target(h, metric.name, target, metric.higher_is_better))]
        return TargetOutcome(reached, len(histories) + len(group.diverged) if histories else 0)

    def target_metrics(self) -> list[tuple[Metric, float]]:
        """(metric, target) in the task's metric order."""
        return [(m, self.targets[m.name]) for m in self.metrics if m.name in self.targets]

    def has_values(self, group: Group) -> bool:
        """Whether ``group`` has a seed in the statistics (finished, or diverged with a value to count)."""
        return any(stats.values for stats in self.stats[group.variant].metrics.values())

    def side(self, group: Group | None, metric: Metric) -> Side:
        """``group``'s side of a verdict in ``metric``: its seeds in the statistics, the diverged ones, its
        median step time, and the metric's best value where every finished seed reached it."""
        if group is None:
            return Side(0, 0, None)
        best = metric.high if metric.higher_is_better else metric.low
        solved = (
            group.ok
            and not group.diverged
            and math.isfinite(best)
            and all(
                abs(value - best) <= 1e-9 * max(1.0, abs(best)) for value in group.finished_values(metric.name).values()
            )
        )
        return Side(
            len(group.ok) + len(group.diverged),
            len(group.diverged),
            self.stats[group.variant].speed["step_time_ms"],
            at_best=best if solved else None,
        )


def analyze(matrix_dir: Path) -> tuple[MatrixSettings, list[Group], list[TaskAnalysis]]:
    """A matrix's settings, its groups and the analysis of each task with every statistic computed: the
    one path from the cells to the numbers, which the summary and the index of verdicts both render."""
    settings = MatrixSettings.load(matrix_dir)
    groups = load_groups(matrix_dir)
    by_task: dict[str, list[Group]] = defaultdict(list)
    for group in groups:
        by_task[group.task].append(group)
    baseline_variant = settings.baseline_variant or (groups[0].variant if groups else None)
    analyses = [
        TaskAnalysis(matrix_dir, task, task_groups, baseline_variant, settings) for task, task_groups in by_task.items()
    ]
    # one family: every comparison of the matrix (task x variant x metric) that has a p-value
    adjusted = holm_adjust(
        {
            (analysis.task, *key): diff.p_value
            for analysis in analyses
            for key, diff in analysis.differences.items()
            if diff.p_value is not None
        }
    )
    for analysis in analyses:
        analysis.summarize(
            {(variant, metric): p for (task, variant, metric), p in adjusted.items() if task == analysis.task},
            len(adjusted),
        )
    return settings, groups, analyses
