"""What every task shares: its config base class, the optimizer schedule and the LightningModule base.

A task is a ``TaskConfig`` subclass (the YAML ``task:`` section, selected by ``task.name``) that
builds a ``TaskModule`` (LightningModule) and a LightningDataModule. The module owns one model
from the block library, built from the run's ``model:`` section completed with the fields the
task derives from its data (vocabulary size, number of classes, ...).
"""

from __future__ import annotations

import math
import random
import re
import warnings
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch.optim.optimizer import _default_to_fused_or_foreach
from torch.utils.data import DataLoader, Dataset, Subset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from blockbench.models import (
    ModelConfig,
    add_auxiliary_losses,
    attended_fraction,
    build_model,
    count_parameters,
    expert_load,
    moe_layers,
)

from .metrics import Margin, Metric, Saturation

# torchdata calls a deprecated torch function on every new loader; nothing for users to act on
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)


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


def parameter_devices(params: list[torch.nn.Parameter]) -> set[str]:
    """The device types (``cpu``, ``cuda``, ...) the parameters are on."""
    return {p.device.type for p in params}


def adamw_implementation(params: list[torch.nn.Parameter], fused: bool) -> str:
    """The AdamW implementation that steps ``params``: ``fused`` (one kernel for all parameters), else
    the one PyTorch picks by default: ``foreach`` (a kernel per operation over all parameters, on CUDA)
    or ``for-loop`` (parameter by parameter, on a CPU)."""
    if fused:
        return "fused"
    return "foreach" if _default_to_fused_or_foreach(params, differentiable=False)[1] else "for-loop"


def warmup_cosine(step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Learning-rate multiplier at ``step``: linear warmup from 0, then cosine to ``min_lr_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


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

    @abstractmethod
    def build(
        self, model: ModelConfig, optimizer: OptimizerConfig, *, max_steps: int, batch_size: int, seed: int = 0
    ) -> tuple[TaskModule, TaskDataModule]:
        """The LightningModule and LightningDataModule of one run; ``seed`` is the run's training seed
        (a generated task draws its data from it unless ``task.data_seed`` fixes the draw)."""


def derived_data_seed(seed: int, task_name: str) -> int:
    """The data seed of a generated task whose ``data_seed`` is null: a 64-bit number drawn by
    ``numpy.random.SeedSequence([seed mod 2**64, crc32(task_name)])`` from the run's training seed,
    so that each training seed sees its own draw of the data and two tasks never share a draw."""
    entropy = [seed % 2**64, zlib.crc32(task_name.encode())]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0])


#: seed of the permutation that picks a real-data task's tuning items: fixed, so that the held-out
#: part is the same in every run, like the dataset's own splits (it is part of the data, not of a seed)
TUNING_HOLDOUT_SEED = 31


