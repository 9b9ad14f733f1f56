"""``tune:`` in a matrix: each variant's candidates train on a tuning seed first, the best on the
task's headline metric (in its direction) is chosen and recorded in tune.json, and the reported
seeds train at it; tuning cells are ordinary cells, cached, outside the reported statistics."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
import yaml
from helpers import TINY_LM, blockbench_here, write_matrix

from blockbench.cli import main
from blockbench.config import ConfigError
from blockbench.matrix.expand import expand_matrix
from blockbench.matrix.plan import plan_reported
from blockbench.matrix.schedule import Results, first_round, tuning_outcomes
from blockbench.matrix.tuning import EXTENSION_STEPS, Candidate, Tuning, extension, trial, tuning_record
from blockbench.provenance import code_fingerprint
from blockbench.report.tuning import chosen_text, grid_edges, tuning_section
from blockbench.store.layout import RESULT_FILE, write_json
from blockbench.store.record import CellRecord, write_tuning
from blockbench.store.reuse import ReuseRule

#: the tiny LM cell, one thread: tuning end to end costs a process per candidate
BASE = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "num_threads": 1}}


def tuned_matrix(folder: Path, axes: dict, **tune) -> Path:
    """``write_matrix`` plus the matrix keys of ``tune`` (``tune``, ``tune_seed``)."""
    path = write_matrix(folder, axes, base=BASE)
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **tune}, sort_keys=False))
    return path


def record(**fields) -> CellRecord:
    """A tuning cell's result record with ``fields``."""
    return CellRecord(task="lm", **fields)


def ok(value: float, metric: str = "perplexity") -> CellRecord:
    return record(status="ok", metrics={metric: value, "loss": 1.0})


def scored(results: list[CellRecord | None], metric: str = "perplexity", seed: int = 1000) -> list:
    """One candidate per result, lr=i, with a single trial at ``seed``."""
    return [
        Candidate({"optimizer.lr": i}, f"lr={i}", (trial(seed, f"tune/lm/v/lr={i}/seed{seed}", result, metric),))
        for i, result in enumerate(results)
    ]


def halving(scores: dict[int, list[CellRecord | None]], higher_is_better: bool = False) -> Tuning:
    """A Tuning over seeds 1000, 1001 whose candidate i has ``scores[seed][i]`` (None: not run)."""
    n = len(scores[1000])
    candidates = tuple(
        Candidate(
            {"optimizer.lr": i},
            f"lr={i}",
            tuple(
                trial(seed, f"tune/lm/v/lr={i}/seed{seed}", results[i], "perplexity")
                for seed, results in scores.items()
            ),
        )
        for i in range(n)
    )
    return Tuning("lm", "v", "perplexity", higher_is_better, candidates, (1000, 1001))


# --- the choice: successive halving -------------------------------------------------------------------


def test_successive_halving_trains_the_better_half_again_and_chooses_the_best_mean():
    """Three candidates: all train at seed 1000; the better two (perplexity 9 and 10) again at 1001; the
    choice is the best mean over both seeds (lr=0: (10 + 8) / 2 = 9 beats lr=1: (9 + 11) / 2 = 10), not
    the best first-seed score (lr=1)."""
    start = halving({1000: [None, None, None], 1001: [None, None, None]})
    assert [(c.label, seed) for c, seed in start.pending()] == [("lr=0", 1000), ("lr=1", 1000), ("lr=2", 1000)]
    assert start.chosen is None and not start.complete
    rung0 = halving({1000: [ok(10.0), ok(9.0), ok(12.0)], 1001: [None, None, None]})
    assert [(c.label, seed) for c, seed in rung0.pending()] == [("lr=1", 1001), ("lr=0", 1001)]
    done = halving({1000: [ok(10.0), ok(9.0), ok(12.0)], 1001: [ok(8.0), ok(11.0), None]})
    assert done.complete and done.pending() == []
    assert done.chosen.label == "lr=0"
    assert "lr=0 (perplexity 9 over 2 seeds" in done.describe()
    record = done.record()
    assert [(c["label"], c["rung"], c["score"]) for c in record["candidates"]] == [
        ("lr=0", 1, 9.0),
        ("lr=1", 1, 10.0),
        ("lr=2", 0, 12.0),
    ]
    # higher is better (accuracy): the halving keeps the highest
    acc = halving({1000: [ok(0.5), ok(0.9), ok(0.7)], 1001: [None, None, None]}, higher_is_better=True)
    assert [c.label for c, _ in acc.pending()] == ["lr=1", "lr=2"]


