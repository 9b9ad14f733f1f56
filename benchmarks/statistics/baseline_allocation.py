"""How many seeds should a shared baseline train? The paired design against Dunnett's √k allocation.

    python -m benchmarks.statistics.baseline_allocation --out results/baseline_allocation.md   # about seven minutes
    python -m benchmarks.statistics.baseline_allocation --reps 4000 --out -                   # a quick look

A matrix compares k variants with one baseline variant. Today every side trains the same seeds, and each
question is decided paired on them (``blockbench.report.decide``): n baseline seeds serve k questions. The
textbook allocation for k comparisons with one control (Dunnett's) gives the control √k times the seeds of
each treatment: its mean enters every comparison, so its noise is worth more. With more baseline seeds
than variant seeds the extra ones have no partner, so the questions become unpaired (Welch's t). Which is
better depends on how much of a seed's noise the two sides share (the data order and the data draw that
the same seed gives both): pairing cancels that shared part, an unpaired test pays for it.

This script measures it on normal noise at the book's scale: each run's headline value is the variant's
mean + a seed effect shared by every variant's run of that seed (variance ρ·σ²) + the run's own noise
(variance (1 - ρ)·σ²), with σ² set so that a seed-matched difference has the book's SD (σ_d, from
results/verdict_error_rates.md: LM perplexity 0.109 with margin 0.0737, translation BLEU 3.25 with margin
1, ViT accuracy 0.0358 with margin 0.01). ρ, the intra-seed correlation, is measured on the book (the
pooled Fisher-z correlation of seed-matched variant and baseline values of every question with six or
more shared seeds) and scanned around it. A family is k questions against one baseline draw, decided
in the default rounds (looks at 3, 6 and 9 variant seeds, α split over them, the futility stop) with the
array functions ``decide.decide`` calls, under three designs:

- **paired**: the baseline trains n seeds at a look with n, each question paired on them (today's);
- **unpaired, n**: the same seeds, each question decided by Welch's t (what unpairing alone costs);
- **√k allocation**: the baseline trains ⌈√k·n⌉ seeds at a look with n, each question by Welch's t.

Per design: (a) the null, every variant at the baseline's mean: the rate of a false better/worse per
question, the chance that a family has at least one and at least two, and the correlation between two
questions of a family of their final estimates and of their false-verdict indicators (the shared
baseline draw that makes one family's verdicts move together); (b) every variant one margin better: the
rate of a false equivalent; (c) every variant σ_d better: the power (rate of better) and the mean seeds;
and the mean runs a family trains (variants' seeds and the baseline's), in each scenario. A sample of
questions is decided again through ``decide.decide`` itself, look by look (they must agree).
docs/decisions/baseline-allocation.md reads the result.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy

from benchmarks import ROOT
from benchmarks.harness import command_line, machine_facts, print_and_write, report_header
from blockbench.report.analysis import analyze
from blockbench.report.decide import (
    BETTER,
    EQUIVALENT,
    UNDECIDED,
    WORSE,
    Looks,
    decide,
    futile,
    paired_moments,
    prob_improvement,
    t_tests,
    t_verdicts,
    welch_moments,
)
from blockbench.report.results import gives_verdicts


@dataclass(frozen=True)
class Scale:
    """A task family at the book's noise: the SD of a seed-matched difference and the margin."""

    label: str
    task: str
    sd: float
    margin: float


#: the book's noise and margins (results/verdict_error_rates.md, the 300-step budget)
SCALES = (
    Scale("LM perplexity", "lm", 0.109, 0.0737),
    Scale("translation BLEU", "translation", 3.25, 1.0),
    Scale("ViT accuracy", "vit", 0.0358, 0.01),
)
#: variants sharing one baseline: ffn_type has 2, norm_placement 3, positional_encoding 5
KS = (2, 5)
#: the default rounds
LOOKS = Looks.plan(3, 9, 3)
PAIRED, UNPAIRED, ALLOCATED, PAIRED_MORE = "paired", "unpaired, n", "√k allocation", "paired, as many runs"
DESIGNS = (PAIRED, UNPAIRED, ALLOCATED, PAIRED_MORE)
#: families per design decided again through decide.decide (every question of each, look by look)
CROSS_CHECK = 5


