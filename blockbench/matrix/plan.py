"""What a matrix run will do before it does it: each cell's status (done, stale, resumable, to run, ...)
and why. ``blockbench matrix --dry-run`` prints it with the time estimate
(:mod:`blockbench.matrix.estimate`), and the runner starts from it.

A cell's status is read from the results store alone (:mod:`blockbench.store`): whether its earlier
result counts (:class:`blockbench.store.reuse.ReuseRule`: the same config, made by this code or, by
the lineage, with its numbers), whether another matrix trained the same config (copied, not trained
again) and which checkpoint it would resume from (:mod:`blockbench.store.checkpoints`). Planning reads
and never writes: the cell's training process clears what it cannot resume, and the runner copies.

Before planning, the runner refuses a results folder that holds cells made on hardware other than
this run's (:func:`refuse_other_hardware`): training there would overwrite them, or put seeds of two
kinds of device or precision side by side, which the report then refuses after the compute is spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from ..store.checkpoints import resumable_checkpoint
from ..store.layout import CELLS_DIR, CHECKPOINT_DIR, cell_results
from ..store.record import HARDWARE_AXES, HARDWARE_WAYS_OUT, Hardware, hardware_listing, read_record
from ..store.reuse import REUSED, ReuseRule, earlier_record
from .devices import cell_hardware
from .expand import Cell, Expansion
from .schedule import Results, extended_tuning, first_round, pending_tuning
from .topgrid import held_back
from .tuning import REPORT, Tuning

#: statuses of a cell before the run; all but DONE (and STALE with --reuse-stale) are trained
DONE, STALE, RESUMABLE, FAILED_BEFORE, TO_RUN = "done", "stale", "resumable", "failed before", "to run"
#: statuses of a reported cell of a matrix with ``tune:`` (see ``blockbench.matrix.tuning``) while its
#: variant's choice is not known (its tuning cells have yet to train), and when no candidate finished
#: (it is not trained: it fails, naming the tuning cells)
AFTER_TUNING, NO_CHOICE = "after tuning", "no choice"
#: a cell whose config another matrix of the results root has already trained with this code: its
#: folder is copied, not trained again
ELSEWHERE = "done elsewhere"
#: a cell that trains only if a later round needs it: a tuning cell of a later rung of successive
#: halving (if its candidate survives), or a seed beyond ``seeds: min`` (if its question is undecided)
IF_NEEDED = "if needed"


class OtherHardware(ConfigError):
    """The matrix's results folder holds finished cells made on another kind of device or at another
    precision than this run's cells train at (CPU float32 cells, and a run on a GPU in bf16): the run
    would train over them, or beside them, and never compare like with like."""


@dataclass(frozen=True)
class CellPlan:
    """A cell's status before the run, why, and the step its training resumes from."""

    n: int  # 1-based position in the matrix
    cell: Cell
    status: str
    detail: str = ""
    trains: bool = True
    resume_step: int = 0
    source: Path | None = None  # ELSEWHERE: the cell folder its result is copied from

    @property
    def steps_to_train(self) -> int:
        return self.cell.run.trainer.max_steps - self.resume_step if self.trains else 0


def plan_cell(n: int, cell: Cell, matrix_dir: Path, rule: ReuseRule) -> CellPlan:
    """Whether ``cell`` is reused (done; stale with ``reuse_stale``), copied from another matrix that
    trained the same config with this code (``rule.elsewhere``), retrained (stale, failed before; made
    on other hardware), resumed from a checkpoint of the same config and code made on the same hardware,
    or trained from step 0 (``rule.force``: all from step 0). The hardware is the cell's as the runner
    resolves it (``rule.cuda``, :func:`blockbench.matrix.devices.cell_hardware`)."""
    if rule.force:
        return CellPlan(n, cell, TO_RUN, "--force: from step 0")
    cell_dir, config_hash = cell.directory(matrix_dir), cell.run.config_hash()
    hardware = cell_hardware(cell.run.trainer, cuda=rule.cuda)
    reuse, message = rule.reuse(cell_dir, config_hash, hardware=hardware)
    stale = message is not None and not message.startswith(REUSED)
    if reuse:
        return CellPlan(n, cell, STALE if stale else DONE, message or "", trains=False)
    source = rule.source(cell_dir, config_hash, hardware=hardware)
    if source is not None:
        return CellPlan(n, cell, ELSEWHERE, f"done in {source}, copying its result", trains=False, source=source)
    status, detail = (STALE, message or "") if stale else (TO_RUN, "")
    earlier = earlier_record(cell_dir)
    if status == TO_RUN and earlier and earlier.status == "failed" and earlier.config_hash == config_hash:
        status, detail = FAILED_BEFORE, f"failed before ({str(earlier.error)[:80]}), retrying"
    if (cell_dir / CHECKPOINT_DIR).is_dir():
        resume = resumable_checkpoint(cell_dir / CHECKPOINT_DIR, config_hash, rule.fingerprint, hardware)
        if resume.checkpoint is not None:
            return CellPlan(n, cell, RESUMABLE, f"resumes from step {resume.step}", resume_step=resume.step)
        detail = "; ".join(filter(None, [detail, resume.error or resume.note]))
    return CellPlan(n, cell, status, detail)