def test_the_choice_is_the_best_mean_over_the_last_rung_not_the_best_last_seed():
    """The choice ranks the last rung's candidates by their mean over its seeds: here lr=0 has the better
    mean but the worse second seed, so a choice by the last tuning seed alone would take lr=1. Perplexity
    (lower is better): (6 + 10) / 2 = 8 against (9 + 9.5) / 2 = 9.25; accuracy (higher is better):
    (0.9 + 0.6) / 2 = 0.75 against (0.7 + 0.65) / 2 = 0.675."""
    for higher_is_better, first, second in (
        (False, [6.0, 9.0, 12.0], [10.0, 9.5]),
        (True, [0.9, 0.7, 0.5], [0.6, 0.65]),
    ):
        done = halving({1000: [ok(v) for v in first], 1001: [ok(v) for v in second] + [None]}, higher_is_better)
        assert done.complete and [c.label for c in done.rungs()[-1]] == ["lr=0", "lr=1"]
        means = {f"lr={i}": statistics.fmean([first[i], second[i]]) for i in range(2)}
        best_mean = (max if higher_is_better else min)(means, key=means.get)
        best_last = (max if higher_is_better else min)(means, key=lambda label: second[int(label[3:])])
        assert (best_mean, best_last) == ("lr=0", "lr=1")  # the two rankings disagree
        assert done.chosen.label == best_mean
        assert done.record()["chosen_label"] == best_mean
        assert [c["score"] for c in done.record()["candidates"][:2]] == pytest.approx(list(means.values()))
        assert f"lr=0 (perplexity {means['lr=0']:.4g} over 2 seeds" in done.describe()


def test_a_diverged_failed_or_unscored_candidate_never_survives_a_rung():
    diverged = record(status="diverged", diverged_at_step=3, metrics={"perplexity": 1.0})  # a stray score is ignored
    failed = record(status="failed", error="RuntimeError: boom")
    only = halving({1000: [diverged, failed, ok(float("nan")), ok(50.0)], 1001: [None, None, None, None]})
    # one candidate finished: the better half of one is itself, trained again at the second seed
    assert [(c.label, seed) for c, seed in only.pending()] == [("lr=3", 1001)]
    nothing = halving({1000: [diverged, failed, ok(float("nan"))], 1001: [None, None, None]})
    assert nothing.complete and nothing.chosen is None and nothing.pending() == []
    # the message the reported cells fail with names every tuning cell and how it ended
    assert "tune/lm/v/lr=0/seed1000 diverged at step 3" in nothing.failure()
    assert "tune/lm/v/lr=1/seed1000 failed (RuntimeError: boom)" in nothing.failure()
    assert "tune/lm/v/lr=2/seed1000 has no finite perplexity (nan)" in nothing.failure()
    # a survivor that diverges on the second seed loses to one that finished both
    second = halving({1000: [ok(9.0), ok(10.0), ok(30.0)], 1001: [diverged, ok(10.5), None]})
    assert second.chosen.label == "lr=1"


