"""A matrix's TensorBoard log folders, made ready before its first cell trains.

Each cell's run lies in a log folder a reader opens on its own (``blockbench.layout.tensorboard_runs``):
one per task under ``tb/`` for the reported cells, one per task under ``tb_tune/`` for the tuning
cells, a task with more runs than TensorBoard enables by default split further. Every run carries
the views of its log folder (``blockbench.tbviews.matrix_views``: the HParams experiment and the
Custom Scalars layout), built from that folder's cells only, so that the HParams table of
``tb/lm`` has the LM's metric columns and its Custom Scalars the LM's charts; TensorBoard shows one
experiment per log folder and merges the layouts of the runs it reads.

:func:`publish_logdirs` moves the runs that older versions of the runner wrote elsewhere (every
run under ``tb/``, tuning runs under ``tb/tune/``, even older ones named after the cell folders)
to their folders now, then writes each folder's ``views.json`` (which its cells log) and rewrites
the runs of earlier cells whose views changed (``blockbench.cell.tensorboard.publish_views``).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from ..cell.tensorboard import LEGACY_VIEW_RUNS, matrix_views, publish_views
from ..layout import TB_DIR, TB_VIEWS_FILE, cell_folder, earlier_run_path, move_runs
from ..tbviews import browse_hint
from .expand import Cell


def publish_logdirs(matrix_dir: Path, cells: Sequence[Cell], tuning: Sequence[Cell] = ()) -> str:
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

    folders: dict[str, list[Cell]] = {}
    for cell in [*cells, *tuning]:
        folders.setdefault(cell.tb.logdir, []).append(cell)
    for logdir, members in folders.items():
        tasks = {cell.task: (cell.run.task.metrics, cell.run.task.throughput_unit) for cell in members}
        views = matrix_views(
            [cell.hparams for cell in members],
            tasks,
            lens_tasks=[cell.task for cell in members if getattr(cell.run.task, "logit_lens", False)],
            curve_tasks=[cell.task for cell in members if cell.run.trainer.curve_interval],
        )
        publish_views(matrix_dir / logdir, views, [cell.tb.name for cell in members])
    return browse_hint(matrix_dir, list(folders))
