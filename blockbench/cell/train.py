"""Train one cell: build the task from a RunConfig, fit with Lightning, write ``result.json``."""

from __future__ import annotations

import math
import shutil
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_only

from ..config import RunConfig, TrainerConfig, to_yaml
from ..progress import StepProgress, quiet_lightning
from ..provenance import code_fingerprint, machine_description, peak_memory_mb, provenance
from ..store.checkpoints import Resume
from ..store.checkpoints import resumable_checkpoint as inspect_checkpoint
from ..store.layout import CHECKPOINT_DIR, CONFIG_FILE, RESULT_FILE, write_atomic
from ..store.record import RECORD_VERSION, CellRecord, Hardware, write_record
from ..tensorboard.views import Views
from ..tensorboard.writer import CellLogger, log_cell_hparams, log_views
from ..walltime import CELL_PARTS, WallClock
from .callbacks import DivergenceGuard, LossCurve, PerformanceMonitor, ResumeState, StepCheckpoint, ValidationHistory
from .runtime import attention_calls, data_loading, lightning_determinism, machine_settings


def resumable_checkpoint(
    checkpoints: Path, config_hash: str, fingerprint: str, hardware: Hardware, *, delete_stale: bool = True
) -> Resume:
    """``last.ckpt`` of an interrupted run of this same config and code on this ``hardware``, with its
    step, as the store reads it (:func:`blockbench.store.checkpoints.resumable_checkpoint`). Any other
    checkpoint is deleted (if ``delete_stale``) and not resumed: one that cannot be loaded (the ``Resume``
    says why), or one of another config or other code (the cell changed since), or made on another kind
    of device or at another precision."""
    resume = inspect_checkpoint(checkpoints, config_hash, fingerprint, hardware)
    if delete_stale and (resume.error or resume.note):
        shutil.rmtree(checkpoints, ignore_errors=True)
    return resume


def train(run: RunConfig, out_dir: Path, **kwargs: Any) -> CellRecord:
    """Train ``run`` under its machine's settings (TF32 on a GPU, the deterministic switch; see
    :func:`blockbench.cell.runtime.machine_settings`), restored after; the arguments are :func:`train_cell`'s."""
    accelerator = resolved_accelerator(run.trainer.accelerator)
    with machine_settings(run.trainer, accelerator, attention_calls(run)):
        return train_cell(run, out_dir, accelerator=accelerator, **kwargs)


def resolved_accelerator(accelerator: str) -> str:
    """``trainer.accelerator`` with ``auto`` made ``gpu`` or ``cpu`` (whether CUDA has a device)."""
    return accelerator if accelerator != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")


def resolved_hardware(cfg: TrainerConfig, accelerator: str) -> Hardware:
    """The device kind and precision a run of ``cfg`` trains at on ``accelerator`` (resolved) here."""
    return Hardware.of(accelerator, cfg.resolved_precision(accelerator), cuda=torch.cuda.is_available())


