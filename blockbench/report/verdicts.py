"""Verdicts: does a variant help, and does it help in every model family?

The analysis of a matrix (``blockbench.report.analysis``) asks one question per task x variant x
level: the task's headline metric against the baseline variant at the same level, decided by
``decide.decide`` from the two sides' cells alone. This module words each answer once, for the top of
each ``summary.md``: one line per variant vs baseline per task (:func:`verdict_lines`), and where the
matrix compares within levels (``within:``, the budget) a table of the differences across the levels
side by side. ``book`` words the same answers for the index of a results root, ``results/README.md``.

There are four verdicts: **better** or **worse** (the test rejects no difference), **equivalent**
(the difference lies within ± the margin of practical equivalence), **undecided** (neither is shown:
more seeds may answer it). A better or worse verdict comes in two forms, ``decide.BEYOND_MARGIN`` and
``decide.WITHIN_MARGIN`` (:attr:`decide.Decision.beyond_margin`). Three states are not verdicts: **no
result** (a side has no seed in the statistics), **saturated** (both sides where the metric cannot tell
them apart: the best value, or the LM's entropy floor) and **not learned** (both sides closed less than
``headroom.NOT_LEARNED_SHARE`` of the way from the trivial baseline to the best value). Nothing here
computes a statistic: :class:`Comparison` carries the analysis's own decision, and every number it
shows names the seeds it was computed over (``stats.seeds_text``).

A verdict that changes from one level to another is flagged (``⚠ flips: worse at 300 steps, better
at 1,500 steps``): short runs can reverse what long ones find, and a deeper model what a shallow one does.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from blockbench.tasks import Metric

from ..matrixfile import RUNG_AXIS
from ..store.record import CellLoad
from .decide import BETTER, BEYOND_MARGIN, EQUIVALENT, RANK_SUM, SIGNED_RANK, UNDECIDED, WITHIN_MARGIN, WORSE, Decision
from .headroom import NOT_LEARNED_SHARE
from .results import BUDGET_AXIS, level_text
from .stats import Ratio, ratio_of_medians, seeds_text

#: the index's family columns, in order: ``model.family`` -> column title
FAMILIES = {"decoder_lm": "LM", "encoder_decoder": "translator", "vit": "ViT"}

#: states that are not verdicts: a side without a seed; both sides at the metric's best; neither side learned
NO_RESULT, SATURATED, NOT_LEARNED = "no result", "saturated", "not learned"
#: the states of a comparison that has a decision but gives no verdict, whatever its test says
NO_VERDICT = (SATURATED, NOT_LEARNED)
#: the verdicts that answer the question, in the order the transfer column lists them
DECIDED = (BETTER, WORSE, EQUIVALENT)
MIXED = "mixed"  # a family whose tasks disagree
#: every family verdict in the order the transfer column lists them
ORDER = (*DECIDED, MIXED, UNDECIDED, SATURATED, NOT_LEARNED, NO_RESULT)
#: the tests of a question where a seed of either side did not learn or diverged
RANK_TESTS = (SIGNED_RANK, RANK_SUM)
#: how much more of the machine's cores other processes may have kept busy on one side's timed seeds than on
#: the other's (each side's median) before its step-time ratio is no finding: a tenth of the cores taken from
#: a cell that uses them all slows its steps by a ninth (x1.11), as much as a design difference the ratio shows
LOAD_DIFFERENCE = 0.1

#: what the two forms of a better or worse verdict mean, said once for the summaries' and the index's legends
FORMS_TEXT = (
    f"A better or worse verdict is *{BEYOND_MARGIN}* where the end of its interval nearer zero lies beyond ± the "
    f"margin, and *{WITHIN_MARGIN}* where that end lies inside ± the margin: the test found a difference, but "
    "not that it matters (a rank test has no interval: its form is read from the t interval shown beside it)."
)
#: what the two labels that are not verdicts mean, said once for both legends
NO_VERDICT_TEXT = (
    "*saturated* (no verdict): both sides sit at the metric's best value or within the stated distance of the "
    "LM's entropy floor, where it cannot tell them apart; *not learned* (no verdict): both sides closed less than "
    f"{NOT_LEARNED_SHARE:.0%} of the way from the task's trivial baseline to the metric's best value (perplexity on "
    "the log scale), "
    "where a difference says how fast two models start, not which block works better; *no result*: a side has no "
    "seed."
)

LEGEND = (
    "One question per task x variant (x level): the task's headline metric, variant − baseline (the arrow says "
    "which way is better), decided from the two sides' cells alone at a 5% error rate per question (no family "
    "across the matrix: the same cells get the same verdict in every matrix; with seeds in rounds each look spends "
    "an equal share of it). **better** / **worse**: the test finds a difference and the typical seed shows it too "
    "(P(better), below, on the same side of 0.5); **equivalent**: the difference's "
    "interval lies within ± the task's margin of practical equivalence (two one-sided tests); **undecided**: "
    f"neither is shown (more seeds may answer it). {FORMS_TEXT} {NO_VERDICT_TEXT} After the verdict: the test that "
    "decided it and its level α; then the seeds it was decided on (the look's: *3 pairs* seed-matched, *3 vs 9 "
    "seeds* unpaired, variant first) and over them the difference with its interval at that level, the margin, and "
    "the probability of improvement P(better) (variant better than baseline over all seed pairs, ties half) with "
    "its bootstrap interval; a rank test decides where a seed of either side did not learn or diverged. "
    "Where the table of means has seeds past that look, the difference over all of them follows, "
    "*descriptive* (95%, no verdict rests on it). Then the shares of seeds that *did not learn* (finished no better "
    "than the trivial baseline; counted as they are) or diverged (counted as a model that learned nothing), the "
    "variant's median step time as a multiple of the baseline's with its 95% bootstrap interval over every "
    "finished seed (*a tie* where it holds 1; n/a: not recorded; *load not recorded* where a side has cells "
    "without a record of how busy other processes kept the machine as they ran; *timed under different load: "
    f"not a finding* where other processes took more than {LOAD_DIFFERENCE:.0%} of the machine's cores more on "
    "one side's seeds than on the other's, the median seed of each: enough to move a step time as much as a "
    "design does; *timed on different machines: not a finding* where the seeds ran on more than one machine, "
    "each machine's seeds counted per side), and in a matrix with `tune:` the values the two "
    "sides' seeds trained at (variant vs baseline; *lowest* or *highest tried* where a value is an end of its grid, "
    "so the side's best may lie beyond it). Whether a verdict transfers across the families uses the same four "
    "words: *equivalent in all 3* is an answer, *undecided* is not a no."
)


def family_title(family: str) -> str:
    """``decoder_lm`` -> ``LM``; an unknown family keeps its name."""
    return FAMILIES.get(family, family)


def _level_key(level: tuple[tuple[str, Any], ...], rungs: tuple[str, ...] = ()) -> tuple:
    """A sort key of a level: a ladder's rung by its place in ``rungs`` (least compute first, not as text:
    ``0.25x``, ``1x``, ``4x``, ``16x``), numbers by value, anything else by its text, after them."""
    return tuple(
        (0, rungs.index(v), "")
        if axis == RUNG_AXIS and v in rungs
        else (0, v, "")
        if isinstance(v, (int, float)) and not isinstance(v, bool)
        else (1, 0, str(v))
        for axis, v in level
    )


def _rungs_of(comparisons: Iterable[Comparison]) -> tuple[str, ...]:
    """The ladder's rungs, least compute first, of the comparisons' matrix (() without a ladder)."""
    return next((c.rungs for c in comparisons if c.rungs), ())


@dataclass(frozen=True)
class Side:
    """One side of a comparison (the variant's or the baseline's cells of a task)."""

    seeds: int  # in the statistics: finished and diverged
    diverged: int
    #: each finished seed's median step time (those that recorded one)
    step_times_ms: tuple[float, ...] = ()
    did_not_learn: int = 0  # finished seeds no better than the trivial baseline
    #: the load each of ``step_times_ms`` was timed under, in order (None: not recorded)
    loads: tuple[CellLoad | None, ...] = ()
    #: the machine each of ``step_times_ms`` was timed on, in order (None: not recorded)
    machines: tuple[str | None, ...] = ()

    @property
    def timed_loads(self) -> list[CellLoad] | None:
        """The load of every timed seed; None where a seed has none (recorded before the runner measured
        load, or on a machine without /proc), since then the side's load is unknown."""
        loads = [load for load in self.loads if load is not None]
        return loads if len(loads) == len(self.step_times_ms) else None

    def issues_text(self) -> str:
        """``1/3 did not learn, 1/3 diverged``, or empty when every seed learned."""
        parts = [f"{self.did_not_learn}/{self.seeds} did not learn"] if self.did_not_learn else []
        parts += [f"{self.diverged}/{self.seeds} diverged"] if self.diverged else []
        return ", ".join(parts)


