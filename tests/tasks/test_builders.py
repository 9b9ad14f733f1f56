"""A task's config builds its LightningModule and DataModule through the builder its task module
registered (``tasks.builders``): every task has one, a task without one stops with an error that says
where it should come from, and no task has two."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from blockbench.models import ModelConfig
from blockbench.tasks import TASK_CONFIGS, OptimizerConfig, TaskConfig
from blockbench.tasks.base import TaskDataModule, TaskModule
from blockbench.tasks.builders import IMPLEMENTATIONS, builds, registered, task_builder
from blockbench.tasks.lm import build_lm


def test_every_task_has_a_builder():
    for name in TASK_CONFIGS:
        assert callable(task_builder(name))
    assert set(registered()) == set(TASK_CONFIGS)


def test_the_config_builds_the_lightning_modules():
    task = TASK_CONFIGS["lm"](seq_len=16, n_train_tokens=2000, n_val_tokens=500, n_probes=8)
    model = ModelConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32).model_copy(update=task.model_overrides())
    module, datamodule = task.build(model, OptimizerConfig(), max_steps=2, batch_size=4, seed=3)
    assert isinstance(module, TaskModule) and isinstance(datamodule, TaskDataModule)
    assert datamodule.data_seed == task.data_seed_for(3)


class UnbuiltTaskConfig(TaskConfig):
    name: Literal["unbuilt"] = "unbuilt"

    def model_overrides(self) -> dict[str, Any]:
        return {}


def test_a_task_without_a_builder_says_where_it_comes_from():
    with pytest.raises(LookupError, match=rf"task 'unbuilt' has a config but no builder.*{IMPLEMENTATIONS}"):
        UnbuiltTaskConfig().build(ModelConfig(), OptimizerConfig(), max_steps=1, batch_size=1)


def test_a_task_has_one_builder():
    def another_lm_builder(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="task 'lm' has two builders"):
        builds(TASK_CONFIGS["lm"])(another_lm_builder)
    assert task_builder("lm") is build_lm
