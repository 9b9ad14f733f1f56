"""What a matrix run will do before it does it: each cell's status (done, stale, resumable, to run)
and an estimate of the wall time; ``blockbench matrix --dry-run`` prints it, the runner starts from
it and updates the ETA as cells finish.

Where the time estimate of a cell comes from, best first:

1. ``measured``: cells of the same task and variant that ran on this machine: in this run (the
   whole process, start-up and validation included), else earlier results in the matrix folder
   (their ``wall_time_s``: training and validation, not the process start-up);
2. ``scaled``: (``--dry-run`` only) a variant none of whose cells ran, of a task of which others
   did: its timed training step times the measured-to-timed ratio of those others, so a variant
   three times as slow (additive attention) is estimated three times as slow, with the same
   share of validation and start-up;
3. ``timed``: a few forward and backward passes of the cell's model on one training batch, timed
   here (``--dry-run`` only): training steps alone, validation and start-up come on top;
4. ``running``: (the runner's ETA under ``--jobs``) a variant none of whose cells has finished but
   some are training: the pace their progress lines print in their train.log since this run began
   (training and validation, not start-up), so a slow variant's first cells are not given their
   task's pace;
5. ``other variants``: the step time of the other variants of the cell's task, a rough guess that
   lets the runner give an ETA before a cell of each variant has finished;
6. ``other tasks``: the step time of the cells of other tasks, a rougher guess still;
7. unknown: no estimate (a cell whose data or model cannot be built here).
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
from ..progress import format_duration, pace_of_lines
from ..record import CellRecord, read_record
from .expand import Cell
from .say import say
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
) -> list[CellPlan]:
    """Each cell's status (see :func:`plan_cell`), in matrix order, numbered from ``start``."""
    return [
        plan_cell(n, cell, matrix_dir, fingerprint, force=force, reuse_stale=reuse_stale, elsewhere=elsewhere)
        for n, cell in enumerate(cells, start)
    ]


def trained_elsewhere(results_root: Path, fingerprint: str) -> dict[str, Path]:
    """Config hash -> the folder of a finished cell (ok or diverged) of any matrix under ``results_root``,
    reported or tuning, made by this code (``fingerprint``): a matrix that needs the same config copies it
    instead of training it again. The shared baselines (pre-norm, the dense FFN, learned positions) are
    the same config in every matrix of the book, so each trains once."""
    found: dict[str, Path] = {}
    for result in sorted(results_root.glob(f"*/{CELLS_DIR}/*/*/*/{RESULT_FILE}")) + sorted(
        results_root.glob(f"*/{TUNE_DIR}/{CELLS_DIR}/*/*/*/*/{RESULT_FILE}")
    ):
        record = read_record(result)
        if record is not None and record.finished and record.code_fingerprint == fingerprint and record.config_hash:
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
) -> CellPlan:
    """Whether ``cell`` is reused (done; stale with ``reuse_stale``, see :func:`reuse_earlier`), copied
    from another matrix that trained the same config with this code (``elsewhere``: config hash ->
    cell folder, see :func:`trained_elsewhere`), retrained (stale, failed before), resumed from a
    checkpoint of the same config and code, or trained from step 0. Reads only: the cell's training
    process clears what it cannot resume, and the runner copies."""
    cell_dir = cell.directory(matrix_dir)
    if force:
        return CellPlan(n, cell, TO_RUN, "--force: from step 0")
    reuse, message = reuse_earlier(cell, cell_dir, fingerprint, reuse_stale=reuse_stale)
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
    cell: Cell, cell_dir: Path, fingerprint: str, *, reuse_stale: bool = False
) -> tuple[bool, str | None]:
    """Whether a matrix run reuses the cell's earlier result instead of training it, and what it says.

    A result is reused when its config is unchanged and it was made by this code (its
    ``code_fingerprint``, see :func:`blockbench.provenance.code_fingerprint`). A result of other code,
    or of code too old to record a fingerprint, is stale: retrained, unless ``reuse_stale``.
    """
    result = earlier_result(cell, cell_dir)
    if result is None:
        return False, None
    theirs = result.code_fingerprint
    if theirs == fingerprint:
        return True, f"{REUSED}, reusing its result"
    change = f"code changed since its result (fingerprint {theirs[:12] if theirs else 'none'} -> {fingerprint[:12]})"
    return (True, f"{change}, reusing it (--reuse-stale)") if reuse_stale else (False, f"{change}, retraining")


# --- time ------------------------------------------------------------------------------------------


