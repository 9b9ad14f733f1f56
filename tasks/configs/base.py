"""What every task's config shares: the ``task:`` section's base class, the real-data and embedded
kinds, and the ``optimizer:`` section.

A task is a ``TaskConfig`` subclass (the YAML ``task:`` section, selected by ``task.name``): its fields,
the ``model:`` fields it decides, and its declarations (metrics, margin, saturation, what a seed
varies). ``build`` makes the run's LightningModule and LightningDataModule (``tasks.base``) through
the builder its task module registered (``tasks.builders``), so that this module imports neither.
"""

from __future__ import annotations

import re
import zlib
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from blockbench.models import ModelConfig

from ..builders import task_builder
from ..metrics import Margin, Metric, Saturation


class OptimizerConfig(BaseModel):
    """AdamW with linear warmup and cosine decay to ``min_lr_ratio * lr`` (nanoGPT/litgpt recipe)."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-3, gt=0, description="peak learning rate, reached at the end of the warmup")
    weight_decay: float = Field(
        0.01, ge=0, description="AdamW weight decay of the matrices (not of norms, biases, position tables)"
    )
    betas: tuple[float, float] = Field((0.9, 0.98), description="AdamW (beta1, beta2)")
    warmup_steps: int = Field(40, ge=0, description="optimizer steps of linear warmup from 0 to lr")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="learning rate at the end of the cosine decay, over lr")


class TaskConfig(BaseModel, ABC):
    """Base of every task's config section. Subclasses set ``name`` to a ``Literal``."""

    model_config = ConfigDict(extra="forbid")

    family: ClassVar[str]
    #: unit of the throughput figure: what one training item is ("tokens", "images")
    throughput_unit: ClassVar[str]
    #: the metrics the task reports; the first is the headline metric of the summary
    metrics: ClassVar[tuple[Metric, ...]]
    #: the margin of practical equivalence of the headline metric (a matrix file's ``margins:`` may override it)
    margin: ClassVar[Margin]
    #: how near its best value (or the entropy floor) the headline metric is saturated; None: never
    saturation: ClassVar[Saturation | None] = None
    description: ClassVar[str]
    #: what the trivial baseline next to the metrics is
    baseline_description: ClassVar[str]

    #: ``model:`` fields known only once the data is prepared (e.g. the vocabulary after compaction);
    #: ``build`` fills them in (see ``with_data_fields``) and a config must not set them
    data_decided_fields: ClassVar[tuple[str, ...]] = ()

    #: settings that make the task harder without changing what it asks, as a scale ladder's headroom check
    #: suggests them where the baseline saturates at the top rung ("": none named)
    harder: ClassVar[str] = ""

    #: what a training seed varies besides the data (``seed_varies`` adds what it says of the data)
    seed_also_varies: ClassVar[str] = "the order of the training data, the initialisation and dropout"

    label: str | None = Field(
        None, description="row name in summaries and results folders; default: the preset or task name"
    )
    eval_split: Literal["validation", "tuning"] = Field(
        "validation",
        description="the split validation scores: 'validation' (the reported one) or 'tuning' (never trained on, "
        "never reported: for choosing settings; a generated task draws it apart, a real-data task holds out "
        "task.tuning_fraction of its training data for it)",
    )

    @field_validator("label")
    @classmethod
    def _names_a_folder(cls, label: str | None) -> str | None:
        """The label is a folder name (``cells/<label>/...``, the TensorBoard run): one safe path part."""
        if label is not None and (not re.fullmatch(r"[A-Za-z0-9_.=+-]+", label) or set(label) == {"."}):
            raise ValueError(
                f"{label!r} cannot name a results folder; use letters, digits and _ . - = + only "
                "(no '/' or spaces, not empty, not '.' or '..')"
            )
        return label

    @property
    def display_name(self) -> str:
        return self.label or self.name

    def seed_varies(self) -> str:
        """What the training seed varies in this task's cells, for the summary: a real-data task's data
        are the dataset itself, the same for every seed."""
        return f"{self.seed_also_varies}; the data are the dataset's own, the same for every seed"

    @abstractmethod
    def model_overrides(self) -> dict[str, Any]:
        """The ``model:`` fields this task decides (family and data-dependent sizes)."""

    def check_model(self, model: ModelConfig) -> None:
        """Raise ValueError (naming the keys) if this task cannot run with ``model``."""

    def build(
        self, model: ModelConfig, optimizer: OptimizerConfig, *, max_steps: int, batch_size: int, seed: int = 0
    ) -> tuple[Any, Any]:
        """The LightningModule and LightningDataModule of one run (a ``tasks.base.TaskModule`` and
        ``TaskDataModule``); ``seed`` is the run's training seed (a generated task draws its data from it
        unless ``task.data_seed`` fixes the draw). The task's own module makes them: its builder, looked
        up by ``task.name`` in ``tasks.builders``, which imports the Lightning code on the first build."""
        builder = task_builder(self.name)
        return builder(self, model, optimizer, max_steps=max_steps, batch_size=batch_size, seed=seed)


def derived_data_seed(seed: int, task_name: str) -> int:
    """The data seed of a generated task whose ``data_seed`` is null: a 64-bit number drawn by
    ``numpy.random.SeedSequence([seed mod 2**64, crc32(task_name)])`` from the run's training seed,
    so that each training seed sees its own draw of the data and two tasks never share a draw."""
    entropy = [seed % 2**64, zlib.crc32(task_name.encode())]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0])


class RealDataTaskConfig(TaskConfig):
    """A task on real data (a hub dataset or local files): the data are the dataset, the same for every
    seed. A share of its training data, ``tuning_fraction``, is always held out as the tuning split
    (``eval_split: tuning`` validates on it), so that a tuning cell trains on exactly what a reported
    cell trains on and no choice of settings looks at the reported validation split."""

    tuning_fraction: float = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="share of the training data held out as the tuning split, whatever eval_split says (never "
        "trained on)",
    )


class EmbeddedTaskConfig(TaskConfig):
    """A task on data that blockbench generates, no download: deterministic from the data seed,
    which by default the run's training seed decides (``derived_data_seed``), so that the spread over
    seeds includes the draw of the data; ``data_seed: 1234`` fixes the draw for every seed. Its
    tuning split (``eval_split: tuning``) is drawn from a stream of its own, as large as the
    validation set; the training data do not depend on which split is scored."""

    data_seed: int | None = Field(
        None,
        description="seed of the generated data (training, validation and tuning draws); null: derived from the "
        "run's seed, so each training seed draws its own data; an int fixes the draw across seeds",
    )

    def data_seed_for(self, seed: int) -> int:
        """The seed the data of a run with training seed ``seed`` are generated from."""
        return self.data_seed if self.data_seed is not None else derived_data_seed(seed, self.name)

    def seed_varies(self) -> str:
        """What the training seed varies: the data draw too, unless ``data_seed`` fixes it."""
        if self.data_seed is None:
            return f"the data draw, {self.seed_also_varies}"
        return f"{self.seed_also_varies}; the data draw is fixed (data_seed={self.data_seed})"
