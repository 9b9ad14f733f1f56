"""``blockbench matrix --dry-run``: every cell validated, its status read from what is on disk
(done, stale, resumable from step k, failed before, to run), a wall-time estimate from the step
times measured here, and nothing written or trained."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from conftest import TINY_LM, write_matrix

from blockbench.cli import main
from blockbench.layout import CHECKPOINT_DIR, RESULT_FILE, write_json
from blockbench.matrix.expand import load_matrix
from blockbench.matrix.plan import MatrixProgress, TimeEstimator, plan_cells
from blockbench.provenance import code_fingerprint
from blockbench.record import CellRecord


def _files(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_dry_run_lists_every_status_with_its_estimate_and_writes_nothing(tmp_path, capsys, monkeypatch):
    # a training step timed on one batch: post-norm's twice pre-norm's (a stand-in: timings vary here)
    timed = []
    monkeypatch.setattr(
        "blockbench.matrix.plan.time_training_step",
        lambda run: timed.append(run.model.norm_placement) or {"pre": 1.0, "post": 2.0}[run.model.norm_placement],
    )
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"], "seed": [0, 1, 2]})
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    cell = {c.key: c for c in cells}
    fingerprint = code_fingerprint()

    def record(key: str, **fields) -> None:
        c = cell[key]
        write_json(
            c.directory(matrix_dir) / RESULT_FILE,
            {"status": "ok", "task": "lm", "seed": c.seed, "config_hash": c.run.config_hash(), **fields},
        )

    # pre: seed 0 done by this code in 10 s, seed 1 by other code in 14 s (both 4 steps: 2.5 and 3.5 s a step),
    # seed 2 interrupted at step 2; post: seed 0 failed, seeds 1 and 2 never started
    record("lm/norm_placement=pre/seed0", code_fingerprint=fingerprint, wall_time_s=10.0, steps=4)
    record("lm/norm_placement=pre/seed1", code_fingerprint="0" * 64, wall_time_s=14.0, steps=4)
    checkpoint = cell["lm/norm_placement=pre/seed2"].directory(matrix_dir) / CHECKPOINT_DIR / "last.ckpt"
    checkpoint.parent.mkdir(parents=True)
    torch.save(
        {
            "global_step": 2,
            "callbacks": {
                "ResumeState": {
                    "config_hash": cell["lm/norm_placement=pre/seed2"].run.config_hash(),
                    "code_fingerprint": fingerprint,
                }
            },
        },
        checkpoint,
    )
    record("lm/norm_placement=post/seed0", status="failed", code_fingerprint=fingerprint, error="RuntimeError: boom")
    before = _files(tmp_path)

    assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), "--dry-run", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert _files(tmp_path) == before  # nothing written, the checkpoint kept
    rows = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r"^\[\d/6\] (\S+)\s+(done|stale|resumable|failed before|to run)\s+(~[\d:?]+)?", out, re.M)
    }
    # the estimate of each cell to train: its steps times the median step time of its variant (pre: 2.5
    # and 3.5 -> 3.0 s); post, none of whose cells finished, is timed with pre as the reference: 2.0 s
    # timed times pre's 3.0 s measured over 1.0 s timed = 6.0 s a step, not pre's 3.0 s
    assert rows == {
        "lm/norm_placement=pre/seed0": ("done", None),
        "lm/norm_placement=pre/seed1": ("stale", "~0:12"),
        "lm/norm_placement=pre/seed2": ("resumable", "~0:06"),
        "lm/norm_placement=post/seed0": ("failed before", "~0:24"),
        "lm/norm_placement=post/seed1": ("to run", "~0:24"),
        "lm/norm_placement=post/seed2": ("to run", "~0:24"),
    }, out
    assert "resumes from step 2" in out and "code changed since its result" in out and "RuntimeError: boom" in out
    assert "timing a training step of 1 variant(s)" in out and sorted(timed) == ["post", "pre"]
    assert "5 to train (1 resume), 1 reused: about 1:30 on this machine" in out
    assert "scaled by the measured-to-timed ratio" in out

    # with two jobs the same cells share two slots
    assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), "--dry-run", "--jobs", "2"]) == 0
    assert "about 0:45 on this machine with --jobs 2" in capsys.readouterr().out


def test_dry_run_of_a_new_matrix_times_a_training_step_of_each_variant(tmp_path, capsys):
    base = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "num_threads": 1}}
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"]}, base=base)
    assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "timing a training step of 2 variant(s)" in out
    assert len(re.findall(r"^\[\d/2\] lm/norm_placement=\w+/seed0\s+to run\s+~0:0\d", out, re.M)) == 2, out
    assert "2 to train: about 0:0" in out and "timed training steps, validation and start-up not included" in out
    assert not (tmp_path / "results").exists()


def test_the_runner_and_the_dry_run_agree_on_what_is_reused(tmp_path):
    """The plan is the runner's rule: a stale result is reused only with --reuse-stale."""
    path = write_matrix(tmp_path, {"seed": [0]})
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    write_json(
        cells[0].directory(matrix_dir) / RESULT_FILE,
        {
            "status": "ok",
            "task": "lm",
            "config_hash": cells[0].run.config_hash(),
            "code_fingerprint": "0" * 64,
            "wall_time_s": 1.0,
            "steps": 4,
        },
    )
    [strict] = plan_cells(cells, matrix_dir, code_fingerprint())
    [lenient] = plan_cells(cells, matrix_dir, code_fingerprint(), reuse_stale=True)
    [forced] = plan_cells(cells, matrix_dir, code_fingerprint(), force=True)
    assert (strict.status, strict.trains) == ("stale", True)
    assert (lenient.status, lenient.trains) == ("stale", False)
    assert (forced.status, forced.trains) == ("to run", True)
    estimator = TimeEstimator()
    estimator.add_results(cells, matrix_dir)
    assert estimator.seconds(strict) == 1.0 and estimator.seconds(lenient) == 0.0
    assert json.loads((cells[0].directory(matrix_dir) / RESULT_FILE).read_text())["code_fingerprint"] == "0" * 64


