"""The validation curves of a matrix (``blockbench.report.plots``): one figure, a row per task, the
headline metric beside the loss curve. What it draws is read back from the figure's artists and checked
against values computed here by hand: each variant's mean and 95% t interval over seeds at every step
(scipy's t quantile), linear axes (BLEU too), titles in words, the trivial baseline as a labelled line,
a legend per row naming each variant with its seed counts, and text that stays readable when the
figure is shown 800 pixels wide. The report draws it as ``plots/curves.png``, links it from the summary
and removes the per-task figures it used to draw."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import yaml
from helpers import ok_result
from matplotlib.collections import PolyCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.text import Text
from scipy import stats as scipy_stats

from blockbench.report.plots import (
    CURVE_METRIC,
    CURVES_PICTURE,
    Panel,
    TaskCurves,
    VariantCurves,
    curves_figure,
    seed_series,
)
from blockbench.report.summary import write_report
from blockbench.store.layout import write_json
from blockbench.store.record import HistoryPoint

#: the README's and a summary page's width in pixels: no text may be smaller than 9 pixels there
PAGE_PIXELS, SMALLEST_PIXELS = 800, 9.0
STEPS = (100, 200, 300)
#: BLEU at steps 100, 200, 300 per seed: from under 1 to 60, a span a log axis used to take
MLP_BLEU = [[0.2, 20.0, 55.0], [1.5, 24.0, 60.0], [0.3, 18.0, 52.0]]
SWIGLU_BLEU = [[1.0, 30.0, 58.0], [2.0, 33.0, 61.0], [1.5, 28.0, 59.0]]
CURVE_STEPS = tuple(range(0, 301, 30))  # the loss curve: 11 points, a band


def _history(metric: str, values: list[float], steps=STEPS) -> list[HistoryPoint]:
    return [HistoryPoint(step=s, metrics={metric: v}) for s, v in zip(steps, values, strict=True)]


def _curve(seed: int) -> list[float]:
    return [4.0 * math.exp(-s / 100) + 1.0 + 0.05 * seed * (s / 300) for s in CURVE_STEPS]


def _variant(name: str, bleu: list[list[float]]) -> VariantCurves:
    return VariantCurves(
        name,
        finished=[
            _history("bleu", values) + _history(CURVE_METRIC, _curve(seed), CURVE_STEPS)
            for seed, values in enumerate(bleu)
        ],
    )


BLEU_PANEL = Panel("bleu", "validation BLEU (higher is better)", "BLEU", 0.0, 100.0, baseline=0.93)
CURVE_PANEL = Panel(CURVE_METRIC, "validation loss on a fixed sample (lower is better)", "cross-entropy (nats)", 0.0)


def _translation() -> TaskCurves:
    variants = (_variant("ffn=mlp", MLP_BLEU), _variant("ffn=swiglu", SWIGLU_BLEU))
    return TaskCurves("translation", "a translator", (BLEU_PANEL, CURVE_PANEL), variants)


def _hand_interval(values: list[float]) -> tuple[float, float]:
    """mean ± t(0.975, n − 1) · s / √n."""
    n = len(values)
    half = scipy_stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return statistics.fmean(values) - half, statistics.fmean(values) + half


@pytest.fixture(scope="module")
def figure() -> Figure:
    lm = TaskCurves(
        "lm",
        "a language model",
        (Panel("perplexity", "validation perplexity (lower is better)", "perplexity", 1.0, baseline=30.6),),
        (VariantCurves("ffn=mlp", finished=[_history("perplexity", [9.0, 8.0, 7.5 + 0.1 * s]) for s in range(3)]),),
    )
    drawn = curves_figure("demo: validation curves", [_translation(), lm])
    assert drawn is not None
    return drawn


def _axes(figure: Figure, title: str):
    (ax,) = [sub_ax for sub in figure.subfigs for sub_ax in sub.axes if sub_ax.get_title() == title]
    return ax


def test_the_error_bars_are_the_hand_computed_95_percent_t_interval_of_the_mean(figure):
    ax = _axes(figure, "validation BLEU (higher is better)")
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # one per variant
    for container, seeds in zip(bars, (MLP_BLEU, SWIGLU_BLEU), strict=True):
        (segments,) = [c.get_segments() for c in container.lines[2]]
        drawn = [tuple(sorted((low[1], high[1]))) for low, high in segments]
        per_step = [[seed[i] for seed in seeds] for i in range(len(STEPS))]
        # cut at BLEU's range [0, 100], as the summary's intervals are
        expected = [(max(0.0, low), min(100.0, high)) for low, high in map(_hand_interval, per_step)]
        assert drawn == pytest.approx(expected, rel=1e-9)
        if seeds is MLP_BLEU:  # BLEU 0.2, 1.5, 0.3: the uncut interval reaches below 0
            assert drawn[0][0] == 0.0 and _hand_interval(per_step[0])[0] < 0
        means = container.lines[0].get_ydata()
        assert list(means) == pytest.approx([statistics.fmean(v) for v in per_step])
    # not min-max: the interval of the mean of three seeds is wider than their range here (t(0.975, 2) = 4.30)
    low, high = _hand_interval([seed[1] for seed in MLP_BLEU])
    assert high - low > max(s[1] for s in MLP_BLEU) - min(s[1] for s in MLP_BLEU)


def test_the_loss_curve_band_is_the_hand_computed_t_interval_at_every_point(figure):
    ax = _axes(figure, "validation loss on a fixed sample (lower is better)")
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2
    vertices = bands[0].get_paths()[0].vertices
    for i, step in enumerate(CURVE_STEPS):
        low, high = _hand_interval([_curve(seed)[i] for seed in range(3)])
        at_step = sorted(y for x, y in vertices if x == step)
        assert at_step[0] == pytest.approx(low, rel=1e-9) and at_step[-1] == pytest.approx(high, rel=1e-9)


def test_seed_series_counts_the_seeds_of_each_step_and_has_no_interval_for_one():
    histories = [_history("bleu", [1.0, 2.0, 3.0]), _history("bleu", [3.0, 4.0], STEPS[:2])]
    series = seed_series(histories, "bleu", 0.0, 100.0)
    assert [(p.step, p.mean, p.n) for p in series] == [(100, 2.0, 2), (200, 3.0, 2), (300, 3.0, 1)]
    assert series[0].interval == pytest.approx((0.0, 2.0 + scipy_stats.t.ppf(0.975, 1) * math.sqrt(2) / math.sqrt(2)))
    assert series[2].interval is None


def test_every_axis_is_linear_and_titled_in_words(figure):
    axes = [ax for sub in figure.subfigs for ax in sub.axes]
    assert [ax.get_title() for ax in axes] == [
        "validation BLEU (higher is better)",
        "validation loss on a fixed sample (lower is better)",
        "validation perplexity (lower is better)",
    ]
    # BLEU from 0.5 to 61 (a ratio above 30) and perplexity beside a baseline of 30.6: linear all the same
    assert {ax.get_yscale() for ax in axes} == {"linear"} and {ax.get_xscale() for ax in axes} == {"linear"}
    texts = [t.get_text() for t in figure.findobj(Text)]
    assert not [t for t in texts if "curve_loss" in t or t.endswith(("↑", "↓"))]  # no metric keys, no bare arrows


def test_the_trivial_baseline_is_a_labelled_line_or_written_where_it_lies_far_off(figure):
    bleu = _axes(figure, "validation BLEU (higher is better)")
    dashed = [line for line in bleu.get_lines() if line.get_linestyle() == "--"]
    assert [list(line.get_ydata()) for line in dashed] == [[0.93, 0.93]]
    assert "trivial baseline" in [t.get_text() for t in bleu.texts]
    perplexity = _axes(figure, "validation perplexity (lower is better)")  # curves near 8, the baseline at 30.6
    assert not [line for line in perplexity.get_lines() if line.get_linestyle() == "--"]
    assert [t.get_text() for t in perplexity.texts] == ["trivial baseline 30.6 ↑ (off the axis)"]


def test_each_row_has_a_legend_of_its_variants_with_their_seed_counts(figure):
    translation, lm = figure.subfigs
    (legend,) = translation.legends
    assert legend.get_title().get_text() == "ffn"
    assert [t.get_text() for t in legend.get_texts()] == ["mlp (3 seeds)", "swiglu (3 seeds)"]
    assert translation.get_suptitle() == "translation: a translator" and lm.get_suptitle() == "lm: a language model"
    caption = figure.get_supxlabel().replace("\n", " ")
    assert "95% confidence interval of the mean" in caption and "t(0.975, n − 1)" in caption


def _smallest_pixels(figure: Figure) -> float:
    """The smallest text's height in pixels when the figure is shown :data:`PAGE_PIXELS` wide."""
    width = figure.get_figwidth()
    sizes = [t.get_fontsize() for t in figure.findobj(Text) if t.get_text().strip() and t.get_visible()]
    return min(sizes) / 72 * PAGE_PIXELS / width


