"""A ladder's run (``blockbench.matrix.headroom``, ``blockbench.matrix.topgrid``): the baseline alone at the
top rung first, checked against the task's saturation rule, which stops the run before any other cell
where the task has no room; then every rung tuned alike, the top rung on a grid centred on the rate the
rungs below chose. The cells are stand-ins that write a record of a chosen loss, so the run's decisions
can be checked against hand-computed ones."""

from __future__ import annotations

import json
import math

import pytest
from test_ladder import LADDER, ladder_matrix

from blockbench.matrix.expand import expand_matrix
from blockbench.matrix.headroom import NEAR, ROOM, SATURATED, UNKNOWN, check_task, headroom_cells
from blockbench.matrix.jobs import write_cell_file
from blockbench.matrix.plan import IF_NEEDED, plan_matrix
from blockbench.matrix.run import run_matrix
from blockbench.provenance import code_fingerprint
from blockbench.report.results import MatrixSettings, load_groups, rung_tuning_costs
from blockbench.store.layout import RESULT_FILE
from blockbench.store.record import CellRecord, read_headroom, read_matrix_run, read_tuning, write_record
from blockbench.store.reuse import ReuseRule

#: the LM's entropy floor in the stand-in records, nats per token
FLOOR = 2.0
GRID = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]


def record(cell, loss: float | None, seconds: float = 1.0) -> CellRecord:
    """A stand-in record of ``cell``: finished at ``loss`` (perplexity its exp), or diverged (None)."""
    common = {"task": "lm", "seed": cell.seed, "config_hash": cell.run.config_hash(), "wall_time_s": seconds}
    if loss is None:
        return CellRecord(status="diverged", diverged_at_step=2, code_fingerprint=code_fingerprint(), **common)
    metrics = {"perplexity": math.exp(loss), "loss": loss}
    baselines = {"loss_floor": FLOOR, "loss": 3.5, "perplexity": math.exp(3.5)}
    return CellRecord(
        status="ok",
        metrics=metrics,
        primary_metric="perplexity",
        baselines=baselines,
        steps=cell.run.trainer.max_steps,
        code_fingerprint=code_fingerprint(),
        **common,
    )


def stand_in_cells(monkeypatch, loss_of) -> list[str]:
    """Cells that write ``record(cell, loss_of(cell))`` instead of training (no peak probe, no server);
    returns the keys trained, in order."""
    trained: list[str] = []

    def run_cell(cell, matrix_dir, matrix_file, **_):
        trained.append(cell.key)
        result = record(cell, loss_of(cell), seconds=cell.run.trainer.max_steps)  # seconds: its steps
        write_cell_file(cell, matrix_dir, matrix_file)
        write_record(cell.directory(matrix_dir) / RESULT_FILE, result)
        return result

    monkeypatch.setattr("blockbench.matrix.rounds.run_cell", run_cell)
    monkeypatch.setattr("blockbench.matrix.run.resolve_peaks", lambda *args, **_: None)
    monkeypatch.setattr("blockbench.matrix.run.start_server", lambda: None)
    return trained


@pytest.mark.parametrize(
    ("excess", "status"),
    [(0.02, SATURATED), (0.03, SATURATED), (0.05, NEAR), (0.09, NEAR), (0.2, ROOM), (None, UNKNOWN)],
)
def test_a_task_s_headroom_is_its_distance_to_the_floor_in_saturation_distances(tmp_path, excess, status):
    """The LM saturates within 0.03 nats of its floor (the book's rule); within 3 x 0.03 = 0.09 it is near;
    a diverged cell leaves the headroom unknown."""
    cell = headroom_cells(expand_matrix(ladder_matrix(tmp_path, tune={"optimizer.lr": GRID})))[0]
    found = check_task(cell, record(cell, None if excess is None else FLOOR + excess))
    assert found.status == status
    if excess is not None:
        assert (found.distance, found.saturation, found.near) == pytest.approx((excess, 0.03, 0.09))


