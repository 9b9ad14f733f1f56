"""The verdicts (``blockbench.report.verdicts``, from ``analysis``'s questions): the lines at the top of
each summary and the index of a results root (``results/README.md``), from hand-written matrix folders
whose paired differences, intervals, tests (t and two one-sided), probabilities of improvement,
diverged and did-not-learn shares and step times are computed here by hand (scipy's t distribution).
No training: every cell is a result.json written below."""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import diverged_result, ok_result
from scipy import stats as scipy_stats

from blockbench.cli import main
from blockbench.matrix.finish import RunRecord, finish_matrix
from blockbench.matrix_command import reporting
from blockbench.matrixfile import REPLICA_SEED_STRIDE
from blockbench.report.analysis import OpenQuestion, analyze, open_questions
from blockbench.report.book import MatrixVerdicts, brief, index_rows
from blockbench.report.decide import Decision, prob_improvement_interval
from blockbench.report.differences import comparisons
from blockbench.report.index import write_index
from blockbench.report.results import load_groups
from blockbench.report.stats import Ratio, ratio_of_medians
from blockbench.report.summary import write_report, write_summary
from blockbench.report.verdicts import FAMILIES, Comparison, Side, transfer
from blockbench.store.layout import write_json
from blockbench.tasks import TASK_CONFIGS
from blockbench.walltime import WallClock

REPO = Path(__file__).resolve().parents[2]
PRE, POST = "norm_placement=pre", "norm_placement=post"
#: every metric but the headline one is the same in every cell: it is described, and decides nothing
CONSTANT = {
    "lm": {"agreement_acc": 0.5, "loss": 2.0},
    "lm_text": {"bits_per_byte": 1.5, "loss": 2.0},
    "translation": {"exact_match": 0.1, "loss": 1.0},
    "vit": {"loss": 1.0},
}
FAMILY = {"lm": "decoder_lm", "lm_text": "decoder_lm", "translation": "encoder_decoder", "vit": "vit"}
HEADLINE = {"lm": "perplexity", "lm_text": "perplexity", "translation": "bleu", "vit": "accuracy"}
TRIVIAL = {
    "lm": {"perplexity": 30.0},
    "lm_text": {"perplexity": 300.0},
    "translation": {"bleu": 0.93},
    "vit": {"accuracy": 0.2},
}
#: the margins of practical equivalence the matrix files below set (``margins:``), so that the expected
#: verdicts do not depend on the tasks' declared ones
MARGINS = {"lm": 0.1, "lm_text": 0.5, "translation": 1.0, "vit": 0.005}


def _result(task_name: str, seed: int, value: float | None, step_time_ms: float | None) -> dict:
    """A finished cell (``value`` of the headline metric), or a diverged one (``value`` None)."""
    if value is None:
        return diverged_result(task_name, seed)
    median = step_time_ms
    timing = {} if median is None else {"performance": {"step_time_ms": {"median": median, "mean": median + 1}}}
    return ok_result(task_name, seed, {HEADLINE[task_name]: value, **CONSTANT[task_name]}, TRIVIAL[task_name], **timing)


def _write_matrix(root, name: str, cells: list[dict], baseline_variant: str | None = None, **settings: object) -> None:
    """``cells``: dicts of task (the row label), task_name, variant, axes, values (headline metric per
    seed, None = diverged), seeds (default 0, 1, ...) and step_time_ms (one for every seed, or a list
    of one per seed); each cell gets cell.json,
    config.yaml (model.family) and
    result.json. The matrix file sets :data:`MARGINS` and ``settings`` (e.g. ``within``, ``axes``)."""
    matrix_dir = root / name
    index = 0
    for cell in cells:
        seeds = cell.get("seeds", range(len(cell["values"])))
        for index_in_cell, (seed, value) in enumerate(zip(seeds, cell["values"], strict=True)):
            cell_dir = matrix_dir / "cells" / cell["task"] / cell["variant"] / f"seed{seed}"
            write_json(
                cell_dir / "cell.json",
                {
                    "index": index,
                    "task": cell["task"],
                    "task_name": cell["task_name"],
                    "variant": cell["variant"],
                    "seed": seed,
                    "axes": {"task": cell["task"], **cell.get("axes", {}), "seed": seed},
                },
            )
            (cell_dir / "config.yaml").write_text(yaml.safe_dump({"model": {"family": FAMILY[cell["task_name"]]}}))
            step_time = cell.get("step_time_ms")
            step_time = step_time[index_in_cell] if isinstance(step_time, list) else step_time
            write_json(cell_dir / "result.json", _result(cell["task_name"], seed, value, step_time))
            index += 1
    tasks = sorted({c["task"] for c in cells})
    matrix = {
        "name": name,
        "axes": {"task": tasks},
        "margins": {c["task"]: {HEADLINE[c["task_name"]]: MARGINS[c["task_name"]]} for c in cells},
        **settings,
    }
    if baseline_variant:
        matrix["baseline_variant"] = baseline_variant
    (matrix_dir / "matrix.yaml").write_text(yaml.safe_dump(matrix))


@dataclass(frozen=True)
class Hand:
    """A question decided by hand: the paired t test and TOST at α = 0.05 (one look)."""

    mean: float
    low: float
    high: float
    p: float
    p_equivalence: float
    verdict: str
    prob: float  # P(better) over all seed pairs, ties half, by counting
    #: a better or worse verdict's form: by more than the margin (the interval's end nearer zero beyond ± the
    #: margin) or possibly by less; "" for the other verdicts
    form: str = ""


def _hand(variant: list[float], baseline: list[float], higher_is_better: bool, margin: float) -> Hand:
    """The verdict of the seed-matched ``variant`` vs ``baseline``, by hand."""
    differences = [v - b for v, b in zip(variant, baseline, strict=True)]
    n = len(differences)
    mean, se = statistics.fmean(differences), statistics.stdev(differences) / math.sqrt(n)
    t = scipy_stats.t(n - 1)
    half = t.ppf(0.975) * se
    p = 2 * t.sf(abs(mean) / se)
    assert p == pytest.approx(scipy_stats.ttest_rel(variant, baseline).pvalue)
    p_equivalence = max(t.sf((mean + margin) / se), t.cdf((mean - margin) / se))
    if p_equivalence < 0.05:
        verdict = "equivalent"
    elif p < 0.05:
        verdict = "better" if (mean > 0) == higher_is_better else "worse"
    else:
        verdict = "undecided"
    wins = [
        1.0 if (v > b if higher_is_better else v < b) else 0.5 if v == b else 0.0 for v in variant for b in baseline
    ]
    form = ""
    if verdict in ("better", "worse"):
        beyond = mean - half > margin if mean > 0 else mean + half < -margin
        form = "by more than the margin" if beyond else "possibly by less than the margin"
    return Hand(mean, mean - half, mean + half, p, p_equivalence, verdict, statistics.fmean(wins), form)


def _expected(
    variant: list[float], baseline: list[float], task_name: str, digits: int, rest: str, flag: str = ""
) -> str:
    """The verdict text of a paired question decided by hand; ``rest`` what follows P(better) (step time...).
    The bootstrap interval of P(better) is ``decide.prob_improvement_interval``'s (tested in test_decide.py)."""
    metric = TASK_CONFIGS[task_name].metrics[0]
    hand = _hand(variant, baseline, metric.higher_is_better, MARGINS[task_name])
    low, high = prob_improvement_interval(variant, baseline, metric.higher_is_better)
    arrow = "↑" if metric.higher_is_better else "↓"
    margin = MARGINS[task_name]
    margin_text = f"{margin:,.{3 if margin < 10 else 2}f}"
    form = f", {hand.form}" if hand.form else ""
    text = (
        f"**{hand.verdict}**{form} (paired t, α 0.05), over {len(variant)} pairs: {metric.name} {arrow} "
        f"{hand.mean:+.{digits}f} [{hand.low:+.{digits}f}, {hand.high:+.{digits}f}], margin ±{margin_text}, "
        f"P(better) {hand.prob:.2f} [{low:.2f}, {high:.2f}]; {rest}"
    )
    return f"{text}; {flag}" if flag else text


def _brief(variant: list[float], baseline: list[float], task_name: str, digits: int, flag: str = "") -> str:
    """The index's cell of a paired question decided by hand: the verdict and the difference with its interval."""
    metric = TASK_CONFIGS[task_name].metrics[0]
    hand = _hand(variant, baseline, metric.higher_is_better, MARGINS[task_name])
    arrow = "↑" if metric.higher_is_better else "↓"
    interval = f"[{hand.low:+.{digits}f}, {hand.high:+.{digits}f}]"
    form = f" ({hand.form})" if hand.form else ""
    text = (
        f"**{hand.verdict}**{form} {metric.name} {arrow} {hand.mean:+.{digits}f} {interval} over {len(variant)} pairs"
    )
    return f"{text}; {flag}" if flag else text