def held_out_for_tuning(n_items: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(training items, tuning items) of a real-data task's ``n_items`` training items, each sorted:
    ``round(fraction * n_items)`` of them (at least one, and one left to train on) drawn by a fixed
    permutation (``TUNING_HOLDOUT_SEED``), so that tuning items are spread over the data, whatever
    order the dataset lists them in."""
    if n_items < 2:
        raise ValueError(f"{n_items} training item(s): too few to hold out a tuning split; add training data")
    n_tuning = min(max(1, round(fraction * n_items)), n_items - 1)
    order = np.random.default_rng(TUNING_HOLDOUT_SEED).permutation(n_items)
    return np.sort(order[n_tuning:]), np.sort(order[:n_tuning])


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


def with_data_fields(model: ModelConfig, **fields: Any) -> ModelConfig:
    """``model`` completed with fields decided by the prepared data (validated again)."""
    return ModelConfig.model_validate({**model.model_dump(exclude_unset=True), **fields})


def capture_rng() -> dict[str, Any]:
    """This process's random generators (python, numpy, torch, CUDA), as tensors and plain values so
    that a checkpoint holding them loads with ``torch.load(weights_only=True)``."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    numpy_state = [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gaussian]
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set this process's random generators to a state from :func:`capture_rng`."""
    random.setstate(state["python"])
    name, keys, position, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class WorkerRngState:
    """Mixin for a map-style Dataset that draws random numbers in ``__getitem__`` or its collate
    (augmentation): the random generators of each DataLoader worker process travel in the loader's
    checkpoint, so a run resumed with ``num_workers > 0`` augments as an uninterrupted one does.

    torchdata's StatefulDataLoader saves every worker's dataset state with each batch it yields and
    restores it in the new workers; the worker seeds alone would restart each worker's stream. In
    the main process (``num_workers = 0``) the dataset has no state: the runner restores the main
    process's generators itself, before the first batch is fetched.
    """

    def state_dict(self) -> dict[str, Any]:
        return {"rng": capture_rng()} if torch.utils.data.get_worker_info() is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state and torch.utils.data.get_worker_info() is not None:
            restore_rng(state["rng"])


class EpochSampler(StatefulDistributedSampler):
    """torchdata's resumable distributed sampler, with the epoch in its state: a checkpoint taken in
    epoch 3 resumes with epoch 3's permutation, at the sample where it stopped."""

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.epoch = state["epoch"]


class TaskDataModule(L.LightningDataModule, ABC):
    """LightningDataModule base: generates or loads the data in ``setup`` and knows its baselines."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size
        #: DataLoader worker processes of the training data (0: the main process) and whether batches
        #: come in pinned memory: the runner sets them for a GPU (see ``load_for``)
        self.num_workers, self.pin_memory = 0, False

    def load_for(self, *, num_workers: int, pin_memory: bool) -> None:
        """Load the training data in ``num_workers`` worker processes (kept between epochs) and every
        batch in pinned memory if ``pin_memory`` (host-to-GPU copies that overlap the step)."""
        self.num_workers, self.pin_memory = num_workers, pin_memory

    def _loading(self, kwargs: dict[str, Any], *, workers: bool) -> dict[str, Any]:
        """``kwargs`` of a DataLoader with the workers (if ``workers``) and pinned memory set by
        ``load_for``; nothing added at their defaults (a CPU run's loaders stay as they were)."""
        if workers and self.num_workers:
            kwargs = {**kwargs, "num_workers": self.num_workers, "persistent_workers": True}
        return {**kwargs, "pin_memory": True} if self.pin_memory else kwargs

    @property
    def rank_and_world(self) -> tuple[int, int]:
        """This process's rank and the number of processes (1 without a distributed Trainer)."""
        trainer = getattr(self, "trainer", None)
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def training_sampler(self, dataset: Dataset) -> EpochSampler:
        """This process's share of a shuffled epoch: a permutation drawn from the run's seed and the
        epoch (Lightning calls ``set_epoch``), dealt out to the processes in turn. With one process
        it is the whole permutation, so one process with batch B and N processes with batch B/N see
        the same global batches."""
        rank, world = self.rank_and_world
        return EpochSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=torch.initial_seed(), drop_last=True
        )

    def training_loader(self, dataset: Dataset, **kwargs: Any) -> StatefulDataLoader:
        """The training DataLoader: this process's shuffled, seeded batches (unless a ``batch_sampler``
        is given) from a torchdata ``StatefulDataLoader``, whose position Lightning saves in
        checkpoints, so a resumed run continues mid-epoch with the batches an uninterrupted run sees."""
        if "batch_sampler" not in kwargs:
            kwargs = {
                "batch_size": self.batch_size,
                "sampler": self.training_sampler(dataset),
                "drop_last": True,
                **kwargs,
            }
        return StatefulDataLoader(dataset, **self._loading(kwargs, workers=True))

    def validation_loader(self, dataset: Dataset, **kwargs: Any) -> DataLoader:
        """This process's share of the validation set: every world-th item, no item twice (no padding,
        unlike DistributedSampler), so metrics reduced over the processes cover the set exactly once."""
        rank, world = self.rank_and_world
        kwargs = self._loading(kwargs, workers=False)  # a few batches now and then: no processes kept for them
        return DataLoader(dataset, batch_size=self.batch_size, sampler=range(rank, len(dataset), world), **kwargs)

    def curve_loader(self, n_items: int) -> DataLoader | None:
        """``n_items`` items spread evenly over the validation set (of the first validation loader;
        all of them if it has no more), whole in every process and batched as in validation: the
        fixed sample of the loss-curve points. Evenly spaced, not the first ones: a validation set
        may be ordered (translation_text sorts its pairs by length, an image folder by class).
        None without validation data."""
        loaders = self.val_dataloader()
        loader = (loaders[0] if loaders else None) if isinstance(loaders, (list, tuple)) else loaders
        if loader is None or len(loader.dataset) == 0:
            return None
        size = len(loader.dataset)
        sample = Subset(
            loader.dataset, [i * size // n_items for i in range(n_items)] if n_items < size else range(size)
        )
        # its own generator: starting the loader then draws nothing from the training's random numbers
        return DataLoader(sample, batch_size=self.batch_size, collate_fn=loader.collate_fn, generator=torch.Generator())

    def data_summary(self) -> dict[str, Any]:
        """Facts about the prepared data stored with the result (sizes, vocabulary, ...)."""
        return {}

    @abstractmethod
    def baselines(self) -> dict[str, float]:
        """Trivial-baseline value of each metric (e.g. unigram perplexity), computed from the data."""


class TaskModule(L.LightningModule, ABC):
    """LightningModule base: owns the model, the optimizer and the schedule."""

    def __init__(self, model: ModelConfig, optimizer: OptimizerConfig, max_steps: int):
        super().__init__()
        self.model_config = model
        self.optimizer_config = optimizer
        self.max_steps = max_steps
        self.model = build_model(model)
        self.moe_layers = moe_layers(self.model)  # found once; a plain list, not submodules
        #: global step of the most recent validation run (the runner reads final metrics from it)
        self.last_validated_step = -1
        #: which AdamW runs ("fused", "foreach", "for-loop"; see ``adamw_implementation``) and whether
        #: this module clips the gradients itself: decided when the optimizer is built
        self.adamw_implementation: str | None = None
        self.clips_itself = False

    @property
    def n_parameters(self) -> int:
        return count_parameters(self.model)

    @abstractmethod
    def training_loss(self, batch: Any) -> torch.Tensor:
        """The task's loss on a training batch (MoE auxiliary losses are added by the base class)."""

    @abstractmethod
    def validation_loss(self, batch: Any) -> tuple[torch.Tensor, int | torch.Tensor]:
        """The validation loss of a batch of the (first) validation loader, the mean over its
        targets, and the number of targets it is the mean of."""

    @torch.no_grad()
    def sample_loss(self, loader: DataLoader, prepare: Callable[[Any], Any]) -> float:
        """The validation loss over every batch of ``loader`` (the mean over all their targets), each
        batch made ready by ``prepare`` (precision, device), in evaluation mode: no dropout, no random
        numbers drawn, the training mode restored after."""
        was_training = self.training
        self.eval()
        total, targets = 0.0, 0.0
        for batch in loader:
            loss, weight = self.validation_loss(prepare(batch))
            total += float(loss) * float(weight)
            targets += float(weight)
        self.train(was_training)
        return total / targets

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.training_loss(batch)
        # the mean over all processes; not on Lightning's progress bar, which would read it every step (a
        # host sync): blockbench.progress.StepProgress prints it from callback_metrics
        self.log("train/loss", loss, sync_dist=True)
        if self.moe_layers:
            loss, moe_losses = add_auxiliary_losses(loss, self.moe_layers, self.model_config)
            self.log_dict(moe_losses)
            self._log_expert_load()  # Lightning writes it every trainer.log_every_n_steps
        return loss

    def _log_expert_load(self) -> None:
        """Per-layer, per-expert share of the routed tokens, and the assignments dropped over capacity."""
        for name, value in expert_load(self.moe_layers).items():
            self.log(name, value)

    @abstractmethod
    def items_in_batch(self, batch: Any) -> int | torch.Tensor:
        """Training items (tokens or images) in a batch, for the throughput figure: a count, or a device
        tensor of one where counting needs the data (read at log steps, so that the step does not wait)."""

    def on_validation_epoch_end(self) -> None:
        self.last_validated_step = self.global_step

    def log_validation(self, metrics: dict[str, Any]) -> None:
        """Log end-of-validation metrics under ``val/`` at the optimizer step they were measured after.

        (Lightning's own logging would file them one step early, under the step still in progress.)
        """
        values = {f"val/{name}": torch.as_tensor(value, dtype=torch.float32) for name, value in metrics.items()}
        self.log_dict(values, prog_bar=True, logger=False)  # progress bar and trainer.callback_metrics
        if self.logger is not None and self.trainer.is_global_zero:
            self.logger.log_metrics({k: float(v) for k, v in values.items()}, step=self.global_step)

    def result_extras(self) -> dict[str, Any]:
        """Extra facts stored with the result: the share of attended (query, key) pairs under a
        sparse attention pattern; tasks add their own (e.g. the sacrebleu signature)."""
        fraction = attended_fraction(self.model)
        return {"attended_fraction": round(fraction, 4)} if fraction is not None else {}

    def _clips_fused_itself(self, params: list[torch.nn.Parameter]) -> bool:
        """Whether this module clips the gradients itself (``configure_gradient_clipping``) so that a
        fused AdamW can run: under bf16-mixed on CUDA, with one whole model per process (one device or
        DDP). Lightning's mixed precision refuses to clip for an optimizer that unscales its gradients
        itself, as the fused one can, although bf16 has no gradient scaler and nothing to unscale."""
        trainer = self._trainer
        return (
            trainer is not None
            and bool(trainer.gradient_clip_val)
            and trainer.gradient_clip_algorithm in (None, "norm")
            and str(trainer.precision) == "bf16-mixed"
            and parameter_devices(params) == {"cuda"}
            and isinstance(trainer.strategy, (SingleDeviceStrategy, DDPStrategy))
            and not isinstance(trainer.strategy, DeepSpeedStrategy)
        )

    def _fused_optimizer(self, params: list[torch.nn.Parameter]) -> bool:
        """Whether AdamW can run as one fused kernel for all parameters (CPU and CUDA have one): not with
        gradient clipping under Lightning's mixed precision, which refuses to clip for optimizers that
        unscale gradients themselves (there the default implementation runs), unless this module clips
        itself (bf16-mixed on CUDA, see ``_clips_fused_itself``; fp16-mixed's gradient scaler, and a CPU,
        keep the default implementation)."""
        trainer = self._trainer
        clipping_in_mixed = (
            trainer is not None and bool(trainer.gradient_clip_val) and str(trainer.precision).endswith("-mixed")
        )
        on_fused_devices = parameter_devices(params) <= {"cpu", "cuda"}
        return on_fused_devices and (not clipping_in_mixed or self._clips_fused_itself(params))

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping, or where the fused AdamW runs under bf16-mixed (``_clips_fused_itself``)
        the same clipping of the gradient norm done here: no gradient scaler, so the gradients are already
        the true ones."""
        if self.clips_itself and gradient_clip_val:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
        else:
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.optimizer_config
        # weight decay on matrices only (not on norms, biases, position tables), as in nanoGPT
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay, "name": "decay"},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "name": "no_decay"},
        ]
        fused = self._fused_optimizer(params)
        self.clips_itself = fused and self._clips_fused_itself(params)
        self.adamw_implementation = adamw_implementation(params, fused)
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=fused or None)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: warmup_cosine(
                step, warmup_steps=cfg.warmup_steps, max_steps=self.max_steps, min_lr_ratio=cfg.min_lr_ratio
            ),
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step", "name": "lr"}}
