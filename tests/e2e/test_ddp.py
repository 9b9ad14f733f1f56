"""Distributed training on CPU processes (gloo): Lightning's DDP through the CLI, as users run it.

Under pytest, Lightning's ``ddp`` would relaunch the test command for the other ranks, so every
distributed run here is a ``blockbench`` subprocess with a timeout and a clean environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY_LM_TASK, TINY_MODEL, blockbench, scalars, write_matrix

from blockbench.config import ConfigError, TrainerConfig
from blockbench.matrix.jobs import DISTRIBUTED_ENV

TASKS = {
    "lm": {**TINY_LM_TASK, "n_train_tokens": 20000},
    "translation": {"name": "translation", "n_train": 2000, "n_val": 30},
    "vit": {"name": "vit", "n_train": 512, "n_val": 50},
}
DDP = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}


def config(task: str, **trainer) -> dict:
    return {
        "model": TINY_MODEL,
        "task": TASKS[task],
        "optimizer": {"warmup_steps": 1},
        "trainer": {"max_steps": 6, "batch_size": 8, "val_every_n_steps": 3, "log_every_n_steps": 1, **trainer},
    }


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}


def train(tmp_path: Path, name: str, cfg: dict) -> dict:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    done = blockbench(
        "train",
        "config.yaml",
        "--out",
        "out",
        "--tb-dir",
        "tb",
        "--tb-name",
        "run",
        "--tb-version",
        "seed0",
        cwd=folder,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "out" / "result.json").read_text())


# the LM in every run; the translator and the ViT (about a minute each on 2 CPUs) with -m slow
@pytest.mark.parametrize("task", [t if t == "lm" else pytest.param(t, marks=pytest.mark.slow) for t in TASKS])
def test_ddp_run_of_each_family_equals_one_process_with_the_same_global_batch(tmp_path, task):
    """Two processes with batch 4 each follow the trajectory of one process with batch 8; only
    rank 0 writes; the validation metrics (BLEU too) cover the whole validation set."""
    single = train(tmp_path, "single", config(task))
    ddp = train(tmp_path, "ddp", config(task, **DDP))
    assert ddp["batch"] == {"global": 8, "per_process": 4, "processes": 2, "accumulate_grad_batches": 1}
    assert ddp["throughput"] == pytest.approx(2 * ddp["throughput_per_process"], rel=0.01)
    for name, value in single["metrics"].items():
        assert ddp["metrics"][name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    last, ddp_last = single["history"][-1]["metrics"], ddp["history"][-1]["metrics"]
    assert set(ddp_last) == set(last) and ("lens/layer0" in last) == (task != "vit")  # the logit lens of the decoder
    for name, value in last.items():
        assert ddp_last[name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    assert ddp["curve"]["items"] == single["curve"]["items"] and len(ddp["curve"]["points"]) == 7  # every step's
    torch.testing.assert_close(
        torch.tensor(ddp["curve"]["points"]), torch.tensor(single["curve"]["points"]), rtol=1e-4, atol=1e-5
    )
    torch.testing.assert_close(
        torch.tensor(scalars(tmp_path / "ddp/tb/run/seed0", "2_train/loss")),
        torch.tensor(scalars(tmp_path / "single/tb/run/seed0", "2_train/loss")),
        rtol=1e-4,
        atol=1e-5,
    )

    # rank 0 alone wrote: one result, TensorBoard events from one process, no checkpoint left
    out = tmp_path / "ddp" / "out"
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "result.json"]
    writers = {p.name.split(".")[-2] for p in (tmp_path / "ddp/tb/run/seed0").glob("events.out.tfevents.*")}
    assert len(writers) == 1  # the pid in the file name
    assert len(scalars(tmp_path / "ddp/tb/run/seed0", "1_val/loss")) == 2  # no duplicate points


class FakeTrainer:
    def __init__(self, rank: int, world_size: int):
        self.global_rank, self.world_size = rank, world_size


def test_each_process_gets_a_disjoint_share_of_training_and_validation_data():
    from blockbench.config import build_run_config

    run = build_run_config({"model": TINY_MODEL}, {"task": TASKS["vit"]})
    _, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=2, batch_size=4)
    datamodule.setup()
    torch.manual_seed(0)
    shares = {}
    for rank in range(2):
        datamodule.trainer = FakeTrainer(rank, 2)
        shares[rank] = (
            list(datamodule.training_sampler(datamodule.train_set)),
            list(datamodule.val_dataloader().sampler),
        )
    datamodule.trainer = FakeTrainer(0, 1)
    whole_epoch = list(datamodule.training_sampler(datamodule.train_set))
    (train0, val0), (train1, val1) = shares[0], shares[1]
    assert not set(train0) & set(train1) and not set(val0) & set(val1)
    assert sorted(train0 + train1) == sorted(whole_epoch) == list(range(len(datamodule.train_set)))
    assert sorted(val0 + val1) == list(range(len(datamodule.val_set)))  # every validation item exactly once
    assert [whole_epoch[i] for i in range(0, 8, 2)] == train0[:4]  # dealt in turn from one permutation


def test_global_batch_must_divide_over_processes_and_accumulation():
    cfg = TrainerConfig(batch_size=32, accumulate_grad_batches=2)
    assert cfg.per_device_batch_size(4) == 4
    with pytest.raises(
        ConfigError, match=r"trainer.batch_size=32 is not divisible by 3 process\(es\) x 2 accumulation"
    ):
        cfg.per_device_batch_size(3)
    assert TrainerConfig().resolved_precision("cpu") == "32-true"
    assert TrainerConfig().resolved_precision("gpu") == "bf16-mixed"


@pytest.mark.slow  # minutes of subprocess training; run with -m slow
def test_a_two_process_matrix_cell_resumes_after_sigkill(tmp_path):
    base = config("lm", **DDP, max_steps=60, val_every_n_steps=20, checkpoint_every_n_steps=10)
    folder = write_matrix(tmp_path / "m", {"seed": [0]}, base).parent
    process = subprocess.Popen(
        [sys.executable, "-m", "blockbench", "matrix", "m.yaml"],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=clean_env(),
    )
    checkpoint = folder / "results/m/cells/lm/default/seed0/checkpoints/last.ckpt"
    deadline = time.monotonic() + 180
    while not checkpoint.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert checkpoint.exists()
    os.killpg(process.pid, signal.SIGKILL)  # the matrix and both training processes
    process.wait()

    done = blockbench("matrix", "m.yaml", cwd=folder, env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((folder / "results/m/cells/lm/default/seed0/result.json").read_text())
    assert result["status"] == "ok" and result["steps"] == 60 and result["resumed_from_step"] >= 10
    assert result["batch"]["processes"] == 2

    uninterrupted = train(tmp_path, "uninterrupted", base)
    assert result["metrics"] == pytest.approx(uninterrupted["metrics"], rel=1e-5)


NAN_ON_RANK_ONE = """
import sys
from pathlib import Path

