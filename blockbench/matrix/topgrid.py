"""The top rung's tuning with ``ladder.top_grid``: a shorter grid centred on the learning rate the rungs
below point to, trained once they have all chosen.

Each lower rung of a ladder tunes the whole ``tune:`` grid (successive halving, extended past an end
that wins, :mod:`blockbench.matrix.tuning`). The top rung costs as much as all of them together, so
with ``top_grid: {points: n}`` it tunes only ``n`` values: centred on the value extrapolated from the
lower rungs' choices of the same task and design (a least-squares line of log value on log compute,
:func:`blockbench.matrix.ladder.extrapolated_value`), on the grid's lattice
(:func:`blockbench.matrix.ladder.centred_grid`). Until every lower rung's tuning has ended (complete,
with no value past an end still to add) the top rung's tuning cells are held back; with fewer than two
lower rungs that chose, the top rung tunes the whole grid. Every variant gets the same number of points
at the top rung, so the budget stays equal, and the tuner extends the centred grid past an end that
wins as it extends any other.

The grids are decided from the tunings on disk (:func:`top_grids`), never from what a run remembers,
so a resumed run centres where the run it resumes did.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from ..matrixfile import RUNG_AXIS
from .expand import Cell, Expansion, design_label
from .ladder import centred_grid, extrapolated_value
from .tuning import Tuning, extension

Key = tuple[str, str]


def centred(expansion: Expansion) -> bool:
    """Whether the matrix's top rung tunes a centred grid (``ladder.top_grid``)."""
    ladder = expansion.matrix.ladder
    return ladder is not None and ladder.top_grid is not None


def held_back(expansion: Expansion, cell: Cell) -> bool:
    """Whether ``cell`` is a tuning cell of the top rung of a centred grid, as expanded: a stand-in that
    trains only where the centred grid has its value (see the module docstring)."""
    ladder = expansion.matrix.ladder
    return centred(expansion) and ladder is not None and cell.axes.get(RUNG_AXIS) == ladder.top.name


def _rungs_of_designs(expansion: Expansion) -> dict[tuple[str, str], dict[str, str]]:
    """(task, design) -> rung -> the variant label of that design at that rung."""
    found: dict[tuple[str, str], dict[str, str]] = {}
    for cell in expansion.cells:
        found.setdefault((cell.task, design_label(cell.axes)), {})[cell.axes[RUNG_AXIS]] = cell.variant
    return found


def ended(tuning: Tuning | None, grid: Mapping[str, list[Any]]) -> bool:
    """Whether a lower rung's ``tuning`` has ended: complete, and the tuner adds no value past an end."""
    return tuning is not None and tuning.complete and extension(tuning, dict(grid)) is None


def top_grids(expansion: Expansion, tunings: Mapping[Key, Tuning]) -> dict[Key, dict[str, list[Any]]]:
    """(task, top-rung variant) -> its centred grid, for each whose lower rungs' tunings have all ended
    (the others wait); the whole grid where fewer than two of them chose."""
    ladder = expansion.matrix.ladder
    if ladder is None or ladder.top_grid is None:
        return {}
    (key, written), top = next(iter(expansion.matrix.tune.items())), ladder.top.name
    grids = {}
    for (task, _), variants in _rungs_of_designs(expansion).items():
        lower = [(expansion.computes[rung], tunings.get((task, variants[rung]))) for rung in ladder.names[:-1]]
        if not all(ended(tuning, expansion.matrix.tune) for _, tuning in lower):
            continue
        chosen = [(compute, t.chosen.values[key]) for compute, t in lower if t is not None and t.chosen is not None]
        if len(chosen) < 2:
            grids[task, variants[top]] = {key: list(written)}
            continue
        centre = extrapolated_value(chosen, expansion.computes[top])
        grids[task, variants[top]] = {key: centred_grid(written, centre, ladder.top_grid.points)}
    return grids


def centred_cells(expansion: Expansion, tuning: list[Cell], tunings: Mapping[Key, Tuning]) -> list[Cell]:
    """The top rung's tuning cells that the centred grids (:func:`top_grids`) call for and ``tuning``
    lacks, numbered after it: every value of the grid at every tuning seed, as successive halving starts."""
    have = {cell.key for cell in tuning}
    added: list[Cell] = []
    for (task, variant), grid in top_grids(expansion, tunings).items():
        template = next(
            cell
            for cell in expansion.tuning
            if (cell.task, cell.variant) == (task, variant) and held_back(expansion, cell)
        )
        for values in itertools.product(*grid.values()):
            tuned = dict(zip(grid, values, strict=True))
            cells = expansion.added_candidate(template, tuned, start=len(tuning) + len(added))
            added += [cell for cell in cells if cell.key not in have]
    return added
