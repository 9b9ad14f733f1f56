"""Validation curves of a matrix as one figure, ``plots/curves.png``: a row per task, and in each
row the task's headline metric at every full validation beside the loss curve (the validation loss on a
fixed sample, every few steps: ``result.json`` ``curve``; the full validations' loss where a cell has
no curve), with human titles, one colour and marker per variant in every row, and a legend per row
naming each variant with its seed counts.

Each variant is the mean over its finished seeds at every validation with the 95% t interval of that
mean (``seed_series``): error bars on the few full validations, a shaded band along the dense loss
curve. Seeds that diverged are thin dotted lines ending with a × where training stopped. The task's
trivial baseline is a labelled dashed grey line, or, where it lies far outside the curves, written at
the panel's edge. Every axis is linear (BLEU and accuracy are bounded; a log axis hid their scale). The
figure is drawn with matplotlib's Agg canvas (no display) and written atomically, without a software
version in the PNG, so that unchanged results redraw the same bytes. The verdict picture (a forest
plot of every question) is ``forest``'s.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..store.files import save_figure
from ..store.record import CellRecord, HistoryPoint
from .stats import t_confidence_interval

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


#: metric names in words, for titles and axis labels (any other: its name with spaces)
METRIC_WORDS = {
    "bleu": "BLEU",
    "accuracy": "top-1 accuracy",
    "agreement_acc": "agreement accuracy",
    "bits_per_byte": "bits per byte",
    "exact_match": "exact match",
}


def metric_words(name: str) -> str:
    """``bleu`` -> ``BLEU``, ``perplexity`` -> ``perplexity``."""
    return METRIC_WORDS.get(name, name.replace("_", " "))


def metric_points(history: History, metric: str) -> list[tuple[int, float]]:
    """(step, value) of every validation that recorded a finite ``metric``."""
    points = []
    for validation in history:
        value = validation.metrics.get(metric)
        if value is not None and math.isfinite(value):
            points.append((int(validation.step), float(value)))
    return points


@dataclass(frozen=True)
class SeriesPoint:
    """One validation step of a variant's curve: the mean over the ``n`` seeds that validated there
    and the :data:`CURVE_LEVEL` t interval of that mean (None with one seed)."""

    step: int
    mean: float
    n: int
    interval: tuple[float, float] | None


def seed_series(
    histories: Sequence[History], metric: str, low: float = -math.inf, high: float = math.inf
) -> list[SeriesPoint]:
    """At each step where a seed validated ``metric``, the mean over those seeds and the interval of the
    mean, mean ± t(0.975, n − 1) · s / √n, cut at the metric's range [``low``, ``high``] as the summary's
    intervals are (``stats.t_confidence_interval``): how well the seeds pin the variant's mean down, where
    a band from the lowest to the highest seed grows with the number of seeds and says nothing of it."""
    by_step: dict[int, list[float]] = {}
    for history in histories:
        for step, value in metric_points(history, metric):
            by_step.setdefault(step, []).append(value)
    return [
        SeriesPoint(step, statistics.fmean(v), len(v), t_confidence_interval(v, CURVE_LEVEL, low, high))
        for step, v in sorted(by_step.items())
    ]


def legend_label(variant: VariantCurves, name: str | None = None) -> str:
    """``pre (3 seeds)``, ``post (2 seeds, 1 diverged)``; ``name`` in place of the variant's own."""
    n = len(variant.finished)
    counts = [f"{n} seed{'s' * (n != 1)}"] + ([f"{len(variant.diverged)} diverged"] if variant.diverged else [])
    return f"{name or variant.variant} ({', '.join(counts)})"


def has_history(curves: Sequence[VariantCurves]) -> bool:
    return any(history for c in curves for history in c.finished + c.diverged)


@dataclass(frozen=True)
class Panel:
    """One panel of a task's row: the series it draws (``metric``, a key of the histories), its title
    and y label in words, the metric's range (intervals are cut at it) and the task's trivial baseline."""

    metric: str
    title: str  # ``validation perplexity (lower is better)``
    ylabel: str  # ``perplexity``
    low: float = -math.inf
    high: float = math.inf
    baseline: float | None = None


@dataclass(frozen=True)
class TaskCurves:
    """One row of the curves figure: a task, its panels (the headline metric, then the loss) and its variants."""

    task: str
    description: str
    panels: tuple[Panel, ...]
    curves: tuple[VariantCurves, ...]


