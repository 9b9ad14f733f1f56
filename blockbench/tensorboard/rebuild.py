"""TensorBoard runs rebuilt from a results folder's cell records (``blockbench report --tensorboard``).

The committed book keeps each cell's ``cell.json`` and ``result.json`` but no ``tb/`` (event files stay
out of git). Every record holds what its cell's run showed of validation: the history of
validations (step, seconds since training began, every metric, the logit lens included), the loss
curve, the final metrics and speed figures, and how the cell ended. :func:`rebuild_matrix` writes
from them, for every cell of a matrix folder, the run a live matrix run would have written
(``blockbench.tensorboard.writer``), in the same log folders under the same names
(``blockbench.store.layout.tensorboard_runs``: ``tb/<task>`` + ``post/seed0``, a tuning cell's ``tb_tune/<task>``
+ ``post/lr=0.001/seed1000``), with the same tags (:func:`blockbench.tensorboard.names.run_tag`:
``0_main/<task>/<headline metric>``, ``0_main/<task>/curve_loss``, ``1_val/<task>/<metric>``,
``z_final/...``) and the same views of each log folder and HParams rows
(:mod:`blockbench.tensorboard.views`), so
that a fresh clone runs ``tensorboard --logdir results/<matrix>/tb/<task>`` on the committed book.
What a record does not hold is not rebuilt: the training loss, learning rates
and per-step speed figures (``2_train``, ``3_lr``, ``4_perf``; their final values are HParams columns).

**Times.** A record's times are seconds since its training began (each validation's ``time_s``, the
run's ``wall_time_s`` at its end, on one clock); a validation's point is written at those seconds
after the run's start, a loss-curve point, whose time the record does not hold, at the time
interpolated by step between them (step 0 at 0 s). The record holds no date: the run's start is
taken as ``result.json``'s modification time less ``wall_time_s`` (the record is written as its
cell ends). On the machine that trained the cells that is when it trained; in a fresh clone it is
the checkout, and only TensorBoard's *Relative* time axis means anything.

**Rebuilt and live runs.** A rebuilt run is one event file whose name carries
:data:`REBUILT_MARK` (``events.out.tfevents.<start>.blockbench-rebuilt``). A run folder holding any
other event file is a live run's (a cell trained here, its own curves complete): it is left as it
is, never overwritten nor added to. A rerun of the rebuild writes each rebuilt run's file anew
(complete before it gets its name) and deletes the rebuilt files it replaces, so a run never holds
the same points twice. A cell trained again later replaces the rebuilt run: the trainer deletes a
run's folder before a fresh run.
"""

from __future__ import annotations

import glob
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard.summary import scalar

from blockbench.tasks import TASK_CONFIGS

from ..config import ConfigError
from ..store.layout import CELL_FILE, CELLS_DIR, RESULT_FILE, TUNE_DIR, cell_files
from ..store.record import CellRecord, read_record
from ..store.tbruns import TensorBoardRun, earlier_run_path, move_runs, tensorboard_runs
from .events import write_event_file
from .logdirs import browse_hint
from .names import CURVE_TAG, PRIMARY_METRIC_TAG, cell_hparams, final_metric_tag, run_tag
from .views import matrix_views, session_end, session_start, view_summaries

#: in the name of every event file the rebuild writes: the files it may replace
REBUILT_MARK = "blockbench-rebuilt"


class RunFile(BaseModel):
    """A cell's TensorBoard run as its ``cell.json`` records it: the log folder and the run's name in it."""

    logdir: str
    name: str


class CellFile(BaseModel):
    """A cell's ``cell.json`` (written by ``blockbench.matrix.jobs.write_cell_file``): what names its
    run and its HParams row, and the run its live writer used (absent from older cell.json files)."""

    model_config = ConfigDict(extra="ignore")

    index: int = 0
    task: str  # the row label (a preset name, or the task name)
    task_name: str  # the task kind, a key of TASK_CONFIGS
    variant: str
    seed: int
    axes: dict[str, Any] = Field(default_factory=dict)
    phase: str | None = None  # tune or report, in a matrix with tune:
    tuned: dict[str, Any] = Field(default_factory=dict)
    tb_run: RunFile | None = None


