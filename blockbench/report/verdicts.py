"""Verdicts: does a variant help, and does it help in every model family?

The summary of a matrix (``blockbench.report``) computes, per task, each variant's difference from
the baseline variant in every metric, with its interval and a Holm-adjusted test. This module turns
the headline metric's comparison into a verdict and words it, once, for two places:

- the top of each ``summary.md``: one line per variant vs baseline per task (:func:`verdict_lines`);
- the index of a results root, ``results/README.md`` (:func:`index_markdown`): one row per matrix x
  variant vs baseline (x budget), one column per model family, and whether the verdict transfers
  across the families.

A verdict is **better** or **worse** where the summary marks the difference ✓ (its Holm-adjusted
p-value is below 0.05), **n.s.** (no significant difference) where it does not, **untested** where
there is no test (one seed, or no spread between seeds), and no result where a side has no seed in
the statistics. Nothing here computes a statistic: :class:`Comparison` carries the summary's own.

When a matrix varies the training budget (``trainer.max_steps`` as an axis), each budget has its own
comparison against the baseline variant at the same budget, and a verdict that changes between
budgets is flagged (``⚠ flips: worse at 300 steps, better at 1500 steps``): short runs can reverse
what long ones find.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from blockbench.tasks import Metric

from .stats import Difference

#: the index's family columns, in order: ``model.family`` -> column title
FAMILIES = {"decoder_lm": "LM", "encoder_decoder": "translator", "vit": "ViT"}

BETTER, WORSE, NOT_SIGNIFICANT, UNTESTED, NO_RESULT = "better", "worse", "n.s.", "untested", "no result"
#: the verdicts that answer the question, in the order the transfer column lists them
DECIDED = (BETTER, WORSE, NOT_SIGNIFICANT)
MIXED = "mixed"  # a family whose tasks disagree

LEGEND = (
    "Each verdict is the headline metric's difference (variant − baseline, the arrow says which way is better) with "
    "its 95% interval, from the matrix's summary: **better** or **worse** where the summary's test finds a difference "
    "(Holm-adjusted p < 0.05 over every comparison of the matrix; the adjusted p follows the verdict), **n.s.** (no "
    "significant difference) where it does not, even where the unadjusted interval leaves out zero, "
    "**untested** where there is no test (one seed, or the same difference in every seed pair). A share of diverged "
    "seeds is shown where it is not zero (diverged seeds count in the difference as a model that learned nothing), "
    "and *both at the best possible* value where every seed of both sides reached it (BLEU 100: the task is solved "
    "and cannot tell them apart), "
    "then the variant's median step time as a multiple of the baseline's (n/a: not recorded), and in a matrix with "
    "`tune:` the values the two sides' seeds trained at (variant vs baseline; *lowest* or *highest tried* where a "
    "value is an end of its grid, so the side's best may lie beyond it). Whether a verdict transfers across the "
    "families names the n.s. families whose unadjusted interval leaves out zero (*unadjusted: worse in "
    "translator*), and says *unclear* rather than *yes* where they lean opposite ways."
)


def family_title(family: str) -> str:
    """``decoder_lm`` -> ``LM``; an unknown family keeps its name."""
    return FAMILIES.get(family, family)


def budget_text(budget: Any) -> str:
    return f"{budget:,} steps" if isinstance(budget, int) else f"{budget} steps"


@dataclass(frozen=True)
class Side:
    """One side of a comparison (the variant's or the baseline's cells of a task)."""

    seeds: int  # in the statistics: finished and diverged
    diverged: int
    step_time_ms: float | None  # mean of the finished seeds' median step times (None: not recorded)
    #: the headline metric's best possible value (BLEU 100) when every seed reached it, none diverged; else None
    at_best: float | None = None

    def diverged_text(self) -> str:
        """``1/3 diverged``, or empty when no seed diverged."""
        return f"{self.diverged}/{self.seeds} diverged" if self.diverged else ""


@dataclass(frozen=True)
class Comparison:
    """A variant against the matrix's baseline variant on one task, in the task's headline metric, as
    the summary computed it."""

    task: str
    family: str  # ``model.family`` of the task's cells
    variant: str  # the variant's label, without the budget when the matrix varies it
    baseline: str  # the baseline variant's label, likewise
    budget: Any  # ``trainer.max_steps`` when the matrix varies it (an axis), else None
    metric: Metric
    difference: Difference | None  # None: a side has no seed in the statistics (see ``missing``)
    difference_text: str  # as the summary's difference table shows it: ``+23.29 [+23.26, +23.31]``
    significant: bool  # the summary's ✓: Holm-adjusted p < 0.05
    direction: str  # ``better`` / ``worse`` / ``same`` of the difference, whatever its test
    variant_side: Side
    baseline_side: Side
    missing: str = ""  # why there is no difference
    #: a matrix with ``tune:``: the tuned value each side's seeds trained at (``lr=0.001``), None if it has none
    tuned: tuple[str | None, str | None] | None = None
    #: the difference's Holm-adjusted p-value (None: untested): shown so that an n.s. whose unadjusted
    #: interval leaves out zero reads as what it is, a difference the family-wise test cannot confirm
    p_holm: float | None = None

    @property
    def verdict(self) -> str:
        if self.difference is None:
            return NO_RESULT
        if self.difference.p_value is None:
            return UNTESTED
        return self.direction if self.significant else NOT_SIGNIFICANT

    @property
    def step_time_ratio(self) -> float | None:
        """The variant's step time over the baseline's (None when either is not recorded)."""
        ours, theirs = self.variant_side.step_time_ms, self.baseline_side.step_time_ms
        return ours / theirs if ours is not None and theirs else None

    @property
    def label(self) -> str:
        """``ffn=swiglu vs ffn=mlp`` (``at 300 steps`` when the matrix varies the budget)."""
        at = f" at {budget_text(self.budget)}" if self.budget is not None else ""
        return f"{self.variant} vs {self.baseline}{at}"

    def describe(self, flag: str = "") -> str:
        """``**worse**, perplexity ↓ +23.29 [+23.26, +23.31]; 1/3 diverged; step time ×1.02``, then in a
        tuned matrix the values the two sides trained at (``tuned lr=0.0003 vs lr=0.001``), then ``flag``."""
        if self.difference is None:
            text = f"no result: {self.missing}"
        else:
            arrow = "↑" if self.metric.higher_is_better else "↓"
            p = "" if self.p_holm is None else f" (Holm p {_p_text(self.p_holm)})"
            parts = [f"**{self.verdict}**{p}, {self.metric.name} {arrow} {self.difference_text}"]
            diverged = [self.variant_side.diverged_text(), self.baseline_side.diverged_text()]
            if any(diverged):
                parts.append(", ".join(filter(None, [diverged[0], diverged[1] and f"baseline {diverged[1]}"])))
            if self.variant_side.at_best is not None and self.baseline_side.at_best is not None:
                parts.append(
                    f"both at the best possible {self.metric.name} ({self.variant_side.at_best:g}) in every "
                    f"seed: the task is solved{' at this budget' if self.budget is not None else ''} and cannot "
                    f"tell them apart"
                )
            ratio = self.step_time_ratio
            parts.append(f"step time ×{ratio:.2f}" if ratio is not None else "step time n/a")
            if self.tuned is not None:
                parts.append(f"tuned {self.tuned[0] or 'none'} vs {self.tuned[1] or 'none'}")
            text = "; ".join(parts)
        return f"{text}; {flag}" if flag else text


def _p_text(p: float) -> str:
    """``0.027``, ``0.0031``, ``< 0.001``."""
    return "< 0.001" if p < 0.001 else f"{p:.2g}"


def budget_flags(comparisons: Iterable[Comparison]) -> dict[tuple[str, str, str], str]:
    """(task, variant, baseline) -> a warning where the verdict changes with the budget:
    ``⚠ flips: worse at 300 steps, better at 1,500 steps`` when it turns from better to worse or back,
    ``⚠ changes with the budget: n.s. at 300 steps, better at 1,500 steps`` otherwise."""
    by_key: dict[tuple[str, str, str], list[Comparison]] = {}
    for c in comparisons:
        if c.budget is not None:
            by_key.setdefault((c.task, c.variant, c.baseline), []).append(c)
    flags = {}
    for key, group in by_key.items():
        group = sorted(group, key=lambda c: c.budget)
        decided = [c for c in group if c.verdict in DECIDED]
        if len({c.verdict for c in decided}) < 2:
            continue
        what = "flips" if {BETTER, WORSE} <= {c.verdict for c in decided} else "changes with the budget"
        flags[key] = f"⚠ {what}: " + ", ".join(f"{c.verdict} at {budget_text(c.budget)}" for c in decided)
    return flags


def family_verdicts(comparisons: list[Comparison]) -> dict[str, str]:
    """Family -> the verdict of its tasks, in :data:`FAMILIES` order: the one decided verdict (better,
    worse, n.s.) its tasks have, ``mixed`` when they have several, else untested or no result."""
    verdicts: dict[str, set[str]] = {}
    for c in comparisons:
        verdicts.setdefault(c.family, set()).add(c.verdict)
    ordered = sorted(verdicts, key=lambda f: (list(FAMILIES).index(f) if f in FAMILIES else len(FAMILIES), f))
    return {f: _one_verdict(verdicts[f]) for f in ordered}


def _one_verdict(verdicts: set[str]) -> str:
    decided = verdicts & set(DECIDED)
    if decided:
        return decided.pop() if len(decided) == 1 else MIXED
    return UNTESTED if UNTESTED in verdicts else NO_RESULT


def _join(names: list[str]) -> str:
    """``LM``, ``LM and ViT``, ``LM, translator and ViT``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def transfer(comparisons: list[Comparison]) -> str:
    """Whether one variant's verdict (at one budget) is the same in every family that ran:
    ``yes: better in all 3``, ``no: better in LM, n.s. in translator and ViT``, ``only LM run``,
    ``yes: worse in LM and ViT (translator not run)``, ``undecided: ...`` when fewer than two
    families have a decided verdict (better, worse or n.s.) and none disagree. A family whose tasks
    disagree (``mixed``) is a verdict that does not transfer. An n.s. whose unadjusted interval
    leaves out zero is named after it (``yes: n.s. in all 3 (unadjusted: worse in translator)``),
    and where such intervals point opposite ways, ``yes`` becomes ``unclear``: three n.s. verdicts
    would otherwise read as "no difference anywhere" when the families in fact lean apart."""
    families = family_verdicts(comparisons)
    if len(families) < 2:
        return f"only {_join([family_title(f) for f in families])} run" if families else "nothing run"
    by_verdict: dict[str, list[str]] = {}
    for family, verdict in families.items():
        by_verdict.setdefault(verdict, []).append(family_title(family))
    order = [*DECIDED, MIXED, UNTESTED, NO_RESULT]
    listing = ", ".join(f"{v} in {_join(by_verdict[v])}" for v in order if v in by_verdict)
    decided = [v for v in families.values() if v in DECIDED]
    not_run = [title for family, title in FAMILIES.items() if family not in families]
    leanings = _leanings(comparisons)
    notes = [f"{_join(not_run)} not run"] if not_run else []
    notes += ["unadjusted: " + ", ".join(f"{d} in {_join(leanings[d])}" for d in leanings)] if leanings else []
    note = f" ({'; '.join(notes)})" if notes else ""
    if MIXED in families.values() or len(set(decided)) > 1:
        return f"no: {listing}{note}"
    if len(decided) < 2:
        return f"undecided: {listing}{note}"
    answer = "unclear" if len(leanings) > 1 else "yes"  # n.s. everywhere, but leaning both ways
    if len(decided) == len(families) == len(FAMILIES):
        return f"{answer}: {decided[0]} in all {len(families)}{note}"
    return f"{answer}: {listing}{note}"


