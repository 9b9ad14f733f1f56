"""A matrix's cells die with their runner, however it dies, and one process at most trains a cell:
the folder lock names a live holder, and the lock of a dead one is taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import write_matrix
from test_resilience import LONG_LM, curves, matrix_args, results, run_matrix

from blockbench.lifeline import FolderHeld, hold, holder


def _python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], **kwargs)


def _wait(condition, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _holding(folder: Path) -> subprocess.Popen:
    """Another process that holds ``folder``'s lock (for 10 minutes), once it holds it."""
    owner = _python(f"""
        import time
        from blockbench.lifeline import hold
        with hold({str(folder)!r}):
            time.sleep(600)
    """)
    _wait(lambda: holder(folder) is not None, what="the other process to take the lock")
    return owner


def test_a_live_holder_is_named_and_a_dead_ones_lock_is_taken_over(tmp_path):
    folder = tmp_path / "cell"
    owner = _holding(folder)
    try:
        assert holder(folder).pid == owner.pid
        with pytest.raises(FolderHeld, match=rf"being trained by pid {owner.pid} on .*kill {owner.pid}"), hold(folder):
            pass
    finally:
        owner.kill()  # SIGKILL: no handler runs, the lock file stays with its pid
        owner.wait()
    assert (folder / ".lock").is_file() and holder(folder) is None  # the kernel released it
    with hold(folder):  # taken over
        assert holder(folder).pid == os.getpid()
    assert holder(folder) is None and not (folder / ".lock").exists()  # a finished holder leaves no file


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow  # a matrix run twice in subprocesses (minutes on 2 CPUs); run with -m slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_the_runner_alone_leaves_no_process_and_the_rerun_equals_an_uninterrupted_run(tmp_path):
    axes = {"model.norm_placement": ["pre", "post"]}
    # long enough that both cells are mid-run when the runner dies (150 steps take under a second on AVX-512)
    base = {
        **LONG_LM,
        "trainer": {**LONG_LM["trainer"], "max_steps": 1500, "val_every_n_steps": 500, "checkpoint_every_n_steps": 100},
    }
    killed = write_matrix(tmp_path / "killed", axes, base=base)
    runner = subprocess.Popen(
        [sys.executable, "-m", "blockbench", *matrix_args(killed), "--jobs", "2"],
        cwd=killed.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cells = killed.parent / "results/m/cells"
    _wait(
        lambda: len(list(cells.glob("*/*/*/checkpoints/last.ckpt"))) == 2, timeout=180, what="both cells' checkpoints"
    )
    processes = _descendants(runner.pid)
    assert len(processes) >= 3  # the fork server and the two cells forked from it
    os.kill(runner.pid, signal.SIGKILL)  # the runner's own pid, not its group: as the OOM killer does
    runner.wait()
    unfinished = [
        str(c.parents[1].relative_to(cells))
        for c in cells.glob("*/*/*/checkpoints/last.ckpt")
        if not (c.parents[1] / "result.json").exists()
    ]
    assert unfinished
    _wait(
        lambda: not any(_running(pid) for pid in processes),
        timeout=10,
        what=f"the runner's processes to end ({[pid for pid in processes if _running(pid)]})",
    )

    rerun = run_matrix(killed)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    reference = write_matrix(tmp_path / "reference", axes, base=base)
    assert run_matrix(reference).returncode == 0
    expected, got = results(reference), results(killed)
    assert got.keys() == expected.keys()
    for key, result in got.items():
        assert result.metrics == expected[key].metrics, key
        assert curves(result) == curves(expected[key]), key
    for key in unfinished:  # each killed cell resumed from its checkpoint
        assert got[key].resumed_from_step, key


def test_a_rerun_refuses_cells_that_a_live_run_holds(tmp_path, capsys):
    from blockbench.cli import main

    path = write_matrix(tmp_path, {"model.norm_placement": ["pre"]}, base=LONG_LM)
    folder = tmp_path / "results/m/cells/lm/norm_placement=pre/seed0"
    owner = _holding(folder)
    try:
        assert main(matrix_args(path)) == 2
        err = capsys.readouterr().err
        assert "lm/norm_placement=pre/seed0" in err and f"pid {owner.pid}" in err
        assert not (folder / "result.json").exists()
    finally:
        owner.kill()
        owner.wait()
