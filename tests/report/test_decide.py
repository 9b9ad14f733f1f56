"""The verdict rule (blockbench.report.decide) against scipy's own tests and hand computations: the
planned looks and their α/K, the paired and Welch t tests and TOST, the four verdicts (equivalence
winning over a difference below the margin), the rank tests for bimodal values, the probability of
improvement, the cases without spread, the futility stop (its conditional power against a simulation
of the seeds to come), and the one-line description. The error rates the rule
claims are checked by simulation in tests/e2e/test_verdict_error_rates.py."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from blockbench.prereg import smallest_rank_p
from blockbench.report.decide import (
    BETTER,
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    EQUIVALENT,
    NO_TEST,
    PAIRED_T,
    RANK_SUM,
    SIGNED_RANK,
    UNDECIDED,
    WELCH_T,
    WORSE,
    Looks,
    conditional_power,
    decide,
    futile,
    paired_moments,
    prob_improvement,
    prob_improvement_interval,
    t_tests,
    t_verdicts,
    typical_agrees,
)
from blockbench.report.ranks import any_failed, rank_sum_tests, signed_rank_tests

FIXED3 = Looks.fixed(3)
PLAN = Looks.plan(3, 9, 3)


def seeds(values):
    return dict(enumerate(values))


# looks ----------------------------------------------------------------------------------------------


def test_a_plan_looks_at_min_every_step_and_always_at_max_and_splits_alpha_equally():
    assert PLAN.sizes == (3, 6, 9) and PLAN.per_look_alpha == pytest.approx(0.05 / 3)
    assert Looks.plan(3, 8, 3).sizes == (3, 6, 8)  # the last look is max even off the step
    assert Looks.plan(3, 3, 3).sizes == (3,) and Looks.plan(3, 3, 3).per_look_alpha == 0.05
    assert Looks((3,)) == FIXED3 and FIXED3.per_look_alpha == 0.05
    assert Looks.plan(2, 10, 4, alpha=0.1).sizes == (2, 6, 10)
    assert Looks.plan(2, 10, 4, alpha=0.1).per_look_alpha == pytest.approx(0.1 / 3)
    assert [PLAN.next_size(n) for n in (0, 3, 4, 6, 8, 9, 12)] == [3, 6, 6, 9, 9, None, None]
    assert [PLAN.is_last(n) for n in (3, 6, 8, 9, 10)] == [False, False, False, True, True]
    # a fixed list is one look: a failed cell leaves 2 of 3 seeds, and no more will come (the summary
    # said "more seeds may decide it", which no round would do)
    assert FIXED3.is_last(2) and FIXED3.is_last(3)
    short = decide(seeds([7.5, 7.0]), seeds([7.0, 7.1]), margin=0.07, higher_is_better=False, looks=FIXED3)
    assert short.verdict == UNDECIDED and short.final
    with pytest.raises(ValueError, match=r"needs 1 <= min <= max"):
        Looks.plan(6, 3, 3)
    with pytest.raises(ValueError, match=r"increasing seed counts"):
        Looks((6, 3))
    with pytest.raises(ValueError, match=r"alpha=1.5 must lie between 0 and 1"):
        Looks((3,), alpha=1.5)


# the t tests ----------------------------------------------------------------------------------------


def test_paired_t_and_tost_match_scipy_at_the_per_look_alpha():
    variant, baseline = [7.339, 7.402, 7.448, 7.40, 7.36, 7.39], [7.349, 7.356, 7.363, 7.35, 7.37, 7.36]
    margin = 0.0736
    decision = decide(seeds(variant), seeds(baseline), margin=margin, higher_is_better=False, looks=PLAN)
    d = np.subtract(variant, baseline)
    alpha = 0.05 / 3
    assert decision.test == PAIRED_T and decision.n == (6,) and decision.alpha == pytest.approx(alpha)
    assert decision.difference == pytest.approx(d.mean())
    assert decision.p_value == pytest.approx(scipy_stats.ttest_rel(variant, baseline).pvalue, rel=1e-10)
    # TOST as two one-sided scipy tests: d > -margin and d < +margin
    lower = scipy_stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = scipy_stats.ttest_1samp(d, margin, alternative="less").pvalue
    assert decision.p_equivalence == pytest.approx(max(lower, upper), rel=1e-10)
    se = d.std(ddof=1) / math.sqrt(6)
    assert decision.interval == pytest.approx(
        (d.mean() - scipy_stats.t.ppf(1 - alpha / 2, 5) * se, d.mean() + scipy_stats.t.ppf(1 - alpha / 2, 5) * se)
    )
    assert decision.equivalence_interval == pytest.approx(
        (d.mean() - scipy_stats.t.ppf(1 - alpha, 5) * se, d.mean() + scipy_stats.t.ppf(1 - alpha, 5) * se)
    )
    # the verdict follows the tests: equivalent exactly when TOST's interval lies inside ± the margin
    inside = -margin < decision.equivalence_interval[0] and decision.equivalence_interval[1] < margin
    assert (decision.verdict == EQUIVALENT) == inside == (decision.p_equivalence < alpha)


def test_welch_t_and_tost_match_scipy_when_the_seeds_differ():
    variant, baseline = {0: 0.865, 1: 0.842, 2: 0.874, 3: 0.85}, {0: 0.795, 1: 0.738, 5: 0.791}
    margin = 0.005
    decision = decide(variant, baseline, margin=margin, higher_is_better=True, looks=FIXED3)
    a, b = list(variant.values()), list(baseline.values())
    assert decision.test == WELCH_T and decision.n == (4, 3)
    assert decision.p_value == pytest.approx(scipy_stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-10)
    lower = scipy_stats.ttest_ind(np.add(a, margin), b, equal_var=False, alternative="greater").pvalue
    upper = scipy_stats.ttest_ind(np.subtract(a, margin), b, equal_var=False, alternative="less").pvalue
    assert decision.p_equivalence == pytest.approx(max(lower, upper), rel=1e-10)
    assert decision.p_value < 0.05 and decision.verdict == BETTER and decision.excludes_zero and decision.final


def _tost_paired(variant: list[float], baseline: list[float], margin: float) -> float:
    """TOST's p-value on seed-matched pairs, as statsmodels' ``ttost_paired``: the larger p of the one-sided
    paired t tests of d > -margin and d < +margin."""
    d = np.subtract(variant, baseline)
    lower = scipy_stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = scipy_stats.ttest_1samp(d, margin, alternative="less").pvalue
    return float(max(lower, upper))


def _tost_welch(variant: list[float], baseline: list[float], margin: float) -> float:
    """TOST's p-value on two unpaired samples, as statsmodels' ``ttost_ind(usevar="unequal")``: the larger
    p of the one-sided Welch t tests of mean(a) - mean(b) > -margin and < +margin."""
    lower = scipy_stats.ttest_ind(np.add(variant, margin), baseline, equal_var=False, alternative="greater").pvalue
    upper = scipy_stats.ttest_ind(np.subtract(variant, margin), baseline, equal_var=False, alternative="less").pvalue
    return float(max(lower, upper))


def test_equivalence_is_declared_exactly_where_tost_at_the_look_s_alpha_rejects():
    """TOST runs at the look's α_k itself, not α_k/2 (which would make equivalence silently rarer): data
    whose TOST p-value lies between α_k/2 and α_k read equivalent, paired at the first of three looks and
    Welch at a single look, and over a sweep of margins across the boundary decide says equivalent
    exactly where the TOST p-value computed here from scipy's one-sided t tests is below α_k."""
    baseline = [7.35, 7.36, 7.34, 7.37, 7.33, 7.36]
    variant = [7.39, 7.33, 7.36, 7.40, 7.32, 7.39]  # differences +0.04, -0.03, +0.02, +0.03, -0.01, +0.03
    alpha = PLAN.per_look_alpha
    p = _tost_paired(variant, baseline, 0.05)
    assert alpha / 2 < p < alpha  # TOST at α_k/2 would not show it
    paired = decide(seeds(variant), seeds(baseline), margin=0.05, higher_is_better=False, looks=PLAN)
    assert paired.test == PAIRED_T and paired.p_equivalence == pytest.approx(p, rel=1e-10)
    assert paired.verdict == EQUIVALENT and paired.final and not paired.excludes_zero
    welch_variant, welch_baseline = {0: 0.801, 1: 0.812, 2: 0.795, 3: 0.808}, {10: 0.80, 11: 0.79, 12: 0.81}
    looks = Looks.fixed(4)
    p = _tost_welch(list(welch_variant.values()), list(welch_baseline.values()), 0.02)
    assert looks.per_look_alpha / 2 < p < looks.per_look_alpha
    welch = decide(welch_variant, welch_baseline, margin=0.02, higher_is_better=True, looks=looks)
    assert welch.test == WELCH_T and welch.p_equivalence == pytest.approx(p, rel=1e-10)
    assert welch.verdict == EQUIVALENT
    # the boundary itself: margins from far too narrow to wide, both tests, both looks
    sides = [(seeds(variant), seeds(baseline), PLAN, _tost_paired), (welch_variant, welch_baseline, looks, _tost_welch)]
    for a, b, plan, tost in sides:
        verdicts = []
        for margin in np.linspace(0.005, 0.06, 56):
            hand = tost(list(a.values()), list(b.values()), margin) < plan.per_look_alpha
            decision = decide(a, b, margin=float(margin), higher_is_better=True, looks=plan)
            assert (decision.verdict == EQUIVALENT) == hand, (margin, decision.describe())
            verdicts.append(decision.verdict)
        assert EQUIVALENT in verdicts and UNDECIDED in verdicts


