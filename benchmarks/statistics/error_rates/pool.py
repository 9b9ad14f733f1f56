"""The empirical null (section (f)): the null matrix's runs as a pool, resampled into two sides and run
through the same plans and rule."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from benchmarks.statistics.error_rates.noise import BUDGET, CROSS_CHECK, PLANS, Noise, four_digits
from benchmarks.statistics.error_rates.simulate import Rates, decide_sequentially, sequential, switching_rule
from blockbench.report.decide import (
    Looks,
)
from blockbench.store.record import load_record

NULL_MATRIX = "null_comparison"
#: the plans resampled from the pool (the pool has 24 runs per task: 9 + 9 fit, with room to vary)
POOL_PLANS = {plan: PLANS[plan] for plan in ("rounds 3, 6, 9 (min 3, max 9, step 3)", "fixed 3 seeds")}


@dataclass(frozen=True)
class Pool:
    """The empirical null's runs of one family: the headline value of every finished cell of both
    replicas (a diverged one at the worse of the trivial baseline and the pool's worst finished value:
    the analysis takes the worst of the look's), which of them did not learn, and the margin at the
    learned runs' mean (the analysis takes each question's baseline mean)."""

    noise: Noise
    values: np.ndarray
    failed: np.ndarray
    margin: float

    def describe(self) -> str:
        learned = self.values[~self.failed]
        shapiro = scipy_stats.shapiro(learned).pvalue if len(learned) >= 3 else float("nan")
        return (
            f"{len(self.values)} runs, {int(self.failed.sum())} did not learn; learned runs: mean "
            f"{four_digits(float(np.mean(learned)))}, SD of a run {four_digits(float(np.std(learned, ddof=1)))} "
            f"({float(np.std(learned, ddof=1)) / self.margin:.2f} margins), skewness "
            f"{float(scipy_stats.skew(learned)):+.2f}, Shapiro-Wilk p {shapiro:.3g}"
        )


def null_pool(results: Path, noise: Noise) -> Pool | None:
    """The pool of :data:`NULL_MATRIX` for one family, or None where the book has no such cells."""
    family = noise.family
    values, failed, diverged = [], [], 0
    for path in sorted((results / NULL_MATRIX / "cells" / family.task).glob("*/seed*/result.json")):
        record = load_record(path)
        if record.ok and record.steps == BUDGET and family.metric in record.metrics:
            values.append(float(record.metrics[family.metric]))
            failed.append(record.did_not_learn)
        diverged += record.status == "diverged"
    if not values:
        return None
    worst = (min if family.higher_is_better else max)([*values, noise.trivial])
    values += [worst] * diverged
    failed += [True] * diverged
    learned = [v for v, f in zip(values, failed, strict=True) if not f] or values
    margin = family.margin * float(np.mean(learned)) if family.relative else family.margin
    return Pool(noise, np.array(values), np.array(failed), margin)


def fits(pool: Pool, looks: Looks) -> bool:
    """Whether the pool holds two sides of the plan's last look."""
    return 2 * looks.sizes[-1] <= len(pool.values)


def resample_pool(
    pool: Pool, looks: Looks, paired: bool, shift: float, reps: int, rng: np.random.Generator
) -> tuple[Rates, int]:
    """``reps`` questions dealt from the pool without replacement (two sides of ``looks.sizes[-1]`` runs),
    the first side's learned runs moved by ``shift`` margins in the better direction, decided by the
    analysis's rule (the rank test where a side holds a run that did not learn); and how many of the
    first :data:`CROSS_CHECK` ``decide.decide`` decides the same, look by look. "Paired" pairs runs
    that share nothing (the replicas' seeds draw their own data), so a difference has the noise of two
    independent runs, more than the book's seed-matched pairs, which share a data draw."""
    n = looks.sizes[-1]
    if not fits(pool, looks):
        raise ValueError(f"the {pool.noise.family.task} pool has {len(pool.values)} runs: {2 * n} are needed")
    order = np.argsort(rng.random((reps, len(pool.values))), axis=1)
    a_index, b_index = order[:, :n], order[:, n : 2 * n]
    sign = 1.0 if pool.noise.family.higher_is_better else -1.0
    a = pool.values[a_index] + np.where(pool.failed[a_index], 0.0, sign * shift * pool.margin)
    b = pool.values[b_index]
    noise = replace(pool.noise, margin=pool.margin)
    # the failed runs keep their values (only learned runs move) and sit past the trivial baseline, where
    # no learned run is, so the rule can tell them by value, as it tells the simulation's
    failed_values = pool.values[pool.failed]

    def is_failed(values: np.ndarray) -> np.ndarray:
        return np.isin(values, failed_values)

    verdicts, used = sequential(a, b, looks, switching_rule(noise, looks, paired, failed=is_failed))
    agreed = sum(
        decide_sequentially(a[row], b[row], noise, looks, paired, "switch", is_failed) == (verdicts[row], used[row])
        for row in range(min(CROSS_CHECK, reps))
    )
    return Rates.of(verdicts, used), agreed


@dataclass(frozen=True)
class Resampled:
    """One family's pool and, per plan and pairing, the rates: the null's (shift 0) and at ± one margin;
    the plans the pool is too small for; and how many questions ``decide.decide`` decided again, and
    agreed on."""

    pool: Pool
    rates: dict[tuple[str, str], dict[float, Rates]]
    too_small: tuple[str, ...] = ()
    checked: int = 0
    agreed: int = 0


def resample(pool: Pool, reps: int, rng: np.random.Generator) -> Resampled:
    """Section (f): every plan of :data:`POOL_PLANS` that the pool holds, in pairs of independent runs
    and on disjoint seeds (as the null matrix's replicas are decided), at shifts 0 and ± one margin."""
    rates, checked, agreed = {}, 0, 0
    too_small = tuple(plan for plan, looks in POOL_PLANS.items() if not fits(pool, looks))
    for plan, looks in POOL_PLANS.items():
        if plan in too_small:
            continue
        for pairing, paired in (("pairs", True), ("disjoint seeds", False)):
            rates[plan, pairing] = {}
            for shift in (0.0, 1.0, -1.0):
                rates[plan, pairing][shift], same = resample_pool(pool, looks, paired, shift, reps, rng)
                checked, agreed = checked + min(CROSS_CHECK, reps), agreed + same
    return Resampled(pool, rates, too_small, checked, agreed)
