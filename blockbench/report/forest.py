"""The verdict picture: a forest plot of every question's answer, one row per variant vs baseline (at
each level), one panel per model family, for one matrix (``plots/verdicts.png``, shown in its summary)
and for the whole book (``verdicts.png`` beside ``results/README.md``, rows grouped by matrix).

**The axis.** The families' headline metrics differ in unit, scale and direction (perplexity ↓, BLEU
↑, accuracy ↑), and their differences in the book span four decades (an accuracy difference of
0.0005, a perplexity difference of +23), so every panel plots the same quantity: the difference in
*margins of practical equivalence*, (variant − baseline) / margin, **signed so that right is better**
(a metric where lower is better, such as perplexity, is flipped; its panel title says so). The
equivalence band is then ±1 in every panel, zero the line of no difference, and one scale serves
every family and every matrix; the axis is symmetric-logarithmic (linear within ±1 margin, where
the equivalent verdicts live, logarithmic beyond, so −60 BLEU and +0.1 perplexity share a panel),
and a point beyond ±:data:`CLIP` margins is drawn as an arrowhead at the edge with its difference
written beside it in the metric's own unit. The tables beside the picture keep the numbers in the
metric's units; the picture shows where each answer lies against what matters.

**What is drawn for a question** (``Comparison``, as the analysis decided it): a point at the mean
difference; a thin line, its (1 − α_k) interval (better or worse where it leaves out 0 and the typical
seed agrees: P(better) on the same side of 0.5); a thick
line, the (1 − 2α_k) interval of the two one-sided tests (equivalent where it lies inside the band),
both as ``decide.Decision`` has them; colours by verdict (better, worse, equivalent, undecided); a
filled point for a better or worse verdict by more than the margin and a hollow one for a better or
worse verdict possibly by less than the margin (``decide.Decision.beyond_margin``), a diamond instead of
a circle where a rank test decided (the lines are then the t intervals, drawn for scale only);
*saturated*, *not learned* and *no result*, which are not verdicts, in grey with the reason written
beside them. In the book's picture a question that several matrices ask of the same cells is one row
(``book.book_rows``), under the first matrix, its label naming the others.
:func:`forest_rows` computes what is drawn, a pure function of the comparisons, so that it can be
tested against the decisions; :func:`draw_forest` only draws it. The PNG carries no software
version or time, so an unchanged book redraws the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..layout import PLOTS_DIR
from .book import BookRow
from .decide import BETTER, BEYOND_MARGIN, EQUIVALENT, RANK_SUM, SIGNED_RANK, UNDECIDED, WITHIN_MARGIN, WORSE
from .headroom import NOT_LEARNED_SHARE
from .plots import save_atomic
from .verdicts import FAMILIES, NO_RESULT, NOT_LEARNED, SATURATED, Comparison, _rows, family_title

#: the picture's file name: ``<matrix>/plots/verdicts.png`` and ``<results root>/verdicts.png``
VERDICT_PICTURE = "verdicts.png"
#: margins beyond which a point is drawn at the edge, its value written beside it
CLIP = 100.0
#: colours by verdict (Okabe-Ito, told apart with colour-blindness); what is not a verdict is grey
COLORS = {
    BETTER: "#009E73",
    WORSE: "#D55E00",
    EQUIVALENT: "#0072B2",
    UNDECIDED: "#E69F00",
    SATURATED: "#9A9A9A",
    NOT_LEARNED: "#9A9A9A",
    NO_RESULT: "#9A9A9A",
}
#: the order of the legend's verdicts
LEGEND_ORDER = (BETTER, WORSE, EQUIVALENT, UNDECIDED, SATURATED, NOT_LEARNED, NO_RESULT)
TICKS = (-100.0, -10.0, -1.0, 0.0, 1.0, 10.0, 100.0)
#: what the x axis is, said once under the panels (each panel's label only says which way is better)
AXIS_TEXT = (
    "x: the difference from the baseline in margins of practical equivalence, (variant − baseline) / margin, "
    "signed so that right is better; linear within ±1 margin, logarithmic beyond"
)
ROW_INCHES = 0.24  # the height of one row: the figure grows with the rows
TALL = 40  # rows above which the x axis is labelled at the top too
NOTE_CHARS = 40  # the longest reason written beside a grey point


@dataclass(frozen=True)
class ForestPoint:
    """One question in one family's panel, as drawn. ``x`` and the intervals are in margins, signed so
    that positive is better (None: no decision, so nothing to place); ``difference`` is the decision's
    variant − baseline in the metric's unit, written beside a point beyond ±:data:`CLIP`."""

    family: str
    task: str
    metric: str
    higher_is_better: bool
    verdict: str  # better, worse, equivalent, undecided; or saturated, no result
    x: float | None
    interval: tuple[float, float] | None  # the (1 - α_k) interval of x, low to high
    equivalence_interval: tuple[float, float] | None  # the (1 - 2α_k) one (None: a rank test, or no spread)
    difference: float | None
    margin: float | None
    rank_test: bool  # decided by a rank test: the intervals are the t test's, drawn for scale
    note: str = ""  # why there is no verdict: ``saturated: ...``, ``no result: ...``
    #: a better or worse verdict by more than the margin (True: filled) or possibly by less (False: hollow);
    #: None for any other verdict
    beyond_margin: bool | None = None

    @property
    def clipped(self) -> int:
        """+1 or -1 where the point lies beyond ±:data:`CLIP` margins (drawn at that edge), else 0."""
        return 0 if self.x is None or abs(self.x) <= CLIP else int(math.copysign(1, self.x))


