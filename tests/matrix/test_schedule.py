"""Which cells a run trains next (``blockbench.matrix.schedule``): the rounds of seeds add the seeds up
to the next planned look for exactly the questions the function handed in calls open, and end when
none is; the run reads results through the store's reuse rule."""

from __future__ import annotations

from dataclasses import dataclass

import yaml
from helpers import write_matrix

from blockbench.matrix.expand import expand_matrix
from blockbench.matrix.schedule import Results, SeedRounds, first_round
from blockbench.store.reuse import ReuseRule


@dataclass(frozen=True)
class Open:
    task: str
    variant: str
    baseline: str
    seeds: int


def rounds_matrix(tmp_path):
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post", "sandwich"]})
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "seeds": {"min": 2, "max": 6, "step": 2}}, sort_keys=False))
    return expand_matrix(path)


def test_the_rounds_of_seeds_follow_the_open_questions_handed_in(tmp_path):
    expansion = rounds_matrix(tmp_path)
    assert {int(cell.axes["seed"]) for cell in first_round(expansion)} == {0, 1}
    asked: list = []

    def open_questions(matrix_dir):
        asked.append(matrix_dir)
        return [Open("lm", "norm_placement=post", "norm_placement=pre", 2)]

    results = Results(tmp_path / "results" / "m", ReuseRule("f" * 64))
    seeds = SeedRounds(expansion, open_questions, tunings={})
    seeds.planned |= {cell.key for cell in first_round(expansion)}
    cells = seeds.next_cells(results)
    # the next look is at 4 seeds: seeds 2 and 3 of the variant and of its baseline, not of sandwich
    assert sorted(cell.key for cell in cells) == [
        "lm/norm_placement=post/seed2",
        "lm/norm_placement=post/seed3",
        "lm/norm_placement=pre/seed2",
        "lm/norm_placement=pre/seed3",
    ]
    assert asked == [results.matrix_dir] and "4 more seed cell(s)" in seeds.describe(cells)
    # the same question still open at 2 seeds asks for nothing new: the schedule has ended
    assert seeds.next_cells(results) is None


def test_no_open_question_ends_the_rounds_at_once(tmp_path):
    expansion = rounds_matrix(tmp_path)
    seeds = SeedRounds(expansion, lambda matrix_dir: [], tunings={})
    assert seeds.next_cells(Results(tmp_path, ReuseRule("f" * 64))) is None
