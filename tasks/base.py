"""What every task's Lightning code shares: the LightningModule and LightningDataModule bases, the
optimizer schedule, the loaders and the tuning split of real data.

A task is a ``TaskConfig`` subclass (the YAML ``task:`` section, selected by ``task.name``, in
``tasks.configs``) whose ``build`` makes a ``TaskModule`` (LightningModule) and a ``TaskDataModule``
(LightningDataModule). The module owns one model from the block library, built from the run's
``model:`` section completed with the fields the task derives from its data (vocabulary size, number
of classes, ...).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
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

from .configs.base import OptimizerConfig
from .rng import capture_rng, restore_rng

# torchdata calls a deprecated torch function on every new loader; nothing for users to act on
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)


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


def with_data_fields(model: ModelConfig, **fields: Any) -> ModelConfig:
    """``model`` completed with fields decided by the prepared data (validated again)."""
    return ModelConfig.model_validate({**model.model_dump(exclude_unset=True), **fields})


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
        self._eager_validation = contextlib.ExitStack()  # the compiler's stance during validation

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
        numbers drawn, the training mode restored after; a compiled model runs eagerly, as in validation."""
        was_training = self.training
        self.eval()
        total, targets = 0.0, 0.0
        with torch.compiler.set_stance("force_eager"):
            for batch in loader:
                loss, weight = self.validation_loss(prepare(batch))
                total += float(loss) * float(weight)
                targets += float(weight)
        self.train(was_training)
        return total / targets

    def on_validation_start(self) -> None:
        """Validation runs a compiled model (``model.compile: true``) eagerly, until ``on_validation_end``:
        compiling is for the training step, and validation's calls (no gradients, their own shapes, the
        decoding, the logit lens) would each compile graphs of their own that cost more time than
        they save."""
        self._eager_validation = contextlib.ExitStack()
        self._eager_validation.enter_context(torch.compiler.set_stance("force_eager"))

    def on_validation_end(self) -> None:
        self._eager_validation.close()

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
