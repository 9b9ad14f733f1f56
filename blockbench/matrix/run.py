"""Run a matrix: a loop over its results folder, round after round, from its plan to its report.

Every cell is validated before the first one trains (``expand``) and planned from the results store
(``plan``: reused, copied from another matrix, resumed or trained; a results folder holding cells made
on other hardware than this run's is refused). Then the run is one loop: train a
round's cells, ask the schedule (``schedule``) which cells the results on disk call for next, until it
has none. A matrix with ``tune:`` runs two schedules, successive halving's tuning rungs and then the
reported cells at the values they chose (``tuning``); with ``seeds: {min, max, step}`` the reported
cells come in rounds of seeds for the questions still undecided. A matrix with a scale ladder runs a
phase before them all: the baseline alone at the top rung, which stops the run where a task has no
headroom there (``headroom``). Each cell runs ``blockbench train``
in a process of its own (``jobs``, ``launch``) and writes its folder through the store; the time
estimate watches the run (``estimate``), and the report, which sits beside the runner, is handed in
by the command line (:class:`Reporting`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..lifeline import FolderHeld, holder
from ..prereg import ALPHA, PlanBook, smallest_rank_p
from ..provenance import code_fingerprint
from ..store.files import write_matrix_copy
from ..store.lineage import Lineage
from ..store.record import HeadroomCheck
from ..store.reuse import ReuseRule, trained_elsewhere
from ..tensorboard.logdirs import publish_logdirs
from ..walltime import WallClock
from .devices import cells_get_cuda, devices_per_cell
from .estimate.dry_run import print_plan
from .estimate.estimator import TimeEstimator
from .estimate.timing import cell_timer
from .estimate.total import MatrixProgress, describe_total
from .expand import Expansion, expand_matrix
from .finish import Reporting, RunRecord, finish_matrix
from .headroom import HeadroomPhase, headroom_cells
from .jobs import AUTO_JOBS, ClusterOptions, forks, gpu_devices, gpu_packing, job_slots, resolve_jobs
from .launch import start_server, stop_cells_on_sigterm
from .peaks import resolve_peaks
from .plan import MatrixPlan, plan_cell, plan_matrix, refuse_other_hardware
from .preregister import analysis_plan
from .rounds import Rounds
from .say import say
from .schedule import Results, SeedRounds, TuningRungs


@dataclass(frozen=True)
class RunOptions:
    """How a matrix runs (the ``blockbench matrix`` options): ``jobs`` cells at a time here, or as cluster
    jobs (``launcher``); reuse (``force``, ``reuse_stale``); ``dry_run``: plan and estimate only;
    ``time_cells``: time a cell of each variant with nothing measured before the first cell, for the
    ETA; ``from_process_start``: this process is the matrix's own, so its wall time counts from its start."""

    force: bool = False
    jobs: int | str = AUTO_JOBS
    launcher: str = "local"
    cluster_options: ClusterOptions = ClusterOptions()  # noqa: RUF009 (a frozen dataclass of immutable fields)
    reuse_stale: bool = False
    dry_run: bool = False
    time_cells: bool = False
    from_process_start: bool = False


