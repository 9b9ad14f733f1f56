"""Rerun the whole book: every matrix of ``configs/matrix`` whose verdicts ``results/README.md``
reports, then the empirical null, into one results root, from a clean checkout.

    python benchmarks/run_book.py --results-dir runs/book --jobs 2      # resumes where it stopped
    python benchmarks/run_book.py --list                                 # the order, nothing run

Order: the flagship first (its pre- and post-norm cells are then copied, not retrained, by the
matrices that share their configs), the shared-baseline design matrices next, the empirical null,
the real-data matrix last (the slowest cells). Before each matrix its dry run's estimate is kept,
and after it the measured wall time, in ``<results-dir>/book_run.jsonl``, so the estimates can be
checked against what the run took. The GPU-sized matrix (``prenorm_vs_postnorm_real``) and the
demonstration (``smoke``) are not part of the CPU book.

A matrix that stops (Ctrl-C, a killed session) resumes on the next run of this command: finished
cells are reused, an interrupted one resumes from its checkpoint. Once every matrix has run, copy
the root's matrix folders into ``results/`` and commit them with ``blockbench report --index results``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATRICES = ROOT / "configs" / "matrix"
#: the flagship first, the real-data matrix last; every other design matrix in between, by name
FIRST, LAST = ["prenorm_vs_postnorm", "norm_placement"], ["null_comparison", "prenorm_vs_postnorm_real_cpu"]
#: not part of the CPU book: a GPU-sized matrix and the demonstration
LEFT_OUT = {"prenorm_vs_postnorm_real", "smoke"}


def book_order() -> list[Path]:
    """The matrix files of the book, in the order they run."""
    names = sorted(p.stem for p in MATRICES.glob("*.yaml") if p.stem not in LEFT_OUT)
    middle = [n for n in names if n not in FIRST + LAST]
    return [MATRICES / f"{name}.yaml" for name in [*FIRST, *middle, *LAST] if name in names]


def blockbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockbench", *args], cwd=ROOT, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", type=Path, default=Path("runs/book"))
    parser.add_argument("--jobs", default="2")
    parser.add_argument("--list", action="store_true", help="print the order and exit")
    args = parser.parse_args(argv)
    order = book_order()
    if args.list:
        print("\n".join(str(p.relative_to(ROOT)) for p in order))
        return 0
    args.results_dir.mkdir(parents=True, exist_ok=True)
    log = args.results_dir / "book_run.jsonl"
    status = 0
    for path in order:
        # relative to the checkout (the commands run there): the summaries then name a command anyone can rerun
        matrix = str(path.relative_to(ROOT))
        common = ["--results-dir", str(args.results_dir), "matrix", matrix, "--jobs", str(args.jobs)]
        dry = blockbench(*common, "--dry-run")
        estimate = next((line for line in dry.stdout.splitlines()[::-1] if "to train" in line), dry.stderr[-500:])
        print(f"{path.stem}: {estimate}", flush=True)
        started = time.time()
        run = subprocess.run([sys.executable, "-m", "blockbench", *common], cwd=ROOT)
        took = time.time() - started
        trained = re.search(r"(\d+) to train", estimate)
        with log.open("a") as file:
            file.write(
                json.dumps(
                    {
                        "matrix": path.stem,
                        "dry_run": estimate,
                        "to_train": int(trained.group(1)) if trained else None,
                        "wall_time_s": round(took, 1),
                        "returncode": run.returncode,
                        "ended": time.strftime("%Y-%m-%d %H:%M:%S"),
                    }
                )
                + "\n"
            )
        if run.returncode not in (0, 1):  # 1: a cell failed, the others are results; anything else stops
            return run.returncode
        status = max(status, run.returncode)
    return status


if __name__ == "__main__":
    sys.exit(main())
