"""The verdict rule's error rates and power, by simulation with known truth at the book's seed noise.

    python benchmarks/verdict_error_rates.py --out results/verdict_error_rates.md   # about ten minutes
    python benchmarks/verdict_error_rates.py --reps 2000 --out -                    # a quick look

``blockbench.report.decide`` claims, per question: a false better/worse at most 5% of the time, a
false equivalent at most 5%, whether seeds come in rounds (α split over the looks) or as a fixed list,
and with a rank test where seeds failed to learn. This script checks those claims where they matter,
at the noise this project's runs actually have, and shows what the rule can find (its power):

1. **Noise.** From the committed book (``results/*/cells/<task>/<variant>/seed<k>/result.json``, read
   with ``blockbench.record.load_record``; matrices marked ``verdicts: false`` left out) it takes, for
   each task family (LM perplexity, translation BLEU, ViT accuracy) at the 300-step budget where the
   margins are set, every pair of variants of a matrix that share seeds, and the sample variance of
   their seed-matched differences. Identical pairs (the shared baselines appear in many matrices) count
   once. The robust pooled SD is √(median of s² / (median of χ²(df) / df)): were every pair's SD the
   same σ, s²·df/σ² would follow χ²(df), so this estimates σ, and a few pairs with failed seeds (BLEU
   0.5 against 99) cannot move it, while the plain pooled √(mean s²), shown beside, jumps.
2. **Margins**: LM 1% of the baseline's perplexity (the mean of the 300-step LM cells shared by most
   matrices, the book's common baseline), BLEU 1.0, accuracy 0.01: each task's declared ``margin``.
3. **Simulation**, for the default plan (``seeds: {min: 3, max: 9, step: 3}``, looks at 3, 6, 9 seeds),
   the same plan without its futility stop (to show what that stop saves and costs), and a fixed list
   of 3 seeds: both sides of a seed-matched comparison are drawn (baseline at the baseline's mean, the
   variant shifted by the true difference, each side's noise N(0, σ²/2), so each difference has SD σ);
   a question stops at the first look that decides it, or undecided where it is futile. The decisions
   come from the array functions ``decide.decide`` itself calls (``paired_moments``, ``t_tests``,
   ``t_verdicts``, ``prob_improvement``, ``futile``, ``signed_rank_tests``, ``rank_sum_tests``, ``rank_verdicts``,
   ``ranks.any_failed``), and a sample of the
   questions is decided again look by look through ``decide.decide`` (they must agree). Scenarios:
   (a) null, true difference 0: rate of better or worse; (b) true difference ± one margin: rate of
   equivalent; (c) power: every verdict's rate at 0, 0.5, 1, 2 and 4 margins (the variant better by
   that much) and the mean number of seeds used; (d) a bimodal null: on each side each seed has a 20%
   chance of not learning (its value at the task's trivial baseline, as the records give it): rate of
   better or worse as the analysis decides (the rank tests, signed-rank on pairs and Mann-Whitney U on
   disjoint seeds, where any seed of either side failed; t otherwise), and for comparison with
   the rank tests always and the t rule alone; (e) the futility bound: the share decided and the seeds
   used at each bound. Every rate has its Monte-Carlo standard error √(p(1 - p)/reps).
4. **The empirical null, resampled** (section (f)): the cells of ``configs/matrix/null_comparison.yaml``
   (the same model on both sides, 12 seeds per replica, so 24 runs of one model per task) are a pool
   of real training noise, not normal draws. Each resample deals two sides of 9 runs from the pool
   without replacement (the runs are exchangeable: same config, every seed draws its own data) and runs
   the same plans through the same rule (``switching_rule``: a rank test where a side holds runs that
   did not learn, as the record says, with runs that did); once as drawn (the null: rate of better or
   worse) and once with one side's learned runs moved by one margin either way (rate of equivalent).
   The runs share no data draw, so a pair is of two independent runs (noisier than the book's
   seed-matched pairs, and symmetric). The pool's shape is shown beside it (did not learn, SD of a run,
   skewness, Shapiro-Wilk p). A rate here is the
   rule's on this pool's distribution; the pool is one draw of 24 runs, so its own uncertainty is wider
   than the resampling error shown.
5. **Skewed differences and failed sides** (section (g)), on the default rounds, decided as the analysis
   decides: a verdict is about the typical seed (``decide``'s docstring), so (i) differences that are
   N(δ, σ²) for most seeds and N(tail, σ²) for a few bad seeds of the variant, with a mean of 0 (δ = 1
   BLEU and 5% of seeds at −19, δ = 2 and 10% at −18, δ = 2 and 5% at −38, stated at translation's SD
   3.25 with margin 1 and taken in units of each family's SD, so that they match there): the rate of
   the wrong direction (worse) and of equivalent, and beside it the mean's reading (better or worse,
   which is false for a mean of 0) and the t test without the typical seed's agreement; (ii) the same
   shapes shifted to a median difference of 0 and (iii) controls (no tail, a symmetric one): the rate
   of better or worse; (iv) identical sides whose seeds fail (at the trivial baseline) with probability
   0.2 to 0.6, in pairs and on disjoint seeds: the rate of better or worse, beside it with the rank test
   only where a side mixes failed and learned seeds. Each family at its own noise, and translation at SD
   3.25 besides (the noise the shapes were stated at), where :data:`FRONTIER` also shows how far the
   rates hold as the share of bad seeds grows.

The markdown names the command, the date, the code's commit, Python, numpy and scipy, and the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import platform
import shlex
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.optimize  # noqa: E402
import yaml  # noqa: E402
from scipy import stats as scipy_stats  # noqa: E402

from blockbench.provenance import cpu_model, git_state  # noqa: E402
from blockbench.record import load_record  # noqa: E402
from blockbench.report.decide import (  # noqa: E402
    BETTER,
    EQUIVALENT,
    FUTILITY,
    UNDECIDED,
    VERDICTS,
    WORSE,
    Looks,
    decide,
    futile,
    paired_moments,
    prob_improvement,
    rank_verdicts,
    t_tests,
    t_verdicts,
    welch_moments,
)
from blockbench.report.ranks import any_failed, rank_sum_tests, signed_rank_tests  # noqa: E402
from blockbench.tasks import TASK_CONFIGS  # noqa: E402


@dataclass(frozen=True)
class Family:
    """A task family of the book: its task, headline metric and direction, and its margin rule."""

    task: str
    label: str
    metric: str
    higher_is_better: bool
    #: the margin: an absolute difference, or a share of the baseline's mean (``relative``)
    margin: float
    relative: bool = False


def _family(task: str, label: str) -> Family:
    """A family with the headline metric and the margin its task declares (``TaskConfig.margin``)."""
    config = TASK_CONFIGS[task]
    metric, margin = config.metrics[0], config.margin
    return Family(task, label, metric.name, metric.higher_is_better, margin.value, relative=margin.relative)


FAMILIES = (
    _family("lm", "LM perplexity ↓"),
    _family("translation", "translation BLEU ↑"),
    _family("vit", "ViT accuracy ↑"),
)
#: the budget (trainer.max_steps) the noise is measured at: the margins are set there
BUDGET = 300
#: true differences of the power table, in margins (the variant better by that much)
MULTIPLES = (0.0, 0.5, 1.0, 2.0, 4.0)
#: the chance per seed and side of not learning in the bimodal null
FAIL_RATE = 0.2
#: the bimodal null's rule that the analysis applies: a rank test where any seed of either side failed
ANALYSIS_RULE = "as the analysis: rank test where a seed failed"
#: the plans simulated: the default rounds (with decide's futility stop), the same without it, and a
#: fixed list of three seeds
PLANS = {
    "rounds 3, 6, 9 (min 3, max 9, step 3)": Looks.plan(3, 9, 3),
    "rounds 3, 6, 9, no futility stop": Looks.plan(3, 9, 3, futility=0.0),
    "fixed 3 seeds": Looks.fixed(3),
}
#: the futility bounds compared in section (e), on the default rounds (decide.FUTILITY is the one used)
FUTILITY_BOUNDS = (0.0, 0.02, 0.05, 0.1, 0.2)
#: questions per scenario decided again through decide.decide, look by look (they must agree)
CROSS_CHECK = 40


# the book's noise ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noise:
    """What the book says about one family at the budget: the robust pooled SD of seed-matched
    differences (``sd``; ``sd_mean`` the plain pooled one), from how many pairs of variants, the
    baseline's mean and the trivial baseline's value, and the margin that follows."""

    family: Family
    sd: float
    sd_mean: float
    pairs: int
    baseline_mean: float
    trivial: float
    margin: float


def book_values(results: Path) -> dict[tuple[str, str, int, str], dict[int, float]]:
    """(matrix, task, steps, variant) -> seed -> headline value of every ok cell of the book's matrices
    that give verdicts (a matrix.yaml with ``verdicts: false`` answers no design question: the smoke
    demonstration, the empirical null, which section (f) reads)."""
    values: dict[tuple[str, str, int, str], dict[int, float]] = defaultdict(dict)
    for path in sorted(results.glob("*/cells/*/*/seed*/result.json")):
        matrix = path.relative_to(results).parts[0]
        settings = yaml.safe_load((results / matrix / "matrix.yaml").read_text()) or {}
        if settings.get("verdicts", True) is False:
            continue
        record = load_record(path)
        if record.ok and record.primary_metric and record.seed is not None and record.steps is not None:
            variant = path.parent.parent.name
            values[matrix, record.task, record.steps, variant][record.seed] = record.metrics[record.primary_metric]
    return values


def trivial_value(results: Path, family: Family) -> float:
    """The task's trivial baseline on its headline metric, as the book's records give it."""
    for path in sorted(results.glob(f"*/cells/{family.task}/*/seed*/result.json")):
        value = load_record(path).baselines.get(family.metric)
        if value is not None:
            return float(value)
    raise SystemExit(f"no record of task {family.task!r} under {results} gives its trivial baseline")


def measure_noise(results: Path, family: Family, budget: int = BUDGET) -> Noise:
    """The robust pooled SD of seed-matched differences between variants (see the module docstring)."""
    values = book_values(results)
    groups: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)
    for (matrix, task, steps, variant), seeds in values.items():
        if task == family.task and steps == budget:
            groups[matrix][variant] = seeds
    seen, scaled, variances = set(), [], []
    for variants in groups.values():
        for a, b in itertools.combinations(variants.values(), 2):
            common = sorted(a.keys() & b.keys())
            identity = frozenset((tuple(a[s] for s in common), tuple(b[s] for s in common)))
            if len(common) < 2 or identity in seen:
                continue
            seen.add(identity)
            dof = len(common) - 1
            variance = float(np.var([a[s] - b[s] for s in common], ddof=1))
            scaled.append(variance / (scipy_stats.chi2.median(dof) / dof))
            variances.append(variance)
    if not scaled:
        raise SystemExit(f"no pair of {family.task} variants at {budget} steps under {results} shares two seeds")
    # the common baseline: the cells (same values) that most matrices hold at this budget
    counts: dict[tuple[float, ...], int] = defaultdict(int)
    for variants in groups.values():
        for seeds in variants.values():
            counts[tuple(seeds[s] for s in sorted(seeds))] += 1
    baseline_mean = float(np.mean(max(counts, key=lambda cells: (counts[cells], len(cells)))))
    margin = family.margin * baseline_mean if family.relative else family.margin
    return Noise(
        family,
        float(np.sqrt(np.median(scaled))),
        float(np.sqrt(np.mean(variances))),
        len(scaled),
        baseline_mean,
        trivial_value(results, family),
        margin,
    )


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
    """decide's rank_based rule: exact signed-rank on pairs, exact Mann-Whitney U on disjoint seeds
    (no futility stop)."""

    def rule(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tests = signed_rank_tests(a - b) if paired else rank_sum_tests(a, b)
        verdicts = rank_verdicts(tests, looks.per_look_alpha, noise.family.higher_is_better)
        return verdicts, np.zeros(len(verdicts), dtype=bool)

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


# (g) skewed differences and failed sides ------------------------------------------------------------

#: the skewed shapes of section (g), stated in BLEU at the seed noise they were found at (SD 3.25,
#: margin 1): the typical seed's difference δ, the share of the variant's seeds that train badly, and
#: where those sit (the tail), so that the mean difference is 0; every family takes them in units of
#: its own SD (δ · SD / 3.25), so the shapes match at SD 3.25
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


# the empirical null, resampled ----------------------------------------------------------------------

#: the matrix whose cells are the pool of real training noise (configs/matrix/null_comparison.yaml)
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
            f"{_g(float(np.mean(learned)))}, SD of a run {_g(float(np.std(learned, ddof=1)))} "
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


# the report -----------------------------------------------------------------------------------------


def _g(value: float) -> str:
    return f"{value:.4g}"


def report(
    noises: list[Noise],
    runs: list[Simulated],
    sweeps: dict[str, dict[float, dict[float, Rates]]],
    resampled: list[Resampled],
    skews: list[SkewRun],
    reps: int,
    seed: int,
    command: str,
) -> str:
    """The markdown: what ran where, the noise, then the claims (a), (b), (d) and the power table (c)."""
    git = git_state()
    lines = [
        "# The verdict rule's error rates, by simulation at the book's seed noise",
        "",
        f"Produced by `{command}` on {datetime.date.today().isoformat()} "
        f"(code: {(git['commit'] or '?')[:12]}{' + uncommitted changes' if git['dirty'] else ''}).",
        "",
        f"- CPU: {cpu_model()}; Python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}",
        f"- {reps:,} simulated questions per scenario, numpy random generator seeded {seed}; every rate is "
        "shown ± its Monte-Carlo standard error √(p(1 - p)/reps). The rule is `blockbench.report.decide` "
        "(docs/decisions/verdict-rule.md); the script is `benchmarks/verdict_error_rates.py`, whose "
        "docstring says how the noise is measured and the questions drawn.",
        f"- Each simulated scenario's first {CROSS_CHECK} questions (sections (a) to (e) and (g)) were decided "
        "again look by look through "
        f"`decide.decide` itself: {sum(r.agreed for r in [*runs, *skews]):,} of "
        f"{sum(r.checked for r in [*runs, *skews]):,} agree "
        "with the array functions the rates come from.",
        "",
        f"## The seed noise of the book ({BUDGET} steps)",
        "",
        "| family | margin | pairs of variants | SD of seed-matched differences (robust) | plain pooled SD | "
        "baseline mean | trivial baseline | SD / margin |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for n in noises:
        rule = f"{n.family.margin:.0%} of {_g(n.baseline_mean)}" if n.family.relative else "absolute"
        lines.append(
            f"| {n.family.label} | {_g(n.margin)} ({rule}) | {n.pairs} | **{_g(n.sd)}** | {_g(n.sd_mean)} | "
            f"{_g(n.baseline_mean)} | {_g(n.trivial)} | {n.sd / n.margin:.2f} |"
        )
    lines += [
        "",
        "## The claims: at most 5% false verdicts",
        "",
        "(a) true difference 0: rate of better or worse; (b) true difference ± one margin: rate of "
        "equivalent; (d) bimodal null (each seed of each side fails to learn with probability "
        f"{FAIL_RATE:.0%}), decided as the analysis decides (a rank test where any seed of either side did not "
        "learn, the t test otherwise): rate of better or worse. Each must be at most 0.05.",
        "",
        "| family | plan | (a) null: better or worse | (b) +1 margin: equivalent | (b) −1 margin: equivalent | "
        "(d) bimodal, pairs: signed-rank | (d) bimodal, disjoint seeds: Mann-Whitney U |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in runs:
        lines.append(
            f"| {r.noise.family.label} | {r.plan} | {r.power[0.0].text(BETTER, WORSE)} | "
            f"{r.power[1.0].text(EQUIVALENT)} | {r.minus_margin.text(EQUIVALENT)} | "
            f"{r.bimodal['paired', ANALYSIS_RULE].text(BETTER, WORSE)} | "
            f"{r.bimodal['disjoint seeds', ANALYSIS_RULE].text(BETTER, WORSE)} |"
        )
    lines += [
        "",
        "### (d) the bimodal null by rule",
        "",
        "Rate of better or worse, and of equivalent (no error here: the true difference is 0; a rank test "
        "never says equivalent), under the bimodal null: the rank test always; as the analysis decides (the rank "
        "test where any seed of either side did not learn, `ranks.any_failed`; the t test "
        "otherwise); and the t test alone.",
        "",
        "| family | plan | seeds | rule | better or worse | equivalent | mean seeds used |",
        "|---|---|---|---|--:|--:|--:|",
    ]
    for r in runs:
        for (pairing, name), rates in r.bimodal.items():
            lines.append(
                f"| {r.noise.family.label} | {r.plan} | {pairing} | {name} | {rates.text(BETTER, WORSE)} | "
                f"{rates.text(EQUIVALENT)} | {rates.mean_seeds:.2f} |"
            )
    lines += [
        "",
        "## (c) Power: what the rule finds, by true difference",
        "",
        "The variant better by the given number of margins (0: the null). Shares of each verdict (± Monte-Carlo "
        "standard error of the largest) and the mean number of seeds a question used before it stopped.",
        "",
        "| family | plan | true difference | better | worse | equivalent | undecided | mean seeds used |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in runs:
        for multiple, rates in r.power.items():
            largest = max(VERDICTS, key=lambda v: rates.shares[v])
            shares = [f"{rates.shares[v]:.4f}" + (f" ± {rates.error(v):.4f}" if v == largest else "") for v in VERDICTS]
            lines.append(
                f"| {r.noise.family.label} | {r.plan} | {multiple:g} × {_g(r.noise.margin)} | "
                + " | ".join(shares)
                + f" | {rates.mean_seeds:.2f} |"
            )
    lines += [
        "",
        "## (e) The futility bound",
        "",
        "The default rounds with each futility bound (`Looks.plan(3, 9, 3, futility=...)`; 0: no stop; "
        f"the rule uses {FUTILITY:g}), the t rule, the same draws for every bound: the share of questions "
        "decided (better, worse or equivalent) and the mean seeds used, by true difference in margins.",
        "",
        "| family | bound | " + " | ".join(f"{m:g} × margin: decided / seeds" for m in MULTIPLES) + " |",
        "|---|--:|" + "--:|" * len(MULTIPLES),
    ]
    for label, sweep in sweeps.items():
        for bound, by_multiple in sweep.items():
            cells = [f"{1 - r.shares[UNDECIDED]:.3f} / {r.mean_seeds:.2f}" for r in by_multiple.values()]
            lines.append(f"| {label} | {bound:g} | " + " | ".join(cells) + " |")
    lines += ["", *pool_section(noises, resampled), "", *skew_section(skews)]
    lines += ["", *reading(noises, runs, resampled, skews), ""]
    return "\n".join(lines)


def pool_section(noises: list[Noise], resampled: list[Resampled]) -> list[str]:
    """Section (f): the empirical null's pool per family and the rule's rates on it."""
    lines = [
        "## (f) Real training noise: the empirical null, resampled",
        "",
        f"The cells of `{NULL_MATRIX}` (`configs/matrix/{NULL_MATRIX}.yaml`): the same model on both sides, "
        "every seed drawing its own data, so each task's runs are one pool of real training noise. Each "
        "resampled question deals two sides of the plan's runs from the pool without replacement and runs it "
        "through the analysis's rule (a rank test where a side holds a run that did not learn, as its record "
        "says); at ± one margin, the first side's learned runs are moved by one margin. "
        "Each must be at most 0.05. The runs share no data draw, so *pairs* pair independent runs: a "
        "difference has the noise of two runs, more than the book's seed-matched pairs (which share their "
        "data draw), and its sign is symmetric by construction; the check is of the rule's size and of its "
        "false equivalence at this noise, with real runs' tails and failures in place of normal draws. The ± "
        "is the resampling error only: the pool is one draw of its runs, so a rate's own uncertainty is wider.",
        "",
    ]
    if not resampled:
        missing = ", ".join(n.family.label for n in noises)
        return [*lines, f"Not run yet: `{NULL_MATRIX}` has no cells under this results folder ({missing}).", ""]
    reps = next((by[0.0].reps for r in resampled for by in r.rates.values()), 0)
    lines[-2] += (
        f" {reps:,} resampled questions per scenario; the first {CROSS_CHECK} of each were decided again look by "
        f"look through `decide.decide`: {sum(r.agreed for r in resampled):,} of "
        f"{sum(r.checked for r in resampled):,} agree. The matrix's own verdicts: "
        f"[its summary]({NULL_MATRIX}/summary.md)."
    )
    lines += ["| family | the pool |", "|---|---|"]
    for r in resampled:
        short = f"; too few runs for {', '.join(r.too_small)}" if r.too_small else ""
        lines.append(f"| {r.pool.noise.family.label} | {r.pool.describe()}{short} |")
    lines += [
        "",
        "| family | plan | seeds | null: better or worse | +1 margin: equivalent | −1 margin: equivalent | "
        "null: equivalent | null: mean seeds used |",
        "|---|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in resampled:
        for (plan, pairing), by_shift in r.rates.items():
            null = by_shift[0.0]
            lines.append(
                f"| {r.pool.noise.family.label} | {plan} | {pairing} | {null.text(BETTER, WORSE)} | "
                f"{by_shift[1.0].text(EQUIVALENT)} | {by_shift[-1.0].text(EQUIVALENT)} | "
                f"{null.shares[EQUIVALENT]:.4f} | {null.mean_seeds:.2f} |"
            )
    return lines


def skew_section(skews: list[SkewRun]) -> list[str]:
    """Section (g): skewed differences (the typical seed against the mean) and sides whose seeds fail."""
    if not skews:
        return []
    reps = skews[0].typical[0][1].reps
    lines = [
        "## (g) Skewed differences and failed sides: the typical seed",
        "",
        "A verdict is about the typical seed (docs/decisions/verdict-rule.md): how the variant's seeds typically "
        "compare with the baseline's. Seed-matched differences here are N(δ, σ²) for most seeds and N(tail, σ²) "
        f"for a share of the variant's seeds that train badly but still learn. The shapes are stated in BLEU at "
        f"SD {SKEW_SD:g} (margin 1) and taken in units of each family's own SD, so they match at that SD; the "
        f"first rows are at that SD, the noise they were stated at. The book's rounds (3, 6, 9 seeds, futility "
        f"stop), the analysis's rule; {reps:,} questions per row, each rate ± its Monte-Carlo standard error.",
        "",
        "(i) **Skewed, mean 0**: the typical seed is better by δ, a rare bad seed pulls the mean to 0. Errors "
        "for the typical seed: *worse* (the wrong direction), and *equivalent* where δ is at least the margin. "
        "Beside them, the mean's reading (its true value 0, so any better or worse is false) and the t test "
        "without the typical seed's agreement.",
        "",
        "| family | differences | δ / margin | worse (wrong direction) | equivalent | better | "
        "mean's reading: better or worse | t test alone: better or worse |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for k in skews:
        for shape, rates, alone in k.typical:
            ratio = shape.delta * k.noise.sd / k.noise.margin
            note = "" if ratio >= 1 else " (no error: δ < margin)"
            lines.append(
                f"| {k.noise.family.label} | {shape.text(k.noise)} | {ratio:.2f} | {rates.text(WORSE)} | "
                f"{rates.text(EQUIVALENT)}{note} | {rates.text(BETTER)} | {rates.text(BETTER, WORSE)} | "
                f"{alone.text(BETTER, WORSE)} |"
            )
    lines += [
        "",
        "(ii) **The typical seed no different**: the same shapes shifted to a median difference of 0 (the "
        "bulk a little better, the bad seeds worse); (iii) **controls**: no tail, and a symmetric one. Rate of "
        "better or worse; each must be at most 0.05.",
        "",
        "| family | kind | differences | better or worse | better | worse | t test alone: better or worse |",
        "|---|---|---|--:|--:|--:|--:|",
    ]
    for k in skews:
        for kind, shape, rates, alone in k.no_difference:
            lines.append(
                f"| {k.noise.family.label} | {kind} | {shape.text(k.noise)} | {rates.text(BETTER, WORSE)} | "
                f"{rates.text(BETTER)} | {rates.text(WORSE)} | {alone.text(BETTER, WORSE)} |"
            )
    lines += [
        "",
        "(iv) **Failed seeds, identical sides**: each seed of each side fails (sits at the trivial baseline) "
        "with the given probability. The rule takes the rank test wherever a seed of either side failed; beside "
        "it, the rank test only where a side mixes failed and learned seeds (a side whose seeds all failed then "
        "goes to the t test). Rate of better or worse; each must be at most 0.05.",
        "",
        "| family | failure probability | seeds | better or worse | rank test only where a side mixes | "
        "mean seeds used |",
        "|---|--:|---|--:|--:|--:|",
    ]
    for k in skews:
        for (p, pairing), (rates, mixed) in k.failed.items():
            lines.append(
                f"| {k.noise.family.label} | {p:g} | {pairing} | {rates.text(BETTER, WORSE)} | "
                f"{mixed.text(BETTER, WORSE)} | {rates.mean_seeds:.2f} |"
            )
    for k in (k for k in skews if k.frontier):
        lines += [
            "",
            f"**How far it holds** ({k.noise.family.label}): more bad seeds, each shape shifted to a median "
            "difference of 0 (the typical seed no different). Rate of better or worse. Where a third or more of "
            "the seeds train badly the variant is bimodal: three seeds all bad (0.4³ = 6.4% at 40%) look like a "
            "variant worse in every seed, and no test on so few seeds can tell them apart.",
            "",
            "| bad seeds | tail (SDs) | differences | better or worse | worse | t test alone: better or worse |",
            "|--:|--:|---|--:|--:|--:|",
        ]
        for shape, rates, alone in k.frontier:
            lines.append(
                f"| {shape.bad:.0%} | {shape.tail - shape.delta:+g} | {shape.text(k.noise)} | "
                f"{rates.text(BETTER, WORSE)} | {rates.text(WORSE)} | {alone.text(BETTER, WORSE)} |"
            )
    return lines


def reading(
    noises: list[Noise], runs: list[Simulated], resampled: list[Resampled], skews: list[SkewRun] = ()
) -> list[str]:
    """What the numbers say, from the numbers: the worst rate of each claim and where equivalence can
    be shown at all."""
    worst_null = max(runs, key=lambda r: r.power[0.0].share(BETTER, WORSE))
    equivalents = [(rates, r) for r in runs for rates in (r.power[1.0], r.minus_margin)]
    worst_equivalent, worst_equivalent_run = max(equivalents, key=lambda pair: pair[0].share(EQUIVALENT))
    worst_bimodal = max(
        ((r, key) for r in runs for key in r.bimodal if key[1] != "t test"),
        key=lambda rk: rk[0].bimodal[rk[1]].share(BETTER, WORSE),
    )
    r, key = worst_bimodal
    lines = [
        "## Reading",
        "",
        f"- Largest null rate of better or worse: {worst_null.power[0.0].text(BETTER, WORSE)} "
        f"({worst_null.noise.family.label}, {worst_null.plan}).",
        f"- Largest rate of a false equivalent at ± one margin: {worst_equivalent.text(EQUIVALENT)} "
        f"({worst_equivalent_run.noise.family.label}, {worst_equivalent_run.plan}).",
        f"- Largest bimodal-null rate of better or worse with a rank test: {r.bimodal[key].text(BETTER, WORSE)} "
        f"({r.noise.family.label}, {r.plan}, {key[0]}, {key[1]}).",
    ]
    cells = [(res, plan, pairing, by) for res in resampled for (plan, pairing), by in res.rates.items()]
    if cells:
        null = max(cells, key=lambda c: c[3][0.0].share(BETTER, WORSE))
        equivalent, shift = max(
            ((c, shift) for c in cells for shift in (1.0, -1.0)), key=lambda cs: cs[0][3][cs[1]].share(EQUIVALENT)
        )
        lines += [
            f"- On real training noise (the empirical null resampled): largest null rate of better or worse "
            f"{null[3][0.0].text(BETTER, WORSE)} ({null[0].pool.noise.family.label}, {null[1]}, {null[2]}); largest "
            f"false equivalent {equivalent[3][shift].text(EQUIVALENT)} ({equivalent[0].pool.noise.family.label}, "
            f"{equivalent[1]}, {equivalent[2]}, {shift:+g} margin).",
        ]
    lines += skew_reading(skews)
    for n in noises:
        parts = []
        for r in (r for r in runs if r.noise is n):
            found = next((m for m in MULTIPLES if m and r.power[m].shares[BETTER] >= 0.8), None)
            power = (
                f"{found:g} × the margin found better in ≥ 80%"
                if found
                else "no difference up to 4 × the margin found in 80%"
            )
            parts.append(f"{r.plan}: equivalent at a true 0 in {r.power[0.0].shares[EQUIVALENT]:.1%}, {power}")
        lines.append(f"- {n.family.label}, seed noise {n.sd / n.margin:.2f} margins. " + "; ".join(parts) + ".")
    lines.append(
        "- A rank test cannot decide with 3 seeds (the smallest exact two-sided p-value of 3 pairs is 0.25, "
        "of 3 against 3 seeds 0.1): a question with a failed seed needs the rounds to be decided."
    )
    return lines


def skew_reading(skews: list[SkewRun]) -> list[str]:
    """Section (g)'s worst rates: the wrong direction and a false equivalent for the typical seed, better
    or worse where it is no different and where seeds fail, and the mean's reading beside them."""
    if not skews:
        return []

    def worst(rows, share):
        return max(rows, key=lambda row: share(row[1]))

    typical = [(k, rates, alone) for k in skews for _, rates, alone in k.typical]
    equivalents = [
        (k, rates) for k in skews for shape, rates, _ in k.typical if shape.delta * k.noise.sd >= k.noise.margin
    ]
    none = [(k, rates, kind) for k in skews for kind, _, rates, _ in k.no_difference]
    failed = [(k, rates, key) for k in skews for key, (rates, _) in k.failed.items()]
    wrong = worst(typical, lambda r: r.share(WORSE))
    mean = worst(typical, lambda r: r.share(BETTER, WORSE))
    lines = [
        f"- Skewed differences, the typical seed better (section (g)): largest rate of the wrong direction "
        f"{wrong[1].text(WORSE)} ({wrong[0].noise.family.label}); the mean's reading (true mean 0) says better or "
        f"worse in up to {mean[1].text(BETTER, WORSE)} ({mean[0].noise.family.label}), the t test alone "
        f"{max(a.share(BETTER, WORSE) for _, _, a in typical):.4f}.",
    ]
    if equivalents:
        eq = worst(equivalents, lambda r: r.share(EQUIVALENT))
        lines[-1] = lines[-1][:-1] + (
            f"; a false equivalent where δ ≥ margin at most {eq[1].text(EQUIVALENT)} ({eq[0].noise.family.label})."
        )
    still = worst(none, lambda r: r.share(BETTER, WORSE))
    fails = worst(failed, lambda r: r.share(BETTER, WORSE))
    lines += [
        f"- The typical seed no different (median difference 0, and the controls): largest rate of better or worse "
        f"{still[1].text(BETTER, WORSE)} ({still[0].noise.family.label}, {still[2]}).",
        f"- Identical sides whose seeds fail: largest rate of better or worse {fails[1].text(BETTER, WORSE)} "
        f"({fails[0].noise.family.label}, failure probability {fails[2][0]:g}, {fails[2][1]}); with the rank test "
        f"only where a side mixes, up to {max(m.share(BETTER, WORSE) for k in skews for _, m in k.failed.values()):.4f}"
        ".",
    ]
    edges = [(shape, rates) for k in skews for shape, rates, _ in k.frontier]
    beyond = [(shape, rates) for shape, rates in edges if rates.share(BETTER, WORSE) > 0.05]
    holds = [shape.bad for shape, _ in edges if shape.bad < min((s.bad for s, _ in beyond), default=2.0)]
    if edges:
        text = f"- How far it holds: at most 0.05 with up to {max(holds, default=0):.0%} bad seeds"
        if beyond:
            shape, rates = max(beyond, key=lambda sr: sr[1].share(BETTER, WORSE))
            text += (
                f"; above it with {min(s.bad for s, _ in beyond):.0%} or more far off (up to "
                f"{rates.text(BETTER, WORSE)} at {shape.bad:.0%}, {shape.tail - shape.delta:+g} SDs): a bimodal "
                "variant that a few seeds cannot tell from a consistently worse one"
            )
        lines.append(text + ".")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="the book to measure the noise in")
    parser.add_argument("--reps", type=int, default=200_000, help="simulated questions per scenario")
    parser.add_argument("--pool-reps", type=int, default=20_000, help="resampled questions per pool scenario")
    parser.add_argument(
        "--skew-reps",
        type=int,
        default=None,
        help=f"simulated questions per section (g) scenario (default: --reps, at most {SKEW_REPS:,})",
    )
    parser.add_argument("--seed", type=int, default=20260531, help="the random generator's seed")
    parser.add_argument("--out", default="results/verdict_error_rates.md", help="markdown file, or - to print only")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rng = np.random.default_rng(args.seed)
    noises = [measure_noise(args.results, family) for family in FAMILIES]
    for n in noises:
        print(
            f"{n.family.label}: SD of seed-matched differences {n.sd:.4g} (robust, {n.pairs} pairs; plain "
            f"{n.sd_mean:.4g}), margin {n.margin:.4g}, baseline {n.baseline_mean:.4g}, trivial {n.trivial:.4g}"
        )
    runs = [simulate(n, plan, looks, args.reps, rng) for n in noises for plan, looks in PLANS.items()]
    sweeps = {n.family.label: futility_sweep(n, args.reps, rng) for n in noises}
    pools = [pool for pool in (null_pool(args.results, n) for n in noises) if pool is not None]
    resampled = [resample(pool, args.pool_reps, rng) for pool in pools]
    stated = next(n for n in noises if n.family.task == "translation")  # the noise the skewed shapes were stated at
    label = f"{stated.family.label} at SD {SKEW_SD:g}"
    stated = replace(stated, family=replace(stated.family, label=label), sd=SKEW_SD)
    skew_reps = args.skew_reps or min(args.reps, SKEW_REPS)
    skews = [simulate_skew(stated, skew_reps, rng, frontier=True), *(simulate_skew(n, skew_reps, rng) for n in noises)]
    command = "python " + " ".join(
        shlex.quote(a) for a in ["benchmarks/verdict_error_rates.py", *(argv or sys.argv[1:])]
    )
    text = report(noises, runs, sweeps, resampled, skews, args.reps, args.seed, command)
    print(text)
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
