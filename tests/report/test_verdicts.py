"""The cross-family verdicts (``blockbench.report.verdicts``): the lines at the top of each summary and the
index of a results root (``results/README.md``), from hand-written matrix folders whose differences,
intervals, Holm-adjusted tests, diverged shares and step times are computed here by hand (scipy).
No training: every cell is a result.json written below."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace

import pytest
import yaml
from scipy import stats as scipy_stats

from blockbench.cli import main
from blockbench.layout import write_json
from blockbench.matrix.run import finish_matrix
from blockbench.report.index import write_index
from blockbench.report.results import load_groups
from blockbench.report.stats import Difference
from blockbench.report.summary import write_report
from blockbench.report.verdicts import FAMILIES, Comparison, MatrixVerdicts, Side, index_rows, transfer
from blockbench.tasks import TASK_CONFIGS
from blockbench.walltime import WallClock

PRE, POST = "norm_placement=pre", "norm_placement=post"
#: every metric but the headline one is the same in every cell: its paired differences are all zero, so
#: it has no test and stays out of the Holm family (which then holds the headline metrics alone)
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


def _result(task_name: str, seed: int, value: float | None, step_time_ms: float | None) -> dict:
    """A finished cell (``value`` of the headline metric), or a diverged one (``value`` None)."""
    if value is None:
        return {
            "status": "diverged",
            "task": task_name,
            "seed": seed,
            "config_hash": "abc",
            "diverged_at_step": 20,
            "last_finite_loss": 7.5,
            "history": [],
        }
    result = {
        "status": "ok",
        "task": task_name,
        "seed": seed,
        "config_hash": "abc",
        "metrics": {HEADLINE[task_name]: value, **CONSTANT[task_name]},
        "primary_metric": HEADLINE[task_name],
        "baselines": TRIVIAL[task_name],
        "steps": 30,
        "wall_time_s": 4.0,
        "parameters": 1000,
        "throughput": 100.0,
        "throughput_unit": "tokens/s",
        "machine": "test",
    }
    if step_time_ms is not None:
        result["performance"] = {"step_time_ms": {"median": step_time_ms, "mean": step_time_ms + 1}}
    return result


def _write_matrix(root, name: str, cells: list[dict], baseline_variant: str | None = None) -> None:
    """``cells``: dicts of task (the row label), task_name, variant, axes, values (headline metric per
    seed, None = diverged) and step_time_ms; each cell gets cell.json, config.yaml (model.family) and result.json."""
    matrix_dir = root / name
    index = 0
    for cell in cells:
        for seed, value in enumerate(cell["values"]):
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
            write_json(cell_dir / "result.json", _result(cell["task_name"], seed, value, cell.get("step_time_ms")))
            index += 1
    matrix = {"name": name, "axes": {"task": sorted({c["task"] for c in cells})}}
    if baseline_variant:
        matrix["baseline_variant"] = baseline_variant
    (matrix_dir / "matrix.yaml").write_text(yaml.safe_dump(matrix))


def _paired(variant: list[float], baseline: list[float]) -> tuple[float, float, float, float]:
    """The summary's paired t: mean difference, 95% interval and p-value, by hand."""
    differences = [v - b for v, b in zip(variant, baseline, strict=True)]
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    half = scipy_stats.t.ppf(0.975, len(differences) - 1) * sd / math.sqrt(len(differences))
    p = scipy_stats.ttest_rel(variant, baseline).pvalue
    assert p == pytest.approx(
        2 * scipy_stats.t.sf(abs(mean) / (sd / math.sqrt(len(differences))), len(differences) - 1)
    )
    return mean, mean - half, mean + half, p


def _holm(p_values: list[float]) -> list[float]:
    """Holm's adjusted p-values, by hand, in the order given."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _p(p_holm: float) -> str:
    """The verdict's ``(Holm p 0.0021)``, from a hand-adjusted p-value."""
    return f"(Holm p {'< 0.001' if p_holm < 0.001 else f'{p_holm:.2g}'})"


