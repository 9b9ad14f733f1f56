"""The trend rule's error rates and power, by simulation with known truth at the book's seed noise.

    python -m benchmarks.statistics.trend_error_rates --out results/trend_error_rates.md   # a few minutes
    python -m benchmarks.statistics.trend_error_rates --quick --out -                      # a quick look

``blockbench.report.trend`` claims, per question: under a true slope of 0 a ladder says grows, shrinks
or reverses in at most α of questions; at a true slope of ± the margin δ it says holds in at most α;
and seeds that fail (bimodal θ, decided by the rank trend test) keep the false-trend rate near α. This
script checks those claims at the noise of the book's runs and shows what the rule can find:

1. **Noise** (:func:`measure`). From the committed book (``results/*/cells/<task>/<variant>/seed<k>/
   result.json`` at the 300-step budget, matrices marked ``verdicts: false`` left out) it takes, per task,
   every pair of variants of a matrix that share seeds and the sample variance over their seeds of
   θ = ln(loss_a - floor) - ln(loss_b - floor) (the floor: the record's ``loss_floor``, 0 where it has
   none); identical pairs count once. The robust pooled SD is √(median of s² / (median of χ²(df)/df)),
   as the verdict rule's simulation pools its differences: a pair with a seed that failed cannot move it.
   Beside it: the baseline's seed SD of ln(loss - floor) (pooled the same way over single variants),
   the common baseline's mean ln(loss - floor) (the variant most matrices share), and the loss a failed
   seed counts at (the record's trivial ``loss`` baseline, else the task's worst recorded loss).
2. **Ladders** (:func:`draw`): rungs at 1/4, 1, 4 and 16 times the book's cell (x = -2, 0, 2, 4
   doublings), 3 seed pairs per rung unless a row says 9. The baseline's ln(loss - floor) falls by
   :data:`EXPONENT` per unit of ln compute plus its seed noise; each pair's θ is the true line plus noise
   of the task's SD (normal; Student t with 3 df scaled to the same SD for heavy tails; a top rung
   three times noisier for uneven rungs); a failed seed (each side, each seed, independently) counts at
   the trivial loss, which sends its ladder to the rank trend test. The words come from
   ``trend.analyse_rows`` and the baseline's gate from ``slope.fit_slope``, the functions
   ``trend.trend`` calls, and a sample of each scenario's ladders is decided again through
   ``trend.trend`` itself from typed records (they must agree).
3. **Scenarios**: (a) null, β = 0 with θ at 0 and at an effect decided at every rung (3σ): the rate of a
   false grows, shrinks or reverses, and of the slope test's rejection; (b) β = ± δ: the rate of holds;
   (c) power: every word's rate at β = 0, δ, 2δ and 4δ (the variant's advantage growing), on 3 and 9
   pairs; (d) uneven rungs and heavy tails under the null; (e) bimodal nulls, seeds failing with chance
   0.1 and 0.2, on 3 and 9 pairs; (f) seeds in rounds (:func:`in_rounds`), the plans of looks at 3 and 6
   pairs (the flagship ladder's) and at 3, 6 and 9 (the book's): every rung's per-rung question decided
   look by look, a rung undecided at a look given the next look's pairs, and the trend decided once on
   the pairs each rung ended with, at α and at the plan's per-look α/K. Every rate has its Monte-Carlo
   standard error √(p(1 - p)/reps).

The markdown names the command, the date, the code's commit, the packages and the CPU
(``benchmarks.harness.report_header``).
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import scipy
import yaml
from scipy import stats as scipy_stats

from benchmarks import ROOT
from benchmarks.harness import command_line, machine_facts, print_and_write, report_header
from benchmarks.statistics.error_rates.noise import Family, Noise
from benchmarks.statistics.error_rates.simulate import sequential, switching_rule
from blockbench.prereg import ALPHA
from blockbench.report.decide import Looks
from blockbench.report.slope import Design
from blockbench.report.trend import (
    DELTA,
    DID_NOT_LEARN,
    GROWS,
    HOLDS,
    NOT_SCALING,
    OK,
    REVERSES,
    SHRINKS,
    UNDECIDED,
    Ladder,
    Rung,
    SeedLoss,
    analyse_rows,
    scaling_gate,
    trend,
)
from blockbench.store.record import load_record

TASKS = ("lm", "translation", "vit")
#: the budget the noise is measured at (the book's cells, the ladder's middle rung R0)
BUDGET = 300
#: the ladder's rungs, as multiples of the book's cell's compute
SCALES = (0.25, 1.0, 4.0, 16.0)
#: the baseline's assumed scaling exponent (ln reducible loss per ln compute). The words do not depend on
#: it but through the scaling gate, which at this exponent and the book's baseline noise passes in
#: nearly every simulated ladder (the report shows the share)
EXPONENT = 0.15
#: the per-rung SD multipliers of the uneven-rung scenario: the top rung three times noisier
UNEVEN = (1.0, 1.0, 1.0, 3.0)
#: Student t's degrees of freedom in the heavy-tailed scenario (scaled to the task's SD)
TAIL_DF = 3
#: θ of the null with an effect: this many SDs of a pair, decided at every rung on 3 pairs most often
EFFECT_SDS = 3.0
#: ladders per scenario decided again through trend.trend from typed records
CROSS_CHECK = 30
MISTAKES = (GROWS, SHRINKS, REVERSES)
#: section (f)'s seed plans, the pairs at each look: the flagship ladder's and the book's
ROUND_PLANS = ((3, 6), (3, 6, 9))
#: section (f)'s per-rung margin on the loss, nats: the LM's 1% of perplexity, standing in for every
#: task's headline margin (what matters here is that some rungs stop at the first look and some go on)
RUNG_MARGIN = 0.01
#: section (f)'s ladders per scenario, as a share of the other sections' (its rungs run the per-rung rule too)
ROUND_SHARE = 5


# the book's noise ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThetaNoise:
    """One task's noise in the book (see the module's docstring, 1.)."""

    task: str
    sd: float
    sd_plain: float
    pairs: int
    baseline_sd: float
    log_reducible: float
    log_trivial: float
    floor: float


def book_losses(results: Path, task: str) -> dict[tuple[str, str], dict[int, tuple[float, float]]]:
    """(matrix, variant) -> seed -> (loss, floor) of every ok cell of ``task`` at :data:`BUDGET`, in the
    matrices that give verdicts; and the trivial loss, where a record gives it, under the key ("", "")."""
    losses: dict[tuple[str, str], dict[int, tuple[float, float]]] = defaultdict(dict)
    for path in sorted(results.glob(f"*/cells/{task}/*/seed*/result.json")):
        matrix = path.relative_to(results).parts[0]
        settings = yaml.safe_load((results / matrix / "matrix.yaml").read_text()) or {}
        record = load_record(path)
        if settings.get("verdicts", True) is False or not record.ok or record.steps != BUDGET:
            continue
        if "loss" in record.metrics and record.seed is not None:
            floor = float(record.baselines.get("loss_floor", 0.0))
            losses[matrix, path.parent.parent.name][record.seed] = (float(record.metrics["loss"]), floor)
            if "loss" in record.baselines:
                losses["", ""][0] = (float(record.baselines["loss"]), floor)
    return losses


def robust_sd(variances: list[float], dofs: list[int]) -> float:
    """√(median of s² / (median of χ²(df)/df)): σ were every sample's SD the same (module docstring, 1.)."""
    return float(
        np.sqrt(np.median([v / (scipy_stats.chi2.median(d) / d) for v, d in zip(variances, dofs, strict=True)]))
    )


