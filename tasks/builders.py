"""Each task's builder of its LightningModule and LightningDataModule, registered under the task's name.

A task's config (``tasks.configs``) is all that validating a run config needs, and validating must not
wait seconds for Lightning, torchmetrics and torchvision to import; building the run's modules needs
them. So each task module with Lightning code (``tasks.lm``, ``tasks.vision``, ...) registers a
builder here with ``@builds(ItsTaskConfig)``, and ``TaskConfig.build`` looks it up by ``task.name``
with :func:`task_builder`. The first lookup imports :data:`IMPLEMENTATIONS`, the module that imports
every task module, by its name: the task modules import their configs, so a configs module importing
them would close a circle, and loading them only where a run is built keeps validation free of them.
A task whose builder is missing (its module not imported by :data:`IMPLEMENTATIONS`, or not
registering one) stops at its first build with an error that says so.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

#: the module that imports every task module with Lightning code, registering their builders
IMPLEMENTATIONS = "blockbench.tasks.implementations"

#: ``builder(task_config, model, optimizer, *, max_steps, batch_size, seed)`` -> (module, datamodule)
Builder = Callable[..., tuple[Any, Any]]

_BUILDERS: dict[str, Builder] = {}


def builds(config: type[BaseModel]) -> Callable[[Builder], Builder]:
    """Register the decorated function as the builder of the task whose config class is ``config``
    (by its ``name``); a second builder of the same task is a mistake and raises."""
    name = config.model_fields["name"].default

    def register(builder: Builder) -> Builder:
        known = _BUILDERS.get(name)
        if known is not None and (known.__module__, known.__qualname__) != (builder.__module__, builder.__qualname__):
            raise ValueError(
                f"task '{name}' has two builders: {known.__module__}.{known.__qualname__} and "
                f"{builder.__module__}.{builder.__qualname__}"
            )
        _BUILDERS[name] = builder
        return builder

    return register


def task_builder(name: str) -> Builder:
    """The builder registered for task ``name``, importing the task modules (:data:`IMPLEMENTATIONS`)
    the first time; a task without one raises LookupError naming where it should come from."""
    if name not in _BUILDERS:
        importlib.import_module(IMPLEMENTATIONS)
    if name not in _BUILDERS:
        raise LookupError(
            f"task '{name}' has a config but no builder of its LightningModule and DataModule: its task module "
            f"registers one with @builds(<its config class>) (blockbench.tasks.builders), and {IMPLEMENTATIONS} "
            "imports that module"
        )
    return _BUILDERS[name]


def registered() -> tuple[str, ...]:
    """The tasks with a builder so far (all of them once :data:`IMPLEMENTATIONS` is imported)."""
    return tuple(_BUILDERS)