def test_better_and_worse_follow_the_metric_direction():
    low, high = [1.0, 2.0, 3.0, 4.0], [1.5, 2.6, 3.4, 4.5]  # high - low: +0.5, +0.6, +0.4, +0.5
    looks = Looks.fixed(4)
    assert decide(seeds(high), seeds(low), margin=0.1, higher_is_better=True, looks=looks).verdict == BETTER
    assert decide(seeds(high), seeds(low), margin=0.1, higher_is_better=False, looks=looks).verdict == WORSE
    assert decide(seeds(low), seeds(high), margin=0.1, higher_is_better=True, looks=looks).verdict == WORSE
    assert decide(seeds(low), seeds(high), margin=0.1, higher_is_better=False, looks=looks).verdict == BETTER


def test_a_real_difference_below_the_margin_is_equivalent_and_says_it_excluded_zero():
    baseline = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    variant = [b + 0.1 + e for b, e in zip(baseline, [0.01, -0.01, 0.02, -0.02, 0.0, 0.0], strict=True)]
    decision = decide(seeds(variant), seeds(baseline), margin=1.0, higher_is_better=True, looks=Looks.fixed(6))
    assert decision.p_value < 0.05 and decision.p_equivalence < 0.05
    assert decision.verdict == EQUIVALENT and decision.excludes_zero and decision.interval[0] > 0
    assert "the difference excludes zero but lies within the margin" in decision.describe()