def measure(results: Path, task: str) -> ThetaNoise:
    """The task's :class:`ThetaNoise` from the book under ``results``."""
    losses = book_losses(results, task)
    trivial = losses.pop(("", ""), {}).get(0)
    if not losses:
        raise SystemExit(f"no {task} cell at {BUDGET} steps under {results}")
    logs = {
        key: {s: math.log(max(loss - floor, 1e-3)) for s, (loss, floor) in seeds.items()}
        for key, seeds in losses.items()
    }
    seen, variances, dofs = set(), [], []
    by_matrix: dict[str, list[dict[int, float]]] = defaultdict(list)
    for (matrix, _), seeds in logs.items():
        by_matrix[matrix].append(seeds)
    for variants in by_matrix.values():
        for a, b in itertools.combinations(variants, 2):
            common = sorted(a.keys() & b.keys())
            identity = frozenset((tuple(a[s] for s in common), tuple(b[s] for s in common)))
            if len(common) < 2 or identity in seen:
                continue
            seen.add(identity)
            variances.append(float(np.var([a[s] - b[s] for s in common], ddof=1)))
            dofs.append(len(common) - 1)
    singles = {tuple(sorted(seeds.items())) for seeds in logs.values() if len(seeds) >= 2}
    baseline_sd = robust_sd([float(np.var([v for _, v in s], ddof=1)) for s in singles], [len(s) - 1 for s in singles])
    counts: dict[tuple[tuple[int, float], ...], int] = defaultdict(int)
    for seeds in logs.values():
        counts[tuple(sorted(seeds.items()))] += 1
    common_baseline = max(counts, key=lambda cells: (counts[cells], len(cells)))
    floor = float(np.median([floor for seeds in losses.values() for _, floor in seeds.values()]))
    worst = trivial[0] if trivial else max(loss for seeds in losses.values() for loss, _ in seeds.values())
    return ThetaNoise(
        task,
        robust_sd(variances, dofs),
        float(np.sqrt(np.mean(variances))),
        len(variances),
        baseline_sd,
        float(np.mean([v for _, v in common_baseline])),
        math.log(worst - floor),
        floor,
    )


