"""Each variant at its own best setting: the ``tune:`` section of a matrix.

A comparison at one learning rate mostly measures which variant that rate suits: post-norm "fails"
the LM at a rate pre-norm likes, the known warmup and learning-rate sensitivity of post-norm (Xiong
et al. 2020), not a verdict on it. With ``tune: {optimizer.lr: [3.0e-4, 1.0e-3, 3.0e-3]}`` the runner
(``blockbench.matrix``) works in two phases:

1. **tuning**: for every task x variant, *tuning cells*: ordinary cells (resumable, reused by config
   and code, a TensorBoard run each) under ``tune/cells/``, which validate on the task's **tuning
   split** (``task.eval_split: tuning``), data no reported metric uses, at seeds no reported cell
   uses (``tune_seeds``). **Successive halving** over those seeds keeps the cost near one seed per
   candidate while no choice rests on one run: every candidate trains at the first tuning seed, the
   better half (rounded up) of those that finished again at the next, and so on; the choice is the
   best mean over the seeds of the last rung. With three candidates and two seeds that is 5 cells;
2. **reported**: every seed of the axes trains with the chosen values set in its config, so the
   choice is part of its config hash: a changed choice retrains it, an unchanged one reuses it.

**A grid that holds the optimum.** A choice at an end of a numeric key's grid (the lowest or highest
learning rate tried) says only that the best may lie beyond it. Once a variant's tuning is complete
with its choice at such an end, the tuner adds the next value past it, one step of the grid's own
ratio at that end (``[3e-4, 1e-3, 3e-3]`` chosen at 3e-4: 9e-5), as one more candidate of the same
successive halving (every cell already trained is reused), and again while the choice stays at the
new end, up to :data:`EXTENSION_STEPS` values past each end. It stops where the best is interior, or
where the next value is worse, diverges or fails (then the best is interior too); a choice still at an
end after the last step is marked so in the summary. ``tune.json`` records the grid as written and
which candidates the tuner added.

Scores are the final value of the task's headline metric, the first of its metrics
(``TaskConfig.metrics``), in that metric's direction. A candidate any of whose cells diverged, failed
or has no finite score never survives a rung; of equal scores the candidate listed first wins. A
variant none of whose candidates finished has no choice, and its reported cells fail with a message
naming its tuning cells.

``tune.json`` records the tuned keys, the seeds, and per task its metric and direction, per variant
every candidate's cells, scores and the rung it reached, and the choice; ``blockbench.report.tuning``
renders it in the summary from the file (``blockbench.store.record.read_tuning``), without the runner.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..store.layout import TUNE_FILE
from ..store.record import CellRecord

#: the phases of a matrix with a ``tune:`` section: a cell's ``phase``, as cell.json, the progress
#: lines and TensorBoard's HParams table (column ``phase``) name it
TUNE, REPORT = "tune", "report"
#: a candidate whose tuning cell has no result of its current config (it has not run)
NOT_RUN = "not run"
#: the values the tuner adds past each end of a numeric key's grid while the choice sits at that end
#: (two steps of the grid's ratio: a factor of about 10 past a half-decade grid's end, where a
#: learning rate's optimum has been in every comparison of the book)
EXTENSION_STEPS = 2


@dataclass(frozen=True)
class Trial:
    """One tuning cell of a candidate: its seed, its key and how it ended."""

    seed: int
    cell: str  # the tuning cell's key, ``tune/lm/norm_placement=post/lr=0.001/seed1000``
    status: str  # ok, diverged, failed or NOT_RUN
    score: float | None = None  # the headline metric's final value (an ok cell's)
    detail: str = ""  # why a trial that is not ok cannot count

    @property
    def eligible(self) -> bool:
        """Whether the trial counts: it finished with a finite score."""
        return self.status == "ok" and self.score is not None and math.isfinite(self.score)

    def describe(self) -> str:
        """``tune/lm/.../seed1000 diverged at step 12``: the cell and how it ended, for messages."""
        return f"{self.cell} {self.detail or self.status}"


def trial(seed: int, cell: str, result: CellRecord | None, metric: str) -> Trial:
    """The trial of tuning cell ``cell`` scored from its ``result`` (None: no result of its config yet)."""
    if result is None:
        return Trial(seed, cell, NOT_RUN, detail="has not run")
    if result.status == "ok":
        score = result.metrics.get(metric)
        score = None if score is None else float(score)
        detail = "" if score is not None and math.isfinite(score) else f"has no finite {metric} ({score})"
        return Trial(seed, cell, "ok", score, detail)
    if result.status == "diverged":
        step = "?" if result.diverged_at_step is None else result.diverged_at_step
        return Trial(seed, cell, "diverged", detail=f"diverged at step {step}")
    error = "no error recorded" if result.error is None else result.error
    return Trial(seed, cell, "failed", detail=f"failed ({error[:200]})")


@dataclass(frozen=True)
class Candidate:
    """One candidate of a task x variant: its values and its trials so far, in tuning-seed order."""

    values: dict[str, Any]  # tuned key -> value, e.g. {"optimizer.lr": 0.001}
    label: str  # ``lr=0.001``
    trials: tuple[Trial, ...]

    def ran(self, seeds: Sequence[int]) -> list[Trial]:
        """Its trials at ``seeds`` (those that have a result)."""
        return [t for t in self.trials if t.seed in seeds and t.status != NOT_RUN]

    def score(self, seeds: Sequence[int]) -> float | None:
        """Mean score over ``seeds``; None unless every trial there counts."""
        trials = [t for t in self.trials if t.seed in seeds]
        if len(trials) < len(seeds) or not all(t.eligible for t in trials):
            return None
        return statistics.fmean(t.score for t in trials)  # type: ignore[misc]

    def describe(self) -> str:
        return "; ".join(t.describe() for t in self.trials if t.status != NOT_RUN) or f"{self.label} has not run"


def rank(candidates: Sequence[Candidate], seeds: Sequence[int], higher_is_better: bool) -> list[Candidate]:
    """The candidates whose trials at ``seeds`` all count, best mean first (of equal scores the first listed)."""
    scored = [(c, c.score(seeds)) for c in candidates]
    eligible = [(c, s) for c, s in scored if s is not None]
    return [c for c, _ in sorted(eligible, key=lambda item: -item[1] if higher_is_better else item[1])]


@dataclass(frozen=True)
class Tuning:
    """The tuning of one task x variant by successive halving: the headline metric, every candidate in
    the listed order with its trials, the tuning seeds (one rung each) and, once the last rung has run,
    the choice."""

    task: str
    variant: str
    metric: str
    higher_is_better: bool
    candidates: tuple[Candidate, ...]
    seeds: tuple[int, ...]

    def rungs(self) -> list[list[Candidate]]:
        """The candidates each rung trains, as far as the results go: rung 0 all of them; rung r + 1 the
        better half (rounded up) of rung r's candidates that finished there, ranked by their mean over
        seeds[: r + 1]. A rung some of whose cells have not run is the last listed."""
        alive = list(self.candidates)
        rungs = [alive]
        for r in range(len(self.seeds) - 1):
            if any(not c.ran([self.seeds[r]]) for c in alive):
                break  # rung r has cells to run
            ranked = rank(alive, self.seeds[: r + 1], self.higher_is_better)
            if not ranked:
                break
            alive = ranked[: math.ceil(len(ranked) / 2)]
            rungs.append(alive)
        return rungs

    def pending(self) -> list[tuple[Candidate, int]]:
        """(candidate, seed) of the tuning cells the current rung still needs."""
        rungs = self.rungs()
        seed = self.seeds[len(rungs) - 1]
        return [(c, seed) for c in rungs[-1] if not any(t.seed == seed and t.status != NOT_RUN for t in c.trials)]

    @property
    def complete(self) -> bool:
        """Every rung has run (or no candidate is left to run the next)."""
        rungs = self.rungs()
        if self.pending():
            return False
        return len(rungs) == len(self.seeds) or not rank(rungs[-1], self.seeds[: len(rungs)], self.higher_is_better)

    @property
    def chosen(self) -> Candidate | None:
        """The best of the last rung by its mean over every tuning seed it ran; None until complete or if
        no candidate finished."""
        if not self.complete:
            return None
        rungs = self.rungs()
        ranked = rank(rungs[-1], self.seeds[: len(rungs)], self.higher_is_better)
        return ranked[0] if ranked else None

    @property
    def cells(self) -> int:
        """Tuning cells that ran."""
        return sum(len(c.ran(self.seeds)) for c in self.candidates)

    def describe(self) -> str:
        """``lm/norm_placement=post: lr=0.0003 (perplexity 10.93 over 2 seeds; lr=0.001 30.61, lr=0.003 diverged)``."""
        chosen = self.chosen
        if chosen is None:
            return f"{self.task}/{self.variant}: no choice, {self.failure()}"
        n = len(self.rungs())
        score = chosen.score(self.seeds[:n])
        others = ", ".join(f"{c.label} {_score_text(c, self.seeds)}" for c in self.candidates if c is not chosen)
        scores = f"{self.metric} {score:.4g} over {n} seed{'s' if n > 1 else ''}" + (f"; {others}" if others else "")
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
        rungs = self.rungs()
        reached = {c.label: r for r, rung in enumerate(rungs) for c in rung}
        return {
            "chosen": chosen.values if chosen else None,
            "chosen_label": chosen.label if chosen else None,
            "candidates": [
                {
                    "values": c.values,
                    "label": c.label,
                    # the mean over the seeds it ran, all of which counted (None: one did not)
                    "score": c.score([t.seed for t in c.ran(self.seeds)]) if c.ran(self.seeds) else None,
                    "status": _status(c, self.seeds),
                    "rung": reached.get(c.label, 0),
                    "trials": [
                        {"seed": t.seed, "cell": t.cell, "status": t.status, "score": t.score}
                        | ({"detail": t.detail} if t.detail else {})
                        for t in c.ran(self.seeds)
                    ],
                }
                for c in self.candidates
            ],
            **({} if chosen else {"error": self.failure()}),
        }


def _status(option: Candidate, seeds: Sequence[int]) -> str:
    """``ok`` when every trial that ran counted, else the first other status."""
    ran = option.ran(seeds)
    return next((t.status for t in ran if not t.eligible), "ok" if ran else NOT_RUN)


def _score_text(option: Candidate, seeds: Sequence[int]) -> str:
    ran = option.ran(seeds)
    score = option.score([t.seed for t in ran]) if ran else None
    return f"{score:.4g}" if score is not None else _status(option, seeds)


def tuning_record(
    grid: dict[str, list[Any]],
    tune_seeds: Sequence[int],
    tunings: Sequence[Tuning],
    grids: Mapping[tuple[str, str], dict[str, list[Any]]] | None = None,
) -> dict[str, Any]:
    """What ``tune.json`` holds: the tuned keys, their grid as written and the seeds; per task its headline
    metric and direction, and per variant (:meth:`Tuning.record`) every candidate (``added``: one the
    tuner added past an end of the grid) and the choice; a variant that tuned another grid (``grids``:
    a ladder's top rung, centred on the rungs below) records it as its ``grid``."""
    tasks: dict[str, dict[str, Any]] = {}
    for tuning in tunings:
        task = tasks.setdefault(
            tuning.task, {"metric": tuning.metric, "higher_is_better": tuning.higher_is_better, "variants": {}}
        )
        own = (grids or {}).get((tuning.task, tuning.variant))
        record = tuning.record() | ({"grid": {key: list(values) for key, values in own.items()}} if own else {})
        for candidate in record["candidates"]:
            candidate["added"] = any(
                candidate["values"].get(key) not in values for key, values in (own or grid).items()
            )
        task["variants"][tuning.variant] = record
    return {
        "keys": list(grid),
        "grid": {key: list(values) for key, values in grid.items()},
        "extension_steps": EXTENSION_STEPS,
        "tune_seeds": list(tune_seeds),
        "method": "successive halving",
        "tasks": tasks,
    }


def _numbers(values: Sequence[Any]) -> bool:
    """Whether a grid can be extended geometrically: two or more distinct positive numbers (not booleans)."""
    return (
        len(set(values)) >= 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        and min(values) > 0
    )


def grid_step(value: float, ratio: float, integer: bool) -> float:
    """``value`` times ``ratio``, to 4 significant digits (``9e-05``, not ``9.000000000000001e-05``)."""
    stepped = float(f"{value * ratio:.4g}")
    return round(stepped) if integer else stepped


def extension(tuning: Tuning, grid: dict[str, list[Any]]) -> dict[str, Any] | None:
    """The values of the next candidate past an end of ``grid`` (the ``tune:`` section as written) that the
    complete ``tuning``'s choice sits at: the chosen values with that key one step of the grid's own
    ratio further (see the module docstring); None when the choice is interior for every key, the
    tuning is not complete, nothing was chosen, or :data:`EXTENSION_STEPS` values were added there."""
    chosen = tuning.chosen
    if chosen is None:
        return None
    for key, written in grid.items():
        if not _numbers(written):
            continue
        ends = sorted(set(written))
        tried = sorted({c.values[key] for c in tuning.candidates})
        value = chosen.values[key]
        integer = all(isinstance(v, int) for v in written)
        if value == tried[0] and value <= ends[0]:
            beyond, ratio = sum(v < ends[0] for v in tried), ends[0] / ends[1]
        elif value == tried[-1] and value >= ends[-1]:
            beyond, ratio = sum(v > ends[-1] for v in tried), ends[-1] / ends[-2]
        else:
            continue
        following = grid_step(value, ratio, integer)
        if beyond < EXTENSION_STEPS and following not in tried and following > 0:
            return {**chosen.values, key: following}
    return None
