"""No host synchronisation inside a training step except at the steps the logger writes: on a GPU
the host must run ahead of the work it queues, so the step timing (CUDA events), the divergence
guard (losses kept on the device) and the MoE layers (capacity-sized buffers, statistics as tensors)
read nothing back between log steps. Tested on the CPU by making the callbacks and the MoE layers
believe they are on a GPU (their ``runs_ahead`` seam), with ``torch.cuda.Event`` replaced by a
host-clock fake, and counting every host read (``Tensor.item``, ``tolist``, ``int``, ``float``,
``bool``, ``torch.cuda.synchronize``, an event's ``synchronize``) per step of a real Lightning fit."""

from __future__ import annotations

import copy
import math
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import TINY_LM
from lightning.pytorch.loggers import CSVLogger

import blockbench.cell.callbacks
import blockbench.models.moe
from blockbench.cell.callbacks import DivergenceGuard, PerformanceMonitor
from blockbench.config import build_run_config

#: the Tensor methods that read a value back to the host (each waits for a GPU)
TENSOR_READS = ("item", "tolist", "__int__", "__float__", "__bool__")
LOG_EVERY = 3
STEPS = 8


class HostReads(L.Callback):
    """Counts host reads per optimizer step: from a step's first ``on_train_batch_start`` (this
    callback comes first) to the next one, so Lightning's logging after the step counts in it; the
    end of the epoch and of training close the last one. Keeps where each read came from."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.counts: defaultdict[int, Counter[str]] = defaultdict(Counter)
        self.where: defaultdict[int, list[str]] = defaultdict(list)

    def count(self, name: str) -> None:
        if self.step is not None:
            self.counts[self.step][name] += 1
            caller = next(
                (f for f in reversed(traceback.extract_stack()[:-2]) if "/torch/" not in f.filename),
                None,
            )
            self.where[self.step].append(f"{name} at {caller.filename}:{caller.lineno}" if caller else name)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step = trainer.global_step + 1  # the optimizer step this micro-batch belongs to

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.step = None

    def on_train_end(self, trainer, pl_module) -> None:
        self.step = None


class FakeEvent:
    """``torch.cuda.Event`` on a machine without CUDA: records the host clock; waiting for it is a
    host synchronisation, counted."""

    reads: HostReads | None = None

    def __init__(self, enable_timing: bool = False, **kwargs) -> None:
        self.time: float | None = None

    def record(self, stream=None) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        FakeEvent.reads.count("event.synchronize")

    def elapsed_time(self, end: FakeEvent) -> float:
        return 1e3 * (end.time - self.time)


@pytest.fixture
def on_a_gpu(monkeypatch) -> HostReads:
    """The callbacks and MoE layers act as on a GPU, and every host read is counted."""
    reads = HostReads()
    monkeypatch.setattr(blockbench.cell.callbacks, "runs_ahead", lambda device: True, raising=False)
    monkeypatch.setattr(blockbench.models.moe, "runs_ahead", lambda device: True, raising=False)
    monkeypatch.setattr(FakeEvent, "reads", reads)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: reads.count("torch.cuda.synchronize"))

    def counted(name, original):
        def read(self, *args, **kwargs):
            reads.count(name)
            return original(self, *args, **kwargs)

        return read

    for name in TENSOR_READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    return reads


def fit(
    tmp_path: Path, reads: HostReads, model: dict, accumulate: int = 1
) -> tuple[PerformanceMonitor, DivergenceGuard]:
    """A tiny LM task trained ``STEPS`` steps by Lightning with the runner's speed and divergence
    callbacks, gradient clipping and a logger writing every ``LOG_EVERY`` steps (no validation)."""
    config = copy.deepcopy(TINY_LM)
    config["model"].update(model)
    run = build_run_config(config)
    L.seed_everything(0, verbose=False)
    module, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=STEPS, batch_size=4)
    log = module.log

    def log_without_progress_bar(name, value, **kwargs):
        # TaskModule.training_step logs train/loss with prog_bar=True, and Lightning converts the
        # progress-bar metrics to numbers after every batch (_LoggerConnector.on_batch_end): a read
        # in every step. Nothing reads them (StepProgress reads trainer.callback_metrics); the task
        # is to drop prog_bar there (tasks/base.py, reported), which makes this wrapper a no-op.
        return log(name, value, **{**kwargs, "prog_bar": False})

    module.log = log_without_progress_bar
    monitor = PerformanceMonitor(run.task.throughput_unit, peak_tflops=1.0)
    guard = DivergenceGuard(None)
    trainer = L.Trainer(
        max_steps=STEPS,
        log_every_n_steps=LOG_EVERY,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=1.0,
        accelerator="cpu",
        devices=1,
        logger=CSVLogger(tmp_path),
        callbacks=[reads, monitor, guard],
        profiler=monitor.data_wait,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == STEPS
    return monitor, guard


@pytest.mark.parametrize(
    "model, accumulate",
    [({}, 1), ({"n_experts": 4, "moe_top_k": 2}, 1), ({"n_experts": 4, "moe_top_k": 1}, 2)],
    ids=["dense", "moe", "moe-accumulating"],
)
def test_no_host_reads_in_a_training_step_except_at_log_steps(tmp_path, on_a_gpu, model, accumulate):
    """Steps 2, 4, 5, 7 and 8 read nothing back (step 1 counts the model FLOPs, a one-off that reads
    the MoE layers' dropped counts; the end of training reads the last steps' times and losses).
    At the log steps 3 and 6, the step timer waits for the GPU once, and Lightning and the guard
    read what they write and decide on."""
    monitor, guard = fit(tmp_path, on_a_gpu, model, accumulate)
    reads = on_a_gpu
    for step in range(2, STEPS + 1):
        if step % LOG_EVERY:
            assert reads.counts[step] == Counter(), f"step {step}: " + "; ".join(reads.where[step])
        else:
            assert reads.counts[step]["event.synchronize"] == 1, reads.where[step]
            assert reads.counts[step]["tolist"] >= 1  # the guard's losses
    assert reads.counts[1]["event.synchronize"] == 0  # no figures logged after a first step that is no log step
    assert all(reads.counts[step]["torch.cuda.synchronize"] == 0 for step in reads.counts)
    # the figures are complete: every step timed by its events and counted, the losses checked
    assert len(monitor.steps) == STEPS and all(s.seconds > 0 and isinstance(s.items, int) for s in monitor.steps)
    assert monitor.summary()["step_time_ms"]["median"] > 0
    assert guard.last_finite_loss is not None and not guard.diverged


class GatherTwo:
    """A strategy whose all-gather returns this process's tensor and another process's (doubled)."""

    @staticmethod
    def all_gather(tensor: torch.Tensor) -> torch.Tensor:
        return torch.stack([tensor, 2 * tensor])


def guard_run(losses: list[float], *, on_gpu: bool, monkeypatch) -> tuple[DivergenceGuard, list[int]]:
    """The guard over one optimizer step per loss, logging every ``LOG_EVERY`` steps, as if on a GPU
    or not; the steps after which it had stopped training."""
    monkeypatch.setattr(blockbench.cell.callbacks, "runs_ahead", lambda device: on_gpu)
    guard = DivergenceGuard(threshold=100.0)
    trainer = SimpleNamespace(
        global_step=0, log_every_n_steps=LOG_EVERY, should_stop=False, strategy=GatherTwo(), max_steps=len(losses)
    )
    module = SimpleNamespace(device=torch.device("cpu"))
    guard.on_train_start(trainer, module)
    stopped = []
    for loss in losses:
        trainer.global_step += 1
        guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(loss)}, None, 0)
        if trainer.should_stop:
            stopped.append(trainer.global_step)
            break
    else:
        guard.on_train_end(trainer, module)
    return guard, stopped


@pytest.mark.parametrize(
    "losses, diverged_at, diverging, last_finite",
    [
        ([4.0, 3.0, 2.0, math.nan, 1.0, 1.0, 1.0], 4, math.nan, 3.0),  # (2 + 4) / 2: both processes
        ([4.0, 3.0, 2.0, 1.0, 60.0, 1.0, 1.0], 5, 120.0, 1.5),  # the other process's 120 is over 100
        ([4.0, 3.0, 2.0, 1.0, 1.0, 1.0, math.inf], 7, math.inf, 1.5),  # after the last log step: at the end
    ],
)
def test_the_guard_records_the_same_divergence_on_a_gpu_and_stops_at_the_next_log_step(
    monkeypatch, losses, diverged_at, diverging, last_finite
):
    """On a CPU the guard reads every step's losses and stops at the diverging step. On a GPU it
    reads them at log steps (3, 6) and at the end: the same step, loss and last finite loss (the
    mean over the processes) are recorded, and training stops at the next log step instead."""
    on_cpu, cpu_stopped = guard_run(losses, on_gpu=False, monkeypatch=monkeypatch)
    on_gpu, gpu_stopped = guard_run(losses, on_gpu=True, monkeypatch=monkeypatch)
    for guard in (on_cpu, on_gpu):
        assert guard.diverged_at_step == diverged_at
        assert guard.last_finite_loss == last_finite
        assert (math.isnan(guard.diverging_loss) and math.isnan(diverging)) or guard.diverging_loss == diverging
    assert cpu_stopped == [diverged_at]
    next_log_step = math.ceil(diverged_at / LOG_EVERY) * LOG_EVERY
    assert gpu_stopped == ([next_log_step] if next_log_step <= len(losses) else [])
