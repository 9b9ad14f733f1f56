"""The end of a matrix run: its record in ``matrix_run.json``, then the report, which the command line
hands in (:class:`Reporting`: the runner never imports the report)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..durations import format_duration
from ..store.files import write_matrix_run
from ..store.record import MatrixRun, RunCell, RunPhase
from ..walltime import MATRIX_PARTS, WallClock
from .say import say
from .schedule import OpenQuestions


@dataclass(frozen=True)
class Reporting:
    """The report's part in a run. ``open_questions``: the questions of a matrix folder more seeds may
    answer (the rounds of seeds ask it); ``report(matrix_dir, name, before_header)``: write the summary
    (calling ``before_header`` once its sections are rendered, before it reads ``matrix_run.json`` for
    its header), refresh the index of the results root and print the answer."""

    open_questions: OpenQuestions
    report: Callable[[Path, str, Callable[[], None]], None] | None

    @classmethod
    def none(cls) -> Reporting:
        """No report: no question is open, and the run tells how to write the summary."""
        return cls(open_questions=lambda matrix_dir: [], report=None)


@dataclass(frozen=True)
class RunRecord:
    """What ``matrix_run.json`` records of a run besides its wall time: its command, the cells trained
    and failed, each local cell's seconds as seen from the runner (None for cluster jobs), the cells
    trained at once and, with ``tune:``, each phase's record."""

    command: str
    trained: int
    failed: Sequence[str]
    cell_times: list[RunCell] | None
    jobs: int
    phases: dict[str, RunPhase] | None


def finish_matrix(matrix_dir: Path, name: str, clock: WallClock, run: RunRecord, reporting: Reporting) -> int:
    """Record the run in ``matrix_run.json``, report, and return the exit code (1 if a cell failed).

    The record holds the run's wall time (``wall_time_s``) and where it went (``wall_time_breakdown``:
    :data:`MATRIX_PARTS`, ``startup`` before the run and ``other`` the rest) with :class:`RunRecord`'s
    fields, which the summary compares with the training steps the cells recorded. It is written before
    the report (a report that fails leaves the run recorded) and again once the report is rendered,
    with its time, before the report reads it for the summary's header."""
    say(f"matrix {name} finished in {format_duration(clock.elapsed())}")

    def record_run() -> None:
        breakdown = clock.breakdown(MATRIX_PARTS)
        record = MatrixRun(
            command=run.command,
            wall_time_s=round(breakdown["total"], 1),
            cells_trained=run.trained,
            jobs=run.jobs,
            wall_time_breakdown=breakdown,
            cells=run.cell_times,
            **({"phases": run.phases} if run.phases else {}),
        )
        write_matrix_run(matrix_dir, record)

    def report_rendered() -> None:
        clock.exit("report")
        record_run()

    record_run()
    clock.enter("report")
    if reporting.report is not None:
        reporting.report(matrix_dir, name, report_rendered)
    else:
        report_rendered()
        say(f"no report written: blockbench report {matrix_dir}")
    if run.failed:
        print(f"{len(run.failed)} cell(s) failed: {', '.join(run.failed)}", file=sys.stderr)
    return 1 if run.failed else 0
