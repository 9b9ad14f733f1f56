"""The verdict of one question: is a variant better than, worse than, or equivalent to its baseline?

**One confirmatory question per task x variant** (x level of a ``within:`` axis, the training budget
always): the task's headline metric, variant minus baseline, over the training seeds (paired by seed
when both sides have the same seeds, Welch otherwise). Secondary metrics are described and decide
nothing.

**Error rates are controlled per question**, not over a family of a matrix's comparisons (Holm) or as
a false discovery rate. The book is a catalogue of separate questions that a reader looks up one at
a time ("is RMSNorm worse than LayerNorm for translation?"); a family across a matrix made a verdict
depend on which other variants happened to share the matrix file, so the same cells got different
verdicts in different matrices. Per question, a verdict depends only on the cells it compares: the
same cells give the same verdict in every matrix. What a reader may not do is count verdicts across
the book as if none could be false: each has its stated error rate, no more and no less.

**The estimand is the typical seed.** A verdict says how the variant's seeds typically compare with
the baseline's: the difference of the bulk of the seeds, whose rank-based reading is the probability
of improvement P(better), the chance that a variant seed beats a baseline seed. It is not the mean
over an unbounded tail: no test on 3-9 seeds can bound its error for the mean when a rare failure
mode may appear in none of the seeds (no nontrivial test of a mean is valid over every distribution
with a finite mean; Bahadur & Savage 1956), while seeds that visibly fail go to the rank test below
and every seed is shown in the tables.

**Four verdicts**, at the per-look level α_k (below):

- ``better`` / ``worse``: the two-sided difference test rejects zero (p < α_k, the (1 - α_k)
  interval excludes zero) *and* the typical seed agrees: the point estimate of P(better)
  (:func:`prob_improvement`, over all seed pairs, ties half) lies strictly on the same side of 0.5
  as the difference. The direction follows the metric's ``higher_is_better``. Where the t test
  rejects but P(better) does not agree (a few seeds far ahead carrying the mean while most seeds
  are behind, or the reverse), the verdict is ``undecided`` and the decision records it
  (``typical_disagrees``): the t test found a difference that the typical seed does not show.
  Simulated on the book's rounds (``benchmarks/statistics/verdict_error_rates.py``, section (g)): a variant
  better by δ in most seeds whose rare bad seed pulls the mean difference to 0 is called better
  in up to 16% of questions, false for the mean and true for the typical seed, while the wrong
  direction (worse) stays below 0.5%; where the typical seed is no different (a median difference
  of 0 with the same tails) better or worse stays below 3.4%. The rates hold while the bad seeds
  are a minority of up to about a fifth; where a third or more train badly the variant is bimodal,
  and three seeds that happen to be all bad look like a variant worse in every seed to any test.
- ``equivalent``: two one-sided tests (TOST) at α_k show the difference lies within ± the margin:
  the (1 - 2α_k) interval lies inside (-margin, +margin). If both a difference and equivalence are
  shown (a real difference smaller than the margin) the verdict is ``equivalent``, since the
  difference is below what matters, and the decision records that the difference excluded zero
  (``excludes_zero``).
- ``undecided``: neither. Not "no difference": the data cannot tell.

**Seeds in rounds**: a matrix may train its seeds in rounds (``seeds: {min: 3, max: 9, step: 3}``:
looks at n = 3, 6, 9; the last look is always ``max``); a question stops at the first look that
decides it. Error control over the looks splits each α equally over the K planned looks (Bonferroni
over looks, :class:`Looks`): valid under any dependence between the looks, simple to state, and a look
at an unplanned n (a missing cell) still uses α/K. α = 0.05 for a false better/worse (two-sided) and
α = 0.05 for a false equivalent; a fixed seed list is K = 1.

**Futility**: a t-tested question also stops, undecided, when more seeds are unlikely to decide it:
when its *conditional power*, the chance that the last planned look decides it (a difference or
equivalence) were the current estimate the truth (the current trend), is below
:data:`FUTILITY` (5%), as group-sequential trials stop for futility. Stopping never adds a
verdict, only removes later chances to give one, so the error rates above hold as they are (a
*non-binding* futility rule); what it costs is some power, and what it saves is the seeds of
questions whose noise is many margins wide (``benchmarks/statistics/verdict_error_rates.py`` measures both).
A rank-based question has no such projection; it stops only where no data could decide it at the last
planned look (:func:`rank_futile`: a signed-rank test on 6 pairs gives p ≥ 0.031, more than the 0.025
each of two looks spends), so its verdict stays undecided whether or not more seeds are added.

**Failed runs**: when any seed of either side did not learn or diverged (counted at the trivial
baseline), a t test's normal model is wrong: a side that mixes them is bimodal, and a side whose
seeds all failed against one that learned is a difference no normal model describes. The caller
then passes ``rank_based=True`` and the decision uses a rank test valid for any distribution: the
exact Wilcoxon signed-rank test on seed-matched pairs, else the exact Mann-Whitney U test, at α_k,
both exact given the ties (the seeds that failed tie at one value). Whether a seed failed does not
depend on which side it is on, so swapping the sides (the rank tests' null arrangements) keeps a
question rank-based, and both the rank test and the t test on questions without a failed seed keep
their level (``ranks.any_failed``). A rank test has no equivalence counterpart here, so such a
question is better, worse or undecided, never equivalent. (At α_k = 0.05/3 no signed-rank test on
3 or 6 pairs can decide: their smallest p-values are 0.25 and 0.031; a paired rank-based question is
decided at 9 pairs, or 3 against 3 seeds never, 6 against 6 can; a side whose seeds all failed
against one that learned is thus undecided until enough seeds.) Simulated with identical sides
whose seeds fail with probability 0.2 to 0.6, better or worse comes out in at most 2.6% of
questions, against up to 4.7% where only a side that mixes goes to the rank test.

**No spread**: with fewer than two seeds on a side (two pairs when paired) there is no test and the
question is undecided. With two or more and no spread at all (every paired difference the same, or
both sides constant), the t statistic is undefined: if that constant difference is within the
margin (identical values on both sides, e.g. BLEU 100 for every seed of both) the question is
``equivalent`` (test ``none``); otherwise ``undecided``, since a constant step between quantized
values (an accuracy over a fixed evaluation set) is no proof that seeds do not vary, and better or
worse needs a test.

Beside the mean difference every decision reports the **probability of improvement**, P(a variant
seed beats a baseline seed) over all seed pairs with ties counting half (rliable's; its point
estimate is the typical seed's reading above), with a 95% percentile bootstrap interval
(``scipy.stats.bootstrap``, fixed random state), and which test decided.

The tests are written over numpy arrays (:func:`paired_moments`, :func:`welch_moments`,
:func:`t_tests`, :func:`t_verdicts`, :func:`prob_improvement`, and the rank tests of :mod:`.ranks`)
so that ``benchmarks/statistics/verdict_error_rates.py`` simulates this very code on many comparisons at once;
:func:`decide` calls them with one. The rule and its simulated error rates are written up in
docs/decisions/verdict-rule.md and results/verdict_error_rates.md.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from ..prereg import ALPHA as ALPHA  # the rule's constants, fixed with the analysis plan
from ..prereg import FUTILITY as FUTILITY
from ..prereg import RULE_VERSION as RULE_VERSION
from ..prereg import smallest_rank_p
from .ranks import RankTests, rank_sum_tests, signed_rank_tests
from .stats import NO_SPREAD, bootstrap_interval

BETTER, WORSE, EQUIVALENT, UNDECIDED = "better", "worse", "equivalent", "undecided"
VERDICTS = (BETTER, WORSE, EQUIVALENT, UNDECIDED)
PAIRED_T, WELCH_T, SIGNED_RANK, RANK_SUM, NO_TEST = (
    "paired t",
    "Welch t",
    "Wilcoxon signed-rank",
    "Mann-Whitney U",
    "none",
)

#: the level of the interval of the probability of improvement (descriptive: it decides nothing)
PROB_LEVEL = 0.95
#: bootstrap resamples of that interval, and the fixed random state that makes it reproducible
BOOTSTRAP_RESAMPLES = 4999
BOOTSTRAP_SEED = 0
#: the two forms of a better or worse verdict (:attr:`Decision.beyond_margin`), worded here once for every
#: report: the decisive interval's end nearer zero lies beyond ± the margin, or inside it
BEYOND_MARGIN, WITHIN_MARGIN = "by more than the margin", "possibly by less than the margin"


@dataclass(frozen=True)
class Looks:
    """The planned looks of a sequential comparison: the seed counts at which the question is decided
    if it can be, and the error rate each look may spend.

    Each of the K looks spends α/K (Bonferroni over looks): the chance of a false verdict at any of
    them is at most K · α/K = α whatever the dependence between looks, and stopping at a decided look
    only removes later chances to err. A look at a size that was not planned (a missing cell) spends
    α/K too."""

    sizes: tuple[int, ...]
    alpha: float = ALPHA
    #: stop for futility below this conditional power (0: never; see the module's docstring)
    futility: float = FUTILITY

    def __post_init__(self) -> None:
        if not self.sizes or any(n < 1 for n in self.sizes) or list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError(f"Looks: sizes={self.sizes} must be increasing seed counts of at least 1, e.g. (3, 6, 9)")
        if not 0 < self.alpha < 1:
            raise ValueError(f"Looks: alpha={self.alpha} must lie between 0 and 1, e.g. 0.05")
        if not 0 <= self.futility < 1:
            raise ValueError(
                f"Looks: futility={self.futility} must lie in [0, 1), e.g. 0.05 (0 never stops for futility)"
            )

    @classmethod
    def plan(cls, minimum: int, maximum: int, step: int, alpha: float = ALPHA, futility: float = FUTILITY) -> Looks:
        """The looks of ``seeds: {min, max, step}``: min, min + step, ..., and always max (as
        ``matrixfile.SeedPlan.sizes``): ``plan(3, 9, 3)`` looks at 3, 6 and 9 seeds, ``plan(3, 8, 3)`` at 3, 6, 8;
        ``futility`` 0 turns the futility stop off."""
        if not 1 <= minimum <= maximum or step < 1:
            raise ValueError(
                f"Looks.plan: min={minimum}, max={maximum}, step={step} needs 1 <= min <= max and step >= 1"
            )
        return cls((*range(minimum, maximum, step), maximum), alpha, futility)

    @classmethod
    def fixed(cls, n: int, alpha: float = ALPHA) -> Looks:
        """A fixed list of ``n`` seeds: one look, the whole α."""
        return cls((n,), alpha)

    @property
    def per_look_alpha(self) -> float:
        """α/K: the error rate each look spends (for a false better/worse, and for a false equivalent)."""
        return self.alpha / len(self.sizes)

    def is_last(self, n: int) -> bool:
        """Whether ``n`` seeds reach the last planned look (no more seeds will be added). A plan of one
        look (a fixed seed list) has no later one, even where a failed cell leaves it short of its size."""
        return len(self.sizes) == 1 or n >= self.sizes[-1]

    def next_size(self, n: int) -> int | None:
        """The next planned seed count above ``n``; None after the last."""
        return next((size for size in self.sizes if size > n), None)


# the tests, over arrays: one comparison per row ----------------------------------------------------


@dataclass(frozen=True)
class Moments:
    """What the t tests need of many comparisons (arrays of one shape): the mean difference, its
    standard error and degrees of freedom, and whether the values vary at all (``spread``: False
    where the standard error is rounding error, or there are fewer than two values to measure it)."""

    mean: np.ndarray
    standard_error: np.ndarray
    dof: np.ndarray
    spread: np.ndarray
    #: the comparisons have two seeds or pairs at least (a spread could be measured)
    measurable: np.ndarray


def _no_spread(standard_error: np.ndarray, *values: np.ndarray) -> np.ndarray:
    """As ``stats._no_spread``: a spread below ``NO_SPREAD`` of the values' magnitude is rounding error."""
    scale = np.max([np.max(np.abs(v), axis=-1) for v in values], axis=0)
    return standard_error <= NO_SPREAD * scale


