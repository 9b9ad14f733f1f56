"""The matrix file, validated with pydantic: the base config, the axes of variants, tasks and seeds,
what a comparison is made within, the tuning grid, the seed rounds and a scale ladder.

A matrix expands into run configs (:mod:`blockbench.config`), each trained as one cell; the cell's
result depends on its run config alone, so this module is not part of the code fingerprint: a change to
how matrix files are read keeps every committed cell current.
"""

from __future__ import annotations

import difflib
import itertools
import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar

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
#: the pseudo-axis of a scale ladder (``ladder:``): not a config key, its values the rungs' names; each
#: cell's axes, folder, TensorBoard run and records carry the rung it trains at, and comparisons are
#: always made within a rung (each variant against the baseline at the same rung)
RUNG_AXIS = "rung"
#: a dotted config key as the ladder writes it (``model.n_layers``)
DOTTED_KEY = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"


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


#: keys a rung cannot set, and why
NOT_PER_RUNG = {
    "seed": "seeds are the repetitions every rung trains (seeds: or the seed axis)",
    "task": "a rung trains the same tasks at another size; set task settings with dotted keys (task.n_train)",
    "task.name": "a rung trains the same tasks at another size",
    "task.label": "the task's label names its row at every rung",
    "task.eval_split": "a rung's tuning cells score the tuning split and its reported cells the validation split",
}


