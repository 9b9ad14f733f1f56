"""The run config (one cell of a matrix), validated with pydantic (the matrix file that expands into
run configs is :mod:`blockbench.matrixfile`).

A run config has four sections, each a pydantic model that rejects unknown keys:
``model`` (``models.ModelConfig``), ``task`` (selected by ``task.name``), ``optimizer`` and
``trainer``, plus the training ``seed``. Configs come from YAML files plus dotted overrides
(``model.norm_placement=post``).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Annotated, Any, Literal, Union, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from blockbench.models import ModelConfig
from blockbench.tasks import TASK_CONFIGS, TASK_PRESETS, LMTaskConfig, OptimizerConfig
from blockbench.tasks.data.image_sources import IMAGE_SOURCES

from .keys import Origins, Problem, unknown_key
from .overrides import ConfigError as ConfigError  # re-exported: the error of every config problem
from .overrides import load_yaml as load_yaml  # re-exported with parse_overrides: how configs are read
from .overrides import parse_overrides as parse_overrides

# Union of the registered task configs, built at import: the | operator cannot spell a union of a runtime tuple
TaskSection = Annotated[Union[tuple(TASK_CONFIGS.values())], Field(discriminator="name")]  # noqa: UP007


#: (section, tag) pairs of the config's tagged unions: the task by name, an image task's data by source
UNION_TAGS = {("task", name) for name in TASK_CONFIGS} | {("data", source) for source in IMAGE_SOURCES}


#: trainer fields whose string values Lightning's Trainer checks against its own lists (see lightning_choices)
LIGHTNING_FIELDS = ("precision", "accelerator", "strategy")
#: the values of each of :data:`LIGHTNING_FIELDS` that configs use most, all of them in Lightning's lists
#: (tests/test_config_validation.py checks that against :func:`lightning_choices`): a config with these is
#: checked without importing Lightning, which takes seconds; any other value is looked up in its lists
COMMON_LIGHTNING_VALUES = {
    "precision": ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "32", "bf16", "16"),
    "accelerator": ("auto", "cpu", "gpu", "cuda", "mps"),
    "strategy": ("auto", "ddp", "ddp_spawn", "fsdp", "deepspeed", "single_device"),
}


def lightning_choices(key: str) -> list[str]:
    """The values Lightning's Trainer accepts as strings for ``trainer.<key>``, from Lightning's own
    lists (precision types, accelerator and strategy registries), plus ``auto``. Imports Lightning:
    validation asks only for a value outside :data:`COMMON_LIGHTNING_VALUES`."""
    from lightning.fabric.connector import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    if key == "precision":  # lightning.pytorch's accelerator connector checks against these
        names = [*get_args(_PRECISION_INPUT_STR), *get_args(_PRECISION_INPUT_STR_ALIAS)]
    elif key == "accelerator":  # "gpu" is accepted besides the registry (it picks cuda or mps)
        names = [*sorted(AcceleratorRegistry.available_accelerators()), "gpu"]
    else:
        names = list(StrategyRegistry.available_strategies())
    return ["auto", *names]


#: Lightning strategies that shard a model over the processes
SHARDING_STRATEGIES = ("fsdp", "deepspeed")
#: ``trainer.checkpoint_every_n_steps: auto`` on a CPU and on a GPU: a GPU step is short next to a
#: synchronous save of the model and optimizer
CHECKPOINT_STEPS = {"cpu": 50, "cuda": 500}
#: most DataLoader workers ``trainer.num_workers: auto`` starts per process on a GPU
MAX_AUTO_WORKERS = 4


def on_gpu(accelerator: str) -> bool:
    """Whether a Trainer ``accelerator`` (resolved: not ``auto``) is a CUDA GPU."""
    return accelerator in ("gpu", "cuda")


class TrainerConfig(BaseModel):
    """Budget and hardware settings, passed to ``lightning.Trainer``."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(300, gt=0, description="optimizer steps; the same budget for every task")
    batch_size: int = Field(
        32, gt=0, description="global batch: sequences (or images) per optimizer step, summed over all processes"
    )
    val_every_n_steps: int = Field(100, gt=0, description="validate (every validation metric) every this many steps")
    curve_every_n_steps: int | None = Field(
        None,
        ge=0,
        description="between full validations, the validation loss on trainer.curve_items validation "
        "items (spread evenly over the set) this often, before the first step and at the last: the loss curve's "
        "points (null: max_steps // 10, so 11 points from 10 steps on; 0: none)",
    )
    curve_items: int = Field(
        256, gt=0, description="validation items (sequences, sentence pairs, images) of each loss-curve point"
    )
    log_every_n_steps: int = Field(10, gt=0, description="log the training loss, learning rate and speed this often")
    grad_clip: float | None = Field(1.0, gt=0, description="clip the gradient norm to this (null: no clipping)")
    checkpoint_every_n_steps: int | Literal["auto"] | None = Field(
        "auto",
        description="save checkpoints/last.ckpt this often (>0); an interrupted cell resumes from it (auto: every "
        f"{CHECKPOINT_STEPS['cpu']} steps on a CPU, every {CHECKPOINT_STEPS['cuda']} on a GPU, where a "
        "synchronous save costs many steps' time; null: never)",
    )
    divergence_threshold: float | None = Field(
        1000.0,
        gt=0,
        description="stop and record the cell as diverged when the training loss exceeds this (or is not finite)",
    )
    accumulate_grad_batches: int = Field(
        1, ge=1, description="micro-batches per optimizer step (the global batch stays batch_size)"
    )
    accelerator: str = Field("auto", description="cpu, gpu, ... (auto: a GPU if there is one)")
    devices: int | str = Field(1, description="devices per node: a number, a list like '0,1', or 'auto' / -1 for all")
    num_nodes: int = Field(1, ge=1, description="machines (with torchrun or SLURM, see the README)")
    strategy: str = Field("auto", description="auto (DDP with more than one device), ddp, fsdp, ...")
    precision: str = Field(
        "auto", description="auto: bf16-mixed on a GPU, 32-true on a CPU; or any Lightning precision"
    )
    num_threads: int | None = Field(None, gt=0, description="torch CPU threads; default: all cores")
    num_workers: int | Literal["auto"] = Field(
        "auto",
        description="DataLoader worker processes (>=0) of each process's training data (auto: none on a CPU; on a GPU "
        f"min({MAX_AUTO_WORKERS}, CPUs per device - 1)); validation loads in the process. On a GPU every batch "
        "comes in pinned memory",
    )
    tf32: bool = Field(
        True,
        description="on a CUDA GPU, float32 matmuls and convolutions run on TF32 tensor cores "
        "(torch.set_float32_matmul_precision('high')); false: full fp32; off under trainer.deterministic; "
        "no effect on a CPU",
    )
    deterministic: bool = Field(
        False,
        description="deterministic kernels (torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG, no cuDNN "
        "benchmark, no TF32), so that a GPU rerun gives the same bits; kernels without a deterministic version "
        "raise. A CPU run is deterministic without it",
    )
    peak_tflops: float | None = Field(
        None,
        gt=0,
        description="peak TFLOP/s of one device, the denominator of MFU; null: this machine's matmul "
        "probe in the run's compute dtype, measured once and cached (see `blockbench peak`)",
    )

    @field_validator(*LIGHTNING_FIELDS)
    @classmethod
    def _lightning_accepts(cls, value: str, info: ValidationInfo) -> str:
        """A value Lightning would reject when the Trainer is built stops the config now, with the choices
        (a common value passes without Lightning's lists, see :data:`COMMON_LIGHTNING_VALUES`)."""
        given = value.lower() if info.field_name == "strategy" else value  # Lightning lowercases strategies
        if given in COMMON_LIGHTNING_VALUES[info.field_name]:
            return value
        choices = lightning_choices(info.field_name)
        if given not in choices:
            raise ValueError(f"'{value}' is not a Lightning {info.field_name}; choose one of: {', '.join(choices)}")
        return value

    @field_validator("checkpoint_every_n_steps", "num_workers")
    @classmethod
    def _count_or_auto(cls, value: int | str | None, info: ValidationInfo) -> int | str | None:
        """A number of steps (>0) or workers (>=0), besides ``auto`` (pydantic's gt/ge would apply to it too)."""
        workers = info.field_name == "num_workers"
        if isinstance(value, int) and value < (0 if workers else 1):
            raise ValueError(f"Input should be greater than {'or equal to ' if workers else ''}0")
        return value

    @model_validator(mode="after")
    def _batch_splits(self) -> TrainerConfig:
        """Check the global batch split before training when the device count is in the config."""
        if isinstance(self.devices, int) and self.devices > 0:
            try:
                self.per_device_batch_size(self.devices * self.num_nodes)
            except ConfigError as error:
                raise ValueError(str(error).removeprefix("trainer.")) from None
        return self

    @property
    def curve_interval(self) -> int:
        """Steps between the loss-curve points (0: none); see ``curve_every_n_steps``."""
        return max(1, self.max_steps // 10) if self.curve_every_n_steps is None else self.curve_every_n_steps

    @model_validator(mode="after")
    def _curve_needs_whole_models(self) -> TrainerConfig:
        """The loss curve runs each process's whole model outside Lightning's step (see
        ``blockbench.cell.callbacks.LossCurve``); a sharding strategy holds a part of it."""
        if self.curve_interval and self.strategy.lower().startswith(SHARDING_STRATEGIES):
            raise ValueError(
                f"the loss curve (trainer.curve_every_n_steps) needs the whole model in every process, "
                f"which strategy={self.strategy} shards; set trainer.curve_every_n_steps: 0 with it"
            )
        return self

    def per_device_batch_size(self, world_size: int) -> int:
        """The batch each process computes per micro-step, so that the global batch is ``batch_size``
        whatever the number of processes; raises ConfigError if it does not divide."""
        shares = world_size * self.accumulate_grad_batches
        if self.batch_size % shares:
            raise ConfigError(
                f"trainer.batch_size={self.batch_size} is not divisible by {world_size} process(es) x "
                f"{self.accumulate_grad_batches} accumulation step(s); use a multiple of {shares}"
            )
        return self.batch_size // shares

    def resolved_precision(self, accelerator: str) -> str:
        if self.precision != "auto":
            return self.precision
        return "bf16-mixed" if on_gpu(accelerator) else "32-true"

    def checkpoint_interval(self, accelerator: str) -> int | None:
        """Steps between checkpoints on ``accelerator`` (None: none); see ``checkpoint_every_n_steps``."""
        if self.checkpoint_every_n_steps != "auto":
            return self.checkpoint_every_n_steps
        return CHECKPOINT_STEPS["cuda" if on_gpu(accelerator) else "cpu"]

    def loader_workers(self, accelerator: str, cpus_per_device: int) -> int:
        """DataLoader workers of each process's training data; see ``num_workers``. ``auto`` on a GPU
        leaves one of the CPUs per device to the training process itself."""
        if self.num_workers != "auto":
            return self.num_workers
        return max(0, min(MAX_AUTO_WORKERS, cpus_per_device - 1)) if on_gpu(accelerator) else 0


class RunConfig(BaseModel):
    """Everything one training run needs."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(
        0,
        description="training seed: initialisation, data order, dropout, augmentation, and a generated task's data "
        "draw (unless task.data_seed fixes it)",
    )
    model: ModelConfig = ModelConfig()
    task: TaskSection = Field(
        LMTaskConfig(), description="a task, or a preset of a real-data task (`task: vit` is short for task.name=vit)"
    )
    optimizer: OptimizerConfig = OptimizerConfig()
    trainer: TrainerConfig = TrainerConfig()

    @field_validator("task", mode="before")
    @classmethod
    def _task_by_name(cls, value: Any) -> Any:
        """``task: vit`` is short for ``task: {name: vit}``; a preset name (``task: wikitext103``)
        expands to the preset's settings, refined by any other keys given; an unknown or missing
        name lists the tasks and presets."""
        if isinstance(value, str):
            value = {"name": value}
        if isinstance(value, dict):
            name = value.get("name")
            if name in TASK_PRESETS:
                value = deep_merge(
                    {**TASK_PRESETS[name].task, "label": name}, {k: v for k, v in value.items() if k != "name"}
                )
            elif name not in TASK_CONFIGS:
                problem = "task.name is missing" if name is None else f"unknown task '{name}'"
                raise ValueError(
                    f"{problem}; choose a task ({', '.join(TASK_CONFIGS)}) or a preset ({', '.join(TASK_PRESETS)})"
                )
        return value

    @model_validator(mode="after")
    def _model_fits_task(self) -> RunConfig:
        data_decided = [k for k in self.task.data_decided_fields if getattr(self.model, k) is not None]
        if data_decided:
            raise ValueError(
                f"{', '.join(f'model.{k}' for k in data_decided)}: decided by task '{self.task.name}' "
                "when its data is prepared; remove it from the config"
            )
        decided = self.task.model_overrides()
        clashes = [
            k for k in sorted(decided) if k in self.model.model_fields_set and getattr(self.model, k) != decided[k]
        ]
        if clashes:
            keys = ", ".join(f"model.{k}={getattr(self.model, k)!r}" for k in clashes)
            raise ValueError(
                f"{keys}: decided by task '{self.task.name}' from its data "
                f"({', '.join(f'{k}={decided[k]!r}' for k in clashes)}); remove it from the config"
            )
        try:
            model = self.resolved_model()
        except ValidationError as exc:  # e.g. the task's image_size and model.patch_size disagree
            raise ValueError("; ".join(describe_validation_error(exc, prefix="model."))) from None
        self.task.check_model(model)
        return self

    def resolved_model(self) -> ModelConfig:
        """The ``model`` section completed with the fields the task derives from its data."""
        return ModelConfig.model_validate({**self.model.model_dump(exclude_unset=True), **self.task.model_overrides()})

    def resolved_dict(self) -> dict[str, Any]:
        """The whole config with the resolved model section: what a cell's config.yaml holds."""
        return {**self.model_dump(mode="json"), "model": self.resolved_model().model_dump(mode="json")}

    def config_hash(self) -> str:
        """The config's identity: the first 16 hex digits of the sha256 of :meth:`resolved_dict` as JSON
        with sorted keys. Every setting counts, including one at its default, so a cell whose record holds
        another hash was made by another config and is trained again; a setting added to the config
        classes therefore changes every hash, and the records are rehashed when it keeps what they did."""
        canonical = json.dumps(self.resolved_dict(), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def describe_validation_error(
    error: ValidationError, prefix: str = "", origins: Origins | None = None, matrix: type[BaseModel] | None = None
) -> list[str]:
    """One line per problem: ``model.n_heads: Input should be greater than 0``; an unknown key names
    the closest valid ones (``model.n_head: unknown key; did you mean model.n_heads?``), among the keys
    of ``matrix`` (the matrix file's class) where the error is a matrix file's, else of a run config;
    given ``origins``, each line says where its key was set (``(set on the command line)``)."""
    matrix = matrix if matrix is not None and error.title == matrix.__name__ else None
    lines = []
    for problem in error.errors():
        # drop the discriminator tags pydantic inserts into the path ("task.lm.seq_len", "task.data.npz.path")
        loc = [str(p) for p in problem["loc"]]
        loc = [part for i, part in enumerate(loc) if not (i and (loc[i - 1], part) in UNION_TAGS)]
        key = ".".join(filter(None, [prefix.rstrip("."), *loc]))
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            root, noun = (matrix, "a matrix file") if matrix is not None else (RunConfig, "a run config")
            message = unknown_key(key, root, RunConfig, problem.get("input"), noun)
        elif problem["type"] not in {"value_error", "missing", "union_tag_invalid"}:
            message = f"{message} (got {problem.get('input')!r})"
        lines.append(Problem(key, message).text(origins))
    return lines


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in, section by section (``update`` wins)."""
    merged = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    """``set_dotted(c, "model.n_heads", 8)`` sets ``c["model"]["n_heads"] = 8``."""
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        child = node.setdefault(part, {})
        if isinstance(child, str):  # "task: lm" shorthand, being refined by "task.seq_len=..."
            child = node[part] = {"name": child}
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: '{part}' is a value, not a section")
        node = child
    node[leaf] = value


def build_run_config(
    raw: dict[str, Any], overrides: dict[str, Any] | None = None, *, source: str = "", origins: dict | None = None
) -> RunConfig:
    """Validate ``raw`` (plus dotted overrides) into a RunConfig or raise ConfigError listing every
    problem, each with where its key was set: in ``source`` (the file ``raw`` was read from) or where
    ``origins`` says its override was given (``on the command line``; default: ``by an override``)."""
    config = copy.deepcopy(raw)
    for key, value in (overrides or {}).items():
        set_dotted(config, key, copy.deepcopy(value))  # a section given as a value stays the caller's own
    try:
        return RunConfig.model_validate(config)
    except ValidationError as exc:
        where = Origins.given(raw, source, overrides or {}, origins or {})
        raise ConfigError("\n".join(describe_validation_error(exc, origins=where))) from None


def to_yaml(run: RunConfig) -> str:
    return yaml.safe_dump(run.resolved_dict(), sort_keys=False)
