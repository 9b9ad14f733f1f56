"""The results of a matrix read back: its settings (the runner's copy of the matrix file), its cells'
records grouped by task x variant (the input of every statistic of the report), its tuning cells'
records, and what made them: the code versions and the machines that both a summary's header and the
index of every matrix name. The one module of the report that reads the files of a results folder, so
that the statistics and the rendering work on typed records (``blockbench.record``), never on paths.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..layout import CELLS_DIR, CONFIG_FILE, MATRIX_FILE, RESULT_FILE, TUNE_DIR, cell_files
from ..provenance import code_fingerprint
from ..record import CellRecord, load_record

#: the training budget: when a matrix varies it along with a design axis, each variant is compared with
#: the baseline variant at the same budget (a verdict per budget; a longer run is no design choice)
BUDGET_AXIS = "trainer.max_steps"


@dataclass
class Group:
    """The cells of one task x variant (one per seed)."""

    task: str  # the row label (a preset name, or the task name)
    task_name: str  # the task kind, a key of TASK_CONFIGS
    variant: str
    index: int
    results: list[CellRecord] = field(default_factory=list)
    axes: dict[str, Any] = field(default_factory=dict)  # the cell's axis values (cell.json), seed included
    family: str | None = None  # ``model.family`` of the cells' resolved config (None: no config.yaml)

    @property
    def budget(self) -> Any:
        """The cells' ``trainer.max_steps`` if the matrix varies it (an axis), else None."""
        return self.axes.get(BUDGET_AXIS)

    @property
    def design(self) -> str:
        """The variant's label without its budget: ``ffn=swiglu`` for ``ffn=swiglu,max_steps=300`` (the
        label itself when the budget is not an axis; empty when the budget is the only one)."""
        if self.budget is None:
            return self.variant
        parts = self.variant.split(",")
        for name in ("max_steps", BUDGET_AXIS):  # the label names an axis by its last key part unless ambiguous
            if f"{name}={self.budget}" in parts:
                parts.remove(f"{name}={self.budget}")
                return ",".join(parts)
        return self.variant

    @property
    def ok(self) -> list[CellRecord]:
        return [r for r in self.results if r.status == "ok"]

    @property
    def diverged(self) -> list[CellRecord]:
        return [r for r in self.results if r.status == "diverged"]

    @property
    def failed(self) -> list[CellRecord]:
        return [r for r in self.results if not r.finished]

    def values(self, metric: str) -> list[float]:
        """``metric`` of every finished seed."""
        return [r.metrics[metric] for r in self.ok]

    def finished_values(self, metric: str) -> dict[Any, float]:
        """Seed -> ``metric`` of every finished seed."""
        return {_seed(r, i): r.metrics[metric] for i, r in enumerate(self.results) if r.ok}

    @property
    def diverged_seeds(self) -> list[Any]:
        return [_seed(r, i) for i, r in enumerate(self.results) if r.status == "diverged"]

    def speed_values(self, figure: str) -> list[float]:
        """A speed figure (see :data:`SPEED_FIGURES`) of every finished seed that recorded it."""
        values = (r.speed_figures()[figure] for r in self.ok)
        return [v for v in values if v is not None]

    def speed_mean(self, figure: str) -> float | None:
        values = self.speed_values(figure)
        return statistics.fmean(values) if values else None

    @property
    def status_without_ok(self) -> str:
        """What a group without a finished seed shows instead of numbers."""
        return "diverged" if self.diverged else "failed"

    def seeds_label(self) -> str:
        """The seeds in the statistics (finished and diverged), then the diverged and the failed ones:
        ``3``, ``3 (1 diverged)``, ``2 (1 failed, not counted)``, ``3 (3 diverged; 1 failed, not counted)``."""
        extra = [f"{len(self.diverged)} diverged"] if self.diverged else []
        if self.failed:
            extra.append(f"{len(self.failed)} failed, not counted")
        return f"{len(self.ok) + len(self.diverged)}" + (f" ({'; '.join(extra)})" if extra else "")


def _seed(result: CellRecord, index: int) -> Any:
    """The seed that pairs a result with the other variants' results (its position if it has none)."""
    return f"cell {index}" if result.seed is None else result.seed


