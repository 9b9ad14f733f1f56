"""Where a cell's wall time goes (``result.json`` ``wall_time_breakdown``) and a matrix run's
(``matrix_run.json``, the summary's header and its "Where the time went" section): the parts add up
to the total, each part grows when what it times is made slow and the others do not, the start-up
agrees with what is seen from outside the process, and the summary shows what the files hold."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import lightning as L
import pytest
import yaml
from helpers import TINY_LM, ok_result, scalars, write_matrix

from blockbench.cell.train import train
from blockbench.config import build_run_config
from blockbench.durations import format_duration
from blockbench.matrix_command import run_matrix
from blockbench.report.summary import write_report
from blockbench.store.layout import write_json
from blockbench.store.record import CellRecord, read_load
from blockbench.tasks.lm import AgreementDataModule
from blockbench.walltime import CELL_PARTS as MEASURED_PARTS
from blockbench.walltime import FORKED_NOTE

#: every part of a cell's breakdown, which add up to its total: the process start, the measured parts, the rest
CELL_PARTS = ("startup", *MEASURED_PARTS, "other")
#: every part of a matrix run's breakdown
MATRIX_PARTS = ("startup", "planning", "tensorboard_views", "peak_probe", "cell_server", "cells", "report", "other")
SLEEP_S = 0.3


def tiny_cell(**trainer) -> dict:
    """TINY_LM (4 steps, validated at steps 2 and 4), one thread, a configured peak (no probe), no checkpoints."""
    config = copy.deepcopy(TINY_LM)
    config["trainer"].update({"num_threads": 1, "peak_tflops": 0.05, "checkpoint_every_n_steps": None, **trainer})
    return config


def train_tiny(tmp_path: Path, config: dict, name: str, *callbacks: L.Callback) -> CellRecord:
    return train(
        build_run_config(config),
        tmp_path / name,
        tb_dir=tmp_path / "tb",
        tb_name="lm",
        tb_version=name,
        extra_callbacks=callbacks,
    )


def assert_adds_up(breakdown: dict, parts: tuple[str, ...]) -> None:
    """Every part is there, none negative, and they sum to the total (each is rounded to 0.01 s)."""
    values = [breakdown[part] for part in parts if breakdown[part] is not None]
    assert all(value >= 0 for value in values), breakdown
    assert sum(values) == pytest.approx(breakdown["total"], abs=0.01 * len(values)), breakdown


@pytest.fixture(scope="module")
def normal(tmp_path_factory) -> tuple[CellRecord, Path]:
    tmp_path = tmp_path_factory.mktemp("wall_time")
    return train_tiny(tmp_path, tiny_cell(), "normal"), tmp_path / "tb" / "lm" / "normal"


def test_the_parts_of_a_cell_add_up_to_its_total(normal):
    result, run_dir = normal
    breakdown = result.wall_time_breakdown
    assert_adds_up(breakdown, CELL_PARTS)
    # train() called in this (pytest) process: no start-up of its own, the total starts with train()
    assert breakdown["startup"] is None and breakdown["measured_from"].startswith("clock start (called inside")
    assert breakdown["resumed"] is False
    assert breakdown["data"] > 0 and breakdown["validation"] > 0 and breakdown["train_steps"] > 0
    assert breakdown["checkpoints"] == 0  # none configured
    # the training steps are the step times the run logged, one per step (log_every_n_steps: 1), the first
    # step's excess over the median of the others apart
    step_times = scalars(run_dir, "4_perf/step_time_ms")
    first, *rest = step_times
    excess = max(0.0, first - sorted(rest)[len(rest) // 2]) / 1e3  # 3 steps: the median is the middle one
    assert len(step_times) == 4 and breakdown["first_step"] == pytest.approx(excess, abs=0.011)
    assert breakdown["train_steps"] + breakdown["first_step"] == pytest.approx(sum(step_times) / 1e3, abs=0.021)
    # the total holds the training time the result has always recorded (from the start of training on)
    assert breakdown["total"] >= result.wall_time_s - 0.01


def test_a_tiny_cells_named_parts_hold_at_least_90_percent_of_its_wall_time(normal, tmp_path):
    """Every second of a cell's run in a named part (set-up, build, data, Lightning's fit set-up, the FLOP
    count, the first step's excess, the steps, the loop between them, validation, teardown), ``other``
    at most 10% of the total, the parts no more than the total, and the total no more than the time the
    call took as seen from outside it."""
    config = tiny_cell()
    started = time.perf_counter()
    result = train_tiny(tmp_path, config, "attributed")
    seen = time.perf_counter() - started
    wall = result.wall_time
    assert wall is not None and wall.startup is None  # in this process: the clock starts with train()
    assert wall.unattributed_share <= 0.10, result.wall_time_breakdown
    assert wall.attributed + (wall.other or 0.0) == pytest.approx(wall.total, abs=0.01 * len(CELL_PARTS))
    assert wall.attributed <= wall.total + 0.01 * len(CELL_PARTS)
    assert wall.total <= seen + 0.005  # the total is rounded to 0.01 s
    assert set(wall.parts()) == set(CELL_PARTS) - {"startup", "other"}  # every part measured
    for part in ("data", "flop_count", "train_steps", "validation", "teardown"):  # each at least 10 ms here
        assert getattr(wall, part) > 0, (part, result.wall_time_breakdown)
    assert normal[0].wall_time.unattributed_share <= 0.10


def test_validation_time_is_zero_exactly_when_nothing_was_validated(tmp_path, monkeypatch):
    """A cell that diverges at its first step is validated once as Lightning stops it; with no
    validation data, Lightning skips every validation run (and the diverged cell has no final one)."""
    diverging = tiny_cell(divergence_threshold=1e-3)
    validated = train_tiny(tmp_path, diverging, "validated")
    assert validated.status == "diverged" and len(validated.history) == 1
    assert validated.wall_time_breakdown["validation"] > 0
    monkeypatch.setattr(AgreementDataModule, "val_dataloader", lambda self: [])
    # its one step made measurably long: a tiny model's step can take under 5 ms, which rounds to 0.00 s
    result = train_tiny(tmp_path, diverging, "not_validated", SlowStep())
    assert result.status == "diverged" and result.history == []
    breakdown = result.wall_time_breakdown
    assert breakdown["validation"] == 0 and breakdown["train_steps"] >= 0.05
    assert_adds_up(breakdown, CELL_PARTS)


class SlowStep(L.Callback):
    """Sleeps inside every training step (after its backward pass), which the step's time holds."""

    def on_after_backward(self, trainer, pl_module) -> None:
        time.sleep(0.05)


