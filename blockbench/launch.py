"""Start a cell's ``blockbench train`` process without paying for its imports each time.

A fresh interpreter spends 10-15 s importing torch, Lightning and torchmetrics (which pulls in
transformers, torchvision and scipy when they are installed) before a small cell trains for a
minute. The runner therefore forks each single-process cell from a server that has imported
them once: Python's ``forkserver`` start method with a preload list, the standard library's own
answer to this cost. Each cell still gets a process of its own (a crash or a leak stays in it;
its RNG, environment and threads are set afresh), and it runs the same ``blockbench train``
command line it would as a subprocess. Multi-process cells (DDP) keep the subprocess: Lightning's
launcher relaunches the entry script, which a forked child does not have.

Standard library only at import: the runner imports this module without torch.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import runpy
import sys
from pathlib import Path

from . import walltime

#: what the server imports once, before it forks any cell (everything ``blockbench train`` imports)
PRELOAD = ["torch", "lightning", "torchmetrics", "blockbench.cli", "blockbench.train", "tasks", "models"]


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


def _enter_cell(environment: dict[str, str], log_file: str | None) -> None:
    """Make this forked process the cell's: its environment, its output, its threads."""
    walltime.FORKED = True
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


def run_forked(arguments: list[str], environment: dict[str, str], log_file: Path | None = None) -> int:
    """Run ``python <arguments>`` (``-m <module> ...``, the form the runner's cell command has) in a
    process forked from the preloaded server, with ``environment`` as its whole environment and its
    output to ``log_file`` (else this process's); return its exit code as ``subprocess`` reports one
    (negative: killed by that signal)."""
    if len(arguments) < 2 or arguments[0] != "-m":
        raise ValueError(f"run_forked runs `-m <module> [args]`, not {arguments!r}")
    return _fork(_train_child, arguments, environment, None if log_file is None else str(log_file))


def _fork(target, *args) -> int:
    """Run ``target(*args)`` in a process forked from the server, wait for it, return its exit code."""
    process = _server().Process(target=target, args=args)
    process.start()
    process.join()
    return process.exitcode
