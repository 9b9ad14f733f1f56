"""Durations as the runner and the cells print them (``1:02:05``), and a cell's plain progress lines
read back for the runner's ETA.

Standard library only: the matrix runner, the report and the estimates use these without importing
Lightning, whose import (with torchmetrics') costs the runner seconds before its first cell. The cell's
progress display (:mod:`blockbench.progress`) writes the lines that :func:`pace_of_lines` reads.
"""

from __future__ import annotations

import re


def format_duration(seconds: float) -> str:
    """``75`` -> ``0:01:15``, ``3725`` -> ``1:02:05``: elapsed times and ETAs as h:mm:ss, hours always
    shown, so that 57 minutes (``0:57:02``) never reads as 57 hours."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def parse_duration(text: str) -> float:
    """``0:01:15`` (or ``1:15``) -> ``75``, ``1:02:05`` -> ``3725``: the inverse of :func:`format_duration`."""
    seconds = 0
    for part in text.split(":"):
        seconds = 60 * seconds + int(part)
    return float(seconds)


#: a plain progress line's step and elapsed time (see :meth:`blockbench.progress.StepProgress._print_line`)
PLAIN_LINE = re.compile(r"^step (\d+)/\d+ \(\d+%\).*?\s(\d+(?::\d\d){1,2}) elapsed")


def pace_of_lines(lines: list[str]) -> float | None:
    """Seconds per optimizer step of a cell's plain progress lines (a ``--jobs`` cell's train.log),
    from its first line to its last (training, and validation once the lines span one; not the
    start-up before the first step); None with fewer than two lines or less than a second between
    them (the lines give whole seconds). A log holds one run of the cell: it is rewritten when the
    cell (re)starts, so a resumed run's first line is past its resume step and still pairs right."""
    points = [(int(m[1]), parse_duration(m[2])) for m in map(PLAIN_LINE.match, lines) if m]
    if len(points) < 2 or points[-1][0] <= points[0][0] or points[-1][1] <= points[0][1]:
        return None
    (first_step, first_time), (last_step, last_time) = points[0], points[-1]
    return (last_time - first_time) / (last_step - first_step)
