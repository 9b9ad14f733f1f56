"""Statistics over seeds for the summary: pure functions, no I/O.

- ``mean_std``: mean and sample standard deviation.
- ``t_confidence_interval``: confidence interval of a mean (Student t), cut at the metric's bounds
  (cutting removes only values the metric cannot take; the mean always stays inside).
- ``diverged_value``, ``with_diverged``: the value a diverged seed counts with, and a seed's values
  with the diverged seeds counted at it.
- ``compare``: difference of two variants' means, with a paired t interval when their seeds match
  and Welch's otherwise (``paired_difference``, ``welch_difference``), never cut: a difference
  interval says how uncertain the difference is, and cutting it to ± the metric's range hid that.
  (Verdicts are decided per question by ``decide.decide``; Holm's adjustment over a matrix is gone.)
- ``time_to_target``: the first validation of a training history that reaches a target.
- ``bootstrap_interval``: the percentile bootstrap interval of a two-sample statistic (P(better),
  the step-time ratio), fixed random state.
- ``ratio_of_medians``: one side's median over the other's with a bootstrap interval (step times:
  cells timed in different runs swing by 15-50% on a shared machine, so a mean of them, or a ratio
  without its spread, can read as a speed-up what is the load the baseline's cells ran under).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from scipy import stats as scipy_stats

from ..store.record import HistoryPoint

#: a spread below this share of the values' magnitude is rounding error (0.7 - 0.5 and 0.8 - 0.6
#: differ by 1e-16), not variation between seeds: the t statistic is then undefined, not huge
NO_SPREAD = 1e-12

PAIRED, WELCH = "paired", "welch"

Key = TypeVar("Key", bound=Hashable)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1 in the denominator; 0 for a single value)."""
    if not values:
        raise ValueError("mean_std needs at least one value")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _no_spread(spread: float, values: Iterable[float]) -> bool:
    return spread <= NO_SPREAD * max((abs(v) for v in values), default=0.0)


def _t_quantile(level: float, dof: float) -> float:
    return float(scipy_stats.t.ppf((1 + level) / 2, dof))


def t_confidence_interval(
    values: Sequence[float], level: float = 0.95, low: float = -math.inf, high: float = math.inf
) -> tuple[float, float] | None:
    """Confidence interval of the mean of ``values``: mean ± t(level, n - 1) · std / √n, cut at the
    metric's range [low, high].

    Cutting removes only values the metric cannot take (BLEU above 100, a loss below 0), and the
    mean lies inside the range, so the interval always contains its own mean and covers the true
    mean as often as the uncut one. (An interval on the logit scale of a bounded metric's share of
    its range, with shares clamped inside the edges, can miss its own mean: BLEU seeds 100, 100 and
    99.938 get [99.900, 99.900] that way, against a mean of 99.979.)

    None for fewer than two values: one seed says nothing about the spread.
    """
    if len(values) < 2:
        return None
    interval_low, interval_high = _t_interval(values, level)
    return max(interval_low, low), min(interval_high, high)


def _t_interval(values: Sequence[float], level: float) -> tuple[float, float]:
    mean, std = mean_std(values)
    half_width = _t_quantile(level, len(values) - 1) * std / math.sqrt(len(values))
    return mean - half_width, mean + half_width


# diverged seeds ------------------------------------------------------------------------------------


def diverged_value(baseline: float | None, finished: Iterable[float], higher_is_better: bool) -> float | None:
    """The value a diverged seed counts with: the worst of the task's trivial baseline (a model that
    learned nothing) and every finished seed of the task. A diverged run produced no usable model, so
    it scores no better than learning nothing, and no better than any run that finished. None when
    there is neither a baseline nor a finished seed."""
    candidates = [*finished] + ([baseline] if baseline is not None else [])
    if not candidates:
        return None
    return min(candidates) if higher_is_better else max(candidates)


