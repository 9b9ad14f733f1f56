"""Each variant at its own best setting: the ``tune:`` section of a matrix.

A comparison at one learning rate mostly measures which variant that rate suits: post-norm "fails"
the LM at a rate pre-norm likes, the known warmup and learning-rate sensitivity of post-norm (Xiong
et al. 2020), not a verdict on it. With ``tune: {optimizer.lr: [3.0e-4, 1.0e-3, 3.0e-3]}`` the runner
(``blockbench.matrix``) works in two phases:

1. **tuning**: for every task x variant, one *tuning cell* per candidate (every combination of the
   tuned keys' values), at ``tune_seed``: ordinary cells (resumable, reused by config and code, a
   TensorBoard run each) under ``tune/cells/``, where the statistics of the reported seeds never
   read them;
2. **reported**: every seed of the axes trains with the chosen values set in its config, so the
   choice is part of its config hash: a changed choice retrains it, an unchanged one reuses it.

The choice (:func:`choose`) is the candidate with the best final value of the task's headline
metric, the first of its metrics (``TaskConfig.metrics``: what the summary reports first and
TensorBoard as ``final/primary_metric``), in that metric's direction. A candidate that diverged,
failed or has no finite score never wins; of equal scores the candidate listed first wins. A
variant none of whose candidates finished has no choice, and its reported cells fail with a message
naming its tuning cells. The tuning seed is not a reported seed: a value picked on a run fits that
run's noise, and reporting the run would flatter the variant (selection bias).

``tune.json`` records the tuned keys, the seed, and per task its metric and direction, per variant
every candidate's status and score and the choice; ``blockbench.report.tuning`` renders it in the
summary from the file (``blockbench.record.read_tuning``), without the runner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..layout import TUNE_FILE
from ..record import CellRecord

#: the phases of a matrix with a ``tune:`` section: a cell's ``phase``, as cell.json, the progress
#: lines and TensorBoard's HParams table (column ``phase``) name it
TUNE, REPORT = "tune", "report"
#: a candidate whose tuning cell has no result of its current config (it has not run)
NOT_RUN = "not run"


@dataclass(frozen=True)
class Candidate:
    """One candidate of a task x variant: its values, its tuning cell and how that cell ended."""

    values: dict[str, Any]  # tuned key -> value, e.g. {"optimizer.lr": 0.001}
    label: str  # ``lr=0.001``
    cell: str  # the tuning cell's key, ``tune/lm/norm_placement=post/lr=0.001/seed1000``
    status: str  # ok, diverged, failed or NOT_RUN
    score: float | None = None  # the headline metric's final value (an ok cell's)
    detail: str = ""  # why a candidate that is not ok cannot win

    @property
    def eligible(self) -> bool:
        """Whether the candidate can be chosen: it finished with a finite score."""
        return self.status == "ok" and self.score is not None and math.isfinite(self.score)

    def describe(self) -> str:
        """``tune/lm/.../seed1000 diverged at step 12``: the cell and how it ended, for messages."""
        return f"{self.cell} {self.detail or self.status}"


def candidate(values: dict[str, Any], label: str, cell: str, result: CellRecord | None, metric: str) -> Candidate:
    """The candidate ``values`` scored from its tuning cell's ``result`` (None: no result of its config yet)."""
    if result is None:
        return Candidate(values, label, cell, NOT_RUN, detail="has not run")
    if result.status == "ok":
        score = result.metrics.get(metric)
        score = None if score is None else float(score)
        detail = "" if score is not None and math.isfinite(score) else f"has no finite {metric} ({score})"
        return Candidate(values, label, cell, "ok", score, detail)
    if result.status == "diverged":
        step = "?" if result.diverged_at_step is None else result.diverged_at_step
        return Candidate(values, label, cell, "diverged", detail=f"diverged at step {step}")
    error = "no error recorded" if result.error is None else result.error
    return Candidate(values, label, cell, "failed", detail=f"failed ({error[:200]})")


def choose(candidates: Sequence[Candidate], higher_is_better: bool) -> Candidate | None:
    """The eligible candidate with the best score; of equal scores the first listed; None if none is eligible."""
    best = None
    for option in candidates:
        if option.eligible and (best is None or _better(option.score, best.score, higher_is_better)):
            best = option
    return best


def _better(score: float, than: float, higher_is_better: bool) -> bool:
    return score > than if higher_is_better else score < than


@dataclass(frozen=True)
class Tuning:
    """The tuning of one task x variant: the headline metric, every candidate in the listed order, the choice."""

    task: str
    variant: str
    metric: str
    higher_is_better: bool
    candidates: tuple[Candidate, ...]

    @property
    def chosen(self) -> Candidate | None:
        return choose(self.candidates, self.higher_is_better)

    def describe(self) -> str:
        """``lm/norm_placement=post: lr=0.0003 (perplexity 10.93; lr=0.001 30.61, lr=0.003 diverged)``."""
        chosen = self.chosen
        if chosen is None:
            return f"{self.task}/{self.variant}: no choice, {self.failure()}"
        others = ", ".join(f"{c.label} {_score_text(c)}" for c in self.candidates if c is not chosen)
        scores = f"{self.metric} {chosen.score:.4g}" + (f"; {others}" if others else "")
        return f"{self.task}/{self.variant}: {chosen.label} ({scores})"

    def failure(self) -> str:
        """Why the variant has no choice, naming its tuning cells and what to do."""
        return (
            f"no candidate of tune: finished ({'; '.join(c.describe() for c in self.candidates)}), so the reported "
            f"seeds of {self.task}/{self.variant} were not trained; add candidates it can train with (e.g. smaller "
            f"learning rates) to tune: and run the matrix again ({TUNE_FILE} has every candidate)"
        )

    def record(self) -> dict[str, Any]:
        chosen = self.chosen
        return {
            "chosen": chosen.values if chosen else None,
            "chosen_label": chosen.label if chosen else None,
            "candidates": [
                {
                    "values": c.values,
                    "label": c.label,
                    "cell": c.cell,
                    "status": c.status,
                    "score": c.score,
                    **({"detail": c.detail} if c.detail else {}),
                }
                for c in self.candidates
            ],
            **({} if chosen else {"error": self.failure()}),
        }


def _score_text(option: Candidate) -> str:
    return f"{option.score:.4g}" if option.eligible else option.status


def tuning_record(keys: Sequence[str], tune_seed: int, tunings: Sequence[Tuning]) -> dict[str, Any]:
    """What ``tune.json`` holds: the tuned keys and seed; per task its headline metric and direction,
    and per variant (:meth:`Tuning.record`) every candidate and the choice."""
    tasks: dict[str, dict[str, Any]] = {}
    for tuning in tunings:
        task = tasks.setdefault(
            tuning.task, {"metric": tuning.metric, "higher_is_better": tuning.higher_is_better, "variants": {}}
        )
        task["variants"][tuning.variant] = tuning.record()
    return {"keys": list(keys), "tune_seed": tune_seed, "tasks": tasks}
