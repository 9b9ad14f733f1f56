"""The records the runs leave on disk, as types: a cell's ``result.json`` (:class:`CellRecord`) and
``load.json`` (:class:`CellLoad`), a matrix's ``tune.json``, ``matrix_run.json`` (:class:`MatrixRun`)
and a ladder's ``headroom.json`` (:class:`HeadroomCheck`), and the figures read from them.

The trainer (``blockbench.cell``) builds a :class:`CellRecord` and writes it; the runner
(``blockbench.matrix``: reuse, estimates, tuning) and the report (``blockbench.report``) read it back
with :func:`read_record`. One typed record instead of a dict that each reader indexes by string keys,
so that a renamed or retyped field fails here, at load time, not as a ``KeyError`` in a summary.
Pydantic, as the run configs (``blockbench.config``), and no import of the trainer: the report reads
results without Lightning. Fields a task adds (``TaskModule.result_extras``: the BLEU signature, the
logit lens, ...) stay top-level keys of the file and are read through :attr:`CellRecord.extras`.
Records written before the record had a version (version 1) have the same shape and load unchanged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..tensorboard.names import (
    FINAL_FIGURES as FINAL_FIGURES,  # re-exported: the figures' tags live with the run's names
)
from ..tensorboard.names import throughput_tag
from .layout import HEADROOM_FILE, LOAD_FILE, RUN_FILE, TUNE_FILE, write_json

#: the version of :class:`CellRecord` that this code writes (``record_version`` in ``result.json``)
RECORD_VERSION = 1
#: how a cell ended: trained to the end, stopped by the divergence guard, or raised / died
Status = Literal["ok", "diverged", "failed"]
#: statuses that are findings: a rerun of the same config would give the same record
FINISHED: tuple[Status, ...] = ("ok", "diverged")


#: Lightning's short names of its precisions (``lightning.fabric.connector``'s alias table): a config
#: may give either, Lightning runs (and a record holds) the full one
PRECISION_ALIASES = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}


def unified_precision(precision: str | int) -> str:
    """A Lightning precision by its full name: ``32`` -> ``32-true``, ``bf16`` -> ``bf16-mixed``."""
    return PRECISION_ALIASES.get(str(precision), str(precision))


#: the settings that decide a cell's hardware: a matrix with one of them as an axis has the cells of each
#: hardware in folders of their own and compares hardware on purpose (each variant on its own)
HARDWARE_AXES = ("trainer.accelerator", "trainer.precision")


class Hardware(BaseModel):
    """What a cell's numbers depend on besides its config and code: the kind of device it trains on
    (``cpu``, ``cuda``, ``mps``) and the precision it trains at (Lightning's full name: ``32-true``,
    ``bf16-mixed``, ...). Neither is in the config hash: ``trainer.accelerator`` and ``trainer.precision``
    are ``auto`` by default and resolved on the machine (bf16-mixed on a GPU, 32-true on a CPU). So a
    result is reused or copied, a checkpoint resumed and a seed put beside other seeds only on the same
    hardware. A record holds it as ``runtime.accelerator`` and ``precision`` (:attr:`CellRecord.hardware`),
    a checkpoint in its resume state."""

    model_config = ConfigDict(frozen=True)

    device_kind: str
    precision: str

    @classmethod
    def of(cls, accelerator: str, precision: str | int, *, cuda: bool) -> Hardware:
        """The hardware of a Lightning ``accelerator`` and ``precision`` (both resolved: not ``auto``) on a
        machine with a CUDA GPU (``cuda``) or without: ``gpu`` is CUDA where there is one, else Apple's mps."""
        kind = ("cuda" if cuda else "mps") if accelerator == "gpu" else accelerator
        return cls(device_kind=kind, precision=unified_precision(precision))

    def describe(self) -> str:
        """``cuda at bf16-mixed``."""
        return f"{self.device_kind} at {self.precision}"


#: cells named per hardware in a hardware error (the rest are counted)
NAMED_CELLS = 4
#: the ways out of a results folder whose cells trained on two kinds of hardware, the same for the run that
#: refuses to train beside them and the report that refuses to compare them
HARDWARE_WAYS_OUT = (
    "Keep each hardware's runs in a results folder of their own (blockbench --results-dir runs/<name> matrix ...), "
    "or make trainer.accelerator or trainer.precision an axis of the matrix, so that the cells of each hardware "
    "have folders of their own and are compared on purpose"
)


