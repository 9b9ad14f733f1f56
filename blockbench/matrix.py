"""Expand a matrix file into cells and run each cell in its own subprocess.

Every cell is validated before the first one trains. Each cell runs ``blockbench train`` in a
subprocess (Lightning's DDP relaunches the entry script, and a crash in one cell must not take
the matrix down) and writes ``cell.json``, ``config.yaml`` and ``result.json`` under
``results/<matrix>/cells/<task>/<variant>/seed<k>/``. A cell whose result exists for the same
resolved config and the same code is skipped, so rerunning an interrupted matrix continues where
it stopped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .config import (
    ConfigError,
    MatrixConfig,
    RunConfig,
    build_run_config,
    describe_validation_error,
    load_yaml,
    to_yaml,
)
from .layout import (
    CELL_FILE,
    CHECKPOINT_DIR,
    CONFIG_FILE,
    JOBS_DIR,
    MATRIX_FILE,
    RESULT_FILE,
    RUN_FILE,
    TB_DIR,
    TB_VIEWS_FILE,
    TRAIN_LOG,
    cell_directory,
    cell_folder,
    failure_record,
    folder_name,
    write_atomic,
    write_json,
)
from .plan import CellPlan, TimeEstimator, describe_total, plan_cells, time_training_step
from .progress import format_duration
from .provenance import code_fingerprint
from .report import write_report
from .tensorboard import matrix_views, publish_views
from .walltime import MATRIX_PARTS, WallClock

#: axes that identify a cell's row (task) and repetition (seed) rather than its variant
NON_VARIANT_AXES = ("task", "task.name", "seed")


_OUTPUT_LOCK = threading.Lock()


def say(line: str, *, stream=None) -> None:
    """Print one whole line, flushed: cells finishing at once under ``--jobs`` (threads) never mix
    their lines (``print`` writes the text and the newline separately)."""
    stream = stream or sys.stdout
    with _OUTPUT_LOCK:
        stream.write(line + "\n")
        stream.flush()


@dataclass(frozen=True)
class Cell:
    index: int
    run: RunConfig
    task: str
    variant: str
    seed: int
    axes: dict[str, Any]
    #: the cell's TensorBoard run, ``<task>/<short variant>/seed<k>`` (see :func:`tensorboard_run_names`)
    tb_run: str = ""

    @property
    def key(self) -> str:
        """``task/variant/seed<k>``: the cell's readable name in messages."""
        return f"{self.task}/{self.variant}/seed{self.seed}"

    @property
    def folder(self) -> str:
        """The variant's folder name: ``variant`` made one safe path part (see ``layout.folder_name``)."""
        return folder_name(self.variant)

    def directory(self, matrix_dir: Path) -> Path:
        """``cells/<task>/<variant folder>/seed<k>`` (see ``layout.cell_directory``)."""
        return cell_directory(matrix_dir, self.task, self.variant, self.seed)

    @property
    def hparams(self) -> dict[str, Any]:
        """The cell's axes for TensorBoard's HParams table, a task axis shown by its label (``lm``)
        rather than the mapping that configures it (``{name: lm, n_train_tokens: 100000}``)."""
        return {key: self.task if key in ("task", "task.name") else value for key, value in self.axes.items()}


def variant_label(axes: dict[str, Any]) -> str:
    """``{"model.norm_placement": "pre"}`` -> ``norm_placement=pre``; the last key part unless ambiguous."""
    keys = [k for k in axes if k not in NON_VARIANT_AXES]
    return ",".join(f"{name}={axes[key]}" for name, key in zip(axis_names(keys), keys)) or "default"


def axis_names(keys: list[str]) -> list[str]:
    """The names of variant axes in labels: the last key part (``norm_placement``), unless two keys share it."""
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    return leaves if len(set(leaves)) == len(leaves) else keys