def trained(steps: int) -> CellRecord:
    """The record of a cell that trained ``steps`` steps (all the runner's progress line reads of it)."""
    return CellRecord(status="ok", task="lm", steps=steps)


def test_the_matrix_eta_covers_tasks_none_of_whose_cells_ran_yet(tmp_path):
    """After the first cell the runner has an ETA for the whole matrix: a task that has not run yet
    is guessed at the pace of those that have (the smoke matrix printed no ETA until its last task)."""
    from conftest import TINY_LM_TASK

    path = write_matrix(
        tmp_path, {"task": [{**TINY_LM_TASK, "label": "a"}, {**TINY_LM_TASK, "label": "b"}], "seed": [0, 1]}
    )
    _, cells = load_matrix(path)
    plans = plan_cells(cells, tmp_path / "results" / "m", code_fingerprint())
    progress = MatrixProgress(plans, TimeEstimator(), jobs=1)
    assert progress.eta() is None  # nothing measured
    first = plans[0]
    progress.start(first.n)
    progress.started[first.n] -= 8.0  # it took 8 s for its 4 steps: 2 s a step
    progress.finish(first.n, trained(4))
    seconds, source = progress.estimator.per_step(cells[2])  # task b, not run yet
    assert source == "other tasks" and seconds == pytest.approx(2.0, rel=1e-3)
    assert progress.eta() == pytest.approx(3 * 8.0, rel=0.01)  # three cells of 4 steps left
    assert "1/4 trained" in progress.describe() and ", ETA 0:24" in progress.describe()


