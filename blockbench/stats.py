"""Statistics over seeds for the summary: pure functions, no I/O.

- ``mean_std``: mean and sample standard deviation.
- ``t_confidence_interval``: confidence interval of a mean (Student t).
- ``welch_difference``: difference of two means with Welch's confidence interval and p-value.
- ``time_to_target``: the first validation of a training history that reaches a target.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from scipy import stats as scipy_stats


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1 in the denominator; 0 for a single value)."""
    if not values:
        raise ValueError("mean_std needs at least one value")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def t_confidence_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Confidence interval of the mean of ``values``: mean ± t(level, n - 1) · std / √n.

    None for fewer than two values: one seed says nothing about the spread.
    """
    n = len(values)
    if n < 2:
        return None
    mean, std = mean_std(values)
    half_width = scipy_stats.t.ppf((1 + level) / 2, n - 1) * std / math.sqrt(n)
    return mean - half_width, mean + half_width


@dataclass(frozen=True)
class Difference:
    """``mean(a) - mean(b)`` with its confidence interval and two-sided p-value (None: no interval)."""

    difference: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None

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
    if len(a) < 2 or len(b) < 2:
        return Difference(difference, None, None, None)
    var_a, var_b = std_a**2 / len(a), std_b**2 / len(b)  # squared standard errors of each mean
    standard_error = math.sqrt(var_a + var_b)
    if standard_error == 0:
        return Difference(difference, None, None, None)
    dof = (var_a + var_b) ** 2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    half_width = scipy_stats.t.ppf((1 + level) / 2, dof) * standard_error
    p_value = 2 * scipy_stats.t.sf(abs(difference) / standard_error, dof)
    return Difference(difference, difference - half_width, difference + half_width, float(p_value))


def reaches(value: float, target: float, higher_is_better: bool) -> bool:
    """Whether ``value`` is at least as good as ``target`` (NaN never reaches)."""
    return value >= target if higher_is_better else value <= target


def time_to_target(
    history: Iterable[dict[str, Any]], metric: str, target: float, higher_is_better: bool
) -> tuple[int, float | None] | None:
    """(step, seconds since training started) of the first validation whose ``metric`` reaches
    ``target`` in the metric's direction; None if none does. Validations without the metric are skipped."""
    for validation in history:
        value = validation.get("metrics", {}).get(metric)
        if value is not None and reaches(float(value), target, higher_is_better):
            return int(validation["step"]), validation.get("time_s")
    return None
