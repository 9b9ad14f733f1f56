"""A scale ladder's trend in the report: per task x variant, the trend verdict over the rungs
(:mod:`.trend`, docs/decisions/trend-rule.md) beside the per-rung verdicts, and what each rung cost.

The trend's input is built here from the cells the per-rung verdicts read: for every rung of the
ladder, the variant's and the baseline's seeds at that rung (paired by seed in :func:`.trend.trend`),
each seed's final validation loss, counted as the trend rule counts it: a diverged seed as diverged
(the rule puts it at the worse of the trivial loss and every finished seed of its rung), a finished
seed that did not beat the task's trivial baseline in the headline metric as "did not learn" at its
own loss; a failed cell (an error, no result) is left out, as the per-rung verdicts leave it out. The
floor is the record's ``baselines.loss_floor`` (the LM's grammar entropy; 0 for tasks without one),
the trivial loss its ``baselines.loss`` where the task records one (the LM's unigram model), else the
worst finished loss of the rung, which is where a diverged seed counts anyway.

The compute of each rung is the one the matrix file declares (relative to the cell without the
ladder); where a rung declares none, the baseline's measured training FLOPs (steps x FLOPs per step,
mean over its finished seeds). The slope per doubling, the exponent and the multiplier do not depend
on the unit. Where neither is known, or a rung lacks cells, the question gets no trend and says why.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..durations import format_duration
from ..matrixfile import RUNG_AXIS
from ..store.layout import PLOTS_DIR
from ..store.record import CellRecord
from .analysis import TaskAnalysis
from .plots import TrendLine, draw_trend
from .results import Group, TuningCost
from .trend import DID_NOT_LEARN, DIVERGED, NOT_SCALING, OK, Ladder, Rung, SeedLoss, TrendVerdict, trend

#: the metric the trend reads: every task's validation cross-entropy
LOSS = "loss"


@dataclass(frozen=True)
class LadderQuestion:
    """One task x design up the ladder: its trend (None, with ``missing`` saying why, where none can be
    computed) and its per-rung verdicts, (rung, verdict word) in ladder order."""

    task: str
    variant: str
    baseline: str
    verdict: TrendVerdict | None
    missing: str
    rung_verdicts: tuple[tuple[str, str], ...]


def seed_losses(group: Group, analysis: TaskAnalysis) -> tuple[SeedLoss, ...]:
    """Each counted seed of ``group`` as the trend reads it: its final validation loss and how it ended
    (failed cells and seeds without a recorded loss are left out)."""
    not_learned = {id(r) for r in group.did_not_learn(analysis.headline)}
    losses = []
    for record in group.results:
        if record.seed is None:
            continue
        if record.status == "diverged":
            losses.append(SeedLoss(record.seed, None, DIVERGED))
        elif record.ok and record.metrics.get(LOSS) is not None:
            status = DID_NOT_LEARN if id(record) in not_learned else OK
            losses.append(SeedLoss(record.seed, float(record.metrics[LOSS]), status))
    return tuple(losses)


def _baselines(groups: list[Group]) -> dict[str, float]:
    """The trivial baselines the records of ``groups`` carry (the first record that has them)."""
    record = next((r for g in groups for r in g.results if r.baselines), None)
    return {k: float(v) for k, v in (record.baselines if record else {}).items() if v is not None}


def _measured_compute(baseline: Group) -> float | None:
    """The baseline's training FLOPs at a rung: steps x FLOPs per step, mean over its finished seeds."""
    flops = [
        r.steps * r.performance.flops_per_step
        for r in baseline.ok
        if r.steps and r.performance is not None and r.performance.flops_per_step
    ]
    return statistics.fmean(flops) if flops else None


def _computes(analysis: TaskAnalysis, baselines: list[Group]) -> tuple[float, ...] | None:
    """Each rung's compute: the declared ones where every rung declares one, else the baselines' measured
    FLOPs where every rung has them (one unit throughout); None otherwise."""
    declared = analysis.settings.rung_computes
    if declared and all(c is not None for c in declared):
        return tuple(float(c) for c in declared)  # type: ignore[arg-type]
    measured = [_measured_compute(g) for g in baselines]
    return None if any(c is None for c in measured) else tuple(measured)  # type: ignore[arg-type]


