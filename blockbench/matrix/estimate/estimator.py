"""A cell's seconds, start-up to exit, from the best of the sources the package docstring lists
(:class:`TimeEstimator`), and what the records on disk and a training cell's log tell of them."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ...config import RunConfig
from ...durations import pace_of_lines
from ...store.layout import TRAIN_LOG
from ...store.reuse import earlier_record
from ..expand import Cell
from ..plan import IF_NEEDED, CellPlan
from .timing import REPORT_SECONDS, CellTiming, report_seconds

Key = tuple[str, str]
#: a cell's task and the sizes its step time depends on (:func:`shape_of`)
Shape = tuple
#: times the cells of some (task, variant)s: their timings, and why the others could not be timed
Timer = Callable[[dict[Key, RunConfig]], tuple[dict[Key, CellTiming], dict[Key, str]]]


def key_of(cell: Cell) -> Key:
    return cell.task, cell.variant


def shape_of(cell: Cell) -> Shape:
    """The cell's task and the sizes of its model and batch: cells of one shape take about the same
    time per step on a GPU, where a small cell's step is its kernels' launches."""
    model, trainer = cell.run.resolved_model(), cell.run.trainer
    sizes = (model.family, model.d_model, model.n_layers, model.n_heads, model.n_kv_heads, model.d_ff, model.ffn)
    return (cell.task, *sizes, model.n_experts, model.max_seq_len, trainer.batch_size, trainer.precision)


@dataclass
class TimeEstimator:
    """A cell's seconds, start-up to exit, from the best source of the module docstring, and the matrix
    run's own seconds before its first cell and after its last (see :func:`describe_total`)."""

    #: seconds per step of whole cells of each (task, variant): this run's processes, earlier records
    measured: dict[Key, list[float]] = field(default_factory=dict)
    #: each (task, variant)'s cell timed in parts (``blockbench.matrix.estimate.timing``)
    timings: dict[Key, CellTiming] = field(default_factory=dict)
    #: measured over timed seconds of this run's cells that have a timing
    ratios: dict[Key, list[float]] = field(default_factory=dict)
    #: the folders of each (task, variant)'s cells, where a training cell's train.log tells its pace
    directories: dict[Key, list[Path]] = field(default_factory=dict)
    #: when the run began: a train.log older than that is another run's (``--jobs 1`` writes none)
    started: float = field(default_factory=time.time)
    #: seconds of the run before its first cell (the dry run's: start-up, planning, cell server, timing)
    before: float = 0.0
    #: seconds of the run after its last cell (see :func:`blockbench.matrix.estimate.timing.report_seconds`)
    after: float = REPORT_SECONDS
    #: a GPU's rule: a variant with nothing measured takes the measured pace of its task's cells of the
    #: same shape, else one timing per task and shape (``probes``), never a timing of every variant
    per_task: bool = False
    #: each shape's timing (``per_task``)
    probes: dict[Shape, CellTiming] = field(default_factory=dict)
    #: a cell of each (task, variant) measured, whose shape stands for the variant's (:meth:`same_shape`)
    examples: dict[Key, Cell] = field(default_factory=dict)
    _shapes_of: dict[tuple[str, int], Shape] = field(default_factory=dict, repr=False)

    def shape(self, cell: Cell) -> Shape:
        """:func:`shape_of` the cell, worked out once per cell and config (resolving a config takes time)."""
        key = (cell.key, id(cell.run))
        if key not in self._shapes_of:
            self._shapes_of[key] = shape_of(cell)
        return self._shapes_of[key]

    def add(self, cell: Cell, seconds: float, steps: int, from_step: int = 0) -> None:
        """A cell took ``seconds`` for ``steps`` optimizer steps from ``from_step``; with a timing of its
        variant, its measured-to-timed ratio is kept for the variants not measured yet."""
        if steps <= 0 or seconds <= 0:
            return
        key = key_of(cell)
        self.measured.setdefault(key, []).append(seconds / steps)
        self.examples.setdefault(key, cell)
        timing = self.timings.get(key)
        timed = timing.seconds(cell.run.trainer, from_step) if timing else 0.0
        if timed > 0:
            self.ratios.setdefault(key, []).append(seconds / timed)

    def add_results(self, cells: Iterable[Cell], matrix_dir: Path) -> None:
        """Earlier results in the matrix folder, whatever code made them (step times change little), and
        the earlier runs' report times under the results root."""
        for cell in cells:
            directory = cell.directory(matrix_dir)
            self.directories.setdefault(key_of(cell), []).append(directory)
            record = earlier_timing(directory)
            if record:
                self.add(cell, *record)
        self.after = report_seconds(matrix_dir.parent)

    def estimate(self, plan: CellPlan, *, guess: bool = True) -> tuple[float, str] | None:
        """(seconds, source) of ``plan``'s cell trained from its resume step, trained or not yet known to
        train (IF_NEEDED), or None; ``guess``: fall back on paces (see :meth:`pace`)."""
        cell, key = plan.cell, key_of(plan.cell)
        steps = cell.run.trainer.max_steps - plan.resume_step
        if self.measured.get(key):
            return statistics.median(self.measured[key]) * steps, "measured"
        same_shape = self.same_shape(cell) if self.per_task else []
        if same_shape:
            return statistics.median(same_shape) * steps, "same shape"
        timing, timed = self.timings.get(key), "timed"
        if timing is None and self.per_task:
            timing, timed = self.probes.get(self.shape(cell)), "task probe"
        if timing is not None:
            seconds = timing.seconds(cell.run.trainer, plan.resume_step)
            ratio = self.ratio(cell.task)
            return (seconds * ratio, "scaled") if ratio is not None else (seconds, timed)
        pace = self.pace(cell) if guess else None
        return (pace[0] * steps, pace[1]) if pace else None

    def same_shape(self, cell: Cell) -> list[float]:
        """Seconds per step measured of the cells of other variants of ``cell``'s task and shape; the
        shapes are worked out only here, once per variant, since resolving a config takes time."""
        same_task = [key for key in self.measured if key[0] == cell.task]  # each has an example (add)
        if not same_task:
            return []
        shape = self.shape(cell)
        return [s for key in same_task if self.shape(self.examples[key]) == shape for s in self.measured[key]]

    def ratio(self, task: str) -> float | None:
        """The median measured-to-timed ratio of this run's cells of ``task``, else of all its cells:
        what the timings missed (another load on the machine, a part they scale wrongly)."""
        same = [r for (other, _), values in self.ratios.items() if other == task for r in values]
        ratios = same or [r for values in self.ratios.values() for r in values]
        return statistics.median(ratios) if ratios else None

    def pace(self, cell: Cell) -> tuple[float, str] | None:
        """(seconds per step, source) where the cell's variant was neither measured nor timed (a timing
        that failed): the pace its training cells print, else other variants' of its shape, else other
        variants' of its task, else other tasks'. A ladder's task spans rungs whose step times differ
        about fivefold, so its median alone would give a top-rung variant a lower rung's pace."""
        key = key_of(cell)
        running = [
            pace
            for directory in self.directories.get(key, [])
            if (pace := running_pace(directory, since=self.started)) is not None
        ]
        if running:  # a variant whose first cells are training: their pace so far
            return statistics.median(running), "running"
        same_shape = self.same_shape(cell)
        if same_shape:  # its task's other variants of its sizes (a ladder's rung, not its whole task)
            return statistics.median(same_shape), "same shape"
        same_task = [s for (task, _), values in self.measured.items() if task == cell.task for s in values]
        if same_task:  # a variant none of whose cells ran yet: its task's pace, a rough guess
            return statistics.median(same_task), "other variants"
        if self.measured:  # a task none of whose cells ran yet: the others' pace, a rougher guess
            return statistics.median(s for values in self.measured.values() for s in values), "other tasks"
        return None

    def seconds(self, plan: CellPlan) -> float | None:
        """Seconds of ``plan``'s cell (0 for one that does not train), or None where nothing is known."""
        if not plan.trains:
            return 0.0
        estimate = self.estimate(plan)
        return estimate[0] if estimate else None

    def time(self, plans: Iterable[CellPlan], timer: Timer) -> list[str]:
        """Time with ``timer`` each (task, variant) of ``plans`` that trains, or may (IF_NEEDED), and has no
        measured figure nor timing; return the problems of those that could not be timed."""
        runs: dict[Key, RunConfig] = {}
        shapes: dict[Key, Shape] = {}
        for plan in plans:
            if (plan.trains or plan.status == IF_NEEDED) and self.estimate(plan, guess=False) is None:
                if self.per_task:  # the first variant of each shape stands for the others
                    shape = self.shape(plan.cell)
                    if shape in shapes.values():
                        continue
                    shapes[key_of(plan.cell)] = shape
                runs.setdefault(key_of(plan.cell), plan.cell.run)
        if not runs:
            return []
        timings, problems = timer(runs)
        self.timings.update(timings)
        self.probes.update({shapes[key]: timing for key, timing in timings.items() if key in shapes})
        return [f"{task}/{variant}: not timed ({why})" for (task, variant), why in problems.items()]


def running_pace(cell_dir: Path, *, since: float = 0.0) -> float | None:
    """Seconds per step that the cell's train.log shows (see :func:`blockbench.progress.pace_of_lines`),
    if it has one written at ``since`` (a time.time()) or later: the log of the cell's run since then."""
    log = cell_dir / TRAIN_LOG
    try:
        if log.stat().st_mtime < since - 1.0:  # a second's slack: file times can lag time.time()
            return None
        return pace_of_lines(log.read_text(encoding="utf-8", errors="replace").splitlines())
    except OSError:
        return None


def earlier_timing(cell_dir: Path) -> tuple[float, int, int] | None:
    """(seconds, steps trained, the step it started from) of a finished earlier result in ``cell_dir``,
    if there is one: its whole process (``wall_time_breakdown`` total), else its ``wall_time_s``."""
    result = earlier_record(cell_dir)
    if not result or not result.finished or not result.steps:
        return None
    seconds = (result.wall_time_breakdown or {}).get("total") or result.wall_time_s
    from_step = result.resumed_from_step or 0
    if not seconds or result.steps <= from_step:
        return None
    return float(seconds), int(result.steps) - from_step, from_step
