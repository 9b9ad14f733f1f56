"""The verdict picture (``blockbench.report.forest``): what it plots of each question against paired t
tests and two one-sided tests computed here by hand (scipy's t distribution), from hand-written matrix
folders; that ``blockbench report`` draws it per matrix and ``--index`` for the book, shows it in the
markdown, leaves out demonstrations, removes a stale one, and redraws the same bytes. The plotted data
are :func:`forest_rows`'s, a pure function of the comparisons; the figure is read back from its
artists: each point and band in the metric's own unit, a panel per family, every mark in the legend,
and text that stays readable when the picture is shown 800 pixels wide."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from helpers import diverged_result, ok_result
from matplotlib.collections import PolyCollection
from matplotlib.text import Text
from scipy import stats as scipy_stats

from blockbench.cli import main
from blockbench.report.analysis import analyze
from blockbench.report.forest import (
    CLIP,
    VERDICT_PICTURE,
    ForestPoint,
    ForestRow,
    draw_forest,
    forest_figure,
    forest_rows,
    panel_ticks,
    short_label,
)
from blockbench.report.index import write_index
from blockbench.report.section import comparisons
from blockbench.report.summary import write_report
from blockbench.store.layout import write_json

PRE, POST, SANDWICH, DEEP, BROKEN = (f"norm_placement={v}" for v in ("pre", "post", "sandwich", "deep", "broken"))
FAMILY = {"lm": "decoder_lm", "translation": "encoder_decoder", "vit": "vit"}
HEADLINE = {"lm": "perplexity", "translation": "bleu", "vit": "accuracy"}
CONSTANT = {
    "lm": {"agreement_acc": 0.5, "loss": 2.0},
    "translation": {"exact_match": 0.1, "loss": 1.0},
    "vit": {"loss": 1.0},
}
#: the trivial baselines; the LM's sits above every LM seed here (perplexity 32.3 at most), so each of them learned
TRIVIAL = {"lm": {"perplexity": 40.0}, "translation": {"bleu": 0.93}, "vit": {"accuracy": 0.2}}
#: the matrix files' margins (``margins:``), so that the expected points do not hang on the tasks' declared ones
MARGINS = {"lm": 0.1, "translation": 1.0, "vit": 0.005}
FAILED = "failed"  # a cell whose run raised: no seed in the statistics

#: task -> variant -> the headline metric per seed (None: diverged, FAILED: failed)
NORMS = {
    "lm": {
        PRE: [10.0, 11.0, 12.5],
        POST: [12.0, 13.1, 14.3],  # perplexity higher by about 2 (20 margins): worse
        SANDWICH: [9.0, 10.1, 11.4],  # lower by about 1: better
        DEEP: [30.0, 31.2, 32.3],  # higher by 20 (200 margins): drawn at the left edge
    },
    "translation": {
        PRE: [50.0, 52.0, 54.0],
        POST: [50.1, 52.05, 54.1],  # +0.08 BLEU, a narrow interval inside ±1: equivalent
        SANDWICH: [49.0, 53.0, 53.5],
        DEEP: [10.0, 30.0, 20.0],
    },
    "vit": {
        PRE: [0.50, 0.55, 0.60],
        POST: [0.52, 0.53, 0.65],  # +0.017 with a wide interval: undecided
        SANDWICH: [0.51, 0.58, None],  # a diverged seed beside two that learned: a rank test decides
        DEEP: [0.50, 0.56, 0.61],
        BROKEN: [FAILED, FAILED, FAILED],  # no seed: no result
    },
}
#: BLEU 100 on both sides: saturated (the translation task's declared distance from the best is 0.5)
SOLVED = {"translation": {PRE: [100.0, 100.0, 100.0], POST: [99.9, 100.0, 100.0]}}


def _result(task: str, seed: int, value: float | str | None) -> dict:
    if value == FAILED:
        return {"task": task, "seed": seed, "config_hash": "abc", "status": "failed", "error": "RuntimeError: boom"}
    if value is None:
        return diverged_result(task, seed)
    return ok_result(task, seed, {HEADLINE[task]: value, **CONSTANT[task]}, TRIVIAL[task])


def write_matrix(root: Path, name: str, cells: dict[str, dict[str, list]], **settings: object) -> Path:
    """A matrix folder of ``cells`` (task -> variant -> values per seed), baseline ``PRE``, with
    :data:`MARGINS` in its matrix file (and ``settings``, e.g. ``verdicts: false``)."""
    matrix_dir = root / name
    index = 0
    for task, variants in cells.items():
        for variant, values in variants.items():
            for seed, value in enumerate(values):
                cell_dir = matrix_dir / "cells" / task / variant / f"seed{seed}"
                axes = {"task": task, "model.norm_placement": variant.split("=")[1], "seed": seed}
                cell = {"index": index, "task": task, "task_name": task, "variant": variant, "seed": seed, "axes": axes}
                write_json(cell_dir / "cell.json", cell)
                (cell_dir / "config.yaml").write_text(yaml.safe_dump({"model": {"family": FAMILY[task]}}))
                write_json(cell_dir / "result.json", _result(task, seed, value))
                index += 1
    matrix = {
        "name": name,
        "axes": {"task": list(cells)},
        "baseline_variant": PRE,
        "margins": {task: {HEADLINE[task]: MARGINS[task]} for task in cells},
        **settings,
    }
    (matrix_dir / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    return matrix_dir


def _matrix_rows(matrix_dir: Path):
    _, _, analyses = analyze(matrix_dir)
    return forest_rows([("", [c for a in analyses for c in comparisons(a)])])


def _hand(task: str, variant: list[float], baseline: list[float]) -> tuple[float, tuple, tuple, str]:
    """x, the (1 - α) and (1 - 2α) intervals in the metric's unit (variant − baseline), and the verdict
    of the seed-matched question, by hand: the paired t test and TOST at α = 0.05 (one look)."""
    differences = [v - b for v, b in zip(variant, baseline, strict=True)]
    n = len(differences)
    mean, se = statistics.fmean(differences), statistics.stdev(differences) / math.sqrt(n)
    t = scipy_stats.t(n - 1)
    margin, sign = MARGINS[task], (1 if task != "lm" else -1)  # perplexity: lower is better
    p = 2 * t.sf(abs(mean) / se)
    p_equivalence = max(t.sf((mean + margin) / se), t.cdf((mean - margin) / se))
    verdict = (
        "equivalent"
        if p_equivalence < 0.05
        else ("better" if sign * mean > 0 else "worse")
        if p < 0.05
        else "undecided"
    )
    half, equivalence_half = t.ppf(0.975) * se, t.ppf(0.95) * se
    return mean, (mean - half, mean + half), (mean - equivalence_half, mean + equivalence_half), verdict


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    write_matrix(root, "norms", NORMS)
    write_matrix(root, "solved", SOLVED)
    return root


@pytest.fixture(scope="module")
def rows(root):
    return {row.label: row for row in _matrix_rows(root / "norms")}


def _point(rows, variant: str, family: str) -> ForestPoint:
    (point,) = [p for p in rows[f"norm_placement: {variant.split('=')[1]} vs pre"].points if p.family == family]
    return point


@pytest.mark.parametrize(
    ("variant", "task", "verdict"),
    [
        (POST, "lm", "worse"),
        (SANDWICH, "lm", "better"),
        (POST, "translation", "equivalent"),
        (POST, "vit", "undecided"),
    ],
)
def test_each_point_is_the_hand_computed_difference_and_intervals_in_the_metric_unit(rows, variant, task, verdict):
    point = _point(rows, variant, FAMILY[task])
    x, interval, equivalence_interval, hand_verdict = _hand(task, NORMS[task][variant], NORMS[task][PRE])
    assert hand_verdict == verdict == point.verdict
    assert point.x == pytest.approx(x, rel=1e-9)
    assert point.interval == pytest.approx(interval, rel=1e-9)
    assert point.equivalence_interval == pytest.approx(equivalence_interval, rel=1e-9)
    assert (
        point.interval[0]
        <= point.equivalence_interval[0]
        < point.x
        < point.equivalence_interval[1]
        <= point.interval[1]
    )
    assert point.x == pytest.approx(statistics.fmean(NORMS[task][variant]) - statistics.fmean(NORMS[task][PRE]))
    assert point.alpha == 0.05  # one look
    assert (point.task, point.metric, point.note, point.clipped, point.rank_test) == (
        task,
        HEADLINE[task],
        "",
        0,
        False,
    )
    # what decides the verdict reads off the picture: equivalent where the thick interval lies inside the band,
    # better or worse where the thin one leaves out 0 (an equivalent one may too: a real difference below the margin)
    inside_band = max(abs(v) for v in point.equivalence_interval) < MARGINS[task]
    excludes_zero = point.interval[0] > 0 or point.interval[1] < 0
    assert inside_band == (verdict == "equivalent")
    assert excludes_zero or verdict not in ("better", "worse")
    assert not excludes_zero or verdict != "undecided"
    # not flipped: a worse LM (perplexity up) lies right of zero, a better one left; a better BLEU right
    if verdict in ("better", "worse"):
        assert (point.x > 0) == ((verdict == "better") == point.higher_is_better)


def test_a_difference_beyond_the_clip_is_drawn_at_the_edge_with_its_value_in_its_unit(rows):
    point = _point(rows, DEEP, "decoder_lm")
    assert point.x == pytest.approx(20.0)  # +20 perplexity: 200 margins of 0.1, drawn at the right edge
    assert point.verdict == "worse" and point.clipped == 1 and abs(point.x) > CLIP * point.margin
    assert _point(rows, DEEP, "encoder_decoder").clipped == 0  # -32.67 BLEU is 32.67 margins: inside


def test_a_rank_test_a_missing_side_and_a_saturated_task_are_marked(root, rows):
    ranked = _point(rows, SANDWICH, "vit")
    assert ranked.rank_test and ranked.equivalence_interval is None and ranked.verdict == "undecided"
    missing = _point(rows, BROKEN, "vit")
    assert (missing.verdict, missing.x, missing.interval, missing.note) == (
        "no result",
        None,
        None,
        "no result: failed",
    )
    assert [p.family for p in rows["norm_placement: broken vs pre"].points] == ["vit"]  # no cells of it elsewhere
    (solved,) = _matrix_rows(root / "solved")
    (point,) = solved.points
    assert (point.verdict, point.note) == ("saturated", "saturated: best bleu")
    assert point.x == pytest.approx(-0.1 / 3)  # still placed: the difference is there, the metric cannot tell


def test_rows_follow_the_verdict_table_and_points_the_family_order(rows):
    assert list(rows) == [f"norm_placement: {v} vs pre" for v in ("post", "sandwich", "deep", "broken")]
    assert [p.family for p in rows["norm_placement: post vs pre"].points] == ["decoder_lm", "encoder_decoder", "vit"]
    assert {row.group for row in rows.values()} == {""}


def test_labels_name_the_axis_once_where_both_sides_set_one_axis(root):
    _, _, analyses = analyze(root / "norms")
    comparison = comparisons(analyses[0])[0]
    assert short_label(comparison) == "norm_placement: post vs pre"
    two_axes = replace(comparison, variant="ffn=swiglu,lr=0.001", baseline="ffn=mlp,lr=0.001")
    assert short_label(two_axes) == "ffn=swiglu,lr=0.001 vs ffn=mlp,lr=0.001"
    at_level = replace(comparison, variant="ffn=swiglu", baseline="ffn=mlp", level=(("trainer.max_steps", 300),))
    assert short_label(at_level) == f"ffn: swiglu vs mlp at {at_level.level_text}" and "300" in at_level.level_text


def test_the_report_draws_each_matrix_picture_and_shows_it_in_the_summary(tmp_path):
    matrix_dir = write_matrix(tmp_path, "norms", NORMS)
    summary = write_report(matrix_dir)
    picture = matrix_dir / "plots" / VERDICT_PICTURE
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![The verdicts of norms](plots/verdicts.png)" in summary.split("## Verdicts", 1)[1]
    assert b"Software" not in picture.read_bytes() and b"atplotlib" not in picture.read_bytes()
    first = picture.read_bytes()
    write_report(matrix_dir)
    assert picture.read_bytes() == first  # unchanged results, unchanged file
    assert not list((matrix_dir / "plots").glob(".*"))  # no temporary file left behind


def test_a_matrix_without_a_comparison_has_no_picture_and_a_stale_one_goes(tmp_path):
    matrix_dir = write_matrix(tmp_path, "single", {"lm": {PRE: [10.0, 11.0, 12.5]}})
    stale = matrix_dir / "plots" / VERDICT_PICTURE
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"\x89PNG old")
    summary = write_report(matrix_dir)
    assert not stale.exists() and "verdicts.png" not in summary
    assert not draw_forest(tmp_path / "none.png", [], "nothing") and not (tmp_path / "none.png").exists()


def test_the_index_draws_the_book_picture_at_its_top_and_redraws_the_same_bytes(tmp_path, capsys):
    root = tmp_path / "results"
    write_matrix(root, "norms", NORMS)
    write_matrix(root, "solved", SOLVED)
    assert main(["report", "--index", str(root)]) == 0
    markdown = (root / "README.md").read_text()
    title, note, picture, counts = markdown.split("\n\n")[:4]
    assert (title, picture) == ("# Verdicts", "![The verdicts of every matrix, per family](verdicts.png)")
    assert note.startswith("Generated by") and "distinct questions are decided" in counts
    book = (root / VERDICT_PICTURE).read_bytes()
    assert book[:8] == b"\x89PNG\r\n\x1a\n" and b"Software" not in book
    assert main(["report", "--index", str(root)]) == 0
    assert (root / VERDICT_PICTURE).read_bytes() == book  # rerun on unchanged results: the same file
    assert (root / "README.md").read_text() == markdown
    # a demonstration (verdicts: false) is left out of the book's picture, as out of its table
    write_matrix(root, "demo", NORMS, verdicts=False)
    assert main(["report", "--index", str(root)]) == 0
    assert (root / VERDICT_PICTURE).read_bytes() == book
    capsys.readouterr()


def test_the_book_rows_are_grouped_by_matrix_in_the_index_order(root):
    found = []
    for name in ("norms", "solved"):
        _, _, analyses = analyze(root / name)
        found.append((name, [c for a in analyses for c in comparisons(a)]))
    rows = forest_rows(found)
    assert [(r.group, r.label) for r in rows] == [
        *(("norms", f"norm_placement: {v} vs pre") for v in ("post", "sandwich", "deep", "broken")),
        ("solved", "norm_placement: post vs pre"),
    ]
    index = write_index(root)
    table = index.split("## Where the numbers come from")[0]
    table_rows = [line for line in table.splitlines() if line.startswith(("| norms", "| solved"))]  # no summary.md
    assert len(table_rows) == len(rows)  # a picture row per table row


# the figure, read back from its artists -------------------------------------------------------------

#: the book's post-norm question as decided (perplexity, BLEU, accuracy): difference, intervals, margin
POST_NORM = {
    "decoder_lm": ("lm", "perplexity", False, "worse", 3.6638, (2.4013, 4.9263), (2.6, 4.7), 0.0737, False),
    "encoder_decoder": ("translation", "bleu", True, "worse", -60.26, (-89.97, -30.55), None, 1.0, True),
    "vit": ("vit", "accuracy", True, "undecided", -0.0078, (-0.2866, 0.2709), (-0.24, 0.22), 0.01, False),
}
UNITS = {"perplexity": "perplexity", "bleu": "BLEU", "accuracy": "top-1 accuracy"}  # the x axes' words
PAGE_PIXELS, SMALLEST_PIXELS = 800, 9.0  # the README's width, and the smallest text height allowed there


def _post_norm_row(label: str, group: str = "") -> ForestRow:
    points = tuple(
        ForestPoint(
            family=family,
            task=task,
            metric=metric,
            higher_is_better=up,
            verdict=verdict,
            x=x,
            interval=interval,
            equivalence_interval=equivalence,
            margin=margin,
            rank_test=rank,
            beyond_margin=True if verdict == "worse" else None,
            alpha=0.05 / 3,
        )
        for family, (task, metric, up, verdict, x, interval, equivalence, margin, rank) in POST_NORM.items()
    )
    return ForestRow(group, label, points)


@pytest.fixture(scope="module")
def book_figure():
    """A book-sized picture: 8 matrices of 3 questions each, with the book's longest label."""
    rows = [
        _post_norm_row(label, f"matrix_{m}")
        for m in range(8)
        for label in (
            "norm_placement: post vs pre (also prenorm_vs_postnorm)",
            "ffn: swiglu vs mlp",
            "n_experts: 4 vs 0",
        )
    ]
    return forest_figure(rows, "The verdicts of the book")


