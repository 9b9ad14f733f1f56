"""The summary's statistics against hand computations and scipy: intervals of a mean cut at a metric's
range (and containing the mean), the value a diverged seed counts with, paired vs Welch differences
(never cut)."""

import math

import pytest
from helpers import T_975_DF2
from scipy import stats as scipy_stats

from blockbench.report.stats import (
    PAIRED,
    WELCH,
    compare,
    diverged_value,
    paired_difference,
    t_confidence_interval,
    with_diverged,
)

# intervals inside the range --------------------------------------------------------------------


def test_interval_of_a_bounded_metric_contains_its_own_mean():
    """GeGLU's translation seeds at 1500 steps: the logit interval with shares clamped to 0.999 was
    [99.900, 99.900], which misses the mean 99.979; the plain t interval cut at 100 contains it."""
    bleu = [100.0, 100.0, 99.938]
    mean = sum(bleu) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in bleu) / 2)  # 0.0358
    half_width = T_975_DF2 * std / math.sqrt(3)  # 0.0889
    low, high = t_confidence_interval(bleu, 0.95, low=0, high=100)
    assert low == pytest.approx(mean - half_width, rel=1e-12) and high == 100.0  # 99.890, cut at 100
    assert low < mean < high


def test_interval_of_a_metric_bounded_on_both_sides_is_the_t_interval_cut_at_the_bounds():
    bleu = [1.0, 2.0, 12.0]  # like post-norm's translation seeds in the book
    plain_low, plain_high = t_confidence_interval(bleu)
    assert plain_low == pytest.approx(5 - T_975_DF2 * math.sqrt(37) / math.sqrt(3))  # 5 ± 15.1: below 0
    assert t_confidence_interval(bleu, 0.95, low=0, high=100) == (0.0, plain_high)
    assert t_confidence_interval([1.0, 1.0, 1.0], 0.95, low=0, high=1) == (1.0, 1.0)  # no spread: the value itself
    assert t_confidence_interval([0.7], 0.95, low=0, high=1) is None  # one seed: no interval
    inside = [0.40, 0.45, 0.50]  # far from both bounds: the plain interval
    assert t_confidence_interval(inside, 0.95, low=0, high=1) == t_confidence_interval(inside)


def test_interval_of_a_metric_bounded_on_one_side_is_cut_at_the_bound():
    loss = [0.01, 0.02, 0.6]
    plain_low, plain_high = t_confidence_interval(loss)
    assert plain_low < 0
    assert t_confidence_interval(loss, 0.95, low=0) == (0.0, plain_high)
    perplexity = [7.0, 8.0, 9.0]  # far from its bound 1: the plain interval
    assert t_confidence_interval(perplexity, 0.95, low=1) == t_confidence_interval(perplexity)


# diverged seeds --------------------------------------------------------------------------------


def test_a_diverged_seed_counts_with_the_worse_of_the_baseline_and_the_worst_finished_seed():
    # higher is better (BLEU): the trivial baseline when every finished seed beats it ...
    assert diverged_value(0.93, [60.0, 62.0, 64.0, 80.0], higher_is_better=True) == 0.93
    # ... the worst finished seed when one does worse than the baseline
    assert diverged_value(0.93, [0.5, 60.0], higher_is_better=True) == 0.5
    # lower is better (perplexity): the largest
    assert diverged_value(30.0, [7.0, 8.0, 200.0], higher_is_better=False) == 200.0
    assert diverged_value(30.0, [7.0, 8.0], higher_is_better=False) == 30.0
    assert diverged_value(None, [1.2, 1.9], higher_is_better=False) == 1.9  # no baseline (a loss)
    assert diverged_value(30.0, [], higher_is_better=False) == 30.0  # every seed of the task diverged
    assert diverged_value(None, [], higher_is_better=True) is None


def test_a_variant_with_two_of_three_seeds_diverged_does_not_look_as_good_as_its_good_seed():
    value = diverged_value(0.93, [80.0, 60.0, 62.0, 64.0], higher_is_better=True)
    unstable = with_diverged({0: 80.0}, [1, 2], value)
    assert unstable == {0: 80.0, 1: 0.93, 2: 0.93}
    assert sum(unstable.values()) / 3 == pytest.approx((80 + 2 * 0.93) / 3)  # 27.3, not 80
    assert with_diverged({0: 80.0}, [1, 2], None) == {0: 80.0}  # nothing to count them with


# differences -----------------------------------------------------------------------------------


