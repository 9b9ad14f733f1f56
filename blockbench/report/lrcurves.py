"""Learning-rate curves of a ladder's tuning cells: at every rung each variant trains the same grid of
peak learning rates, so its loss against the rate is a curve the variants share the x of (a top rung
with ``ladder.top_grid`` trains each variant's own centred grid, as ``tune.json`` records it, and a
curve there holds only the rates of its own grid, not the headroom cell's if it lies off it). Described,
never decided: per task x rung x variant, the best loss and the rate that gives it, the sensitivity
over the shared grid (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities": the mean over the grid of min(loss, trivial loss) minus the best, so a rate that
diverged or learned nothing counts at the trivial loss and no worse), the penalty of the variant's best
against the baseline's best at the rung, and the largest rate that learns (finished and beat the
task's trivial baseline). A curve reads each rate's cell of the first tuning seed, the one every
candidate trains on (successive halving trains only the better half again on later seeds).

The trivial loss is the record's ``baselines.loss`` (the LM's unigram model); a task that records none
(translation, the ViT) counts a failed rate at the worst finished loss of the rung, and the table says so.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from ..matrixfile import RUNG_AXIS
from ..store.layout import PLOTS_DIR
from ..store.record import read_tuning
from .plots import RatePanel, draw_rate_curves
from .results import MatrixSettings, TuningCell, tuning_cells

#: the tuned key the curves are over
LR = "optimizer.lr"
LOSS = "loss"


@dataclass(frozen=True)
class RateCurve:
    """One variant's losses over a rung's grid (None: diverged or failed) and what they describe."""

    task: str
    rung: str
    variant: str  # the design, without the rung
    points: tuple[tuple[float, float | None], ...]  # (rate, loss), rates increasing
    trivial: float
    trivial_recorded: bool
    best_loss: float
    best_rate: float
    sensitivity: float
    penalty: float | None  # best minus the baseline's best (None: the baseline itself, or no baseline)
    largest_learning: float | None

    def counted(self) -> list[float]:
        """Each rate's loss as the sensitivity counts it: min(loss, trivial), a failed rate at the trivial."""
        return [self.trivial if loss is None else min(loss, self.trivial) for _, loss in self.points]


def _design(variant: str, rung: str) -> str:
    """The variant's label without its rung: ``norm_placement=pre`` of ``norm_placement=pre,rung=1x``."""
    return ",".join(part for part in variant.split(",") if part != f"{RUNG_AXIS}={rung}")


def _learned(cell: TuningCell, trivial: float) -> bool:
    record = cell.record
    if not record.ok or record.metrics.get(LOSS) is None:
        return False
    return record.learned if record.learned is not None else record.metrics[LOSS] < trivial


def _curve(task: str, rung: str, variant: str, cells: dict[float, TuningCell], trivial: float, recorded: bool):
    points = tuple(
        (rate, float(c.record.metrics[LOSS]) if c.record.ok and c.record.metrics.get(LOSS) is not None else None)
        for rate, c in sorted(cells.items())
    )
    counted = [trivial if loss is None else min(loss, trivial) for _, loss in points]
    best = min(counted)
    best_rate = points[counted.index(best)][0]
    learning = [rate for rate, c in cells.items() if _learned(c, trivial)]
    sensitivity = statistics.fmean(counted) - best
    return RateCurve(
        task, rung, variant, points, trivial, recorded, best, best_rate, sensitivity, None, max(learning, default=None)
    )


