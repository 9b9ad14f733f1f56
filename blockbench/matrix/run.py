"""Run a matrix: from its plan to its summary.

Every cell is validated before the first one trains (``expand``). Each cell runs ``blockbench train``
in a process of its own (a crash in one cell must not take the matrix down): forked from a server
that has done the imports once (``launch``), or for a DDP cell, whose launcher relaunches the entry
script, a subprocess (``jobs``). It writes ``cell.json``, ``config.yaml`` and ``result.json`` under
``results/<matrix>/cells/<task>/<variant>/seed<k>/``. A cell whose result exists for the same
resolved config and the same code is skipped (``plan``), so rerunning an interrupted matrix
continues where it stopped. A matrix with ``tune:`` first trains its tuning cells
(``results/<matrix>/tune/cells/``), then the reported cells at the values they chose (see
``blockbench.matrix.tuning``).
"""

from __future__ import annotations

import contextlib
import queue
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..layout import (
    CONFIG_FILE,
    INDEX_FILE,
    MATRIX_FILE,
    RESULT_FILE,
    RUN_FILE,
    SUMMARY_MD,
    TRAIN_LOG,
    TUNE_FILE,
    tensorboard_logdirs,
    write_atomic,
    write_json,
)
from ..lifeline import FolderHeld, holder
from ..lineage import NO_LINEAGE, Lineage
from ..prereg import PlanBook
from ..progress import format_duration
from ..provenance import code_fingerprint
from ..record import CellRecord, write_record, write_tuning
from ..report.answer import answer_lines
from ..report.index import write_index
from ..report.results import gives_verdicts
from ..report.summary import write_summary
from ..tbviews import browse_hint
from ..walltime import MATRIX_PARTS, WallClock
from .devices import DevicePool, devices_per_cell
from .expand import Cell, Expansion, expand_matrix
from .jobs import (
    AUTO_JOBS,
    ClusterOptions,
    Slot,
    describe_outcome,
    forks,
    gpu_devices,
    job_slots,
    resolve_jobs,
    run_cell,
    run_cells_as_jobs,
    write_cell_file,
)
from .launch import start_server, stop_cells_on_sigterm, stopping
from .plan import (
    AFTER_TUNING,
    DONE,
    ELSEWHERE,
    IF_NEEDED,
    NO_CHOICE,
    CellPlan,
    MatrixProgress,
    TimeEstimator,
    copy_cell,
    describe_total,
    plan_cell,
    plan_cells,
    print_plan,
    trained_elsewhere,
)
from .preregister import analysis_plan
from .rounds import Counts, extended_tuning, first_round, merge_phases, next_round, pending_tuning
from .say import say
from .tensorboard import publish_logdirs
from .timing import cell_timer
from .tuning import REPORT, TUNE, Tuning, tuning_record


