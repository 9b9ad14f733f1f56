"""A matrix run's time from its cells' estimates: the total of the dry run and of the run's first line
(:func:`describe_total`), and the progress line with its ETA as cells end (:class:`MatrixProgress`).
The cells run ``--jobs`` at a time, phase after phase (tuning rung after rung, then the reported
cells), as the runner's queue hands them out (:func:`blockbench.matrix.estimate.timing.makespan`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from ...durations import format_duration
from ...store.record import CellRecord
from ..plan import AFTER_TUNING, ELSEWHERE, IF_NEEDED, NO_CHOICE, RESUMABLE, CellPlan
from ..tuning import TUNE
from .estimator import Key, TimeEstimator, key_of
from .timing import makespan


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
    (``blockbench.matrix.estimate.timing.makespan``); the run's own seconds before and after them are the
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
        "same shape": "cells of other variants of the same task and sizes that ran here",
        "task probe": "a cell of another variant of the same task and shape timed here in parts (on a GPU)",
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
    phase after phase (``blockbench.matrix.estimate.timing.makespan``), then the report. Thread-safe: under
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

    def take(self, plans: list[CellPlan]) -> None:
        """Plans of cells that train ahead of their phase (a ladder's headroom check): counted from now
        on, and no longer among the later tuning rungs expected."""
        with self._lock:
            ahead = {plan.cell.key for plan in plans}
            self.expected = [(plan, r) for plan, r in self.expected if plan.cell.key not in ahead]
            self.plans.update({plan.n: plan for plan in plans if plan.trains})

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
