"""The book's seed noise per task family: the families, the budget and plans simulated, and the robust
pooled SD of seed-matched differences read from the committed records (``measure_noise``)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from scipy import stats as scipy_stats

from blockbench.report.decide import (
    Looks,
)
from blockbench.store.record import load_record
from blockbench.tasks import TASK_CONFIGS


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


def four_digits(value: float) -> str:
    """A figure of the report to four significant digits."""
    return f"{value:.4g}"
