"""The processes that train a matrix's cells: each cell's folder and command line, the slots that
``--jobs`` cells share (threads, a GPU each), one cell trained in a process of its own (forked from
the preloaded server, ``blockbench.matrix.launch``, or a subprocess for DDP) and read back as its
record, and ``--launcher slurm``'s cluster jobs (submitit).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError, RunConfig, to_yaml
from ..lifeline import RUNNER_ENV
from ..prereg import PlanBook
from ..provenance import code_fingerprint
from ..store.files import prepare_cell, write_cell_json
from ..store.layout import CONFIG_FILE, JOBS_DIR, RESULT_FILE, TB_VIEWS_FILE
from ..store.record import CellRecord, read_record, write_load, write_record
from .devices import VISIBLE, auto_jobs, packed_per_gpu, visible_devices
from .expand import Cell
from .launch import forkserver_available, run_forked, run_subprocess, stopping
from .load import LoadMeter
from .say import say

#: variables of a torch.distributed process group (set by Lightning's DDP launcher or torchrun)
DISTRIBUTED_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
)


@dataclass(frozen=True)
class Slot:
    """Where a cell runs when several run at once: its share of the CPU threads and, with GPUs, the
    devices it was handed (``blockbench.matrix.devices``; None: those of the runner)."""

    threads: int | None = None
    devices: tuple[str, ...] | None = None

    def environment(self) -> dict[str, str]:
        # each cell sets up its own process group: nothing of an earlier or enclosing one leaks in
        env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)  # torch's intra-op threads (trainer.num_threads wins)
        if self.devices is not None:  # exactly the cell's devices: Lightning numbers them from 0
            env[VISIBLE] = ",".join(self.devices)
        return env


#: ``--jobs auto``: as many cells at once as the machine runs best (:func:`resolve_jobs`)
AUTO_JOBS = "auto"


def resolve_jobs(jobs: int | str, n_cells: int, needs: Sequence[int] = (), per_gpu: int = 1) -> int:
    """How many cells run at once. A number is taken as it is; ``auto`` (the default) runs as many whole
    cells as fit on the job's GPUs (``needs``: each cell's devices, :func:`gpu_devices`; one each if not
    given), ``per_gpu`` single-GPU cells on each (:func:`gpu_packing`), else one per CPU core (at most
    one per cell of the matrix), the cores split evenly between them (:func:`job_slots`).

    Why one thread per cell: the cells here are small, and a small model's step gains little from a
    second intra-op thread, while a second cell gains all of its core (measured: ``results/jobs.md``).
    The choice depends on the machine and on the matrix's size only, never on how many of its cells are
    left to train, so that a resumed matrix trains its remaining cells on the same thread count as the
    first run: the thread count can change a result's last bits."""
    if jobs == AUTO_JOBS:
        gpus = len(gpu_devices())
        return max(1, min(auto_jobs(list(needs) or [1 if gpus else 0], gpus, cpu_cores(), per_gpu), n_cells))
    if not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs {jobs}: give a number of cells to run at once (1 or more), or auto")
    return jobs