@dataclass(frozen=True)
class RecordedCell:
    """A cell folder read back: its cell.json, its record and where the record lies."""

    cell: CellFile
    record: CellRecord
    result: Path

    # what names the run (``blockbench.store.layout.LabelledCell``)
    @property
    def task(self) -> str:
        return self.cell.task

    @property
    def variant(self) -> str:
        return self.cell.variant

    @property
    def seed(self) -> int:
        return self.cell.seed

    @property
    def axes(self) -> dict[str, Any]:
        return self.cell.axes

    @property
    def tuned(self) -> dict[str, Any]:
        return self.cell.tuned

    @property
    def hparams(self) -> dict[str, Any]:
        """The cell's HParams row, as the runner passes it to the cell
        (``blockbench.tensorboard.names.cell_hparams``)."""
        return cell_hparams(self.cell.task, self.cell.axes, self.cell.tuned, self.cell.phase)

    @property
    def start(self) -> float:
        """The run's start, seconds since the epoch: the record's modification time less its wall time
        (see the module docstring)."""
        return self.result.stat().st_mtime - (self.record.wall_time_s or 0.0)


@dataclass
class RebuiltMatrix:
    """What :func:`rebuild_matrix` did in one matrix folder."""

    matrix_dir: Path
    written: list[str] = field(default_factory=list)  # runs written from records (their paths in matrix_dir)
    live: list[str] = field(default_factory=list)  # runs left as they are: a live run's event files
    logdirs: list[str] = field(default_factory=list)  # the log folders of the runs, reported ones first
    without_record: int = 0  # cell folders without a readable result.json (not run yet, or running)
    bytes: int = 0  # the size of the event files written

    def describe(self) -> str:
        """One line: ``results/norm_type: 36 runs rebuilt (1.2 MB), 2 live runs kept, 3 cells without a
        result; log folders tb/lm, tb/vit, tb_tune/lm, tb_tune/vit``."""
        parts = [f"{len(self.written)} runs rebuilt ({self.bytes / 1e6:.1f} MB)"]
        if self.live:
            parts.append(f"{len(self.live)} live runs kept")
        if self.without_record:
            parts.append(f"{self.without_record} cells without a result")
        return f"{self.matrix_dir}: " + ", ".join(parts) + f"; log folders {', '.join(self.logdirs) or 'none'}"


def matrix_folders(path: Path) -> list[Path]:
    """``path`` if it is a matrix results folder (it has ``cells/``), else the matrix folders in it (a
    results root such as ``results``); raises ConfigError if there are none."""
    path = Path(path)
    if (path / CELLS_DIR).is_dir():
        return [path]
    found = sorted(folder for folder in path.iterdir() if (folder / CELLS_DIR).is_dir()) if path.is_dir() else []
    if not found:
        raise ConfigError(
            f"{path}: neither a matrix results folder (no {CELLS_DIR}/) nor a folder of them; pass "
            "results/<matrix name> or a results root such as results"
        )
    return found


def write_tensorboard(path: Path) -> str:
    """Rebuild the TensorBoard runs of the matrix folder ``path``, or of every matrix folder in it;
    return what was written, with the command that shows it."""
    began = time.perf_counter()
    done = [rebuild_matrix(matrix_dir) for matrix_dir in matrix_folders(path)]
    total = sum(matrix.bytes for matrix in done)
    runs = sum(len(matrix.written) for matrix in done)
    # a log folder per task (TensorBoard shows one HParams experiment per log folder, all runs up to 40)
    browse = (
        browse_hint(done[0].matrix_dir, done[0].logdirs)
        if len(done) == 1
        else f"TensorBoard: tensorboard --logdir {Path(path) / '<matrix>' / 'tb' / '<task>'} (a log folder per "
        "task, opened one at a time; tuning runs: <matrix>/tb_tune/<task>)"
    )
    return "\n".join(
        [
            *(matrix.describe() for matrix in done),
            f"{runs} runs, {total / 1e6:.1f} MB in {time.perf_counter() - began:.1f} s",
            browse,
        ]
    )