@dataclass(frozen=True)
class ForestRow:
    """One variant vs baseline (at one level): its points, a family's tasks each, in family order."""

    group: str  # the matrix in the book's picture; "" in a matrix's own
    label: str  # ``norm_placement: post vs pre at 300 steps``
    points: tuple[ForestPoint, ...]


def in_margins(value: float, margin: float, higher_is_better: bool) -> float:
    """``value`` (a difference, variant − baseline) in margins, signed so that positive is better."""
    return (value if higher_is_better else -value) / margin


def _interval(bounds: tuple[float, float] | None, margin: float, higher_is_better: bool) -> tuple[float, float] | None:
    if bounds is None:
        return None
    low, high = sorted(in_margins(b, margin, higher_is_better) for b in bounds)
    return low, high


def _note(comparison: Comparison) -> str:
    """The reason beside a grey point, short enough for a panel: ``saturated: entropy floor``,
    ``saturated: best bleu``, ``no result: every seed of the baseline failed``."""
    if comparison.verdict == SATURATED:
        where = "entropy floor" if "entropy floor" in comparison.saturation else f"best {comparison.metric.name}"
        return f"saturated: {where}"
    if comparison.verdict == NOT_LEARNED:
        return f"not learned: <{NOT_LEARNED_SHARE:.0%} of the way"
    if comparison.verdict == NO_RESULT or comparison.decision is None:
        text = f"no result: {comparison.missing or 'no seed'}"
        return text if len(text) <= NOTE_CHARS else text[: NOTE_CHARS - 1] + "…"
    return ""


def forest_point(comparison: Comparison) -> ForestPoint:
    """What the picture draws of one comparison, from its own decision (nothing is recomputed)."""
    metric, decision = comparison.metric, comparison.decision
    common = dict(
        family=comparison.family,
        task=comparison.task,
        metric=metric.name,
        higher_is_better=metric.higher_is_better,
        verdict=comparison.verdict,
        note=_note(comparison),
    )
    if decision is None:
        return ForestPoint(
            **common, x=None, interval=None, equivalence_interval=None, difference=None, margin=None, rank_test=False
        )
    up = metric.higher_is_better
    return ForestPoint(
        **common,
        x=in_margins(decision.difference, decision.margin, up),
        interval=_interval(decision.interval, decision.margin, up),
        equivalence_interval=_interval(decision.equivalence_interval, decision.margin, up),
        difference=decision.difference,
        margin=decision.margin,
        rank_test=decision.test in (SIGNED_RANK, RANK_SUM),
        beyond_margin=decision.beyond_margin if comparison.verdict in (BETTER, WORSE) else None,
    )