def test_the_runner_eta_of_a_variant_whose_first_cells_are_training_uses_their_printed_pace(tmp_path):
    """attention_score's runner printed "ETA 13:51" with about 45 min to go: its additive cells were
    training at five times the dot-product pace, and the ETA gave them the dot-product cells' pace. A
    variant none of whose cells finished but some are training gets the pace their train.log shows."""
    from blockbench.layout import TRAIN_LOG

    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"], "seed": [0, 1]})
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    plans = plan_cells(cells, matrix_dir, code_fingerprint())
    estimator = TimeEstimator()
    estimator.add_results(cells, matrix_dir)
    progress = MatrixProgress(plans, estimator, jobs=2)
    pre, post = (
        [p for p in plans if p.cell.variant.endswith("pre")],
        [p for p in plans if p.cell.variant.endswith("post")],
    )
    progress.start(pre[0].n)
    progress.started[pre[0].n] -= 8.0  # 2 s a step, its 4 steps
    progress.finish(pre[0].n, trained(4))
    progress.start(post[0].n)  # training, its log written as a --jobs cell's
    log = post[0].cell.directory(matrix_dir) / TRAIN_LOG
    log.parent.mkdir(parents=True)
    log.write_text("step 1/4 (25%)  loss 3.9  0:12 elapsed, ETA 0:36\n")
    assert estimator.per_step(post[1].cell) == (pytest.approx(2.0, rel=1e-3), "other variants")  # one line: no pace yet
    log.write_text(log.read_text() + "step 2/4 (50%)  loss 3.1  val/perplexity 40.2  0:22 elapsed, ETA 0:22\n")
    assert estimator.per_step(post[1].cell) == (pytest.approx(10.0), "running")  # (22 - 12) s / (2 - 1) steps
    assert estimator.per_step(post[1].cell, guess=False) is None  # the dry run still times it
    log.write_bytes(log.read_bytes() + b"a warning in Latin-1: \xe9\n")  # not UTF-8: still read, no error
    assert estimator.per_step(post[1].cell) == (pytest.approx(10.0), "running")
    os.utime(log, (estimator.started - 60, estimator.started - 60))  # another run's log (--jobs 1 writes none)
    assert estimator.per_step(post[1].cell)[1] == "other variants"
    os.utime(log)
    # left: pre's second cell (8 s), post's running cell (40 s less the ~0 s it has had), its second (40 s)
    assert progress.eta() == pytest.approx((8 + 40 + 40) / 2, rel=0.01)
    progress.finish(post[0].n, trained(4))  # a finished cell's own time wins over any log
    assert estimator.per_step(post[1].cell)[1] == "measured"


def test_a_variant_none_of_whose_cells_ran_is_scaled_by_its_timed_step_not_given_its_task_pace():
    """attention_score's dry run gave additive attention the pace of the dot-product cells that had run
    (2.5 min a cell), and its cells took 12: a variant's own timed step, scaled by the measured-to-timed
    ratio of its task's variants that ran, is the estimate; the task's pace is only the runner's guess."""
    from types import SimpleNamespace

    dot, additive = (
        SimpleNamespace(task="lm", variant="attention_score=dot"),
        SimpleNamespace(task="lm", variant="attention_score=additive"),
    )
    vit = SimpleNamespace(task="vit", variant="attention_score=dot")
    estimator = TimeEstimator()
    estimator.add(dot, 30.0, 10)
    estimator.add(dot, 50.0, 10)  # 3 and 5 s a step: median 4
    assert estimator.per_step(dot) == (4.0, "measured")
    assert estimator.per_step(additive) == (4.0, "other variants")  # the runner's rough guess
    assert estimator.per_step(additive, guess=False) is None  # so the dry run times it
    assert estimator.per_step(vit) == (4.0, "other tasks")

    timer_calls = []

    def timer(run):
        timer_calls.append(run)
        return {"dot": 1.0, "additive": 5.0}[run]

    plans = [
        SimpleNamespace(
            cell=SimpleNamespace(task=c.task, variant=c.variant, run=c.variant.split("=")[1]), trains=trains
        )
        for c, trains in ((dot, False), (additive, True))
    ]
    assert estimator.time_steps(plans, timer) == []
    assert timer_calls == ["additive", "dot"]  # the new variant and its task's measured reference
    assert estimator.per_step(additive) == (pytest.approx(20.0), "scaled")  # 5 s timed x (4 measured / 1 timed)
    assert estimator.per_step(dot) == (4.0, "measured")

    estimator.timed.pop(("lm", "attention_score=dot"))  # no reference timing (it failed): the bare timed step
    assert estimator.per_step(additive) == (5.0, "timed")
