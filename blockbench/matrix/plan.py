"""What a matrix run will do before it does it: each cell's status (done, stale, resumable, to run)
and an estimate of the wall time; ``blockbench matrix --dry-run`` prints it, the runner starts from
it and updates the ETA as cells finish.

Where the time estimate of a cell comes from, best first:

1. ``measured``: cells of the same task and variant that ran on this machine: in this run (their whole
   process, start to exit, as the runner saw it), else earlier results in the matrix folder (their
   record's ``wall_time_breakdown`` total: the cell's process, start-up to the result);
2. ``scaled``: (the runner's ETA) a variant none of whose cells finished, timed in parts before the
   cells (3.), times the measured-to-timed ratio of the cells that finished (its task's, else all):
   what the timing missed, such as a machine busier than when it was timed;
3. ``timed``: a variant with no measured cell, its cell timed in parts before the run (the dry run, and
   the runner for its ETA; ``blockbench.matrix.timing``): a short fit in a process started as the
   cell's, beside as many as ``--jobs`` runs at once, scaled to the cell's steps, validations, loss-curve
   points and checkpoints, plus its process start, build and Lightning's set-up;
4. ``running``: (the runner's ETA, a variant whose timing failed) the pace that its training cells
   print in their train.log since this run began (training and validation, not start-up);
5. ``other variants``: the step time of the other variants of the cell's task, a rough guess;
6. ``other tasks``: the step time of the cells of other tasks, a rougher guess still;
7. unknown: no estimate (a cell whose data or model cannot be built here).

A matrix run's time is more than its cells': the process's start-up and planning, the cell server's
imports and the timing before the first cell, the report after the last
(:func:`blockbench.matrix.timing.report_seconds`). The dry run measures the first ones by doing them;
the cells run ``--jobs`` at a time, phase after phase (tuning rung after rung, then the reported cells),
as the runner's queue hands them out (:func:`blockbench.matrix.timing.makespan`).
"""

from __future__ import annotations

import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..config import RunConfig
from ..layout import CELL_FILE, CELLS_DIR, CHECKPOINT_DIR, RESULT_FILE, TRAIN_LOG, TUNE_DIR
from ..lifeline import LOCK_FILE
from ..lineage import NO_LINEAGE, Lineage
from ..progress import format_duration, pace_of_lines
from ..record import CellRecord, read_record
from .expand import Cell
from .jobs import forks
from .launch import start_server
from .say import say
from .timing import REPORT_SECONDS, CellTiming, cell_timer, makespan, report_seconds
from .tuning import TUNE

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


def plan_cells(
    cells: list[Cell],
    matrix_dir: Path,
    fingerprint: str,
    *,
    force: bool = False,
    reuse_stale: bool = False,
    start: int = 1,
    elsewhere: Mapping[str, Path] | None = None,
    lineage: Lineage = NO_LINEAGE,
) -> list[CellPlan]:
    """Each cell's status (see :func:`plan_cell`), in matrix order, numbered from ``start``."""
    return [
        plan_cell(
            n,
            cell,
            matrix_dir,
            fingerprint,
            force=force,
            reuse_stale=reuse_stale,
            elsewhere=elsewhere,
            lineage=lineage,
        )
        for n, cell in enumerate(cells, start)
    ]


def trained_elsewhere(results_root: Path, fingerprint: str, lineage: Lineage = NO_LINEAGE) -> dict[str, Path]:
    """Config hash -> the folder of a finished cell (ok or diverged) of any matrix under ``results_root``,
    reported or tuning, made by this code (``fingerprint``, or through the ``lineage``): a matrix that
    needs the same config copies it instead of training it again. The shared baselines (pre-norm, the
    dense FFN, learned positions) are the same config in every matrix of the book, so each trains once."""
    found: dict[str, Path] = {}
    for result in sorted(results_root.glob(f"*/{CELLS_DIR}/*/*/*/{RESULT_FILE}")) + sorted(
        results_root.glob(f"*/{TUNE_DIR}/{CELLS_DIR}/*/*/*/*/{RESULT_FILE}")
    ):
        record = read_record(result)
        if record is not None and record.finished and lineage.admits(record, fingerprint) and record.config_hash:
            found.setdefault(record.config_hash, result.parent)
    return found


