"""The trend verdict of a scale ladder: does a variant's effect hold, grow, shrink or reverse as compute
grows?

A ladder trains one question (a task x variant against its baseline) at rungs of growing training
compute, several seeds per side per rung, seeds paired by their number. Each rung keeps its own verdict
(:mod:`.decide`); this module gives the question one more, over the rungs (docs/decisions/trend-rule.md
states the rule, its margin and its simulated error rates).

**The statistic.** Per seed pair at rung k, θ = ln(loss_variant - floor) - ln(loss_baseline - floor):
the log ratio of the two sides' reducible loss, the floor being the task's irreducible loss (the LM's
grammar entropy, 0 where a task has none). Under a power law loss - floor = A·C^-α, a variant worth a
constant compute multiplier c has θ = -α·ln c at every rung, so θ does not shrink merely because both
sides near the floor (a difference of losses does). θ is regressed on x = log2 of the baseline's compute
at each rung (:mod:`.slope`: OLS over every pair, the slope's variance from each rung's own seeds), giving
the slope β per doubling of compute with its interval.

**The words**, at the question's level α (the caller's per-look α where seeds come in rounds):

- ``holds``: TOST shows |β| < :data:`DELTA` (the (1 - 2α) interval lies inside ± δ): the effect, as a
  compute multiplier, is the same at every rung within the margin, whatever its sign or size. It wins
  where the slope test rejects too (a real slope below what matters), as equivalence does in ``decide``.
- ``grows`` / ``shrinks``: the two-sided slope test rejects β = 0 at α, and the effect's magnitude |θ|
  moves with the slope: its sign is read from the top rung where θ's (1 - α) interval excludes 0, else
  the bottom rung's; ``grows`` where the slope moves θ away from 0 in that sign, ``shrinks`` toward it.
- ``reverses``: the slope test rejects, and the bottom and top rungs are both decided (intervals
  excluding 0) in opposite directions, the top in the slope's.
- ``undecided``: anything else, including a rejected slope whose end rungs are both undecided (the
  effect changes, but whether its magnitude grows cannot be told), or whose end rungs' means move
  against it (a curve no line describes).

Every word but ``holds`` needs the slope test to reject, so under β = 0 the ladder says grows, shrinks
or reverses in at most α of questions; a false ``holds`` at |β| = δ is at most α (TOST).

**Seeds that failed** count, as in the per-rung rule: a diverged seed at the worse of the trivial loss
and every finished seed of its rung (:func:`.stats.diverged_value`), a seed that did not learn at its
own loss. Where any seed of either side at any rung failed, θ is bimodal and the slope test's normal
model is wrong: the slope's direction is then tested by the Jonckheere-Terpstra trend test
(:func:`.slope.rank_trend`) and the end rungs by the exact signed-rank test, and ``holds`` is never
given (a rank test has no equivalence counterpart).

**Baseline scaling.** The baseline's exponent α_B is minus the slope of ln(loss - floor) on ln compute
over its seeds (same fit). Where that slope's (1 - α) interval does not lie below 0 (where seeds
failed: where the rank trend test does not find it falling at α) the baseline has stopped improving up
the ladder and the trend is of nothing: the word is ``ladder not scaling``. The
**compute multiplier** at a rung, how many times its compute the baseline would need to reach the
variant's reducible loss there, is read off the baseline's fitted line within the ladder's range only
(:func:`.slope.compute_multiplier`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as scipy_stats

from ..prereg import ALPHA, smallest_rank_p
from .decide import Moments, TTests, t_tests
from .ranks import signed_rank_tests
from .slope import (
    PER_RUNG,
    POOLED,
    Design,
    SlopeFit,
    compute_multiplier,
    fit_slope,
    rank_trend,
    slope_interval,
)
from .stats import NO_SPREAD, diverged_value, paired_difference

HOLDS, GROWS, SHRINKS, REVERSES, UNDECIDED = "holds", "grows", "shrinks", "reverses", "undecided"
NOT_SCALING = "ladder not scaling"
WORDS = (HOLDS, GROWS, SHRINKS, REVERSES, UNDECIDED, NOT_SCALING)
OK, DIVERGED, DID_NOT_LEARN = "ok", "diverged", "did not learn"
SLOPE_T, JONCKHEERE, NO_TEST = "OLS slope, per-rung variance", "Jonckheere-Terpstra", "none"

#: the margin of a flat trend, on the slope β per doubling of compute. The planned CPU ladder spans six
#: doublings (rungs at 1/4, 1, 4 and 16 times the book's cell), and over them a slope of δ moves the
#: reducible-loss ratio by 6δ ≈ ln 1.1: 10%, the change the LM's per-rung margin already treats as not
#: mattering (1% perplexity is about 10% of the baseline's reducible loss at the book's size).
#: Declared before any ladder was trained.
DELTA = 0.016
#: the smallest reducible loss counted: a seed within a thousandth of a nat of the floor (or below it,
#: by a finite validation set's sampling error) counts there, so the logarithm stays finite and such
#: seeds tie rather than run to minus infinity; the per-rung rule already calls a side that close saturated
MIN_REDUCIBLE = 1e-3


# the input ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeedLoss:
    """One seed's final validation loss (None where it diverged) and how it ended."""

    seed: int
    loss: float | None
    status: str = OK

    def __post_init__(self) -> None:
        if self.status not in (OK, DIVERGED, DID_NOT_LEARN):
            raise ValueError(f"SeedLoss: status {self.status!r} is none of {OK!r}, {DIVERGED!r}, {DID_NOT_LEARN!r}")
        if (self.loss is None) != (self.status == DIVERGED) or (self.loss is not None and not math.isfinite(self.loss)):
            raise ValueError(f"SeedLoss: seed {self.seed} has loss {self.loss} with status {self.status!r}")

    @property
    def failed(self) -> bool:
        return self.status != OK


