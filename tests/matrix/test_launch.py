"""How the runner starts a cell's process (``blockbench.matrix.launch``) and how many run at once
(``--jobs``, ``blockbench.matrix.jobs``).

A single-process cell is forked from a server that imported torch, Lightning and the tasks once;
its process must still be the cell's own: the environment, thread count and output it was given,
the exit code it ended with, and the same numbers a fresh interpreter computes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_LM, blockbench, write_matrix

from blockbench import walltime
from blockbench.cli import build_parser
from blockbench.config import ConfigError, build_run_config
from blockbench.matrix import jobs, launch
from blockbench.matrix.jobs import forks, resolve_jobs
from blockbench.matrix_command import run_matrix

PRELOADED = ["lightning", "torchmetrics", "blockbench.cell.train"]


def _child_entry(path: str, environment: dict[str, str]) -> None:
    """Child: which modules it has before importing anything itself; then, set up as ``_train_child``
    sets up a cell, its environment and threads."""
    preloaded = {name: name in sys.modules for name in PRELOADED}
    launch._enter_cell(environment, None)
    with open(path, "w") as f:
        json.dump(
            {
                "preloaded": preloaded,
                "forked": walltime.FORKED,
                "marker": os.environ.get("BLOCKBENCH_TEST_MARKER"),
                "threads": torch.get_num_threads(),
            },
            f,
        )


def test_a_forked_child_has_the_imports_done_and_its_own_environment(tmp_path):
    out = tmp_path / "report.json"
    environment = {**os.environ, "BLOCKBENCH_TEST_MARKER": "cell-7", "OMP_NUM_THREADS": "1"}
    process = launch._server().Process(target=_child_entry, args=(str(out), environment))
    process.start()
    process.join()
    assert process.exitcode == 0
    report = json.loads(out.read_text())
    # the server imported these before forking: the cell pays nothing for them
    assert report["preloaded"] == {name: True for name in PRELOADED}
    assert report["marker"] == "cell-7" and report["threads"] == 1 and report["forked"] is True


def test_run_forked_returns_the_exit_code_and_writes_the_log(tmp_path):
    log = tmp_path / "train.log"
    # a bad command line: the CLI's own error, exit code 2, in the cell's log
    code = launch.run_forked(["-m", "blockbench", "train", str(tmp_path / "missing.yaml")], dict(os.environ), log)
    assert code != 0
    assert "missing.yaml" in log.read_text()


def test_forked_cell_computes_what_a_fresh_interpreter_computes(tmp_path):
    """The same tiny cell trained as a matrix cell (forked) and by ``blockbench train`` in a new
    interpreter: bit-identical metrics and loss history."""
    config = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "num_threads": 1, "peak_tflops": 0.05}}
    path = write_matrix(tmp_path, {"seed": [0]}, base=config)
    results = tmp_path / "results"
    assert run_matrix(path, results) == 0
    cell_dir = results / "m/cells/lm/default/seed0"
    forked = json.loads((cell_dir / "result.json").read_text())
    assert forked["wall_time_breakdown"]["measured_from"].startswith("process start (forked")

    fresh_dir = tmp_path / "fresh"
    process = blockbench(
        "train",
        str(cell_dir / "config.yaml"),
        "--out",
        str(fresh_dir),
        "--tb-dir",
        str(tmp_path / "tb"),
        "--quiet",
        cwd=tmp_path,
    )
    assert process.returncode == 0, process.stderr[-2000:]
    fresh = json.loads((fresh_dir / "result.json").read_text())
    assert fresh["wall_time_breakdown"]["measured_from"] == "process start"
    assert forked["metrics"] == fresh["metrics"]
    assert [h["metrics"] for h in forked["history"]] == [h["metrics"] for h in fresh["history"]]


def _where_it_ran(path: str) -> None:
    """In the server's child: its process id and whether Lightning was there without importing it."""
    Path(path).write_text(json.dumps({"pid": os.getpid(), "lightning": "lightning" in sys.modules}))


def _fails() -> None:
    raise ValueError("no peak here")


def test_run_in_server_calls_in_a_forked_child_and_raises_when_it_fails(tmp_path):
    """What the runner hands to the server (the peak FLOP/s probe) runs in a child that has Lightning
    imported, not in the runner; a failure there stops the runner with the child's error above."""
    out = tmp_path / "where.json"
    launch.run_in_server(_where_it_ran, str(out))
    where = json.loads(out.read_text())
    assert where["pid"] != os.getpid() and where["lightning"] is True
    with pytest.raises(RuntimeError, match=r"_fails failed in a process forked from the cell server \(exit code 1"):
        launch.run_in_server(_fails)


def test_the_runner_and_the_report_import_no_lightning():
    """The runner leaves Lightning (and torchmetrics, which it imports) to the cell server: a fresh
    interpreter importing the runner's and the report's modules has neither."""
    modules = ["blockbench.cli", "blockbench.matrix_command", "blockbench.matrix.run", "blockbench.report.summary"]
    code = f"import sys; import {', '.join(modules)}; print(sorted({{'lightning', 'torchmetrics'}} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_only_single_process_cells_fork():
    assert forks(build_run_config(TINY_LM))
    ddp = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "accelerator": "cpu", "devices": 2, "strategy": "ddp"}}
    assert not forks(build_run_config(ddp))  # Lightning relaunches the entry script: a subprocess