# the simulated ladders ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A family of ladders with a known truth: θ = ``theta0`` + ``slope`` · x (x in doublings from the
    book's cell), ``pairs`` per rung, the noise's shape (``uneven``: per-rung SD multipliers; ``tail``:
    Student t df, 0 for normal) and each seed's chance to fail."""

    name: str
    slope: float
    theta0: float = 0.0
    pairs: int = 3
    uneven: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)
    tail: int = 0
    fail_rate: float = 0.0


def design(pairs: int, log: bool) -> Design:
    """The ladder's design: x in doublings from the book's cell, or in ln compute (the baseline's fit)."""
    x = tuple((math.log(s) if log else math.log2(s)) for s in SCALES)
    return Design(x, (pairs,) * len(SCALES))


def draw(noise: ThetaNoise, scenario: Scenario, reps: int, rng: np.random.Generator):
    """``reps`` ladders: each side's ln(loss - floor) per seed (rows of shape (reps, N)) and which seeds
    failed (each side), as the module's docstring (2.) says."""
    doublings = design(scenario.pairs, log=False).value_x
    shape = (reps, len(doublings))
    baseline = noise.log_reducible - EXPONENT * doublings * math.log(2) + noise.baseline_sd * rng.standard_normal(shape)
    if scenario.tail:
        errors = rng.standard_t(scenario.tail, shape) / math.sqrt(scenario.tail / (scenario.tail - 2))
    else:
        errors = rng.standard_normal(shape)
    spread = noise.sd * np.repeat(scenario.uneven, scenario.pairs)
    variant = baseline + scenario.theta0 + scenario.slope * doublings + spread * errors
    failed_variant, failed_baseline = (rng.random(shape) < scenario.fail_rate for _ in range(2))
    variant = np.where(failed_variant, noise.log_trivial, variant)
    baseline = np.where(failed_baseline, noise.log_trivial, baseline)
    return baseline, variant, failed_baseline | failed_variant


def words(noise: ThetaNoise, scenario: Scenario, baseline: np.ndarray, variant: np.ndarray, failed: np.ndarray):
    """Each ladder's word (the baseline's scaling gate first), as ``trend.trend`` decides it."""
    rows = analyse_rows(design(scenario.pairs, log=False), variant - baseline, failed.any(axis=-1), DELTA, ALPHA)
    scaling, _ = scaling_gate(design(scenario.pairs, log=True), baseline, failed.any(axis=-1), ALPHA)
    return np.where(scaling, rows.words, NOT_SCALING), rows.rejects