def test_the_headroom_cell_is_the_baseline_at_the_top_rung_at_the_grid_s_middle(tmp_path):
    expansion = expand_matrix(
        ladder_matrix(tmp_path, tune={"optimizer.lr": GRID}, baseline_variant="norm_placement=post")
    )
    assert [cell.key for cell in headroom_cells(expansion)] == ["tune/lm/norm_placement=post,rung=4x/lr=0.001/seed1000"]
    untuned = expand_matrix(ladder_matrix(tmp_path / "untuned", tune={}))
    assert [cell.key for cell in headroom_cells(untuned)] == ["lm/norm_placement=pre,rung=4x/seed0"]
    off = expand_matrix(ladder_matrix(tmp_path / "off", {**LADDER, "headroom": False}, tune={}))
    assert headroom_cells(off) == []


def test_a_saturated_task_stops_the_ladder_before_any_other_cell(tmp_path, monkeypatch, capsys):
    trained = stand_in_cells(monkeypatch, lambda cell: FLOOR + 0.02)
    path = ladder_matrix(tmp_path, tune={"optimizer.lr": GRID})
    assert run_matrix(path, tmp_path / "results", jobs=1) == 1
    assert trained == ["tune/lm/norm_placement=pre,rung=4x/lr=0.001/seed1000"]
    check = read_headroom(tmp_path / "results" / "lad")
    assert check is not None and check.stop and check.rung == "4x"
    assert [(task.task, task.status) for task in check.tasks] == [("lm", SATURATED)]
    said = capsys.readouterr().err
    assert "lm: norm_placement=pre,rung=4x" in said and "task.max_depth" in said and "lad.yaml" in said


def test_every_rung_tunes_alike_and_the_top_rung_centres_on_the_rate_the_rungs_below_chose(tmp_path, monkeypatch):
    """Each lower rung's loss is least at its own rate (3e-3 at 1/4x, 1e-3 at 1x: both inside the grid, so no
    value is added past an end). The line through (1/4, 3e-3) and (1, 1e-3) on log-log reads 1e-3 / 3 at 4x;
    the lattice value nearest is 3e-4, so the top rung tunes 1e-4, 3e-4 and 1e-3 (not the stand-in grid
    3e-4, 1e-3, 3e-3) and chooses 3e-4, where its own loss is least. The headroom cell, pre-norm's 4x cell
    at 1e-3 and seed 1000, has room (0.5 nats) and trains once: tuning reuses it."""
    best = {"0.25x": 3e-3, "1x": 1e-3, "4x": 1e-3 / 3}

    def loss_of(cell) -> float:
        return FLOOR + 0.5 + (math.log10(cell.run.optimizer.lr) - math.log10(best[cell.axes["rung"]])) ** 2

    trained = stand_in_cells(monkeypatch, loss_of)
    path = ladder_matrix(tmp_path, {**LADDER, "top_grid": {"points": 3}}, tune={"optimizer.lr": GRID})
    results = tmp_path / "results"
    # before anything ran, the top rung's cells wait for the rungs below: listed as if needed
    plan = plan_matrix(expand_matrix(path), results / "lad", ReuseRule(code_fingerprint()))
    assert not [p for p in plan.tuning_plans if p.cell.axes["rung"] == "4x"]
    assert {p.status for p in plan.plans if p.cell.phase == "tune" and p.cell.axes["rung"] == "4x"} == {IF_NEEDED}

    assert run_matrix(path, results, jobs=1) == 0
    headroom = "tune/lm/norm_placement=pre,rung=4x/lr=0.001/seed1000"
    assert trained[0] == headroom and trained.count(headroom) == 1
    assert read_headroom(results / "lad").tasks[0].status == ROOM
    tune = read_tuning(results / "lad")["tasks"]["lm"]["variants"]
    for design in ("pre", "post"):
        assert tune[f"norm_placement={design},rung=0.25x"]["chosen"] == {"optimizer.lr": 3e-3}
        assert tune[f"norm_placement={design},rung=1x"]["chosen"] == {"optimizer.lr": 1e-3}
        top = tune[f"norm_placement={design},rung=4x"]
        assert top["grid"] == {"optimizer.lr": [1e-4, 3e-4, 1e-3]}
        assert [c["values"]["optimizer.lr"] for c in top["candidates"]] == [1e-4, 3e-4, 1e-3]
        assert top["chosen"] == {"optimizer.lr": 3e-4}
    assert "tune/lm/norm_placement=pre,rung=4x/lr=0.003/seed1000" not in trained  # the stand-in grid's end
    cells = results / "lad" / "cells" / "lm"
    top_cell = json.loads((cells / "norm_placement=post,rung=4x" / "seed0" / "cell.json").read_text())
    assert top_cell["tuned"] == {"optimizer.lr": 3e-4} and top_cell["axes"]["rung"] == "4x"
    run = read_matrix_run(results / "lad")
    assert run is not None and run.phases is not None and run.phases["headroom"].trained == 1
    # the report reads the rung as a level: each design compared with the baseline's at the same rung
    settings = MatrixSettings.load(results / "lad")
    assert (settings.levels, settings.rungs, settings.cells) == (("rung",), ("0.25x", "1x", "4x"), 6)
    groups = load_groups(results / "lad")
    assert [(g.design, g.level) for g in groups[:2]] == [
        ("norm_placement=pre", (("rung", "0.25x"),)),
        ("norm_placement=pre", (("rung", "1x"),)),
    ]
    # the tuning cost per rung from the records: 5 + 3 successive-halving cells of each side at the lower rungs,
    # 3 + 2 at the top, each "taking" its steps in seconds (2, 4 and 8)
    costs = rung_tuning_costs(results / "lad")
    assert {rung: (cost.cells, cost.seconds) for (_, rung), cost in costs.items()} == {
        "0.25x": (16, 32.0),
        "1x": (16, 64.0),
        "4x": (10, 80.0),
    }
    assert (
        json.loads((cells / "norm_placement=pre,rung=4x" / "seed0" / "cell.json").read_text())["axes"]["rung"] == "4x"
    )


