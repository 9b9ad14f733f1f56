"""Verdicts: does a variant help, and does it help in every model family?

The analysis of a matrix (``blockbench.report.analysis``) asks one question per task x variant x
level: the task's headline metric against the baseline variant at the same level, decided by
``decide.decide`` from the two sides' cells alone. This module words each answer, once, for two places:

- the top of each ``summary.md``: one line per variant vs baseline per task (:func:`verdict_lines`),
  and where the matrix compares within levels (``within:``, the budget) a table of the differences
  across the levels side by side;
- the index of a results root, ``results/README.md`` (:func:`index_markdown`): one row per matrix x
  variant vs baseline (x level), one column per model family, whether the verdict transfers across
  the families, how many of the family verdicts are decided and what the whole book cost.

There are four verdicts: **better** or **worse** (the test rejects no difference), **equivalent**
(the difference lies within ± the margin of practical equivalence), **undecided** (neither is shown:
more seeds may answer it). Two states are not verdicts: **no result** (a side has no seed in the
statistics) and **saturated** (both sides where the metric cannot tell them apart: the best value,
or the LM's entropy floor). Nothing here computes a statistic: :class:`Comparison` carries the
analysis's own decision.

A verdict that changes from one level to another is flagged (``⚠ flips: worse at 300 steps, better
at 1,500 steps``): short runs can reverse what long ones find, and a deeper model what a shallow one does.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from blockbench.tasks import Metric

from .decide import BETTER, EQUIVALENT, RANK_SUM, SIGNED_RANK, UNDECIDED, WORSE, Decision
from .results import BUDGET_AXIS, level_text
from .stats import Ratio, ratio_of_medians

#: the index's family columns, in order: ``model.family`` -> column title
FAMILIES = {"decoder_lm": "LM", "encoder_decoder": "translator", "vit": "ViT"}

NO_RESULT, SATURATED = "no result", "saturated"  # states that are not verdicts
#: the verdicts that answer the question, in the order the transfer column lists them
DECIDED = (BETTER, WORSE, EQUIVALENT)
MIXED = "mixed"  # a family whose tasks disagree
#: every family verdict in the order the transfer column lists them
ORDER = (*DECIDED, MIXED, UNDECIDED, SATURATED, NO_RESULT)
#: the tests of a question where a seed of either side did not learn or diverged
RANK_TESTS = (SIGNED_RANK, RANK_SUM)

LEGEND = (
    "One question per task x variant (x level): the task's headline metric, variant − baseline (the arrow says "
    "which way is better), decided from the two sides' cells alone at a 5% error rate per question (no family "
    "across the matrix: the same cells get the same verdict in every matrix; with seeds in rounds each look spends "
    "an equal share of it). **better** / **worse**: the test finds a difference and the typical seed shows it too "
    "(P(better), below, on the same side of 0.5); **equivalent**: the difference's "
    "interval lies within ± the task's margin of practical equivalence (two one-sided tests); **undecided**: "
    "neither is shown (more seeds may answer it). *saturated* (no verdict): both sides sit at the metric's best "
    "value or within the stated distance of the LM's entropy floor, where it cannot tell them apart; *no result*: "
    "a side has no seed. After the verdict: the test that decided it, its seeds and level α, the difference with "
    "its interval at that level, the margin, and the probability of improvement P(better) (variant better than "
    "baseline over all seed pairs, ties half) with its bootstrap interval; a rank test decides where a seed of "
    "either side did not learn or diverged. Then the shares of seeds that *did not learn* "
    "(finished no better than the trivial baseline; counted as they are) or diverged (counted as a model that "
    "learned nothing), the variant's median step time as a multiple of the baseline's with its 95% bootstrap "
    "interval over the seeds (*a tie* where it holds 1; n/a: not recorded), and in "
    "a matrix with `tune:` the values the two sides' seeds trained at (variant vs baseline; *lowest* or *highest "
    "tried* where a value is an end of its grid, so the side's best may lie beyond it). Whether a verdict transfers "
    "across the families uses the same four words: *equivalent in all 3* is an answer, *undecided* is not a no."
)


#: the index's legend: its cells are short (:func:`brief`); the summaries have the rest
INDEX_LEGEND = (
    "One question per task x variant (x level): the task's headline metric, variant − baseline (the arrow says "
    "which way is better), decided from the two sides' cells alone at a 5% error rate per question, so the same "
    "cells get the same verdict in every matrix ([the rule](../docs/decisions/verdict-rule.md)). **better** / "
    "**worse**: the test finds a difference that the typical seed shows too; **equivalent**: the difference's "
    "interval lies within ± the task's margin of practical equivalence; **undecided**: neither is shown (more "
    "seeds may answer it); *saturated*: both sides at the metric's best value (or the LM's entropy floor), no "
    "verdict. Each cell: the verdict, the difference with the interval of the test that decided it (where a rank "
    "test decided, which has none, the t interval, as a description), *rank test* where a seed of either side did "
    "not learn (or diverged), and how many seeds *did not learn* (finished no better than the trivial baseline) "
    "or diverged. The matrix's summary (first column) has the test, its α, the margin, the probability of "
    "improvement, step times and tuned values. The last column says whether the verdict is the same in every "
    "family: *equivalent in all 3* is an answer, *undecided* is not a no. A family with several tasks has a line "
    "per task."
)


def family_title(family: str) -> str:
    """``decoder_lm`` -> ``LM``; an unknown family keeps its name."""
    return FAMILIES.get(family, family)


def _level_key(level: tuple[tuple[str, Any], ...]) -> tuple:
    """A sort key of a level: numbers by value, anything else by its text, after them."""
    return tuple(
        (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v)) for _, v in level
    )


@dataclass(frozen=True)
class Side:
    """One side of a comparison (the variant's or the baseline's cells of a task)."""

    seeds: int  # in the statistics: finished and diverged
    diverged: int
    #: each finished seed's median step time (those that recorded one)
    step_times_ms: tuple[float, ...] = ()
    did_not_learn: int = 0  # finished seeds no better than the trivial baseline

    def issues_text(self) -> str:
        """``1/3 did not learn, 1/3 diverged``, or empty when every seed learned."""
        parts = [f"{self.did_not_learn}/{self.seeds} did not learn"] if self.did_not_learn else []
        parts += [f"{self.diverged}/{self.seeds} diverged"] if self.diverged else []
        return ", ".join(parts)


@dataclass(frozen=True)
class Comparison:
    """A variant against the matrix's baseline variant on one task (at one level), in the task's
    headline metric, as the analysis decided it."""

    task: str
    family: str  # ``model.family`` of the task's cells
    variant: str  # the variant's label, without the level when the matrix compares within levels
    baseline: str  # the baseline variant's label, likewise
    level: tuple[tuple[str, Any], ...]  # (axis, value) of each level axis; () without levels
    metric: Metric
    verdict: str  # better, worse, equivalent, undecided; or no result, saturated
    decision: Decision | None  # None: no result (see ``missing``)
    #: the decision's difference and interval to the decimals of the larger mean: ``+23.29 [+23.26, +23.31]``
    difference_text: str
    margin_text: str  # ``±0.074``
    variant_side: Side
    baseline_side: Side
    missing: str = ""  # why there is no decision
    saturation: str = ""  # why the comparison is saturated
    #: a matrix with ``tune:``: the tuned value each side's seeds trained at (``lr=0.001``), None if it has none
    tuned: tuple[str | None, str | None] | None = None

    @property
    def decided(self) -> bool:
        return self.verdict in DECIDED

    @property
    def step_time_ratio(self) -> Ratio | None:
        """The variant's median step time over the baseline's, over their finished seeds, with its
        bootstrap interval (None when either side recorded none): the median, since a few cells timed
        under another load (copied from a matrix that ran beside other work) would move a mean."""
        return ratio_of_medians(self.variant_side.step_times_ms, self.baseline_side.step_times_ms)

    def step_time_text(self) -> str:
        """``step time ×2.10 [1.95, 2.31]``, ``step time ×0.97 [0.52, 1.03], a tie`` (the interval
        holds 1), ``step time ×1.02`` (no interval), or ``step time n/a``."""
        ratio = self.step_time_ratio
        if ratio is None:
            return "step time n/a"
        if ratio.interval is None:
            return f"step time ×{ratio.value:.2f}"
        low, high = ratio.interval
        return f"step time ×{ratio.value:.2f} [{low:.2f}, {high:.2f}]" + (", a tie" if ratio.tie else "")

    @property
    def level_text(self) -> str:
        """``n_layers=4`` or ``300 steps`` (empty without levels)."""
        return level_text(self.level)

    @property
    def label(self) -> str:
        """``ffn=swiglu vs ffn=mlp`` (``at 300 steps``, ``at n_layers=4`` when compared within levels)."""
        return f"{self.variant} vs {self.baseline}" + (f" at {self.level_text}" if self.level else "")

    def test_text(self) -> str:
        """``paired t, 3 pairs, α 0.05``: the test that decided, its seeds and the α of its look."""
        d = self.decision
        if d is None:
            return ""
        seeds = f"{d.n[0]} pairs" if len(d.n) == 1 else " vs ".join(str(n) for n in d.n) + " seeds"
        return f"{d.test}, {seeds}, α {d.alpha:.2g}"

    def describe(self, flag: str = "") -> str:
        """``**worse** (paired t, 3 pairs, α 0.05), perplexity ↓ +23.29 [+23.26, +23.31], margin ±0.074;
        P(better) 0.00 [0.00, 0.00]; 1/3 did not learn; step time ×1.02``, then in a tuned matrix the values
        the two sides trained at (``tuned lr=0.0003 vs lr=0.001``), then ``flag``."""
        if self.decision is None:
            text = f"no result: {self.missing}"
        else:
            arrow = "↑" if self.metric.higher_is_better else "↓"
            head = f"**{self.verdict}**"
            if self.verdict == SATURATED:
                head += f" (no verdict: {self.saturation})"
            else:
                more = ""
                if self.decision.futile:
                    power = self.decision.conditional_power
                    more = f"; stopped for futility: conditional power {power:.0%}"
                elif self.verdict == UNDECIDED and not self.decision.final:
                    more = "; more seeds may decide it"
                if self.decision.typical_disagrees:
                    more = "; the t test found a difference that the typical seed does not show" + more
                head += f" ({self.test_text()}{more})"
            parts = [f"{head}, {self.metric.name} {arrow} {self.difference_text}, margin {self.margin_text}"]
            p = self.decision.prob_improvement
            if p is not None:
                interval = self.decision.prob_improvement_interval
                parts.append(
                    f"P(better) {p:.2f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval is not None else "")
                )
            issues = [self.variant_side.issues_text(), self.baseline_side.issues_text()]
            if any(issues):
                parts.append(", ".join(filter(None, [issues[0], issues[1] and f"baseline {issues[1]}"])))
            parts.append(self.step_time_text())
            if self.tuned is not None:
                parts.append(f"tuned {self.tuned[0] or 'none'} vs {self.tuned[1] or 'none'}")
            text = "; ".join(parts)
        return f"{text}; {flag}" if flag else text


def brief(comparison: Comparison, flag: str = "") -> str:
    """The index's cell, short enough to read down a column: ``**worse** perplexity ↓ +23.29 [+23.26,
    +23.31]``, then ``rank test`` where a rank test decided, the seeds that did not learn or diverged,
    and ``flag``. The test, its α, the margin, P(better), step times and tuned values are in the
    matrix's summary (:meth:`Comparison.describe`)."""
    c = comparison
    if c.decision is None:
        return f"no result: {c.missing}"
    arrow = "↑" if c.metric.higher_is_better else "↓"
    parts = [f"**{c.verdict}** {c.metric.name} {arrow} {c.difference_text}"]
    if c.verdict == SATURATED:
        parts = [f"*{c.verdict}* (both at the best {c.metric.name})"]
    elif c.decision.test in RANK_TESTS:
        parts.append("rank test")
    issues = [c.variant_side.issues_text(), c.baseline_side.issues_text()]
    parts += [text for text in (issues[0], issues[1] and f"baseline {issues[1]}") if text]
    return "; ".join([*parts, *([flag] if flag else [])])