def test_the_tuning_section_shows_every_score_the_choice_and_the_tuned_value(tmp_path):
    lm = [
        Tuning(
            "lm",
            "norm_placement=pre",
            "perplexity",
            False,
            tuple(scored([ok(8.123456), ok(7.5), record(status="diverged", diverged_at_step=2)])),
            (1000,),
        ),
        Tuning(
            "lm",
            "norm_placement=post",
            "perplexity",
            False,
            tuple(scored([record(status="failed", error="x"), record(status="diverged"), record(status="diverged")])),
            (1000,),
        ),
    ]
    vit = [
        Tuning(
            "vit",
            "norm_placement=pre",
            "accuracy",
            True,
            tuple(scored([ok(0.5, "accuracy"), ok(0.25, "accuracy"), ok(0.5, "accuracy")], "accuracy")),
            (1000,),
        )
    ]
    write_tuning(tmp_path, tuning_record({"optimizer.lr": [0.0003, 0.001, 0.003]}, [1000], lm + vit))
    text = "\n".join(tuning_section(tmp_path))
    assert text.startswith("## Tuning") and "`optimizer.lr`" in text and "tuning seed 1000" in text
    assert "tuning split (`task.eval_split: tuning`)" in text
    assert "**lm**: perplexity ↓ on the tuning split" in text and "**vit**: accuracy ↑ on the tuning split" in text
    assert "| variant | lr=0 | lr=1 | lr=2 | tuned value |" in text
    assert "| norm_placement=pre | 8.123 | **7.5** | diverged | lr=1 |" in text
    assert "| norm_placement=post | failed | diverged | diverged | none: no candidate finished" in text
    assert (
        "| norm_placement=pre | **0.5** | 0.25 | 0.5 | lr=0 (lowest lr tried) |" in text
    )  # higher is better; a tie: the first
    assert "*lowest* or *highest tried* is an end of the values tried (the tuner went up to 2 values" in text
    assert tuning_section(tmp_path / "no_tuning") == []


def test_a_choice_at_an_end_of_the_grid_is_marked_per_key():
    """A sweep whose best point is its lowest or highest value may have its best beyond it: say so."""

    def tuned(chosen: dict, grid: list[dict]) -> dict:
        return {
            "chosen": chosen,
            "chosen_label": " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in chosen.items()),
            "candidates": [{"values": values} for values in grid],
        }

    lrs = [{"optimizer.lr": lr} for lr in (3e-4, 1e-3, 3e-3)]
    assert chosen_text(tuned({"optimizer.lr": 3e-4}, lrs)) == "lr=0.0003 (lowest lr tried)"
    assert chosen_text(tuned({"optimizer.lr": 3e-3}, lrs)) == "lr=0.003 (highest lr tried)"
    assert chosen_text(tuned({"optimizer.lr": 1e-3}, lrs)) == "lr=0.001"  # inside the grid: no mark
    # two keys: each is judged over its own values; one value only, or names, are no grid
    grid = [
        {"optimizer.lr": lr, "trainer.warmup_steps": w, "model.ffn": f}
        for lr in (1e-3, 3e-3)
        for w in (30, 60, 90)
        for f in ("mlp",)
    ]
    both = tuned({"optimizer.lr": 3e-3, "trainer.warmup_steps": 60, "model.ffn": "mlp"}, grid)
    assert grid_edges(both) == ["highest lr"]
    assert grid_edges(tuned({"optimizer.lr": 1e-3, "trainer.warmup_steps": 30, "model.ffn": "mlp"}, grid)) == [
        "lowest lr",
        "lowest warmup_steps",
    ]
    assert grid_edges({"chosen": None, "chosen_label": None, "candidates": []}) == [] and chosen_text(None) is None