def baseline_seeds(design: str, k: int, n: int) -> int:
    """The baseline's seeds at a look with ``n`` variant seeds: n, or ⌈√k·n⌉ with the allocation."""
    return math.ceil(math.sqrt(k) * n) if design == ALLOCATED else n


def looks(design: str, k: int) -> Looks:
    """The design's planned looks: the default rounds, or for the paired design with as many runs as the
    allocation each look's seeds times (k + √k)/(k + 1), the allocation's runs over the paired design's."""
    if design != PAIRED_MORE:
        return LOOKS
    scale = (k + math.sqrt(k)) / (k + 1)
    return Looks(tuple(math.ceil(n * scale) for n in LOOKS.sizes), LOOKS.alpha, LOOKS.futility)


@dataclass(frozen=True)
class Draws:
    """One scenario's runs: ``variants`` (reps, k, n_max) and ``baseline`` (reps, m_max), the seed effect
    of seed s shared by every run of seed s."""

    variants: np.ndarray
    baseline: np.ndarray


def draw(rng: np.random.Generator, reps: int, k: int, scale: Scale, rho: float, shift: float, m_max: int) -> Draws:
    """Runs at the scale's noise with intra-seed correlation ``rho``, every variant ``shift`` above the baseline."""
    sigma2 = scale.sd**2 / (2 * (1 - rho))  # so that a seed-matched difference has SD scale.sd
    n_max = max(looks(design, k).sizes[-1] for design in DESIGNS)
    seed = rng.normal(0.0, math.sqrt(rho * sigma2), (reps, max(m_max, n_max)))
    own = math.sqrt((1 - rho) * sigma2)
    baseline = seed[:, :m_max] + rng.normal(0.0, own, (reps, m_max))
    variants = shift + seed[:, None, :n_max] + rng.normal(0.0, own, (reps, k, n_max))
    return Draws(variants, baseline)


@dataclass(frozen=True)
class Outcome:
    """Each question's final verdict, estimate and variant seeds (reps, k), and each family's runs (reps,)."""

    verdicts: np.ndarray
    estimates: np.ndarray
    seeds: np.ndarray
    runs: np.ndarray


def decide_families(draws: Draws, design: str, scale: Scale) -> Outcome:
    """Every question of every family decided in the rounds, as ``decide.decide`` decides one look: the
    variant's first n seeds against the baseline's first n (paired, or unpaired) or ⌈√k·n⌉ (unpaired)."""
    reps, k, _ = draws.variants.shape
    plan = looks(design, k)
    verdicts = np.full((reps, k), UNDECIDED, dtype=object)
    estimates = np.full((reps, k), np.nan)
    seeds = np.zeros((reps, k), dtype=int)
    open_ = np.ones((reps, k), dtype=bool)
    alpha = plan.per_look_alpha
    for n in plan.sizes:
        m = baseline_seeds(design, k, n)
        a = draws.variants[:, :, :n]
        b = np.broadcast_to(draws.baseline[:, None, :m], (reps, k, m))
        moments = paired_moments(a, b) if design in (PAIRED, PAIRED_MORE) else welch_moments(a, b)
        tests = t_tests(moments, scale.margin, alpha)
        found, _ = t_verdicts(moments, tests, scale.margin, alpha, True, prob_improvement(a, b, True))
        final = (found != UNDECIDED) | futile(moments, found, n, plan, scale.margin) | plan.is_last(n)
        now = open_ & final
        verdicts[now], estimates[now], seeds[now] = found[now], moments.mean[now], n
        open_ &= ~final
    last = seeds.max(axis=1)  # the baseline trains for the question that looks longest
    runs = seeds.sum(axis=1) + np.array([baseline_seeds(design, k, int(n)) for n in last])
    return Outcome(verdicts, estimates, seeds, runs)