#: the figure's file name in ``<matrix>/plots/``
CURVES_PICTURE = "curves.png"
#: the confidence level of the curves' intervals
CURVE_LEVEL = 0.95
#: a series with at most this many validations is drawn as points with error bars (three full validations
#: joined by a band would suggest values between them that were never measured); a denser one, the loss
#: curve, as a line with a band
SPARSE = 6
#: sparse series of different variants at the same step are set this share of the steps' span apart
DODGE = 0.018
#: colour-blind-safe colours (Okabe-Ito) and markers, one pair per variant, the same in every row
COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
CURVES_WIDTH = 9.5  # inches: two panels and a legend, readable when shown 800 pixels wide
ROW_HEIGHT = 2.7  # inches per task
FONT = {"base": 9.5, "title": 10.0, "suptitle": 11.5, "caption": 9.0}
CAPTION_CHARS = 125  # the caption's line length
BASELINE_REACH = 0.5  # a trivial baseline further than this share of the data's span from it is written, not drawn
CAPTION = (
    "Mean over seeds at each validation. Error bars (full validations) and shaded bands (the loss curve): "
    "the 95% confidence interval of the mean, mean ± t(0.975, n − 1)·s/√n over the n seeds named in the "
    "legend (none with one seed), cut at the metric's range. Dashed grey: the task's trivial baseline.{diverged}"
)


def _styles(rows: Sequence[TaskCurves]) -> dict[str, tuple[str, str]]:
    """Each variant's colour and marker, by first appearance, the same in every row."""
    variants = dict.fromkeys(c.variant for row in rows for c in row.curves)
    return {v: (COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)]) for i, v in enumerate(variants)}


def _names(curves: Sequence[VariantCurves]) -> tuple[str | None, dict[str, str]]:
    """The legend's title and each variant's name in it: where every variant sets the same one axis
    (``ffn=mlp``, ``ffn=swiglu``), the axis as the title and the values as the names."""
    sides = [c.variant.split("=", 1) for c in curves]
    one_axis = all(len(s) == 2 and "," not in c.variant for s, c in zip(sides, curves, strict=True))
    if one_axis and len({s[0] for s in sides}) == 1:
        return sides[0][0], {c.variant: s[1] for s, c in zip(sides, curves, strict=True)}
    return None, {c.variant: c.variant for c in curves}


def _draw_panel(ax, panel: Panel, curves: Sequence[VariantCurves], styles: dict[str, tuple[str, str]]) -> None:
    """One panel: each variant's mean with its interval, its diverged seeds dotted, the trivial baseline."""
    series = {c.variant: seed_series(c.finished, panel.metric, panel.low, panel.high) for c in curves}
    steps = sorted({p.step for s in series.values() for p in s})
    span = (steps[-1] - steps[0]) if len(steps) > 1 else 1.0
    plotted: list[float] = []
    for k, variant in enumerate(curves):
        color, marker = styles[variant.variant]
        points = series[variant.variant]
        if points:
            means = [p.mean for p in points]
            lows = [p.interval[0] if p.interval else p.mean for p in points]
            highs = [p.interval[1] if p.interval else p.mean for p in points]
            plotted += lows + highs
            if len(points) <= SPARSE:
                shift = (k - (len(curves) - 1) / 2) * DODGE * span
                xs = [p.step + shift for p in points]
                errors = [
                    [m - lo for m, lo in zip(means, lows, strict=True)],
                    [h - m for m, h in zip(means, highs, strict=True)],
                ]
                ax.plot(xs, means, color=color, linewidth=1.0, alpha=0.55)  # a guide for the eye, not a measurement
                ax.errorbar(
                    xs, means, yerr=errors, color=color, marker=marker, markersize=5, linestyle="none", capsize=3
                )
            else:
                xs = [p.step for p in points]
                ax.plot(xs, means, color=color, linewidth=1.6)
                ax.fill_between(xs, lows, highs, color=color, alpha=0.2, linewidth=0)
        for history in variant.diverged:
            found = metric_points(history, panel.metric)
            if found:
                xs, ys = zip(*found, strict=True)
                ax.plot(xs, ys, color=color, linestyle=":", linewidth=1.2)
                ax.plot(xs[-1], ys[-1], color=color, marker="x", markersize=7, linestyle="none")
                plotted += ys
    _draw_baseline(ax, panel.baseline, plotted)
    ax.set_title(panel.title, fontsize=FONT["title"])
    ax.set_xlabel("training step", fontsize=FONT["base"])
    ax.set_ylabel(panel.ylabel, fontsize=FONT["base"])
    ax.tick_params(labelsize=FONT["base"] - 0.5)
    ax.grid(alpha=0.3)


