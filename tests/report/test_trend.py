"""The trend verdict of a scale ladder (``blockbench.report.trend`` and ``.slope``): the slope and its
intervals against scipy (``linregress``, Welch's t test, a hand-computed Satterthwaite df and the
Jonckheere-Terpstra normal approximation), the constant compute multiplier read as a slope of exactly
0, each word on ladders built with a known truth, the baseline that stops scaling, and small
simulations of the rule's error rates against the binomial standard error."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from blockbench.report import slope as slope_module
from blockbench.report.slope import PER_RUNG, POOLED, Design, fit_slope, rank_trend, slope_interval
from blockbench.report.trend import (
    DELTA,
    DID_NOT_LEARN,
    DIVERGED,
    GROWS,
    HOLDS,
    JONCKHEERE,
    NO_TEST,
    NOT_SCALING,
    REVERSES,
    SHRINKS,
    UNDECIDED,
    Ladder,
    Rung,
    SeedLoss,
    analyse_rows,
    trend,
)

ALPHA = 0.05
#: the planned ladder: rungs at 1/4, 1, 4 and 16 times the book's cell, three seed pairs each
SCALES = (0.25, 1.0, 4.0, 16.0)
BOOK_FLOPS = 2.8e15
DESIGN = Design(tuple(math.log2(s * BOOK_FLOPS) for s in SCALES), (3, 3, 3, 3))
#: a fixed zero-mean pattern of seed noise within a rung (SD 1), so that built ladders are reproducible
PATTERN = np.array([-1.0, 0.0, 1.0])


def build(
    theta: list[list[float]],
    *,
    floor: float = 1.9,
    exponent: float = 0.3,
    reducible: float = 0.1,
    statuses: dict[tuple[int, str, int], str] | None = None,
    baseline_noise: list[float] | None = None,
) -> Ladder:
    """A ladder whose baseline follows reducible · (C / C_book)^-exponent (times each seed's
    ``baseline_noise`` factor) and whose variant seed i at rung k has θ = ``theta[k][i]``; ``statuses``
    marks (rung, side, seed) as diverged or not learned (a diverged seed's loss is dropped)."""
    statuses = statuses or {}
    rungs = []
    for k, (scale, thetas) in enumerate(zip(SCALES, theta, strict=True)):
        sides: dict[str, list[SeedLoss]] = {"variant": [], "baseline": []}
        for i, t in enumerate(thetas):
            factor = 1.0 if baseline_noise is None else baseline_noise[i]
            base = reducible * factor * scale**-exponent
            for side, value in (("baseline", floor + base), ("variant", floor + base * math.exp(t))):
                status = statuses.get((k, side, i), "ok")
                sides[side].append(SeedLoss(i, None if status == DIVERGED else value, status))
        rungs.append(
            Rung(f"r{k - 1}", scale * BOOK_FLOPS, floor, 3.42, tuple(sides["variant"]), tuple(sides["baseline"]))
        )
    return Ladder(tuple(rungs))


def line(intercept: float, slope: float, noise: float) -> list[list[float]]:
    """θ on a line in doublings from the book's cell (x = -2, 0, 2, 4), plus ``noise`` · the fixed pattern."""
    return [list(intercept + slope * math.log2(s) + noise * PATTERN) for s in SCALES]


# the statistics against references --------------------------------------------------------------


def test_the_slope_and_its_pooled_interval_are_linregress():
    """Every pair one point: OLS's slope, intercept and pooled standard error are ``linregress``'s, and
    the per-rung variance changes only the standard error, not the slope."""
    rng = np.random.default_rng(1)
    design = Design((-2.0, 0.0, 2.0, 4.0), (3, 4, 2, 3))
    values = rng.normal(0.1, 0.2, (5, sum(design.sizes))) + 0.03 * design.value_x
    pooled, per_rung = fit_slope(design, values, POOLED), fit_slope(design, values, PER_RUNG)
    for row in range(5):
        reference = scipy_stats.linregress(design.value_x, values[row])
        assert pooled.slope[row] == pytest.approx(reference.slope, rel=1e-12)
        assert pooled.intercept[row] == pytest.approx(reference.intercept, rel=1e-12)
        assert pooled.standard_error[row] == pytest.approx(reference.stderr, rel=1e-12)
        assert pooled.dof[row] == sum(design.sizes) - 2
        assert per_rung.slope[row] == pytest.approx(reference.slope, rel=1e-12)


def test_the_per_rung_variance_and_satterthwaite_df_by_hand():
    """Rungs at x 0, 1, 2 holding [1, 3], [2, 4, 6], [5, 7]: x̄ = 1, S_xx = 4, slope 2, intercept 2;
    Var = (2·1·2 + 0 + 2·1·2)/16 = 0.5; the two end rungs each carry 0.25 on one df, so df =
    0.5² / (0.25² + 0.25²) = 2. The interval is slope ± t(0.975, 2)·√0.5."""
    design = Design((0.0, 1.0, 2.0), (2, 3, 2))
    fit = fit_slope(design, np.array([[1.0, 3.0, 2.0, 4.0, 6.0, 5.0, 7.0]]))
    assert fit.slope[0] == pytest.approx(2.0) and fit.intercept[0] == pytest.approx(2.0)
    assert fit.standard_error[0] == pytest.approx(math.sqrt(0.5)) and fit.dof[0] == pytest.approx(2.0)
    low, high = slope_interval(fit, 0.95)
    half = scipy_stats.t.ppf(0.975, 2) * math.sqrt(0.5)
    assert (low[0], high[0]) == pytest.approx((2.0 - half, 2.0 + half))


def test_on_two_rungs_the_slope_test_is_welchs_t_test():
    """Two rungs: the slope is the difference of their means over their distance, and its t test (per-rung
    variance, Satterthwaite df) is Welch's t test (``scipy.stats.ttest_ind(equal_var=False)``)."""
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.0, 0.1, 3), rng.normal(0.3, 0.4, 5)
    design = Design((1.0, 3.0), (3, 5))
    fit = fit_slope(design, np.concatenate([a, b])[None])
    welch = scipy_stats.ttest_ind(b, a, equal_var=False)
    assert fit.slope[0] == pytest.approx((b.mean() - a.mean()) / 2)
    assert fit.slope[0] / fit.standard_error[0] == pytest.approx(welch.statistic)
    assert fit.dof[0] == pytest.approx(welch.df)
    p_value = 2 * scipy_stats.t.sf(abs(fit.slope[0] / fit.standard_error[0]), fit.dof[0])
    assert p_value == pytest.approx(welch.pvalue)