def level_flags(comparisons: Iterable[Comparison]) -> dict[tuple[str, str, str], str]:
    """(task, variant, baseline) -> a warning where the verdict changes from one level to another:
    ``⚠ flips: worse at 300 steps, better at 1,500 steps`` when it turns from better to worse or back,
    ``⚠ changes with the budget: equivalent at 300 steps, better at 1,500 steps`` (``with the level``
    where the level is not only the budget) otherwise. Only decided verdicts count: an undecided level
    does not disagree with anything."""
    by_key: dict[tuple[str, str, str], list[Comparison]] = {}
    for c in comparisons:
        if c.level:
            by_key.setdefault((c.task, c.variant, c.baseline), []).append(c)
    flags = {}
    for key, found in by_key.items():
        decided = [c for c in sorted(found, key=lambda c: _level_key(c.level)) if c.decided]
        if len({c.verdict for c in decided}) < 2:
            continue
        budget_only = all(axis == BUDGET_AXIS for c in decided for axis, _ in c.level)
        what = (
            "flips"
            if {BETTER, WORSE} <= {c.verdict for c in decided}
            else f"changes with the {'budget' if budget_only else 'level'}"
        )
        flags[key] = f"⚠ {what}: " + ", ".join(f"{c.verdict} at {c.level_text}" for c in decided)
    return flags