#: what a copied cell folder leaves behind: its matrix's own files (cell.json names that matrix's
#: variant and axes), a live run's lock, and training state that a finished cell no longer needs
NOT_COPIED = (CELL_FILE, LOCK_FILE, CHECKPOINT_DIR, TRAIN_LOG)


def copy_cell(source: Path, cell_dir: Path) -> None:
    """Copy a finished cell's files from ``source`` into ``cell_dir`` (see :data:`NOT_COPIED`), the
    result last, so that a copy cut short has no result and is planned again."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    for item in sorted(source.iterdir(), key=lambda p: p.name == RESULT_FILE):
        if item.name in NOT_COPIED:
            continue
        if item.is_dir():
            shutil.copytree(item, cell_dir / item.name, dirs_exist_ok=True)
        else:
            shutil.copy2(item, cell_dir / item.name)


def plan_cell(
    n: int,
    cell: Cell,
    matrix_dir: Path,
    fingerprint: str,
    *,
    force: bool = False,
    reuse_stale: bool = False,
    elsewhere: Mapping[str, Path] | None = None,
    lineage: Lineage = NO_LINEAGE,
) -> CellPlan:
    """Whether ``cell`` is reused (done; stale with ``reuse_stale``, see :func:`reuse_earlier`), copied
    from another matrix that trained the same config with this code (``elsewhere``: config hash ->
    cell folder, see :func:`trained_elsewhere`), retrained (stale, failed before), resumed from a
    checkpoint of the same config and code, or trained from step 0. Reads only: the cell's training
    process clears what it cannot resume, and the runner copies."""
    cell_dir = cell.directory(matrix_dir)
    if force:
        return CellPlan(n, cell, TO_RUN, "--force: from step 0")
    reuse, message = reuse_earlier(cell, cell_dir, fingerprint, reuse_stale=reuse_stale, lineage=lineage)
    stale = message is not None and not message.startswith(REUSED)
    if reuse:
        return CellPlan(n, cell, STALE if stale else DONE, message or "", trains=False)
    source = (elsewhere or {}).get(cell.run.config_hash())
    if source is not None and source.resolve() != cell_dir.resolve():
        return CellPlan(n, cell, ELSEWHERE, f"done in {source}, copying its result", trains=False, source=source)
    status, detail = (STALE, message or "") if stale else (TO_RUN, "")
    earlier = earlier_record(cell_dir)
    if status == TO_RUN and earlier and earlier.status == "failed" and earlier.config_hash == cell.run.config_hash():
        status, detail = FAILED_BEFORE, f"failed before ({str(earlier.error)[:80]}), retrying"
    if (cell_dir / CHECKPOINT_DIR).is_dir():
        from ..cell.train import resumable_checkpoint  # imports Lightning: only where there is a checkpoint

        resume = resumable_checkpoint(
            cell_dir / CHECKPOINT_DIR, cell.run.config_hash(), fingerprint, delete_stale=False
        )
        if resume.checkpoint is not None:
            return CellPlan(n, cell, RESUMABLE, f"resumes from step {resume.step}", resume_step=resume.step)
        detail = "; ".join(filter(None, [detail, resume.error or resume.note]))
    return CellPlan(n, cell, status, detail)


#: what :func:`reuse_earlier` says of a result of this very code
REUSED = "done earlier"


def earlier_record(cell_dir: Path) -> CellRecord | None:
    """The record in the cell folder's result.json (of any status and config), if it can be read."""
    return read_record(cell_dir / RESULT_FILE)


def earlier_result(cell: Cell, cell_dir: Path) -> CellRecord | None:
    """The finished result (ok or diverged) of exactly this resolved config, if the cell has one."""
    result = earlier_record(cell_dir)
    return result if result and result.finished and result.config_hash == cell.run.config_hash() else None


