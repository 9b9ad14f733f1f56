"""A matrix file expanded into cells: every reported cell (the axes' product) and, with ``tune:``,
every tuning cell, each validated before anything is written; their labels (variant, candidate,
TensorBoard run) and the folder each cell gets (``cells/<task>/<variant>/seed<k>``, a tuning cell's
under ``tune/cells/``).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..config import ConfigError, RunConfig, build_run_config, describe_validation_error, load_yaml
from ..matrixfile import REPLICA_AXIS, REPLICA_SEED_STRIDE, RUNG_AXIS, LadderRung, MatrixConfig
from ..store.layout import (
    NON_VARIANT_AXES,
    TUNE_DIR,
    axis_names,
    candidate_label,
    cell_directory,
    folder_name,
    tuning_cell_directory,
)
from ..store.tbruns import TensorBoardRun, tensorboard_runs, tuning_run_name
from ..tensorboard.logdirs import LogdirCell
from ..tensorboard.names import cell_hparams
from .ladder import RungCell, centred_grid, key_problems, missing_settings, rung_computes, rung_settings
from .tuning import REPORT, TUNE

#: what a tuning cell sets in its task: it validates on the task's tuning split, which no reported
#: metric uses (a value picked on the split it is reported on fits that split's noise)
TUNING_SPLIT = {"task.eval_split": "tuning"}


#: the key of a ``task:`` axis entry (a mapping) that holds settings for that task's cells only, e.g. a
#: longer budget for a task that learns slower: ``{name: translation_text, ..., overrides: {trainer.max_steps: 2000}}``
TASK_OVERRIDES = "overrides"


def task_overrides(axes: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a ``task:`` axis entry's own ``overrides:`` (dotted keys for its cells alone) from the task
    section: ``(axes with the entry without them, the overrides)``; raises ConfigError if they are not a
    mapping of dotted keys outside the task section."""
    task = axes.get("task")
    if not isinstance(task, dict) or TASK_OVERRIDES not in task:
        return axes, {}
    task = dict(task)
    own = task.pop(TASK_OVERRIDES)
    label = task.get("label") or task.get("name")
    if not isinstance(own, dict) or not all(isinstance(key, str) and "." in key for key in own):
        raise ConfigError(
            f"{path}: task '{label}': {TASK_OVERRIDES} must map dotted keys to values (e.g. {TASK_OVERRIDES}: "
            f"{{trainer.max_steps: 2000}}), got {own!r}"
        )
    inside = [key for key in own if key.split(".")[0] in ("task", "seed")]
    if inside:
        raise ConfigError(
            f"{path}: task '{label}': {TASK_OVERRIDES} sets {', '.join(inside)}; set task keys in the task entry "
            "itself, and seeds with the seed axis or seeds:"
        )
    return {**axes, "task": task}, own


@dataclass(frozen=True)
class Cell:
    index: int
    run: RunConfig
    task: str
    variant: str
    seed: int
    axes: dict[str, Any]
    #: the cell's TensorBoard run: its log folder (``tb/lm``, a tuning cell's ``tb_tune/lm``) and its name
    #: there (``post/seed0``, ``post/lr=0.001/seed1000``; see ``blockbench.store.tbruns.tensorboard_runs``)
    tb_run: TensorBoardRun | None = None
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
    def tb(self) -> TensorBoardRun:
        """The cell's TensorBoard run (:attr:`tb_run`), which :func:`expand_matrix` names; raises
        ValueError for a cell made without it."""
        if self.tb_run is None:
            raise ValueError(f"{self.key}: no TensorBoard run; take cells from blockbench.matrix.expand.expand_matrix")
        return self.tb_run

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
        return cell_hparams(self.task, self.axes, self.tuned, self.phase)

    @property
    def logdir_cell(self) -> LogdirCell:
        """What the cell's TensorBoard log folder needs of it (``blockbench.tensorboard.logdirs``): its
        labels, run and HParams row, its task's metrics and throughput unit, and whether it logs the
        logit lens and the loss curve."""
        task = self.run.task
        return LogdirCell(
            task=self.task,
            variant=self.variant,
            seed=self.seed,
            tb=self.tb,
            hparams=self.hparams,
            metrics=task.metrics,
            throughput_unit=task.throughput_unit,
            logit_lens=bool(getattr(task, "logit_lens", False)),
            loss_curve=bool(self.run.trainer.curve_interval),
        )


