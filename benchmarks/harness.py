"""The one harness every timing benchmark uses: interleaved rounds, timing a callable, ratio intervals
and the report header.

* **Rounds** (``round_order``, ``interleaved``): each round runs every arm once, the order reversed
  every other round (A B, B A, A B, ...), so a slow phase of a shared machine hits every arm alike and
  a steady drift cancels over two rounds.
* **Timing a callable** (``time_calls``, ``autorange``): on ``torch.utils.benchmark``. ``autorange``
  is its ``Timer.blocked_autorange``, for short calls timed to a time budget; ``time_calls`` times each
  call on its own (``warmup`` untimed calls, then at least ``min_calls`` calls and ``min_seconds``
  seconds, at most ``max_calls``) because a training step changes its model and a report needs every
  step's time, which a Timer's blocks of repeated calls do not give; it reads the same clock as a
  Timer (``torch.utils.benchmark.timer``: the accelerator synchronised, then the wall clock) and
  returns a ``Measurement``.
* **Whole processes** (a CLI start-up, a Lightning fit, cells training at once) are timed by their
  scripts on the wall clock around the process or inside it: a Timer times a statement in this
  process, not another process's start or exit.
* **Ratios** (``ratio_interval``): a round's ratio of the two arms' times cancels the load both saw;
  the ratio over rounds is the geometric mean with a t interval on the logs (``RATIO_METHOD``).
* **The header** (``machine_facts``, ``report_header``): machine, versions, command and code, read
  through ``blockbench.provenance``.
"""

from __future__ import annotations

import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.utils.benchmark import Measurement, TaskSpec, Timer

from benchmarks import ROOT

Arm = TypeVar("Arm")


# ------------------------------------------------------------------------------------- rounds
def round_order(arms: Sequence[Arm], round_index: int, offset: int = 0) -> list[Arm]:
    """``arms`` in their order in even rounds, reversed in odd ones; ``offset`` shifts the parity (so
    that pairs timed one after another in a round do not all start with the same arm)."""
    return list(arms) if (round_index + offset) % 2 == 0 else list(arms)[::-1]


def interleaved(rounds: int, arms: Sequence[Arm]) -> Iterator[tuple[int, Arm]]:
    """``(round, arm)`` for every arm in every round, each round in ``round_order``."""
    for round_index in range(rounds):
        for arm in round_order(arms, round_index):
            yield round_index, arm


# ------------------------------------------------------------------------------------- timing
def synced_clock(device: str | torch.device = "cpu") -> Callable[[], float]:
    """The clock of a timed call on ``device``: on a CUDA device the queued work is waited for first
    (a host timestamp then bounds it), on a CPU the wall clock alone."""
    if torch.device(device).type == "cuda":
        return torch.utils.benchmark.timer
    return time.perf_counter


def measurement(times: Sequence[float], label: str = "", threads: int | None = None) -> Measurement:
    """Seconds of single calls as a ``torch.utils.benchmark.Measurement`` (one call per run)."""
    spec = TaskSpec(stmt=label or "call", setup="", num_threads=threads or torch.get_num_threads())
    return Measurement(number_per_run=1, raw_times=list(times), task_spec=spec)


def time_calls(
    fn: Callable[[], object],
    *,
    warmup: int = 0,
    min_calls: int = 1,
    max_calls: int | None = None,
    min_seconds: float = 0.0,
    device: str | torch.device = "cpu",
    clock: Callable[[], float] | None = None,
    label: str = "",
) -> Measurement:
    """Time ``fn``: ``warmup`` untimed calls, then timed calls until at least ``min_calls`` calls and
    ``min_seconds`` seconds have passed (at most ``max_calls``, default ``min_calls`` when no
    ``min_seconds`` is asked), each call timed alone on ``clock`` (default ``synced_clock(device)``)."""
    clock = clock or synced_clock(device)
    limit = max_calls if max_calls is not None else (min_calls if not min_seconds else math.inf)
    for _ in range(warmup):
        fn()
    times: list[float] = []
    started = clock()
    while len(times) < limit and (len(times) < min_calls or clock() - started < min_seconds):
        begin = clock()
        fn()
        times.append(clock() - begin)
    return measurement(times, label)


def autorange(fn: Callable[[], object], *, min_run_time: float = 0.2, label: str = "") -> Measurement:
    """``torch.utils.benchmark.Timer.blocked_autorange`` of ``fn`` on this process's torch threads (a
    Timer's default is one): blocks of calls sized so the clock's own cost is negligible, for calls
    of microseconds to milliseconds. Each of its ``times`` is a block's seconds per call."""
    timer = Timer(stmt="fn()", globals={"fn": fn}, label=label or "call", num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time)


# ------------------------------------------------------------------------------------- ratios
@dataclass(frozen=True)
class Ratio:
    """One arm's speed over another's: the geometric mean over rounds of each round's ratio, with its
    interval (None when a single round timed both)."""

    ratio: float
    low: float | None
    high: float | None
    rounds: int

    @property
    def verdict(self) -> str:
        """ "faster" or "slower" only when the interval excludes 1; otherwise a tie."""
        if self.low is None or self.high is None:
            return f"no interval ({self.rounds} round)"
        if self.low > 1:
            return "faster"
        if self.high < 1:
            return "slower"
        return "tie"