def test_the_split_alpha_decides_less_than_a_single_look_on_the_same_seeds():
    # paired differences +0.3, +0.5, +0.4: p = 0.0198, below 0.05 but above 0.05 / 3
    variant, baseline = seeds([1.3, 2.5, 3.4]), seeds([1.0, 2.0, 3.0])
    p = scipy_stats.ttest_rel([1.3, 2.5, 3.4], [1.0, 2.0, 3.0]).pvalue
    assert 0.05 / 3 < p < 0.05
    once = decide(variant, baseline, margin=0.1, higher_is_better=True, looks=FIXED3)
    first_of_three = decide(variant, baseline, margin=0.1, higher_is_better=True, looks=PLAN)
    assert (once.verdict, once.final) == (BETTER, True)
    assert (first_of_three.verdict, first_of_three.final) == (UNDECIDED, False)  # six seeds next
    assert "more seeds to come" in first_of_three.describe()
    # at the last look an undecided question is final; a decided one is final at any look
    at_last = decide(
        seeds([1.3, 2.5, 3.4, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]),
        seeds([1.0, 2.0, 3.0, 1.2, 0.7, 1.1, 2.3, 1.8, 2.1]),
        margin=0.1,
        higher_is_better=True,
        looks=PLAN,
    )
    assert at_last.verdict == UNDECIDED and at_last.final


# the typical seed -----------------------------------------------------------------------------------


def test_better_or_worse_needs_the_typical_seed_to_agree_with_the_t_test():
    """Nine pairs, one look at α 0.05: four variant seeds far ahead (+5) and five just behind (-0.1)
    of baseline seeds at 0.00 .. 0.08. The paired t test rejects zero (p 0.042, scipy's), but the typical
    seed is behind: P(better) = 4 · 9 / 81 = 4/9 < 0.5, so the verdict is undecided and the decision
    says why. With five seeds ahead and four behind P(better) = 5/9 agrees, and the verdict is better.
    The same by Welch on disjoint seeds (p 0.041), and with the metric's direction reversed."""
    baseline = np.arange(9) * 0.01
    for ahead, verdict, prob in ((4, UNDECIDED, 4 / 9), (5, BETTER, 5 / 9)):
        variant = baseline + np.array([5.0] * ahead + [-0.1] * (9 - ahead))
        reference = scipy_stats.ttest_rel(variant, baseline).pvalue
        assert reference < 0.05
        for sign, higher_is_better in ((1.0, True), (-1.0, False)):
            a, b = seeds(sign * variant), seeds(sign * baseline)
            decision = decide(a, b, margin=1.0, higher_is_better=higher_is_better, looks=Looks.fixed(9))
            assert decision.test == PAIRED_T and decision.p_value == pytest.approx(reference)
            assert decision.prob_improvement == pytest.approx(prob)
            assert decision.verdict == verdict and decision.excludes_zero and decision.final
            assert decision.typical_disagrees == (verdict == UNDECIDED)
            described = "the t test found a difference that the typical seed does not show" in decision.describe()
            assert described == (verdict == UNDECIDED)
        other = {k + 100: v for k, v in seeds(baseline).items()}
        welch = decide(seeds(variant), other, margin=1.0, higher_is_better=True, looks=Looks.fixed(9))
        assert welch.test == WELCH_T
        assert welch.p_value == pytest.approx(scipy_stats.ttest_ind(variant, baseline, equal_var=False).pvalue)
        assert welch.p_value < 0.05 and welch.verdict == verdict and welch.typical_disagrees == (verdict == UNDECIDED)
    # the array function asked for the t test alone (no P(better)) says better where decide says undecided
    variant = baseline + np.array([5.0] * 4 + [-0.1] * 5)
    moments = paired_moments(variant[None], baseline[None])
    tests = t_tests(moments, 1.0, 0.05)
    assert t_verdicts(moments, tests, 1.0, 0.05, True, None)[0].tolist() == [BETTER]
    prob = prob_improvement(variant[None], baseline[None], True)
    assert t_verdicts(moments, tests, 1.0, 0.05, True, prob)[0].tolist() == [UNDECIDED]