def tensorboard_run_names(cells: list[Cell]) -> list[str]:
    """Each cell's TensorBoard run, ``<task>/<short variant>/seed<k>``: the variant's axis values alone
    (``translation/post/seed0``), so that a run list which cuts long names still tells the variants
    apart; the full keys are in the HParams table. A value that does not name itself (a number, a
    bool, None, a mapping) keeps its key (``lm/n_kv_heads=4/seed0``), as does a value that another axis
    takes too; a character that cannot be part of a folder name is percent-encoded as in the cell's
    folder (``layout.folder_name``). Should the short names still collide, every run is named after
    its cell folder (``layout.cell_folder``)."""
    keys = [k for k in (cells[0].axes if cells else {}) if k not in NON_VARIANT_AXES]
    values = {key: [cell.axes[key] for cell in cells] for key in keys}

    def names_itself(key: str) -> bool:
        taken_elsewhere = {str(v) for other in keys if other != key for v in values[other]}
        return all(isinstance(v, str) and v not in taken_elsewhere for v in values[key])

    bare = {key: names_itself(key) for key in keys}
    names = []
    for cell in cells:
        parts = [str(cell.axes[key]) if bare[key] else f"{name}={cell.axes[key]}"
                 for name, key in zip(axis_names(keys), keys)]
        names.append(f"{cell.task}/{folder_name(','.join(parts) or 'default')}/seed{cell.seed}")
    if len(set(names)) < len(names):
        names = [cell_folder(cell.task, cell.variant, cell.seed).as_posix() for cell in cells]
    return names


def load_matrix(path: str | Path) -> tuple[MatrixConfig, list[Cell]]:
    """Read and validate a matrix file and every cell it expands to; raise ConfigError listing all problems."""
    path = Path(path)
    raw = load_yaml(path)
    try:
        matrix = MatrixConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(f"{path}: {line}" for line in describe_validation_error(exc))) from None
    base: dict[str, Any] = {}
    if matrix.base:
        base = load_yaml((path.parent / matrix.base).resolve())

    cells, problems = [], []
    for index, values in enumerate(itertools.product(*matrix.axes.values())):
        axes = dict(zip(matrix.axes, values))
        try:
            # whole sections first ("task: wikitext103"), so that deeper keys ("task.seq_len") refine them
            settings = dict(sorted({**matrix.overrides, **axes}.items(), key=lambda item: item[0].count(".")))
            run = build_run_config(base, settings)
        except ConfigError as exc:
            problems += [f"{path} [cell {axes_text(axes)}]: {line}" for line in str(exc).splitlines()]
            continue
        cells.append(Cell(index, run, run.task.display_name, variant_label(axes), run.seed, axes))
    problems += folder_problems(path, cells)
    if problems:
        # the same mistake usually breaks every cell: report each distinct problem once
        raise ConfigError("\n".join(dict.fromkeys(problems)))
    return matrix, [replace(cell, tb_run=name) for cell, name in zip(cells, tensorboard_run_names(cells))]


#: longest file name most file systems allow (ext4, XFS, APFS: 255 bytes)
MAX_FOLDER_NAME_BYTES = 255


def folder_problems(path: Path, cells: list[Cell]) -> list[str]:
    """What keeps the cells from each having a folder of their own: a cell whose folder another cell
    already has would overwrite its result (e.g. ``task: [lm, {name: lm, seq_len: 64}]``, both
    labelled ``lm``, or a repeated axis value), and a variant folder name can be too long."""
    owners: dict[Path, Cell] = {}
    problems = []
    for cell in cells:
        if len(cell.folder.encode()) > MAX_FOLDER_NAME_BYTES:
            problems.append(
                f"{path} [cell {axes_text(cell.axes)}]: the variant's folder name would have {len(cell.folder.encode())} "
                f"characters, more than file systems allow ({MAX_FOLDER_NAME_BYTES}); use shorter axis values"
            )
        folder = cell.directory(Path())
        owner = owners.setdefault(folder, cell)
        if owner is not cell:
            problems.append(
                f"{path}: cells [{axes_text(owner.axes)}] and [{axes_text(cell.axes)}] would share the folder "
                f"{folder}; give their tasks distinct task.label values or make the axis values distinct"
            )
    return problems


