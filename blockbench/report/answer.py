"""The short answer a matrix run (and ``blockbench report``) prints at its end: one line per question,
its verdict and the difference it rests on, then where the whole summary and the curves are.

The summary itself is a page of Markdown with every number and its reading; printed to a terminal it
scrolls the answer away. So the terminal gets what a reader looks for first, at most
:data:`MAX_LINES` lines, as the last lines of the run, and the paths to open for the rest.
"""

from __future__ import annotations

from pathlib import Path

from .decide import WITHIN_MARGIN
from .table import arrow
from .verdicts import Comparison

#: the most lines the answer takes, paths included: it fits a terminal's screen
MAX_LINES = 20
#: the lines after the questions: the summary and TensorBoard (and with an index, the verdicts of every matrix)
FOOTER_LINES = 2


def question_line(c: Comparison) -> tuple[str, str, str, str]:
    """The columns of one question: task, what is compared, the verdict word (``(weak)`` where the
    difference may lie inside the margin) and the difference with its interval in the headline metric."""
    word = c.verdict + (" (weak)" if c.form == WITHIN_MARGIN else "")
    number = f"{arrow(c.metric)} {c.difference_text}" if c.difference_text else ""
    return c.task, c.label, word, number


def answer_lines(
    title: str, comparisons: list[Comparison], summary: Path, browse: str, index: Path | None = None
) -> list[str]:
    """The answer: a title line, one aligned line per question (as many as fit in :data:`MAX_LINES`,
    then how many more the summary has), the summary's path, ``browse`` (the line that says which
    ``tensorboard --logdir`` to run, ``blockbench.tensorboard.logdirs.browse_hint``, as the run's start said it)
    and the index's path where there is one."""
    rows = [question_line(c) for c in comparisons]
    room = MAX_LINES - 1 - FOOTER_LINES - (index is not None)
    shown = rows if len(rows) <= room else rows[: room - 1]
    widths = [max((len(row[i]) for row in shown), default=0) for i in range(3)]
    lines = [title]
    lines += ["  " + "  ".join([*(text.ljust(widths[i]) for i, text in enumerate(row[:3])), row[3]]) for row in shown]
    lines = [line.rstrip() for line in lines]
    if len(shown) < len(rows):
        lines.append(f"  ... {len(rows) - len(shown)} more in the summary")
    if not rows:
        lines.append("  no question to answer: the matrix has one variant per task (its numbers are in the summary)")
    lines.append(f"summary (every number, how each verdict was reached): {summary}")
    lines.append(browse)
    if index is not None:
        lines.append(f"verdicts of every matrix: {index}")
    return lines
