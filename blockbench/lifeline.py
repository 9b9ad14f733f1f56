"""A cell's tie to the runner that started it, and the lock that keeps one process per cell folder.

A runner killed outright (``kill -9``, the OOM killer) runs no handler, so its cells would go on
training, reparented to init, into folders that a rerun trains again. Each cell therefore dies with
its runner, however the runner died: on Linux the kernel sends the cell SIGKILL when its parent
exits (``prctl(PR_SET_PDEATHSIG)``, what systemd and torchrun's workers rely on), and on every
platform a watch thread in the cell checks that the runner's pid (:data:`RUNNER_ENV`) is alive and
kills the cell when it is gone (DDP ranks, which Lightning starts, carry the same variable). A killed
cell loses only its steps since its last checkpoint: the rerun resumes from it.

And no two processes train one cell: the training process holds an advisory lock on its folder
(``flock`` on :data:`LOCK_FILE`, with the holder's pid, host and start time in the file, as pip's and
Lightning's file locks do). The kernel releases it when the holder dies, so a lock left by a dead
process is simply taken over; a live holder is named (:func:`holder`), and the runner refuses to
start cells that another live run holds. Standard library only: the runner imports it without torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: the environment variable that gives a cell (and its DDP ranks) the pid of the runner it dies with
RUNNER_ENV = "BLOCKBENCH_RUNNER_PID"
#: how often a cell's watch thread checks its runner (seconds)
WATCH_INTERVAL_S = 1.0
#: the lock file in a cell's (or a ``blockbench train`` run's) folder
LOCK_FILE = ".lock"
#: prctl's option to have the kernel signal this process when its parent exits (linux/prctl.h)
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process (SIGKILL) when its parent exits, on Linux; call it in the
    child, first thing. If the parent ``parent_pid`` already exited before the call, exit now."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the call: nobody would signal us
        os._exit(1)


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (a zombie counts until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def watch_runner(pid: int | None = None, *, interval: float = WATCH_INTERVAL_S) -> threading.Thread | None:
    """Kill this process (SIGKILL) once the runner ``pid`` (default: :data:`RUNNER_ENV`'s) is gone:
    a daemon thread that checks every ``interval`` seconds. None (and no thread) outside a runner."""
    if pid is None:
        value = os.environ.get(RUNNER_ENV, "")
        if not value.isdigit():
            return None
        pid = int(value)

    def watch() -> None:
        while alive(pid) and os.getppid() != 1:  # reparented to init: the parent (runner or server) is gone
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="blockbench-runner-watch", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class Holder:
    """Who holds a folder's lock: as the holder wrote it into the lock file."""

    pid: int | None
    host: str
    since: str

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host or 'an unknown host'}" + (f" since {self.since}" if self.since else "")


class FolderHeld(RuntimeError):
    """Other live processes hold folders this one was to train: ``held`` maps a name (a cell's key,
    a folder) to its holder."""

    def __init__(self, held: dict[str, Holder]):
        pids = " ".join(str(h.pid) for h in held.values() if h.pid is not None)
        lines = [f"{name} is being trained by {holder}" for name, holder in held.items()]
        super().__init__(
            "; ".join(lines)
            + "; wait for that run to finish, or stop it"
            + (f" (kill {pids})" if pids else "")
            + " and run again: its checkpoints resume"
        )
        self.held = held


def _read_holder(path: Path) -> Holder:
    fields = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line) if path.is_file() else {}
    pid = fields.get("pid", "")
    return Holder(int(pid) if pid.isdigit() else None, fields.get("host", ""), fields.get("since", ""))


def holder(folder: Path) -> Holder | None:
    """Who holds ``folder``'s lock now, or None if nobody does (no lock file, or its holder died)."""
    path = Path(folder) / LOCK_FILE
    try:
        file = path.open("r")
    except FileNotFoundError:
        return None
    with file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(path)
        fcntl.flock(file, fcntl.LOCK_UN)
    return None


@contextlib.contextmanager
def hold(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock while the block runs (raise :class:`FolderHeld` if a live process holds
    it). The lock file names this process (pid, host, start time) for others to read, and is removed
    when the block ends; a process killed meanwhile leaves it, and the next one takes it over."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    while True:
        file = path.open("a+")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.close()
            raise FolderHeld({str(folder): _read_holder(path)}) from None
        try:
            same = os.stat(path).st_ino == os.fstat(file.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        file.close()  # its holder removed the file after we opened it: lock the file that is there now
    try:
        file.seek(0)
        file.truncate()
        file.write(f"pid={os.getpid()}\nhost={socket.gethostname()}\nsince={time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        file.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # while still holding it: a waiter that opened it retries on the new file
        fcntl.flock(file, fcntl.LOCK_UN)
        file.close()