@dataclass(frozen=True)
class MatrixSettings:
    """What the report reads from the runner's copy of the matrix file."""

    description: str = ""
    baseline_variant: str | None = None
    targets: dict[str, dict[str, float]] = field(default_factory=dict)
    cells: int = 0  # the reported cells the matrix has (its axes' product; 0: not known)

    @classmethod
    def load(cls, matrix_dir: Path) -> MatrixSettings:
        path = matrix_dir / MATRIX_FILE
        raw = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
        targets = {
            str(task): {str(m): float(v) for m, v in (metrics or {}).items()}
            for task, metrics in (raw.get("targets") or {}).items()
        }
        axes = raw.get("axes") or {}
        cells = (
            math.prod(len(values) for values in axes.values())
            if isinstance(axes, dict) and all(isinstance(values, list) for values in axes.values()) and axes
            else 0
        )
        return cls(raw.get("description") or "", raw.get("baseline_variant"), targets, cells)

    def without_result(self, matrix_dir: Path, results: int) -> int:
        """Cells of the matrix with no result yet: those its axes make and those begun (a cell.json)
        that have none, whichever is more (a run stopped part-way has begun only some of its cells)."""
        return max(self.cells, len(cell_files(matrix_dir))) - results


def load_groups(matrix_dir: Path) -> list[Group]:
    """Every task x variant with a result, in matrix order."""
    groups: dict[tuple[str, str], Group] = {}
    for cell_file in cell_files(matrix_dir):
        result_file = cell_file.with_name(RESULT_FILE)
        if not result_file.is_file():
            continue  # not run yet (an interrupted matrix)
        cell = json.loads(cell_file.read_text())
        result = load_record(result_file)
        group = groups.get((cell["task"], cell["variant"]))
        if group is None:
            group = groups[cell["task"], cell["variant"]] = Group(
                cell["task"],
                cell.get("task_name", cell["task"]),
                cell["variant"],
                cell["index"],
                axes=cell.get("axes") or {},
                family=_model_family(cell_file.with_name(CONFIG_FILE)),
            )
        group.index = min(group.index, cell["index"])
        group.results.append(result)
    for group in groups.values():
        group.results.sort(key=lambda r: r.seed or 0)
    return sorted(groups.values(), key=lambda g: g.index)


def _model_family(config_file: Path) -> str | None:
    """``model.family`` of a cell's resolved config (None without one: results written by hand)."""
    if not config_file.is_file():
        return None
    config = yaml.load(config_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    return (config.get("model") or {}).get("family")


def tuning_records(matrix_dir: Path) -> list[CellRecord]:
    """The records of a matrix's tuning cells (``<matrix>/tune/cells``): no statistic reads them, but
    their code, machine and time are part of the matrix's."""
    return [load_record(path) for path in sorted((matrix_dir / TUNE_DIR / CELLS_DIR).rglob(RESULT_FILE))]


def machines(records: list[CellRecord]) -> list[str]:
    """The machines the cells ran on (``provenance.machine_description``), each once."""
    return sorted({r.machine for r in records if r.machine is not None})


def code_versions(records: list[CellRecord]) -> list[str]:
    """``commit 595b935 (clean tree)`` per distinct code version the cells ran with (with its count
    if there are several): a summary says which code made its numbers, and whether it was committed.
    Cells whose code fingerprint is not this checkout's are marked stale: the numbers are still those
    of their commit, but ``blockbench matrix`` here would train them again (``plan``'s "stale")."""
    current = code_fingerprint()
    versions: dict[str, int] = {}
    for r in records:
        git = r.git
        if not git.commit:
            continue
        text = f"commit {git.commit[:7]}" + {True: " + uncommitted changes", False: " (clean tree)"}.get(git.dirty, "")
        if r.code_fingerprint not in (None, current):
            text += ", stale at this checkout (its model, task, trainer or config code has changed since)"
        versions[text] = versions.get(text, 0) + 1
    if len(versions) <= 1:
        return list(versions)
    return [f"{text} ({n} cell{'s' if n != 1 else ''})" for text, n in versions.items()]


def first_cell(matrix_dir: Path) -> dict[str, Any]:
    """The ``cell.json`` of a matrix's first cell ({} without one): the runner's record of the cell."""
    files = cell_files(matrix_dir)
    return json.loads(files[0].read_text()) if files else {}


def matrix_file_keys(matrix_file: Path) -> dict[str, Any]:
    """A matrix file's top-level keys, unvalidated ({} when it is missing or does not parse)."""
    try:
        raw = yaml.safe_load(matrix_file.read_text()) if matrix_file.is_file() else None
    except yaml.YAMLError:
        return {}
    return raw if isinstance(raw, dict) else {}


def gives_verdicts(matrix_file: Path) -> bool:
    """Whether the matrix file's results are verdicts (``verdicts: false`` marks a demonstration)."""
    return matrix_file_keys(matrix_file).get("verdicts") is not False
