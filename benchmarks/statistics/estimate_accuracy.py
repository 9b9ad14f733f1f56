"""How honest are the time estimates? A matrix's dry-run estimate and its runner's ETA against the time
the run took.

    python -m benchmarks.statistics.estimate_accuracy            # configs/matrix/smoke.yaml
    python -m benchmarks.statistics.estimate_accuracy --jobs 1 --out results/estimate_accuracy.md  # the same, one job

On a fresh results folder (a temporary one unless ``--results-dir``), as a fresh clone has: runs
``blockbench matrix FILE --dry-run`` and reads the estimate it prints (``about H:MM:SS on this machine``),
then runs the matrix for real into the same folder, stamping each line of its output with the seconds
since its start, and reads the ETA of each progress line (``3/12 trained, 0:00:42 elapsed, ETA 0:01:02``).
The measured time is the whole command's, process start to exit; at a progress line it is what was left
of it. It prints the ratio estimate / measured of the dry run and of the ETA at the first progress line
at or past 25%, 50% and 75% of the cells (1.00: exact; the goal is 0.75 to 1.25), with the machine, the
load on it when the run began (other users of the machine slow the run, not the estimate made before),
torch's version and the command (``benchmarks.harness.report_header``). The two commands are whole
processes, timed on the wall clock from their start to their exit (``run_stamped``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import ROOT
from benchmarks.harness import command_line, print_and_write, report_header
from blockbench.durations import parse_duration

#: the dry run's total: ``about 0:02:14 on this machine with --jobs 2 to train 12 cells``
ESTIMATE = re.compile(r"about (\d+(?::\d\d){1,2}) on this machine(?: with --jobs \d+)? to train")
#: the most a later round may add: ``if needed up to 1:10:00 more``
MAYBE = re.compile(r"if needed up to (\d+(?::\d\d){1,2}) more")
#: a runner's progress line: ``... |  3/12 trained, 0:00:42 elapsed, ETA 0:01:02``
PROGRESS = re.compile(r"\|\s+(\d+)/(\d+) trained, (\d+(?::\d\d){1,2}) elapsed(?:, ETA (\d+(?::\d\d){1,2}))?")
#: the share of the cells done at which the ETA is read
FRACTIONS = (0.25, 0.5, 0.75)


@dataclass(frozen=True)
class Progress:
    """A progress line of the run: when it came (seconds since the command started), the cells done
    of those planned, and the ETA it printed (None: none)."""

    at: float
    done: int
    total: int
    eta: float | None


def parse_estimate(output: str) -> tuple[float, float | None]:
    """The dry run's estimate in seconds, and the most the cells of later rounds may add (None: none)."""
    found = ESTIMATE.search(output)
    if found is None:
        raise ValueError(
            f"no estimate ('about H:MM:SS on this machine ... to train') in the dry run's output:\n{output}"
        )
    maybe = MAYBE.search(output)
    return parse_duration(found[1]), parse_duration(maybe[1]) if maybe else None


def parse_progress(lines: Iterable[tuple[float, str]]) -> list[Progress]:
    """The progress lines among ``lines`` (seconds since the start, text)."""
    points = []
    for at, line in lines:
        found = PROGRESS.search(line)
        if found:
            eta = parse_duration(found[4]) if found[4] else None
            points.append(Progress(at, int(found[1]), int(found[2]), eta))
    return points


def eta_ratios(
    points: Sequence[Progress], total: float, fractions: Sequence[float] = FRACTIONS
) -> dict[float, tuple[Progress, float] | None]:
    """For each fraction of the cells, the first progress line at or past it that has an ETA and what
    the ETA was over the time that was actually left (``total`` less its time); None where no line has one."""
    ratios: dict[float, tuple[Progress, float] | None] = {}
    for fraction in fractions:
        point = next((p for p in points if p.eta is not None and p.done >= fraction * p.total), None)
        left = total - point.at if point else 0.0
        ratios[fraction] = (point, point.eta / left) if point and left > 0 else None
    return ratios