def run_matrix(
    path: str | Path,
    results_root: Path,
    *,
    force: bool = False,
    jobs: int | str = AUTO_JOBS,
    launcher: str = "local",
    cluster_options: ClusterOptions = ClusterOptions(),  # noqa: B008 (a frozen dataclass of immutable fields)
    reuse_stale: bool = False,
    dry_run: bool = False,
    from_process_start: bool = False,
) -> int:
    """Run every cell of the matrix at ``path``: here, ``jobs`` at a time (see
    :func:`blockbench.matrix.jobs.resolve_jobs`), or as cluster jobs (``launcher``: "slurm", or
    "submitit-local" to try the job path on this machine). Cells with a result of the same config and
    code are reused (see :func:`blockbench.matrix.plan.reuse_earlier`; all are retrained with
    ``force``). Write the summary and return the exit code: 1 if a cell failed (a diverged cell is a
    finding, not a failure). ``dry_run``: print each cell's status and the time estimate
    (:func:`blockbench.matrix.plan.print_plan`), write nothing and train nothing.
    ``from_process_start``: this process is the matrix's own (``blockbench matrix``), so its wall time
    counts from the process start.

    A matrix with ``tune:`` runs in two phases (see :mod:`blockbench.matrix.tuning`): its tuning cells,
    then, once each variant's values are chosen and recorded in ``tune.json``, the reported cells at
    them. Both are ordinary cells, run the same way (``jobs`` at a time), reused by the same rule.

    ``matrix_run.json`` records where the wall time went: the matrix's own parts (:data:`MATRIX_PARTS`:
    planning, TensorBoard views, the peak FLOP/s probe, the cells, the report), each trained cell's
    seconds as seen from here and, with ``tune:``, each phase's (see :func:`finish_matrix`)."""
    clock = WallClock(from_process_start=from_process_start)
    clock.enter("planning")
    path = Path(path)
    expansion = expand_matrix(path)  # raises before anything is written
    matrix, cells, tuning = expansion.matrix, expansion.cells, expansion.tuning
    # each cell's GPUs (none on a CPU), checked before anything trains: a cell asking for more than the job
    # has fails here
    gpus = gpu_devices() if launcher == "local" else []
    needs = {cell.key: devices_per_cell(cell.run, len(gpus)) for cell in tuning + cells}
    jobs = resolve_jobs(jobs, max(len(cells), len(tuning)), list(needs.values()))  # the larger phase
    matrix_dir = results_root / matrix.name
    fingerprint = code_fingerprint()
    # a config another matrix of this results root trained with this code is copied, not trained again
    # results of other code that its recorded lineage shows give this code's numbers count as this code's
    lineage = Lineage.load(results_root)
    elsewhere = {} if force else trained_elsewhere(results_root, fingerprint, lineage)
    reuse = dict(force=force, reuse_stale=reuse_stale, elsewhere=elsewhere, lineage=lineage)
    counts = Counts(fingerprint, reuse_stale, force, lineage)
    # the tuning cells the current rung of each variant still needs; the variants whose tuning has ended
    # (every rung reusable here): their choice is known before anything trains
    # (with the candidates the tuner added past an end of the grid that won, as far as they have run)
    tuning, tunings = extended_tuning(expansion, tuning, matrix_dir, counts, finished_only=True)
    settled = {cell.key for cell in tuning if counts.record(cell, matrix_dir, finished_only=True)}
    pending = {cell.key for cell in pending_tuning(tuning, tunings)}
    tuning_plans = plan_cells(
        [cell for cell in tuning if cell.key in settled | pending], matrix_dir, fingerprint, **reuse
    )
    known = {key: t for key, t in tunings.items() if t.complete}
    first = first_round(expansion)
    plans = tuning_plans + plan_reported(
        expansion, first, known, matrix_dir, fingerprint, start=len(tuning_plans) + 1, **reuse
    )
    planned = {plan.cell.key for plan in tuning_plans}
    later = [
        cell
        for cell in tuning
        if cell.key not in planned
        and (cell.task, cell.variant) not in known
        and counts.record(cell, matrix_dir) is None
    ]
    later += [cell for cell in cells if cell not in first]
    # a later round's cells: reused where a run got that far, else trained only if a round needs them
    for cell in later:
        n = len(plans) + 1
        chosen = known.get((cell.task, cell.variant))
        if cell.phase == REPORT and tuning and chosen is not None and chosen.chosen is not None:
            cell = expansion.at_choice(cell, chosen.chosen.values)
        plan = plan_cell(n, cell, matrix_dir, fingerprint, **reuse)
        done = plan.status == DONE and not (cell.phase == REPORT and tuning and not cell.tuned)
        plans.append(plan if done else CellPlan(n, cell, IF_NEEDED, trains=False))
    estimator = TimeEstimator()
    estimator.add_results(tuning + cells, matrix_dir)
    # a cell that another live run trains now (a runner started twice): never a second process on it
    held = {plan.cell.key: by for plan in plans if plan.trains and (by := holder(plan.cell.directory(matrix_dir)))}
    if dry_run:
        notes = [f"analysis plan {analysis_plan(expansion).digest()} (what decides the verdicts; see plan.json)"]
        notes += [f"tuned {tuned.describe()}" for tuned in known.values()]
        if matrix.seeds:
            notes.append(
                f"seeds in rounds: {matrix.seeds.min} per variant first, then {matrix.seeds.step} more at a time "
                f"for the variants whose verdict is undecided, up to {matrix.seeds.max} "
                f"(looks at {list(matrix.seeds.sizes)})"
            )
        notes += [f"{key} is being trained by {by}: a run now would stop at once" for key, by in held.items()]
        started = clock.elapsed() if clock.startup is not None else 0.0  # start-up and planning, as the run's
        return print_plan(matrix.name, matrix_dir, plans, estimator, jobs, notes=notes, started=started)
    if held:
        raise FolderHeld(held)
    clock.exit("planning")
    matrix_dir.mkdir(parents=True, exist_ok=True)
    # what decides the verdicts, committed to before any cell of this run starts (cell.json names it)
    PlanBook.load(matrix_dir).record(matrix_dir, analysis_plan(expansion))
    write_atomic(matrix_dir / MATRIX_FILE, path.read_text())
    if not tuning:
        (matrix_dir / TUNE_FILE).unlink(missing_ok=True)  # the tune: section was removed: its record is not this run's
    # TensorBoard: a log folder per task (tuning runs apart), its HParams columns and charts carried by every
    # run in it; runs of earlier cells get them if they changed (blockbench.matrix.tensorboard)
    with clock.part("tensorboard_views"):
        browse = publish_logdirs(matrix_dir, cells, tuning)
    stale_flag = " --reuse-stale" if reuse_stale else ""  # recorded with the run: its summary may hold stale results
    how = f" --launcher {launcher}" if launcher != "local" else f" --jobs {jobs}" if jobs > 1 else ""
    command = f"blockbench matrix {path}{how}{stale_flag}"
    n_cells = len(plans) - len(later)  # the cells planned so far (a later round adds its own)
    failed: list[str] = []
    cell_times: list[dict[str, Any]] = []  # each trained cell's seconds as seen from here, in the order they ended
    progress = MatrixProgress(plans, estimator, jobs)  # those that train, and the tuning rungs expected
    slots = job_slots(jobs) if launcher == "local" else []
    if slots:
        with clock.part("peak_probe"):  # before any cell starts: one MFU denominator
            resolve_peaks([plan.cell for plan in plans if plan.trains], slots[0].threads)
        if any(plan.trains and forks(plan.cell.run) for plan in plans):
            with clock.part("cell_server"):  # its imports, once, before the first cell forks from it
                start_server()
        with clock.part("planning"):  # the variants with nothing measured, timed as the dry run does, for the ETA
            for problem in estimator.time(plans, cell_timer(jobs)):
                say(problem)
    counted = f"{len(tuning)} tuning cells, then {len(cells)} cells" if tuning else f"{len(cells)} cells"
    say(
        f"matrix {matrix.name}: {counted} -> {matrix_dir}"
        + (f", {jobs} at a time" if jobs > 1 else "")
        + f"; {describe_total(plans, estimator, jobs)}"
    )
    say(browse)
    free_slots: queue.SimpleQueue[Slot] = queue.SimpleQueue()
    for slot in slots:
        free_slots.put(slot)
    devices = DevicePool(gpus)

    def run(n: int, cell: Cell) -> None:
        slot = free_slots.get()
        # whole devices, waiting for them if need be (a value the tuner added past a grid's end: its own)
        need = needs.get(cell.key) or devices_per_cell(cell.run, len(gpus)) if gpus else 0
        taken = devices.take(need) if gpus else None
        if taken is not None:
            slot = replace(slot, devices=tuple(taken))
        try:
            if stopping():  # the runner is being terminated: this cell stays as it is and resumes next time
                raise KeyboardInterrupt
            prefix = f"[{n}/{n_cells}] {cell.key}"
            plan = progress.start(n)
            say(f"{prefix}: training" + (f" ({plan.detail})" if plan.status == "resumable" else ""))
            log_file = cell.directory(matrix_dir) / TRAIN_LOG if jobs > 1 else None
            if log_file:
                log_file.parent.mkdir(parents=True, exist_ok=True)
            result = run_cell(cell, matrix_dir, path, slot=slot, log_file=log_file, fresh=force)
            if result.status == "failed":
                failed.append(cell.key)
            took = progress.finish(n, result)  # its process, spawn to exit, and the few file writes around it
            timing = {"key": cell.key, "seconds": round(took, 2), **({"phase": cell.phase} if cell.phase else {})}
            if (
                cell.phase == TUNE
            ):  # the summary reads the reported cells' results: a tuning cell's breakdown comes from here
                timing["wall_time_breakdown"] = result.wall_time_breakdown
            cell_times.append(timing)
            say(f"{prefix}: {describe_outcome(result)} in {format_duration(took)}  |  {progress.describe()}")
        finally:
            if taken:
                devices.give_back(taken)
            free_slots.put(replace(slot, devices=None))

    def run_phase(phase_plans: list[CellPlan]) -> dict[str, Any]:
        """Train the cells of ``phase_plans`` that need it (``jobs`` at a time, or as cluster jobs);
        return the phase's record for ``matrix_run.json``."""
        started = time.perf_counter()
        for plan in phase_plans:
            if plan.detail and (not plan.trains or plan.status != "resumable"):  # resuming is said when the cell starts
                say(f"[{plan.n}/{n_cells}] {plan.cell.key}: {plan.detail}")
            if plan.status == ELSEWHERE and plan.source is not None:
                copy_cell(plan.source, plan.cell.directory(matrix_dir))
                write_cell_file(plan.cell, matrix_dir, path)
        todo = [(plan.n, plan.cell) for plan in phase_plans if plan.trains]
        with clock.part("cells"):
            if launcher != "local":
                cluster = {"slurm": "slurm", "submitit-local": "local"}[launcher]
                failed.extend(
                    run_cells_as_jobs(
                        todo, n_cells, matrix_dir, path, cluster=cluster, options=cluster_options, fresh=force
                    )
                )
            else:
                pool = ThreadPoolExecutor(max_workers=jobs)
                try:
                    for future in [pool.submit(run, n, cell) for n, cell in todo]:
                        future.result()
                finally:  # on Ctrl-C running cells stop too; queued ones never start
                    pool.shutdown(wait=True, cancel_futures=True)
        return {"cells": len(phase_plans), "trained": len(todo), "wall_time_s": round(time.perf_counter() - started, 1)}

    def add_plans(cells_to_plan: list[Cell]) -> list[CellPlan]:
        """Plans for cells a later round needs, numbered after every plan so far."""
        nonlocal n_cells
        new = plan_cells(cells_to_plan, matrix_dir, fingerprint, start=n_cells + 1, **reuse)
        n_cells += len(new)
        progress.revise(new)
        return new

    def run_tuning(phases: dict[str, dict[str, Any]]) -> dict[tuple[str, str], Tuning]:
        """Successive halving, rung by rung, until every variant's tuning is complete; its records in ``phases``."""
        say(
            f"phase 1 of 2, tuning: each variant's candidates of {', '.join(matrix.tune)} on the tuning split, "
            f"successive halving over seeds {', '.join(map(str, matrix.tune_seeds))}"
        )
        records = [run_phase(tuning_plans)]
        seen: set[str] = set()
        cells_of_tuning = tuning
        while True:
            with clock.part("planning"):
                grid_before = len(cells_of_tuning)
                cells_of_tuning, tunings = extended_tuning(expansion, cells_of_tuning, matrix_dir, counts)
                pending = [cell for cell in pending_tuning(cells_of_tuning, tunings) if cell.key not in seen]
            if not pending:
                break
            seen |= {cell.key for cell in pending}
            added = len(cells_of_tuning) > grid_before
            say(
                f"tuning: {len(pending)} cell(s) of "
                + ("a value past an end of the grid that won" if added else "the candidates that survived")
            )
            records.append(run_phase(add_plans(pending)))
        phases[TUNE] = merge_phases(records)
        write_tuning(matrix_dir, tuning_record(matrix.tune, matrix.tune_seeds, list(tunings.values())))
        for tuned in tunings.values():
            say(f"tuned {tuned.describe()}")
        return tunings

    def run_phases(phases: dict[str, dict[str, Any]]) -> None:
        """Tuning (with ``tune:``), then the reported cells in rounds; each phase's record into ``phases``."""
        report_plans = plans[len(tuning_plans) : len(plans) - len(later)]
        tunings = known
        if tuning:
            tunings = run_tuning(phases)
            with clock.part("planning"):
                # at the numbers they were planned with before tuning (counted in n_cells), so that the
                # progress replaces those plans instead of counting the cells twice
                report_plans = plan_reported(
                    expansion, first, tunings, matrix_dir, fingerprint, start=len(tuning_plans) + 1, **reuse
                )
            progress.revise(report_plans)
            say(f"phase 2 of 2, the reported seeds at the tuned values (recorded in {matrix_dir / TUNE_FILE})")
        records = []
        for plan in report_plans:
            if plan.status == NO_CHOICE:  # no candidate finished: nothing to train these cells at
                record_no_choice(plan.cell, matrix_dir, path, plan.detail)
                failed.append(plan.cell.key)
                say(f"[{plan.n}/{n_cells}] {plan.cell.key}: FAILED: {plan.detail}")
        records.append(run_phase([plan for plan in report_plans if plan.status != NO_CHOICE]))
        planned = {plan.cell.key for plan in report_plans}
        while matrix.seeds is not None:
            with clock.part("planning"):
                wanted = next_round(expansion, matrix_dir)
                todo = [cell for cell in wanted if cell.key not in planned]
            if not todo:
                break
            planned |= {cell.key for cell in todo}
            groups = sorted({f"{cell.task}/{cell.variant}" for cell in todo})
            say(f"undecided: {len(todo)} more seed cell(s) for {', '.join(groups)}")
            tuned = [
                expansion.at_choice(cell, tunings[cell.task, cell.variant].chosen.values)  # type: ignore[union-attr]
                if tuning
                else cell
                for cell in todo
                if not tuning or (tunings.get((cell.task, cell.variant)) and tunings[cell.task, cell.variant].chosen)
            ]
            records.append(run_phase(add_plans(tuned)))
        phases[REPORT] = merge_phases(records)

    phases: dict[str, dict[str, Any]] = {}
    terminated: list[int] = []  # SIGTERM received (local cells only: cluster jobs are the scheduler's)
    try:
        with stop_cells_on_sigterm() if launcher == "local" else contextlib.nullcontext(terminated) as terminated:
            run_phases(phases)
    except KeyboardInterrupt:
        if launcher != "local":
            raise
        how = "terminated (SIGTERM): running cells were stopped" if terminated else "interrupted"
        say(
            f"\n{how}: finished cells are kept, unfinished ones resume from their last checkpoint; "
            "run the same command again to continue",
            stream=sys.stderr,
        )
        return 128 + signal.SIGTERM if terminated else 130
    trained = sum(phase["trained"] for phase in phases.values())
    return finish_matrix(
        matrix_dir,
        matrix.name,
        command,
        clock,
        trained,
        failed,
        cell_times=cell_times if launcher == "local" else None,
        jobs=jobs if launcher == "local" else 1,
        phases=phases if tuning else None,
    )