@dataclass(frozen=True)
class Rung:
    """One rung of a ladder: its name, the baseline's training compute (FLOPs), the task's irreducible
    loss (``floor``), the loss of a model that learned nothing (``trivial``: the unigram model, the
    most frequent class), and each side's seeds."""

    name: str
    compute: float
    floor: float
    trivial: float
    variant: tuple[SeedLoss, ...]
    baseline: tuple[SeedLoss, ...]

    def losses(self) -> tuple[dict[int, float], dict[int, float]]:
        """Seed -> loss of each side, a diverged seed at the worse of the trivial loss and every finished
        seed of the rung (either side), as the per-rung rule counts it."""
        finished = [s.loss for s in (*self.variant, *self.baseline) if s.loss is not None]
        stand_in = diverged_value(self.trivial, finished, higher_is_better=False)
        return tuple(  # type: ignore[return-value]
            {s.seed: s.loss if s.loss is not None else stand_in for s in side} for side in (self.variant, self.baseline)
        )

    def log_reducible(self, loss: float) -> float:
        """ln(loss - floor), the reducible loss counted at :data:`MIN_REDUCIBLE` at least."""
        return math.log(max(loss - self.floor, MIN_REDUCIBLE))


@dataclass(frozen=True)
class Ladder:
    """A question's rungs, compute increasing."""

    rungs: tuple[Rung, ...]

    def __post_init__(self) -> None:
        computes = [r.compute for r in self.rungs]
        if len(computes) < 2 or any(c <= 0 for c in computes) or computes != sorted(set(computes)):
            raise ValueError(f"Ladder: rung computes {computes} must be two or more, positive and increasing")

    @property
    def any_failed(self) -> bool:
        return any(s.failed for r in self.rungs for s in (*r.variant, *r.baseline))


# the output -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RungTheta:
    """θ at one rung: its seed pairs' mean, the (1 - α) interval (t, or None without spread or with
    fewer than two pairs), the direction the rung was decided in (+1: the variant's reducible loss is
    larger, -1 smaller, 0 undecided; by the signed-rank test where the ladder is rank-based), and the
    compute multiplier there (None where it cannot be read within the ladder)."""

    name: str
    compute: float
    doublings: float  # log2 of the compute
    pairs: int
    theta: float
    interval: tuple[float, float] | None
    decided: int
    multiplier: float | None


