"""The analysis plan of a matrix file: what the runner commits to before the first cell trains.

:func:`analysis_plan` gathers everything that decides the matrix's verdicts (see
:mod:`blockbench.prereg`) from the validated matrix and its cells' configs: the decision rule's
version, α and futility bound (``blockbench.prereg``), the looks of ``seeds:``, the baseline
variant, per task the headline metric's direction, margin (the matrix file's ``margins:`` or the
task's declared one) and saturation, and the tuning grid with its seeds and extension steps. The
runner records it in ``plan.json`` and its hash in each cell's ``cell.json``.
"""

from __future__ import annotations

from collections import Counter

from blockbench.tasks import TASK_CONFIGS

from ..prereg import ALPHA, FUTILITY, RULE_VERSION, AnalysisPlan, TaskPlan
from .expand import Expansion, design_label
from .tuning import EXTENSION_STEPS


def analysis_plan(expansion: Expansion) -> AnalysisPlan:
    """The plan the reported cells of ``expansion`` will be decided by (see the module docstring)."""
    matrix = expansion.matrix
    tasks: dict[str, TaskPlan] = {}
    for cell in expansion.cells:
        if cell.task in tasks:
            continue
        headline = cell.run.task.metrics[0]
        declared = TASK_CONFIGS[cell.run.task.name]
        override = (matrix.margins.get(cell.task) or matrix.margins.get(cell.run.task.name) or {}).get(headline.name)
        margin = getattr(declared, "margin", None)
        saturation = getattr(declared, "saturation", None)
        tasks[cell.task] = TaskPlan(
            metric=headline.name,
            higher_is_better=headline.higher_is_better,
            margin=float(override) if override is not None else (margin.value if margin else None),
            margin_relative=override is None and bool(margin and margin.relative),
            saturation=saturation.distance if saturation else None,
            saturation_of=saturation.of if saturation else None,
        )
    seeds = matrix.seeds
    per_side = Counter((cell.task, cell.variant) for cell in expansion.cells)
    looks = list(seeds.sizes) if seeds else [max(per_side.values(), default=0)]
    # the report's default baseline: the first cell's variant (a ladder's without its rung: every rung's baseline)
    first = design_label(expansion.cells[0].axes) if expansion.cells else None
    return AnalysisPlan(
        rule=RULE_VERSION,
        alpha=ALPHA,
        futility=FUTILITY if seeds and len(seeds.sizes) > 1 else None,
        looks=looks,
        baseline_variant=matrix.baseline_variant or first,
        tasks=tasks,
        tune={key: list(values) for key, values in matrix.tune.items()},
        tune_seeds=list(matrix.tune_seeds) if matrix.tune else [],
        extension_steps=EXTENSION_STEPS if matrix.tune else 0,
    )
