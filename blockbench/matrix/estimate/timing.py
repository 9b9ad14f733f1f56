"""A whole cell's time, measured before it runs: each part of a cell of a (task, variant) timed in a
process of its own, started as the runner starts the cell's, beside as many others as ``--jobs`` runs.

A fresh results folder has nothing measured, and a few training steps alone leave out most of a cell
(why, with the measurements: ``docs/decisions/time-estimate.md``). :func:`time_cell` therefore does what
a cell does, briefly: builds the model and the data, fits :data:`TIMED_STEPS` optimizer steps in
Lightning with a validation after each half (:data:`VALIDATION_BATCHES` batches of every validation
loader: the forward, the logit lens, the decoding of the translation task), a loss-curve point and a
checkpoint save. :meth:`CellTiming.seconds` scales the parts to the cell: its steps, its validations
(every ``trainer.val_every_n_steps`` and the final one, each over every batch of every loader), its
loss-curve points and checkpoints, and once each the process start and exit, the build (the data
generation among it) and Lightning's set-up.

Under ``--jobs N`` cells share the cores, and a cell beside others runs slower than one alone, by how
much the machine and what else runs on it decide, so :func:`time_runs` measures it rather than assuming
it: its timings run N at a time, in the runner's slots (their threads, a GPU each), in rounds whose fits
start and end together (:class:`Company`).

A run's time from its cells': they run ``--jobs`` at a time as the runner's queue hands them out
(:func:`makespan`), and the report follows the last (:func:`report_seconds`).
"""

from __future__ import annotations

import heapq
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ...config import RunConfig, TrainerConfig, build_run_config, load_yaml, to_yaml
from ...store.layout import write_json
from ...store.record import read_matrix_run
from ..devices import VISIBLE
from ..jobs import forks, job_slots
from ..launch import run_forked, run_subprocess

#: optimizer steps of the timing fit, a validation after each half; the first step and the first
#: validation warm up (their excess over the others counts once, as a cell's own first ones do)
TIMED_STEPS = 8
#: batches of each validation loader in a timing validation, scaled to the loader's length
VALIDATION_BATCHES = 2
#: the module a timing process runs (``python -m``)
TIMING_MODULE = "blockbench.matrix.estimate.timing"

K = TypeVar("K")


@dataclass(frozen=True)
class CellTiming:
    """Seconds of each part of one cell of a (task, variant) on this machine (see the module docstring)."""

    process: float  # the process's start and exit, as the runner sees them (a fork: little; a subprocess: imports)
    build: float  # the model and the data (generated, or read from the cache)
    fit: float  # Lightning's set-up and teardown, the code fingerprint, the first step's excess over the others
    step: float  # one optimizer step (median), its batch fetched
    validation: float  # one whole validation: every batch of every loader, and the metrics at its end
    curve: float  # one loss-curve point (``trainer.curve_items`` validation items)
    checkpoint: float  # one checkpoint save
    checkpoint_every: int | None = None  # the cell's checkpoint interval on the accelerator it ran on

    def seconds(self, trainer: TrainerConfig, from_step: int = 0) -> float:
        """The whole cell's seconds, trained from ``from_step`` (a resumed cell) to ``trainer.max_steps``."""
        counts = part_counts(trainer, from_step, self.checkpoint_every)
        return (
            self.process
            + self.build
            + self.fit
            + counts.steps * self.step
            + counts.validations * self.validation
            + counts.curve_points * self.curve
            + counts.checkpoints * self.checkpoint
        )


@dataclass(frozen=True)
class PartCounts:
    """How many times a cell does each repeated part."""

    steps: int
    validations: int
    curve_points: int
    checkpoints: int


def multiples(every: int, after: int, upto: int) -> int:
    """How many multiples of ``every`` lie in ``(after, upto]``."""
    return upto // every - after // every if every > 0 else 0


def part_counts(trainer: TrainerConfig, from_step: int = 0, checkpoint_every: int | None = None) -> PartCounts:
    """The parts of a cell trained from ``from_step`` to ``trainer.max_steps``: a validation every
    ``val_every_n_steps`` and a final one where the last step is not a validation step
    (``blockbench.cell.train``); a loss-curve point before the first step (a fresh cell), every
    ``curve_interval`` steps and at the last (``blockbench.cell.callbacks.LossCurve``); a checkpoint every
    ``checkpoint_every`` steps (``StepCheckpoint``)."""
    end = trainer.max_steps
    validations = multiples(trainer.val_every_n_steps, from_step, end) + (end % trainer.val_every_n_steps != 0)
    interval = trainer.curve_interval
    curve = 0
    if interval:
        curve = (from_step == 0) + multiples(interval, from_step, end) + (end % interval != 0)
    checkpoints = multiples(checkpoint_every, from_step, end) if checkpoint_every else 0
    return PartCounts(max(0, end - from_step), validations, curve, checkpoints)


