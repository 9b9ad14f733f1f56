"""A matrix run's rounds trained: each round's cells, ``--jobs`` at a time here or as cluster jobs, then
the schedule asked for the next (:mod:`blockbench.matrix.schedule`), and each phase's record for
``matrix_run.json`` (:class:`PhaseRecord`)."""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..durations import format_duration
from ..provenance import code_fingerprint
from ..store.files import record_untrained
from ..store.layout import TRAIN_LOG, TUNE_FILE
from ..store.record import CellRecord, HeadroomCheck, RunCell, RunPhase, write_headroom, write_tuning
from ..store.reuse import ReuseRule, copy_cell
from ..walltime import WallClock
from .devices import DevicePool, devices_per_cell
from .estimate.total import MatrixProgress
from .expand import Cell, Expansion
from .headroom import HeadroomPhase, headroom_check
from .jobs import Slot, cell_file, describe_outcome, run_cell, run_cells_as_jobs, write_cell_file
from .launch import stopping
from .plan import ELSEWHERE, NO_CHOICE, CellPlan, MatrixPlan, plan_cells, plan_reported
from .say import say
from .schedule import Results, Schedule, SeedRounds, TuningRungs
from .topgrid import top_grids
from .tuning import REPORT, TUNE, Tuning, tuning_record

#: the phase of a ladder's headroom check in ``matrix_run.json``
HEADROOM = "headroom"


@dataclass(frozen=True)
class RoundRecord:
    """One round: its cells, those trained, and its seconds."""

    cells: int
    trained: int
    wall_time_s: float


def merge_rounds(records: list[RoundRecord]) -> RunPhase:
    """One phase's record for ``matrix_run.json`` from its rounds' (cells, trained, seconds summed)."""
    return RunPhase(
        cells=sum(r.cells for r in records),
        trained=sum(r.trained for r in records),
        wall_time_s=round(sum(r.wall_time_s for r in records), 1),
        rounds=len(records),
    )


