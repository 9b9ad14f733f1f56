"""Rerun the whole book: every matrix of ``configs/matrix`` whose verdicts ``results/README.md``
reports, then the empirical null, into one results root, from a clean checkout.

    python -m benchmarks.book.run_book --results-dir runs/book --jobs 2      # resumes where it stopped
    python -m benchmarks.book.run_book --list                                 # the order, nothing run
    python -m benchmarks.book.run_book --results-dir runs/book --publish results   # finished matrices -> results/

Order: the flagship first (its pre- and post-norm cells are then copied, not retrained, by the
matrices that share their configs), the shared-baseline design matrices next, the empirical null,
the real-data matrix last (the slowest cells). Before each matrix its dry run's estimate is kept,
and after it the measured wall time, in ``<results-dir>/book_run.jsonl``, so the estimates can be
checked against what the run took. The GPU-sized matrix (``prenorm_vs_postnorm_real``) and the
demonstration (``smoke``) are not part of the CPU book.

A matrix that stops (Ctrl-C, a killed session) resumes on the next run of this command: finished
cells are reused, an interrupted one resumes from its checkpoint. ``--publish results`` copies each
matrix whose last run in the root ran to its end (its last ``book_run.jsonl`` line, exit 0 or 1: a
cell failed, the others are results) into ``results/``, replacing the folder there, without what git
leaves out of a results folder (event files, checkpoints, training logs, locks), rebuilds its summary
and the index (``blockbench report``), and lists what it copied; commit that from a clean checkout.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import ROOT

MATRICES = ROOT / "configs" / "matrix"
#: the flagship first, the real-data matrix last; every other design matrix in between, by name
FIRST, LAST = ["prenorm_vs_postnorm", "norm_placement"], ["null_comparison", "prenorm_vs_postnorm_real_cpu"]
#: not part of the CPU book: a GPU-sized matrix, the demonstration, the flagship ladder's shape check,
#: and every scale ladder (``*_ladder``: runs of their own, hours to a day of cell processes each,
#: docs/ladder.md)
LEFT_OUT = {"prenorm_vs_postnorm_real", "smoke", "prenorm_vs_postnorm_shape"}
LADDER_SUFFIX = "_ladder"
#: what a committed results folder leaves out (as .gitignore): event files, checkpoints, logs, locks
NOT_PUBLISHED = shutil.ignore_patterns("tb", "tb_tune", "checkpoints", "lightning_logs", "train.log", ".lock", "*.ckpt")


def book_order() -> list[Path]:
    """The matrix files of the book, in the order they run."""
    names = sorted(
        p.stem for p in MATRICES.glob("*.yaml") if p.stem not in LEFT_OUT and not p.stem.endswith(LADDER_SUFFIX)
    )
    middle = [n for n in names if n not in FIRST + LAST]
    return [MATRICES / f"{name}.yaml" for name in [*FIRST, *middle, *LAST] if name in names]


def blockbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockbench", *args], cwd=ROOT, capture_output=True, text=True)


def finished(results_dir: Path) -> list[str]:
    """The matrices of the book whose last run in ``results_dir`` ran to its end (exit 0, or 1: a cell
    failed and the others are results), in the book's order."""
    log = results_dir / "book_run.jsonl"
    last = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        entry = json.loads(line)
        last[entry["matrix"]] = entry["returncode"]
    return [p.stem for p in book_order() if last.get(p.stem) in (0, 1) and (results_dir / p.stem).is_dir()]


def records(matrix_dir: Path) -> dict[str, bytes]:
    """Every cell record of a matrix folder (reported and tuning cells' ``result.json``) and its matrix
    file, by path."""
    paths = [*matrix_dir.rglob("result.json"), *matrix_dir.glob("matrix.yaml")]
    return {str(path.relative_to(matrix_dir)): path.read_bytes() for path in sorted(paths)}


def publish(results_dir: Path, target: Path) -> list[str]:
    """Copy the :func:`finished` matrices of ``results_dir`` into ``target`` (each replacing its folder
    there, without :data:`NOT_PUBLISHED`), rebuild their summaries and ``target``'s index; their names.
    A matrix whose cell records and matrix file ``target`` already holds, byte for byte, is left as it is: the book's
    later run of it only reused its cells, and its ``matrix_run.json`` would replace the run that
    trained them with one that trained nothing."""
    # as the checkout names it (the commands run there), so the index says `--index results`
    target = target.relative_to(ROOT) if target.is_relative_to(ROOT) else target
    names = [name for name in finished(results_dir) if records(results_dir / name) != records(ROOT / target / name)]
    for name in names:
        shutil.rmtree(ROOT / target / name, ignore_errors=True)
        shutil.copytree(results_dir / name, ROOT / target / name, ignore=NOT_PUBLISHED)
        report = blockbench("report", str(target / name))
        if report.returncode != 0:
            raise SystemExit(f"blockbench report {target / name} failed:\n{report.stderr[-2000:]}")
    index = blockbench("report", "--index", str(target))
    if index.returncode != 0:
        raise SystemExit(f"blockbench report --index {target} failed:\n{index.stderr[-2000:]}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", type=Path, default=Path("runs/book"))
    parser.add_argument("--jobs", default="2")
    parser.add_argument("--list", action="store_true", help="print the order and exit")
    parser.add_argument(
        "--publish",
        type=Path,
        metavar="RESULTS",
        help="copy the finished matrices into RESULTS (e.g. results), run none",
    )
    args = parser.parse_args(argv)
    args.results_dir = args.results_dir.resolve()  # the commands run in the checkout, wherever this was started
    order = book_order()
    if args.list:
        print("\n".join(str(p.relative_to(ROOT)) for p in order))
        return 0
    if args.publish:
        names = publish(args.results_dir, args.publish.resolve())
        print(f"published to {args.publish}: {', '.join(names) or 'nothing (no matrix has finished or changed)'}")
        return 0
    args.results_dir.mkdir(parents=True, exist_ok=True)
    log = args.results_dir / "book_run.jsonl"
    status = 0
    for path in order:
        # relative to the checkout (the commands run there): the summaries then name a command anyone can rerun
        matrix = str(path.relative_to(ROOT))
        common = ["--results-dir", str(args.results_dir), "matrix", matrix, "--jobs", str(args.jobs)]
        dry = blockbench(*common, "--dry-run")
        estimate = next((line for line in dry.stdout.splitlines()[::-1] if "train" in line), dry.stderr[-500:])
        print(f"{path.stem}: {estimate}", flush=True)
        started = time.time()
        run = subprocess.run([sys.executable, "-m", "blockbench", *common], cwd=ROOT)
        took = time.time() - started
        trained = re.search(r"to train (\d+) cell", estimate)
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