def plan_reported(
    expansion: Expansion,
    cells: list[Cell],
    tunings: dict[tuple[str, str], Tuning],
    matrix_dir: Path,
    fingerprint: str,
    *,
    start: int,
    force: bool = False,
    reuse_stale: bool = False,
    elsewhere: dict[str, Path] | None = None,
    lineage: Lineage = NO_LINEAGE,
) -> list[CellPlan]:
    """The plans of the reported ``cells``, numbered from ``start``. With ``tune:``, a cell whose variant
    has a choice in ``tunings`` is planned at the chosen values (its config, so a changed choice
    retrains it and an unchanged one reuses it); one whose variant has no finished candidate is
    NO_CHOICE (it fails, untrained); one whose variant is still tuning trains AFTER_TUNING."""
    reuse = dict(force=force, reuse_stale=reuse_stale, elsewhere=elsewhere, lineage=lineage)
    if not expansion.tuning:
        return plan_cells(cells, matrix_dir, fingerprint, start=start, **reuse)
    plans = []
    for n, cell in enumerate(cells, start):
        tuning = tunings.get((cell.task, cell.variant))
        if tuning is None:
            plans.append(CellPlan(n, cell, AFTER_TUNING, f"at the {', '.join(expansion.matrix.tune)} its tuning picks"))
        elif tuning.chosen is None:
            plans.append(CellPlan(n, cell, NO_CHOICE, tuning.failure(), trains=False))
        else:
            tuned = expansion.at_choice(cell, tuning.chosen.values)
            plans.append(plan_cell(n, tuned, matrix_dir, fingerprint, **reuse))
    return plans