def axes_text(axes: dict[str, Any]) -> str:
    """``task=lm, seed=0``: a cell's axis values in messages."""
    return ", ".join(f"{k}={v}" for k, v in axes.items())


#: variables of a torch.distributed process group (set by Lightning's DDP launcher or torchrun)
DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                   "GROUP_RANK")


@dataclass(frozen=True)
class Slot:
    """Where a cell runs when several run at once: CPU threads and, with GPUs, one device."""

    threads: int | None = None
    device: int | None = None

    def environment(self) -> dict[str, str]:
        # each cell sets up its own process group: nothing of an earlier or enclosing one leaks in
        env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)  # torch's intra-op threads (trainer.num_threads wins)
        if self.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.device)
        return env


def job_slots(jobs: int) -> list[Slot]:
    """``jobs`` slots sharing the machine: the CPU cores split evenly, one GPU each if there are GPUs."""
    if jobs <= 1:
        return [Slot()]
    import torch

    gpus = torch.cuda.device_count()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    return [Slot(threads, i % gpus if gpus else None) for i in range(jobs)]


def resolve_peaks(cells: list[Cell], slot_threads: int | None) -> None:
    """Read, or measure once, the peak FLOP/s that MFU divides by for every compute dtype and thread
    count these cells train with on this machine's CPU, before the first of them starts: each cell
    then reads the same cached figure (:func:`blockbench.perf.peak_flops`), and no probe runs while
    other cells train. A cell's threads are ``trainer.num_threads``, else its slot's (``--jobs``),
    else torch's default, which this process has too (it runs in the same environment).

    Left to the cells themselves (the first probes, any others wait for it and read it): cells with
    ``trainer.peak_tflops``, GPU cells (a probe here would keep a CUDA context, and GPU memory, in
    this process for the whole matrix) and multi-process cells (Lightning sets their threads).
    """
    import torch

    from .perf import compute_dtype, peak_flops

    settings: dict[tuple[Any, int], str] = {}
    for cell in cells:
        trainer = cell.run.trainer
        accelerator = trainer.accelerator if trainer.accelerator != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")
        if trainer.peak_tflops is not None or accelerator != "cpu" or trainer.devices not in (1, "1") or trainer.num_nodes > 1:
            continue
        precision = trainer.resolved_precision(accelerator)
        try:
            dtype = compute_dtype(precision)
        except ValueError:
            continue  # the cell reports it
        settings.setdefault((dtype, trainer.num_threads or slot_threads or torch.get_num_threads()), precision)
    for (_, threads), precision in settings.items():
        peak = peak_flops(None, torch.device("cpu"), precision, threads=threads)
        spread = (peak.probe or {}).get("spread_tflops") or {}
        print(f"MFU peak for {precision} on {threads} thread(s): {peak.tflops:.4g} TFLOP/s (spread {spread.get('min')} to "
              f"{spread.get('max')} over {spread.get('n')} rounds), {peak.source}", flush=True)


def cell_command(cell: Cell, matrix_dir: Path, matrix_file: Path, *, fresh: bool = False) -> list[str]:
    """Write the cell's folder (cell.json, config.yaml) and return the command that trains it.

    An interrupted earlier attempt resumes from its checkpoint unless ``fresh``.
    """
    cell_dir = cell.directory(matrix_dir)
    (cell_dir / RESULT_FILE).unlink(missing_ok=True)
    if fresh:
        shutil.rmtree(cell_dir / CHECKPOINT_DIR, ignore_errors=True)
    write_json(cell_dir / CELL_FILE, {
        "index": cell.index, "task": cell.task, "task_name": cell.run.task.name, "variant": cell.variant,
        "seed": cell.seed, "axes": cell.axes,
        "matrix_file": {"path": str(matrix_file), "sha256": hashlib.sha256(matrix_file.read_bytes()).hexdigest()},
    })
    write_atomic(cell_dir / CONFIG_FILE, to_yaml(cell.run))
    tb_name, tb_version = cell.tb_run.rsplit("/", 1)
    return [
        sys.executable, "-m", "blockbench", "train", str(cell_dir / CONFIG_FILE),
        "--out", str(cell_dir),
        "--tb-dir", str(matrix_dir / TB_DIR),
        "--tb-name", tb_name,
        "--tb-version", tb_version,
        "--tb-scope", cell.task,  # tags name the task: val/<task>/loss (see blockbench.tensorboard)
        "--tb-views", str(matrix_dir / TB_DIR / TB_VIEWS_FILE),
        "--hparams", json.dumps(cell.hparams),
        "--quiet",  # the runner prints the outcome
    ]


