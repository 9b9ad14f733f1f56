"""The GPU check in one command: ``python benchmarks/gpu_check.py`` (or ``python -m benchmarks.gpu_check``).

The check itself is ``benchmarks.gpu.check`` (its docstring lists the sections and options). Run as
a file, this script starts itself again as the module ``benchmarks.gpu_check`` with the repository
root on ``PYTHONPATH``: a file's own folder is what Python puts on ``sys.path``, and the check imports
``benchmarks`` and ``blockbench`` from the root.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gpu.check import main as check

    return check(argv)


if __name__ == "__main__":
    if __package__:  # python -m benchmarks.gpu_check
        sys.exit(main())
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    os.execve(
        sys.executable,
        [sys.executable, "-m", "benchmarks.gpu_check", *sys.argv[1:]],
        {**os.environ, "PYTHONPATH": path},
    )