def _draw_baseline(ax, baseline: float | None, plotted: Sequence[float]) -> None:
    """The trivial baseline as a dashed grey line with its name, or, where drawing it would squash the
    curves (a unigram perplexity of 30 above curves near 8), written at the panel's edge with its value."""
    if baseline is None or not math.isfinite(baseline):
        return
    low, high = (min(plotted), max(plotted)) if plotted else (baseline, baseline)
    reach = BASELINE_REACH * max(high - low, abs(high) * 1e-3, 1e-12)
    size = FONT["base"] - 0.5
    if low - reach <= baseline <= high + reach:
        ax.axhline(baseline, color="0.45", linestyle="--", linewidth=1.1, zorder=1)
        ax.annotate(
            "trivial baseline",
            (1.0, baseline),
            xycoords=("axes fraction", "data"),
            xytext=(-3, 2),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=size,
            color="0.35",
        )
        return
    above = baseline > high
    ax.text(
        0.98,
        0.97 if above else 0.03,
        f"trivial baseline {baseline:.3g} {'↑' if above else '↓'} (off the axis)",
        transform=ax.transAxes,
        ha="right",
        va="top" if above else "bottom",
        fontsize=size,
        color="0.35",
    )


def curves_figure(title: str, rows: Sequence[TaskCurves]) -> Figure | None:
    """The validation curves of a matrix as one figure: a row per task with a history, its panels side
    by side, a legend per row (each variant with its seed counts), the caption under them. None where no
    task has a history."""
    rows = [row for row in rows if has_history(row.curves)]
    if not rows:
        return None
    diverged = any(c.diverged for row in rows for c in row.curves)
    figure = Figure(figsize=(CURVES_WIDTH, 1.3 + ROW_HEIGHT * len(rows)), layout="constrained")
    FigureCanvasAgg(figure)
    styles = _styles(rows)
    for sub, row in zip(figure.subfigures(len(rows), 1, squeeze=False)[:, 0], rows, strict=True):
        for ax, panel in zip(sub.subplots(1, len(row.panels), squeeze=False)[0], row.panels, strict=True):
            _draw_panel(ax, panel, row.curves, styles)
        heading, names = _names(row.curves)
        handles = [
            Line2D(
                [], [], color=styles[c.variant][0], marker=styles[c.variant][1], label=legend_label(c, names[c.variant])
            )
            for c in row.curves
        ]
        sub.legend(
            handles=handles,
            title=heading,
            loc="outside right center",
            fontsize=FONT["base"] - 0.5,
            title_fontsize=FONT["base"],
            frameon=False,
        )
        sub.suptitle(f"{row.task}: {row.description}", fontsize=FONT["title"], fontweight="bold", x=0.01, ha="left")
    figure.suptitle(title, fontsize=FONT["suptitle"])
    note = " Dotted, ending in ×: a seed that diverged." if diverged else ""
    caption = textwrap.fill(CAPTION.format(diverged=note), CAPTION_CHARS)
    figure.supxlabel(caption, fontsize=FONT["caption"], color="0.25")
    return figure


def draw_curves(path: Path, title: str, rows: Sequence[TaskCurves]) -> bool:
    """Draw :func:`curves_figure` to ``path`` (PNG); False, with nothing written, without any history."""
    figure = curves_figure(title, rows)
    if figure is None:
        return False
    save_atomic(figure, path)
    return True


#: the PNG's metadata: none (matplotlib would name its version), so a redrawn figure differs only where it does
PNG_METADATA = {"Software": None}
#: pixels per inch of the saved pictures: sharp when a page shows them scaled down to its width
DPI = 150


def save_atomic(figure: Figure, path: Path) -> None:
    """Save as PNG to a temporary file next to ``path``, then rename it into place. The file carries no
    software version (nor a time: matplotlib writes none to a PNG), so redrawing unchanged results leaves
    the committed file unchanged."""
    save_figure(path, figure, format="png", dpi=DPI, metadata=PNG_METADATA)


# learning-rate curves ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RatePanel:
    """One rung's panel of learning-rate curves: its name, the trivial loss, variant -> (rate, loss) points
    (loss None: the rate diverged or failed, drawn as × at the trivial loss)."""

    rung: str
    trivial: float
    curves: dict[str, tuple[tuple[float, float | None], ...]]