def test_the_rank_trend_is_jonckheere_terpstra():
    """On two rungs the rank trend is the Mann-Whitney U test (its normal approximation, ties and all);
    on three rungs without ties its p-value is the Jonckheere-Terpstra statistic's normal approximation,
    computed here by hand: J = Σ_{k<l} #(y_l > y_k), E = (N² - Σn²)/4, Var = (N²(2N+3) - Σn²(2n+3))/72."""
    a, b = np.array([0.3, 1.2, 0.5, 2.0, 2.0]), np.array([1.1, 2.0, 0.9, 3.0, 3.0])
    two = rank_trend(Design((0.0, 1.0), (5, 5)), np.concatenate([a, b])[None])
    reference = scipy_stats.mannwhitneyu(a, b, method="asymptotic", use_continuity=False)
    assert two.p_value[0] == pytest.approx(reference.pvalue) and two.sign[0] == 1
    groups = [np.array([0.5, 0.1, 0.9]), np.array([0.7, 1.3, 0.2, 1.1]), np.array([1.5, 0.8, 1.9])]
    j = sum((y > x).sum() for k, g in enumerate(groups) for h in groups[k + 1 :] for x in g for y in h)
    sizes = np.array([len(g) for g in groups])
    total = sizes.sum()
    mean = (total**2 - (sizes**2).sum()) / 4
    variance = (total**2 * (2 * total + 3) - (sizes**2 * (2 * sizes + 3)).sum()) / 72
    p_value = 2 * scipy_stats.norm.sf(abs(j - mean) / math.sqrt(variance))
    three = rank_trend(Design((0.0, 1.0, 2.0), tuple(sizes)), np.concatenate(groups)[None])
    assert three.p_value[0] == pytest.approx(p_value) and three.sign[0] == 1


def test_the_compute_multiplier_interpolates_and_never_extrapolates():
    """On ln R = 1 - 0.5 ln C over ln C in [0, 4]: reaching ln R = 0 needs ln C* = 2, so from ln C = 1 a
    multiplier e; a target below the line's end at 4 (ln R -1) lies beyond the ladder: None; a line that
    does not fall gives none."""
    log_compute = (0.0, 2.0, 4.0)
    assert slope_module.compute_multiplier(log_compute, 1.0, -0.5, 0.0, 1.0) == pytest.approx(math.e)
    assert slope_module.compute_multiplier(log_compute, 1.0, -0.5, -1.5, 1.0) is None
    assert slope_module.compute_multiplier(log_compute, 1.0, 0.0, 0.0, 1.0) is None