def family_verdicts(comparisons: list[Comparison]) -> dict[str, str]:
    """Family -> the verdict of its tasks, in :data:`FAMILIES` order: the one decided verdict (better,
    worse, equivalent) its tasks have, ``mixed`` when they have several, else undecided, saturated or
    no result."""
    verdicts: dict[str, set[str]] = {}
    for c in comparisons:
        verdicts.setdefault(c.family, set()).add(c.verdict)
    ordered = sorted(verdicts, key=lambda f: (list(FAMILIES).index(f) if f in FAMILIES else len(FAMILIES), f))
    return {f: _one_verdict(verdicts[f]) for f in ordered}


def _one_verdict(verdicts: set[str]) -> str:
    decided = verdicts & set(DECIDED)
    if decided:
        return decided.pop() if len(decided) == 1 else MIXED
    return next(v for v in (UNDECIDED, SATURATED, NO_RESULT) if v in verdicts or v == NO_RESULT)


def _join(names: list[str]) -> str:
    """``LM``, ``LM and ViT``, ``LM, translator and ViT``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def transfer(comparisons: list[Comparison]) -> str:
    """Whether one variant's verdict (at one level) is the same in every family that ran:
    ``yes: better in all 3``, ``yes: equivalent in all 3``, ``no: better in LM, worse in ViT``,
    ``only LM run``, ``yes: worse in LM and ViT (translator not run)``, ``undecided: ...`` when fewer
    than two families have a decided verdict (better, worse, equivalent) and none disagree: an
    undecided family is not a "no". Where two or more agree and another is undecided or saturated,
    ``yes where decided: worse in LM and translator, undecided in ViT``: an undecided family is not a
    "yes" either, so the plain ``yes`` is kept for a verdict every family that ran agrees on. A family
    whose tasks disagree (``mixed``) is a verdict that does not transfer."""
    families = family_verdicts(comparisons)
    if len(families) < 2:
        return f"only {_join([family_title(f) for f in families])} run" if families else "nothing run"
    by_verdict: dict[str, list[str]] = {}
    for family, verdict in families.items():
        by_verdict.setdefault(verdict, []).append(family_title(family))
    every = len(by_verdict) == 1 and len(families) == len(FAMILIES)
    listing = (
        f"{next(iter(by_verdict))} in all {len(families)}"
        if every
        else ", ".join(f"{v} in {_join(by_verdict[v])}" for v in ORDER if v in by_verdict)
    )
    decided = [v for v in families.values() if v in DECIDED]
    not_run = [title for family, title in FAMILIES.items() if family not in families]
    note = f" ({_join(not_run)} not run)" if not_run else ""
    if MIXED in families.values() or len(set(decided)) > 1:
        return f"no: {listing}{note}"
    if len(decided) < 2:
        return f"undecided: {listing}{note}"
    if len(decided) < len(families):
        return f"yes where decided: {listing}{note}"
    return f"yes: {listing}{note}"


def _rows(comparisons: list[Comparison]) -> dict[tuple[str, str, tuple], list[Comparison]]:
    """(variant, baseline, level) -> its comparisons (one per task), variants in the order they first
    come, each one's levels ascending."""
    rows: dict[tuple[str, str, tuple], list[Comparison]] = {}
    for c in comparisons:
        rows.setdefault((c.variant, c.baseline, c.level), []).append(c)
    variants = list(dict.fromkeys(key[0] for key in rows))
    return dict(sorted(rows.items(), key=lambda item: (variants.index(item[0][0]), _level_key(item[0][2]))))


