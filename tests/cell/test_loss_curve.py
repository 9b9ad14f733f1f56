"""The loss curve: the validation loss on a fixed sample every few steps, between full validations."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_MODEL, scalars, tensorboard_events

from blockbench.cell.train import train
from blockbench.config import ConfigError, build_run_config
from blockbench.report.plots import CURVE_METRIC, plotted_history
from blockbench.store.record import CellRecord
from blockbench.tasks import Metric
from blockbench.tensorboard.names import CURVE_TAG, run_tag
from blockbench.tensorboard.views import matrix_views

TASKS = {
    "lm": {"name": "lm", "seq_len": 16, "n_train_tokens": 4000, "n_val_tokens": 600, "n_probes": 16},
    "translation": {"name": "translation", "n_train": 256, "n_val": 24},
    "vit": {"name": "vit", "n_train": 256, "n_val": 40, "image_size": 20},
}


def config(task: str, **trainer) -> dict:
    model = {**TINY_MODEL, **({"patch_size": 4} if task == "vit" else {})}
    return {
        "model": model,
        "task": TASKS[task],
        "trainer": {"max_steps": 12, "batch_size": 8, "val_every_n_steps": 6, "num_threads": 1, **trainer},
    }


def run(tmp_path: Path, raw: dict, name: str = "run") -> dict:
    return train(
        build_run_config(raw), tmp_path / name, tb_dir=tmp_path / "tb", tb_name="cell", tb_version=name
    ).to_json()


@pytest.mark.parametrize("task", TASKS)
def test_a_point_on_the_whole_validation_set_is_the_validation_loss(tmp_path, task):
    """With a sample as large as the validation set, the points at the validation steps are the
    task's validation loss there (computed by other code: the validation step, its metrics)."""
    result = run(tmp_path, config(task, curve_every_n_steps=3, curve_items=10_000))
    points = dict(result["curve"]["points"])
    _, data = built(config(task))
    loaders = data.val_dataloader()
    assert result["curve"]["items"] == len((loaders[0] if isinstance(loaders, list) else loaders).dataset)
    assert sorted(points) == [0, 3, 6, 9, 12]
    validations = {v["step"]: v["metrics"]["loss"] for v in result["history"]}
    assert sorted(validations) == [6, 12]
    for step, loss in validations.items():
        assert points[step] == pytest.approx(loss, rel=1e-5)


def built(raw: dict):
    """The module and the prepared data a run of ``raw`` starts with."""
    run_config = build_run_config(raw)
    L.seed_everything(run_config.seed, workers=True, verbose=False)  # as the runner does before building
    module, data = run_config.task.build(
        run_config.resolved_model(),
        run_config.optimizer,
        max_steps=run_config.trainer.max_steps,
        batch_size=run_config.trainer.batch_size,
    )
    data.setup("fit")
    return module, data


def test_the_first_point_is_the_loss_of_the_initial_model_on_items_spread_over_the_set(tmp_path):
    """Brute force: the model the run starts from, on each of 5 validation images (every 8th of 40) alone."""
    raw = config("vit", curve_items=5)
    result = run(tmp_path, raw)
    module, data = built(raw)
    module.eval()
    with torch.no_grad():
        losses = [
            F.cross_entropy(module.model(data.val_set[i][0][None]), data.val_set[i][1][None]) for i in range(0, 40, 8)
        ]
    step, loss = result["curve"]["points"][0]
    assert (step, result["curve"]["items"]) == (0, 5)
    assert loss == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)


def test_the_sample_spreads_evenly_over_the_validation_set():
    """Not the first items: a validation set may be ordered (by length, by class)."""
    _, data = built(config("vit"))
    assert list(data.curve_loader(10).dataset.indices) == [0, 4, 8, 12, 16, 20, 24, 28, 32, 36]
    assert list(data.curve_loader(40).dataset.indices) == list(range(40))
    assert list(data.curve_loader(1000).dataset.indices) == list(range(40))


