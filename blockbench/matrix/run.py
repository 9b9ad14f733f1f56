"""Expand a matrix file into cells and run each cell in its own process.

Every cell is validated before the first one trains. Each cell runs ``blockbench train`` in a
process of its own (a crash in one cell must not take the matrix down): forked from a server that
has done the imports once (``blockbench.launch``), or for a DDP cell, whose launcher relaunches the
entry script, a subprocess. It writes ``cell.json``, ``config.yaml`` and ``result.json`` under
``results/<matrix>/cells/<task>/<variant>/seed<k>/``. A cell whose result exists for the same
resolved config and the same code is skipped, so rerunning an interrupted matrix continues where
it stopped. A matrix with ``tune:`` first trains its tuning cells (``results/<matrix>/tune/cells/``),
then the reported cells at the values they chose (see ``blockbench.tuning``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import queue
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..config import ConfigError, MatrixConfig, RunConfig, build_run_config, describe_validation_error, load_yaml, to_yaml
from ..layout import CELL_FILE, CHECKPOINT_DIR, CONFIG_FILE, INDEX_FILE, JOBS_DIR, MATRIX_FILE, RESULT_FILE, RUN_FILE, TB_DIR, TB_VIEWS_FILE, TRAIN_LOG, TUNE_DIR, TUNE_FILE, cell_directory, cell_folder, folder_name, tuning_cell_directory, write_atomic, write_json
from ..record import CellRecord, read_record, write_record
from .launch import forkserver_available, run_forked, run_subprocess, start_server, stop_cells_on_sigterm, stopping
from .plan import AFTER_TUNING, NO_CHOICE, CellPlan, TimeEstimator, describe_total, earlier_record, plan_cell, plan_cells, time_training_step
from ..progress import format_duration
from ..provenance import code_fingerprint
from ..report.summary import write_index, write_report
from ..cell.tensorboard import matrix_views, publish_views
from .tuning import REPORT, TUNE, Tuning, candidate, tuning_record
from ..record import write_tuning
from ..walltime import MATRIX_PARTS, WallClock

#: axes that identify a cell's row (task) and repetition (seed) rather than its variant
NON_VARIANT_AXES = ("task", "task.name", "seed")
#: the HParams column that says whether a run tuned or is reported (a matrix with ``tune:``)
PHASE_HPARAM = "phase"


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
    #: in a matrix with ``tune:``, ``tune`` for a tuning cell and ``report`` for a reported one; else None
    phase: str | None = None
    #: the tuned keys' values the cell trains with: a tuning cell's candidate, a reported cell's choice
    #: (empty until tuning has chosen)
    tuned: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """``task/variant/seed<k>``: the cell's readable name in messages; a tuning cell's is
        ``tune/task/variant/<candidate>/seed<k>``."""
        if self.phase == TUNE:
            return f"{TUNE_DIR}/{self.task}/{self.variant}/{self.candidate}/seed{self.seed}"
        return f"{self.task}/{self.variant}/seed{self.seed}"

    @property
    def candidate(self) -> str:
        """The tuned values as a label, ``lr=0.001`` (see :func:`candidate_label`)."""
        return candidate_label(self.tuned)

    @property
    def folder(self) -> str:
        """The variant's folder name: ``variant`` made one safe path part (see ``layout.folder_name``)."""
        return folder_name(self.variant)

    def directory(self, matrix_dir: Path) -> Path:
        """``cells/<task>/<variant folder>/seed<k>`` (see ``layout.cell_directory``); a tuning cell's
        ``tune/cells/<task>/<variant folder>/<candidate folder>/seed<k>``."""
        if self.phase == TUNE:
            return tuning_cell_directory(matrix_dir, self.task, self.variant, self.candidate, self.seed)
        return cell_directory(matrix_dir, self.task, self.variant, self.seed)

    @property
    def hparams(self) -> dict[str, Any]:
        """The cell's axes for TensorBoard's HParams table, a task axis shown by its label (``lm``)
        rather than the mapping that configures it (``{name: lm, n_train_tokens: 100000}``); in a
        matrix with ``tune:``, also the tuned values and the phase."""
        hparams = {key: self.task if key in ("task", "task.name") else value for key, value in self.axes.items()}
        return {**hparams, **self.tuned, **({PHASE_HPARAM: self.phase} if self.phase else {})}