def test_paired_difference_matches_scipy_and_a_hand_computation():
    a, b = [0.525, 0.63, 0.72], [0.50, 0.60, 0.70]
    # differences 0.025, 0.03, 0.02: mean 0.025, std 0.005
    result = paired_difference(a, b)
    half_width = T_975_DF2 * 0.005 / math.sqrt(3)
    assert result.test == PAIRED and result.n == (3,)
    assert result.difference == pytest.approx(0.025)
    assert (result.ci_low, result.ci_high) == pytest.approx((0.025 - half_width, 0.025 + half_width))
    assert result.p_value == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue, rel=1e-9)
    assert result.p_value < 0.05 < scipy_stats.ttest_ind(a, b, equal_var=False).pvalue  # Welch sees the seed spread
    same_step = paired_difference([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])  # every pair differs by exactly 1
    assert same_step.difference == 1.0 and same_step.p_value is None and same_step.ci_low is None
    rounding = paired_difference([0.7, 0.8], [0.5, 0.6])  # differences 0.19999999999999996 and 0.20000000000000007
    assert rounding.p_value is None and rounding.ci_low is None  # rounding error is no spread (scipy: p = 1e-15)
    with pytest.raises(ValueError, match="as many values"):
        paired_difference([1.0, 2.0], [1.0])


def test_compare_pairs_by_seed_when_the_seeds_match_and_uses_welch_otherwise():
    a = {0: 0.525, 1: 0.63, 2: 0.72}
    b = {2: 0.70, 0: 0.50, 1: 0.60}  # another order: pairs go by seed, not by position
    paired = compare(a, b)
    assert paired.test == PAIRED and paired.p_value == pytest.approx(
        scipy_stats.ttest_rel([0.525, 0.63, 0.72], [0.5, 0.6, 0.7]).pvalue
    )
    other_seeds = {0: 0.50, 1: 0.60, 3: 0.70}
    welch = compare(a, other_seeds)
    assert welch.test == WELCH and welch.n == (3, 3)
    assert welch.p_value == pytest.approx(
        scipy_stats.ttest_ind([0.525, 0.63, 0.72], [0.5, 0.6, 0.7], equal_var=False).pvalue
    )
    fewer = compare({0: 0.9, 1: 0.95}, b)
    assert fewer.test == WELCH and fewer.n == (2, 3)
    one_seed = compare({0: 0.9}, {0: 0.5})
    assert one_seed.difference == pytest.approx(0.4) and one_seed.ci_low is None and one_seed.p_value is None


def test_compare_never_cuts_a_difference_interval_to_the_metric_range():
    """Exact-match differences -0.9, -0.9, +0.9: the paired interval is -0.3 ± 4.303 · 1.039 / √3 =
    [-2.88, +2.28]; it used to be cut to [-1, +1] (the metric's span), which hid how little 3 seeds say."""
    variant, baseline = {0: 0.0, 1: 0.0, 2: 0.9}, {0: 0.9, 1: 0.9, 2: 0.0}
    half_width = T_975_DF2 * math.sqrt(((0.6**2) * 2 + 1.2**2) / 2) / math.sqrt(3)
    result = compare(variant, baseline)
    assert result.difference == pytest.approx(-0.3)
    assert (result.ci_low, result.ci_high) == pytest.approx((-0.3 - half_width, -0.3 + half_width))
    assert result.ci_low < -2.8 and result.ci_high > 2.2
    assert not hasattr(result, "clipped")


# the metrics' ranges ---------------------------------------------------------------------------


def test_every_metric_declares_the_range_its_values_can_take():
    from blockbench.tasks import TASK_CONFIGS, Metric

    expected = {
        "accuracy": (0, 1),
        "agreement_acc": (0, 1),
        "exact_match": (0, 1),
        "bleu": (0, 100),
        "perplexity": (1, math.inf),
        "loss": (0, math.inf),
        "bits_per_byte": (0, math.inf),
        # the LM's loss over the task's floor and the share of the gap closed: either sign (tasks/lm.py)
        "excess_loss": (-math.inf, math.inf),
        "gap_closed": (-math.inf, math.inf),
    }
    declared = {(task, m.name): (m.low, m.high) for task, cfg in TASK_CONFIGS.items() for m in cfg.metrics}
    assert declared and all(bounds == expected[metric] for (_, metric), bounds in declared.items())
    assert Metric(name="bleu", higher_is_better=True, description="", low=0, high=100).span == 100
    with pytest.raises(ValueError, match=r"low=1\.0 must be below high=0\.0"):
        Metric(name="x", higher_is_better=True, description="", low=1, high=0)
