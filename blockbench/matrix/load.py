"""How busy other processes kept the machine while a cell ran, measured by the runner from outside the
cell (the cell's own code is fingerprinted, and a process cannot see its own end).

While a cell's process runs, a thread of the runner reads two counters every ``interval`` seconds: the
machine's busy CPU time over all its cores (the first line of ``/proc/stat``) and the CPU time of the
cell's process tree (``/proc/<pid>/stat`` of the cell and of every process below it, each with its
reaped children's time, so that a data worker that ended still counts). The window is from the first
reading to the last one taken while the cell was alive: the machine's busy seconds in it less the
cell's are what other processes took, a :class:`blockbench.store.record.CellLoad` that the runner writes
next to the cell's result. Without ``/proc`` (macOS, Windows) there is nothing to read, and no record.

The standard library and the record's type only: the runner imports this module without torch.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..store.record import CellLoad

PROC = Path("/proc")
#: seconds between two readings: a cell's last second or less goes unmeasured, at a few ms of CPU a reading
INTERVAL_S = 1.0


def clock_ticks() -> int:
    """The unit of /proc's CPU times per second (``USER_HZ``, 100 on Linux)."""
    return os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy(stat_text: str, ticks: int) -> tuple[float, int]:
    """The machine's busy CPU seconds since boot and its number of CPUs, from the text of ``/proc/stat``.
    Its first line sums every CPU's ticks: ``cpu user nice system idle iowait irq softirq steal guest
    guest_nice``; busy is all but idle and iowait (guest time is already in user and nice, so it is not
    added again; steal, time a hypervisor gave to other machines, is time the cell could not have).
    The CPUs are its ``cpu<N>`` lines."""
    lines = stat_text.splitlines()
    fields = lines[0].split() if lines else []
    if not fields or fields[0] != "cpu":
        raise ValueError("not the text of /proc/stat: its first line is not the sum over the CPUs")
    user, nice, system, _idle, _iowait, irq, softirq, steal = ([int(v) for v in fields[1:9]] + [0] * 8)[:8]
    cores = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return (user + nice + system + irq + softirq + steal) / ticks, cores


def _stat_fields(stat_text: str) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` text from field 3 (state) on: counted after the command
    name, which is in parentheses and may hold spaces or parentheses itself."""
    return stat_text[stat_text.rindex(")") + 2 :].split()


def process_ticks(stat_text: str) -> int:
    """A process's CPU ticks with those of its reaped children (utime, stime, cutime, cstime: fields
    14-17 of ``/proc/<pid>/stat``)."""
    fields = _stat_fields(stat_text)
    return sum(int(fields[field - 3]) for field in (14, 15, 16, 17))


def process_tree(pid: int, proc: Path = PROC) -> list[int]:
    """``pid`` and the processes below it (children, theirs, ...), from /proc: each process's
    ``task/*/children`` where the kernel has them (one small file per process), else by reading every
    process's parent (field 4 of its stat). Just ``[pid]`` where /proc has none of them."""
    if (proc / str(pid) / "task" / str(pid) / "children").is_file():
        found, todo = [], [pid]
        while todo:
            process = todo.pop()
            found.append(process)
            for children in (proc / str(process) / "task").glob("*/children"):
                try:
                    todo += [int(child) for child in children.read_text().split()]
                except (OSError, ValueError):  # it ended while we looked
                    continue
        return found
    parents: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            parents.setdefault(int(_stat_fields(stat.read_text())[4 - 3]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):  # it ended while we looked
            continue
    found, todo = [], [pid]
    while todo:
        process = todo.pop()
        found.append(process)
        todo += parents.get(process, [])
    return found


@dataclass(frozen=True)
class CpuReading:
    """The counters at one moment: the machine's busy CPU seconds since boot, its CPUs, and the CPU
    seconds of a process tree (each process's own and its reaped children's: a child that ended and
    was waited for moves into its parent's count, so the sum over the tree never loses it)."""

    at: float  # time.monotonic()
    machine_s: float
    cores: int
    tree_s: float


def read_counters(pid: int, proc: Path = PROC, at: float | None = None, ticks: int | None = None) -> CpuReading | None:
    """The counters for the process tree of ``pid`` now (``at``: the time to stamp, default now;
    ``ticks``: /proc's ticks per second, default the system's); None where they cannot be read (no
    /proc, or the process has ended)."""
    ticks = ticks or clock_ticks()
    try:
        machine_s, cores = machine_busy((proc / "stat").read_text(), ticks)
    except (OSError, ValueError, IndexError):
        return None
    tree = 0
    for process in process_tree(pid, proc):
        try:
            tree += process_ticks((proc / str(process) / "stat").read_text())
        except (OSError, IndexError, ValueError):
            if process == pid:
                return None  # the cell has ended (or there is no /proc)
            # a process below it ended: its parent has its ticks once it reaps it
    return CpuReading(time.monotonic() if at is None else at, machine_s, cores, tree / ticks)


def load_between(first: CpuReading, last: CpuReading, interval_s: float | None = None) -> CellLoad | None:
    """The cell's load from its first reading to its last (None if they are not apart in time)."""
    wall = last.at - first.at
    if wall <= 0:
        return None
    return CellLoad(
        wall_s=round(wall, 3),
        cores=last.cores,
        machine_cpu_s=round(last.machine_s - first.machine_s, 3),
        cell_cpu_s=round(last.tree_s - first.tree_s, 3),
        interval_s=interval_s,
    )


class LoadMeter:
    """Reads the counters of one cell's process while it runs (:meth:`watch` once it has started,
    :meth:`stop` once it has ended), in a thread of its own; :meth:`load` is the result."""

    def __init__(self, interval_s: float = INTERVAL_S, proc: Path = PROC):
        self.interval_s = interval_s
        self.proc = proc
        self._first: CpuReading | None = None
        self._last: CpuReading | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pid: int) -> None:
        """Take the first reading of ``pid``'s tree now, then one every interval until :meth:`stop`."""
        self._first = self._last = read_counters(pid, self.proc)
        if self._first is None:
            return  # no /proc: nothing to measure
        self._thread = threading.Thread(target=self._run, args=(pid,), name=f"load-{pid}", daemon=True)
        self._thread.start()

    def _run(self, pid: int) -> None:
        """Read every ``interval_s``, the first readings sooner (from a tenth of it, doubling), so that a
        cell of a second or less still has two readings apart in time."""
        wait = self.interval_s / 10
        while not self._stop.wait(wait):
            reading = read_counters(pid, self.proc)
            if reading is None:  # it has ended: the last reading closes the window
                return
            self._last = reading
            wait = min(self.interval_s, 2 * wait)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def load(self) -> CellLoad | None:
        """The cell's load over the readings taken (None: fewer than two, or none at all)."""
        if self._first is None or self._last is None:
            return None
        return load_between(self._first, self._last, self.interval_s)
