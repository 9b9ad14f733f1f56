"""The verdict picture: a forest plot of every question's answer, one row per variant vs baseline (at
each level), one panel per model family, for one matrix (``plots/verdicts.png``, shown in its summary)
and for the whole book (``verdicts.png`` beside ``results/README.md``, rows grouped by matrix).

**The axes.** A panel per model family (and headline metric), each in the metric's own unit: the
mean difference variant − baseline in perplexity, BLEU or accuracy (+3.66 perplexity for post-norm
LMs), not flipped, so that a number read off the picture is the number in the tables; each panel's
axis label says which side is better. The equivalence band is ± the question's margin around 0 in
that unit, drawn behind each row (the margins of one panel may differ a little: a perplexity margin is
a share of the baseline's perplexity), the panel's title giving its value. The families' differences
in the book span four decades (an accuracy difference of 0.0005, a BLEU difference of −68), so each
axis is symmetric-logarithmic, linear within ± the panel's smallest margin, where the equivalent
verdicts live, and logarithmic beyond; its ticks are decades of the unit. A point beyond ±:data:`CLIP`
margins is drawn as an arrowhead at the edge with its difference written beside it. The picture is
sized to be read where a page shows it 800 pixels wide (the README): no text smaller than 8 points on
a figure about 9 inches wide.

**What is drawn for a question** (``Comparison``, as the analysis decided it): a point at the mean
difference; a thin line, its (1 − α_k) interval (better or worse where it leaves out 0 and the typical
seed agrees: P(better) on the same side of 0.5); a thick
line, the (1 − 2α_k) interval of the two one-sided tests (equivalent where it lies inside the band),
both as ``decide.Decision`` has them; colours by verdict (better, worse, equivalent, undecided); a
filled point for a better or worse verdict by more than the margin and a hollow one for a better or
worse verdict possibly by less than the margin (``decide.Decision.beyond_margin``), a diamond instead of
a circle where a rank test decided (the lines are then the t intervals, drawn for scale only). The
legend defines every mark, and its title what α_k is (α = 0.05 split over the question's planned
looks, the rounds of seeds) with the intervals' levels;
*saturated*, *not learned* and *no result*, which are not verdicts, in grey with the reason written
beside them. In the book's picture a question that several matrices ask of the same cells is one row
(``book.book_rows``), under the first matrix, its label naming the others.
:func:`forest_rows` computes what is drawn, a pure function of the comparisons, so that it can be
tested against the decisions; :func:`draw_forest` only draws it. The PNG carries no software
version or time, so an unchanged book redraws the same bytes.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..store.files import remove_files
from ..store.layout import PLOTS_DIR
from .book import BookRow
from .decide import BETTER, BEYOND_MARGIN, EQUIVALENT, RANK_SUM, SIGNED_RANK, UNDECIDED, WITHIN_MARGIN, WORSE
from .headroom import NOT_LEARNED_SHARE
from .plots import metric_words, save_atomic
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
#: what the x axes are and what α_k is, said once under the panels (each axis says which way is better)
AXIS_TEXT = (
    "x: the mean difference variant − baseline over seeds, in the metric's own unit; linear within ± the "
    "margin (the grey band), logarithmic beyond. Colour: the verdict (how many questions have it). α_k, the "
    "error rate of one look: α = 0.05 split equally over the question's planned looks (rounds of seeds); {levels}."
)
ROW_INCHES = 0.32  # the height of one row (two lines of a label): the figure grows with the rows
PANEL_INCHES = 2.15  # the width of one panel
MIN_WIDTH = 9.0  # inches: room for the legend's two columns
CHAR_INCHES = 0.066  # the width of a label's character
LABEL_CHARS = 36  # labels longer than this are wrapped
MIN_ROWS = 3  # the height of at least this many rows: room for a lone row's written values
TALL = 40  # rows above which the x axis is labelled at the top too
NOTE_CHARS = 40  # the longest reason written beside a grey point
LEGEND_CHARS = 115  # the legend title's line length
#: font sizes (points): at most about 9.3 inches wide, the smallest stays 9 pixels high when shown 800 wide
FONT = {"title": 11.0, "panel": 9.5, "label": 8.5, "axis": 8.5, "tick": 8.0, "legend": 8.0, "note": 8.0}


@dataclass(frozen=True)
class ForestPoint:
    """One question in one family's panel, as drawn. ``x`` is the decision's mean difference, variant −
    baseline, in the metric's unit, and the intervals are the decision's too, low to high (None: no
    decision, so nothing to place); ``alpha`` the per-look α_k that set their levels."""

    family: str
    task: str
    metric: str
    higher_is_better: bool
    verdict: str  # better, worse, equivalent, undecided; or saturated, no result
    x: float | None
    interval: tuple[float, float] | None  # the (1 - α_k) interval of x, low to high
    equivalence_interval: tuple[float, float] | None  # the (1 - 2α_k) one (None: a rank test, or no spread)
    margin: float | None
    rank_test: bool  # decided by a rank test: the intervals are the t test's, drawn for scale
    note: str = ""  # why there is no verdict: ``saturated: ...``, ``no result: ...``
    #: a better or worse verdict by more than the margin (True: filled) or possibly by less (False: hollow);
    #: None for any other verdict
    beyond_margin: bool | None = None
    alpha: float | None = None

    @property
    def clipped(self) -> int:
        """+1 or -1 where the point lies beyond ±:data:`CLIP` margins (drawn at that edge), else 0."""
        if self.x is None or self.margin is None or abs(self.x) <= CLIP * self.margin:
            return 0
        return int(math.copysign(1, self.x))


@dataclass(frozen=True)
class ForestRow:
    """One variant vs baseline (at one level): its points, a family's tasks each, in family order."""

    group: str  # the matrix in the book's picture; "" in a matrix's own
    label: str  # ``norm_placement: post vs pre at 300 steps``
    points: tuple[ForestPoint, ...]


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
        return ForestPoint(**common, x=None, interval=None, equivalence_interval=None, margin=None, rank_test=False)
    return ForestPoint(
        **common,
        x=decision.difference,
        interval=decision.interval,
        equivalence_interval=decision.equivalence_interval,
        margin=decision.margin,
        rank_test=decision.test in (SIGNED_RANK, RANK_SUM),
        beyond_margin=decision.beyond_margin if comparison.verdict in (BETTER, WORSE) else None,
        alpha=decision.alpha,
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


def _clip(x: float, margin: float) -> float:
    return max(-CLIP * margin, min(CLIP * margin, x))


def _wrap(label: str) -> str:
    """A label over :data:`LABEL_CHARS` on two lines or more: before ``(also ...)`` where it names the
    other matrices, else at spaces."""
    if len(label) <= LABEL_CHARS:
        return label
    head, also, tail = label.partition(" (also ")
    if also and len(head) <= LABEL_CHARS:
        return f"{head}\n{textwrap.fill('(also ' + tail, LABEL_CHARS)}"
    return textwrap.fill(label, LABEL_CHARS, break_on_hyphens=False)


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
        slots.append((_wrap(row.label), False))
    return slots, where


def forest_panels(rows: Sequence[ForestRow]) -> list[tuple[str, str]]:
    """The panels, (family, metric): the families in their order, a family's metrics as they come (one
    headline metric per family in every task so far: a panel per family)."""
    found = dict.fromkeys((p.family, p.metric) for r in rows for p in r.points)
    return sorted(found, key=lambda key: _family_order(key[0]))


def _linear(points: Sequence[ForestPoint]) -> float:
    """The half-width of a panel's linear part: its smallest margin (1 where no point has one)."""
    return min((p.margin for p in points if p.margin), default=1.0)


def panel_limits(points: Sequence[ForestPoint]) -> tuple[float, float]:
    """The x limits of a panel: each side reaches past its farthest drawn value (a point or an interval's
    end, clipped at ±:data:`CLIP` margins) and past two margins, with room for an arrowhead."""
    linear = _linear(points)
    reach = {-1: 2 * linear, 1: 2 * linear}
    for p in points:
        if p.x is None or p.margin is None:
            continue
        for value in (p.x, *(p.interval or ()), *(p.equivalence_interval or ())):
            value = _clip(value, p.margin)
            if value:
                side = int(math.copysign(1, value))
                reach[side] = max(reach[side], abs(value))
    return -1.6 * reach[-1], 1.6 * reach[1]


def _number(value: float) -> str:
    """``+0.1``, ``−10``, ``0``: a tick or a written value with its sign and a true minus."""
    return "0" if value == 0 else f"{value:+.3g}".replace("-", "−")


def panel_ticks(low: float, high: float, linear: float) -> list[float]:
    """0 and, on each side, the decades of the unit from the linear part to the limit (±0.1, ±1, ±10 in
    a panel whose margin is 0.07); the margin itself on a side that reaches no decade."""
    ticks = [0.0]
    for side, limit in ((-1, -low), (1, high)):
        first, last = math.floor(math.log10(linear)), math.ceil(math.log10(limit))
        decades = [10.0**k for k in range(first, last + 1) if linear * (1 - 1e-9) <= 10.0**k <= limit]
        ticks += [side * d for d in decades] or [side * linear]
    return sorted(ticks)


def _panel_title(family: str, metric: str, points: Sequence[ForestPoint]) -> str:
    """``LM: perplexity`` and its margin, ``margin ±0.074`` (a range where the panel's margins differ)."""
    margins = sorted({float(f"{p.margin:.2g}") for p in points if p.margin})
    text = "" if not margins else f"±{margins[0]:g}" if len(margins) == 1 else f"±{margins[0]:g} to ±{margins[-1]:g}"
    return f"{family_title(family)}: {metric_words(metric)}" + (f"\nequivalence margin {text}" if text else "")


def _axis_label(metric: str, higher_is_better: bool) -> str:
    """``Δ perplexity (variant − baseline)`` and which side is better."""
    sides = "← worse      better →" if higher_is_better else "← better      worse →"
    return f"Δ {metric_words(metric)} (variant − baseline)\n{sides}"


def _clipped_text(point: ForestPoint) -> str:
    """``−64.2 bleu``: a clipped point's difference in its unit, to three significant digits."""
    return f"{_number(point.x)} {metric_words(point.metric)}"


def _draw_point(ax: Axes, y: float, half: float, point: ForestPoint) -> None:
    """One point of one panel at height ``y`` (its share of the row ``half`` above and below): the margin
    band behind it, its intervals, its marker, a clipped value, a grey reason."""
    color = COLORS.get(point.verdict, COLORS[NO_RESULT])
    if point.margin:
        ax.fill_betweenx([y - half, y + half], -point.margin, point.margin, color="0.86", linewidth=0, zorder=0)
    if point.x is None or point.margin is None:
        ax.text(0, y, point.note, color=color, fontsize=FONT["note"], ha="center", va="center", style="italic")
        return
    margin = point.margin
    if point.interval is not None:
        low, high = (_clip(v, margin) for v in point.interval)
        ax.plot([low, high], [y, y], color=color, linewidth=1.1, solid_capstyle="butt")
    if point.equivalence_interval is not None:
        low, high = (_clip(v, margin) for v in point.equivalence_interval)
        ax.plot([low, high], [y, y], color=color, linewidth=3.6, alpha=0.55, solid_capstyle="butt")
    x = _clip(point.x, margin)
    if point.clipped:
        marker = ">" if point.clipped > 0 else "<"
        ax.plot(x, y, marker=marker, color=color, markersize=6.5, linestyle="none")
        ax.annotate(
            _clipped_text(point),
            (x, y),
            xytext=(-8 * point.clipped, 3.5),
            textcoords="offset points",
            ha="right" if point.clipped > 0 else "left",
            va="bottom",
            fontsize=FONT["note"],
            color=color,
        )
    else:
        face = "white" if point.beyond_margin is False else color
        marker, size = ("D", 4.5) if point.rank_test else ("o", 5.0)
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
            fontsize=FONT["note"],
            color=color,
            style="italic",
        )