#: why the interval is computed as it is, for the reports. A t interval, not a bootstrap: with the 3 to
#: 8 rounds a benchmark affords, a bootstrap has too few distinct resamples for a 95% interval.
RATIO_METHOD = (
    "each round times every implementation back to back, so a slow phase of the machine slows both "
    "medians of a round alike and their ratio cancels it; ratios multiply, so the 95% interval is a "
    "t interval over rounds on the log of the round ratios (symmetric for ours/theirs and theirs/ours)"
)


def ratio_interval(ours_ms: Mapping[int, float], theirs_ms: Mapping[int, float], level: float = 0.95) -> Ratio:
    """Our speed over theirs from each round's time of each (round -> time, any unit): per round
    ``theirs / ours``, then the mean and t interval of its log over the rounds both ran in."""
    from blockbench.report.stats import t_confidence_interval

    paired = sorted(set(ours_ms) & set(theirs_ms))
    if not paired:
        raise ValueError("no round timed both implementations: no ratio")
    logs = [math.log(theirs_ms[r] / ours_ms[r]) for r in paired]
    interval = t_confidence_interval(logs, level)
    low, high = (math.exp(interval[0]), math.exp(interval[1])) if interval else (None, None)
    return Ratio(math.exp(statistics.fmean(logs)), low, high, len(paired))


# ------------------------------------------------------------------------------------ header
def native_bf16_instructions() -> bool | None:
    """Whether this x86 CPU has AVX512-BF16 or AMX, as torch reads them from cpuinfo; None where
    nothing says: another architecture, or a torch without these (private) ``torch.cpu`` checks.

    Needed because ``get_cpu_capability()`` says "AVX512" for every CPU with AVX512VL, BW and DQ
    and FMA3, with or without BF16 (ATen's ``compute_cpu_capability`` picks its kernels by those)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if any(check is None for check in checks):
        return None
    return any(check() for check in checks)


def machine_facts(device: str = "cpu", threads: int | None = None, packages: str = "") -> dict[str, Any]:
    """The machine as a report's header and JSON record it: the device and GPU, the CPU model, the
    vector extension torch's kernels use and native bf16, versions (``packages``: more of them, as
    the script names them)."""
    from blockbench.provenance import cpu_model

    return {
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16": native_bf16_instructions(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": threads or torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "packages": packages,
    }


def machine_summary(machine: Mapping[str, Any] | None = None) -> str:
    """The machine in one line, for a record's field: CPU, vector extension, cores, torch and Python."""
    machine = machine or machine_facts()
    return (
        f"{machine['cpu']}, `torch.backends.cpu.get_cpu_capability()` = {machine['cpu_capability']}, "
        f"{machine['logical_cpus']} logical CPUs; torch {machine['torch']}, Python {machine['python']}"
    )


def command_line(program: str, argv: Sequence[str] | None = None) -> str:
    """The command a report says it was produced by: ``python -m <program> <args>`` for a module name
    (a script file's path: ``python <path> <args>``), the arguments ``argv`` or this process's."""
    args = list(argv) if argv is not None else sys.argv[1:]
    head = ["python", program] if program.endswith(".py") else ["python", "-m", program]
    return shlex.join([*head, *args])


def code_note() -> str:
    """`` (code: <commit>)`` for a report's first line, ``+ uncommitted changes`` when the tree was dirty."""
    from blockbench.provenance import git_state

    git = git_state()
    return f" (code: {(git['commit'] or '?')[:12]}{' + uncommitted changes' if git['dirty'] else ''})"


def lightning_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lightning")
    except PackageNotFoundError:
        return "not installed"


def report_header(title: str, command: str, machine: Mapping[str, Any] | None = None, *, note: str = "") -> list[str]:
    """A report's first lines: its title; what produced it, when and from which code (``note`` ends
    that line: how long it took, say); the machine and the versions (``machine_facts``)."""
    machine = machine or machine_facts()
    native = {True: "yes", False: "no", None: "unknown"}[machine["native_bf16"]]
    gpu = f" ({machine['gpu']})" if machine["gpu"] else ""
    packages = f"; {machine['packages']}" if machine["packages"] else ""
    return [
        f"# {title}",
        "",
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')}{code_note()}{note}.",
        "",
        f"- Machine: {machine['device']}{gpu}; CPU {machine['cpu']}, {machine['logical_cpus']} logical CPUs, "
        f"`torch.backends.cpu.get_cpu_capability()` = {machine['cpu_capability']}, AVX512-BF16/AMX: {native}; "
        f"torch threads {machine['torch_threads']}",
        f"- Python {machine['python']}, torch {machine['torch']}, lightning {lightning_version()}{packages}",
    ]


def print_and_write(text: str, out: str) -> None:
    """Print a benchmark's markdown report and write it to ``out`` ('-': print only)."""
    print(text)
    if out != "-":
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"wrote {out}")


# ----------------------------------------------------------------------------------- workers
def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``module`` of this package in a fresh Python (``module_env`` makes
    it importable from any working directory)."""
    return [sys.executable, "-m", module, *args]


def module_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default this process's) with the repository root first on ``PYTHONPATH``: a worker
    started elsewhere imports ``benchmarks`` and this checkout's ``blockbench``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env