# --- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "axes, tune, expected",
    [
        (
            {"model.norm_placement": ["pre", "post"]},
            {"tune": {"model.norm_placement": ["pre"]}},
            "tune: 'model.norm_placement' is also an axis",
        ),
        (
            {"optimizer.lr": [1.0e-3]},
            {"tune": {"optimizer": [{"lr": 1.0e-3}]}},
            "tune: 'optimizer' and the axis 'optimizer.lr' set the same value",
        ),
        (
            {"seed": [0, 1]},
            {"tune": {"optimizer.lr": [1.0e-3]}, "tune_seeds": [1, 1000]},
            "tune_seeds 1 also reported (0, 1)",
        ),
        (
            {"seed": [0]},
            {"tune": {"optimizer.lr": [1.0e-3]}, "tune_seeds": [1000]},
            "tune_seeds: List should have at least 2 items",
        ),
        (
            {"seed": [0]},
            {"tune": {"optimizer.lr": [1.0e-3, -1]}},
            "[tuning cell optimizer.lr=-1]: optimizer.lr: Input should be greater than 0",
        ),
        ({"seed": [0]}, {"tune": {"optimizer.lrr": [1.0e-3]}}, "optimizer.lrr: unknown key"),
        ({"seed": [0]}, {"tune": {"optimizer.lr": []}}, "tune: 'optimizer.lr' has no candidate values"),
        ({"seed": [0]}, {"tune": {"optimizer.lr": [1.0e-3, 1.0e-3]}}, "lists the candidate 0.001 more than once"),
        ({"seed": [0]}, {"tune": {"seed": [1, 2]}}, "'seed' cannot be tuned"),
        ({"seed": [0]}, {"tune_seeds": [7, 8]}, "tune_seeds is set but nothing is tuned"),
    ],
)
def test_tuning_mistakes_stop_the_matrix_before_anything_trains(tmp_path, capsys, axes, tune, expected):
    path = tuned_matrix(tmp_path, axes, **tune)
    results = tmp_path / "results"
    assert main(["--results-dir", str(results), "matrix", str(path)]) == 2
    assert expected in capsys.readouterr().err
    assert not results.exists()


def test_dry_run_lists_the_tuning_cells_and_the_reported_ones_after_tuning(tmp_path, capsys):
    path = tuned_matrix(
        tmp_path, {"model.norm_placement": ["pre"], "seed": [0, 1]}, tune={"optimizer.lr": [3.0e-4, 3.0e-3]}
    )
    assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "6 cells (4 tuning, 2 reported)" in out
    rows = dict(re.findall(r"^\[\d/6\] (\S+)\s+(to run|after tuning)\s+~", out, re.M))
    assert rows == {
        "tune/lm/norm_placement=pre/lr=0.0003/seed1000": "to run",
        "tune/lm/norm_placement=pre/lr=0.003/seed1000": "to run",
        "lm/norm_placement=pre/seed0": "after tuning",
        "lm/norm_placement=pre/seed1": "after tuning",
    }, out
    # the second rung trains only the better half: listed as cells that may train, with their time
    assert re.findall(r"^\[\d/6\] (\S+)\s+if needed", out, re.M) == [
        "tune/lm/norm_placement=pre/lr=0.0003/seed1001",
        "tune/lm/norm_placement=pre/lr=0.003/seed1001",
    ], out
    assert (
        "to train 4 cells (2 tuning, 2 after tuning)" in out and "for up to 2 more cells" in out
    )  # the estimate counts both phases
    assert not (tmp_path / "results").exists()


# --- end to end ------------------------------------------------------------------------------------


def _mtimes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob(RESULT_FILE)}


