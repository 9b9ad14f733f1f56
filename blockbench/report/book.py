"""The book's verdicts: the index of a results root, ``results/README.md``, as a table of distinct questions.

Each matrix's summary words its own comparisons (``verdicts``). The index reads them all: one row per
variant vs baseline (x level) with a cell per model family, whether the verdict transfers across the
families, how many questions are decided and what the whole book cost. Several matrices may ask the same
question of the same cells: a matrix copies a cell that another one trained with the same config and code
instead of training it again (post- vs pre-norm is asked by ``norm_placement`` and ``prenorm_vs_postnorm``
on one set of records). Its decision is then the same in both (a question is decided from its own cells
alone), so the index shows it as **one row that lists the matrices**, and every count counts it once
(:func:`book_rows`, :func:`distinct_questions`): a count that doubled it would read as twice the evidence.
Whether two questions are the same is read from their records (``verdicts.QuestionCells``), never from
their names. Matrices whose file says ``verdicts: false`` are listed apart and never merged.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field

from .decide import BETTER, BEYOND_MARGIN, EQUIVALENT, WORSE
from .headroom import NOT_LEARNED_LABEL
from .results import BookCost, level_text, resumed_note
from .verdicts import (
    FAMILIES,
    FORMS_TEXT,
    NO_RESULT,
    NO_VERDICT_TEXT,
    NOT_LEARNED,
    RANK_TESTS,
    SATURATED,
    UNDECIDED,
    Comparison,
    _rows,
    family_title,
    level_flags,
    transfer,
)

#: the index's legend: its cells are short (:func:`brief`); the summaries have the rest
INDEX_LEGEND = (
    "One question per task x variant (x level): the task's headline metric, variant − baseline (the arrow says "
    "which way is better), decided from the two sides' cells alone at a 5% error rate per question, so the same "
    "cells get the same verdict in every matrix ([the rule](../docs/decisions/verdict-rule.md)); a question that "
    "several matrices ask of the same cells is one row, which lists them. **better** / **worse**: the test finds a "
    "difference that the typical seed shows too; **equivalent**: the difference's interval lies within ± the "
    f"task's margin of practical equivalence; **undecided**: neither is shown (more seeds may answer it). "
    f"{FORMS_TEXT} {NO_VERDICT_TEXT} Each "
    "cell: the verdict, the difference with the interval of the test that decided it (where a rank test decided, "
    "which has none, the t interval, as a description) and the seeds it was decided on (*3 pairs* seed-matched, "
    "*3 vs 9 seeds* unpaired, variant first), *rank test* where a seed of either side did not learn "
    "(or diverged), and how many seeds *did not learn* (finished no better than the trivial baseline) or "
    "diverged. The matrix's summary (first column) has the test, its α, the margin, the probability of "
    "improvement, the difference over all its seeds where the decision's look used fewer, step times and tuned "
    "values. The last column says whether the verdict is the same in every family: *equivalent in all 3* is an "
    "answer, *undecided* is not a no. A family with several tasks has a line per task."
)


def brief(comparison: Comparison, flag: str = "") -> str:
    """The index's cell, short enough to read down a column: ``**worse** (by more than the margin)
    perplexity ↓ +23.29 [+23.26, +23.31] over 3 pairs``, then ``rank test`` where a rank test decided, the
    seeds that did not learn or diverged, and ``flag``. The test, its α, the margin, P(better), step times
    and tuned values are in the matrix's summary (``Comparison.describe``)."""
    c = comparison
    if c.decision is None:
        return f"no result: {c.missing}"
    arrow = "↑" if c.metric.higher_is_better else "↓"
    parts = [f"{c.verdict_words()} {c.metric.name} {arrow} {c.difference_text} over {c.seeds_text}"]
    if c.verdict == SATURATED:
        parts = [f"*{c.verdict}* (both at the best {c.metric.name})"]
    elif c.verdict == NOT_LEARNED:
        parts = [f"*{c.verdict}* ({NOT_LEARNED_LABEL})"]
    elif c.decision.test in RANK_TESTS:
        parts.append("rank test")
    issues = [c.variant_side.issues_text(), c.baseline_side.issues_text()]
    parts += [text for text in (issues[0], issues[1] and f"baseline {issues[1]}") if text]
    return "; ".join([*parts, *([flag] if flag else [])])


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
    #: a ladder's trend table (``ladders.trend_table``): each task x variant's trend beside its per-rung verdicts
    trends: tuple[str, ...] = ()


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
    cost: BookCost = field(default_factory=BookCost)
    #: paragraphs under the count of decided verdicts (the baseline swap's, ``fragility``)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BookRow:
    """One row of the index and of the book's picture: a variant vs baseline (at one level), a comparison
    per task, and every matrix that asks it of the same cells (the first is where its comparisons come
    from: the others' are the same decisions)."""

    matrices: tuple[MatrixVerdicts, ...]
    comparisons: tuple[Comparison, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.matrices)


