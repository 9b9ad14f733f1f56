"""The writes of a matrix's own files, outside its cells' records: the copy of the matrix file, a
cell's ``cell.json`` and ``config.yaml`` as the runner prepares its folder, a cell recorded untrained,
the run's record, and the report's files (the summary, the index, the figures).

Each is a named write of a file of the layout (:mod:`blockbench.store.layout`), atomic (a reader or a
crash never sees half a file), so that the runner and the report never open a results folder's file
for writing themselves and one place says what a results folder can hold.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from .layout import (
    CELL_FILE,
    CHECKPOINT_DIR,
    CONFIG_FILE,
    INDEX_FILE,
    LOAD_FILE,
    MATRIX_FILE,
    PLAN_FILE,
    RESULT_FILE,
    RUN_FILE,
    SUMMARY_CSV,
    SUMMARY_MD,
    TUNE_FILE,
    atomic_path,
    write_atomic,
    write_json,
)
from .record import CellRecord, MatrixRun, write_record


def write_matrix_copy(matrix_dir: Path, text: str, *, tuned: bool) -> None:
    """The runner's copy of the matrix file (``text``), which the report reads its settings from; a
    matrix no longer ``tuned`` loses its ``tune.json`` (its record is not this run's)."""
    matrix_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(matrix_dir / MATRIX_FILE, text)
    if not tuned:
        (matrix_dir / TUNE_FILE).unlink(missing_ok=True)


def write_cell_json(cell_dir: Path, cell_json: Mapping[str, Any]) -> None:
    """A cell's ``cell.json``: what the report groups it by, its axes and its matrix file."""
    write_json(cell_dir / CELL_FILE, dict(cell_json))


def prepare_cell(cell_dir: Path, cell_json: Mapping[str, Any], config_yaml: str, *, fresh: bool) -> None:
    """A cell's folder made ready for its training process: an earlier attempt's result and load gone
    (this one's are measured anew), its checkpoints too where it trains ``fresh``, its ``cell.json`` and
    the resolved ``config.yaml`` written."""
    (cell_dir / RESULT_FILE).unlink(missing_ok=True)
    (cell_dir / LOAD_FILE).unlink(missing_ok=True)
    if fresh:
        shutil.rmtree(cell_dir / CHECKPOINT_DIR, ignore_errors=True)
    write_cell_json(cell_dir, cell_json)
    write_atomic(cell_dir / CONFIG_FILE, config_yaml)


def record_untrained(cell_dir: Path, cell_json: Mapping[str, Any], failure: CellRecord) -> None:
    """A cell that cannot train (its variant has no tuned value) recorded as ``failure``; a config.yaml
    of an earlier choice is removed (the cell trained with nothing)."""
    write_cell_json(cell_dir, cell_json)
    (cell_dir / CONFIG_FILE).unlink(missing_ok=True)
    write_record(cell_dir / RESULT_FILE, failure)


def write_plan_book(matrix_dir: Path, book: Mapping[str, Any]) -> None:
    """``plan.json``: every analysis plan the matrix committed to, and the current one (``blockbench.prereg``)."""
    write_json(matrix_dir / PLAN_FILE, dict(book))


def write_matrix_run(matrix_dir: Path, run: MatrixRun) -> None:
    """``matrix_run.json``: the last run's command, wall time and where it went (see :class:`MatrixRun`)."""
    write_json(matrix_dir / RUN_FILE, run.model_dump(mode="json", exclude_unset=True))


def write_summary(matrix_dir: Path, markdown: str, csv: str) -> None:
    """The report of a matrix: ``summary.md`` and ``summary.csv``."""
    write_atomic(matrix_dir / SUMMARY_MD, markdown)
    write_atomic(matrix_dir / SUMMARY_CSV, csv)


def write_index(results_root: Path, markdown: str) -> None:
    """``README.md`` of a results root: the verdicts of every matrix."""
    write_atomic(results_root / INDEX_FILE, markdown)


class Figure(Protocol):
    """What :func:`save_figure` saves (a matplotlib figure)."""

    def savefig(self, fname: Any, **options: Any) -> None: ...


def save_figure(path: Path, figure: Figure, **options: Any) -> None:
    """``figure`` saved to ``path`` (``options``: matplotlib's ``savefig``'s), whole or not at all."""
    with atomic_path(path) as tmp:
        figure.savefig(tmp, **options)


def remove_files(paths: Iterable[Path]) -> None:
    """Files a report no longer makes (a figure of an older layout, a plot of a task now without one)."""
    for path in paths:
        path.unlink(missing_ok=True)