def with_diverged(finished: Mapping[Key, float], diverged: Iterable[Key], value: float | None) -> dict[Key, float]:
    """Seed -> value of the finished seeds, and of the diverged seeds at ``value`` (left out if None)."""
    values = dict(finished)
    if value is not None:
        values.update({seed: value for seed in diverged})
    return values


# differences ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """``mean(a) - mean(b)`` with its confidence interval and two-sided p-value (None: no interval).

    ``test`` is ``paired`` (a t test on seed-matched differences) or ``welch``; ``n`` is the number of
    pairs of a paired test, or the two sample sizes of Welch's."""

    difference: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    test: str = WELCH
    n: tuple[int, ...] = ()

    def __iter__(self) -> Iterator[float | None]:  # unpacks as (difference, ci_low, ci_high, p_value)
        return iter((self.difference, self.ci_low, self.ci_high, self.p_value))

    @property
    def excludes_zero(self) -> bool:
        """The interval lies entirely above or below zero (False without an interval)."""
        return self.ci_low is not None and self.ci_high is not None and (self.ci_low > 0 or self.ci_high < 0)


def welch_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Difference:
    """Difference of means ``mean(a) - mean(b)`` with Welch's t interval and p-value.

    The standard error is √(s_a²/n_a + s_b²/n_b) and the degrees of freedom are
    Welch–Satterthwaite's. There is no interval (None) when a side has a single value (its spread
    is unknown) or when neither side varies at all (the t statistic is undefined).
    """
    mean_a, std_a = mean_std(a)
    mean_b, std_b = mean_std(b)
    difference = mean_a - mean_b
    sizes = (len(a), len(b))
    if len(a) < 2 or len(b) < 2:
        return Difference(difference, None, None, None, WELCH, sizes)
    var_a, var_b = std_a**2 / len(a), std_b**2 / len(b)  # squared standard errors of each mean
    standard_error = math.sqrt(var_a + var_b)
    if _no_spread(standard_error, [*a, *b]):
        return Difference(difference, None, None, None, WELCH, sizes)
    dof = (var_a + var_b) ** 2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    half_width = _t_quantile(level, dof) * standard_error
    p_value = 2 * scipy_stats.t.sf(abs(difference) / standard_error, dof)
    return Difference(difference, difference - half_width, difference + half_width, float(p_value), WELCH, sizes)


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Difference:
    """Mean of the differences ``a[i] - b[i]`` of seed-matched pairs with the paired t interval and
    p-value (``scipy.stats.ttest_rel``'s): mean ± t(level, n - 1) · std(d) / √n.

    Seeds of different variants share the data order (and, where shapes match, the initialisation),
    so pairing removes the seed's own effect from the comparison. There is no interval (None) for a
    single pair, or when every pair differs by the same amount (the t statistic is undefined).
    """
    if len(a) != len(b):
        raise ValueError(f"a paired difference needs as many values on each side, got {len(a)} and {len(b)}")
    differences = [x - y for x, y in zip(a, b, strict=True)]
    mean, std = mean_std(differences)
    n = len(differences)
    if n < 2 or _no_spread(std, [*a, *b]):
        return Difference(mean, None, None, None, PAIRED, (n,))
    standard_error = std / math.sqrt(n)
    half_width = _t_quantile(level, n - 1) * standard_error
    p_value = 2 * scipy_stats.t.sf(abs(mean) / standard_error, n - 1)
    return Difference(mean, mean - half_width, mean + half_width, float(p_value), PAIRED, (n,))


def compare(a: Mapping[Hashable, float], b: Mapping[Hashable, float], level: float = 0.95) -> Difference:
    """``mean(a) - mean(b)`` of two variants' values by seed: the paired test when both have the
    same seeds, Welch's otherwise. The interval is never cut to ± the metric's range: [-100.00,
    +97.08] cut from about [-171, +97] said the difference was known better than it was."""
    if a.keys() == b.keys():
        seeds = list(a)
        return paired_difference([a[s] for s in seeds], [b[s] for s in seeds], level)
    return welch_difference(list(a.values()), list(b.values()), level)