def _rung(name: str, compute: float, variant: Group, baseline: Group, analysis: TaskAnalysis) -> Rung:
    recorded = _baselines([variant, baseline])
    sides = seed_losses(variant, analysis), seed_losses(baseline, analysis)
    finished = [s.loss for side in sides for s in side if s.loss is not None]
    trivial = recorded.get(LOSS, max(finished, default=math.inf))
    return Rung(name, compute, recorded.get("loss_floor", 0.0), trivial, *sides)


def ladder_questions(analysis: TaskAnalysis) -> list[LadderQuestion]:
    """Every design of the task against the baseline up the matrix's ladder (none without one), its trend
    decided at the plan's per-look α (α/K where seeds come in rounds): rungs that stop at an early look
    beside rungs that go on make a slope test at the full α reject a true slope of 0 too often
    (``benchmarks/statistics/trend_error_rates.py``, section (f))."""
    rungs = analysis.settings.rungs
    if not rungs or RUNG_AXIS not in analysis.level_axes:
        return []
    verdicts = {q.group.variant: q.verdict for q in analysis.questions}
    by_design: dict[tuple, dict[str, Group]] = {}
    for group in analysis.groups:
        if analysis.is_baseline(group):
            continue
        level = dict(group.level)
        rest = tuple((k, v) for k, v in group.level if k != RUNG_AXIS)
        by_design.setdefault((group.design, rest), {})[str(level.get(RUNG_AXIS))] = group
    found = []
    for (design, _), groups in by_design.items():
        pairs = [(groups.get(r), analysis.baseline_of(groups[r]) if r in groups else None) for r in rungs]
        rung_verdicts = tuple(
            (r, verdicts.get(g.variant, "no result") if g else "no result")
            for r, (g, _) in zip(rungs, pairs, strict=True)
        )
        verdict, missing = None, ""
        absent = [r for r, (g, b) in zip(rungs, pairs, strict=True) if g is None or b is None]
        computes = None if absent else _computes(analysis, [b for _, b in pairs])  # type: ignore[misc]
        if absent:
            missing = f"no cells of both sides at rung {', '.join(absent)} yet"
        elif computes is None:
            missing = "the rungs' computes are unknown: declare compute: for every rung in the ladder"
        else:
            try:
                ladder = Ladder(
                    tuple(_rung(r, c, g, b, analysis) for r, c, (g, b) in zip(rungs, computes, pairs, strict=True))  # type: ignore[arg-type]
                )
                looks = analysis.looks  # the plan's α/K, as every question; its last look for the reason
                verdict = trend(ladder, alpha=looks.per_look_alpha, planned_pairs=looks.sizes[-1])
            except ValueError as exc:
                missing = str(exc)
        found.append(LadderQuestion(analysis.task, design, analysis.baseline_label, verdict, missing, rung_verdicts))
    return found


# rendering -----------------------------------------------------------------------------------------


def _interval(interval: tuple[float, float] | None, digits: str = "+.3f") -> str:
    return "" if interval is None else f" [{interval[0]:{digits}}, {interval[1]:{digits}}]"


def trend_word(verdict: TrendVerdict | None) -> str:
    """The trend's word as the table shows it: none where the ladder does not scale."""
    if verdict is None:
        return "–"
    if verdict.word == NOT_SCALING:
        return "none (ladder not scaling)"
    return f"**{verdict.word}**" + (" (rank test)" if verdict.rank_based else "")


def multipliers_text(verdict: TrendVerdict) -> str:
    """``×1.52 at 1x; ×1.49 at 4x``: the compute multiplier at each rung where it can be read off."""
    found = [f"×{r.multiplier:.2f} at {r.name}" for r in verdict.rungs if r.multiplier is not None]
    return "; ".join(found) or "–"


def trend_row(question: LadderQuestion) -> list[str]:
    """The table's row of a question: task, variant, trend, slope, exponent, multiplier, per-rung verdicts."""
    v = question.verdict
    rungs = [word for _, word in question.rung_verdicts]
    if v is None:
        return [question.task, question.variant, f"– ({question.missing})", "–", "–", "–", *rungs]
    slope = f"{v.beta:+.3f}{_interval(v.interval)}"
    exponent = f"{v.exponent.value:.3f}{_interval(v.exponent.interval, '.3f')}"
    return [question.task, question.variant, trend_word(v), slope, exponent, multipliers_text(v), *rungs]