@pytest.mark.parametrize(
    ("overrides", "repeats_the_hint"),
    [
        ({"task": "translation"}, True),
        ({"task": "translation", "task.max_depth": 2, "task.max_len": 40}, False),
        ({"task": "translation", "task.max_depth": 3, "task.max_len": 48}, False),
        ({"task": "translation", "task.max_depth": 3, "task.max_len": 32}, True),  # one setting short of it
        ({"task": "vit", "task.max_shapes": 9}, True),
        ({"task": "vit", "task.max_shapes": 9, "task.pixel_noise": 24}, False),
    ],
)
def test_the_stop_message_suggests_going_past_harder_settings_the_entry_already_has(overrides, repeats_the_hint):
    """A task whose entry already sets what its config's ``harder`` names, and is still near its ceiling,
    is told to go past those values, not to set them again (the ladder's translator at clauses two deep
    was told "task.max_depth: 2 with task.max_len: 40", its own settings)."""
    from helpers import REPO

    from blockbench.config import build_run_config, load_yaml
    from blockbench.matrix.headroom import harder_suggestion

    task = build_run_config(load_yaml(REPO / "configs" / "base.yaml"), overrides).task
    said = harder_suggestion(task)
    if repeats_the_hint:
        assert said == type(task).harder
    else:
        settings = ", ".join(f"{key}: {value}" for key, value in overrides.items() if key != "task")
        assert said.startswith(f"past what the entry already sets ({settings}, ") and type(task).harder in said


@pytest.mark.parametrize("name", ["lm", "translation", "vit"])
def test_each_generated_tasks_harder_settings_exist_and_build(name):
    """The settings the headroom message suggests are real: every ``task.key: value`` in a task's ``harder``
    is a field of its config, and all of them together (or each alone, for "or") make a valid run config."""
    import yaml
    from helpers import REPO

    from blockbench.config import build_run_config, load_yaml
    from blockbench.matrix.headroom import HINTED_SETTING
    from blockbench.tasks import TASK_CONFIGS

    cls = TASK_CONFIGS[name]
    pairs = HINTED_SETTING.findall(cls.harder)
    assert pairs, f"{name} names no harder setting"
    for key, _ in pairs:
        assert key in cls.model_fields
    together = {f"task.{key}": yaml.safe_load(value) for key, value in pairs}
    alone = [{key: value} for key, value in together.items()]
    for overrides in [together, *alone] if " or " in cls.harder else [together]:
        run = build_run_config(load_yaml(REPO / "configs" / "base.yaml"), {"task": name, **overrides})
        assert all(getattr(run.task, key.removeprefix("task.")) == value for key, value in overrides.items())
