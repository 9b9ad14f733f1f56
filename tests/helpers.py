"""What more than one test file uses, besides the fixtures of conftest.py: the tiny model and run
configs, the float64 reference precision, a matrix written to disk, the ``blockbench`` command,
TensorBoard events. Test files import the plain names (``from helpers import TINY_LM, write_matrix``:
pytest's ``pythonpath`` setting puts tests/ on sys.path). The config dicts are shared: derive new ones
(``{**TINY_LM, ...}``, ``deep_merge``), never change them in place."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import SCALARS, TENSORS, EventAccumulator
from torch import nn

from blockbench.models import build_model
from blockbench.store.layout import write_json
from blockbench.store.record import Hardware

REPO = Path(__file__).resolve().parents[1]
#: the real data sets beside the repo (tinyshakespeare, multi30k_de_en, cifar10_subset; see its README)
SHARED_DATA = REPO.parent / "shared" / "data"

#: what a cell trains on: a CPU in float32 (every committed cell) and a GPU in bf16 (``auto`` on a GPU)
CPU_FP32 = Hardware(device_kind="cpu", precision="32-true")
GPU_BF16 = Hardware(device_kind="cuda", precision="bf16-mixed")

#: the precision of the tests that compare against a reference written out by hand, and their tolerance
DT = torch.float64
TOL = dict(rtol=1e-10, atol=1e-10)

#: Student t quantiles 0.975, the 95% intervals of 3 and 5 seeds are checked against (tables: 4.303, 2.776)
T_975_DF2 = 4.302652729749464
T_975_DF4 = 2.776445105197793

#: the model section of the tiny cells the runner, the trainer and the tasks are tested with
TINY_MODEL = {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64}
#: the embedded agreement LM task at the size of those cells
TINY_LM_TASK = {"name": "lm", "seq_len": 32, "n_train_tokens": 8000, "n_val_tokens": 2000, "n_probes": 32}
#: a whole tiny LM cell: four steps, validated twice
TINY_LM = {
    "model": TINY_MODEL,
    "task": TINY_LM_TASK,
    "trainer": {"max_steps": 4, "batch_size": 8, "val_every_n_steps": 2, "log_every_n_steps": 1},
    "optimizer": {"warmup_steps": 1},
}


# --------------------------------------------------------------------------- tiny models


def tiny(family: str, **overrides) -> dict:
    """A tiny config mapping for ``family`` (d_model 32, 2 layers, 4 heads; vocabulary 17, 24
    positions; 8x8 images in 4x4 patches, 5 classes), with ``overrides``."""
    cfg = dict(family=family, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=24)
    if family in ("decoder_lm", "encoder_decoder"):
        cfg["vocab_size"] = 17
    if family == "vit":
        cfg.update(image_size=8, patch_size=4, in_channels=3, n_classes=5)
    cfg.update(overrides)
    return cfg


def tiny_model(family: str, dtype: torch.dtype = DT, **overrides) -> nn.Module:
    """``tiny(family, **overrides)`` built in ``dtype``, in eval mode (the global seed draws its init)."""
    return build_model(tiny(family, **overrides)).to(dtype).eval()


def randomize_(module: nn.Module, std: float = 0.3) -> nn.Module:
    """Overwrite every parameter (norm gains/biases included) with N(0, std) values from the global
    generator, so no weight is a trivial 0 or 1 that could hide a mistake."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std)
    return module


# --------------------------------------------------------------------------- runs on disk


def write_matrix(folder: Path, axes: dict, base: dict = TINY_LM, name: str = "m") -> Path:
    """A matrix file ``folder/<name>.yaml`` crossing ``axes`` over ``base`` (written beside it as
    base.yaml); its results go to ``results/<name>`` under the folder the runner is given."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text(yaml.safe_dump(base))
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "base": "base.yaml", "axes": axes}, sort_keys=False))
    return path


def ok_result(task: str, seed: int, metrics: dict[str, float], baselines: dict[str, float], **extra: object) -> dict:
    """A finished cell's result.json as the report reads it: ``metrics`` (the first is the headline),
    the trivial ``baselines``, and fixed figures for the rest (30 steps, 4 s, 1,000 parameters);
    ``extra`` adds or replaces fields (``history``, ``performance``, ``data``)."""
    return {
        "status": "ok",
        "task": task,
        "seed": seed,
        "config_hash": "abc",
        "metrics": metrics,
        "primary_metric": next(iter(metrics)),
        "baselines": baselines,
        "steps": 30,
        "wall_time_s": 4.0,
        "parameters": 1000,
        "throughput": 100.0,
        "throughput_unit": "tokens/s",
        "machine": "test",
        **extra,
    }


def diverged_result(task: str, seed: int) -> dict:
    """A cell's result.json that diverged at step 20."""
    return {
        "status": "diverged",
        "task": task,
        "seed": seed,
        "config_hash": "abc",
        "diverged_at_step": 20,
        "last_finite_loss": 7.5,
        "history": [],
    }


def blockbench(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m blockbench *args`` in ``cwd``, as users run it, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "blockbench", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def blockbench_here(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """``blockbench *args`` in this test's process (:func:`blockbench.cli.main`), its output read
    from ``capsys``, returned as :func:`blockbench` returns a subprocess's. For tests of what a run does
    rather than how a fresh interpreter starts one: it reuses this process's imports and its cell
    server (each subprocess run imports torch and starts a server of its own, seconds of CPU each).
    The cells' own output (the forked processes') is not captured."""
    from blockbench.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["blockbench", *args], code, out, err)


def tensorboard_events(run_dir: Path) -> EventAccumulator:
    """A TensorBoard run's events, every scalar and tensor of them loaded (none sampled away)."""
    events = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0, TENSORS: 0})
    events.Reload()
    return events


