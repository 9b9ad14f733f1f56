"""The summary's ``Tuning`` section, read from a matrix's ``tune.json`` (written by the runner's
tuning rules, ``blockbench.matrix.tuning``): each variant's candidates, their scores and the choice,
and what the tuning cost per variant (its tuning cells' process time).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..store.layout import TUNE_FILE
from ..store.record import read_tuning
from .results import tuning_costs
from .table import row as _row


def grid_edges(tuned: dict[str, Any]) -> list[str]:
    """The tuned keys whose chosen value is the lowest or highest numeric value of the grid (a variant
    record of ``tune.json``): ``["lowest lr"]``. The variant's best may lie beyond the values tried,
    as in a learning-rate sweep whose best point is an end of it; empty if none is (or no choice)."""
    chosen = tuned.get("chosen")
    if not chosen:
        return []
    edges = []
    for key, value in chosen.items():
        tried = {c["values"].get(key) for c in tuned["candidates"]}
        if len(tried) < 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in tried):
            continue
        name = key.rsplit(".", 1)[-1]
        if value == min(tried):
            edges.append(f"lowest {name}")
        elif value == max(tried):
            edges.append(f"highest {name}")
    return edges


def chosen_text(tuned: dict[str, Any] | None) -> str | None:
    """A variant's tuned value as the summary names it, ``lr=0.0003 (lowest lr tried)`` when it lies at
    an edge of the grid (:func:`grid_edges`); None without a choice."""
    if not tuned or not tuned.get("chosen_label"):
        return None
    edges = grid_edges(tuned)
    return tuned["chosen_label"] + (f" ({', '.join(edges)} tried)" if edges else "")


def tuning_section(matrix_dir: Path) -> list[str]:
    """The summary's ``Tuning`` section, from ``tune.json``: what was tuned and how, then per task a
    table of variant x candidate scores, the choice in bold, and each variant's tuned value (the value
    its reported seeds, the rows of the task's tables, trained with). Empty without ``tune.json``."""
    record = read_tuning(Path(matrix_dir))
    if not record or not record.get("tasks"):
        return []
    keys = ", ".join(f"`{key}`" for key in record["keys"])
    seeds = record.get("tune_seeds") or [record.get("tune_seed")]
    how = (
        f"by successive halving over the tuning seeds {', '.join(map(str, seeds))} (none a reported seed): every "
        "candidate trained on the first, the better half (rounded up) again on the next, and the best mean over the "
        "last rung's seeds was chosen"
        if len(seeds) > 1
        else f"every candidate trained once on the tuning seed {seeds[0]} (not a reported seed); the best was chosen"
    )
    lines = [
        "## Tuning",
        "",
        f"Each variant's reported seeds trained at its own {keys}, {how}. Scores are the final value of the task's "
        "headline metric on the task's tuning split (`task.eval_split: tuning`), which no reported metric uses. A "
        "diverged or failed candidate cannot be chosen; of equal scores the one listed first is. **Bold**: the "
        f"choice; a score over several seeds is their mean (n seeds); `{TUNE_FILE}` has every cell's score.",
        "",
    ]
    lines += _extension_lines(record)
    if any(grid_edges(t) for entry in record["tasks"].values() for t in entry["variants"].values()):
        steps = record.get("extension_steps")
        went = f" (the tuner went up to {steps} values past the grid's ends, and stopped there)" if steps else ""
        lines += [
            f"A tuned value marked *lowest* or *highest tried* is an end of the values tried{went}: the variant's "
            "best may lie beyond it, so its verdict may understate it. Add values past that end to `tune:` and run "
            "the matrix again (the finished tuning cells are reused).",
            "",
        ]
    for task, entry in record["tasks"].items():
        arrow = "↑" if entry["higher_is_better"] else "↓"
        labels = _in_value_order([c for variant in entry["variants"].values() for c in variant["candidates"]])
        lines += [f"**{task}**: {entry['metric']} {arrow} on the tuning split", ""]
        lines += [_row(["variant", *labels, "tuned value"]), "|" + "---|" * (len(labels) + 2)]
        for variant, tuned in entry["variants"].items():
            by_label = {c["label"]: c for c in tuned["candidates"]}
            cells = [_candidate_cell(by_label.get(label), label == tuned["chosen_label"]) for label in labels]
            chosen = chosen_text(tuned) or "none: no candidate finished, the seeds were not trained"
            lines.append(_row([variant, *cells, chosen]))
        lines.append("")
    return lines


def _in_value_order(candidates: list[dict[str, Any]]) -> list[str]:
    """The candidates' labels once each, ordered by their values where these are all numbers (a grid the
    tuner extended reads in order, its added values at the ends), else as listed."""
    labels = {c["label"]: tuple(c["values"].values()) for c in candidates}
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for values in labels.values() for v in values)
    return sorted(labels, key=lambda label: labels[label]) if numeric else list(labels)


def _extension_lines(record: dict[str, Any]) -> list[str]:
    """Which values the tuner added past the grid's ends, per variant, and where each variant's choice ended:
    interior (the grid now holds its best) or still at an end (the cap, or the config refused the next value)."""
    lines = []
    for task, entry in record["tasks"].items():
        for variant, tuned in entry["variants"].items():
            added = [c["label"] for c in tuned["candidates"] if c.get("added")]
            if not added:
                continue
            edges = grid_edges(tuned)
            ended = f"still at the {', '.join(edges)} tried" if edges else "the best is now inside the values tried"
            lines.append(f"- {task} {variant}: added {', '.join(added)}; {ended}")
    if not lines:
        return []
    grid = ", ".join(f"`{key}: {values}`" for key, values in (record.get("grid") or {}).items())
    return [
        f"The grid as written ({grid}) was extended where a variant's choice sat at one of its ends: the tuner added "
        f"the next value past that end, one step of the grid's own ratio, as one more candidate (up to "
        f"{record.get('extension_steps')} per end), until the best was inside the values tried or the next value "
        "lost, diverged or failed:",
        "",
        *lines,
        "",
    ]


def _candidate_cell(option: dict[str, Any] | None, chosen: bool) -> str:
    """A candidate's score (4 significant digits, as the runner's lines), bold if chosen; its status if it has none."""
    if option is None:
        return ""
    score = option.get("score")
    if option["status"] != "ok" or score is None or not math.isfinite(score):
        return option["status"] if option["status"] != "ok" else f"no score ({score})"
    text = f"{score:.4g}"
    seeds = len(option.get("trials") or [])
    text += f" ({seeds} seeds)" if seeds > 1 else ""
    return f"**{text}**" if chosen else text


def tuning_cost_lines(matrix_dir: Path) -> list[str]:
    """What tuning cost, per task x variant: its tuning cells and their processes' seconds summed (the
    price of each variant's tuned value, beside the reported cells' own time); empty without tuning cells."""
    costs = tuning_costs(Path(matrix_dir))
    if not costs:
        return []
    lines = [
        "Tuning cost per variant: the tuning cells that have a result, and the seconds of their processes summed "
        "(cell-process time, as a run on one slot would take):",
        "",
        _row(["task", "variant", "tuning cells", "cell-process time (s)"]),
        "|---|---|---|---|",
    ]
    lines += [_row([task, variant, str(cost.cells), f"{cost.seconds:,.0f}"]) for (task, variant), cost in costs.items()]
    cells, seconds = sum(c.cells for c in costs.values()), sum(c.seconds for c in costs.values())
    return [*lines, _row(["all", "", str(cells), f"{seconds:,.0f}"]), ""]
