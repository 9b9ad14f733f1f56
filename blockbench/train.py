"""Train one cell: build the task from a RunConfig, fit with Lightning, write ``result.json``."""

from __future__ import annotations

import json
import os
import platform
import time
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import TensorBoardLogger

from .callbacks import TrainingThroughput
from .config import RunConfig, to_yaml

RESULT_FILE = "result.json"
CONFIG_FILE = "config.yaml"


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves a truncated file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def machine_description() -> str:
    """CPU model and core count, GPUs if any, and the torch version, for the results' header."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    parts = [f"{cpu}, {os.cpu_count()} logical CPUs"]
    if torch.cuda.is_available():
        parts.append(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
    parts.append(f"torch {torch.__version__}, lightning {L.__version__}")
    return "; ".join(parts)


def train(run: RunConfig, out_dir: Path, *, tb_dir: Path, tb_name: str, tb_version: str) -> dict[str, Any]:
    """Train ``run`` and return (and write to ``out_dir/result.json``) its result record."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / CONFIG_FILE, to_yaml(run))
    if run.trainer.num_threads:
        torch.set_num_threads(run.trainer.num_threads)
    L.seed_everything(run.seed, workers=True, verbose=False)

    task_cfg = run.task
    module, datamodule = task_cfg.build(
        run.resolved_model(), run.optimizer, max_steps=run.trainer.max_steps, batch_size=run.trainer.batch_size
    )
    throughput = TrainingThroughput(task_cfg.throughput_unit)
    logger = TensorBoardLogger(save_dir=str(tb_dir), name=tb_name, version=tb_version, default_hp_metric=False)
    cfg = run.trainer
    trainer = L.Trainer(
        max_steps=cfg.max_steps,
        val_check_interval=cfg.val_every_n_steps,
        check_val_every_n_epoch=None,  # validate every val_every_n_steps steps, across epochs
        num_sanity_val_steps=0,
        log_every_n_steps=cfg.log_every_n_steps,
        gradient_clip_val=cfg.grad_clip,
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        strategy=cfg.strategy,
        precision=cfg.precision,
        logger=logger,
        callbacks=[LearningRateMonitor(logging_interval="step"), throughput],
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=str(out_dir),
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    if trainer.interrupted:  # Lightning returns from fit on Ctrl-C; an unfinished run has no result
        raise KeyboardInterrupt
    if module.last_validated_step != trainer.global_step:  # the final step was not a validation step
        trainer.validate(module, datamodule=datamodule, verbose=False)
    wall_time = time.perf_counter() - start

    metrics = {m.name: float(trainer.callback_metrics[f"val/{m.name}"]) for m in task_cfg.metrics}
    result = {
        "status": "ok",
        "task": task_cfg.name,
        "seed": run.seed,
        "config_hash": run.config_hash(),
        "metrics": metrics,
        "primary_metric": task_cfg.metrics[0].name,
        "baselines": datamodule.baselines(),
        "data": datamodule.data_summary(),
        "steps": trainer.global_step,
        "wall_time_s": round(wall_time, 2),
        "parameters": module.n_parameters,
        "throughput": round(throughput.per_second, 1),
        "throughput_unit": f"{task_cfg.throughput_unit}/s",
        "machine": machine_description(),
        **module.result_extras(),
    }
    if trainer.is_global_zero:
        write_json(out_dir / RESULT_FILE, result)
    return result


def failure_record(run: RunConfig, error: BaseException) -> dict[str, Any]:
    """The result record of a cell that raised: the matrix goes on and reports it as failed."""
    return {
        "status": "failed",
        "task": run.task.name,
        "seed": run.seed,
        "config_hash": run.config_hash(),
        "error": f"{type(error).__name__}: {error}",
        "traceback": traceback.format_exc(),
    }