def train_cell(
    run: RunConfig,
    out_dir: Path,
    *,
    tb_dir: Path,
    tb_name: str,
    tb_version: str,
    hparams: dict[str, Any] | None = None,
    tb_scope: str | None = None,
    tb_views: Views | None = None,
    extra_callbacks: Sequence[L.Callback] = (),
    progress_every: int | None = None,
    from_process_start: bool = False,
    accelerator: str,
) -> CellRecord:
    """Train ``run`` on ``accelerator`` (resolved: not ``auto``) and return (and write to
    ``out_dir/result.json``) its result record;
    ``hparams`` (the cell's varied keys) go to TensorBoard's HParams dashboard with the final metrics;
    ``tb_scope`` (a matrix cell's task) names the TensorBoard tags (``1_val/<scope>/loss``), and
    ``tb_views`` (the matrix's HParams columns and charts) start the run (see :mod:`blockbench.tensorboard.writer`);
    ``extra_callbacks`` join the runner's own (e.g. a timer in ``benchmarks/lightning_overhead.py``);
    ``progress_every``: the steps between progress lines when stdout is not a terminal (see
    :class:`blockbench.progress.StepProgress`); ``from_process_start``: this process is the run's own
    (``blockbench train``), so its ``wall_time_breakdown`` counts from the process start (see
    :class:`blockbench.walltime.WallClock`).

    An interrupted run of the same config and code resumes from ``out_dir/checkpoints/last.ckpt``; a run
    whose loss diverges is stopped and recorded with status ``diverged``.
    """
    clock = WallClock(from_process_start=from_process_start)  # first: what came before is the start-up
    clock.enter("setup")  # until the fit (the build and the data inside it count as theirs)
    task_cfg, cfg = run.task, run.trainer
    is_rank_zero = rank_zero_only.rank == 0  # known before the Trainer: launched processes carry their rank
    out_dir.mkdir(parents=True, exist_ok=True)
    if is_rank_zero:
        write_atomic(out_dir / CONFIG_FILE, to_yaml(run))
    if run.trainer.num_threads:
        torch.set_num_threads(run.trainer.num_threads)

    checkpoints = out_dir / CHECKPOINT_DIR
    fingerprint = code_fingerprint()
    hardware = resolved_hardware(cfg, accelerator)
    resume = resumable_checkpoint(checkpoints, run.config_hash(), fingerprint, hardware, delete_stale=is_rank_zero)
    resume_from, resumed_step = resume.checkpoint, resume.step
    if is_rank_zero and (resume.error or resume.note):
        print(f"blockbench: {resume.error or resume.note}", file=sys.stderr, flush=True)
    perf = PerformanceMonitor(task_cfg.throughput_unit, peak_tflops=cfg.peak_tflops, clock=clock)
    history = ValidationHistory([m.name for m in task_cfg.metrics])
    guard = DivergenceGuard(cfg.divergence_threshold)
    # perf before history: its peak FLOP/s probe at the start of training is not training time
    progress = StepProgress(f"val/{task_cfg.metrics[0].name}", every_n_steps=progress_every)
    callbacks = [
        LearningRateMonitor(logging_interval="step"),
        perf,
        history,
        guard,
        ResumeState(run.config_hash(), fingerprint, hardware),
        progress,
    ]
    # after perf (its step ends first) and before the checkpoints (which then hold the step's point)
    curve = LossCurve(cfg.curve_interval, cfg.curve_items, clock) if cfg.curve_interval else None
    callbacks += [curve] if curve else []
    callbacks += list(extra_callbacks)
    checkpoint_interval = cfg.checkpoint_interval(accelerator)
    if checkpoint_interval:
        callbacks.append(StepCheckpoint(checkpoints, checkpoint_interval))
    if not resume_from and is_rank_zero:  # a fresh run: TensorBoard would keep the hparams of an earlier run here
        shutil.rmtree(Path(tb_dir) / tb_name / tb_version, ignore_errors=True)
    # purge_step: TensorBoard drops the points a killed run logged after its last checkpoint
    quiet_lightning()
    logger = CellLogger(tb_dir, tb_name, tb_version, scope=tb_scope, purge_step=resumed_step or None)
    if tb_views is not None:  # again after a resumption: the same views, and a run deleted meanwhile still gets them
        log_views(logger, tb_views)
    trainer = lightning_trainer(cfg, accelerator, out_dir, logger, callbacks, perf)
    per_device_batch = cfg.per_device_batch_size(trainer.world_size)
    if trainer.is_global_zero and (trainer.world_size > 1 or cfg.accumulate_grad_batches > 1):
        print(
            f"batch: global {cfg.batch_size} = {trainer.world_size} process(es) x {per_device_batch} per process "
            f"x {cfg.accumulate_grad_batches} accumulation step(s)",
            flush=True,
        )
    L.seed_everything(run.seed, workers=True, verbose=False)
    with clock.part("build"):  # the real-data tasks prepare their data here: the model's vocabulary depends on it
        module, datamodule = task_cfg.build(
            run.resolved_model(), run.optimizer, max_steps=cfg.max_steps, batch_size=per_device_batch, seed=run.seed
        )
    datamodule.load_for(**data_loading(cfg, accelerator, trainer.num_devices))
    if resume_from and trainer.is_global_zero:
        print(f"resuming from {resume_from} (step {resumed_step})", flush=True)
    fit(trainer, module, datamodule, resume_from, clock)

    record = outcome(run, fingerprint, guard, module, datamodule, trainer)
    result = cell_record(
        run, record, module, datamodule, trainer, perf, history, curve, resume, checkpoint_interval, per_device_batch
    )
    if trainer.is_global_zero:
        final = {f"val/{name}": value for name, value in result.metrics.items()}
        final |= result.final_figures(task_cfg.throughput_unit)
        log_cell_hparams(
            logger,
            hparams or {},
            final,
            primary=f"val/{task_cfg.metrics[0].name}",
            status=result.status,
            step=trainer.global_step,
        )
        logger.close()
    # this process's time (a resumed run: since it resumed) until the result is written
    clock.move("train_steps", "first_step", perf.first_step_excess())
    result.wall_time_breakdown = clock.breakdown(CELL_PARTS, resumed=bool(resumed_step))
    if trainer.is_global_zero:
        write_record(out_dir / RESULT_FILE, result)
        shutil.rmtree(checkpoints, ignore_errors=True)  # the result is written: nothing left to resume
    return result