def test_jobs_auto_runs_one_cell_per_core_and_never_more_than_the_matrix_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(jobs, "cpu_cores", lambda: 8)
    assert resolve_jobs("auto", 18) == 8
    assert resolve_jobs("auto", 3) == 3  # the matrix's size, not the cells left: a resumed run keeps its threads
    assert [slot.threads for slot in jobs.job_slots(resolve_jobs("auto", 3))] == [2, 2, 2]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert resolve_jobs("auto", 18) == 4  # one cell per GPU
    assert resolve_jobs(5, 18) == 5
    with pytest.raises(ConfigError, match="--jobs 0: give a number"):
        resolve_jobs(0, 18)


def test_jobs_flag_takes_auto_by_default_and_rejects_words():
    parser = build_parser()
    assert parser.parse_args(["matrix", "m.yaml"]).jobs == "auto"
    assert parser.parse_args(["matrix", "m.yaml", "--jobs", "3"]).jobs == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["matrix", "m.yaml", "--jobs", "many"])


# --- stopping the cells (the runner terminated) ------------------------------------------------------

#: a cell process that would run for a minute and takes Ctrl-C as Python's default does, whatever this
#: process does with SIGINT; it touches the file named by its argument when it is ready
SLEEPER = [
    sys.executable,
    "-c",
    "import pathlib, signal, sys, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)",
]


def _start_cell(command: list[str], ready: Path) -> tuple[threading.Thread, dict[str, int]]:
    """``command`` (given ``ready`` as its argument) started as the runner starts a cell, in a thread;
    returns once it is ready."""
    ended: dict[str, int] = {}
    thread = threading.Thread(
        target=lambda: ended.setdefault("code", launch.run_subprocess([*command, str(ready)], dict(os.environ)))
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.05)
    assert ready.exists() and launch._running
    return thread, ended


def test_stopping_the_cells_signals_each_running_one_and_starts_no_other(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "_stop_signal", None)
    thread, ended = _start_cell(SLEEPER, tmp_path / "ready")
    launch.stop_cells()
    thread.join(timeout=10)
    assert ended["code"] == -signal.SIGINT  # Ctrl-C's signal: a cell shuts down as on Ctrl-C
    assert launch.stopping() and not launch._running
    with pytest.raises(KeyboardInterrupt):  # a cell about to start once the stop began never starts
        launch.run_subprocess(["true"], dict(os.environ))


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread() or not Path("/proc/self/stat").exists(),
    reason="signal handlers: main thread only; the process table from /proc (Linux)",
)
def test_sigterm_stops_the_running_cells_and_interrupts_the_runner(tmp_path):
    """The first SIGTERM ends the cells as Ctrl-C would and interrupts the runner; a second, while the
    runner waits for them, kills them and what they started; after a SIGTERM no cell starts."""
    previous = signal.getsignal(signal.SIGTERM)
    thread, ended = _start_cell(SLEEPER, tmp_path / "ready")
    with pytest.raises(KeyboardInterrupt), launch.stop_cells_on_sigterm() as received:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises before this ends
    thread.join(timeout=10)
    assert received == [signal.SIGTERM] and ended["code"] == -signal.SIGINT
    assert signal.getsignal(signal.SIGTERM) is previous
    assert launch.stopping()  # the process is ending: a cell thread that was about to start does not
    launch._stop_signal = None

    # a cell that ignores SIGINT (stuck where Ctrl-C does not reach it) and has a child of its own (a DDP rank)
    pid_file = tmp_path / "grandchild"
    stubborn = [
        sys.executable,
        "-c",
        "import pathlib, signal, subprocess, sys, time; signal.signal(signal.SIGINT, "
        "signal.SIG_IGN); child = subprocess.Popen(['sleep', '60']); "
        f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid)); pathlib.Path(sys.argv[1]).touch(); "
        "time.sleep(60)",
    ]
    thread, ended = _start_cell(stubborn, tmp_path / "ready2")
    grandchild = int(pid_file.read_text())
    with pytest.raises(KeyboardInterrupt), launch.stop_cells_on_sigterm() as received:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        except KeyboardInterrupt:  # the runner now waits for its cells, as its pool does
            os.kill(os.getpid(), signal.SIGTERM)
            thread.join(timeout=10)
            raise
    assert received == [signal.SIGTERM, signal.SIGTERM] and ended["code"] == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
    launch._stop_signal = None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_forked_cell_takes_ctrl_c_even_when_the_runner_was_started_with_it_ignored(tmp_path):
    """A shell without job control starts a background job (``blockbench matrix ... &`` in a script)
    with SIGINT ignored, and every child inherits that: the cells must still stop on the runner's SIGINT."""
    (tmp_path / "sleeper.py").write_text(
        "import pathlib, sys, time\npathlib.Path(sys.argv[1]).touch()\ntime.sleep(60)\n"
    )
    ready = tmp_path / "ready"
    runner = f"""
import os, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.path.insert(0, {str(tmp_path)!r})  # the cell server starts with this process's path: it finds sleeper.py
from blockbench.matrix import launch
ended = {{}}
thread = threading.Thread(target=lambda: ended.setdefault("code", launch.run_forked(
    ["-m", "sleeper", {str(ready)!r}], dict(os.environ))))
thread.start()
while not os.path.exists({str(ready)!r}) and thread.is_alive():
    time.sleep(0.05)
print("ready" if os.path.exists({str(ready)!r}) else "never ready", flush=True)
launch.stop_cells()
thread.join(timeout=20)
print("still running" if thread.is_alive() else ended["code"], flush=True)
launch.stop_cells(signal.SIGKILL)  # without accept_interrupts the sleeper would outlive this script
thread.join(timeout=20)
os._exit(0)
"""
    done = subprocess.run([sys.executable, "-c", runner], capture_output=True, text=True, timeout=120)
    # KeyboardInterrupt in the forked child: multiprocessing reports an exception as exit code 1
    assert done.stdout.split() == ["ready", "1"], done.stdout + done.stderr[-2000:]