@dataclass(frozen=True)
class Exponent:
    """The baseline's scaling exponent α_B (loss - floor ∝ C^-α_B) with its (1 - α) interval, and
    whether the baseline scales: the interval of its slope lies below 0 (where seeds failed: the rank
    trend test finds the loss falling)."""

    value: float
    interval: tuple[float, float] | None
    scaling: bool


@dataclass(frozen=True)
class TrendVerdict:
    """The trend of one question (see the module's docstring): the word, the slope β per doubling with
    its (1 - α) interval and TOST's (1 - 2α) one, both p-values and the degrees of freedom (None where
    there is no test), which test decided, the margin δ and level α, the baseline's exponent, every
    rung's θ, and why the word is what it is."""

    word: str
    beta: float
    interval: tuple[float, float] | None
    flat_interval: tuple[float, float] | None
    p_value: float | None
    p_flat: float | None
    dof: float | None
    test: str
    margin: float
    level: float
    exponent: Exponent
    rungs: tuple[RungTheta, ...]
    reason: str

    @property
    def rank_based(self) -> bool:
        return self.test == JONCKHEERE

    def describe(self) -> str:
        """One line for a summary: ``grows: slope +0.12 [+0.05, +0.19] per doubling``."""
        interval = "" if self.interval is None else f" [{self.interval[0]:+.2g}, {self.interval[1]:+.2g}]"
        test = f" ({self.test})" if self.rank_based else ""
        return f"{self.word}{test}: slope {self.beta:+.2g}{interval} per doubling"


# the rule, over arrays ------------------------------------------------------------------------------


def trend_words(
    rejects: np.ndarray,
    slope_sign: np.ndarray,
    flat: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    ends_move: np.ndarray,
) -> np.ndarray:
    """The word of each ladder from its tests: ``rejects`` (the slope test, or the rank trend test, at α)
    in the direction ``slope_sign``; ``flat`` (TOST within ± δ); ``lo``, ``hi`` the bottom and top
    rungs' decided signs of θ (0 undecided); ``ends_move`` the sign of θ̂_top - θ̂_bottom. See the
    module's docstring for the rule."""
    slope_sign, lo, hi = (np.asarray(v, dtype=int) for v in (slope_sign, lo, hi))
    reference = np.where(hi != 0, hi, lo)
    consistent = np.asarray(rejects, dtype=bool) & (np.sign(ends_move) == slope_sign) & (slope_sign != 0)
    reverses = consistent & (lo != 0) & (hi == -lo) & (hi == slope_sign)
    moving = np.where(reference == slope_sign, GROWS, SHRINKS)
    words = np.where(consistent & (reference != 0), moving, UNDECIDED)
    words = np.where(reverses, REVERSES, words)
    return np.where(np.asarray(flat, dtype=bool), HOLDS, words)


@dataclass(frozen=True)
class RowTests:
    """Everything the rule reads of many ladders of one design (arrays, one row per ladder): the fit,
    the slope's t tests, whether the slope (or rank trend) test rejects and in which direction, whether
    TOST shows it flat, each rung's decided sign of θ (shape (reps, K)) and the word."""

    fit: SlopeFit
    tests: TTests
    rejects: np.ndarray
    slope_sign: np.ndarray
    flat: np.ndarray
    decided: np.ndarray
    words: np.ndarray


def slope_moments(fit: SlopeFit) -> Moments:
    """The slope as :class:`.decide.Moments`, so that the per-rung rule's t tests test it."""
    return Moments(fit.slope, fit.standard_error, fit.dof, fit.spread, np.ones(fit.slope.shape, dtype=bool))


