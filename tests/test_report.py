"""The summary's statistics against hand-computed values, and the report of a synthetic matrix
with finished, diverged and failed cells, a baseline variant, targets and validation histories."""

import csv
import math

import pytest
import yaml
from matplotlib.image import imread
from scipy import stats as scipy_stats

from blockbench.report import write_report
from blockbench.stats import mean_std, t_confidence_interval, time_to_target, welch_difference
from blockbench.train import write_json

T_975_DF2 = 4.302652729749464  # Student t quantile 0.975 at 2 degrees of freedom (tables: 4.303)
T_975_DF4 = 2.776445105197793  # ... at 4 degrees of freedom (tables: 2.776)


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
    assert result.ci_low == pytest.approx(-1.5 - half_width, rel=1e-9) and result.ci_high == pytest.approx(-1.5 + half_width, rel=1e-9)
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


def _history(metric: str, values: list[float]) -> list[dict]:
    return [{"step": 10 * (i + 1), "time_s": 1.5 * (i + 1), "metrics": {metric: v}} for i, v in enumerate(values)]


def test_time_to_target_takes_the_first_validation_in_the_metrics_direction():
    perplexity = _history("perplexity", [50.0, 20.0, 9.0, 12.0, 8.0])
    assert time_to_target(perplexity, "perplexity", 10.0, higher_is_better=False) == (30, 4.5)
    assert time_to_target(perplexity, "perplexity", 20.0, higher_is_better=False) == (20, 3.0)  # reaching = equal is enough
    assert time_to_target(perplexity, "perplexity", 5.0, higher_is_better=False) is None
    accuracy = _history("accuracy", [0.4, 0.6, 0.55, 0.8])
    assert time_to_target(accuracy, "accuracy", 0.6, higher_is_better=True) == (20, 3.0)
    assert time_to_target(accuracy, "accuracy", 0.3, higher_is_better=True) == (10, 1.5)
    assert time_to_target(accuracy, "accuracy", 0.9, higher_is_better=True) is None
    assert time_to_target([{"step": 5, "metrics": {}}, *accuracy], "accuracy", 0.3, True) == (10, 1.5)  # no metric: skipped
    assert time_to_target([], "accuracy", 0.3, True) is None


# the report of a synthetic matrix -----------------------------------------------------------------

LM_BASELINES = {"perplexity": 30.0, "agreement_acc": 0.5, "loss": 3.4}


def _ok(task: str, seed: int, metrics: dict[str, float], history: list[dict] | None, baselines: dict[str, float]) -> dict:
    result = {"status": "ok", "task": task, "seed": seed, "config_hash": "abc", "metrics": metrics,
              "primary_metric": next(iter(metrics)), "baselines": baselines, "data": {}, "steps": 30,
              "wall_time_s": 4.0, "parameters": 1000, "throughput": 100.0, "throughput_unit": "tokens/s", "machine": "test"}
    if history is not None:
        result["history"] = history
    return result


def _lm_history(perplexities: list[float], accuracies: list[float], losses: list[float]) -> list[dict]:
    return [{"step": 10 * (i + 1), "time_s": float(i + 1), "metrics": {"perplexity": p, "agreement_acc": a, "loss": l}}
            for i, (p, a, l) in enumerate(zip(perplexities, accuracies, losses))]


def _speed(seed: int) -> dict:
    """Speed figures of a seed: step time 10 + seed ms, MFU 10 + seed %, data wait 2%, peak memory 500 + 10 seed MB."""
    performance = {"step_time_ms": {"median": 10.0 + seed, "mean": 12.0 + seed}, "data_wait_ms": 0.2,
                   "data_wait_fraction": 0.02, "flops_per_step": 10**9, "achieved_tflops": 0.1 + 0.01 * seed,
                   "peak_tflops": 1.0 + 0.1 * seed, "peak_source": "measured: fp32 matmul 1024^2 median of 5",
                   "mfu": 0.1 + 0.01 * seed, "timed_steps": 27, "warmup_steps": 3}
    return {"performance": performance, "peak_memory": {"cpu_rss_mb": 500.0 + 10 * seed}}


