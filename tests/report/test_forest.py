"""The verdict picture (``blockbench.report.forest``): what it plots of each question against paired t
tests and two one-sided tests computed here by hand (scipy's t distribution), from hand-written matrix
folders; that ``blockbench report`` draws it per matrix and ``--index`` for the book, shows it in the
markdown, leaves out demonstrations, removes a stale one, and redraws the same bytes. No pixel is
tested: the plotted data are :func:`forest_rows`'s, a pure function of the comparisons."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import diverged_result, ok_result
from scipy import stats as scipy_stats

from blockbench.cli import main
from blockbench.layout import write_json
from blockbench.report.analysis import analyze
from blockbench.report.forest import (
    CLIP,
    VERDICT_PICTURE,
    ForestPoint,
    draw_forest,
    forest_rows,
    in_margins,
    short_label,
)
from blockbench.report.index import write_index
from blockbench.report.section import comparisons
from blockbench.report.summary import write_report

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
    """x, the (1 - α) and (1 - 2α) intervals in margins signed so that + is better, and the verdict of the
    seed-matched question, by hand: the paired t test and TOST at α = 0.05 (one look)."""
    differences = [v - b for v, b in zip(variant, baseline, strict=True)]
    n = len(differences)
    mean, se = statistics.fmean(differences), statistics.stdev(differences) / math.sqrt(n)
    t = scipy_stats.t(n - 1)
    margin, sign = MARGINS[task], (1 if task != "lm" else -1)  # perplexity: lower is better

    def scaled(low: float, high: float) -> tuple[float, float]:
        return tuple(sorted((sign * low / margin, sign * high / margin)))

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
    return (
        sign * mean / margin,
        scaled(mean - half, mean + half),
        scaled(mean - equivalence_half, mean + equivalence_half),
        verdict,
    )


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
def test_each_point_is_the_hand_computed_difference_and_intervals_in_margins_right_is_better(
    rows, variant, task, verdict
):
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
    assert point.difference == pytest.approx(
        statistics.fmean(NORMS[task][variant]) - statistics.fmean(NORMS[task][PRE])
    )
    assert (point.task, point.metric, point.note, point.clipped, point.rank_test) == (
        task,
        HEADLINE[task],
        "",
        0,
        False,
    )
    # what decides the verdict reads off the picture: equivalent where the thick interval lies inside the band,
    # better or worse where the thin one leaves out 0 (an equivalent one may too: a real difference below the margin)
    inside_band = max(abs(v) for v in point.equivalence_interval) < 1
    excludes_zero = point.interval[0] > 0 or point.interval[1] < 0
    assert inside_band == (verdict == "equivalent")
    assert excludes_zero or verdict not in ("better", "worse")
    assert not excludes_zero or verdict != "undecided"
    # right is better: a worse LM (perplexity up) lies left of zero, a better one right
    assert (point.x > 0) == (verdict == "better") or verdict in ("equivalent", "undecided")


def test_a_difference_beyond_the_clip_is_drawn_at_the_edge_with_its_value_in_its_unit(rows):
    point = _point(rows, DEEP, "decoder_lm")
    assert point.difference == pytest.approx(20.0) and point.x == pytest.approx(-200.0)  # +20 perplexity, margin 0.1
    assert point.verdict == "worse" and point.clipped == -1 and abs(point.x) > CLIP
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


def test_in_margins_flips_a_metric_where_lower_is_better():
    assert in_margins(0.3, 0.1, higher_is_better=True) == pytest.approx(3.0)
    assert in_margins(0.3, 0.1, higher_is_better=False) == pytest.approx(-3.0)


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
