"""The summary's statistics against hand-computed values, and the report of a synthetic matrix
with finished, diverged and failed cells, a baseline variant, targets and validation histories.
(tests/report/test_stats.py checks the bounded intervals, the diverged-seed rule, the paired test and Holm.)"""

import csv
import json
import math
import re
import shutil
import statistics

import numpy as np
import pytest
import yaml
from helpers import T_975_DF2, T_975_DF4, diverged_result, ok_result
from matplotlib.image import imread
from scipy import stats as scipy_stats

from blockbench.cli import main
from blockbench.report.results import MixedHardware, load_groups
from blockbench.report.stats import mean_std, t_confidence_interval, time_to_target, welch_difference
from blockbench.report.summary import write_report
from blockbench.store.layout import write_json
from blockbench.store.record import HARDWARE_WAYS_OUT, HistoryPoint
from blockbench.tasks import TASK_CONFIGS

# statistics -------------------------------------------------------------------------------------


def test_mean_std_and_t_interval_by_hand():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_std([5.0]) == (5.0, 0.0)
    low, high = t_confidence_interval([1.0, 2.0, 3.0])
    half_width = T_975_DF2 * 1.0 / math.sqrt(3)  # 2.484
    assert low == pytest.approx(2 - half_width, rel=1e-9) and high == pytest.approx(2 + half_width, rel=1e-9)
    assert t_confidence_interval([5.0]) is None  # one seed: no interval
    assert t_confidence_interval([4.0, 4.0, 4.0]) == (4.0, 4.0)
    narrow = t_confidence_interval([1.0, 2.0, 3.0], level=0.5)
    assert narrow[1] - narrow[0] < high - low