@dataclass
class Rounds:
    """Trains a run's rounds and keeps what ``matrix_run.json`` records of them: the cells that failed,
    each trained cell's seconds as seen from here (in the order they ended) and each phase's record."""

    matrix_dir: Path
    path: Path
    options: object  # blockbench.matrix.run.RunOptions: force, launcher, cluster_options
    jobs: int
    slots: list[Slot]
    gpus: list[str]
    needs: dict[str, int]
    progress: MatrixProgress
    clock: WallClock
    per_gpu: int = 1  # single-GPU cells sharing one GPU (blockbench.matrix.devices.DevicePool)
    n_cells: int = 0
    failed: list[str] = field(default_factory=list)
    cell_times: list[RunCell] = field(default_factory=list)
    phases: dict[str, RunPhase] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free_slots: queue.SimpleQueue[Slot] = queue.SimpleQueue()
        for slot in self.slots:
            self.free_slots.put(slot)
        self.devices = DevicePool(self.gpus, self.per_gpu)

    @property
    def tune_file(self) -> Path:
        return self.matrix_dir / TUNE_FILE

    def trained(self) -> int:
        return sum(phase.trained for phase in self.phases.values())

    def train(self, n: int, cell: Cell) -> None:
        """Train cell ``n`` in a free slot, on whole devices (waiting for them if need be)."""
        slot = self.free_slots.get()
        gpus = self.gpus
        need = self.needs.get(cell.key) or devices_per_cell(cell.run, len(gpus)) if gpus else 0
        taken = self.devices.take(need) if gpus else None
        if taken is not None:
            slot = replace(slot, devices=tuple(taken))
        try:
            if stopping():  # the runner is being terminated: this cell stays as it is and resumes next time
                raise KeyboardInterrupt
            prefix = f"[{n}/{self.n_cells}] {cell.key}"
            plan = self.progress.start(n)
            say(f"{prefix}: training" + (f" ({plan.detail})" if plan.status == "resumable" else ""))
            log_file = cell.directory(self.matrix_dir) / TRAIN_LOG if self.jobs > 1 else None
            if log_file:
                log_file.parent.mkdir(parents=True, exist_ok=True)
            result = run_cell(cell, self.matrix_dir, self.path, slot=slot, log_file=log_file, fresh=self.options.force)
            if result.status == "failed":
                self.failed.append(cell.key)
            took = self.progress.finish(n, result)  # its process, spawn to exit, and the file writes around it
            # the summary reads the reported cells' results: a tuning cell's breakdown comes from here
            breakdown = {"wall_time_breakdown": result.wall_time_breakdown} if cell.phase == TUNE else {}
            phase = {"phase": cell.phase} if cell.phase else {}
            self.cell_times.append(RunCell(key=cell.key, seconds=round(took, 2), **phase, **breakdown))
            say(f"{prefix}: {describe_outcome(result)} in {format_duration(took)}  |  {self.progress.describe()}")
        finally:
            if taken:
                self.devices.give_back(taken)
            self.free_slots.put(replace(slot, devices=None))

    def run_round(self, plans: list[CellPlan]) -> RoundRecord:
        """Train the cells of ``plans`` that need it (``jobs`` at a time, or as cluster jobs), copying
        those another matrix trained; return the round's record."""
        started = time.perf_counter()
        for plan in plans:
            if plan.detail and (not plan.trains or plan.status != "resumable"):  # resuming is said as it starts
                say(f"[{plan.n}/{self.n_cells}] {plan.cell.key}: {plan.detail}")
            if plan.status == ELSEWHERE and plan.source is not None:
                copy_cell(plan.source, plan.cell.directory(self.matrix_dir))
                write_cell_file(plan.cell, self.matrix_dir, self.path)
        todo = [(plan.n, plan.cell) for plan in plans if plan.trains]
        options = self.options
        with self.clock.part("cells"):
            if options.launcher != "local":
                cluster = {"slurm": "slurm", "submitit-local": "local"}[options.launcher]
                self.failed.extend(
                    run_cells_as_jobs(
                        todo,
                        self.n_cells,
                        self.matrix_dir,
                        self.path,
                        cluster=cluster,
                        options=options.cluster_options,
                        fresh=options.force,
                    )
                )
            else:
                pool = ThreadPoolExecutor(max_workers=self.jobs)
                try:
                    for future in [pool.submit(self.train, n, cell) for n, cell in todo]:
                        future.result()
                finally:  # on Ctrl-C running cells stop too; queued ones never start
                    pool.shutdown(wait=True, cancel_futures=True)
        return RoundRecord(len(plans), len(todo), round(time.perf_counter() - started, 1))

    def add_plans(self, cells: list[Cell], rule: ReuseRule) -> list[CellPlan]:
        """Plans for cells a later round needs, numbered after every plan so far."""
        new = plan_cells(cells, self.matrix_dir, rule, start=self.n_cells + 1)
        self.n_cells += len(new)
        self.progress.revise(new)
        return new

    def run_schedule(
        self, first: list[CellPlan], schedule: Schedule, results: Results, rule: ReuseRule
    ) -> list[RoundRecord]:
        """The first round's ``first`` plans, then each round ``schedule`` asks for, until it asks for none."""
        records = [self.run_round(first)]
        while True:
            with self.clock.part("planning"):
                cells = schedule.next_cells(results)
            if cells is None:
                return records
            say(schedule.describe(cells))
            records.append(self.run_round(self.add_plans(cells, rule)))

    def headroom(
        self, plans: list[CellPlan], phase: HeadroomPhase, results: Results, rule: ReuseRule, expansion: Expansion
    ) -> HeadroomCheck:
        """A ladder's headroom check first (:mod:`blockbench.matrix.headroom`): the ``plans`` of its cells
        trained (or reused), the check decided from their results and recorded in ``headroom.json``."""
        self.progress.take(plans)
        self.phases[HEADROOM] = merge_rounds(self.run_schedule(plans, phase, results, rule))
        check = headroom_check(expansion, phase.cells, results)
        write_headroom(self.matrix_dir, check)
        for task in check.tasks:
            distance = "" if task.distance is None else f", {task.distance:.3g} from the best ({task.status})"
            say(f"headroom: {task.task}: {task.cell}{distance}{f'; {task.detail}' if task.detail else ''}")
        return check

    def tune(
        self, first: list[CellPlan], rungs: TuningRungs, results: Results, rule: ReuseRule, expansion: Expansion
    ) -> dict[tuple[str, str], Tuning]:
        """Successive halving, rung by rung, until every variant's tuning is complete; its choices
        recorded in ``tune.json``."""
        self.phases[TUNE] = merge_rounds(self.run_schedule(first, rungs, results, rule))
        matrix = expansion.matrix
        grids = top_grids(expansion, rungs.tunings)
        record = tuning_record(matrix.tune, matrix.tune_seeds, list(rungs.tunings.values()), grids)
        write_tuning(self.matrix_dir, record)
        for tuned in rungs.tunings.values():
            say(f"tuned {tuned.describe()}")
        return rungs.tunings

    def plan_reported_after_tuning(
        self, expansion: Expansion, plan: MatrixPlan, tunings: dict[tuple[str, str], Tuning], rule: ReuseRule
    ) -> list[CellPlan]:
        """The first round's reported cells at the values tuning chose, at the numbers they were planned
        with before tuning (counted in ``n_cells``), so that the progress replaces those plans."""
        plans = plan_reported(expansion, plan.first, tunings, self.matrix_dir, rule, start=len(plan.tuning_plans) + 1)
        self.progress.revise(plans)
        return plans

    def report(
        self, plans: list[CellPlan], seeds: SeedRounds, results: Results, rule: ReuseRule, planned: set[str]
    ) -> None:
        """The reported cells: ``plans`` first (those without a tuned value fail, untrained), then the
        rounds of seeds."""
        for plan in plans:
            if plan.status == NO_CHOICE:  # no candidate finished: nothing to train these cells at
                cell = plan.cell
                failure = CellRecord.failure(
                    cell.task, cell.seed, cell.run.config_hash(), code_fingerprint(), plan.detail
                )
                record_untrained(cell.directory(self.matrix_dir), cell_file(cell, self.matrix_dir, self.path), failure)
                self.failed.append(cell.key)
                say(f"[{plan.n}/{self.n_cells}] {cell.key}: FAILED: {plan.detail}")
        seeds.planned |= planned
        first = [plan for plan in plans if plan.status != NO_CHOICE]
        self.phases[REPORT] = merge_rounds(self.run_schedule(first, seeds, results, rule))
