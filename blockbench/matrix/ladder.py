"""A scale ladder's rungs applied to a matrix's cells: each rung's settings, the settings that scale
with them, each rung's training compute, the checks made before anything trains, and the grid the top
rung may tune instead of the whole one.

A ladder (``ladder:`` in a matrix file, :class:`blockbench.matrixfile.LadderConfig`) trains every cell
of the axes at every rung. A cell at a rung is the cell without the ladder (its *reference*: base,
overrides, axes, tuned values) with the rung's overrides set and every setting of ``ladder.scale``
moved by its rule from its reference value: ``{with: trainer.max_steps}`` in proportion to the steps
(so that the training data and the warm-up grow with them and the epochs stay as they are), ``fixed``
as it is. A rung that sets nothing is the reference itself, the same config and config hash, so the
book's cells count for it (reused or copied, never trained again).

**Compute.** At a fixed width and batch a step's cost is proportional to the depth, so a rung's
training compute relative to its reference is (layers x steps) over the reference's, the layers of
every stack (the translator's encoder and decoder). Where a rung changes anything else of the model or
the batch, that ratio is not its compute, and the rung must declare one (``compute:``); where it can
be computed a declared value is checked against it. The rungs' computes must increase in the order
listed.

**The top rung's grid.** With ``ladder.top_grid: {points: n}`` the top rung tunes ``n`` values centred
on the one extrapolated from the rungs below (:func:`extrapolated_value`: a least-squares line of the
log of each lower rung's chosen value on the log of its compute, read at the top's), snapped to the
lattice of the ``tune:`` grid (:func:`lattice`: its values and the steps of its own ratio past its
ends that the tuner adds when a choice sits at an end), so the top rung's values are values the rungs
below could have tried.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ConfigError, RunConfig
from ..keys import known_keys, unknown_run_key
from ..matrixfile import LadderConfig, LadderRung
from .tuning import EXTENSION_STEPS, grid_step

#: how far a computed compute may stray from a declared one (relative)
COMPUTE_TOLERANCE = 1e-6
#: the model settings that the depth-times-steps compute lets differ between a rung and its reference
DEPTH_KEYS = ("n_layers", "n_encoder_layers", "n_decoder_layers")

_MISSING = object()


def key_problems(ladder: LadderConfig, source: str) -> list[str]:
    """The ladder's keys that are no run config setting (each rung's overrides, every scaled setting and
    the setting it follows), each with the keys meant (did you mean ...?), in ``source``'s words."""
    known = known_keys(RunConfig)
    problems = []
    where = [(f"rung '{rung.name}'", key) for rung in ladder.rungs for key in rung.overrides]
    where += [("ladder.scale", key) for key in ladder.scale]
    where += [(f"ladder.scale ({key})", rule.follows) for key, rule in ladder.scale.items() if rule.follows]
    for place, key in where:
        if key in known and known[key].definitions:
            continue
        message = unknown_run_key(key, known) if key not in known else "a section, not a setting: name its keys"
        problems.append(f"{source}: ladder: {place}: {key}: {message}")
    return list(dict.fromkeys(problems))


