"""The summary's "Logit lens" section of a task: where in depth each variant's prediction forms.

The LM and translation tasks log, at each validation, the loss of every decoder block's output decoded
through the final norm and the output head (``val/lens/layer{i}``, see ``tasks.lens``); the history in
``result.json`` keeps them. The section shows the last validation's: one row per variant, one column
per block, the mean over the finished seeds. A task without lens values (the ViT classifies from its
CLS token and has none; a task run with ``task.logit_lens: false``) gets no section.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from blockbench.tasks.configs.lens import LENS_METRIC_PATTERN, lens_metric

from ..store.record import CellRecord
from .results import Group

#: a block's lens loss within this share of the last block's: the prediction has formed (the table's last column)
SETTLED = 0.1


def last_lens(result: CellRecord) -> list[float] | None:
    """The lens losses of a result's last validation, block 0 first; None if it logged none (or not
    every block's)."""
    if not result.history:
        return None
    metrics = result.history[-1].metrics
    layers = sorted(int(m.group(1)) for name in metrics if (m := LENS_METRIC_PATTERN.fullmatch(name)))
    if not layers or layers != list(range(len(layers))):
        return None
    return [float(metrics[lens_metric(i)]) for i in layers]


def logit_lens_section(groups: Sequence[Group]) -> list[str]:
    """Markdown lines of one task's "Logit lens" section: a table of the last validation's lens loss per
    block, one row per variant (the mean over its finished seeds that recorded one), with the block
    where it first comes within :data:`SETTLED` of the last block's loss, and how to read it. Empty
    when no finished seed has lens values, or only one block's (that is the validation loss itself)."""
    rows: list[tuple[str, list[float], int, int]] = []  # variant, mean per block, seeds with a lens, finished seeds
    for group in groups:
        lenses = [lens for result in group.ok if (lens := last_lens(result)) is not None]
        # the seeds of a variant share its config, hence its depth; a result of another depth is no seed of it
        lenses = [lens for lens in lenses if len(lens) == len(lenses[0])]
        if lenses:
            rows.append(
                (
                    group.variant,
                    [statistics.fmean(column) for column in zip(*lenses, strict=True)],
                    len(lenses),
                    len(group.ok),
                )
            )
    depth = max((len(means) for _, means, _, _ in rows), default=0)
    if depth < 2:  # one block: its lens is the validation loss itself, nothing to look into
        return []
    lines = [
        "### Logit lens",
        "",
        "Validation loss (nats per target token) of each block's output decoded as the model decodes its last one: "
        "through the final norm (pre-norm, sandwich; post-norm and DeepNorm have none) and the output head. "
        "At the last validation, mean over the finished seeds; block 0 is the first, and the last block's is the "
        f"model's own validation loss (TensorBoard: `val/<task>/lens/layer{{i}}`). *within {SETTLED:.0%}*: the first "
        f"block whose loss is within {SETTLED:.0%} of the last block's.",
        "",
        "| variant | " + " | ".join(f"block {i}" for i in range(depth)) + f" | within {SETTLED:.0%} |",
        "|---|" + "---|" * (depth + 1),
    ]
    for variant, means, n_lens, n_ok in rows:
        label = variant if n_lens == n_ok else f"{variant} ({n_lens} of {n_ok} seeds)"
        cells = [f"{value:.3f}" for value in means] + [""] * (depth - len(means))
        lines.append(f"| {label} | " + " | ".join(cells) + f" | block {_settles_at(means)} |")
    return [*lines, ""]


def _settles_at(means: Sequence[float]) -> int:
    """The first block whose loss is within :data:`SETTLED` (relative) of the last block's."""
    last = means[-1]
    return next(i for i, value in enumerate(means) if abs(value - last) <= SETTLED * abs(last))