def trend_table(questions: list[LadderQuestion]) -> list[str]:
    """The trend table's Markdown (empty without questions), the rungs' verdicts in ladder order."""
    if not questions:
        return []
    rungs = [name for name, _ in questions[0].rung_verdicts]
    level = next((f"{100 * (1 - q.verdict.level):.3g}%" for q in questions if q.verdict), "95%")
    header = [
        "task",
        "variant",
        "trend",
        f"slope per doubling [{level}]",
        f"baseline exponent [{level}]",
        "compute multiplier",
        *(f"verdict at {r}" for r in rungs),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in trend_row(q)) + " |" for q in questions]
    return [*lines, ""]


def trend_section(questions: list[LadderQuestion], baseline: str, picture: str | None = None) -> list[str]:
    """The summary's ``Trend up the ladder``: how to read it, the table and the trend picture."""
    if not questions:
        return []
    lines = [
        "## Trend up the ladder",
        "",
        f"Each variant against `{baseline}` at every rung, then over the rungs: θ, the log ratio of the two sides' "
        "reducible loss (loss minus the task's floor) per seed pair, regressed on log2 of the compute. **holds**: "
        "the effect, as a compute multiplier, is the same at every rung within the margin; **grows** / "
        "**shrinks**: its magnitude changes with compute; **reverses**: its sign changes; **undecided**: the data "
        "cannot tell. Each is decided at the error rate that each look of the matrix's seed plan spends (5% split "
        "equally over the looks, as for every question; the intervals are at that level). A baseline whose "
        "reducible loss does not fall up the ladder gets no trend (ladder not "
        "scaling). The baseline exponent is α in loss − floor ∝ compute^−α; the compute multiplier how many "
        "times a rung's compute the baseline needs to reach the variant's loss there (read off the baseline's "
        "line within the ladder only; it decides nothing). Under the table, why each word is what it is. The rule: "
        "docs/decisions/trend-rule.md.",
        "",
        *trend_table(questions),
        *[
            f"- {q.task}, {q.variant}: {trend_word(q.verdict)}: {q.verdict.reason}"
            for q in questions
            if q.verdict is not None
        ],
        "",
    ]
    return [*lines, *([picture, ""] if picture else [])]


#: the trend picture of a ladder matrix, under its plots folder
TREND_PICTURE = "trend.png"


def draw_trend_picture(matrix_dir: Path, questions: list[LadderQuestion]) -> str | None:
    """Draw ``plots/trend.png`` (a panel per task, :func:`.plots.draw_trend`) and return its Markdown
    image line; None, with nothing drawn, where no question has a trend."""
    panels: dict[str, list[TrendLine]] = {}
    for q in questions:
        v = q.verdict
        if v is None:
            continue
        verdicts = dict(q.rung_verdicts)
        panels.setdefault(q.task, []).append(
            TrendLine(
                q.variant,
                tuple(r.doublings for r in v.rungs),
                tuple(max(r.pairs, 1) for r in v.rungs),
                tuple(r.theta for r in v.rungs),
                tuple(r.interval for r in v.rungs),
                tuple(verdicts.get(r.name, "") for r in v.rungs),
                v.beta,
                v.word,
            )
        )
    if not panels:
        return None
    draw_trend(matrix_dir / PLOTS_DIR / TREND_PICTURE, f"{matrix_dir.name}: the trend up the ladder", panels)
    return f"![The trend of every question up the ladder of {matrix_dir.name}]({PLOTS_DIR}/{TREND_PICTURE})"


def ladder_cost_line(
    rungs: tuple[str, ...], groups: list[Group], tuning: dict[tuple[str, str], TuningCost]
) -> list[str]:
    """The header's line on what each rung cost: its reported cells' and its tuning cells' process time."""
    if not rungs:
        return []
    seconds = dict.fromkeys(rungs, 0.0)
    for group in groups:
        rung = dict(group.level).get(RUNG_AXIS)
        if rung in seconds:
            seconds[rung] += sum(_seconds(r) for r in group.results)
    for (_, rung), cost in tuning.items():
        if rung in seconds:
            seconds[rung] += cost.seconds
    parts = ", ".join(f"{rung} {format_duration(s)} ({s / 3600:.2f} h)" for rung, s in seconds.items())
    return [f"Ladder cost per rung, cell processes with their tuning: {parts}  "]


def _seconds(record: CellRecord) -> float:
    return record.wall_time_s or 0.0
