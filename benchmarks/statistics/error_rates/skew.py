"""Skewed differences and failed sides (section (g)): shapes with a few bad seeds, decided as the
analysis decides, and identical sides whose seeds fail."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy
import scipy.optimize
from scipy import stats as scipy_stats

from benchmarks.statistics.error_rates.noise import CROSS_CHECK, PLANS, Noise
from benchmarks.statistics.error_rates.simulate import (
    Rates,
    Rule,
    decide_sequentially,
    draw,
    sequential,
    switching_rule,
    t_rule,
)

SKEWED = ((1.0, 0.05, -19.0), (2.0, 0.10, -18.0), (2.0, 0.05, -38.0))
SKEW_SD = 3.25
#: the per-seed failure probabilities of section (g)'s identical sides
FAILURE_PROBABILITIES = (0.2, 0.3, 0.4, 0.5, 0.6)
#: section (g)'s plan: the book's rounds
SKEW_PLAN = "rounds 3, 6, 9 (min 3, max 9, step 3)"
#: section (g)'s questions per scenario unless told (its 82 scenarios, each under two rules, would take several
#: times the other sections' time at --reps; 10^5 puts a rate near 0.05 within ± 0.0007)
SKEW_REPS = 100_000
#: how far the typical seed's rates hold: shares of bad seeds and their tails (in SDs), each shape
#: shifted to a median difference of 0, on the noise the shapes were stated at
FRONTIER = tuple((bad, tail) for tail in (-4.0, -12.0) for bad in (0.05, 0.1, 0.2, 0.3, 0.4))


@dataclass(frozen=True)
class Shape:
    """Seed-matched differences in units of the family's SD (the better direction positive): N(δ, 1)
    for most seeds, N(tail, 1) for a share ``bad`` of them (the variant's bad seeds; ``symmetric``:
    half of them at +tail, half at −tail)."""

    delta: float
    bad: float = 0.0
    tail: float = 0.0
    symmetric: bool = False

    def median(self) -> float:
        """The median of the differences (the mixture's; 0 for a symmetric shape around 0)."""
        cdf = scipy_stats.norm.cdf
        tails = ((self.bad / 2, self.tail), (self.bad / 2, -self.tail)) if self.symmetric else ((self.bad, self.tail),)

        def below(m: float) -> float:
            return (1 - self.bad) * cdf(m - self.delta) + sum(w * cdf(m - t) for w, t in tails) - 0.5

        reach = abs(self.tail) + abs(self.delta) + 10
        return float(scipy.optimize.brentq(below, -reach, reach))

    def shifted(self, by: float) -> Shape:
        return replace(self, delta=self.delta + by, tail=self.tail + by)

    def text(self, noise: Noise) -> str:
        """``δ +0.631, 5% at −11.98`` in the family's units (``±`` for a symmetric tail; ``no tail``)."""
        head = f"δ {self.delta * noise.sd:+.3g}"
        if not self.bad:
            return f"{head}, no tail"
        return f"{head}, {self.bad:.0%} at {'±' if self.symmetric else ''}{self.tail * noise.sd:.4g}"


def draw_shape(rng: np.random.Generator, noise: Noise, reps: int, seeds: int, shape: Shape):
    """``reps`` questions of ``seeds`` seed pairs whose differences follow ``shape`` (each side's noise
    N(0, σ²/2), as :func:`draw`; the bad seeds the variant's): (variant, baseline)."""
    sign = 1.0 if noise.family.higher_is_better else -1.0
    side_sd = noise.sd / np.sqrt(2)
    tail = shape.tail * (np.where(rng.random((reps, seeds)) < 0.5, -1.0, 1.0) if shape.symmetric else 1.0)
    shift = np.where(rng.random((reps, seeds)) < shape.bad, tail, shape.delta) * noise.sd
    baseline = noise.baseline_mean + rng.normal(0.0, side_sd, (reps, seeds))
    variant = noise.baseline_mean + sign * shift + rng.normal(0.0, side_sd, (reps, seeds))
    return variant, baseline


@dataclass(frozen=True)
class SkewRun:
    """Section (g) for one family, each scenario's rates under the rule and under the rule beside it:
    (i) the skewed shapes (beside: the t test alone), (ii) the same shifted to a median of 0 and (iii)
    the controls (beside: the t test alone), (iv) identical sides with failed seeds by probability and
    pairing (beside: the rank test only where a side mixes); and, where asked, the :data:`FRONTIER`
    shapes at a median of 0 (beside: the t test alone)."""

    noise: Noise
    typical: list[tuple[Shape, Rates, Rates]]
    no_difference: list[tuple[str, Shape, Rates, Rates]]
    failed: dict[tuple[float, str], tuple[Rates, Rates]]
    checked: int
    agreed: int
    frontier: list[tuple[Shape, Rates, Rates]]


def simulate_skew(noise: Noise, reps: int, rng: np.random.Generator, frontier: bool = False) -> SkewRun:
    """Section (g) for one family on the book's rounds (see the module docstring); ``frontier``: the
    :data:`FRONTIER` shapes too."""
    looks = PLANS[SKEW_PLAN]
    seeds = looks.sizes[-1]
    checked = agreed = 0

    def run(sides, other: Rule, paired: bool = True) -> tuple[Rates, Rates]:
        nonlocal checked, agreed
        verdicts, used = sequential(*sides, looks, switching_rule(noise, looks, paired))
        for row in range(min(CROSS_CHECK, len(verdicts))):
            again = decide_sequentially(sides[0][row], sides[1][row], noise, looks, paired, "switch")
            checked, agreed = checked + 1, agreed + (again == (verdicts[row], used[row]))
        return Rates.of(verdicts, used), Rates.of(*sequential(*sides, looks, other))

    t_alone = t_rule(noise, looks, typical=False)
    shapes = [Shape(delta / SKEW_SD, bad, tail / SKEW_SD) for delta, bad, tail in SKEWED]
    typical = [(shape, *run(draw_shape(rng, noise, reps, seeds, shape), t_alone)) for shape in shapes]
    controls = [("median 0", shape.shifted(-shape.median())) for shape in shapes] + [
        ("control", Shape(0.0)),
        ("control", Shape(0.0, 0.05, 19.0 / SKEW_SD, symmetric=True)),
    ]
    no_difference = [
        (kind, shape, *run(draw_shape(rng, noise, reps, seeds, shape), t_alone)) for kind, shape in controls
    ]
    failed = {}
    for p in FAILURE_PROBABILITIES:
        for pairing, paired in (("pairs", True), ("disjoint seeds", False)):
            sides = draw(rng, noise, reps, seeds, 0.0, p)
            failed[p, pairing] = run(sides, switching_rule(noise, looks, paired, only_mixed=True), paired)
    edges = [Shape(0.0, bad, tail) for bad, tail in FRONTIER] if frontier else []
    edges = [shape.shifted(-shape.median()) for shape in edges]
    far = [(shape, *run(draw_shape(rng, noise, reps, seeds, shape), t_alone)) for shape in edges]
    return SkewRun(noise, typical, no_difference, failed, checked, agreed, far)