def short_label(comparison: Comparison) -> str:
    """``norm_placement: post vs pre`` where both sides set the same one axis, else ``variant vs
    baseline`` as the tables write it; then ``at <level>``."""
    variant, baseline = comparison.variant, comparison.baseline
    sides = [side.split("=", 1) for side in (variant, baseline)]
    same_axis = all(len(s) == 2 and "," not in side for s, side in zip(sides, (variant, baseline), strict=True))
    text = (
        f"{sides[0][0]}: {sides[0][1]} vs {sides[1][1]}"
        if same_axis and sides[0][0] == sides[1][0]
        else f"{variant} vs {baseline}"
    )
    return text + (f" at {comparison.level_text}" if comparison.level else "")


def _family_order(family: str) -> tuple[int, str]:
    return (list(FAMILIES).index(family) if family in FAMILIES else len(FAMILIES), family)


def forest_rows(matrices: Sequence[tuple[str, Sequence[Comparison]]]) -> list[ForestRow]:
    """The rows of a picture: per (group, comparisons) in order, a row per variant vs baseline (per
    level) in the order of the verdict tables (``verdicts._rows``: variants as they first come, each
    one's levels ascending), its points in family order (a family's tasks as they come)."""
    rows = []
    for group, comparisons in matrices:
        for found in _rows(list(comparisons)).values():
            ordered = sorted(found, key=lambda c: _family_order(c.family))  # stable: tasks keep their order
            rows.append(ForestRow(group, short_label(found[0]), tuple(forest_point(c) for c in ordered)))
    return rows


# drawing ------------------------------------------------------------------------------------------


def _clip(x: float) -> float:
    return max(-CLIP, min(CLIP, x))


def _slots(rows: Sequence[ForestRow]) -> tuple[list[tuple[str, bool]], list[int]]:
    """The y slots top to bottom, (label, is a group header), and each row's slot. A group (matrix) with
    a name gets a header slot before its rows."""
    slots: list[tuple[str, bool]] = []
    where = []
    group = None
    for row in rows:
        if row.group and row.group != group:
            slots.append((row.group, True))
        group = row.group
        where.append(len(slots))
        slots.append((row.label, False))
    return slots, where


def _panel_title(family: str, points: Sequence[ForestPoint]) -> str:
    """``LM: perplexity ↓ (flipped: right is lower)``, ``translator: bleu ↑``."""
    metrics = dict.fromkeys((p.metric, p.higher_is_better) for p in points)
    names = ", ".join(f"{name} {'↑' if up else '↓'}" for name, up in metrics)
    flipped = " (flipped: right is lower)" if not all(up for _, up in metrics) else ""
    return f"{family_title(family)}: {names}{flipped}"


def _clipped_text(point: ForestPoint) -> str:
    """``−64.2 bleu``: a clipped point's difference in its unit, to three significant digits."""
    return f"{point.difference:+.3g} {point.metric}".replace("-", "−")


