"""The tasks' configs: every ``task:`` section class, the ``optimizer:`` section, and ``TASK_CONFIGS``.

A package of its own, one module per task family (``lm``, ``translation``, ``vision``) beside what they
share (``base``, ``lens``), and not a config module beside each task module: validating a run config
imports exactly this package and the data configs it uses (``tasks.data.text``, ``tasks.data.tokenizer``,
``tasks.data.image_sources``), none of which imports Lightning, torchmetrics or torchvision, so that a
mistake in a config is told in the time torch takes to import rather than Lightning's seconds more; the
rule that nothing here imports them is one place to keep. The LightningModules and DataModules stay in
the task modules (``tasks.lm``, ``tasks.translation``, ...), each of which imports its configs from here
and registers the builder that ``TaskConfig.build`` looks up (``tasks.builders``).
"""

from .base import EmbeddedTaskConfig, OptimizerConfig, RealDataTaskConfig, TaskConfig, derived_data_seed
from .lens import LogitLensConfig
from .lm import LMTaskConfig, TextLMTaskConfig
from .translation import DecodingConfig, TextTranslationTaskConfig, TranslationTaskConfig
from .vision import AugmentConfig, ImageTaskConfig, VisionTaskConfig

#: the tasks by ``task.name``, in the order of the discriminated union of ``RunConfig.task``
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
    "AugmentConfig",
    "DecodingConfig",
    "EmbeddedTaskConfig",
    "ImageTaskConfig",
    "LMTaskConfig",
    "LogitLensConfig",
    "OptimizerConfig",
    "RealDataTaskConfig",
    "TaskConfig",
    "TextLMTaskConfig",
    "TextTranslationTaskConfig",
    "TranslationTaskConfig",
    "VisionTaskConfig",
    "derived_data_seed",
]