# the statistic's point: a constant compute multiplier is a slope of 0 ---------------------------


def test_a_constant_compute_multiplier_is_a_slope_of_exactly_zero():
    """Variant = baseline at c = 2 times the compute, on a power law loss - floor = A_i·C^-0.3 whose A_i
    differs by seed: θ = ln(A_i (cC)^-α) - ln(A_i C^-α) = -α ln c = -0.3 ln 2 in every pair at every
    rung, however close both sides come to the floor, so β = 0 (no spread: held flat by the no-spread
    rule) and the multiplier is c wherever c·C lies inside the ladder (every rung but the top)."""
    exponent, c = 0.3, 2.0
    theta = -exponent * math.log(c)
    ladder = build([[theta] * 3] * 4, exponent=exponent, baseline_noise=[0.8, 1.0, 1.3])
    verdict = trend(ladder)
    assert verdict.beta == pytest.approx(0.0, abs=1e-12)
    assert [r.theta for r in verdict.rungs] == pytest.approx([theta] * 4, abs=1e-12)
    assert verdict.word == HOLDS and verdict.test == NO_TEST and verdict.interval is None
    assert verdict.exponent.value == pytest.approx(exponent) and verdict.exponent.scaling
    assert [r.multiplier for r in verdict.rungs[:-1]] == pytest.approx([c] * 3)
    assert verdict.rungs[-1].multiplier is None  # 32 times the book's cell: beyond the ladder
    # the raw loss difference shrinks by 16^0.3 ≈ 2.3 up the ladder: a difference would read "shrinks"
    gaps = [np.mean([v.loss - b.loss for v, b in zip(r.variant, r.baseline, strict=True)]) for r in ladder.rungs]
    assert gaps[0] / gaps[-1] == pytest.approx(64**exponent)


# each word on ladders with a known truth ---------------------------------------------------------


@pytest.mark.parametrize(
    ("theta", "word", "ends"),
    [
        (line(-0.3, -0.1, 0.02), GROWS, (-1, -1)),  # better at every rung, more so with compute
        (line(0.2, 0.1, 0.02), GROWS, (0, 1)),  # worse, emerging: the bottom rung (θ 0) is undecided
        (line(-0.6, 0.08, 0.02), SHRINKS, (-1, -1)),  # better at every rung, less so
        (line(-0.3, 0.15, 0.02), REVERSES, (-1, 1)),  # better at the bottom, worse at the top
        (line(0.2, 0.001, 0.01), HOLDS, (1, 1)),  # worse by the same compute multiplier throughout
        (line(0.0, 0.0, 0.3), UNDECIDED, (0, 0)),  # too noisy to say anything
    ],
)
def test_each_word_on_a_ladder_built_with_its_truth(theta, word, ends):
    verdict = trend(build(theta))
    assert verdict.word == word, verdict.reason
    assert (verdict.rungs[0].decided, verdict.rungs[-1].decided) == ends
    assert verdict.test == "OLS slope, per-rung variance"
    if word in (GROWS, SHRINKS, REVERSES):
        assert verdict.p_value < ALPHA and not (verdict.interval[0] <= 0 <= verdict.interval[1])
    if word == HOLDS:
        assert verdict.flat_interval[0] > -DELTA and verdict.flat_interval[1] < DELTA


def test_a_rejected_slope_with_neither_end_decided_is_undecided():
    """θ from -0.04 to +0.08 on a line, each rung too noisy to be decided on three pairs but the twelve
    together pinning the slope: the effect changes, whether its magnitude grows cannot be told."""
    theta = line(0.0, 0.02, 0.04)
    verdict = trend(build(theta))
    assert verdict.p_value < ALPHA
    assert all(r.decided == 0 for r in verdict.rungs[::3])
    assert verdict.word == UNDECIDED and "end rungs do not tell" in verdict.reason


def test_the_slope_and_the_end_rungs_disagreeing_is_undecided():
    """A rejected slope whose end rungs' means move against it (a curve no line describes) gets no word."""
    theta = [list(m + 0.01 * PATTERN) for m in (-0.50, -0.20, 0.80, -0.52)]
    verdict = trend(build(theta))
    assert verdict.p_value < ALPHA and verdict.beta > 0
    assert verdict.word == UNDECIDED


