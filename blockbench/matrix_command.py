"""``blockbench matrix``: the matrix runner (``blockbench.matrix``) joined with the report
(``blockbench.report``), which stand side by side and never import each other: the runner asks the
report's open questions between its rounds of seeds and hands it the finished run through the
functions given here (:func:`reporting`). A script of its own that runs a matrix calls
:func:`run_matrix` here, under ``if __name__ == "__main__":`` as for any multiprocessing code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from .matrix.finish import Reporting
from .matrix.jobs import ClusterOptions
from .matrix.run import run_matrix as run_with
from .matrix.say import say
from .report.analysis import open_questions
from .report.answer import answer_lines
from .report.index import write_index
from .report.results import gives_verdicts
from .report.summary import write_summary
from .store.layout import INDEX_FILE, MATRIX_FILE, SUMMARY_MD
from .store.tbruns import tensorboard_logdirs
from .tensorboard.logdirs import browse_hint


def report_run(matrix_dir: Path, name: str, before_header: Callable[[], None]) -> None:
    """The report of a finished run: the summary (``before_header`` called once its sections are
    rendered), the index of every matrix of the results root with this one's verdicts, and the answer
    in a few lines with where to read the rest."""
    written = write_summary(matrix_dir, before_header=before_header)
    index: Path | None = matrix_dir.parent / INDEX_FILE
    try:
        write_index(matrix_dir.parent)
    except (OSError, ValueError, KeyError) as error:  # another matrix's folder it cannot read: the run itself is done
        index = None
        say(
            f"could not refresh {matrix_dir.parent / INDEX_FILE} ({error}); "
            f"run blockbench report --index {matrix_dir.parent}",
            stream=sys.stderr,
        )
    title = f"{name}: " + (
        "the verdicts" if gives_verdicts(matrix_dir / MATRIX_FILE) else "a demonstration, not verdicts"
    )
    browse = browse_hint(matrix_dir, tensorboard_logdirs(matrix_dir))
    print("\n".join(answer_lines(title, written.comparisons, matrix_dir / SUMMARY_MD, browse, index)), flush=True)


def reporting() -> Reporting:
    """The report's part in a matrix run (see :class:`blockbench.matrix.finish.Reporting`)."""
    return Reporting(open_questions=open_questions, report=report_run)


def run_matrix(path: str | Path, results_root: Path, **options: object) -> int:
    """Run the matrix at ``path`` into ``results_root`` and report it (``options``: the fields of
    :class:`blockbench.matrix.run.RunOptions`); return the exit code."""
    return run_with(path, results_root, reporting=reporting(), **options)


def matrix_command(args: argparse.Namespace) -> int:
    """``blockbench matrix``'s options turned into a run."""
    cluster = ClusterOptions(
        partition=args.slurm_partition,
        time_min=args.slurm_time,
        account=args.slurm_account,
        cpus_per_task=args.slurm_cpus_per_task,
    )
    return run_matrix(
        args.matrix,
        Path(args.results_dir),
        force=args.force,
        jobs=args.jobs,
        launcher=args.launcher,
        cluster_options=cluster,
        reuse_stale=args.reuse_stale,
        dry_run=args.dry_run,
        time_cells=args.time_cells,
        from_process_start=True,
    )
