"""Benchmark tasks: one LightningModule + LightningDataModule per task, each with its metrics.

``TASK_CONFIGS`` is the registry of tasks by ``task.name``.
"""

from .base import Metric, OptimizerConfig, TaskConfig, TaskDataModule, TaskModule
from .lm import LMTaskConfig
from .translation import TranslationTaskConfig
from .vision import VisionTaskConfig

TASK_CONFIGS: dict[str, type[TaskConfig]] = {
    cfg.model_fields["name"].default: cfg for cfg in (LMTaskConfig, TranslationTaskConfig, VisionTaskConfig)
}

__all__ = ["TASK_CONFIGS", "Metric", "OptimizerConfig", "TaskConfig", "TaskDataModule", "TaskModule"]