def hardware_listing(cells: dict[Hardware, list[str]]) -> str:
    """``cpu at 32-true: 3 cells (lm/pre/seed0, ...); cuda at bf16-mixed: 1 cell (lm/pre/seed3)``: the cells
    of each hardware, the first :data:`NAMED_CELLS` by name, for the errors that refuse to mix them."""

    def named(names: list[str]) -> str:
        more = f" and {len(names) - NAMED_CELLS} more" if len(names) > NAMED_CELLS else ""
        return ", ".join(names[:NAMED_CELLS]) + more

    return "; ".join(
        f"{hardware.describe()}: {len(names)} cell{'s' if len(names) > 1 else ''} ({named(names)})"
        for hardware, names in cells.items()
    )


class _Open(BaseModel):
    """A part of a record that may carry keys this version does not name (newer writers, task extras)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class StepTime(_Open):
    median: float | None = None
    mean: float | None = None


class Performance(_Open):
    """The ``performance`` block: this run's timed steps (see ``blockbench.cell.perf.step_statistics``)."""

    step_time_ms: StepTime | None = None
    data_wait_ms: float | None = None
    data_wait_fraction: float | None = None
    flops_per_step: float | None = None
    achieved_tflops: float | None = None
    peak_tflops: float | None = None
    peak_source: str | None = None
    peak_probe: dict[str, Any] | None = None
    probe_tflops: float | None = None  # the machine's matmul probe, shown beside a datasheet peak
    mfu: float | None = None
    mfu_above_peak: bool | None = None
    timed_steps: int | None = None
    warmup_steps: int | None = None


class Batch(_Open):
    global_: int | None = Field(default=None, alias="global")
    per_process: int | None = None
    processes: int | None = None
    accumulate_grad_batches: int | None = None


class Runtime(_Open):
    """The ``runtime`` block: what the trainer resolved for the machine (``blockbench.cell.runtime``)."""

    accelerator: str | None = None  # the device type the cell trained on: cpu, cuda, ...
    deterministic: bool | None = None  # trainer.deterministic: deterministic kernels only
    matmul_precision: str | None = None  # torch's float32 matmul precision: highest, or high (TF32)
    adamw: str | None = None  # the AdamW implementation: fused, foreach or for-loop
    num_workers: int | None = None  # DataLoader worker processes of the training data
    pin_memory: bool | None = None
    checkpoint_every_n_steps: int | None = None  # null: no checkpoints


class CellWallTime(_Open):
    """A cell's ``wall_time_breakdown``: the seconds of each part of its wall time, from its process's
    start (``startup``: interpreter and imports until the cell's code ran; None where the run was not its
    process's own) to its result, each second in one part (see ``blockbench.walltime.CELL_PARTS`` for
    what each holds). ``other`` is what no part holds; the parts and ``other`` add up to ``total``.
    Records written before a part was measured lack it (None); their time is in ``other``."""

    startup: float | None = None
    setup: float | None = None
    build: float | None = None
    data: float | None = None
    fit_setup: float | None = None
    flop_count: float | None = None
    data_wait: float | None = None
    first_step: float | None = None
    train_steps: float | None = None
    loop: float | None = None
    validation: float | None = None
    checkpoints: float | None = None
    teardown: float | None = None
    other: float | None = None
    total: float
    measured_from: str | None = None
    resumed: bool | None = None

    def parts(self) -> dict[str, float]:
        """The named parts that were measured, by name (``other`` and ``total`` not among them)."""
        named = self.model_dump(exclude={"other", "total", "measured_from", "resumed"}, exclude_none=True)
        return {name: float(value) for name, value in named.items() if isinstance(value, int | float)}

    @property
    def attributed(self) -> float:
        """Seconds the named parts hold."""
        return sum(self.parts().values())

    @property
    def unattributed_share(self) -> float:
        """The share of the total no named part holds (``other`` / ``total``; 0 for a total of 0)."""
        return (self.other or 0.0) / self.total if self.total > 0 else 0.0


class HistoryPoint(_Open):
    """One validation: its step, the seconds since training began and every metric."""

    step: int
    time_s: float | None = None
    metrics: dict[str, float | None] = Field(default_factory=dict)


class Curve(_Open):
    """The loss curve: ``points`` are ``[step, loss]`` on a fixed validation sample."""

    every_n_steps: int | None = None
    items: int | None = None
    points: list[list[float]] = Field(default_factory=list)


class Git(_Open):
    commit: str | None = None
    dirty: bool | None = None


class Provenance(_Open):
    git: Git = Field(default_factory=Git)
    packages: dict[str, str] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    #: CUDA, cuDNN, NCCL and driver versions where CUDA is available (``provenance.cuda_versions``)
    cuda: dict[str, Any] | None = None
    command: str | None = None