class MatrixRunner:
    """One run of the matrix at ``path`` into ``results_root`` (see the module docstring): planned on
    construction, then :meth:`run` (or :meth:`dry_run`)."""

    def __init__(self, path: str | Path, results_root: Path, options: RunOptions, reporting: Reporting):
        self.clock = WallClock(from_process_start=options.from_process_start)
        self.clock.enter("planning")
        self.path, self.options, self.reporting = Path(path), options, reporting
        self.expansion: Expansion = expand_matrix(self.path)  # raises before anything is written
        matrix = self.expansion.matrix
        cells, tuning = self.expansion.cells, self.expansion.tuning
        # each cell's GPUs (none on a CPU), checked before anything trains: a cell asking for more than the
        # job has fails here
        self.gpus = gpu_devices() if options.launcher == "local" else []
        self.needs = {cell.key: devices_per_cell(cell.run, len(self.gpus)) for cell in tuning + cells}
        self.matrix_dir = results_root / matrix.name
        # single-GPU cells share a GPU where their memory fits (blockbench.matrix.devices)
        needs = list(self.needs.values())
        self.per_gpu = gpu_packing(options.jobs, tuning + cells, needs, len(self.gpus), self.matrix_dir)
        self.jobs = resolve_jobs(options.jobs, max(len(cells), len(tuning)), needs, self.per_gpu)
        fingerprint = code_fingerprint()
        # a config another matrix of this results root trained with this code is copied, not trained again;
        # results of other code that the recorded lineage shows give this code's numbers count as its own;
        # only results made on the hardware the cells resolve to here count at all
        lineage = Lineage.load(results_root)
        elsewhere = {} if options.force else trained_elsewhere(results_root, fingerprint, lineage)
        # submitit-local's jobs are processes of this machine, and see its GPUs
        cuda = cells_get_cuda(options.launcher, gpu_devices() if options.launcher == "submitit-local" else self.gpus)
        # cells made on other hardware are never trained over nor seeded beside: refused before planning
        refuse_other_hardware(tuning + cells, self.matrix_dir, cuda=cuda)
        self.rule = ReuseRule(fingerprint, options.reuse_stale, options.force, lineage, elsewhere, cuda)
        self.results = Results(self.matrix_dir, self.rule)
        self.plan: MatrixPlan = plan_matrix(self.expansion, self.matrix_dir, self.rule)
        # on a GPU a cell's time is mostly its start-up: one probe per task and shape, not one per variant
        self.estimator = TimeEstimator(per_task=any(needs))
        self.estimator.add_results(tuning + cells, self.matrix_dir)
        # a cell that another live run trains now (a runner started twice): never a second process on it
        self.held = {
            plan.cell.key: by
            for plan in self.plan.plans
            if plan.trains and (by := holder(plan.cell.directory(self.matrix_dir)))
        }

    def notes(self) -> list[str]:
        """What the dry run says under its cells: the analysis plan, the choices known, the rounds of seeds."""
        matrix = self.expansion.matrix
        notes = [f"analysis plan {analysis_plan(self.expansion).digest()} (what decides the verdicts; see plan.json)"]
        notes += self.ladder_notes()
        notes += [f"tuned {tuned.describe()}" for tuned in self.plan.known.values()]
        if matrix.seeds:
            notes.append(
                f"seeds in rounds: {matrix.seeds.min} per variant first, then {matrix.seeds.step} more at a time "
                f"for the variants whose verdict is undecided, up to {matrix.seeds.max} "
                f"(looks at {list(matrix.seeds.sizes)})"
            )
            per_look = ALPHA / len(matrix.seeds.sizes)  # decide.Looks.per_look_alpha, which this layer cannot import
            smallest = smallest_rank_p(matrix.seeds.max)
            if smallest >= per_look:
                notes.append(
                    f"a question where a seed does not learn or diverges is decided by the signed-rank test on "
                    f"seed pairs, which on {matrix.seeds.max} pairs cannot reach α {per_look:.3g} per look (its "
                    f"smallest p-value is {smallest:.3g}): such a question stays undecided; "
                    "seeds: {min: 3, max: 9, step: 3} can decide it"
                )
        return notes + [
            f"{key} is being trained by {by}: a run now would stop at once" for key, by in self.held.items()
        ]

    def ladder_notes(self) -> list[str]:
        """What the dry run says of a ladder: its rungs and their compute, and the headroom check first."""
        ladder, expansion = self.expansion.matrix.ladder, self.expansion
        if ladder is None:
            return []
        rungs = ", ".join(f"{name} ({expansion.computes[name]:g}x compute)" for name in ladder.names)
        notes = [f"ladder: rungs {rungs}; each variant is compared with the baseline at its own rung"]
        if ladder.top_grid is not None:
            notes.append(
                f"the top rung {ladder.top.name} tunes {ladder.top_grid.points} values centred on the rate "
                "extrapolated from the rungs below, once they have chosen (listed as if needed until then)"
            )
        cells = headroom_cells(expansion)
        if cells:
            notes.append(
                f"headroom first: {', '.join(cell.key for cell in cells)} train before any other cell; the run "
                "stops there if a task's baseline is saturated or near it at the top rung"
            )
        return notes

    def dry_run(self) -> int:
        """Print each cell's status and the time estimate; write nothing and train nothing."""
        started = self.clock.elapsed() if self.clock.startup is not None else 0.0  # start-up and planning
        return print_plan(
            self.expansion.matrix.name,
            self.matrix_dir,
            self.plan.plans,
            self.estimator,
            self.jobs,
            notes=self.notes(),
            started=started,
            time_cells=self.options.time_cells,
        )

    def prepare(self) -> tuple[Rounds, str]:
        """Everything before the first cell: the analysis plan and the matrix file recorded, the
        TensorBoard log folders, the peak FLOP/s, the cell server and, with ``time_cells``, the timing;
        return the rounds' trainer and the TensorBoard line."""
        if self.held:
            raise FolderHeld(self.held)
        self.clock.exit("planning")
        expansion, options, plans = self.expansion, self.options, self.plan.plans
        # what decides the verdicts, committed to before any cell of this run starts (cell.json names it)
        PlanBook.load(self.matrix_dir).record(self.matrix_dir, analysis_plan(expansion))
        write_matrix_copy(self.matrix_dir, self.path.read_text(), tuned=bool(expansion.tuning))
        with self.clock.part("tensorboard_views"):  # a log folder per task, tuning runs apart
            logged = [cell.logdir_cell for cell in expansion.cells]
            browse = publish_logdirs(self.matrix_dir, logged, [cell.logdir_cell for cell in expansion.tuning])
        progress = MatrixProgress(plans, self.estimator, self.jobs)  # those that train, and later rungs expected
        slots = job_slots(self.jobs) if options.launcher == "local" else []
        if slots:
            served = any(plan.trains and forks(plan.cell.run) for plan in plans)
            if served:
                with self.clock.part("cell_server"):  # its imports, once, before the first cell forks from it
                    start_server()
            with self.clock.part("peak_probe"):  # before any cell starts: one MFU denominator
                resolve_peaks([plan.cell for plan in plans if plan.trains], slots[0].threads, in_server=served)
            if options.time_cells:
                with self.clock.part("planning"):  # the variants with nothing measured, timed for the ETA
                    for problem in self.estimator.time(plans, cell_timer(self.jobs)):
                        say(problem)
        rounds = Rounds(
            self.matrix_dir,
            self.path,
            options,
            self.jobs,
            slots,
            self.gpus,
            self.needs,
            progress,
            self.clock,
            per_gpu=self.per_gpu,
        )
        rounds.n_cells = len(plans) - len(self.plan.later)  # the cells planned so far (a later round adds its own)
        return rounds, browse

    def command(self) -> str:
        """The command line that ``matrix_run.json`` records for this run."""
        options = self.options
        how = f" --launcher {options.launcher}" if options.launcher != "local" else ""
        how = how or (f" --jobs {self.jobs}" if self.jobs > 1 else "")
        return f"blockbench matrix {self.path}{how}" + (" --reuse-stale" if options.reuse_stale else "")

    def run(self) -> int:
        """Train the rounds, then record the run and report; return the exit code (1 if a cell failed,
        130 or 143 if interrupted)."""
        rounds, browse = self.prepare()
        matrix, tuning = self.expansion.matrix, self.expansion.tuning
        counted = f"{len(tuning)} tuning cells, then {len(self.expansion.cells)} cells" if tuning else None
        say(
            f"matrix {matrix.name}: {counted or f'{len(self.expansion.cells)} cells'} -> {self.matrix_dir}"
            + (f", {self.jobs} at a time" if self.jobs > 1 else "")
            + (f" ({self.per_gpu} on each GPU)" if self.per_gpu > 1 else "")
            + f"; {describe_total(self.plan.plans, self.estimator, self.jobs)}"
        )
        say(browse)
        local = self.options.launcher == "local"
        terminated: list[int] = []  # SIGTERM received (local cells only: cluster jobs are the scheduler's)
        try:
            with stop_cells_on_sigterm() if local else contextlib.nullcontext(terminated) as terminated:
                stopped = self.run_phases(rounds)
        except KeyboardInterrupt:
            if not local:
                raise
            how = "terminated (SIGTERM): running cells were stopped" if terminated else "interrupted"
            say(
                f"\n{how}: finished cells are kept, unfinished ones resume from their last checkpoint; "
                "run the same command again to continue",
                stream=sys.stderr,
            )
            return 128 + signal.SIGTERM if terminated else 130
        if stopped is not None:  # a task without headroom: nothing else trained, nothing to report
            say(stopped.message, stream=sys.stderr)
            return 1
        record = RunRecord(
            self.command(),
            rounds.trained(),
            rounds.failed,
            rounds.cell_times if local else None,
            self.jobs if local else 1,
            rounds.phases if tuning else None,
        )
        return finish_matrix(self.matrix_dir, matrix.name, self.clock, record, self.reporting)

    def run_headroom(self, rounds: Rounds) -> tuple[HeadroomCheck | None, set[str]]:
        """A ladder's headroom check (:mod:`blockbench.matrix.headroom`), before any other cell: its
        check (None without one) and the keys of the cells it trained, which the later phases skip."""
        cells = headroom_cells(self.expansion)
        if not cells:
            return None, set()
        rung = self.expansion.matrix.ladder.top.name if self.expansion.matrix.ladder else ""
        say(
            f"headroom first: the baseline alone at the top rung {rung}, one cell per task "
            f"({', '.join(cell.key for cell in cells)}); the ladder stops if a task has no room there"
        )
        # a cell planned to train keeps its number; one listed only as if needed (a centred top rung's) gets a new one
        numbers = {plan.cell.key: plan.n for plan in self.plan.plans if plan.n <= rounds.n_cells}
        known = [cell for cell in cells if cell.key in numbers]
        plans = [plan_cell(numbers[cell.key], cell, self.matrix_dir, self.rule) for cell in known]
        plans += rounds.add_plans([cell for cell in cells if cell.key not in numbers], self.rule)
        check = rounds.headroom(plans, HeadroomPhase(cells), self.results, self.rule, self.expansion)
        return check, {cell.key for cell in cells}

    def run_phases(self, rounds: Rounds) -> HeadroomCheck | None:
        """A ladder's headroom check, then tuning (with ``tune:``), then the reported cells in rounds of
        seeds: each a schedule whose rounds are trained until it asks for none. Return the headroom
        check where it stopped the run (before any other cell), else None."""
        expansion, plan = self.expansion, self.plan
        check, done = self.run_headroom(rounds)
        if check is not None and check.stop:
            return check
        report_plans, tunings = [p for p in plan.first_reported if p.cell.key not in done], plan.known
        if expansion.tuning:
            matrix = expansion.matrix
            say(
                f"phase 1 of 2, tuning: each variant's candidates of {', '.join(matrix.tune)} on the tuning split, "
                f"successive halving over seeds {', '.join(map(str, matrix.tune_seeds))}"
            )
            rungs = TuningRungs(expansion, plan.tuning)
            first = [p for p in plan.tuning_plans if p.cell.key not in done]
            tunings = rounds.tune(first, rungs, self.results, self.rule, expansion)
            with self.clock.part("planning"):
                report_plans = rounds.plan_reported_after_tuning(expansion, plan, tunings, self.rule)
            say(f"phase 2 of 2, the reported seeds at the tuned values (recorded in {rounds.tune_file})")
        seeds = SeedRounds(expansion, self.reporting.open_questions, tunings)
        rounds.report(report_plans, seeds, self.results, self.rule, {p.cell.key for p in report_plans} | done)
        return None


def run_matrix(path: str | Path, results_root: Path, *, reporting: Reporting | None = None, **options: Any) -> int:
    """Run every cell of the matrix at ``path`` (see :class:`MatrixRunner`; ``options``: the fields of
    :class:`RunOptions`). ``reporting``: the report's functions, which the command line hands in
    (``blockbench.matrix_command.run_matrix`` runs with them); without them the run records itself
    and writes no summary, and a matrix with seeds in rounds stops after its first round. Return the
    exit code: 1 if a cell failed (a diverged cell is a finding, not a failure)."""
    settings = RunOptions(**options)
    runner = MatrixRunner(path, results_root, settings, reporting or Reporting.none())
    return runner.dry_run() if settings.dry_run else runner.run()
