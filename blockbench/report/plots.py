"""Validation curves of a matrix: one PNG per task, one panel per metric, one line per variant;
first the loss-curve points' panel (the validation loss on a fixed sample, every few steps).

Each line is the mean over the variant's finished seeds at every validation step, with a shaded
band from the lowest to the highest seed. Seeds that diverged are drawn as thin dotted lines that
end with a × where training stopped. The task's trivial baseline is a dashed grey line.
Figures are drawn with matplotlib's Agg canvas (no display) and written atomically, without a
software version in the PNG, so that unchanged results redraw the same bytes. The verdict picture
(a forest plot of every question) is ``forest``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..layout import atomic_path
from ..record import CellRecord, HistoryPoint

History = list[HistoryPoint]  # a cell's validations: step, seconds since training began, every metric


@dataclass
class VariantCurves:
    """The validation histories of one task x variant."""

    variant: str
    finished: list[History] = field(default_factory=list)  # seeds with status "ok"
    diverged: list[History] = field(default_factory=list)  # may be empty: diverged before the first validation


#: the panel of the loss-curve points (``result.json`` ``curve``, see ``blockbench.cell.callbacks.LossCurve``)
CURVE_METRIC = "curve_loss"


def plotted_history(result: CellRecord) -> History:
    """A cell's validations with its loss-curve points as validations of ``CURVE_METRIC`` alone."""
    points = result.curve.points if result.curve else []
    return [*result.history, *(HistoryPoint(step=int(step), metrics={CURVE_METRIC: loss}) for step, loss in points)]


def metric_points(history: History, metric: str) -> list[tuple[int, float]]:
    """(step, value) of every validation that recorded a finite ``metric``."""
    points = []
    for validation in history:
        value = validation.metrics.get(metric)
        if value is not None and math.isfinite(value):
            points.append((int(validation.step), float(value)))
    return points


def seed_band(histories: Sequence[History], metric: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps and, at each, the mean, min and max over the seeds that validated at that step."""
    by_step: dict[int, list[float]] = {}
    for history in histories:
        for step, value in metric_points(history, metric):
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    means = [sum(by_step[s]) / len(by_step[s]) for s in steps]
    return steps, means, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps]


def legend_label(variant: VariantCurves) -> str:
    """``pre (3 seeds)``, ``post (2 seeds, 1 diverged)``."""
    n = len(variant.finished)
    counts = [f"{n} seed{'s' * (n != 1)}"] + ([f"{len(variant.diverged)} diverged"] if variant.diverged else [])
    return f"{variant.variant} ({', '.join(counts)})"


def has_history(curves: Sequence[VariantCurves]) -> bool:
    return any(history for c in curves for history in c.finished + c.diverged)


def plot_task(
    path: Path,
    title: str,
    metrics: Sequence[tuple[str, bool]],
    curves: Sequence[VariantCurves],
    baselines: dict[str, float] | None = None,
) -> bool:
    """Draw one task's validation curves to ``path`` (PNG); False (nothing written) without any history.

    ``metrics`` are (name, higher_is_better) pairs, one panel each.
    """
    if not has_history(curves):
        return False
    baselines = baselines or {}
    figure = Figure(figsize=(5.0 * len(metrics), 3.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(metrics), squeeze=False)[0]
    colors = [f"C{i % 10}" for i in range(len(curves))]
    for ax, (metric, higher_is_better) in zip(axes, metrics, strict=True):
        plotted: list[float] = []
        for color, variant in zip(colors, curves, strict=True):
            label: str | None = legend_label(variant)
            steps, means, lows, highs = seed_band(variant.finished, metric)
            if steps:
                ax.plot(steps, means, color=color, marker="o", markersize=3, label=label)
                label = None
                if len(variant.finished) > 1:
                    ax.fill_between(steps, lows, highs, color=color, alpha=0.2, linewidth=0)
                plotted += lows + highs
            for history in variant.diverged:
                points = metric_points(history, metric)
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, color=color, linestyle=":", linewidth=1, label=label)
                    ax.plot(xs[-1], ys[-1], color=color, marker="x", markersize=7)
                    label = None  # a variant whose seeds all diverged is named by its first dotted line
                    plotted += ys
        if metric in baselines and baselines[metric] is not None:
            ax.axhline(baselines[metric], color="grey", linestyle="--", linewidth=1, label="trivial baseline")
            plotted.append(baselines[metric])
        if plotted and min(plotted) > 0 and max(plotted) / min(plotted) > 30:
            ax.set_yscale("log")  # e.g. perplexity falling from thousands to single digits
        ax.set_title(f"{metric} {'↑' if higher_is_better else '↓'}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    diverged = any(c.diverged for c in curves)
    figure.suptitle(
        f"{title}: validation, mean over seeds, band = min–max over seeds"
        + ("; dotted × = diverged seed" if diverged else ""),
        fontsize="medium",
    )
    save_atomic(figure, path)
    return True


#: the PNG's metadata: none (matplotlib would name its version), so a redrawn figure differs only where it does
PNG_METADATA = {"Software": None}


def save_atomic(figure: Figure, path: Path) -> None:
    """Save as PNG to a temporary file next to ``path``, then rename it into place. The file carries no
    software version (nor a time: matplotlib writes none to a PNG), so redrawing unchanged results leaves
    the committed file unchanged."""
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=110, metadata=PNG_METADATA)
