"""``blockbench.matrix.estimate.timing``: a whole cell's time from a short timed fit. The counts of each repeated
part checked against a step-by-step count, the scaling of the parts against hand computations with made-up
timings (a fake clock: no timed assertions), and one real timing of a tiny cell in processes of their own."""

from __future__ import annotations

import itertools

import pytest
from helpers import TINY_LM, TINY_LM_TASK

from blockbench.config import RunConfig, TrainerConfig
from blockbench.matrix.estimate.timing import (
    CellTiming,
    Company,
    PartCounts,
    keep_busy,
    median_timing,
    part_counts,
    step_seconds,
    time_runs,
    validation_seconds,
)
from blockbench.matrix.jobs import job_slots


def counted_step_by_step(max_steps: int, val_every: int, curve_every: int, checkpoint_every: int | None, start: int):
    """What a cell trained from ``start`` does, step by step: the reference for :func:`part_counts`."""
    validations = curve = checkpoints = 0
    curve += curve_every > 0 and start == 0  # a fresh cell's point before its first step
    for step in range(start + 1, max_steps + 1):
        validations += step % val_every == 0 or step == max_steps  # the final validation
        curve += curve_every > 0 and (step % curve_every == 0 or step == max_steps)
        checkpoints += bool(checkpoint_every) and step % checkpoint_every == 0
    return PartCounts(max_steps - start, validations, curve, checkpoints)


def test_a_cells_parts_are_counted_as_it_does_them_step_by_step():
    for max_steps, val_every, curve_every, checkpoint_every in itertools.product(
        (1, 7, 25, 100, 300), (1, 3, 50, 100), (0, 1, 10, 30), (None, 2, 50)
    ):
        trainer = TrainerConfig(max_steps=max_steps, val_every_n_steps=val_every, curve_every_n_steps=curve_every)
        for start in {0, max_steps // 2, max_steps - 1}:
            expected = counted_step_by_step(max_steps, val_every, curve_every, checkpoint_every, start)
            assert part_counts(trainer, start, checkpoint_every) == expected, (max_steps, val_every, curve_every, start)
    # by hand: the default cell (300 steps, validated every 100, 11 loss-curve points, a checkpoint every 50)
    default = TrainerConfig(max_steps=300, val_every_n_steps=100)
    assert part_counts(default, 0, 50) == PartCounts(300, 3, 11, 6)
    assert part_counts(default, 150, 50) == PartCounts(150, 2, 5, 3)  # resumed: 200, 300; 180..300; 200, 250, 300
    assert part_counts(TrainerConfig(max_steps=250, val_every_n_steps=100), 0, None).validations == 3  # 100, 200, 250


def test_a_timing_scales_to_the_whole_cell():
    timing = CellTiming(process=0.5, build=2.0, fit=1.5, step=0.25, validation=3.0, curve=0.1, checkpoint=0.4)
    trainer = TrainerConfig(max_steps=300, val_every_n_steps=100)
    # 0.5 + 2 + 1.5 + 300 x 0.25 + 3 x 3 + 11 x 0.1 + 0 checkpoints (none on this timing's accelerator)
    assert timing.seconds(trainer) == pytest.approx(4.0 + 75.0 + 9.0 + 1.1)
    every_50 = CellTiming(**{**timing.__dict__, "checkpoint_every": 50})
    assert every_50.seconds(trainer) == pytest.approx(89.1 + 6 * 0.4)
    assert every_50.seconds(trainer, from_step=150) == pytest.approx(4.0 + 37.5 + 2 * 3.0 + 5 * 0.1 + 3 * 0.4)


def test_a_step_is_the_median_time_between_steps_less_the_validations_between_them():
    # steps end at 10, 11, 12.5, 16 and 17.2; a validation ran from 13 to 15, after the step ending at 12.5
    ends = [10.0, 11.0, 12.5, 16.0, 17.2]
    assert step_seconds(ends, [(13.0, 15.0)]) == pytest.approx(1.35)  # median of 1.0, 1.5, 1.5, 1.2
    assert step_seconds([3.0], []) == 0.0  # one step: no interval to measure


def test_a_validation_scales_each_loaders_batches_to_its_length():
    # loader 0: 2 batches of 10 timed (0.2, 0.4 s), loader 1: 1 of 4 (0.1 s), 1 s in all: 0.3 s at its end
    assert validation_seconds({0: [0.2, 0.4], 1: [0.1]}, 1.0, [10, 4]) == pytest.approx(0.3 + 0.3 * 10 + 0.1 * 4)
    assert validation_seconds({}, 0.05, []) == pytest.approx(0.05)  # no batch: the end alone


def test_a_run_timed_twice_gets_each_parts_median():
    first = CellTiming(process=1, build=2, fit=3, step=4, validation=5, curve=6, checkpoint=7, checkpoint_every=50)
    second = CellTiming(process=3, build=2, fit=1, step=2, validation=9, curve=6, checkpoint=5, checkpoint_every=50)
    assert median_timing([first, second]) == CellTiming(2, 2, 2, 3, 7, 6, 6, 50)


def test_a_round_waits_for_every_timing_and_for_none_that_died(tmp_path):
    """A timing works on until each of its round has arrived (``keep_busy``), at most its timeout."""
    mine, other = Company(tmp_path, 2, "0"), Company(tmp_path, 2, "1")
    calls = []
    mine.arrive("ready")

    def work():  # the other timing arrives after three steps of this one's untimed work
        calls.append(1)
        if len(calls) == 3:
            other.arrive("ready")

    keep_busy(work, lambda: mine.all_arrived("ready"))
    assert len(calls) == 3
    keep_busy(lambda: calls.append(1), lambda: mine.all_arrived("done"), timeout=0.0)  # nobody done: gives up
    assert len(calls) == 3


def test_timing_a_tiny_cell_in_processes_of_their_own(tmp_path):
    """Each run's cell timed in a process forked as a cell's, two at a time as with ``--jobs 2`` (the one
    run padded to a round of two): every part measured; a run that cannot be built is reported, not raised."""
    run = RunConfig.model_validate({**TINY_LM, "trainer": {**TINY_LM["trainer"], "num_threads": 1}})
    broken = RunConfig.model_validate({**TINY_LM, "task": {**TINY_LM_TASK, "n_train_tokens": 10}})  # no batch
    environments = [slot.environment() for slot in job_slots(2)]
    timings, problems = time_runs({"tiny": run}, environments)
    timing = timings["tiny"]
    assert timing.step > 0 and timing.validation > 0 and timing.curve > 0 and timing.checkpoint > 0
    assert timing.build > 0 and timing.process > 0 and timing.checkpoint_every == 50 and problems == {}
    assert timing.seconds(run.trainer) > 4 * timing.step + 2 * timing.validation
    timings, problems = time_runs({"broken": broken}, environments[:1])
    assert timings == {} and problems["broken"], problems