def _interval_text(values: tuple[float, float, float, float], digits: int) -> str:
    mean, low, high, _ = values
    return f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


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
    _write_matrix(root, "budget", budget_cells)

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
        == "| [norms](norms/summary.md) | not recorded | test | 1.3 min of cell processes (19 cells) |"
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
        "changes (2 cells) | test | `blockbench matrix timed.yaml --jobs 2`, 1.1 min, 12 cells trained; "
        "0.4 min of cell processes (6 cells) |"
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
    p = {task: _paired(post, pre)[3] for task, (pre, post, _) in NORMS.items()}
    holm = _holm(list(p.values()))
    assert max(holm) < 0.05  # every difference is significant after Holm over the 3
    lm, translation, vit = (_paired(post, pre) for pre, post, _ in NORMS.values())
    assert _row(index, "norms", POST) == [
        "[norms](norms/summary.md)",
        POST,
        PRE,
        # lower perplexity is better
        f"**better** {_p(holm[0])}, perplexity ↓ {_interval_text(lm, 2)}; step time ×1.10",
        f"**better** {_p(holm[1])}, bleu ↑ {_interval_text(translation, 2)}; step time ×0.90",
        f"**better** {_p(holm[2])}, accuracy ↑ {_interval_text(vit, 3)}; step time ×1.00",
        "yes: better in all 3",
    ]


def test_index_row_of_a_mixed_verdict_with_diverged_seeds_and_no_step_times(index, root):
    images = _paired([25.0, 26.5, 27.2], [20.0, 21.0, 22.0])
    # a diverged seed counts with the worse of the trivial baseline and the task's worst finished seed
    translation = _paired([51.0, 50.0, 56.0], [50.0, 52.0, 0.93])
    vit = _paired([0.52, 0.58, 0.2], [0.50, 0.55, 0.60])
    holm = _holm([images[3], translation[3], vit[3]])
    assert holm[0] < 0.05 and holm[1] > 0.05 and holm[2] > 0.05
    # the LM column because the cells' resolved config says model.family: decoder_lm, whatever the task's label
    assert {g.task: g.family for g in load_groups(root / "mixed")} == {
        "images": "decoder_lm",
        "translation": "encoder_decoder",
        "vit": "vit",
    }
    assert _row(index, "mixed", POST) == [
        "[mixed](mixed/summary.md)",
        POST,
        PRE,  # the baseline the matrix file names, not the first variant
        # higher perplexity: worse
        f"**worse** {_p(holm[0])}, perplexity ↓ {_interval_text(images, 2)}; step time ×1.25",
        f"**n.s.** {_p(holm[1])}, bleu ↑ {_interval_text(translation, 2)}; baseline 1/3 diverged; step time ×1.00",
        f"**n.s.** {_p(holm[2])}, accuracy ↑ {_interval_text(vit, 3)}; 1/3 diverged; step time n/a",
        "no: worse in LM, n.s. in translator and ViT",
    ]


def test_a_verdict_that_flips_with_the_budget_is_given_per_budget_and_flagged(index, root):
    short, long = (_paired(swiglu, mlp) for mlp, swiglu in BUDGET.values())
    holm = _holm([short[3], long[3]])
    assert max(holm) < 0.05
    flag = "⚠ flips: worse at 300 steps, better at 1,500 steps"
    assert _row(index, "budget", "ffn=swiglu at 300 steps") == [
        "[budget](budget/summary.md)",
        "ffn=swiglu at 300 steps",
        "ffn=mlp",
        f"**worse** {_p(holm[0])}, perplexity ↓ {_interval_text(short, 2)}; step time ×1.00; {flag}",
        "–",
        "–",
        "only LM run",
    ]
    assert _row(index, "budget", "ffn=swiglu at 1,500 steps")[3] == (  # means below 10: three decimals
        f"**better** {_p(holm[1])}, perplexity ↓ {_interval_text(long, 3)}; step time ×1.00; {flag}"
    )
    # the MLP at 1500 steps is the baseline of its budget, not a variant compared with the MLP at 300
    assert "| ffn=mlp at" not in index


def test_the_summary_compares_each_budget_with_the_baseline_variant_at_that_budget(root):
    summary = write_report(root / "budget")
    assert "Difference from the baseline variant `ffn=mlp` at the same budget (`trainer.max_steps`)" in summary
    mean = _paired(BUDGET[1500][1], BUDGET[1500][0])[0]
    rows = (root / "budget" / "summary.csv").read_text().splitlines()
    swiglu_long = next(r for r in rows if r.startswith('lm,"ffn=swiglu,max_steps=1500",perplexity,'))
    assert ',"ffn=mlp,max_steps=1500",' in swiglu_long and f"{mean:.6f}"[:8] in swiglu_long
    assert "Holm over 2 comparisons" in summary  # the two budgets' comparisons, not the MLP's 1500 vs 300


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
    cells = _row(index, "norms", POST)
    lines = [line for line in verdicts.splitlines() if line.startswith("- ")]
    assert lines == [  # the same wording as the index
        f"- lm (LM), {POST} vs {PRE}: {cells[3]}",
        f"- translation (translator), {POST} vs {PRE}: {cells[4]}",
        f"- vit (ViT), {POST} vs {PRE}: {cells[5]}",
        f"- {POST} vs {PRE}, across the families: yes: better in all 3",
    ]
    budget = write_report(root / "budget")
    short = _interval_text(_paired(BUDGET[300][1], BUDGET[300][0]), 2)
    assert "- lm (LM), ffn=swiglu vs ffn=mlp at 300 steps: **worse** (Holm p " in budget
    assert f"), perplexity ↓ {short}; step time ×1.00; ⚠ flips" in budget
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


