"""Where a matrix's results live on disk: the names the runner and the trainer write and the report
reads back, the path of a cell's folder, and the atomic writes they all use.

::

    results/README.md                 INDEX_FILE: the verdicts of every matrix of the results root (report.write_index)
    results/<matrix>/
        matrix.yaml                   MATRIX_FILE: the runner's copy of the matrix file (the report reads its settings)
        matrix_run.json               RUN_FILE: the command and wall time of the last run, where it went, each
                                      cell's seconds
        summary.md, summary.csv       SUMMARY_MD, SUMMARY_CSV: the report
        plots/<task>.png              PLOTS_DIR
        tb/<task>/<short variant>/seed<k>/  TB_DIR: TensorBoard, one run per cell (matrix.expand.tensorboard_run_names)
        tb/views.json                 TB_VIEWS_FILE: the HParams columns and charts every cell's run carries
        jobs/                         JOBS_DIR: logs of cluster jobs (--launcher slurm)
        tune.json                     TUNE_FILE: a matrix's tune: section, every candidate's score and each
                                      variant's choice
        tune/cells/<task>/<variant>/<candidate>/seed<k>/   tuning_cell_directory: a tuning cell (the files
                                      of a cell; its TensorBoard run:
                                      tb/tune/<task>/<short variant>/<candidate>/seed<k>)
        cells/<task>/<variant>/seed<k>/   cell_directory
            cell.json                 CELL_FILE: the cell's task, variant, seed, axes and matrix file
            config.yaml               CONFIG_FILE: the fully resolved run config
            result.json               RESULT_FILE: the result record (blockbench.record.CellRecord)
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MATRIX_FILE = "matrix.yaml"
RUN_FILE = "matrix_run.json"
SUMMARY_MD = "summary.md"
SUMMARY_CSV = "summary.csv"
INDEX_FILE = "README.md"
PLOTS_DIR = "plots"
TB_DIR = "tb"
TB_VIEWS_FILE = "views.json"
JOBS_DIR = "jobs"
CELLS_DIR = "cells"
CELL_FILE = "cell.json"
TUNE_FILE = "tune.json"
TUNE_DIR = "tune"
CONFIG_FILE = "config.yaml"
RESULT_FILE = "result.json"
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
    ``blockbench.matrix.expand.tensorboard_run_names``; older versions used this one.)"""
    return Path(task, folder_name(variant), f"seed{seed}")


def cell_directory(matrix_dir: Path, task: str, variant: str, seed: int) -> Path:
    """``<matrix_dir>/cells/<task>/<variant folder>/seed<k>``."""
    return matrix_dir / CELLS_DIR / cell_folder(task, variant, seed)


def tuning_cell_directory(matrix_dir: Path, task: str, variant: str, candidate: str, seed: int) -> Path:
    """``<matrix_dir>/tune/cells/<task>/<variant folder>/<candidate folder>/seed<k>``: a tuning cell's
    folder (``candidate``: its tuned values, ``lr=0.001``), outside ``cells/``, so the statistics of
    the reported seeds (:func:`cell_files`) never read it."""
    return matrix_dir / TUNE_DIR / CELLS_DIR / task / folder_name(variant) / folder_name(candidate) / f"seed{seed}"


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
