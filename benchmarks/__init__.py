"""blockbench's benchmarks: speed, parity with other implementations, the verdict rule's statistics,
the book, the docs' measured figures and the GPU check (``benchmarks/README.md`` lists every script).

Each script is a module run from the repository root (``python -m benchmarks.speed.throughput``), so
its imports of this package and of ``blockbench`` resolve without editing ``sys.path``. What more than
one script shares lives here: ``harness`` (timing, interleaved rounds, ratio intervals, the report
header) and ``parity.implementations`` (the implementations people use, built at our sizes).
"""

from pathlib import Path

#: the repository root: the benchmarks read its configs and results and write its docs
ROOT = Path(__file__).resolve().parents[1]
