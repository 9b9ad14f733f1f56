"""The TensorBoard runs of a matrix on disk: each cell's run name, the log folder a reader opens
(one per task, tuning runs apart, split past :data:`blockbench.store.layout.MAX_RUNS_PER_LOGDIR` runs),
runs of older layouts moved to where a reader looks now, and the log folders a matrix holds. The
live writer (``blockbench.cell``), the runner and the rebuild (``blockbench.report``) all name runs
here, so that they cannot drift apart."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .layout import (
    MAX_RUNS_PER_LOGDIR,
    NON_VARIANT_AXES,
    TB_DIR,
    TB_TUNE_DIR,
    TUNE_DIR,
    axis_names,
    candidate_label,
    cell_folder,
    folder_name,
)


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
    is split further (:func:`logdirs`). Tags name the task too (``blockbench.tensorboard.names.run_tag``), so
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