class LadderRung(BaseModel):
    """One rung of a scale ladder: its name (the value of the :data:`RUNG_AXIS` pseudo-axis, part of its
    cells' variant label and folder), the settings it changes, written as dotted keys beside the name
    (``{name: 4x, model.n_layers: 8, trainer.max_steps: 600}``), and optionally its training compute
    relative to the matrix's cell without a ladder. Where the rung keeps the model's width and the
    batch, the compute is depth x steps over the cell's own (``blockbench.matrix.ladder``), and a
    declared value is checked against it; elsewhere it must be declared."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.+-]+$", description="the rung's name in cell labels and folders (4x)")
    compute: float | None = Field(
        None, gt=0, description="training compute relative to the cell without the ladder (1: the book's cell)"
    )
    overrides: dict[str, Any] = Field(default_factory=dict, description="dotted key -> value, set at this rung")

    @model_validator(mode="before")
    @classmethod
    def _dotted_keys_are_overrides(cls, data: Any) -> Any:
        """The dotted keys written beside the name (and a seed, to be refused) are the rung's overrides."""
        if not isinstance(data, dict):
            return data
        dotted = {key: value for key, value in data.items() if isinstance(key, str) and ("." in key or key == "seed")}
        rest = {key: value for key, value in data.items() if key not in dotted}
        fields = list(cls.model_fields)
        unknown = [key for key in rest if key not in fields]
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), fields, n=1)
            raise ValueError(
                f"rung {data.get('name', '')!r}: '{unknown[0]}' is not a rung field"
                + (f"; did you mean {close[0]}?" if close else "")
                + " A rung has a name, optionally its compute, and settings as dotted keys (model.n_layers: 8)"
            )
        written = rest.get("overrides")
        both = sorted(set(dotted) & set(written)) if isinstance(written, dict) else []
        if both:
            raise ValueError(f"rung sets {', '.join(both)} both beside its name and under overrides:; set it once")
        return {**rest, "overrides": {**(written if isinstance(written, dict) else {}), **dotted}} if dotted else data

    @field_validator("overrides")
    @classmethod
    def _settings(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        for key in overrides:
            if key in NOT_PER_RUNG:
                raise ValueError(f"a rung cannot set '{key}': {NOT_PER_RUNG[key]}")
            if not re.match(DOTTED_KEY, key):
                raise ValueError(f"'{key}' is not a dotted config key (section.key, e.g. model.n_layers)")
        return overrides


class ScaleRule(BaseModel, ABC):
    """How a setting that no rung sets moves up the ladder (``ladder.scale:``), a rule picked by its name
    (:data:`SCALE_RULES`): its value at a rung from its value in the cell without the ladder."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    #: the rule's name in the matrix file
    kind: ClassVar[str] = ""

    @property
    def follows(self) -> str | None:
        """The setting whose change across the rungs this one follows (None: it follows none)."""
        return None

    @abstractmethod
    def scaled(self, value: float, ratio: float) -> float:
        """The setting's value at a rung: ``value`` without the ladder, ``ratio`` the followed setting's
        value at the rung over its value without the ladder."""


class Fixed(ScaleRule):
    """``fixed``: the value the cell has without the ladder, at every rung (a count that stays a count:
    one key/value head stays one, multi-query attention stays multi-query)."""

    kind: ClassVar[str] = "fixed"

    def scaled(self, value: float, ratio: float) -> float:
        return value


class ScaleWith(ScaleRule):
    """``{with: KEY}``: in proportion to the setting KEY, times KEY's value at the rung over its value
    without the ladder: the training data and the warm-up with ``trainer.max_steps`` (the epochs and the
    warm-up's share stay as they are), ``model.n_kv_heads`` with ``model.n_heads`` (a share of the heads)."""

    kind: ClassVar[str] = "with"

    key: str = Field(alias="with", pattern=DOTTED_KEY, description="the setting this one grows in proportion to")

    @property
    def follows(self) -> str | None:
        return self.key

    def scaled(self, value: float, ratio: float) -> float:
        return value * ratio


#: the rules of ``ladder.scale:`` by name
SCALE_RULES: dict[str, type[ScaleRule]] = {rule.kind: rule for rule in (Fixed, ScaleWith)}


def scale_rule(written: Any) -> ScaleRule:
    """The rule ``written`` in ``ladder.scale:`` names: ``fixed``, or ``{with: KEY}``; raises ValueError."""
    if isinstance(written, ScaleRule):
        return written
    name = written if isinstance(written, str) else next(iter(written), None) if isinstance(written, dict) else None
    rule = SCALE_RULES.get(name) if isinstance(name, str) else None
    if rule is None or (isinstance(written, dict) and len(written) != 1):
        raise ValueError(
            f"{written!r} is not a scale rule; write fixed (the value without the ladder at every rung) or "
            "{with: KEY} (in proportion to the setting KEY, e.g. {with: trainer.max_steps})"
        )
    return rule() if isinstance(written, str) else rule.model_validate(written)


class TopGrid(BaseModel):
    """``ladder.top_grid:``: the top rung tunes ``points`` values of the tuned key centred on the value
    extrapolated from the rungs below (a straight line of the log of their chosen values on the log of
    their compute), on the lattice of the ``tune:`` grid (its values and the steps past its ends that
    the tuner would add), instead of the whole grid."""

    model_config = ConfigDict(extra="forbid")

    points: int = Field(3, ge=2, description="values the top rung tunes, centred on the extrapolated one")


class LadderConfig(BaseModel):
    """``ladder:``: the same question at several sizes. Every cell of the axes trains at every rung,
    the rung being a pseudo-axis (:data:`RUNG_AXIS`) compared within, like ``within:``; each rung tunes
    with the same ``tune:`` grid and budget for every variant; settings no rung sets follow ``scale:``
    (or stay); with ``headroom`` the run first trains the baseline alone at the top rung and stops if
    the task is saturated there (``blockbench.matrix.headroom``)."""

    model_config = ConfigDict(extra="forbid")

    rungs: list[LadderRung] = Field(min_length=2, description="the rungs, compute increasing")
    scale: dict[str, ScaleRule] = Field(
        default_factory=dict,
        description="dotted key -> how it moves up the ladder: fixed, or {with: KEY} (in proportion to KEY)",
    )
    top_grid: TopGrid | None = Field(None, description="the top rung tunes a shorter grid centred on the extrapolation")
    headroom: bool = Field(True, description="train the baseline at the top rung first; stop if it is saturated there")

    @field_validator("scale", mode="before")
    @classmethod
    def _rules(cls, scale: Any) -> Any:
        return {key: scale_rule(rule) for key, rule in scale.items()} if isinstance(scale, dict) else scale

    @model_validator(mode="after")
    def _consistent(self) -> LadderConfig:
        """Distinct rung names, declared computes increasing, and each setting moved by one thing only."""
        names = [rung.name for rung in self.rungs]
        repeated = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if repeated is not None:
            raise ValueError(f"ladder: two rungs are named '{repeated}'; give every rung its own name")
        declared = [(rung.name, rung.compute) for rung in self.rungs if rung.compute is not None]
        for (low, a), (high, b) in itertools.pairwise(declared):
            if b <= a:
                raise ValueError(
                    f"ladder: rung '{high}' declares compute {b:g}, not above rung '{low}''s {a:g}; list the rungs "
                    "from the least compute to the most"
                )
        for key, rule in self.scale.items():
            if not re.match(DOTTED_KEY, key):
                raise ValueError(f"ladder.scale: '{key}' is not a dotted config key (section.key, e.g. task.n_train)")
            setter = next((rung.name for rung in self.rungs if key in rung.overrides), None)
            if setter is not None:
                raise ValueError(
                    f"ladder: rung '{setter}' sets {key}, which ladder.scale also scales; a setting is either set "
                    "by the rungs or scaled: remove it from one of them"
                )
            if rule.follows in self.scale:
                raise ValueError(
                    f"ladder.scale: {key} follows {rule.follows}, which is scaled itself; follow a setting the "
                    "rungs set"
                )
        return self

    @property
    def names(self) -> list[str]:
        return [rung.name for rung in self.rungs]

    @property
    def top(self) -> LadderRung:
        """The rung of the most compute (the last)."""
        return self.rungs[-1]

    def rung(self, name: str) -> LadderRung:
        """The rung called ``name``; raises KeyError."""
        found = next((rung for rung in self.rungs if rung.name == name), None)
        if found is None:
            raise KeyError(f"the ladder has no rung '{name}' (rungs: {', '.join(self.names)})")
        return found


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
    ladder: LadderConfig | None = Field(
        None,
        description="the same question at several sizes: rungs of overrides (compared within, each tuned alike), "
        "how other settings scale, and a headroom check of the baseline at the top rung before anything else",
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

    @model_validator(mode="after")
    def _ladder_fits(self) -> MatrixConfig:
        """A setting varies across variants (an axis), is tuned, or changes across the rungs: one of them;
        a centred top grid needs one numeric tuned key."""
        ladder = self.ladder
        if ladder is None:
            if RUNG_AXIS in self.axes:
                raise ValueError(f"'{RUNG_AXIS}' is the ladder's pseudo-axis, not an axis; list rungs under ladder:")
            return self
        if RUNG_AXIS in self.axes:
            raise ValueError(f"axis '{RUNG_AXIS}' is the ladder's own: its rungs; rename the axis or remove it")
        for rung in ladder.rungs:
            for key, value in rung.overrides.items():
                axis = next((axis for axis in self.axes if _same_setting(key, axis)), None)
                if axis is not None:
                    raise ValueError(
                        f"ladder: rung '{rung.name}' sets {key}={value!r} but the axis {axis} also varies it; a "
                        "setting either varies across variants (axes) or across rungs (ladder): remove it from one"
                    )
                tuned = next((tuned for tuned in self.tune if _same_setting(key, tuned)), None)
                if tuned is not None:
                    raise ValueError(
                        f"ladder: rung '{rung.name}' sets {key}={value!r} but tune: tunes {tuned} at every rung; "
                        "remove it from one of them"
                    )
        for key in ladder.scale:
            tuned = next((tuned for tuned in self.tune if _same_setting(key, tuned)), None)
            if tuned is not None:
                raise ValueError(f"ladder.scale: {key} is tuned (tune: {tuned}); a tuned setting is not scaled")
        if ladder.top_grid is not None:
            numeric = [
                key
                for key, values in self.tune.items()
                if len(set(values)) >= 2 and all(_positive_number(value) for value in values)
            ]
            if len(self.tune) != 1 or not numeric:
                raise ValueError(
                    "ladder.top_grid centres one tuned number (tune: {optimizer.lr: [...]}, two or more positive "
                    f"values); tune: has {', '.join(self.tune) or 'nothing'}: remove top_grid or tune one number"
                )
        return self

    @property
    def seed_values(self) -> list[int]:
        """Every reported seed the matrix may train: the seed axis's, or 0 .. seeds.max-1."""
        if self.seeds is not None:
            return list(range(self.seeds.max))
        return [int(seed) for seed in self.axes.get("seed", [0])]

    @property
    def levels(self) -> list[str]:
        """The axes comparisons are made within: ``within:``, every axis of :data:`ALWAYS_WITHIN` and a
        ladder's rungs (:data:`RUNG_AXIS`)."""
        levels = [*self.within, *(key for key in ALWAYS_WITHIN if key in self.axes and key not in self.within)]
        return [*levels, RUNG_AXIS] if self.ladder is not None else levels


def _same_setting(key: str, other: str) -> bool:
    """Whether two dotted keys set the same value: equal, or one a section of the other (``optimizer``
    and ``optimizer.lr``)."""
    return key == other or key.startswith(other + ".") or other.startswith(key + ".")


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
