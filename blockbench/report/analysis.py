"""The statistics of a matrix, task by task: each variant's mean, spread and 95% interval per metric,
its difference from the baseline variant, the one confirmatory question per task x variant x level
and its decision, and its time to the matrix's targets. :func:`analyze` is the one path from the cells
to the numbers; the summary (``section``, ``summary``) and the index of verdicts (``index``) only render
what it computed, so the two cannot disagree; :func:`open_questions` tells the runner which questions
more seeds may still answer.

The rules (``docs/decisions/verdict-rule.md``):

- **One question per task x variant x level**: the task's headline metric (the first of its
  metrics), the variant minus the baseline variant at the same level (the values of the matrix's
  ``within:`` axes and its budget). ``decide.decide`` answers it from the two sides' cells alone, at a
  per-question error rate: no family across the matrix, so the same cells get the same verdict in
  every matrix. Secondary metrics are described with unadjusted 95% intervals and decide nothing.
- **Four verdicts**: better, worse, equivalent (the difference lies inside ± the margin of practical
  equivalence: the task's declared one, or the matrix file's ``margins:``), undecided. A side
  without a seed is *no result*; both sides at the metric's best value, or the LM within its
  saturation distance of the entropy floor, is *saturated*: the metric cannot tell them apart, so
  such a comparison gets no verdict; nor does one whose two sides both closed less than a tenth of
  the way from the trivial baseline to the best value (*not learned*: ``headroom.NOT_LEARNED_SHARE``).
- **Seeds in rounds**: with ``seeds: {min, max, step}`` every look spends an equal share of the
  error rate (``decide.Looks.plan``), and a question is decided look by look on the seeds of each
  complete look, stopping at its first final look: decided, stopped for futility, or the last
  planned (``TaskAnalysis._sequential``); a fixed seed axis is one look on every finished seed.
- **Runs that fail**: in a question, a diverged seed counts with the worse of the task's trivial
  baseline and the worst finished seed of the two sides' look (``stats.diverged_value``): an unstable
  variant is not judged by its good seeds, and the value depends on the compared cells alone. A
  finished seed that does not beat the trivial baseline *did not learn*; it counts as it is. Where a
  seed of either side did not learn or diverged, the question is decided by a rank test
  (``rank_based``), valid for such values, bimodal or not; where no seed of either side learned,
  there is nothing to compare (*no result*: a verdict, equivalent above all, from imputed values
  would say nothing about the designs), and before the last look the runner adds seeds, whose data
  draws may learn.
- Seeds of different variants share the data order, so a variant with the baseline variant's seeds
  is compared seed-matched (paired); cells that failed (an error, not a finding) are left out and listed.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from blockbench.tasks import TASK_CONFIGS, Metric

from ..matrixfile import REPLICA_SEED_STRIDE
from ..store.record import SPEED_FIGURES
from .decide import UNDECIDED, Decision, Looks, decide
from .headroom import Headroom, headroom, not_learned_text, recorded_trivial, saturation_text
from .ranks import any_failed
from .results import Group, MatrixSettings, level_text, load_groups, seed_key
from .stats import Difference, compare, diverged_value, mean_std, t_confidence_interval, time_to_target, with_diverged
from .verdicts import NO_RESULT, NOT_LEARNED, SATURATED

LEVEL = 0.95  # confidence level of the descriptive intervals (the decisions' own level is decide's)
NO_MARGIN = 1e-12  # the margin of a task that declares none (decide needs a positive one)


def _round(seed: Any) -> int | float:
    """The round a seed belongs to: its number, a replica's shifted seed (``REPLICA_SEED_STRIDE``)
    counted as the replica's own seed k; infinite for a seed that is not a number."""
    return seed % REPLICA_SEED_STRIDE if isinstance(seed, int) else math.inf