def _lm_ok(seed: int, perplexity: list[float], agreement: list[float], loss: list[float]) -> dict:
    """A finished lm cell whose final metrics are the last validation of its history, with speed figures."""
    final = {"perplexity": perplexity[-1], "agreement_acc": agreement[-1], "loss": loss[-1]}
    return {**_ok("lm", seed, final, _lm_history(perplexity, agreement, loss), LM_BASELINES), **_speed(seed)}


def _write_cells(matrix_dir, cells: list[tuple[str, str, int, dict]]) -> None:
    for index, (task, variant, seed, result) in enumerate(cells):
        cell_dir = matrix_dir / "cells" / task / variant / f"seed{seed}"
        write_json(cell_dir / "cell.json", {"index": index, "task": task, "task_name": task, "variant": variant,
                                            "seed": seed, "axes": {}})
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
        ("lm", SANDWICH, 0, {"status": "diverged", "task": "lm", "seed": 0, "config_hash": "abc", "diverged_at_step": 20,
                             "last_finite_loss": 5.5, "history": _lm_history([40.0], [0.3], [3.7])}),
        ("lm", SANDWICH, 1, {"status": "diverged", "task": "lm", "seed": 1, "config_hash": "abc", "diverged_at_step": 30,
                             "last_finite_loss": None, "history": []}),
        ("lm", SANDWICH, 2, {"status": "diverged", "task": "lm", "seed": 2, "config_hash": "abc", "diverged_at_step": 40,
                             "last_finite_loss": 6.25, "history": _lm_history([40.0, 60.0], [0.3, 0.2], [3.7, 4.1])}),
        ("lm", DEEP, 0, _lm_ok(0, [30.0, 100.0], [0.5, 0.5], [3.0, 4.6])),
        ("lm", DEEP, 1, _lm_ok(1, [30.0, 200.0], [0.5, 0.5], [3.0, 5.3])),
        # metrics in a diverged or failed record must not leak into the statistics
        ("lm", DEEP, 2, {"status": "diverged", "task": "lm", "seed": 2, "config_hash": "abc", "diverged_at_step": 15,
                         "last_finite_loss": 9.0, "history": [], "metrics": {"perplexity": 1e9, "agreement_acc": 0.0, "loss": 1e9}}),
        ("lm", DEEP, 3, {"status": "failed", "task": "lm", "seed": 3, "config_hash": "abc", "error": "RuntimeError: boom",
                         "metrics": {"perplexity": 1e9, "agreement_acc": 0.0, "loss": 1e9}}),
        ("vit", POST, 0, _ok("vit", 0, {"accuracy": 0.5, "loss": 1.2}, None, {"accuracy": 0.2})),
        ("vit", PRE, 0, _ok("vit", 0, {"accuracy": 0.6, "loss": 1.0}, None, {"accuracy": 0.2})),
    ]
    _write_cells(matrix_dir, cells)
    matrix = {"name": "synthetic", "description": "A synthetic matrix.", "axes": {"task": ["lm", "vit"]},
              "baseline_variant": PRE, "targets": {"lm": {"perplexity": 10, "agreement_acc": 0.6}, "vit": {"accuracy": 0.55}}}
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
    expected = ["task", "variant", "metric", "mean", "std", "ci_low", "ci_high", "seeds", "seeds_diverged", "seeds_failed",
                "higher_is_better", "baseline_variant", "diff_vs_baseline", "diff_ci_low", "diff_ci_high", "diff_p_value",
                "significant", "direction", "baseline", "steps", "wall_time_s", "parameters", "throughput",
                "throughput_unit", "step_time_ms", "achieved_tflops", "peak_tflops", "mfu", "data_wait_fraction",
                "peak_memory_mb", "target", "target_reached", "steps_to_target", "seconds_to_target"]
    assert list(next(iter(rows.values()))) == expected
    assert len(rows) == 4 * 3 + 2 * 2  # every task x variant x metric, diverged groups included