def _leanings(comparisons: list[Comparison]) -> dict[str, list[str]]:
    """``better``/``worse`` -> the families (``LM (wikitext)``: the task, where a family has several)
    with an n.s. verdict whose unadjusted interval leaves out zero on that side, in :data:`FAMILIES`
    order (better first; empty when there are none)."""
    tasks: dict[str, set[str]] = {}
    for c in comparisons:
        tasks.setdefault(c.family, set()).add(c.task)
    leanings: dict[str, list[str]] = {BETTER: [], WORSE: []}
    for family in family_verdicts(comparisons):  # FAMILIES order
        for c in comparisons:
            if c.family != family or c.direction not in leanings or c.verdict != NOT_SIGNIFICANT:
                continue
            if c.difference is not None and c.difference.excludes_zero:
                title = family_title(family) + (f" ({c.task})" if len(tasks[family]) > 1 else "")
                if title not in leanings[c.direction]:
                    leanings[c.direction].append(title)
    return {direction: titles for direction, titles in leanings.items() if titles}


def _rows(comparisons: list[Comparison]) -> dict[tuple[str, str, Any], list[Comparison]]:
    """(variant, baseline, budget) -> its comparisons (one per task), in the order they come."""
    rows: dict[tuple[str, str, Any], list[Comparison]] = {}
    for c in comparisons:
        rows.setdefault((c.variant, c.baseline, c.budget), []).append(c)
    return dict(sorted(rows.items(), key=lambda item: _order(item[0], rows)))