#: the seeds a step time multiple of 3 seeds a side is over, and what it says of cells without a load.json
OVER_3 = "over 3 vs 3 finished seeds, load not recorded"
# norms: post better than pre in all three families; step times 110, 90, 100 ms against 100 ms
NORMS = {
    "lm": ([10.0, 11.0, 12.5], [8.0, 9.1, 10.3], 110.0),
    "translation": ([50.0, 52.0, 54.0], [60.0, 61.5, 64.2], 90.0),
    "vit": ([0.50, 0.55, 0.60], [0.60, 0.66, 0.70], 100.0),
}
#: budget: SwiGLU worse than the MLP at 300 steps, better at 1500
BUDGET = {300: ([10.0, 11.0, 12.5], [12.0, 13.1, 14.3]), 1500: ([8.0, 9.0, 10.0], [6.0, 7.1, 7.8])}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A results root with four matrix folders (norms, mixed, budget, broken: only failed cells, empty:
    no cell) and a folder of matrix files, one of which (never_run) has no results folder."""
    root = tmp_path_factory.mktemp("results")
    cells = []
    for task, (pre, post, step_time) in NORMS.items():
        cells += [
            {"task": task, "task_name": task, "variant": PRE, "values": pre, "step_time_ms": 100.0},
            {"task": task, "task_name": task, "variant": POST, "values": post, "step_time_ms": step_time},
        ]
    _write_matrix(root, "norms", cells)
    # a tuning cell (another phase's seed) must not count: a perplexity of a million would turn the verdict
    tune_dir = root / "norms" / "tune" / "cells" / "lm" / POST / "lr=0.001" / "seed1000"
    write_json(
        tune_dir / "cell.json",
        {"index": 99, "task": "lm", "task_name": "lm", "variant": POST, "seed": 1000, "axes": {}},
    )
    write_json(tune_dir / "result.json", _result("lm", 1000, 1e6, 100.0))

    # mixed: post listed first, the baseline variant (pre) named by the matrix file; the LM task is labelled
    # "images" (its family comes from its config, not its name); the translator's baseline has a diverged
    # seed, the ViT's post one; the ViT cells recorded no step time
    _write_matrix(
        root,
        "mixed",
        [
            {
                "task": "images",
                "task_name": "lm_text",
                "variant": POST,
                "values": [25.0, 26.5, 27.2],
                "step_time_ms": 50.0,
            },
            {
                "task": "images",
                "task_name": "lm_text",
                "variant": PRE,
                "values": [20.0, 21.0, 22.0],
                "step_time_ms": 40.0,
            },
            {
                "task": "translation",
                "task_name": "translation",
                "variant": POST,
                "values": [51.0, 50.0, 56.0],
                "step_time_ms": 30.0,
            },
            {
                "task": "translation",
                "task_name": "translation",
                "variant": PRE,
                "values": [50.0, 52.0, None],
                "step_time_ms": 30.0,
            },
            {"task": "vit", "task_name": "vit", "variant": POST, "values": [0.52, 0.58, None]},
            {"task": "vit", "task_name": "vit", "variant": PRE, "values": [0.50, 0.55, 0.60]},
        ],
        baseline_variant=PRE,
    )

    budget_cells = []
    for steps, (mlp, swiglu) in BUDGET.items():
        for ffn, values in (("mlp", mlp), ("swiglu", swiglu)):
            budget_cells.append(
                {
                    "task": "lm",
                    "task_name": "lm",
                    "variant": f"ffn={ffn},max_steps={steps}",
                    "values": values,
                    "axes": {"model.ffn": ffn, "trainer.max_steps": steps},
                    "step_time_ms": 100.0,
                }
            )
    axes = {"task": ["lm"], "model.ffn": ["mlp", "swiglu"], "trainer.max_steps": [300, 1500], "seed": [0, 1, 2]}
    _write_matrix(root, "budget", budget_cells, axes=axes)

    for seed in (0, 1):
        cell_dir = root / "broken" / "cells" / "vit" / PRE / f"seed{seed}"
        write_json(
            cell_dir / "cell.json",
            {
                "index": seed,
                "task": "vit",
                "task_name": "vit",
                "variant": PRE,
                "seed": seed,
                "axes": {},
                "matrix_file": {"path": "elsewhere/broken.yaml", "sha256": "0"},
            },
        )
        write_json(
            cell_dir / "result.json",
            {"status": "failed", "task": "vit", "seed": seed, "config_hash": "abc", "error": "RuntimeError: boom"},
        )
    (root / "empty").mkdir()
    (root / "empty" / "matrix.yaml").write_text(yaml.safe_dump({"name": "empty", "axes": {"task": ["lm"]}}))
    (root / "train").mkdir()  # `blockbench train` results: not a matrix

    configs = root.parent / "configs"
    configs.mkdir()
    for name in ("norms", "mixed", "budget", "broken"):
        (configs / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, "axes": {"task": ["lm"]}}))
    (configs / "never_run.yaml").write_text(
        yaml.safe_dump({"name": "never_run", "axes": {"task": ["lm"]}, "description": "Pre vs post at a GPU budget."})
    )
    (configs / "notes.yaml").write_text("just: a list\n")  # no name and axes: not a matrix file
    for name in ("norms", "mixed", "budget"):
        write_report(root / name)  # as the runner does before it refreshes the index
    return root


@pytest.fixture(scope="module")
def index(root) -> str:
    return write_index(root, root.parent / "configs")


def _row(index: str, matrix: str, variant: str) -> list[str]:
    """The cells of the index row of ``matrix`` and ``variant`` (the matrix cell links to its summary)."""
    rows = [line for line in index.splitlines() if line.startswith(f"| [{matrix}](") and f" | {variant} | " in line]
    assert len(rows) == 1, rows
    return [cell.strip() for cell in rows[0].strip("|").split(" | ")]


def test_the_index_says_which_code_and_machine_made_each_matrix_and_what_it_cost(root, index):
    """Every number in results/ says where it came from: a row per matrix with its cells' code version
    and machine, its last run, and the time of all its cells' processes, tuning cells included."""
    section = index.split("## Where the numbers come from", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0]: line for line in section.splitlines() if line.startswith("| [")}
    # norms: 18 reported cells and 1 tuning cell of 4 s each; the cells record no git state; no matrix_run.json
    assert (
        rows["| [norms](norms/summary.md)"]
        == "| [norms](norms/summary.md) | not recorded | test | 0:01:16 of cell processes (19 cells) |"
    )
    (root / "run").mkdir()
    _write_matrix(
        root / "run",
        "timed",
        [{"task": "lm", "task_name": "lm", "variant": variant, "values": [7.0, 7.1, 7.3]} for variant in (PRE, POST)],
    )
    timed = root / "run" / "timed"
    for i, result_file in enumerate(sorted(timed.rglob("result.json"))):  # two code versions, one of them dirty
        result = json.loads(result_file.read_text())
        result["provenance"] = {"git": {"commit": "e9ffbeb" + "0" * 33, "dirty": i >= 4}}
        write_json(result_file, result)
    write_json(
        timed / "matrix_run.json",
        {"command": "blockbench matrix timed.yaml --jobs 2", "wall_time_s": 63.0, "cells_trained": 12},
    )
    write_report(timed)
    text = write_index(root / "run", root.parent / "configs")
    row = next(line for line in text.splitlines() if line.startswith("| [timed](timed/summary.md) | commit"))
    assert row == (
        "| [timed](timed/summary.md) | commit e9ffbeb (clean tree) (4 cells); commit e9ffbeb + uncommitted "
        "changes (2 cells) | test | 0:00:24 of cell processes (6 cells); last run "
        "`blockbench matrix timed.yaml --jobs 2`, 0:01:03, 12 cells trained |"
    )
    assert "Code of the tuning cells" not in (timed / "summary.md").read_text()  # a matrix without tune:
    # a tuning candidate added to tune: later, trained by a newer clean commit on another machine: the summary's
    # header and the index say so, not only the reported cells' code
    tune_dir = timed / "tune" / "cells" / "lm" / POST / "lr=0.01" / "seed1000"
    write_json(
        tune_dir / "cell.json",
        {"index": 99, "task": "lm", "task_name": "lm", "variant": POST, "seed": 1000, "axes": {}},
    )
    write_json(
        tune_dir / "result.json",
        {
            **_result("lm", 1000, 9.0, 100.0),
            "machine": "another CPU",
            "provenance": {"git": {"commit": "7cff7a3" + "0" * 33, "dirty": False}},
        },
    )
    write_report(timed)
    header = (timed / "summary.md").read_text().split("\n\n## ", 1)[0]
    assert "Machine: another CPU  \nMachine: test  \n" in header
    assert header.endswith(
        "Code: commit e9ffbeb (clean tree) (4 cells)  \nCode: commit e9ffbeb + uncommitted changes (2 cells)  \n"
        "Code of the tuning cells: commit 7cff7a3 (clean tree)  "
    )
    section = write_index(root / "run", root.parent / "configs").split("## Where the numbers come from", 1)[1]
    row = next(line for line in section.splitlines() if line.startswith("| [timed](timed/summary.md) | commit"))
    assert row.startswith(
        "| [timed](timed/summary.md) | commit e9ffbeb (clean tree) (4 cells); commit e9ffbeb + "
        "uncommitted changes (2 cells); commit 7cff7a3 (clean tree) (1 cell) | another CPU; test | "
    )


def test_index_row_of_a_variant_better_in_every_family(index):
    header = next(line for line in index.splitlines() if line.startswith("| comparison"))
    assert header == "| comparison | variant | baseline | LM | translator | ViT | transfers across the families? |"
    lm, translation, vit = ((post, pre) for pre, post, _ in NORMS.values())
    assert _row(index, "norms", POST) == [
        "[norms](norms/summary.md)",
        POST,
        PRE,
        # lower perplexity is better
        _brief(*lm, "lm", 2),
        _brief(*translation, "translation", 2),
        _brief(*vit, "vit", 3),
        "yes: better in all 3",
    ]
    assert _hand(*lm, False, MARGINS["lm"]).verdict == "better"  # the reference says so too


def test_index_row_of_a_mixed_verdict_with_diverged_seeds_and_no_step_times(index, root):
    """A side whose seeds mix runs that learned with a diverged one is bimodal: the exact Wilcoxon
    signed-rank test decides it (with 3 pairs its smallest p-value is 0.25, so it stays undecided), and
    one decided family out of three is no "yes" and no "no": undecided."""
    # the LM column because the cells' resolved config says model.family: decoder_lm, whatever the task's label
    assert {g.task: g.family for g in load_groups(root / "mixed")} == {
        "images": "decoder_lm",
        "translation": "encoder_decoder",
        "vit": "vit",
    }
    row = _row(index, "mixed", POST)
    assert row[:3] == ["[mixed](mixed/summary.md)", POST, PRE]  # the baseline the matrix file names
    # higher perplexity: worse (MARGINS["lm_text"] of 0.5)
    images = ([25.0, 26.5, 27.2], [20.0, 21.0, 22.0])
    assert _hand(*images, False, 0.5).verdict == "worse"
    assert row[3] == _brief(*images, "lm_text", 2)
    # a diverged seed counts with the worse of the trivial baseline and the task's worst finished seed (0.93)
    translation = _hand([51.0, 50.0, 56.0], [50.0, 52.0, 0.93], True, 1.0)
    assert row[4] == (
        f"**undecided** bleu ↑ {translation.mean:+.2f} [{translation.low:+.2f}, {translation.high:+.2f}] over 3 pairs; "
        "rank test; baseline 1/3 diverged"
    )
    assert scipy_stats.wilcoxon([1.0, -2.0, 55.07], method="exact").pvalue >= 0.25  # too weak for 3 pairs
    assert row[5].startswith("**undecided** accuracy ↑ ") and row[5].endswith("; rank test; 1/3 diverged")
    # the summary has the rest: the test, its α, the margin, P(better), step times
    line = next(x for x in write_report(root / "mixed").splitlines() if x.startswith("- translation (translator)"))
    assert "**undecided** (Wilcoxon signed-rank, α 0.05), over 3 pairs: bleu ↑ " in line and ", margin ±1.000" in line
    assert f"P(better) {translation.prob:.2f} " in line and translation.prob == pytest.approx(6.5 / 9)
    assert line.endswith("; baseline 1/3 diverged; step time ×1.00 over 3 vs 2 finished seeds, load not recorded")
    assert row[6] == "undecided: worse in LM, undecided in translator and ViT"


