"""Benchmark tasks: one LightningModule + LightningDataModule per task, each with its metrics.

``TASK_CONFIGS`` is the registry of tasks by ``task.name``; ``TASK_PRESETS`` names ready-made
real-data settings (``task: wikitext103``), see ``tasks.presets``. Each task config declares, in
code, its metrics (``Metric``: the first is the headline one; ``Metric.beats`` tells whether a cell
beat the trivial baseline), the headline metric's margin of practical equivalence (``margin``, a
``Margin``) and where it saturates (``saturation``, a ``Saturation`` or None), and what a training
seed varies (``seed_varies()``).
"""

from .base import OptimizerConfig, TaskConfig, TaskDataModule, TaskModule
from .image import ImageTaskConfig
from .lm import LMTaskConfig
from .lm_text import TextLMTaskConfig
from .metrics import Margin, Metric, Saturation
from .presets import TASK_PRESETS
from .translation import TranslationTaskConfig
from .translation_text import TextTranslationTaskConfig
from .vision import VisionTaskConfig

TASK_CONFIGS: dict[str, type[TaskConfig]] = {
    cfg.model_fields["name"].default: cfg
    for cfg in (
        # embedded: generated from a seed, no download
        LMTaskConfig,
        TranslationTaskConfig,
        VisionTaskConfig,
        # real data: HF hub datasets or local files
        TextLMTaskConfig,
        TextTranslationTaskConfig,
        ImageTaskConfig,
    )
}

__all__ = [
    "TASK_CONFIGS",
    "TASK_PRESETS",
    "Margin",
    "Metric",
    "OptimizerConfig",
    "Saturation",
    "TaskConfig",
    "TaskDataModule",
    "TaskModule",
]
