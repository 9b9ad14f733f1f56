"""The names and the switch of the logit lens (``task.logit_lens``), apart from its torchmetrics
accumulator (``tasks.lens``): block ``i``'s lens loss is the validation metric ``lens/layer{i}``, which
the TensorBoard views and the report read without loading the tasks' Lightning code.
"""

from __future__ import annotations

import re

from pydantic import Field

from .base import TaskConfig

#: block ``i``'s lens loss is the validation metric ``lens/layer{i}`` (logged as ``val/lens/layer0``, ...)
LENS_PREFIX = "lens/layer"
#: matches those names and captures the block
LENS_METRIC_PATTERN = re.compile(rf"{re.escape(LENS_PREFIX)}(\d+)")


class LogitLensConfig(TaskConfig):
    """The ``task.logit_lens`` switch of the tasks whose model decodes a vocabulary."""

    logit_lens: bool = Field(
        True,
        description="at each validation, the loss of every decoder block's output decoded through the final norm "
        "and the output head (val/lens/layer{i}); false: off",
    )


def lens_metric(layer: int) -> str:
    """``lens/layer3``: the validation metric of block ``layer``'s lens loss."""
    return f"{LENS_PREFIX}{layer}"