def test_welch_difference_with_equal_spreads_by_hand():
    # means 2 and 5, both variances 1, n = 3: se = sqrt(1/3 + 1/3); Welch's dof = (2/3)^2 / (2 * (1/3)^2 / 2) = 4
    difference, low, high, p_value = welch_difference([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    se = math.sqrt(2 / 3)
    assert difference == -3.0
    assert low == pytest.approx(-3 - T_975_DF4 * se, rel=1e-9) and high == pytest.approx(-3 + T_975_DF4 * se, rel=1e-9)
    assert p_value == pytest.approx(2 * scipy_stats.t.cdf(-3 / se, 4), rel=1e-9)
    assert p_value == pytest.approx(scipy_stats.ttest_ind([1, 2, 3], [4, 5, 6], equal_var=False).pvalue, rel=1e-9)


def test_welch_difference_with_unequal_spreads_and_sizes():
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0]
    # by hand: means 2.5 and 4, variances 5/3 and 4; squared standard errors 5/12 and 4/3
    se2_a, se2_b = 5 / 12, 4 / 3
    dof = (se2_a + se2_b) ** 2 / (se2_a**2 / 3 + se2_b**2 / 2)  # = 3.0625 / 0.94676 = 3.2347
    assert dof == pytest.approx(3.2347, abs=1e-4)
    half_width = scipy_stats.t.ppf(0.975, dof) * math.sqrt(se2_a + se2_b)
    result = welch_difference(a, b)
    assert result.difference == -1.5
    assert result.ci_low == pytest.approx(-1.5 - half_width, rel=1e-9) and result.ci_high == pytest.approx(
        -1.5 + half_width, rel=1e-9
    )
    assert result.p_value == pytest.approx(scipy_stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
    assert not result.excludes_zero and result.p_value > 0.05
    # the interval excludes zero exactly when the p-value is below 1 - level
    assert welch_difference([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]).excludes_zero


def test_welch_difference_without_an_interval():
    one_seed = welch_difference([3.0], [1.0, 2.0, 3.0])
    assert one_seed.difference == 1.0 and (one_seed.ci_low, one_seed.ci_high, one_seed.p_value) == (None, None, None)
    assert not one_seed.excludes_zero
    identical_seeds = welch_difference([1.0, 1.0], [2.0, 2.0, 2.0])
    assert identical_seeds.difference == -1.0 and identical_seeds.ci_low is None and identical_seeds.p_value is None
    # one side without spread: the dof are the other side's n - 1
    one_sided = welch_difference([2.0, 2.0, 2.0], [1.0, 2.0, 3.0])
    assert one_sided.difference == 0.0 and one_sided.ci_high == pytest.approx(T_975_DF2 / math.sqrt(3), rel=1e-9)


def _history(metric: str, values: list[float]) -> list[HistoryPoint]:
    return [HistoryPoint(step=10 * (i + 1), time_s=1.5 * (i + 1), metrics={metric: v}) for i, v in enumerate(values)]


def test_time_to_target_takes_the_first_validation_in_the_metrics_direction():
    perplexity = _history("perplexity", [50.0, 20.0, 9.0, 12.0, 8.0])
    assert time_to_target(perplexity, "perplexity", 10.0, higher_is_better=False) == (30, 4.5)
    assert time_to_target(perplexity, "perplexity", 20.0, higher_is_better=False) == (
        20,
        3.0,
    )  # reaching = equal is enough
    assert time_to_target(perplexity, "perplexity", 5.0, higher_is_better=False) is None
    accuracy = _history("accuracy", [0.4, 0.6, 0.55, 0.8])
    assert time_to_target(accuracy, "accuracy", 0.6, higher_is_better=True) == (20, 3.0)
    assert time_to_target(accuracy, "accuracy", 0.3, higher_is_better=True) == (10, 1.5)
    assert time_to_target(accuracy, "accuracy", 0.9, higher_is_better=True) is None
    assert time_to_target([HistoryPoint(step=5), *accuracy], "accuracy", 0.3, True) == (10, 1.5)  # no metric: skipped
    assert time_to_target([], "accuracy", 0.3, True) is None


# the report of a synthetic matrix -----------------------------------------------------------------

#: the LM task's metrics: perplexity, agreement, loss, and where the task reports them, the excess loss over
#: the entropy floor and the share of the unigram-to-floor gap closed (computed below from the loss)
LM_METRICS = tuple(m.name for m in TASK_CONFIGS["lm"].metrics)
LM_FLOOR = 1.8
LM_BASELINES = {"perplexity": 30.0, "agreement_acc": 0.5, "loss": 3.4, "loss_floor": LM_FLOOR}


def _lm_figures(perplexity: float, agreement: float, loss: float) -> dict[str, float]:
    """An LM validation's metrics, those derived from the floor included where the task has them."""
    derived = {"excess_loss": loss - LM_FLOOR, "gap_closed": (3.4 - loss) / (3.4 - LM_FLOOR)}
    figures = {"perplexity": perplexity, "agreement_acc": agreement, "loss": loss}
    return {**figures, **{name: derived[name] for name in LM_METRICS if name in derived}}


def _ok(
    task: str, seed: int, metrics: dict[str, float], history: list[dict] | None, baselines: dict[str, float]
) -> dict:
    return ok_result(task, seed, metrics, baselines, data={}, **({} if history is None else {"history": history}))


def _lm_history(perplexities: list[float], accuracies: list[float], losses: list[float]) -> list[dict]:
    return [
        {"step": 10 * (i + 1), "time_s": float(i + 1), "metrics": _lm_figures(p, a, loss)}
        for i, (p, a, loss) in enumerate(zip(perplexities, accuracies, losses, strict=True))
    ]


def _speed(seed: int) -> dict:
    """Speed figures of a seed: step time 10 + seed ms, MFU 10 + seed %, data wait 2%, peak memory 500 + 10 seed MB."""
    performance = {
        "step_time_ms": {"median": 10.0 + seed, "mean": 12.0 + seed},
        "data_wait_ms": 0.2,
        "data_wait_fraction": 0.02,
        "flops_per_step": 10**9,
        "achieved_tflops": 0.1 + 0.01 * seed,
        "peak_tflops": 1.0 + 0.1 * seed,
        "peak_source": "measured: fp32 matmul 1024^2 median of 5",
        "mfu": 0.1 + 0.01 * seed,
        "timed_steps": 27,
        "warmup_steps": 3,
    }
    return {"performance": performance, "peak_memory": {"cpu_rss_mb": 500.0 + 10 * seed}}


def _lm_ok(seed: int, perplexity: list[float], agreement: list[float], loss: list[float]) -> dict:
    """A finished lm cell whose final metrics are the last validation of its history, with speed figures."""
    final = _lm_figures(perplexity[-1], agreement[-1], loss[-1])
    return {**_ok("lm", seed, final, _lm_history(perplexity, agreement, loss), LM_BASELINES), **_speed(seed)}


def _write_cells(matrix_dir, cells: list[tuple[str, str, int, dict]]) -> None:
    for index, (task, variant, seed, result) in enumerate(cells):
        cell_dir = matrix_dir / "cells" / task / variant / f"seed{seed}"
        write_json(
            cell_dir / "cell.json",
            {"index": index, "task": task, "task_name": task, "variant": variant, "seed": seed, "axes": {}},
        )
        write_json(cell_dir / "result.json", result)


POST, PRE, SANDWICH, DEEP = (f"norm_placement={v}" for v in ("post", "pre", "sandwich", "deepnorm"))


@pytest.fixture(scope="module")
def matrix_dir(tmp_path_factory):
    """lm: post (first in cell order), pre (the baseline variant), sandwich (every seed diverged),
    deepnorm (2 ok, 1 diverged, 1 failed); vit: two variants, one old-format seed each (no history)."""
    matrix_dir = tmp_path_factory.mktemp("results") / "synthetic"
    cells = [
        # post: final perplexity 10, 11, 12; agreement never reaches 0.6; loss 1.5, 2.1, 2.7
        ("lm", POST, 0, _lm_ok(0, [30.0, 15.0, 10.0], [0.40, 0.45, 0.50], [3.0, 2.0, 1.5])),
        ("lm", POST, 1, _lm_ok(1, [30.0, 15.0, 11.0], [0.40, 0.45, 0.52], [3.0, 2.5, 2.1])),
        ("lm", POST, 2, _lm_ok(2, [30.0, 15.0, 12.0], [0.40, 0.45, 0.48], [3.0, 2.9, 2.7])),
        # pre: final perplexity 7, 8, 9 (seed 0 below 10 at step 20, the others at step 30); loss 1.9, 2.0, 2.1
        ("lm", PRE, 0, _lm_ok(0, [30.0, 9.5, 7.0], [0.40, 0.65, 0.70], [3.0, 2.5, 1.9])),
        ("lm", PRE, 1, _lm_ok(1, [30.0, 12.0, 8.0], [0.40, 0.65, 0.75], [3.0, 2.5, 2.0])),
        ("lm", PRE, 2, _lm_ok(2, [30.0, 12.0, 9.0], [0.40, 0.65, 0.80], [3.0, 2.5, 2.1])),
        (
            "lm",
            SANDWICH,
            0,
            {
                "status": "diverged",
                "task": "lm",
                "seed": 0,
                "config_hash": "abc",
                "diverged_at_step": 20,
                "last_finite_loss": 5.5,
                "history": _lm_history([40.0], [0.3], [3.7]),
            },
        ),
        (
            "lm",
            SANDWICH,
            1,
            {
                "status": "diverged",
                "task": "lm",
                "seed": 1,
                "config_hash": "abc",
                "diverged_at_step": 30,
                "last_finite_loss": None,
                "history": [],
            },
        ),
        (
            "lm",
            SANDWICH,
            2,
            {
                "status": "diverged",
                "task": "lm",
                "seed": 2,
                "config_hash": "abc",
                "diverged_at_step": 40,
                "last_finite_loss": 6.25,
                "history": _lm_history([40.0, 60.0], [0.3, 0.2], [3.7, 4.1]),
            },
        ),
        ("lm", DEEP, 0, _lm_ok(0, [30.0, 100.0], [0.5, 0.5], [3.0, 4.6])),
        ("lm", DEEP, 1, _lm_ok(1, [30.0, 200.0], [0.5, 0.5], [3.0, 5.3])),
        # metrics in a diverged or failed record must not leak into the statistics
        (
            "lm",
            DEEP,
            2,
            {
                "status": "diverged",
                "task": "lm",
                "seed": 2,
                "config_hash": "abc",
                "diverged_at_step": 15,
                "last_finite_loss": 9.0,
                "history": [],
                "metrics": {"perplexity": 1e9, "agreement_acc": 0.0, "loss": 1e9},
            },
        ),
        (
            "lm",
            DEEP,
            3,
            {
                "status": "failed",
                "task": "lm",
                "seed": 3,
                "config_hash": "abc",
                "error": "RuntimeError: boom",
                "metrics": {"perplexity": 1e9, "agreement_acc": 0.0, "loss": 1e9},
            },
        ),
        ("vit", POST, 0, _ok("vit", 0, {"accuracy": 0.5, "loss": 1.2}, None, {"accuracy": 0.2})),
        ("vit", PRE, 0, _ok("vit", 0, {"accuracy": 0.6, "loss": 1.0}, None, {"accuracy": 0.2})),
    ]
    _write_cells(matrix_dir, cells)
    matrix = {
        "name": "synthetic",
        "description": "A synthetic matrix.",
        "axes": {"task": ["lm", "vit"]},
        "baseline_variant": PRE,
        "targets": {"lm": {"perplexity": 10, "agreement_acc": 0.6}, "vit": {"accuracy": 0.55}},
    }
    (matrix_dir / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    write_report(matrix_dir)
    return matrix_dir


@pytest.fixture(scope="module")
def summary(matrix_dir) -> str:
    return (matrix_dir / "summary.md").read_text()


@pytest.fixture(scope="module")
def rows(matrix_dir) -> dict[tuple[str, str, str], dict[str, str]]:
    with open(matrix_dir / "summary.csv") as f:
        return {(r["task"], r["variant"], r["metric"]): r for r in csv.DictReader(f)}


def _section(summary: str, heading_start: str) -> str:
    """The text from a heading to the next heading of the same level."""
    start = summary.index(heading_start)
    end = summary.find("\n## ", start + 1)
    return summary[start:] if end < 0 else summary[start:end]


def test_summary_csv_columns(rows):
    expected = [
        "task",
        "variant",
        "metric",
        "mean",
        "std",
        "ci_low",
        "ci_high",
        "mean_finished",
        "seeds",
        "seeds_diverged",
        "seeds_failed",
        "seeds_did_not_learn",
        "diverged_value",
        "higher_is_better",
        "baseline_variant",
        "diff_vs_baseline",
        "diff_ci_low",
        "diff_ci_high",
        "diff_test",
        "diff_p_value",
        "direction",
        "verdict",
        "decision_test",
        "decision_seeds",
        "decision_alpha",
        "decision_difference",
        "decision_ci_low",
        "decision_ci_high",
        "decision_p_value",
        "decision_p_equivalence",
        "margin",
        "prob_improvement",
        "prob_improvement_low",
        "prob_improvement_high",
        "decision_final",
        "baseline",
        "steps",
        "wall_time_s",
        "parameters",
        "throughput",
        "throughput_unit",
        "step_time_ms",
        "achieved_tflops",
        "peak_tflops",
        "mfu",
        "data_wait_fraction",
        "peak_memory_mb",
        "target",
        "target_reached",
        "steps_to_target",
        "seconds_to_target",
    ]
    assert list(next(iter(rows.values()))) == expected
    assert len(rows) == 4 * len(LM_METRICS) + 2 * 2  # every task x variant x metric, diverged groups included


def test_statistics_in_the_summary_match_hand_computed_values(summary, rows):
    pre = rows["lm", PRE, "perplexity"]
    assert float(pre["mean"]) == 8.0 and float(pre["std"]) == 1.0 and pre["seeds"] == "3"
    assert float(pre["ci_low"]) == pytest.approx(8 - T_975_DF2 / math.sqrt(3)) and float(
        pre["ci_high"]
    ) == pytest.approx(8 + T_975_DF2 / math.sqrt(3))
    assert "| norm_placement=pre | [5.516, 10.48] |" not in summary  # digits follow the mean: 3 below 10
    assert "| norm_placement=pre | [5.516, 10.484] |" in summary
    # post vs the baseline pre share seeds 0, 1, 2: paired differences, not Welch's unpaired test.
    # Perplexity: every seed pair differs by exactly +3, so the paired t is undefined: no test,
    # and a constant difference beyond the margin is no proof of a difference (decide's rule): undecided
    post = rows["lm", POST, "perplexity"]
    assert post["baseline_variant"] == PRE and float(post["diff_vs_baseline"]) == pytest.approx(3.0)
    assert post["diff_test"] == "paired" and post["diff_ci_low"] == "" and post["diff_p_value"] == ""
    assert post["verdict"] == "undecided" and post["decision_test"] == "none" and post["direction"] == "worse"
    assert rows["lm", POST, "agreement_acc"]["verdict"] == ""  # a secondary metric decides nothing
    # agreement: differences -0.20, -0.23, -0.32 (mean -0.25, std 0.0624)
    agreement = rows["lm", POST, "agreement_acc"]
    half_width = T_975_DF2 * statistics.stdev([-0.20, -0.23, -0.32]) / math.sqrt(3)
    assert float(agreement["diff_ci_low"]) == pytest.approx(-0.25 - half_width)
    assert float(agreement["diff_ci_high"]) == pytest.approx(-0.25 + half_width)
    assert float(agreement["diff_p_value"]) == pytest.approx(
        scipy_stats.ttest_rel([0.50, 0.52, 0.48], [0.70, 0.75, 0.80]).pvalue
    )
    assert (
        "| norm_placement=post | +3.00 (no interval) **undecided** over 3 pairs | -0.250 [-0.405, -0.095] over 3 pairs "
        "| +0.100 [-1.142, +1.342] over 3 pairs |"
    ) in summary
    assert rows["lm", PRE, "perplexity"]["diff_vs_baseline"] == ""  # the baseline is not compared with itself


def test_speed_figures_are_means_over_the_finished_seeds(summary, rows):
    lm = _section(summary, "## lm:")
    assert (
        "| seeds | steps | wall time (s) | parameters | step time (ms) | throughput (tokens/s) | MFU | data wait "
        "| peak memory (MB) |"
    ) in lm
    # pre: seeds 0, 1, 2; deepnorm: seeds 0 and 1 finished (its diverged and failed seeds are left out)
    assert (
        "| 3 | 30 | 4.0 | 1,000 | 11.0 | 100 | 11.0% | 2.0% | 510 |"
        in lm.split("| norm_placement=pre |")[1].split("\n")[0]
    )
    assert (
        "| 30 | 4.0 | 1,000 | 10.5 | 100 | 10.5% | 2.0% | 505 |"
        in lm.split("| norm_placement=deepnorm |")[1].split("\n")[0]
    )
    baselines = " | ".join(["30.00", "0.500", "3.400"] + [""] * (len(LM_METRICS) - 3))
    assert f"| *trivial baseline* | {baselines} |" + " |" * 9 + "\n" in lm  # a cell under each other column
    # the peak: mean over the 8 finished cells (1.0, 1.1, 1.2 for post and pre; 1.0, 1.1 for deepnorm)
    assert (
        "MFU is model FLOP/s over the peak of 1.087 TFLOP/s per device (cells: 1.000 to 1.200), "
        "measured by a fp32 matmul probe" in lm
    )
    pre = rows["lm", PRE, "loss"]
    assert float(pre["step_time_ms"]) == 11.0 and float(pre["mfu"]) == pytest.approx(0.11)
    assert float(pre["data_wait_fraction"]) == pytest.approx(0.02) and float(pre["peak_memory_mb"]) == 510.0
    assert float(pre["achieved_tflops"]) == pytest.approx(0.11) and float(pre["peak_tflops"]) == pytest.approx(1.1)
    # results written before the speed figures existed: no such columns, blanks in the CSV
    vit = _section(summary, "## vit:")
    assert "MFU" not in vit and "peak memory" not in vit and "step time" not in vit
    assert rows["vit", PRE, "accuracy"]["mfu"] == "" and rows["vit", PRE, "accuracy"]["step_time_ms"] == ""
    assert rows["lm", SANDWICH, "loss"]["mfu"] == ""  # every seed diverged


def test_only_the_headline_metric_of_a_variant_has_a_verdict(summary, rows):
    """One question per task x variant, in the headline metric; the other metrics are
    described with unadjusted intervals and decide nothing, and no test is adjusted over the matrix."""
    verdicts = {key: r["verdict"] for key, r in rows.items() if r["verdict"]}
    assert verdicts == {
        ("lm", POST, "perplexity"): "undecided",  # +3 in every pair: no test
        # every seed failed (sandwich's diverged, at 30: +23, +22, +21; deepnorm's 100, 200 did not learn and a
        # diverged 200, vs 7, 8, 9): a rank test decides wherever a seed failed, and 3 pairs cannot (p 0.25)
        ("lm", SANDWICH, "perplexity"): "undecided",
        ("lm", DEEP, "perplexity"): "undecided",
        ("vit", POST, "accuracy"): "undecided",  # one seed: no test
    }
    deep = rows["lm", DEEP, "perplexity"]
    p = scipy_stats.wilcoxon(np.subtract([100.0, 200.0, 200.0], [7.0, 8.0, 9.0]), method="exact").pvalue
    assert p == pytest.approx(0.25) and float(deep["decision_p_value"]) == pytest.approx(p)
    assert deep["decision_test"] == rows["lm", SANDWICH, "perplexity"]["decision_test"] == "Wilcoxon signed-rank"
    # the paired t test would have called it worse (p 0.02): a step no normal model describes
    assert scipy_stats.ttest_rel([100.0, 200.0, 200.0], [7.0, 8.0, 9.0]).pvalue < 0.05
    assert (deep["seeds_did_not_learn"], rows["lm", POST, "perplexity"]["seeds_did_not_learn"]) == ("2", "0")
    assert "Holm" not in summary and "✓" not in summary
    assert "**descriptive, unadjusted** (they decide nothing)" in summary
    assert (
        "| variant | perplexity ↓ (verdict) | agreement_acc ↑ (descriptive, unadjusted) | loss ↓ (descriptive"
        in summary
    )


def test_baseline_variant_comes_from_the_matrix_file(summary):
    lm = _section(summary, "## lm:")
    assert "Difference from the baseline variant `norm_placement=pre`" in lm
    differences = lm[lm.index("Difference from") :]
    assert "| norm_placement=post |" in differences and "| norm_placement=pre |" not in differences.split("\n\n")[1]


def test_diverged_seeds_count_and_failed_cells_are_left_out_of_the_statistics(summary, rows):
    # Leaving diverged seeds out too would flatter: deepnorm would show 150.0 over its 2 finished seeds,
    # and sandwich (every seed diverged) would have no mean and no difference.
    lm = _section(summary, "## lm:")
    assert "Cells: 15 (10 ok, 4 diverged, 1 failed)" in summary
    assert f"| norm_placement=sandwich | {' | '.join(['diverged'] * len(LM_METRICS))} | 3 (3 diverged) |" in lm
    # a diverged lm seed counts with the worse of the baseline and the task's worst finished seed:
    # perplexity max(30, 200) = 200, agreement min(0.5, 0.48) = 0.48, loss max(3.4, 5.3) = 5.3
    assert (
        "perplexity 200.0 (worst finished seed), agreement_acc 0.480 (worst finished seed), "
        "loss 5.300 (worst finished seed)"
    ) in lm
    [deep_row] = [line for line in lm.splitlines() if line.startswith("| norm_placement=deepnorm | 166")]
    assert deep_row.startswith(
        "| norm_placement=deepnorm | 166.7 ± 57.7 (finished 150.0) | 0.493 ± 0.012 (finished 0.500) "
        "| 5.067 ± 0.404 (finished 4.950) |"
    )
    # its finished seeds (perplexity 100 and 200) did not beat the unigram's 30: they did not learn
    assert "| 3 (2 did not learn; 1 diverged; 1 failed, not counted) | 30 |" in deep_row
    deep = rows["lm", DEEP, "perplexity"]
    assert float(deep["mean"]) == pytest.approx(500 / 3) and float(deep["mean_finished"]) == 150.0
    assert (deep["seeds"], deep["seeds_diverged"], deep["seeds_failed"], deep["diverged_value"]) == (
        "3",
        "1",
        "1",
        "200.0",
    )
    # deepnorm's seeds in the statistics (0, 1, 2; the failed seed 3 is out) match pre's: paired
    assert deep["diff_test"] == "paired" and float(deep["diff_vs_baseline"]) == pytest.approx(500 / 3 - 8)
    sandwich = rows["lm", SANDWICH, "perplexity"]
    assert float(sandwich["mean"]) == 200.0 and sandwich["mean_finished"] == "" and sandwich["seeds_diverged"] == "3"
    assert float(sandwich["diff_vs_baseline"]) == 192.0 and sandwich["direction"] == "worse"
    # in its question, a diverged seed counts with the worse of the unigram (30) and the two sides' worst
    # finished seed (pre's 9), not deepnorm's 200: 30 - (7, 8, 9) = +22 [+19.5, +24.5] (the paired t interval,
    # a description: the rank test decides, and with 3 pairs it cannot)
    assert (
        "| norm_placement=sandwich | +22.0 [+19.5, +24.5] **undecided** over 3 pairs |"
        in lm.split("Difference from")[1]
    )
    diverged = _section(summary, "## Diverged cells")
    assert "- `lm/norm_placement=sandwich/seed0`: diverged at step 20, last finite training loss 5.500" in diverged
    assert "- `lm/norm_placement=sandwich/seed1`: diverged at step 30, no finite training loss" in diverged
    assert "- `lm/norm_placement=deepnorm/seed2`: diverged at step 15, last finite training loss 9.000" in diverged
    failed = _section(summary, "## Failed cells")
    assert failed.strip().splitlines()[1:] == ["", "- `lm/norm_placement=deepnorm/seed3`: RuntimeError: boom"]


def test_time_to_target_table(summary, rows):
    lm = _section(summary, "## lm:")
    assert "| variant | perplexity ≤ 10 | agreement_acc ≥ 0.6 |" in lm
    # pre: seeds reach perplexity 10 at steps 20, 30, 30 (2, 3, 3 s); agreement 0.6 at step 20 in every seed
    assert "| norm_placement=pre | 3/3 seeds: 27 steps, 2.7 s | 3/3 seeds: 20 steps, 2.0 s |" in lm
    assert "| norm_placement=post | 1/3 seeds: 30 steps, 3.0 s | 0/3 seeds |" in lm  # 10 reaches a target of 10
    assert "| norm_placement=sandwich | diverged | diverged |" in lm
    assert "| norm_placement=deepnorm | 0/3 seeds | 0/3 seeds |" in lm  # its diverged seed counts (was 0/2)
    pre = rows["lm", PRE, "perplexity"]
    assert pre["target"] == "10.0" and pre["target_reached"] == "3/3"
    assert float(pre["steps_to_target"]) == pytest.approx(80 / 3) and float(pre["seconds_to_target"]) == pytest.approx(
        8 / 3
    )
    assert rows["lm", PRE, "loss"]["target"] == ""
    assert "| norm_placement=pre | no history |" in _section(summary, "## vit:")  # old results


def test_plots_exist_are_pngs_and_are_linked(matrix_dir, summary):
    image = imread(matrix_dir / "plots" / "curves.png")  # one figure, a row per task with a history: lm's alone
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 1000
    assert "![The validation curves of" in _section(summary, "## Validation curves")
    assert "](plots/curves.png)" in summary and "plots/lm.png" not in summary and "plots/vit.png" not in summary
    assert not list((matrix_dir / "plots").glob(".*"))  # no temporary files left behind


def test_single_seeds_have_no_intervals(summary):
    vit = _section(summary, "## vit:")
    assert "confidence interval of the mean" not in vit  # no variant has two seeds
    assert (
        "| norm_placement=post | -0.100 (no interval) **undecided** over 1 pair | +0.200 over 1 pair (no interval: one "
        "seed) |"
    ) in vit


def _tables(section: str) -> dict[str, list[dict[str, str]]]:
    """A task section's markdown tables by kind (``main``, ``interval``, ``difference``, ``target``), each
    a list of rows as {column header: cell}; a table's kind is named by the paragraph above it."""
    kinds = {"95% confidence interval": "interval", "Difference from": "difference", "Time to target": "target"}
    tables: dict[str, list[dict[str, str]]] = {}
    kind, header = "main", None
    for line in section.splitlines():
        if not line.startswith("|"):
            kind = next((k for start, k in kinds.items() if line.startswith(start)), kind)
            header = None
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif not line.startswith("|---"):
            tables.setdefault(kind, []).append(dict(zip(header, cells, strict=True)))
    return tables


def _shows(text: str, value: str) -> bool:
    """Whether the markdown number ``text`` (``1,000``, ``+0.25``, ``11.0%``) is the CSV's ``value`` at
    the precision shown: within half a unit of its last digit."""
    percent = text.endswith("%")
    text = text.rstrip("%").replace(",", "")
    places = len(text.split(".")[1]) if "." in text else 0
    shown = float(text) / 100 if percent else float(text)
    return abs(shown - float(value)) <= 0.5 * 10**-places / (100 if percent else 1) * (1 + 1e-9)


def test_the_markdown_and_the_csv_show_the_same_numbers_for_each_group(summary, rows):
    """Every number of the markdown tables, for every group and metric, is the CSV's number rounded."""
    checked = 0

    def agree(text: str, row: dict[str, str], column: str) -> None:
        nonlocal checked
        assert _shows(text, row[column]), (
            f"{row['task']}/{row['variant']}/{row['metric']}: {column} {text} vs {row[column]!r}"
        )
        checked += 1

    for task in ("lm", "vit"):
        tables = _tables(_section(summary, f"## {task}:"))
        metrics = [m for (t, _, m) in rows if t == task]
        for line in tables["main"]:
            variant = line["variant"]
            if variant == "*trivial baseline*":
                continue
            for column, cell in line.items():
                metric = column.split(" ")[0]
                row = rows.get((task, variant, metric))
                if row is not None and (parts := re.fullmatch(r"(\S+) ± (\S+)(?: \(finished (\S+)\))?", cell)):
                    agree(parts[1], row, "mean"), agree(parts[2], row, "std")
                    if parts[3]:
                        agree(parts[3], row, "mean_finished")
            for metric in dict.fromkeys(metrics):
                row = rows[task, variant, metric]
                seeds = re.fullmatch(
                    r"(\d+)(?: \((?:(\d+) did not learn)?(?:; )?(?:(\d+) diverged)?(?:; )?"
                    r"(?:(\d+) failed, not counted)?\))?",
                    line["seeds"],
                )
                counts = (row["seeds"], row["seeds_did_not_learn"], row["seeds_diverged"], row["seeds_failed"])
                assert (seeds[1], seeds[2] or "0", seeds[3] or "0", seeds[4] or "0") == counts, (
                    f"{task}/{variant}: seeds {line['seeds']} vs {counts}"
                )
                columns = {
                    "steps": "steps",
                    "wall time (s)": "wall_time_s",
                    "parameters": "parameters",
                    "step time (ms)": "step_time_ms",
                    "MFU": "mfu",
                    "data wait": "data_wait_fraction",
                    "peak memory (MB)": "peak_memory_mb",
                }
                columns |= {column: "throughput" for column in line if column.startswith("throughput (")}
                for column, name in columns.items():
                    if line.get(column) not in (None, "", "–"):
                        agree(line[column], row, name)
        for line in tables.get("interval", []):
            for column, cell in line.items():
                if parts := re.fullmatch(r"\[(\S+), (\S+)\]", cell):
                    row = rows[task, line["variant"], column.split(" ")[0]]
                    agree(parts[1], row, "ci_low"), agree(parts[2], row, "ci_high")
        for line in tables.get("difference", []):
            for column, cell in line.items():
                parts = re.fullmatch(
                    r"(\S+)(?: \[(\S+), (\S+)\])?(?: \(no interval(?:: .*)?\))?(?: \*\*(\w+)\*\*)?", cell
                )
                if column == "variant" or not parts or parts[1] in ("diverged", "failed"):
                    continue
                row = rows[task, line["variant"], column.split(" ")[0]]
                # the headline metric shows its decision (its verdict in bold), the others the description
                decided = "decision" if row["verdict"] else "diff"
                agree(parts[1], row, "decision_difference" if row["verdict"] else "diff_vs_baseline")
                if parts[2]:
                    agree(parts[2], row, f"{decided}_ci_low"), agree(parts[3], row, f"{decided}_ci_high")
                assert (parts[4] or "") == row["verdict"], f"{task}/{line['variant']}/{column}: {cell}"
        for line in tables.get("target", []):
            for column, cell in line.items():
                if parts := re.fullmatch(r"(\d+/\d+) seeds(?:: (\S+) steps(?:, (\S+) s)?)?", cell):
                    row = rows[task, line["variant"], column.split(" ")[0]]
                    assert parts[1] == row["target_reached"], (
                        f"{task}/{line['variant']}: reached {parts[1]} vs {row['target_reached']}"
                    )
                    if parts[2]:
                        agree(parts[2], row, "steps_to_target")
                    if parts[3]:
                        agree(parts[3], row, "seconds_to_target")
    assert checked > 100  # the tables were read: every kind of number above is in the synthetic matrix


def test_default_baseline_is_the_first_variant_in_cell_order(tmp_path):
    cells = [("vit", POST, s, _ok("vit", s, {"accuracy": a, "loss": 1.0}, None, {})) for s, a in enumerate([0.5, 0.6])]
    cells += [("vit", PRE, s, _ok("vit", s, {"accuracy": a, "loss": 1.0}, None, {})) for s, a in enumerate([0.7, 0.8])]
    _write_cells(tmp_path, cells)
    summary = write_report(tmp_path)
    assert "Difference from the baseline variant `norm_placement=post`" in summary
    assert "| norm_placement=pre | +0.200 " in summary
    # both variants have seeds 0 and 1: paired, and each pair differs by the same amount (was Welch's [-0.104, +0.504])
    # the headline accuracy: the same +0.2 in both pairs is no test, and beyond any margin: undecided
    assert (
        "| norm_placement=pre | +0.200 (no interval) **undecided** over 2 pairs "
        "| +0.000 over 2 pairs (no interval: the same difference in every seed pair) |"
    ) in summary
    # no history: no curves; the one picture is the verdicts' (tests/report/test_forest.py)
    assert [p.name for p in (tmp_path / "plots").iterdir()] == ["verdicts.png"]


# statistics that do not flatter ------------------------------------------------------------------

TRANSLATION_BASELINES = {"bleu": 0.93, "exact_match": 0.0}  # word-by-word translation


def _translation(seed: int, bleu: float, exact_match: float = 0.1, loss: float = 1.0) -> dict:
    return _ok(
        "translation", seed, {"bleu": bleu, "exact_match": exact_match, "loss": loss}, None, TRANSLATION_BASELINES
    )


def _vit(seed: int, accuracy: float) -> dict:
    return _ok("vit", seed, {"accuracy": accuracy, "loss": 1.0}, None, {"accuracy": 0.2})


def _report(matrix_dir, cells: list[tuple[str, str, int, dict]], baseline_variant: str) -> tuple[str, dict]:
    _write_cells(matrix_dir, cells)
    (matrix_dir / "matrix.yaml").write_text(yaml.safe_dump({"name": "m", "baseline_variant": baseline_variant}))
    summary = write_report(matrix_dir)
    with open(matrix_dir / "summary.csv") as f:
        return summary, {(r["task"], r["variant"], r["metric"]): r for r in csv.DictReader(f)}


def test_a_variant_with_two_of_three_seeds_diverged_does_not_look_as_good_as_its_good_seed(tmp_path):
    cells = [("translation", PRE, s, _translation(s, bleu)) for s, bleu in enumerate([60.0, 62.0, 64.0])]
    cells += [
        ("translation", POST, 0, _translation(0, 80.0)),
        ("translation", POST, 1, diverged_result("translation", 1)),
        ("translation", POST, 2, diverged_result("translation", 2)),
    ]
    summary, rows = _report(tmp_path, cells, PRE)
    # the diverged seeds count with the word-by-word baseline's BLEU 0.93 (every finished seed is better)
    post = rows["translation", POST, "bleu"]
    assert float(post["mean"]) == pytest.approx((80 + 2 * 0.93) / 3) and float(post["mean_finished"]) == 80.0
    assert (post["seeds"], post["seeds_diverged"], float(post["diverged_value"])) == ("3", "2", 0.93)
    assert "| norm_placement=post | 27.29 ± 45.65 (finished 80.00) |" in summary
    assert "| 3 (2 diverged) |" in summary.split("| norm_placement=post |")[1].split("\n")[0]
    assert "bleu 0.930 (trivial baseline)" in summary
    # the difference counts them too: seed-matched differences +20, 0.93 - 62, 0.93 - 64
    differences = [20.0, 0.93 - 62, 0.93 - 64]
    assert post["diff_test"] == "paired" and float(post["diff_vs_baseline"]) == pytest.approx(
        statistics.fmean(differences)
    )
    assert post["direction"] == "worse"
    assert float(post["diff_p_value"]) == pytest.approx(scipy_stats.ttest_rel([80, 0.93, 0.93], [60, 62, 64]).pvalue)
    # the intervals count them as well, and stay in BLEU's range
    assert 0 <= float(post["ci_low"]) < float(post["mean"]) < float(post["ci_high"]) <= 100


def test_seed_matched_variants_get_a_paired_test_and_others_welch_and_the_summary_says_which(tmp_path):
    cells = [("vit", PRE, s, _vit(s, a)) for s, a in enumerate([0.50, 0.60, 0.70])]
    # post tracks pre seed by seed (+0.025, +0.03, +0.02): the seeds' own spread (0.1) hides it from Welch's test
    cells += [("vit", POST, s, _vit(s, a)) for s, a in enumerate([0.525, 0.63, 0.72])]
    cells += [("vit", SANDWICH, s, _vit(s, a)) for s, a in enumerate([0.60, 0.75])]  # seeds 0 and 1 only
    summary, rows = _report(tmp_path, cells, PRE)
    post, sandwich = rows["vit", POST, "accuracy"], rows["vit", SANDWICH, "accuracy"]
    assert post["diff_test"] == "paired"
    assert float(post["diff_p_value"]) == pytest.approx(
        scipy_stats.ttest_rel([0.525, 0.63, 0.72], [0.5, 0.6, 0.7]).pvalue
    )
    half_width = T_975_DF2 * 0.005 / math.sqrt(3)
    assert (float(post["diff_ci_low"]), float(post["diff_ci_high"])) == pytest.approx(
        (0.025 - half_width, 0.025 + half_width)
    )
    assert sandwich["diff_test"] == "welch"
    assert float(sandwich["diff_p_value"]) == pytest.approx(
        scipy_stats.ttest_ind([0.60, 0.75], [0.5, 0.6, 0.7], equal_var=False).pvalue
    )
    # each question alone, at α 0.05: post's paired p of 0.013 decides it
    assert float(post["decision_p_value"]) == pytest.approx(float(post["diff_p_value"]))
    assert post["verdict"] == "better" and sandwich["verdict"] == "undecided"
    assert (post["decision_seeds"], sandwich["decision_seeds"]) == ("3", "2 vs 3")  # pairs; unpaired: each side's
    assert "| norm_placement=post | +0.025 [+0.013, +0.037] **better** over 3 pairs |" in summary
    assert (
        "Decided by: paired t at α 0.05 for `norm_placement=post`; Welch t at α 0.05 for `norm_placement=sandwich`."
    ) in summary


def test_a_verdict_does_not_depend_on_the_other_variants_of_the_matrix(tmp_path):
    """Two variants each better than the baseline by its own paired test (p 0.026 and 0.035): under Holm over
    the matrix both were n.s. (2 x 0.026 > 0.05), and alone in a matrix each would have been marked. Each
    question now depends only on its own cells: better, with or without the other variant."""
    pre = [("vit", PRE, s, _vit(s, a)) for s, a in enumerate([0.50, 0.60, 0.70])]
    post = [("vit", POST, s, _vit(s, a)) for s, a in enumerate([0.52, 0.625, 0.735])]
    sandwich = [("vit", SANDWICH, s, _vit(s, a)) for s, a in enumerate([0.53, 0.62, 0.74])]
    p_post, p_sandwich = (
        scipy_stats.ttest_rel(v, [0.5, 0.6, 0.7]).pvalue for v in ([0.52, 0.625, 0.735], [0.53, 0.62, 0.74])
    )
    assert p_post < p_sandwich < 0.05 < 2 * p_post  # each alone passes; Holm over the two did not
    _, both = _report(tmp_path / "both", pre + post + sandwich, PRE)
    _, alone = _report(tmp_path / "alone", pre + post, PRE)
    assert both["vit", POST, "accuracy"]["verdict"] == alone["vit", POST, "accuracy"]["verdict"] == "better"
    assert both["vit", SANDWICH, "accuracy"]["verdict"] == "better"
    assert both["vit", POST, "accuracy"]["decision_ci_low"] == alone["vit", POST, "accuracy"]["decision_ci_low"]


def test_intervals_of_bounded_metrics_stay_inside_their_range_and_hold_their_mean(tmp_path):
    cells = [
        ("translation", PRE, s, _translation(s, bleu, exact))
        for s, (bleu, exact) in enumerate([(70.0, 0.9), (75.0, 0.9), (80.0, 0.0)])
    ]
    cells += [
        ("translation", POST, s, _translation(s, bleu, exact))
        for s, (bleu, exact) in enumerate([(1.0, 0.0), (2.0, 0.0), (12.0, 0.9)])
    ]
    summary, rows = _report(tmp_path, cells, PRE)
    post = rows["translation", POST, "bleu"]
    # the plain t interval of BLEU 1, 2, 12 is [-10.1, 20.1]: cut at BLEU's bound 0, it holds its mean 5
    half_width = T_975_DF2 * statistics.stdev([1.0, 2.0, 12.0]) / math.sqrt(3)
    assert (float(post["ci_low"]), float(post["ci_high"])) == pytest.approx((0.0, 5.0 + half_width))
    assert "| norm_placement=post | [0.000, 20.110] | [0.000, 1.000] |" in summary  # digits of the mean 5
    assert "Student t, cut at the metric's bounds (bleu in [0, 100], exact_match in [0, 1], loss ≥ 0)" in summary
    for row in rows.values():
        if row["ci_low"] and row["metric"] != "loss":
            high = 100 if row["metric"] == "bleu" else 1
            assert 0 <= float(row["ci_low"]) <= float(row["mean"]) <= float(row["ci_high"]) <= high
    # exact match differences -0.9, -0.9, +0.9: the paired interval [-2.88, +2.28] is not cut to [-1, +1]
    # (a cut interval looks better known than it is)
    exact = rows["translation", POST, "exact_match"]
    half_width = T_975_DF2 * statistics.stdev([-0.9, -0.9, 0.9]) / math.sqrt(3)
    assert (float(exact["diff_ci_low"]), float(exact["diff_ci_high"])) == pytest.approx(
        (-0.3 - half_width, -0.3 + half_width)
    )
    assert "cut to ± the width" not in summary


def test_an_mfu_above_100_percent_is_never_printed(tmp_path):
    """A peak measured too low gives an MFU above 1: no figure, a dash and a note (not "150.0%")."""
    cells = []
    for variant, mfu in ((PRE, 1.5), (POST, 0.4)):
        for seed in (0, 1):
            result = _lm_ok(seed, [30.0, 10.0 + seed], [0.5, 0.6 + 0.01 * seed], [3.0, 2.0 + 0.1 * seed])
            result["performance"] = {**result["performance"], "mfu": mfu}
            cells.append(("lm", variant, seed, result))
    summary, rows = _report(tmp_path, cells, PRE)
    pre_row = summary.split("| norm_placement=pre |")[1].split("\n")[0]
    assert "| 100 | – | 2.0% |" in pre_row and "150" not in summary
    assert "| 100 | 40.0% | 2.0% |" in summary.split("| norm_placement=post |")[1].split("\n")[0]
    assert "An MFU above 100% says the peak was measured too low" in summary
    assert rows["lm", PRE, "perplexity"]["mfu"] == "" and float(rows["lm", POST, "perplexity"]["mfu"]) == pytest.approx(
        0.4
    )


def test_the_header_says_which_commit_made_the_numbers_and_whether_it_was_committed(tmp_path):
    def cell(seed: int, commit: str | None, dirty: bool | None) -> dict:
        result = _ok("vit", seed, {"accuracy": 0.5, "loss": 1.0}, None, {})
        return result if commit is None else {**result, "provenance": {"git": {"commit": commit, "dirty": dirty}}}

    clean = "595b935" + "0" * 33
    _write_cells(tmp_path / "a", [("vit", PRE, s, cell(s, clean, False)) for s in range(2)])
    assert "Code: commit 595b935 (clean tree)  \n" in write_report(tmp_path / "a")
    _write_cells(
        tmp_path / "b",
        [
            ("vit", PRE, 0, cell(0, clean, False)),
            ("vit", PRE, 1, cell(1, "f42b178" + "0" * 33, True)),
            ("vit", PRE, 2, cell(2, None, None)),
        ],
    )
    summary = write_report(tmp_path / "b")
    assert (
        "Code: commit 595b935 (clean tree) (1 cell)  \nCode: commit f42b178 + uncommitted changes (1 cell)  \n"
        in summary
    )


def test_the_header_marks_cells_of_other_code_than_the_checkout_stale(tmp_path):
    from blockbench.provenance import code_fingerprint

    def cell(seed: int, fingerprint: str) -> dict:
        return {
            **_ok("vit", seed, {"accuracy": 0.5, "loss": 1.0}, None, {}),
            "code_fingerprint": fingerprint,
            "provenance": {"git": {"commit": "e9ffbeb" + "0" * 33, "dirty": False}},
        }

    _write_cells(tmp_path / "a", [("vit", PRE, s, cell(s, code_fingerprint())) for s in range(2)])
    assert "Code: commit e9ffbeb (clean tree)  \n" in write_report(tmp_path / "a")
    _write_cells(tmp_path / "b", [("vit", PRE, 0, cell(0, code_fingerprint())), ("vit", PRE, 1, cell(1, "0" * 64))])
    assert (
        "Code: commit e9ffbeb (clean tree) (1 cell)  \nCode: commit e9ffbeb (clean tree), stale at this checkout "
        "(its model, task, trainer or config code has changed since) (1 cell)  \n"
    ) in write_report(tmp_path / "b")


def test_a_reported_cell_scored_on_the_tuning_split_counts_in_no_statistic(tmp_path):
    """A cell whose config says ``task.eval_split: tuning`` validated on the split tuning chose on: the
    summary leaves it out of the verdict and the tables and names it. Here the baseline's seed 2 has
    accuracy 0.99 on the tuning split; counted, the baseline's mean would be 0.73, not 0.60."""
    cells = [("vit", PRE, s, _vit(s, a)) for s, a in enumerate([0.6, 0.6, 0.99])]
    cells += [("vit", POST, s, _vit(s, a)) for s, a in enumerate([0.5, 0.52, 0.54])]
    _write_cells(tmp_path, cells)
    split = {("vit", PRE, 2): "tuning"}
    for task, variant, seed, _ in cells:
        config = {"task": {"name": task, "eval_split": split.get((task, variant, seed), "validation")}}
        (tmp_path / "cells" / task / variant / f"seed{seed}" / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump({"name": "m", "baseline_variant": PRE}))
    summary = write_report(tmp_path)
    assert "## Cells scored on the wrong split" in summary
    assert f"- `vit/{PRE}/seed2`" in summary
    assert f"| {PRE} | 0.600 ± 0.000 |" in summary, summary  # the two validation-split seeds alone
    assert "Cells: 5 of 6 (5 ok, 0 diverged, 0 failed, 1 scored on the wrong split and left out)" in summary
    assert "Unfinished" not in summary
    # the question is decided from the seeds each side has on the validation split: 3 against 2
    verdict = rf"vit \(ViT\), {POST} vs {PRE}: \*\*worse\*\*, by more than the margin \(Welch t, α 0.05\)"
    assert re.search(verdict + ", over 3 vs 2 seeds", summary), summary

    # every seed of the baseline scored the tuning split: no result, and the summary says why
    for seed in range(3):
        config = {"task": {"name": "vit", "eval_split": "tuning"}}
        (tmp_path / "cells" / "vit" / PRE / f"seed{seed}" / "config.yaml").write_text(yaml.safe_dump(config))
    summary = write_report(tmp_path)
    assert "no result: every seed of the baseline left out (scored on the wrong split)" in summary, summary


CPU_CELL = {"precision": "32-true", "runtime": {"accelerator": "cpu"}}
GPU_CELL = {"precision": "bf16-mixed", "runtime": {"accelerator": "cuda"}}


def test_the_report_refuses_to_compare_cells_of_two_devices_or_precisions(tmp_path):
    """A GPU bf16 seed beside CPU float32 seeds of the same variant (one side), or a variant on the GPU
    against a baseline on the CPU, is refused, naming the cells and the ways out; on one hardware, or
    where the matrix varies the precision itself (an axis), the report is written."""
    on_cpu = [("vit", PRE, s, {**_vit(s, a), **CPU_CELL}) for s, a in enumerate([0.6, 0.62, 0.64])]
    post = [("vit", POST, s, {**_vit(s, a), **CPU_CELL}) for s, a in enumerate([0.5, 0.52, 0.54])]
    _write_cells(tmp_path, on_cpu + post)
    assert "## " in write_report(tmp_path)

    on_gpu = [("vit", PRE, 3, {**_vit(3, 0.9), **GPU_CELL})]
    _write_cells(tmp_path, on_cpu + on_gpu + post)
    with pytest.raises(MixedHardware) as refused:
        write_report(tmp_path)
    message = str(refused.value)
    assert message.startswith(
        f"vit: its cells trained on different hardware (cpu at 32-true: 6 cells (vit/{PRE}/seed0, vit/{PRE}/seed1, "
        f"vit/{PRE}/seed2, vit/{POST}/seed0 and 2 more); cuda at bf16-mixed: 1 cell (vit/{PRE}/seed3))"
    ), message
    assert message.endswith(HARDWARE_WAYS_OUT), message  # the ways out the run's refusal gives too
    assert main(["report", str(tmp_path)]) == 2  # the command says it as a user's error, no traceback

    shutil.rmtree(tmp_path / "cells")
    post_on_gpu = [("vit", POST, s, {**_vit(s, a), **GPU_CELL}) for s, a in enumerate([0.5, 0.52, 0.54])]
    _write_cells(tmp_path, on_cpu + post_on_gpu)
    with pytest.raises(MixedHardware, match=f"vit/{POST}/seed0"):
        load_groups(tmp_path)
    for task, variant, seed, _ in on_cpu + post_on_gpu:  # the precision is the matrix's own axis
        cell_file = tmp_path / "cells" / task / variant / f"seed{seed}" / "cell.json"
        cell = json.loads(cell_file.read_text())
        cell["axes"] = {"trainer.precision": "32-true" if variant == PRE else "bf16-mixed", "seed": seed}
        write_json(cell_file, cell)
    assert [len(group.results) for group in load_groups(tmp_path)] == [3, 3]