def test_a_finished_matrix_refreshes_the_index_of_its_results_root(root):
    (root / "README.md").unlink(missing_ok=True)
    assert finish_matrix(root / "norms", "norms", "blockbench matrix norms.yaml", WallClock(), 0, []) == 0
    readme = (root / "README.md").read_text()
    assert "Generated by `blockbench report --index" in readme and "yes: better in all 3" in readme
    assert "## Verdicts" in (root / "norms" / "summary.md").read_text()


def _comparison(family: str, p_value: float | None, significant: bool, difference: float = 1.0) -> Comparison:
    """A comparison in accuracy (higher is better), as the summary would hand it over."""
    return Comparison(
        task=family,
        family=family,
        variant=POST,
        baseline=PRE,
        budget=None,
        metric=TASK_CONFIGS["vit"].metrics[0],
        difference=Difference(difference, None, None, p_value),
        difference_text="+1.000",
        significant=significant,
        direction="better" if difference > 0 else "worse",
        variant_side=Side(3, 0, None),
        baseline_side=Side(3, 0, None),
    )


def test_transfer_names_the_families_that_ran_and_those_without_a_verdict():
    better, worse, ns = (
        _comparison("vit", 0.001, True),
        _comparison("vit", 0.001, True, -1.0),
        _comparison("vit", 0.3, False),
    )
    lm = lambda c: replace(c, task="lm", family="decoder_lm")  # noqa: E731
    translator = lambda c: replace(c, task="translation", family="encoder_decoder")  # noqa: E731
    assert transfer([lm(better), better]) == "yes: better in LM and ViT (translator not run)"
    assert transfer([lm(worse), translator(worse), worse]) == "yes: worse in all 3"
    assert transfer([lm(better), translator(ns), worse]) == "no: better in LM, worse in ViT, n.s. in translator"
    assert transfer([worse]) == "only ViT run"
    untested = _comparison("vit", None, False)  # one seed: no test
    assert untested.verdict == "untested"
    assert transfer([lm(better), untested]) == "undecided: better in LM, untested in ViT (translator not run)"
    # two LM tasks that disagree: the family is mixed, so the verdict does not transfer
    assert transfer([lm(better), replace(lm(ns), task="wikitext"), better]) == (
        "no: better in ViT, mixed in LM (translator not run)"
    )


def test_transfer_names_the_n_s_families_whose_unadjusted_interval_leaves_out_zero():
    """attention_score's additive attention: n.s. everywhere after Holm, but the translator's interval
    lies below zero and (here) the ViT's above it, so "yes: n.s. in all 3" would hide two opposite leanings."""
    ns = _comparison("vit", 0.3, False)
    lm = replace(ns, task="lm", family="decoder_lm")  # interval holds zero
    translator_worse = replace(
        ns,
        task="translation",
        family="encoder_decoder",
        direction="worse",
        difference=Difference(-42.7, -62.0, -23.5, 0.007),
    )
    vit_better = replace(ns, difference=Difference(0.07, 0.01, 0.13, 0.05))
    vit_holds_zero = replace(ns, difference=Difference(0.07, -0.04, 0.18, 0.1))
    assert transfer([lm, translator_worse, vit_holds_zero]) == "yes: n.s. in all 3 (unadjusted: worse in translator)"
    assert transfer([lm, translator_worse, vit_better]) == (
        "unclear: n.s. in all 3 (unadjusted: better in ViT, worse in translator)"
    )
    assert transfer([lm, vit_better]) == "yes: n.s. in LM and ViT (translator not run; unadjusted: better in ViT)"
    lm_worse = replace(translator_worse, task="lm", family="decoder_lm")
    assert transfer([vit_better, lm_worse, translator_worse]) == (  # in the families' order, whatever the tasks'
        "unclear: n.s. in all 3 (unadjusted: better in ViT, worse in LM and translator)"
    )
    wikitext_better = replace(vit_better, task="wikitext", family="decoder_lm")  # a family with two tasks: each named
    assert transfer([lm_worse, wikitext_better, vit_holds_zero]) == (
        "unclear: n.s. in LM and ViT (translator not run; unadjusted: better in LM (wikitext), worse in LM (lm))"
    )
    untested = _comparison("vit", None, False)
    assert (
        transfer([lm_worse, untested])
        == "undecided: n.s. in LM, untested in ViT (translator not run; unadjusted: worse in LM)"
    )
    significant = replace(vit_better, significant=True)  # a decided verdict is not a leaning
    assert transfer([lm, translator_worse, significant]) == (
        "no: better in ViT, n.s. in LM and translator (unadjusted: worse in translator)"
    )
    assert transfer([lm, ns]) == "yes: n.s. in LM and ViT (translator not run)"  # no interval: nothing named