def level_tables(comparisons: list[Comparison]) -> list[str]:
    """Per task compared within levels: its differences across the levels side by side, a row per design
    and a column per level (``**worse** +2.6 [+1.9, +3.3]``), so a trend with depth or budget shows."""
    lines: list[str] = []
    tasks = list(dict.fromkeys(c.task for c in comparisons if c.level))
    for task in tasks:
        found = [c for c in comparisons if c.task == task and c.level]
        levels = sorted(dict.fromkeys(c.level for c in found), key=_level_key)
        if len(levels) < 2:
            continue
        metric, baseline = found[0].metric, found[0].baseline
        arrow = "↑" if metric.higher_is_better else "↓"
        lines += [f"**{task}**, {metric.name} {arrow} minus `{baseline}` at each level:", ""]
        lines += ["| variant | " + " | ".join(level_text(level) for level in levels) + " |"]
        lines += ["|" + "---|" * (len(levels) + 1)]
        for variant in dict.fromkeys(c.variant for c in found):
            by_level = {c.level: c for c in found if c.variant == variant}
            cells = [
                f"**{c.verdict}** {c.difference_text}"
                if (c := by_level.get(level)) and c.decision
                else (c.verdict if c else "–")
                for level in levels
            ]
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def apart_note(description: str) -> str:
    """The note atop the verdicts of a matrix whose file says ``verdicts: false``: it answers no design
    question (a demonstration, or the empirical null, whose better or worse is a false positive), so the
    index lists it apart; its file's ``description`` says what it is instead."""
    what = f" It is: {description.rstrip('.')}." if description else ""
    return (
        "**Not a design question's answer**: this matrix's file says `verdicts: false`, so `results/README.md` "
        f"lists it apart from the verdicts.{what}"
    )


