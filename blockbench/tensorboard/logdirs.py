"""A matrix's TensorBoard log folders, made ready before its first cell trains, and the line that
tells a reader which one to open.

Each cell's run lies in a log folder a reader opens on its own (``blockbench.store.layout.tensorboard_runs``):
one per task under ``tb/`` for the reported cells, one per task under ``tb_tune/`` for the tuning
cells, a task with more runs than TensorBoard enables by default split further. Every run carries
the views of its log folder (:func:`blockbench.tensorboard.views.matrix_views`: the HParams experiment
and the Custom Scalars layout), built from that folder's cells only, so that the HParams table of
``tb/lm`` has the LM's metric columns and its Custom Scalars the LM's charts; TensorBoard shows one
experiment per log folder and merges the layouts of the runs it reads.

:func:`publish_logdirs` moves the runs that older versions of the runner wrote elsewhere (every
run under ``tb/``, tuning runs under ``tb/tune/``, even older ones named after the cell folders)
to their folders now, then writes each folder's ``views.json`` (which its cells log) and rewrites
the runs of earlier cells whose views changed (:func:`publish_views`). The runner passes its cells
as :class:`LogdirCell` records, what a log folder needs to know of a cell.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..store.layout import MAX_RUNS_PER_LOGDIR, TB_DIR, TB_TUNE_DIR, TB_VIEWS_FILE, cell_folder, write_json
from ..store.tbruns import TensorBoardRun, earlier_run_path, move_runs
from .events import refresh_run_views
from .views import Views, matrix_views, view_summaries

if TYPE_CHECKING:
    from blockbench.tasks import Metric

#: runs that older versions wrote the experiment and the layout to; deleted when a log folder is published
LEGACY_VIEW_RUNS = (".hparams", ".layout")


@dataclass(frozen=True)
class LogdirCell:
    """What a log folder needs of one of a matrix's cells: its labels, its run, its HParams row, its
    task's metrics (primary first) and throughput unit, and whether it logs the logit lens and the
    loss curve (its task's charts)."""

    task: str
    variant: str
    seed: int
    tb: TensorBoardRun
    hparams: Mapping[str, Any]
    metrics: Sequence[Metric]
    throughput_unit: str
    logit_lens: bool = False
    loss_curve: bool = False


def publish_logdirs(matrix_dir: Path, cells: Sequence[LogdirCell], tuning: Sequence[LogdirCell] = ()) -> str:
    """Make the log folders of ``cells`` (the reported cells) and ``tuning`` (the tuning cells) ready
    for their runs: runs of older layouts moved in, each folder's views written and carried by its
    existing runs; returns the line that tells the reader which ``tensorboard --logdir`` to run."""
    moves: dict[str, str] = {}
    for cell in cells:  # the oldest runs were named after the cell folders
        moves[f"{TB_DIR}/{cell_folder(cell.task, cell.variant, cell.seed).as_posix()}"] = cell.tb.path
    for cell in [*cells, *tuning]:
        moves[earlier_run_path(cell.task, cell.tb)] = cell.tb.path
    move_runs(matrix_dir, moves)
    for legacy in (*LEGACY_VIEW_RUNS, TB_VIEWS_FILE):  # the views of the older layouts' single log folder
        path = matrix_dir / TB_DIR / legacy
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)

    folders: dict[str, list[LogdirCell]] = {}
    for cell in [*cells, *tuning]:
        folders.setdefault(cell.tb.logdir, []).append(cell)
    for logdir, members in folders.items():
        tasks = {cell.task: (cell.metrics, cell.throughput_unit) for cell in members}
        views = matrix_views(
            [cell.hparams for cell in members],
            tasks,
            lens_tasks=[cell.task for cell in members if cell.logit_lens],
            curve_tasks=[cell.task for cell in members if cell.loss_curve],
        )
        publish_views(matrix_dir / logdir, views, [cell.tb.name for cell in members])
    return browse_hint(matrix_dir, list(folders))


def publish_views(tb_dir: Path, views: Views, runs: Iterable[str]) -> None:
    """Before a matrix's first cell: write ``views`` to ``tb_dir/views.json`` for the cells to log,
    delete the experiment and layout runs of older versions, and rewrite each existing run of
    ``runs`` whose first views differ (``blockbench.tensorboard.events.refresh_run_views``). Runs
    that older versions named otherwise are moved first, with ``blockbench.store.layout.move_runs``."""
    write_json(tb_dir / TB_VIEWS_FILE, views)
    for legacy in LEGACY_VIEW_RUNS:
        shutil.rmtree(tb_dir / legacy, ignore_errors=True)
    summaries = view_summaries(views)
    for run in runs:
        refresh_run_views(tb_dir / run, summaries)


def browse_hint(matrix_dir: Path, logdirs: Sequence[str]) -> str:
    """The line that tells a reader which TensorBoard to start for a matrix whose runs lie in ``logdirs``
    (relative to ``matrix_dir``: ``tb/lm``, ``tb_tune/lm``, see ``blockbench.store.layout.tensorboard_runs``):
    the command for the first reported log folder, then the matrix's other folders, each opened on its
    own (a log folder holds at most as many runs as TensorBoard shows by default)."""
    reported = [logdir for logdir in logdirs if logdir.split("/", 1)[0] == TB_DIR]
    tuning = [logdir for logdir in logdirs if logdir.split("/", 1)[0] == TB_TUNE_DIR]
    if not reported and not tuning:
        return f"TensorBoard: no runs in {matrix_dir / TB_DIR}"
    first, *others = reported or tuning
    notes = []
    if len(reported) + len(tuning) > 1:
        notes.append(f"a log folder per task, at most {MAX_RUNS_PER_LOGDIR} runs, opened one at a time")
    if others:
        notes.append(f"the others: {', '.join(others)}")
    if tuning and reported:
        notes.append(f"tuning runs: {', '.join(tuning)}")
    return f"TensorBoard: tensorboard --logdir {matrix_dir / first}" + (f" ({'; '.join(notes)})" if notes else "")