def cross_check(draws: Draws, outcome: Outcome, design: str, scale: Scale) -> tuple[int, int]:
    """The first families' questions decided again through ``decide.decide`` look by look: (agree, checked)."""
    agree = checked = 0
    k = draws.variants.shape[1]
    plan = looks(design, k)
    for rep in range(min(CROSS_CHECK, len(draws.baseline))):
        for q in range(k):
            for n in plan.sizes:
                m = baseline_seeds(design, k, n)
                variant = {s: float(draws.variants[rep, q, s]) for s in range(n)}
                keys = range(m) if design in (PAIRED, PAIRED_MORE) else (("baseline", s) for s in range(m))
                baseline = dict(zip(keys, (float(v) for v in draws.baseline[rep, :m]), strict=True))
                decision = decide(variant, baseline, margin=scale.margin, higher_is_better=True, looks=plan)
                if decision.final:
                    break
            checked += 1
            agree += decision.verdict == outcome.verdicts[rep, q] and n == outcome.seeds[rep, q]
    return agree, checked


@dataclass(frozen=True)
class Row:
    """One design's figures at one family scale, k and ρ (see the module's docstring)."""

    scale: Scale
    k: int
    rho: float
    design: str
    false_rate: float  # (a) per question
    any_false: float  # (a) families with at least one false better/worse
    two_false: float  # (a) with at least two
    two_independent: float  # (a) with at least two, were the questions independent at the same rate
    estimate_corr: float  # (a) between the final estimates of two questions of a family
    indicator_corr: float  # (a) between their false-verdict indicators
    false_equivalent: float  # (b)
    power: float  # (c) rate of better
    seeds: float  # (c) mean variant seeds per question
    runs_null: float  # mean runs per family, (a)
    runs_power: float  # and (c)
    agree: tuple[int, int]


def _two_or_more(p: float, k: int) -> float:
    """The chance of two or more of ``k`` independent events of chance ``p``."""
    return 1 - (1 - p) ** k - k * p * (1 - p) ** (k - 1)