def test_statistics_in_the_summary_match_hand_computed_values(summary, rows):
    pre = rows["lm", PRE, "perplexity"]
    assert float(pre["mean"]) == 8.0 and float(pre["std"]) == 1.0 and pre["seeds"] == "3"
    assert float(pre["ci_low"]) == pytest.approx(8 - T_975_DF2 / math.sqrt(3)) and float(pre["ci_high"]) == pytest.approx(8 + T_975_DF2 / math.sqrt(3))
    assert "| norm_placement=pre | [5.516, 10.48] |" not in summary  # digits follow the mean: 3 below 10
    assert "| norm_placement=pre | [5.516, 10.484] |" in summary
    # post vs the baseline pre: +3 with Welch's interval at 4 dof, significant, and worse (perplexity falls)
    post = rows["lm", POST, "perplexity"]
    half_width = T_975_DF4 * math.sqrt(2 / 3)
    assert post["baseline_variant"] == PRE and float(post["diff_vs_baseline"]) == pytest.approx(3.0)
    assert float(post["diff_ci_low"]) == pytest.approx(3 - half_width) and float(post["diff_ci_high"]) == pytest.approx(3 + half_width)
    assert float(post["diff_p_value"]) == pytest.approx(scipy_stats.ttest_ind([10, 11, 12], [7, 8, 9], equal_var=False).pvalue)
    assert post["significant"] == "True" and post["direction"] == "worse"
    assert "| norm_placement=post | +3.00 [+0.73, +5.27] ✓ worse | -0.250 [-0.357, -0.143] ✓ worse | +0.100 [-1.337, +1.537] |" in summary
    assert rows["lm", PRE, "perplexity"]["diff_vs_baseline"] == ""  # the baseline is not compared with itself


def test_speed_figures_are_means_over_the_finished_seeds(summary, rows):
    lm = _section(summary, "## lm:")
    assert ("| seeds | steps | wall time (s) | parameters | step time (ms) | throughput (tokens/s) | MFU | data wait "
            "| peak memory (MB) |") in lm
    # pre: seeds 0, 1, 2; deepnorm: seeds 0 and 1 finished (its diverged and failed seeds are left out)
    assert "| 3 | 30 | 4.0 | 1,000 | 11.0 | 100 | 11.0% | 2.0% | 510 |" in lm.split("| norm_placement=pre |")[1].split("\n")[0]
    assert "| 30 | 4.0 | 1,000 | 10.5 | 100 | 10.5% | 2.0% | 505 |" in lm.split("| norm_placement=deepnorm |")[1].split("\n")[0]
    assert "| *trivial baseline* | 30.00 | 0.500 | 3.400 |" + " |" * 9 + "\n" in lm  # a cell under each other column
    # the peak: mean over the 8 finished cells (1.0, 1.1, 1.2 for post and pre; 1.0, 1.1 for deepnorm)
    assert "MFU is model FLOP/s over the peak of 1.087 TFLOP/s per device (cells: 1.000 to 1.200), measured by a fp32 matmul probe" in lm
    pre = rows["lm", PRE, "loss"]
    assert float(pre["step_time_ms"]) == 11.0 and float(pre["mfu"]) == pytest.approx(0.11)
    assert float(pre["data_wait_fraction"]) == pytest.approx(0.02) and float(pre["peak_memory_mb"]) == 510.0
    assert float(pre["achieved_tflops"]) == pytest.approx(0.11) and float(pre["peak_tflops"]) == pytest.approx(1.1)
    # results written before the speed figures existed: no such columns, blanks in the CSV
    vit = _section(summary, "## vit:")
    assert "MFU" not in vit and "peak memory" not in vit and "step time" not in vit
    assert rows["vit", PRE, "accuracy"]["mfu"] == "" and rows["vit", PRE, "accuracy"]["step_time_ms"] == ""
    assert rows["lm", SANDWICH, "loss"]["mfu"] == ""  # every seed diverged