class CellRecord(_Open):
    """A cell's ``result.json``: how it ended, its final metrics and everything measured on the way.

    An ok record has ``metrics``; a diverged one the step and loss where the guard stopped it; a
    failed one (:meth:`failure`) the error. The rest is filled by a run that reached its end.
    """

    record_version: int = RECORD_VERSION
    status: Status
    task: str
    seed: int | None = None
    config_hash: str | None = None
    code_fingerprint: str | None = None
    # ok
    metrics: dict[str, float] = Field(default_factory=dict)
    primary_metric: str | None = None
    baselines: dict[str, float | None] = Field(default_factory=dict)
    #: whether the headline metric beats the task's trivial baseline (None: no baseline to beat, or a
    #: record written before it was recorded); False is a run that finished but **did not learn**
    learned: bool | None = None
    # diverged
    diverged_at_step: int | None = None
    diverging_loss: float | str | None = None  # "nan" or "inf" where not finite
    last_finite_loss: float | None = None
    # failed
    error: str | None = None
    traceback: str | None = None
    # a run that reached its end
    data: dict[str, Any] | None = None
    steps: int | None = None
    resumed_from_step: int | None = None
    resume_error: str | None = None
    wall_time_s: float | None = None
    wall_time_breakdown: dict[str, Any] | None = None
    parameters: int | None = None
    throughput: float | None = None
    throughput_per_process: float | None = None
    throughput_unit: str | None = None
    performance: Performance | None = None
    batch: Batch | None = None
    precision: str | int | None = None
    runtime: Runtime | None = None  # None in records written before it
    peak_memory: dict[str, float] | None = None
    machine: str | None = None
    history: list[HistoryPoint] = Field(default_factory=list)
    curve: Curve | None = None
    provenance: Provenance | None = None

    @classmethod
    def failure(
        cls, task: str, seed: int | None, config_hash: str, fingerprint: str, error: str, traceback: str | None = None
    ) -> CellRecord:
        """The record of a cell that failed (raised, or died without writing a result): the matrix goes
        on, and the report lists it as failed and leaves it out of the statistics."""
        return cls(
            status="failed",
            task=task,
            seed=seed,
            config_hash=config_hash,
            code_fingerprint=fingerprint,
            error=error,
            **({} if traceback is None else {"traceback": traceback}),
        )

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def wall_time(self) -> CellWallTime | None:
        """The wall-time breakdown, typed (None where the record has none: a failed cell)."""
        return CellWallTime.model_validate(self.wall_time_breakdown) if self.wall_time_breakdown else None

    @property
    def did_not_learn(self) -> bool:
        """A run that finished without beating its task's trivial baseline on the headline metric
        (post-norm LM cells ending at the unigram's perplexity): a finding, distinct from diverged and failed."""
        return self.status == "ok" and self.learned is False

    @property
    def finished(self) -> bool:
        """A finding (ok or diverged): a rerun of the same config and code would give the same record."""
        return self.status in FINISHED

    @property
    def extras(self) -> dict[str, Any]:
        """The keys this version does not name: the task's own (``TaskModule.result_extras``)."""
        return dict(self.model_extra or {})

    @property
    def git(self) -> Git:
        return self.provenance.git if self.provenance else Git()

    @property
    def hardware(self) -> Hardware | None:
        """The device kind and precision the cell trained at: its ``runtime.accelerator`` (the device type)
        and ``precision``; a record from before ``runtime`` trained on a GPU where its machine had one
        (``trainer.accelerator: auto``). None for a record without them (a failed cell)."""
        if self.precision is None:
            return None
        if self.runtime is not None and self.runtime.accelerator is not None:
            kind = self.runtime.accelerator
        elif self.provenance is not None:
            kind = "cuda" if self.provenance.hardware.get("gpu_count") else "cpu"
        else:
            return None
        return Hardware(device_kind=kind, precision=unified_precision(self.precision))

    @property
    def device_kind(self) -> str | None:
        """The kind of device the cell ran on, as far as its bits depend on it: its accelerator (the
        GPU's name on a GPU), the CPU's vector extensions torch used (parsed from ``machine``, where
        :func:`blockbench.provenance.machine_description` puts them in parentheses), and the torch and
        lightning versions; None for a record without them (a failed cell). A lineage step holds for
        one kind (:mod:`blockbench.store.lineage`)."""
        if self.provenance is None or self.machine is None:
            return None
        packages = self.provenance.packages
        gpus = self.provenance.hardware.get("gpus") or []
        accelerator = self.runtime.accelerator if self.runtime and self.runtime.accelerator else "cpu"
        on = gpus[0] if accelerator != "cpu" and gpus else accelerator
        capability = re.search(r"\(([A-Za-z0-9_]+)\)", self.machine.split(";")[0])
        return (
            f"{on} {capability.group(1) if capability else '?'}, "
            f"torch {packages.get('torch', '?')}, lightning {packages.get('lightning', '?')}"
        )

    def describe(self) -> str:
        """How the cell ended, for a progress line: ``ok``, ``diverged at step 12``, ``failed: ...``."""
        if self.status == "diverged":
            return f"diverged at step {self.diverged_at_step if self.diverged_at_step is not None else '?'}"
        if self.status == "failed":
            return f"failed: {self.error or 'no error recorded'}"
        return self.status

    def speed_figures(self) -> dict[str, float | None]:
        """The speed figures by name (None where the record has none): the summary's columns. An MFU
        above 1 is None: it says the peak was too low, not how well the device was used."""
        perf = self.performance or Performance()
        mfu = perf.mfu
        return {
            "step_time_ms": perf.step_time_ms.median if perf.step_time_ms else None,  # the run's median step
            "achieved_tflops": perf.achieved_tflops,
            "peak_tflops": perf.peak_tflops,
            "mfu": None if mfu is None or mfu > 1 else mfu,  # above 1 the peak is wrong (results before mfu_above_peak)
            "data_wait_fraction": perf.data_wait_fraction,
            "peak_memory_mb": headline_peak_memory_mb(self.peak_memory),
        }

    def final_figures(self, unit: str) -> dict[str, float]:
        """The speed figures by TensorBoard tag (those it has): :data:`FINAL_FIGURES` and the
        throughput of all processes under :func:`throughput_tag`."""
        speed = self.speed_figures()
        timed = bool(self.performance and self.performance.timed_steps)
        figures = {
            "perf/step_time_ms": speed["step_time_ms"],
            throughput_tag(unit): self.throughput if timed else None,
            "perf/tflops_per_sec": speed["achieved_tflops"],
            "perf/mfu": speed["mfu"],
            "perf/data_wait_fraction": speed["data_wait_fraction"],
            "perf/peak_memory_mb": speed["peak_memory_mb"],
        }
        return {tag: float(value) for tag, value in figures.items() if value is not None}

    def to_json(self) -> dict[str, Any]:
        """The file's content: the fields that were set (an ok record has no ``error: null``), in order."""
        return self.model_dump(by_alias=True, exclude_unset=True)  # python mode: a nan stays nan (json: null)