def restrict(group: Group, seeds: Collection[Any]) -> Group:
    """``group`` with only the records of ``seeds`` (keys as :func:`results.seed_key` gives them)."""
    return replace(group, results=[r for i, r in enumerate(group.results) if seed_key(r, i) in seeds])


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
    interval: tuple[float, float] | None  # of the mean (None: fewer than two seeds)
    mean_finished: float | None  # of the finished seeds alone
    #: from the baseline variant, with its unadjusted 95% interval: a description, never a verdict
    #: (None: the baseline itself, or a side without seeds)
    difference: Difference | None
    target: float | None  # the matrix's target for this metric
    outcome: TargetOutcome | None  # the seeds against ``target`` (None: no target, or no finished seed)

    @property
    def direction(self) -> str:
        """``better``, ``worse`` or ``same`` than the baseline variant; empty without a difference."""
        return direction(self.difference.difference, self.metric) if self.difference else ""


@dataclass(frozen=True)
class Margin:
    """The margin of practical equivalence a question used: an absolute difference of the headline
    metric, and where it comes from (the task's declaration, with its reason, or the matrix file)."""

    value: float
    source: str  # ``task`` (declared in code), ``matrix`` (the matrix file's margins:) or ``none``
    reason: str  # the task's one-line reason, or what the matrix file overrides
    relative: float | None = None  # the declared share of the baseline's mean, for a relative margin


@dataclass(frozen=True)
class Question:
    """One confirmatory question: a variant's headline metric against the baseline variant's at the same
    level. ``verdict`` is decide's word (better, worse, equivalent, undecided), or ``no result``,
    ``saturated`` or ``not learned``, which are not verdicts."""

    group: Group
    baseline: Group | None
    verdict: str
    decision: Decision | None  # None: a side without seeds (or no baseline)
    margin: Margin | None
    rank_based: bool = False  # a seed of either side did not learn or diverged
    saturation: str = ""  # why the comparison is saturated (empty if it is not)
    missing: str = ""  # why there is no decision (empty if there is one)
    #: the runner adds seeds: undecided and not final, or saturated before the last planned look (with
    #: seeds that draw the data the ceiling is reached in some draws only)
    more_seeds: bool = False
    #: the seeds of each side the question was looked at on (variant's, baseline's); empty where none was
    look: tuple[frozenset, frozenset] = (frozenset(), frozenset())
    not_learned: str = ""  # why neither side learned the task (``headroom.not_learned_text``; empty if one did)

    @property
    def decided(self) -> bool:
        """A verdict that answers the question: better, worse or equivalent."""
        return self.decision is not None and self.verdict == self.decision.verdict and self.verdict != UNDECIDED

    @property
    def seeds(self) -> int:
        """The seeds of the smaller side the question was looked at on (0 without a look)."""
        if self.decision is not None and self.decision.n:
            return min(self.decision.n)
        return min(len(side) for side in self.look)


@dataclass(frozen=True)
class GroupStats:
    """One group's statistics: each metric's, and the figures of its finished seeds (None: no finished seed)."""

    group: Group
    metrics: dict[str, MetricStats]  # by metric name
    steps: int | None  # of the first finished seed (every seed of a group trains the same config)
    wall_time_s: float | None  # mean over the finished seeds
    parameters: int | None  # of the first finished seed
    throughput: float | None  # median over the finished seeds (as ``speed``)
    throughput_unit: str | None
    speed: dict[str, float | None]  # each of SPEED_FIGURES: median over the finished seeds that recorded it
    question: Question | None  # None: a baseline group
    headroom: Headroom | None  # the LM's distance to its entropy floor (None: the task has no floor)


@dataclass(frozen=True)
class OpenQuestion:
    """A question more seeds may still answer: its decision is undecided and not final. ``variant`` and
    ``baseline`` are the two groups' labels as their cells' ``variant`` (cell.json), so that the runner
    adds seeds to exactly those cells; ``level`` is the (axis, value) pairs of the level; ``seeds`` the
    seeds of the smaller side so far."""

    task: str
    variant: str
    baseline: str
    level: tuple[tuple[str, Any], ...]
    seeds: int


