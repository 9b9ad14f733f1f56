"""How much room a comparison had: the LM's distance to the entropy floor of its grammar, and whether
both sides of a comparison sit where the headline metric can no longer tell them apart (saturated).

The LM task's data come from a finite probabilistic grammar whose entropy is computable: no model
can reach a loss below that floor. A cell records the floor beside its trivial baselines
(``baselines.loss_floor``, nats per token) and, per validation, its excess loss over it and the
share of the gap from the unigram baseline to the floor that it closed (``excess_loss``,
``gap_closed``; computed here from the loss and the baselines where a record lacks them). Two
variants both within the task's saturation distance of the floor, or of a bounded metric's best
value (BLEU 100), differ by less than the metric can show at that budget: such a comparison gets no
verdict, whatever its test says.

The opposite end has no verdict either: both sides *not learned*, each having closed less than
:data:`NOT_LEARNED_SHARE` of the way from the task's trivial baseline to the metric's best value
(:func:`not_learned_text`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blockbench.tasks import Metric

from .results import Group

#: the record's names: the floor among the trivial baselines, the per-cell figures among the metrics
FLOOR, UNIGRAM, EXCESS, GAP = "loss_floor", "loss", "excess_loss", "gap_closed"


@dataclass(frozen=True)
class Headroom:
    """A group's distance to its task's entropy floor, mean over its finished seeds that recorded one."""

    floor: float  # the loss floor, nats per token
    unigram: float | None  # the unigram baseline's loss (None: not recorded)
    excess_loss: float  # loss - floor
    gap_closed: float | None  # (unigram - loss) / (unigram - floor): 1 is the floor, 0 the unigram model
    seeds: int


def headroom(group: Group) -> Headroom | None:
    """``group``'s :class:`Headroom` (None where no finished seed recorded a floor: not the LM, or a record
    from before the floor)."""
    rows = []
    for record in group.ok:
        floor = record.baselines.get(FLOOR)
        loss = record.metrics.get("loss")
        if floor is None or (loss is None and EXCESS not in record.metrics):
            continue
        excess = record.metrics.get(EXCESS, loss - floor if loss is not None else math.nan)
        unigram = record.baselines.get(UNIGRAM)
        gap = record.metrics.get(GAP)
        if gap is None and unigram is not None and loss is not None and unigram > floor:
            gap = (unigram - loss) / (unigram - floor)
        rows.append((floor, unigram, excess, gap))
    if not rows:
        return None
    unigrams = [u for _, u, _, _ in rows if u is not None]
    gaps = [g for _, _, _, g in rows if g is not None]
    return Headroom(
        statistics.fmean(f for f, _, _, _ in rows),
        statistics.fmean(unigrams) if unigrams else None,
        statistics.fmean(e for _, _, e, _ in rows),
        statistics.fmean(gaps) if len(gaps) == len(rows) else None,
        len(rows),
    )


def best_value(metric: Metric) -> float:
    """The best value ``metric`` can take (BLEU 100, accuracy 1, perplexity 1); infinite where unbounded."""
    return metric.high if metric.higher_is_better else metric.low


def _floor(group: Group) -> float | None:
    """The entropy floor the group's finished seeds recorded (their mean; None if none did)."""
    floors = [r.baselines[FLOOR] for r in group.ok if r.baselines.get(FLOOR) is not None]
    return statistics.fmean(floors) if floors else None


def saturation_text(task_cfg: Any, metric: Metric, groups: Sequence[Group], means: Sequence[float]) -> str:
    """Why a comparison of ``groups`` (the variant's and the baseline's, whose headline means are
    ``means``) is saturated, or "" if it is not: both sides saturated by the task's declared rule
    (``TASK_CONFIGS[...].saturation``: within its distance of the metric's best value, or for the LM of
    the entropy floor, in nats of loss). A side with a diverged seed, or one that did not learn, is never
    saturated, nor is a task that declares no saturation (code from before the declaration: only both
    sides exactly at the best value)."""
    if any(group.diverged or group.did_not_learn(metric) for group in groups):
        return ""
    if not hasattr(task_cfg, "saturation"):  # a task config from before the declaration
        best = best_value(metric)
        if math.isfinite(best) and all(abs(mean - best) <= 1e-9 * max(1.0, abs(best)) for mean in means):
            return (
                f"both sides at the best possible {metric.name} ({best:g}): the task is solved at this budget and "
                "cannot tell them apart"
            )
        return ""
    saturation = task_cfg.saturation
    if saturation is None:
        return ""
    reason = f" ({saturation.reason})"
    if saturation.of == "floor":
        floors = [_floor(group) for group in groups]
        if any(floor is None for floor in floors):
            return ""  # cells from before the floor was recorded
        if not all(saturation.saturated(m, metric, floor=f) for m, f in zip(means, floors, strict=True)):
            return ""
        excess = [
            (math.log(m) if getattr(metric, "exp_of_loss", False) else m) - f
            for m, f in zip(means, floors, strict=True)
        ]
        shown = " and ".join(f"{e:.3f}" for e in excess)
        return (
            f"both sides within {saturation.distance:g} nats of the entropy floor (excess loss {shown}){reason}: "
            f"the {metric.name} cannot tell them apart at this budget"
        )
    if not all(saturation.saturated(mean, metric) for mean in means):
        return ""
    return (
        f"both sides within {saturation.distance:g} of the best possible {metric.name} ({best_value(metric):g})"
        f"{reason}: the task is solved at this budget and cannot tell them apart"
    )