def test_a_baseline_that_stops_improving_is_not_scaling():
    """A baseline whose reducible loss stays put up the ladder (exponent 0, seed noise around it) gives
    no trend word, even where θ's slope is clear; its exponent's interval holds 0."""
    noise = [0.9, 1.0, 1.1]
    verdict = trend(build(line(-0.2, -0.1, 0.02), exponent=0.0, baseline_noise=noise))
    assert verdict.word == NOT_SCALING and not verdict.exponent.scaling
    assert verdict.exponent.interval[0] < 0 < verdict.exponent.interval[1]
    assert all(r.multiplier is None for r in verdict.rungs)
    rising = trend(build(line(-0.2, -0.1, 0.02), exponent=-0.2, baseline_noise=noise))
    assert rising.word == NOT_SCALING and rising.exponent.value < 0
    assert trend(build(line(-0.2, -0.1, 0.02), exponent=0.3, baseline_noise=noise)).word == GROWS


def test_failed_seeds_count_and_send_the_ladder_to_the_rank_trend():
    """A diverged seed counts at the worse of the trivial loss and every finished seed of its rung
    (here the trivial 3.42); a seed that did not learn at its own loss; with either anywhere the slope's
    direction is the Jonckheere-Terpstra test's, and the ladder is never held flat."""
    statuses = {(3, "variant", 2): DIVERGED, (1, "baseline", 0): DID_NOT_LEARN}
    ladder = build(line(0.2, 0.0005, 0.005), statuses=statuses)
    variant, _ = ladder.rungs[3].losses()
    assert variant[2] == 3.42
    verdict = trend(ladder)
    assert verdict.test == JONCKHEERE and verdict.rank_based and verdict.word != HOLDS
    assert verdict.p_flat is None and verdict.describe().startswith(f"{verdict.word} (Jonckheere-Terpstra)")
    # θ rising with the rung in every pair: the rank trend rejects, but on three pairs the signed-rank
    # test cannot decide an end rung (its smallest two-sided p is 0.25), so the magnitude's trend is not told
    grows = trend(build(line(0.1, 0.1, 0.02), statuses={(0, "baseline", 1): DID_NOT_LEARN}))
    assert grows.rank_based and grows.p_value < ALPHA and grows.rungs[-1].decided == 0
    assert grows.word == UNDECIDED


def test_a_rung_with_fewer_than_two_pairs_is_undecided_without_a_test():
    ladder = build(line(-0.2, -0.1, 0.02))
    top = ladder.rungs[-1]
    short = Rung(top.name, top.compute, top.floor, top.trivial, top.variant[:1], top.baseline)
    verdict = trend(Ladder((*ladder.rungs[:-1], short)))
    assert verdict.word == UNDECIDED and verdict.test == NO_TEST and "fewer than two seed pairs" in verdict.reason
    assert verdict.rungs[-1].pairs == 1


def test_the_one_line_rendering():
    verdict = trend(build(line(-0.3, -0.1, 0.02)))
    low, high = verdict.interval
    assert verdict.describe() == f"grows: slope {verdict.beta:+.2g} [{low:+.2g}, {high:+.2g}] per doubling"


def test_invalid_inputs_are_refused():
    with pytest.raises(ValueError, match="status"):
        SeedLoss(0, 2.0, "exploded")
    with pytest.raises(ValueError, match="loss"):
        SeedLoss(0, 2.0, DIVERGED)
    ladder = build(line(0.0, 0.0, 0.1))
    with pytest.raises(ValueError, match="increasing"):
        Ladder(ladder.rungs[::-1])


# the rule's error rates, simulated small ---------------------------------------------------------

#: ladders per simulated scenario: the binomial SE of a rate near α is √(α(1-α)/REPS) ≈ 0.0049
REPS = 2000


def binomial_bound(rate: float, reps: int, sds: float = 3.0) -> float:
    """A rate plus ``sds`` binomial standard errors: where an observed rate may lie by chance."""
    return rate + sds * math.sqrt(rate * (1 - rate) / reps)


def simulate_theta(slope: float, sds: tuple[float, ...], reps: int, seed: int, intercept: float = 0.1) -> np.ndarray:
    """``reps`` rows of per-pair θ on the planned design: a line in doublings plus normal noise of each
    rung's SD."""
    rng = np.random.default_rng(seed)
    x = np.repeat(np.log2(SCALES), 3)
    return intercept + slope * x + rng.normal(0.0, np.repeat(sds, 3), (reps, 12))