def variant_label(axes: dict[str, Any]) -> str:
    """``{"model.norm_placement": "pre"}`` -> ``norm_placement=pre``; the last key part unless ambiguous."""
    keys = [k for k in axes if k not in NON_VARIANT_AXES]
    return ",".join(f"{name}={axes[key]}" for name, key in zip(axis_names(keys), keys, strict=True)) or "default"


def design_label(axes: dict[str, Any]) -> str:
    """The variant label of a cell's ``axes`` without its ladder rung: ``norm_placement=post`` for the
    cell ``norm_placement=post,rung=4x`` (the same design at every rung)."""
    return variant_label({key: value for key, value in axes.items() if key != RUNG_AXIS})


def load_matrix(path: str | Path) -> tuple[MatrixConfig, list[Cell]]:
    """Read and validate a matrix file and every cell it expands to (its tuning cells too, see
    :func:`expand_matrix`); return the matrix and its reported cells; raise ConfigError listing all problems."""
    expansion = expand_matrix(path)
    return expansion.matrix, expansion.cells


@dataclass(frozen=True)
class Expansion:
    """A matrix file, read and validated: its reported cells (the axes' product), its tuning cells
    (``tune:``, see :mod:`blockbench.matrix.tuning`) and what builds a cell's config."""

    path: Path
    matrix: MatrixConfig
    base: dict[str, Any]
    cells: list[Cell] = field(default_factory=list)
    tuning: list[Cell] = field(default_factory=list)
    #: a ladder's rungs' training computes, relative to the cell without the ladder (see ``ladder_checks``)
    computes: dict[str, float] = field(default_factory=dict)

    def grid(self, cell: Cell) -> dict[str, list[Any]]:
        """The ``tune:`` grid ``cell``'s variant tunes at first: the matrix's, but at the top rung of a
        ladder with ``top_grid:`` its ``points`` values centred on the grid's middle value, which stand
        in until the rungs below have chosen and the top rung's grid is centred on their extrapolation
        (``blockbench.matrix.topgrid``)."""
        ladder = self.matrix.ladder
        if ladder is None or ladder.top_grid is None or cell.axes.get(RUNG_AXIS) != ladder.top.name:
            return dict(self.matrix.tune)
        (key, written), points = next(iter(self.matrix.tune.items())), ladder.top_grid.points
        return {key: centred_grid(written, sorted(written)[(len(written) - 1) // 2], points)}

    def run_config(self, axes: dict[str, Any], extra: dict[str, Any] | None = None) -> RunConfig:
        """The config of the cell at ``axes`` with ``extra`` keys set (tuned values, a tuning seed);
        raises ConfigError. A ``replica`` axis is not a config key: replica i shifts the seed by
        i x REPLICA_SEED_STRIDE (copies of one model on disjoint seeds, the empirical null). Nor is a
        ladder's ``rung``: the cell at a rung is the cell without it with the rung's settings set
        (:func:`blockbench.matrix.ladder.rung_settings`)."""
        axes = dict(axes)
        rung = axes.pop(RUNG_AXIS, None)
        reference = self._run_config(axes, extra)
        if rung is None or self.matrix.ladder is None:
            return reference
        return self.at_rung(axes, extra, reference, self.matrix.ladder.rung(rung))

    def at_rung(
        self, axes: dict[str, Any], extra: dict[str, Any] | None, reference: RunConfig, rung: LadderRung
    ) -> RunConfig:
        """The config of the cell at ``axes`` (``extra`` set) at ``rung``, ``reference`` being its config
        without the ladder; raises ConfigError (a rung setting a key the cell's task entry sets too)."""
        assert self.matrix.ladder is not None
        _, own = task_overrides(dict(axes), self.path)
        clash = sorted(set(rung.overrides) & set(own))
        if clash:
            raise ConfigError(
                f"{self.path}: ladder: rung '{rung.name}' sets {', '.join(clash)}, which the task entry's "
                f"{TASK_OVERRIDES}: sets too; remove it from one of them"
            )
        overrides, scaled = rung_settings(self.matrix.ladder, rung, reference)
        if not overrides and not scaled:
            return reference  # the cell without the ladder: the same config, so the same hash
        where = {
            **{key: f"by {self.path.name}'s ladder rung '{rung.name}'" for key in overrides},
            **{key: f"by {self.path.name}'s ladder.scale at rung '{rung.name}'" for key in scaled},
        }
        return self._run_config(axes, {**overrides, **scaled, **(extra or {})}, where)

    def _run_config(
        self, axes: dict[str, Any], extra: dict[str, Any] | None = None, where: dict[str, str] | None = None
    ) -> RunConfig:
        """The config of the cell at ``axes`` (no rung) with ``extra`` keys set, ``where`` saying where
        those of them a ladder set came from."""
        axes = dict(axes)
        if REPLICA_AXIS in axes:
            replica = self.matrix.axes[REPLICA_AXIS].index(axes.pop(REPLICA_AXIS))
            axes["seed"] = int(axes.get("seed", 0)) + replica * REPLICA_SEED_STRIDE
        axes, own = task_overrides(axes, self.path)
        # whole sections first ("task: wikitext103"), so that deeper keys ("task.seq_len") refine them
        settings = {**self.matrix.overrides, **own, **axes, **(extra or {})}
        # where each key was set, for a config error to name the place to fix
        origins = {
            **{key: f"in {self.path.name}'s overrides:" for key in self.matrix.overrides},
            **{key: f"in {self.path.name}'s task axis entry's {TASK_OVERRIDES}:" for key in own},
            **{key: f"by {self.path.name}'s axis {key}" for key in axes},
            **{key: f"by {self.path.name}'s tune: (a tuning cell)" for key in extra or {}},
            **(where or {}),
        }
        base = str(self.path.parent / self.matrix.base) if self.matrix.base else ""
        # copies: a section given as a value (a ``task:`` axis entry) must not enter this cell's config by
        # reference, where a later key ("task.eval_split" of a tuning cell) would write into the matrix's axis
        ordered = {key: copy.deepcopy(value) for key, value in sorted(settings.items(), key=lambda i: i[0].count("."))}
        return build_run_config(self.base, ordered, source=base, origins=origins)

    def tuning_cell(self, cell: Cell, tuned: dict[str, Any], seed: int, index: int) -> Cell:
        """The tuning cell of ``cell``'s task x variant (a reported or tuning cell of it) at the values
        ``tuned`` and tuning seed ``seed``, validating on the task's tuning split; raises ConfigError."""
        axes = {key: value for key, value in cell.axes.items() if key != "seed"}
        run = self.run_config(axes, {**tuned, **TUNING_SPLIT, "seed": seed})
        seeded = {**axes, "seed": run.seed} if "seed" in cell.axes else axes
        return Cell(index, run, cell.task, cell.variant, run.seed, seeded, phase=TUNE, tuned=dict(tuned))

    def added_candidate(self, template: Cell, tuned: dict[str, Any], start: int) -> list[Cell]:
        """The tuning cells of a candidate the tuner adds past an end of the grid (see
        :func:`blockbench.matrix.tuning.extension`): ``template``'s (a tuning cell of the variant) at the
        values ``tuned``, one per tuning seed, numbered from ``start``; raises ConfigError."""
        logdir, variant = template.tb.logdir, template.tb.name.split("/", 1)[0]  # <variant>/<candidate>/seed<k>
        cells = [self.tuning_cell(template, tuned, seed, start + i) for i, seed in enumerate(self.matrix.tune_seeds)]
        return [
            replace(cell, tb_run=TensorBoardRun(logdir, tuning_run_name(variant, tuned, cell.seed))) for cell in cells
        ]

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
        raise ConfigError(
            "\n".join(f"{path}: {line}" for line in describe_validation_error(exc, matrix=MatrixConfig))
        ) from None
    base: dict[str, Any] = {}
    if matrix.base:
        base = load_yaml((path.parent / matrix.base).resolve())
    expansion = Expansion(path, matrix, base)

    if matrix.ladder is not None and (unknown := key_problems(matrix.ladder, str(path))):
        raise ConfigError("\n".join(unknown))  # every cell would fail alike: say it once
    cells, problems = [], []
    phase = REPORT if matrix.tune else None
    # seeds: {min, max, step} is a seed axis of every seed the matrix may train (the runner trains them in rounds);
    # a ladder's rungs a pseudo-axis, before the seeds
    rungs = {RUNG_AXIS: matrix.ladder.names} if matrix.ladder is not None else {}
    axes_values = {**matrix.axes, **rungs, **({"seed": matrix.seed_values} if matrix.seeds else {})}
    for index, values in enumerate(itertools.product(*axes_values.values())):
        axes = dict(zip(axes_values, values, strict=True))
        try:
            run = expansion.run_config(axes)
        except ConfigError as exc:
            problems += [f"{path} [cell {axes_text(axes)}]: {line}" for line in str(exc).splitlines()]
            continue
        cells.append(Cell(index, run, run.task.display_name, variant_label(axes), run.seed, axes, phase=phase))
    computes, ladder_problems = ladder_checks(expansion, cells) if not problems else ({}, [])
    expansion = replace(expansion, computes=computes)
    tuning, tuning_problems = tuning_cells(expansion, cells)
    problems += ladder_problems + folder_problems(path, cells) + tuning_problems + folder_problems(path, tuning)
    if problems:
        # the same mistake usually breaks every cell: report each distinct problem once
        raise ConfigError("\n".join(dict.fromkeys(problems)))
    # runs in a log folder per task: tb/lm + post/seed0; a tuning cell's tb_tune/lm + post/lr=0.001/seed1000
    reported_runs, tuning_runs = tensorboard_runs(cells, tuning)
    cells = [replace(cell, tb_run=run) for cell, run in zip(cells, reported_runs, strict=True)]
    tuning = [replace(cell, tb_run=run) for cell, run in zip(tuning, tuning_runs, strict=True)]
    return replace(expansion, cells=cells, tuning=tuning)


def ladder_checks(expansion: Expansion, cells: list[Cell]) -> tuple[dict[str, float], list[str]]:
    """A ladder's rungs' computes and what is wrong with the ladder as its cells show (see
    :mod:`blockbench.matrix.ladder`): a rung whose compute cannot be computed and is not declared, or
    differs from the declared one, computes that do not increase, a scaled setting no cell has."""
    ladder = expansion.matrix.ladder
    if ladder is None:
        return {}, []
    by_rung: dict[str, list[RungCell]] = {}
    seen = set()
    for cell in cells:
        if (cell.task, cell.variant) in seen:
            continue  # one cell of each task x variant at each rung: the seeds share its settings
        seen.add((cell.task, cell.variant))
        axes = {key: value for key, value in cell.axes.items() if key != RUNG_AXIS}
        rung_cell = RungCell(f"{cell.task}/{cell.variant}", expansion.run_config(axes), cell.run)
        by_rung.setdefault(cell.axes[RUNG_AXIS], []).append(rung_cell)
    source = str(expansion.path)
    references = [rung_cell.reference for group in by_rung.values() for rung_cell in group]
    computes, problems = rung_computes(ladder, by_rung, source)
    return computes, problems + missing_settings(ladder, references, source)


def tuning_cells(expansion: Expansion, cells: list[Cell]) -> tuple[list[Cell], list[str]]:
    """The tuning cells of a matrix with ``tune:``: for each task x variant of ``cells``, one per
    combination of the candidates and tuning seed (``tune_seeds``; successive halving trains only some,
    see :mod:`blockbench.matrix.tuning`), each validating on its task's tuning split; and the problems
    that keep them from running (a candidate the config rejects, a tuning seed that is also a reported one)."""
    matrix, path = expansion.matrix, expansion.path
    if not matrix.tune:
        return [], []
    problems = []
    seeds = sorted({cell.seed for cell in cells})
    reported = sorted(set(matrix.tune_seeds) & set(seeds))
    if reported:
        problems.append(
            f"{path}: tune_seeds {', '.join(map(str, reported))} also reported ({', '.join(map(str, seeds))}); a value "
            "picked on a run fits that run's noise, so a tuning run must not be reported: set tune_seeds to seeds "
            f"the matrix does not report, e.g. tune_seeds: [{max(seeds) + 1000}, {max(seeds) + 1001}]"
        )
    variants: dict[tuple[str, str], Cell] = {}  # the first reported cell of each task x variant
    for cell in cells:
        variants.setdefault((cell.task, cell.variant), cell)
    tuning = []
    for cell in variants.values():
        grid = expansion.grid(cell)
        for seed, values in itertools.product(matrix.tune_seeds, itertools.product(*grid.values())):
            tuned = dict(zip(grid, values, strict=True))
            try:
                tuning.append(expansion.tuning_cell(cell, tuned, seed, len(tuning)))
            except ConfigError as exc:
                axes = {key: value for key, value in cell.axes.items() if key != "seed"}
                where = f"{path} [tuning cell {axes_text({**axes, **tuned})}]"
                problems += [f"{where}: {line}" for line in str(exc).splitlines()]
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
                f"{path}: cells [{axes_text({**owner.axes, **owner.tuned})}] and "
                f"[{axes_text({**cell.axes, **cell.tuned})}] would share the folder {folder}; give their tasks "
                "distinct task.label values or make the axis (or tune) values distinct"
            )
    return problems


def axes_text(axes: dict[str, Any]) -> str:
    """``task=lm, seed=0``: a cell's axis values in messages."""
    return ", ".join(f"{k}={v}" for k, v in axes.items())
