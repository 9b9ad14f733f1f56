"""Whether two results folders of one matrix hold the same numbers, cell by cell: the final metrics,
every validation in the history (its step and metrics; not its timestamps) and the loss curve, compared
exactly (no tolerance). What ``Reproducing the numbers`` in docs/reproducibility.md promises: the same
config on the same kind of CPU with the pinned versions gives the same bits, whatever code fingerprint, machine
timings or commit the two runs record.

    python -m benchmarks.book.compare_results results/prenorm_vs_postnorm runs/prenorm_vs_postnorm

Prints one line per cell and a total; exits 1 if any cell differs or is missing on one side.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blockbench.store.layout import CELLS_DIR, RESULT_FILE
from blockbench.store.record import CellRecord, load_record


def cells(folder: Path) -> dict[str, CellRecord]:
    """The records under ``folder/cells``, by their path there (``lm/norm_placement=pre/seed0``)."""
    root = folder / CELLS_DIR
    return {path.parent.relative_to(root).as_posix(): load_record(path) for path in sorted(root.rglob(RESULT_FILE))}


def differences(a: CellRecord, b: CellRecord) -> list[str]:
    """What differs between two records of one cell: status, metrics, history, curve, config hash."""
    found = []
    if a.config_hash != b.config_hash:
        found.append(f"config hash {a.config_hash} vs {b.config_hash}")
    if a.status != b.status:
        found.append(f"status {a.status} vs {b.status}")
    if a.metrics != b.metrics:
        found.append(f"metrics {a.metrics} vs {b.metrics}")
    history_a = [(h.step, h.metrics) for h in a.history]
    history_b = [(h.step, h.metrics) for h in b.history]
    if history_a != history_b:
        found.append(f"history differs ({len(history_a)} vs {len(history_b)} validations)")
    curve_a, curve_b = (a.curve.points if a.curve else None), (b.curve.points if b.curve else None)
    if curve_a != curve_b:
        found.append("loss curve differs")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="a matrix's results folder, e.g. results/prenorm_vs_postnorm")
    parser.add_argument("second", type=Path, help="the same matrix run again, e.g. runs/prenorm_vs_postnorm")
    args = parser.parse_args(argv)
    first, second = cells(args.first), cells(args.second)
    same = 0
    for key in sorted(first.keys() | second.keys()):
        if key not in first or key not in second:
            print(f"{key}: only in {args.first if key in first else args.second}")
            continue
        found = differences(first[key], second[key])
        same += not found
        commits = f"{first[key].git.commit or '?'}"[:7] + " vs " + f"{second[key].git.commit or '?'}"[:7]
        print(f"{key}: " + ("; ".join(found) if found else f"identical metrics, history and curve ({commits})"))
    total = len(first.keys() | second.keys())
    print(f"{same} of {total} cells identical")
    return 0 if same == total else 1


if __name__ == "__main__":
    sys.exit(main())
