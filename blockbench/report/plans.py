"""The summary's account of the analysis plan: which plan decides the verdicts, and which verdicts rest
on cells that started under another one.

Every matrix run records the plan it commits to (``blockbench.prereg``: the rule's version, α, the
looks, futility, the baseline, each task's metric, margin and saturation, the tuning grid) in
``plan.json`` and its hash in each cell's ``cell.json``. A verdict whose cells all started under the
current plan was decided by rules fixed before its first cell trained. One with a cell under an
earlier plan, or with no plan recorded, was not: the summary names it and what changed, so a reader
can weigh it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..prereg import AnalysisPlan, PlanBook
from .analysis import TaskAnalysis
from .decide import ALPHA, RULE_VERSION


def describe_plan(plan: AnalysisPlan) -> str:
    """One line of what decides the verdicts: rule, α, looks, futility, baseline, margins, tuning."""
    margins = "; ".join(
        f"{task} {p.metric} {'↑' if p.higher_is_better else '↓'} ±"
        + (f"{p.margin:.0%} of the baseline's mean" if p.margin_relative and p.margin else f"{p.margin}")
        for task, p in plan.tasks.items()
    )
    parts = [
        f"rule of {plan.rule}",
        f"α {plan.alpha}",
        "looks at " + ", ".join(map(str, plan.looks)) + " seeds",
        f"futility {plan.futility}" if plan.futility is not None else "no futility stop",
        f"baseline `{plan.baseline_variant}`",
        f"margins: {margins}",
    ]
    if plan.tune:
        grid = ", ".join(f"`{key}` over {values}" for key, values in plan.tune.items())
        seeds = ", ".join(map(str, plan.tune_seeds))
        parts.append(f"tuning {grid} at seeds {seeds}, up to {plan.extension_steps} values past an end")
    return "; ".join(parts)


def plan_section(matrix_dir: Path, analyses: list[TaskAnalysis]) -> list[str]:
    """The summary's ``Analysis plan`` section: the current plan and its hash, and each verdict whose cells
    did not all start under it (with the plans they did start under and what changed since)."""
    book = PlanBook.load(matrix_dir)
    current = book.plans.get(book.current) if book.current else None
    lines = ["## Analysis plan", ""]
    if current is None:
        lines.append(
            "No analysis plan is recorded for this matrix: its cells trained before the runner recorded one, so "
            "nothing here shows that the rules deciding its verdicts (margins, looks, the futility stop, the tuning "
            "grid) were fixed before its cells trained. Running the matrix again records the plan it commits to."
        )
        return [*lines, ""]
    lines += [f"Plan `{book.current}` (`plan.json`): {describe_plan(current)}.", ""]
    if (current.rule, current.alpha) != (RULE_VERSION, ALPHA):
        lines += [
            f"**This report decides by the rule of {RULE_VERSION} (α {ALPHA}), not the plan's**: the rule changed "
            "after the matrix last ran, so every verdict below is decided under a plan that changed after its cells "
            "trained. Running the matrix again records the new plan.",
            "",
        ]
    flagged = []
    for analysis in analyses:
        for question in analysis.questions:
            under = Counter(question.group.plans + (question.baseline.plans if question.baseline else []))
            if set(under) <= {book.current}:
                continue
            parts = []
            for digest, n in under.items():
                if digest == book.current:
                    continue
                earlier = book.plans.get(digest) if digest else None
                if digest is None:
                    parts.append(f"{n} cell(s) with no plan recorded")
                elif earlier is None:
                    parts.append(f"{n} cell(s) under plan `{digest}`, not in plan.json")
                else:
                    changed = ", ".join(earlier.changes(current)) or "nothing that decides"
                    parts.append(f"{n} cell(s) under plan `{digest}` (changed since: {changed})")
            flagged.append(f"- {analysis.task} {question.group.variant}: " + "; ".join(parts))
    if not flagged:
        lines.append("Every reported cell of every verdict started under this plan: it was fixed before they trained.")
        return [*lines, ""]
    return [
        *lines,
        "These verdicts rest on cells that started under another plan, or none: the rules that decided them changed "
        "after their first cell trained.",
        "",
        *flagged,
        "",
    ]