def test_a_verdict_that_flips_with_the_budget_is_given_per_budget_and_flagged(index, root):
    flag = "⚠ flips: worse at 300 steps, better at 1,500 steps"
    (mlp, swiglu), (mlp_long, swiglu_long) = BUDGET.values()
    assert _row(index, "budget", "ffn=swiglu at 300 steps") == [
        "[budget](budget/summary.md)",
        "ffn=swiglu at 300 steps",
        "ffn=mlp",
        _brief(swiglu, mlp, "lm", 2, flag),
        "–",
        "–",
        "only LM run",
    ]
    assert _row(index, "budget", "ffn=swiglu at 1,500 steps")[3] == (  # means below 10: three decimals
        _brief(swiglu_long, mlp_long, "lm", 3, flag)
    )
    # the MLP at 1500 steps is the baseline of its budget, not a variant compared with the MLP at 300
    assert "| ffn=mlp at" not in index


def test_the_summary_compares_each_budget_with_the_baseline_variant_at_that_budget(root):
    summary = write_report(root / "budget")
    assert "Difference from the baseline variant `ffn=mlp` at the same level (`trainer.max_steps`)" in summary
    mean = _hand(BUDGET[1500][1], BUDGET[1500][0], False, 0.1).mean
    rows = (root / "budget" / "summary.csv").read_text().splitlines()
    swiglu_long = next(r for r in rows if r.startswith('lm,"ffn=swiglu,max_steps=1500",perplexity,'))
    assert ',"ffn=mlp,max_steps=1500",' in swiglu_long and f"{mean:.6f}"[:8] in swiglu_long
    assert "Holm" not in summary  # each question alone: no family
    # the differences across the budgets side by side
    assert "| variant | 300 steps | 1,500 steps |" in summary
    short, long = (_hand(swiglu, mlp, False, 0.1) for mlp, swiglu in BUDGET.values())
    assert (short.form, long.form) == ("by more than the margin", "by more than the margin")
    assert (
        f"| ffn=swiglu | **worse** (by more than the margin) {short.mean:+.2f} [{short.low:+.2f}, {short.high:+.2f}] "
        f"over 3 pairs | **better** (by more than the margin) {long.mean:+.3f} [{long.low:+.3f}, {long.high:+.3f}] "
        "over 3 pairs |"
    ) in summary


def test_matrices_without_results_are_listed_with_the_command_that_runs_them(index, root):
    not_run = index.split("## Not run yet\n\n")[1].strip().splitlines()
    configs = root.parent / "configs"
    assert not_run == [
        f"- broken (2 cell(s) failed, none finished): `blockbench matrix {configs / 'broken.yaml'}`",
        "- empty (no cell has finished): `blockbench matrix <the matrix file of empty>`",
        f"- never_run (no results): Pre vs post at a GPU budget. `blockbench matrix {configs / 'never_run.yaml'}`",
    ]
    assert "[broken]" not in index and "[empty]" not in index and "train" not in index.split("## Not run yet")[1]


def test_each_summary_starts_with_the_verdict_lines_of_its_matrix(root, index):
    summary = write_report(root / "norms")
    verdicts = summary.split("## Verdicts\n")[1].split("\n## ")[0]
    assert summary.index("## Verdicts") < summary.index("## lm:")  # before the detailed tables
    lm, translation, vit = ((post, pre) for pre, post, _ in NORMS.values())
    lines = [line for line in verdicts.splitlines() if line.startswith("- ")]
    assert lines == [  # the index's verdicts in full: the test, its α, the margin, P(better), step times
        f"- lm (LM), {POST} vs {PRE}: {_expected(*lm, 'lm', 2, f'step time ×1.10 {OVER_3}')}",
        f"- translation (translator), {POST} vs {PRE}: "
        + _expected(*translation, "translation", 2, f"step time ×0.90 {OVER_3}"),
        f"- vit (ViT), {POST} vs {PRE}: {_expected(*vit, 'vit', 3, f'step time ×1.00 {OVER_3}')}",
        f"- {POST} vs {PRE}, across the families: yes: better in all 3",
    ]
    assert all(
        _row(index, "norms", POST)[3 + i] in _brief(*pair, task, d)
        for i, (pair, task, d) in enumerate([(lm, "lm", 2), (translation, "translation", 2), (vit, "vit", 3)])
    )
    budget = write_report(root / "budget")
    short = _hand(BUDGET[300][1], BUDGET[300][0], False, 0.1)
    assert (
        "- lm (LM), ffn=swiglu vs ffn=mlp at 300 steps: **worse**, by more than the margin (paired t, α 0.05), "
        "over 3 pairs: "
    ) in budget
    assert f"perplexity ↓ {short.mean:+.2f} [{short.low:+.2f}, {short.high:+.2f}], margin ±0.100, " in budget
    assert f"; step time ×1.00 {OVER_3}; ⚠ flips" in budget
    assert "across the families: " not in budget  # one family: nothing to transfer


def test_report_index_command_writes_the_readme_of_the_results_root(root, capsys):
    configs = root.parent / "configs"
    assert main(["report", "--index", str(root), "--matrices", str(configs)]) == 0
    readme = (root / "README.md").read_text()
    assert readme.startswith(f"# Verdicts\n\nGenerated by `blockbench report --index {root} --matrices {configs}`")
    assert capsys.readouterr().out == readme + "\n"  # and prints it
    assert "| [norms](norms/summary.md) |" in readme
    assert main(["report", "--index", str(root / "missing")]) == 2  # a clear error, not a traceback
    assert "no such folder" in capsys.readouterr().err


def test_a_finished_matrix_refreshes_the_index_of_its_results_root(root, capsys):
    (root / "README.md").unlink(missing_ok=True)
    run = RunRecord("blockbench matrix norms.yaml", 0, [], None, 1, None)
    assert finish_matrix(root / "norms", "norms", WallClock(), run, reporting()) == 0
    readme = (root / "README.md").read_text()
    assert "Generated by `blockbench report --index" in readme and "yes: better in all 3" in readme
    assert "## Verdicts" in (root / "norms" / "summary.md").read_text()
    # the terminal gets the short answer, not the summary's Markdown: a line per question, then the paths
    out = capsys.readouterr().out
    said = out.split("norms: the verdicts\n", 1)[1].splitlines()
    assert "## Verdicts" not in out and len(said) <= 19
    found = write_summary(root / "norms").comparisons
    assert len(said) == len(found) + 3
    for line, c in zip(said, found, strict=False):
        assert line.split()[:4] == [c.task, c.variant, "vs", c.baseline], line
        assert f" {c.verdict} " in line and c.difference_text in line
    assert said[-3:] == [
        f"summary (every number, how each verdict was reached): {root / 'norms' / 'summary.md'}",
        f"TensorBoard: no runs in {root / 'norms' / 'tb'}",
        f"verdicts of every matrix: {root / 'README.md'}",
    ]


def test_the_index_counts_the_decided_family_verdicts_and_what_the_book_cost(tmp_path):
    """The index says how many of its family verdicts are
    decided (better, worse or equivalent) of how many, and the book's cost in cell-process hours,
    reported and tuning cells together."""
    cells = []
    for task, (pre, post, _) in NORMS.items():  # better in all 3 families
        cells += [
            {"task": task, "task_name": task, "variant": PRE, "values": pre},
            {"task": task, "task_name": task, "variant": POST, "values": post},
        ]
    # a second variant: undecided on the LM (differences +1, -1, +0.5), equivalent on the ViT, no translation
    cells += [
        {"task": "lm", "task_name": "lm", "variant": "norm_placement=sandwich", "values": [11.0, 10.0, 13.0]},
        {"task": "vit", "task_name": "vit", "variant": "norm_placement=sandwich", "values": [0.501, 0.5515, 0.6005]},
    ]
    _write_matrix(tmp_path, "book", cells, baseline_variant=PRE)
    tune_dir = tmp_path / "book" / "tune" / "cells" / "lm" / POST / "lr=0.001" / "seed1000"
    write_json(tune_dir / "cell.json", {"index": 0, "task": "lm", "task_name": "lm", "variant": POST, "seed": 1000})
    write_json(tune_dir / "result.json", {**_result("lm", 1000, 9.0, None), "wall_time_s": 3600.0})
    write_report(tmp_path / "book")
    index = write_index(tmp_path, tmp_path / "none")
    assert _hand([11.0, 10.0, 13.0], NORMS["lm"][0], False, 0.1).verdict == "undecided"
    assert _hand([0.501, 0.5515, 0.6005], NORMS["vit"][0], True, 0.005).verdict == "equivalent"
    # questions: post 3 (better x 3, each by more than the margin), sandwich 2 (LM undecided, ViT equivalent):
    # 4 of 5 decided; 24 reported cells of 4 s and one tuning cell of an hour
    forms = [
        _hand(post, pre, TASK_CONFIGS[t].metrics[0].higher_is_better, MARGINS[t]).form
        for t, (pre, post, _) in NORMS.items()
    ]
    assert forms == ["by more than the margin"] * 3
    hours = (24 * 4.0 + 3600.0) / 3600
    assert (
        "**4 of 5 distinct questions are decided** (better, worse or equivalent): better: 3 (3 by more than the "
        "margin), worse: 0 (0 by more than the margin), equivalent: 1, undecided: 1. A question is a variant against "
        "its baseline on one task (at one level); one that several matrices ask of the same cells counts once. All "
        f"these results took **{hours:.1f} cell-process hours** (the summed wall time of every cell's process, a "
        f"cell copied into several matrices counted once: {24 * 4.0 / 3600:.1f} h reported cells, 1.0 h tuning cells)."
    ) in index
    sandwich = _row(index, "book", "norm_placement=sandwich")
    assert sandwich[6] == "undecided: equivalent in ViT, undecided in LM (translator not run)"
    # a second matrix that copied the tuning cell (same config and code) and trained one of its own: the
    # copy costs nothing, the new cell its hour
    record = {**_result("lm", 1000, 9.0, None), "wall_time_s": 3600.0, "config_hash": "c1", "code_fingerprint": "f"}
    write_json(tune_dir / "result.json", record)
    for i, config_hash in enumerate(["c1", "c2"]):
        cell = tmp_path / "other" / "tune" / "cells" / "lm" / POST / f"lr={i}" / "seed1000"
        write_json(cell / "cell.json", {"index": i, "task": "lm", "task_name": "lm", "variant": POST, "seed": 1000})
        write_json(cell / "result.json", {**record, "config_hash": config_hash})
    _write_matrix(tmp_path, "other", cells[:2], baseline_variant=PRE)
    index = write_index(tmp_path, tmp_path / "none")
    assert f"{(24 + 6) * 4.0 / 3600:.1f} h reported cells, 2.0 h tuning cells)." in index
    # a cell resumed after an interruption records only its last process: every cost with it says it is a
    # lower bound (the book's, the matrix's in the index and in its summary); the copy does not count twice
    write_json(tune_dir / "result.json", {**record, "resumed_from_step": 200})
    copy = tmp_path / "other" / "tune" / "cells" / "lm" / POST / "lr=0" / "seed1000" / "result.json"
    write_json(copy, {**record, "config_hash": "c1", "resumed_from_step": 200})
    index = write_index(tmp_path, tmp_path / "none")
    lower = "a lower bound: 1 cell(s) resumed after an interruption count only their last process"
    assert f"2.0 h tuning cells; {lower})." in index
    assert f"of cell processes (25 cells; {lower})" in index and f"of cell processes (8 cells; {lower})" in index
    assert f"cells run side by side take less wall time; {lower})" in write_report(tmp_path / "book")