def fit(trainer: L.Trainer, module: Any, datamodule: Any, resume_from: Path | None, clock: WallClock) -> None:
    """``trainer.fit``, resumed from ``resume_from`` if given; Ctrl-C raises KeyboardInterrupt (an
    unfinished run has no result: it resumes next time). Its wall time goes to ``clock``: ``fit_setup``
    until training starts (then the parts :class:`PerformanceMonitor` marks), ``teardown`` from the end
    of training on (to the result)."""
    clock.exit("setup")
    clock.enter("fit_setup")
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    except SystemExit:  # Lightning shuts down gracefully on Ctrl-C, then exits with code 1
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise
    if trainer.interrupted:
        raise KeyboardInterrupt
    if not clock.is_open("teardown"):  # a fit that ended without on_train_end
        clock.exit("fit_setup")
        clock.enter("teardown")


def lightning_trainer(
    cfg: TrainerConfig,
    accelerator: str,
    out_dir: Path,
    logger: CellLogger,
    callbacks: list[L.Callback],
    perf: PerformanceMonitor,
) -> L.Trainer:
    """The Lightning ``Trainer`` of a cell: ``cfg``'s steps, validation interval, clipping, devices and
    precision on ``accelerator``, the cell's ``logger`` and ``callbacks``, ``perf``'s profiler timing the
    waits for batches; no checkpointing or sampler of Lightning's own (the callbacks and the datamodules
    do both)."""
    return L.Trainer(
        max_steps=cfg.max_steps,
        val_check_interval=cfg.val_every_n_steps,
        check_val_every_n_epoch=None,  # validate every val_every_n_steps steps, across epochs
        num_sanity_val_steps=0,
        log_every_n_steps=cfg.log_every_n_steps,
        gradient_clip_val=cfg.grad_clip,
        accumulate_grad_batches=cfg.accumulate_grad_batches,
        accelerator=accelerator,
        devices=cfg.devices,
        num_nodes=cfg.num_nodes,
        strategy=cfg.strategy,
        precision=cfg.resolved_precision(accelerator),
        use_distributed_sampler=False,  # the datamodules shard training and validation data themselves
        logger=logger,
        callbacks=callbacks,
        profiler=perf.data_wait,  # times the loop's waits for training batches, and the parts of the wall time
        enable_checkpointing=False,  # no ModelCheckpoint: StepCheckpoint writes the checkpoints
        enable_model_summary=False,
        default_root_dir=str(out_dir),
        **lightning_determinism(cfg),
    )