def _draw_point(ax: Axes, y: float, point: ForestPoint) -> None:
    """One point of one panel at height ``y``: its intervals, its marker, a clipped value, a grey reason."""
    color = COLORS.get(point.verdict, COLORS[NO_RESULT])
    if point.x is None:
        ax.text(0, y, point.note, color=color, fontsize=6.5, ha="center", va="center", style="italic")
        return
    if point.interval is not None:
        ax.plot([_clip(v) for v in point.interval], [y, y], color=color, linewidth=1.0, solid_capstyle="butt")
    if point.equivalence_interval is not None:
        low, high = point.equivalence_interval
        ax.plot([_clip(low), _clip(high)], [y, y], color=color, linewidth=3.2, alpha=0.55, solid_capstyle="butt")
    x = _clip(point.x)
    if point.clipped:
        marker = ">" if point.clipped > 0 else "<"
        ax.plot(x, y, marker=marker, color=color, markersize=6, linestyle="none")
        ax.annotate(
            _clipped_text(point),
            (x, y),
            xytext=(-7 * point.clipped, 3.5),
            textcoords="offset points",
            ha="right" if point.clipped > 0 else "left",
            va="bottom",
            fontsize=6,
            color=color,
        )
    else:
        face = "white" if point.beyond_margin is False else color
        marker, size = ("D", 4.0) if point.rank_test else ("o", 4.5)
        ax.plot(x, y, marker=marker, markersize=size, markerfacecolor=face, markeredgecolor=color, linestyle="none")
    if point.note:
        side = -1 if point.x > 0 else 1  # write it on the emptier side of zero
        ax.annotate(
            point.note,
            (x, y),
            xytext=(6 * side, 0),
            textcoords="offset points",
            ha="left" if side > 0 else "right",
            va="center",
            fontsize=6,
            color=color,
            style="italic",
        )


def _legend_handles(rows: Sequence[ForestRow]) -> list:
    """The legend: each verdict with how many points have it, then what the band, lines and markers mean."""
    counts = {v: sum(p.verdict == v for r in rows for p in r.points) for v in LEGEND_ORDER}
    handles: list = [
        Line2D([], [], marker="o", linestyle="none", color=COLORS[v], label=f"{v} ({counts[v]})")
        for v in LEGEND_ORDER
        if counts[v] or v in (BETTER, WORSE, EQUIVALENT, UNDECIDED)
    ]
    handles += [
        Patch(color="0.88", label="± the margin: equivalence"),
        Line2D([], [], color="0.3", linewidth=1.0, label="(1−α/K) interval: leaves out 0 for better or worse"),
        Line2D(
            [], [], color="0.3", linewidth=3.2, alpha=0.55, label="(1−2α/K) interval: equivalent if inside the band"
        ),
        Line2D([], [], marker="o", color="0.3", linestyle="none", label=f"filled: better or worse {BEYOND_MARGIN}"),
        Line2D(
            [],
            [],
            marker="o",
            markerfacecolor="white",
            color="0.3",
            linestyle="none",
            label=f"hollow: better or worse, {WITHIN_MARGIN}",
        ),
        Line2D([], [], marker="D", color="0.3", linestyle="none", label="diamond: decided by a rank test"),
        Line2D([], [], marker=">", linestyle="none", color="0.3", label=f"beyond ±{CLIP:g} margins (value written)"),
    ]
    return handles