def candidate_label(tuned: dict[str, Any]) -> str:
    """``{"optimizer.lr": 0.001}`` -> ``lr=0.001``: tuned values named as variants are (:func:`axis_names`)."""
    keys = list(tuned)
    return ",".join(f"{name}={tuned[key]}" for name, key in zip(axis_names(keys), keys))


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
    """Read and validate a matrix file and every cell it expands to (its tuning cells too, see
    :func:`expand_matrix`); return the matrix and its reported cells; raise ConfigError listing all problems."""
    expansion = expand_matrix(path)
    return expansion.matrix, expansion.cells


@dataclass(frozen=True)
class Expansion:
    """A matrix file, read and validated: its reported cells (the axes' product), its tuning cells
    (``tune:``, see :mod:`blockbench.tuning`) and what builds a cell's config."""

    path: Path
    matrix: MatrixConfig
    base: dict[str, Any]
    cells: list[Cell] = field(default_factory=list)
    tuning: list[Cell] = field(default_factory=list)

    def run_config(self, axes: dict[str, Any], extra: dict[str, Any] | None = None) -> RunConfig:
        """The config of the cell at ``axes`` with ``extra`` keys set (tuned values, a tuning seed);
        raises ConfigError."""
        # whole sections first ("task: wikitext103"), so that deeper keys ("task.seq_len") refine them
        settings = {**self.matrix.overrides, **axes, **(extra or {})}
        return build_run_config(self.base, dict(sorted(settings.items(), key=lambda item: item[0].count("."))))

    def at_choice(self, cell: Cell, chosen: dict[str, Any]) -> Cell:
        """The reported ``cell`` with the values tuning ``chosen`` set in its config (and so in its hash)."""
        return replace(cell, run=self.run_config(cell.axes, chosen), tuned=dict(chosen))


def expand_matrix(path: str | Path) -> Expansion:
    """Read and validate a matrix file, every reported cell and every tuning cell; raise ConfigError
    listing all problems, before anything is written."""
    path = Path(path)
    raw = load_yaml(path)
    try:
        matrix = MatrixConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(f"{path}: {line}" for line in describe_validation_error(exc))) from None
    base: dict[str, Any] = {}
    if matrix.base:
        base = load_yaml((path.parent / matrix.base).resolve())
    expansion = Expansion(path, matrix, base)

    cells, problems = [], []
    phase = REPORT if matrix.tune else None
    for index, values in enumerate(itertools.product(*matrix.axes.values())):
        axes = dict(zip(matrix.axes, values))
        try:
            run = expansion.run_config(axes)
        except ConfigError as exc:
            problems += [f"{path} [cell {axes_text(axes)}]: {line}" for line in str(exc).splitlines()]
            continue
        cells.append(Cell(index, run, run.task.display_name, variant_label(axes), run.seed, axes, phase=phase))
    tuning, tuning_problems = tuning_cells(expansion, cells)
    problems += folder_problems(path, cells) + tuning_problems + folder_problems(path, tuning)
    if problems:
        # the same mistake usually breaks every cell: report each distinct problem once
        raise ConfigError("\n".join(dict.fromkeys(problems)))
    cells = [replace(cell, tb_run=name) for cell, name in zip(cells, tensorboard_run_names(cells))]
    # a tuning cell's run: tune/<its variant's run>/<candidate>/seed<k>, e.g. tune/lm/post/lr=0.001/seed1000
    variant_runs = {(cell.task, cell.variant): cell.tb_run.rsplit("/", 1)[0] for cell in cells}
    tuning = [replace(cell, tb_run=f"{TUNE_DIR}/{variant_runs[cell.task, cell.variant]}/{folder_name(cell.candidate)}/"
                                   f"seed{cell.seed}") for cell in tuning]
    return replace(expansion, cells=cells, tuning=tuning)


