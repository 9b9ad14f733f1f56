"""benchmarks/statistics/verdict_error_rates.py: the noise it reads from a book (checked on a book written here
with known variances), the rates it simulates checked against known truth (the nominal error rates,
power at a huge difference, decide.decide agreeing with the array functions), and the report it writes."""

from __future__ import annotations

import importlib
import math
import platform
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import scipy
from helpers import REPO
from scipy import stats as scipy_stats

from blockbench.report.decide import BETTER, EQUIVALENT, UNDECIDED, WORSE, Looks
from blockbench.store.record import CellRecord, write_record

#: the modules of the simulation, by concept (``benchmarks/statistics/error_rates/``)
PARTS = ("noise", "simulate", "pool", "skew", "report")


def script() -> SimpleNamespace:
    """Every name of the simulation's modules and of the command's (``decide``'s they import too)."""
    names: dict[str, object] = {}
    for part in PARTS:
        names.update(vars(importlib.import_module(f"benchmarks.statistics.error_rates.{part}")))
    names.update(vars(importlib.import_module("benchmarks.statistics.verdict_error_rates")))
    return SimpleNamespace(**names)


def write_book(root: Path, matrix: str, variants: dict[str, list[float]], steps: int = 300, verdicts: bool = True):
    (root / matrix).mkdir(parents=True, exist_ok=True)
    (root / matrix / "matrix.yaml").write_text(f"name: {matrix}\n" + ("" if verdicts else "verdicts: false\n"))
    for variant, values in variants.items():
        for seed, value in enumerate(values):
            record = CellRecord(
                status="ok",
                task="lm",
                seed=seed,
                steps=steps,
                metrics={"perplexity": value},
                primary_metric="perplexity",
                baselines={"perplexity": 30.6},
            )
            write_record(root / matrix / "cells" / "lm" / variant / f"seed{seed}" / "result.json", record)


def test_the_noise_is_the_robust_pooled_sd_of_seed_matched_differences(tmp_path):
    a = [7.0, 7.1, 7.2]
    b = [x + d for x, d in zip(a, [0.0, 0.1, 0.2], strict=True)]  # a - b has variance 0.01
    c = [x + d for x, d in zip(a, [0.0, 0.0, 0.3], strict=True)]  # a - c 0.03, b - c 0.01
    d = [x + d for x, d in zip(a, [0.5, -0.5, 0.0], strict=True)]  # a - d 0.25
    write_book(tmp_path, "m1", {"a": a, "b": b, "c": c})
    write_book(tmp_path, "m1", {"a_long": [6.0, 6.5, 7.0], "b_long": [9.0, 6.0, 6.0]}, steps=1500)  # another budget
    write_book(tmp_path, "m2", {"a": a, "d": d})
    write_book(tmp_path, "m3", {"a": a, "b": b})  # the same pair again: counts once
    write_book(tmp_path, "smoke", {"a": [1.0, 2.0, 3.0], "e": [30.0, 1.0, 9.0]}, verdicts=False)  # left out
    noise = script().measure_noise(tmp_path, script().FAMILIES[0])
    # variances 0.01, 0.03, 0.01, 0.25: median 0.02; the median of chi2(2) / 2 is ln 2
    assert noise.pairs == 4
    assert noise.sd == pytest.approx(math.sqrt(0.02 / math.log(2)))
    assert noise.sd_mean == pytest.approx(math.sqrt((0.01 + 0.03 + 0.01 + 0.25) / 4))
    assert noise.baseline_mean == pytest.approx(7.1)  # a: in three matrices
    assert noise.margin == pytest.approx(0.071) and noise.trivial == 30.6


def noise_like(sd_in_margins: float, higher_is_better: bool = True):
    module = script()
    family = module.Family("vit", "test accuracy", "accuracy", higher_is_better, 0.01)
    return module.Noise(family, sd_in_margins * 0.01, 0.0, 1, 0.8, 0.2, 0.01)