def scalars(run_dir: Path, tag: str) -> list[float]:
    """The values a TensorBoard run logged for ``tag``, in the order it logged them."""
    return [e.value for e in tensorboard_events(run_dir).Scalars(tag)]


def hparams_session(run_dir: Path):
    """The HParams session-start record (hparams of the cell) in a run's event files."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    for event_file in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(event_file)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    if data.HasField("session_start_info"):
                        return data.session_start_info
    raise AssertionError(f"no hparams session in {run_dir}")


# --------------------------------------------------------------------------- a scale ladder's results

#: a ladder of four rungs, each 4 times the compute of the one below (the flagship's names and computes)
LADDER_RUNGS = {"0.25x": 0.25, "1x": 1.0, "4x": 4.0, "16x": 16.0}
#: the LM's trivial (unigram) loss and entropy floor in the ladder's stand-in records
LADDER_TRIVIAL, LADDER_FLOOR = 3.4, 1.8


def ladder_record(seed: int, loss: float | None, seconds: float = 10.0) -> dict:
    """An lm cell's result.json at final validation ``loss`` (perplexity its exp), or diverged (None)."""
    if loss is None:
        return {**diverged_result("lm", seed), "wall_time_s": seconds}
    baselines = {"perplexity": math.exp(LADDER_TRIVIAL), "loss": LADDER_TRIVIAL, "loss_floor": LADDER_FLOOR}
    return ok_result("lm", seed, {"perplexity": math.exp(loss), "loss": loss}, baselines, wall_time_s=seconds)


def write_ladder_results(
    matrix_dir: Path,
    losses: dict[tuple[str, str], list[float | None]],
    baseline: str = "norm_placement=pre",
    tuning: dict[tuple[str, str, float], float | None] | None = None,
    *,
    name_baseline: bool = True,
    seeds: dict[str, int] | None = None,
) -> Path:
    """A ladder matrix's results folder as the report reads it: its matrix.yaml (rungs of
    :data:`LADDER_RUNGS`, computes declared) and, per (design, rung), an lm cell per seed (0, 1, ...) at
    the given losses (None: diverged), written in text order of the rungs (``16x`` before ``1x``), so that
    nothing but the ladder puts them in order; ``tuning``: (design, rung, lr) -> the tuning cell's loss;
    ``name_baseline``: False leaves ``baseline_variant`` out, so the matrix's first variant is the baseline;
    ``seeds``: the matrix's ``seeds:`` plan (seeds in rounds), none by default."""
    ladder = {"rungs": [{"name": name, "compute": compute} for name, compute in LADDER_RUNGS.items()]}
    named = {"baseline_variant": baseline} if name_baseline else {}
    planned = {"seeds": seeds} if seeds else {}
    matrix = {"name": matrix_dir.name, **named, "axes": {"task": ["lm"]}, **planned, "ladder": ladder}
    matrix_dir.mkdir(parents=True, exist_ok=True)
    (matrix_dir / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
    cells = sorted(losses.items(), key=lambda item: (item[0][0] != baseline, item[0][0], item[0][1]))
    index = 0
    for (design, rung), seeds in cells:
        for seed, loss in enumerate(seeds):
            folder = matrix_dir / "cells" / "lm" / f"{design},rung={rung}" / f"seed{seed}"
            axes = {"model.norm_placement": design.split("=")[1], "rung": rung, "seed": seed}
            cell = {"index": index, "task": "lm", "task_name": "lm", "variant": f"{design},rung={rung}", "axes": axes}
            write_json(folder / "cell.json", {**cell, "seed": seed})
            write_json(folder / "result.json", ladder_record(seed, loss))
            index += 1
    for (design, rung, lr), loss in (tuning or {}).items():
        folder = matrix_dir / "tune" / "cells" / "lm" / f"{design},rung={rung}" / f"lr={lr:g}" / "seed1000"
        axes = {"model.norm_placement": design.split("=")[1], "rung": rung, "seed": 1000}
        cell = {"index": index, "task": "lm", "task_name": "lm", "variant": f"{design},rung={rung}", "axes": axes}
        write_json(folder / "cell.json", {**cell, "seed": 1000, "phase": "tune", "tuned": {"optimizer.lr": lr}})
        write_json(folder / "result.json", ladder_record(1000, loss, seconds=5.0))
        index += 1
    return matrix_dir


def write_ok_record(cell, matrix_dir: Path):
    """A finished record of ``cell`` (every metric 1.0) written where the runner looks, for tests whose
    stand-in ``run_cell`` trains nothing."""
    from blockbench.provenance import code_fingerprint
    from blockbench.store.record import CellRecord, write_record

    record = CellRecord(
        status="ok",
        task=cell.task,
        seed=cell.seed,
        config_hash=cell.run.config_hash(),
        code_fingerprint=code_fingerprint(),
        primary_metric="perplexity",
        metrics={m.name: 1.0 for m in cell.run.task.metrics},
    )
    write_record(cell.directory(matrix_dir) / "result.json", record)
    return record
