"""The statistics of a scale ladder's trend, over numpy rows: the least-squares slope of values on a
rung's x with its standard error and degrees of freedom, the rank trend test that replaces it where
seeds failed, and the baseline's compute multiplier read off its own fitted power law.

A ladder's values are laid out rung after rung along the last axis (shape (..., N), N the sum of the
rung sizes of a :class:`Design`), so that ``benchmarks/statistics/trend_error_rates.py`` runs this very
code on many simulated ladders at once and :func:`blockbench.report.trend.trend` on one.

**The slope** (:func:`fit_slope`) is ordinary least squares of every value on its rung's x, each seed
pair one point (seeds within a rung are the replication, and every pair weighs the same). Its standard
error is by default built from each rung's own seed variance, √(Σ_k n_k (x_k - x̄)² s_k²) / S_xx, with
Satterthwaite's degrees of freedom (:data:`PER_RUNG`): the Welch form of a linear contrast of rung
means. Rungs differ in noise (deeper models, fewer nats left to learn), and the end rungs carry the
slope's leverage, so a variance pooled over rungs misstates the slope's where the ends are the noisy
ones; the per-rung variance is also free of any curvature between the rungs, so the test is of the
least-squares slope through the true rung means, whatever the curve's shape. On two rungs it is
Welch's t test of their means, scaled by their distance. The pooled form (:data:`POOLED`: residual
variance about the line, N - 2 degrees of freedom, ``scipy.stats.linregress``'s) is kept for the
simulation to show what it would claim.

**The rank trend** (:func:`rank_trend`) is the Jonckheere-Terpstra test of an ordered alternative
across rungs, computed as Kendall's tau-b between a value and its rung's x (``scipy.stats.kendalltau``):
Kendall's S between a grouping and a response is the Jonckheere-Terpstra statistic (twice the count of
cross-rung pairs in increasing order, less the number of such pairs), and scipy's null variance
corrects for the ties in both (the rung, and seeds that failed at one value). Its p-value is the
normal approximation: an exact enumeration of 12 values in 4 rungs would list 369,600 arrangements
per ladder, too many for the simulation's rows, and the simulation shows the approximation's level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from .ranks import RankTests
from .stats import NO_SPREAD

#: the slope's variance: from each rung's own seed variance (Satterthwaite's df), or pooled about the line
PER_RUNG, POOLED = "per-rung variance", "pooled variance"


@dataclass(frozen=True)
class Design:
    """Where each value of a ladder's row lies: ``x`` of each rung (increasing) and how many values
    (seed pairs, or seeds) each rung holds, in the order the row lists them."""

    x: tuple[float, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.x) != len(self.sizes) or len(self.x) < 2:
            raise ValueError(f"Design: {len(self.x)} rungs' x and {len(self.sizes)} sizes; a ladder needs two or more")
        if any(b <= a for a, b in zip(self.x, self.x[1:], strict=False)) or any(n < 1 for n in self.sizes):
            raise ValueError(f"Design: x={self.x} must increase and sizes={self.sizes} be at least 1")

    @property
    def value_x(self) -> np.ndarray:
        """Each value's x: its rung's, repeated over the rung's values."""
        return np.repeat(np.asarray(self.x, dtype=float), self.sizes)

    @property
    def bounds(self) -> np.ndarray:
        """Where each rung's values start along the row, and where the last ends."""
        return np.concatenate([[0], np.cumsum(self.sizes)])


@dataclass(frozen=True)
class SlopeFit:
    """The least-squares line of many ladders (arrays of one shape): slope, intercept (at x = 0), the
    slope's standard error and degrees of freedom, whether the values vary at all (``spread``: False
    where the standard error is rounding error), and each rung's mean (shape (..., K))."""

    slope: np.ndarray
    intercept: np.ndarray
    standard_error: np.ndarray
    dof: np.ndarray
    spread: np.ndarray
    rung_means: np.ndarray