def test_a_tuned_matrix_trains_each_variant_at_its_best_value_and_reruns_nothing(tmp_path, capsys):
    """Two candidates of one variant: 10000 diverges (listed first: it must not win for being first),
    3e-3 finishes and, as the better half of the first rung, trains again at the second tuning seed. The
    choice is the lowest value of the grid, so the tuner adds the next one past it at the grid's ratio
    (3e-3 x 3e-3 / 1e4 = 9e-10), which loses: 3e-3 stays the choice, now inside the values tried. The
    reported seed trains at 3e-3, not at the base's 1e-3. Tuning cells validate on the tuning split. A
    rerun trains nothing; a tuning result that changes leaves the variant without a choice, and its seed
    fails untrained."""
    path = tuned_matrix(
        tmp_path, {"model.norm_placement": ["pre"], "seed": [0]}, tune={"optimizer.lr": [1.0e4, 3.0e-3]}
    )
    results = tmp_path / "results"
    first = blockbench_here(capsys, "--results-dir", str(results), "matrix", str(path))
    assert first.returncode == 0, first.stderr[-3000:]
    matrix_dir = results / "m"
    tune_dir = matrix_dir / "tune" / "cells" / "lm" / "norm_placement=pre"
    good = [json.loads((tune_dir / "lr=0.003" / f"seed{s}" / RESULT_FILE).read_text()) for s in (1000, 1001)]
    assert [g["status"] for g in good] == ["ok", "ok"] and [g["seed"] for g in good] == [1000, 1001]
    assert not (tune_dir / "lr=10000.0" / "seed1001").exists()  # halved away after the first rung
    config = yaml.safe_load((tune_dir / "lr=0.003" / "seed1000" / "config.yaml").read_text())
    assert config["task"]["eval_split"] == "tuning"
    assert json.loads((tune_dir / "lr=10000.0" / "seed1000" / RESULT_FILE).read_text())["status"] == "diverged"
    assert "phase 1 of 2, tuning" in first.stdout and "phase 2 of 2" in first.stdout
    # every progress line counts the 4 cells once: no [n/N] past N, the last one 4/4 trained
    numbers = [tuple(map(int, m)) for m in re.findall(r"^\[(\d+)/(\d+)\]", first.stdout, re.M)]
    assert numbers and all(n <= total for n, total in numbers), first.stdout
    assert re.findall(r"(\d+)/(\d+) trained", first.stdout)[-1] == ("5", "5"), first.stdout
    assert "tuning: 1 cell(s) of a value past an end of the grid that won" in first.stdout
    added = json.loads((tune_dir / "lr=9e-10" / "seed1000" / RESULT_FILE).read_text())
    assert not (tune_dir / "lr=9e-10" / "seed1001").exists()  # it lost the first rung
    mean = (good[0]["metrics"]["perplexity"] + good[1]["metrics"]["perplexity"]) / 2
    worse = added["metrics"]["perplexity"]
    assert worse > max(g["metrics"]["perplexity"] for g in good)
    tuned_line = f"tuned lm/norm_placement=pre: lr=0.003 (perplexity {mean:.4g} over 2 seeds; lr=10000.0 diverged, "
    assert tuned_line + f"lr=9e-10 {worse:.4g})" in first.stdout

    # tune.json: the metric, its direction, every candidate with its trials, the choice
    record = json.loads((matrix_dir / "tune.json").read_text())
    assert record["keys"] == ["optimizer.lr"] and record["tune_seeds"] == [1000, 1001]
    assert record["grid"] == {"optimizer.lr": [1.0e4, 3.0e-3]} and record["extension_steps"] == EXTENSION_STEPS
    lm = record["tasks"]["lm"]
    assert (lm["metric"], lm["higher_is_better"]) == ("perplexity", False)
    variant = lm["variants"]["norm_placement=pre"]
    assert variant["chosen"] == {"optimizer.lr": 0.003}
    assert [(c["label"], c["status"], c["score"], c["rung"], c["added"]) for c in variant["candidates"]] == [
        ("lr=10000.0", "diverged", None, 0, False),
        ("lr=0.003", "ok", pytest.approx(mean), 1, False),
        ("lr=9e-10", "ok", pytest.approx(worse), 0, True),
    ]

    # the reported seed trained at the chosen value, on the validation split, and says so
    reported = matrix_dir / "cells" / "lm" / "norm_placement=pre" / "seed0"
    config = yaml.safe_load((reported / "config.yaml").read_text())
    assert config["optimizer"]["lr"] == 0.003 and config["seed"] == 0 and config["task"]["eval_split"] == "validation"
    cell = json.loads((reported / "cell.json").read_text())
    assert (cell["phase"], cell["tuned"]) == ("report", {"optimizer.lr": 0.003})
    assert json.loads((reported / RESULT_FILE).read_text())["status"] == "ok"

    # matrix_run.json records both phases and the tuning's two rungs
    run = json.loads((matrix_dir / "matrix_run.json").read_text())
    assert {phase: (r["cells"], r["trained"], r["rounds"]) for phase, r in run["phases"].items()} == {
        "tune": (4, 4, 3),
        "report": (1, 1, 1),
    }
    assert [(c["key"], c["phase"]) for c in run["cells"]][-1] == ("lm/norm_placement=pre/seed0", "report")
    summary = (matrix_dir / "summary.md").read_text()
    assert f"| norm_placement=pre | {worse:.4g} | **{mean:.4g} (2 seeds)** | diverged | lr=0.003 |" in summary, summary
    assert "- lm norm_placement=pre: added lr=9e-10; the best is now inside the values tried" in summary

    # a rerun (here in this process: no interpreter start-up to wait for) reuses all four cells: nothing
    # trains, no result is rewritten
    before = _mtimes(matrix_dir)
    assert main(["--results-dir", str(results), "matrix", str(path), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "nothing to train: 5 reused" in dry and "tuned lm/norm_placement=pre: lr=0.003" in dry
    assert main(["--results-dir", str(results), "matrix", str(path)]) == 0
    again = capsys.readouterr().out
    assert ": training" not in again and again.count("done earlier, reusing its result") == 5
    assert json.loads((matrix_dir / "matrix_run.json").read_text())["cells_trained"] == 0
    assert _mtimes(matrix_dir) == before

    # the choice is part of the reported cell's config: another choice would retrain it, the same one reuses it
    expansion = expand_matrix(path)
    tunings = tuning_outcomes(expansion.tuning, Results(matrix_dir, ReuseRule(code_fingerprint())), (1000, 1001))
    [same] = plan_reported(
        expansion, first_round(expansion), tunings, matrix_dir, ReuseRule(code_fingerprint()), start=3
    )
    assert same.status == "done"
    changed = Candidate({"optimizer.lr": 1.0e-3}, "lr=0.001", (trial(1000, "c", ok(1.0), "perplexity"),))
    other = {key: Tuning(t.task, t.variant, t.metric, False, (changed,), (1000,)) for key, t in tunings.items()}
    [retrain] = plan_reported(
        expansion, first_round(expansion), other, matrix_dir, ReuseRule(code_fingerprint()), start=3
    )
    assert (retrain.status, retrain.trains, retrain.cell.run.optimizer.lr) == ("to run", True, 1.0e-3)

    # no candidate finished (the good ones' first records now say they diverged): the seed fails, untrained
    write_json(
        tune_dir / "lr=0.003" / "seed1000" / RESULT_FILE, {**good[0], "status": "diverged", "diverged_at_step": 3}
    )
    write_json(tune_dir / "lr=9e-10" / "seed1000" / RESULT_FILE, {**added, "status": "diverged", "diverged_at_step": 3})
    assert main(["--results-dir", str(results), "matrix", str(path)]) == 1
    assert ": training" not in capsys.readouterr().out
    error = json.loads((reported / RESULT_FILE).read_text())
    assert error["status"] == "failed" and "tune/lm/norm_placement=pre/lr=10000.0/seed1000 diverged" in error["error"]
    assert "tune/lm/norm_placement=pre/lr=0.003/seed1000 diverged at step 3" in error["error"]
    assert not (reported / "config.yaml").exists()
    assert "none: no candidate finished" in (matrix_dir / "summary.md").read_text()


def test_a_task_given_as_a_mapping_is_never_shared_between_cells(tmp_path):
    """A ``task:`` axis entry given as a mapping (``{name: lm, label: ..., ...}``) is copied into each
    cell's config: setting a tuning cell's ``task.eval_split: tuning`` must leave the matrix's axis
    and every reported cell validating on the validation split."""
    task = {**TINY_LM["task"], "label": "tiny"}
    path = tuned_matrix(
        tmp_path,
        {"task": [task], "model.norm_placement": ["pre", "post"], "seed": [0]},
        tune={"optimizer.lr": [1e-3, 3e-3]},
    )
    expansion = expand_matrix(path)
    assert {cell.run.task.eval_split for cell in expansion.tuning} == {"tuning"}
    assert [cell.run.task.eval_split for cell in expansion.cells] == ["validation", "validation"]
    chosen = [expansion.at_choice(cell, {"optimizer.lr": 3e-3}) for cell in expansion.cells]
    assert [cell.run.task.eval_split for cell in chosen] == ["validation", "validation"]
    assert "eval_split" not in expansion.matrix.axes["task"][0]


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        # perplexity at 3e-4, 1e-3, 3e-3 (lower is better): the lowest wins, the next value below is 9e-5
        ({3e-4: 5.0, 1e-3: 6.0, 3e-3: 7.0}, 9e-5),
        ({3e-4: 7.0, 1e-3: 6.0, 3e-3: 5.0}, 9e-3),  # the highest wins: 3e-3 x 3
        ({3e-4: 7.0, 1e-3: 5.0, 3e-3: 6.0}, None),  # interior: nothing to add
        ({9e-5: 4.0, 3e-4: 5.0, 1e-3: 6.0, 3e-3: 7.0}, 2.7e-5),  # the added value wins again: one more step
        ({2.7e-5: 3.0, 9e-5: 4.0, 3e-4: 5.0, 1e-3: 6.0, 3e-3: 7.0}, None),  # two added past the end: the cap
        ({9e-5: None, 3e-4: 5.0, 1e-3: 6.0, 3e-3: 7.0}, None),  # the added value diverged: the best is interior
    ],
)
def test_the_tuner_adds_the_next_value_past_an_end_that_wins_up_to_its_cap(scores, expected):
    """Hand-computed steps of the grid's own ratio at each end: 3e-4 / 1e-3 below, 3e-3 / 1e-3 above."""
    assert EXTENSION_STEPS == 2
    candidates = tuple(
        Candidate(
            {"optimizer.lr": lr},
            f"lr={lr}",
            (
                trial(
                    1000, f"tune/lm/v/lr={lr}/seed1000", ok(score) if score else record(status="diverged"), "perplexity"
                ),
            ),
        )
        for lr, score in scores.items()
    )
    tuning = Tuning("lm", "v", "perplexity", False, candidates, (1000,))
    values = extension(tuning, {"optimizer.lr": [3e-4, 1e-3, 3e-3]})
    assert values == (None if expected is None else {"optimizer.lr": pytest.approx(expected, rel=1e-12)})


