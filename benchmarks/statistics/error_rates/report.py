"""The markdown of the verdict error rates: the header, the noise, every section's table and what it
means."""

from __future__ import annotations

import numpy as np
import scipy
import scipy.optimize

from benchmarks.harness import machine_facts, report_header
from benchmarks.statistics.error_rates.noise import (
    ANALYSIS_RULE,
    BUDGET,
    CROSS_CHECK,
    FAIL_RATE,
    MULTIPLES,
    Noise,
    four_digits,
)
from benchmarks.statistics.error_rates.pool import NULL_MATRIX, Resampled
from benchmarks.statistics.error_rates.simulate import Rates, Simulated
from benchmarks.statistics.error_rates.skew import SKEW_SD, SkewRun
from blockbench.report.decide import (
    BETTER,
    EQUIVALENT,
    FUTILITY,
    UNDECIDED,
    VERDICTS,
    WORSE,
)


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
    machine = machine_facts(packages=f"numpy {np.__version__}, scipy {scipy.__version__}")
    lines = [
        *report_header("The verdict rule's error rates, by simulation at the book's seed noise", command, machine),
        f"- {reps:,} simulated questions per scenario, numpy random generator seeded {seed}; every rate is "
        "shown ± its Monte-Carlo standard error √(p(1 - p)/reps). The rule is `blockbench.report.decide` "
        "(docs/decisions/verdict-rule.md); the script is `benchmarks/statistics/verdict_error_rates.py`, whose "
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
        rule = f"{n.family.margin:.0%} of {four_digits(n.baseline_mean)}" if n.family.relative else "absolute"
        lines.append(
            f"| {n.family.label} | {four_digits(n.margin)} ({rule}) | {n.pairs} | **{four_digits(n.sd)}** | "
            f"{four_digits(n.sd_mean)} | "
            f"{four_digits(n.baseline_mean)} | {four_digits(n.trivial)} | {n.sd / n.margin:.2f} |"
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
                f"| {r.noise.family.label} | {r.plan} | {multiple:g} × {four_digits(r.noise.margin)} | "
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