def ladder(noise: ThetaNoise, scenario: Scenario, baseline: np.ndarray, variant: np.ndarray, failed: np.ndarray):
    """One simulated ladder as the typed records ``trend.trend`` reads (a failed seed: did not learn,
    at the trivial loss; which side failed is read back from the values)."""
    rungs = []
    trivial = noise.floor + math.exp(noise.log_trivial)
    for k, scale in enumerate(SCALES):
        part = slice(k * scenario.pairs, (k + 1) * scenario.pairs)
        sides = []
        for values in (variant[part], baseline[part]):
            seeds = []
            for i, value in enumerate(values):
                status = DID_NOT_LEARN if failed[part][i] and value == noise.log_trivial else OK
                seeds.append(SeedLoss(i, noise.floor + math.exp(value), status))
            sides.append(tuple(seeds))
        rungs.append(Rung(f"x{scale:g}", scale, noise.floor, trivial, sides[0], sides[1]))
    return Ladder(tuple(rungs))


@dataclass(frozen=True)
class Outcome:
    """A scenario's rates: each word's share of the ladders, the slope (or rank trend) test's rejections,
    and how many of the cross-checked ladders ``trend.trend`` decided the same."""

    noise: ThetaNoise
    scenario: Scenario
    reps: int
    rates: dict[str, float]
    rejects: float
    agree: int
    checked: int

    def rate(self, *names: str) -> float:
        return sum(self.rates.get(name, 0.0) for name in names)


def simulate(noise: ThetaNoise, scenario: Scenario, reps: int, rng: np.random.Generator) -> Outcome:
    """The rates of one scenario over ``reps`` ladders, and the cross-check through ``trend.trend``."""
    baseline, variant, failed = draw(noise, scenario, reps, rng)
    decided, rejects = words(noise, scenario, baseline, variant, failed)
    checked = min(CROSS_CHECK, reps)
    agree = sum(
        trend(ladder(noise, scenario, baseline[i], variant[i], failed[i]), DELTA, ALPHA).word == decided[i]
        for i in range(checked)
    )
    names, counts = np.unique(decided, return_counts=True)
    rates = {str(name): count / reps for name, count in zip(names, counts, strict=True)}
    return Outcome(noise, scenario, reps, rates, float(rejects.mean()), int(agree), checked)


def scenarios(noise: ThetaNoise) -> list[Scenario]:
    """Every scenario of the module's docstring (3.) for one task."""
    effect = EFFECT_SDS * noise.sd
    rows = [
        Scenario("(a) null, θ 0", 0.0),
        Scenario(f"(a) null, θ {effect:+.2g} (3 SD)", 0.0, effect),
        Scenario("(b) β = +δ", DELTA, effect),
        Scenario("(b) β = -δ", -DELTA, effect),
    ]
    for pairs in (3, 9):
        rows += [
            Scenario(
                f"(c) {'grows, β = -' + format(m, 'g') + 'δ' if m else 'β = 0'}, {pairs} pairs",
                -m * DELTA,
                -effect,
                pairs,
            )
            for m in (0, 1, 2, 4)
        ]
    rows += [
        Scenario("(d) null, top rung 3x noisier", 0.0, effect, uneven=UNEVEN),
        Scenario(f"(d) null, Student t{TAIL_DF} noise", 0.0, effect, tail=TAIL_DF),
    ]
    rows += [
        Scenario(f"(e) null, seeds fail at {rate:g}, {pairs} pairs", 0.0, effect, pairs, fail_rate=rate)
        for pairs in (3, 9)
        for rate in (0.1, 0.2)
    ]
    return rows


# seeds in rounds -----------------------------------------------------------------------------------