def rung_moments(design: Design, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each rung's mean and sample variance (n - 1; 0 for a rung of one value), shapes (..., K)."""
    values = np.asarray(values, dtype=float)
    edges = design.bounds
    parts = [values[..., edges[k] : edges[k + 1]] for k in range(len(design.sizes))]
    means = np.stack([part.mean(axis=-1) for part in parts], axis=-1)
    variances = np.stack(
        [part.var(axis=-1, ddof=1) if part.shape[-1] > 1 else np.zeros(part.shape[:-1]) for part in parts], axis=-1
    )
    return means, variances


def fit_slope(design: Design, values: np.ndarray, variance: str = PER_RUNG) -> SlopeFit:
    """The OLS line of ``values`` (rows of shape (..., N)) on their rungs' x, with the slope's standard
    error from each rung's variance and Satterthwaite's df (:data:`PER_RUNG`, every rung with a positive
    weight needs two values) or pooled about the line with N - 2 df (:data:`POOLED`). See the module's
    docstring for why per rung."""
    values = np.asarray(values, dtype=float)
    x, n = np.asarray(design.x, dtype=float), np.asarray(design.sizes, dtype=float)
    total = n.sum()
    x_mean = float((n * x).sum() / total)
    sxx = float((n * (x - x_mean) ** 2).sum())
    means, variances = rung_moments(design, values)
    slope = (means * (n * (x - x_mean))).sum(axis=-1) / sxx
    intercept = (means * n).sum(axis=-1) / total - slope * x_mean
    if variance == POOLED:
        residuals = values - intercept[..., None] - slope[..., None] * design.value_x
        dof = np.full(slope.shape, max(total - 2, 1.0))
        standard_error = np.sqrt((residuals**2).sum(axis=-1) / dof / sxx)
    elif variance == PER_RUNG:
        weights = n * (x - x_mean) ** 2 / sxx**2  # Var(slope) = Σ weights_k · s_k²
        if any(size < 2 for size, w in zip(design.sizes, weights, strict=True) if w > 0):
            raise ValueError(f"fit_slope: a rung of one value has no variance of its own (sizes {design.sizes})")
        parts = weights * variances
        var_slope = parts.sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            dof = var_slope**2 / (parts**2 / np.maximum(n - 1, 1)).sum(axis=-1)
        standard_error = np.sqrt(var_slope)
    else:
        raise ValueError(f"fit_slope: variance={variance!r} is neither {PER_RUNG!r} nor {POOLED!r}")
    scale = np.max(np.abs(values), axis=-1)
    spread = standard_error > NO_SPREAD * np.maximum(scale, 1.0)
    return SlopeFit(slope, intercept, standard_error, np.where(spread, dof, 1.0), spread, means)


def slope_interval(fit: SlopeFit, level: float) -> tuple[np.ndarray, np.ndarray]:
    """The two-sided ``level`` t interval of each slope (NaN without spread)."""
    with np.errstate(invalid="ignore"):
        half = scipy_stats.t.ppf((1 + level) / 2, fit.dof) * np.where(fit.spread, fit.standard_error, np.nan)
    return fit.slope - half, fit.slope + half


def rank_trend(design: Design, values: np.ndarray) -> RankTests:
    """The Jonckheere-Terpstra trend test of each row across its rungs (Kendall's tau-b against the
    rung's x, scipy's tie-corrected normal approximation; see the module's docstring): its two-sided
    p-value and the sign of the trend (> 0: values rise with x). A row without two distinct values has
    p = 1 and no sign."""
    values = np.asarray(values, dtype=float)
    rows = values.reshape(-1, values.shape[-1])
    x = design.value_x
    p_value, sign = np.ones(len(rows)), np.zeros(len(rows))
    for i, row in enumerate(rows):
        if np.ptp(row) > NO_SPREAD * max(float(np.max(np.abs(row))), 1.0):
            result = scipy_stats.kendalltau(x, row)
            p_value[i], sign[i] = float(result.pvalue), float(np.sign(result.statistic))
    return RankTests(p_value.reshape(values.shape[:-1]), sign.reshape(values.shape[:-1]))


def compute_multiplier(
    log_compute: tuple[float, ...], intercept: float, slope: float, target: float, at: float
) -> float | None:
    """How many times the compute ``exp(at)`` the baseline needs to reach ``target`` (a mean log reducible
    loss) on its fitted line ``intercept + slope · ln C``: exp(ln C* - at) with ln C* = (target -
    intercept) / slope. None where the line does not fall (slope ≥ 0) or ln C* lies outside the
    ladder's range of ``log_compute``: an interpolation, never an extrapolation."""
    if not slope < 0 or not math.isfinite(target):
        return None
    log_needed = (target - intercept) / slope
    if not min(log_compute) <= log_needed <= max(log_compute):
        return None
    return math.exp(log_needed - at)