def test_the_typical_seed_agrees_only_strictly_on_the_mean_s_side_of_one_half():
    mean = np.array([1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 0.0])
    prob = np.array([0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.6])
    assert typical_agrees(mean, prob, True).tolist() == [True, False, False, True, False, False, False]
    # lower is better: a larger variant value is worse, so P(better) below 0.5 agrees with a positive mean
    assert typical_agrees(mean, 1 - prob, False).tolist() == [True, False, False, True, False, False, False]


def test_a_question_is_rank_based_wherever_a_seed_of_either_side_failed():
    """Not only where a side mixes failed and learned seeds: a side whose seeds all failed against one
    that learned goes to the rank test too, and a question is rank-based whichever side holds the seed."""
    learned, mixed, failed = [False, False, False], [False, True, False], [True, True, True]
    assert any_failed([learned, mixed, failed, learned], [learned, learned, learned, failed]).tolist() == [
        False,
        True,
        True,
        True,
    ]
    assert bool(any_failed(failed, learned)) and bool(any_failed(learned, failed)) and not any_failed(learned, learned)
    # decided so, three pairs cannot decide: the exact signed-rank p of three pairs is at least 0.25
    post, pre = [0.5, 0.4, 0.6], [60.0, 62.0, 64.0]
    decision = decide(seeds(post), seeds(pre), margin=1.0, higher_is_better=True, looks=PLAN, rank_based=True)
    assert decision.test == SIGNED_RANK and decision.p_value == pytest.approx(0.25) and decision.verdict == UNDECIDED
    assert decision.p_value == pytest.approx(scipy_stats.wilcoxon(np.subtract(post, pre), method="exact").pvalue)


# rank tests -----------------------------------------------------------------------------------------


def test_rank_based_decisions_use_exact_tests_and_are_never_equivalent():
    # nine seed pairs, the variant ahead in every one: the exact signed-rank p is 2 / 2^9
    baseline = [99.0, 98.5, 0.9, 99.2, 98.8, 0.9, 99.1, 98.9, 99.3]
    variant = [b + 0.05 * (i + 1) for i, b in enumerate(baseline)]
    decision = decide(seeds(variant), seeds(baseline), margin=1.0, higher_is_better=True, looks=PLAN, rank_based=True)
    assert decision.test == SIGNED_RANK and decision.p_value == pytest.approx(2 / 512)
    assert decision.verdict == BETTER and decision.excludes_zero
    assert decision.p_equivalence is None and decision.equivalence_interval is None
    # the same values by the t rule: equivalent (every difference is below the margin); a rank test never says so
    assert decide(seeds(variant), seeds(baseline), margin=1.0, higher_is_better=True, looks=PLAN).verdict == EQUIVALENT
    # three pairs can never reach α: the smallest exact two-sided p is 2 / 2^3
    three = decide(
        seeds(variant[:3]), seeds(baseline[:3]), margin=1.0, higher_is_better=True, looks=PLAN, rank_based=True
    )
    assert three.p_value == pytest.approx(0.25) and three.verdict == UNDECIDED and not three.final
    # unpaired: the exact Mann-Whitney U test
    other = {k + 100: v for k, v in seeds(baseline).items()}
    unpaired = decide(seeds(variant), other, margin=1.0, higher_is_better=False, looks=PLAN, rank_based=True)
    # the baseline's two seeds at 0.9 tie: the exact test given the ties (scipy's permutation method)
    reference = scipy_stats.mannwhitneyu(variant, baseline, method=scipy_stats.PermutationMethod(n_resamples=np.inf))
    assert unpaired.test == RANK_SUM and unpaired.n == (9, 9)
    assert unpaired.p_value == pytest.approx(reference.pvalue)
    assert unpaired.verdict == UNDECIDED  # two low seeds on each side: the ranks barely lean


def test_a_rank_based_question_stops_where_no_planned_look_can_decide_it():
    """Up to 6 seed pairs in two looks spend α 0.025 each; the exact signed-rank test on 6 pairs gives p ≥
    2/64 = 0.031, so whatever the next 3 pairs hold, the question stays undecided: it stops at 3 pairs,
    for futility, with a conditional power of 0. Up to 9 pairs in three looks can decide it (p ≥ 0.0039),
    so the same 3 pairs wait for more; so does a plan with the futility stop off."""
    post, pre = [0.5, 0.4, 0.6], [60.0, 62.0, 64.0]
    up_to_six = decide(
        seeds(post), seeds(pre), margin=1.0, higher_is_better=True, looks=Looks.plan(3, 6, 3), rank_based=True
    )
    assert up_to_six.verdict == UNDECIDED and up_to_six.final and up_to_six.futile
    assert up_to_six.conditional_power == 0.0
    assert "stopped for futility: the Wilcoxon signed-rank test on 6 pairs cannot reach α 0.025" in up_to_six.describe()
    up_to_nine = decide(seeds(post), seeds(pre), margin=1.0, higher_is_better=True, looks=PLAN, rank_based=True)
    assert not up_to_nine.final and not up_to_nine.futile
    never = Looks.plan(3, 6, 3, futility=0.0)
    kept = decide(seeds(post), seeds(pre), margin=1.0, higher_is_better=True, looks=never, rank_based=True)
    assert not kept.final
    # the bound is the exact tests' own: n pairs all one way (ours and scipy's), and 3 against 3 seeds apart
    for n in range(2, 10):
        assert smallest_rank_p(n) == pytest.approx(signed_rank_tests(np.arange(1.0, n + 1)[None]).p_value[0]), n
    assert smallest_rank_p(6) == pytest.approx(scipy_stats.wilcoxon(np.arange(1.0, 7), method="exact").pvalue)
    assert smallest_rank_p(3, 3) == pytest.approx(scipy_stats.mannwhitneyu([1, 2, 3], [4, 5, 6], method="exact").pvalue)