def rung_rule(noise: ThetaNoise, looks: Looks):
    """The per-rung rule on each rung's ln(loss - floor) of seed pairs (variant, baseline), as the
    analysis decides a question (``error_rates.simulate.switching_rule``: paired t and TOST of the losses
    at :data:`RUNG_MARGIN` with its futility stop, or the exact signed-rank test where a seed of either
    side failed, at the trivial loss as :func:`draw` puts it). Returns (verdicts, stops) as
    ``error_rates.simulate.sequential`` takes them."""
    trivial = noise.floor + math.exp(noise.log_trivial)
    on_loss = Noise(
        Family(noise.task, noise.task, "loss", False, RUNG_MARGIN),
        noise.sd,
        noise.sd_plain,
        noise.pairs,
        noise.floor + math.exp(noise.log_reducible),
        trivial,
        RUNG_MARGIN,
    )
    rule = switching_rule(on_loss, looks, failed=lambda values: np.isclose(values, trivial, rtol=1e-12, atol=0.0))
    return lambda log_a, log_b: rule(noise.floor + np.exp(log_a), noise.floor + np.exp(log_b))


@dataclass(frozen=True)
class RoundsOutcome:
    """Section (f), one scenario and plan: the share of each word with the trend decided at the full α
    and at the plan's per-look α (as the report decides it), and the mean seed pairs per rung."""

    noise: ThetaNoise
    scenario: Scenario
    sizes: tuple[int, ...]
    reps: int
    rates: dict[float, dict[str, float]]
    mean_pairs: float

    def rate(self, alpha: float, *names: str) -> float:
        return sum(self.rates[alpha].get(name, 0.0) for name in names)


def in_rounds(
    noise: ThetaNoise, scenario: Scenario, sizes: tuple[int, ...], reps: int, rng: np.random.Generator
) -> RoundsOutcome:
    """Ladders whose seed pairs come in rounds as the runner adds them: every rung's per-rung question is
    decided look by look (:func:`rung_rule`), a rung undecided at a look gets the next look's pairs, and
    the trend is decided once, on the pairs each rung ended with, at α and at α/K (K looks)."""
    looks = Looks(sizes)
    top = sizes[-1]
    baseline, variant, failed = draw(noise, replace(scenario, pairs=top), reps, rng)
    used = np.empty((reps, len(SCALES)), dtype=int)
    for k in range(len(SCALES)):
        part = slice(k * top, (k + 1) * top)
        used[:, k] = sequential(variant[:, part], baseline[:, part], looks, rung_rule(noise, looks))[1]
    alphas = (ALPHA, looks.per_look_alpha)
    decided = {alpha: np.empty(reps, dtype=object) for alpha in alphas}
    x, ln_x = (tuple((math.log(s) if log else math.log2(s)) for s in SCALES) for log in (False, True))
    for pattern in np.unique(used, axis=0):  # one design per pattern of pairs the rungs ended with
        rows = (used == pattern).all(axis=1)
        columns = np.concatenate([k * top + np.arange(n) for k, n in enumerate(pattern)])
        sizes_here = tuple(int(n) for n in pattern)
        theta = (variant - baseline)[rows][:, columns]
        rank_based = failed[rows][:, columns].any(axis=-1)
        for alpha in alphas:
            found = analyse_rows(Design(x, sizes_here), theta, rank_based, DELTA, alpha).words
            scaling, _ = scaling_gate(Design(ln_x, sizes_here), baseline[rows][:, columns], rank_based, alpha)
            decided[alpha][rows] = np.where(scaling, found, NOT_SCALING)
    rates = {}
    for alpha, words_found in decided.items():
        names, counts = np.unique(words_found.astype(str), return_counts=True)
        rates[alpha] = {str(name): count / reps for name, count in zip(names, counts, strict=True)}
    return RoundsOutcome(noise, scenario, sizes, reps, rates, float(used.mean()))