def verdict_lines(comparisons: list[Comparison], *, apart: str | None = None) -> list[str]:
    """The ``Verdicts`` section at the top of a summary: one line per variant vs baseline per task (per
    level), then, where it ran in several families, whether its verdict transfers across them, then the
    differences across levels side by side (empty without comparisons). A matrix whose file says
    ``verdicts: false`` passes its ``description`` as ``apart``, and the section says so first."""
    if not comparisons:
        return []
    flags = level_flags(comparisons)
    lines = ["## Verdicts", "", *([apart_note(apart), ""] if apart is not None else []), LEGEND, ""]
    for row in _rows(comparisons).values():
        for c in row:
            flag = flags.get((c.task, c.variant, c.baseline), "")
            lines.append(f"- {c.task} ({family_title(c.family)}), {c.label}: {c.describe(flag)}")
        if len({c.family for c in row}) > 1:
            lines.append(f"- {row[0].label}, across the families: {transfer(row)}")
    lines.append("")
    return lines + level_tables(comparisons)


@dataclass
class MatrixVerdicts:
    """One matrix's part of the index: its comparisons and where its summary is."""

    name: str
    comparisons: list[Comparison]
    has_summary: bool = True
    unfinished: int = 0  # cells with a cell.json but no result (an interrupted run)
    #: where its numbers came from, as its summary's header says: the code versions and machines of its
    #: cells; and what it cost: its last run and its cells' summed process time (None: nothing recorded)
    code: tuple[str, ...] = ()
    machines: tuple[str, ...] = ()
    cost: str | None = None


@dataclass(frozen=True)
class Apart:
    """A matrix with results whose file says ``verdicts: false``, and what it is (its ``description``)."""

    name: str
    description: str = ""


@dataclass(frozen=True)
class NotRun:
    """A matrix without a finished or diverged cell: the command that runs it and why it is listed."""

    name: str
    command: str
    reason: str
    #: what the matrix compares (its file's ``description``), so the list says what is missing
    description: str = ""


@dataclass
class Index:
    """What ``results/README.md`` holds."""

    command: str  # the command that writes it
    matrices: list[MatrixVerdicts] = field(default_factory=list)
    not_run: list[NotRun] = field(default_factory=list)
    #: matrices with ``verdicts: false`` that have results (a demonstration, the empirical null)
    apart: list[Apart] = field(default_factory=list)
    #: the seconds of every cell process of the book: reported cells and tuning cells (those apart included)
    book_seconds: tuple[float, float] = (0.0, 0.0)


def _cell(text: str) -> str:
    """A table cell: a ``|`` would end it."""
    return text.replace("|", "\\|")


def _matrix_cell(matrix: MatrixVerdicts) -> str:
    name = (
        f"[{matrix.name}]({urllib.parse.quote(matrix.name)}/summary.md)"
        if matrix.has_summary
        else f"{matrix.name} (no summary.md yet)"
    )
    plural = "s" if matrix.unfinished != 1 else ""
    return name + (f" ({matrix.unfinished} cell{plural} without a result)" if matrix.unfinished else "")


