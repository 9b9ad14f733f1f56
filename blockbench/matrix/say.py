"""The runner's printed lines: the plan (``plan``), each cell's start and outcome (``jobs``, ``run``)
and the matrix's own, each written whole. Its own module because all three print, and ``run`` imports
the other two.
"""

from __future__ import annotations

import sys
import threading

_OUTPUT_LOCK = threading.Lock()


def say(line: str, *, stream=None) -> None:
    """Print one whole line, flushed: cells finishing at once under ``--jobs`` (threads) never mix
    their lines (``print`` writes the text and the newline separately)."""
    stream = stream or sys.stdout
    with _OUTPUT_LOCK:
        stream.write(line + "\n")
        stream.flush()
