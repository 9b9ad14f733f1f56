"""Which cells a matrix run trains next: its schedules, each read from the results on disk.

A run trains in rounds. Before each round after the first it asks its schedule for the next cells
(:meth:`Schedule.next_cells`), and the schedule reads the results folder to decide: successive
halving's rungs of tuning cells (:class:`TuningRungs`, see :mod:`blockbench.matrix.tuning`) and,
with ``seeds: {min, max, step}``, the rounds of seeds for the questions still undecided
(:class:`SeedRounds`). Decided from disk, never from what the run remembers, so a resumed run asks
for the same cells as the run it resumes. A new kind of round (a scale ladder's rungs) is one more
class with ``next_cells``; the run's loop (:mod:`blockbench.matrix.run`) does not change.

The rounds of seeds need to know which questions are still open, which only the report's statistics
can say: the run is handed that as a function (:data:`OpenQuestions`) by the command line, which
stands above both, so that the runner never imports the report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..config import ConfigError
from ..store.record import CellRecord
from ..store.reuse import ReuseRule
from .devices import cell_hardware
from .expand import Cell, Expansion
from .topgrid import centred_cells, top_grids
from .tuning import Candidate, Tuning, extension, trial


@dataclass(frozen=True)
class Results:
    """A matrix's results folder as the schedules read it: each cell's record that counts under the
    run's reuse rule (:class:`blockbench.store.reuse.ReuseRule`), on the hardware the cell resolves to."""

    matrix_dir: Path
    rule: ReuseRule

    def record(self, cell: Cell, *, finished_only: bool = False) -> CellRecord | None:
        return self.rule.counted(
            cell.directory(self.matrix_dir),
            cell.run.config_hash(),
            hardware=cell_hardware(cell.run.trainer, cuda=self.rule.cuda),
            finished_only=finished_only,
        )


class Schedule(Protocol):
    """What a run asks between its rounds."""

    def next_cells(self, results: Results) -> list[Cell] | None:
        """The cells of the next round, decided from ``results``; None when the schedule has ended."""
        ...

    def describe(self, cells: list[Cell]) -> str:
        """The line the run prints as the round starts."""
        ...


