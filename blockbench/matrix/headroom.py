"""Headroom first: before a ladder's cells, the baseline alone at the top rung, one cell per task, checked
against the book's saturation rule; the run stops there if a task has no room left.

A ladder measures how a verdict changes as compute grows only while the baseline can still improve. A
task whose baseline, at the top rung, is within its saturation distance of the best its headline
metric allows (the LM within 0.03 nats of its grammar's entropy floor, the translator within half a
BLEU point of 100; the task's declared ``saturation``, the same rule that withholds a verdict in the
summary) gives the top rungs no verdict, and a trend fitted below it mostly measures the approach to the
ceiling. So the run trains the baseline at the top rung first (:func:`headroom_cells`): the first
tuning seed's cell of the middle value of the grid, which the tuning of that rung reuses, or without
``tune:`` its first reported seed. A task whose baseline there is saturated, or nearer than
:data:`NEAR_FACTOR` saturation distances (the variants, better or longer tuned, would reach the ceiling
first), stops the run before any other cell, with a message naming the task and what to change: the
task's settings for the whole ladder, harder, in the matrix file's task entry. The 1x rung then trains
at those settings too, so the book's cells are no longer copied for it.

The outcome is a :class:`blockbench.store.record.HeadroomCheck` (``headroom.json``), decided from the
results on disk: a run after one that stopped checks again from the same cells.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..matrixfile import RUNG_AXIS
from ..store.record import CellRecord, HeadroomCheck, HeadroomTask
from .expand import Cell, Expansion, design_label
from .schedule import Results

#: a task stops the ladder where its baseline at the top rung is within this many saturation distances
#: of the best value: at three the variants still have twice the distance to gain before the per-rung
#: rule calls both sides saturated, while a baseline that close has little left to show a trend in
NEAR_FACTOR = 3.0
ROOM, NEAR, SATURATED, UNKNOWN, NO_RULE = "room", "near", "saturated", "unknown", "no rule"
#: the record's name of the LM's entropy floor among a cell's trivial baselines
FLOOR = "loss_floor"
#: what the message suggests for a task whose config names no harder settings
HARDER_ANY = "harder settings of its own (blockbench list task)"
#: a setting a task config's ``harder`` names: ``task.<key>: <value>``
HINTED_SETTING = re.compile(r"task\.(\w+): ([\w.]+)")


def harder_suggestion(task: object) -> str:
    """What the stop message suggests to make ``task`` (a task config) harder: its config's ``harder``,
    unless the entry already sets every ``task.key: value`` it names at that value or beyond, where
    repeating it would send the user round in a circle; then the keys to raise past their values now."""
    hint = type(task).harder
    if not hint:
        return HARDER_ANY
    named = HINTED_SETTING.findall(hint)
    if not named or not all(_at_least(getattr(task, key, None), value) for key, value in named):
        return hint
    now = ", ".join(f"task.{key}: {_shown(getattr(task, key))}" for key, _ in named)
    return f"past what the entry already sets ({now}, the task's own suggestion: {hint})"


def _shown(value: object) -> str:
    """A setting as a matrix file writes it: 24, not 24.0."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _at_least(current: object, value: str) -> bool:
    """Whether a setting now at ``current`` has the hinted ``value`` or goes beyond it (numbers)."""
    try:
        return float(current) >= float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(current) == value


def baseline_design(expansion: Expansion) -> str:
    """The baseline's label without its rung: the matrix's ``baseline_variant``, else the first cell's."""
    matrix = expansion.matrix
    return matrix.baseline_variant or (design_label(expansion.cells[0].axes) if expansion.cells else "")