#: the speed figures of a record, by their summary.csv column (see :meth:`CellRecord.speed_figures`)
SPEED_FIGURES = ("step_time_ms", "achieved_tflops", "peak_tflops", "mfu", "data_wait_fraction", "peak_memory_mb")


def headline_peak_memory_mb(peak_memory: dict[str, float] | None) -> float | None:
    """The figure of a record's ``peak_memory`` that the summary shows: GPU if recorded, else CPU RSS."""
    if not peak_memory:
        return None
    return peak_memory.get("cuda_max_allocated_mb", peak_memory.get("cpu_rss_mb"))


def read_record(path: Path) -> CellRecord | None:
    """The record in ``path`` (a ``result.json``), or None if there is none or it cannot be read (a
    file cut short, or not a record): such a cell has no result and trains again."""
    try:
        return CellRecord.model_validate_json(Path(path).read_bytes())
    except (OSError, ValueError):
        return None


def load_record(path: Path) -> CellRecord:
    """The record in ``path``; raises if there is none (where a record must exist, e.g. the report's)."""
    return CellRecord.model_validate_json(Path(path).read_bytes())


def write_record(path: Path, record: CellRecord) -> None:
    write_json(path, record.to_json())


def write_tuning(matrix_dir: Path, record: dict[str, Any]) -> None:
    write_json(matrix_dir / TUNE_FILE, record)


def read_tuning(matrix_dir: Path) -> dict[str, Any] | None:
    """The matrix's ``tune.json``, or None if it has none (a matrix without ``tune:``)."""
    path = matrix_dir / TUNE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


class RunCell(_Open):
    """A cell a matrix run trained, as the runner timed it (``matrix_run.json`` ``cells``): its key
    (``task/variant/seed<k>``, ``tune/...`` for a tuning cell), the seconds of its process from start to
    exit, and the breakdown its record has (the runner's copy: a tuning cell's is in no reported record)."""

    key: str
    seconds: float
    phase: str | None = None
    wall_time_breakdown: dict[str, Any] | None = None