def reuse_earlier(
    cell: Cell, cell_dir: Path, fingerprint: str, *, reuse_stale: bool = False, lineage: Lineage = NO_LINEAGE
) -> tuple[bool, str | None]:
    """Whether a matrix run reuses the cell's earlier result instead of training it, and what it says.

    A result is reused when its config is unchanged and it was made by this code (its
    ``code_fingerprint``, see :func:`blockbench.provenance.code_fingerprint`), or by code that the
    results folder's ``lineage`` shows gives this code's numbers (:mod:`blockbench.lineage`). A result
    of other code, or of code too old to record a fingerprint, is stale: retrained, unless ``reuse_stale``.
    """
    result = earlier_result(cell, cell_dir)
    if result is None:
        return False, None
    theirs = result.code_fingerprint
    if theirs == fingerprint:
        return True, f"{REUSED}, reusing its result"
    route = lineage.route(result, fingerprint)
    if route:
        return True, f"{REUSED} by code {str(theirs)[:12]}, the same numbers by lineage {route[-1].describe()}"
    change = f"code changed since its result (fingerprint {theirs[:12] if theirs else 'none'} -> {fingerprint[:12]})"
    return (True, f"{change}, reusing it (--reuse-stale)") if reuse_stale else (False, f"{change}, retraining")


# --- time ------------------------------------------------------------------------------------------

Key = tuple[str, str]
#: times the cells of some (task, variant)s: their timings, and why the others could not be timed
Timer = Callable[[dict[Key, RunConfig]], tuple[dict[Key, CellTiming], dict[Key, str]]]


def key_of(cell: Cell) -> Key:
    return cell.task, cell.variant


@dataclass
class TimeEstimator:
    """A cell's seconds, start-up to exit, from the best source of the module docstring, and the matrix
    run's own seconds before its first cell and after its last (see :func:`describe_total`)."""

    #: seconds per step of whole cells of each (task, variant): this run's processes, earlier records
    measured: dict[Key, list[float]] = field(default_factory=dict)
    #: each (task, variant)'s cell timed in parts (``blockbench.matrix.timing``)
    timings: dict[Key, CellTiming] = field(default_factory=dict)
    #: measured over timed seconds of this run's cells that have a timing
    ratios: dict[Key, list[float]] = field(default_factory=dict)
    #: the folders of each (task, variant)'s cells, where a training cell's train.log tells its pace
    directories: dict[Key, list[Path]] = field(default_factory=dict)
    #: when the run began: a train.log older than that is another run's (``--jobs 1`` writes none)
    started: float = field(default_factory=time.time)
    #: seconds of the run before its first cell (the dry run's: start-up, planning, cell server, timing)
    before: float = 0.0
    #: seconds of the run after its last cell (see :func:`blockbench.matrix.timing.report_seconds`)
    after: float = REPORT_SECONDS

    def add(self, cell: Cell, seconds: float, steps: int, from_step: int = 0) -> None:
        """A cell took ``seconds`` for ``steps`` optimizer steps from ``from_step``; with a timing of its
        variant, its measured-to-timed ratio is kept for the variants not measured yet."""
        if steps <= 0 or seconds <= 0:
            return
        key = key_of(cell)
        self.measured.setdefault(key, []).append(seconds / steps)
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
        timing = self.timings.get(key)
        if timing is not None:
            seconds = timing.seconds(cell.run.trainer, plan.resume_step)
            ratio = self.ratio(cell.task)
            return (seconds * ratio, "scaled") if ratio is not None else (seconds, "timed")
        pace = self.pace(cell) if guess else None
        return (pace[0] * steps, pace[1]) if pace else None

    def ratio(self, task: str) -> float | None:
        """The median measured-to-timed ratio of this run's cells of ``task``, else of all its cells:
        what the timings missed (another load on the machine, a part they scale wrongly)."""
        same = [r for (other, _), values in self.ratios.items() if other == task for r in values]
        ratios = same or [r for values in self.ratios.values() for r in values]
        return statistics.median(ratios) if ratios else None

    def pace(self, cell: Cell) -> tuple[float, str] | None:
        """(seconds per step, source) where the cell's variant was neither measured nor timed (a timing
        that failed): the pace its training cells print, else other variants', else other tasks'."""
        key = key_of(cell)
        running = [
            pace
            for directory in self.directories.get(key, [])
            if (pace := running_pace(directory, since=self.started)) is not None
        ]
        if running:  # a variant whose first cells are training: their pace so far
            return statistics.median(running), "running"
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
        for plan in plans:
            if (plan.trains or plan.status == IF_NEEDED) and self.estimate(plan, guess=False) is None:
                runs.setdefault(key_of(plan.cell), plan.cell.run)
        if not runs:
            return []
        timings, problems = timer(runs)
        self.timings.update(timings)
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