def tuning_cells(expansion: Expansion, cells: list[Cell]) -> tuple[list[Cell], list[str]]:
    """The tuning cells of a matrix with ``tune:``: for each task x variant of ``cells``, one per
    combination of the candidates, at ``tune_seed``; and the problems that keep them from running
    (a candidate the config rejects, a tuning seed that is also a reported one)."""
    matrix, path = expansion.matrix, expansion.path
    if not matrix.tune:
        return [], []
    problems = []
    seeds = sorted({cell.seed for cell in cells})
    if matrix.tune_seed in seeds:
        problems.append(
            f"{path}: tune_seed {matrix.tune_seed} is also a reported seed ({', '.join(map(str, seeds))}); a value "
            "picked on a run fits that run's noise, so the tuning run must not be reported: set tune_seed to a seed "
            f"the matrix does not report, e.g. tune_seed: {max(seeds) + 1000}"
        )
    variants: dict[tuple[str, str], Cell] = {}  # the first reported cell of each task x variant
    for cell in cells:
        variants.setdefault((cell.task, cell.variant), cell)
    tuning = []
    for cell in variants.values():
        axes = {key: value for key, value in cell.axes.items() if key != "seed"}
        for values in itertools.product(*matrix.tune.values()):
            tuned = dict(zip(matrix.tune, values))
            try:
                run = expansion.run_config(axes, {**tuned, "seed": matrix.tune_seed})
            except ConfigError as exc:
                where = f"{path} [tuning cell {axes_text({**axes, **tuned})}]"
                problems += [f"{where}: {line}" for line in str(exc).splitlines()]
                continue
            seeded = {**axes, "seed": run.seed} if "seed" in cell.axes else axes
            tuning.append(Cell(len(tuning), run, cell.task, cell.variant, run.seed, seeded, phase=TUNE, tuned=tuned))
    return tuning, problems


#: longest file name most file systems allow (ext4, XFS, APFS: 255 bytes)
MAX_FOLDER_NAME_BYTES = 255