class Undecided(Protocol):
    """A question more seeds may still answer (``blockbench.report.analysis.OpenQuestion``): the two
    sides' variant labels, as their cells' ``variant``, and the seeds of the smaller side so far."""

    @property
    def task(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def baseline(self) -> str: ...
    @property
    def seeds(self) -> int: ...


#: a matrix folder's questions that more seeds may answer (the CLI hands in the report's)
OpenQuestions = Callable[[Path], Sequence[Undecided]]


def tuning_outcomes(
    tuning: list[Cell], results: Results, seeds: Sequence[int], *, finished_only: bool = False
) -> dict[tuple[str, str], Tuning]:
    """The tuning of each task x variant (see :mod:`blockbench.matrix.tuning`), scored from the results of its
    tuning cells that count (``finished_only`` while planning, so a failed cell is retried)."""
    variants: dict[tuple[str, str], dict[str, list[Cell]]] = {}
    for cell in tuning:
        variants.setdefault((cell.task, cell.variant), {}).setdefault(cell.candidate, []).append(cell)
    tunings = {}
    for (task, variant), by_candidate in variants.items():
        metric = next(iter(by_candidate.values()))[0].run.task.metrics[0]  # the headline metric
        candidates = tuple(
            Candidate(
                group[0].tuned,
                label,
                tuple(
                    trial(cell.seed, cell.key, results.record(cell, finished_only=finished_only), metric.name)
                    for cell in group
                ),
            )
            for label, group in by_candidate.items()
        )
        tunings[task, variant] = Tuning(task, variant, metric.name, metric.higher_is_better, candidates, tuple(seeds))
    return tunings


def extended_tuning(
    expansion: Expansion, tuning: list[Cell], results: Results, *, finished_only: bool = False
) -> tuple[list[Cell], dict[tuple[str, str], Tuning]]:
    """The tuning cells with those of the candidates the tuner added past the ends of the grid
    (:func:`blockbench.matrix.tuning.extension`), and each task x variant's tuning over all of them:
    a variant whose complete tuning chose an end gets the next value's cells, and its tuning is scored
    again, until no variant needs another. A value the config rejects ends the extension there. A
    ladder's top rung with a centred grid gets its cells once the rungs below have chosen
    (:mod:`blockbench.matrix.topgrid`), and is extended past the ends of that grid."""
    seeds = expansion.matrix.tune_seeds
    refused: set[tuple[str, str]] = set()
    while True:
        tunings = tuning_outcomes(tuning, results, seeds, finished_only=finished_only)
        centred = centred_cells(expansion, tuning, tunings)
        if centred:
            tuning = tuning + centred
            continue
        grids = top_grids(expansion, tunings)
        added: list[Cell] = []
        for key, outcome in tunings.items():
            grid = grids.get(key, expansion.matrix.tune)
            values = None if key in refused or not outcome.complete else extension(outcome, grid)
            if values is None:
                continue
            template = next(cell for cell in tuning if (cell.task, cell.variant) == key)
            try:
                added += expansion.added_candidate(template, values, start=len(tuning) + len(added))
            except ConfigError:
                refused.add(key)
        if not added:
            return tuning, tunings
        tuning = tuning + added


def pending_tuning(tuning: list[Cell], tunings: dict[tuple[str, str], Tuning]) -> list[Cell]:
    """The tuning cells the current rung of each variant's successive halving still needs, in matrix order."""
    wanted = {
        (task, variant, candidate.label, seed)
        for (task, variant), t in tunings.items()
        for candidate, seed in t.pending()
    }
    return [cell for cell in tuning if (cell.task, cell.variant, cell.candidate, cell.seed) in wanted]


def first_round(expansion: Expansion) -> list[Cell]:
    """The reported cells every variant trains: all of them, or with ``seeds: {min, ...}`` seeds 0 .. min-1."""
    plan = expansion.matrix.seeds
    return [cell for cell in expansion.cells if plan is None or int(cell.axes["seed"]) < plan.min]


def next_round(expansion: Expansion, matrix_dir: Path, open_questions: OpenQuestions) -> list[Cell]:
    """The reported cells the questions still undecided need next (``seeds: {min, max, step}``): for each
    such question (``open_questions`` of the matrix folder), the seeds up to the next planned look for
    the variant's and the baseline's cells."""
    plan = expansion.matrix.seeds
    if plan is None:
        return []
    wanted: dict[tuple[str, str], int] = {}
    for question in open_questions(matrix_dir):
        target = next((size for size in plan.sizes if size > question.seeds), None)
        if target is None:
            continue
        for variant in (question.variant, question.baseline):
            wanted[question.task, variant] = max(wanted.get((question.task, variant), 0), target)
    return [cell for cell in expansion.cells if int(cell.axes["seed"]) < wanted.get((cell.task, cell.variant), 0)]


@dataclass
class TuningRungs:
    """Successive halving, rung by rung (:class:`Schedule`): each next rung's cells of the candidates that
    survived, or of a value past an end of the grid that won; ``tunings`` holds each variant's tuning
    as last read."""

    expansion: Expansion
    cells: list[Cell]
    tunings: dict[tuple[str, str], Tuning] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    extended: bool = False

    def next_cells(self, results: Results) -> list[Cell] | None:
        before = len(self.cells)
        self.cells, self.tunings = extended_tuning(self.expansion, self.cells, results)
        pending = [cell for cell in pending_tuning(self.cells, self.tunings) if cell.key not in self.seen]
        if not pending:
            return None
        self.seen |= {cell.key for cell in pending}
        self.extended = len(self.cells) > before
        return pending

    def describe(self, cells: list[Cell]) -> str:
        what = "a value past an end of the grid that won" if self.extended else "the candidates that survived"
        return f"tuning: {len(cells)} cell(s) of {what}"


@dataclass
class SeedRounds:
    """The rounds of seeds (:class:`Schedule`): the seeds the questions still open need next, at each
    variant's tuned values where the matrix tunes; ``planned``: the cells of the rounds so far."""

    expansion: Expansion
    open_questions: OpenQuestions
    tunings: dict[tuple[str, str], Tuning]
    planned: set[str] = field(default_factory=set)
    asked: list[Cell] = field(default_factory=list)  # the last round's cells, before those without a choice left

    def next_cells(self, results: Results) -> list[Cell] | None:
        if self.expansion.matrix.seeds is None:
            return None
        todo = [
            cell
            for cell in next_round(self.expansion, results.matrix_dir, self.open_questions)
            if cell.key not in self.planned
        ]
        if not todo:
            return None
        self.planned |= {cell.key for cell in todo}
        self.asked = todo
        if not self.expansion.tuning:
            return todo
        chosen = {key: t.chosen for key, t in self.tunings.items() if t.chosen is not None}
        return [
            self.expansion.at_choice(cell, chosen[cell.task, cell.variant].values)
            for cell in todo
            if (cell.task, cell.variant) in chosen
        ]

    def describe(self, cells: list[Cell]) -> str:
        groups = sorted({f"{cell.task}/{cell.variant}" for cell in self.asked})
        return f"undecided: {len(self.asked)} more seed cell(s) for {', '.join(groups)}"