def paired_moments(a: np.ndarray, b: np.ndarray) -> Moments:
    """Paired t moments of the seed-matched differences a - b (rows of shape (..., n)): their mean,
    std/√n and n - 1 degrees of freedom. Whether they vary is judged against the values' magnitude
    (0.7 - 0.5 and 0.8 - 0.6 differ by rounding error alone)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    d = a - b
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    std = d.std(axis=-1, ddof=1) if n > 1 else np.zeros_like(mean)
    standard_error = std / math.sqrt(n)
    dof = np.full_like(mean, max(n - 1, 1))
    measurable = np.full(mean.shape, n >= 2)
    return Moments(mean, standard_error, dof, measurable & ~_no_spread(standard_error, a, b), measurable)


def welch_moments(a: np.ndarray, b: np.ndarray) -> Moments:
    """Welch t moments of mean(a) - mean(b) (rows of shapes (..., n_a) and (..., n_b)): the standard
    error √(s_a²/n_a + s_b²/n_b) and Welch–Satterthwaite's degrees of freedom."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n_a, n_b = a.shape[-1], b.shape[-1]
    mean = a.mean(axis=-1) - b.mean(axis=-1)
    measurable = np.full(mean.shape, n_a >= 2 and n_b >= 2)
    if not (n_a >= 2 and n_b >= 2):
        zeros = np.zeros_like(mean)
        return Moments(mean, zeros, np.ones_like(mean), measurable, measurable)
    var_a, var_b = a.var(axis=-1, ddof=1) / n_a, b.var(axis=-1, ddof=1) / n_b  # squared standard errors
    standard_error = np.sqrt(var_a + var_b)
    spread = ~_no_spread(standard_error, a, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        dof = (var_a + var_b) ** 2 / (var_a**2 / (n_a - 1) + var_b**2 / (n_b - 1))
    return Moments(mean, standard_error, np.where(spread, dof, 1.0), spread, measurable)


@dataclass(frozen=True)
class TTests:
    """The difference and equivalence t tests of many comparisons (arrays of one shape; NaN where
    there is no spread): the two-sided p-value and (1 - α) interval of the difference, and TOST's
    p-value and (1 - 2α) interval."""

    p_value: np.ndarray
    p_equivalence: np.ndarray
    low: np.ndarray
    high: np.ndarray
    equivalence_low: np.ndarray
    equivalence_high: np.ndarray


def t_tests(moments: Moments, margin: float, alpha: float) -> TTests:
    """Both t tests at level ``alpha`` for each comparison of ``moments``.

    TOST is written here with scipy's t distribution (statsmodels, which has it, is not a dependency
    and would pull in pandas and patsy for one line): p = max(P(T > (d + m)/se), P(T < (d - m)/se)),
    below α exactly when the (1 - 2α) interval d ± t(1 - α)·se lies inside (-m, m)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.where(moments.spread, moments.standard_error, np.nan)
        t = scipy_stats.t
        p_value = 2 * t.sf(np.abs(moments.mean) / se, moments.dof)
        p_equivalence = np.maximum(
            t.sf((moments.mean + margin) / se, moments.dof), t.cdf((moments.mean - margin) / se, moments.dof)
        )
        half = t.ppf(1 - alpha / 2, moments.dof) * se
        equivalence_half = t.ppf(1 - alpha, moments.dof) * se
    return TTests(
        p_value,
        p_equivalence,
        moments.mean - half,
        moments.mean + half,
        moments.mean - equivalence_half,
        moments.mean + equivalence_half,
    )


def _direction(sign: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """better where the variant's values are larger (``sign`` > 0) and higher is better, or smaller
    and lower is better; worse otherwise."""
    return np.where((sign > 0) == higher_is_better, BETTER, WORSE)


def typical_agrees(mean: np.ndarray, prob_better: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """Whether the typical seed leans the way the mean difference does: P(better) strictly above 0.5
    where the mean is in the better direction, strictly below where it is in the worse one (at 0.5,
    or a mean of 0, it leans neither way, so it does not agree)."""
    mean, prob_better = np.asarray(mean, dtype=float), np.asarray(prob_better, dtype=float)
    better = (mean > 0) == higher_is_better
    return (mean != 0) & np.where(better, prob_better > 0.5, prob_better < 0.5)


def t_verdicts(
    moments: Moments,
    tests: TTests,
    margin: float,
    alpha: float,
    higher_is_better: bool,
    prob_better: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """The verdict of each comparison by the t tests, and whether its difference test rejected zero.

    Equivalent where TOST rejects (even where the difference test rejects too: a real difference
    below the margin); else better/worse where the difference test rejects and the typical seed
    agrees (``prob_better``, each comparison's :func:`prob_improvement`, on the same side of 0.5:
    :func:`typical_agrees`); else undecided. ``prob_better`` None asks the t test alone, which the
    error-rate simulation shows beside the rule. Without spread (two values or more on each side):
    equivalent where the constant difference lies within the margin, undecided otherwise (see the
    module's docstring)."""
    rejects = moments.spread & (tests.p_value < alpha)
    equivalent = moments.spread & (tests.p_equivalence < alpha)
    constant_within = moments.measurable & ~moments.spread & (np.abs(moments.mean) < margin)
    agrees = True if prob_better is None else typical_agrees(moments.mean, prob_better, higher_is_better)
    verdicts = np.where(
        equivalent | constant_within,
        EQUIVALENT,
        np.where(rejects & agrees, _direction(moments.mean, higher_is_better), UNDECIDED),
    )
    return verdicts, rejects


def conditional_power(moments: Moments, n: int, last: int, margin: float, alpha: float) -> np.ndarray:
    """The chance that the look at ``last`` seeds (pairs, or the smaller side) decides each comparison of
    ``moments``, now at ``n`` seeds, were its current mean difference the truth and its spread known
    (conditional power under the current trend; NaN without spread).

    The ``last - n`` seeds to come are averaged in: the final mean is normal around today's with
    variance se²·n·(last - n)/last², and the final look decides where that mean lies beyond the
    difference test's bound t(1 - α/2)·se_last, or within the equivalence bound margin - t(1 - α)·se_last,
    with se_last = se·√(n/last) and the degrees of freedom grown with the seeds. Written here because
    the closed form is four normal CDFs; the tests check it against a simulation of the seeds to come."""
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.where(moments.spread, moments.standard_error, np.nan)
        se_last = se * math.sqrt(n / last)
        dof_last = moments.dof * (last - 1) / max(n - 1, 1)
        spread = se * math.sqrt(n * (last - n)) / last
        difference_bound = scipy_stats.t.ppf(1 - alpha / 2, dof_last) * se_last
        equivalence_bound = np.clip(margin - scipy_stats.t.ppf(1 - alpha, dof_last) * se_last, 0.0, None)
        mean, cdf = moments.mean, scipy_stats.norm.cdf
        undecided = (cdf((difference_bound - mean) / spread) - cdf((equivalence_bound - mean) / spread)) + (
            cdf((-equivalence_bound - mean) / spread) - cdf((-difference_bound - mean) / spread)
        )
        power = np.where(equivalence_bound >= difference_bound, 1.0, 1.0 - undecided)
    return np.where(moments.spread, power, np.nan)


def futile(moments: Moments, verdicts: np.ndarray, n: int, looks: Looks, margin: float) -> np.ndarray:
    """Whether each comparison stops for futility at this look (``n`` seeds): undecided by the t tests,
    a later look planned, and its :func:`conditional_power` below ``looks.futility``."""
    if looks.futility <= 0 or looks.is_last(n) or n < 2:
        return np.zeros(np.shape(verdicts), dtype=bool)
    power = conditional_power(moments, n, looks.sizes[-1], margin, looks.per_look_alpha)
    return (np.asarray(verdicts) == UNDECIDED) & moments.spread & (power < looks.futility)


def rank_futile(looks: Looks, n: int, paired: bool) -> bool:
    """Whether a rank-based question at ``n`` seeds (pairs, or the smaller side's) stops for futility: a
    later look is planned, yet at the last one the exact test's smallest p-value
    (``prereg.smallest_rank_p`` on the last look's seeds) is not below α_k, so no seeds to come can
    decide it. Exact, whatever the data: its conditional power is 0. Off where ``looks.futility`` is 0."""
    if looks.futility <= 0 or looks.is_last(n):
        return False
    last = looks.sizes[-1]
    return smallest_rank_p(last, None if paired else last) >= looks.per_look_alpha


def rank_verdicts(tests: RankTests, alpha: float, higher_is_better: bool) -> np.ndarray:
    """Better/worse where the rank test rejects at ``alpha``, else undecided (never equivalent)."""
    return np.where(tests.p_value < alpha, _direction(tests.sign, higher_is_better), UNDECIDED)


def prob_improvement(variant: np.ndarray, baseline: np.ndarray, higher_is_better: bool, axis: int = -1) -> np.ndarray:
    """P(a variant seed beats a baseline seed) over all pairs of their seeds, ties counting half
    (rliable's probability of improvement): the Mann-Whitney U of the better side over n_a·n_b."""
    x = np.moveaxis(np.asarray(variant, dtype=float), axis, -1)[..., :, None]
    y = np.moveaxis(np.asarray(baseline, dtype=float), axis, -1)[..., None, :]
    wins = (x > y) if higher_is_better else (x < y)
    return (wins + 0.5 * (x == y)).mean(axis=(-2, -1))


def prob_improvement_interval(
    variant: np.ndarray, baseline: np.ndarray, higher_is_better: bool
) -> tuple[float, float] | None:
    """The 95% percentile bootstrap interval of :func:`prob_improvement`, each side resampled on its
    own (``scipy.stats.bootstrap``, fixed random state); None with fewer than two seeds on a side.
    Percentile rather than BCa: BCa is undefined when every resample gives the same value (P = 0 or 1)."""
    if len(variant) < 2 or len(baseline) < 2:
        return None

    def statistic(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
        return prob_improvement(x, y, higher_is_better, axis)

    return bootstrap_interval(variant, baseline, statistic, PROB_LEVEL, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED)


# one question ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """The answer to one question (see the module's docstring) and everything that decided it.

    ``interval`` is the (1 - α_k) interval of the mean difference (never cut to the metric's range),
    ``equivalence_interval`` TOST's (1 - 2α_k) one (None for a rank-based decision, which has no
    equivalence test); ``alpha`` is the per-look α_k = α/K; ``n`` the number of pairs, or the two
    sides' seed counts (variant, baseline) when unpaired. ``excludes_zero``: the difference test named
    in ``test`` rejected zero at α_k (also recorded when the verdict is equivalent).
    ``typical_disagrees``: the t test rejected zero but P(better) did not lie on the same side of 0.5,
    so the verdict is undecided (the t test found a difference that the typical seed does not show).
    ``final``: no more seeds will be added (decided, the last planned look reached, or ``futile``:
    undecided with a conditional power, ``conditional_power``, below the plan's futility bound)."""

    verdict: str
    test: str  # "paired t" | "Welch t" | "Wilcoxon signed-rank" | "Mann-Whitney U" | "none"
    difference: float  # mean(variant) - mean(baseline)
    interval: tuple[float, float] | None
    equivalence_interval: tuple[float, float] | None
    p_value: float | None
    p_equivalence: float | None
    margin: float
    alpha: float
    n: tuple[int, ...]
    excludes_zero: bool
    prob_improvement: float | None
    prob_improvement_interval: tuple[float, float] | None
    final: bool
    conditional_power: float | None = None
    futile: bool = False
    #: why a futile question stopped, as the summary says it (empty unless ``futile``)
    futility_note: str = ""
    typical_disagrees: bool = False

    @property
    def beyond_margin(self) -> bool | None:
        """Whether a better or worse verdict holds by more than the margin: True where its interval's end
        nearer zero lies beyond ± the margin (the difference test would also reject a difference of one
        margin in that direction), False where that end lies inside ± the margin (better, but possibly by
        less than what matters); None for any other verdict. A rank test has no interval of its own: its
        verdict is read from the t interval reported beside it, and is never called the larger form where
        that interval holds zero."""
        if self.verdict not in (BETTER, WORSE):
            return None
        if self.interval is None:
            return False
        low, high = self.interval
        return (self.difference > 0 and low > self.margin) or (self.difference < 0 and high < -self.margin)

    @property
    def form(self) -> str:
        """:data:`BEYOND_MARGIN` or :data:`WITHIN_MARGIN` for a better or worse verdict (see
        :attr:`beyond_margin`), "" for any other."""
        beyond = self.beyond_margin
        return "" if beyond is None else (BEYOND_MARGIN if beyond else WITHIN_MARGIN)

    def describe(self) -> str:
        """One line: ``worse by more than the margin (paired t, n=3, α/K=0.0167): +23.3 [+20.1, +26.5],
        margin ±0.07; P(better)=0.00 [0.00, 0.00]``, with what else decided it (a difference below the
        margin, no spread, more seeds to come)."""
        decimals = _decimals(self)
        interval = (
            "" if self.interval is None else f" [{self.interval[0]:+.{decimals}f}, {self.interval[1]:+.{decimals}f}]"
        )
        notes = []
        if self.verdict == EQUIVALENT and self.excludes_zero:
            notes.append("the difference excludes zero but lies within the margin")
        if self.typical_disagrees:
            notes.append("the t test found a difference that the typical seed does not show (P(better) disagrees)")
        if self.test == NO_TEST and self.verdict == EQUIVALENT:
            notes.append("no spread: the same difference in every seed, within the margin")
        elif self.test == NO_TEST:
            notes.append("no test: one seed, or no spread")
        if self.futile:
            projected = self.test in (PAIRED_T, WELCH_T)  # a t test's futility is a projection; a rank test's is exact
            notes.append(
                self.futility_note + (" (today's difference and spread taken as the truth)" if projected else "")
            )
        elif not self.final:
            notes.append("more seeds to come")
        prob = ""
        if self.prob_improvement is not None:
            prob = f"; P(better)={self.prob_improvement:.2f}"
            if self.prob_improvement_interval is not None:
                prob += f" [{self.prob_improvement_interval[0]:.2f}, {self.prob_improvement_interval[1]:.2f}]"
        sizes = "/".join(str(n) for n in self.n)
        verdict = f"{self.verdict} {self.form}" if self.form else self.verdict
        return (
            f"{verdict} ({self.test}, n={sizes}, α/K={self.alpha:.3g}): "
            f"{self.difference:+.{decimals}f}{interval}, margin ±{self.margin:g}{prob}"
            + "".join(f"; {note}" for note in notes)
        )


def _decimals(decision: Decision) -> int:
    """Decimals that show the interval's width (else the margin's) to two significant digits."""
    width = decision.interval[1] - decision.interval[0] if decision.interval else 0.0
    scale = width if math.isfinite(width) and width > 0 else decision.margin
    return max(0, 1 - math.floor(math.log10(scale)))


def _optional(value: float) -> float | None:
    return None if not math.isfinite(value) else float(value)


def decide(
    variant: Mapping[Hashable, float],
    baseline: Mapping[Hashable, float],
    *,
    margin: float,
    higher_is_better: bool,
    looks: Looks,
    rank_based: bool = False,
) -> Decision:
    """The verdict of ``variant`` against ``baseline`` (seed -> headline metric value) under the rule
    of this module: paired tests when both sides have the same seeds, else Welch / Mann-Whitney;
    ``rank_based`` (a seed of either side did not learn or diverged) decides by a rank test.

    The look is the number of pairs, or the smaller side's seed count when unpaired; its α is
    ``looks.per_look_alpha`` whatever that number is."""
    if not margin > 0:
        raise ValueError(f"decide: margin={margin} must be positive (the smallest difference that matters)")
    if not variant or not baseline:
        raise ValueError(
            f"decide: a side without seeds ({len(variant)} variant, {len(baseline)} baseline values); "
            "a question needs at least one seed on each side"
        )
    if not all(math.isfinite(v) for v in (*variant.values(), *baseline.values())):
        raise ValueError("decide: a value is not finite; count a diverged seed at stats.diverged_value first")
    paired = variant.keys() == baseline.keys()
    seeds = list(variant)
    a = np.array([variant[s] for s in seeds] if paired else list(variant.values()), dtype=float)
    b = np.array([baseline[s] for s in seeds] if paired else list(baseline.values()), dtype=float)
    alpha = looks.per_look_alpha
    n = (len(a),) if paired else (len(a), len(b))
    moments = paired_moments(a[None], b[None]) if paired else welch_moments(a[None], b[None])
    tests = t_tests(moments, margin, alpha)
    has_interval = bool(moments.spread[0])
    interval = (float(tests.low[0]), float(tests.high[0])) if has_interval else None
    look = n[0] if paired else min(n)  # the look this is: pairs, or the smaller side's seeds
    prob_better = float(prob_improvement(a, b, higher_is_better))
    disagrees = False
    if rank_based:
        ranks = signed_rank_tests(a[None] - b[None]) if paired else rank_sum_tests(a[None], b[None])
        verdict = str(rank_verdicts(ranks, alpha, higher_is_better)[0])
        test, p_value, p_equivalence, equivalence_interval = (
            SIGNED_RANK if paired else RANK_SUM,
            float(ranks.p_value[0]),
            None,
            None,
        )
        excludes_zero = p_value < alpha
        stop = verdict == UNDECIDED and rank_futile(looks, look, paired)
        power = 0.0 if stop else None
        last = looks.sizes[-1]
        on = f"{last} pairs" if paired else f"{last} against {last} seeds"
        note = f"stopped for futility: the {test} test on {on} cannot reach α {alpha:.3g}" if stop else ""
    else:
        verdicts, rejects = t_verdicts(moments, tests, margin, alpha, higher_is_better, np.array([prob_better]))
        verdict, excludes_zero = str(verdicts[0]), bool(rejects[0])
        disagrees = excludes_zero and verdict == UNDECIDED
        stop = bool(futile(moments, verdicts, look, looks, margin)[0])
        power = None
        if verdict == UNDECIDED and has_interval and not looks.is_last(look) and look >= 2:
            power = float(conditional_power(moments, look, looks.sizes[-1], margin, alpha)[0])
        note = f"stopped for futility: conditional power {power:.0%}" if stop else ""
        test = (PAIRED_T if paired else WELCH_T) if has_interval else NO_TEST
        p_value, p_equivalence = _optional(tests.p_value[0]), _optional(tests.p_equivalence[0])
        equivalence_interval = (
            (float(tests.equivalence_low[0]), float(tests.equivalence_high[0])) if has_interval else None
        )
    return Decision(
        verdict=verdict,
        test=test,
        difference=float(a.mean() - b.mean()),
        interval=interval,
        equivalence_interval=equivalence_interval,
        p_value=p_value,
        p_equivalence=p_equivalence,
        margin=margin,
        alpha=alpha,
        n=n,
        excludes_zero=excludes_zero,
        prob_improvement=prob_better,
        prob_improvement_interval=prob_improvement_interval(a, b, higher_is_better),
        final=verdict != UNDECIDED or looks.is_last(look) or stop,
        conditional_power=power,
        futile=stop,
        futility_note=note,
        typical_disagrees=disagrees,
    )