class RunPhase(_Open):
    """A phase of a matrix run (its tuning, its reported cells; ``matrix_run.json`` ``phases``): its
    cells, those trained, its seconds and its rounds (tuning rungs, rounds of seeds)."""

    cells: int
    trained: int
    wall_time_s: float
    rounds: int


class MatrixRun(_Open):
    """A matrix's ``matrix_run.json``, written by the runner (``blockbench.matrix``) after each run: the
    last run's command, its wall time, the cells it trained and where the time went (``cells``: None
    when it did not time them, e.g. cells run as cluster jobs)."""

    command: str
    wall_time_s: float
    cells_trained: int
    jobs: int | None = None
    wall_time_breakdown: dict[str, Any] | None = None
    cells: list[RunCell] | None = None
    phases: dict[str, RunPhase] | None = None  # with ``tune:``: the tuning phase's and the reported cells'


def read_matrix_run(matrix_dir: Path) -> MatrixRun | None:
    """The matrix's ``matrix_run.json``, or None if it has none (never run by ``blockbench matrix``)."""
    path = Path(matrix_dir) / RUN_FILE
    return MatrixRun.model_validate_json(path.read_bytes()) if path.is_file() else None


class HeadroomTask(_Open):
    """One task's part of a ladder's headroom check: the baseline's cell at the top rung, how it ended,
    its headline metric's value, and how far that is from the best the metric allows (``of``: ``best``,
    the metric's best value, or ``floor``, the LM grammar's entropy floor, in nats of loss) against the
    task's saturation distance and the distance the ladder needs (``near``: a multiple of it)."""

    task: str
    variant: str
    cell: str
    status: str  # room, near, saturated, unknown (the cell did not finish) or no rule (the task declares none)
    metric: str
    value: float | None = None
    of: str | None = None
    distance: float | None = None
    saturation: float | None = None
    near: float | None = None
    detail: str = ""
    harder: str = ""  # what the message suggests to make the task harder (``headroom.harder_suggestion``)


class HeadroomCheck(_Open):
    """A ladder's ``headroom.json``: the top rung, whether the run stopped there, each task's check and,
    where it stopped, what to change."""

    rung: str
    stop: bool
    tasks: list[HeadroomTask]
    message: str = ""


def write_headroom(matrix_dir: Path, check: HeadroomCheck) -> None:
    write_json(matrix_dir / HEADROOM_FILE, check.model_dump(mode="json"))


def read_headroom(matrix_dir: Path) -> HeadroomCheck | None:
    """The matrix's ``headroom.json``, or None if it has none (no ladder, or not checked yet)."""
    path = Path(matrix_dir) / HEADROOM_FILE
    return HeadroomCheck.model_validate_json(path.read_bytes()) if path.is_file() else None


class CellLoad(BaseModel):
    """A cell's ``load.json``: how much CPU the machine spent on other processes while the cell ran, as
    the runner measured it from outside the cell (``blockbench.matrix.load``). Its step times are only
    comparable with another cell's where the two ran under similar load: on a shared machine, a cell
    beside other work can take twice as long per step with the same design. ``wall_s`` is the window
    measured (from the cell's start to the runner's last reading before it ended), ``machine_cpu_s``
    the busy CPU seconds of every core of the machine in it, ``cell_cpu_s`` those of the cell's
    process tree; ``cores``: the CPUs the machine has (all of them, not only the cell's)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    wall_s: float
    cores: int
    machine_cpu_s: float
    cell_cpu_s: float
    interval_s: float | None = None  # how often the runner read the counters

    @property
    def other_cpu_s(self) -> float:
        """CPU seconds that processes other than the cell's took in the window (never below 0: the
        readings of the machine and of the cell are a few milliseconds apart)."""
        return max(0.0, self.machine_cpu_s - self.cell_cpu_s)

    @property
    def other_cores(self) -> float:
        """How many cores other processes kept busy on average while the cell ran."""
        return self.other_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def other_share(self) -> float:
        """:attr:`other_cores` as a share of the machine's cores (0: idle but for the cell; 1: full)."""
        return self.other_cores / self.cores if self.cores > 0 else 0.0


def read_load(cell_dir: Path) -> CellLoad | None:
    """The ``load.json`` of the cell in ``cell_dir``, or None where it has none (cells trained before
    the runner recorded load, on a machine without /proc, as cluster jobs, or too short to measure)
    or it cannot be read."""
    try:
        return CellLoad.model_validate_json((Path(cell_dir) / LOAD_FILE).read_bytes())
    except (OSError, ValueError):
        return None


def write_load(cell_dir: Path, load: CellLoad) -> None:
    write_json(Path(cell_dir) / LOAD_FILE, load.model_dump(exclude_none=True))