@dataclass
class TimeEstimator:
    """Seconds per optimizer step of each (task, variant), from cells that ran (see the module
    docstring); a cell's estimate is its steps to train times the best-matching figure."""

    measured: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    timed: dict[tuple[str, str], float] = field(default_factory=dict)
    #: the folders of each (task, variant)'s cells, where a training cell's train.log tells its pace
    directories: dict[tuple[str, str], list[Path]] = field(default_factory=dict)
    #: when the run began: a train.log older than that is another run's (``--jobs 1`` writes none)
    started: float = field(default_factory=time.time)

    def add(self, cell: Cell, seconds: float, steps: int) -> None:
        """A cell of this run took ``seconds`` for ``steps`` optimizer steps."""
        if steps > 0 and seconds > 0:
            self.measured.setdefault((cell.task, cell.variant), []).append(seconds / steps)

    def add_results(self, cells: Iterable[Cell], matrix_dir: Path) -> None:
        """Earlier results in the matrix folder, whatever code made them: step times change little."""
        for cell in cells:
            directory = cell.directory(matrix_dir)
            self.directories.setdefault((cell.task, cell.variant), []).append(directory)
            record = earlier_timing(directory)
            if record:
                self.add(cell, *record)

    def per_step(self, cell: Cell, *, guess: bool = True) -> tuple[float, str] | None:
        """(seconds per step, source) for ``cell``, or None; ``guess``: fall back on the pace of other
        variants and tasks (those that were not timed, for the runner's ETA)."""
        key = (cell.task, cell.variant)
        same_variant = self.measured.get(key)
        if same_variant:
            return statistics.median(same_variant), "measured"
        if key in self.timed:
            # measured over timed of the task's other variants: the share of validation and start-up
            ratios = [
                statistics.median(values) / self.timed[other]
                for other, values in self.measured.items()
                if other[0] == cell.task and self.timed.get(other)
            ]
            if ratios:
                return self.timed[key] * statistics.median(ratios), "scaled"
            return self.timed[key], "timed"
        if not guess:
            return None
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
        if not plan.trains:
            return 0.0
        per_step = self.per_step(plan.cell)
        return per_step[0] * plan.steps_to_train if per_step else None

    def time_steps(self, plans: Iterable[CellPlan], timer: Callable[[RunConfig], float]) -> list[str]:
        """Time with ``timer`` each (task, variant) to train that has no measured figure, and one
        measured variant of each such task (the reference that scales the timings to whole cells);
        return the problems of those that could not be timed."""
        plans = list(plans)
        to_time = {
            (plan.cell.task, plan.cell.variant): plan.cell
            for plan in plans
            if plan.trains and self.per_step(plan.cell, guess=False) is None
        }
        tasks = {task for task, _ in to_time}
        for plan in plans:  # the reference: the first measured variant of the task, done or not
            key = (plan.cell.task, plan.cell.variant)
            if plan.cell.task in tasks and key in self.measured:
                tasks.discard(plan.cell.task)
                if key not in self.timed:
                    to_time[key] = plan.cell
        problems = []
        for key, cell in to_time.items():  # none timed yet: per_step would have found its figure
            try:
                self.timed[key] = timer(cell.run)
            except Exception as error:  # e.g. a data set that is not on this machine
                self.timed[key] = None  # type: ignore[assignment]  # tried once
                problems.append(f"{cell.task}/{cell.variant}: not timed ({type(error).__name__}: {error})")
        self.timed = {key: value for key, value in self.timed.items() if value is not None}
        return problems


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


def earlier_timing(cell_dir: Path) -> tuple[float, int] | None:
    """(wall_time_s, steps) of a finished earlier result in ``cell_dir``, if there is one."""
    result = earlier_record(cell_dir)
    if not result or not result.finished or not result.wall_time_s or not result.steps:
        return None
    return float(result.wall_time_s), int(result.steps)


def time_training_step(run: RunConfig, *, repeats: int = 3) -> float:
    """Seconds of one optimizer step of ``run``'s model on one of its training batches: the fastest of
    ``repeats`` forward and backward passes after a warm-up (the least disturbed by other processes), times the
    accumulation steps (the optimizer update itself is a small share and left out). Builds the task's data as a cell
    does."""
    import torch

    trainer = run.trainer
    previous_threads = torch.get_num_threads()
    if trainer.num_threads:
        torch.set_num_threads(trainer.num_threads)
    try:
        torch.manual_seed(run.seed)  # the model and the batch a cell starts with
        module, datamodule = run.task.build(
            run.resolved_model(),
            run.optimizer,
            max_steps=trainer.max_steps,
            batch_size=trainer.per_device_batch_size(1),
        )
        datamodule.prepare_data()
        datamodule.setup("fit")
        batch = next(iter(datamodule.train_dataloader()))
        module.train()
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            module.training_loss(batch).backward()
            times.append(time.perf_counter() - start)
            module.zero_grad(set_to_none=True)
        return min(times[1:]) * trainer.accumulate_grad_batches
    finally:
        torch.set_num_threads(previous_threads)


