"""A task's differences from the baseline variant, as its summary section shows them and as the
verdicts word them: the question each variant answers (the headline metric, its margin, the planned
looks, what a seed varies), the difference table (the headline metric as decided, the other metrics
described with unadjusted intervals), the tests that decided, and the :class:`verdicts.Comparison`
of each question. It computes no statistic: the numbers are ``analysis``'s.
"""

from __future__ import annotations

from blockbench.tasks import Metric

from ..store.record import read_tuning
from .analysis import LEVEL, Question, TaskAnalysis, restrict
from .results import Group, level_text
from .stats import PAIRED, Difference, seeds_text
from .table import arrow, decimals, fmt
from .table import row as _row
from .table import table_head as _table_head
from .tuning import chosen_text
from .verdicts import NO_VERDICT, Comparison, QuestionCells, SeedCell, Side


def question_note(a: TaskAnalysis) -> list[str]:
    """What the task's verdicts rest on: the headline metric, the margin of practical equivalence and its
    reason, the planned looks, and what a seed varies in its cells."""
    if not a.questions:
        return []
    arrow = "↑" if a.headline.higher_is_better else "↓"
    margins = {q.margin for q in a.questions if q.margin is not None}
    margin = next(iter(margins), None)
    if margin is None:
        margin_text = ""
    elif margin.source == "matrix":
        margin_text = f" Margin of practical equivalence: ±{fmt(margin.value)} (the matrix file's `margins:`)."
    elif margin.source == "none":
        margin_text = f" No margin of practical equivalence: {margin.reason}."
    else:
        size = (
            f"{margin.relative:.0%} of the baseline's mean, "
            + ", ".join(f"±{fmt(m.value)}" for m in sorted(margins, key=lambda m: m.value))
            if margin.relative is not None
            else f"±{fmt(margin.value)}"
        )
        margin_text = f" Margin of practical equivalence: {size} ({margin.reason})."
    sizes = ", ".join(str(n) for n in a.looks.sizes)
    looks = (
        f" Seeds in rounds: looks at {sizes} seeds, α {a.looks.alpha:g} split equally over them."
        if len(a.looks.sizes) > 1
        else f" One look at {sizes} seeds, α {a.looks.alpha:g}."
    )
    varies = a.seed_varies()
    seed = f" A seed varies {varies}." if varies else ""
    return [
        f"Question: {a.headline.name} {arrow} of each variant minus the baseline `{a.baseline_label}`"
        + (f" at the same level ({', '.join(f'`{k}`' for k in a.level_axes)})" if a.by_level else "")
        + f".{margin_text}{looks}{seed}",
        "",
    ]


# differences from the baseline variant ----------------------------------------------------------


def difference_table(a: TaskAnalysis) -> list[str]:
    """Each variant minus the baseline variant: the headline metric as decided (the verdict, and the
    decision's interval at its level), the others described with unadjusted 95% intervals; then the
    tests that decided."""
    others = [g for g in a.groups if not a.is_baseline(g)]
    if not others:
        return []
    if not a.baselines:
        return [f"No differences: the baseline variant `{a.baseline_label}` has no cells for this task.", ""]
    if not any(a.has_values(baseline) for baseline in a.baselines.values()):
        status = " or ".join(dict.fromkeys(b.status_without_ok for b in a.baselines.values()))
        return [f"No differences: every seed of the baseline variant `{a.baseline_label}` {status}.", ""]
    at = f" at the same level ({', '.join(f'`{k}`' for k in a.level_axes)})" if a.by_level else ""
    secondary = (
        f"; the other metrics with their {LEVEL:.0%} intervals, **descriptive, unadjusted** (they decide nothing)"
        if len(a.metrics) > 1
        else ""
    )
    lines = [
        f"Difference from the baseline variant `{a.baseline_label}`{at} (variant − baseline), each over the seeds "
        f"it names (*3 pairs* seed-matched, *3 vs 9 seeds* unpaired, variant first): the headline {a.headline.name} "
        "with its verdict and the interval of the test that decided it (the t interval where a rank test, which has "
        "none, decided) over the seeds of the look that decided it, and where the table of means has more, its "
        f"difference over all of them, descriptive (95%){secondary}:",
        "",
    ]
    columns = [
        f"{arrow(m)} (verdict)" if m is a.headline else f"{arrow(m)} (descriptive, unadjusted)" for m in a.metrics
    ]
    lines += _table_head(["variant", *columns])
    for group in others:
        lines.append(_row([group.variant] + [difference_cell(a, group, m) for m in a.metrics]))
    return [*lines, "", difference_method(a, others), ""]