def run_stamped(command: Sequence[str], env: dict[str, str]) -> tuple[list[tuple[float, str]], float, int]:
    """Run ``command``, its output merged; return each line with the seconds since the start when it
    came, the seconds until the process exited, and its exit code."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    lines = [(time.perf_counter() - start, line.rstrip("\n")) for line in process.stdout]  # type: ignore[union-attr]
    code = process.wait()
    return lines, time.perf_counter() - start, code


def report(
    matrix: str,
    command: Sequence[str],
    estimate: float,
    maybe: float | None,
    dry_run_seconds: float,
    total: float,
    points: Sequence[Progress],
    load: float,
) -> str:
    """The markdown lines of one measurement."""
    fmt = lambda seconds: f"{seconds:.0f} s"  # noqa: E731
    lines = [
        f"- matrix `{matrix}`: `{' '.join(command)}`; load average {load:.2f} when it began",
        f"- dry run: estimate {fmt(estimate)}"
        + (f" (and up to +{fmt(maybe)} if later rounds run)" if maybe else "")
        + f", itself {fmt(dry_run_seconds)}; the run took {fmt(total)}: ratio **{estimate / total:.2f}**",
    ]
    for fraction, found in eta_ratios(points, total).items():
        if found is None:
            lines.append(f"- ETA at {fraction:.0%} of the cells: none printed")
            continue
        point, ratio = found
        lines.append(
            f"- ETA at {fraction:.0%} of the cells ({point.done}/{point.total} at {fmt(point.at)}): "
            f"{fmt(point.eta or 0)} against {fmt(total - point.at)} left: ratio **{ratio:.2f}**"
        )
    return "\n".join(lines)


def measure(matrix: Path, jobs: str | None, results_dir: Path, log: Path | None = None) -> str:
    """Dry run, then the run, of ``matrix`` into ``results_dir``; the report's lines. ``log``: write
    both outputs there, each line after its seconds since the start of its command."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base = [sys.executable, "-m", "blockbench", "--results-dir", str(results_dir), "matrix", str(matrix)]
    base += ["--jobs", jobs] if jobs else []
    lines, dry_seconds, code = run_stamped([*base, "--dry-run"], env)
    output = "\n".join(line for _, line in lines)
    if code != 0:
        raise SystemExit(f"the dry run failed (exit code {code}):\n{output[-3000:]}")
    estimate, maybe = parse_estimate(output)
    load = os.getloadavg()[0]
    run_lines, total, code = run_stamped(base, env)
    if log is not None:
        log.write_text("".join(f"{at:8.2f}  {line}\n" for at, line in [*lines, (dry_seconds, "(exit)"), *run_lines]))
    lines = run_lines
    if code != 0:
        raise SystemExit(f"the run failed (exit code {code}):\n" + "\n".join(line for _, line in lines[-40:]))
    command = ["blockbench", "matrix", str(matrix), *(["--jobs", jobs] if jobs else [])]
    return report(str(matrix), command, estimate, maybe, dry_seconds, total, parse_progress(lines), load)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("matrix", nargs="?", default=str(ROOT / "configs" / "matrix" / "smoke.yaml"))
    parser.add_argument("--jobs", help="the matrix's --jobs (default: its own, auto)")
    parser.add_argument("--results-dir", help="a fresh folder for the results (default: a temporary one)")
    parser.add_argument("--out", default="-", help="also write the report to this markdown file")
    parser.add_argument("--log", type=Path, help="write the two commands' output there, each line timed")
    args = parser.parse_args(argv)
    if args.results_dir:
        results = Path(args.results_dir)
        if results.exists() and any(results.iterdir()):
            raise SystemExit(f"{results}: not empty; give a fresh folder (the estimate is a fresh clone's)")
        body = measure(Path(args.matrix), args.jobs, results, args.log)
    else:
        with tempfile.TemporaryDirectory(prefix="estimate-accuracy-") as folder:
            body = measure(Path(args.matrix), args.jobs, Path(folder), args.log)
    header = report_header("Time estimates against the measured time", command_line(__spec__.name, argv))
    print_and_write("\n".join([*header, body, ""]), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