@pytest.mark.parametrize(("plan", "looks"), [("rounds", Looks.plan(3, 9, 3)), ("fixed", Looks.fixed(3))])
def test_simulated_rates_keep_the_claims_and_the_power_reaches_one(plan, looks):
    module = script()
    reps = 4000
    slack = 4 * math.sqrt(0.05 * 0.95 / reps)  # four Monte-Carlo standard errors at the nominal rate
    for noise in (noise_like(0.6), noise_like(5.0, higher_is_better=False)):
        run = module.simulate(noise, plan, looks, reps, np.random.default_rng(1))
        assert run.checked > 0 and run.agreed == run.checked  # decide.decide gives the same verdicts
        assert run.power[0.0].share(BETTER, WORSE) <= 0.05 + slack
        assert run.power[1.0].share(EQUIVALENT) <= 0.05 + slack
        assert run.minus_margin.share(EQUIVALENT) <= 0.05 + slack
        for (pairing, rule), rates in run.bimodal.items():
            assert rates.share(BETTER, WORSE) <= 0.05 + slack, (pairing, rule)
            if rule == "rank test":
                assert rates.share(EQUIVALENT) == 0.0
        assert run.power[4.0].shares[WORSE] <= 0.025 + slack  # better in truth: called worse at most alpha / 2
    # a single look at noise far above the margin almost never shows equivalence, so the t test's size is
    # exactly alpha: the simulated null rate is not merely small, it is 0.05
    if looks.per_look_alpha == 0.05:
        loud = module.simulate(noise_like(20.0), plan, looks, reps, np.random.default_rng(2))
        assert abs(loud.power[0.0].share(BETTER, WORSE) - 0.05) <= slack
    # a difference of 4 margins with noise a tenth of a margin: every question is decided better at the first look
    quiet = module.simulate(noise_like(0.1, higher_is_better=False), plan, looks, 500, np.random.default_rng(3))
    assert quiet.power[4.0].shares[BETTER] == 1.0 and quiet.power[4.0].mean_seeds == 3.0


def test_the_futility_stop_saves_seeds_where_noise_is_wide_and_keeps_the_power_where_it_is_not():
    """Known truth: at 4.6 margins of noise (the ViT's) a null question cannot be decided by 9 seeds, and
    the futility stop ends most of them at the first look; at 0.6 margins (the LM's) nearly every
    question is decided by 9 seeds either way, and the stop changes almost nothing."""
    module = script()
    with_stop, without = Looks.plan(3, 9, 3), Looks.plan(3, 9, 3, futility=0.0)

    def run(noise, looks, multiple, seed):
        variant, baseline = module.draw(np.random.default_rng(seed), noise, 4000, 9, multiple)
        verdicts, used = module.sequential(variant, baseline, looks, module.t_rule(noise, looks))
        return float(np.mean(verdicts != "undecided")), float(used.mean())

    wide = noise_like(4.6)
    assert run(wide, without, 0.0, 5)[1] > 8.5 and run(wide, with_stop, 0.0, 5)[1] < 5.5
    assert run(wide, with_stop, 4.0, 6)[0] >= run(wide, without, 4.0, 6)[0] - 0.06
    for multiple in (0.0, 1.0, 2.0):
        assert run(noise_like(0.6), with_stop, multiple, 7)[0] >= run(noise_like(0.6), without, multiple, 7)[0] - 0.04


