"""Benchmark tasks: one LightningModule + LightningDataModule per task, each with its metrics.

``TASK_CONFIGS`` is the registry of tasks by ``task.name``; ``TASK_PRESETS`` names ready-made
real-data settings (``task: wikitext103``), see ``tasks.presets``. Each task config declares, in
code, its metrics (``Metric``: the first is the headline one; ``Metric.beats`` tells whether a cell
beat the trivial baseline), the headline metric's margin of practical equivalence (``margin``, a
``Margin``) and where it saturates (``saturation``, a ``Saturation`` or None), and what a training
seed varies (``seed_varies()``).

Importing this package loads the configs (``tasks.configs``), the metrics and the presets: what
validating a run config needs, without Lightning, torchmetrics or torchvision. The Lightning code is
imported from the task modules themselves (``tasks.base.TaskModule``, ``tasks.lm.LMTask``, ...), or
all of it at once from ``tasks.implementations``, which ``TaskConfig.build`` loads on its first call.
"""

from .configs import (
    TASK_CONFIGS,
    ImageTaskConfig,
    LMTaskConfig,
    OptimizerConfig,
    TaskConfig,
    TextLMTaskConfig,
    TextTranslationTaskConfig,
    TranslationTaskConfig,
    VisionTaskConfig,
)
from .metrics import Margin, Metric, Saturation
from .presets import TASK_PRESETS

__all__ = [
    "TASK_CONFIGS",
    "TASK_PRESETS",
    "ImageTaskConfig",
    "LMTaskConfig",
    "Margin",
    "Metric",
    "OptimizerConfig",
    "Saturation",
    "TaskConfig",
    "TextLMTaskConfig",
    "TextTranslationTaskConfig",
    "TranslationTaskConfig",
    "VisionTaskConfig",
]