def test_equivalent_in_every_family_is_an_answer_and_undecided_is_not_a_no(tmp_path):
    """Four verdicts: a difference whose two one-sided tests put it inside ± the
    margin is **equivalent**, and the transfer column says so (``yes: equivalent in all 3``) instead of
    three "n.s." that did not tell "alike" from "we don't know"."""
    alike = {
        "lm": ([7.00, 7.10, 7.20], [7.01, 7.105, 7.21]),
        "translation": ([98.0, 99.0, 97.0], [98.2, 99.1, 97.1]),
        "vit": ([0.80, 0.82, 0.84], [0.801, 0.8215, 0.8405]),
    }
    cells = []
    for task, (pre, post) in alike.items():
        cells += [
            {"task": task, "task_name": task, "variant": PRE, "values": pre},
            {"task": task, "task_name": task, "variant": POST, "values": post},
        ]
    _write_matrix(tmp_path, "alike", cells)
    summary = write_report(tmp_path / "alike")
    for task, (pre, post) in alike.items():
        hand = _hand(post, pre, TASK_CONFIGS[task].metrics[0].higher_is_better, MARGINS[task])
        assert hand.verdict == "equivalent" and hand.p_equivalence < 0.05
        assert f"**equivalent** (paired t, α 0.05), over 3 pairs: {HEADLINE[task]} " in summary
    assert f"- {POST} vs {PRE}, across the families: yes: equivalent in all 3" in summary
    rows = {r.split(",")[2]: r for r in (tmp_path / "alike" / "summary.csv").read_text().splitlines()[1:]}
    assert "equivalent" in rows["accuracy"] and "paired t" in rows["accuracy"]
    # vit's difference 0.001 [0.00016, 0.00184] excludes zero yet lies within ±0.005: equivalent, not better
    assert _hand(*reversed(alike["vit"]), True, 0.005).p < 0.1


def test_the_verdict_of_identical_cells_is_the_same_in_every_matrix(tmp_path):
    """A verdict depends only on the cells it compares. The same post- and pre-norm
    cells in a matrix of two variants and in one of five get the same verdict and numbers (under Holm over
    each matrix's family the larger matrix needed a p-value five times smaller)."""
    pre, post = [7.35, 7.36, 7.34], [7.52, 7.61, 7.48]
    base = [
        {"task": "lm", "task_name": "lm", "variant": PRE, "values": pre},
        {"task": "lm", "task_name": "lm", "variant": POST, "values": post},
    ]
    others = [
        {"task": "lm", "task_name": "lm", "variant": f"norm_placement={name}", "values": [7.3 + 0.1 * i, 7.5, 7.7]}
        for i, name in enumerate(("sandwich", "deepnorm", "mixed"))
    ]
    _write_matrix(tmp_path, "two", base)
    _write_matrix(tmp_path, "five", base + others)
    line = lambda name: next(  # noqa: E731
        x for x in write_report(tmp_path / name).splitlines() if x.startswith(f"- lm (LM), {POST} vs {PRE}: ")
    )
    hand = _hand(post, pre, False, 0.1)
    assert hand.verdict == "worse" and 0.01 < hand.p < 0.05  # 4 x p would not pass: Holm called it n.s.
    assert line("two") == line("five") and "**worse**" in line("two")


def _committed_questions() -> dict[tuple, list[tuple[str, str]]]:
    """Every question of the committed book that has a decision, keyed by what decides it (the two sides'
    cells as (seed, config hash), and the planned looks): key -> [(matrix, the decision in one line)]."""
    found: dict[tuple, list[tuple[str, str]]] = defaultdict(list)
    for matrix_file in sorted((REPO / "results").glob("*/matrix.yaml")):
        for analysis in analyze(matrix_file.parent)[2]:
            for q in analysis.questions:
                if q.decision is not None and q.baseline is not None:
                    sides = tuple(frozenset((r.seed, r.config_hash) for r in g.results) for g in (q.group, q.baseline))
                    found[(*sides, analysis.looks.sizes)].append((matrix_file.parent.name, q.decision.describe()))
    return found


def test_questions_the_committed_book_asks_in_several_matrices_get_one_verdict_everywhere():
    """The case to avoid: post- vs pre-norm on the LM, identical cells in results/norm_placement and
    results/prenorm_vs_postnorm_tuned, n.s. in one and worse in the other under Holm. Now a question
    depends only on its cells (and its planned looks): wherever the book asks it with the same cells,
    the decision, its test, interval and P(better), is the same."""
    shared = {key: seen for key, seen in _committed_questions().items() if len({m for m, _ in seen}) > 1}
    # the rerun flagship and norm_placement share post- vs pre-norm's cells (copied, not trained twice)
    assert shared, "no question of the committed book has the same cells in two matrices"
    for seen in shared.values():
        assert len({line for _, line in seen}) == 1, seen


def test_verdicts_within_levels_of_any_axis(tmp_path):
    """With ``within: [model.n_layers]`` post-norm is compared with pre-norm at each
    depth ("at n_layers=2", "at n_layers=4"), not every combination with the first; the differences
    across the depths stand side by side, and a verdict that changes with the depth is flagged."""
    values = {
        (2, "pre"): [7.00, 7.10, 7.20],
        (2, "post"): [7.01, 7.105, 7.21],  # equivalent at 2 layers
        (4, "pre"): [6.50, 6.60, 6.70],
        (4, "post"): [9.10, 9.40, 9.50],  # worse at 4
    }
    cells = [
        {
            "task": "lm",
            "task_name": "lm",
            "variant": f"n_layers={layers},norm_placement={norm}",
            "values": seeds,
            "axes": {"model.n_layers": layers, "model.norm_placement": norm},
            "step_time_ms": 100.0,
        }
        for (layers, norm), seeds in values.items()
    ]
    axes = {"task": ["lm"], "model.n_layers": [2, 4], "model.norm_placement": ["pre", "post"], "seed": [0, 1, 2]}
    _write_matrix(tmp_path, "depth", cells, axes=axes, within=["model.n_layers"])
    summary = write_report(tmp_path / "depth")
    flag = "⚠ changes with the level: equivalent at n_layers=2, worse at n_layers=4"
    lines = [line for line in summary.splitlines() if line.startswith("- lm (LM)")]
    assert lines == [
        f"- lm (LM), {POST} vs {PRE} at n_layers=2: "
        + _expected(values[2, "post"], values[2, "pre"], "lm", 3, f"step time ×1.00 {OVER_3}", flag),
        f"- lm (LM), {POST} vs {PRE} at n_layers=4: "
        + _expected(values[4, "post"], values[4, "pre"], "lm", 3, f"step time ×1.00 {OVER_3}", flag),
    ]
    assert "n_layers=4,norm_placement=post vs" not in summary
    deep = _hand(values[4, "post"], values[4, "pre"], False, 0.1)
    shallow = _hand(values[2, "post"], values[2, "pre"], False, 0.1)
    assert (
        f"| {POST} | **equivalent** {shallow.mean:+.3f} [{shallow.low:+.3f}, {shallow.high:+.3f}] over 3 pairs "
        f"| **worse** ({deep.form}) {deep.mean:+.3f} [{deep.low:+.3f}, {deep.high:+.3f}] over 3 pairs |"
    ) in summary
    assert "| variant | n_layers=2 | n_layers=4 |" in summary
    index = write_index(tmp_path, tmp_path / "none")
    assert _row(index, "depth", f"{POST} at n_layers=4")[2] == PRE
    assert _row(index, "depth", f"{POST} at n_layers=2")[3].startswith("**equivalent** perplexity ↓ ")
    # the runner's view: nothing open (a fixed seed axis is one look, final)
    assert open_questions(tmp_path / "depth") == []


def test_open_questions_are_the_undecided_ones_that_more_seeds_may_answer(tmp_path):
    """``seeds: {min: 3, max: 9, step: 3}``: a question undecided at 3 seeds is open (the runner adds seeds
    to both sides' cells, named by their cell.json labels), a decided one is not, nor one stopped for
    futility, and none is open once a side reaches the last look."""
    cells = [
        {"task": "lm", "task_name": "lm", "variant": PRE, "values": [7.0, 7.1, 7.2]},
        {"task": "lm", "task_name": "lm", "variant": POST, "values": [7.5, 7.0, 7.6]},  # undecided
        {"task": "lm", "task_name": "lm", "variant": "norm_placement=sandwich", "values": [9.0, 9.2, 9.3]},  # worse
        # seeds 27 margins apart around no difference: 9 seeds cannot decide it, it stops for futility
        {"task": "lm", "task_name": "lm", "variant": "norm_placement=deepnorm", "values": [9.0, 5.2, 7.1]},
    ]
    seeds = {"min": 3, "max": 9, "step": 3}
    axes = {"task": ["lm"], "model.norm_placement": ["pre", "post", "sandwich", "deepnorm"]}
    _write_matrix(tmp_path, "rounds", cells, baseline_variant=PRE, axes=axes, seeds=seeds)
    questions = {q.group.variant: q for a in analyze(tmp_path / "rounds")[2] for q in a.questions}
    assert questions[POST].verdict == "undecided" and questions["norm_placement=sandwich"].verdict == "worse"
    # three looks: each spends 0.05 / 3
    assert questions[POST].decision.alpha == pytest.approx(0.05 / 3) and not questions[POST].decision.final
    assert open_questions(tmp_path / "rounds") == [OpenQuestion("lm", POST, PRE, (), 3)]
    summary = write_report(tmp_path / "rounds")
    assert "Seeds in rounds: looks at 3, 6, 9 seeds, α 0.05 split equally over them." in summary
    assert "**undecided** (paired t, α 0.017; more seeds may decide it), over 3 pairs: " in summary
    deepnorm = questions["norm_placement=deepnorm"].decision
    assert deepnorm.verdict == "undecided" and deepnorm.futile and deepnorm.final
    assert "**undecided** (paired t, α 0.017; stopped for futility: conditional power 0%), over 3 pairs: " in summary
    nine = [{**c, "values": c["values"] * 3} for c in cells]  # the last look: final, whatever it says
    _write_matrix(tmp_path, "last", nine, baseline_variant=PRE, axes=axes, seeds=seeds)
    assert open_questions(tmp_path / "last") == []