def test_a_rank_decided_question_follows_the_metric_s_direction():
    """Where runs did not learn, the rank test decides, and its verdict reads the metric's direction as the t
    test's does: a perplexity (lower is better) higher in every one of nine pairs, three of them runs that
    did not learn (30, the trivial unigram's), is worse, as is an accuracy lower in every pair; the sides
    swapped are better. Paired by the exact signed-rank test, unpaired (6 against 6 seeds) by the exact
    Mann-Whitney U test, p-values as scipy's; the t interval includes zero, so only the rank test decides."""
    every = scipy_stats.PermutationMethod(n_resamples=np.inf)
    perplexity = ([7.1, 7.3, 7.0, 7.2, 7.4, 7.05, 7.15, 7.25, 7.35], [7.5, 30.0, 7.6, 30.0, 7.9, 7.45, 30.0, 7.7, 7.8])
    accuracy = (
        [0.81, 0.79, 0.83, 0.80, 0.82, 0.78, 0.84, 0.80, 0.81],
        [0.75, 0.1, 0.77, 0.1, 0.74, 0.72, 0.1, 0.76, 0.73],
    )
    for higher_is_better, (good, bad) in ((False, perplexity), (True, accuracy)):
        for variant, baseline, expected in ((bad, good, WORSE), (good, bad, BETTER)):
            paired = decide(
                seeds(variant),
                seeds(baseline),
                margin=0.005,
                higher_is_better=higher_is_better,
                looks=PLAN,
                rank_based=True,
            )
            reference = scipy_stats.wilcoxon(np.subtract(variant, baseline), method="exact").pvalue
            assert reference == pytest.approx(2 / 2**9)  # the smallest p of nine pairs
            assert paired.test == SIGNED_RANK and paired.p_value == pytest.approx(reference)
            assert paired.verdict == expected, (higher_is_better, paired.describe())
            assert paired.interval[0] < 0 < paired.interval[1]  # the t test alone would not decide
            a, b = variant[:6], baseline[:6]
            unpaired = decide(
                seeds(a),
                {k + 100: v for k, v in seeds(b).items()},
                margin=0.005,
                higher_is_better=higher_is_better,
                looks=PLAN,
                rank_based=True,
            )
            reference = scipy_stats.mannwhitneyu(a, b, method=every).pvalue
            assert unpaired.test == RANK_SUM and unpaired.p_value == pytest.approx(reference)
            assert unpaired.p_value < PLAN.per_look_alpha
            assert unpaired.verdict == expected, (higher_is_better, unpaired.describe())


def test_the_signed_rank_test_drops_zero_differences_and_its_sign_follows_the_ranks():
    # zeros (both seeds of a pair at the trivial baseline) are dropped, then scipy's exact test
    d = np.array([[0.0, 1.0, 2.0, -0.5, 0.0, 3.0, 4.0]])
    tests = signed_rank_tests(d)
    assert tests.p_value[0] == pytest.approx(scipy_stats.wilcoxon([1.0, 2.0, -0.5, 3.0, 4.0], method="exact").pvalue)
    assert tests.sign[0] == 1.0
    both = signed_rank_tests(np.array([[0.0, 0.0, 0.0], [-1.0, -2.0, 0.5]]))
    assert both.p_value[0] == 1.0 and both.sign[0] == 0.0  # nothing left: no evidence
    assert both.sign[1] == -1.0  # ranks 2 and 3 negative, 1 positive
    # rows of different zero counts in one call give each row's own test
    many = signed_rank_tests(np.array([[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]]))
    assert many.p_value.tolist() == pytest.approx([0.5, 0.25])