class SlowValidationEnd(L.Callback):
    """Sleeps at the end of every validation run, after the runner's own callbacks."""

    def __init__(self) -> None:
        self.validations = 0

    def on_validation_end(self, trainer, pl_module) -> None:
        self.validations += 1
        time.sleep(SLEEP_S)


def test_a_slow_validation_shows_as_validation_time_only(normal, tmp_path):
    slow = SlowValidationEnd()
    result = train_tiny(tmp_path, tiny_cell(), "slow_validation", slow)
    got = result.wall_time_breakdown
    assert slow.validations == 2
    assert_adds_up(got, CELL_PARTS)
    # the sleeps are validation time; counted anywhere else too, the remainder (other) would go
    # negative. (No comparison with the normal run's figures: on a busy machine they vary by more
    # than a sleep.)
    assert got["validation"] >= slow.validations * SLEEP_S


class SlowCheckpoint(L.Callback):
    """Adds ``SLEEP_S`` to every checkpoint save (Lightning calls it while it builds the checkpoint)."""

    def __init__(self) -> None:
        self.saves = 0

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.saves += 1
        time.sleep(SLEEP_S)


def test_a_slow_checkpoint_shows_as_checkpoint_time_even_when_saved_inside_a_validation(normal, tmp_path):
    """A checkpoint every step: those of steps 2 and 4 are saved at the end of their validation
    (StepCheckpoint waits for it), and count as checkpoint time, not validation time."""
    slow = SlowCheckpoint()
    result = train_tiny(tmp_path, tiny_cell(checkpoint_every_n_steps=1), "slow_checkpoint", slow)
    got, before = result.wall_time_breakdown, normal[0].wall_time_breakdown
    assert slow.saves == 4
    assert_adds_up(got, CELL_PARTS)
    # checkpoint time, not validation time: counted in both, the remainder (other) would go negative
    assert got["checkpoints"] >= slow.saves * SLEEP_S > before["checkpoints"]


class Interrupt(Exception):
    pass


