"""How long the command line takes to answer at the door: ``blockbench --help`` and ``blockbench list``.

    python -m benchmarks.speed.cli_startup                  # 7 rounds of each, 3 of the cold listing
    python -m benchmarks.speed.cli_startup --rounds 3 --cold-rounds 0

Each command runs in a fresh process (the ``blockbench`` script of this environment, else ``python -m
blockbench``), its output thrown away, and is timed from start to exit on the wall clock: what a user
waits (a process's start and exit, which a ``torch.utils.benchmark.Timer`` in this process cannot time).
The commands:

* ``blockbench --help`` and ``blockbench train --help``: argparse only; no config class is loaded;
* ``blockbench list``: the config keys read from the listing's cache (``blockbench.listing``), which
  an earlier run of the same code wrote (the script runs it untimed just before each timed listing,
  so that an edit of the models, tasks or config code in between, which makes the next listing walk
  the classes again, lands in the untimed run; in a tree that others edit as it runs, a timed run
  can still meet such an edit: it shows as a maximum of seconds);
* ``blockbench train configs/base.yaml model.n_head=4``: a misspelt key, told from the same cache
  before any config class loads (``blockbench.precheck``; it exits with 2);
* ``blockbench list`` with a cold cache: the first listing after the code changed, which walks the
  config classes and so loads the models, the tasks, torch and Lightning (a fresh cache each round);
* ``python -c "import blockbench.config"``: loading the config classes and everything under them, what
  every command paid before the CLI imported each command's stack inside the command.

Rounds alternate the commands (``benchmarks.harness.round_order``: the order reversed every other
round), so that a slow spell of a shared machine falls on all of them. The table gives each command's
median and range (min to max) in seconds, under the report header (``benchmarks.harness.report_header``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import ROOT
from benchmarks.harness import command_line, report_header, round_order


def blockbench_command() -> list[str]:
    """The ``blockbench`` script installed beside this Python, else ``python -m blockbench``."""
    script = Path(sys.executable).with_name("blockbench")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "blockbench"]


#: the commands that answer with an error on purpose, and the exit code they must give
MISTAKES = {"blockbench train configs/base.yaml model.n_head=4": 2}


def timed(argv: list[str], env: dict[str, str], expect: int = 0) -> float:
    """Wall-clock seconds of one fresh process running ``argv`` (which must exit with ``expect``)."""
    start = time.perf_counter()
    process = subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    if process.returncode != expect:
        raise SystemExit(f"{' '.join(argv)} exited with {process.returncode}, not {expect}")
    return seconds


def measure(rounds: int, cold_rounds: int) -> dict[str, list[float]]:
    """Each command's times over the rounds (see the module's docstring)."""
    blockbench = blockbench_command()
    warm = tempfile.mkdtemp(prefix="blockbench-cli-startup-")
    env = {**os.environ, "BLOCKBENCH_CACHE": warm}
    warm_up = [*blockbench, "list"]
    commands = {
        "blockbench --help": [*blockbench, "--help"],
        "blockbench train --help": [*blockbench, "train", "--help"],
        "blockbench list": [*blockbench, "list"],
        "blockbench list model": [*blockbench, "list", "model"],
        "blockbench train configs/base.yaml model.n_head=4": [
            *blockbench,
            "train",
            "configs/base.yaml",
            "model.n_head=4",
        ],
        "python -c 'import blockbench.config'": [sys.executable, "-c", "import blockbench.config"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    cold = "blockbench list (cold cache)"
    if cold_rounds:
        times[cold] = []
    try:
        for round_ in range(max(rounds, cold_rounds)):
            if round_ < rounds:
                for name in round_order(list(commands), round_):
                    argv = commands[name]
                    if argv[len(blockbench) :][:1] in (["list"], ["train"]):
                        timed(warm_up, env)  # the cache of this code, untimed (train's key check reads it too)
                    times[name].append(timed(argv, env, MISTAKES.get(name, 0)))
            if round_ < cold_rounds:
                with tempfile.TemporaryDirectory(prefix="blockbench-cli-cold-") as empty:
                    times[cold].append(timed([*blockbench, "list"], {**os.environ, "BLOCKBENCH_CACHE": empty}))
    finally:
        shutil.rmtree(warm, ignore_errors=True)
    return times


def report(times: dict[str, list[float]], command: str) -> str:
    """The table: each command's median and range in seconds, under the header of the machine it ran on."""
    width = max(len(name) for name in times)
    lines = [
        *report_header("blockbench CLI start-up, wall clock per fresh process", command),
        f"- load average {os.getloadavg()[0]:.2f}",
        "",
        f"{'command':<{width}}  rounds  median s  range s",
    ]
    for name, values in times.items():
        lines.append(
            f"{name:<{width}}  {len(values):>6}  {statistics.median(values):>8.3f}  "
            f"{min(values):.3f} - {max(values):.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed runs of each command (default 7)")
    parser.add_argument(
        "--cold-rounds", type=int, default=3, help="timed runs of the listing with a cold cache (default 3; 0: none)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: give 1 or more")
    print(report(measure(args.rounds, args.cold_rounds), command_line(__spec__.name, argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