@dataclass(frozen=True)
class SeedCell:
    """One seed's cell as a question reads it: what makes two matrices' copies of a cell the same cell."""

    seed: Any
    config_hash: str | None
    status: str
    value: float | None  # the headline metric (None: diverged or failed)


@dataclass(frozen=True)
class QuestionCells:
    """What a question is asked of: the task kind and headline metric, the cells of each side's seeds that
    its decision read (the look's), the planned looks and the margin. Two matrices that copy the same cells
    ask the same question and get the same decision (per question, nothing else enters it), so the index
    lists it once with both matrices and counts it once; names are not compared, records are."""

    task: str  # the task kind (``lm``, ``translation_text``), not its label in the matrix
    metric: str
    variant: frozenset[SeedCell]
    baseline: frozenset[SeedCell]
    looks: tuple[int, ...]
    margin: float | None


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
    verdict: str  # better, worse, equivalent, undecided; or no result, saturated, not learned
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
    not_learned: str = ""  # why neither side learned the task (empty if one did)
    #: the difference over every seed of the two sides in the statistics, where the decision's look used fewer:
    #: ``over all 9 pairs, descriptive (95%): -0.023 [-0.062, +0.016]`` (empty where the look used them all)
    all_seeds_text: str = ""
    #: the cells the question was asked of (None: no look, e.g. no cells of the baseline)
    cells: QuestionCells | None = None
    #: the matrix's ladder rungs, least compute first (() without a ladder): the order its levels sort in
    rungs: tuple[str, ...] = ()

    @property
    def decided(self) -> bool:
        return self.verdict in DECIDED

    @property
    def form(self) -> str:
        """``decide.BEYOND_MARGIN`` or ``decide.WITHIN_MARGIN`` for a better or worse verdict, else ""."""
        return self.decision.form if self.decision is not None and self.verdict in (BETTER, WORSE) else ""

    @property
    def seeds_text(self) -> str:
        """The seeds the decision was made on: ``3 pairs``, ``3 vs 9 seeds`` (empty without a decision)."""
        return seeds_text(self.decision.n) if self.decision is not None else ""

    @property
    def step_time_ratio(self) -> Ratio | None:
        """The variant's median step time over the baseline's, over their finished seeds, with its
        bootstrap interval (None when either side recorded none): the median, since a few cells timed
        under another load (copied from a matrix that ran beside other work) would move a mean."""
        return ratio_of_medians(self.variant_side.step_times_ms, self.baseline_side.step_times_ms)

    def step_time_text(self) -> str:
        """``step time ×2.10 [1.95, 2.31] over 3 vs 3 finished seeds``, ``..., a tie`` (the interval holds
        1), ``step time ×1.02 over 1 vs 1 finished seeds`` (no interval), or ``step time n/a``: a property
        of the design, so over every finished seed that recorded one, not only the decision's look. Then
        what the two sides' load says of it (:func:`load_mark`): ``, load not recorded``, or ``, timed
        under different load (other processes: 0.9 vs 0.1 of 2 cores): not a finding``, or first of all
        ``, timed on different machines (...): not a finding`` (:func:`machine_mark`); either drops
        ``a tie``: a ratio timed so says nothing of the designs either way."""
        ratio = self.step_time_ratio
        if ratio is None:
            return "step time n/a"
        over = f" over {len(self.variant_side.step_times_ms)} vs {len(self.baseline_side.step_times_ms)} finished seeds"
        text = f"step time ×{ratio.value:.2f}"
        if ratio.interval is not None:
            text += f" [{ratio.interval[0]:.2f}, {ratio.interval[1]:.2f}]"
        mark = machine_mark(self.variant_side, self.baseline_side) or load_mark(self.variant_side, self.baseline_side)
        if mark.startswith((DIFFERENT_MACHINES, DIFFERENT_LOAD)):
            return f"{text}{over}, {mark}"
        return f"{text}{over}" + (", a tie" if ratio.tie else "") + (f", {mark}" if mark else "")

    @property
    def level_text(self) -> str:
        """``n_layers=4`` or ``300 steps`` (empty without levels)."""
        return level_text(self.level)

    @property
    def label(self) -> str:
        """``ffn=swiglu vs ffn=mlp`` (``at 300 steps``, ``at n_layers=4`` when compared within levels)."""
        return f"{self.variant} vs {self.baseline}" + (f" at {self.level_text}" if self.level else "")

    def test_text(self) -> str:
        """``paired t, α 0.05``: the test that decided and the α of its look (its seeds go with its numbers)."""
        d = self.decision
        if d is None:
            return ""
        return f"{d.test}, α {d.alpha:.2g}"

    def describe(self, flag: str = "") -> str:
        """``**worse**, by more than the margin (paired t, α 0.05), over 3 pairs: perplexity ↓ +23.29 [+23.26,
        +23.31], margin ±0.074, P(better) 0.00 [0.00, 0.00]; 1/3 did not learn; step time ×1.02 over 3 vs 3
        finished seeds``, with the difference over all the seeds where the look used fewer, then in a tuned
        matrix the values the two sides trained at (``tuned lr=0.0003 vs lr=0.001``), then ``flag``."""
        if self.decision is None:
            text = f"no result: {self.missing}"
        else:
            arrow = "↑" if self.metric.higher_is_better else "↓"
            head = f"**{self.verdict}**"
            if self.verdict == SATURATED:
                head += f" (no verdict: {self.saturation})"
            elif self.verdict == NOT_LEARNED:
                head += f" (no verdict: {self.not_learned})"
            else:
                more = ""
                if self.decision.futile:
                    more = f"; {self.decision.futility_note}"
                elif self.verdict == UNDECIDED and not self.decision.final:
                    more = "; more seeds may decide it"
                if self.decision.typical_disagrees:
                    more = "; the t test found a difference that the typical seed does not show" + more
                head += (f", {self.form}" if self.form else "") + f" ({self.test_text()}{more})"
            numbers = f"{self.metric.name} {arrow} {self.difference_text}, margin {self.margin_text}"
            p = self.decision.prob_improvement
            if p is not None:
                interval = self.decision.prob_improvement_interval
                numbers += f", P(better) {p:.2f}" + (
                    f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval is not None else ""
                )
            parts = [f"{head}, over {self.seeds_text}: {numbers}"]
            if self.all_seeds_text:
                parts.append(self.all_seeds_text)
            issues = [self.variant_side.issues_text(), self.baseline_side.issues_text()]
            if any(issues):
                parts.append(", ".join(filter(None, [issues[0], issues[1] and f"baseline {issues[1]}"])))
            parts.append(self.step_time_text())
            if self.tuned is not None:
                parts.append(f"tuned {self.tuned[0] or 'none'} vs {self.tuned[1] or 'none'}")
            text = "; ".join(parts)
        return f"{text}; {flag}" if flag else text

    def verdict_words(self) -> str:
        """The verdict as the index and the tables of levels write it: ``**better** (possibly by less than the
        margin)``, ``**undecided**``, ``*saturated*``, ``*not learned*``."""
        if self.verdict in NO_VERDICT:
            return f"*{self.verdict}*"
        return f"**{self.verdict}**" + (f" ({self.form})" if self.form else "")


