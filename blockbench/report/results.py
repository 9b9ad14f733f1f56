"""The results of a matrix read back: its settings (the runner's copy of the matrix file, read as a
``blockbench.config.MatrixConfig``), its cells' records grouped by task x variant (the input of every
statistic of the report), its tuning cells' records and what they cost, and what made them: the code
versions and the machines that both a summary's header and the index of every matrix name. The one
module of the report that reads the files of a results folder, so that the statistics and the
rendering work on typed records (``blockbench.store.record``), never on paths.

The cells compared must have trained on one kind of device at one precision (their
``blockbench.store.record.Hardware``), which their config hash does not name: a results folder with
CPU float32 cells and GPU bf16 cells of the same matrix is refused (:class:`MixedHardware`), unless the
matrix varies ``trainer.accelerator`` or ``trainer.precision`` itself.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from blockbench.tasks import Metric

from ..matrixfile import ALWAYS_WITHIN, RUNG_AXIS, MatrixConfig, SeedPlan
from ..overrides import ConfigError
from ..provenance import code_fingerprint
from ..store.layout import CELL_FILE, CELLS_DIR, CONFIG_FILE, MATRIX_FILE, RESULT_FILE, TUNE_DIR, cell_files
from ..store.lineage import NO_LINEAGE, Lineage
from ..store.record import (
    HARDWARE_AXES,
    HARDWARE_WAYS_OUT,
    CellLoad,
    CellRecord,
    Hardware,
    hardware_listing,
    load_record,
    read_load,
)

#: the training budget: when a matrix varies it along with a design axis, each variant is compared with
#: the baseline variant at the same budget (a verdict per budget; a longer run is no design choice)
BUDGET_AXIS = "trainer.max_steps"
#: the split every reported metric must be scored on (``task.eval_split``'s default; tuning cells score "tuning")
VALIDATION_SPLIT = "validation"


class MixedHardware(ConfigError):
    """Cells that a comparison would put together trained on different kinds of device or at different
    precisions (e.g. CPU float32 seeds and GPU bf16 seeds of one variant): their numbers differ by the
    hardware, not only by the design or the seed."""


def beats(metric: Metric, value: float, reference: float | None) -> bool:
    """Whether ``value`` is strictly better than ``reference`` (a task's trivial baseline) in ``metric``'s
    direction: a cell that does not beat it did not learn. True without a reference (nothing to beat)."""
    if reference is None or not math.isfinite(reference):
        return True
    if hasattr(metric, "beats"):  # the task's own rule (blockbench.tasks.Metric.beats)
        return bool(metric.beats(value, reference))
    return value > reference if metric.higher_is_better else value < reference


def level_part(key: str, value: Any) -> str:
    """How one level axis reads in a label: ``n_layers=4``, or ``1,500 steps`` for the budget."""
    if key == BUDGET_AXIS:
        return f"{value:,} steps" if isinstance(value, int) else f"{value} steps"
    return f"{key.rsplit('.', 1)[-1]}={value}"


def level_text(level: tuple[tuple[str, Any], ...]) -> str:
    """``n_layers=4, 300 steps``: a level as the verdicts name it (empty for no level)."""
    return ", ".join(level_part(key, value) for key, value in level)


@dataclass
class Group:
    """The cells of one task x variant (one per seed). ``levels``: the axes the matrix compares within
    (``within:`` and the budget): the group's values of them are its level, and its label without
    them is its design, which is compared with the baseline design at the same level."""

    task: str  # the row label (a preset name, or the task name)
    task_name: str  # the task kind, a key of TASK_CONFIGS
    variant: str
    index: int
    results: list[CellRecord] = field(default_factory=list)
    axes: dict[str, Any] = field(default_factory=dict)  # the cell's axis values (cell.json), seed included
    family: str | None = None  # ``model.family`` of the cells' resolved config (None: no config.yaml)
    levels: tuple[str, ...] = ()  # the matrix's level axes that this group's cells have
    #: the ``task:`` section of the first cell's resolved config (None: no config.yaml)
    task_section: dict[str, Any] | None = None
    #: cells whose config scored another split than the validation split (``task.eval_split: tuning``):
    #: left out of every statistic, since a reported metric must come from data no choice was made on
    wrong_split: list[CellRecord] = field(default_factory=list)
    #: the analysis plan's hash each reported cell started under (``cell.json``; None: none recorded)
    plans: list[str | None] = field(default_factory=list)
    #: seed -> the load the machine was under while that seed's cell ran (``load.json``), where recorded
    loads: dict[Any, CellLoad] = field(default_factory=dict)

    @property
    def level(self) -> tuple[tuple[str, Any], ...]:
        """(axis, value) of each level axis: ``(("model.n_layers", 4),)``; () without levels."""
        return tuple((key, self.axes[key]) for key in self.levels if key in self.axes)

    @property
    def design(self) -> str:
        """The variant's label without its level: ``norm_placement=post`` for
        ``n_layers=4,norm_placement=post`` (the label itself without levels; empty when the level axes
        are its only ones). A label names an axis by its last key part unless that is ambiguous."""
        parts = self.variant.split(",")
        for key, value in self.level:
            for name in (key.rsplit(".", 1)[-1], key):
                if f"{name}={value}" in parts:
                    parts.remove(f"{name}={value}")
                    break
        return ",".join(parts)

    @property
    def ok(self) -> list[CellRecord]:
        return [r for r in self.results if r.status == "ok"]

    @property
    def diverged(self) -> list[CellRecord]:
        return [r for r in self.results if r.status == "diverged"]

    @property
    def failed(self) -> list[CellRecord]:
        return [r for r in self.results if not r.finished]

    def did_not_learn(self, metric: Metric) -> list[CellRecord]:
        """The finished seeds whose ``metric`` (the headline) does not beat the task's trivial baseline
        (the record's ``learned``, or :func:`beats` in a record from before it): they ran to the end and
        learned nothing, which is neither a divergence nor a failure."""
        return [
            r
            for r in self.ok
            if (
                r.learned is False
                if r.learned is not None
                else not beats(metric, r.metrics[metric.name], r.baselines.get(metric.name))
            )
        ]

    def values(self, metric: str) -> list[float]:
        """``metric`` of every finished seed that recorded it."""
        return [r.metrics[metric] for r in self.ok if metric in r.metrics]

    def finished_values(self, metric: str) -> dict[Any, float]:
        """Seed -> ``metric`` of every finished seed that recorded it (a record written before its task
        added the metric has none)."""
        return {seed_key(r, i): r.metrics[metric] for i, r in enumerate(self.results) if r.ok and metric in r.metrics}

    @property
    def diverged_seeds(self) -> list[Any]:
        return [seed_key(r, i) for i, r in enumerate(self.results) if r.status == "diverged"]

    def _timed(self, figure: str) -> list[CellRecord]:
        """The finished seeds that recorded a speed figure, in order: the seeds of :meth:`speed_values`,
        :meth:`speed_loads` and :meth:`speed_machines`, so that the three stay aligned."""
        return [r for r in self.ok if r.speed_figures()[figure] is not None]

    def speed_values(self, figure: str) -> list[float]:
        """A speed figure (see :data:`SPEED_FIGURES`) of every finished seed that recorded it."""
        return [r.speed_figures()[figure] for r in self._timed(figure)]  # type: ignore[misc]

    def speed_loads(self, figure: str) -> list[CellLoad | None]:
        """The load each seed of :meth:`speed_values` was timed under, in the same order (None: not
        recorded), so that a comparison of two sides' speed can tell whether they ran under the same."""
        return [self.loads.get(r.seed) if r.seed is not None else None for r in self._timed(figure)]

    def speed_machines(self, figure: str) -> list[str | None]:
        """The machine each seed of :meth:`speed_values` was timed on (its record's ``machine``: the CPU and
        any GPU, the CPU's vector extensions, the torch and lightning versions; None: not recorded), in the
        same order, so that a comparison of two sides' speed can tell whether they ran on the same one."""
        return [r.machine for r in self._timed(figure)]

    def speed_median(self, figure: str) -> float | None:
        """The median of :meth:`speed_values`: cells copied from a matrix that ran beside other work can be
        timed at twice their step time on a shared machine, and a few of them would move a mean."""
        values = self.speed_values(figure)
        return statistics.median(values) if values else None

    @property
    def status_without_ok(self) -> str:
        """What a group without a finished seed shows instead of numbers: its seeds diverged, failed, or were
        all scored on another split than the validation split and left out."""
        if self.diverged:
            return "diverged"
        return "left out (scored on the wrong split)" if self.wrong_split and not self.failed else "failed"

    def seeds_label(self, headline: Metric | None = None) -> str:
        """The seeds in the statistics (finished and diverged), then those that did not learn (with the
        ``headline`` metric), diverged or failed: ``3``, ``3 (1 diverged)``, ``3 (1 did not learn)``,
        ``2 (1 failed, not counted)``, ``3 (3 diverged; 1 failed, not counted)``."""
        extra = []
        not_learned = self.did_not_learn(headline) if headline is not None else []
        if not_learned:
            extra.append(f"{len(not_learned)} did not learn")
        if self.diverged:
            extra.append(f"{len(self.diverged)} diverged")
        if self.failed:
            extra.append(f"{len(self.failed)} failed, not counted")
        return f"{len(self.ok) + len(self.diverged)}" + (f" ({'; '.join(extra)})" if extra else "")


def seed_key(result: CellRecord, index: int) -> Any:
    """The seed that pairs a result with the other variants' results (its position if it has none)."""
    return f"cell {index}" if result.seed is None else result.seed


@dataclass(frozen=True)
class MatrixSettings:
    """What the report reads from the runner's copy of the matrix file (``blockbench.config.MatrixConfig``).

    A copy that no longer validates (an older matrix file, e.g. with ``tune_seed:``) is read key by
    key, leniently: its results are about to be rerun, and until then they must still be summarised."""

    description: str = ""
    baseline_variant: str | None = None
    targets: dict[str, dict[str, float]] = field(default_factory=dict)
    cells: int = 0  # the reported cells the matrix has (its axes' product; with seeds: {min, ...}, the first round)
    #: the axes comparisons are made within (``MatrixConfig.levels``: ``within:`` and the budget)
    levels: tuple[str, ...] = ()
    seeds: SeedPlan | None = None  # seeds in rounds (None: a fixed seed axis)
    seed_axis: int | None = None  # the seed axis's length (None: no seed axis, or seeds in rounds)
    #: task (or preset label) -> metric -> an absolute margin of practical equivalence overriding the task's
    margins: dict[str, dict[str, float]] = field(default_factory=dict)
    verdicts: bool = True
    #: a ladder's rungs, least compute first (each cell's ``rung`` axis; () without a ladder)
    rungs: tuple[str, ...] = ()
    #: each rung's training compute relative to the cell without the ladder, as the matrix file declares
    #: it (None where a rung declares none: the runner computes it, the report reads the cells' FLOPs)
    rung_computes: tuple[float | None, ...] = ()

    @classmethod
    def load(cls, matrix_dir: Path) -> MatrixSettings:
        raw = matrix_file_keys(matrix_dir / MATRIX_FILE)
        try:
            matrix = MatrixConfig.model_validate(raw)
        except ValidationError:
            return cls._lenient(raw)
        return cls(
            matrix.description,
            matrix.baseline_variant,
            matrix.targets,
            _cells(matrix.axes, matrix.seeds) * (len(matrix.ladder.rungs) if matrix.ladder else 1),
            tuple(matrix.levels),
            matrix.seeds,
            len(matrix.axes["seed"]) if "seed" in matrix.axes else None,
            matrix.margins,
            matrix.verdicts,
            tuple(matrix.ladder.names) if matrix.ladder else (),
            tuple(rung.compute for rung in matrix.ladder.rungs) if matrix.ladder else (),
        )

    @classmethod
    def _lenient(cls, raw: dict[str, Any]) -> MatrixSettings:
        """The settings of a matrix file that does not validate (or of none: hand-written results)."""
        targets = {
            str(task): {str(m): float(v) for m, v in (metrics or {}).items()}
            for task, metrics in (raw.get("targets") or {}).items()
        }
        axes = raw.get("axes") if isinstance(raw.get("axes"), dict) else {}
        lists = {key: values for key, values in axes.items() if isinstance(values, list)}
        within = [key for key in raw.get("within") or [] if key in lists]
        levels = (*within, *(key for key in ALWAYS_WITHIN if key in lists and key not in within))
        try:
            seeds = SeedPlan.model_validate(raw["seeds"]) if isinstance(raw.get("seeds"), dict) else None
        except ValidationError:
            seeds = None
        margins = {
            str(task): {str(m): float(v) for m, v in (metrics or {}).items()}
            for task, metrics in (raw.get("margins") or {}).items()
        }
        ladder = raw.get("ladder") if isinstance(raw.get("ladder"), dict) else {}
        rungs = [rung for rung in ladder.get("rungs") or [] if isinstance(rung, dict) and "name" in rung]
        computes = [rung.get("compute") for rung in rungs]
        return cls(
            str(raw.get("description") or ""),
            raw.get("baseline_variant"),
            targets,
            _cells(lists, seeds) if len(lists) == len(axes) else 0,
            (*levels, RUNG_AXIS) if rungs else levels,
            seeds,
            len(lists["seed"]) if "seed" in lists else None,
            margins,
            raw.get("verdicts") is not False,
            tuple(str(rung["name"]) for rung in rungs),
            tuple(float(c) if isinstance(c, (int, float)) else None for c in computes),
        )

    def without_result(self, matrix_dir: Path, results: int) -> int:
        """Cells of the matrix with no result yet: those its axes make and those begun (a cell.json)
        that have none, whichever is more (a run stopped part-way has begun only some of its cells)."""
        return max(self.cells, len(cell_files(matrix_dir))) - results


def _cells(axes: dict[str, list[Any]], seeds: SeedPlan | None) -> int:
    """The reported cells of a matrix's axes: their product, times the first round's seeds with
    ``seeds: {min, ...}`` (later rounds train only where a question is undecided); 0 without axes."""
    if not axes:
        return 0
    return math.prod(len(values) for values in axes.values()) * (seeds.min if seeds is not None else 1)


def load_groups(matrix_dir: Path, levels: tuple[str, ...] | None = None) -> list[Group]:
    """Every task x variant with a result, in matrix order. ``levels``: the matrix's level axes (default:
    its settings', :class:`MatrixSettings`)."""
    if levels is None:
        levels = MatrixSettings.load(matrix_dir).levels
    levels = (*levels, *(key for key in ALWAYS_WITHIN if key not in levels))  # the budget, even if the file lacks it
    groups: dict[tuple[str, str], Group] = {}
    for cell_file in cell_files(matrix_dir):
        result_file = cell_file.with_name(RESULT_FILE)
        if not result_file.is_file():
            continue  # not run yet (an interrupted matrix)
        cell = json.loads(cell_file.read_text())
        result = load_record(result_file)
        config = _config(cell_file.with_name(CONFIG_FILE))
        group = groups.get((cell["task"], cell["variant"]))
        if group is None:
            axes = cell.get("axes") or {}
            group = groups[cell["task"], cell["variant"]] = Group(
                cell["task"],
                cell.get("task_name", cell["task"]),
                cell["variant"],
                cell["index"],
                axes=axes,
                family=(config.get("model") or {}).get("family") if config else None,
                levels=tuple(key for key in levels if key in axes),
                task_section=config.get("task") if config and isinstance(config.get("task"), dict) else None,
            )
        group.index = min(group.index, cell["index"])
        if _scored_validation(config):
            group.results.append(result)
            group.plans.append(cell.get("plan"))
            load = read_load(cell_file.parent)
            if load is not None and result.seed is not None:
                group.loads[result.seed] = load
        else:
            group.wrong_split.append(result)
    for group in groups.values():
        group.results.sort(key=lambda r: r.seed or 0)
        group.wrong_split.sort(key=lambda r: r.seed or 0)
    ordered = sorted(groups.values(), key=lambda g: g.index)
    check_hardware(ordered)
    return ordered


def check_hardware(groups: list[Group]) -> None:
    """Raise :class:`MixedHardware` where cells that are compared trained on different hardware: the
    seeds of a variant (one side of a comparison) always, and all the variants of a task unless the
    matrix varies the hardware itself (an axis of :data:`HARDWARE_AXES`). Cells without a recorded
    hardware (failed ones) are left out."""
    by_variant = any(key in group.axes for group in groups for key in HARDWARE_AXES)
    sides: dict[tuple[str, ...], list[Group]] = {}
    for group in groups:
        sides.setdefault((group.task, group.variant) if by_variant else (group.task,), []).append(group)
    for side, members in sides.items():
        cells: dict[Hardware, list[str]] = {}
        for group in members:
            for i, record in enumerate(group.results):
                if record.finished and record.hardware is not None:
                    name = f"{group.task}/{group.variant}/seed{seed_key(record, i)}"
                    cells.setdefault(record.hardware, []).append(name)
        if len(cells) > 1:
            raise MixedHardware(_mixed_hardware_text(" ".join(side), cells))


def _mixed_hardware_text(side: str, cells: dict[Hardware, list[str]]) -> str:
    """The error of :func:`check_hardware`: which cells trained on which hardware, and the ways out."""
    return (
        f"{side}: its cells trained on different hardware ({hardware_listing(cells)}), so their numbers differ "
        "by the device or the precision, not only by the design and the seed, and they cannot be compared. "
        f"{HARDWARE_WAYS_OUT}"
    )


def _scored_validation(config: dict[str, Any] | None) -> bool:
    """Whether a reported cell's resolved config scored the validation split (true without a config:
    results written by hand, and configs older than ``task.eval_split``, which always did)."""
    task = (config or {}).get("task")
    return not isinstance(task, dict) or task.get("eval_split", VALIDATION_SPLIT) == VALIDATION_SPLIT


def _config(config_file: Path) -> dict[str, Any] | None:
    """A cell's resolved config (None without one: results written by hand)."""
    if not config_file.is_file():
        return None
    config = yaml.load(config_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return config if isinstance(config, dict) else None


def tuning_records(matrix_dir: Path) -> list[CellRecord]:
    """The records of a matrix's tuning cells (``<matrix>/tune/cells``): no statistic reads them, but
    their code, machine and time are part of the matrix's."""
    return [load_record(path) for path in sorted((matrix_dir / TUNE_DIR / CELLS_DIR).rglob(RESULT_FILE))]


@dataclass(frozen=True)
class TuningCell:
    """One tuning cell with a result: its task, variant label, rung (None without a ladder), the values it
    tuned (``{"optimizer.lr": 0.001}``), its seed and its record."""

    task: str
    variant: str
    rung: str | None
    values: dict[str, Any]
    seed: int | None
    record: CellRecord


def tuning_cells(matrix_dir: Path) -> list[TuningCell]:
    """Every tuning cell of a matrix with a result and a cell.json, in matrix order."""
    found = []
    for result_file in sorted((matrix_dir / TUNE_DIR / CELLS_DIR).rglob(RESULT_FILE)):
        cell_file = result_file.with_name(CELL_FILE)
        if not cell_file.is_file():
            continue
        cell = json.loads(cell_file.read_text())
        rung = (cell.get("axes") or {}).get(RUNG_AXIS)
        cell_values = cell.get("tuned") or {}
        found.append(
            (
                cell.get("index", 0),
                TuningCell(
                    cell["task"],
                    cell["variant"],
                    None if rung is None else str(rung),
                    cell_values,
                    cell.get("seed"),
                    load_record(result_file),
                ),
            )
        )
    return [cell for _, cell in sorted(found, key=lambda item: item[0])]


@dataclass(frozen=True)
class TuningCost:
    """What tuning one task x variant cost: its tuning cells with a result and their processes' seconds."""

    cells: int
    seconds: float


def tuning_costs(matrix_dir: Path) -> dict[tuple[str, str], TuningCost]:
    """(task, variant) -> the cost of its tuning cells (``<matrix>/tune/cells/<task>/<variant>/...``, named
    by their cell.json), in matrix order: the price of each variant's tuned value, which the summary states."""
    return _tuning_costs(matrix_dir, lambda cell: (cell.task, cell.variant))


def rung_tuning_costs(matrix_dir: Path) -> dict[tuple[str, str], TuningCost]:
    """(task, rung) -> the cost of a ladder's tuning at that rung, every variant's tuning cells of the task
    there (their processes' seconds, as :func:`tuning_costs`), in matrix order; empty without a ladder. The
    headroom check's cell is a tuning cell of the top rung and counts there."""
    return _tuning_costs(matrix_dir, lambda cell: (cell.task, cell.rung))


def _tuning_costs(matrix_dir: Path, key_of: Callable[[TuningCell], tuple[str, Any]]) -> dict[tuple, TuningCost]:
    """``key_of(cell)`` -> the cost of the tuning cells (:func:`tuning_cells`) with that key (None in its second
    place: left out), in the order of each key's first cell."""
    costs: dict[tuple[str, Any], TuningCost] = {}
    for cell in tuning_cells(matrix_dir):
        key = key_of(cell)
        if key[1] is None:
            continue
        before = costs.get(key, TuningCost(0, 0.0))
        costs[key] = TuningCost(before.cells + 1, before.seconds + (cell.record.wall_time_s or 0.0))
    return costs


@dataclass(frozen=True)
class BookCost:
    """What a results root cost: its reported and its tuning cells' process seconds, and how many of
    those cells resumed after an interruption (their records hold only the process that finished them,
    so the seconds are a lower bound when there are any)."""

    reported: float = 0.0
    tuning: float = 0.0
    resumed: int = 0


def book_cost(matrix_dirs: list[Path]) -> BookCost:
    """What a results root cost (:class:`BookCost`), each cell counted once. A matrix copies a cell another
    matrix of the root trained with the same config and code (``plan.trained_elsewhere``) instead of
    training it again, so a record whose config hash and code fingerprint were counted already is a copy
    and adds nothing (each matrix's own cost in the index counts its copies: what it would take alone)."""
    seen: set[tuple[str | None, str | None]] = set()
    totals = [0.0, 0.0]
    counted: list[CellRecord] = []
    for matrix_dir in matrix_dirs:
        reported = [load_record(path) for path in sorted((matrix_dir / CELLS_DIR).glob(f"*/*/*/{RESULT_FILE}"))]
        for kind, records in enumerate((reported, tuning_records(matrix_dir))):
            for record in records:
                key = (record.config_hash, record.code_fingerprint)
                if None not in key and key in seen:
                    continue
                seen.add(key)
                totals[kind] += record.wall_time_s or 0.0
                counted.append(record)
    return BookCost(totals[0], totals[1], resumed_cells(counted))


def resumed_note(resumed: int) -> str:
    """The caveat, to append to a cost's brackets, that a cost in cell-process time carries when
    ``resumed`` of its cells resumed after an interruption: a record keeps the wall time of the process
    that finished it, not of those before. Empty without such cells."""
    if not resumed:
        return ""
    return f"; a lower bound: {resumed} cell(s) resumed after an interruption count only their last process"


def resumed_cells(records: list[CellRecord]) -> int:
    """How many of ``records`` resumed from a checkpoint after an interruption."""
    return sum(bool(r.resumed_from_step) for r in records)


def machines(records: list[CellRecord]) -> list[str]:
    """The machines the cells ran on (``provenance.machine_description``), each once."""
    return sorted({r.machine for r in records if r.machine is not None})


def code_versions(records: list[CellRecord], lineage: Lineage = NO_LINEAGE) -> list[str]:
    """``commit 595b935 (clean tree)`` per distinct code version the cells ran with (with its count
    if there are several): a summary says which code made its numbers, and whether it was committed.
    Cells whose code fingerprint is not this checkout's are marked stale: the numbers are still those
    of their commit, but ``blockbench matrix`` here would train them again (``plan``'s "stale"), unless
    the results folder's ``lineage`` keeps them (then :func:`lineage_lines` names the steps)."""
    current = code_fingerprint()
    versions: dict[str, int] = {}
    for r in records:
        git = r.git
        if not git.commit:
            continue
        text = f"commit {git.commit[:7]}" + {True: " + uncommitted changes", False: " (clean tree)"}.get(git.dirty, "")
        if r.code_fingerprint not in (None, current) and not lineage.admits(r, current):
            text += ", stale at this checkout (its model, task, trainer or config code has changed since)"
        versions[text] = versions.get(text, 0) + 1
    if len(versions) <= 1:
        return list(versions)
    return [f"{text} ({n} cell{'s' if n != 1 else ''})" for text, n in versions.items()]


def lineage_lines(records: list[CellRecord], lineage: Lineage) -> list[str]:
    """One line per chain of lineage steps that keeps some of ``records`` current at this checkout
    though other code made them (:mod:`blockbench.store.lineage`): how many cells, and the steps, so that
    a reader knows which evidence the numbers rest on."""
    current = code_fingerprint()
    routes: dict[str, int] = {}
    for r in records:
        route = lineage.route(r, current) if r.code_fingerprint not in (None, current) else None
        if route:
            text = "; ".join(step.describe() for step in route)
            routes[text] = routes.get(text, 0) + 1
    return [f"{n} cell{'s' if n != 1 else ''} by lineage {text}" for text, n in routes.items()]


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
    """Whether the matrix file's results are verdicts (``verdicts: false`` marks a matrix that answers
    no design question: a demonstration such as the smoke test, or the empirical null's calibration)."""
    return matrix_file_keys(matrix_file).get("verdicts") is not False


def matrix_description(matrix_file: Path) -> str:
    """The matrix file's ``description`` ("" without one, or when the file does not parse)."""
    return str(matrix_file_keys(matrix_file).get("description") or "").strip()