def _marks(ax) -> list:
    return [line for line in ax.get_lines() if line.get_marker() not in ("None", "", None)]


def test_each_panel_draws_the_difference_and_its_band_in_the_metric_unit(book_figure):
    axes = book_figure.axes
    assert len(axes) == 3  # a panel per family
    for ax, (_, metric, up, _, x, interval, _, margin, rank) in zip(axes, POST_NORM.values(), strict=True):
        marks = _marks(ax)
        assert [float(line.get_xdata()[0]) for line in marks] == pytest.approx([x] * 24)  # +3.66 perplexity, not −49.7
        assert {line.get_marker() for line in marks} == {"D" if rank else "o"}
        thin = [line for line in ax.get_lines() if line.get_linewidth() == pytest.approx(1.1)]
        assert [list(line.get_xdata()) for line in thin] == [pytest.approx(interval)] * 24
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert bands and all(
            {round(v, 9) for v in c.get_paths()[0].vertices[:, 0]} == {-margin, margin} for c in bands
        )  # ± the margin in the unit: ±0.0737 perplexity, ±1 BLEU, ±0.01 accuracy
        assert ax.get_xscale() == "symlog" and ax.xaxis.get_transform().linthresh == pytest.approx(margin)
        assert ax.get_xlabel().startswith(f"Δ {UNITS[metric]} (variant − baseline)\n")
        assert ("← better" in ax.get_xlabel()) == (not up)  # lower perplexity is better: left
        assert f"±{float(f'{margin:.2g}'):g}" in ax.get_title()
        low, high = ax.get_xlim()
        assert low < min(interval) and max(interval) < high  # nothing clipped here: every value in range