def test_a_true_half_precision_run_gets_its_inputs_converted(tmp_path):
    """bf16-true: the sample's images are converted to the weights' dtype, as Lightning's own loops do."""
    result = run(tmp_path, config("vit", max_steps=2, val_every_n_steps=2, precision="bf16-true", curve_items=8))
    assert [step for step, _ in result["curve"]["points"]] == [0, 1, 2]


def test_a_sharding_strategy_needs_the_curve_off():
    with pytest.raises(ConfigError, match=r"strategy=fsdp shards; set trainer.curve_every_n_steps: 0"):
        build_run_config({}, {"trainer.strategy": "fsdp"})
    assert (
        build_run_config({}, {"trainer.strategy": "fsdp", "trainer.curve_every_n_steps": 0}).trainer.curve_interval == 0
    )


def test_by_default_every_curve_has_at_least_ten_points_and_ends_at_the_last_step(tmp_path):
    result = run(tmp_path, config("lm", max_steps=25, val_every_n_steps=25))
    assert [step for step, _ in result["curve"]["points"]] == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25]
    assert [step for step, _ in scalars_with_steps(tmp_path / "tb/cell/run", run_tag(CURVE_TAG))] == [
        step for step, _ in result["curve"]["points"]
    ]
    assert len(result["history"]) == 1  # the full validations stay as configured


def scalars_with_steps(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in tensorboard_events(run_dir).Scalars(tag)]


def test_the_curve_leaves_training_as_it_is(tmp_path):
    """The points draw no random numbers from the training (dropout, data order): a run with them
    trains exactly as a run without them, and its time counts as validation."""

    def with_dropout(**trainer):
        return {**config("lm", **trainer), "model": {**TINY_MODEL, "dropout": 0.2}}

    plain = run(tmp_path, with_dropout(curve_every_n_steps=0), "plain")
    curved = run(tmp_path, with_dropout(curve_every_n_steps=1), "curved")
    assert plain["curve"] is None and len(curved["curve"]["points"]) == 13
    assert curved["metrics"] == plain["metrics"]
    assert curved["history"] == [{**v, "time_s": pytest.approx(v["time_s"], abs=100)} for v in plain["history"]]
    curved_loss = scalars(tmp_path / "tb/cell/curved", "2_train/loss")
    assert curved_loss and curved_loss == scalars(tmp_path / "tb/cell/plain", "2_train/loss")


def test_a_curve_interval_must_not_be_negative():
    with pytest.raises(ConfigError, match="curve_every_n_steps"):
        build_run_config({}, {"trainer.curve_every_n_steps": -1})
    assert build_run_config({}, {"trainer.max_steps": 5}).trainer.curve_interval == 1
    assert build_run_config({}, {"trainer.max_steps": 300}).trainer.curve_interval == 30


def test_the_curve_chart_comes_first_for_the_tasks_that_log_it():
    metrics = [Metric(name="loss", higher_is_better=False, description="")]
    views = matrix_views(
        [{"task": "lm"}, {"task": "vit"}], {"lm": (metrics, "tokens"), "vit": (metrics, "images")}, curve_tasks=["lm"]
    )
    assert [title for title, _ in views["layout"]["lm"]] == [CURVE_TAG, "val/loss", "train/loss"]
    assert views["layout"]["lm"][0][1] == "^0_main/lm/curve_loss$"  # in the group that opens Time Series
    assert [title for title, _ in views["layout"]["vit"]] == ["val/loss", "train/loss"]


def test_plots_get_the_points_as_a_metric_of_their_own():
    result = CellRecord.model_validate(
        {
            "status": "ok",
            "task": "lm",
            "history": [{"step": 6, "time_s": 1.0, "metrics": {"loss": 2.0}}],
            "curve": {"every_n_steps": 3, "items": 8, "points": [[0, 3.0], [3, 2.5], [6, 2.1]]},
        }
    )
    history = plotted_history(result)
    assert history[0] == result.history[0]
    assert [(v.step, v.metrics) for v in history[1:]] == [
        (0, {CURVE_METRIC: 3.0}),
        (3, {CURVE_METRIC: 2.5}),
        (6, {CURVE_METRIC: 2.1}),
    ]
    assert plotted_history(CellRecord(status="ok", task="lm", curve=None)) == []