def draw_forest(path: Path, rows: Sequence[ForestRow], title: str) -> bool:
    """Draw the forest plot of ``rows`` to ``path`` (PNG, the same bytes for the same rows); False,
    with nothing written, where there is no row. See the module's docstring for what is drawn."""
    if not rows:
        return False
    families = sorted({p.family for r in rows for p in r.points}, key=_family_order)
    slots, where = _slots(rows)
    label_chars = max(len(label) for label, _ in slots)
    width = 0.8 + 0.06 * label_chars + 3.3 * len(families)
    figure = Figure(figsize=(width, 2.4 + ROW_INCHES * len(slots)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(families), sharey=True, squeeze=False)[0]
    for ax, family in zip(axes, families, strict=True):
        ax.axvspan(-1, 1, color="0.88", linewidth=0, zorder=0)
        ax.axvline(0, color="0.35", linewidth=0.8, zorder=1)
        for i, (_, header) in enumerate(slots):
            if header and i:
                ax.axhline(i - 0.5, color="0.6", linewidth=0.8, zorder=0)  # above a matrix's name
        for y, row in zip(where, rows, strict=True):
            if y % 2:
                ax.axhspan(y - 0.5, y + 0.5, color="0.965", linewidth=0, zorder=-1)
            ours = [p for p in row.points if p.family == family]
            for k, point in enumerate(ours):
                offset = 0.0 if len(ours) == 1 else -0.25 + 0.5 * k / (len(ours) - 1)
                _draw_point(ax, y + offset, point)
                if len(ours) > 1:
                    ax.annotate(
                        point.task,
                        (1.0, y + offset),
                        xycoords=("axes fraction", "data"),
                        xytext=(-2, 0),
                        textcoords="offset points",
                        ha="right",
                        va="center",
                        fontsize=5.5,
                        color="0.4",
                    )
        ax.set_xscale("symlog", linthresh=1.0, linscale=0.8)
        ax.set_xlim(-CLIP * 1.6, CLIP * 1.6)
        ax.set_xticks(TICKS, [f"{t:+g}".replace("-", "−") if t else "0" for t in TICKS])
        ax.tick_params(axis="x", labelsize=7, top=len(slots) > TALL, labeltop=len(slots) > TALL)
        ax.set_xlabel("← worse    margins    better →", fontsize=7.5)
        ax.grid(axis="x", alpha=0.25)
        ax.set_title(_panel_title(family, [p for r in rows for p in r.points if p.family == family]), fontsize=9)
    axes[0].set_ylim(len(slots) - 0.5, -0.5)
    axes[0].set_yticks(range(len(slots)), [label for label, _ in slots])
    axes[0].tick_params(axis="y", labelsize=7, length=0)
    for tick, (_, header) in zip(axes[0].get_yticklabels(), slots, strict=True):
        if header:
            tick.set_fontweight("bold")
    figure.suptitle(title, fontsize=10)
    legend = figure.legend(
        handles=_legend_handles(rows),
        loc="outside lower center",
        ncol=4,
        fontsize=7,
        frameon=False,
        title=AXIS_TEXT,
        title_fontsize=7.5,
    )
    legend.get_title().set_multialignment("center")
    save_atomic(figure, path)
    return True


# the hooks of the summary and the index -------------------------------------------------------------


def draw_matrix_picture(matrix_dir: Path, comparisons: Sequence[Comparison], *, apart: bool) -> list[str]:
    """Draw ``<matrix>/plots/verdicts.png`` from the matrix's comparisons and return the summary's lines
    that show it (none, and no stale picture left, without a comparison)."""
    path = Path(matrix_dir) / PLOTS_DIR / VERDICT_PICTURE
    title = f"{Path(matrix_dir).name}: each variant against the baseline, per family" + (
        " (verdicts: false, not a design question)" if apart else ""
    )
    if not draw_forest(path, forest_rows([("", comparisons)]), title):
        path.unlink(missing_ok=True)
        return []
    return [f"![The verdicts of {Path(matrix_dir).name}]({PLOTS_DIR}/{VERDICT_PICTURE})", ""]


def book_forest_rows(rows: Sequence[BookRow]) -> list[ForestRow]:
    """The rows of the book's picture: one per row of the index (``book.book_rows``: a question several
    matrices ask of the same cells once), grouped under the first matrix that asks it, its label naming
    the others (``norm_placement: post vs pre (also prenorm_vs_postnorm)``)."""
    found = []
    for row in rows:
        ordered = sorted(row.comparisons, key=lambda c: _family_order(c.family))  # stable: tasks keep their order
        also = f" (also {', '.join(row.names[1:])})" if len(row.names) > 1 else ""
        found.append(ForestRow(row.names[0], short_label(row.comparisons[0]) + also, tuple(map(forest_point, ordered))))
    return found


def draw_book_picture(results_root: Path, book: Sequence[BookRow]) -> str | None:
    """Draw ``<results_root>/verdicts.png``, a row per distinct question of the book grouped by matrix
    (:func:`book_forest_rows`), and return the markdown line that shows it beside ``README.md``; None (and
    no stale picture left) without a comparison."""
    path = Path(results_root) / VERDICT_PICTURE
    rows = book_forest_rows(book)
    title = f"The verdicts of the book: {len(rows)} comparisons, each variant against its matrix's baseline, per family"
    if not draw_forest(path, rows, title):
        path.unlink(missing_ok=True)
        return None
    return f"![The verdicts of every matrix, per family]({VERDICT_PICTURE})"