ROUND_PRE = [7.0, 7.05, 6.98, 7.02, 6.97, 7.03, 7.01, 6.99, 7.04]
ROUND_POST = [7.25, 7.0, 7.3, 7.1, 7.35, 7.05, 7.3, 7.2, 7.28]  # undecided at 3 and 6 seeds, worse at 9
ROUND_SANDWICH = [7.6, 7.7, 7.65]  # worse at 3 seeds


def _lm_cells(**variants: list[float]) -> list[dict]:
    return [
        {"task": "lm", "task_name": "lm", "variant": f"norm_placement={name}", "values": values}
        for name, values in variants.items()
    ]


def _questions(matrix_dir) -> dict:
    return {q.group.variant: q for a in analyze(matrix_dir)[2] for q in a.questions}


def test_in_rounds_a_question_is_decided_on_its_own_looks_whatever_else_shares_the_baseline(tmp_path):
    """The baseline trains 9 seeds for post-norm's undecided question; sandwich, decided worse at 3, keeps
    its verdict on its 3 pairs (the same as in a matrix without post-norm) instead of being tested again
    as 3 against 9 unpaired seeds: a verdict must not depend on which variants share the matrix."""
    seeds = {"min": 3, "max": 9, "step": 3}
    axes = {"task": ["lm"], "model.norm_placement": ["pre", "post", "sandwich"]}
    cells = _lm_cells(pre=ROUND_PRE, post=ROUND_POST, sandwich=ROUND_SANDWICH)
    _write_matrix(tmp_path, "shared", cells, baseline_variant=PRE, axes=axes, seeds=seeds)
    alone = _lm_cells(pre=ROUND_PRE[:3], sandwich=ROUND_SANDWICH)
    _write_matrix(tmp_path, "alone", alone, baseline_variant=PRE, axes=axes, seeds=seeds)
    shared, single = (_questions(tmp_path / m)["norm_placement=sandwich"].decision for m in ("shared", "alone"))
    assert shared.n == (3,) and shared.test == "paired t" and shared.verdict == "worse"
    assert shared.describe() == single.describe()
    post = _questions(tmp_path / "shared")[POST].decision
    assert post.verdict == "worse" and post.n == (9,)  # its third look decided it
    # futile at 3 pairs while 9 seeds of both sides exist (trained before the futility stop, or by another
    # matrix): the answer is the futile look's, as in a matrix that has only the 3
    wide = [9.0, 5.2, 7.1, 8.8, 5.0, 7.3, 9.1, 5.4, 6.9]
    _write_matrix(tmp_path, "wide", _lm_cells(pre=ROUND_PRE, post=wide), baseline_variant=PRE, axes=axes, seeds=seeds)
    _write_matrix(
        tmp_path, "wide3", _lm_cells(pre=ROUND_PRE, post=wide[:3]), baseline_variant=PRE, axes=axes, seeds=seeds
    )
    three, nine = (_questions(tmp_path / m)[POST].decision for m in ("wide3", "wide"))
    assert three.futile and three.n == (3,) and nine.describe() == three.describe()


def test_an_interrupted_round_is_decided_at_its_last_complete_look_and_resumed(tmp_path):
    """Post-norm's third round stopped after seed 6: its question stays at the look of 6 pairs (not 7 against
    9 seeds, which an uninterrupted run never tests), and the runner asks for seeds up to 9 again."""
    seeds = {"min": 3, "max": 9, "step": 3}
    axes = {"task": ["lm"], "model.norm_placement": ["pre", "post"]}
    _write_matrix(
        tmp_path, "cut", _lm_cells(pre=ROUND_PRE, post=ROUND_POST[:7]), baseline_variant=PRE, axes=axes, seeds=seeds
    )
    post = _questions(tmp_path / "cut")[POST].decision
    assert post.verdict == "undecided" and post.n == (6,) and not post.final
    assert open_questions(tmp_path / "cut") == [OpenQuestion("lm", POST, PRE, (), 6)]
    # replicas (the empirical null): replica b's seeds are shifted by REPLICA_SEED_STRIDE, counted by round
    replicas = [
        {"task": "lm", "task_name": "lm", "variant": "replica=a", "values": ROUND_PRE[:3]},
        {
            "task": "lm",
            "task_name": "lm",
            "variant": "replica=b",
            "values": ROUND_POST,
            "seeds": [REPLICA_SEED_STRIDE + k for k in range(9)],
        },
    ]
    _write_matrix(tmp_path, "null", replicas, baseline_variant="replica=a", axes={"replica": ["a", "b"]}, seeds=seeds)
    null = _questions(tmp_path / "null")["replica=b"].decision
    assert null.test == "Welch t" and null.n == (3, 3)


def _comparison(family: str, verdict: str, difference: float = 1.0) -> Comparison:
    """A comparison in accuracy (higher is better), as the analysis would hand it over."""
    decision = Decision(
        verdict=verdict,
        test="paired t",
        difference=difference,
        interval=(difference - 0.5, difference + 0.5),
        equivalence_interval=None,
        p_value=0.01,
        p_equivalence=0.5,
        margin=0.005,
        alpha=0.05,
        n=(3,),
        excludes_zero=True,
        prob_improvement=1.0,
        prob_improvement_interval=(1.0, 1.0),
        final=True,
    )
    return Comparison(
        task=family,
        family=family,
        variant=POST,
        baseline=PRE,
        level=(),
        metric=TASK_CONFIGS["vit"].metrics[0],
        verdict=verdict,
        decision=decision,
        difference_text="+1.000 [+0.500, +1.500]",
        margin_text="±0.005",
        variant_side=Side(3, 0),
        baseline_side=Side(3, 0),
    )


def test_transfer_names_the_families_that_ran_and_those_without_a_verdict():
    better, worse, equivalent, undecided = (
        _comparison("vit", v) for v in ("better", "worse", "equivalent", "undecided")
    )
    lm = lambda c: replace(c, task="lm", family="decoder_lm")  # noqa: E731
    translator = lambda c: replace(c, task="translation", family="encoder_decoder")  # noqa: E731
    assert transfer([lm(better), better]) == "yes: better in LM and ViT (translator not run)"
    assert transfer([lm(worse), translator(worse), worse]) == "yes: worse in all 3"
    assert transfer([lm(equivalent), translator(equivalent), equivalent]) == "yes: equivalent in all 3"
    assert transfer([lm(better), translator(undecided), worse]) == (
        "no: better in LM, worse in ViT, undecided in translator"
    )
    assert (
        transfer([lm(better), translator(equivalent), better]) == "no: better in LM and ViT, equivalent in translator"
    )
    assert transfer([worse]) == "only ViT run"
    # undecided is not a "no": one decided family is no answer across the families
    assert transfer([lm(better), undecided]) == "undecided: better in LM, undecided in ViT (translator not run)"
    assert transfer([lm(undecided), translator(undecided), undecided]) == "undecided: undecided in all 3"
    # two LM tasks that disagree: the family is mixed, so the verdict does not transfer
    assert transfer([lm(better), replace(lm(equivalent), task="wikitext"), better]) == (
        "no: better in ViT, mixed in LM (translator not run)"
    )
    saturated = replace(translator(undecided), verdict="saturated")
    # nor is it a "yes": two agreeing families beside an undecided or saturated one say so
    assert transfer([lm(better), saturated, better]) == (
        "yes where decided: better in LM and ViT, saturated in translator"
    )
    assert transfer([lm(worse), translator(worse), undecided]) == (
        "yes where decided: worse in LM and translator, undecided in ViT"
    )


def test_a_family_with_several_tasks_has_a_line_per_task_in_its_cell():
    lm = replace(_comparison("decoder_lm", "better"), task="lm")
    wikitext = replace(_comparison("decoder_lm", "equivalent"), task="wikitext")
    vit = _comparison("vit", "better")
    [row] = index_rows(MatrixVerdicts("real", [lm, wikitext, vit]), list(FAMILIES))
    assert row[3] == f"lm: {brief(lm)}<br>wikitext: {brief(wikitext)}"
    assert row[4] == "–" and row[5] == brief(vit)
    assert row[6] == "no: better in ViT, mixed in LM (translator not run)"
    assert vit.describe() == (
        "**better**, by more than the margin (paired t, α 0.05), over 3 pairs: accuracy ↑ +1.000 [+0.500, +1.500], "
        "margin ±0.005, P(better) 1.00 [1.00, 1.00]; step time n/a"
    )