#: how :func:`load_mark` begins where the two sides were timed under different load, or on different machines
DIFFERENT_LOAD = "timed under different load"
DIFFERENT_MACHINES = "timed on different machines"
LOAD_NOT_RECORDED = "load not recorded"


def machine_mark(variant: Side, baseline: Side) -> str:
    """``timed on different machines (AMD EPYC: 0 vs 3; Intel(R) Xeon(R) Processor: 3 vs 0): not a finding``
    where the two sides' timed seeds ran on more than one machine (a CPU model, its vector extensions or the
    torch version can move a step time by more than a design does; a matrix resumed on another machine
    mixes them), with each machine's seeds per side (variant first); empty where every seed whose machine
    is recorded ran on one. A machine is named by its CPU model, in full (GPUs, versions) where two share one."""
    sides = [[m for m in side.machines if m] for side in (variant, baseline)]
    machines = sorted({m for side in sides for m in side})
    if len(machines) < 2:
        return ""
    short = {m: m.split(",")[0] for m in machines}
    names = short if len(set(short.values())) == len(machines) else {m: m for m in machines}
    counts = "; ".join(f"{names[m]}: {sides[0].count(m)} vs {sides[1].count(m)}" for m in machines)
    return f"{DIFFERENT_MACHINES} ({counts}): not a finding"