# --- a run's time from its cells' --------------------------------------------------------------------

#: seconds of a matrix run after its last cell where no earlier run under the results root measured its
#: report: the report (summary.md, plots), the index of every matrix and the process's exit; measured on a
#: shared 2-core AMD EPYC: 3 s (4 cells) to 5 to 7 s (the smoke matrix's 12) from the last progress line
#: to the exit (``python benchmarks/estimate_accuracy.py --log``)
REPORT_SECONDS = 5.0
#: seconds after the report that ``matrix_run.json`` does not record: the index of every matrix, the exit
#: (the smoke matrix: 5.4 s from its last cell to its exit, 2.1 s of it the report)
AFTER_REPORT_SECONDS = 3.0


def recorded_seconds(results_root: Path, part: str) -> list[float]:
    """The seconds of ``part`` of the wall time (``wall_time_breakdown``) of each earlier matrix run under
    ``results_root`` that recorded it (``matrix_run.json``)."""
    found = []
    for matrix_dir in sorted(results_root.glob("*/")) if results_root.is_dir() else []:
        try:
            run = read_matrix_run(matrix_dir)
        except (OSError, ValueError):  # a run file this code cannot read: the default serves
            continue
        seconds = ((run.wall_time_breakdown or {}) if run else {}).get(part)
        if isinstance(seconds, (int, float)) and seconds > 0:
            found.append(float(seconds))
    return found


def report_seconds(results_root: Path) -> float:
    """Seconds from a matrix run's last cell to its exit: the median report of the earlier runs under
    ``results_root`` (``matrix_run.json``) plus :data:`AFTER_REPORT_SECONDS`, else :data:`REPORT_SECONDS`."""
    reports = recorded_seconds(results_root, "report")
    return statistics.median(reports) + AFTER_REPORT_SECONDS if reports else REPORT_SECONDS


def server_seconds(results_root: Path) -> float:
    """Seconds of the cell server's start (its imports) in the earlier runs under ``results_root``
    (their median), else 0: a dry run with nothing to time does not start it to find out."""
    starts = recorded_seconds(results_root, "cell_server")
    return statistics.median(starts) if starts else 0.0


def makespan(durations: Iterable[float], jobs: int, busy: Iterable[float] = ()) -> float:
    """Seconds until all of ``durations`` have run, in order, on ``jobs`` slots that each take the next
    as they free (the runner's queue), the slots first busy for ``busy`` seconds (cells running). The
    runner's own rule simulated with a heap (a few lines): not an optimal schedule, so no solver."""
    slots = list(busy)[:jobs]
    slots += [0.0] * (max(1, jobs) - len(slots))
    heapq.heapify(slots)
    for seconds in durations:
        heapq.heapreplace(slots, slots[0] + seconds)
    return max(slots)


# --- in the timing process -----------------------------------------------------------------------

#: the longest a timing waits for the others of its round (a sibling that died never arrives)
COMPANY_WAIT_S = 300.0


@dataclass(frozen=True)
class Company:
    """The timings that run at once (a round of :func:`time_runs`): each marks in ``folder`` when it is
    ready to fit and when its fit is done, and trains untimed until all the others are too, so that every
    timed fit runs beside ``size - 1`` others from its start to its end, as a cell beside the others of
    ``--jobs`` (a timing that ran alone for its last seconds would be timed on a quieter machine)."""

    folder: Path
    size: int
    name: str

    def arrive(self, stage: str) -> None:
        (self.folder / f"{stage}-{self.name}").touch()

    def all_arrived(self, stage: str) -> bool:
        return len(list(self.folder.glob(f"{stage}-*"))) >= self.size


def keep_busy(work: Callable[[], None], done: Callable[[], bool], timeout: float = COMPANY_WAIT_S) -> None:
    """Do ``work`` again and again until ``done()``, at most ``timeout`` seconds."""
    start = time.perf_counter()
    while not done() and time.perf_counter() - start < timeout:
        work()


