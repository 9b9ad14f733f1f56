"""The one source of every duration the docs quote: measures them on this machine, writes them to
``docs/durations.json`` and into the places that quote them.

    python -m benchmarks.docs.durations            # measure, then rewrite the quoted durations
    python -m benchmarks.docs.durations --check    # only say whether the quoted durations match the file

A quoted duration is an h:mm:ss followed by its marker, ``0:02:08<!-- duration:smoke_run -->`` (the
marker is invisible in rendered Markdown and a plain comment in a matrix file), in the README, the
docs and the matrix files' comments; ``tests/test_docs.py`` checks each against ``durations.json`` and
that those pages quote no duration without one. What is measured, each from a fresh results folder as
a new clone has (``benchmarks.statistics.estimate_accuracy.run_stamped``, the command's start to its exit):

- ``smoke_run``: ``blockbench matrix configs/matrix/smoke.yaml --jobs 2``, the whole run;
- ``smoke_estimate``, ``default_estimate``, ``example_estimate``: what ``--dry-run`` estimates for the
  smoke matrix, the default matrix (``prenorm_vs_postnorm.yaml``) and the README's own example matrix
  (its YAML block, written to a temporary file), with ``*_if_needed``, what later rounds may add;
- ``default_dry_run``: how long the default matrix's dry run itself takes.

The file records the machine, torch's version, the load average before and after, and the date: the
same run on a busier or faster machine gives other figures (timings here swing 15-50% between runs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from benchmarks import ROOT
from benchmarks.harness import machine_summary
from benchmarks.statistics.estimate_accuracy import parse_estimate, run_stamped
from blockbench.durations import format_duration

#: the command that measures the durations, as ``durations.json`` records it
COMMAND = "python -m benchmarks.docs.durations"
#: where the measured durations are kept
DURATIONS_FILE = ROOT / "docs" / "durations.json"
#: a quoted duration and its name: ``0:02:08<!-- duration:smoke_run -->``
QUOTED = re.compile(r"(\d+:\d\d:\d\d)<!-- duration:(\w+) -->")
#: the pages that quote durations
PAGES = ("README.md", "docs/*.md", "configs/matrix/*.yaml")
#: the matrices whose dry-run estimates are quoted, by name
MATRICES = {"smoke": "configs/matrix/smoke.yaml", "default": "configs/matrix/prenorm_vs_postnorm.yaml"}
#: how the README's example matrix file starts (its YAML block is measured as written)
EXAMPLE_START = "# configs/matrix/my_norms.yaml"
#: the --jobs every quoted figure is for
JOBS = "2"


def pages() -> list[Path]:
    """Every file :data:`PAGES` names, each once."""
    return sorted({path for pattern in PAGES for path in ROOT.glob(pattern)})


def quoted(text: str) -> list[tuple[str, str]]:
    """Each ``(h:mm:ss, name)`` quoted in ``text``."""
    return QUOTED.findall(text)


def requote(text: str, durations: dict[str, float]) -> str:
    """``text`` with each quoted duration replaced by its measured one (a name not measured is kept)."""
    return QUOTED.sub(
        lambda m: f"{format_duration(durations[m[2]]) if m[2] in durations else m[1]}<!-- duration:{m[2]} -->", text
    )


def example_matrix(readme: str, folder: Path) -> Path:
    """The README's example matrix file, written into ``folder`` with its ``base:`` made absolute."""
    block = next(b for b in readme.split("```yaml\n")[1:] if b.startswith(EXAMPLE_START)).split("```")[0]
    text = block.replace("base: ../base.yaml", f"base: {ROOT / 'configs' / 'base.yaml'}")
    path = folder / "my_norms.yaml"
    path.write_text(text)
    return path


def dry_run(matrix: Path, results: Path, env: dict[str, str]) -> tuple[float, float | None, float]:
    """The dry run's estimate, what later rounds may add, and the dry run's own seconds."""
    command = [sys.executable, "-m", "blockbench", "--results-dir", str(results), "matrix", str(matrix)]
    lines, seconds, code = run_stamped([*command, "--jobs", JOBS, "--dry-run"], env)
    output = "\n".join(line for _, line in lines)
    if code != 0:
        raise SystemExit(f"the dry run of {matrix} failed (exit code {code}):\n{output[-3000:]}")
    estimate, maybe = parse_estimate(output)
    return estimate, maybe, seconds


def measure() -> dict[str, float]:
    """Every duration of the module docstring, in seconds, each from a fresh results folder."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    found: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        matrices = {name: ROOT / path for name, path in MATRICES.items()}
        matrices["example"] = example_matrix((ROOT / "README.md").read_text(), folder)
        for name, matrix in matrices.items():
            estimate, maybe, seconds = dry_run(matrix, folder / f"{name}-dry", env)
            found[f"{name}_estimate"] = estimate
            if maybe is not None:
                found[f"{name}_if_needed"] = maybe
            found[f"{name}_dry_run"] = seconds
        command = [sys.executable, "-m", "blockbench", "--results-dir", str(folder / "smoke"), "matrix"]
        lines, seconds, code = run_stamped([*command, str(matrices["smoke"]), "--jobs", JOBS], env)
        if code != 0:
            raise SystemExit("the smoke run failed:\n" + "\n".join(line for _, line in lines[-40:]))
        found["smoke_run"] = seconds
    return found


def check(durations: dict[str, float]) -> list[str]:
    """What the pages quote that ``durations`` does not say: a name it lacks, or another value."""
    problems = []
    for path in pages():
        for value, name in quoted(path.read_text()):
            if name not in durations:
                problems.append(f"{path.relative_to(ROOT)}: {name} is not measured in {DURATIONS_FILE.name}")
            elif value != format_duration(durations[name]):
                problems.append(f"{path.relative_to(ROOT)}: {name} quoted {value}, measured {durations[name]:.0f} s")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare the quoted durations with the file")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(json.loads(DURATIONS_FILE.read_text())["durations"])
        print("\n".join(problems) or "every quoted duration is the measured one")
        return 1 if problems else 0
    load_before = os.getloadavg()[0]
    durations = measure()
    record = {
        "command": COMMAND,
        "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_summary(),
        "jobs": int(JOBS),
        "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "durations": {name: round(seconds, 1) for name, seconds in durations.items()},
    }
    DURATIONS_FILE.write_text(json.dumps(record, indent=2) + "\n")
    for path in pages():
        text = path.read_text()
        if quoted(text):
            path.write_text(requote(text, record["durations"]))
    for name, seconds in record["durations"].items():
        print(f"{name:22} {format_duration(seconds)}")
    print(f"written to {DURATIONS_FILE.relative_to(ROOT)} and the pages that quote them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
