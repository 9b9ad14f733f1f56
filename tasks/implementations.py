"""Every task module with Lightning code, imported together: importing this registers each task's
builder of its LightningModule and DataModule (``tasks.builders``), which ``TaskConfig.build`` looks
up. ``TaskConfig.build`` imports it on its first call, and the matrix runner's fork server preloads it
so that its cells start with the tasks' code loaded. A new task module is added here.
"""

from . import image, lm, lm_text, translation, translation_text, vision

__all__ = ["image", "lm", "lm_text", "translation", "translation_text", "vision"]