@dataclass
class _Validation:
    start: float
    end: float
    batches: dict[int, list[float]]  # loader index -> each batch's seconds


@dataclass
class _Recorder:
    """What a Lightning callback (:func:`_recording_callback`) saw of the timing fit."""

    fit_start: float = 0.0
    step_ends: list[float] = field(default_factory=list)
    validations: list[_Validation] = field(default_factory=list)
    curve: float = 0.0
    checkpoint: float = 0.0
    at_end: float = 0.0  # the curve and checkpoint timings, done inside the fit


def step_seconds(step_ends: Sequence[float], validations: Sequence[tuple[float, float]]) -> float:
    """The median seconds between consecutive optimizer steps' ends, each less the validations run
    between them (a validation follows its step's end); the first step, which warms up, is not among them."""
    cycles = []
    for before, after in itertools.pairwise(step_ends):
        inside = sum(end - start for start, end in validations if before <= start and end <= after)
        cycles.append(after - before - inside)
    return statistics.median(cycles) if cycles else 0.0


def validation_seconds(batches: Mapping[int, Sequence[float]], total: float, loader_lengths: Sequence[int]) -> float:
    """A whole validation's seconds from one that ran ``batches`` (loader -> each batch's seconds) in
    ``total``: its time outside the batches (the metrics at its end, BLEU among them) plus each loader's
    mean batch times its length."""
    outside = max(0.0, total - sum(sum(times) for times in batches.values()))
    return outside + sum(
        statistics.fmean(batches[i]) * length for i, length in enumerate(loader_lengths) if batches.get(i)
    )


def _recording_callback(record: _Recorder, checkpoint: Path, curve_items: int):
    """A Lightning callback that fills ``record``; at the end of training (the model still on its
    device) it times a loss-curve point of ``curve_items`` items (0: none) and a checkpoint save."""
    import lightning as L

    class Recording(L.Callback):
        def __init__(self) -> None:
            self._step = -1
            self._batches: dict[int, list[float]] = {}
            self._start = self._batch_start = 0.0

        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self._step = trainer.global_step

        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step != self._step:  # not a micro-batch of gradient accumulation
                self._step = trainer.global_step
                record.step_ends.append(time.perf_counter())

        def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self._start, self._batches = time.perf_counter(), {}

        def on_validation_batch_start(self, *args: Any, **kwargs: Any) -> None:
            self._batch_start = time.perf_counter()

        def on_validation_batch_end(
            self,
            trainer: L.Trainer,
            pl_module: L.LightningModule,
            outputs: Any,
            batch: Any,
            batch_idx: int,
            dataloader_idx: int = 0,
        ) -> None:
            self._batches.setdefault(dataloader_idx, []).append(time.perf_counter() - self._batch_start)

        def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            record.validations.append(_Validation(self._start, time.perf_counter(), self._batches))

        def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            start = time.perf_counter()
            loader = trainer.datamodule.curve_loader(curve_items) if curve_items else None
            if loader is not None:

                def prepare(batch: Any) -> Any:  # as blockbench.cell.callbacks.LossCurve prepares a batch
                    batch = trainer.precision_plugin.convert_input(batch)
                    batch = pl_module._on_before_batch_transfer(batch, dataloader_idx=0)
                    return trainer.strategy.batch_to_device(batch, dataloader_idx=0)

                pl_module.sample_loss(loader, prepare)  # the first warms up
                before = time.perf_counter()
                pl_module.sample_loss(loader, prepare)
                record.curve = time.perf_counter() - before
            before = time.perf_counter()
            trainer.save_checkpoint(checkpoint)
            record.checkpoint = time.perf_counter() - before
            record.at_end = time.perf_counter() - start

    return Recording()