def _levels(rows: Sequence[ForestRow]) -> str:
    """``here α_k = 0.0167: thin lines are 98.3% intervals, thick lines 96.7%`` (a range where the
    questions' looks differ)."""
    alphas = sorted({round(p.alpha, 6) for r in rows for p in r.points if p.alpha is not None})
    if not alphas:
        return "no question has a decision here"
    if len(alphas) == 1:
        a = alphas[0]
        return f"here α_k = {a:.3g}: thin lines are {1 - a:.1%} intervals, thick lines {1 - 2 * a:.1%}"
    return f"here α_k = {alphas[0]:.3g} to {alphas[-1]:.3g}"


def _legend_handles(rows: Sequence[ForestRow]) -> list:
    """The legend: each verdict with how many points have it, then what the band, lines and markers mean."""
    counts = {v: sum(p.verdict == v for r in rows for p in r.points) for v in LEGEND_ORDER}
    handles: list = [
        Line2D([], [], marker="o", linestyle="none", color=COLORS[v], label=f"{v} ({counts[v]})")
        for v in LEGEND_ORDER
        if counts[v] or v in (BETTER, WORSE, EQUIVALENT, UNDECIDED)
    ]
    dark = "0.3"
    handles += [
        Patch(color="0.86", label="grey band: ± the equivalence margin"),
        Line2D([], [], color=dark, linewidth=1.1, label="thin: (1 − α_k) interval; excludes 0 → better or worse"),
        Line2D(
            [],
            [],
            color=dark,
            linewidth=3.6,
            alpha=0.55,
            label="thick: (1 − 2α_k) interval; inside the band → equivalent",
        ),
        Line2D([], [], marker="o", color=dark, linestyle="none", label=f"filled: better or worse {BEYOND_MARGIN}"),
        Line2D(
            [],
            [],
            marker="o",
            markerfacecolor="white",
            color=dark,
            linestyle="none",
            label=f"hollow: better or worse, {WITHIN_MARGIN}",
        ),
        Line2D(
            [],
            [],
            marker="D",
            color=dark,
            linestyle="none",
            label="diamond: decided by a rank test (lines: t intervals)",
        ),
        Line2D(
            [],
            [],
            marker=">",
            linestyle="none",
            color=dark,
            label=f"arrowhead: beyond ±{CLIP:g} margins, value written",
        ),
    ]
    return handles