def test_a_family_with_several_tasks_has_a_line_per_task_in_its_cell():
    lm = replace(_comparison("decoder_lm", 0.001, True), task="lm")
    wikitext = replace(_comparison("decoder_lm", 0.3, False), task="wikitext")
    [row] = index_rows(MatrixVerdicts("real", [lm, wikitext, _comparison("vit", 0.001, True)]), list(FAMILIES))
    assert row[3] == f"lm: {lm.describe()}<br>wikitext: {wikitext.describe()}"
    assert row[4] == "–" and row[5] == _comparison("vit", 0.001, True).describe()
    assert row[6] == "no: better in ViT, mixed in LM (translator not run)"


def test_a_demonstration_matrix_gives_no_verdicts_and_is_not_listed_as_not_run(tmp_path):
    """``verdicts: false`` (the smoke matrix): its results are named as a demonstration, never as verdicts,
    and its file is not a matrix 'not run yet'."""
    root = tmp_path / "results"
    cells = [
        {"task": "lm", "task_name": "lm", "variant": variant, "values": values, "step_time_ms": 10.0}
        for variant, values in ((PRE, [7.0, 7.1, 7.2]), (POST, [30.0, 31.0, 30.5]))
    ]
    _write_matrix(root, "smoke", cells)
    matrix_file = root / "smoke" / "matrix.yaml"
    matrix_file.write_text(yaml.safe_dump({**yaml.safe_load(matrix_file.read_text()), "verdicts": False}))
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "smoke.yaml").write_text(yaml.safe_dump({"name": "smoke", "axes": {"task": ["lm"]}, "verdicts": False}))
    (configs / "demo.yaml").write_text(yaml.safe_dump({"name": "demo", "axes": {"task": ["lm"]}, "verdicts": False}))
    index = write_index(root, configs)
    assert "Demonstrations, not verdicts (`verdicts: false` in their matrix file): [smoke](smoke/summary.md)." in index
    assert "| [smoke](" not in index
    assert "Not run yet" not in index and "demo.yaml" not in index
    summary = write_report(root / "smoke")
    assert (
        summary.index("## Verdicts") < summary.index("**A demonstration, not an answer**") < summary.index("- lm (LM)")
    )
    _write_matrix(root, "flagship", cells)  # the same cells in a matrix that gives verdicts
    flagship = write_report(root / "flagship")
    assert "## Verdicts" in flagship and "A demonstration" not in flagship


def test_a_tuned_matrix_says_which_value_each_side_trained_at(tmp_path):
    """Each variant at its own best learning rate: the verdict names both sides' tuned values (tune.json)."""
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
            "tune_seed": 1000,
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
    write_report(tmp_path / "tuned")
    index = write_index(tmp_path, tmp_path / "no_configs")
    # post-norm's choice is the lowest rate of the grid: its best may lie below, and the verdict says so
    assert _row(index, "tuned", POST)[3].endswith("; step time ×1.00; tuned lr=0.0003 (lowest lr tried) vs lr=0.001")
    summary = (tmp_path / "tuned" / "summary.md").read_text()
    assert f"- lm (LM), {POST} vs {PRE}: **worse**" in summary
    assert "tuned lr=0.0003 (lowest lr tried) vs lr=0.001" in summary


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


def test_a_task_both_sides_solve_in_every_seed_says_it_cannot_tell_them_apart(tmp_path):
    """BLEU 100 in every seed of both sides (dense_vs_moe's translator at 1,500 steps): the verdict says the
    task is solved at this budget, rather than only 'untested, +0.0'; one seed below 100 is no such claim."""
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
    assert "**untested**" in long
    assert "both at the best possible bleu (100) in every seed: the task is solved at this budget" in long
    assert "best possible" not in short
    _write_matrix(
        tmp_path,
        "almost",
        [{**c, "values": [100.0, 100.0, 99.9]} if c["variant"] == "n_experts=4,max_steps=1500" else c for c in cells],
        baseline_variant="n_experts=0",
    )
    assert "the task is solved at this budget" not in write_report(tmp_path / "almost")