def plan_cells(cells: list[Cell], matrix_dir: Path, rule: ReuseRule, *, start: int = 1) -> list[CellPlan]:
    """Each cell's status (see :func:`plan_cell`), in matrix order, numbered from ``start``."""
    return [plan_cell(n, cell, matrix_dir, rule) for n, cell in enumerate(cells, start)]


def plan_reported(
    expansion: Expansion,
    cells: list[Cell],
    tunings: dict[tuple[str, str], Tuning],
    matrix_dir: Path,
    rule: ReuseRule,
    *,
    start: int,
) -> list[CellPlan]:
    """The plans of the reported ``cells``, numbered from ``start``. With ``tune:``, a cell whose variant
    has a choice in ``tunings`` is planned at the chosen values (its config, so a changed choice
    retrains it and an unchanged one reuses it); one whose variant has no finished candidate is
    NO_CHOICE (it fails, untrained); one whose variant is still tuning trains AFTER_TUNING."""
    if not expansion.tuning:
        return plan_cells(cells, matrix_dir, rule, start=start)
    plans = []
    for n, cell in enumerate(cells, start):
        tuning = tunings.get((cell.task, cell.variant))
        if tuning is None:
            plans.append(CellPlan(n, cell, AFTER_TUNING, f"at the {', '.join(expansion.matrix.tune)} its tuning picks"))
        elif tuning.chosen is None:
            plans.append(CellPlan(n, cell, NO_CHOICE, tuning.failure(), trains=False))
        else:
            tuned = expansion.at_choice(cell, tuning.chosen.values)
            plans.append(plan_cell(n, tuned, matrix_dir, rule))
    return plans


@dataclass(frozen=True)
class MatrixPlan:
    """A whole matrix planned before its first cell: ``plans`` lists the tuning cells of the current
    rungs (``tuning_plans``, first), the reported cells of the first round, then the cells a later round
    may add (``later``, IF_NEEDED unless reused); ``tuning``: every tuning cell, with those of values the
    tuner added past a grid's end so far; ``known``: the variants whose tuning has ended already."""

    plans: list[CellPlan]
    tuning_plans: list[CellPlan]
    tuning: list[Cell]
    known: dict[tuple[str, str], Tuning]
    first: list[Cell]
    later: list[Cell]

    @property
    def first_reported(self) -> list[CellPlan]:
        """The plans of the first round's reported cells."""
        return self.plans[len(self.tuning_plans) : len(self.plans) - len(self.later)]


def plan_matrix(expansion: Expansion, matrix_dir: Path, rule: ReuseRule) -> MatrixPlan:
    """Plan every cell of ``expansion`` from the results in ``matrix_dir`` (see :class:`MatrixPlan`):
    a variant's tuning that has ended (every rung reusable here) has its choice known before anything
    trains, so its reported cells are planned at it."""
    results = Results(matrix_dir, rule)
    start = [cell for cell in expansion.tuning if not held_back(expansion, cell)]
    tuning, tunings = extended_tuning(expansion, start, results, finished_only=True)
    settled = {cell.key for cell in tuning if results.record(cell, finished_only=True)}
    pending = {cell.key for cell in pending_tuning(tuning, tunings)}
    tuning_plans = plan_cells([cell for cell in tuning if cell.key in settled | pending], matrix_dir, rule)
    known = {key: t for key, t in tunings.items() if t.complete}
    first = first_round(expansion)
    plans = tuning_plans + plan_reported(expansion, first, known, matrix_dir, rule, start=len(tuning_plans) + 1)
    planned = {plan.cell.key for plan in tuning_plans}
    later = [
        cell
        for cell in tuning
        if cell.key not in planned and (cell.task, cell.variant) not in known and results.record(cell) is None
    ]
    # a centred top rung's stand-ins until the rungs below have chosen: listed for the estimate
    placed = {(cell.task, cell.variant) for cell in tuning}
    later += [
        cell for cell in expansion.tuning if held_back(expansion, cell) and (cell.task, cell.variant) not in placed
    ]
    later += [cell for cell in expansion.cells if cell not in first]
    # a later round's cells: reused where a run got that far, else trained only if a round needs them
    for cell in later:
        n = len(plans) + 1
        chosen = known.get((cell.task, cell.variant))
        if cell.phase == REPORT and tuning and chosen is not None and chosen.chosen is not None:
            cell = expansion.at_choice(cell, chosen.chosen.values)
        plan = plan_cell(n, cell, matrix_dir, rule)
        done = plan.status == DONE and not (cell.phase == REPORT and tuning and not cell.tuned)
        plans.append(plan if done else CellPlan(n, cell, IF_NEEDED, trains=False))
    return MatrixPlan(plans, tuning_plans, tuning, known, first, later)