def describe_total(plans: list[CellPlan], estimator: TimeEstimator, jobs: int = 1) -> str:
    """``12 to train (2 resume), 6 done: about 21:30 on this machine`` plus where the figure comes from;
    in a matrix with ``tune:`` the estimate covers both phases (``24 to train (6 tuning, 18 after
    tuning)``)."""
    training = [plan for plan in plans if plan.trains]
    counts = f"{len(training)} to train"
    kinds = {
        "tuning": sum(plan.cell.phase == TUNE for plan in training),
        AFTER_TUNING: sum(plan.status == AFTER_TUNING for plan in training),
        "resume": sum(plan.status == RESUMABLE for plan in training),
    }
    parts = [f"{count} {kind}" for kind, count in kinds.items() if count]
    counts += f" ({', '.join(parts)})" if parts else ""
    reused = sum(not plan.trains and plan.status not in (NO_CHOICE, IF_NEEDED, ELSEWHERE) for plan in plans)
    counts += f", {reused} reused" if reused else ""
    copied = sum(plan.status == ELSEWHERE for plan in plans)
    counts += f", {copied} copied from other matrices (same config and code)" if copied else ""
    unchosen = sum(plan.status == NO_CHOICE for plan in plans)
    counts += f", {unchosen} without a tuned value (they fail: no candidate finished)" if unchosen else ""
    maybe = [replace(plan, trains=True) for plan in plans if plan.status == IF_NEEDED]
    if maybe:
        more = [seconds for plan in maybe if (seconds := estimator.seconds(plan)) is not None]
        counts += f"; up to {len(maybe)} more if needed (later tuning rungs, seeds for undecided verdicts)" + (
            f", up to +{format_duration(sum(more) / jobs)}" if more else ""
        )
    if not training:
        return counts
    estimates = [estimator.seconds(plan) for plan in training]
    known = [seconds for seconds in estimates if seconds is not None]
    if not known:
        return f"{counts}; no time estimate (nothing measured or timed here yet)"
    sources = {estimator.per_step(plan.cell)[1] for plan in training if estimator.per_step(plan.cell)}
    how = {
        "measured": "step times of cells that ran here",
        "scaled": "timed training steps, scaled by the measured-to-timed ratio of the task's variants that ran here",
        "timed": "timed training steps, validation and start-up not included",
        "running": "the pace that the training cells of variants none of whose cells finished print",
        "other variants": "other variants' step times for variants none of whose cells ran yet",
        "other tasks": "other tasks' step times for tasks none of whose cells ran yet",
    }
    total = sum(known) / jobs
    text = f"{counts}: about {format_duration(total)} on this machine" + (f" with --jobs {jobs}" if jobs > 1 else "")
    text += f" (from {'; '.join(how[source] for source in sorted(sources))})"
    if len(known) < len(estimates):
        text += f"; {len(estimates) - len(known)} cell(s) without an estimate"
    return text


class MatrixProgress:
    """The matrix's progress line: cells done of those to train, the time since the run started and
    an ETA for the rest, from the step times of the cells done so far (their whole process: start-up,
    training, validation), the same task and variant first (see :class:`TimeEstimator`).
    Thread-safe: under ``--jobs`` cells start and finish in worker threads."""

    def __init__(self, plans: list[CellPlan], estimator: TimeEstimator, jobs: int):
        self.plans = {plan.n: plan for plan in plans}
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
        """New plans of cells that have not started: the reported cells once tuning has chosen their
        values (those now reused, or without a choice, leave the count)."""
        with self._lock:
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
            trained = (result.steps or 0) - (result.resumed_from_step or 0)
            self.estimator.add(self.plans[n].cell, seconds, trained)
        return seconds

    def eta(self) -> float | None:
        """Seconds until every cell is done: the estimates of the cells not finished (less the time
        the running ones have had), shared by the ``jobs`` slots; None while nothing is known."""
        now, left = time.perf_counter(), 0.0
        with self._lock:
            for n, plan in self.plans.items():
                if n in self.finished:
                    continue
                estimate = self.estimator.seconds(plan)
                if estimate is None:
                    return None
                left += max(0.0, estimate - (now - self.started[n])) if n in self.started else estimate
        return left / min(self.jobs, max(1, len(self.plans) - len(self.finished)))

    def describe(self) -> str:
        """``3/12 trained, 5:40 elapsed, ETA 17:00``."""
        eta = self.eta()
        elapsed = format_duration(time.perf_counter() - self.start_time)
        text = f"{len(self.finished)}/{len(self.plans)} trained, {elapsed} elapsed"
        return text + (
            f", ETA {format_duration(eta)}" if eta is not None and len(self.finished) < len(self.plans) else ""
        )


def print_plan(
    name: str, matrix_dir: Path, plans: list[CellPlan], estimator: TimeEstimator, jobs: int, notes: Sequence[str] = ()
) -> int:
    """``--dry-run``: every cell validated (load_matrix did), its status and estimated time, ``notes``
    (the tuned values already known), the total; the cells to train without a measured step time are
    timed on one batch first. Writes nothing."""
    tuning = sum(plan.cell.phase == TUNE for plan in plans)
    counted = (
        f"{len(plans)} cells ({tuning} tuning, {len(plans) - tuning} reported)" if tuning else f"{len(plans)} cells"
    )
    say(f"matrix {name}: {counted} -> {matrix_dir} (dry run: every cell validated, nothing trained)")
    untimed = {
        (p.cell.task, p.cell.variant) for p in plans if p.trains and estimator.per_step(p.cell, guess=False) is None
    }
    if untimed:
        say(f"timing a training step of {len(untimed)} variant(s) with no earlier results here...")
        for problem in estimator.time_steps(plans, time_training_step):
            say(f"  {problem}")
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