def test_rank_tests_are_exact_given_the_ties_as_scipys_permutation_method_and_scipy_exact_without_ties():
    """Seeds that failed tie at one value. scipy's exact Mann-Whitney ignores ties: a variant with three
    seeds tied at the trivial 0.2 against six that learned has p 0.0152 by it, under α_k = 0.05/3, while
    its exact p given the ties is 0.0173 (undecided). Both rank tests list every arrangement of the
    midranks, as scipy's permutation method does one row at a time; without ties they equal scipy's exact
    tests."""
    rng = np.random.default_rng(0)
    every = scipy_stats.PermutationMethod(n_resamples=np.inf)
    for n_a, n_b in [(3, 3), (6, 6), (9, 9), (4, 7)]:
        a, b = rng.normal(size=(20, n_a)), rng.normal(size=(20, n_b))
        ours, reference = rank_sum_tests(a, b), scipy_stats.mannwhitneyu(a, b, axis=-1, method="exact")
        assert ours.p_value == pytest.approx(reference.pvalue)
        assert (ours.sign == np.sign(reference.statistic - n_a * n_b / 2)).all()
    for n in (3, 6, 9):
        d = rng.normal(size=(20, n))
        assert signed_rank_tests(d).p_value == pytest.approx(scipy_stats.wilcoxon(d, axis=-1, method="exact").pvalue)
    for _ in range(60):  # tied values: scipy's permutation test, one row at a time
        a = rng.choice([0.2, 0.6, 0.7, 0.8], size=rng.integers(2, 7))
        b = rng.choice([0.2, 0.6, 0.7, 0.9], size=rng.integers(2, 7))
        reference = scipy_stats.mannwhitneyu(a, b, method=every).pvalue
        assert rank_sum_tests(a[None], b[None]).p_value[0] == pytest.approx(reference)
        d = rng.choice([-0.5, -0.1, 0.1, 0.5, 0.6], size=rng.integers(2, 9))
        reference = scipy_stats.wilcoxon(d, method=every).pvalue
        assert signed_rank_tests(d[None]).p_value[0] == pytest.approx(reference)
    variant, baseline = np.array([0.67, 0.2, 0.73, 0.2, 0.66, 0.2]), np.array([0.73, 0.66, 0.77, 0.82, 0.74, 0.78])
    assert scipy_stats.mannwhitneyu(variant, baseline, method="exact").pvalue < 0.05 / 3  # ties ignored
    assert rank_sum_tests(variant[None], baseline[None]).p_value[0] == pytest.approx(0.017316, abs=1e-6)


# probability of improvement -------------------------------------------------------------------------


def test_probability_of_improvement_counts_all_seed_pairs_with_ties_as_half():
    variant, baseline = [3.0, 1.0, 2.0], [2.0, 0.0]
    # pairs (v > b): 3>2, 3>0, 1<2, 1>0, 2=2 (half), 2>0 -> (4 + 0.5) / 6
    assert prob_improvement(np.array(variant), np.array(baseline), higher_is_better=True) == pytest.approx(4.5 / 6)
    assert prob_improvement(np.array(variant), np.array(baseline), higher_is_better=False) == pytest.approx(1.5 / 6)
    # it is the Mann-Whitney U of the variant over n_a n_b (scipy counts ties as half too)
    u = scipy_stats.mannwhitneyu(variant, baseline).statistic
    assert prob_improvement(np.array(variant), np.array(baseline), True) == pytest.approx(u / 6)
    interval = prob_improvement_interval(np.array(variant), np.array(baseline), True)
    assert interval == prob_improvement_interval(np.array(variant), np.array(baseline), True)  # fixed random state
    assert 0 <= interval[0] <= 4.5 / 6 <= interval[1] <= 1
    assert prob_improvement_interval(np.array([1.0]), np.array(baseline), True) is None  # one seed: no interval
    decision = decide(seeds(variant), {10: 2.0, 11: 0.0}, margin=0.5, higher_is_better=True, looks=FIXED3)
    assert decision.prob_improvement == pytest.approx(4.5 / 6) and decision.prob_improvement_interval == interval


