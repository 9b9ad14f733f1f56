"""The baseline swap: does a verdict rest on its baseline's particular seeds?

Every question of a matrix compares a variant with the same baseline cells, and a baseline variant
is usually the same config in every matrix of the book (the default model of each task), whose
cells the runner copies from one matrix into the next. So every verdict of a family leans on the
same few baseline seeds: an unlucky draw of them moves all those verdicts together, which no
per-question error rate accounts for. The swap measures it on the cells the book already has: for
each question with a verdict, it looks for an *independent baseline set*, cells of the very config
of the question's baseline cells (the resolved config with its seed left out, as its config hash
would see it) on seeds that neither side of the question used, finished, made by the same code (or
code the results folder's lineage admits as the same, :mod:`blockbench.store.lineage`) on the same kind of
device. The empirical null's second replica is such a set for the book's default baselines; so are a
baseline's own seeds past a question's look. The question is then decided again with its baseline
side replaced by as many seeds of that set as the original look had (the lowest rounds first, a
replica's shifted seeds counted by their round), unpaired since the seeds differ, by
``decide.decide`` as the analysis calls it: the same looks, the margin by the same rule, a rank test
where a seed of either side did not learn or diverged. A verdict whose word changes is
**fragile**: another draw of the same baseline gives another answer.

:func:`fragile_questions` returns a :class:`BaselineSwaps` (one typed :class:`Swap` per question);
the index of a results root states its count and marks each fragile verdict with :data:`FRAGILE_MARK`.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..config import RunConfig
from ..matrixfile import REPLICA_SEED_STRIDE
from ..provenance import code_fingerprint
from ..store.layout import CONFIG_FILE, MATRIX_FILE, RESULT_FILE, cell_files
from ..store.lineage import Lineage
from ..store.record import CellRecord, load_record
from .analysis import Question, TaskAnalysis, analyze, restrict
from .decide import VERDICTS, Decision, decide
from .headroom import saturation_text
from .ranks import any_failed
from .results import Group, gives_verdicts
from .stats import diverged_value, with_diverged
from .verdicts import NO_RESULT, SATURATED, Comparison

#: the mark of a fragile verdict in the index
FRAGILE_MARK = "†"


def config_key(config: Mapping[str, Any]) -> str | None:
    """A hash of a cell's resolved config without its seed: equal for two cells that differ in their seed
    alone. The config is read as the current code reads it (``RunConfig.resolved_dict``, so a setting added
    since the cell trained is at its default, as in the cell's config hash). None for a config this code
    does not validate: what it would have meant cannot be compared, so such a cell is matched with none."""
    try:
        hashed: dict[str, Any] = RunConfig.model_validate(dict(config)).resolved_dict()
    except (ValidationError, ValueError, TypeError):
        return None
    hashed.pop("seed", None)
    return hashlib.sha256(json.dumps(hashed, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PoolCell:
    """One reported cell of a results root: where it is (matrix folder, task row, variant, seed), the
    hash of its config without the seed (:func:`config_key`), its record and the code it counts as made by."""

    matrix: str
    task: str
    variant: str
    seed: int
    config_key: str
    record: CellRecord
    #: the code the cell counts as made by: this checkout's where the results root's lineage admits it
    code: str | None = None


@dataclass(frozen=True)
class CellPool:
    """Every reported cell with a result, a seed and a config this code validates in a results root,
    matrices with ``verdicts: false`` (the empirical null) included: where each cell is, and which cells
    share a config."""

    by_place: Mapping[tuple[str, str, str, int], PoolCell]
    #: config key -> its cells, one per seed (a cell copied into several matrices counts once)
    by_config: Mapping[str, tuple[PoolCell, ...]]

    @classmethod
    def load(cls, results_root: Path) -> CellPool:
        by_place: dict[tuple[str, str, str, int], PoolCell] = {}
        by_config: dict[str, dict[int, PoolCell]] = {}
        lineage, current = Lineage.load(results_root), code_fingerprint()
        for cell_file in cell_files_of(results_root):
            result_file, config_file = cell_file.with_name(RESULT_FILE), cell_file.with_name(CONFIG_FILE)
            if not result_file.is_file() or not config_file.is_file():
                continue
            config = yaml.load(config_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            if not isinstance(config, dict):
                continue
            cell = json.loads(cell_file.read_text())
            record = load_record(result_file)
            key = config_key(config)
            if not isinstance(record.seed, int) or key is None:
                continue
            code = record.code_fingerprint
            if code not in (None, current) and lineage.admits(record, current):
                code = current
            matrix = cell_file.parents[4].name  # <matrix>/cells/<task>/<variant>/<seed>/cell.json
            found = PoolCell(matrix, cell["task"], cell["variant"], record.seed, key, record, code)
            by_place[found.matrix, found.task, found.variant, found.seed] = found
            by_config.setdefault(found.config_key, {}).setdefault(found.seed, found)
        return cls(by_place, {key: tuple(cells.values()) for key, cells in by_config.items()})


def cell_files_of(results_root: Path) -> list[Path]:
    """The cell.json of every reported cell of every matrix folder of ``results_root``."""
    return [path for folder in sorted(Path(results_root).iterdir()) if folder.is_dir() for path in cell_files(folder)]


@dataclass(frozen=True)
class Swap:
    """One question and its baseline swap. ``verdict`` is the report's word; ``swapped`` the word with the
    baseline side replaced by the independent set (None: there is no such set, ``why`` says why),
    decided by ``decision`` on the set's ``seeds``, cells of the matrices ``sources``. ``identity``
    is the same for the same question asked in several matrices (the same cells on both sides)."""

    matrix: str
    task: str
    variant: str  # the variant's label, as the index shows it (without the level when by level)
    baseline: str
    level: tuple[tuple[str, Any], ...]
    verdict: str
    swapped: str | None
    #: the word of the question's own look decided unpaired (None without a swap): where it is the swapped
    #: word too, the swap changed the verdict by unpairing the seeds, not by the baseline's draw
    unpaired: str | None = None
    decision: Decision | None = None
    seeds: tuple[int, ...] = ()
    sources: tuple[str, ...] = ()
    why: str = ""
    identity: tuple[Any, ...] = ()

    @property
    def has_set(self) -> bool:
        return self.swapped is not None

    @property
    def fragile(self) -> bool:
        """The swap changes the verdict's word."""
        return self.swapped is not None and self.swapped != self.verdict

    @property
    def by_pairing(self) -> bool:
        """Fragile, but the question's own seeds decided unpaired give the swapped word as well: what
        changed the verdict is the pairing the swap gives up, not the baseline's draw."""
        return self.fragile and self.unpaired == self.swapped

    @property
    def place(self) -> tuple[str, str, str, tuple[tuple[str, Any], ...]]:
        """(matrix, task, variant label, level): where the index shows the question."""
        return (self.matrix, self.task, self.variant, self.level)


@dataclass(frozen=True)
class BaselineSwaps:
    """The baseline swap of every question with a verdict in a results root (:class:`Swap`, in matrix
    order), and what the index says of them. A question asked in several matrices on the same cells
    is counted once."""

    swaps: tuple[Swap, ...] = ()

    @property
    def questions(self) -> list[Swap]:
        """One swap per distinct question (that of the first matrix that asks it)."""
        first: dict[tuple[Any, ...], Swap] = {}
        for swap in self.swaps:
            first.setdefault(swap.identity or swap.place, swap)
        return list(first.values())

    @property
    def kept(self) -> list[Swap]:
        return [s for s in self.questions if s.has_set and not s.fragile]

    @property
    def fragile(self) -> list[Swap]:
        return [s for s in self.questions if s.fragile]

    @property
    def without_set(self) -> list[Swap]:
        return [s for s in self.questions if not s.has_set]

    def is_fragile(self, matrix: str, task: str, variant: str, level: tuple[tuple[str, Any], ...] = ()) -> bool:
        """Whether the question of ``matrix`` shown as ``variant`` (at ``level``) on ``task`` is fragile."""
        return any(s.fragile and s.place == (matrix, task, variant, tuple(level)) for s in self.swaps)

    def marked(self, matrix: str, comparisons: Iterable[Comparison]) -> list[Comparison]:
        """``comparisons`` of ``matrix`` with :data:`FRAGILE_MARK` after the difference of each fragile one."""
        return [
            replace(c, difference_text=f"{c.difference_text} {FRAGILE_MARK}")
            if self.is_fragile(matrix, c.task, c.variant, c.level)
            else c
            for c in comparisons
        ]

    def line(self) -> str:
        """The index's line: how many verdicts keep their word when their baseline's seeds are swapped for
        an independent set of the same config, how many are fragile (and how many of those change as well
        when their own seeds are compared unpaired), how many have no such set ("" without a verdict)."""
        if not self.questions:
            return ""
        kept, fragile = len(self.kept), len(self.fragile)
        pairing = sum(s.by_pairing for s in self.fragile)
        because = (
            f", {pairing} of them because the swap gives up the pairing of seeds (decided unpaired on their own "
            "seeds they change too)"
            if pairing
            else ""
        )
        return (
            f"**Baseline swap**: {kept} of {kept + fragile} verdicts with an independent baseline set (cells of the "
            "baseline's very config, code and device kind on seeds neither side used, such as the empirical null's "
            "second replica) keep their word when the baseline's seeds are swapped for that set and the question is "
            f"decided again; {fragile} {'is' if fragile == 1 else 'are'} fragile (marked {FRAGILE_MARK}: another "
            f"draw of the same baseline gives another answer){because}; {len(self.without_set)} "
            f"{'has' if len(self.without_set) == 1 else 'have'} no such set. A question asked in several matrices "
            "counts once."
        )

    def summary_lines(self, matrix: str) -> list[str]:
        """A paragraph for ``matrix``'s summary naming its fragile verdicts (none where it has none)."""
        found = [s for s in self.swaps if s.matrix == matrix and s.fragile]
        if not found:
            return []
        names = "; ".join(
            f"{s.task}, {s.variant}: {s.verdict} becomes {s.swapped} against seeds {_seeds_text(s.seeds)} of "
            f"{' and '.join(s.sources)}"
            + (" (decided unpaired on its own seeds it changes too)" if s.by_pairing else "")
            for s in found
        )
        return [
            f"**Fragile verdicts** (marked {FRAGILE_MARK}): decided again with the baseline's seeds swapped for cells "
            f"of the baseline's very config on seeds neither side used, these change their word: {names}. Such a "
            "verdict rests on the baseline's particular seeds.",
            "",
        ]


def _seeds_text(seeds: tuple[int, ...]) -> str:
    """``1000000-1000005`` for a run of consecutive seeds, else ``3, 7, 9``."""
    if len(seeds) > 2 and list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(str(seed) for seed in seeds)


def redecide(
    analysis: TaskAnalysis, variant: Group, baseline: Group, *, unpaired: bool = False
) -> tuple[str, Decision]:
    """The question of ``variant`` against ``baseline`` (both restricted to the seeds to compare), decided
    as the analysis decides one look: a diverged seed at the worse of the trivial baseline and the worst
    finished seed of the two sides, a rank test where a seed of either side did not learn or
    diverged, the margin by the task's rule at this baseline's mean, the matrix's looks; the word is *no result*
    where no seed of either side learned and *saturated* where both sides are, as in the report.
    ``unpaired``: the two sides are compared as if their seeds differed (Welch, Mann-Whitney) even where
    they are the same seeds, which tells what the pairing alone contributes to a verdict."""
    headline = analysis.headline
    finished = [side.finished_values(headline.name) for side in (variant, baseline)]
    value = diverged_value(
        analysis.trivial_baselines.get(headline.name),
        [v for side in finished for v in side.values()],
        headline.higher_is_better,
    )
    values, baseline_values = (
        with_diverged(f, side.diverged_seeds, value) for f, side in zip(finished, (variant, baseline), strict=True)
    )
    failed = [analysis.failed_seeds(variant), analysis.failed_seeds(baseline)]
    rank_based = bool(
        any_failed(
            *([seed in bad for seed in seeds] for bad, seeds in zip(failed, (values, baseline_values), strict=True))
        )
    )
    margin = analysis.margin(statistics.fmean(baseline_values.values()))
    decision = decide(
        values,
        {("baseline", seed): v for seed, v in baseline_values.items()} if unpaired else baseline_values,
        margin=margin.value,
        higher_is_better=headline.higher_is_better,
        looks=analysis.looks,
        rank_based=rank_based,
    )
    if set(values) <= failed[0] and set(baseline_values) <= failed[1]:
        return NO_RESULT, decision
    means = [statistics.fmean(values.values()), statistics.fmean(baseline_values.values())]
    if saturation_text(analysis.task_cfg, headline, [variant, baseline], means):
        return SATURATED, decision
    return decision.verdict, decision


def _swap(matrix: str, analysis: TaskAnalysis, question: Question, pool: CellPool) -> Swap:
    """The baseline swap of one question (see the module's docstring)."""
    group, baseline = question.group, question.baseline
    if baseline is None:
        raise ValueError(f"{matrix}: {analysis.task} {group.variant} has no baseline to swap")
    unswapped = Swap(
        matrix,
        analysis.task,
        analysis.label(group),
        analysis.baseline_label,
        group.level if analysis.by_level else (),
        question.verdict,
        swapped=None,
    )
    look_variant, look_baseline = question.look
    cells = [pool.by_place.get((matrix, analysis.task, baseline.variant, seed)) for seed in look_baseline]
    variant_cells = [pool.by_place.get((matrix, analysis.task, group.variant, seed)) for seed in look_variant]
    keys = {c.config_key for c in cells if c is not None}
    if None in cells or len(keys) != 1 or None in variant_cells:
        return replace(unswapped, why="the baseline's cells have no config this code validates to match")
    key = keys.pop()
    identity = (
        analysis.task,
        tuple(sorted({c.config_key for c in variant_cells if c is not None})),
        key,
        tuple(sorted(look_variant, key=str)),
        tuple(sorted(look_baseline, key=str)),
    )
    made = {c.code for c in cells if c is not None}
    kinds = {c.record.device_kind for c in cells if c is not None}
    used = set(look_variant) | set(look_baseline)
    candidates = sorted(
        (
            c
            for c in pool.by_config.get(key, ())
            if c.record.finished and c.seed not in used and c.code in made and c.record.device_kind in kinds
        ),
        key=lambda c: (c.seed % REPLICA_SEED_STRIDE, c.seed),
    )
    needed = len(look_baseline)
    if len(candidates) < needed:
        why = f"{len(candidates)} cell(s) of the baseline's config on other seeds, {needed} needed"
        return replace(unswapped, why=why, identity=identity)
    chosen = candidates[:needed]
    swap_group = Group(
        baseline.task, baseline.task_name, baseline.variant, baseline.index, [c.record for c in chosen], baseline.axes
    )
    variant_look = restrict(group, look_variant)
    word, decision = redecide(analysis, variant_look, swap_group)
    return replace(
        unswapped,
        swapped=word,
        unpaired=redecide(analysis, variant_look, restrict(baseline, look_baseline), unpaired=True)[0],
        decision=decision,
        seeds=tuple(c.seed for c in chosen),
        sources=tuple(dict.fromkeys(c.matrix for c in chosen)),
        identity=identity,
    )


def matrix_swaps(matrix: str, analyses: Iterable[TaskAnalysis], pool: CellPool) -> list[Swap]:
    """The baseline swap of every question with a verdict (better, worse, equivalent, undecided) of the
    matrix folder named ``matrix``, whose analyses are ``analyses``, against the cells of ``pool``."""
    return [
        _swap(matrix, analysis, question, pool)
        for analysis in analyses
        for question in analysis.questions
        if question.verdict in VERDICTS and question.decision is not None and question.baseline is not None
    ]


def summary_swaps(matrix_dir: Path, analyses: Iterable[TaskAnalysis]) -> BaselineSwaps:
    """The baseline swap of one matrix's questions (``analyses``), against the cells of its results root
    (the folder that holds ``matrix_dir``): what its summary marks. None for a ``verdicts: false`` matrix."""
    matrix_dir = Path(matrix_dir)
    if not gives_verdicts(matrix_dir / MATRIX_FILE):
        return BaselineSwaps()
    return BaselineSwaps(tuple(matrix_swaps(matrix_dir.name, analyses, CellPool.load(matrix_dir.parent))))


def fragile_questions(results_root: Path) -> BaselineSwaps:
    """The baseline swap of every question with a verdict of every matrix of ``results_root`` whose file
    does not say ``verdicts: false``, against the cells of the whole root (those apart included: the
    empirical null's second replica is an independent set of the default baselines)."""
    results_root = Path(results_root)
    pool = CellPool.load(results_root)
    swaps = [
        swap
        for folder in sorted(p for p in results_root.iterdir() if p.is_dir() and cell_files(p))
        if gives_verdicts(folder / MATRIX_FILE)
        for swap in matrix_swaps(folder.name, analyze(folder)[2], pool)
    ]
    return BaselineSwaps(tuple(swaps))