def time_cell(
    run: RunConfig,
    workdir: Path,
    *,
    company: Company | None = None,
    steps: int = TIMED_STEPS,
    batches: int = VALIDATION_BATCHES,
) -> CellTiming:
    """Time the parts of ``run``'s cell in this process (see the module docstring), with the Trainer
    settings a cell has (``blockbench.cell.train``), writing only under ``workdir``, its fit beside the
    others of ``company``. ``process`` is left 0: the process that started this one measures it."""
    import lightning as L
    import torch

    from ...cell.runtime import attention_calls, data_loading, lightning_determinism, machine_settings
    from ...cell.train import resolved_accelerator
    from ...progress import quiet_lightning
    from ...provenance import code_fingerprint

    cfg = run.trainer
    accelerator = resolved_accelerator(cfg.accelerator)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    quiet_lightning()
    record = _Recorder()
    start = time.perf_counter()
    code_fingerprint()  # a cell computes it in its own process (a fork of the server has none yet)
    fingerprint = time.perf_counter() - start
    with machine_settings(cfg, accelerator, attention_calls(run)):
        L.seed_everything(run.seed, workers=True, verbose=False)
        start = time.perf_counter()
        module, datamodule = run.task.build(
            run.resolved_model(),
            run.optimizer,
            max_steps=cfg.max_steps,
            batch_size=cfg.per_device_batch_size(1),
            seed=run.seed,
        )
        datamodule.load_for(**data_loading(cfg, accelerator, 1))
        datamodule.prepare_data()  # the fit's own calls find the data made (the tasks make it once)
        datamodule.setup("fit")
        build = time.perf_counter() - start
        batch = next(iter(datamodule.train_dataloader()))

        def work() -> None:  # a training step's forward and backward, untimed
            module.training_loss(batch).backward()
            module.zero_grad(set_to_none=True)

        if company is not None:
            company.arrive("ready")
            keep_busy(work, lambda: company.all_arrived("ready"))
        start = time.perf_counter()
        callback = _recording_callback(record, workdir / "timing.ckpt", cfg.curve_items if cfg.curve_interval else 0)
        trainer = L.Trainer(
            max_steps=steps,
            val_check_interval=max(1, steps // 2),
            check_val_every_n_epoch=None,
            limit_val_batches=batches,
            num_sanity_val_steps=0,
            gradient_clip_val=cfg.grad_clip,
            accumulate_grad_batches=cfg.accumulate_grad_batches,
            accelerator=accelerator,
            devices=1,
            precision=cfg.resolved_precision(accelerator),
            use_distributed_sampler=False,
            logger=False,
            callbacks=[callback],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(workdir),
            **lightning_determinism(cfg),
        )
        trainer.fit(module, datamodule=datamodule)
        fit = time.perf_counter() - start
        if company is not None:
            company.arrive("done")
            keep_busy(work, lambda: company.all_arrived("done"))
    spans = [(v.start, v.end) for v in record.validations]
    step = step_seconds(record.step_ends, spans)
    validation = 0.0
    if record.validations:
        last = record.validations[-1]  # the first warms up
        loaders = datamodule.val_dataloader()
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        validation = validation_seconds(last.batches, last.end - last.start, [len(loader) for loader in loaders])
    validated = sum(end - start for start, end in spans)
    return CellTiming(
        process=0.0,
        build=build,
        fit=fingerprint + max(0.0, fit - validated - record.at_end - len(record.step_ends) * step),
        step=step,
        validation=validation,
        curve=record.curve,
        checkpoint=record.checkpoint,
        checkpoint_every=cfg.checkpoint_interval(accelerator),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m blockbench.matrix.estimate.timing RUN.yaml OUT.json [ROUND_FOLDER SIZE]``: time the cell of the
    run config in RUN.yaml (:func:`time_cell`, working in OUT.json's folder; beside the SIZE timings of
    the round that mark themselves in ROUND_FOLDER, see :class:`Company`) and write ``{"timing": ...,
    "seconds": ...}`` (this process's seconds until then) or ``{"error": ...}`` to OUT.json; exit 0, or
    1 on an error."""
    started = time.perf_counter()
    arguments = list(argv if argv is not None else sys.argv[1:])
    config, out = arguments[:2]
    company = Company(Path(arguments[2]), int(arguments[3]), Path(out).parent.name) if len(arguments) >= 4 else None
    try:
        run = build_run_config(load_yaml(config), source=config)
        timing = time_cell(run, Path(out).parent, company=company)
    except Exception as error:  # reported by the runner as this variant's problem, not raised there
        write_json(Path(out), {"error": f"{type(error).__name__}: {error}"})
        return 1
    finally:  # the others of the round wait for no timing that failed
        if company is not None:
            company.arrive("ready")
            company.arrive("done")
    write_json(Path(out), {"timing": asdict(timing), "seconds": time.perf_counter() - started})
    return 0


# --- in the runner -------------------------------------------------------------------------------


def timing_environments(jobs: int, gpus: Sequence[str] = ()) -> list[dict[str, str]]:
    """The environments of ``jobs`` timings at once: the runner's slots (``blockbench.matrix.jobs.job_slots``:
    their threads), one GPU each where there are GPUs (round robin)."""
    environments = [slot.environment() for slot in job_slots(jobs)]
    for i, environment in enumerate(environments):
        if gpus:
            environment[VISIBLE] = gpus[i % len(gpus)]
    return environments


def time_runs(
    runs: Mapping[K, RunConfig], environments: Sequence[Mapping[str, str]]
) -> tuple[dict[K, CellTiming], dict[K, str]]:
    """Time the cell of each run (:func:`time_cell`) in a process of its own, in rounds of
    ``len(environments)`` at once (each timing in one of them, as a cell in a slot), forked from the
    runner's preloaded server where the cell would be (else a subprocess, which pays the imports as its
    cell will). The list is padded with repeats to whole rounds, and the timings of a round fit together
    (:class:`Company`), so that every timing has the company its cell will have; a run timed twice gets
    the median of each part. Returns the timings and, for the runs that could not be timed, why."""
    keys = list(runs)
    jobs = max(1, len(environments))
    order = list(itertools.islice(itertools.cycle(keys), -(-len(keys) // jobs) * jobs)) if keys else []
    found: dict[K, list[CellTiming]] = {}
    problems: dict[K, str] = {}
    with tempfile.TemporaryDirectory(prefix="blockbench-timing-") as folder:

        def one(i: int, key: K, environment: Mapping[str, str], round_folder: Path, size: int) -> None:
            workdir = Path(folder) / str(i)
            workdir.mkdir()
            (workdir / "run.yaml").write_text(to_yaml(runs[key]))
            arguments = ["-m", TIMING_MODULE, str(workdir / "run.yaml"), str(workdir / "timing.json")]
            arguments += [str(round_folder), str(size)]
            start = time.perf_counter()
            if forks(runs[key]):
                code = run_forked(arguments, dict(environment), workdir / "log.txt")
            else:
                code = run_subprocess([sys.executable, *arguments], dict(environment), workdir / "log.txt")
            seconds = time.perf_counter() - start
            outcome = _read_outcome(workdir, code)
            if isinstance(outcome, str):
                problems.setdefault(key, outcome)
                return
            timing, inside = outcome
            found.setdefault(key, []).append(CellTiming(**{**asdict(timing), "process": max(0.0, seconds - inside)}))

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for first in range(0, len(order), jobs):  # a round: its timings start together
                round_folder = Path(folder) / f"round{first // jobs}"
                round_folder.mkdir()
                members = list(enumerate(order[first : first + jobs], first))
                futures = [
                    pool.submit(
                        one, i, key, environments[i - first] if environments else {}, round_folder, len(members)
                    )
                    for i, key in members
                ]
                for future in futures:
                    future.result()
    timings = {key: median_timing(values) for key, values in found.items()}
    return timings, {key: why for key, why in problems.items() if key not in timings}


def cell_timer(jobs: int) -> Callable[[Mapping[K, RunConfig]], tuple[dict[K, CellTiming], dict[K, str]]]:
    """:func:`time_runs` in the environments of ``--jobs`` slots on this machine (:func:`timing_environments`)."""
    from ..jobs import gpu_devices

    environments = timing_environments(jobs, gpu_devices())
    return lambda runs: time_runs(runs, environments)


def _read_outcome(workdir: Path, code: int) -> tuple[CellTiming, float] | str:
    """A timing process's timing and its own seconds, or why there is none."""
    try:
        outcome = json.loads((workdir / "timing.json").read_text())
    except (OSError, ValueError):
        log = (
            (workdir / "log.txt").read_text(errors="replace").strip().splitlines()
            if (workdir / "log.txt").exists()
            else []
        )
        return f"the timing process exited with code {code} without a timing" + (f" ({log[-1][:200]})" if log else "")
    if "error" in outcome:
        return str(outcome["error"])
    return CellTiming(**outcome["timing"]), float(outcome["seconds"])


def median_timing(timings: Sequence[CellTiming]) -> CellTiming:
    """Each part's median over ``timings`` of one run."""
    names = [name for name in asdict(timings[0]) if name != "checkpoint_every"]
    parts = {name: statistics.median(getattr(t, name) for t in timings) for name in names}
    return CellTiming(**parts, checkpoint_every=timings[0].checkpoint_every)


if __name__ == "__main__":
    sys.exit(main())