def headroom_cells(expansion: Expansion) -> list[Cell]:
    """The cells the headroom check trains (see the module docstring): per task, the baseline at the top
    rung, at the first tuning seed and the middle value of the rung's first grid where the matrix tunes
    (a tuning cell of that rung), else its first reported seed; none without a ladder or its check."""
    ladder = expansion.matrix.ladder
    if ladder is None or not ladder.headroom:
        return []
    baseline, top = baseline_design(expansion), ladder.top.name
    at_top = [
        cell
        for cell in expansion.cells
        if cell.axes.get(RUNG_AXIS) == top and baseline in (design_label(cell.axes), cell.variant)
    ]
    chosen: dict[str, Cell] = {}
    for cell in at_top:
        if cell.task in chosen:
            continue
        if not expansion.matrix.tune:
            chosen[cell.task] = cell
            continue
        grid = expansion.grid(cell)
        middle = {key: sorted(values)[(len(values) - 1) // 2] for key, values in grid.items()}
        seed = expansion.matrix.tune_seeds[0]
        chosen[cell.task] = next(
            tuning
            for tuning in expansion.tuning
            if (tuning.task, tuning.variant, tuning.seed) == (cell.task, cell.variant, seed) and tuning.tuned == middle
        )
    return list(chosen.values())


def check_task(cell: Cell, record: CellRecord | None) -> HeadroomTask:
    """One task's check from its headroom cell's ``record`` (None: it has none)."""
    metric = cell.run.task.metrics[0]
    saturation = getattr(cell.run.task, "saturation", None)
    found = HeadroomTask(
        task=cell.task,
        variant=cell.variant,
        cell=cell.key,
        status=UNKNOWN,
        metric=metric.name,
        harder=harder_suggestion(cell.run.task),
    )
    if record is None or record.status != "ok" or metric.name not in record.metrics:
        how = "has no result" if record is None else f"ended {record.status}"
        return found.model_copy(update={"detail": f"{cell.key} {how}: its headroom is unknown"})
    value = float(record.metrics[metric.name])
    found = found.model_copy(update={"value": value})
    if saturation is None:
        return found.model_copy(update={"status": NO_RULE, "detail": f"task {cell.task} declares no saturation"})
    floor = record.baselines.get(FLOOR) if saturation.of == "floor" else None
    if saturation.of == "floor" and floor is None:
        return found.model_copy(update={"detail": f"{cell.key} recorded no entropy floor: its headroom is unknown"})
    loss = math.log(value) if metric.exp_of_loss else value
    distance = loss - floor if floor is not None else abs(metric.best - value)
    near = NEAR_FACTOR * saturation.distance
    status = SATURATED if saturation.saturated(value, metric, floor=floor) else NEAR if distance <= near else ROOM
    return found.model_copy(
        update={
            "status": status,
            "of": saturation.of,
            "distance": distance,
            "saturation": saturation.distance,
            "near": near,
        }
    )


def stop_message(check: list[HeadroomTask], rung: str, path: Path) -> str:
    """What the run says where it stops: each task without room, how far it is from the ceiling, and what
    to change."""
    lines = [f"headroom: the ladder stops before its cells: the baseline has too little room at the top rung {rung}"]
    for task in check:
        if task.status not in (SATURATED, NEAR):
            continue
        ceiling = "the entropy floor, in nats of loss" if task.of == "floor" else f"the best {task.metric}"
        lines.append(
            f"  {task.task}: {task.variant} ({task.cell}) is {task.distance:.3g} from {ceiling} ({task.status}: "
            f"saturated within {task.saturation:g}, the ladder needs more than {task.near:g}). Make {task.task} "
            f"harder for the whole ladder in its task entry of {path.name} (axes: task:), e.g. "
            f"{task.harder or HARDER_ANY}; then run again (the "
            "1x rung then trains at those settings instead of copying the book's cells)"
        )
    return "\n".join(lines)


def headroom_check(expansion: Expansion, cells: list[Cell], results: Results) -> HeadroomCheck:
    """The headroom check of ``cells`` (:func:`headroom_cells`) from their results: it stops the run
    where a task's baseline is saturated or near it at the top rung."""
    assert expansion.matrix.ladder is not None
    rung = expansion.matrix.ladder.top.name
    tasks = [check_task(cell, results.record(cell)) for cell in cells]
    stop = any(task.status in (SATURATED, NEAR) for task in tasks)
    message = stop_message(tasks, rung, expansion.path) if stop else ""
    return HeadroomCheck(rung=rung, stop=stop, tasks=tasks, message=message)


@dataclass
class HeadroomPhase:
    """The headroom check as the run's first phase (a :class:`blockbench.matrix.schedule.Schedule`): one
    round, its cells (:func:`headroom_cells`), then nothing; :func:`headroom_check` reads its outcome."""

    cells: list[Cell] = field(default_factory=list)

    def next_cells(self, results: Results) -> list[Cell] | None:
        return None

    def describe(self, cells: list[Cell]) -> str:
        return f"headroom: {len(cells)} cell(s) of the baseline at the top rung"