def cell_result(cell: Cell, matrix_dir: Path, exit_description: str) -> dict[str, Any]:
    """The result the cell's training process wrote, or a failure record if it died without one."""
    result_path = cell.directory(matrix_dir) / RESULT_FILE
    if result_path.is_file():
        return json.loads(result_path.read_text())
    record = failure_record(cell.task, cell.seed, cell.run.config_hash(), code_fingerprint(),
                            f"the training process {exit_description} without writing a result")
    write_json(result_path, record)
    return record


def run_cell(cell: Cell, matrix_dir: Path, matrix_file: Path, *, slot: Slot = Slot(), log_file: Path | None = None,
             fresh: bool = False) -> dict[str, Any]:
    """Train one cell in a local subprocess; return its result record (a failure record if it died)."""
    command = cell_command(cell, matrix_dir, matrix_file, fresh=fresh)
    if log_file is None:
        process = subprocess.run(command, env=slot.environment())
    else:
        with log_file.open("w") as log:
            process = subprocess.run(command, env=slot.environment(), stdout=log, stderr=subprocess.STDOUT)
    if process.returncode in (130, -signal.SIGINT):  # the cell was interrupted, not broken
        raise KeyboardInterrupt
    return cell_result(cell, matrix_dir, f"exited with code {process.returncode}")


@dataclass(frozen=True)
class ClusterOptions:
    """Where ``--launcher slurm`` submits cells (through submitit): one job per cell."""

    partition: str | None = None
    time_min: int = 240
    account: str | None = None
    cpus_per_task: int = 8


def run_cells_as_jobs(todo: list[tuple[int, Cell]], n_cells: int, matrix_dir: Path, matrix_file: Path, *,
                      cluster: str, options: ClusterOptions, fresh: bool) -> list[str]:
    """Submit each cell as a job with submitit (``cluster``: "slurm", or "local" to run the jobs
    as local processes), wait for all, and return the keys of the failed cells.

    A cell's job has one task per device and ``trainer.num_nodes`` nodes, so Lightning's SLURM
    environment sets up DDP across them; the job runs the same ``blockbench train`` as a local cell,
    so resuming and the summary work the same.
    """
    import submitit

    executor = submitit.AutoExecutor(folder=matrix_dir / JOBS_DIR / "%j", cluster=cluster)
    jobs = []
    for n, cell in todo:
        trainer = cell.run.trainer
        devices = trainer.devices if isinstance(trainer.devices, int) and trainer.devices > 0 else 1
        parameters: dict[str, Any] = {"name": f"{matrix_dir.name}/{cell.key}", "timeout_min": options.time_min,
                                      "nodes": trainer.num_nodes, "tasks_per_node": devices}
        if cluster == "slurm":
            parameters.update(slurm_partition=options.partition, slurm_account=options.account,
                              cpus_per_task=options.cpus_per_task, gpus_per_node=devices if trainer.accelerator != "cpu" else 0)
        executor.update_parameters(**{k: v for k, v in parameters.items() if v is not None})
        command = cell_command(cell, matrix_dir, matrix_file, fresh=fresh)
        job = executor.submit(submitit.helpers.CommandFunction(command, cwd=os.getcwd(), verbose=False))
        say(f"[{n}/{n_cells}] {cell.key}: submitted as job {job.job_id}")
        jobs.append((n, cell, job))
    failed = []
    for n, cell, job in jobs:
        try:
            job.result()
            exit_description = "finished"
        except Exception as error:  # submitit reports the job's failure (exit code, timeout, preemption)
            exit_description = f"failed as job {job.job_id} ({str(error).strip().splitlines()[-1][:200]})"
        result = cell_result(cell, matrix_dir, exit_description)
        if result["status"] == "failed":
            failed.append(cell.key)
        say(f"[{n}/{n_cells}] {cell.key}: {describe_outcome(result)}")
    return failed