def _corr(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def simulate(rng: np.random.Generator, reps: int, scale: Scale, k: int, rho: float, design: str) -> Row:
    m_max = baseline_seeds(design, k, looks(design, k).sizes[-1])
    null = draw(rng, reps, k, scale, rho, 0.0, m_max)
    at_null = decide_families(null, design, scale)
    false = np.isin(at_null.verdicts, (BETTER, WORSE))
    agree = cross_check(null, at_null, design, scale)
    at_margin = decide_families(draw(rng, reps, k, scale, rho, scale.margin, m_max), design, scale)
    at_power = decide_families(draw(rng, reps, k, scale, rho, scale.sd, m_max), design, scale)
    return Row(
        scale,
        k,
        rho,
        design,
        false_rate=float(false.mean()),
        any_false=float(false.any(axis=1).mean()),
        two_false=float((false.sum(axis=1) >= 2).mean()),
        two_independent=_two_or_more(float(false.mean()), k),
        estimate_corr=_corr(at_null.estimates[:, 0], at_null.estimates[:, 1]),
        indicator_corr=_corr(false[:, 0], false[:, 1]),
        false_equivalent=float((at_margin.verdicts == EQUIVALENT).mean()),
        power=float((at_power.verdicts == BETTER).mean()),
        seeds=float(at_power.seeds.mean()),
        runs_null=float(at_null.runs.mean()),
        runs_power=float(at_power.runs.mean()),
        agree=agree,
    )


def book_correlation(results: Path, task: str) -> tuple[float, int]:
    """The intra-seed correlation of ``task`` in the book: the pooled Fisher-z correlation of seed-matched
    variant and baseline values over every question with six or more shared finished seeds (each variant
    once), and how many questions it pools."""
    z_sum = weight = 0.0
    seen: set[str] = set()
    for folder in sorted(p for p in results.iterdir() if (p / "cells").is_dir()):
        if not gives_verdicts(folder / "matrix.yaml"):
            continue
        for analysis in analyze(folder)[2]:
            if analysis.task != task:
                continue
            for question in analysis.questions:
                if question.baseline is None or question.group.variant in seen:
                    continue
                values = question.group.finished_values(analysis.headline.name)
                baseline = question.baseline.finished_values(analysis.headline.name)
                common = sorted(set(values) & set(baseline), key=str)
                if len(common) < 6:
                    continue
                seen.add(question.group.variant)
                r = _corr([values[s] for s in common], [baseline[s] for s in common])
                if math.isfinite(r):
                    z_sum += math.atanh(max(-0.99, min(0.99, r))) * (len(common) - 3)
                    weight += len(common) - 3
    return (math.tanh(z_sum / weight) if weight else float("nan")), len(seen)


def markdown(rows: list[Row], measured: dict[str, tuple[float, int]], reps: int, seed: int, command: str) -> str:
    title = "The shared baseline's seeds: paired against the √k allocation, simulated"
    lines = report_header(title, command, machine_facts(packages=f"numpy {np.__version__}, scipy {scipy.__version__}"))
    lines += [
        f"- {reps:,} families per cell (a rate p is within about 2√(p(1 - p)/{reps:,}) of its limit), numpy random "
        f"generator seeded {seed}. The script's docstring says what is drawn "
        "and how each family is decided (the default rounds: looks at 3, 6, 9 variant seeds, α/3 each, the "
        "futility stop).",
        "- The intra-seed correlation ρ measured on the book (seed-matched variant and baseline values, "
        "pooled Fisher z): "
        + "; ".join(f"{s.label} {measured[s.task][0]:.2f} ({measured[s.task][1]} questions)" for s in SCALES)
        + ".",
        f"- Cross-check: {sum(r.agree[0] for r in rows):,} of {sum(r.agree[1] for r in rows):,} questions "
        "decided again look by look through `decide.decide` agree with the array functions.",
        "",
        "Designs: *paired* (today's: n baseline seeds at a look with n, paired t), *unpaired, n* (the same seeds, "
        "Welch's t: what unpairing alone costs), *√k allocation* (⌈√k·n⌉ baseline seeds, Welch's t), *paired, as "
        "many runs* (paired, each look's seeds times (k + √k)/(k + 1): the allocation's budget spent on pairs). "
        "Columns: (a) the null, every variant at the baseline's mean: false better/worse per question, families "
        "with ≥ 1 and ≥ 2 (and ≥ 2 were the k questions independent at that rate), the correlation of two "
        "questions of a family (their final estimates, their false-verdict indicators); (b) every variant one "
        "margin better: false equivalent; (c) every variant σ_d better: power (better) and mean variant seeds; "
        "runs per family under (a) and (c).",
        "",
        "| family | k | ρ | design | (a) false | (a) ≥ 1 | (a) ≥ 2 | ≥ 2 if indep. | (a) corr est. | (a) corr false "
        "| (b) false eq. | (c) power | (c) seeds | runs (a) | runs (c) |",
        "|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.scale.label} | {r.k} | {r.rho:.2f} | {r.design} | {r.false_rate:.4f} | {r.any_false:.4f} | "
            f"{r.two_false:.4f} | {r.two_independent:.4f} | {r.estimate_corr:.2f} | {r.indicator_corr:.2f} | "
            f"{r.false_equivalent:.4f} | {r.power:.3f} | {r.seeds:.2f} | {r.runs_null:.1f} | {r.runs_power:.1f} |"
        )
    lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="the book to measure ρ in")
    parser.add_argument("--reps", type=int, default=40_000, help="simulated families per cell")
    parser.add_argument("--rho", type=float, nargs="*", default=None, help="ρ values (default: 0, the book's, 0.5)")
    parser.add_argument("--seed", type=int, default=20260601, help="the random generator's seed")
    parser.add_argument("--out", default="results/baseline_allocation.md", help="markdown file, or - to print only")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rng = np.random.default_rng(args.seed)
    measured = {s.task: book_correlation(args.results, s.task) for s in SCALES}
    rows = []
    for scale in SCALES:
        book = measured[scale.task][0]
        rhos = args.rho if args.rho is not None else sorted({0.0, round(max(book, 0.0), 2), 0.5})
        for k in KS:
            for rho in rhos:
                rows += [simulate(rng, args.reps, scale, k, rho, design) for design in DESIGNS]
    print_and_write(markdown(rows, measured, args.reps, args.seed, command_line(__spec__.name, argv)), args.out)


if __name__ == "__main__":
    main()