import lightning as L
import yaml

from blockbench.config import build_run_config
from blockbench.cell.train import train


class NanOnRankOne(L.Callback):
    \"\"\"From the 4th optimizer step on, process 1's training loss is NaN; process 0's is not.\"\"\"

    def on_train_start(self, trainer, pl_module):
        if trainer.global_rank == 1:
            loss = pl_module.training_loss
            pl_module.training_loss = lambda batch: loss(batch) * (float("nan") if trainer.global_step >= 3 else 1.0)


run = build_run_config(yaml.safe_load(Path("config.yaml").read_text()))
train(run, Path("out"), tb_dir=Path("tb"), tb_name="run", tb_version="0", extra_callbacks=[NanOnRankOne()])
"""


@pytest.mark.slow  # two-process training (about 30 s); run with -m slow
def test_a_loss_diverging_in_one_process_stops_every_process(tmp_path):
    """Without a decision shared by the processes, process 1 leaves the loop while process 0 waits
    for it in the next gradient all-reduce: the run hangs (here: past the timeout) instead of ending."""
    cfg = config("lm", **DDP, max_steps=8, val_every_n_steps=8)
    cfg["task"] = {**cfg["task"], "n_train_tokens": 4000, "n_val_tokens": 1000, "n_probes": 16}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "nan_on_rank_one.py").write_text(NAN_ON_RANK_ONE)
    # Lightning relaunches this script for process 1; a new session lets the timeout end both
    process = subprocess.Popen(
        [sys.executable, "nan_on_rank_one.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("the run did not end within 120 s: a process is waiting for one that stopped")
    assert process.returncode == 0, stderr[-3000:]
    result = json.loads((tmp_path / "out/result.json").read_text())
    assert result["status"] == "diverged" and result["steps"] == 4
    assert result["diverged_at_step"] == 4 and result["diverging_loss"] == "nan"
    assert result["last_finite_loss"] > 0  # step 3: the mean over both processes


@pytest.mark.slow  # minutes of subprocess training; run with -m slow
def test_matrix_cells_as_submitit_jobs(tmp_path):
    """The cluster path (one submitit job per cell) run as local jobs: same results folder, summary and reuse."""
    pytest.importorskip("submitit")
    folder = write_matrix(tmp_path / "m", {"seed": [0, 1]}, config("lm", max_steps=4, val_every_n_steps=2)).parent
    command = ("--results-dir", "results", "matrix", "m.yaml", "--launcher", "submitit-local")
    done = blockbench(*command, cwd=folder, env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("submitted as job") == 2
    for seed in (0, 1):
        result = json.loads((folder / f"results/m/cells/lm/default/seed{seed}/result.json").read_text())
        assert result["status"] == "ok" and result["steps"] == 4
    assert "| default |" in (folder / "results/m/summary.md").read_text()
    again = blockbench(*command, cwd=folder, env=clean_env())
    assert again.stdout.count("done earlier") == 2 and "submitted" not in again.stdout