def rebuild_matrix(matrix_dir: Path) -> RebuiltMatrix:
    """Write the run of every cell of ``matrix_dir`` that has a record (its tuning cells' too) into its
    log folder (``tb/<task>/<variant>/seed<k>``, ``tb_tune/<task>/...``), each run carrying its log
    folder's views and the cell's HParams row; a live run is kept. Runs an earlier version put
    elsewhere (every run under ``tb/``, tuning runs under ``tb/tune/``) are moved first."""
    matrix_dir = Path(matrix_dir)
    done = RebuiltMatrix(matrix_dir)
    reported, tuning, done.without_record = matrix_cells(matrix_dir)
    placed = run_names(reported, tuning)
    move_runs(matrix_dir, {earlier_run_path(cell.task, run): run.path for cell, run in placed})
    folders: dict[str, list[tuple[RecordedCell, TensorBoardRun]]] = {}
    for cell, run in placed:
        folders.setdefault(run.logdir, []).append((cell, run))
    done.logdirs = list(folders)  # the reported cells' folders first, in the matrix's order
    for logdir in done.logdirs:
        members = folders[logdir]
        summaries = view_summaries(views_of([cell for cell, _ in members]))
        for cell, run in members:
            live = live_run(matrix_dir, cell.task, run)
            written = None if live else write_run(matrix_dir / run.path, cell, run.name, summaries)
            if written is None:
                done.live.append(live or run.path)
            else:
                done.written.append(run.path)
                done.bytes += written.stat().st_size
    return done


def matrix_cells(matrix_dir: Path) -> tuple[list[RecordedCell], list[RecordedCell], int]:
    """The reported and the tuning cells of ``matrix_dir`` that have a record, and how many have none."""
    reported, without = read_cells(cell_files(matrix_dir))
    tuning, without_tuning = read_cells(sorted((matrix_dir / TUNE_DIR / CELLS_DIR).glob(f"*/*/*/*/{CELL_FILE}")))
    return reported, tuning, without + without_tuning


def run_names(reported: list[RecordedCell], tuning: list[RecordedCell]) -> list[tuple[RecordedCell, TensorBoardRun]]:
    """Each cell with its run, reported cells first: the run its cell.json records, where the live
    writer put it. A cell.json of an older version records none; such a cell's run is named as the
    runner names runs (``blockbench.store.tbruns.tensorboard_runs``), from the cells with a record:
    ``tb/<task>`` + ``<short variant>/seed<k>``, a tuning cell's ``tb_tune/<task>`` +
    ``<short variant>/<candidate>/seed<k>`` (its variant's folder name where no reported cell of the
    variant has a record). The runner splits a task's log folder by every cell the matrix file may
    train, so while seed rounds are open the names from records alone may put a run in another part
    of the split folder (``tb/lm_1of2`` for ``tb/lm``); the recorded run never does."""
    cells = [*reported, *tuning]
    reported_runs, tuning_runs = tensorboard_runs(reported, tuning)
    named = [*reported_runs, *tuning_runs]
    runs = [
        TensorBoardRun(cell.cell.tb_run.logdir, cell.cell.tb_run.name) if cell.cell.tb_run else run
        for cell, run in zip(cells, named, strict=True)
    ]
    if len({run.path for run in runs}) < len(runs):
        runs = named  # a book of cells from both versions whose names clash: name them all alike
    return list(zip(cells, runs, strict=True))


def read_cells(files: Iterable[Path]) -> tuple[list[RecordedCell], int]:
    """The cells of ``files`` (cell.json paths) with a readable record, in the matrix's order (their
    index), and how many have none."""
    cells, without = [], 0
    for path in files:
        record = read_record(path.with_name(RESULT_FILE))
        try:
            cell = CellFile.model_validate(json.loads(path.read_text()))
        except (ValueError, ValidationError):
            cell = None
        if record is None or cell is None:
            without += 1
            continue
        cells.append(RecordedCell(cell, record, path.with_name(RESULT_FILE)))
    return sorted(cells, key=lambda cell: cell.cell.index), without


def views_of(cells: list[RecordedCell]) -> dict[str, Any]:
    """The views of the log folder of ``cells`` as the runner builds them
    (``blockbench.tensorboard.views.matrix_views``, see ``blockbench.tensorboard.logdirs``): every cell's HParams
    row, each task's metrics and throughput unit in the matrix's order, the tasks whose records hold
    the logit lens and the loss curve."""
    tasks = {
        cell.task: (TASK_CONFIGS[cell.cell.task_name].metrics, TASK_CONFIGS[cell.cell.task_name].throughput_unit)
        for cell in cells
    }
    lens_tasks = [
        cell.task
        for cell in cells
        if any(name.startswith("lens/") for point in cell.record.history for name in point.metrics)
    ]
    curve_tasks = [cell.task for cell in cells if cell.record.curve and cell.record.curve.points]
    return matrix_views([cell.hparams for cell in cells], tasks, lens_tasks=lens_tasks, curve_tasks=curve_tasks)