class TaskAnalysis:
    """One task's statistics: which group each is compared with (the baseline design at its level), the
    values its seeds count with, each group's :class:`GroupStats` and each variant's :class:`Question`,
    all computed on construction from the task's cells alone."""

    def __init__(self, matrix_dir: Path, task: str, groups: list[Group], settings: MatrixSettings) -> None:
        self.matrix_dir = matrix_dir
        self.task = task
        self.groups = groups
        self.settings = settings
        self.task_cfg = TASK_CONFIGS[groups[0].task_name]
        self.metrics: tuple[Metric, ...] = self.task_cfg.metrics
        self.headline = self.metrics[0]
        baseline_variant = settings.baseline_variant or groups[0].variant
        #: whether each design is compared with the baseline design at its own level (``within:``, the budget)
        self.by_level = any(g.level for g in groups) and any(g.design for g in groups)
        #: the level axes of this task's groups, in the matrix's order
        self.level_axes: tuple[str, ...] = tuple(dict.fromkeys(key for g in groups for key, _ in g.level))
        named = next((g for g in groups if g.variant == baseline_variant), None)
        #: the baseline variant's label, without the level when comparisons are by level
        self.baseline_label = (named.design if named else baseline_variant) if self.by_level else baseline_variant
        #: level (() unless by level) -> the baseline variant's group
        self.baselines: dict[tuple, Group] = {
            self._level(g): g
            for g in groups
            if (g.design == self.baseline_label if self.by_level else g.variant == baseline_variant)
        }
        self.targets = settings.targets.get(task) or settings.targets.get(groups[0].task_name) or {}
        self.trivial_baselines: dict[str, float] = next(
            (
                {k: v for k, v in r.baselines.items() if v is not None}
                for g in groups
                for r in g.ok + g.diverged
                if r.baselines
            ),
            {},
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
        #: the planned looks of every question: seeds in rounds, or one look at the seed axis's count
        self.looks = (
            Looks.plan(settings.seeds.min, settings.seeds.max, settings.seeds.step)
            if settings.seeds is not None
            else Looks.fixed(settings.seed_axis or max(1, *(len(g.ok) + len(g.diverged) for g in groups)))
        )
        #: variant -> its statistics
        self.stats: dict[str, GroupStats] = {g.variant: self._group_stats(g) for g in groups}

    def _level(self, group: Group) -> tuple:
        return group.level if self.by_level else ()

    def baseline_of(self, group: Group) -> Group | None:
        """The group ``group`` is compared with: the baseline variant's (at ``group``'s level when by level)."""
        return self.baselines.get(self._level(group))

    def is_baseline(self, group: Group) -> bool:
        return any(group is baseline for baseline in self.baselines.values())

    def label(self, group: Group) -> str:
        """The group's label in the verdicts: its design when comparisons are by level, else its variant."""
        return group.design if self.by_level else group.variant

    # differences and questions ----------------------------------------------------------------------

    def _difference(self, group: Group, metric: Metric) -> Difference | None:
        """``group`` minus its baseline with an unadjusted 95% interval, paired when their seeds match (see
        ``stats.compare``): a description; None for the baseline itself or a side without seeds."""
        baseline = self.baseline_of(group)
        if baseline is None or group is baseline:
            return None
        values = self.values[group.variant, metric.name]
        baseline_values = self.values[baseline.variant, metric.name]
        if not values or not baseline_values:
            return None
        return compare(values, baseline_values, LEVEL)

    def margin(self, baseline_mean: float) -> Margin:
        """The headline metric's margin of practical equivalence at a baseline mean of ``baseline_mean``:
        the matrix file's ``margins:`` for the task (absolute), else the task's declared one (relative
        margins are a share of the baseline's mean), else none (0: equivalence cannot be shown)."""
        overrides = self.settings.margins.get(self.task) or self.settings.margins.get(self.groups[0].task_name) or {}
        if self.headline.name in overrides:  # 0: no equivalence can be shown (decide needs a positive margin)
            value = max(float(overrides[self.headline.name]), NO_MARGIN)
            return Margin(value, "matrix", "the matrix file's margins:")
        declared = getattr(self.task_cfg, "margin", None)
        if declared is None:  # decide needs a positive margin: one this small shows only identical sides equivalent
            return Margin(NO_MARGIN, "none", "the task declares no margin, so equivalence cannot be shown")
        return Margin(
            float(declared.absolute(baseline_mean)),
            "task",
            declared.reason,
            float(declared.value) if declared.relative else None,
        )

    def failed_seeds(self, group: Group) -> set[Any]:
        """The seeds of ``group`` that did not learn or diverged (keys of :attr:`values`): the rank test's
        trigger, here and in the baseline swap (``fragility``)."""
        not_learned = group.did_not_learn(self.headline)
        return {
            seed_key(r, i)
            for i, r in enumerate(group.results)
            if r.status == "diverged" or any(r is x for x in not_learned)
        }

    def _look_values(
        self, group: Group, baseline: Group, keep: Callable[[Any], bool]
    ) -> tuple[dict[Any, float], dict[Any, float]]:
        """The headline values of the seeds of each side that ``keep`` accepts (a look), a diverged seed
        at the worse of the trivial baseline and the worst finished seed among them: so the value a
        failed run counts with depends only on the cells the question compares, not on another
        variant's seeds or the baseline's seeds past the look."""
        sides = [
            restrict(g, {k for k in self.values[g.variant, self.headline.name] if keep(k)}) for g in (group, baseline)
        ]
        finished = [side.finished_values(self.headline.name) for side in sides]
        value = diverged_value(
            self.trivial_baselines.get(self.headline.name),
            [v for side in finished for v in side.values()],
            self.headline.higher_is_better,
        )
        variant_values, baseline_values = (
            with_diverged(f, side.diverged_seeds, value) for f, side in zip(finished, sides, strict=True)
        )
        return variant_values, baseline_values

    def _decide(
        self, group: Group, baseline: Group, values: dict[Any, float], baseline_values: dict[Any, float]
    ) -> tuple[Decision, Margin, bool]:
        """decide's answer on these seeds of the two sides, the margin at the baseline's mean over them,
        and whether a rank test decided: a seed among them of either side did not learn or diverged, so
        a normal-theory test is not valid (``ranks.any_failed``)."""
        margin = self.margin(statistics.fmean(baseline_values.values()))
        failed, baseline_failed = self.failed_seeds(group), self.failed_seeds(baseline)
        rank_based = bool(any_failed([s in failed for s in values], [s in baseline_failed for s in baseline_values]))
        decision = decide(
            values,
            baseline_values,
            margin=margin.value,
            higher_is_better=self.headline.higher_is_better,
            looks=self.looks,
            rank_based=rank_based,
        )
        return decision, margin, rank_based

    def _sequential(
        self, group: Group, baseline: Group
    ) -> tuple[Decision, Margin, bool, dict[Any, float], dict[Any, float]]:
        """The question decided as the rounds decide it, and the seeds of each side it was decided on.

        With seeds in rounds: look by look, on the seeds of each planned look (0 .. n-1; a replica's
        shifted seeds counted by their round) once both sides have finished them all, stopping at the
        first final look (decided, futile, or the last planned one), as the runner stops adding seeds
        there. A look a side has not finished (an interrupted round) is not taken, so the answer is
        that of an uninterrupted run. Seeds past the final look do not count: the baseline's, trained
        for another variant's question, or a variant's trained by another matrix or before the
        futility stop existed; so a question's verdict depends on its own looks alone, and the same
        question gets the same decision in every matrix that asks it. Before the first look is
        complete, one decision on the seeds of the first look that both sides have (paired; unpaired
        where they share fewer than two, as replicas do), so a round in progress or a cell that failed
        does not bring seeds past the look in. Without rounds, one decision on every finished seed."""
        found = None
        if self.settings.seeds is not None:
            for size in self.looks.sizes:
                look = self._look_values(group, baseline, lambda s, size=size: _round(s) < size)
                if min(len(side) for side in look) < size:
                    break  # not complete yet
                found = (*self._decide(group, baseline, *look), *look)
                # a saturated look before the last is not final: the next seeds may leave the ceiling; nor is
                # one where no seed learned: the next data draws may
                early = not self.looks.is_last(size) and (
                    self._saturation(group, baseline, *look) or self._nothing_learned(group, baseline, *look)
                )
                if found[0].final and not early:
                    break
            if found is None:  # the first look is incomplete: a round in progress, or a cell that failed
                first = self.looks.sizes[0]
                look = self._look_values(group, baseline, lambda s: _round(s) < first)
                common = set(look[0]) & set(look[1])
                if len(common) >= 2 and set(look[0]) != set(look[1]):
                    look = self._look_values(group, baseline, lambda s: s in common)
                if all(look):
                    found = (*self._decide(group, baseline, *look), *look)
        if found is None:
            every = self._look_values(group, baseline, lambda s: True)
            found = (*self._decide(group, baseline, *every), *every)
        return found

    def _question(self, group: Group) -> Question | None:
        """The confirmatory question of a non-baseline group (None for a baseline)."""
        if self.is_baseline(group):
            return None
        baseline = self.baseline_of(group)
        if baseline is None:
            at = f" at {level_text(group.level)}" if self.by_level else ""
            return Question(
                group, None, NO_RESULT, None, None, missing=f"no cells of the baseline `{self.baseline_label}`{at}"
            )
        values = self.values[group.variant, self.headline.name]
        baseline_values = self.values[baseline.variant, self.headline.name]

        def no_result(why: str, **more: Any) -> Question:
            return Question(group, baseline, NO_RESULT, None, None, missing=why, **more)

        if not baseline_values:
            return no_result(f"every seed of the baseline {baseline.status_without_ok}")
        if not values:
            return no_result(group.status_without_ok)
        if not all(math.isfinite(v) for v in (*values.values(), *baseline_values.values())):
            return no_result("a finished seed's value is not finite")
        decision, margin, rank_based, values, baseline_values = self._sequential(group, baseline)
        # a look before the last that is saturated, or where nothing learned, asks for the next round's seeds
        before_last = self.settings.seeds is not None and not self.looks.is_last(min(decision.n))
        if self._nothing_learned(group, baseline, values, baseline_values):
            return no_result(
                f"no seed of either side learned (each of the {len(values)} vs {len(baseline_values)} seeds of the "
                "look diverged or did not learn): nothing to compare"
                + ("; more seeds may learn" if before_last else ""),
                more_seeds=before_last,
                look=(frozenset(values), frozenset(baseline_values)),
            )
        saturation = self._saturation(group, baseline, values, baseline_values)
        not_learned = "" if saturation else self._not_learned_text(group, baseline, values, baseline_values)
        verdict = SATURATED if saturation else NOT_LEARNED if not_learned else decision.verdict
        # not learned is a label, not a stop: the runner adds seeds where the test itself is undecided
        more_seeds = (decision.verdict == UNDECIDED and not decision.final) or (bool(saturation) and before_last)
        look = (frozenset(values), frozenset(baseline_values))
        return Question(
            group,
            baseline,
            verdict,
            decision,
            margin,
            rank_based,
            saturation,
            more_seeds=more_seeds,
            look=look,
            not_learned=not_learned,
        )

    def _not_learned_text(
        self, group: Group, baseline: Group, values: dict[Any, float], baseline_values: dict[Any, float]
    ) -> str:
        """Why neither side learned the task on these seeds (``headroom.not_learned_text``), or "": each side's
        mean against the trivial baseline its own cells recorded (a seed that draws the data draws its
        trivial baseline too), else the task's."""
        sides = [restrict(group, set(values)), restrict(baseline, set(baseline_values))]
        task_trivial = self.trivial_baselines.get(self.headline.name)
        trivials = [recorded_trivial(side, self.headline.name, task_trivial) for side in sides]
        means = [statistics.fmean(values.values()), statistics.fmean(baseline_values.values())]
        return not_learned_text(self.headline, means, trivials)

    def _nothing_learned(
        self, group: Group, baseline: Group, values: dict[Any, float], baseline_values: dict[Any, float]
    ) -> bool:
        """Whether every seed of both sides among these diverged or did not learn: two imputed or trivial
        constants, whose comparison (equivalent, most often) would say nothing about the designs."""
        return set(values) <= self.failed_seeds(group) and set(baseline_values) <= self.failed_seeds(baseline)

    def _saturation(
        self, group: Group, baseline: Group, values: dict[Any, float], baseline_values: dict[Any, float]
    ) -> str:
        """Why the two sides are saturated on these seeds (``headroom.saturation_text``), or "": judged on
        these seeds alone, so a seed past the look (the baseline's, trained for another question) that
        diverged does not decide whether this look is saturated."""
        means = [statistics.fmean(values.values()), statistics.fmean(baseline_values.values())]
        sides = [restrict(group, set(values)), restrict(baseline, set(baseline_values))]
        return saturation_text(self.task_cfg, self.headline, sides, means)

    # statistics -------------------------------------------------------------------------------------

    def _group_stats(self, group: Group) -> GroupStats:
        first = group.ok[0] if group.ok else None
        return GroupStats(
            group,
            {m.name: self._metric_stats(group, m) for m in self.metrics},
            steps=first.steps if first else None,
            wall_time_s=statistics.fmean(r.wall_time_s for r in group.ok) if group.ok else None,
            parameters=first.parameters if first else None,
            throughput=statistics.median(r.throughput for r in group.ok) if group.ok else None,
            throughput_unit=first.throughput_unit if first else None,
            speed={figure: group.speed_median(figure) for figure in SPEED_FIGURES},
            question=self._question(group),
            headroom=headroom(group),
        )

    def _metric_stats(self, group: Group, metric: Metric) -> MetricStats:
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
            difference=self._difference(group, metric),
            target=target,
            outcome=self._target_outcome(group, metric, target) if target is not None and group.ok else None,
        )

    @property
    def questions(self) -> list[Question]:
        """Every variant's question, in group order."""
        return [s.question for s in self.stats.values() if s.question is not None]

    @property
    def any_diverged(self) -> bool:
        return any(g.diverged for g in self.groups)

    @property
    def any_did_not_learn(self) -> bool:
        return any(g.did_not_learn(self.headline) for g in self.groups)

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

    def seed_varies(self) -> str:
        """What a seed varies in this task's cells, as the task config says (``seed_varies()``), or from
        the cells' ``task.data_seed``: a fixed one draws the same data for every seed."""
        sections = [g.task_section for g in self.groups if g.task_section is not None]
        if not sections:
            return ""
        try:
            config = self.task_cfg.model_validate(sections[0])
        except ValueError:
            config = None  # a config of older code: read its data seed below
        if config is not None and hasattr(config, "seed_varies"):
            return str(config.seed_varies())
        if not any("data_seed" in section for section in sections):
            return ""
        draws = {section.get("data_seed") for section in sections}
        if draws == {None}:
            return "the data draw, its order and the initialisation"
        if len(draws) == 1:
            return f"the order and the initialisation; the data draw is fixed (data_seed={draws.pop()})"
        return "the order and the initialisation; the data draw differs between variants (task.data_seed)"


