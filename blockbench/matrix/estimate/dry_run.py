"""``blockbench matrix --dry-run``: every cell's status and estimated time, and the run's total.

The variants to train with nothing measured here are timed first (a short fit each, ``--jobs`` at a
time, see :mod:`blockbench.matrix.estimate.timing`), so that a fresh matrix still gets an estimate;
the timing forks from the cell server, as the cells will. The run's own seconds before its first cell
are the dry run's start-up and planning, the cell server's start (as the timing measured it, else as
earlier runs under the results root recorded it) and, with ``--time-cells``, the timing the run will
repeat. Nothing is written under the results (the timings work in a temporary folder).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from ...durations import format_duration
from ..jobs import cpu_cores, forks
from ..launch import start_server
from ..plan import IF_NEEDED, CellPlan
from ..say import say
from ..tuning import TUNE
from .estimator import TimeEstimator, Timer, key_of
from .timing import cell_timer, server_seconds
from .total import describe_total


def busy_machine(cores: int) -> str | None:
    """What to say where other processes already keep this machine's ``cores`` busy before the timings
    start (the one-minute load average above half of them): a timing shares its cores with them, so it
    runs long and so does the estimate, maybe several times over. None on a quiet machine."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load <= cores / 2:
        return None
    return (
        f"this machine is busy (load {load:.1f} over the last minute on {cores} CPUs): the timings share "
        "the cores with other processes, so they and the estimate below run long; time again on a quiet machine"
    )


def time_before_the_cells(
    plans: Sequence[CellPlan],
    estimator: TimeEstimator,
    timer: Timer,
    jobs: int,
    results_root: Path,
    *,
    time_cells: bool,
) -> float:
    """The run's seconds between its planning and its first cell: the cell server's start where a cell
    forks from it, and with ``time_cells`` the timing the run repeats. The variants with nothing
    measured are timed here (their timings fork from the server, so it is started first, and its start
    measured); where nothing needs timing, the server's start is the earlier runs' (``matrix_run.json``)."""
    may_train = [plan for plan in plans if plan.trains or plan.status == IF_NEEDED]
    forking = any(forks(plan.cell.run) for plan in may_train)
    untimed = [p.cell for p in may_train if estimator.estimate(p, guess=False) is None]
    if not untimed:
        return server_seconds(results_root) if forking else 0.0
    if estimator.per_task:  # a GPU: one timing per task and shape
        what = f"each of {len({estimator.shape(cell) for cell in untimed})} task and shape(s)"
    else:
        what = f"each of {len({key_of(cell) for cell in untimed})} variant(s)"
    say(
        f"timing a cell of {what} with no earlier results here (a short fit: its "
        f"build, steps, validations, a checkpoint{f'; {jobs} at a time' if jobs > 1 else ''})..."
    )
    busy = busy_machine(cpu_cores())
    if busy:
        say(f"  {busy}")
    start = time.perf_counter()
    if forking:
        start_server()  # the timings fork from it, as the cells will
    server = time.perf_counter() - start
    for problem in estimator.time(plans, timer):
        say(f"  {problem}")
    timing = time.perf_counter() - start - server
    return server + (timing if time_cells else 0.0)


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
    time_cells: bool = False,
) -> int:
    """``--dry-run``: every cell validated (load_matrix did), its status and estimated time, ``notes``
    (the tuned values already known), the total; the variants to train without a measured figure are
    timed first (``timer``, default :func:`blockbench.matrix.estimate.timing.cell_timer`: ``jobs`` at a
    time; see :func:`time_before_the_cells`). ``started``: the seconds this process has run so far (its
    start-up and the planning, which the run repeats); ``time_cells``: the run will time its cells too
    (``--time-cells``). Writes nothing under the results (the timings work in a temporary folder)."""
    tuning = sum(plan.cell.phase == TUNE for plan in plans)
    counted = (
        f"{len(plans)} cells ({tuning} tuning, {len(plans) - tuning} reported)" if tuning else f"{len(plans)} cells"
    )
    say(f"matrix {name}: {counted} -> {matrix_dir} (dry run: every cell validated, nothing trained)")
    timer = timer or cell_timer(jobs)
    before = time_before_the_cells(plans, estimator, timer, jobs, matrix_dir.parent, time_cells=time_cells)
    estimator.before = started + before
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