def no_difference_reason(a: TaskAnalysis, group: Group) -> str:
    """Why ``group`` has no difference from its baseline: ``failed``, ``diverged`` (its own seeds), or the
    baseline's."""
    baseline = a.baseline_of(group)
    if baseline is None:
        at = f" at {level_text(group.level)}" if a.by_level else ""
        return f"no cells of the baseline variant `{a.baseline_label}`{at}"
    if not a.has_values(baseline):
        return f"every seed of the baseline {baseline.status_without_ok}"
    return group.status_without_ok if not group.ok else "not recorded"


def difference_cell(a: TaskAnalysis, group: Group, metric: Metric) -> str:
    stats = a.stats[group.variant].metrics[metric.name]
    if stats.difference is None:
        return no_difference_reason(a, group)
    if metric is a.headline:
        question = a.stats[group.variant].question
        if question is not None and question.decision is not None:
            text = f"{decision_text(a, question)} **{question.verdict}** over {seeds_text(question.decision.n)}"
            every = all_seeds_text(a, question)
            return f"{text}; {every}" if every else text
    return difference_text(a, group, metric)


def _digits(a: TaskAnalysis, group: Group, metric: Metric) -> int:
    """The decimals of a difference: those of the larger of the two means."""
    mean = a.stats[group.variant].metrics[metric.name].mean
    baseline_mean = a.stats[a.baseline_of(group).variant].metrics[metric.name].mean
    return decimals(max(abs(mean), abs(baseline_mean)))


def difference_text(a: TaskAnalysis, group: Group, metric: Metric, *, seeds: bool = True) -> str:
    """``+23.29 [+23.26, +23.31] over 3 pairs``, or ``+0.200 over 1 pair (no interval: one seed)``:
    ``group``'s difference from its baseline in ``metric`` over every seed of the two sides in the statistics,
    with its unadjusted 95% interval, to the decimals of the larger mean (without the seed set: ``seeds``)."""
    diff = a.stats[group.variant].metrics[metric.name].difference
    digits = _digits(a, group, metric)
    over = f" over {seeds_text(diff.n)}" if seeds and diff.n else ""
    text = fmt(diff.difference, digits, sign=True)
    if diff.ci_low is None or diff.ci_high is None:
        return f"{text}{over} (no interval: {_no_interval_reason(diff)})"
    return text + f" [{fmt(diff.ci_low, digits, sign=True)}, {fmt(diff.ci_high, digits, sign=True)}]{over}"


def all_seeds_text(a: TaskAnalysis, question: Question) -> str:
    """``over all 9 pairs, descriptive (95%): -0.023 [-0.062, +0.016]``: the headline difference over every
    seed of the two sides in the statistics, where the question's look used fewer of them (a look stops
    where it decides, and seeds past it do not count in the verdict); "" where the look used them all.
    Labelled descriptive: no verdict rests on it (the seeds past the look were trained for another question
    or by another matrix), and reading it as a second test would spend the question's error rate twice."""
    group, baseline = question.group, question.baseline
    if baseline is None or question.decision is None:
        return ""
    every = [set(a.values[g.variant, a.headline.name]) for g in (group, baseline)]
    if every == [set(question.look[0]), set(question.look[1])]:
        return ""
    diff = a.stats[group.variant].metrics[a.headline.name].difference
    if diff is None:
        return ""
    described = difference_text(a, group, a.headline, seeds=False)
    return f"over all {seeds_text(diff.n)}, descriptive ({LEVEL:.0%}): {described}"


def decision_text(a: TaskAnalysis, question: Question) -> str:
    """``+3.67 [+2.80, +4.53]``: the decided difference with the interval of its test (at its look's
    level, never cut), or ``+0.0 (no interval)``, to the decimals of the larger mean."""
    decision = question.decision
    digits = _digits(a, question.group, a.headline)
    text = fmt(decision.difference, digits, sign=True)
    if decision.interval is None:
        return f"{text} (no interval)"
    low, high = decision.interval
    return text + f" [{fmt(low, digits, sign=True)}, {fmt(high, digits, sign=True)}]"