def record_no_choice(cell: Cell, matrix_dir: Path, matrix_file: Path, error: str) -> None:
    """Record a reported cell whose variant has no tuned value as failed with ``error``, untrained; a
    config.yaml of an earlier choice is removed (the cell trained with nothing)."""
    cell_dir = cell.directory(matrix_dir)
    write_cell_file(cell, matrix_dir, matrix_file)
    (cell_dir / CONFIG_FILE).unlink(missing_ok=True)
    write_record(
        cell_dir / RESULT_FILE,
        CellRecord.failure(cell.task, cell.seed, cell.run.config_hash(), code_fingerprint(), error),
    )


def finish_matrix(
    matrix_dir: Path,
    name: str,
    command: str,
    clock: WallClock,
    trained: int,
    failed: list[str],
    *,
    cell_times: list[dict[str, Any]] | None = None,
    jobs: int = 1,
    phases: dict[str, dict[str, Any]] | None = None,
) -> int:
    """Record the run in ``matrix_run.json``, write the summary, and return the exit code (1 if a cell failed).

    The record holds the run's wall time (``wall_time_s``) and where it went (``wall_time_breakdown``:
    :data:`MATRIX_PARTS`, ``startup`` before :func:`run_matrix` and ``other`` the rest), the cells trained
    at once (``jobs``) and, for local cells, each one's seconds from here (``cells``: key, seconds, and
    with ``tune:`` its phase), which the summary compares with the training steps the cells recorded;
    with ``tune:``, each phase's cells, cells trained and seconds (``phases``). It is written before the
    report (a report that fails leaves the run recorded) and again once the report is rendered, with
    its time, before the report reads it for the summary's header."""
    say(f"matrix {name} finished in {format_duration(clock.elapsed())}")

    def record_run() -> None:
        breakdown = clock.breakdown(MATRIX_PARTS)
        write_json(
            matrix_dir / RUN_FILE,
            {
                "command": command,
                "wall_time_s": round(breakdown["total"], 1),
                "cells_trained": trained,
                "jobs": jobs,
                "wall_time_breakdown": breakdown,
                "cells": cell_times,
                **({"phases": phases} if phases else {}),
            },
        )

    def report_rendered() -> None:
        clock.exit("report")
        record_run()

    record_run()
    clock.enter("report")
    written = write_summary(matrix_dir, before_header=report_rendered)
    index: Path | None = matrix_dir.parent / INDEX_FILE
    try:  # the verdicts of every matrix of the results root, with this one's new ones
        write_index(matrix_dir.parent)
    except (OSError, ValueError, KeyError) as error:  # another matrix's folder it cannot read: the run itself is done
        index = None
        say(
            f"could not refresh {matrix_dir.parent / INDEX_FILE} ({error}); "
            f"run blockbench report --index {matrix_dir.parent}",
            stream=sys.stderr,
        )
    title = f"{name}: " + (
        "the verdicts" if gives_verdicts(matrix_dir / MATRIX_FILE) else "a demonstration, not verdicts"
    )
    browse = browse_hint(matrix_dir, tensorboard_logdirs(matrix_dir))
    print("\n".join(answer_lines(title, written.comparisons, matrix_dir / SUMMARY_MD, browse, index)), flush=True)
    if failed:
        print(f"{len(failed)} cell(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def resolve_peaks(cells: list[Cell], slot_threads: int | None) -> None:
    """Read, or measure once, the peak FLOP/s that MFU divides by for every compute dtype and thread
    count these cells train with on this machine's CPU, before the first of them starts: each cell
    then reads the same cached figure (:func:`blockbench.cell.perf.peak_flops`), and no probe runs while
    other cells train. A cell's threads are ``trainer.num_threads``, else its slot's (``--jobs``),
    else torch's default, which this process has too (it runs in the same environment).

    Left to the cells themselves (the first probes, any others wait for it and read it): cells with
    ``trainer.peak_tflops``, GPU cells (a probe here would keep a CUDA context, and GPU memory, in
    this process for the whole matrix) and multi-process cells (Lightning sets their threads).
    """
    import torch

    from ..cell.perf import compute_dtype, peak_flops

    settings: dict[tuple[Any, int], str] = {}
    for cell in cells:
        trainer = cell.run.trainer
        accelerator = (
            trainer.accelerator if trainer.accelerator != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")
        )
        if (
            trainer.peak_tflops is not None
            or accelerator != "cpu"
            or trainer.devices not in (1, "1")
            or trainer.num_nodes > 1
        ):
            continue
        precision = trainer.resolved_precision(accelerator)
        try:
            dtype = compute_dtype(precision)
        except ValueError:
            continue  # the cell reports it
        settings.setdefault((dtype, trainer.num_threads or slot_threads or torch.get_num_threads()), precision)
    for (_, threads), precision in settings.items():
        peak = peak_flops(None, torch.device("cpu"), precision, threads=threads)
        print(
            f"MFU peak for {precision} on {threads} thread(s): {peak.tflops:.4g} TFLOP/s, what the cells' model "
            "FLOPs utilization (MFU) divides by: this CPU's measured fastest matmul, cached "
            "(blockbench peak shows how it was measured)",
            flush=True,
        )
