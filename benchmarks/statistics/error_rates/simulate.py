"""The verdict rule as array functions over many simulated questions: the t and rank rules of
``blockbench.report.decide``, the sequential looks, the draws at known truth, and the rates they give
(sections (a) to (e))."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks.statistics.error_rates.noise import (
    ANALYSIS_RULE,
    CROSS_CHECK,
    FAIL_RATE,
    FUTILITY_BOUNDS,
    MULTIPLES,
    Noise,
)
from blockbench.report.decide import (
    UNDECIDED,
    VERDICTS,
    Looks,
    decide,
    futile,
    paired_moments,
    prob_improvement,
    rank_futile,
    rank_verdicts,
    t_tests,
    t_verdicts,
    welch_moments,
)
from blockbench.report.ranks import any_failed, rank_sum_tests, signed_rank_tests

# simulation -----------------------------------------------------------------------------------------

#: a rule: (variant values, baseline values) of the questions still open at a look -> their verdicts,
#: and which of the undecided ones stop there for futility
Rule = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def t_rule(noise: Noise, looks: Looks, paired: bool = True, typical: bool = True) -> Rule:
    """decide's t rule (paired t, or Welch on disjoint seeds) at the plan's per-look α, better or worse
    only where the typical seed agrees (P(better) over all seed pairs on the same side of 0.5), with its
    futility stop (``decide.futile``); ``typical`` False: the t test alone, shown beside the rule."""
    alpha, margin, higher_is_better = looks.per_look_alpha, noise.margin, noise.family.higher_is_better

    def rule(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        moments = paired_moments(a, b) if paired else welch_moments(a, b)
        prob = prob_improvement(a, b, higher_is_better) if typical else None
        verdicts = t_verdicts(moments, t_tests(moments, margin, alpha), margin, alpha, higher_is_better, prob)[0]
        return verdicts, futile(moments, verdicts, a.shape[-1], looks, margin)

    return rule


def rank_rule(noise: Noise, looks: Looks, paired: bool = True) -> Rule:
    """decide's rank_based rule: exact signed-rank on pairs, exact Mann-Whitney U on disjoint seeds,
    stopping where no planned look can decide (``decide.rank_futile``; never in the book's plans)."""

    def rule(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tests = signed_rank_tests(a - b) if paired else rank_sum_tests(a, b)
        verdicts = rank_verdicts(tests, looks.per_look_alpha, noise.family.higher_is_better)
        return verdicts, (verdicts == UNDECIDED) & rank_futile(looks, a.shape[-1], paired)

    return rule


#: flags the values of runs that did not learn (a side's row of seeds -> booleans)
Failed = Callable[[np.ndarray], np.ndarray]


def at_trivial(noise: Noise) -> Failed:
    """The simulation's failed runs: those at the trivial baseline, as :func:`draw` makes them."""
    return lambda values: values == noise.trivial


def mixes(failed: np.ndarray) -> np.ndarray:
    """Whether each side (rows of per-seed flags) mixes failed with learned seeds: section (g)'s other
    trigger, which leaves a side whose seeds all failed to the t test."""
    return failed.any(axis=-1) & ~failed.all(axis=-1)


def switching_rule(
    noise: Noise, looks: Looks, paired: bool = True, failed: Failed | None = None, only_mixed: bool = False
) -> Rule:
    """The analysis's rule: the rank rule for questions where any seed of either side did not learn
    (``ranks.any_failed``), the t rule otherwise. ``failed`` flags the runs that did not learn (default
    :func:`at_trivial`); ``only_mixed``: the rank rule only where a side mixes failed and learned seeds
    (:func:`mixes`), shown beside the rule in section (g)."""
    t, rank = t_rule(noise, looks, paired), rank_rule(noise, looks, paired)
    is_failed = failed or at_trivial(noise)

    def rule(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        fa, fb = is_failed(a), is_failed(b)
        failed = (mixes(fa) | mixes(fb)) if only_mixed else any_failed(fa, fb)
        (t_found, t_stop), (rank_found, rank_stop) = t(a, b), rank(a, b)
        return np.where(failed, rank_found, t_found), np.where(failed, rank_stop, t_stop)

    return rule


def sequential(a: np.ndarray, b: np.ndarray, looks: Looks, rule: Rule) -> tuple[np.ndarray, np.ndarray]:
    """Each question's verdict and the seeds it used: decided at the first look whose rule decides it,
    undecided where it stops for futility, else undecided at the last (``a``, ``b``: rows of
    ``looks.sizes[-1]`` seeds)."""
    verdicts = np.full(len(a), UNDECIDED, dtype=object)
    used = np.zeros(len(a), dtype=int)
    open_rows = np.arange(len(a))
    for size in looks.sizes:
        found, stop = rule(a[open_rows, :size], b[open_rows, :size])
        verdicts[open_rows], used[open_rows] = found, size
        open_rows = open_rows[(found == UNDECIDED) & ~stop]
    return verdicts, used


def draw(rng: np.random.Generator, noise: Noise, reps: int, seeds: int, multiple: float, fail_rate: float = 0.0):
    """``reps`` questions of ``seeds`` seeds: (variant, baseline) values, the variant better by
    ``multiple`` margins, each side's noise N(0, σ²/2); with ``fail_rate``, each seed of each side
    independently at the trivial baseline instead."""
    sign = 1.0 if noise.family.higher_is_better else -1.0
    side_sd = noise.sd / np.sqrt(2)
    baseline = noise.baseline_mean + rng.normal(0.0, side_sd, (reps, seeds))
    variant = noise.baseline_mean + sign * multiple * noise.margin + rng.normal(0.0, side_sd, (reps, seeds))
    if fail_rate:
        baseline[rng.random((reps, seeds)) < fail_rate] = noise.trivial
        variant[rng.random((reps, seeds)) < fail_rate] = noise.trivial
    return variant, baseline


@dataclass(frozen=True)
class Rates:
    """How often each verdict came out of ``reps`` simulated questions, and the mean seeds used."""

    shares: dict[str, float]
    mean_seeds: float
    reps: int

    @classmethod
    def of(cls, verdicts: np.ndarray, used: np.ndarray) -> Rates:
        return cls({v: float(np.mean(verdicts == v)) for v in VERDICTS}, float(used.mean()), len(verdicts))

    def share(self, *verdicts: str) -> float:
        return sum(self.shares[v] for v in verdicts)

    def error(self, *verdicts: str) -> float:
        """The Monte-Carlo standard error of :meth:`share`: √(p(1 - p)/reps)."""
        p = self.share(*verdicts)
        return float(np.sqrt(p * (1 - p) / self.reps))

    def text(self, *verdicts: str) -> str:
        return f"{self.share(*verdicts):.4f} ± {self.error(*verdicts):.4f}"


@dataclass(frozen=True)
class Simulated:
    """One family and plan: the power table's rates by multiple of the margin (the 0 row is the null),
    the rate at minus one margin, the bimodal null's by rule and pairing, and how many questions
    decide.decide decided again, and agreed on."""

    noise: Noise
    plan: str
    power: dict[float, Rates]
    minus_margin: Rates
    bimodal: dict[tuple[str, str], Rates]
    checked: int
    agreed: int


def decide_sequentially(
    a: np.ndarray,
    b: np.ndarray,
    noise: Noise,
    looks: Looks,
    paired: bool,
    rank: str,
    failed: Failed | None = None,
):
    """One question decided look by look through ``decide.decide`` itself: (verdict, seeds used).
    ``rank``: "t", "rank" or "switch" (rank_based where a seed failed, as the analysis decides);
    ``failed`` flags the runs that did not learn (default :func:`at_trivial`)."""
    is_failed = failed or at_trivial(noise)
    for size in looks.sizes:
        x, y = a[:size], b[:size]
        rank_based = rank == "rank" or (rank == "switch" and bool(any_failed(is_failed(x), is_failed(y))))
        decision = decide(
            dict(enumerate(x)),
            dict(enumerate(y)) if paired else {100 + i: v for i, v in enumerate(y)},
            margin=noise.margin,
            higher_is_better=noise.family.higher_is_better,
            looks=looks,
            rank_based=rank_based,
        )
        if decision.final:
            return decision.verdict, size
    return UNDECIDED, looks.sizes[-1]


def simulate(noise: Noise, plan: str, looks: Looks, reps: int, rng: np.random.Generator) -> Simulated:
    """Every scenario of one family and plan (see the module docstring)."""
    seeds = looks.sizes[-1]
    checked = agreed = 0

    def run(variant, baseline, rule: Rule, paired: bool, rank: str) -> Rates:
        nonlocal checked, agreed
        verdicts, used = sequential(variant, baseline, looks, rule)
        for row in range(min(CROSS_CHECK, len(variant))):
            again = decide_sequentially(variant[row], baseline[row], noise, looks, paired, rank)
            checked += 1
            agreed += again == (verdicts[row], used[row])
        return Rates.of(verdicts, used)

    power = {m: run(*draw(rng, noise, reps, seeds, m), t_rule(noise, looks), True, "t") for m in MULTIPLES}
    minus_margin = run(*draw(rng, noise, reps, seeds, -1.0), t_rule(noise, looks), True, "t")
    bimodal = {}
    for pairing, paired in (("paired", True), ("disjoint seeds", False)):
        sides = draw(rng, noise, reps, seeds, 0.0, FAIL_RATE)
        for name, make, rank in (
            ("rank test", rank_rule, "rank"),
            (ANALYSIS_RULE, switching_rule, "switch"),
            ("t test", t_rule, "t"),
        ):
            bimodal[pairing, name] = run(*sides, make(noise, looks, paired), paired, rank)
    return Simulated(noise, plan, power, minus_margin, bimodal, checked, agreed)


def futility_sweep(noise: Noise, reps: int, rng: np.random.Generator) -> dict[float, dict[float, Rates]]:
    """Section (e): the default rounds with each bound of :data:`FUTILITY_BOUNDS`, by true difference
    (the t rule; the same draws for every bound): what each bound saves in seeds and costs in decisions."""
    sides = {m: draw(rng, noise, reps, 9, m) for m in MULTIPLES}
    sweep = {}
    for bound in FUTILITY_BOUNDS:
        looks = Looks.plan(3, 9, 3, futility=bound)
        sweep[bound] = {m: Rates.of(*sequential(*sides[m], looks, t_rule(noise, looks))) for m in MULTIPLES}
    return sweep
