"""Expand a matrix file into cells and run each cell in its own subprocess.

Every cell is validated before the first one trains. Each cell runs ``blockbench train`` in a
subprocess (Lightning's DDP relaunches the entry script, and a crash in one cell must not take
the matrix down) and writes ``cell.json``, ``config.yaml`` and ``result.json`` under
``results/<matrix>/cells/<task>/<variant>/seed<k>/``. A cell whose result exists for the same
resolved config is skipped, so rerunning an interrupted matrix continues where it stopped.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
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
)
from .train import CONFIG_FILE, RESULT_FILE, to_yaml, write_atomic, write_json

CELL_FILE = "cell.json"
#: axes that identify a cell's row (task) and repetition (seed) rather than its variant
NON_VARIANT_AXES = ("task", "task.name", "seed")


@dataclass(frozen=True)
class Cell:
    index: int
    run: RunConfig
    task: str
    variant: str
    seed: int
    axes: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.task}/{self.variant}/seed{self.seed}"

    def directory(self, matrix_dir: Path) -> Path:
        return matrix_dir / "cells" / self.task / self.variant / f"seed{self.seed}"


def variant_label(axes: dict[str, Any]) -> str:
    """``{"model.norm_placement": "pre"}`` -> ``norm_placement=pre``; the last key part unless ambiguous."""
    keys = [k for k in axes if k not in NON_VARIANT_AXES]
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    names = leaves if len(set(leaves)) == len(leaves) else keys
    return ",".join(f"{name}={axes[key]}" for name, key in zip(names, keys)) or "default"


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
            label = ", ".join(f"{k}={v}" for k, v in axes.items())
            problems += [f"{path} [cell {label}]: {line}" for line in str(exc).splitlines()]
            continue
        cells.append(Cell(index, run, run.task.display_name, variant_label(axes), run.seed, axes))
    if problems:
        # the same mistake usually breaks every cell: report each distinct problem once
        raise ConfigError("\n".join(dict.fromkeys(problems)))
    return matrix, cells


def is_done(cell: Cell, cell_dir: Path) -> bool:
    """A finished result for exactly this resolved config exists."""
    result_path = cell_dir / RESULT_FILE
    if not result_path.is_file():
        return False
    try:
        result = json.loads(result_path.read_text())
    except json.JSONDecodeError:
        return False
    return result.get("status") == "ok" and result.get("config_hash") == cell.run.config_hash()


def run_cell(cell: Cell, matrix_dir: Path) -> dict[str, Any]:
    """Train one cell in a subprocess; return its result record (a failure record if it died)."""
    cell_dir = cell.directory(matrix_dir)
    (cell_dir / RESULT_FILE).unlink(missing_ok=True)
    write_json(cell_dir / CELL_FILE, {"index": cell.index, "task": cell.task, "task_name": cell.run.task.name,
                                      "variant": cell.variant, "seed": cell.seed, "axes": cell.axes})
    write_atomic(cell_dir / CONFIG_FILE, to_yaml(cell.run))
    command = [
        sys.executable, "-m", "blockbench", "train", str(cell_dir / CONFIG_FILE),
        "--out", str(cell_dir),
        "--tb-dir", str(matrix_dir / "tb"),
        "--tb-name", f"{cell.task}/{cell.variant}",
        "--tb-version", f"seed{cell.seed}",
    ]
    process = subprocess.run(command)
    if process.returncode in (130, -signal.SIGINT):  # the cell was interrupted, not broken
        raise KeyboardInterrupt
    result_path = cell_dir / RESULT_FILE
    if result_path.is_file():
        return json.loads(result_path.read_text())
    record = {
        "status": "failed",
        "task": cell.task,
        "seed": cell.seed,
        "config_hash": cell.run.config_hash(),
        "error": f"the training process exited with code {process.returncode} without writing a result",
    }
    write_json(result_path, record)
    return record


def run_matrix(path: str | Path, results_root: Path, *, force: bool = False) -> int:
    """Run every cell of the matrix at ``path``; write the summary; return the exit code."""
    from .report import RUN_FILE, write_report

    matrix, cells = load_matrix(path)  # raises before anything is written
    matrix_dir = results_root / matrix.name
    matrix_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(matrix_dir / "matrix.yaml", Path(path).read_text())
    print(f"matrix {matrix.name}: {len(cells)} cells -> {matrix_dir}", flush=True)
    start = time.perf_counter()
    failed, trained = [], 0
    try:
        for n, cell in enumerate(cells, 1):
            prefix = f"[{n}/{len(cells)}] {cell.key}"
            if not force and is_done(cell, cell.directory(matrix_dir)):
                print(f"{prefix}: done earlier, reusing its result", flush=True)
                continue
            print(f"{prefix}: training", flush=True)
            trained += 1
            result = run_cell(cell, matrix_dir)
            if result["status"] != "ok":
                failed.append(cell.key)
                print(f"{prefix}: FAILED: {result['error']}", flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted: finished cells are kept; run the same command again to continue", file=sys.stderr)
        return 130
    elapsed = time.perf_counter() - start
    print(f"matrix {matrix.name} finished in {elapsed:.0f} s", flush=True)
    write_json(matrix_dir / RUN_FILE, {"command": f"blockbench matrix {path}", "wall_time_s": round(elapsed, 1),
                                       "cells_trained": trained})
    print(write_report(matrix_dir))
    if failed:
        print(f"{len(failed)} cell(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