def outcome(
    run: RunConfig, fingerprint: str, guard: DivergenceGuard, module: Any, datamodule: Any, trainer: L.Trainer
) -> dict[str, Any]:
    """How a finished cell ended, the first fields of its record: diverged (where and at which loss), or
    ok with its final metrics (validated once more where the last step was not a validation step), the
    trivial baselines and whether the headline metric beat its baseline (the cell learned)."""
    record: dict[str, Any] = {
        "task": run.task.name,
        "seed": run.seed,
        "config_hash": run.config_hash(),
        "code_fingerprint": fingerprint,
    }
    if guard.diverged:
        loss = guard.diverging_loss
        record = {
            "status": "diverged",
            **record,
            "diverged_at_step": guard.diverged_at_step,
            "diverging_loss": loss if math.isfinite(loss) else str(loss),
            "last_finite_loss": guard.last_finite_loss,
        }
    else:
        if module.last_validated_step != trainer.global_step:  # the final step was not a validation step
            trainer.validate(module, datamodule=datamodule, verbose=False)
        metrics = {m.name: float(trainer.callback_metrics[f"val/{m.name}"]) for m in run.task.metrics}
        baselines = datamodule.baselines()
        headline = run.task.metrics[0]
        trivial = baselines.get(headline.name)
        record = {
            "status": "ok",
            **record,
            "metrics": metrics,
            "primary_metric": headline.name,
            "baselines": baselines,
            # no better than the trivial baseline on the headline metric: the run did not learn
            "learned": None if trivial is None else headline.beats(metrics[headline.name], trivial),
        }
    return record


def cell_record(
    run: RunConfig,
    record: dict[str, Any],
    module: Any,
    datamodule: Any,
    trainer: L.Trainer,
    perf: PerformanceMonitor,
    history: ValidationHistory,
    curve: LossCurve | None,
    resume: Resume,
    checkpoint_interval: int | None,
    per_device_batch: int,
) -> CellRecord:
    """A finished cell's typed record: its ``outcome`` (``record``) with the data, steps, resumption,
    wall time, parameters, throughput and performance, batch, precision and runtime settings, memory,
    machine, the task's extras, the validation history, the loss curve and the provenance. The wall
    time's breakdown is left unset, to be set just before the record is written; a field of the wrong
    type fails here, not in a reader."""
    fields = {
        "record_version": RECORD_VERSION,
        **record,
        "data": datamodule.data_summary(),
        "steps": trainer.global_step,
        "resumed_from_step": resume.step or None,
        "resume_error": resume.error,  # a checkpoint that could not be loaded: this run started over
        "wall_time_s": round(history.elapsed(), 2),
        "wall_time_breakdown": None,  # set last, just before the result is written
        "parameters": module.n_parameters,
        "throughput": round(perf.per_second, 1),  # all processes together
        "throughput_per_process": round(perf.per_second_per_process, 1),
        "throughput_unit": f"{run.task.throughput_unit}/s",
        "performance": perf.summary(),  # this run's steps (a resumed run: those since the resume)
        "batch": {
            "global": run.trainer.batch_size,
            "per_process": per_device_batch,
            "processes": trainer.world_size,
            "accumulate_grad_batches": run.trainer.accumulate_grad_batches,
        },
        "precision": trainer.precision,
        "runtime": {
            "accelerator": trainer.strategy.root_device.type,
            "deterministic": run.trainer.deterministic,
            "matmul_precision": torch.get_float32_matmul_precision(),
            "adamw": module.adamw_implementation,
            "num_workers": datamodule.num_workers,  # an image task's own task.num_workers where set
            "pin_memory": datamodule.pin_memory,
            "checkpoint_every_n_steps": checkpoint_interval,
            # on a GPU: whether SDPA could use cuDNN's kernel (blockbench.cell.runtime.cudnn_attention_pays)
            **(
                {"cudnn_attention": torch.backends.cuda.cudnn_sdp_enabled()}
                if trainer.strategy.root_device.type == "cuda"
                else {}
            ),
        },
        "peak_memory": peak_memory_mb(),
        "machine": machine_description(),
        **module.result_extras(),
        "history": history.history,
        "curve": curve.record() if curve else None,
        "provenance": provenance(),
    }
    return CellRecord.model_validate(fields)


def error_record(run: RunConfig, error: BaseException) -> CellRecord:
    """The failure record of a run that raised ``error`` (call it while handling the error: it
    records the traceback)."""
    return CellRecord.failure(
        run.task.name,
        run.seed,
        run.config_hash(),
        code_fingerprint(),
        f"{type(error).__name__}: {error}",
        traceback.format_exc(),
    )