def _row_key(comparisons: list[Comparison]) -> frozenset | None:
    """What a row asks: the cells of each of its questions (None where one has no look: never merged)."""
    cells = [c.cells for c in comparisons]
    return None if any(c is None for c in cells) else frozenset(cells)


def book_rows(index: Index) -> list[BookRow]:
    """The index's rows: each matrix's variant vs baseline (per level) in order, a row that an earlier
    matrix asked of the same cells joined to that one's (listed with it) instead of repeated."""
    found: list[tuple[list[MatrixVerdicts], list[Comparison]]] = []
    where: dict[frozenset, int] = {}
    for matrix in index.matrices:
        for row in _rows(matrix.comparisons).values():
            key = _row_key(row)
            if key is not None and key in where:
                found[where[key]][0].append(matrix)
                continue
            if key is not None:
                where[key] = len(found)
            found.append(([matrix], row))
    return [BookRow(tuple(matrices), tuple(row)) for matrices, row in found]


def distinct_questions(index: Index) -> list[Comparison]:
    """Every question of the index once: a question several matrices ask of the same cells (the same
    ``Comparison.cells``) counts once, in the first matrix that asks it."""
    seen: set = set()
    questions = []
    for matrix in index.matrices:
        for c in matrix.comparisons:
            if c.cells is not None and c.cells in seen:
                continue
            if c.cells is not None:
                seen.add(c.cells)
            questions.append(c)
    return questions


@dataclass(frozen=True)
class VerdictCounts:
    """How many distinct questions have each verdict or state, and how many of the better and worse ones
    hold by more than the margin (``decide.Decision.beyond_margin``)."""

    total: int
    better: int
    better_beyond_margin: int
    worse: int
    worse_beyond_margin: int
    equivalent: int
    undecided: int
    saturated: int
    not_learned: int
    no_result: int

    @classmethod
    def of(cls, questions: list[Comparison]) -> VerdictCounts:
        def count(verdict: str, beyond: bool = False) -> int:
            return sum(c.verdict == verdict and (not beyond or c.decision.beyond_margin is True) for c in questions)

        return cls(
            len(questions),
            count(BETTER),
            count(BETTER, beyond=True),
            count(WORSE),
            count(WORSE, beyond=True),
            count(EQUIVALENT),
            count(UNDECIDED),
            count(SATURATED),
            count(NOT_LEARNED),
            count(NO_RESULT),
        )

    @property
    def decided(self) -> int:
        return self.better + self.worse + self.equivalent

    def text(self) -> str:
        """``better: 12 (7 by more than the margin), worse: 20 (15 by more than the margin), equivalent: 6,
        undecided: 21, not learned: 1``: the decided verdicts always, the other states where a question has them."""
        parts = [
            f"{BETTER}: {self.better} ({self.better_beyond_margin} {BEYOND_MARGIN})",
            f"{WORSE}: {self.worse} ({self.worse_beyond_margin} {BEYOND_MARGIN})",
            f"{EQUIVALENT}: {self.equivalent}",
        ]
        others = ((UNDECIDED, self.undecided), (SATURATED, self.saturated), (NOT_LEARNED, self.not_learned))
        parts += [f"{state}: {n}" for state, n in (*others, (NO_RESULT, self.no_result)) if n]
        return ", ".join(parts)


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


