"""Start a cell's ``blockbench train`` process without paying for its imports each time.

A fresh interpreter spends 10-15 s importing torch, Lightning and torchmetrics (which pulls in
transformers, torchvision and scipy when they are installed) before a small cell trains for a
minute. The runner therefore forks each single-process cell from a server that has imported
them once: Python's ``forkserver`` start method with a preload list, the standard library's own
answer to this cost. Each cell still gets a process of its own (a crash or a leak stays in it;
its RNG, environment and threads are set afresh), and it runs the same ``blockbench train``
command line it would as a subprocess. Multi-process cells (DDP) keep the subprocess: Lightning's
launcher relaunches the entry script, which a forked child does not have.

The runner's cells are its children: :func:`stop_cells_on_sigterm` ends them when the runner is
terminated (``kill``, a scheduler), as Ctrl-C, which reaches the whole process group, ends them.

No torch at import (the standard library, and the load record's type): the runner imports this module
without torch.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from .. import walltime
from .load import LoadMeter, process_tree

#: what the server imports once, before it forks any cell (everything ``blockbench train`` imports)
PRELOAD = [
    "torch",
    "lightning",
    "torchmetrics",
    "blockbench.cli",
    "blockbench.cell.train",
    "blockbench.tasks.implementations",
    "blockbench.models",
]


def forkserver_available() -> bool:
    """Whether this platform has the forkserver start method (Linux and macOS; not Windows)."""
    return "forkserver" in multiprocessing.get_all_start_methods()


@functools.cache
def _server() -> multiprocessing.context.ForkServerContext:
    """The forkserver context, its preload set once (the server starts at the first fork)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _started() -> None:
    """A child that does nothing: its fork returns once the server has finished its imports."""


def start_server() -> None:
    """Start the server and wait until it has done its imports (a fork returns only after them), so
    that the time goes to the matrix's own start-up rather than to its first cell."""
    _fork(_started)


def run_in_server(target: Callable[..., None], *args: object) -> None:
    """Call ``target(*args)`` (a module-level function and picklable arguments) in a process forked
    from the started server, which has the imports of :data:`PRELOAD`, and wait for it: work that
    needs Lightning without importing it here. Its output goes where this process's does."""
    sys.stdout.flush()
    sys.stderr.flush()
    code = _fork(target, *args)
    if code != 0:
        name = f"{target.__module__}.{target.__qualname__}"
        raise RuntimeError(
            f"{name} failed in a process forked from the cell server (exit code {code}; its error is above)"
        )


def _enter_cell(environment: dict[str, str], log_file: str | None) -> None:
    """Make this forked process the cell's: its environment, its output, its threads, Ctrl-C."""
    walltime.FORKED = True
    accept_interrupts()
    os.environ.clear()
    os.environ.update(environment)
    if log_file is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    threads = environment.get("OMP_NUM_THREADS")
    if threads:
        import torch

        # OpenMP read OMP_NUM_THREADS when the server loaded it; a fresh interpreter would have read
        # this cell's value: set it as that interpreter would have it (trainer.num_threads still wins)
        torch.set_num_threads(int(threads))


def _train_child(arguments: list[str], environment: dict[str, str], log_file: str | None) -> None:
    """A cell's process, forked from the server: set up as the cell's, then ``python -m <module> <args>``
    as the interpreter would run it (``runpy``, which is what ``-m`` does)."""
    _enter_cell(environment, log_file)
    module, argv = arguments[1], arguments[2:]
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run_forked(
    arguments: list[str], environment: dict[str, str], log_file: Path | None = None, meter: LoadMeter | None = None
) -> int:
    """Run ``python <arguments>`` (``-m <module> ...``, the form the runner's cell command has) in a
    process forked from the preloaded server, with ``environment`` as its whole environment and its
    output to ``log_file`` (else this process's); return its exit code as ``subprocess`` reports one
    (negative: killed by that signal). ``meter`` watches the machine's load while it runs."""
    if len(arguments) < 2 or arguments[0] != "-m":
        raise ValueError(f"run_forked runs `-m <module> [args]`, not {arguments!r}")
    log = None if log_file is None else str(log_file)
    return _fork(_train_child, arguments, environment, log, meter=meter)