def index_rows(matrix: MatrixVerdicts, families: list[str]) -> list[list[str]]:
    """One table row per variant vs baseline (per level): matrix, variant, baseline, a cell per family
    in ``families`` (``task: ...`` lines when a family has several tasks), the transfer column."""
    flags = level_flags(matrix.comparisons)
    rows = []
    for (variant, baseline, level), row in _rows(matrix.comparisons).items():
        cells = []
        for family in families:
            ours = [c for c in row if c.family == family]
            texts = [brief(c, flags.get((c.task, c.variant, c.baseline), "")) for c in ours]
            # several tasks of one family (e.g. two LM data sets): a line each in the family's cell, so that the
            # row stays one comparison and its last column answers for all of them
            if len(ours) > 1:
                texts = [f"{c.task}: {text}" for c, text in zip(ours, texts, strict=True)]
            cells.append("<br>".join(texts) if texts else "–")
        at = f" at {level_text(level)}" if level else ""
        rows.append([_matrix_cell(matrix), f"{variant}{at}", baseline, *cells, transfer(row)])
    return rows


def decided_count(index: Index) -> tuple[int, int]:
    """(decided, all) family verdicts of the index: one per row x family that ran, decided where it is
    better, worse or equivalent (a family whose tasks disagree, mixed, is not one answer)."""
    verdicts = [
        verdict
        for matrix in index.matrices
        for row in _rows(matrix.comparisons).values()
        for verdict in family_verdicts(row).values()
    ]
    return sum(v in DECIDED for v in verdicts), len(verdicts)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f}"


def index_markdown(index: Index) -> str:
    """``results/README.md``: the verdict table of every matrix with results, how many of its family
    verdicts are decided and what the book cost, and the matrices not run yet."""
    lines = [
        "# Verdicts",
        "",
        f"Generated by `{index.command}` from the matrix folders here (`blockbench matrix` refreshes it after each "
        "run): do not edit it by hand. Each matrix's summary has the details: every metric, the trivial baselines, "
        "the tests, the curves and the scale it ran at.",
        "",
    ]
    comparisons = [c for m in index.matrices for c in m.comparisons]
    reported, tuning = index.book_seconds
    if comparisons:
        decided, total = decided_count(index)
        lines += [
            f"**{decided} of {total} family verdicts are decided** (better, worse or equivalent; the rest undecided, "
            f"saturated or without a result), for **{_hours(reported + tuning)} cell-process hours** (the summed "
            f"wall time of every cell's process, a cell copied into several matrices counted once: "
            f"{_hours(reported)} h reported cells, {_hours(tuning)} h tuning cells).",
            "",
        ]
        present = {c.family for c in comparisons}
        families = [*FAMILIES, *sorted(present - set(FAMILIES))]
        header = [
            "comparison",
            "variant",
            "baseline",
            *[family_title(f) for f in families],
            "transfers across the families?",
        ]
        lines += [
            INDEX_LEGEND,
            "",
        ]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for matrix in index.matrices:
            lines += ["| " + " | ".join(_cell(text) for text in row) + " |" for row in index_rows(matrix, families)]
        lines.append("")
    elif not index.matrices:
        lines += ["No matrix has a finished cell yet.", ""]
    single = [m.name for m in index.matrices if not m.comparisons]
    if single:
        lines += [
            "Matrices with results but nothing to compare (one variant): "
            + ", ".join(f"[{n}]({urllib.parse.quote(n)}/summary.md)" for n in single)
            + ".",
            "",
        ]
    provenance = [m for m in index.matrices if m.code or m.machines or m.cost]
    if provenance:
        lines += [
            "## Where the numbers come from",
            "",
            "The code and machine each matrix's cells ran on, tuning cells included (as its summary's header says). "
            "Cost: its last run (the command, which reuses finished cells, its wall time and the cells it trained), "
            "then the time of every cell's process summed, tuning cells included: what the whole matrix takes on "
            "one slot, even when it ran in several pieces.",
            "",
            "| comparison | code | machine | cost |",
            "|---|---|---|---|",
        ]
        lines += [
            "| "
            + " | ".join(
                _cell(text)
                for text in (
                    _matrix_cell(m),
                    "; ".join(m.code) or "not recorded",
                    "; ".join(m.machines) or "not recorded",
                    m.cost or "not recorded",
                )
            )
            + " |"
            for m in provenance
        ]
        lines.append("")
    if index.apart:
        lines += [
            "Not design questions (`verdicts: false` in their matrix file), so not among the verdicts:",
            "",
            *(f"- [{m.name}]({m.name}/summary.md){': ' + m.description if m.description else ''}" for m in index.apart),
            "",
        ]
    if index.not_run:
        lines += ["## Not run yet", ""]
        lines += [
            f"- {m.name} ({m.reason}): {m.description + ' ' if m.description else ''}`{m.command}`"
            for m in index.not_run
        ]
        lines.append("")
    return "\n".join(lines)