def _side(folder: Path, matrix_dir: Path, *, by_variant: bool) -> tuple[str, ...]:
    """The cells a report compares the cell in ``folder`` with: those of its task and variant folder
    (``by_variant``) or of its task; a tuning cell's are those of its variant (or task) too."""
    parts = folder.relative_to(matrix_dir).parts
    task_and_variant = parts[1:3] if parts[0] == CELLS_DIR else parts[2:4]
    return task_and_variant if by_variant else task_and_variant[:1]


def cells_on_other_hardware(
    cells: list[Cell], matrix_dir: Path, *, cuda: bool
) -> dict[Hardware, tuple[list[str], set[Hardware]]]:
    """The finished cells in ``matrix_dir`` made on other hardware than this run's: hardware -> their
    names and the hardware this run would put beside them. This run's hardware for a folder is that of
    its cell of ``cells`` (each resolved as :func:`blockbench.matrix.devices.cell_hardware`, ``cuda``:
    whether the cells get a CUDA GPU); for a folder that no cell names (a tuning candidate the tuner
    added, a variant since dropped), that of the cells it would be reported with: its task's, or its
    variant's where the matrix has a hardware axis (:data:`HARDWARE_AXES`: the variant folders then
    differ by hardware, and the report compares each on its own)."""
    ours = {cell.directory(matrix_dir): cell_hardware(cell.run.trainer, cuda=cuda) for cell in cells}
    by_variant = any(key in cell.axes for cell in cells for key in HARDWARE_AXES)
    beside: dict[tuple[str, ...], set[Hardware]] = {}
    for folder, hardware in ours.items():
        beside.setdefault(_side(folder, matrix_dir, by_variant=by_variant), set()).add(hardware)
    found: dict[Hardware, tuple[list[str], set[Hardware]]] = {}
    for result in cell_results(matrix_dir):
        record, folder = read_record(result), result.parent
        made = record.hardware if record is not None and record.finished else None
        expected = {ours[folder]} if folder in ours else beside.get(_side(folder, matrix_dir, by_variant=by_variant))
        if made is None or not expected or made in expected:
            continue
        names, runs = found.setdefault(made, ([], set()))
        parts = folder.relative_to(matrix_dir).parts
        names.append("/".join(parts[1:] if parts[0] == CELLS_DIR else (parts[0], *parts[2:])))
        runs.update(expected)
    return found


def refuse_other_hardware(cells: list[Cell], matrix_dir: Path, *, cuda: bool) -> None:
    """Raise :class:`OtherHardware`, before any cell trains (and in a dry run), where the results folder
    ``matrix_dir`` holds finished cells, reported or tuning, made on other hardware than this run's
    ``cells`` train at (see :func:`cells_on_other_hardware`): this run would overwrite them, and a
    later round or the report would read them beside this run's. A run on the same hardware, its
    resume and its reruns, never raises."""
    found = cells_on_other_hardware(cells, matrix_dir, cuda=cuda)
    if not found:
        return
    count = sum(len(names) for names, _ in found.values())
    made = hardware_listing({hardware: names for hardware, (names, _) in found.items()})
    runs = ", ".join(sorted({hardware.describe() for _, resolved in found.values() for hardware in resolved}))
    raise OtherHardware(
        f"{matrix_dir} holds {count} finished cell{'s' if count > 1 else ''} made on other hardware than this run's "
        f"({made}), and this run's cells resolve {runs}: training here would overwrite those cells or put seeds "
        f"of two kinds of device or precision side by side. {HARDWARE_WAYS_OUT}"
    )