def _fork(target, *args, meter: LoadMeter | None = None) -> int:
    """Run ``target(*args)`` in a process forked from the server, wait for it, return its exit code."""
    process = _server().Process(target=target, args=args)

    def start() -> tuple[int, Callable[[int], None]]:
        process.start()
        # os.kill, not the Process's methods: polling it here would race the thread that joins it
        return process.pid, functools.partial(os.kill, process.pid)

    with _running_cell(start, meter):
        process.join()
    return process.exitcode


def run_subprocess(
    command: list[str], environment: dict[str, str], log_file: Path | None = None, meter: LoadMeter | None = None
) -> int:
    """Run ``command`` as a subprocess with ``environment`` and its output to ``log_file`` (else this
    process's); return its exit code (negative: killed by that signal). The cell form for multi-process
    (DDP) cells, which Lightning's launcher must be able to relaunch. ``meter`` watches the machine's
    load while it runs."""
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(log_file.open("w")) if log_file is not None else None
        processes: list[subprocess.Popen] = []

        def start() -> tuple[int, Callable[[int], None]]:
            processes.append(
                subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT if log else None)
            )
            return processes[0].pid, processes[0].send_signal  # send_signal skips a process already reaped

        with _running_cell(start, meter):
            return processes[0].wait()


# --- stopping the cells ------------------------------------------------------------------------------

#: guards the two below; reentrant: a second SIGTERM's handler can run while the first's holds it
_lock = threading.RLock()
_running: dict[int, Callable[[int], None]] = {}  # pid -> how to signal it, for each cell process running now
_stop_signal: int | None = None  # set once the runner stops its cells: no cell starts after that


@contextlib.contextmanager
def _running_cell(
    start: Callable[[], tuple[int, Callable[[int], None]]], meter: LoadMeter | None = None
) -> Iterator[None]:
    """Start a cell process (``start()`` returns its pid and how to signal it) and count it as running
    until the block ends, ``meter`` (if any) watching its load meanwhile; once the cells are being
    stopped, start none (KeyboardInterrupt: it resumes next time)."""
    with _lock:  # a cell either starts before the stop, and is stopped, or not at all
        if _stop_signal is not None:
            raise KeyboardInterrupt
        pid, send = start()
        _running[pid] = send
    if meter is not None:
        meter.watch(pid)
    try:
        yield
    finally:
        if meter is not None:
            meter.stop()
        with _lock:
            _running.pop(pid, None)


def stopping() -> bool:
    """Whether the runner is stopping its cells: a cell that ends now was stopped, not broken."""
    return _stop_signal is not None


def accept_interrupts() -> None:
    """Ctrl-C's default handling (KeyboardInterrupt) in a cell's process, even if the runner was
    started with SIGINT ignored: a shell without job control starts a background job (``cmd &`` in a
    script) so, and every child inherits it, but the runner stops its cells with SIGINT."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_cells(signum: int = signal.SIGINT) -> None:
    """Send ``signum`` to every running cell and start no other. SIGINT (the default) is Ctrl-C's
    signal: a cell shuts down gracefully (Lightning), records no result and resumes from its last
    checkpoint next time; a DDP cell's launcher ends its other processes itself. SIGKILL also goes to
    each cell's descendants (a DDP cell's other ranks, data workers): a killed launcher ends nothing."""
    global _stop_signal
    with _lock:
        _stop_signal = signum
        for pid, send in list(_running.items()):
            if signum == signal.SIGKILL:
                for descendant in _descendants(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(descendant, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                send(signum)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, theirs, ...), from /proc on Linux; none found elsewhere."""
    return process_tree(pid)[1:]


@contextlib.contextmanager
def stop_cells_on_sigterm() -> Iterator[list[int]]:
    """While the block runs, SIGTERM (``kill``, a scheduler ending the job) ends the cells as Ctrl-C
    does (:func:`stop_cells` with SIGINT) and raises KeyboardInterrupt here, so the runner waits for
    them and exits as on Ctrl-C; a second SIGTERM kills them at once (SIGKILL). Without it the runner
    would die alone and leave its forked cells training unattended. Yields the signals received.
    Only the main thread can set signal handlers: elsewhere (a runner called from a thread) this does nothing."""
    global _stop_signal
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def on_sigterm(signum: int, frame) -> None:
        received.append(signum)
        if len(received) == 1:
            stop_cells(signal.SIGINT)
            raise KeyboardInterrupt
        stop_cells(signal.SIGKILL)  # the runner is already waiting for them: they end, it returns

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not received:  # after a SIGTERM the process is ending: a cell thread still starting must not start
            with _lock:
                _stop_signal = None
