"""Where a matrix's results live on disk: the names the runner and the trainer write and the report
reads back, the path of a cell's folder, and the atomic writes they all use.

::

    results/README.md                 INDEX_FILE: the verdicts of every matrix of the results root (report.write_index)
    results/verdicts.png              the book's verdict picture, at the top of README.md (report.forest)
    results/<matrix>/
        matrix.yaml                   MATRIX_FILE: the runner's copy of the matrix file (the report reads its settings)
        matrix_run.json               RUN_FILE: the command and wall time of the last run, where it went, each
                                      cell's seconds
        summary.md, summary.csv       SUMMARY_MD, SUMMARY_CSV: the report
        plots/curves.png              PLOTS_DIR: the validation curves, a row per task (report.plots)
        plots/verdicts.png            the matrix's verdict picture, shown in summary.md (report.forest)
        tb/<task>/                    TB_DIR: TensorBoard, one log folder per task, opened on its own
                                      (tensorboard --logdir results/<matrix>/tb/<task>), at most
                                      MAX_RUNS_PER_LOGDIR runs; a task with more is split: tb/<task>_1of2/, ...
        tb/<task>/<short variant>/seed<k>/  a cell's run (tensorboard_runs), written by the cell or rebuilt
                                      from its result.json (blockbench report --tensorboard)
        tb/<task>/views.json          TB_VIEWS_FILE: the HParams columns and charts every run of the log folder carries
        tb_tune/<task>/<short variant>/<candidate>/seed<k>/   TB_TUNE_DIR: the tuning cells' runs, in log
                                      folders of their own (outside tb/, split as tb/ is), with their views.json
        jobs/                         JOBS_DIR: logs of cluster jobs (--launcher slurm)
        tune.json                     TUNE_FILE: a matrix's tune: section, every candidate's score and each
                                      variant's choice
        tune/cells/<task>/<variant>/<candidate>/seed<k>/   tuning_cell_directory: a tuning cell (the files
                                      of a cell; its TensorBoard run:
                                      tb_tune/<task>/<short variant>/<candidate>/seed<k>)
        cells/<task>/<variant>/seed<k>/   cell_directory
            cell.json                 CELL_FILE: the cell's task, variant, seed, axes and matrix file
            config.yaml               CONFIG_FILE: the fully resolved run config
            result.json               RESULT_FILE: the result record (blockbench.record.CellRecord)
            load.json                 LOAD_FILE: how busy other processes kept the machine while the cell ran,
                                      written by the runner (blockbench.record.CellLoad)
            checkpoints/              CHECKPOINT_DIR: an unfinished run's, to resume
            train.log                 TRAIN_LOG: the cell's output under --jobs

One module, so that the writers and the reader cannot drift apart, and standard library only, so
that the report reads results without importing the trainer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MATRIX_FILE = "matrix.yaml"
RUN_FILE = "matrix_run.json"
SUMMARY_MD = "summary.md"
SUMMARY_CSV = "summary.csv"
INDEX_FILE = "README.md"
PLOTS_DIR = "plots"
TB_DIR = "tb"
TB_TUNE_DIR = "tb_tune"
TB_VIEWS_FILE = "views.json"
#: the most runs a TensorBoard log folder holds: TensorBoard's Scalars and Custom Scalars dashboards tick
#: every run by default only when there are at most 40 (``maxNamesToEnableByDefault = 40`` in its frontend,
#: ``tensorboard/components/tf_dashboard_common/tf-multi-checkbox.ts``); with more, every box starts
#: unticked and every chart is empty until the reader picks runs
MAX_RUNS_PER_LOGDIR = 40
JOBS_DIR = "jobs"
CELLS_DIR = "cells"
CELL_FILE = "cell.json"
TUNE_FILE = "tune.json"
PLAN_FILE = "plan.json"
TUNE_DIR = "tune"
CONFIG_FILE = "config.yaml"
RESULT_FILE = "result.json"
LOAD_FILE = "load.json"
CHECKPOINT_DIR = "checkpoints"
TRAIN_LOG = "train.log"


def folder_name(label: str) -> str:
    """``label`` as a single folder name, percent-encoded like a URL path segment (``/`` -> ``%2F``,
    a space -> ``%20``): an axis value with ``/`` cannot nest folders (the report reads exactly
    ``cells/<task>/<variant>/seed<k>``), and two different labels never share a folder. The usual
    labels (``norm_placement=pre``, ``n_kv_heads=None,lr=0.001``) are unchanged."""
    name = urllib.parse.quote(label, safe="=,+")
    return name.replace(".", "%2E") if name in (".", "..") else name


def cell_folder(task: str, variant: str, seed: int) -> Path:
    """``<task>/<variant folder>/seed<k>``: a cell's folder under ``cells/``; the readable variant label
    is in its cell.json. (Its TensorBoard run under ``tb/`` has a shorter name, see
    :func:`tensorboard_run_names`; older versions used this one.)"""
    return Path(task, folder_name(variant), f"seed{seed}")


def cell_directory(matrix_dir: Path, task: str, variant: str, seed: int) -> Path:
    """``<matrix_dir>/cells/<task>/<variant folder>/seed<k>``."""
    return matrix_dir / CELLS_DIR / cell_folder(task, variant, seed)


def tuning_cell_directory(matrix_dir: Path, task: str, variant: str, candidate: str, seed: int) -> Path:
    """``<matrix_dir>/tune/cells/<task>/<variant folder>/<candidate folder>/seed<k>``: a tuning cell's
    folder (``candidate``: its tuned values, ``lr=0.001``), outside ``cells/``, so the statistics of
    the reported seeds (:func:`cell_files`) never read it."""
    return matrix_dir / TUNE_DIR / CELLS_DIR / task / folder_name(variant) / folder_name(candidate) / f"seed{seed}"


#: axes that identify a cell's row (task) and repetition (seed) rather than its variant
NON_VARIANT_AXES = ("task", "task.name", "seed")


class LabelledCell(Protocol):
    """What names a cell's TensorBoard run: its task label, variant label, seed and axis values
    (``blockbench.matrix.expand.Cell`` as the runner expands it, or a cell.json read back by the report)."""

    @property
    def task(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def axes(self) -> Mapping[str, Any]: ...


def axis_names(keys: list[str]) -> list[str]:
    """The names of variant axes in labels: the last key part (``norm_placement``), unless two keys share it."""
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    return leaves if len(set(leaves)) == len(leaves) else keys


def candidate_label(tuned: Mapping[str, Any]) -> str:
    """``{"optimizer.lr": 0.001}`` -> ``lr=0.001``: tuned values named as variants are (:func:`axis_names`)."""
    keys = list(tuned)
    return ",".join(f"{name}={tuned[key]}" for name, key in zip(axis_names(keys), keys, strict=True))


def tensorboard_run_names(cells: Sequence[LabelledCell]) -> list[str]:
    """Each cell's run name with its task first, ``<task>/<short variant>/seed<k>`` (:func:`tensorboard_runs`
    puts the part after the task in the task's log folder): the variant's axis values alone
    (``translation/post/seed0``), so that a run list which cuts long names still tells the variants
    apart; the full keys are in the HParams table. A value that does not name itself (a number, a
    bool, None, a mapping) keeps its key (``lm/n_kv_heads=4/seed0``), as does a value that another axis
    takes too; a character that cannot be part of a folder name is percent-encoded as in the cell's
    folder (:func:`folder_name`). Should the short names still collide, every run is named after
    its cell folder (:func:`cell_folder`). The names depend on every cell of ``cells``: the runner
    passes a matrix's reported cells, the TensorBoard rebuild (``blockbench.report.tensorboard``) those
    with a cell.json, the same cells once a matrix has run."""
    keys = [k for k in (cells[0].axes if cells else {}) if k not in NON_VARIANT_AXES]
    values = {key: [cell.axes[key] for cell in cells] for key in keys}

    def names_itself(key: str) -> bool:
        taken_elsewhere = {str(v) for other in keys if other != key for v in values[other]}
        return all(isinstance(v, str) and v not in taken_elsewhere for v in values[key])

    bare = {key: names_itself(key) for key in keys}
    names = []
    for cell in cells:
        parts = [
            str(cell.axes[key]) if bare[key] else f"{name}={cell.axes[key]}"
            for name, key in zip(axis_names(keys), keys, strict=True)
        ]
        names.append(f"{cell.task}/{folder_name(','.join(parts) or 'default')}/seed{cell.seed}")
    if len(set(names)) < len(names):
        names = [cell_folder(cell.task, cell.variant, cell.seed).as_posix() for cell in cells]
    return names


class TunedCell(LabelledCell, Protocol):
    """A tuning cell as far as its TensorBoard run goes: a labelled cell and its candidate's values."""

    @property
    def tuned(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class TensorBoardRun:
    """A cell's TensorBoard run: the log folder a reader opens, relative to the matrix folder
    (``tb/lm``, ``tb_tune/lm``, ``tb/lm_1of2``), and the run's name in it, which TensorBoard shows
    (``post/seed0``, a tuning cell's ``post/lr=0.001/seed1000``): the variant first, so that a
    variant's seeds sit together in the run list and one regex (``^post/``) selects them."""

    logdir: str
    name: str

    @property
    def path(self) -> str:
        """The run's folder relative to the matrix folder: ``tb/lm/post/seed0``."""
        return f"{self.logdir}/{self.name}"

    @property
    def writer_args(self) -> tuple[str, str]:
        """``(name, version)`` as a cell's writer takes them (``--tb-name``, ``--tb-version``):
        ``post/seed0`` -> ``("post", "seed0")``."""
        name, version = self.name.rsplit("/", 1)
        return name, version


def tensorboard_runs(
    reported: Sequence[LabelledCell], tuning: Sequence[TunedCell] = ()
) -> tuple[list[TensorBoardRun], list[TensorBoardRun]]:
    """The TensorBoard runs of a matrix's reported cells and of its tuning cells.

    A reported cell's run is its :func:`tensorboard_run_names` name without the task, in its task's
    log folder under ``tb/`` (``tb/lm`` + ``post/seed0``); a tuning cell's is
    ``<its variant's short name>/<candidate>/seed<k>`` (:func:`tuning_run_name`) in its task's log
    folder under ``tb_tune/``, outside ``tb/``: TensorBoard lists every folder under the one it opens
    as a run, so tuning runs inside ``tb/<task>`` would mix with the reported ones in every chart.
    One log folder per task because TensorBoard enables a log folder's runs by default only up to
    :data:`MAX_RUNS_PER_LOGDIR`, and a matrix's tasks together usually hold more; a task with more
    is split further (:func:`logdirs`). Tags name the task too (``blockbench.tbnames.run_tag``), so
    several task folders opened together still draw each task's charts apart."""
    names = tensorboard_run_names(reported)
    inside = [name.removeprefix(f"{cell.task}/") for cell, name in zip(reported, names, strict=True)]
    variant_of = {(cell.task, cell.variant): name.split("/", 1)[0] for cell, name in zip(reported, inside, strict=True)}
    tuning_inside = [
        tuning_run_name(variant_of.get((cell.task, cell.variant), folder_name(cell.variant)), cell.tuned, cell.seed)
        for cell in tuning
    ]
    reported_dirs = logdirs(TB_DIR, [cell.task for cell in reported], [name.split("/", 1)[0] for name in inside])
    tuning_dirs = logdirs(
        TB_TUNE_DIR, [cell.task for cell in tuning], [name.split("/", 1)[0] for name in tuning_inside]
    )
    return (
        [TensorBoardRun(logdir, name) for logdir, name in zip(reported_dirs, inside, strict=True)],
        [TensorBoardRun(logdir, name) for logdir, name in zip(tuning_dirs, tuning_inside, strict=True)],
    )


def tuning_run_name(variant: str, tuned: Mapping[str, Any], seed: int) -> str:
    """A tuning cell's run in its log folder, ``<variant>/<candidate>/seed<k>`` (``variant``: the short
    name its variant's reported runs start with), e.g. ``post/lr=0.001/seed1000``."""
    return f"{variant}/{folder_name(candidate_label(tuned))}/seed{seed}"


def logdirs(root: str, tasks: Sequence[str], variants: Sequence[str], limit: int = MAX_RUNS_PER_LOGDIR) -> list[str]:
    """Each run's log folder, for runs of ``tasks`` and ``variants`` (one entry per run): ``<root>/<task>``
    where the task has at most ``limit`` runs, else ``<root>/<task>_<i>of<n>``, parts of at most
    ``limit`` runs that take the task's variants in order, each whole unless it alone holds more
    than ``limit`` runs (its seeds then go on into the next part), so that a part never opens with
    a variant's seeds cut from the previous one when a whole variant would fit."""
    by_task: dict[str, list[int]] = {}
    for index, task in enumerate(tasks):
        by_task.setdefault(task, []).append(index)
    placed = [""] * len(tasks)
    for task, indices in by_task.items():
        if len(indices) <= limit:
            for index in indices:
                placed[index] = f"{root}/{task}"
            continue
        by_variant: dict[str, list[int]] = {}
        for index in indices:
            by_variant.setdefault(variants[index], []).append(index)
        part_of, part, filled = {}, 0, 0
        for members in by_variant.values():
            if filled and filled + len(members) > limit:
                part, filled = part + 1, 0
            for index in members:
                if filled == limit:
                    part, filled = part + 1, 0
                part_of[index], filled = part, filled + 1
        for index, number in part_of.items():
            placed[index] = f"{root}/{task}_{number + 1}of{part + 1}"
    return placed


def earlier_run_path(task: str, run: TensorBoardRun) -> str:
    """Where earlier versions put ``run`` (of a cell of ``task``), relative to the matrix folder: every
    run in one log folder, ``tb/``, a tuning run under ``tb/tune/`` (``tb/lm/post/seed0``,
    ``tb/tune/lm/post/lr=0.001/seed1000``); :func:`move_runs` moves it to ``run.path``."""
    if run.logdir.split("/", 1)[0] == TB_TUNE_DIR:
        return f"{TB_DIR}/{TUNE_DIR}/{task}/{run.name}"
    return f"{TB_DIR}/{task}/{run.name}"


def move_runs(matrix_dir: Path, moves: Mapping[str, str]) -> None:
    """Move each run folder of ``moves`` (its path relative to ``matrix_dir`` as an older layout named
    it -> its path now) to its new path, or delete it where the new run exists already (trained
    again since), and remove the folders it leaves empty: a matrix trained before the runs moved
    keeps its curves in the folder a reader opens now."""
    for old, new in moves.items():
        old_dir, new_dir = matrix_dir / old, matrix_dir / new
        if old_dir == new_dir or not old_dir.is_dir():
            continue
        if new_dir.exists():
            shutil.rmtree(old_dir)
        else:
            new_dir.parent.mkdir(parents=True, exist_ok=True)
            os.replace(old_dir, new_dir)
        for parent in Path(old).parents[:-1]:  # folders left empty, the deepest first
            with contextlib.suppress(OSError):
                (matrix_dir / parent).rmdir()


def tensorboard_logdirs(matrix_dir: Path) -> list[str]:
    """The log folders that hold a matrix's runs on disk, relative to ``matrix_dir``: each folder
    under ``tb/`` and ``tb_tune/`` (``tb/lm``, ``tb_tune/lm``), reported ones first, each root sorted."""
    return [
        f"{root}/{folder.name}"
        for root in (TB_DIR, TB_TUNE_DIR)
        if (matrix_dir / root).is_dir()
        for folder in sorted((matrix_dir / root).iterdir())
        if folder.is_dir()
    ]


def cell_files(matrix_dir: Path) -> list[Path]:
    """The cell.json of every cell folder of ``matrix_dir`` (those :func:`cell_directory` makes), in path order."""
    return sorted((matrix_dir / CELLS_DIR).glob(f"*/*/*/{CELL_FILE}"))


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path next to ``path`` to write to, renamed to ``path`` when the block ends without
    an error: a reader, or a crash, never leaves a truncated file. The name is this process's, so
    processes writing the same file at once (DDP ranks, parallel cells) do not mix their bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    yield tmp
    os.replace(tmp, path)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
