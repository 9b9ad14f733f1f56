"""The analysis plan: what decides a matrix's verdicts, recorded before its cells train, and flagged
where it changed after them."""

from __future__ import annotations

import json

import yaml
from helpers import TINY_LM, ok_result, write_matrix

from blockbench.cli import main
from blockbench.matrix.expand import expand_matrix
from blockbench.matrix.preregister import analysis_plan
from blockbench.prereg import ALPHA, FUTILITY, RULE_VERSION, AnalysisPlan, PlanBook, TaskPlan
from blockbench.report.summary import write_report
from blockbench.store.layout import PLAN_FILE, write_json

BASE = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "num_threads": 1}}


def _matrix(tmp_path, **keys):
    seeds = {} if "seeds" in keys else {"seed": [0, 1]}
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"], **seeds}, base=BASE)
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "tune": {}, **keys}, sort_keys=False))
    return path


def test_the_plan_names_everything_that_decides_and_its_hash_moves_with_each(tmp_path):
    plan = analysis_plan(expand_matrix(_matrix(tmp_path)))
    assert (plan.rule, plan.alpha, plan.futility, plan.looks) == (RULE_VERSION, ALPHA, None, [2])
    assert plan.baseline_variant == "norm_placement=pre"  # the first variant: the report's default
    lm = plan.tasks["lm"]
    assert (lm.metric, lm.higher_is_better, lm.margin, lm.margin_relative) == ("perplexity", False, 0.01, True)
    # a margin given in the matrix file, looks in rounds, a tuning grid: each changes the hash, and is named
    margin = analysis_plan(expand_matrix(_matrix(tmp_path / "b", margins={"lm": {"perplexity": 0.5}})))
    assert (margin.tasks["lm"].margin, margin.tasks["lm"].margin_relative) == (0.5, False)
    assert margin.digest() != plan.digest() and plan.changes(margin) == ["margin of lm", "margin_relative of lm"]
    rounds = analysis_plan(expand_matrix(_matrix(tmp_path / "c", seeds={"min": 2, "max": 4, "step": 2})))
    assert (rounds.looks, rounds.futility) == ([2, 4], FUTILITY) and plan.changes(rounds) == ["futility", "looks"]
    assert plan.digest() == analysis_plan(expand_matrix(_matrix(tmp_path))).digest()  # the same file, the same hash


def test_each_cell_records_the_plan_it_started_under_and_the_summary_flags_a_changed_one(tmp_path, capsys):
    path = _matrix(tmp_path)
    results = tmp_path / "results"
    assert main(["--results-dir", str(results), "matrix", str(path)]) == 0
    capsys.readouterr()
    matrix_dir = results / "m"
    book = PlanBook.load(matrix_dir)
    assert book.current == analysis_plan(expand_matrix(path)).digest() and list(book.plans) == [book.current]
    cells = sorted((matrix_dir / "cells").rglob("cell.json"))
    assert len(cells) == 4 and {json.loads(c.read_text())["plan"] for c in cells} == {book.current}
    summary = (matrix_dir / "summary.md").read_text()
    assert f"Analysis plan: `{book.current}`" in summary
    assert "Every reported cell of every verdict started under this plan" in summary

    # the margin changes after the cells trained: they are reused (their configs are the same), and the
    # verdict says it rests on cells of another plan, naming what changed
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "margins": {"lm": {"perplexity": 0.5}}}))
    assert main(["--results-dir", str(results), "matrix", str(path)]) == 0
    assert ": training" not in capsys.readouterr().out
    after = PlanBook.load(matrix_dir)
    assert after.current != book.current and set(after.plans) == {book.current, after.current}
    summary = (matrix_dir / "summary.md").read_text()
    flag = f"- lm norm_placement=post: 4 cell(s) under plan `{book.current}` (changed since: margin of lm, "
    assert flag + "margin_relative of lm)" in summary, summary


def test_cells_without_a_recorded_plan_are_said_to_have_none(tmp_path):
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump({"name": "m"}))
    summary = write_report(tmp_path)
    assert "No analysis plan is recorded for this matrix" in summary
    assert not (tmp_path / PLAN_FILE).exists()


def test_a_verdict_with_some_cells_under_an_earlier_plan_is_flagged_and_one_under_the_current_is_not(tmp_path):
    """vit: both variants' seeds 0-2 started under the current plan; translation: the baseline's seed 2
    started under an earlier one whose margin was 2 BLEU (the rest under the current one)."""
    task = {"vit": TaskPlan(metric="accuracy", higher_is_better=True, margin=0.01)}
    task["translation"] = TaskPlan(metric="bleu", higher_is_better=True, margin=1.0)
    current = AnalysisPlan(rule=RULE_VERSION, alpha=ALPHA, futility=None, looks=[3], baseline_variant="a", tasks=task)
    earlier_tasks = {**task, "translation": TaskPlan(metric="bleu", higher_is_better=True, margin=2.0)}
    earlier = current.model_copy(update={"tasks": earlier_tasks})
    book = PlanBook()
    old, new = book.record(tmp_path, earlier), book.record(tmp_path, current)
    values = {"vit": ("accuracy", 0.5, {"accuracy": 0.1}), "translation": ("bleu", 30.0, {"bleu": 1.0})}
    index = 0
    for name, (metric, value, baselines) in values.items():
        for variant in ("a", "b"):
            for seed in range(3):
                plan = old if (name, variant, seed) == ("translation", "a", 2) else new
                folder = tmp_path / "cells" / name / variant / f"seed{seed}"
                cell = {"index": index, "task": name, "task_name": name, "variant": variant, "seed": seed}
                write_json(folder / "cell.json", {**cell, "axes": {}, "plan": plan})
                metrics = {metric: value + seed + (variant == "b"), "loss": 1.0}
                write_json(folder / "result.json", ok_result(name, seed, metrics, baselines))
                index += 1
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump({"name": "m", "baseline_variant": "a"}))
    summary = write_report(tmp_path)
    assert f"Analysis plan: `{new}`" in summary
    assert f"- translation b: 1 cell(s) under plan `{old}` (changed since: margin of translation)" in summary
    assert "- vit b" not in summary