def test_under_a_null_trend_the_slope_test_has_its_level_and_false_words_stay_below_it():
    """True β = 0 at equal noise, and at a top rung three times noisier than the rest: the slope test
    rejects in α of ladders within binomial error (its level, which a wrong df or variance would move),
    and grows, shrinks or reverses come out no more often."""
    for seed, sds in ((3, (0.1,) * 4), (4, (0.1, 0.1, 0.1, 0.3))):
        rows = analyse_rows(DESIGN, simulate_theta(0.0, sds, REPS, seed), np.zeros(REPS, dtype=bool))
        rejects = rows.rejects.mean()
        assert abs(rejects - ALPHA) < 3.5 * math.sqrt(ALPHA * (1 - ALPHA) / REPS), (sds, rejects)
        false = np.isin(rows.words, (GROWS, SHRINKS, REVERSES)).mean()
        assert false <= binomial_bound(ALPHA, REPS), (sds, false)


def test_a_pooled_variance_would_miss_its_level_where_the_top_rung_is_noisier():
    """Why the slope's variance is per rung: with the top rung three times noisier, the pooled OLS test
    rejects a true slope of 0 well above α."""
    theta = simulate_theta(0.0, (0.1, 0.1, 0.1, 0.3), REPS, 5)
    fit = fit_slope(DESIGN, theta, POOLED)
    p_value = 2 * scipy_stats.t.sf(np.abs(fit.slope) / fit.standard_error, fit.dof)
    assert (p_value < ALPHA).mean() > binomial_bound(ALPHA, REPS)


def test_at_a_slope_of_one_margin_holds_stays_below_alpha_and_power_at_two():
    """True β = δ at a noise where TOST can show flatness (SE of β about δ/3): holds in at most α of
    ladders; at β = 0 it is shown in most, and at 2δ the slope test finds the trend in most."""
    sds = (0.04,) * 4
    at_margin = analyse_rows(DESIGN, simulate_theta(DELTA, sds, REPS, 6), np.zeros(REPS, dtype=bool))
    assert (at_margin.words == HOLDS).mean() <= binomial_bound(ALPHA, REPS)
    at_zero = analyse_rows(DESIGN, simulate_theta(0.0, sds, REPS, 7), np.zeros(REPS, dtype=bool))
    assert (at_zero.words == HOLDS).mean() > 0.5
    at_two = analyse_rows(DESIGN, simulate_theta(2 * DELTA, sds, REPS, 8), np.zeros(REPS, dtype=bool))
    assert at_two.rejects.mean() > 0.5


def test_a_bimodal_null_keeps_false_trends_near_alpha():
    """Seeds that fail (the pair's θ far off, either way, with chance 0.15 per pair) under a null trend,
    decided by the rank trend: grows, shrinks or reverses in at most α within binomial error."""
    reps = 300
    rng = np.random.default_rng(9)
    theta = simulate_theta(0.0, (0.1,) * 4, reps, 10)
    failed = rng.random(theta.shape) < 0.15
    theta = np.where(failed, rng.choice([-2.0, 2.0], theta.shape), theta)
    rows = analyse_rows(DESIGN, theta, np.ones(reps, dtype=bool))
    assert not (rows.words == HOLDS).any()
    assert np.isin(rows.words, (GROWS, SHRINKS, REVERSES)).mean() <= binomial_bound(ALPHA, reps)
    assert rows.rejects.mean() <= binomial_bound(ALPHA, reps)


def test_where_seeds_failed_the_baseline_scales_only_if_the_rank_trend_finds_its_loss_falling():
    """A rank-based ladder's gate is the rank trend test of the baseline's seeds: a baseline falling by
    0.3 per ln compute in every seed scales; one falling by 0.005, its seed spread far larger than the
    fall, leans the right way but is not shown to fall, so the ladder is not scaling."""
    statuses = {(1, "variant", 0): DID_NOT_LEARN}
    noise = [0.9, 1.0, 1.1]
    falling = trend(build(line(-0.3, -0.1, 0.02), statuses=statuses, baseline_noise=noise))
    assert falling.rank_based and falling.exponent.scaling
    barely = trend(build(line(-0.3, -0.1, 0.02), exponent=0.005, statuses=statuses, baseline_noise=noise))
    assert barely.exponent.value > 0 and not barely.exponent.scaling and barely.word == NOT_SCALING
