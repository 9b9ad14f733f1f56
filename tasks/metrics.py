"""What a task declares about its metrics, in code and before any result: each metric's direction
and range, and for the headline metric the margin of practical equivalence and the distance from
the best value at which a comparison is saturated.

A summary compares variants on a task's headline metric (the first it reports). Whether a
difference matters is decided by a margin fixed in advance (``Margin``), not by the data that
the comparison then judges; whether the metric can still tell two variants apart near its best
value by a declared ``Saturation``; and whether a cell learned anything at all by
``Metric.beats``: strictly better than the task's trivial baseline.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Metric(BaseModel):
    """A validation metric that a task reports: its name in the logs, its direction and its range.

    The range keeps the summary's confidence intervals inside the values the metric can take
    (an accuracy in [0, 1], BLEU in [0, 100], a perplexity of at least 1); infinite = unbounded.
    """

    name: str
    higher_is_better: bool
    description: str
    low: float = Field(-math.inf, description="smallest value the metric can take")
    high: float = Field(math.inf, description="largest value the metric can take")
    exp_of_loss: bool = Field(
        False, description="the metric is exp of a loss in nats per token (a perplexity): its log is that loss"
    )

    @model_validator(mode="after")
    def _check_range(self) -> Metric:
        if not self.low < self.high:
            raise ValueError(f"metric {self.name!r}: low={self.low} must be below high={self.high}")
        return self

    @property
    def span(self) -> float:
        """Width of the range: no difference of two values lies outside [-span, span]."""
        return self.high - self.low

    @property
    def best(self) -> float:
        """The best value the metric can take: its upper end if higher is better, else its lower end."""
        return self.high if self.higher_is_better else self.low

    def beats(self, value: float, reference: float) -> bool:
        """Whether ``value`` is strictly better than ``reference`` in this metric's direction (a tie
        or a missing value, NaN, is not). A cell whose headline metric does not beat its task's
        trivial baseline did not learn: post-norm LM cells ending at perplexity 30.64 against the
        unigram model's 30.60, or BLEU 0.5 against word-by-word translation's 0.93."""
        return bool(value > reference if self.higher_is_better else value < reference)


class Margin(BaseModel):
    """The margin of practical equivalence of a headline metric: two variants whose difference lies
    within it are equivalent for practical purposes. ``relative``: ``value`` is a share of the
    baseline variant's mean (a perplexity ratio); otherwise a difference in the metric's units.
    Declared per task in code, with its reason, before any result exists."""

    model_config = ConfigDict(frozen=True)

    value: float = Field(gt=0, description="the margin: a share of the baseline's mean if relative, else absolute")
    relative: bool
    reason: str = Field(min_length=1, description="why this margin, in one line")

    def absolute(self, baseline_mean: float) -> float:
        """The margin in the metric's units, for a comparison whose baseline variant has mean
        ``baseline_mean``: ``value`` itself, or ``value`` times the baseline's mean if relative."""
        return self.value * abs(baseline_mean) if self.relative else self.value


class Saturation(BaseModel):
    """How close to the best possible value a headline metric is saturated: when both sides of a
    comparison are there, the metric cannot tell them apart and gives no verdict. ``of="best"``:
    within ``distance`` of the metric's best value (BLEU 100, accuracy 1), in its units;
    ``of="floor"``: an excess loss of at most ``distance`` nats per token over the cell's entropy
    floor (the LM, whose data come from a grammar with a computable floor)."""

    model_config = ConfigDict(frozen=True)

    distance: float = Field(gt=0, description="how near the best value (or the floor) counts as saturated")
    of: Literal["best", "floor"]
    reason: str = Field(min_length=1, description="why this distance, in one line")

    def saturated(self, mean: float, metric: Metric, *, floor: float | None = None) -> bool:
        """Whether a mean value of ``metric`` is saturated. Of "best": within ``distance`` of
        ``metric.best``. Of "floor": its loss (the log of a perplexity, ``metric.exp_of_loss``) at most
        ``distance`` above ``floor``, the cell's entropy floor in nats per token (its baselines'
        ``loss_floor``), which must then be given."""
        if self.of == "best":
            return bool(abs(metric.best - mean) <= self.distance)
        if floor is None:
            raise ValueError(
                f"saturation of {metric.name!r} is measured from the entropy floor: pass floor= (the cell's "
                "baselines.loss_floor, nats per token)"
            )
        loss = math.log(mean) if metric.exp_of_loss else mean
        return bool(loss - floor <= self.distance)
