"""The load a cell ran under, as the runner measures it from /proc (``blockbench.matrix.load``): the
machine's busy CPU time less the cell's process tree's, from hand-written /proc files whose readings
give a known share, and from a real process tree whose CPU time is known."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from blockbench.matrix import launch
from blockbench.matrix.load import LoadMeter, load_between, machine_busy, process_tree, read_counters

STAT_BEFORE = """cpu  1000 50 300 5000 20 0 10 5 40 0
cpu0 500 25 150 2500 10 0 5 3 20 0
cpu1 500 25 150 2500 10 0 5 2 20 0
intr 12345 0 0
ctxt 999
"""
STAT_AFTER = """cpu  1900 50 420 5200 25 0 15 5 60 0
cpu0 950 25 210 2600 12 0 7 3 30 0
cpu1 950 25 210 2600 13 0 8 2 30 0
intr 23456 0 0
ctxt 1999
"""


def _process_stat(pid: int, parent: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0) -> str:
    """A ``/proc/<pid>/stat`` line: its command name has spaces and parentheses, as a cell's may."""
    fields = ["S", parent, *[0] * 9, utime, stime, cutime, cstime, *[0] * 35]  # fields 3 (state) to 52
    return f"{pid} (python (cell) -m x) " + " ".join(map(str, fields)) + "\n"


def _fake_proc(root: Path, stat: str, processes: dict[int, tuple[int, int, int, int, int]], children: bool) -> Path:
    """A /proc with ``stat`` and each process's stat (pid -> parent, utime, stime, cutime, cstime), with
    ``task/<pid>/children`` files where ``children`` (else the tree is read from the parents)."""
    root.mkdir(parents=True)
    (root / "stat").write_text(stat)
    for pid, (parent, *ticks) in processes.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(_process_stat(pid, parent, *ticks))
        if children:
            (root / str(pid) / "task" / str(pid)).mkdir(parents=True)
            mine = [str(child) for child, (p, *_) in processes.items() if p == pid]
            (root / str(pid) / "task" / str(pid) / "children").write_text(" ".join(mine) + (" " if mine else ""))
    return root


def test_the_machine_busy_time_leaves_out_idle_iowait_and_guest():
    """busy = user + nice + system + irq + softirq + steal: 1000 + 50 + 300 + 0 + 10 + 5 = 1365 ticks; idle
    (5000), iowait (20) and guest (40, already in user) are not; the CPUs are the cpu<N> lines."""
    assert machine_busy(STAT_BEFORE, 100) == (pytest.approx(13.65), 2)
    assert machine_busy(STAT_AFTER, 100) == (pytest.approx(23.90), 2)  # 1900 + 50 + 420 + 15 + 5 = 2390
    with pytest.raises(ValueError):
        machine_busy("intr 1 2 3\n", 100)


@pytest.mark.parametrize("children", [True, False])
def test_a_cells_load_from_two_readings_of_proc(tmp_path, children):
    """The cell (pid 500) and its data worker (501), beside an unrelated process (600), read 10 s apart.
    The machine: 2390 - 1365 = 1025 busy ticks = 10.25 s. The cell's tree: 100 + 20 + 30 + 5 = 155 ticks
    before; after, 500 + 60 + 40 + 5 (a worker it reaped: cutime, cstime) + 130 + 15 = 750: 5.95 s. Other
    processes took 10.25 - 5.95 = 4.30 s: 0.43 of a core on average, 0.215 of the machine's 2."""
    before = {500: (10, 100, 20, 0, 0), 501: (500, 30, 5, 0, 0), 600: (1, 400, 100, 0, 0)}
    after = {500: (10, 500, 60, 40, 5), 501: (500, 130, 15, 0, 0), 600: (1, 800, 200, 0, 0)}
    first_proc = _fake_proc(tmp_path / "before", STAT_BEFORE, before, children)
    last_proc = _fake_proc(tmp_path / "after", STAT_AFTER, after, children)
    assert sorted(process_tree(500, first_proc)) == [500, 501]
    first = read_counters(500, first_proc, at=50.0, ticks=100)
    last = read_counters(500, last_proc, at=60.0, ticks=100)
    assert (first.machine_s, first.tree_s, first.cores) == (pytest.approx(13.65), pytest.approx(1.55), 2)
    load = load_between(first, last, interval_s=1.0)
    assert (load.wall_s, load.cores, load.interval_s) == (10.0, 2, 1.0)
    assert (load.machine_cpu_s, load.cell_cpu_s) == (pytest.approx(10.25), pytest.approx(5.95))
    assert (load.other_cpu_s, load.other_cores, load.other_share) == pytest.approx((4.30, 0.43, 0.215))
    assert load_between(last, last) is None  # no time apart: nothing measured


def test_no_proc_or_no_process_reads_as_nothing(tmp_path):
    """Without /proc (macOS) there is no reading and no record; nor once the process has gone."""
    assert read_counters(os.getpid(), tmp_path / "no-proc") is None
    meter = LoadMeter(proc=tmp_path / "no-proc")
    meter.watch(os.getpid())
    meter.stop()
    assert meter.load() is None
    proc = _fake_proc(tmp_path / "proc", STAT_BEFORE, {500: (10, 1, 1, 0, 0)}, children=True)
    assert read_counters(501, proc) is None


BUSY = """
import subprocess, sys, time
burn = "import time\\nwhile time.process_time() < 0.5: pass"
helper = subprocess.Popen([sys.executable, "-c", burn])  # a process below the cell, as a data worker is
while time.process_time() < 1.0:
    pass
helper.wait()
time.sleep(0.3)  # idle at the end: the last readings see the CPU time of both
"""


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="the runner measures load from /proc (Linux)")
def test_the_meter_counts_the_cell_process_tree_as_the_cells_own(tmp_path):
    """A cell that burns 1.0 s of CPU and starts a process that burns 0.5 s: the meter, watching it run as
    the runner runs a cell, counts their 1.5 s (and the interpreters' start-up) as the cell's own, and
    the machine's busy time over the same window includes it."""
    meter = LoadMeter(interval_s=0.1)
    assert launch.run_subprocess([sys.executable, "-c", BUSY], dict(os.environ), meter=meter) == 0
    load = meter.load()
    assert load is not None and load.wall_s > 1.0 and load.cores >= 1
    assert 1.3 <= load.cell_cpu_s <= 2.2  # less what the tree spent before the first reading
    assert load.machine_cpu_s >= load.cell_cpu_s - 0.05  # read a few ms apart, at 10 ms ticks


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="the runner measures load from /proc (Linux)")
def test_a_cell_shorter_than_the_interval_still_has_a_load(tmp_path):
    """The meter's first readings come sooner than its interval, so a cell of half a second, which ends
    before the first one-second reading, still gets a window of two readings."""
    meter = LoadMeter(interval_s=1.0)
    code = "import time\nwhile time.process_time() < 0.5: pass"
    assert launch.run_subprocess([sys.executable, "-c", code], dict(os.environ), meter=meter) == 0
    load = meter.load()
    assert load is not None and 0.1 <= load.wall_s < 1.0 and load.cell_cpu_s > 0