def test_a_matrix_apart_gives_no_verdicts_says_what_it_is_and_is_not_listed_as_not_run(tmp_path):
    """``verdicts: false`` (the smoke matrix, the empirical null): its results are listed apart with its
    file's description, never as verdicts, and its file is not a matrix 'not run yet'. The summary used
    to call every such matrix a demonstration "too small to decide anything", which the empirical null
    (24 runs per task, a calibration of the rule) is not."""
    root = tmp_path / "results"
    cells = [
        {"task": "lm", "task_name": "lm", "variant": variant, "values": values, "step_time_ms": 10.0}
        for variant, values in ((PRE, [7.0, 7.1, 7.2]), (POST, [30.0, 31.0, 30.5]))
    ]
    _write_matrix(root, "smoke", cells)
    matrix_file = root / "smoke" / "matrix.yaml"
    description = "The same model on both sides, the empirical null."
    matrix_file.write_text(
        yaml.safe_dump({**yaml.safe_load(matrix_file.read_text()), "verdicts": False, "description": description})
    )
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "smoke.yaml").write_text(yaml.safe_dump({"name": "smoke", "axes": {"task": ["lm"]}, "verdicts": False}))
    (configs / "demo.yaml").write_text(yaml.safe_dump({"name": "demo", "axes": {"task": ["lm"]}, "verdicts": False}))
    index = write_index(root, configs)
    assert (
        "Not design questions (`verdicts: false` in their matrix file), so not among the verdicts:\n\n"
        f"- [smoke](smoke/summary.md): {description}\n" in index
    )
    assert "| [smoke](" not in index
    assert "Not run yet" not in index and "demo.yaml" not in index
    summary = write_report(root / "smoke")
    assert (
        summary.index("## Verdicts")
        < summary.index(
            "**Not a design question's answer**: this matrix's file says `verdicts: false`, so `results/README.md` "
            "lists it apart from the verdicts. It is: The same model on both sides, the empirical null."
        )
        < summary.index("- lm (LM)")
    )
    _write_matrix(root, "flagship", cells)  # the same cells in a matrix that gives verdicts
    flagship = write_report(root / "flagship")
    assert "## Verdicts" in flagship and "Not a design question" not in flagship


def test_a_tuned_matrix_says_which_value_each_side_trained_at_and_what_tuning_cost(tmp_path):
    """Each variant at its own best learning rate: the verdict names both sides' tuned values (tune.json),
    and the summary states each variant's tuning cells and their cell-process seconds."""
    GRID = [
        {"values": {"optimizer.lr": lr}, "label": f"lr={lr}", "status": "ok", "score": 1.0} for lr in (3e-4, 1e-3, 3e-3)
    ]
    _write_matrix(
        tmp_path,
        "tuned",
        [
            {"task": "lm", "task_name": "lm", "variant": PRE, "values": [7.0, 7.1, 7.3], "step_time_ms": 100.0},
            {"task": "lm", "task_name": "lm", "variant": POST, "values": [9.0, 9.4, 9.5], "step_time_ms": 100.0},
        ],
    )
    write_json(
        tmp_path / "tuned" / "tune.json",
        {
            "keys": ["optimizer.lr"],
            "tune_seeds": [1000, 1001],
            "tasks": {
                "lm": {
                    "metric": "perplexity",
                    "higher_is_better": False,
                    "variants": {
                        PRE: {"chosen": {"optimizer.lr": 0.001}, "chosen_label": "lr=0.001", "candidates": GRID},
                        POST: {"chosen": {"optimizer.lr": 0.0003}, "chosen_label": "lr=0.0003", "candidates": GRID},
                    },
                }
            },
        },
    )
    # tuning cells: three of post-norm (100, 110, 120 s) and two of pre-norm (50, 60 s)
    for variant, seconds in ((POST, [100.0, 110.0, 120.0]), (PRE, [50.0, 60.0])):
        for i, wall in enumerate(seconds):
            cell_dir = tmp_path / "tuned" / "tune" / "cells" / "lm" / variant / f"lr={i}" / "seed1000"
            write_json(cell_dir / "cell.json", {"index": i, "task": "lm", "task_name": "lm", "variant": variant})
            write_json(cell_dir / "result.json", {**_result("lm", 1000, 9.0, None), "wall_time_s": wall})
    write_report(tmp_path / "tuned")
    index = write_index(tmp_path, tmp_path / "no_configs")
    # post-norm's choice is the lowest rate of the grid: its best may lie below, and the verdict says so
    assert _row(index, "tuned", POST)[3].startswith("**worse** (")  # the summary has the tuned values
    summary = (tmp_path / "tuned" / "summary.md").read_text()
    assert f"- lm (LM), {POST} vs {PRE}: **worse**" in summary
    assert "tuned lr=0.0003 (lowest lr tried) vs lr=0.001" in summary
    cost = summary.split("Tuning cost per variant")[1].split("\n\n")[1]
    assert cost.splitlines()[2:] == [
        f"| lm | {POST} | 3 | 330 |",
        f"| lm | {PRE} | 2 | 110 |",
        "| all |  | 5 | 440 |",
    ]


def test_a_matrix_stopped_part_way_says_how_many_cells_it_lacks(tmp_path):
    """A run stopped after 4 of its 8 cells (the 4 others never began, so they have no cell.json): the
    summary and the index count the cells its axes make, not only those begun, and call the verdicts
    provisional, instead of presenting half a matrix as a whole one."""
    cells = [
        {"task": "lm", "task_name": "lm", "variant": variant, "values": values}
        for variant, values in ((PRE, [7.3, 7.4]), (POST, [9.1, 9.6]))
    ]
    _write_matrix(tmp_path, "partial", cells)
    axes = {"task": ["lm", "vit"], "model.norm_placement": ["pre", "post"], "seed": [0, 1]}
    (tmp_path / "partial" / "matrix.yaml").write_text(yaml.safe_dump({"name": "partial", "axes": axes}))
    summary = write_report(tmp_path / "partial")
    assert "Cells: 4 of 8 (4 ok, 0 diverged, 0 failed)" in summary
    assert "Unfinished: 4 cell(s) without a result yet" in summary and "provisional" in summary
    assert "[partial](partial/summary.md) (4 cells without a result)" in write_index(tmp_path, tmp_path / "none")
    _write_matrix(tmp_path, "whole", cells)  # every cell its axes make has a result: nothing said
    assert "Unfinished" not in write_report(tmp_path / "whole") and "Cells: 4 (4 ok" in write_report(tmp_path / "whole")


def test_a_task_both_sides_solve_in_every_seed_is_saturated_not_a_verdict(tmp_path):
    """BLEU 100 in every seed of both sides (dense_vs_moe's translator at 1,500 steps): the comparison is
    saturated, no verdict, and says why; a side well below 100 is no such claim."""
    cells = []
    for steps, moe, dense in ((300, [93.8, 94.8, 87.6], [99.2, 99.5, 98.9]), (1500, [100.0] * 3, [100.0] * 3)):
        for experts, values in ((0, dense), (4, moe)):
            cells.append(
                {
                    "task": "translation",
                    "task_name": "translation",
                    "variant": f"n_experts={experts},max_steps={steps}",
                    "values": values,
                    "axes": {"model.n_experts": experts, "trainer.max_steps": steps},
                    "step_time_ms": 100.0,
                }
            )
    _write_matrix(tmp_path, "moe", cells, baseline_variant="n_experts=0")
    summary = write_report(tmp_path / "moe")
    [long] = [line for line in summary.splitlines() if line.startswith("- translation") and "1,500 steps" in line]
    [short] = [line for line in summary.splitlines() if line.startswith("- translation") and "at 300 steps" in line]
    assert "**saturated** (no verdict: both sides " in long and "the best possible bleu (100)" in long
    assert "the task is solved at this budget and cannot tell them apart" in long
    assert "saturated" not in short
    assert "saturated" in (tmp_path / "moe" / "summary.csv").read_text()
    index = write_index(tmp_path, tmp_path / "none")
    # 300 steps: undecided (differences -5.4, -4.7, -11.3: p = 0.08); 1,500 steps saturated: not decided either
    assert "**0 of 2 distinct questions are decided**" in index
    assert _row(index, "moe", "n_experts=4 at 1,500 steps")[4] == "*saturated* (both at the best bleu)"
    _write_matrix(
        tmp_path,
        "almost",
        [{**c, "values": [100.0, 100.0, 97.0]} if c["variant"] == "n_experts=4,max_steps=1500" else c for c in cells],
        baseline_variant="n_experts=0",
    )
    assert "**saturated**" not in write_report(tmp_path / "almost")


def _translation_cells(post: list[float | None]) -> list[dict]:
    return [
        {"task": "translation", "task_name": "translation", "variant": PRE, "values": [60.0, 62.0, 64.0]},
        {"task": "translation", "task_name": "translation", "variant": POST, "values": post},
    ]


def test_a_cell_that_did_not_learn_is_labelled_counted_and_decided_by_ranks(tmp_path):
    """A finished cell whose BLEU is below word-by-word translation's 0.93 did not learn:
    the summary and the index label it (distinct from diverged and failed) and count it per variant, its
    value counts as it is, and the side, bimodal, is decided by the exact signed-rank test."""
    _write_matrix(tmp_path, "dnl", _translation_cells([80.0, 0.5, 70.0]))
    summary = write_report(tmp_path / "dnl")
    assert f"| {POST} | 50.17 ± " in summary  # (80 + 0.5 + 70) / 3: the value as it is
    assert "| 3 (1 did not learn) |" in summary.split(f"| {POST} |")[1].split("\n")[0]
    section = summary.split("## Cells that did not learn")[1].split("\n## ")[0]
    assert f"- `translation/{POST}/seed1`: bleu 0.500 (trivial baseline 0.930)" in section
    assert f"Per variant: translation {POST}: 1 of 3." in section
    assert "Diverged cells" not in summary and "Failed cells" not in summary
    assert "Wilcoxon signed-rank (a seed did not learn or diverged) at α 0.05" in summary
    row = _row(write_index(tmp_path, tmp_path / "none"), "dnl", POST)
    assert row[4].startswith("**undecided** bleu ↑ ") and row[4].endswith("; rank test; 1/3 did not learn")
    csv_row = next(r for r in (tmp_path / "dnl" / "summary.csv").read_text().splitlines() if f"{POST},bleu" in r)
    assert ",1,Wilcoxon signed-rank," not in csv_row and "Wilcoxon signed-rank" in csv_row
    # the record's own word wins: a cell written with learned: false did not learn, whatever its value
    result_file = tmp_path / "dnl" / "cells" / "translation" / PRE / "seed0" / "result.json"
    write_json(result_file, {**json.loads(result_file.read_text()), "learned": False})
    assert "| 3 (1 did not learn) |" in write_report(tmp_path / "dnl").split(f"| {PRE} |")[1].split("\n")[0]