def analyse_rows(
    design: Design, theta: np.ndarray, rank_based: np.ndarray, margin: float = DELTA, alpha: float = ALPHA
) -> RowTests:
    """The rule's tests of many ladders of one design (rows of per-pair θ, shape (reps, N)), before the
    baseline's scaling gate: the slope's t and TOST tests and each rung's one-sample t test of θ, or,
    where ``rank_based``, the rank trend test and each rung's signed-rank test. The simulation of the
    error rates calls this, and :func:`trend` calls it with one row."""
    theta = np.atleast_2d(np.asarray(theta, dtype=float))
    rank_based = np.broadcast_to(np.asarray(rank_based, dtype=bool), theta.shape[:1])
    fit = fit_slope(design, theta)
    tests = t_tests(slope_moments(fit), margin, alpha)
    rejects = fit.spread & (tests.p_value < alpha)
    flat = (fit.spread & (tests.p_equivalence < alpha)) | (~fit.spread & (np.abs(fit.slope) < margin))
    slope_sign = np.sign(fit.slope).astype(int)
    edges = design.bounds
    rungs = [theta[:, edges[k] : edges[k + 1]] for k in range(len(design.sizes))]
    decided = np.stack([_t_decided(part, alpha) for part in rungs], axis=-1)
    if rank_based.any():
        rows = np.flatnonzero(rank_based)
        trend_test = rank_trend(design, theta[rows])
        rejects[rows], slope_sign[rows], flat[rows] = trend_test.p_value < alpha, trend_test.sign, False
        decided[rows] = np.stack([_rank_decided(part[rows], alpha) for part in rungs], axis=-1)
    ends_move = np.sign(fit.rung_means[:, -1] - fit.rung_means[:, 0])
    words = trend_words(rejects, slope_sign, flat, decided[:, 0], decided[:, -1], ends_move)
    return RowTests(fit, tests, rejects, slope_sign, flat, decided, words)