def draw_rate_curves(path: Path, title: str, panels: Sequence[RatePanel]) -> None:
    """Loss against log10 of the peak learning rate, a panel per rung, a line per variant (colours shared
    across panels), the trivial loss a dashed grey line; saved as PNG to ``path``."""
    figure = Figure(figsize=(3.2 * len(panels) + 1.5, 3.4), layout="constrained")
    FigureCanvasAgg(figure)
    variants = list(dict.fromkeys(v for panel in panels for v in panel.curves))
    colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    axes = figure.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    for ax, panel in zip(axes, panels, strict=True):
        for variant, points in panel.curves.items():
            x = [math.log10(rate) for rate, _ in points]
            y = [panel.trivial if loss is None else min(loss, panel.trivial) for _, loss in points]
            ax.plot(x, y, color=colours[variant], marker="o", label=variant)
            failed = [(xi, panel.trivial) for xi, (_, loss) in zip(x, points, strict=True) if loss is None]
            if failed:
                ax.plot(*zip(*failed, strict=True), linestyle="none", marker="x", color=colours[variant], markersize=9)
        ax.axhline(panel.trivial, color="0.6", linestyle="--", linewidth=1)
        ax.set_title(f"rung {panel.rung}", fontsize=FONT["title"])
        ax.set_xlabel("log10 peak learning rate", fontsize=FONT["base"])
    axes[0].set_ylabel("tuning-split loss (capped at the trivial loss)", fontsize=FONT["base"])
    figure.legend(
        handles=[Line2D([], [], color=colours[v], marker="o", label=v) for v in variants],
        loc="outside right center",
        fontsize=FONT["base"] - 0.5,
        frameon=False,
    )
    figure.suptitle(title, fontsize=FONT["suptitle"])
    save_atomic(figure, path)


# the trend of a ladder ------------------------------------------------------------------------------

#: a rung's marker colour by its per-rung verdict (any other word: grey)
VERDICT_COLOURS = {"better": "tab:green", "worse": "tab:red", "equivalent": "tab:blue"}


@dataclass(frozen=True)
class TrendLine:
    """One variant's trend in a family's panel: each rung's log2 compute, pairs, mean θ with its interval
    (None: no interval) and per-rung verdict, and the fitted slope per doubling."""

    variant: str
    x: tuple[float, ...]
    pairs: tuple[int, ...]
    theta: tuple[float, ...]
    intervals: tuple[tuple[float, float] | None, ...]
    verdicts: tuple[str, ...]
    slope: float
    word: str


def draw_trend(path: Path, title: str, panels: dict[str, Sequence[TrendLine]]) -> None:
    """θ (the log ratio of reducible loss) against log2 compute, a panel per family (task), per variant
    the rung means with their intervals, markers coloured by the rung's verdict, and the fitted slope
    line (least squares over the pairs: through the pairs' mean point); saved as PNG to ``path``."""
    figure = Figure(figsize=(4.2 * len(panels) + 1.0, 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, (family, lines) in zip(axes, panels.items(), strict=True):
        for i, line in enumerate(lines):
            colour = f"C{i % 10}"
            weights = sum(line.pairs)
            x_mean = sum(n * x for n, x in zip(line.pairs, line.x, strict=True)) / weights
            t_mean = sum(n * t for n, t in zip(line.pairs, line.theta, strict=True)) / weights
            ends = [min(line.x), max(line.x)]
            ax.plot(
                ends,
                [t_mean + line.slope * (x - x_mean) for x in ends],
                color=colour,
                label=f"{line.variant}: {line.word}",
            )
            for x, t, interval, verdict in zip(line.x, line.theta, line.intervals, line.verdicts, strict=True):
                if interval is not None:
                    ax.plot([x, x], interval, color=colour, linewidth=1)
                ax.plot(
                    [x],
                    [t],
                    marker="o",
                    markersize=7,
                    color=VERDICT_COLOURS.get(verdict, "0.5"),
                    markeredgecolor=colour,
                )
        ax.axhline(0.0, color="0.6", linestyle="--", linewidth=1)
        ax.set_title(family, fontsize=FONT["title"])
        ax.set_xlabel("log2 training compute", fontsize=FONT["base"])
        ax.legend(fontsize=FONT["base"] - 1, frameon=False)
    axes[0].set_ylabel("θ: ln reducible-loss ratio", fontsize=FONT["base"])
    figure.suptitle(title, fontsize=FONT["suptitle"])
    figure.supxlabel(
        textwrap.fill(
            "Markers: rung means of θ with their intervals, filled by the rung's verdict (green better, red worse, "
            "blue equivalent, grey otherwise); lines: the fitted slope per doubling.",
            70 + 40 * (len(panels) - 1),
        ),
        fontsize=FONT["caption"],
        color="0.25",
    )
    save_atomic(figure, path)