def test_a_side_whose_seeds_all_failed_is_decided_by_ranks_not_by_the_t_test(tmp_path):
    """Every seed of post-norm did not learn (BLEU 0.5, 0.4, 0.6, below word-by-word translation's 0.93)
    against a pre-norm that learned: a step no normal model describes, so the exact signed-rank test
    decides it, as it does wherever a seed of either side failed. With 3 pairs its smallest p-value is
    0.25, so the question stays undecided; the paired t test would have called it worse (p 0.00034)."""
    post, pre = [0.5, 0.4, 0.6], [60.0, 62.0, 64.0]
    _write_matrix(tmp_path, "all_failed", _translation_cells(post))
    summary = write_report(tmp_path / "all_failed")
    assert "| 3 (3 did not learn) |" in summary.split(f"| {POST} |")[1].split("\n")[0]
    line = next(x for x in summary.splitlines() if x.startswith(f"- translation (translator), {POST} vs {PRE}: "))
    assert "**undecided** (Wilcoxon signed-rank, α 0.05), over 3 pairs: bleu ↑ " in line
    assert "Wilcoxon signed-rank (a seed did not learn or diverged) at α 0.05" in summary
    assert scipy_stats.wilcoxon(np.subtract(post, pre), method="exact").pvalue == pytest.approx(0.25)
    assert scipy_stats.ttest_rel(post, pre).pvalue == pytest.approx(0.000336, abs=1e-6)  # the t test: worse
    row = _row(write_index(tmp_path, tmp_path / "none"), "all_failed", POST)
    assert row[4].startswith("**undecided** bleu ↑ ") and row[4].endswith("; rank test; 3/3 did not learn")


def test_a_question_decided_by_ranks_reads_worse_where_the_variant_is_worse_in_its_metric_s_direction(tmp_path):
    """Post-norm is worse than pre-norm in all six pairs of both tasks, two of its seeds runs that did not
    learn (LM perplexity 31, above the unigram's 30; ViT accuracy 0.1, below chance's 0.2): each side mixes,
    so the exact signed-rank test decides (p = 2/2^6 < 0.05), and it reads worse both where lower is better
    (the perplexity rose) and where higher is better (the accuracy fell), in the summary and the index."""
    cells = [
        {"task": "lm", "task_name": "lm", "variant": PRE, "values": [7.0, 7.1, 6.9, 7.2, 7.05, 6.95]},
        {"task": "lm", "task_name": "lm", "variant": POST, "values": [7.4, 31.0, 7.3, 31.0, 7.5, 7.35]},
        {"task": "vit", "task_name": "vit", "variant": PRE, "values": [0.80, 0.81, 0.79, 0.82, 0.80, 0.78]},
        {"task": "vit", "task_name": "vit", "variant": POST, "values": [0.75, 0.1, 0.76, 0.1, 0.74, 0.73]},
    ]
    _write_matrix(tmp_path, "ranks", cells, baseline_variant=PRE)
    summary = write_report(tmp_path / "ranks")
    for task, family, metric, arrow in (("lm", "LM", "perplexity", "↓"), ("vit", "ViT", "accuracy", "↑")):
        pre, post = (next(c["values"] for c in cells if c["task"] == task and c["variant"] == v) for v in (PRE, POST))
        assert all(TASK_CONFIGS[task].metrics[0].higher_is_better == (p < b) for p, b in zip(post, pre, strict=True))
        line = next(x for x in summary.splitlines() if x.startswith(f"- {task} ({family}), {POST} vs {PRE}: "))
        assert f"(Wilcoxon signed-rank, α 0.05), over 6 pairs: {metric} {arrow} " in line and "**worse**" in line
        assert "2/6 did not learn" in line
    assert scipy_stats.wilcoxon(np.subtract(cells[1]["values"], cells[0]["values"])).pvalue == pytest.approx(2 / 64)
    row = _row(write_index(tmp_path, tmp_path / "none"), "ranks", POST)
    assert row[3].startswith("**worse** (") and " perplexity ↓ " in row[3] and "rank test" in row[3]
    assert row[5].startswith("**worse** (") and " accuracy ↑ " in row[5] and "rank test" in row[5]