def setting(run: RunConfig, key: str) -> Any:
    """The value of dotted ``key`` in ``run``'s resolved config, or :data:`_MISSING` where the config has
    no such setting (another task's key)."""
    node: Any = run.resolved_dict()
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def missing_settings(ladder: LadderConfig, references: Sequence[RunConfig], source: str) -> list[str]:
    """The settings of ``ladder.scale`` that none of the cells (``references``: their configs without the
    ladder) has: a rule that moves nothing is a mistake (a key of a task the matrix does not train)."""
    return [
        f"{source}: ladder.scale: {key} is a setting of none of the matrix's cells (their tasks: "
        f"{', '.join(sorted({run.task.name for run in references}))}); remove it or scale a key they have"
        for key in ladder.scale
        if all(setting(run, key) is _MISSING for run in references)
    ]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def rung_settings(
    ladder: LadderConfig, rung: LadderRung, reference: RunConfig
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(the rung's overrides, the scaled settings that change)`` of the cell whose config without the
    ladder is ``reference``: each setting of ``ladder.scale`` that the cell has and holds a number, moved
    by its rule (a whole number for a setting that is one); unchanged settings are left out, so a rung
    that sets nothing gives the reference's config exactly. Raises ConfigError where a rule cannot apply."""
    scaled = {}
    for key, rule in ladder.scale.items():
        value = setting(reference, key)
        if value is _MISSING or value is None:
            continue  # another task's setting, or one left to its default rule (n_kv_heads null: every head)
        if not _number(value):
            raise ConfigError(f"ladder.scale: {key} is {value!r}, not a number; scale numeric settings only")
        ratio = 1.0
        if rule.follows is not None:
            before = setting(reference, rule.follows)
            after = rung.overrides.get(rule.follows, before)
            if not (_number(before) and _number(after)) or before <= 0:
                raise ConfigError(
                    f"ladder.scale: {key} follows {rule.follows}, which is {before!r} without the ladder and "
                    f"{after!r} at rung '{rung.name}'; follow a positive number"
                )
            ratio = after / before
        new = rule.scaled(value, ratio)
        if isinstance(value, int):
            if abs(new - round(new)) > 1e-9 * max(1.0, abs(new)):
                raise ConfigError(
                    f"ladder.scale: {key} ({value}) {rule.kind} {rule.follows} gives {new:g} at rung '{rung.name}', "
                    "not a whole number; choose rungs whose ratios keep it whole, or set it at each rung"
                )
            new = round(new)
        if new != value:
            scaled[key] = new
    return dict(rung.overrides), scaled


def _layer_steps(run: RunConfig) -> float:
    """Layers of every stack times the optimizer steps: a step's cost at a fixed width and batch is
    proportional to the depth (a decoder-only model's encoder and decoder depths are both its depth)."""
    model = run.resolved_model()
    return (model.encoder_layers + model.decoder_layers) * run.trainer.max_steps


def shape_change(reference: RunConfig, run: RunConfig) -> str:
    """What ``run`` changes of ``reference`` besides the depth and the steps that a step's cost depends
    on (``model.d_model 128 -> 256``), or '' where it changes nothing of the kind."""
    before, after = (r.resolved_model().model_dump(exclude=set(DEPTH_KEYS)) for r in (reference, run))
    changes = [f"model.{key} {before[key]!r} -> {after[key]!r}" for key in before if before[key] != after[key]]
    if reference.trainer.batch_size != run.trainer.batch_size:
        changes.append(f"trainer.batch_size {reference.trainer.batch_size} -> {run.trainer.batch_size}")
    return ", ".join(changes)


def rung_compute(reference: RunConfig, run: RunConfig) -> float | None:
    """``run``'s training compute relative to ``reference``'s (layers x steps, see the module docstring),
    or None where it changes the width, another model setting or the batch (:func:`shape_change`)."""
    if shape_change(reference, run):
        return None
    return _layer_steps(run) / _layer_steps(reference)


@dataclass(frozen=True)
class RungCell:
    """One cell of a rung as the ladder's checks see it: its label, its config and its config without the ladder."""

    label: str
    reference: RunConfig
    run: RunConfig


def rung_computes(
    ladder: LadderConfig, cells: Mapping[str, Sequence[RungCell]], source: str
) -> tuple[dict[str, float], list[str]]:
    """``(rung name -> its compute, the problems)``: each rung's compute computed from its cells (every
    cell of a rung must give the same) or declared where it cannot be computed, a declared value checked
    against the computed one, and the computes increasing in the order of the rungs."""
    computes: dict[str, float] = {}
    problems = []
    for rung in ladder.rungs:
        found = {cell.label: rung_compute(cell.reference, cell.run) for cell in cells.get(rung.name, ())}
        changed = next((cell for cell in cells.get(rung.name, ()) if shape_change(cell.reference, cell.run)), None)
        values = sorted({round(value, 9) for value in found.values() if value is not None})
        if changed is not None and rung.compute is None:
            problems.append(
                f"{source}: ladder: rung '{rung.name}' changes {shape_change(changed.reference, changed.run)} "
                f"({changed.label}), so its compute is not depth x steps; declare it: compute: <times the cell "
                "without the ladder>"
            )
            continue
        if len(values) > 1:
            listed = ", ".join(f"{label} {value:g}" for label, value in found.items() if value is not None)
            problems.append(
                f"{source}: ladder: rung '{rung.name}' gives its cells different computes ({listed}); set the "
                "same depth and steps for every cell of a rung"
            )
            continue
        computed = values[0] if values and changed is None else None
        declared = rung.compute
        if computed is not None and declared is not None and abs(declared - computed) > COMPUTE_TOLERANCE * computed:
            problems.append(
                f"{source}: ladder: rung '{rung.name}' declares compute {declared:g}, but its cells train "
                f"{computed:g} times the layers x steps of the cell without the ladder; correct compute: or "
                "the rung's settings"
            )
            continue
        value = rung.compute if rung.compute is not None else computed
        if value is not None:
            computes[rung.name] = value
    ordered = [(name, computes[name]) for name in ladder.names if name in computes]
    for (low, a), (high, b) in itertools.pairwise(ordered):
        if b <= a:
            problems.append(
                f"{source}: ladder: rung '{high}' has compute {b:g}, not above rung '{low}''s {a:g}; list the rungs "
                "from the least compute to the most"
            )
    return computes, problems


# the top rung's grid ---------------------------------------------------------------------------------


def lattice(written: Sequence[float], low: float, high: float, beyond: int = EXTENSION_STEPS) -> list[float]:
    """The values of the grid ``written`` (a ``tune:`` key's, two or more positive numbers) and those past
    its ends, one step of the grid's own ratio at that end after another (each to 4 significant digits,
    as :func:`blockbench.matrix.tuning.extension` steps), ascending, as far as needed to pass ``low``
    and ``high`` by ``beyond`` steps more."""
    ends = sorted(set(written))
    integer = all(isinstance(value, int) for value in written)
    values = list(ends)
    down, up = ends[0] / ends[1], ends[-1] / ends[-2]
    past = 0
    while past <= beyond:
        values.insert(0, grid_step(values[0], down, integer))
        past = past + 1 if values[0] < low else past
    past = 0
    while past <= beyond:
        values.append(grid_step(values[-1], up, integer))
        past = past + 1 if values[-1] > high else past
    return [value for i, value in enumerate(values) if value > 0 and value not in values[:i]]


def centred_grid(written: Sequence[float], centre: float, points: int) -> list[float]:
    """``points`` consecutive values of the lattice of ``written`` (:func:`lattice`) centred on the one
    nearest ``centre`` on a log scale (with an even number of points, the extra one on the side nearer
    ``centre``)."""
    values = lattice(written, centre, centre, beyond=points)
    logs = np.log(values)
    nearest = int(np.argmin(np.abs(logs - math.log(centre))))
    below = (points - 1) // 2
    if points % 2 == 0 and math.log(centre) > logs[nearest]:
        below = points // 2 - 1
    elif points % 2 == 0:
        below = points // 2
    start = min(max(nearest - below, 0), len(values) - points)
    return values[start : start + points]


def extrapolated_value(chosen: Sequence[tuple[float, float]], compute: float) -> float:
    """The value at ``compute`` of the least-squares line of log(value) on log(compute) through
    ``chosen`` (each rung below: its compute and its chosen value), two rungs or more."""
    if len(chosen) < 2:
        raise ValueError("extrapolating a tuned value needs the choices of two rungs or more")
    x = np.log([c for c, _ in chosen])
    y = np.log([v for _, v in chosen])
    slope, intercept = np.polyfit(x, y, 1)
    return float(math.exp(intercept + slope * math.log(compute)))