def folder_problems(path: Path, cells: list[Cell]) -> list[str]:
    """What keeps the cells from each having a folder of their own: a cell whose folder another cell
    already has would overwrite its result (e.g. ``task: [lm, {name: lm, seq_len: 64}]``, both
    labelled ``lm``, or a repeated axis value), and a variant folder name can be too long."""
    owners: dict[Path, Cell] = {}
    problems = []
    for cell in cells:
        names = {"variant": (cell.folder, "axis")}
        if cell.tuned:
            names["candidate"] = (folder_name(cell.candidate), "tune")
        for what, (name, source) in names.items():
            if len(name.encode()) > MAX_FOLDER_NAME_BYTES:
                problems.append(
                    f"{path} [cell {axes_text({**cell.axes, **cell.tuned})}]: the {what}'s folder name would have "
                    f"{len(name.encode())} characters, more than file systems allow ({MAX_FOLDER_NAME_BYTES}); use "
                    f"shorter {source} values"
                )
        folder = cell.directory(Path())
        owner = owners.setdefault(folder, cell)
        if owner is not cell:
            problems.append(
                f"{path}: cells [{axes_text({**owner.axes, **owner.tuned})}] and [{axes_text({**cell.axes, **cell.tuned})}] "
                f"would share the folder {folder}; give their tasks distinct task.label values or make the axis (or tune) "
                "values distinct"
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


#: ``--jobs auto``: as many cells at once as the machine runs best (:func:`resolve_jobs`)
AUTO_JOBS = "auto"


def resolve_jobs(jobs: int | str, n_cells: int) -> int:
    """How many cells run at once. A number is taken as it is; ``auto`` (the default) runs one cell per
    GPU where there are GPUs, else one per CPU core (at most one per cell of the matrix), the cores split
    evenly between them (:func:`job_slots`).

    Why one thread per cell: the cells here are small, and a small model's step gains little from a
    second intra-op thread, while a second cell gains all of its core (measured: ``results/jobs.md``).
    The choice depends on the machine and on the matrix's size only, never on how many of its cells are
    left to train, so that a resumed matrix trains its remaining cells on the same thread count as the
    first run: the thread count can change a result's last bits."""
    if jobs == AUTO_JOBS:
        import torch

        return max(1, min(torch.cuda.device_count() or cpu_cores(), n_cells))
    if not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs {jobs}: give a number of cells to run at once (1 or more), or auto")
    return jobs


def cpu_cores() -> int:
    """The CPUs this process may run on (its affinity, as SLURM or taskset set it), else all of them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def job_slots(jobs: int) -> list[Slot]:
    """``jobs`` slots sharing the machine: the CPU cores split evenly, one GPU each if there are GPUs."""
    if jobs <= 1:
        return [Slot()]
    import torch

    gpus = torch.cuda.device_count()
    threads = max(1, cpu_cores() // jobs)
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

    from ..cell.perf import compute_dtype, peak_flops

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


def write_cell_file(cell: Cell, matrix_dir: Path, matrix_file: Path) -> None:
    """The cell's ``cell.json``: what the report groups it by (task, variant, seed), its axes and the
    matrix file; in a matrix with ``tune:`` also its phase and tuned values."""
    tuning = {"phase": cell.phase, "tuned": cell.tuned} if cell.phase else {}
    write_json(cell.directory(matrix_dir) / CELL_FILE, {
        "index": cell.index, "task": cell.task, "task_name": cell.run.task.name, "variant": cell.variant,
        "seed": cell.seed, "axes": cell.axes, **tuning,
        "matrix_file": {"path": str(matrix_file), "sha256": hashlib.sha256(matrix_file.read_bytes()).hexdigest()},
    })


def cell_command(cell: Cell, matrix_dir: Path, matrix_file: Path, *, fresh: bool = False) -> list[str]:
    """Write the cell's folder (cell.json, config.yaml) and return the command that trains it.

    An interrupted earlier attempt resumes from its checkpoint unless ``fresh``.
    """
    cell_dir = cell.directory(matrix_dir)
    (cell_dir / RESULT_FILE).unlink(missing_ok=True)
    if fresh:
        shutil.rmtree(cell_dir / CHECKPOINT_DIR, ignore_errors=True)
    write_cell_file(cell, matrix_dir, matrix_file)
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


def cell_result(cell: Cell, matrix_dir: Path, exit_description: str) -> CellRecord:
    """The result the cell's training process wrote, or a failure record if it died without one."""
    result_path = cell.directory(matrix_dir) / RESULT_FILE
    record = read_record(result_path)
    if record is not None:
        return record
    record = CellRecord.failure(cell.task, cell.seed, cell.run.config_hash(), code_fingerprint(),
                                f"the training process {exit_description} without writing a result")
    write_record(result_path, record)
    return record


def run_cell(cell: Cell, matrix_dir: Path, matrix_file: Path, *, slot: Slot = Slot(), log_file: Path | None = None,
             fresh: bool = False) -> dict[str, Any]:
    """Train one cell in a process of its own; return its result record (a failure record if it died).

    A single-process cell is forked from a server that has the imports done (``blockbench.launch``:
    10-15 s less per cell); a multi-process (DDP) cell runs as a subprocess, which Lightning's launcher
    can relaunch."""
    command = cell_command(cell, matrix_dir, matrix_file, fresh=fresh)
    if forks(cell.run):
        returncode = run_forked(command[1:], slot.environment(), log_file)  # "-m blockbench train ..."
    else:
        returncode = run_subprocess(command, slot.environment(), log_file)
    # interrupted (Ctrl-C, SIGTERM to it or to the runner), not broken: no failure record, it resumes next time
    if returncode in (130, -signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGTERM) or stopping():
        raise KeyboardInterrupt
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


def run_matrix(path: str | Path, results_root: Path, *, force: bool = False, jobs: int | str = AUTO_JOBS, launcher: str = "local",
               cluster_options: ClusterOptions = ClusterOptions(), reuse_stale: bool = False, dry_run: bool = False,
               from_process_start: bool = False) -> int:
    """Run every cell of the matrix at ``path``: here, ``jobs`` at a time (:func:`resolve_jobs`), or as cluster jobs
    (``launcher``: "slurm", or "submitit-local" to try the job path on this machine). Cells with a
    result of the same config and code are reused (see :func:`blockbench.plan.reuse_earlier`; all
    are retrained with ``force``). Write the summary and return the exit code: 1 if a cell failed (a
    diverged cell is a finding, not a failure). ``dry_run``: print each cell's status and the time
    estimate (:func:`print_plan`), write nothing and train nothing. ``from_process_start``: this process
    is the matrix's own (``blockbench matrix``), so its wall time counts from the process start.

    A matrix with ``tune:`` runs in two phases (see :mod:`blockbench.tuning`): its tuning cells, then,
    once each variant's values are chosen and recorded in ``tune.json``, the reported cells at them.
    Both are ordinary cells, run the same way (``jobs`` at a time), reused by the same rule.

    ``matrix_run.json`` records where the wall time went: the matrix's own parts (:data:`MATRIX_PARTS`:
    planning, TensorBoard views, the peak FLOP/s probe, the cells, the report), each trained cell's
    seconds as seen from here and, with ``tune:``, each phase's (see :func:`finish_matrix`)."""
    clock = WallClock(from_process_start=from_process_start)
    clock.enter("planning")
    path = Path(path)
    expansion = expand_matrix(path)  # raises before anything is written
    matrix, cells, tuning = expansion.matrix, expansion.cells, expansion.tuning
    jobs = resolve_jobs(jobs, max(len(cells), len(tuning)))  # the larger phase
    matrix_dir = results_root / matrix.name
    fingerprint = code_fingerprint()
    reuse = dict(force=force, reuse_stale=reuse_stale)
    tuning_plans = plan_cells(tuning, matrix_dir, fingerprint, **reuse)
    # the variants whose tuning cells all have results to reuse: their choice is known before anything trains
    known = tuning_outcomes(tuning, matrix_dir, settled={plan.cell.key for plan in tuning_plans if not plan.trains})
    plans = tuning_plans + plan_reported(expansion, known, matrix_dir, fingerprint, start=len(tuning) + 1, **reuse)
    estimator = TimeEstimator()
    estimator.add_results(tuning + cells, matrix_dir)
    if dry_run:
        notes = [f"tuned {tuned.describe()}" for tuned in known.values()]
        return print_plan(matrix.name, matrix_dir, plans, estimator, jobs, notes=notes)
    clock.exit("planning")
    matrix_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(matrix_dir / MATRIX_FILE, path.read_text())
    if not tuning:
        (matrix_dir / TUNE_FILE).unlink(missing_ok=True)  # the tune: section was removed: its record is not this run's
    # TensorBoard: the HParams columns (every varied key, every task's metrics, the speed figures) and one
    # chart per task and metric, which every cell's run carries; runs of earlier cells get them if they changed
    tasks = {cell.task: (cell.run.task.metrics, cell.run.task.throughput_unit) for cell in cells}
    lens_tasks = [cell.task for cell in cells if getattr(cell.run.task, "logit_lens", False)]  # a chart of their lens
    with clock.part("tensorboard_views"):
        curve_tasks = [cell.task for cell in cells if cell.run.trainer.curve_interval]
        views = matrix_views([cell.hparams for cell in tuning + cells], tasks, lens_tasks=lens_tasks, curve_tasks=curve_tasks)
        publish_views(matrix_dir / TB_DIR, views,
                      [cell.tb_run for cell in tuning + cells],
                      renamed={cell_folder(cell.task, cell.variant, cell.seed).as_posix(): cell.tb_run for cell in cells})
    counted = f"{len(tuning)} tuning cells, then {len(cells)} cells" if tuning else f"{len(cells)} cells"
    say(f"matrix {matrix.name}: {counted} -> {matrix_dir}" + (f", {jobs} at a time" if jobs > 1 else "")
        + f"; {describe_total(plans, estimator, jobs)}")
    stale_flag = " --reuse-stale" if reuse_stale else ""  # recorded with the run: its summary may hold stale results
    how = f" --launcher {launcher}" if launcher != "local" else f" --jobs {jobs}" if jobs > 1 else ""
    command = f"blockbench matrix {path}{how}{stale_flag}"
    n_cells = len(plans)
    failed: list[str] = []
    cell_times: list[dict[str, Any]] = []  # each trained cell's seconds as seen from here, in the order they ended
    progress = MatrixProgress([plan for plan in plans if plan.trains], estimator, jobs)
    slots = job_slots(jobs) if launcher == "local" else []
    if slots:
        with clock.part("peak_probe"):  # before any cell starts: one MFU denominator
            resolve_peaks([plan.cell for plan in plans if plan.trains], slots[0].threads)
        if any(plan.trains and forks(plan.cell.run) for plan in plans):
            with clock.part("cell_server"):  # its imports, once, before the first cell forks from it
                start_server()
    free_slots: queue.SimpleQueue[Slot] = queue.SimpleQueue()
    for slot in slots:
        free_slots.put(slot)

    def run(n: int, cell: Cell) -> None:
        slot = free_slots.get()
        try:
            if stopping():  # the runner is being terminated: this cell stays as it is and resumes next time
                raise KeyboardInterrupt
            prefix = f"[{n}/{n_cells}] {cell.key}"
            plan = progress.start(n)
            say(f"{prefix}: training" + (f" ({plan.detail})" if plan.status == "resumable" else ""))
            log_file = cell.directory(matrix_dir) / TRAIN_LOG if jobs > 1 else None
            if log_file:
                log_file.parent.mkdir(parents=True, exist_ok=True)
            result = run_cell(cell, matrix_dir, path, slot=slot, log_file=log_file, fresh=force)
            if result["status"] == "failed":
                failed.append(cell.key)
            took = progress.finish(n, result)  # its process, spawn to exit, and the few file writes around it
            timing = {"key": cell.key, "seconds": round(took, 2), **({"phase": cell.phase} if cell.phase else {})}
            if cell.phase == TUNE:  # the summary reads the reported cells' results: a tuning cell's breakdown comes from here
                timing["wall_time_breakdown"] = result.get("wall_time_breakdown")
            cell_times.append(timing)
            say(f"{prefix}: {describe_outcome(result)} in {format_duration(took)}  |  {progress.describe()}")
        finally:
            free_slots.put(slot)

    def run_phase(phase_plans: list[CellPlan]) -> dict[str, Any]:
        """Train the cells of ``phase_plans`` that need it (``jobs`` at a time, or as cluster jobs);
        return the phase's record for ``matrix_run.json``."""
        started = time.perf_counter()
        for plan in phase_plans:
            if plan.detail and (not plan.trains or plan.status != "resumable"):  # resuming is said when the cell starts
                say(f"[{plan.n}/{n_cells}] {plan.cell.key}: {plan.detail}")
        todo = [(plan.n, plan.cell) for plan in phase_plans if plan.trains]
        with clock.part("cells"):
            if launcher != "local":
                cluster = {"slurm": "slurm", "submitit-local": "local"}[launcher]
                failed.extend(run_cells_as_jobs(todo, n_cells, matrix_dir, path, cluster=cluster, options=cluster_options,
                                                fresh=force))
            else:
                pool = ThreadPoolExecutor(max_workers=jobs)
                try:
                    for future in [pool.submit(run, n, cell) for n, cell in todo]:
                        future.result()
                finally:  # on Ctrl-C running cells stop too; queued ones never start
                    pool.shutdown(wait=True, cancel_futures=True)
        return {"cells": len(phase_plans), "trained": len(todo), "wall_time_s": round(time.perf_counter() - started, 1)}

    def run_phases(phases: dict[str, dict[str, Any]]) -> None:
        """Tuning (with ``tune:``), then the reported cells; each phase's record into ``phases``."""
        report_plans = plans[len(tuning):]
        if tuning:
            say(f"phase 1 of 2, tuning: each variant's candidates of {', '.join(matrix.tune)} at seed {matrix.tune_seed}")
            phases[TUNE] = run_phase(tuning_plans)
            with clock.part("planning"):
                tunings = tuning_outcomes(tuning, matrix_dir)
                write_tuning(matrix_dir, tuning_record(list(matrix.tune), matrix.tune_seed, list(tunings.values())))
                report_plans = plan_reported(expansion, tunings, matrix_dir, fingerprint, start=len(tuning) + 1, **reuse)
            for tuned in tunings.values():
                say(f"tuned {tuned.describe()}")
            progress.revise(report_plans)
            say(f"phase 2 of 2, the reported seeds at the tuned values (recorded in {matrix_dir / TUNE_FILE})")
        for plan in report_plans:
            if plan.status == NO_CHOICE:  # no candidate finished: nothing to train these cells at
                record_no_choice(plan.cell, matrix_dir, path, plan.detail)
                failed.append(plan.cell.key)
                say(f"[{plan.n}/{n_cells}] {plan.cell.key}: FAILED: {plan.detail}")
        phases[REPORT] = run_phase([plan for plan in report_plans if plan.status != NO_CHOICE])

    phases: dict[str, dict[str, Any]] = {}
    terminated: list[int] = []  # SIGTERM received (local cells only: cluster jobs are the scheduler's)
    try:
        with stop_cells_on_sigterm() if launcher == "local" else contextlib.nullcontext(terminated) as terminated:
            run_phases(phases)
    except KeyboardInterrupt:
        if launcher != "local":
            raise
        how = "terminated (SIGTERM): running cells were stopped" if terminated else "interrupted"
        say(f"\n{how}: finished cells are kept, unfinished ones resume from their last checkpoint; "
            "run the same command again to continue", stream=sys.stderr)
        return 128 + signal.SIGTERM if terminated else 130
    trained = sum(phase["trained"] for phase in phases.values())
    return finish_matrix(matrix_dir, matrix.name, command, clock, trained, failed,
                         cell_times=cell_times if launcher == "local" else None, jobs=jobs if launcher == "local" else 1,
                         phases=phases if tuning else None)


def tuning_outcomes(tuning: list[Cell], matrix_dir: Path, *,
                    settled: set[str] | None = None) -> dict[tuple[str, str], Tuning]:
    """The tuning of each task x variant (see :mod:`blockbench.tuning`), scored from its tuning cells'
    results on its task's headline metric; with ``settled`` (the keys of the tuning cells that have
    results to reuse), only of the variants all of whose tuning cells are settled: the others' choice
    is not known until they have trained."""
    variants: dict[tuple[str, str], list[Cell]] = {}
    for cell in tuning:
        variants.setdefault((cell.task, cell.variant), []).append(cell)
    tunings = {}
    for (task, variant), group in variants.items():
        if settled is not None and any(cell.key not in settled for cell in group):
            continue
        metric = group[0].run.task.metrics[0]  # the headline metric: the summary's first, TensorBoard's primary
        candidates = tuple(candidate(cell.tuned, cell.candidate, cell.key, current_record(cell, matrix_dir), metric.name)
                           for cell in group)
        tunings[task, variant] = Tuning(task, variant, metric.name, metric.higher_is_better, candidates)
    return tunings


def current_record(cell: Cell, matrix_dir: Path) -> dict[str, Any] | None:
    """The cell's result record (of any status) if it is of the cell's current config, else None."""
    record = earlier_record(cell.directory(matrix_dir))
    return record if record and record.get("config_hash") == cell.run.config_hash() else None


def plan_reported(expansion: Expansion, tunings: dict[tuple[str, str], Tuning], matrix_dir: Path, fingerprint: str, *,
                  start: int, force: bool = False, reuse_stale: bool = False) -> list[CellPlan]:
    """The plans of the reported cells, numbered from ``start``. With ``tune:``, a cell whose variant
    has a choice in ``tunings`` is planned at the chosen values (its config, so a changed choice
    retrains it and an unchanged one reuses it); one whose variant has no finished candidate is
    NO_CHOICE (it fails, untrained); one whose variant is still tuning trains AFTER_TUNING."""
    if not expansion.tuning:
        return plan_cells(expansion.cells, matrix_dir, fingerprint, force=force, reuse_stale=reuse_stale, start=start)
    plans = []
    for n, cell in enumerate(expansion.cells, start):
        tuning = tunings.get((cell.task, cell.variant))
        if tuning is None:
            plans.append(CellPlan(n, cell, AFTER_TUNING, f"at the {', '.join(expansion.matrix.tune)} its tuning picks"))
        elif tuning.chosen is None:
            plans.append(CellPlan(n, cell, NO_CHOICE, tuning.failure(), trains=False))
        else:
            tuned = expansion.at_choice(cell, tuning.chosen.values)
            plans.append(plan_cell(n, tuned, matrix_dir, fingerprint, force=force, reuse_stale=reuse_stale))
    return plans


def record_no_choice(cell: Cell, matrix_dir: Path, matrix_file: Path, error: str) -> None:
    """Record a reported cell whose variant has no tuned value as failed with ``error``, untrained; a
    config.yaml of an earlier choice is removed (the cell trained with nothing)."""
    cell_dir = cell.directory(matrix_dir)
    write_cell_file(cell, matrix_dir, matrix_file)
    (cell_dir / CONFIG_FILE).unlink(missing_ok=True)
    write_record(cell_dir / RESULT_FILE, CellRecord.failure(cell.task, cell.seed, cell.run.config_hash(), code_fingerprint(), error))


def finish_matrix(matrix_dir: Path, name: str, command: str, clock: WallClock, trained: int, failed: list[str], *,
                  cell_times: list[dict[str, Any]] | None = None, jobs: int = 1,
                  phases: dict[str, dict[str, Any]] | None = None) -> int:
    """Record the run in ``matrix_run.json``, write the summary, and return the exit code (1 if a cell failed).

    The record holds the run's wall time (``wall_time_s``) and where it went (``wall_time_breakdown``:
    :data:`MATRIX_PARTS`, ``startup`` before :func:`run_matrix` and ``other`` the rest), the cells trained
    at once (``jobs``) and, for local cells, each one's seconds from here (``cells``: key, seconds, and
    with ``tune:`` its phase), which the summary compares with the training steps the cells recorded;
    with ``tune:``, each phase's cells, cells trained and seconds (``phases``). It is written before the
    report (a report that fails leaves the run recorded) and again once the report is rendered, with
    its time, before the report reads it for the summary's header."""
    say(f"matrix {name} finished in {format_duration(clock.elapsed())}")

    def record_run() -> None:
        breakdown = clock.breakdown(MATRIX_PARTS)
        write_json(matrix_dir / RUN_FILE, {"command": command, "wall_time_s": round(breakdown["total"], 1),
                                           "cells_trained": trained, "jobs": jobs, "wall_time_breakdown": breakdown,
                                           "cells": cell_times, **({"phases": phases} if phases else {})})

    def report_rendered() -> None:
        clock.exit("report")
        record_run()

    record_run()
    clock.enter("report")
    print(write_report(matrix_dir, before_header=report_rendered))
    try:  # the verdicts of every matrix of the results root, with this one's new ones
        write_index(matrix_dir.parent)
        say(f"verdicts of every matrix: {matrix_dir.parent / INDEX_FILE}")
    except (OSError, ValueError, KeyError) as error:  # another matrix's folder it cannot read: the run itself is done
        say(f"could not refresh {matrix_dir.parent / INDEX_FILE} ({error}); run blockbench report --index {matrix_dir.parent}",
            stream=sys.stderr)
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

    def revise(self, plans: list[CellPlan]) -> None:
        """New plans of cells that have not started: the reported cells once tuning has chosen their
        values (those now reused, or without a choice, leave the count)."""
        with self._lock:
            for plan in plans:
                if plan.n in self.started:
                    continue
                if plan.trains:
                    self.plans[plan.n] = plan
                else:
                    self.plans.pop(plan.n, None)

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


def print_plan(name: str, matrix_dir: Path, plans: list[CellPlan], estimator: TimeEstimator, jobs: int,
               notes: Sequence[str] = ()) -> int:
    """``--dry-run``: every cell validated (load_matrix did), its status and estimated time, ``notes``
    (the tuned values already known), the total; the cells to train without a measured step time are
    timed on one batch first. Writes nothing."""
    tuning = sum(plan.cell.phase == TUNE for plan in plans)
    counted = f"{len(plans)} cells ({tuning} tuning, {len(plans) - tuning} reported)" if tuning else f"{len(plans)} cells"
    say(f"matrix {name}: {counted} -> {matrix_dir} (dry run: every cell validated, nothing trained)")
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
    for note in notes:
        say(note)
    say(describe_total(plans, estimator, jobs))
    return 0