def seeds_text(n: Sequence[int]) -> str:
    """The seed set a difference, an interval or a test was computed over, as every line of the report
    names it: ``3 pairs`` (seed-matched: ``n`` is the number of pairs), ``3 vs 9 seeds`` (unpaired: each
    side's count, the variant's first), ``1 pair``. A number shown without its seed set could come from a
    look's seeds or from every seed of a table beside it."""
    if len(n) == 1:
        return f"{n[0]} pair{'' if n[0] == 1 else 's'}"
    return " vs ".join(str(k) for k in n) + " seeds"


# targets -------------------------------------------------------------------------------------------


def reaches(value: float, target: float, higher_is_better: bool) -> bool:
    """Whether ``value`` is at least as good as ``target`` (NaN never reaches)."""
    return value >= target if higher_is_better else value <= target


def time_to_target(
    history: Iterable[HistoryPoint], metric: str, target: float, higher_is_better: bool
) -> tuple[int, float | None] | None:
    """(step, seconds since training started) of the first validation whose ``metric`` reaches
    ``target`` in the metric's direction; None if none does. Validations without the metric are skipped."""
    for validation in history:
        value = validation.metrics.get(metric)
        if value is not None and reaches(float(value), target, higher_is_better):
            return int(validation.step), validation.time_s
    return None


#: the bootstrap of :func:`ratio_of_medians`: its level, resamples and fixed random state (reproducible)
RATIO_LEVEL, RATIO_RESAMPLES, RATIO_SEED = 0.95, 1999, 0


def bootstrap_interval(
    x: np.ndarray, y: np.ndarray, statistic: Callable[..., np.ndarray], level: float, resamples: int, seed: int
) -> tuple[float, float]:
    """The percentile bootstrap interval of a two-sample ``statistic(x, y, axis)``, each sample
    resampled on its own (``scipy.stats.bootstrap``, fixed random state, so a summary rebuilt from the
    same cells is the same bytes). Percentile rather than BCa: BCa is undefined where every resample
    gives the same value."""
    result = scipy_stats.bootstrap(
        (np.asarray(x, dtype=float), np.asarray(y, dtype=float)),
        statistic,
        vectorized=True,
        paired=False,
        confidence_level=level,
        n_resamples=resamples,
        method="percentile",
        random_state=seed,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


@dataclass(frozen=True)
class Ratio:
    """``a``'s median over ``b``'s, and its 95% percentile bootstrap interval (None with fewer than two
    values on a side, or no spread)."""

    value: float
    interval: tuple[float, float] | None

    @property
    def tie(self) -> bool:
        """Whether the interval holds 1: the two sides' values are not told apart."""
        return self.interval is not None and self.interval[0] <= 1.0 <= self.interval[1]


def ratio_of_medians(a: Sequence[float], b: Sequence[float]) -> Ratio | None:
    """``median(a) / median(b)`` with each side resampled on its own (``scipy.stats.bootstrap``,
    percentile, fixed random state), values that are not finite left out; None when a side is empty or
    ``b``'s median is not positive. With 3 values a side the percentile interval is close to the range
    of the ratios (its coverage nearer 90% than 95%): *a tie* there says the ranges overlap."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if not len(x) or not len(y) or np.median(y) <= 0:
        return None
    value = float(np.median(x) / np.median(y))
    if len(x) < 2 or len(y) < 2 or (np.ptp(x) == 0 and np.ptp(y) == 0):
        return Ratio(value, None)

    def statistic(u: np.ndarray, v: np.ndarray, axis: int) -> np.ndarray:
        return np.median(u, axis=axis) / np.median(v, axis=axis)

    return Ratio(value, bootstrap_interval(x, y, statistic, RATIO_LEVEL, RATIO_RESAMPLES, RATIO_SEED))