def _exact_bootstrap(
    variant: np.ndarray, baseline: np.ndarray, higher_is_better: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Every value P(better) takes over the bootstrap resamples of the two sides (each resampled on its own)
    and its probability, by enumerating each side's resample counts (multinomial) instead of drawing them."""

    def counts(n: int) -> tuple[np.ndarray, np.ndarray]:
        rows = [np.bincount(c, minlength=n) for c in itertools.combinations_with_replacement(range(n), n)]
        rows = np.array(rows)
        ways = np.array([math.factorial(n) / math.prod(math.factorial(k) for k in row) for row in rows])
        return rows, ways / n**n

    x, y = variant[:, None], baseline[None, :]
    wins = ((x > y) if higher_is_better else (x < y)) + 0.5 * (x == y)
    (a, p_a), (b, p_b) = counts(len(variant)), counts(len(baseline))
    values = (a @ wins @ b.T) / (len(variant) * len(baseline))
    return values.ravel(), np.outer(p_a, p_b).ravel()


def test_the_probability_of_improvement_interval_is_a_95_percent_percentile_bootstrap():
    """The interval of P(better) is scipy's 95% percentile bootstrap (each side resampled on its own, the
    module's resamples and random state), in both directions of the metric. Independently of scipy, the
    exact bootstrap distribution (every resample enumerated) leaves about 2.5% of its mass beyond each
    end, not the 5% a 90% interval would: at most 2.5% plus the Monte Carlo error strictly outside."""
    variant = np.array([7.1, 7.6, 6.9, 7.4, 7.3, 7.0])
    baseline = np.array([7.2, 7.5, 7.35, 7.05, 7.45, 6.95])
    for higher_is_better in (False, True):
        reference = scipy_stats.bootstrap(
            (variant, baseline),
            lambda x, y, axis, h=higher_is_better: prob_improvement(x, y, h, axis),
            vectorized=True,
            paired=False,
            confidence_level=0.95,
            n_resamples=BOOTSTRAP_RESAMPLES,
            method="percentile",
            random_state=BOOTSTRAP_SEED,
        ).confidence_interval
        interval = prob_improvement_interval(variant, baseline, higher_is_better)
        assert interval == pytest.approx((reference.low, reference.high), abs=1e-12)
        decision = decide(seeds(variant), seeds(baseline), margin=0.05, higher_is_better=higher_is_better, looks=FIXED3)
        assert decision.prob_improvement_interval == interval
    values, probability = _exact_bootstrap(variant, baseline, higher_is_better=False)
    assert probability.sum() == pytest.approx(1.0)
    low, high = prob_improvement_interval(variant, baseline, higher_is_better=False)
    error = 3 * math.sqrt(0.025 * 0.975 / BOOTSTRAP_RESAMPLES)  # three Monte Carlo standard errors
    below, above = probability[values < low - 1e-9].sum(), probability[values > high + 1e-9].sum()
    assert below <= 0.025 + error and above <= 0.025 + error
    assert probability[values <= low + 1e-9].sum() >= 0.025 - error
    assert probability[values >= high - 1e-9].sum() >= 0.025 - error


# no spread, one seed, bad input ---------------------------------------------------------------------


def test_without_spread_identical_sides_are_equivalent_and_a_constant_step_beyond_the_margin_is_undecided():
    saturated = decide(seeds([100.0] * 3), seeds([100.0] * 3), margin=1.0, higher_is_better=True, looks=FIXED3)
    assert (saturated.verdict, saturated.test, saturated.p_value, saturated.interval) == (
        EQUIVALENT,
        NO_TEST,
        None,
        None,
    )
    assert saturated.final and not saturated.excludes_zero
    small_step = decide(
        seeds([0.802, 0.812, 0.822]), seeds([0.8, 0.81, 0.82]), margin=0.005, higher_is_better=True, looks=FIXED3
    )
    assert small_step.verdict == EQUIVALENT and small_step.test == NO_TEST  # +0.002 in every seed, within 0.005
    step = decide(seeds([2.0, 3.0, 4.0]), seeds([1.0, 2.0, 3.0]), margin=0.5, higher_is_better=True, looks=FIXED3)
    assert (step.verdict, step.test, step.p_value) == (UNDECIDED, NO_TEST, None)
    welch_constant = decide(
        {0: 100.0, 1: 100.0}, {5: 100.0, 6: 100.0, 7: 100.0}, margin=1.0, higher_is_better=True, looks=FIXED3
    )
    assert welch_constant.verdict == EQUIVALENT and welch_constant.n == (2, 3)
    one_seed = decide({0: 0.5}, {0: 0.5}, margin=0.1, higher_is_better=True, looks=PLAN)
    assert (one_seed.verdict, one_seed.test, one_seed.final) == (UNDECIDED, NO_TEST, False)
    assert one_seed.prob_improvement == 0.5 and one_seed.prob_improvement_interval is None


def test_bad_input_says_what_is_wrong():
    with pytest.raises(ValueError, match="margin=0 must be positive"):
        decide(seeds([1.0, 2.0]), seeds([1.0, 2.0]), margin=0, higher_is_better=True, looks=FIXED3)
    with pytest.raises(ValueError, match="a side without seeds"):
        decide({}, seeds([1.0, 2.0]), margin=1, higher_is_better=True, looks=FIXED3)
    with pytest.raises(ValueError, match="diverged seed"):
        decide(seeds([math.nan, 2.0]), seeds([1.0, 2.0]), margin=1, higher_is_better=True, looks=FIXED3)


# one line, and the array functions ------------------------------------------------------------------


def test_describe_gives_the_verdict_the_test_and_the_numbers_in_one_line():
    # post-norm vs pre-norm LM perplexity as the book once measured it: +23.29, every seed far worse
    decision = decide(
        seeds([30.65, 30.633, 30.64]), seeds([7.349, 7.356, 7.363]), margin=0.0736, higher_is_better=False, looks=PLAN
    )
    assert decision.describe() == (
        "worse by more than the margin (paired t, n=3, α/K=0.0167): +23.29 [+23.22, +23.35], margin ±0.0736; "
        "P(better)=0.00 [0.00, 0.00]"
    )


def test_the_array_functions_give_decide_s_verdicts_row_by_row():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.0, 1.0, (200, 6)), rng.normal(0.0, 1.0, (200, 6))
    a[:50] += 2.0  # some better
    a[50:100] = b[50:100] + rng.normal(0.0, 0.05, (50, 6))  # some equivalent
    alpha = PLAN.per_look_alpha
    moments = paired_moments(a, b)
    prob = prob_improvement(a, b, higher_is_better=True)
    verdicts, rejects = t_verdicts(moments, t_tests(moments, 0.5, alpha), 0.5, alpha, True, prob)
    rows = [
        decide(seeds(x), seeds(y), margin=0.5, higher_is_better=True, looks=PLAN) for x, y in zip(a, b, strict=True)
    ]
    assert verdicts.tolist() == [r.verdict for r in rows]
    assert rejects.tolist() == [r.excludes_zero for r in rows]
    assert prob.tolist() == [r.prob_improvement for r in rows]
    assert {BETTER, EQUIVALENT, UNDECIDED} <= set(verdicts.tolist())