def _t_decided(theta: np.ndarray, alpha: float) -> np.ndarray:
    """The sign in which each row's mean θ is decided by the two-sided one-sample t test at α (0:
    undecided; a rung of one pair, or without spread, is undecided), as ``stats.paired_difference``."""
    n = theta.shape[-1]
    if n < 2:
        return np.zeros(len(theta), dtype=int)
    mean, sd = theta.mean(axis=-1), theta.std(axis=-1, ddof=1)
    spread = sd > NO_SPREAD * np.maximum(np.max(np.abs(theta), axis=-1), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_value = 2 * scipy_stats.t.sf(np.abs(mean) / (sd / math.sqrt(n)), n - 1)
    return np.where(spread & (p_value < alpha), np.sign(mean), 0).astype(int)


def _rank_decided(theta: np.ndarray, alpha: float) -> np.ndarray:
    """The sign in which each row's θ is decided by the exact signed-rank test at α (0: undecided)."""
    tests = signed_rank_tests(theta)
    return np.where(tests.p_value < alpha, np.sign(tests.sign), 0).astype(int)


# one question ---------------------------------------------------------------------------------------


def scaling_gate(design: Design, log_reducible: np.ndarray, rank_based: np.ndarray, alpha: float = ALPHA):
    """Whether the baseline scales in each of many ladders (rows of its seeds' ln(loss - floor), the
    design's x in ln compute), and its fit: the (1 - α) interval of the slope lies below 0 (a fit without
    spread: the slope is below 0), or, where ``rank_based`` (a seed of either side failed), the rank
    trend test rejects at α with the loss falling. The simulation of the error rates calls this too."""
    values = np.atleast_2d(np.asarray(log_reducible, dtype=float))
    fit = fit_slope(design, values, PER_RUNG if min(design.sizes) >= 2 else POOLED)
    _, high = slope_interval(fit, 1 - alpha)
    scaling = np.where(fit.spread, high < 0, fit.slope < 0)
    rank_based = np.broadcast_to(np.asarray(rank_based, dtype=bool), values.shape[:1])
    if rank_based.any():
        rows = np.flatnonzero(rank_based)
        test = rank_trend(design, values[rows])
        scaling[rows] = (test.p_value < alpha) & (test.sign < 0)
    return scaling, fit


def baseline_exponent(ladder: Ladder, alpha: float = ALPHA) -> tuple[Exponent, SlopeFit, tuple[float, ...]]:
    """The baseline's exponent from ln(loss - floor) on ln compute over every baseline seed (the slope's
    variance per rung, or pooled where a rung has one seed) with its (1 - α) interval, whether it scales
    (:func:`scaling_gate`), the fit and the rungs' ln compute."""
    log_compute = tuple(math.log(r.compute) for r in ladder.rungs)
    values = [[r.log_reducible(loss) for loss in r.losses()[1].values()] for r in ladder.rungs]
    design = Design(log_compute, tuple(len(v) for v in values))
    if sum(design.sizes) <= 2:
        raise ValueError("baseline_exponent: a ladder needs three baseline seeds at least, two on some rung")
    scaling, fit = scaling_gate(design, np.concatenate(values)[None], np.array([ladder.any_failed]), alpha)
    slope, scales = float(fit.slope[0]), bool(scaling[0])
    if not fit.spread[0]:
        return Exponent(-slope, None, scales), fit, log_compute
    low, high = (float(v[0]) for v in slope_interval(fit, 1 - alpha))
    return Exponent(-slope, (-high, -low), scales), fit, log_compute


def trend(
    ladder: Ladder, margin: float = DELTA, alpha: float = ALPHA, planned_pairs: int | None = None
) -> TrendVerdict:
    """The trend verdict of one question's ladder under the rule of this module (see its docstring):
    θ per seed pair (seeds paired by number; a seed without its partner counts in the baseline's
    exponent only), the slope on log2 compute, the words, the baseline's exponent and gate, and the
    compute multiplier at each rung. ``planned_pairs`` (the seed plan's last look) only changes the
    reason: where no rung can be decided on the pairs present, it says whether the plan's last look
    could, so a reader knows whether more seeds would help."""
    if not margin > 0:
        raise ValueError(f"trend: margin={margin} must be positive (the smallest slope per doubling that matters)")
    exponent, baseline_fit, log_compute = baseline_exponent(ladder, alpha)
    thetas, variant_logs = [], []
    for rung in ladder.rungs:
        variant, baseline = rung.losses()
        seeds = sorted(variant.keys() & baseline.keys())
        thetas.append([rung.log_reducible(variant[s]) - rung.log_reducible(baseline[s]) for s in seeds])
        variant_logs.append(float(np.mean([rung.log_reducible(v) for v in variant.values()])))
    sizes = tuple(len(t) for t in thetas)
    design = Design(tuple(math.log2(r.compute) for r in ladder.rungs), tuple(max(n, 1) for n in sizes))
    multipliers = [
        compute_multiplier(log_compute, float(baseline_fit.intercept[0]), float(baseline_fit.slope[0]), target, at)
        if exponent.scaling
        else None
        for target, at in zip(variant_logs, log_compute, strict=True)
    ]
    if min(sizes) < 2:
        short = ", ".join(r.name for r, n in zip(ladder.rungs, sizes, strict=True) if n < 2)
        rungs = _rung_thetas(ladder, design, thetas, [0] * len(sizes), multipliers, alpha)
        beta = float(fit_slope(design, np.concatenate(thetas)[None], POOLED).slope[0]) if min(sizes) else math.nan
        reason = f"no test: rung {short} has fewer than two seed pairs"
        word = NOT_SCALING if not exponent.scaling else UNDECIDED
        return TrendVerdict(word, beta, None, None, None, None, None, NO_TEST, margin, alpha, exponent, rungs, reason)
    rank_based = ladder.any_failed
    rows = analyse_rows(design, np.concatenate(thetas)[None], np.array([rank_based]), margin, alpha)
    rungs = _rung_thetas(ladder, design, thetas, list(rows.decided[0]), multipliers, alpha)
    spread = bool(rows.fit.spread[0])
    interval = tuple(float(v[0]) for v in slope_interval(rows.fit, 1 - alpha)) if spread else None
    tests = rows.tests
    flat_interval = (float(tests.equivalence_low[0]), float(tests.equivalence_high[0])) if spread else None
    word = str(rows.words[0]) if exponent.scaling else NOT_SCALING
    p_flat = float(tests.p_equivalence[0]) if spread and not rank_based else None
    p_value = _rank_p(design, thetas) if rank_based else (float(tests.p_value[0]) if spread else None)
    test = JONCKHEERE if rank_based else (SLOPE_T if spread else NO_TEST)
    verdict = TrendVerdict(
        word=word,
        beta=float(rows.fit.slope[0]),
        interval=interval,  # type: ignore[arg-type]
        flat_interval=flat_interval,
        p_value=p_value,
        p_flat=p_flat,
        dof=float(rows.fit.dof[0]) if spread else None,
        test=test,
        margin=margin,
        level=alpha,
        exponent=exponent,
        rungs=rungs,
        reason="",
    )
    return replace(verdict, reason=_reason(verdict, bool(rows.rejects[0]), planned_pairs))


def _rank_p(design: Design, thetas: list[list[float]]) -> float:
    return float(rank_trend(design, np.concatenate(thetas)[None]).p_value[0])


def _rung_thetas(
    ladder: Ladder,
    design: Design,
    thetas: list[list[float]],
    decided: list[int],
    multipliers: list[float | None],
    alpha: float,
) -> tuple[RungTheta, ...]:
    rows = []
    for rung, x, theta, sign, multiplier in zip(ladder.rungs, design.x, thetas, decided, multipliers, strict=True):
        difference = paired_difference(theta, [0.0] * len(theta), 1 - alpha) if theta else None
        interval = None if difference is None or difference.ci_low is None else (difference.ci_low, difference.ci_high)
        mean = float(np.mean(theta)) if theta else math.nan
        rows.append(RungTheta(rung.name, rung.compute, x, len(theta), mean, interval, int(sign), multiplier))  # type: ignore[arg-type]
    return tuple(rows)


def _reason(verdict: TrendVerdict, rejects: bool, planned_pairs: int | None = None) -> str:
    """Why the word is what it is, in a sentence."""
    bottom, top = verdict.rungs[0], verdict.rungs[-1]
    ends = (
        f"θ {bottom.theta:+.3g} at {bottom.name} ({_side(bottom.decided)}), "
        f"{top.theta:+.3g} at {top.name} ({_side(top.decided)})"
    )
    if verdict.word == NOT_SCALING:
        e = verdict.exponent
        interval = "" if e.interval is None else f" [{e.interval[0]:+.3g}, {e.interval[1]:+.3g}]"
        return (
            f"the baseline's reducible loss does not fall up the ladder: exponent {e.value:+.3g}{interval} "
            "does not exclude 0 or less"
        )
    if verdict.word == HOLDS:
        if verdict.flat_interval is None:
            return f"no spread: every pair's θ lies on one line, its slope within ±{verdict.margin:g} per doubling"
        low, high = verdict.flat_interval
        also = "; the slope excludes 0, but lies within the margin" if rejects else ""
        level = f"{1 - 2 * verdict.level:.0%}"
        return f"the slope's {level} interval [{low:+.3g}, {high:+.3g}] lies within ±{verdict.margin:g}{also}"
    test = "rank trend test" if verdict.rank_based else "slope test"
    if verdict.rank_based:
        ranked, limit = "a seed failed, so rank tests decide and never show holds: ", ""
        most = max(rung.pairs for rung in verdict.rungs)
        smallest = smallest_rank_p(most)
        if smallest >= verdict.level:  # no rung's direction can be shown, so no word but undecided
            limit = (
                f"; no rung can be decided: a signed-rank test on {most} pairs gives p ≥ {smallest:.2g}, "
                f"not below α {verdict.level:.3g}"
            )
            if planned_pairs is not None and planned_pairs > most:
                last = smallest_rank_p(planned_pairs)
                more = "more seeds cannot change that" if last >= verdict.level else "more seeds could"
                limit += f"; on the {planned_pairs} pairs of the plan's last look p ≥ {last:.2g}: {more}"
    else:
        ranked, limit = "", ""
    if not rejects:
        flat = "" if verdict.rank_based else f" and the slope is not shown within ±{verdict.margin:g}"
        return f"{ranked}the {test} does not reject 0{flat}; {ends}{limit}"
    if verdict.word == UNDECIDED:
        return (
            f"{ranked}the {test} rejects 0, but the end rungs do not tell whether the effect's magnitude grows: "
            f"{ends}{limit}"
        )
    return f"{ranked}the {test} rejects 0 (p {verdict.p_value:.3g}); {ends}"


def _side(sign: int) -> str:
    return {1: "the variant's reducible loss larger", -1: "the variant's reducible loss smaller", 0: "undecided"}[sign]