def test_marker_appears_exactly_when_the_interval_excludes_zero(summary, rows):
    compared = [r for r in rows.values() if r["diff_ci_low"]]
    assert {r["significant"] for r in compared} == {"True", "False"}
    for r in compared:
        assert (r["significant"] == "True") == (float(r["diff_ci_low"]) > 0 or float(r["diff_ci_high"]) < 0)
    assert summary.count("✓") - summary.count("✓ = the interval excludes zero") == sum(r["significant"] == "True" for r in compared)


def test_baseline_variant_comes_from_the_matrix_file(summary):
    lm = _section(summary, "## lm:")
    assert "Difference from the baseline variant `norm_placement=pre`" in lm
    differences = lm[lm.index("Difference from"):]
    assert "| norm_placement=post |" in differences and "| norm_placement=pre |" not in differences.split("\n\n")[1]


def test_diverged_and_failed_cells_are_shown_and_left_out_of_the_statistics(summary, rows):
    lm = _section(summary, "## lm:")
    assert "Cells: 15 (10 ok, 4 diverged, 1 failed)" in summary
    assert "| norm_placement=sandwich | diverged | diverged | diverged | 0 (3 diverged) |" in lm
    assert "| norm_placement=deepnorm | 150.0 ± 70.7 | 0.500 ± 0.000 | 4.950 ± 0.495 | 2 (1 diverged, 1 failed) | 30 |" in lm
    deep = rows["lm", DEEP, "perplexity"]
    assert float(deep["mean"]) == 150.0 and (deep["seeds"], deep["seeds_diverged"], deep["seeds_failed"]) == ("2", "1", "1")
    sandwich = rows["lm", SANDWICH, "perplexity"]
    assert sandwich["mean"] == "" and sandwich["seeds_diverged"] == "3" and sandwich["diff_vs_baseline"] == ""
    assert "| norm_placement=sandwich | diverged | diverged | diverged |" in lm.split("Difference from")[1]
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
    pre = rows["lm", PRE, "perplexity"]
    assert pre["target"] == "10.0" and pre["target_reached"] == "3/3"
    assert float(pre["steps_to_target"]) == pytest.approx(80 / 3) and float(pre["seconds_to_target"]) == pytest.approx(8 / 3)
    assert rows["lm", PRE, "loss"]["target"] == ""
    assert "| norm_placement=pre | no history |" in _section(summary, "## vit:")  # old results


def test_plots_exist_are_pngs_and_are_linked(matrix_dir, summary):
    image = imread(matrix_dir / "plots" / "lm.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 300
    assert "![lm](plots/lm.png)" in _section(summary, "## lm:")
    assert not (matrix_dir / "plots" / "vit.png").exists() and "plots/vit.png" not in summary  # no history: no plot
    assert not list((matrix_dir / "plots").glob(".*"))  # no temporary files left behind


def test_single_seeds_have_no_intervals(summary):
    vit = _section(summary, "## vit:")
    assert "confidence interval of the mean" not in vit  # no variant has two seeds
    assert "| norm_placement=post | -0.100 (no interval: one seed) | +0.200 (no interval: one seed) |" in vit


def test_default_baseline_is_the_first_variant_in_cell_order(tmp_path):
    cells = [("vit", POST, s, _ok("vit", s, {"accuracy": a, "loss": 1.0}, None, {})) for s, a in enumerate([0.5, 0.6])]
    cells += [("vit", PRE, s, _ok("vit", s, {"accuracy": a, "loss": 1.0}, None, {})) for s, a in enumerate([0.7, 0.8])]
    _write_cells(tmp_path, cells)
    summary = write_report(tmp_path)
    assert "Difference from the baseline variant `norm_placement=post`" in summary
    assert "| norm_placement=pre | +0.200 " in summary
    assert "| norm_placement=pre | +0.200 [-0.104, +0.504] | +0.000 (no interval: seeds identical) |" in summary
    assert not (tmp_path / "plots").exists()