class InterruptAfter(L.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise Interrupt


def test_a_resumed_cell_counts_the_resuming_process_only(tmp_path):
    """Stopped after step 3, resumed from the checkpoint of step 2: the breakdown is flagged and its
    training steps are those of steps 3 and 4, the steps this process logged."""
    config = tiny_cell(checkpoint_every_n_steps=2)
    with pytest.raises(Interrupt):
        train_tiny(tmp_path, config, "cell", InterruptAfter(3))
    result = train_tiny(tmp_path, config, "cell")
    breakdown = result.wall_time_breakdown
    assert result.resumed_from_step == 2 and breakdown["resumed"] is True
    assert_adds_up(breakdown, CELL_PARTS)
    # TensorBoard drops the interrupted process's points from step 2 on: the last two are the resumed process's
    resumed_steps = scalars(tmp_path / "tb/lm/cell", "4_perf/step_time_ms")[-2:]
    # the first step's time beyond the steady median is its own part (first_step), moved out of train_steps
    steps = breakdown["train_steps"] + breakdown["first_step"]
    assert steps == pytest.approx(sum(resumed_steps) / 1e3, abs=0.021)


@pytest.mark.parametrize("forked", [True, False])
def test_a_matrix_cell_counts_its_process_start_up_and_the_run_records_every_part(tmp_path, monkeypatch, forked):
    """A one-cell matrix: the cell runs as ``blockbench train`` in a process of its own, whose start-up
    (process start to ``train()``, where it writes config.yaml first) is seen from here too; the matrix
    run records the cell's seconds and its own parts, and the summary shows them. A single-process
    cell is forked from the preloaded server (its start-up excludes the imports, which the server did
    before the fork); a DDP cell (here: forking turned off) is a fresh interpreter, which imports them."""
    import blockbench.matrix.jobs as jobs_module
    import blockbench.matrix.run as matrix_module

    spawned: list[float] = []
    real_run, real_fork = jobs_module.run_subprocess, jobs_module.run_forked

    def timed(real):
        def start(*args, **kwargs):
            spawned.append(time.time())
            return real(*args, **kwargs)

        return start

    monkeypatch.setattr(jobs_module, "run_subprocess", timed(real_run))
    monkeypatch.setattr(jobs_module, "run_forked", timed(real_fork))
    if not forked:  # the runner's choice to start the server, and the cell's to fork
        monkeypatch.setattr(matrix_module, "forks", lambda run: False)
        monkeypatch.setattr(jobs_module, "forks", lambda run: False)
    real_expand = matrix_module.expand_matrix

    def slow_expand(*args, **kwargs):  # planning takes a few ms: make it long enough to show after rounding
        time.sleep(SLEEP_S)
        return real_expand(*args, **kwargs)

    monkeypatch.setattr(matrix_module, "expand_matrix", slow_expand)
    path = write_matrix(tmp_path, {"seed": [0]}, base=tiny_cell(checkpoint_every_n_steps=2))
    assert run_matrix(path, tmp_path / "results") == 0
    matrix_dir = tmp_path / "results/m"
    cell_dir = matrix_dir / "cells/lm/default/seed0"
    breakdown = json.loads((cell_dir / "result.json").read_text())["wall_time_breakdown"]
    run = json.loads((matrix_dir / "matrix_run.json").read_text())

    assert_adds_up(breakdown, CELL_PARTS)
    assert breakdown["checkpoints"] > 0
    [spawn] = spawned
    seen_startup = (cell_dir / "config.yaml").stat().st_mtime - spawn  # train() writes it first thing
    if forked:
        assert breakdown["measured_from"] == "process start" + FORKED_NOTE
        # the fork comes after the server's imports, which the first cell waits for (and later cells do not)
        assert 0 <= breakdown["startup"] < seen_startup
    else:
        assert breakdown["measured_from"] == "process start"
        assert breakdown["startup"] > 0.5  # an interpreter importing torch and Lightning
        assert breakdown["startup"] == pytest.approx(seen_startup, abs=0.15)
    [cell] = run["cells"]
    assert cell["key"] == "lm/default/seed0"
    # the runner saw the whole process, and not much more (its own wait for the process to end grows
    # with the machine's load)
    assert breakdown["total"] <= cell["seconds"] < 1.5 * breakdown["total"] + 10
    # the runner measured the load the cell ran under, from its start to its last reading before it ended
    # (from /proc: without it, as on macOS, there is no load.json)
    load = read_load(cell_dir)
    if Path("/proc/stat").is_file():
        assert load is not None and 0 < load.wall_s <= cell["seconds"] and load.cell_cpu_s > 0
        assert load.machine_cpu_s >= load.cell_cpu_s - 0.05  # the cell's CPU time is part of the machine's

    matrix = run["wall_time_breakdown"]
    assert_adds_up(matrix, MATRIX_PARTS)
    assert matrix["startup"] is None and matrix["measured_from"].startswith("clock start (called inside")
    assert matrix["cells"] >= cell["seconds"] and matrix["planning"] >= SLEEP_S and matrix["report"] > 0
    assert run["jobs"] == 1 and run["cells_trained"] == 1 and run["wall_time_s"] == round(matrix["total"], 1)

    summary = (matrix_dir / "summary.md").read_text()
    share = breakdown["train_steps"] / matrix["total"]
    assert (
        f"(last run: {format_duration(run['wall_time_s'])}, 1 cells trained; "
        f"training steps {share:.0%} of the wall time)" in summary
    )
    row = " | ".join(f"{breakdown[part]:,.1f}" for part in (*CELL_PARTS, "total"))
    assert f"| lm | 1 | {row} |" in summary
    assert f"this report {matrix['report']:,.1f} s" in summary


# the summary of synthetic results ------------------------------------------------------------------


def _breakdown(startup, build, data, data_wait, train_steps, validation, checkpoints, other, **flags) -> dict:
    parts = dict(
        startup=startup,
        build=build,
        data=data,
        data_wait=data_wait,
        train_steps=train_steps,
        validation=validation,
        checkpoints=checkpoints,
        other=other,
    )
    total = sum(v for v in parts.values() if v is not None)
    return {**parts, "total": total, "measured_from": "process start", "resumed": False, **flags}


def _cell(matrix_dir: Path, index: int, task: str, seed: int, breakdown: dict | None) -> None:
    cell_dir = matrix_dir / "cells" / task / "default" / f"seed{seed}"
    write_json(
        cell_dir / "cell.json",
        {"index": index, "task": task, "task_name": task, "variant": "default", "seed": seed, "axes": {}},
    )
    metrics = {
        "lm": {"perplexity": 10.0 + seed, "agreement_acc": 0.5, "loss": 2.0},
        "vit": {"accuracy": 0.5 + 0.1 * seed, "loss": 1.0},
    }[task]
    extra = {} if breakdown is None else {"wall_time_breakdown": breakdown}
    write_json(cell_dir / "result.json", ok_result(task, seed, metrics, {}, data={}, wall_time_s=40.0, **extra))


def synthetic_matrix(matrix_dir: Path, *, jobs: int) -> None:
    """lm seeds 0, 1 and vit seed 0 trained in the last run; vit seed 1 reused from an earlier run."""
    _cell(matrix_dir, 0, "lm", 0, _breakdown(4.0, 0.5, 2.0, 0.1, 30.0, 3.0, 0.4, 1.0))  # total 41.0
    _cell(matrix_dir, 1, "lm", 1, _breakdown(6.0, 0.5, 2.0, 0.3, 50.0, 5.0, 0.6, 1.0, resumed=True))  # total 65.4
    _cell(matrix_dir, 2, "vit", 0, _breakdown(5.0, 0.2, 1.0, 0.0, 20.0, 2.0, 0.0, 0.8))  # total 29.0
    _cell(
        matrix_dir,
        3,
        "vit",
        1,
        _breakdown(
            None,
            0.2,
            1.0,
            0.0,
            24.0,
            2.0,
            0.0,
            0.8,  # total 28.0
            measured_from="clock start",
        ),
    )
    run = {
        "command": "blockbench matrix m.yaml",
        "wall_time_s": 160.0,
        "cells_trained": 3,
        "jobs": jobs,
        "wall_time_breakdown": {
            "startup": 3.0,
            "planning": 1.0,
            "tensorboard_views": 2.0,
            "peak_probe": 4.0,
            "cells": 148.0,
            "report": 1.5,
            "other": 0.5,
            "total": 160.0,
        },
        "cells": [
            {"key": "lm/default/seed0", "seconds": 42.0},
            {"key": "lm/default/seed1", "seconds": 66.5},
            {"key": "vit/default/seed0", "seconds": 30.0},
        ],
    }
    write_json(matrix_dir / "matrix_run.json", run)
    (matrix_dir / "matrix.yaml").write_text(yaml.safe_dump({"name": matrix_dir.name, "axes": {"task": ["lm", "vit"]}}))


def test_the_summary_shows_where_the_time_went_by_hand(tmp_path):
    synthetic_matrix(tmp_path / "one", jobs=1)
    summary = write_report(tmp_path / "one")
    # the last run's cells trained 30 + 50 + 20 = 100 s of its 160 s; the reused vit seed 1 is not the last run's
    assert (
        "Command: `blockbench matrix m.yaml` (last run: 0:02:40, 3 cells trained; "
        "training steps 62% of the wall time)  \n" in summary
    )
    section = summary[summary.index("## Where the time went") :]
    # means: lm over seeds 0 and 1; vit over seeds 0 and 1, its start-up over seed 0 alone (seed 1 has none)
    assert (
        "| task | cells | startup | setup | build | data | fit setup | flop count | data wait | first step "
        "| train steps | loop | validation | checkpoints | teardown | other | total |" in section
    )
    # parts the synthetic records (as records from before those parts were measured) lack: "–"
    assert "| lm | 2 | 5.0 | – | 0.5 | 2.0 | – | – | 0.2 | – | 40.0 | – | 4.0 | 0.5 | – | 1.0 | 53.2 |" in section
    assert "| vit | 2 | 5.0 | – | 0.2 | 1.0 | – | – | 0.0 | – | 22.0 | – | 2.0 | 0.0 | – | 0.8 | 28.5 |" in section
    assert "1 resumed cell(s) count their last process only" in section
    assert "1 cell(s) have no start-up time" in section
    # the processes ran 42 - 41, 66.5 - 65.4 and 30 - 29 s after their results' breakdowns ended
    assert (
        "The last run took 160.0 s: 3 cells, whose processes took 138.5 s from start to exit (3.1 s of it after they "
        "wrote their results: shutting down), 100.0 s of it training steps (62% of the wall time; outside them 38%); "
        "the matrix's own parts: startup 3.0 s, planning 1.0 s, TensorBoard views 2.0 s, peak FLOP/s probe 4.0 s, "
        "this report 1.5 s, other 0.5 s."
    ) in section

    # results and a run recorded before the breakdown: the header as it was, no section
    old = tmp_path / "old"
    _cell(old, 0, "lm", 0, None)
    write_json(
        old / "matrix_run.json", {"command": "blockbench matrix m.yaml", "wall_time_s": 120.0, "cells_trained": 1}
    )
    summary = write_report(old)
    assert "Command: `blockbench matrix m.yaml` (last run: 0:02:00, 1 cells trained)  \n" in summary
    assert "Where the time went" not in summary


def test_with_parallel_cells_the_share_is_of_every_slots_wall_time(tmp_path):
    synthetic_matrix(tmp_path / "two", jobs=2)
    summary = write_report(tmp_path / "two")
    # 100 s of training steps in 2 slots x 160 s
    assert "3 cells trained; training steps 31% of the wall time of 2 parallel slots)" in summary
    assert (
        "3 cells, 2 at a time, whose processes took 138.5 s" in summary
        and "(31% of the wall time of the slots;" in summary
    )


def test_the_report_records_its_own_time_before_it_reads_the_run(tmp_path):
    """The runner's hook runs after the sections are rendered and before the header reads matrix_run.json."""
    synthetic_matrix(tmp_path / "m", jobs=1)
    run_file = tmp_path / "m" / "matrix_run.json"

    def record() -> None:
        run = json.loads(run_file.read_text())
        run["wall_time_s"] = 600.0
        run["wall_time_breakdown"]["report"] = 7.25
        write_json(run_file, run)

    summary = write_report(tmp_path / "m", before_header=record)
    assert "(last run: 0:10:00, 3 cells trained;" in summary and "this report 7.2 s" in summary


def test_rounding_never_makes_other_negative():
    """Parts that each round up (0.007 s -> 0.01 s) can sum past the rounded total: ``other`` stays at zero."""
    from blockbench.walltime import WallClock

    clock = WallClock()
    clock.seconds = {"a": 0.007, "b": 0.007}
    clock.origin = clock._last = time.perf_counter() - 0.0141  # total 0.0141 s -> 0.01, the parts 0.02
    figures = clock.breakdown(("a", "b"))
    assert figures["a"] == figures["b"] == 0.01 and figures["other"] == 0.0