def analyze(matrix_dir: Path) -> tuple[MatrixSettings, list[Group], list[TaskAnalysis]]:
    """A matrix's settings, its groups and the analysis of each task with every statistic computed: the
    one path from the cells to the numbers, which the summary and the index of verdicts both render."""
    settings = MatrixSettings.load(matrix_dir)
    groups = load_groups(matrix_dir, settings.levels)
    by_task: dict[str, list[Group]] = defaultdict(list)
    for group in groups:
        by_task[group.task].append(group)
    return settings, groups, [TaskAnalysis(matrix_dir, task, found, settings) for task, found in by_task.items()]


def open_questions(matrix_dir: Path) -> list[OpenQuestion]:
    """Every question of the matrix that more seeds may answer (``Question.more_seeds``: undecided and not
    final, or saturated before its last planned look), which the runner's next round adds seeds to (the
    variant's and the baseline's cells at its level). Decided from the cells on disk; a missing result
    counts as not there."""
    _, _, analyses = analyze(Path(matrix_dir))
    return [
        OpenQuestion(a.task, q.group.variant, q.baseline.variant, q.group.level, q.seeds)
        for a in analyses
        for q in a.questions
        if q.baseline is not None and q.more_seeds
    ]


__all__ = ["LEVEL", "NO_RESULT", "SATURATED", "OpenQuestion", "Question", "TaskAnalysis", "analyze", "open_questions"]