def index_row(row: BookRow, families: list[str]) -> list[str]:
    """One table row: the matrices that ask it, variant, baseline, a cell per family in ``families``
    (``task: ...`` lines when a family has several tasks), the transfer column."""
    comparisons = list(row.comparisons)
    flags = level_flags(row.matrices[0].comparisons)
    first = comparisons[0]
    cells = []
    for family in families:
        ours = [c for c in comparisons if c.family == family]
        texts = [brief(c, flags.get((c.task, c.variant, c.baseline), "")) for c in ours]
        # several tasks of one family (e.g. two LM data sets): a line each in the family's cell, so that the
        # row stays one comparison and its last column answers for all of them
        if len(ours) > 1:
            texts = [f"{c.task}: {text}" for c, text in zip(ours, texts, strict=True)]
        cells.append("<br>".join(texts) if texts else "–")
    at = f" at {level_text(first.level)}" if first.level else ""
    matrices = ", ".join(_matrix_cell(m) for m in row.matrices)
    return [matrices, f"{first.variant}{at}", first.baseline, *cells, transfer(comparisons)]


def index_rows(matrix: MatrixVerdicts, families: list[str]) -> list[list[str]]:
    """The rows of one matrix alone (:func:`index_row` of each of its variant vs baseline)."""
    return [index_row(BookRow((matrix,), tuple(row)), families) for row in _rows(matrix.comparisons).values()]


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f}"


def index_markdown(index: Index) -> str:
    """``results/README.md``: the verdict table of every matrix with results (a row per distinct
    question), how many distinct questions are decided and what the book cost, and the matrices not run
    yet."""
    lines = [
        "# Verdicts",
        "",
        f"Generated by `{index.command}` from the matrix folders here (`blockbench matrix` refreshes it after each "
        "run): do not edit it by hand. Each matrix's summary has the details: every metric, the trivial baselines, "
        "the tests, the curves and the scale it ran at.",
        "",
    ]
    comparisons = [c for m in index.matrices for c in m.comparisons]
    reported, tuning = index.cost.reported, index.cost.tuning
    if comparisons:
        counts = VerdictCounts.of(distinct_questions(index))
        lines += [
            f"**{counts.decided} of {counts.total} distinct questions are decided** (better, worse or equivalent): "
            f"{counts.text()}. A question is a variant against its baseline on one task (at one level); one that "
            "several matrices ask of the same cells counts once. All these results took "
            f"**{_hours(reported + tuning)} cell-process hours** (the summed wall time of every cell's process, a "
            f"cell copied into several matrices counted once: {_hours(reported)} h reported cells, "
            f"{_hours(tuning)} h tuning cells{resumed_note(index.cost.resumed)}).",
            "",
        ]
        lines += [text for note in index.notes if note for text in (note, "")]
        present = {c.family for c in comparisons}
        families = [*FAMILIES, *sorted(present - set(FAMILIES))]
        header = [
            "comparison",
            "variant",
            "baseline",
            *[family_title(f) for f in families],
            "transfers across the families?",
        ]
        lines += [INDEX_LEGEND, ""]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += [
            "| " + " | ".join(_cell(text) for text in index_row(row, families)) + " |" for row in book_rows(index)
        ]
        lines.append("")
    elif not index.matrices and index.apart:  # a demonstration ran (the smoke test): it is listed below
        lines += ["No matrix that asks a design question has a finished cell yet; the runs below are not verdicts.", ""]
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
    lines += _trends(index)
    lines += _provenance(index)
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


def _trends(index: Index) -> list[str]:
    """``Trends up the ladders``: each ladder matrix's trend table (empty where no matrix has a ladder)."""
    ladders = [m for m in index.matrices if m.trends]
    if not ladders:
        return []
    lines = [
        "## Trends up the ladders",
        "",
        "A matrix with a scale ladder asks each question at several sizes; its trend says whether the effect, as a "
        "compute multiplier, holds, grows, shrinks or reverses with compute (docs/decisions/trend-rule.md), beside "
        "the verdict at every rung.",
        "",
    ]
    for matrix in ladders:
        lines += [f"**{_matrix_cell(matrix)}**", "", *matrix.trends]
    return lines


def _provenance(index: Index) -> list[str]:
    """``Where the numbers come from``: the code, machine and cost of each matrix (empty when none recorded any)."""
    provenance = [m for m in index.matrices if m.code or m.machines or m.cost]
    if not provenance:
        return []
    lines = [
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
    return [*lines, ""]
