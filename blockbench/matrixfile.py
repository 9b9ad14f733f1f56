"""The matrix file, validated with pydantic: the base config, the axes of variants, tasks and seeds,
what a comparison is made within, the tuning grid and the seed rounds.

A matrix expands into run configs (:mod:`blockbench.config`), each trained as one cell; the cell's
result depends on its run config alone, so this module is not part of the code fingerprint: a change to
how matrix files are read keeps every committed cell current.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: the tuning seeds when the matrix file names none: far from the usual reported seeds 0, 1, 2, ...;
#: two, so that a choice never rests on one run's noise (successive halving: every candidate on the
#: first, the better half again on the second, see ``blockbench.matrix.tuning``)
DEFAULT_TUNE_SEEDS = (1000, 1001)
#: keys a tune: section cannot name, and why
UNTUNABLE = {
    "seed": "a variant's seeds are the repetitions the summary reports (tune_seeds sets the tuning cells' seeds)",
    "task": "tasks are what a matrix compares across, not a setting to tune",
    "task.name": "tasks are what a matrix compares across, not a setting to tune",
}
#: an axis that is not a config key: ``replica: [a, b]`` trains copies of one model on disjoint seeds
#: (replica i adds i x REPLICA_SEED_STRIDE to the seed), the empirical null comparison of
#: configs/matrix/null.yaml
REPLICA_AXIS = "replica"
REPLICA_SEED_STRIDE = 1_000_000
#: the axes comparisons are always made within when the matrix varies them: short runs can reverse
#: what long ones find, so each budget is compared at its own level
ALWAYS_WITHIN = ("trainer.max_steps",)


class SeedPlan(BaseModel):
    """``seeds: {min: 3, max: 9, step: 3}``: seeds 0 .. min-1 first; then, in rounds, ``step`` more
    seeds for the variants (and their baseline) whose verdict is still undecided, until each is
    decided or has ``max`` seeds. Each look spends an equal share of the error rate
    (``blockbench.report.decide``), so adding seeds cannot make a false verdict likelier than stated."""

    model_config = ConfigDict(extra="forbid")

    min: int = Field(3, ge=2, description="seeds every variant trains (two at least: one seed has no spread)")
    max: int = Field(9, ge=2, description="seeds a variant trains at most")
    step: int = Field(3, ge=1, description="seeds added per round to the questions still undecided")

    @model_validator(mode="after")
    def _ordered(self) -> SeedPlan:
        if self.max < self.min:
            raise ValueError(f"seeds: max={self.max} is below min={self.min}; set max >= min (max = min: no rounds)")
        return self

    @property
    def sizes(self) -> tuple[int, ...]:
        """The seed counts at which the verdicts are looked at: min, min + step, ..., max."""
        return (*range(self.min, self.max, self.step), self.max)


class MatrixConfig(BaseModel):
    """A matrix file: a base config, overrides, axes (config keys with value lists), and the settings
    tuned for each variant before its reported seeds train (``tune``, see ``blockbench.matrix.tuning``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="results go to results/<name>/")
    description: str = ""
    base: str | None = Field(None, description="run config YAML, relative to the matrix file")
    overrides: dict[str, Any] = Field(default_factory=dict, description="dotted keys applied to the base")
    axes: dict[str, list[Any]] = Field(description="dotted config key -> values; cells are their product")
    baseline_variant: str | None = Field(
        None, description="variant the others are compared with (e.g. norm_placement=pre); default: the first variant"
    )
    targets: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="task (or preset label) -> metric -> target value; the summary reports when each cell reached it",
    )
    tune: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="dotted config key -> candidate values (several keys: every combination); each task x variant "
        "first tunes on the tuning split (successive halving over tune_seeds), then trains its reported seeds at the "
        "best on the task's headline metric. Absent: the learning rate over DEFAULT_LR_GRID (tune: {} turns it off)",
    )
    tune_seeds: list[int] = Field(
        default_factory=lambda: list(DEFAULT_TUNE_SEEDS),
        description="the tuning cells' seeds, none a reported one; every candidate trains on the first, the better "
        "half again on the next (successive halving)",
        min_length=2,
    )
    seeds: SeedPlan | None = Field(
        None,
        description="seeds in rounds, {min, max, step}: variants still undecided get more (instead of a seed axis)",
    )
    within: list[str] = Field(
        default_factory=list,
        description="axes whose levels are compared separately (each variant against the baseline at the same "
        "level, e.g. [model.n_layers]); trainer.max_steps always is",
    )
    margins: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="task (or preset label) -> headline metric -> margin of practical equivalence, overriding the "
        "task's declared one (an absolute difference)",
    )
    verdicts: bool = Field(
        True,
        description="false: a matrix that answers no design question (a demonstration such as smoke.yaml, or "
        "the empirical null's calibration); results/README.md lists it apart from the verdicts, with its description",
    )

    @field_validator("axes")
    @classmethod
    def _non_empty(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if not axes:
            raise ValueError("a matrix needs at least one axis")
        for key, values in axes.items():
            if not values:
                raise ValueError(f"axis '{key}' has no values")
        return axes

    @field_validator("tune")
    @classmethod
    def _candidates(cls, tune: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Each tuned key has candidates, each listed once, and is a setting: not the seed or the task."""
        for key, values in tune.items():
            if key in UNTUNABLE:
                raise ValueError(f"'{key}' cannot be tuned: {UNTUNABLE[key]}")
            if not values:
                raise ValueError(f"'{key}' has no candidate values; list at least one, e.g. {key}: [3.0e-4, 1.0e-3]")
            repeated = next((value for i, value in enumerate(values) if value in values[:i]), None)
            if repeated is not None:
                raise ValueError(f"'{key}' lists the candidate {repeated!r} more than once; list each value once")
        return tune

    @model_validator(mode="after")
    def _tuned_keys_are_not_compared(self) -> MatrixConfig:
        """A key is either compared (an axis) or tuned, and a tuning seed needs something to tune."""
        for key in self.tune:
            axis = next((axis for axis in self.axes if _same_setting(key, axis)), None)
            if axis == key:
                raise ValueError(
                    f"tune: '{key}' is also an axis; a setting is either compared (axes) or tuned for "
                    "each variant (tune): remove it from one of them"
                )
            if axis is not None:
                raise ValueError(
                    f"tune: '{key}' and the axis '{axis}' set the same value (one is a section of the "
                    "other); a setting is either compared (axes) or tuned (tune): remove it from one of them"
                )
        if "tune_seeds" in self.model_fields_set and not self.tune:
            raise ValueError(
                "tune_seeds is set but nothing is tuned; add a tune: section (e.g. tune: {optimizer.lr: "
                "[3.0e-4, 1.0e-3]}) or remove tune_seeds"
            )
        return self

    @model_validator(mode="after")
    def _seeds_and_levels(self) -> MatrixConfig:
        """``seeds:`` replaces a seed axis; ``within:`` names axes the matrix has, other than task and seed."""
        if self.seeds is not None and "seed" in self.axes:
            raise ValueError(
                "the matrix has both a seed axis and seeds: {min, max, step}; keep one: seeds: runs 0 .. min-1 "
                "first and adds seeds where a verdict is undecided, a seed axis runs exactly the seeds it lists"
            )
        for key in self.within:
            if key not in self.axes:
                raise ValueError(
                    f"within: '{key}' is not an axis of the matrix (axes: {', '.join(self.axes)}); list axes "
                    "whose levels are compared separately"
                )
            if key in ("task", "task.name", "seed", REPLICA_AXIS):
                raise ValueError(f"within: '{key}' cannot be a level: tasks and seeds are always separate")
        return self

    @property
    def seed_values(self) -> list[int]:
        """Every reported seed the matrix may train: the seed axis's, or 0 .. seeds.max-1."""
        if self.seeds is not None:
            return list(range(self.seeds.max))
        return [int(seed) for seed in self.axes.get("seed", [0])]

    @property
    def levels(self) -> list[str]:
        """The axes comparisons are made within: ``within:`` and every axis of :data:`ALWAYS_WITHIN`."""
        return [*self.within, *(key for key in ALWAYS_WITHIN if key in self.axes and key not in self.within)]


def _same_setting(key: str, other: str) -> bool:
    """Whether two dotted keys set the same value: equal, or one a section of the other (``optimizer``
    and ``optimizer.lr``)."""
    return key == other or key.startswith(other + ".") or other.startswith(key + ".")