def describe_outcome(result: dict[str, Any]) -> str:
    if result["status"] == "ok":
        primary = result["primary_metric"]
        return f"ok, {primary} {result['metrics'][primary]:.4g}"
    if result["status"] == "diverged":
        return f"DIVERGED at step {result['diverged_at_step']} (last finite loss {result['last_finite_loss']})"
    return f"FAILED: {result['error']}"


def run_matrix(path: str | Path, results_root: Path, *, force: bool = False, jobs: int = 1, launcher: str = "local",
               cluster_options: ClusterOptions = ClusterOptions(), reuse_stale: bool = False, dry_run: bool = False,
               from_process_start: bool = False) -> int:
    """Run every cell of the matrix at ``path``: here, ``jobs`` at a time, or as cluster jobs
    (``launcher``: "slurm", or "submitit-local" to try the job path on this machine). Cells with a
    result of the same config and code are reused (see :func:`blockbench.plan.reuse_earlier`; all
    are retrained with ``force``). Write the summary and return the exit code: 1 if a cell failed (a
    diverged cell is a finding, not a failure). ``dry_run``: print each cell's status and the time
    estimate (:func:`print_plan`), write nothing and train nothing. ``from_process_start``: this process
    is the matrix's own (``blockbench matrix``), so its wall time counts from the process start.

    ``matrix_run.json`` records where the wall time went: the matrix's own parts (:data:`MATRIX_PARTS`:
    planning, TensorBoard views, the peak FLOP/s probe, the cells, the report) and each trained cell's
    seconds as seen from here (see :func:`finish_matrix`)."""
    clock = WallClock(from_process_start=from_process_start)
    clock.enter("planning")
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: run at least one cell at a time")
    path = Path(path)
    matrix, cells = load_matrix(path)  # raises before anything is written
    matrix_dir = results_root / matrix.name
    fingerprint = code_fingerprint()
    plans = plan_cells(cells, matrix_dir, fingerprint, force=force, reuse_stale=reuse_stale)
    estimator = TimeEstimator()
    estimator.add_results(cells, matrix_dir)
    if dry_run:
        return print_plan(matrix.name, matrix_dir, plans, estimator, jobs)
    clock.exit("planning")
    matrix_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(matrix_dir / MATRIX_FILE, path.read_text())
    # TensorBoard: the HParams columns (every varied key, every task's metrics, the speed figures) and one
    # chart per task and metric, which every cell's run carries; runs of earlier cells get them if they changed
    tasks = {cell.task: (cell.run.task.metrics, cell.run.task.throughput_unit) for cell in cells}
    with clock.part("tensorboard_views"):
        publish_views(matrix_dir / TB_DIR, matrix_views([cell.hparams for cell in cells], tasks), [cell.tb_run for cell in cells],
                      renamed={cell_folder(cell.task, cell.variant, cell.seed).as_posix(): cell.tb_run for cell in cells})
    say(f"matrix {matrix.name}: {len(cells)} cells -> {matrix_dir}" + (f", {jobs} at a time" if jobs > 1 else "")
        + f"; {describe_total(plans, estimator, jobs)}")
    stale_flag = " --reuse-stale" if reuse_stale else ""  # recorded with the run: its summary may hold stale results
    for plan in plans:
        if plan.detail and (not plan.trains or plan.status != "resumable"):  # resuming is said when the cell starts
            say(f"[{plan.n}/{len(cells)}] {plan.cell.key}: {plan.detail}")
    todo = [(plan.n, plan.cell) for plan in plans if plan.trains]
    if launcher != "local":
        cluster = {"slurm": "slurm", "submitit-local": "local"}[launcher]
        with clock.part("cells"):
            failed = run_cells_as_jobs(todo, len(cells), matrix_dir, path, cluster=cluster, options=cluster_options, fresh=force)
        return finish_matrix(matrix_dir, matrix.name, f"blockbench matrix {path} --launcher {launcher}" + stale_flag, clock,
                             len(todo), failed)
    failed: list[str] = []
    slots = job_slots(jobs)
    with clock.part("peak_probe"):
        resolve_peaks([cell for _, cell in todo], slots[0].threads)  # before any cell starts: one MFU denominator
    free_slots = queue.SimpleQueue()
    for slot in slots:
        free_slots.put(slot)
    progress = MatrixProgress([plan for plan in plans if plan.trains], estimator, jobs)
    cell_times: list[dict[str, Any]] = []  # each trained cell's seconds as seen from here, in the order they ended

    def run(n: int, cell: Cell) -> None:
        slot = free_slots.get()
        try:
            prefix = f"[{n}/{len(cells)}] {cell.key}"
            plan = progress.start(n)
            say(f"{prefix}: training" + (f" ({plan.detail})" if plan.status == "resumable" else ""))
            log_file = cell.directory(matrix_dir) / TRAIN_LOG if jobs > 1 else None
            if log_file:
                log_file.parent.mkdir(parents=True, exist_ok=True)
            result = run_cell(cell, matrix_dir, path, slot=slot, log_file=log_file, fresh=force)
            if result["status"] == "failed":
                failed.append(cell.key)
            took = progress.finish(n, result)  # its process, spawn to exit, and the few file writes around it
            cell_times.append({"key": cell.key, "seconds": round(took, 2)})
            say(f"{prefix}: {describe_outcome(result)} in {format_duration(took)}  |  {progress.describe()}")
        finally:
            free_slots.put(slot)

    pool = ThreadPoolExecutor(max_workers=jobs)
    clock.enter("cells")
    try:
        for future in [pool.submit(run, n, cell) for n, cell in todo]:
            future.result()
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)  # running cells stop on the same Ctrl-C; queued ones never start
        say("\ninterrupted: finished cells are kept, unfinished ones resume from their last checkpoint; "
              "run the same command again to continue", stream=sys.stderr)
        return 130
    pool.shutdown()
    clock.exit("cells")
    command = f"blockbench matrix {path}" + (f" --jobs {jobs}" if jobs > 1 else "") + stale_flag
    return finish_matrix(matrix_dir, matrix.name, command, clock, len(todo), failed, cell_times=cell_times, jobs=jobs)