def test_an_unpaired_question_prints_each_side_s_seed_count_variant_first(tmp_path):
    """Sides with different seeds are compared unpaired (Welch), and every place that prints the look's size
    names each side's seed count, the variant's first, as the cells on disk hold them: the verdict line,
    the decision's own line and summary.csv. Post-norm has 3 seeds and sandwich 5 against pre-norm's 4, so
    a swapped, sorted, smallest or largest count cannot pass."""
    values = {
        PRE: [7.0, 7.1, 7.05, 6.95],
        POST: [7.5, 7.6, 7.55],
        "norm_placement=sandwich": [7.4, 7.5, 7.45, 7.6, 7.55],
    }
    cells = [{"task": "lm", "task_name": "lm", "variant": v, "values": vals} for v, vals in values.items()]
    _write_matrix(tmp_path, "unpaired", cells, baseline_variant=PRE)
    summary = write_report(tmp_path / "unpaired")
    questions = _questions(tmp_path / "unpaired")
    with open(tmp_path / "unpaired" / "summary.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f) if r["metric"] == "perplexity"}
    for variant in (POST, "norm_placement=sandwich"):
        n, n_baseline = len(values[variant]), len(values[PRE])
        decision = questions[variant].decision
        assert decision.test == "Welch t" and decision.n == (n, n_baseline)
        assert f", n={n}/{n_baseline}, " in decision.describe()
        line = next(x for x in summary.splitlines() if x.startswith(f"- lm (LM), {variant} vs {PRE}: "))
        assert f"(Welch t, α 0.05), over {n} vs {n_baseline} seeds: " in line
        assert rows[variant]["decision_seeds"] == f"{n} vs {n_baseline}"


def test_the_summary_says_what_the_seed_varies_and_the_margin_it_used(tmp_path):
    """Each task's section states its margin of practical equivalence (the matrix
    file's, or the task's declared one with its reason) and whether a seed draws the data or the draw is fixed."""
    _write_matrix(tmp_path, "seeded", _translation_cells([61.0, 62.5, 64.5]))
    for config in (tmp_path / "seeded" / "cells").rglob("config.yaml"):
        section = {"name": "translation", "data_seed": 1234}
        config.write_text(yaml.safe_dump({"model": {"family": "encoder_decoder"}, "task": section}))
    summary = write_report(tmp_path / "seeded")
    fixed = TASK_CONFIGS["translation"](data_seed=1234)
    assert "Margin of practical equivalence: ±1.000 (the matrix file's `margins:`)." in summary
    if hasattr(fixed, "seed_varies"):
        assert f"A seed varies {fixed.seed_varies()}." in summary and "data_seed=1234" in summary
    else:  # from the cells' task.data_seed
        assert "the data draw is fixed (data_seed=1234)" in summary
    for config in (tmp_path / "seeded" / "cells").rglob("config.yaml"):
        config.write_text(yaml.safe_dump({"task": {"name": "translation", "data_seed": None}}))
    assert "A seed varies the data draw, " in write_report(tmp_path / "seeded")


def test_in_rounds_a_saturated_look_before_the_last_asks_for_more_seeds(tmp_path):
    """With seeds that draw the data, a task is at its ceiling in some draws only: grouped-query's
    translation sat at BLEU >= 99.5 on its first 3 seeds while the same baseline's next seeds fell to
    95. A saturated look before the last is not final: the runner adds seeds, and the question is
    decided (or called saturated) on the looks that follow."""
    seeds = {"min": 3, "max": 9, "step": 3}
    axes = {"task": ["translation"], "model.n_kv_heads": [4, 2]}
    base, gqa = [99.55, 99.6, 99.64, 99.4, 98.18, 94.98], [99.36, 99.75, 99.62, 99.5, 98.3, 95.2]

    def cells(n: int) -> list[dict]:
        return [
            {"task": "translation", "task_name": "translation", "variant": "n_kv_heads=4", "values": base[:n]},
            {"task": "translation", "task_name": "translation", "variant": "n_kv_heads=2", "values": gqa[:n]},
        ]

    _write_matrix(tmp_path, "three", cells(3), baseline_variant="n_kv_heads=4", axes=axes, seeds=seeds)
    question = _questions(tmp_path / "three")["n_kv_heads=2"]
    assert question.verdict == "saturated" and question.more_seeds
    assert open_questions(tmp_path / "three") == [OpenQuestion("translation", "n_kv_heads=2", "n_kv_heads=4", (), 3)]
    _write_matrix(tmp_path, "six", cells(6), baseline_variant="n_kv_heads=4", axes=axes, seeds=seeds)
    question = _questions(tmp_path / "six")["n_kv_heads=2"]
    assert question.verdict == "equivalent" and question.decision.n == (6,) and not question.more_seeds
    # a fixed seed list (one look, the last): saturated is final, as before
    fixed = {"task": ["translation"], "model.n_kv_heads": [4, 2], "seed": [0, 1, 2]}
    _write_matrix(tmp_path, "fixed", cells(3), baseline_variant="n_kv_heads=4", axes=fixed)
    assert (
        _questions(tmp_path / "fixed")["n_kv_heads=2"].verdict == "saturated"
        and open_questions(tmp_path / "fixed") == []
    )


ROUNDS = {"min": 3, "max": 9, "step": 3}


def _vit_cells(**variants: list[float | None]) -> list[dict]:
    return [
        {"task": "vit", "task_name": "vit", "variant": f"norm_placement={name}", "values": values}
        for name, values in variants.items()
    ]


def test_a_look_is_saturated_or_not_on_its_own_seeds_whatever_the_baseline_trained_past_it(tmp_path):
    """Grouped-query-like translation at its ceiling on seeds 0-2 of both sides: saturated. A baseline seed
    past the look (seed 7, trained for another variant's question) that diverged used to veto the
    saturation, so the same seeds were saturated in one matrix and got a verdict in another."""
    axes = {"task": ["translation"], "model.norm_placement": ["pre", "post", "sandwich"]}
    pre, post = [99.95, 99.9, 99.97], [99.93, 99.96, 99.9]

    def cells(extra: bool) -> list[dict]:
        base = {"task": "translation", "task_name": "translation", "variant": PRE, "values": pre}
        if extra:
            base = {**base, "values": [*pre, None], "seeds": [0, 1, 2, 7]}
        return [base, {"task": "translation", "task_name": "translation", "variant": POST, "values": post}]

    for name, extra in (("alone", False), ("shared", True)):
        _write_matrix(tmp_path, name, cells(extra), baseline_variant=PRE, axes=axes, seeds=ROUNDS)
    alone, shared = (_questions(tmp_path / m)[POST] for m in ("alone", "shared"))
    assert alone.verdict == shared.verdict == "saturated"
    assert alone.decision.describe() == shared.decision.describe()


def test_a_diverged_seed_counts_with_a_value_from_the_compared_cells_alone(tmp_path):
    """Post-norm's seed 0 diverged; it counts as the worse of the trivial baseline (0.2) and the two sides'
    worst finished seed, not the matrix's: a third variant's seed at 0.10 used to pull it down to 0.10, and
    the signed-rank test on the same nine pairs read worse (p 0.0117 < 0.0167) instead of undecided (p 0.0195)."""
    axes = {"task": ["vit"], "model.norm_placement": ["pre", "post", "sandwich"]}
    pre = [0.25, 0.80, 0.81, 0.82, 0.83, 0.84, 0.85, 0.86, 0.87]
    post = [None, 0.77, 0.91, 0.32, 0.32, 0.32, 0.32, 0.32, 0.32]
    sandwich = [0.10, 0.7, 0.7]
    _write_matrix(tmp_path, "pair", _vit_cells(pre=pre, post=post), baseline_variant=PRE, axes=axes, seeds=ROUNDS)
    _write_matrix(
        tmp_path,
        "three",
        _vit_cells(pre=pre, post=post, sandwich=sandwich),
        baseline_variant=PRE,
        axes=axes,
        seeds=ROUNDS,
    )
    pair, three = (_questions(tmp_path / m)[POST].decision for m in ("pair", "three"))
    assert pair.test == "Wilcoxon signed-rank" and pair.n == (9,)
    assert pair.describe() == three.describe() and three.verdict == "undecided"
    differences = [0.2 - 0.25] + [v - b for v, b in zip(post[1:], pre[1:], strict=True)]
    assert three.p_value == pytest.approx(scipy_stats.wilcoxon(differences).pvalue)


def test_when_no_seed_of_either_side_learned_there_is_no_result_not_equivalent(tmp_path):
    """Every seed of both sides diverged: both count at the same imputed value, a constant difference of 0
    that read *equivalent*, a claim made from no measurement. Now: no result; before the last look the
    runner adds seeds (the next data draws may learn), at the last it stops. Where one side learned, the
    rank test compares them, as wherever a seed failed."""
    axes = {"task": ["vit"], "model.norm_placement": ["pre", "post", "sandwich"]}
    # sandwich's finished seeds carry the task's trivial baseline (0.2) that the diverged seeds count at
    cells = _vit_cells(pre=[None, None, None], post=[None, None, None], sandwich=[0.8, 0.81, 0.79])
    _write_matrix(tmp_path, "broken", cells, baseline_variant=PRE, axes=axes, seeds=ROUNDS)
    question = _questions(tmp_path / "broken")[POST]
    assert question.verdict == "no result" and "no seed of either side learned" in question.missing
    # sandwich learned against a baseline whose seeds all diverged: the rank test, which 3 pairs cannot decide
    assert open_questions(tmp_path / "broken") == [
        OpenQuestion("vit", POST, PRE, (), 3),
        OpenQuestion("vit", "norm_placement=sandwich", PRE, (), 3),
    ]
    nine = _vit_cells(pre=[None] * 9, post=[None] * 9, sandwich=[0.8, 0.81, 0.79] * 3)
    _write_matrix(tmp_path, "nine", nine, baseline_variant=PRE, axes=axes, seeds=ROUNDS)
    assert _questions(tmp_path / "nine")[POST].verdict == "no result" and open_questions(tmp_path / "nine") == []
    # one side learned: compared by the rank test (the diverged side counts at the trivial baseline's 0.2),
    # undecided at 3 pairs (its smallest p is 0.25), worse at 9 (p = 2/2^9 < 0.05/3)
    half = _vit_cells(pre=[0.8, 0.82, 0.81], post=[None] * 3)
    _write_matrix(tmp_path, "half", half, baseline_variant=PRE, axes=axes, seeds=ROUNDS)
    decision = _questions(tmp_path / "half")[POST].decision
    assert (decision.verdict, decision.test, decision.final) == ("undecided", "Wilcoxon signed-rank", False)
    assert decision.p_value == pytest.approx(0.25)
    half = _vit_cells(pre=[0.8, 0.82, 0.81] * 3, post=[None] * 9)
    _write_matrix(tmp_path, "half_nine", half, baseline_variant=PRE, axes=axes, seeds=ROUNDS)
    decision = _questions(tmp_path / "half_nine")[POST].decision
    assert (decision.verdict, decision.test, decision.n) == ("worse", "Wilcoxon signed-rank", (9,))
    assert decision.p_value == pytest.approx(2 / 2**9)


def test_an_incomplete_first_look_is_decided_on_its_own_seeds_paired_where_both_sides_have_them(tmp_path):
    """The baseline's seed 1 is missing (a failed cell, or a round still running) while it has seeds 3-8 for
    another question: the question used to be decided on every seed, 3 against 8 unpaired (seeds past the
    look, and an answer that depends on the other question); now on the first look's seeds both sides
    have, seeds 0 and 2, paired."""
    axes = {"task": ["lm"], "model.norm_placement": ["pre", "post"]}
    pre = {"task": "lm", "task_name": "lm", "variant": PRE, "values": [7.0, 6.98, 7.02, 6.97, 7.03, 7.01, 6.99, 7.04]}
    pre["seeds"] = [0, 2, 3, 4, 5, 6, 7, 8]
    post = {"task": "lm", "task_name": "lm", "variant": POST, "values": [7.5, 7.1, 7.62]}
    _write_matrix(tmp_path, "gap", [pre, post], baseline_variant=PRE, axes=axes, seeds=ROUNDS)
    decision = _questions(tmp_path / "gap")[POST].decision
    assert decision.test == "paired t" and decision.n == (2,)
    assert decision.difference == pytest.approx(((7.5 - 7.0) + (7.62 - 6.98)) / 2)


def test_the_counts_beside_a_verdict_are_those_of_the_seeds_it_was_decided_on(tmp_path):
    """Sandwich is decided worse on its first 3 pairs; it also has seeds 3-8 (trained by another matrix),
    one of which did not learn. The index cell read "1/9 did not learn" beside a 3-pair verdict that
    seed never entered; the counts are now the look's."""
    axes = {"task": ["lm"], "model.norm_placement": ["pre", "sandwich"]}
    sandwich = [*ROUND_SANDWICH, 7.6, 7.7, 7.65, 40.0, 7.6, 7.7]  # seed 6 worse than the unigram's 30
    cells = _lm_cells(pre=ROUND_PRE, sandwich=sandwich)
    _write_matrix(tmp_path, "m", cells, baseline_variant=PRE, axes=axes, seeds=ROUNDS)
    [task] = analyze(tmp_path / "m")[2]
    [found] = comparisons(task)
    assert found.verdict == "worse" and found.decision.n == (3,)
    assert (found.variant_side.seeds, found.variant_side.did_not_learn) == (3, 0)
    assert found.variant_side.issues_text() == ""


def test_the_step_time_multiple_is_a_ratio_of_medians_with_its_interval_and_a_tie_says_so(tmp_path):
    """Cells copied from a matrix that ran beside other work can be timed at twice their step time (a
    shared 2-core machine). The multiple was the ratio of the two sides' mean step times, so three such
    baseline cells of nine read as the variant running at ×0.74 (the ViT rows of norm_type and ffn_type);
    the ratio of medians is ×0.96, and its bootstrap interval holds 1: a tie."""
    variant = [131.1, 130.7, 130.4, 136.3, 133.2, 134.8, 130.9, 132.0, 131.5]
    baseline = [128.2, 128.8, 130.4, 141.2, 136.6, 131.9, 266.1, 266.9, 274.6]  # the last three under load
    values = [0.80, 0.81, 0.79, 0.80, 0.82, 0.78, 0.80, 0.81, 0.79]
    cells = [
        {"task": "vit", "task_name": "vit", "variant": PRE, "values": values, "step_time_ms": baseline},
        {"task": "vit", "task_name": "vit", "variant": POST, "values": values, "step_time_ms": variant},
        {
            "task": "lm",
            "task_name": "lm",
            "variant": PRE,
            "values": [7.0, 7.1, 7.2],
            "step_time_ms": [100.0, 101.0, 99.0],
        },
        {
            "task": "lm",
            "task_name": "lm",
            "variant": POST,
            "values": [7.0, 7.1, 7.2],
            "step_time_ms": [200.0, 205.0, 210.0],
        },
    ]
    _write_matrix(tmp_path, "timed", cells)
    lines = write_report(tmp_path / "timed").splitlines()
    vit = next(x for x in lines if x.startswith("- vit (ViT)"))
    ratio = ratio_of_medians(variant, baseline)
    assert ratio.value == pytest.approx(np.median(variant) / np.median(baseline))  # 131.5 / 136.6
    assert statistics.fmean(variant) / statistics.fmean(baseline) < 0.75  # what the mean said
    assert (
        ratio.tie
        and f"step time ×{ratio.value:.2f} [{ratio.interval[0]:.2f}, {ratio.interval[1]:.2f}] over 9 vs 9 finished "
        "seeds, a tie, load not recorded"
        in vit
    )
    # the speed table too: the median step time (136.6 ms), not the mean (178.3 ms)
    speed_rows = [x for x in lines if x.startswith(f"| {PRE} |") and "136.6" in x]
    assert speed_rows and not any("178.3" in x for x in lines)
    lm = next(x for x in lines if x.startswith("- lm (LM)"))
    twice = ratio_of_medians([200.0, 205.0, 210.0], [100.0, 101.0, 99.0])
    assert twice.value == pytest.approx(205.0 / 100.0) and twice.interval[0] > 1.9 and not twice.tie
    assert f"step time ×2.05 [{twice.interval[0]:.2f}, {twice.interval[1]:.2f}]" in lm and "a tie" not in lm


def test_the_ratio_of_medians_interval_is_scipys_bootstrap_and_needs_two_values_a_side():
    a, b = [3.0, 4.0, 5.0, 9.0], [2.0, 2.5, 3.0]
    ratio = ratio_of_medians(a, b)
    reference = scipy_stats.bootstrap(
        (np.array(a), np.array(b)),
        lambda x, y, axis: np.median(x, axis=axis) / np.median(y, axis=axis),
        vectorized=True,
        paired=False,
        n_resamples=1999,
        method="percentile",
        random_state=0,
    ).confidence_interval
    assert ratio.value == 4.5 / 2.5 and ratio.interval == pytest.approx((reference.low, reference.high))
    assert ratio_of_medians([2.0], [0.5, 1.5]) == Ratio(2.0, None)  # one seed: no interval
    assert ratio_of_medians([2.0, 2.0], [1.0, 1.0]) == Ratio(2.0, None)  # no spread
    assert ratio_of_medians([], [1.0]) is None and ratio_of_medians([1.0], [0.0]) is None
    assert ratio_of_medians([2.0, float("nan"), 2.2], [1.0, 1.0]) == ratio_of_medians([2.0, 2.2], [1.0, 1.0])