def rate_curves(matrix_dir: Path, settings: MatrixSettings) -> list[RateCurve]:
    """Every task x rung x variant's curve of a ladder matrix's tuning cells (none without a ladder)."""
    if not settings.rungs:
        return []
    by_key: dict[tuple[str, str, str], dict[float, TuningCell]] = {}
    tried = _tried_rates(matrix_dir)
    for cell in tuning_cells(matrix_dir):
        rate = cell.values.get(LR)
        if cell.rung is None or not isinstance(rate, (int, float)):
            continue
        if tried is not None and rate not in tried.get((cell.task, cell.variant), ()):
            continue  # not a candidate of its variant's grid: the top rung's headroom cell off the centred grid
        rates = by_key.setdefault((cell.task, cell.rung, _design(cell.variant, cell.rung)), {})
        if rate not in rates or (cell.seed or 0) < (rates[rate].seed or 0):
            rates[rate] = cell  # the first tuning seed's
    curves: list[RateCurve] = []
    order = {rung: i for i, rung in enumerate(settings.rungs)}
    named = settings.baseline_variant and _design(settings.baseline_variant, "")
    for task in dict.fromkeys(key[0] for key in by_key):
        # the matrix's baseline_variant, else its first variant (matrix order), as the verdicts take it
        baseline = named or next(key[2] for key in by_key if key[0] == task)
        for rung in sorted({key[1] for key in by_key if key[0] == task}, key=lambda r: order.get(r, len(order))):
            found = {key[2]: cells for key, cells in by_key.items() if key[:2] == (task, rung)}
            records = [c.record for cells in found.values() for c in cells.values()]
            recorded = next((r.baselines.get(LOSS) for r in records if r.baselines.get(LOSS) is not None), None)
            finished = [r.metrics[LOSS] for r in records if r.ok and r.metrics.get(LOSS) is not None]
            if recorded is None and not finished:
                continue
            trivial = float(recorded) if recorded is not None else max(finished)
            rung_curves = [_curve(task, rung, v, cells, trivial, recorded is not None) for v, cells in found.items()]
            base = next((c for c in rung_curves if c.variant == baseline), None)
            curves += [
                c if base is None or c is base else _with_penalty(c, c.best_loss - base.best_loss) for c in rung_curves
            ]
    return curves


def _tried_rates(matrix_dir: Path) -> dict[tuple[str, str], set[float]] | None:
    """(task, variant) -> the rates its tuning tried, as ``tune.json`` records them (the grid, the values
    added past an end, a top rung's centred grid); None before tuning has ended (no ``tune.json``)."""
    record = read_tuning(matrix_dir)
    if not record or not record.get("tasks"):
        return None
    return {
        (task, variant): {c["values"].get(LR) for c in tuned["candidates"]}
        for task, found in record["tasks"].items()
        for variant, tuned in found["variants"].items()
    }


def _with_penalty(curve: RateCurve, penalty: float) -> RateCurve:
    return replace(curve, penalty=penalty)


def rate_panels(curves: list[RateCurve], task: str) -> list[RatePanel]:
    """``task``'s picture: a panel per rung (ladder order, as ``curves`` come) with that rung's trivial loss
    and its variants' points."""
    rungs: dict[str, list[RateCurve]] = {}
    for curve in curves:
        if curve.task == task:
            rungs.setdefault(curve.rung, []).append(curve)
    return [RatePanel(rung, same[0].trivial, {c.variant: c.points for c in same}) for rung, same in rungs.items()]


def rate_section(matrix_dir: Path, curves: list[RateCurve]) -> list[str]:
    """The summary's ``Learning-rate curves``: the table and a picture per task (``plots/lr_<task>.png``)."""
    if not curves:
        return []
    lines = [
        "## Learning-rate curves",
        "",
        "Each variant's loss on the tuning split over the rung's shared grid of peak learning rates (its first "
        "tuning seed; the tuner itself picks by the task's metric, so the two may prefer different rates; a top "
        "rung that tunes a grid centred on the rungs below has each variant's own grid). "
        "Sensitivity: the mean over the grid of min(loss, trivial loss) minus the best (a rate that diverged or "
        "failed counts at the trivial loss); penalty: the best minus the baseline's best at the rung; the largest "
        "rate that learns: the largest that finished and beat the trivial baseline. A description, never a verdict.",
        "",
        "| task | rung | variant | best loss | at rate | sensitivity | penalty vs baseline | largest rate learning |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in curves:
        penalty = "–" if c.penalty is None else f"{c.penalty:+.4f}"
        largest = "none" if c.largest_learning is None else f"{c.largest_learning:g}"
        trivial = "" if c.trivial_recorded else " (no trivial loss recorded: the rung's worst)"
        lines.append(
            f"| {c.task} | {c.rung} | {c.variant} | {c.best_loss:.4f} | {c.best_rate:g} | {c.sensitivity:.4f}{trivial} "
            f"| {penalty} | {largest} |"
        )
    lines.append("")
    for task in dict.fromkeys(c.task for c in curves):
        name = f"lr_{task}.png"
        draw_rate_curves(
            matrix_dir / PLOTS_DIR / name,
            f"{matrix_dir.name}, {task}: loss over the learning rate",
            rate_panels(curves, task),
        )
        lines += [f"![{task}: loss over the learning rate at each rung]({PLOTS_DIR}/{name})", ""]
    return lines