def _order(key: tuple[str, str, Any], rows: dict[tuple[str, str, Any], list[Comparison]]) -> tuple[int, Any]:
    """Variants in the order they first come, each one's budgets ascending."""
    variants = list(dict.fromkeys(k[0] for k in rows))
    return variants.index(key[0]), (key[2] is not None, key[2] if key[2] is not None else 0)


DEMONSTRATION = (
    "**A demonstration, not an answer**: this matrix's file says `verdicts: false` (it is too small "
    "to decide anything), so `results/README.md` leaves these lines out. They show what a matrix's "
    "verdicts look like."
)


def verdict_lines(comparisons: list[Comparison], *, demonstration: bool = False) -> list[str]:
    """The ``Verdicts`` section at the top of a summary: one line per variant vs baseline per task,
    then, where it ran in several families, whether its verdict transfers across them (empty without
    comparisons). A ``demonstration`` (``verdicts: false`` in the matrix file) says so first."""
    if not comparisons:
        return []
    flags = budget_flags(comparisons)
    lines = ["## Verdicts", "", *([DEMONSTRATION, ""] if demonstration else []), LEGEND, ""]
    for row in _rows(comparisons).values():
        for c in row:
            flag = flags.get((c.task, c.variant, c.baseline), "")
            lines.append(f"- {c.task} ({family_title(c.family)}), {c.label}: {c.describe(flag)}")
        if len({c.family for c in row}) > 1:
            lines.append(f"- {row[0].label}, across the families: {transfer(row)}")
    return [*lines, ""]


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
    demonstrations: list[str] = field(default_factory=list)  # matrices with ``verdicts: false`` that have results


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
    """One table row per variant vs baseline (per budget): matrix, variant, baseline, a cell per family
    in ``families`` (``task: ...`` lines when a family has several tasks), the transfer column."""
    flags = budget_flags(matrix.comparisons)
    rows = []
    for (variant, baseline, budget), row in _rows(matrix.comparisons).items():
        cells = []
        for family in families:
            ours = [c for c in row if c.family == family]
            texts = [c.describe(flags.get((c.task, c.variant, c.baseline), "")) for c in ours]
            # several tasks of one family (e.g. two LM data sets): a line each in the family's cell, so that the
            # row stays one comparison and its last column answers for all of them
            if len(ours) > 1:
                texts = [f"{c.task}: {text}" for c, text in zip(ours, texts, strict=True)]
            cells.append("<br>".join(texts) if texts else "–")
        at = f" at {budget_text(budget)}" if budget is not None else ""
        rows.append([_matrix_cell(matrix), f"{variant}{at}", baseline, *cells, transfer(row)])
    return rows


def index_markdown(index: Index) -> str:
    """``results/README.md``: the verdict table of every matrix with results, and those not run yet."""
    lines = [
        "# Verdicts",
        "",
        f"Generated by `{index.command}` from the matrix folders here (`blockbench matrix` refreshes it after each "
        "run): do not edit it by hand. Each matrix's summary has the details: every metric, the trivial baselines, "
        "the tests, the curves and the scale it ran at.",
        "",
    ]
    comparisons = [c for m in index.matrices for c in m.comparisons]
    if comparisons:
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
            LEGEND + " Columns: the family of the model each task trains (`model.family`); "
            "a family with several tasks has a line per task.",
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
    if index.demonstrations:
        lines += [
            f"Demonstrations, not verdicts (`verdicts: false` in their matrix file): "
            f"{', '.join(f'[{name}]({name}/summary.md)' for name in index.demonstrations)}.",
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