def later_rungs(plans: Sequence[CellPlan]) -> list[tuple[CellPlan, int]]:
    """The tuning cells listed IF_NEEDED that successive halving trains when every candidate finishes (the
    better half of a rung, rounded up, at the next: of three candidates and two tuning seeds, two of the
    three cells listed for the second seed), each as a plan that trains, with its rung (its seed's place
    among the variant's tuning seeds); fewer train only where candidates fail."""
    variants: dict[Key, list[CellPlan]] = {}
    for plan in plans:
        if plan.cell.phase == TUNE:
            variants.setdefault(key_of(plan.cell), []).append(plan)
    expected = []
    for group in variants.values():
        candidates = len({plan.cell.candidate for plan in group})
        for rung, seed in enumerate(dict.fromkeys(plan.cell.seed for plan in group)):
            listed = [plan for plan in group if plan.cell.seed == seed]
            waiting = [plan for plan in listed if plan.status == IF_NEEDED]
            wanted = -(-candidates // 2**rung) - (len(listed) - len(waiting))  # ceil(c / 2^rung), less those planned
            expected += [(replace(plan, trains=True), rung) for plan in waiting[: max(0, wanted)]]
    return sorted(expected, key=lambda item: item[0].n)


def phase_of(plan: CellPlan, rung: int = 0) -> tuple[int, int]:
    """The order of the plan's phase: tuning rung after rung, then the reported cells; a phase's first
    cell waits for the last cell of the one before."""
    return (0, rung) if plan.cell.phase == TUNE else (1, 0)


def cells_seconds(plans: Sequence[tuple[CellPlan, int]], seconds: Sequence[float], jobs: int) -> float:
    """Seconds of the cells of ``plans`` (each a plan and its tuning rung; each ``seconds``) on ``jobs``
    slots, phase after phase."""
    phases: dict[tuple[int, int], list[float]] = {}
    for (plan, rung), value in zip(plans, seconds, strict=True):
        phases.setdefault(phase_of(plan, rung), []).append(value)
    return sum(makespan(values, jobs) for _, values in sorted(phases.items()))


def describe_total(plans: list[CellPlan], estimator: TimeEstimator, jobs: int = 1) -> str:
    """The time the run takes first, then what it trains, then what it may add:
    ``about 0:21:30 on this machine to train 12 cells (2 resume), 6 reused (cells ...; from ...)``, and
    where more may train, ``; if needed up to 1:10:00 more, for up to 18 more cells (later tuning
    rungs, seeds for undecided verdicts)``. In a matrix with ``tune:`` the estimate covers both phases
    (``24 cells (6 tuning, 18 after tuning)``) and the later tuning rungs that train when every
    candidate finishes (:func:`later_rungs`). The cells run ``jobs`` at a time, phase after phase
    (``blockbench.matrix.timing.makespan``); the run's own seconds before and after them are the
    estimator's."""
    training = [plan for plan in plans if plan.trains]
    kinds = {
        "tuning": sum(plan.cell.phase == TUNE for plan in training),
        AFTER_TUNING: sum(plan.status == AFTER_TUNING for plan in training),
        "resume": sum(plan.status == RESUMABLE for plan in training),
    }
    parts = [f"{count} {kind}" for kind, count in kinds.items() if count]
    counts = f"{len(training)} cell{'s' if len(training) != 1 else ''}" + (f" ({', '.join(parts)})" if parts else "")
    reused = sum(not plan.trains and plan.status not in (NO_CHOICE, IF_NEEDED, ELSEWHERE) for plan in plans)
    copied = sum(plan.status == ELSEWHERE for plan in plans)
    unchosen = sum(plan.status == NO_CHOICE for plan in plans)
    others = [f"{reused} reused"] if reused else []
    others += [f"{copied} copied from other matrices (same config and code)"] if copied else []
    others += [f"{unchosen} without a tuned value (they fail: no candidate finished)"] if unchosen else []
    counts += "".join(f", {text}" for text in others)
    maybe = ""
    listed = sum(plan.status == IF_NEEDED for plan in plans)
    if listed:
        seeds = [replace(plan, trains=True) for plan in plans if plan.status == IF_NEEDED and plan.cell.phase != TUNE]
        more = [(plan, seconds) for plan in seeds if (seconds := estimator.seconds(plan)) is not None]
        extra = cells_seconds([(plan, 0) for plan, _ in more], [seconds for _, seconds in more], jobs) if more else 0
        maybe = f"; if needed up to {format_duration(extra)} more" if more else "; if needed"
        maybe += f", for up to {listed} more cells (later tuning rungs, seeds for undecided verdicts)"
    rungs = later_rungs(plans)
    if not training and not rungs:
        return "nothing to train" + (f": {', '.join(others)}" if others else "") + maybe
    cells = [(plan, 0) for plan in training] + rungs
    estimates = [estimator.estimate(plan) for plan, _ in cells]
    known = [(cell, estimate) for cell, estimate in zip(cells, estimates, strict=True) if estimate is not None]
    if not known:
        return f"{counts} to train; no time estimate (nothing measured or timed here yet){maybe}"
    seconds = cells_seconds([cell for cell, _ in known], [estimate[0] for _, estimate in known], jobs)
    how = {
        "measured": "cells that ran here, start-up to exit",
        "scaled": "cells timed here in parts, scaled by the measured-to-timed ratio of the cells that ran",
        "timed": "cells timed here in parts: start-up, build, steps, validations, loss curve, checkpoints",
        "running": "the pace that the training cells of variants none of whose cells finished print",
        "other variants": "other variants' step times for variants none of whose cells ran yet",
        "other tasks": "other tasks' step times for tasks none of whose cells ran yet",
    }
    sources = sorted({estimate[1] for _, estimate in known})
    total = estimator.before + seconds + estimator.after
    text = f"about {format_duration(total)} on this machine" + (f" with --jobs {jobs}" if jobs > 1 else "")
    text += f" to train {counts}"
    spent = [f"cells {format_duration(seconds)}" + (f", {jobs} at a time" if jobs > 1 else "")]
    spent[0] += f", with {len(rungs)} of later tuning rungs" if rungs else ""
    spent += [f"before them {format_duration(estimator.before)}"] if estimator.before else []
    spent += [f"report and exit {format_duration(estimator.after)}"] if estimator.after else []
    text += f" ({' + '.join(spent)}; from {'; '.join(how[source] for source in sources)})"
    if len(known) < len(estimates):
        text += f"; {len(estimates) - len(known)} cell(s) without an estimate"
    return text + maybe


class MatrixProgress:
    """The matrix's progress line: cells done of those to train, the time since the run started and
    an ETA for the rest: each cell's estimate (:class:`TimeEstimator`: the whole processes of the cells
    done so far, the same task and variant first, else its timing), the cells run ``jobs`` at a time
    phase after phase (``blockbench.matrix.timing.makespan``), then the report. Thread-safe: under
    ``--jobs`` cells start and finish in worker threads."""

    def __init__(self, plans: list[CellPlan], estimator: TimeEstimator, jobs: int):
        """``plans``: the run's plans; those that train are counted, and the later tuning rungs that will
        (:func:`later_rungs`) are in the ETA until they are planned."""
        self.plans = {plan.n: plan for plan in plans if plan.trains}
        self.expected = later_rungs(plans)
        self.estimator = estimator
        self.jobs = jobs
        self.start_time = time.perf_counter()
        self.started: dict[int, float] = {}
        self.finished: set[int] = set()
        self._lock = threading.Lock()

    def start(self, n: int) -> CellPlan:
        with self._lock:
            self.started[n] = time.perf_counter()
        return self.plans[n]

    def revise(self, plans: list[CellPlan]) -> None:
        """New plans of cells that have not started: a tuning rung's (its expected cells then leave the
        ETA), the reported cells once tuning has chosen their values (those now reused, or without a
        choice, leave the count; tuning has ended), a later round's."""
        with self._lock:
            rung = {plan.cell.seed for plan in plans if plan.cell.phase == TUNE}
            self.expected = [(plan, r) for plan, r in self.expected if rung and plan.cell.seed not in rung]
            for plan in plans:
                if plan.n in self.started:
                    continue
                if plan.trains:
                    self.plans[plan.n] = plan
                else:
                    self.plans.pop(plan.n, None)

    def finish(self, n: int, result: CellRecord) -> float:
        """Record cell ``n``'s end; return its seconds."""
        with self._lock:
            seconds = time.perf_counter() - self.started[n]
            self.finished.add(n)
            from_step = result.resumed_from_step or 0
            self.estimator.add(self.plans[n].cell, seconds, (result.steps or 0) - from_step, from_step)
        return seconds

    def eta(self) -> float | None:
        """Seconds until the run ends: the cells not finished (a running one: its estimate less the time
        it has had) and the later tuning rungs expected, on the ``jobs`` slots phase after phase, then the
        report; None while a cell has no estimate."""
        now = time.perf_counter()
        phases: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        with self._lock:
            left = [(plan, 0) for n, plan in sorted(self.plans.items()) if n not in self.finished] + self.expected
            for plan, rung in left:
                estimate = self.estimator.seconds(plan)
                if estimate is None:
                    return None
                queued, busy = phases.setdefault(phase_of(plan, rung), ([], []))
                if plan.n in self.started and self.plans.get(plan.n) is plan:
                    busy.append(max(0.0, estimate - (now - self.started[plan.n])))
                else:
                    queued.append(estimate)
        cells = sum(makespan(queued, self.jobs, busy) for _, (queued, busy) in sorted(phases.items()))
        return cells + self.estimator.after

    def describe(self) -> str:
        """``3/12 trained, 5:40 elapsed, ETA 17:00``."""
        eta = self.eta()
        elapsed = format_duration(time.perf_counter() - self.start_time)
        text = f"{len(self.finished)}/{len(self.plans)} trained, {elapsed} elapsed"
        return text + (
            f", ETA {format_duration(eta)}" if eta is not None and len(self.finished) < len(self.plans) else ""
        )


def time_before_the_cells(plans: Sequence[CellPlan], estimator: TimeEstimator, timer: Timer, jobs: int) -> float:
    """``--dry-run``: what the run will do before its first cell, done here and timed: the cell server's
    start (its imports), and the timing of the variants with nothing measured (the runner times them too,
    for its ETA); return its seconds."""
    start = time.perf_counter()
    may_train = [plan for plan in plans if plan.trains or plan.status == IF_NEEDED]
    if any(forks(plan.cell.run) for plan in may_train):
        start_server()
    untimed = {key_of(p.cell) for p in may_train if estimator.estimate(p, guess=False) is None}
    if untimed:
        say(
            f"timing a cell of each of {len(untimed)} variant(s) with no earlier results here (a short fit: its "
            f"build, steps, validations, a checkpoint{f'; {jobs} at a time' if jobs > 1 else ''})..."
        )
        for problem in estimator.time(plans, timer):
            say(f"  {problem}")
    return time.perf_counter() - start


def print_plan(
    name: str,
    matrix_dir: Path,
    plans: list[CellPlan],
    estimator: TimeEstimator,
    jobs: int,
    notes: Sequence[str] = (),
    *,
    started: float = 0.0,
    timer: Timer | None = None,
) -> int:
    """``--dry-run``: every cell validated (load_matrix did), its status and estimated time, ``notes``
    (the tuned values already known), the total; the variants to train without a measured figure are
    timed first (``timer``, default :func:`blockbench.matrix.timing.cell_timer`: ``jobs`` at a time),
    after the cell server is started, both as the run will do them. ``started``: the seconds this process
    has run so far (its start-up and the planning, which the run repeats). Writes nothing under the
    results (the timings work in a temporary folder)."""
    tuning = sum(plan.cell.phase == TUNE for plan in plans)
    counted = (
        f"{len(plans)} cells ({tuning} tuning, {len(plans) - tuning} reported)" if tuning else f"{len(plans)} cells"
    )
    say(f"matrix {name}: {counted} -> {matrix_dir} (dry run: every cell validated, nothing trained)")
    estimator.before = started + time_before_the_cells(plans, estimator, timer or cell_timer(jobs), jobs)
    width = max(len(f"[{plan.n}/{len(plans)}] {plan.cell.key}") for plan in plans)
    for plan in plans:
        seconds = estimator.seconds(plan)
        time_text = "" if not plan.trains else ("~?" if seconds is None else f"~{format_duration(seconds)}")
        detail = f"  ({plan.detail})" if plan.detail else ""
        say(f"{f'[{plan.n}/{len(plans)}] {plan.cell.key}':<{width}}  {plan.status:<13} {time_text:>9}{detail}")
    for note in notes:
        say(note)
    say(describe_total(plans, estimator, jobs))
    return 0
