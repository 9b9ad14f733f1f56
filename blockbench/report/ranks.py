"""The rank tests a question falls back on where a seed of either side did not learn or diverged:
the exact Wilcoxon signed-rank test on seed-matched pairs and the exact Mann-Whitney U test on
disjoint seeds, both exact given the ties (the seeds that failed tie at one value), over numpy rows
so that ``benchmarks/statistics/verdict_error_rates.py`` simulates this very code on 10^5 comparisons at once;
and :func:`any_failed`, the rule that sends a question to them. ``decide`` turns their p-values into
verdicts (docs/decisions/verdict-rule.md, "Failed runs")."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats


@dataclass(frozen=True)
class RankTests:
    """A rank test of many comparisons: its two-sided exact p-value and the side the ranks lean to
    (> 0: the variant's values are larger)."""

    p_value: np.ndarray
    sign: np.ndarray


#: the most rank arrangements an exact rank test enumerates (C(18, 9) = 48,620 for 9 against 9 seeds,
#: 2^9 = 512 for 9 pairs); beyond it scipy's normal approximation with its tie correction is used
EXACT_LIMIT = 200_000


@functools.cache
def _subsets(n: int, k: int) -> np.ndarray:
    """Every k-subset of range(n), one per row."""
    return np.array(list(itertools.combinations(range(n), k)), dtype=np.intp).reshape(-1, k)


@functools.cache
def _sign_vectors(n: int) -> np.ndarray:
    """Every vector of n signs ±1, one per row (2^n rows)."""
    return 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)


def _exact_p(doubled: np.ndarray, statistic: np.ndarray, null: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Two-sided exact p-values given the ties: for each row, twice the smaller share of the null's
    arrangements whose statistic (centred on its null mean) lies at or below, or at or above, the
    row's ``statistic`` (capped at 1; scipy's convention). The null distribution depends only on the
    row's midranks (doubled to integers, so comparisons are exact), so it is enumerated once per tie
    pattern by ``null(pattern) -> statistics`` and shared by the rows that have it. Written here
    because scipy's exact Mann-Whitney ignores ties and its permutation test would enumerate again for
    each of the simulation's 10^5 rows."""
    patterns, inverse = np.unique(np.sort(doubled, axis=-1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    p_value = np.empty(len(doubled))
    for j, pattern in enumerate(patterns):
        rows = inverse == j
        null_statistics = np.sort(null(pattern))
        at_most = np.searchsorted(null_statistics, statistic[rows], side="right")
        at_least = len(null_statistics) - np.searchsorted(null_statistics, statistic[rows], side="left")
        p_value[rows] = np.minimum(1.0, 2 * np.minimum(at_most, at_least) / len(null_statistics))
    return p_value


def signed_rank_tests(differences: np.ndarray) -> RankTests:
    """The exact Wilcoxon signed-rank test of seed-matched differences (rows of shape (..., n)).

    Zero differences (a pair whose values are identical, e.g. both seeds at the trivial baseline) are
    dropped first (Wilcoxon's own treatment; under the null the remaining signs are still exchangeable);
    tied absolute differences get their mean rank, and the p-value is exact given those midranks (every
    sign vector enumerated, :func:`_exact_p`). Rows are grouped by how many differences are left; a row
    with none left has p = 1. The sign is that of the sum of signed ranks."""
    d = np.asarray(differences, dtype=float)
    shape = d.shape[:-1]
    d = d.reshape(-1, d.shape[-1])
    p_value, sign = np.ones(len(d)), np.zeros(len(d))
    nonzero = d != 0
    left = nonzero.sum(axis=-1)
    for count in np.unique(left[left > 0]):
        rows = np.flatnonzero(left == count)
        kept = d[rows][nonzero[rows]].reshape(len(rows), count)
        doubled = np.rint(2 * scipy_stats.rankdata(np.abs(kept), axis=-1)).astype(np.int64)
        signed = (doubled * np.sign(kept).astype(np.int64)).sum(axis=-1)  # 2·(T+ − its mean under the null)
        if 2**count <= EXACT_LIMIT:
            signs = _sign_vectors(int(count))
            p_value[rows] = _exact_p(doubled, signed, lambda pattern, signs=signs: signs @ pattern)
        else:
            p_value[rows] = scipy_stats.wilcoxon(kept, axis=-1, method="asymptotic").pvalue
        sign[rows] = np.sign(signed)
    return RankTests(p_value.reshape(shape), sign.reshape(shape))


def rank_sum_tests(a: np.ndarray, b: np.ndarray) -> RankTests:
    """The exact Mann-Whitney U test of a against b (rows of shapes (..., n_a) and (..., n_b)), exact
    given the ties (seeds that failed tie at one value): the pooled values' midranks, and every way to
    deal them to the two sides enumerated (:func:`_exact_p`). The sign is that of U_a - n_a·n_b/2 (a's
    values tend to be larger where it is positive)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    shape, n_a, n_b = a.shape[:-1], a.shape[-1], b.shape[-1]
    pooled = np.concatenate([a.reshape(-1, n_a), b.reshape(-1, n_b)], axis=-1)
    doubled = np.rint(2 * scipy_stats.rankdata(pooled, axis=-1)).astype(np.int64)
    centre = n_a * (n_a + n_b + 1)  # 2·E[rank sum of a] under the null
    offset = doubled[:, :n_a].sum(axis=-1) - centre  # 2·(U_a − n_a·n_b/2)
    if math.comb(n_a + n_b, n_a) <= EXACT_LIMIT:
        subsets = _subsets(n_a + n_b, n_a)
        p_value = _exact_p(doubled, offset, lambda pattern: pattern[subsets].sum(axis=-1) - centre)
    else:
        p_value = scipy_stats.mannwhitneyu(pooled[:, :n_a], pooled[:, n_a:], axis=-1, method="asymptotic").pvalue
    return RankTests(np.asarray(p_value).reshape(shape), np.sign(offset).reshape(shape).astype(float))


def any_failed(*sides: np.ndarray) -> np.ndarray:
    """Whether any seed of the sides (rows of per-seed flags: the seed diverged or did not learn) failed,
    so that the question is decided by a rank test (``rank_based``): a side that mixes failed and
    learned seeds is bimodal, and a side whose seeds all failed against one that learned is a step no
    normal model describes either. The flags go with the seeds, not with the side, so swapping values
    between the sides (the rank tests' null arrangements) keeps the question rank-based, and both
    tests keep their level. The analysis and the simulation of the error rates both ask this."""
    return np.any([np.asarray(failed, dtype=bool).any(axis=-1) for failed in sides], axis=0)