def cpu_cores() -> int:
    """The CPUs this process may run on (its affinity, as SLURM or taskset set it), else all of them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def gpu_devices() -> list[str]:
    """The GPUs this job may hand to its cells: its own ``CUDA_VISIBLE_DEVICES`` list, else every device."""
    import torch

    return visible_devices(os.environ, torch.cuda.device_count())


def gpu_free_bytes(count: int) -> list[int]:
    """Free memory of each of the first ``count`` GPUs this process sees (``torch.cuda.mem_get_info``:
    what other processes hold is not free). It creates a CUDA context on each, in this process only:
    the cells fork from the cell server, which has none."""
    import torch

    return [torch.cuda.mem_get_info(index)[0] for index in range(count)]


def gpu_packing(jobs: int | str, cells: Sequence[Cell], needs: Sequence[int], n_gpus: int, matrix_dir: Path) -> int:
    """How many single-GPU cells run on one GPU at once (:func:`blockbench.matrix.devices.packed_per_gpu`):
    1 without GPUs or with a cell of several; else from the cells' expected peaks of memory
    (:func:`blockbench.matrix.memory.cell_peaks`) and the GPUs' free memory (:func:`gpu_free_bytes`),
    with ``--jobs auto`` as many as the CPU cores feed, with ``--jobs N`` the N cells spread over the GPUs."""
    from .memory import cell_peaks

    if not n_gpus or not needs or set(needs) != {1}:
        return 1
    explicit = jobs if isinstance(jobs, int) and jobs > 0 else None  # a wrong --jobs fails in resolve_jobs
    if explicit == 1:
        return 1
    return packed_per_gpu(needs, cell_peaks(cells, matrix_dir), gpu_free_bytes(n_gpus), cpu_cores(), explicit)


def job_slots(jobs: int) -> list[Slot]:
    """``jobs`` slots sharing the machine's CPU cores evenly (the GPUs go to each cell as it starts:
    :class:`blockbench.matrix.devices.DevicePool`)."""
    if jobs <= 1:
        return [Slot()]
    return [Slot(max(1, cpu_cores() // jobs)) for _ in range(jobs)]


def cell_file(cell: Cell, matrix_dir: Path, matrix_file: Path) -> dict[str, Any]:
    """The cell's ``cell.json``: what the report groups it by (task, variant, seed), its axes and the
    matrix file; in a matrix with ``tune:`` also its phase and tuned values; the hash of the
    analysis plan in force as the cell starts (``plan.json``'s current, see ``blockbench.prereg``);
    and its TensorBoard run, which the rebuild (``blockbench report --tensorboard``) names it by: the
    runner names runs from every cell the matrix file may train, which the records alone do not show."""
    tuning = {"phase": cell.phase, "tuned": cell.tuned} if cell.phase else {}
    tb_run = {"tb_run": {"logdir": cell.tb_run.logdir, "name": cell.tb_run.name}} if cell.tb_run else {}
    plan = PlanBook.load(matrix_dir).current
    return {
        "index": cell.index,
        "task": cell.task,
        "task_name": cell.run.task.name,
        "variant": cell.variant,
        "seed": cell.seed,
        "axes": cell.axes,
        **tuning,
        "matrix_file": {"path": str(matrix_file), "sha256": hashlib.sha256(matrix_file.read_bytes()).hexdigest()},
        **({"plan": plan} if plan else {}),
        **tb_run,
    }


def write_cell_file(cell: Cell, matrix_dir: Path, matrix_file: Path) -> None:
    """Write the cell's ``cell.json`` (:func:`cell_file`) into its folder."""
    write_cell_json(cell.directory(matrix_dir), cell_file(cell, matrix_dir, matrix_file))


def cell_command(cell: Cell, matrix_dir: Path, matrix_file: Path, *, fresh: bool = False) -> list[str]:
    """Write the cell's folder (cell.json, config.yaml) and return the command that trains it.

    An interrupted earlier attempt resumes from its checkpoint unless ``fresh``.
    """
    cell_dir = cell.directory(matrix_dir)
    prepare_cell(cell_dir, cell_file(cell, matrix_dir, matrix_file), to_yaml(cell.run), fresh=fresh)
    tb_run = cell.tb
    tb_name, tb_version = tb_run.writer_args  # the run tb/<task>/<variant>/seed<k>: <variant>/seed<k> in tb/<task>
    return [
        sys.executable,
        "-m",
        "blockbench",
        "train",
        str(cell_dir / CONFIG_FILE),
        "--out",
        str(cell_dir),
        "--tb-dir",
        str(matrix_dir / tb_run.logdir),  # the log folder a reader opens, which shows the run as tb_name/tb_version
        "--tb-name",
        tb_name,
        "--tb-version",
        tb_version,
        "--tb-scope",
        cell.task,  # tags name the task: val/<task>/loss (see blockbench.tensorboard.writer)
        "--tb-views",
        str(matrix_dir / tb_run.logdir / TB_VIEWS_FILE),  # the views of this log folder (its task's)
        "--hparams",
        json.dumps(cell.hparams),
        "--quiet",  # the runner prints the outcome
    ]


def cell_result(cell: Cell, matrix_dir: Path, exit_description: str) -> CellRecord:
    """The result the cell's training process wrote, or a failure record if it died without one."""
    result_path = cell.directory(matrix_dir) / RESULT_FILE
    record = read_record(result_path)
    if record is not None:
        return record
    record = CellRecord.failure(
        cell.task,
        cell.seed,
        cell.run.config_hash(),
        code_fingerprint(),
        f"the training process {exit_description} without writing a result",
    )
    write_record(result_path, record)
    return record


def run_cell(
    cell: Cell,
    matrix_dir: Path,
    matrix_file: Path,
    *,
    slot: Slot = Slot(),
    log_file: Path | None = None,
    fresh: bool = False,
) -> CellRecord:
    """Train one cell in a process of its own; return its result record (a failure record if it died).

    A single-process cell is forked from a server that has the imports done (``blockbench.matrix.launch``:
    10-15 s less per cell); a multi-process (DDP) cell runs as a subprocess, which Lightning's launcher
    can relaunch. While it runs, a :class:`blockbench.matrix.load.LoadMeter` measures how busy other
    processes kept the machine, and its ``load.json`` goes next to the result: the report compares the
    two sides' load before it states a step-time ratio."""
    command = cell_command(cell, matrix_dir, matrix_file, fresh=fresh)
    environment = {**slot.environment(), RUNNER_ENV: str(os.getpid())}  # the cell dies with this process
    meter = LoadMeter()
    if forks(cell.run):
        returncode = run_forked(command[1:], environment, log_file, meter)  # "-m blockbench train ..."
    else:
        returncode = run_subprocess(command, environment, log_file, meter)
    # interrupted (Ctrl-C, SIGTERM to it or to the runner), not broken: no failure record, it resumes next time
    if returncode in (130, -signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGTERM) or stopping():
        raise KeyboardInterrupt
    load = meter.load()
    if load is not None:
        write_load(cell.directory(matrix_dir), load)
    return cell_result(cell, matrix_dir, f"exited with code {returncode}")


def forks(run: RunConfig) -> bool:
    """Whether the cell starts forked from the preloaded server: one process on one machine (a DDP
    cell's launcher relaunches the entry script, which needs an interpreter of its own), and a
    platform with the forkserver start method."""
    return run.trainer.devices in (1, "1") and run.trainer.num_nodes == 1 and forkserver_available()


@dataclass(frozen=True)
class ClusterOptions:
    """Where ``--launcher slurm`` submits cells (through submitit): one job per cell."""

    partition: str | None = None
    time_min: int = 240
    account: str | None = None
    cpus_per_task: int = 8


def run_cells_as_jobs(
    todo: list[tuple[int, Cell]],
    n_cells: int,
    matrix_dir: Path,
    matrix_file: Path,
    *,
    cluster: str,
    options: ClusterOptions,
    fresh: bool,
) -> list[str]:
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
        parameters: dict[str, Any] = {
            "name": f"{matrix_dir.name}/{cell.key}",
            "timeout_min": options.time_min,
            "nodes": trainer.num_nodes,
            "tasks_per_node": devices,
        }
        if cluster == "slurm":
            parameters.update(
                slurm_partition=options.partition,
                slurm_account=options.account,
                cpus_per_task=options.cpus_per_task,
                gpus_per_node=devices if trainer.accelerator != "cpu" else 0,
            )
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
        if result.status == "failed":
            failed.append(cell.key)
        say(f"[{n}/{n_cells}] {cell.key}: {describe_outcome(result)}")
    return failed


def describe_outcome(result: CellRecord) -> str:
    """How a cell ended, for its progress line: ``ok, perplexity 10.93``, ``DIVERGED at step 12 (...)``,
    ``FAILED: ...``. A cell that finished no better than its task's trivial baseline says so as what it
    is, a result (a short budget, a variant that trains slowly), in words that do not read as a crash."""
    if result.status == "ok":
        primary = result.primary_metric
        text = f"ok, {primary} {result.metrics[primary]:.4g}"
        if result.did_not_learn:
            trivial = result.baselines.get(primary, float("nan"))
            text += f", no better than the trivial baseline's {trivial:.4g}: it did not learn (a result, not an error)"
        return text
    if result.status == "diverged":
        return f"DIVERGED at step {result.diverged_at_step} (last finite loss {result.last_finite_loss})"
    return f"FAILED: {result.error}"