def difference_method(a: TaskAnalysis, others: list[Group]) -> str:
    """Which test decided each variant's question, and what the other metrics' intervals are."""
    tests: dict[str, list[str]] = {}
    for group in others:
        question = a.stats[group.variant].question
        if question is not None and question.verdict in NO_VERDICT:
            tests.setdefault(f"no verdict ({question.verdict})", []).append(f"`{group.variant}`")
        elif question is not None and question.decision is not None:
            d = question.decision
            why = " (a seed did not learn or diverged)" if question.rank_based else ""
            tests.setdefault(f"{d.test}{why} at α {d.alpha:.2g}", []).append(f"`{group.variant}`")
    if len(tests) == 1:
        test_text = f"Decided by: {next(iter(tests))}. "
    else:
        test_text = "; ".join(f"{text} for {', '.join(variants)}" for text, variants in tests.items())
        test_text = f"Decided by: {test_text}. " if tests else ""
    return (
        f"{test_text}Each question is decided from its two sides' cells alone (no adjustment across the matrix); "
        f"the secondary metrics' intervals are paired t over seed-matched pairs (Welch's where the seeds differ), "
        "unadjusted, and never cut at the metric's range."
    )


def _no_interval_reason(diff: Difference) -> str:
    if min(diff.n) < 2:
        return "one seed"
    return "the same difference in every seed pair" if diff.test == PAIRED else "seeds identical"


def _side(a: TaskAnalysis, group: Group | None, look: frozenset) -> Side:
    """``group``'s side of a verdict: its seeds in the look that decided it (all its seeds in the
    statistics where there is no decision), those diverged and those that did not learn, and the median
    step time of each of its finished seeds (all of them: a property of the design, not of the look), with
    the load and the machine each was timed under."""
    if group is None:
        return Side(0, 0)
    step_times = tuple(group.speed_values("step_time_ms"))
    loads = tuple(group.speed_loads("step_time_ms"))
    machines = tuple(group.speed_machines("step_time_ms"))
    group = restrict(group, look) if look else group
    return Side(
        len(group.ok) + len(group.diverged),
        len(group.diverged),
        step_times,
        len(group.did_not_learn(a.headline)),
        loads,
        machines,
    )


def _margin_text(question: Question) -> str:
    """``±0.074`` (``none declared`` for a task without a margin)."""
    if question.margin is None:
        return ""
    return "none declared" if question.margin.source == "none" else f"±{fmt(question.margin.value)}"


def comparisons(a: TaskAnalysis) -> list[Comparison]:
    """Each variant's question in the task's headline metric, as the task's section shows it: what the
    verdicts (``blockbench.report.verdicts``) word."""
    family = next((g.family for g in a.groups if g.family), None) or a.task_cfg.family
    tuned = ((read_tuning(a.matrix_dir) or {}).get("tasks") or {}).get(a.task, {}).get("variants")

    def tuned_value(group: Group | None) -> str | None:
        return chosen_text(tuned.get(group.variant)) if tuned and group else None

    found = []
    for question in a.questions:
        group, baseline = question.group, question.baseline
        found.append(
            Comparison(
                task=a.task,
                family=family,
                variant=a.label(group),
                baseline=a.baseline_label,
                level=group.level if a.by_level else (),
                metric=a.headline,
                verdict=question.verdict,
                decision=question.decision,
                difference_text=decision_text(a, question) if question.decision else "",
                margin_text=_margin_text(question),
                variant_side=_side(a, group, question.look[0]),
                baseline_side=_side(a, baseline, question.look[1]),
                missing=question.missing or ("" if question.decision else no_difference_reason(a, group)),
                saturation=question.saturation,
                tuned=(tuned_value(group), tuned_value(baseline)) if tuned else None,
                not_learned=question.not_learned,
                all_seeds_text=all_seeds_text(a, question),
                cells=question_cells(a, question),
                rungs=a.settings.rungs,
            )
        )
    return found


def question_cells(a: TaskAnalysis, question: Question) -> QuestionCells | None:
    """The cells ``question`` was asked of (``verdicts.QuestionCells``): each side's records of the seeds of
    its look, by seed, config hash, status and headline value; None without a look (no decision)."""
    if question.baseline is None or question.decision is None:
        return None
    sides = [
        frozenset(
            SeedCell(r.seed, r.config_hash, r.status, (r.metrics or {}).get(a.headline.name))
            for r in restrict(group, seeds).results
        )
        for group, seeds in zip((question.group, question.baseline), question.look, strict=True)
    ]
    margin = question.margin.value if question.margin is not None else None
    return QuestionCells(question.group.task_name, a.headline.name, *sides, a.looks.sizes, margin)