@pytest.mark.slow  # the simulation script end to end (about 2 minutes on 2 CPUs); run with -m slow
def test_the_script_writes_its_report_with_where_and_how_it_ran(tmp_path):
    out = tmp_path / "rates.md"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.statistics.verdict_error_rates", "--reps", "300", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert "Produced by `python -m benchmarks.statistics.verdict_error_rates --reps 300 --out " in text
    assert f"- Python {platform.python_version()}, torch " in text
    assert f"; numpy {np.__version__}, scipy {scipy.__version__}" in text
    assert "- Machine: " in text and "300 simulated questions per scenario" in text
    simulated, pool = text.split("## (f) Real training noise", 1)
    pool, skewed = pool.split("## (g) Skewed differences", 1)
    for family in ("LM perplexity", "translation BLEU", "ViT accuracy"):
        # noise; the claims, bimodal and power rows of 3 plans; the futility bounds
        assert simulated.count(f"| {family}") == 1 + 3 + 3 * 6 + 3 * 5 + 5
        # the empirical null, where the book has it: the pool, then 2 plans x 2 pairings
        assert pool.count(f"| {family}") in (0, 1 + 4)
        # (i) 3 skewed shapes, (ii) 3 at a median of 0 and (iii) 2 controls, (iv) 5 failure rates x 2 pairings
        arrow = "↓" if family.startswith("LM") else "↑"
        assert skewed.count(f"| {family} {arrow} |") == 3 + 3 + 2 + 10
    # translation at the SD the shapes were stated at, with how far the rates hold (10 shapes)
    assert skewed.count("| translation BLEU ↑ at SD 3.25 |") == 3 + 3 + 2 + 10
    assert skewed.count("\n| 40% |") == 2 and "- How far it holds: " in skewed
    assert "SD of seed-matched differences" in done.stdout


def test_the_simulated_bimodal_rule_is_the_analysis_rule():
    """The analysis decides by a rank test wherever a seed of either side failed (``ranks.any_failed``),
    a side whose seeds all failed included: against a side that learned it is a step no normal model
    describes, and the t test would call it worse at once. With 3 pairs the rank test cannot decide, so
    that question is undecided. Beside it, the rule that sends only mixed sides to the rank test."""
    module = script()
    noise, looks = noise_like(0.6), Looks.plan(3, 9, 3)
    variant = np.array([[0.2, 0.2, 0.2], [0.2, 0.8, 0.81], [0.8, 0.82, 0.79], [0.8, 0.82, 0.79]])
    baseline = np.array([[0.8, 0.81, 0.79], [0.8, 0.81, 0.79], [0.2, 0.81, 0.8], [0.7, 0.71, 0.69]])
    # all failed; mixed; mixed baseline; every seed learned
    assert module.any_failed(variant == noise.trivial, baseline == noise.trivial).tolist() == [True, True, True, False]
    found, _ = module.switching_rule(noise, looks)(variant, baseline)
    by_t, _ = module.t_rule(noise, looks)(variant, baseline)
    by_rank, _ = module.rank_rule(noise, looks)(variant, baseline)
    assert by_t[0] == "worse" and found[0] == by_rank[0] == "undecided"  # all failed: the rank test
    assert found[1] == by_rank[1] == "undecided" and found[2] == by_rank[2]  # a side mixes: the rank test
    assert found[3] == by_t[3] == "better"  # nothing failed: the t test
    only_mixed, _ = module.switching_rule(noise, looks, only_mixed=True)(variant, baseline)
    assert only_mixed[0] == "worse" and only_mixed[1] == found[1]  # the other trigger: all failed to the t test
    for row in range(4):
        verdict, _ = module.decide_sequentially(variant[row], baseline[row], noise, Looks.fixed(3), True, "switch")
        assert (
            verdict
            == module.switching_rule(noise, Looks.fixed(3))(variant[row : row + 1], baseline[row : row + 1])[0][0]
        )


def write_null(root: Path, runs: dict[str, list[tuple[str, float]]]) -> None:
    """A null_comparison matrix of LM cells: replica -> (status, perplexity) per seed (status ok,
    did_not_learn or diverged)."""
    (root / "null_comparison").mkdir(parents=True, exist_ok=True)
    (root / "null_comparison" / "matrix.yaml").write_text("name: null_comparison\nverdicts: false\n")
    for replica, cells in runs.items():
        for seed, (status, value) in enumerate(cells):
            record = CellRecord(
                status="diverged" if status == "diverged" else "ok",
                task="lm",
                seed=seed,
                steps=300,
                metrics={} if status == "diverged" else {"perplexity": value},
                primary_metric="perplexity",
                baselines={"perplexity": 30.6},
                learned=None if status == "diverged" else status == "ok",
            )
            path = root / "null_comparison" / "cells" / "lm" / f"replica={replica}" / f"seed{seed}" / "result.json"
            write_record(path, record)


def test_the_empirical_null_pool_is_every_run_of_both_replicas_a_diverged_one_at_the_worst_value(tmp_path):
    module = script()
    write_null(
        tmp_path,
        {"a": [("ok", 7.0), ("ok", 7.2), ("did_not_learn", 30.9)], "b": [("ok", 7.1), ("diverged", 0.0)]},
    )
    noise = module.Noise(module.FAMILIES[0], 0.05, 0.05, 1, 7.1, 30.6, 0.071)
    pool = module.null_pool(tmp_path, noise)
    assert sorted(pool.values.tolist()) == [7.0, 7.1, 7.2, 30.9, 30.9]  # diverged: the worst (30.9 > trivial 30.6)
    assert sorted(zip(pool.values.tolist(), pool.failed.tolist(), strict=True)) == [
        (7.0, False),
        (7.1, False),
        (7.2, False),
        (30.9, True),
        (30.9, True),
    ]
    assert pool.margin == pytest.approx(0.01 * 7.1)  # the task's 1% at the learned runs' mean
    assert "5 runs, 2 did not learn" in pool.describe()
    assert module.null_pool(tmp_path / "elsewhere", noise) is None


def pool_of(values, failed=None, higher_is_better=True):
    module = script()
    family = module.Family("vit", "test accuracy", "accuracy", higher_is_better, 0.01)
    noise = module.Noise(family, 0.01, 0.0, 1, 0.8, 0.2, 0.01)
    failed = np.zeros(len(values), dtype=bool) if failed is None else failed
    return module.Pool(noise, np.asarray(values, dtype=float), failed, 0.01)


def test_the_resampled_null_keeps_the_claims_and_finds_a_planted_difference():
    """Known truth: a pool of one model's runs has no difference, so the rule's rate of better or worse
    on resampled questions is at most 5%, as is its rate of equivalent when one side moves by a margin;
    with 20% of the runs failed (spread below the trivial baseline, so the rule must know them from the
    records, not by the trivial value) the rank test keeps it; a side moved by 4 margins at a tenth of a
    margin of noise is found better every time (the shift is applied, the rule can say so); decide.decide
    agrees with the array rule question by question."""
    module = script()
    rng = np.random.default_rng(11)
    reps = 4000
    slack = 4 * math.sqrt(0.05 * 0.95 / reps)
    rounds = Looks.plan(3, 9, 3)
    normal = pool_of(0.8 + rng.normal(0.0, 0.006, 40))  # 0.6 margins: equivalence reachable
    heavy = pool_of(0.8 + 0.006 * rng.standard_t(3, 40))  # heavy tails, as real runs can have
    fails = rng.random(40) < 0.2
    bimodal = pool_of(np.where(fails, rng.uniform(0.1, 0.19, 40), 0.8 + rng.normal(0.0, 0.02, 40)), fails)
    for pool in (normal, heavy, bimodal):
        for paired in (True, False):
            null, agreed = module.resample_pool(pool, rounds, paired, 0.0, reps, rng)
            assert null.share(BETTER, WORSE) <= 0.05 + slack and agreed == module.CROSS_CHECK
            for shift in (1.0, -1.0):
                shifted, agreed = module.resample_pool(pool, rounds, paired, shift, reps, rng)
                assert shifted.share(EQUIVALENT) <= 0.05 + slack and agreed == module.CROSS_CHECK
    assert module.resample_pool(normal, rounds, True, 0.0, reps, rng)[0].share(EQUIVALENT) > 0.5  # can say equivalent
    quiet = pool_of(0.8 + rng.normal(0.0, 0.001, 24), higher_is_better=False)
    found, _ = module.resample_pool(quiet, rounds, True, 4.0, 500, rng)
    assert found.shares[BETTER] == 1.0 and found.mean_seeds == 3.0
    with pytest.raises(ValueError, match="has 10 runs: 18 are needed"):
        module.resample_pool(pool_of(np.ones(10)), rounds, True, 0.0, 10, rng)


def test_the_bimodal_pool_s_failed_runs_are_known_from_their_records_not_from_the_trivial_value():
    """With 3 pairs a side that mixes failed and learned runs goes to the rank test, which cannot decide
    (its p is at least 0.25), so only questions where neither side mixes can be decided: at most the
    exact chance of that deal. These failed runs sit at 0.10-0.19, not at the trivial 0.2, so a rule that
    looked for the trivial value would not see them and its t test would decide more (about 0.13)."""
    module = script()
    rng = np.random.default_rng(13)
    fails = np.arange(30) % 3 == 0  # 10 of 30 failed
    pool = pool_of(np.where(fails, rng.uniform(0.1, 0.19, 30), 0.8 + rng.normal(0.0, 0.001, 30)), fails)
    reps = 2000
    ranked, agreed = module.resample_pool(pool, Looks.fixed(3), True, 4.0, reps, np.random.default_rng(1))
    # two sides of 3 from 20 learned and 10 failed, neither side mixing: all six learned, all failed, or
    # one side all learned and the other all failed
    falling = math.perm(30, 6)
    pure = (math.perm(20, 6) + 2 * math.perm(20, 3) * math.perm(10, 3) + math.perm(10, 6)) / falling
    decided = 1 - ranked.shares[UNDECIDED]
    assert decided <= pure + 3 * math.sqrt(pure * (1 - pure) / reps) and agreed == module.CROSS_CHECK


def test_the_report_shows_the_resampled_null_or_says_it_has_not_run():
    module = script()
    rng = np.random.default_rng(12)
    pool = pool_of(0.8 + rng.normal(0.0, 0.006, 24))
    resampled = module.resample(pool, 200, rng)
    section = "\n".join(module.pool_section([pool.noise], [resampled]))
    assert "200 resampled questions per scenario" in section and "24 runs, 0 did not learn" in section
    assert f"{resampled.checked:,} of {resampled.checked:,} agree" in section and resampled.checked == 12 * 40
    assert section.count("| test accuracy | ") == 1 + 4  # the pool; 2 plans x pairs, disjoint seeds
    assert "Not run yet: `null_comparison` has no cells" in "\n".join(module.pool_section([pool.noise], []))
    reading = "\n".join(
        module.reading([], [module.simulate(pool.noise, "fixed 3 seeds", Looks.fixed(3), 200, rng)], [resampled])
    )
    assert "- On real training noise (the empirical null resampled): largest null rate of better or worse " in reading
    # a pool too small for 9 + 9 runs still gives the 3-seed plan, and says what it could not deal
    small = module.resample(pool_of(0.8 + rng.normal(0.0, 0.006, 12)), 100, rng)
    assert list(small.rates) == [("fixed 3 seeds", "pairs"), ("fixed 3 seeds", "disjoint seeds")]
    assert "too few runs for rounds 3, 6, 9" in "\n".join(module.pool_section([pool.noise], [small]))


def test_the_empirical_null_matrix_trains_a_pool_the_resampled_plans_fit_in():
    """Each task of configs/matrix/null_comparison.yaml needs at least two sides of the longest plan's
    seeds (9 + 9) for section (f) to deal; with rounds it would stop at 3 seeds where it decides."""
    from blockbench.matrix.expand import load_matrix

    module = script()
    matrix, cells = load_matrix(REPO / "configs" / "matrix" / f"{module.NULL_MATRIX}.yaml")
    assert not matrix.seeds  # a fixed seed axis, no rounds
    need = 2 * max(looks.sizes[-1] for looks in module.POOL_PLANS.values())
    for task in ("lm", "translation", "vit"):
        runs = [cell for cell in cells if cell.task == task]
        assert len(runs) >= need and len({cell.seed for cell in runs}) == len(runs)  # disjoint seeds


def test_skewed_differences_keep_the_typical_seed_s_rates():
    """Known truth for the typical seed: differences N(δ, σ²) with 5% bad seeds at −19/3.25 SDs (the mean
    0, the typical seed better by 1/3.25 SD): the wrong direction (worse) stays far below 2.5%; the same
    shape shifted to a median of 0, and identical sides whose seeds fail half the time, give better or
    worse at most 5% (plus three Monte-Carlo standard errors). decide.decide agrees question by question."""
    module = script()
    reps = 3000
    slack = 3 * math.sqrt(0.05 * 0.95 / reps)
    run = module.simulate_skew(noise_like(3.25), reps, np.random.default_rng(21))
    assert run.checked > 0 and run.agreed == run.checked
    shape, typical, _ = run.typical[0]
    assert (shape.delta, shape.bad, shape.tail) == pytest.approx((1 / 3.25, 0.05, -19 / 3.25))
    assert typical.share(WORSE) <= 0.025 and typical.share(BETTER) > typical.share(WORSE)
    for kind, shape, rates, _ in run.no_difference:
        assert rates.share(BETTER, WORSE) <= 0.05 + slack, (kind, shape)
    for key, (rates, _) in run.failed.items():
        assert rates.share(BETTER, WORSE) <= 0.05 + slack, key


def test_a_shape_shifted_by_its_median_has_a_median_of_zero():
    """The median of a skewed mixture, checked on draws: 0.95·N(δ, 1) + 0.05·N(tail, 1) with the mixture's
    CDF at the median equal to 0.5 by hand, and a tail split evenly about 0 leaves the median at 0."""
    module = script()
    shape = module.Shape(1 / 3.25, 0.05, -19 / 3.25)
    m = shape.median()
    cdf = scipy_stats.norm.cdf
    assert 0.95 * cdf(m - shape.delta) + 0.05 * cdf(m - shape.tail) == pytest.approx(0.5)
    assert module.Shape(0.0, 0.1, 4.0, symmetric=True).median() == pytest.approx(0.0, abs=1e-9)
    noise = noise_like(2.0)
    variant, baseline = module.draw_shape(np.random.default_rng(5), noise, 20000, 9, shape.shifted(-m))
    assert np.median(variant - baseline) == pytest.approx(0.0, abs=0.02 * noise.sd)
    assert np.mean(variant - baseline) == pytest.approx(-m * noise.sd, abs=0.05 * noise.sd)
