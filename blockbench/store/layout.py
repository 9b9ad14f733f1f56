"""Where a matrix's results live on disk: the names the runner and the trainer write and the report
reads back, the path of a cell's folder, and the atomic writes that every writer of the store uses.

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
        tb/<task>/<short variant>/seed<k>/  a cell's run (store.tbruns.tensorboard_runs), written by the cell or rebuilt
                                      from its result.json (blockbench report --tensorboard)
        tb/<task>/views.json          TB_VIEWS_FILE: the HParams columns and charts every run of the log folder carries
        tb_tune/<task>/<short variant>/<candidate>/seed<k>/   TB_TUNE_DIR: the tuning cells' runs, in log
                                      folders of their own (outside tb/, split as tb/ is), with their views.json
        jobs/                         JOBS_DIR: logs of cluster jobs (--launcher slurm)
        tune.json                     TUNE_FILE: a matrix's tune: section, every candidate's score and each
                                      variant's choice
        headroom.json                 HEADROOM_FILE: a ladder's headroom check, the baseline at the top rung
                                      before any other cell (store.record.HeadroomCheck)
        tune/cells/<task>/<variant>/<candidate>/seed<k>/   tuning_cell_directory: a tuning cell (the files
                                      of a cell; its TensorBoard run:
                                      tb_tune/<task>/<short variant>/<candidate>/seed<k>)
        cells/<task>/<variant>/seed<k>/   cell_directory
            cell.json                 CELL_FILE: the cell's task, variant, seed, axes, matrix file and
                                      TensorBoard run
            config.yaml               CONFIG_FILE: the fully resolved run config
            result.json               RESULT_FILE: the result record (blockbench.store.record.CellRecord)
            load.json                 LOAD_FILE: how busy other processes kept the machine while the cell ran,
                                      written by the runner (blockbench.store.record.CellLoad)
            checkpoints/              CHECKPOINT_DIR: an unfinished run's, to resume
            train.log                 TRAIN_LOG: the cell's output under --jobs

One module, so that the writers and the reader cannot drift apart, and standard library only, so
that the report reads results without importing the trainer.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

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
HEADROOM_FILE = "headroom.json"
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


def axis_names(keys: list[str]) -> list[str]:
    """The names of variant axes in labels: the last key part (``norm_placement``), unless two keys share it."""
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    return leaves if len(set(leaves)) == len(leaves) else keys


def candidate_label(tuned: Mapping[str, Any]) -> str:
    """``{"optimizer.lr": 0.001}`` -> ``lr=0.001``: tuned values named as variants are (:func:`axis_names`)."""
    keys = list(tuned)
    return ",".join(f"{name}={tuned[key]}" for name, key in zip(axis_names(keys), keys, strict=True))


def cell_files(matrix_dir: Path) -> list[Path]:
    """The cell.json of every cell folder of ``matrix_dir`` (those :func:`cell_directory` makes), in path order."""
    return sorted((matrix_dir / CELLS_DIR).glob(f"*/*/*/{CELL_FILE}"))


def cell_results(matrix_dir: Path) -> list[Path]:
    """The result.json of every cell folder of ``matrix_dir``, reported (:func:`cell_directory`) and
    tuning (:func:`tuning_cell_directory`), in path order."""
    return sorted((matrix_dir / CELLS_DIR).glob(f"*/*/*/{RESULT_FILE}")) + sorted(
        (matrix_dir / TUNE_DIR / CELLS_DIR).glob(f"*/*/*/*/{RESULT_FILE}")
    )


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