def test_the_figure_is_one_grid_readable_at_page_width(figure):
    assert len(figure.subfigs) == 2  # a row per task
    assert 8 <= figure.get_figwidth() <= 10 and figure.get_figheight() > figure.get_figwidth() * 0.5
    assert _smallest_pixels(figure) >= SMALLEST_PIXELS


def _write_matrix(root: Path) -> Path:
    """A matrix of two lm variants x 3 seeds with histories and loss curves, and one vit cell without."""
    matrix_dir = root / "curves"
    for index, (variant, seed) in enumerate((v, s) for v in ("ffn=mlp", "ffn=swiglu") for s in range(3)):
        cell_dir = matrix_dir / "cells" / "lm" / variant / f"seed{seed}"
        axes = {"task": "lm", "model.ffn": variant.split("=")[1], "seed": seed}
        write_json(
            cell_dir / "cell.json", {"index": index, "task": "lm", "variant": variant, "seed": seed, "axes": axes}
        )
        (cell_dir / "config.yaml").write_text(yaml.safe_dump({"model": {"family": "decoder_lm"}}))
        perplexities = [12.0 - seed, 9.0 - 0.1 * seed, 8.0 + 0.1 * seed + (variant == "ffn=swiglu")]
        history = [
            {"step": s, "metrics": {"perplexity": p, "loss": math.log(p)}}
            for s, p in zip(STEPS, perplexities, strict=True)
        ]
        curve = {
            "every_n_steps": 30,
            "items": 8,
            "points": [[s, v] for s, v in zip(CURVE_STEPS, _curve(seed), strict=True)],
        }
        metrics = {"perplexity": perplexities[-1], "agreement_acc": 0.6, "loss": math.log(perplexities[-1])}
        result = ok_result("lm", seed, metrics, {"perplexity": 30.6, "loss": 3.42}, history=history, curve=curve)
        write_json(cell_dir / "result.json", result)
    (matrix_dir / "matrix.yaml").write_text(
        yaml.safe_dump({"name": "curves", "axes": {"task": ["lm"]}, "baseline_variant": "ffn=mlp"})
    )
    return matrix_dir


def test_the_report_draws_one_curves_figure_links_it_and_removes_the_old_per_task_ones(tmp_path):
    matrix_dir = _write_matrix(tmp_path)
    stale = matrix_dir / "plots" / "lm.png"  # what the report drew before: a figure per task
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"\x89PNG old")
    summary = write_report(matrix_dir)
    picture = matrix_dir / "plots" / CURVES_PICTURE
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"Software" not in picture.read_bytes()
    assert not stale.exists() and "plots/lm.png" not in summary
    assert "## Validation curves\n\n![The validation curves of curves](plots/curves.png)\n" in summary
    first = picture.read_bytes()
    write_report(matrix_dir)
    assert picture.read_bytes() == first  # unchanged results, unchanged file
    assert sorted(p.name for p in (matrix_dir / "plots").iterdir()) == [CURVES_PICTURE, "verdicts.png"]
