"""Where a run's wall time goes: the seconds of each part of a cell (``result.json``
``wall_time_breakdown``) or of a matrix run (``matrix_run.json``), from the start of the process.

A :class:`WallClock` attributes each second to the innermost part open at that moment, as a
profiler's "self time" does: a checkpoint saved inside a validation counts as checkpoint time, not
twice. Time in no part is ``other``, the remainder, so the parts sum to ``total`` exactly (to the
0.01 s they are rounded to). ``startup``, the time before the clock was made, comes from the
operating system's record of when the process started (:func:`process_age`).

Standard library only: the matrix runner uses it without importing torch or Lightning.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: True in a cell process forked by ``blockbench.matrix.launch`` (its imports were done before the fork)
FORKED = False

#: how ``measured_from`` says that the process was forked with its imports done (its start-up is short)
FORKED_NOTE = " (forked from the runner's server, imports done before: blockbench.matrix.launch)"

#: the parts of a cell's wall time that its run measures, in the order they come (``startup``, ``other`` and
#: ``total`` come with every breakdown): ``setup`` from the clock to the fit (the config, the code fingerprint,
#: the resume check, the logger and the Trainer), ``build`` the model and data module, ``data`` the data
#: module's hooks, ``fit_setup`` Lightning's fit until training starts (the model to its device, the
#: optimizers, the peak FLOP/s), ``flop_count`` the model FLOPs counted on the first batch (the first call of
#: every kernel on a GPU: cuDNN's execution plans among them), ``data_wait`` the waits for training batches,
#: ``first_step`` the first step's time beyond the steady steps' median, ``train_steps`` the optimizer steps,
#: ``loop`` the training loop between them (logging, callbacks), ``validation`` every validation,
#: ``checkpoints`` their saves, ``teardown`` from the end of training to the result
CELL_PARTS = (
    "setup",
    "build",
    "data",
    "fit_setup",
    "flop_count",
    "data_wait",
    "first_step",
    "train_steps",
    "loop",
    "validation",
    "checkpoints",
    "teardown",
)
#: the parts of a matrix run outside its cells, and ``cells``: the time its cells ran
MATRIX_PARTS = ("planning", "tensorboard_views", "peak_probe", "cell_server", "cells", "report")


def process_age() -> float | None:
    """Seconds since this process started, as the operating system recorded it: on Linux the
    ``starttime`` of ``/proc/self/stat`` (clock ticks since boot) against the boot-time clock
    (``CLOCK_BOOTTIME``, else ``/proc/uptime``); 10 ms resolution. None elsewhere (no /proc)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # fields after the command name, which is in parentheses and may hold spaces: state is field 3, starttime 22
        started = int(stat[stat.rindex(")") + 2 :].split()[22 - 3]) / os.sysconf("SC_CLK_TCK")
        if hasattr(time, "CLOCK_BOOTTIME"):
            now = time.clock_gettime(time.CLOCK_BOOTTIME)
        else:
            now = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, now - started)


class WallClock:
    """Exclusive seconds per named part of a run, on ``time.perf_counter``'s timeline.

    ``from_process_start``: the run is its process's (``blockbench train`` or ``blockbench matrix``),
    so its ``total`` starts when the process started and ``startup`` is the time until the clock was
    made; otherwise (a run called inside a longer-lived process, or no start time from the OS) both
    start at the clock, ``startup`` is None and :attr:`measured_from` says why.
    """

    def __init__(self, *, from_process_start: bool = False):
        now = time.perf_counter()
        age = process_age() if from_process_start else None
        self.startup = age
        self.origin = now - (age or 0.0)
        if age is not None:
            self.measured_from = "process start" + (FORKED_NOTE if FORKED else "")
        elif from_process_start:
            self.measured_from = "clock start (the process's start time is known only on Linux)"
        else:
            self.measured_from = "clock start (called inside a running process, which started earlier)"
        self.seconds: dict[str, float] = {}
        self._open: list[str] = []
        self._last = now

    def elapsed(self) -> float:
        """Seconds since the origin (the process start, or the clock's)."""
        return time.perf_counter() - self.origin

    def enter(self, part: str, at: float | None = None) -> None:
        """``part`` starts at ``at`` (a ``perf_counter`` reading; default now), inside the part open so far."""
        self._advance(at)
        self._open.append(part)

    def exit(self, part: str, at: float | None = None) -> None:
        """``part`` ends at ``at``; parts opened inside it and not closed end with it. A part that is not
        open is ignored (e.g. a hook Lightning called without its pair)."""
        if part not in self._open:
            return
        self._advance(at)
        while self._open.pop() != part:
            pass

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """The block's time counts as ``name``."""
        self.enter(name)
        try:
            yield
        finally:
            self.exit(name)

    def move(self, source: str, target: str, seconds: float) -> None:
        """Count ``seconds`` of ``source`` (at most all of it) as ``target``: a part measured inside
        another after the fact (the first step's excess over the steady steps)."""
        moved = min(max(0.0, seconds), self.seconds.get(source, 0.0))
        if moved > 0:
            self.seconds[source] -= moved
            self.seconds[target] = self.seconds.get(target, 0.0) + moved

    def is_open(self, part: str) -> bool:
        return part in self._open

    def _advance(self, at: float | None) -> None:
        """Attribute the time since the last event to the innermost open part (or to none: ``other``)."""
        now = time.perf_counter() if at is None else at
        if self._open:
            innermost = self._open[-1]
            self.seconds[innermost] = self.seconds.get(innermost, 0.0) + max(0.0, now - self._last)
        self._last = max(self._last, now)

    def breakdown(self, parts: Sequence[str], **flags: Any) -> dict[str, Any]:
        """Seconds (to 0.01) of ``startup``, each of ``parts``, ``other`` (the rest) and ``total``, from
        the origin until now, with ``measured_from`` and ``flags``. Parts still open are counted up to now.
        ``other`` is ``total`` less the rounded parts, so that the figures add up as shown (to 0.01 s)."""
        self._advance(None)
        total = round(time.perf_counter() - self.origin, 2)
        figures: dict[str, Any] = {"startup": None if self.startup is None else round(self.startup, 2)}
        figures |= {name: round(self.seconds.get(name, 0.0), 2) for name in parts}
        # never below zero: rounding the parts can take their sum 0.01 s past the total when nothing is left
        figures["other"] = max(0.0, round(total - sum(v for v in figures.values() if v is not None), 2))
        figures["total"] = total
        return {**figures, "measured_from": self.measured_from, **flags}