def round_scenarios(noise: ThetaNoise) -> list[Scenario]:
    """Section (f)'s truths: nulls with θ at 0, at 1 SD (rungs split between stopping and going on) and
    at 3 SD (most rungs decided at the first look), a null whose seeds fail at 0.1, and β = δ."""
    return [
        Scenario("(f) null, θ 0", 0.0),
        Scenario(f"(f) null, θ {noise.sd:+.2g} (1 SD)", 0.0, noise.sd),
        Scenario(f"(f) null, θ {EFFECT_SDS * noise.sd:+.2g} (3 SD)", 0.0, EFFECT_SDS * noise.sd),
        Scenario("(f) null, seeds fail at 0.1", 0.0, EFFECT_SDS * noise.sd, fail_rate=0.1),
        Scenario("(f) β = +δ", DELTA, EFFECT_SDS * noise.sd),
    ]


# the report ---------------------------------------------------------------------------------------


def _rate(value: float, reps: int) -> str:
    return f"{value:.4f} ± {math.sqrt(max(value * (1 - value), 1e-12) / reps):.4f}"


def report(
    noises: list[ThetaNoise], outcomes: list[Outcome], rounds: list[RoundsOutcome], seed: int, command: str
) -> str:
    """The markdown: the header, the noise measured, one table of every scenario's rates, and the table of
    seeds in rounds (section (f))."""
    machine = machine_facts(packages=f"numpy {np.__version__}, scipy {scipy.__version__}")
    lines = [
        *report_header("The trend rule's error rates, by simulation at the book's seed noise", command, machine),
        f"- numpy random generator seeded {seed}; every rate ± its Monte-Carlo standard error √(p(1 - p)/reps). "
        "The rule is `blockbench.report.trend` (docs/decisions/trend-rule.md); this script's docstring says how "
        f"the noise is measured and the ladders drawn. α = {ALPHA}, δ = {DELTA} per doubling, the baseline's "
        f"exponent {EXPONENT} per ln compute, rungs at {', '.join(f'{s:g}' for s in SCALES)} times the book's cell.",
        "",
        "## The book's noise (300 steps)",
        "",
        "| task | SD of θ per seed pair (robust; plain) | pairs of variants | baseline's SD of ln(loss - floor) "
        "| baseline ln(loss - floor) | failed seed's ln(loss - floor) |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    lines += [
        f"| {n.task} | {n.sd:.4g} ({n.sd_plain:.4g}) | {n.pairs} | {n.baseline_sd:.4g} | {n.log_reducible:+.4g} "
        f"| {n.log_trivial:+.4g} |"
        for n in noises
    ]
    lines += [
        "",
        "## Rates",
        "",
        "Under a true slope of 0 (a), (d), (e) and (c)'s β = 0 rows, grows, shrinks or reverses is a false trend "
        "(claimed at most α); at |β| = δ (b) holds is false (claimed at most α); in (c) the variant's advantage "
        "grows, so grows is right. Rejects: the slope test's (where seeds failed, the rank trend test's) "
        "rejections of 0; not scaling: the baseline's gate withheld the word.",
        "",
        "| task | scenario | reps | grows, shrinks or reverses | holds | grows | shrinks | reverses | undecided "
        "| not scaling | rejects | trend.trend agrees |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.noise.task} | {o.scenario.name} | {o.reps:,} | {_rate(o.rate(*MISTAKES), o.reps)} "
            f"| {_rate(o.rate(HOLDS), o.reps)} | "
            + " | ".join(f"{o.rate(word):.4f}" for word in (GROWS, SHRINKS, REVERSES, UNDECIDED, NOT_SCALING))
            + f" | {o.rejects:.4f} | {o.agree}/{o.checked} |"
        )
    nulls = [o for o in outcomes if o.scenario.slope == 0]
    worst = max(nulls, key=lambda o: o.rate(*MISTAKES))
    flat = max((o for o in outcomes if abs(o.scenario.slope) == DELTA), key=lambda o: o.rate(HOLDS))
    lines += [
        "",
        f"Largest false-trend rate over the nulls: {_rate(worst.rate(*MISTAKES), worst.reps)} ({worst.noise.task}, "
        f"{worst.scenario.name}); largest rate of holds at |β| = δ: {_rate(flat.rate(HOLDS), flat.reps)} "
        f"({flat.noise.task}, {flat.scenario.name}).",
        "",
        *rounds_table(rounds),
    ]
    return "\n".join(lines)