#: A comparison whose two sides both closed less than this share of the way from the task's trivial baseline
#: (recorded in each cell's ``baselines``) to the metric's best value is *not learned* and gets no verdict,
#: whatever its test says. Two models that have gone less than a tenth of the way from guessing to perfect
#: differ in how fast they start, not in which block works better once trained: BLEU 5.5 against 2.9 on
#: Multi30k (the trivial baseline 0.23, the best 100) says which of two nearly untrained translators is less
#: bad, and a longer run can reverse it. A tenth lies well below where the book's trained models are: every
#: variant of the generated tasks at 300 steps has closed 30% of the way or more (the LM in loss), so the
#: label falls only on models that have barely started (the real-data Multi30k at 600 CPU steps, 3% and 5%;
#: the 100-step smoke matrix's translator).
NOT_LEARNED_SHARE = 0.1
#: the label's reason, as the index writes it beside *not learned*
NOT_LEARNED_LABEL = f"both sides within {NOT_LEARNED_SHARE:.0%} of the trivial baseline's distance to the best value"


def share_of_the_way(mean: float, trivial: float, metric: Metric) -> float | None:
    """How far ``mean`` has come from the trivial baseline's value ``trivial`` towards the metric's best
    value: 0 at the trivial baseline, 1 at the best (BLEU 100, accuracy 1, perplexity 1), negative where
    it is worse than the trivial baseline. A perplexity is measured on the log scale, in loss (the best
    then 0 nats): halfway from a unigram model's 30 to 1 is a perplexity of about 5.5, not 15.5. None where
    the best value is not finite or the trivial baseline is already at it (no way to go)."""
    best = best_value(metric)
    log = bool(getattr(metric, "exp_of_loss", False))
    if not (math.isfinite(best) and math.isfinite(trivial) and math.isfinite(mean)):
        return None
    if log and min(best, trivial, mean) <= 0:
        return None
    scale = math.log if log else float
    distance = scale(best) - scale(trivial)
    return None if distance == 0 else (scale(mean) - scale(trivial)) / distance


def recorded_trivial(group: Group, metric: str, default: float | None = None) -> float | None:
    """The mean of the trivial baselines of ``metric`` that ``group``'s cells recorded (``default`` where
    none did): a seed that draws the data draws its trivial baseline too."""
    recorded = [r.baselines[metric] for r in group.results if r.baselines.get(metric) is not None]
    return statistics.fmean(recorded) if recorded else default


def not_learned_text(metric: Metric, means: Sequence[float], trivials: Sequence[float | None]) -> str:
    """Why a comparison of two sides whose headline means are ``means`` (and whose cells recorded the
    trivial baselines ``trivials``, one per side: the mean over its seeds) is *not learned*, or "" when
    one side, at least, closed :data:`NOT_LEARNED_SHARE` of the way from its trivial baseline to the best
    value (or a side has no trivial baseline to measure from)."""
    shares = [
        None if trivial is None else share_of_the_way(mean, trivial, metric)
        for mean, trivial in zip(means, trivials, strict=True)
    ]
    if any(share is None or share >= NOT_LEARNED_SHARE for share in shares):
        return ""
    scale = " (perplexity on the log scale, in loss)" if getattr(metric, "exp_of_loss", False) else ""
    distinct = list(dict.fromkeys(f"{t:.4g}" for t in trivials))
    trivial = distinct[0] if len(distinct) == 1 else f"({', '.join(distinct)})"
    return (
        f"{NOT_LEARNED_LABEL}: the variant closed {shares[0]:.1%} and the baseline {shares[1]:.1%} of the way from "
        f"the trivial baseline's {metric.name} {trivial} to {best_value(metric):g}{scale}; a difference this early "
        "says how fast two models start, not which block works better"
    )


def headroom_lines(groups: Sequence[Group], metrics: Sequence[str] = ()) -> list[str]:
    """The summary's headroom note of a task with an entropy floor (the LM): the floor and the unigram
    model's loss, and each variant's excess loss over the floor and the share of the unigram-to-floor
    gap it closed (a table, unless the task's ``metrics`` already show both as columns); empty for other
    tasks."""
    rows = [(group, room) for group in groups if (room := headroom(group)) is not None]
    if not rows:
        return []
    floor = statistics.fmean(room.floor for _, room in rows)
    unigrams = [room.unigram for _, room in rows if room.unigram is not None]
    unigram = f", the unigram model's {statistics.fmean(unigrams):.3f}" if unigrams else ""
    note = (
        f"Headroom: no model can reach a loss below the entropy floor of the task's grammar, {floor:.3f} nats per "
        f"token on the validation set (perplexity {math.exp(floor):.3f}){unigram}. "
    )
    if EXCESS in metrics and GAP in metrics:
        return [
            note + f"`{EXCESS}` is a cell's loss above the floor and `{GAP}` the share of the gap from the unigram "
            "model to the floor that it closed (1: the best possible model).",
            "",
        ]
    lines = [
        note + "Per variant, mean over its finished seeds: the excess loss over the floor, and the share of the gap "
        "from the unigram model to the floor that it closed (1: the best possible model).",
        "",
        "| variant | excess loss (nats) | gap closed |",
        "|---|---|---|",
    ]
    for group, room in rows:
        gap = "–" if room.gap_closed is None else f"{room.gap_closed:.1%}"
        lines.append(f"| {group.variant} | {room.excess_loss:.3f} | {gap} |")
    return [*lines, ""]