def finish_matrix(matrix_dir: Path, name: str, command: str, clock: WallClock, trained: int, failed: list[str], *,
                  cell_times: list[dict[str, Any]] | None = None, jobs: int = 1) -> int:
    """Record the run in ``matrix_run.json``, write the summary, and return the exit code (1 if a cell failed).

    The record holds the run's wall time (``wall_time_s``) and where it went (``wall_time_breakdown``:
    :data:`MATRIX_PARTS`, ``startup`` before :func:`run_matrix` and ``other`` the rest), the cells trained
    at once (``jobs``) and, for local cells, each one's seconds from here (``cells``: key, seconds),
    which the summary compares with the training steps the cells recorded. It is written before the
    report (a report that fails leaves the run recorded) and again once the report is rendered, with
    its time, before the report reads it for the summary's header."""
    say(f"matrix {name} finished in {format_duration(clock.elapsed())}")

    def record_run() -> None:
        breakdown = clock.breakdown(MATRIX_PARTS)
        write_json(matrix_dir / RUN_FILE, {"command": command, "wall_time_s": round(breakdown["total"], 1),
                                           "cells_trained": trained, "jobs": jobs, "wall_time_breakdown": breakdown,
                                           "cells": cell_times})

    def report_rendered() -> None:
        clock.exit("report")
        record_run()

    record_run()
    clock.enter("report")
    print(write_report(matrix_dir, before_header=report_rendered))
    if failed:
        print(f"{len(failed)} cell(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


class MatrixProgress:
    """The matrix's progress line: cells done of those to train, the time since the run started and
    an ETA for the rest, from the step times of the cells done so far (their whole process: start-up,
    training, validation), the same task and variant first (see :class:`blockbench.plan.TimeEstimator`).
    Thread-safe: under ``--jobs`` cells start and finish in worker threads."""

    def __init__(self, plans: list[CellPlan], estimator: TimeEstimator, jobs: int):
        self.plans = {plan.n: plan for plan in plans}
        self.estimator = estimator
        self.jobs = jobs
        self.start_time = time.perf_counter()
        self.started: dict[int, float] = {}
        self.finished: set[int] = set()
        self._lock = threading.Lock()

    def start(self, n: int) -> CellPlan:
        with self._lock:
            self.started[n] = time.perf_counter()
        return self.plans[n]

    def finish(self, n: int, result: dict[str, Any]) -> float:
        """Record cell ``n``'s end; return its seconds."""
        with self._lock:
            seconds = time.perf_counter() - self.started[n]
            self.finished.add(n)
            trained = (result.get("steps") or 0) - (result.get("resumed_from_step") or 0)
            self.estimator.add(self.plans[n].cell, seconds, trained)
        return seconds

    def eta(self) -> float | None:
        """Seconds until every cell is done: the estimates of the cells not finished (less the time
        the running ones have had), shared by the ``jobs`` slots; None while nothing is known."""
        now, left = time.perf_counter(), 0.0
        with self._lock:
            for n, plan in self.plans.items():
                if n in self.finished:
                    continue
                estimate = self.estimator.seconds(plan)
                if estimate is None:
                    return None
                left += max(0.0, estimate - (now - self.started[n])) if n in self.started else estimate
        return left / min(self.jobs, max(1, len(self.plans) - len(self.finished)))

    def describe(self) -> str:
        """``3/12 trained, 5:40 elapsed, ETA 17:00``."""
        eta = self.eta()
        text = f"{len(self.finished)}/{len(self.plans)} trained, {format_duration(time.perf_counter() - self.start_time)} elapsed"
        return text + (f", ETA {format_duration(eta)}" if eta is not None and len(self.finished) < len(self.plans) else "")


def print_plan(name: str, matrix_dir: Path, plans: list[CellPlan], estimator: TimeEstimator, jobs: int) -> int:
    """``--dry-run``: every cell validated (load_matrix did), its status and estimated time, the total;
    the cells to train without a measured step time are timed on one batch first. Writes nothing."""
    say(f"matrix {name}: {len(plans)} cells -> {matrix_dir} (dry run: every cell validated, nothing trained)")
    untimed = {(p.cell.task, p.cell.variant) for p in plans if p.trains and estimator.per_step(p.cell, guess=False) is None}
    if untimed:
        say(f"timing a training step of {len(untimed)} variant(s) with no earlier results here...")
        for problem in estimator.time_steps(plans, time_training_step):
            say(f"  {problem}")
    width = max(len(f"[{plan.n}/{len(plans)}] {plan.cell.key}") for plan in plans)
    for plan in plans:
        seconds = estimator.seconds(plan)
        time_text = "" if not plan.trains else ("~?" if seconds is None else f"~{format_duration(seconds)}")
        detail = f"  ({plan.detail})" if plan.detail else ""
        say(f"{f'[{plan.n}/{len(plans)}] {plan.cell.key}':<{width}}  {plan.status:<13} {time_text:>9}{detail}")
    say(describe_total(plans, estimator, jobs))
    return 0