def forest_figure(rows: Sequence[ForestRow], title: str) -> Figure | None:
    """The forest plot of ``rows`` (see the module's docstring for what is drawn); None without a row."""
    if not rows:
        return None
    panels = forest_panels(rows)
    slots, where = _slots(rows)
    label_chars = max(len(line) for label, _ in slots for line in label.splitlines())
    width = max(MIN_WIDTH, 0.5 + CHAR_INCHES * label_chars + PANEL_INCHES * len(panels))
    figure = Figure(figsize=(width, 2.9 + ROW_INCHES * max(len(slots), MIN_ROWS)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, (family, metric) in zip(axes, panels, strict=True):
        ours = [p for r in rows for p in r.points if (p.family, p.metric) == (family, metric)]
        ax.axvline(0, color="0.35", linewidth=0.8, zorder=1)
        for i, (_, header) in enumerate(slots):
            if header and i:
                ax.axhline(i - 0.5, color="0.6", linewidth=0.8, zorder=0)  # above a matrix's name
        for y, row in zip(where, rows, strict=True):
            if y % 2:
                ax.axhspan(y - 0.5, y + 0.5, color="0.965", linewidth=0, zorder=-1)
            found = [p for p in row.points if (p.family, p.metric) == (family, metric)]
            for k, point in enumerate(found):
                half = 0.5 / len(found)
                offset = -0.5 + half * (2 * k + 1)
                _draw_point(ax, y + offset, half, point)
                if len(found) > 1:
                    ax.annotate(
                        point.task,
                        (1.0, y + offset),
                        xycoords=("axes fraction", "data"),
                        xytext=(-2, 0),
                        textcoords="offset points",
                        ha="right",
                        va="center",
                        fontsize=FONT["note"],
                        color="0.4",
                    )
        linear = _linear(ours)
        low, high = panel_limits(ours)
        ax.set_xscale("symlog", linthresh=linear, linscale=1.0)
        ax.set_xlim(low, high)
        ticks = panel_ticks(low, high, linear)
        ax.set_xticks(ticks, [_number(t) for t in ticks])
        ax.tick_params(axis="x", labelsize=FONT["tick"], top=len(slots) > TALL, labeltop=len(slots) > TALL)
        ax.set_xlabel(_axis_label(metric, ours[0].higher_is_better), fontsize=FONT["axis"])
        ax.grid(axis="x", alpha=0.25)
        ax.set_title(_panel_title(family, metric, ours), fontsize=FONT["panel"])
    axes[0].set_ylim(len(slots) - 0.5, -0.5)
    axes[0].set_yticks(range(len(slots)), [label for label, _ in slots])
    axes[0].tick_params(axis="y", labelsize=FONT["label"], length=0)
    for tick, (_, header) in zip(axes[0].get_yticklabels(), slots, strict=True):
        if header:
            tick.set_fontweight("bold")
    figure.suptitle(title, fontsize=FONT["title"])
    legend = figure.legend(
        handles=_legend_handles(rows),
        loc="outside lower center",
        ncol=2,
        fontsize=FONT["legend"],
        frameon=False,
        title=textwrap.fill(AXIS_TEXT.format(levels=_levels(rows)), LEGEND_CHARS),
        title_fontsize=FONT["legend"],
    )
    legend.get_title().set_multialignment("left")
    return figure


def draw_forest(path: Path, rows: Sequence[ForestRow], title: str) -> bool:
    """Draw the forest plot of ``rows`` to ``path`` (PNG, the same bytes for the same rows); False,
    with nothing written, where there is no row."""
    figure = forest_figure(rows, title)
    if figure is None:
        return False
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
        remove_files([path])
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
    title = f"Every verdict: {len(rows)} comparisons, each variant against its matrix's baseline, per family"
    if not draw_forest(path, rows, title):
        remove_files([path])
        return None
    return f"![The verdicts of every matrix, per family]({VERDICT_PICTURE})"