def load_mark(variant: Side, baseline: Side) -> str:
    """What the load the two sides' seeds were timed under says of their step-time ratio: ``load not
    recorded`` where a side has a timed seed without a load record; ``timed under different load (other
    processes: 0.9 vs 0.1 of 2 cores): not a finding`` where the median share of the machine's cores
    that other processes kept busy differs between the sides by more than :data:`LOAD_DIFFERENCE`
    (then the ratio measures the machine, not the designs); empty where the load was alike."""
    loads = [variant.timed_loads, baseline.timed_loads]
    if loads[0] is None or loads[1] is None:
        return LOAD_NOT_RECORDED
    if not loads[0] or not loads[1]:
        return ""  # no timed seed on a side: there is no ratio to mark
    shares = [statistics.median(load.other_share for load in side) for side in loads]
    if abs(shares[0] - shares[1]) <= LOAD_DIFFERENCE:
        return ""
    cores = {load.cores for side in loads for load in side}
    busy = [statistics.median(load.other_cores for load in side) for side in loads]
    of = f" of {next(iter(cores))} cores" if len(cores) == 1 else " cores"
    return f"{DIFFERENT_LOAD} (other processes: {busy[0]:.1f} vs {busy[1]:.1f}{of}): not a finding"


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
        decided = [c for c in sorted(found, key=lambda c: _level_key(c.level, c.rungs)) if c.decided]
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
    return next(v for v in (UNDECIDED, SATURATED, NOT_LEARNED, NO_RESULT) if v in verdicts or v == NO_RESULT)


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
    variants, rungs = list(dict.fromkeys(key[0] for key in rows)), _rungs_of(comparisons)
    return dict(sorted(rows.items(), key=lambda item: (variants.index(item[0][0]), _level_key(item[0][2], rungs))))


def level_tables(comparisons: list[Comparison]) -> list[str]:
    """Per task compared within levels: its differences across the levels side by side, a row per design
    and a column per level (``**worse** (by more than the margin) +2.6 [+1.9, +3.3] over 3 pairs``), so a trend
    with depth or budget shows."""
    lines: list[str] = []
    tasks = list(dict.fromkeys(c.task for c in comparisons if c.level))
    for task in tasks:
        found = [c for c in comparisons if c.task == task and c.level]
        rungs = _rungs_of(found)
        levels = sorted(dict.fromkeys(c.level for c in found), key=lambda level: _level_key(level, rungs))
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
                f"{c.verdict_words()} {c.difference_text} over {c.seeds_text}"
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