# futility -------------------------------------------------------------------------------------------


def test_conditional_power_matches_a_simulation_of_the_seeds_to_come():
    """The closed form against brute force under its own assumptions: the seeds to come drawn around
    today's mean difference with today's spread, the last look decided with se·√(n/last) and the grown
    degrees of freedom, as decide's t tests would at that look."""
    rng = np.random.default_rng(7)
    n, last, margin, alpha = 3, 9, 1.0, PLAN.per_look_alpha
    for today in ([0.9, -0.4, 0.3], [2.5, 1.0, 3.1], [0.2, -0.1, 0.05], [6.0, -5.0, 2.0]):
        a = np.array(today)
        moments = paired_moments(a[None], np.zeros((1, 3)))
        sd = float(np.std(a, ddof=1))
        future = rng.normal(a.mean(), sd, (200_000, last - n))
        final = (a.sum() + future.sum(axis=1)) / last
        se_last = sd / math.sqrt(last)
        difference = np.abs(final) > scipy_stats.t.ppf(1 - alpha / 2, last - 1) * se_last
        equivalent = np.abs(final) < margin - scipy_stats.t.ppf(1 - alpha, last - 1) * se_last
        simulated = np.mean(difference | equivalent)
        assert conditional_power(moments, n, last, margin, alpha)[0] == pytest.approx(simulated, abs=0.005)


def test_a_question_more_seeds_cannot_decide_stops_for_futility_and_says_so():
    # ViT-like: seeds 4.6 margins apart, the difference near zero: 9 seeds cannot show either answer
    hopeless = decide(
        seeds([0.79, 0.72, 0.67]), seeds([0.74, 0.72, 0.75]), margin=0.01, higher_is_better=True, looks=PLAN
    )
    assert hopeless.verdict == UNDECIDED and hopeless.futile and hopeless.final
    assert hopeless.conditional_power < 0.01
    assert "stopped for futility: conditional power 0% (today's difference and spread taken as the truth)" in (
        hopeless.describe()
    )
    # the same values without the stop, or at a last look: no futility
    assert not decide(
        seeds([0.79, 0.72, 0.67]),
        seeds([0.74, 0.72, 0.75]),
        margin=0.01,
        higher_is_better=True,
        looks=Looks.plan(3, 9, 3, futility=0.0),
    ).final
    # a difference that 9 seeds will likely show keeps its rounds
    promising = decide(seeds([3.0, 0.4, 2.9]), seeds([0.0, 0.0, 0.0]), margin=0.5, higher_is_better=True, looks=PLAN)
    assert promising.verdict == UNDECIDED and not promising.final and not promising.futile
    assert promising.conditional_power > 0.5 and "more seeds to come" in promising.describe()
    # a rank-based question has no projection: it keeps its planned looks
    ranked = decide(
        seeds([0.79, 0.72, 0.67]),
        seeds([0.74, 0.72, 0.75]),
        margin=0.01,
        higher_is_better=True,
        looks=PLAN,
        rank_based=True,
    )
    assert not ranked.final and not ranked.futile and ranked.conditional_power is None


def test_futile_gives_decide_s_stops_row_by_row():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.0, 1.0, (300, 3)), rng.normal(0.0, 1.0, (300, 3))
    a[:100] += rng.uniform(0.0, 3.0, (100, 1))
    moments = paired_moments(a, b)
    alpha = PLAN.per_look_alpha
    prob = prob_improvement(a, b, higher_is_better=True)
    verdicts = t_verdicts(moments, t_tests(moments, 0.3, alpha), 0.3, alpha, True, prob)[0]
    stops = futile(moments, verdicts, 3, PLAN, 0.3)
    rows = [
        decide(seeds(x), seeds(y), margin=0.3, higher_is_better=True, looks=PLAN) for x, y in zip(a, b, strict=True)
    ]
    assert stops.tolist() == [r.futile for r in rows]
    assert 0 < stops.sum() < len(stops)  # both kinds occur
    assert not futile(moments, verdicts, 9, PLAN, 0.3).any()  # the last look: nothing to stop
    with pytest.raises(ValueError, match=r"futility=1.5 must lie in \[0, 1\)"):
        Looks((3, 6), futility=1.5)
