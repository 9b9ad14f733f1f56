"""The rounds of a matrix run: successive halving's rungs of tuning cells (see
:mod:`blockbench.matrix.tuning`) and, with ``seeds: {min, max, step}``, the rounds of seeds for the
questions still undecided. Every round is decided from the results on disk, so a resumed run asks
for the same cells as the run it resumes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..lineage import NO_LINEAGE, Lineage
from ..record import CellRecord
from .expand import Cell, Expansion
from .plan import earlier_record
from .tuning import Candidate, Tuning, extension, trial


@dataclass(frozen=True)
class Counts:
    """Which results count for tuning and for the rounds: those of the cell's current config made by this
    code or, by the results folder's ``lineage``, with its numbers (any code with ``--reuse-stale``); none
    with ``--force``, until the cell has trained again."""

    fingerprint: str
    reuse_stale: bool = False
    force: bool = False
    lineage: Lineage = NO_LINEAGE

    def record(self, cell: Cell, matrix_dir: Path, *, finished_only: bool = False) -> CellRecord | None:
        record = earlier_record(cell.directory(matrix_dir))
        if record is None or record.config_hash != cell.run.config_hash():
            return None
        if finished_only and (self.force or not record.finished):
            return None  # planning: a failed cell is retried, and --force retrains everything
        return record if self.reuse_stale or self.lineage.admits(record, self.fingerprint) else None


def tuning_outcomes(
    tuning: list[Cell], matrix_dir: Path, seeds: Sequence[int], counts: Counts, *, finished_only: bool = False
) -> dict[tuple[str, str], Tuning]:
    """The tuning of each task x variant (see :mod:`blockbench.matrix.tuning`), scored from the results of its
    tuning cells that count (``counts``; ``finished_only`` while planning, so a failed cell is retried)."""
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
                    trial(
                        cell.seed, cell.key, counts.record(cell, matrix_dir, finished_only=finished_only), metric.name
                    )
                    for cell in group
                ),
            )
            for label, group in by_candidate.items()
        )
        tunings[task, variant] = Tuning(task, variant, metric.name, metric.higher_is_better, candidates, tuple(seeds))
    return tunings


def extended_tuning(
    expansion: Expansion, tuning: list[Cell], matrix_dir: Path, counts: Counts, *, finished_only: bool = False
) -> tuple[list[Cell], dict[tuple[str, str], Tuning]]:
    """The tuning cells with those of the candidates the tuner added past the ends of the grid
    (:func:`blockbench.matrix.tuning.extension`), and each task x variant's tuning over all of them:
    a variant whose complete tuning chose an end gets the next value's cells, and its tuning is scored
    again, until no variant needs another. Decided from the results on disk, so a resumed run asks for
    the same cells; a value the config rejects ends the extension there."""
    seeds = expansion.matrix.tune_seeds
    refused: set[tuple[str, str]] = set()
    while True:
        tunings = tuning_outcomes(tuning, matrix_dir, seeds, counts, finished_only=finished_only)
        added: list[Cell] = []
        for key, outcome in tunings.items():
            values = None if key in refused or not outcome.complete else extension(outcome, expansion.matrix.tune)
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


def next_round(expansion: Expansion, matrix_dir: Path) -> list[Cell]:
    """The reported cells the questions still undecided need next (``seeds: {min, max, step}``): for each
    such question, the seeds up to the next planned look for the variant's and the baseline's cells at its
    level. Decided from the results on disk (``blockbench.report.analysis.open_questions``), so a resumed
    run asks for the same cells."""
    from ..report.analysis import open_questions

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


def merge_phases(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase's record for ``matrix_run.json`` from its rounds' (cells, trained, seconds summed)."""
    return {
        key: round(sum(r[key] for r in records), 1) if key == "wall_time_s" else sum(r[key] for r in records)
        for key in ("cells", "trained", "wall_time_s")
    } | {"rounds": len(records)}
