"""The analysis plan a matrix commits to before its cells train, and the matrix's record of it.

A verdict is only as good as the rules that decided it were fixed before the results: a margin or a
look chosen after seeing the cells fits them. So every matrix run serialises **everything that
decides its verdicts** as an :class:`AnalysisPlan` (the decision rule's version, α, the futility
bound, the looks, the baseline variant, per task the headline metric with its direction, margin and
saturation, the tuning grid, seeds and how far the tuner may extend the grid), hashes it
(:meth:`AnalysisPlan.digest`), keeps every plan it ran under in the matrix's ``plan.json`` (:class:`PlanBook`) and
writes the hash into each cell's ``cell.json`` when the cell starts. The summary prints the current
plan's hash and flags each verdict whose cells started under another plan: a plan that changed
after the question's first cell trained, with the fields that changed.

Pydantic records on the ground floor: the runner (``blockbench.matrix``) builds and writes them, the
report (``blockbench.report``) reads them back, neither importing the other.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .store.files import write_plan_book
from .store.layout import PLAN_FILE

#: the decision rule's version, recorded in every matrix's analysis plan: the date of the last change to
#: what decides a verdict (``blockbench.report.decide``); docs/decisions/verdict-rule.md's History has each one
RULE_VERSION = "2026-11-28"
#: the error rate of a false better/worse (two-sided) and, separately, of a false equivalent, per question
ALPHA = 0.05
#: stop adding seeds to an undecided question whose conditional power (``blockbench.report.decide``) is below this
FUTILITY = 0.05


def smallest_rank_p(n_a: int, n_b: int | None = None) -> float:
    """The smallest two-sided p-value the exact signed-rank test can give on ``n_a`` seed pairs (``n_b``
    None), or the exact Mann-Whitney U test on ``n_a`` against ``n_b`` seeds: the null's one most extreme
    arrangement, doubled (2/2^n, 2/C(n_a + n_b, n_a)); ties only raise it. Where it is not below a look's
    α, no data can decide a rank-based question at that look. Here, on the ground floor, because the
    runner's dry run warns of such a seed plan and the report stops such questions."""
    arrangements = 2**n_a if n_b is None else math.comb(n_a + n_b, n_a)
    return min(1.0, 2.0 / arrangements)


class TaskPlan(BaseModel):
    """What decides one task's questions: its headline metric and direction, the margin of practical
    equivalence (``relative``: a share of the baseline's mean) and the saturation distance."""

    model_config = ConfigDict(frozen=True)

    metric: str
    higher_is_better: bool
    margin: float | None  # None: no margin, equivalence cannot be shown
    margin_relative: bool = False
    saturation: float | None = None
    saturation_of: str | None = None


class AnalysisPlan(BaseModel):
    """Everything that decides a matrix's verdicts, fixed before its cells train (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    rule: str  # the decision rule's version (:data:`RULE_VERSION`)
    alpha: float
    futility: float | None
    looks: list[int]  # the seed counts at which a question is decided
    baseline_variant: str | None
    tasks: dict[str, TaskPlan]
    tune: dict[str, list[Any]] = Field(default_factory=dict)
    tune_seeds: list[int] = Field(default_factory=list)
    extension_steps: int = 0

    def digest(self) -> str:
        """The plan's hash: sha256 of its canonical JSON (sorted keys), 16 hex digits."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def changes(self, other: AnalysisPlan) -> list[str]:
        """The fields in which ``other`` differs from this plan (a task's field as ``margin of lm``), in order."""
        changed = [
            name for name in type(self).model_fields if name != "tasks" and getattr(self, name) != getattr(other, name)
        ]
        for task in sorted(set(self.tasks) | set(other.tasks)):
            mine, theirs = self.tasks.get(task), other.tasks.get(task)
            if mine is None or theirs is None:
                changed.append(f"task {task}")
                continue
            changed += [
                f"{name} of {task}" for name in TaskPlan.model_fields if getattr(mine, name) != getattr(theirs, name)
            ]
        return changed


class PlanBook(BaseModel):
    """A matrix's ``plan.json``: every plan a run of it committed to, by hash, and the latest run's."""

    current: str | None = None
    plans: dict[str, AnalysisPlan] = Field(default_factory=dict)

    @classmethod
    def load(cls, matrix_dir: Path) -> PlanBook:
        """The matrix's plans (none before a run recorded one)."""
        path = Path(matrix_dir) / PLAN_FILE
        return cls.model_validate_json(path.read_text()) if path.is_file() else cls()

    def record(self, matrix_dir: Path, plan: AnalysisPlan) -> str:
        """Add ``plan`` as the current one, write ``plan.json`` and return its hash."""
        digest = plan.digest()
        self.plans[digest] = plan
        self.current = digest
        write_plan_book(Path(matrix_dir), self.model_dump(mode="json"))
        return digest