def test_ticks_are_decades_of_the_unit_and_the_margin_where_no_decade_fits():
    assert panel_ticks(-1.6, 8.0, 0.0737) == pytest.approx([-1.0, -0.1, 0.0, 0.1, 1.0])
    assert panel_ticks(-150.0, 4.0, 1.0) == pytest.approx([-100.0, -10.0, -1.0, 0.0, 1.0])
    assert panel_ticks(-0.06, 0.06, 0.02) == pytest.approx([-0.02, 0.0, 0.02])


def test_every_mark_is_defined_in_the_legend_and_alpha_k_with_its_levels(book_figure):
    (legend,) = book_figure.legends
    defined = {h.get_marker() for h in legend.legend_handles if hasattr(h, "get_marker")}
    drawn = {line.get_marker() for ax in book_figure.axes for line in _marks(ax)}
    assert drawn <= defined and {"o", "D", ">"} <= defined
    texts = [t.get_text() for t in legend.get_texts()]
    assert any(t.startswith("grey band: ± the equivalence margin") for t in texts)
    assert any(t.startswith("thin: (1 − α_k) interval") for t in texts)
    assert any(t.startswith("thick: (1 − 2α_k) interval") for t in texts)
    title = legend.get_title().get_text().replace("\n", " ")
    assert "α = 0.05 split equally over the question's planned looks" in title
    assert "α_k = 0.0167: thin lines are 98.3% intervals, thick lines 96.7%" in title
    everything = " ".join(t.get_text() for t in book_figure.findobj(Text))
    assert not re.search(r"\bK\b", everything)  # no undefined symbol
    assert "margins of practical equivalence" not in everything


def _smallest_pixels(figure) -> float:
    """The smallest text's height in pixels when the figure is shown :data:`PAGE_PIXELS` wide."""
    sizes = [t.get_fontsize() for t in figure.findobj(Text) if t.get_text().strip() and t.get_visible()]
    return min(sizes) / 72 * PAGE_PIXELS / figure.get_figwidth()


def test_the_text_stays_readable_at_the_readme_width(book_figure, rows):
    assert _smallest_pixels(book_figure) >= SMALLEST_PIXELS
    assert book_figure.get_figwidth() <= 9.5
    matrix = forest_figure(list(rows.values()), "norms")
    assert _smallest_pixels(matrix) >= SMALLEST_PIXELS
    labels = [t.get_text() for t in book_figure.axes[0].get_yticklabels()]
    assert "norm_placement: post vs pre\n(also prenorm_vs_postnorm)" in labels  # wrapped, not shrunk
