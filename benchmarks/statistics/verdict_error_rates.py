"""The verdict rule's error rates and power, by simulation with known truth at the book's seed noise.

    python -m benchmarks.statistics.verdict_error_rates --out results/verdict_error_rates.md   # about ten minutes
    python -m benchmarks.statistics.verdict_error_rates --reps 2000 --out -                    # a quick look

``blockbench.report.decide`` claims, per question: a false better/worse at most 5% of the time, a
false equivalent at most 5%, whether seeds come in rounds (α split over the looks) or as a fixed list,
and with a rank test where seeds failed to learn. This script checks those claims where they matter,
at the noise this project's runs actually have, and shows what the rule can find (its power):

1. **Noise.** From the committed book (``results/*/cells/<task>/<variant>/seed<k>/result.json``, read
   with ``blockbench.store.record.load_record``; matrices marked ``verdicts: false`` left out) it takes, for
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

The markdown names the command, the date, the code's commit, Python, numpy and scipy, and the CPU
(``benchmarks.harness.report_header``). The code is split by concept under
``benchmarks/statistics/error_rates/``: ``noise`` (1, 2), ``simulate`` (3), ``pool`` (4), ``skew`` (5)
and ``report``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks import ROOT
from benchmarks.harness import command_line, print_and_write
from benchmarks.statistics.error_rates.noise import FAMILIES, PLANS, measure_noise
from benchmarks.statistics.error_rates.pool import null_pool, resample
from benchmarks.statistics.error_rates.report import report
from benchmarks.statistics.error_rates.simulate import futility_sweep, simulate
from benchmarks.statistics.error_rates.skew import SKEW_REPS, SKEW_SD, simulate_skew


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
    command = command_line(__spec__.name, argv)
    print_and_write(report(noises, runs, sweeps, resampled, skews, args.reps, args.seed, command), args.out)


if __name__ == "__main__":
    main()