def live_run(matrix_dir: Path, task: str, run: TensorBoardRun) -> str | None:
    """The path of a live run of ``run``'s cell in another log folder of its task (``tb/lm`` for
    ``tb/lm_1of2``, or the reverse), None if there is none. The runner splits a task's folder by
    every cell its matrix file may train (every seed of ``seeds:``), the rebuild by the cells with a
    record: where they differ, the live run stays where it is and no rebuilt copy is written."""
    root = run.logdir.split("/", 1)[0]
    folders = [matrix_dir / root / task, *(matrix_dir / root).glob(f"{glob.escape(task)}_*of*")]
    for folder in folders:
        path = f"{root}/{folder.name}/{run.name}"
        if path == run.path or not (matrix_dir / path).is_dir():
            continue
        if any(REBUILT_MARK not in event.name for event in (matrix_dir / path).glob("*tfevents*")):
            return path
    return None


def write_run(run_dir: Path, cell: RecordedCell, run: str, views: list[Summary]) -> Path | None:
    """Write the rebuilt run of ``cell`` into ``run_dir`` and delete the rebuilt files it replaces;
    None (nothing written) if ``run_dir`` holds a live run's event files."""
    existing = list(run_dir.glob("*tfevents*")) if run_dir.is_dir() else []
    if any(REBUILT_MARK not in path.name for path in existing):
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    start = cell.start
    events = run_events(cell, run, views, start)
    path = run_dir / f"events.out.tfevents.{int(start):010d}.{REBUILT_MARK}"
    write_event_file(path, [event.SerializeToString() for event in events], wall_time=start)
    for old in existing:
        if old != path:
            old.unlink(missing_ok=True)
    return path


def run_events(cell: RecordedCell, run: str, views: list[Summary], start: float) -> list[Event]:
    """The events of a cell's rebuilt run, in the order a live run writes them: the views at step 0,
    the validation points and loss-curve points by step, then at the final step the HParams
    session's start, the final figures (``z_final/...``, finite ones only) and the session's end."""
    record, task = cell.record, cell.task
    seconds = elapsed_at(record)
    points: list[tuple[int, float, str, float]] = []  # step, seconds, tag, value
    for validation in record.history:
        at = validation.time_s if validation.time_s is not None else seconds(validation.step)
        for name, value in validation.metrics.items():
            points.append((validation.step, at, run_tag(f"val/{name}", task), math.nan if value is None else value))
    for step, loss in record.curve.points if record.curve else []:
        points.append((int(step), seconds(step), run_tag(CURVE_TAG, task), loss))
    events = [Event(wall_time=start, step=0, summary=summary) for summary in views]
    events += [
        Event(wall_time=start + at, step=step, summary=scalar(tag, value))
        for step, at, tag, value in sorted(points, key=lambda point: point[0])
    ]
    last_step = record.steps if record.steps is not None else max((point[0] for point in points), default=0)
    end = start + (record.wall_time_s if record.wall_time_s is not None else seconds(last_step))
    task_cfg = TASK_CONFIGS[cell.cell.task_name]
    finals = {f"val/{name}": value for name, value in record.metrics.items()}
    finals |= record.final_figures(task_cfg.throughput_unit)
    primary = f"val/{record.primary_metric or task_cfg.metrics[0].name}"
    tagged = {final_metric_tag(name): value for name, value in finals.items()}
    if primary in finals:
        tagged[PRIMARY_METRIC_TAG] = finals[primary]
    events.append(Event(wall_time=end, step=last_step, summary=session_start(cell.hparams, record.status, run, start)))
    events += [
        Event(wall_time=end, step=last_step, summary=scalar(tag, value))
        for tag, value in tagged.items()
        if value is not None and math.isfinite(value)
    ]
    events.append(Event(wall_time=end, step=last_step, summary=session_end(record.status, end)))
    return events


def elapsed_at(record: CellRecord) -> Callable[[float], float]:
    """The seconds since training began at a step, interpolated (numpy's ``interp``) between the
    record's known times: step 0 at 0 s, each validation's ``time_s`` and, unless a validation is
    there, the run's ``wall_time_s`` at its last step; held at the last known time after it."""
    known = {0: 0.0}
    known |= {point.step: point.time_s for point in record.history if point.time_s is not None}
    if record.steps is not None and record.wall_time_s is not None:
        known.setdefault(record.steps, record.wall_time_s)  # a validation at the last step keeps its time
    steps = sorted(known)
    times = [known[step] for step in steps]

    def seconds(step: float) -> float:
        return float(np.interp(step, steps, times))

    return seconds
