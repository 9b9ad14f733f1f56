"""The rounds of a matrix run: a config another matrix already trained is copied, not trained again;
``seeds: {min, max, step}`` trains the first seeds, then more for the questions still undecided; a
``replica`` axis trains copies of one model on disjoint seeds."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from helpers import blockbench_here, write_matrix

from blockbench.cli import main
from blockbench.matrix.expand import expand_matrix
from blockbench.matrixfile import REPLICA_SEED_STRIDE, MatrixConfig
from blockbench.store.layout import RESULT_FILE


def test_a_config_another_matrix_trained_is_copied_not_trained_again(tmp_path, capsys):
    results = tmp_path / "results"
    first = write_matrix(tmp_path, {"model.norm_placement": ["pre"], "seed": [0]}, name="a")
    assert blockbench_here(capsys, "--results-dir", str(results), "matrix", str(first)).returncode == 0
    second = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"], "seed": [0]}, name="b")
    assert main(["--results-dir", str(results), "matrix", str(second), "--dry-run"]) == 0
    assert "to train 1 cell, 1 copied from other matrices (same config and code)" in capsys.readouterr().out
    assert main(["--results-dir", str(results), "matrix", str(second)]) == 0
    out = capsys.readouterr().out
    assert out.count(": training") == 1 and "lm/norm_placement=post/seed0: training" in out
    assert f"done in {results / 'a' / 'cells' / 'lm' / 'norm_placement=pre' / 'seed0'}, copying its result" in out
    source = results / "a" / "cells" / "lm" / "norm_placement=pre" / "seed0"
    copy = results / "b" / "cells" / "lm" / "norm_placement=pre" / "seed0"
    assert (copy / RESULT_FILE).read_bytes() == (source / RESULT_FILE).read_bytes()
    assert json.loads((copy / "cell.json").read_text())["matrix_file"]["path"] == str(second)  # b's own cell.json
    # the copy is now b's own result: a rerun reuses it in place
    assert main(["--results-dir", str(results), "matrix", str(second), "--dry-run"]) == 0
    assert "nothing to train: 2 reused" in capsys.readouterr().out


def test_a_replica_axis_gives_copies_of_one_model_disjoint_seeds(tmp_path):
    path = write_matrix(tmp_path, {"replica": ["a", "b"], "seed": [0, 1]})
    cells = expand_matrix(path).cells
    assert [(c.variant, c.seed) for c in cells] == [
        ("replica=a", 0),
        ("replica=a", 1),
        ("replica=b", REPLICA_SEED_STRIDE),
        ("replica=b", REPLICA_SEED_STRIDE + 1),
    ]
    # the same model: the configs differ in the seed alone
    a, b = cells[0].run.resolved_dict(), cells[2].run.resolved_dict()
    assert {k for k in a if a[k] != b[k]} == {"seed"}


def test_every_design_matrix_of_the_book_tunes_the_learning_rate_and_adds_seeds_where_undecided():
    """A shared learning rate suits some variant best (the earlier book's 1e-3 was pre-norm's optimum in
    all three tasks), so every matrix whose verdicts the book reports tunes each variant's rate, and runs
    its seeds in rounds; demonstrations and calibrations (verdicts: false) may do neither."""
    files = sorted(Path(__file__).parents[2].joinpath("configs", "matrix").glob("*.yaml"))
    design = [MatrixConfig.model_validate(yaml.safe_load(f.read_text())) for f in files]
    design = [m for m in design if m.verdicts]
    assert len(design) >= 10
    for matrix in design:
        assert "optimizer.lr" in matrix.tune and len(matrix.tune["optimizer.lr"]) >= 3, matrix.name
        assert matrix.seeds is not None and matrix.seeds.min >= 3 and matrix.seeds.max > matrix.seeds.min, matrix.name


def test_seeds_in_rounds_add_seeds_where_the_verdict_is_undecided_up_to_the_last_look(tmp_path, capsys):
    """Two replicas of one model (no true difference) with an equivalence margin of zero: nothing can be
    shown at 2 seeds, so the runner adds the next round's 2 seeds to both sides, and stops at the last
    look (4). A rerun reuses all 8 cells; the dry run of a fresh folder counts the first round and what a
    later round may add."""
    path = write_matrix(tmp_path, {"replica": ["a", "b"]})
    matrix = yaml.safe_load(path.read_text())
    matrix |= {"seeds": {"min": 2, "max": 4, "step": 2}, "margins": {"lm": {"perplexity": 0.0}}}
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    results = tmp_path / "results"
    assert main(["--results-dir", str(results), "matrix", str(path), "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "to train 4 cells" in said and "for up to 4 more cells" in said
    run = blockbench_here(capsys, "--results-dir", str(results), "matrix", str(path))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "undecided: 4 more seed cell(s) for lm/replica=a, lm/replica=b" in run.stdout
    seeds = sorted(int(p.parent.name[4:]) for p in (results / "m" / "cells").glob(f"lm/*/seed*/{RESULT_FILE}"))
    assert seeds == sorted([0, 1, 2, 3] + [REPLICA_SEED_STRIDE + k for k in range(4)])
    assert main(["--results-dir", str(results), "matrix", str(path), "--dry-run"]) == 0
    assert "nothing to train: 8 reused" in capsys.readouterr().out


def test_the_dry_run_says_where_a_failed_seed_s_question_can_never_be_decided(tmp_path, capsys):
    """Up to 6 seeds in two looks spend α 0.025 each, which a signed-rank test on 6 pairs cannot reach
    (p ≥ 0.031): the dry run says so before anything trains. Up to 9 in three looks can (p ≥ 0.0039)."""
    for most, said in ((6, True), (9, False)):
        path = write_matrix(tmp_path / str(most), {"model.norm_placement": ["pre", "post"]})
        matrix = yaml.safe_load(path.read_text()) | {"seeds": {"min": 3, "max": most, "step": 3}}
        path.write_text(yaml.safe_dump(matrix, sort_keys=False))
        assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert ("on 6 pairs cannot reach α 0.025 per look (its smallest p-value is 0.0312)" in out) == said, out