def rounds_table(rounds: list[RoundsOutcome]) -> list[str]:
    """Section (f)'s table: each null's false-trend rate and β = δ's rate of holds, with the trend decided at
    α and at the plan's α/K, and the pairs a rung ended with on average."""
    if not rounds:
        return []
    lines = [
        "## Seeds in rounds",
        "",
        "Each rung's per-rung question decided look by look at the plan's α/K (on the loss, margin "
        f"{RUNG_MARGIN:g} nats; the exact signed-rank test where a seed failed), the rungs still undecided given "
        "the next look's pairs, the trend decided once on the pairs each rung ended with. Under the nulls, "
        "grows, shrinks or reverses is a false trend; at β = δ, holds is false. The report decides the trend at "
        "the plan's α/K.",
        "",
        "| task | scenario | looks (pairs) | reps | mean pairs per rung | grows, shrinks or reverses at α "
        "| grows, shrinks or reverses at α/K | holds at α | holds at α/K |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for o in rounds:
        full, split = ALPHA, Looks(o.sizes).per_look_alpha
        lines.append(
            f"| {o.noise.task} | {o.scenario.name} | {', '.join(map(str, o.sizes))} | {o.reps:,} | {o.mean_pairs:.2f} "
            f"| {_rate(o.rate(full, *MISTAKES), o.reps)} | {_rate(o.rate(split, *MISTAKES), o.reps)} "
            f"| {_rate(o.rate(full, HOLDS), o.reps)} | {_rate(o.rate(split, HOLDS), o.reps)} |"
        )
    nulls = [o for o in rounds if o.scenario.slope == 0]
    worst_full = max(nulls, key=lambda o: o.rate(ALPHA, *MISTAKES))
    worst_split = max(nulls, key=lambda o: o.rate(Looks(o.sizes).per_look_alpha, *MISTAKES))
    lines += [
        "",
        f"Largest false-trend rate in rounds at α: {_rate(worst_full.rate(ALPHA, *MISTAKES), worst_full.reps)} "
        f"({worst_full.noise.task}, {worst_full.scenario.name}, looks {worst_full.sizes}); at α/K: "
        f"{_rate(worst_split.rate(Looks(worst_split.sizes).per_look_alpha, *MISTAKES), worst_split.reps)} "
        f"({worst_split.noise.task}, {worst_split.scenario.name}, looks {worst_split.sizes}).",
        "",
    ]
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="the book to measure the noise in")
    parser.add_argument("--reps", type=int, default=100_000, help="simulated ladders per scenario")
    parser.add_argument("--rank-reps", type=int, default=20_000, help="ladders per scenario where seeds fail")
    parser.add_argument("--quick", action="store_true", help="2,000 and 400 ladders per scenario: a look, for tests")
    parser.add_argument("--seed", type=int, default=20261201, help="the random generator's seed")
    parser.add_argument("--out", default="results/trend_error_rates.md", help="markdown file, or - to print only")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    reps, rank_reps = (2_000, 400) if args.quick else (args.reps, args.rank_reps)
    rng = np.random.default_rng(args.seed)
    noises = [measure(args.results, task) for task in TASKS]
    outcomes, rounds = [], []
    for noise in noises:
        print(f"{noise.task}: SD of θ {noise.sd:.4g} (robust, {noise.pairs} pairs of variants)", flush=True)
        for scenario in scenarios(noise):
            outcomes.append(simulate(noise, scenario, rank_reps if scenario.fail_rate else reps, rng))
        for scenario in round_scenarios(noise):
            for sizes in ROUND_PLANS:
                n = (rank_reps if scenario.fail_rate else reps) // ROUND_SHARE
                rounds.append(in_rounds(noise, scenario, sizes, n, rng))
    print_and_write(report(noises, outcomes, rounds, args.seed, command_line(__spec__.name, argv)), args.out)


if __name__ == "__main__":
    main()