def test_a_task_entry_s_own_overrides_apply_to_its_cells_alone(tmp_path):
    """``task: [{..., overrides: {trainer.max_steps: 6}}, ...]``: that task's reported and tuning cells train
    6 steps, the other task the base's 4; a key of the task section or the seed there is refused."""
    slow = {**TINY_LM["task"], "label": "slow", "overrides": {"trainer.max_steps": 6}}
    fast = {**TINY_LM["task"], "label": "fast"}
    axes = {"task": [slow, fast], "model.norm_placement": ["pre"], "seed": [0]}
    expansion = expand_matrix(tuned_matrix(tmp_path, axes, tune={"optimizer.lr": [1e-3, 3e-3]}))
    steps = {(cell.task, cell.phase): cell.run.trainer.max_steps for cell in expansion.cells + expansion.tuning}
    assert steps == {("slow", "report"): 6, ("fast", "report"): 4, ("slow", "tune"): 6, ("fast", "tune"): 4}
    for bad, named in (({"task.seq_len": 16}, "sets task.seq_len"), ({"max_steps": 6}, "must map dotted keys")):
        entry = {**TINY_LM["task"], "label": "slow", "overrides": bad}
        with pytest.raises(ConfigError, match=named):
            expand_matrix(tuned_matrix(tmp_path / "bad", {"task": [entry], "seed": [0]}))
