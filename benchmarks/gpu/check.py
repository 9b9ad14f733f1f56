"""blockbench on a CUDA GPU in one prepared run of at most 7 minutes: the LM loss's two paths, SDPA's
first-call cost per backend, eager and compiled training steps against nanoGPT and HF GPT-2, the smoke
matrix one cell at a time against packed on the GPU, and where each cell's wall time went.

    python benchmarks/gpu_check.py --nanogpt ~/nanoGPT   # every section; writes results/gpu.md and results/gpu.json
    python benchmarks/gpu_check.py --quick               # shorter sections (fewer rounds and steps)
    python benchmarks/gpu_check.py --skip matrix compiled --out -   # some sections, printed only
    python benchmarks/gpu_check.py --plan                # what would run, and each section's time limit; no GPU

On a machine without a CUDA device it prints "no CUDA device: nothing measured; see README" and
exits 0, writing nothing. The sections run in this order, most important first, each within its own
time limit (:data:`BUDGET_S`) and all within ``--budget`` seconds (default 420): a section that runs
out of time is reported as cut (its worker process group is stopped: SIGTERM, then SIGKILL) and the
next starts; one that fails is reported as failed and the others go on (exit status 1).

* **loss**: the LM loss alone at the GPT-2-small shape (16 x 1024 tokens, d 768, vocab 50304): the
  plain ``F.cross_entropy(F.linear(...))`` against the chunked ``models.loss.linear_cross_entropy``, in
  fp32 and bf16 autocast, each against the plain path in float32: the loss's and the gradients'
  relative differences, the milliseconds of a forward and backward, and the peak memory.
* **cudnn**: SDPA's forward and backward with each backend (cuDNN, flash, memory-efficient), each in a
  fresh process, at the attention shapes of the smoke matrix and of ``configs/base.yaml``'s cells: the
  first call against the later ones (cuDNN builds an execution plan per new shape, in every process),
  and after how many calls cuDNN's faster calls repay its first one, against the calls a cell makes.
* **eager**: training steps at the GPT-2-small shape (d 768, 12 layers, 12 heads, context 1024, vocab
  50304, batch 16) of blockbench's LM, nanoGPT's model.py (``--nanogpt PATH``) and HF transformers'
  GPT2LMHeadModel, in bf16 autocast (``--dtypes``), all in one process and timed in interleaved rounds
  (``benchmarks.harness.interleaved``); ratios with a 95% interval over rounds
  (``benchmarks.harness.ratio_interval``). MFU divides by ``blockbench.cell.perf.peak_flops``, the
  trainer's denominator (``--peak-tflops`` overrides it).
* **compiled**: the same with ``torch.compile``: blockbench against nanoGPT (HF GPT-2 without
  ``--nanogpt``), the compilation in the warm-up steps, whose seconds are reported.
* **matrix**: ``configs/matrix/smoke.yaml`` (seed 0, ``trainer.precision: auto``) through
  ``blockbench.matrix.run.run_matrix`` twice, into fresh folders: one cell at a time (``--jobs 1``),
  then packed on the GPU (``--jobs auto``, or ``--jobs``): the matrices' wall times and each cell's.
* **breakdown**: where each cell of the one-at-a-time run spent its wall time (``wall_time_breakdown``:
  start-up, set-up, build, data, Lightning's fit set-up, the FLOP count, the first step's excess over
  the steady ones, the training steps, the loop between them, validation, checkpoints, teardown) and
  the share it attributes; the runner's seconds of each cell beside its record's.
* **gradients** (when time is left): every positional variant's SDPA gradients against the math backend.
* **trainer** (when time is left): the GPT-2-small shape through ``blockbench.cell.train.train``.

Every measurement of the trainer, the matrix and the models goes through the functions a matrix
uses (``build_run_config``, ``train``, ``run_matrix``, ``build_model``), never a copy of them. The
workers (:mod:`benchmarks.gpu.measure`) run each in a fresh process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import ROOT
from benchmarks.gpu import measure
from benchmarks.gpu.gradients import (
    GRADIENT_DIMS,
    GRADIENT_TOLERANCE,
    POSITIONAL_VARIANTS,
    GradientCheck,
    gradient_lines,
    kernel_names,
    positional_gradients,
)
from benchmarks.harness import (
    RATIO_METHOD,
    Ratio,
    command_line,
    machine_facts,
    module_command,
    module_env,
    print_and_write,
    ratio_interval,
    report_header,
)
from benchmarks.parity.implementations import (
    GPT2_SMALL,
    GPT2_SMALL_NAME,
    Dims,
    describe_dims,
    importable,
    load_nanogpt,
    package_versions,
)

__all__ = ["GRADIENT_TOLERANCE", "GradientCheck", "gradient_lines", "kernel_names", "positional_gradients"]

#: what a machine without a CUDA device prints (and nothing else happens)
NO_GPU_MESSAGE = "no CUDA device: nothing measured; see README"

#: the sections, in the order they run (the most important first), with what each measures
SECTIONS: dict[str, str] = {
    "loss": "the LM loss: plain F.cross_entropy(F.linear) against the chunked linear_cross_entropy, against fp32",
    "cudnn": "SDPA's first call against its later calls, per backend (cuDNN, flash, memory-efficient)",
    "eager": "eager training steps at the GPT-2-small shape: blockbench, nanoGPT, HF GPT-2 in interleaved rounds",
    "compiled": "torch.compile'd training steps at the GPT-2-small shape: blockbench against nanoGPT",
    "matrix": "the smoke matrix one cell at a time against packed on the GPU (--jobs auto)",
    "breakdown": "where each smoke cell's wall time went",
    "gradients": "SDPA gradients of every positional variant against the math backend",
    "trainer": "the GPT-2-small shape through blockbench's trainer: throughput, MFU, share of wall time in steps",
}
#: each section's time limit in seconds (its worker processes' start-up included); the first six fit in
#: :data:`TOTAL_BUDGET_S`, the last two run in what the others leave
BUDGET_S: dict[str, float] = {
    "loss": 40,
    "cudnn": 50,
    "eager": 75,
    "compiled": 110,
    "matrix": 140,
    "breakdown": 5,
    "gradients": 20,
    "trainer": 60,
}
#: the whole check's time limit in seconds (``--budget``)
TOTAL_BUDGET_S = 420.0

DTYPES = ("bf16", "fp32", "tf32")
DTYPE_NOTES = {
    "bf16": "bf16 autocast (parameters, gradients and optimizer state fp32)",
    "fp32": 'fp32 with torch.set_float32_matmul_precision("highest") (no TF32)',
    "tf32": 'fp32 with torch.set_float32_matmul_precision("high") (TF32 matmuls)',
}

SMOKE_MATRIX = ROOT / "configs" / "matrix" / "smoke.yaml"
BASE_CONFIG = ROOT / "configs" / "base.yaml"


@dataclass(frozen=True)
class Settings:
    """How long each section measures: the full run's or ``--quick``'s."""

    rounds: int  # eager and compiled: interleaved rounds (3 at least: an interval needs them)
    warmup: int  # eager and compiled: untimed steps per implementation (compilation among them)
    min_steps: int
    max_steps: int
    min_seconds: float
    trainer_steps: int  # the trainer run's optimizer steps
    matrix_seeds: tuple[int, ...] | None  # None: the smoke matrix's own seeds
    calls: int  # loss and SDPA: timed calls


FULL = Settings(
    rounds=5, warmup=5, min_steps=10, max_steps=40, min_seconds=1.0, trainer_steps=300, matrix_seeds=(0,), calls=20
)
QUICK = Settings(
    rounds=3, warmup=3, min_steps=5, max_steps=20, min_seconds=0.5, trainer_steps=60, matrix_seeds=(0,), calls=10
)


class SectionCut(Exception):
    """A section ran out of its time: reported as cut, and the next section starts."""


# ------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class PlannedSection:
    """One section as it would run: what, at which shape, the runs it makes, and its time limit."""

    name: str
    what: str
    shape: str
    runs: tuple[str, ...]
    limit_s: float
    notes: tuple[str, ...] = ()


def reference_impls(nanogpt: str | None) -> tuple[list[str], list[str]]:
    """The references the eager section times, and a line for each it cannot time here."""
    impls, not_run = [], []
    if nanogpt:
        impls.append("nanogpt")
    else:
        not_run.append("nanogpt not run: pass --nanogpt PATH (nanoGPT's model.py, or the folder of a clone of it)")
    if importable("transformers"):
        impls.append("hf_gpt2")
    else:
        not_run.append('hf_gpt2 not run: transformers is not installed (pip install -e ".[bench]")')
    return impls, not_run


def compiled_impls(nanogpt: str | None) -> list[str]:
    """blockbench and the compiled section's reference: nanoGPT, else HF GPT-2, else none."""
    references, _ = reference_impls(nanogpt)
    return ["blockbench", *references[:1]]


def trainer_overrides(steps: int, compile: bool, dims: Dims = GPT2_SMALL) -> dict[str, Any]:
    """The dotted overrides of ``configs/base.yaml`` for the trainer runs: the GPT-2-small model on the
    embedded LM task at its context, ``steps`` steps, validation at the end, every other setting the
    default a user gets (precision auto, checkpoints, logging)."""
    rows = steps * dims.batch + 64  # one epoch covers the run: no epoch boundary in the timed steps
    return {
        "task": {
            "name": "lm",
            "seq_len": dims.seq_len,
            "n_train_tokens": rows * (dims.seq_len + 1),
            "n_val_tokens": 16 * (dims.seq_len + 1),
            "n_probes": 128,
        },
        "model.d_model": dims.d_model,
        "model.n_layers": dims.n_layers,
        "model.n_heads": dims.n_heads,
        "model.d_ff": dims.d_ff,
        "model.activation": "gelu",
        "model.norm": "layernorm",
        "model.norm_placement": "pre",
        "model.pos_encoding": "learned",
        "model.bias": True,
        "model.tie_embeddings": True,
        "model.dropout": 0.0,
        "model.compile": compile,
        "trainer.batch_size": dims.batch,
        "trainer.max_steps": steps,
        "trainer.val_every_n_steps": steps,
        "trainer.precision": "auto",
        "optimizer.warmup_steps": min(30, steps // 2),
    }


def trainer_run_config(steps: int, compile: bool, dims: Dims = GPT2_SMALL):
    """The RunConfig of a trainer run, built as every cell's is (``build_run_config``)."""
    from blockbench.config import build_run_config, load_yaml

    return build_run_config(load_yaml(BASE_CONFIG), trainer_overrides(steps, compile, dims), source="gpu_check")


def smoke_matrix_file(folder: Path, seeds: Iterable[int] | None = None) -> Path:
    """``configs/matrix/smoke.yaml`` written to ``folder`` with ``trainer.precision: auto`` set
    explicitly (the default, so the cells' configs and hashes are the matrix's own), its base made
    absolute and, with ``seeds``, only those seeds."""
    import yaml

    from blockbench.config import load_yaml

    raw = load_yaml(SMOKE_MATRIX)
    raw["base"] = str((SMOKE_MATRIX.parent / raw["base"]).resolve())
    raw.setdefault("overrides", {})["trainer.precision"] = "auto"
    if seeds is not None:
        raw["axes"]["seed"] = list(seeds)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SMOKE_MATRIX.name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def smoke_cells(seeds: Iterable[int] | None = None) -> list:
    """The smoke matrix's cells as ``run_matrix`` expands them (``expand_matrix``), validated."""
    from blockbench.matrix.expand import expand_matrix

    with tempfile.TemporaryDirectory() as folder:
        return expand_matrix(smoke_matrix_file(Path(folder), seeds)).cells


def _trainer_shape(run) -> str:
    model = run.resolved_model()
    return (
        f"blockbench decoder_lm d {model.d_model}, {model.n_layers} layers, {model.n_heads} heads, context "
        f"{run.task.seq_len}, vocab {model.vocab_size} (the lm task's), batch {run.trainer.batch_size}, "
        f"precision {run.trainer.precision}"
    )


def book_attention_shapes() -> list[dict[str, Any]]:
    """The attention shapes of the smoke matrix's cells and of ``configs/base.yaml``'s (the book's
    default size) per task: batch, heads, sequence, head size, whether causal, and the SDPA calls
    a cell makes (a forward and backward per attention layer and step)."""
    from blockbench.config import build_run_config, load_yaml

    runs = [("smoke", cell.run) for cell in smoke_cells([0])]
    base = load_yaml(BASE_CONFIG)
    tasks = dict.fromkeys(run.task.name for _, run in runs)
    runs += [("base", build_run_config({**base, "task": {"name": task}}, source=str(BASE_CONFIG))) for task in tasks]
    shapes: dict[str, dict[str, Any]] = {}
    for source, run in runs:
        model = run.resolved_model()
        layers = model.n_layers * (3 if model.family == "encoder_decoder" else 1)  # encoder, decoder, cross
        head_dim = model.d_model // model.n_heads
        batch = run.trainer.per_device_batch_size(1)
        vit = model.family == "vit" and model.image_size
        seq = (model.image_size // model.patch_size) ** 2 + 1 if vit else model.max_seq_len  # patches and CLS
        label = f"{run.task.name} ({source}): batch {batch}, {model.n_heads} heads, seq {seq}"
        label += f", head {head_dim}"
        shapes.setdefault(
            label,
            {
                "label": label,
                "batch": batch,
                "heads": model.n_heads,
                "seq": seq,
                "head_dim": head_dim,
                "causal": model.family != "vit",
                "calls_per_cell": layers * run.trainer.max_steps,
            },
        )
    return list(shapes.values())


def plan(args: argparse.Namespace) -> list[PlannedSection]:
    """Every section not skipped, as it would run with ``args``: needs no GPU (the trainer config and
    the matrix are validated as the trainer and the runner validate them)."""
    settings = QUICK if args.quick else FULL
    skip = set(args.skip or ())
    references, not_run = reference_impls(args.nanogpt)
    gpt2 = describe_dims(GPT2_SMALL)
    rounds = f"{settings.rounds} interleaved rounds in one process"
    described: dict[str, Callable[[], tuple[str, tuple[str, ...], tuple[str, ...]]]] = {
        "loss": lambda: (
            f"{GPT2_SMALL.batch * GPT2_SMALL.seq_len} tokens, d {GPT2_SMALL.d_model}, vocab {GPT2_SMALL.vocab}",
            ("plain fp32", "plain bf16", "chunked fp32", "chunked bf16"),
            ("against the plain path in float32 at the highest matmul precision",),
        ),
        "cudnn": lambda: (
            "; ".join(shape["label"] for shape in book_attention_shapes()),
            ("cudnn", "flash", "efficient"),
            ("each backend in a fresh process",),
        ),
        "eager": lambda: (
            gpt2,
            tuple(f"{impl} {dtype}" for impl in ["blockbench", *references] for dtype in args.dtypes),
            (rounds, *not_run),
        ),
        "compiled": lambda: (
            gpt2,
            tuple(f"{impl} {dtype} compiled" for impl in compiled_impls(args.nanogpt) for dtype in args.dtypes),
            (rounds, "torch.compile in the warm-up steps"),
        ),
        "matrix": lambda: _matrix_shape(settings, args.jobs),
        "breakdown": lambda: ("the matrix section's cells", (), ("read from their records: nothing runs",)),
        "gradients": lambda: (
            describe_dims(GRADIENT_DIMS),
            tuple(f"{variant} {dtype}" for variant in POSITIONAL_VARIANTS for dtype in ("fp32", "bf16")),
            (),
        ),
        "trainer": lambda: (
            _trainer_shape(trainer_run_config(settings.trainer_steps, compile=False)),
            (f"blockbench.cell.train.train, {settings.trainer_steps} steps",),
            (),
        ),
    }
    planned = []
    for name in SECTIONS:
        if name not in skip:
            shape, runs, notes = described[name]()
            planned.append(PlannedSection(name, SECTIONS[name], shape, runs, BUDGET_S[name], notes))
    return planned


def _matrix_shape(settings: Settings, jobs: int | str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    cells = smoke_cells(settings.matrix_seeds)
    model, trainer = cells[0].run.model, cells[0].run.trainer
    tasks = ", ".join(dict.fromkeys(cell.task for cell in cells))
    shape = (
        f"the smoke matrix's models (d {model.d_model}, {model.n_layers} layers, {trainer.max_steps} steps) on {tasks}"
    )
    return shape, ("--jobs 1", f"--jobs {jobs}"), (f"{len(cells)} cells each run, trainer.precision auto",)


def format_plan(planned: list[PlannedSection], budget: float = TOTAL_BUDGET_S) -> str:
    lines = ["| section | shape | runs | time limit |", "|---|---|---|---|"]
    for section in planned:
        lines.append(
            f"| {section.name} | {section.shape} | {len(section.runs)}: {', '.join(section.runs)} | "
            f"{section.limit_s:.0f} s |"
        )
    notes = [f"- {section.name}: {note}" for section in planned for note in section.notes]
    return "\n".join(
        [
            *lines,
            "",
            *notes,
            f"- in this order, each within its limit, all within {budget / 60:.1f} min: a section that runs out of "
            "time is cut and the next starts",
        ]
    )


# ---------------------------------------------------------------------------------- workers
def run_worker(kind: str, spec: dict[str, Any], timeout: float) -> dict[str, Any] | str:
    """Run this module with ``--worker kind`` in a fresh process (a process group of its own); its
    record, or why it failed. Past ``timeout`` seconds the group is stopped (:func:`stop_group`) and
    :class:`SectionCut` raised."""
    label = f"{kind} {spec.get('label', '')}".strip()
    if timeout <= 0:
        raise SectionCut(f"no time left for {label}")
    command = module_command(__spec__.name, "--worker", kind, "--spec", json.dumps(spec))
    env = module_env({**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=None if math.isinf(timeout) else timeout)
    except subprocess.TimeoutExpired:
        stop_group(process)
        raise SectionCut(f"{label} did not finish in the {timeout:.0f} s left to its section") from None
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (stderr or stdout).strip().splitlines()[-3:]
    return f"{label} failed (exit {process.returncode}): " + " | ".join(tail)


def stop_group(process: subprocess.Popen, grace: float = 15.0) -> None:
    """Stop a worker and everything it started (a matrix run's cell processes): SIGTERM to its process
    group (a matrix run stops its cells on it, as on a scheduler's), SIGKILL after ``grace`` seconds."""
    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.communicate(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # what the worker left running (the cell server)
        os.killpg(process.pid, signal.SIGKILL)


def trainer_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One trainer run (``blockbench.cell.train.train``) of the GPT-2-small config; its record's figures."""
    from blockbench.cell.train import train

    run = trainer_run_config(spec["steps"], spec["compile"], Dims(**spec["dims"]))
    out = Path(spec["out"])
    record = train(run, out, tb_dir=out / "tb", tb_name=GPT2_SMALL_NAME, tb_version="0", from_process_start=True)
    performance = record.performance
    return {
        "label": spec["label"],
        "compile": spec["compile"],
        "status": record.status,
        "error": record.error,
        "steps": record.steps,
        "parameters": record.parameters,
        "precision": record.precision,
        "throughput": record.throughput,
        "throughput_unit": record.throughput_unit,
        "step_ms_median": performance.step_time_ms.median if performance and performance.step_time_ms else None,
        "achieved_tflops": performance.achieved_tflops if performance else None,
        "peak_tflops": performance.peak_tflops if performance else None,
        "peak_source": performance.peak_source if performance else None,
        "mfu": performance.mfu if performance else None,
        "wall_time_s": record.wall_time_s,  # from the start of training
        "process_s": (record.wall_time_breakdown or {}).get("total"),  # from the process start
        "wall_time_breakdown": record.wall_time_breakdown,
        "peak_memory": record.peak_memory,
        # what the trainer resolved for the machine (TF32, AdamW, workers, checkpoints), where the record has it
        "runtime": runtime.model_dump() if (runtime := getattr(record, "runtime", None)) is not None else None,
        "out": str(out),
    }


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "loss": measure.loss_worker,
    "cudnn": measure.cudnn_worker,
    "rounds": measure.rounds_worker,
    "matrix": measure.matrix_worker,
    "trainer": trainer_worker,
}


# --------------------------------------------------------------------------------- sections
@dataclass
class Section:
    """A section's outcome: its markdown, a one-line headline for the summary table, its figures;
    ``cut``: it ran out of time."""

    name: str
    headline: str
    lines: list[str]
    data: dict[str, Any] = field(default_factory=dict)
    failed: bool = False
    seconds: float = 0.0
    cut: bool = False


@dataclass
class Context:
    """What the sections share. A GPU run takes the defaults; the tests run the sections on a CPU at
    tiny shapes through the same code (``device``, the shapes, ``in_process`` workers, a small matrix)."""

    args: argparse.Namespace
    settings: Settings
    runs: Path  # where the trainer run and the matrices write
    device: str = "cuda"
    dims: Dims = GPT2_SMALL  # the loss's, the eager and compiled sections' and the trainer's model
    gradient_dims: Dims = GRADIENT_DIMS
    gradient_dtypes: tuple[str, ...] = ("fp32", "bf16")
    loss_dtypes: tuple[str, ...] = ("fp32", "bf16")
    sdpa_backends: tuple[str, ...] = ("cudnn", "flash", "efficient")
    attention_shapes: list[dict[str, Any]] | None = None  # None: book_attention_shapes()
    compile_backend: str = "inductor"
    matrix_file: Path | None = None  # None: the smoke matrix with the settings' seeds
    in_process: bool = False  # run the workers in this process (tests: no time limit then)
    deadline: float = math.inf  # the current section's end (time.perf_counter)
    matrix: dict[str, Any] = field(default_factory=dict)  # the matrix section's runs, for the breakdown

    def left(self) -> float:
        """Seconds left to the current section."""
        return self.deadline - time.perf_counter()

    def worker(self, kind: str, spec: dict[str, Any]) -> dict[str, Any] | str:
        """A worker's record (its spec and record through JSON, as between processes), or why it failed."""
        if self.in_process:
            return json.loads(json.dumps(WORKERS[kind](json.loads(json.dumps(spec)))))
        return run_worker(kind, spec, self.left())


def make_context(args: argparse.Namespace) -> Context:
    """The context of a GPU run: the default shapes, the runs in ``--runs`` or a temporary folder."""
    runs = Path(args.runs) if args.runs else Path(tempfile.mkdtemp(prefix="gpu_check-"))
    return Context(args, QUICK if args.quick else FULL, runs)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _pct(value: float | None) -> str:
    """A share in percent, with two significant digits below 1% (a smoke cell's MFU on a GPU is
    about 0.02%, which one decimal shows as 0.0%)."""
    if value is None:
        return "–"
    return f"{value:.1%}" if value == 0 or abs(value) >= 0.01 else f"{100 * value:.2g}%"


def _interval(ratio: Ratio) -> str:
    return "–" if ratio.low is None else f"{ratio.low:.2f}–{ratio.high:.2f}"


def _failed(name: str, intro: list[str], error: str) -> Section:
    return Section(name, "failed", [*intro, f"Failed: {error}"], {"error": error}, failed=True)


def _gib(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _calls(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:,.0f}"


def section_loss(ctx: Context) -> Section:
    d = ctx.dims
    spec = {
        "label": "loss",
        "device": ctx.device,
        "tokens": d.batch * d.seq_len,
        "d_model": d.d_model,
        "vocab": d.vocab,
        "dtypes": list(ctx.loss_dtypes),
        "calls": ctx.settings.calls,
    }
    intro = [
        f"The LM loss alone at {spec['tokens']} tokens, d {d.d_model}, vocab {d.vocab} on {ctx.device}: forward and "
        "backward of the plain `F.cross_entropy(F.linear(hidden, weight), targets)` and of the chunked "
        "`models.loss.linear_cross_entropy`, each against the plain path in float32 at the highest matmul precision "
        f"(relative = max |difference| / max |reference|; agreement: loss <= {measure.LOSS_TOLERANCE['bf16']:g} and "
        f"gradients <= {measure.GRAD_TOLERANCE['bf16']:g} in bf16, <= {measure.LOSS_TOLERANCE['fp32']:g} and "
        f"<= {measure.GRAD_TOLERANCE['fp32']:g} in fp32). Milliseconds: median of {ctx.settings.calls} synchronised "
        "calls after 2 warm-up calls; memory: the peak allocated above what was allocated before the calls.",
        "",
    ]
    outcome = ctx.worker("loss", spec)
    if isinstance(outcome, str):
        return _failed("loss", intro, outcome)
    rows = outcome["rows"]
    lines = [
        *intro,
        "| path | dtype | loss (relative) | d hidden (relative) | d weight (relative) | ms (median) | peak memory GiB "
        "| agrees |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['path']} | {r['dtype']} | {r['loss']:.1e} | {r['grad_hidden']:.1e} | {r['grad_weight']:.1e} | "
        f"{r['ms']:.2f} | {_gib(r['memory_gib'])} | "
        f"{'yes' if r['agrees'] else '**NO**'} |"
        for r in rows
    ]
    by = {(r["path"], r["dtype"]): r for r in rows}
    dtype = ctx.loss_dtypes[-1]
    plain, chunked = by[("plain", dtype)], by[("chunked", dtype)]
    headline = (
        f"{dtype}: chunked {chunked['ms']:.1f} ms against plain {plain['ms']:.1f} ms "
        f"({chunked['ms'] / plain['ms']:.2f}x); "
        + ("all agree with fp32" if all(r["agrees"] for r in rows) else "some differ from fp32")
    )
    return Section("loss", headline, lines, {"rows": rows}, failed=not all(r["agrees"] for r in rows))


def cudnn_verdicts(results: dict[str, dict[str, Any]], shapes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per shape, whether cuDNN's SDPA pays in a cell: its first call's excess over its later calls,
    less that of the fastest other backend, repaid by its later calls' saving against that backend's
    after ``pays_after`` calls (infinite where it saves nothing); it pays where a cell makes as many.
    ``rule``: whether the cells' own rule (``blockbench.cell.runtime.cudnn_attention_pays``) lets
    cuDNN run at the shape's calls; ``agrees``: the rule's choice is the measurement's."""
    from blockbench.cell.runtime import cudnn_attention_pays

    verdicts = []
    for shape in shapes:
        timed = {
            backend: row
            for backend, out in results.items()
            for row in out.get("results", [])
            if row["label"] == shape["label"] and "first_ms" in row
        }
        cudnn = timed.pop("cudnn", None)
        if cudnn is None or not timed:
            continue
        other_name, other = min(timed.items(), key=lambda item: item[1]["median_ms"])
        extra = (cudnn["first_ms"] - cudnn["median_ms"]) - (other["first_ms"] - other["median_ms"])
        saving = other["median_ms"] - cudnn["median_ms"]
        pays_after = max(0.0, extra) / saving if saving > 0 else math.inf
        rule = cudnn_attention_pays(shape["calls_per_cell"])
        verdicts.append(
            {
                "rule": rule,
                "agrees": rule == (pays_after <= shape["calls_per_cell"]),
                "label": shape["label"],
                "against": other_name,
                "first_call_extra_ms": extra,
                "saving_ms": saving,
                "pays_after": pays_after,
                "calls_per_cell": shape["calls_per_cell"],
                "pays": pays_after <= shape["calls_per_cell"],
            }
        )
    return verdicts


def section_cudnn(ctx: Context) -> Section:
    from blockbench.cell.runtime import CUDNN_SDPA_MIN_CALLS

    shapes = ctx.attention_shapes or book_attention_shapes()
    intro = [
        "SDPA forward and backward (`F.scaled_dot_product_attention(...).sum().backward()`) under "
        "`sdpa_kernel(<backend>)`, each backend in a fresh process (the device's context made first), at the "
        f"attention shapes of the smoke matrix's and `configs/base.yaml`'s cells, one after another: the first call "
        f"(for the first shape the backend's set-up in the process too; for each new shape, e.g., cuDNN's execution "
        f"plan) against the median of {ctx.settings.calls} later calls, synchronised. cuDNN pays in a cell where its "
        "later calls' saving against the fastest other backend repays its larger first call within the SDPA calls "
        "the cell makes (a forward and backward per attention layer and step).",
        "",
    ]
    results: dict[str, dict[str, Any]] = {}
    failures = []
    for backend in ctx.sdpa_backends:
        spec = {
            "label": backend,
            "device": ctx.device,
            "backend": backend,
            "shapes": shapes,
            "calls": ctx.settings.calls,
        }
        outcome = ctx.worker("cudnn", spec)
        if isinstance(outcome, str):
            failures.append(outcome)
        else:
            results[backend] = outcome
    lines = [*intro, "| shape | backend | first call ms | later calls ms (median) | first call's excess ms |"]
    lines.append("|---|---|---|---|---|")
    for shape in shapes:
        for backend, outcome in results.items():
            for row in outcome["results"]:
                if row["label"] != shape["label"]:
                    continue
                if "error" in row:
                    lines.append(f"| {shape['label']} | {backend} | not available: {row['error']} | – | – |")
                else:
                    first, median = row["first_ms"], row["median_ms"]
                    lines.append(
                        f"| {shape['label']} | {backend} | {first:.2f} | {median:.3f} | {first - median:.2f} |"
                    )
    verdicts = cudnn_verdicts(results, shapes)
    if verdicts:
        lines += [
            "",
            "| shape | against | cuDNN's first call, extra ms | saving per call ms | pays after calls | "
            "calls in a cell | pays | the cells' rule | agrees |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {v['label']} | {v['against']} | {v['first_call_extra_ms']:.2f} | {v['saving_ms']:.4f} | "
            f"{_calls(v['pays_after'])} | "
            f"{v['calls_per_cell']:,} | {'yes' if v['pays'] else 'no'} | {'cuDNN on' if v['rule'] else 'cuDNN off'} | "
            f"{'yes' if v['agrees'] else '**NO**'} |"
            for v in verdicts
        ]
        lines += [
            "",
            "- the cells' rule: SDPA may use cuDNN only in a cell of at least "
            f"{CUDNN_SDPA_MIN_CALLS:,} SDPA calls (`blockbench.cell.runtime.CUDNN_SDPA_MIN_CALLS`)",
        ]
    lines += ["", *[f"- failed: {failure}" for failure in failures]] if failures else []
    paying, disagree = sum(v["pays"] for v in verdicts), sum(not v["agrees"] for v in verdicts)
    headline = (
        f"cuDNN pays in {paying} of {len(verdicts)} shapes; the cells' rule "
        + ("agrees" if not disagree else f"disagrees at {disagree}")
        if verdicts
        else f"timed {', '.join(results) or 'nothing'}"
    )
    return Section(
        "cudnn",
        headline,
        lines,
        {"results": results, "verdicts": verdicts, "failures": failures},
        failed=bool(failures),
    )


def _rounds_section(ctx: Context, name: str, impls: list[str], compile: bool, notes: list[str]) -> Section:
    """The eager or the compiled section: ``impls`` timed in one process per dtype in interleaved rounds
    (:func:`benchmarks.gpu.measure.rounds_worker`), blockbench's throughput over each reference's."""
    settings = ctx.settings
    intro = [
        f"Shape: {describe_dims(ctx.dims)}. Step: zero_grad + forward + loss + backward + fused AdamW step "
        "(`benchmarks.speed.throughput.build_training_step`)"
        + (f", the model `torch.compile`d (backend {ctx.compile_backend})" if compile else "")
        + f"; every implementation built in one process, {settings.warmup} warm-up steps each"
        + (" (compilation)" if compile else "")
        + f", then {settings.rounds} interleaved rounds (each implementation once a round, the order reversed every "
        f"other round) of >= {settings.min_steps} steps and >= {settings.min_seconds:g} s (at most "
        f"{settings.max_steps}). MFU = achieved / peak FLOP/s, the peak from `blockbench.cell.perf.peak_flops` "
        "(the trainer's denominator) unless `--peak-tflops`. Peak memory: during an implementation's steps, the "
        "others' weights resident too.",
        "",
        *[f"- {DTYPE_NOTES[d]}: rows `{d}`" for d in ctx.args.dtypes],
        *[f"- {note}" for note in notes],
        "",
        "| implementation | dtype | parameters | warm-up s | step ms (median) | tokens/s | achieved TFLOP/s | MFU "
        "| peak memory GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    runs, ratios, failures = [], [], []
    for dtype in ctx.args.dtypes:
        spec = {
            "label": f"{name} {dtype}",
            "device": ctx.device,
            "impls": impls,
            "dims": asdict(ctx.dims),
            "dtype": dtype,
            "rounds": settings.rounds,
            "warmup": settings.warmup,
            "min_steps": settings.min_steps,
            "max_steps": settings.max_steps,
            "min_seconds": settings.min_seconds,
            "peak_tflops": ctx.args.peak_tflops,
            "nanogpt": ctx.args.nanogpt,
            "compile": compile,
            "compile_backend": ctx.compile_backend,
        }
        outcome = ctx.worker("rounds", spec)
        if isinstance(outcome, str):
            failures.append(outcome)
            continue
        runs += outcome["runs"]
        ours = outcome["runs"][0]
        for theirs in outcome["runs"][1:]:
            ratio = ratio_interval(
                dict(enumerate(ours["round_medians_ms"])), dict(enumerate(theirs["round_medians_ms"]))
            )
            ratios.append({"dtype": dtype, "reference": theirs["impl"], **asdict(ratio), "verdict": ratio.verdict})
    lines = intro + [
        f"| {r['impl']} | {r['dtype']} | {r['parameters']:,} | {r['warmup_s']:.1f} | {r['step_ms']:.1f} | "
        f"{r['throughput']:,.0f} | {_ms(r['achieved_tflops'])} | {_pct(_mfu(r))} | {_gib(r['memory_gib'])} |"
        for r in runs
    ]
    if ratios:
        lines += [
            "",
            f"Ours / theirs (throughput), with a 95% interval over rounds ({RATIO_METHOD}); an interval that "
            "includes 1 is a tie.",
            "",
            "| dtype | reference | ours / theirs | 95% interval | verdict |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {x['dtype']} | {x['reference']} | **{x['ratio']:.2f}** | {_interval(Ratio(**x_ratio(x)))} | "
            f"{x['verdict']} |"
            for x in ratios
        ]
    lines += [f"- **{r['impl']}**: {r['note']}" for r in runs if r["dtype"] == ctx.args.dtypes[0]]
    lines += ["", *[f"- failed: {failure}" for failure in failures]] if failures else []
    headline = "; ".join(f"{x['dtype']} ours/{x['reference']} {x['ratio']:.2f} ({x['verdict']})" for x in ratios)
    headline = headline or "; ".join(f"{r['impl']} {r['dtype']} {r['step_ms']:.1f} ms" for r in runs) or "nothing timed"
    data = {"runs": runs, "ratios": ratios, "failures": failures}
    return Section(name, headline, lines, data, failed=bool(failures) or not runs)


def x_ratio(row: dict[str, Any]) -> dict[str, Any]:
    """The :class:`benchmarks.harness.Ratio` fields of a ratio row."""
    return {name: row[name] for name in Ratio.__dataclass_fields__}


def _mfu(run: dict[str, Any]) -> float | None:
    if not run.get("achieved_tflops") or not run.get("peak_tflops"):
        return None
    mfu = run["achieved_tflops"] / run["peak_tflops"]
    return None if mfu > 1 else mfu


def section_eager(ctx: Context) -> Section:
    references, not_run = reference_impls(ctx.args.nanogpt)
    return _rounds_section(ctx, "eager", ["blockbench", *references], False, not_run)


def section_compiled(ctx: Context) -> Section:
    impls = compiled_impls(ctx.args.nanogpt)
    notes = [] if len(impls) > 1 else ["no reference: pass --nanogpt PATH, or install transformers"]
    return _rounds_section(ctx, "compiled", impls, True, notes)


#: the matrix section's two runs: one cell at a time, then packed (``--jobs`` of the check, auto by default)
MATRIX_RUNS = ("serial", "packed")


def section_matrix(ctx: Context) -> Section:
    path = ctx.matrix_file or smoke_matrix_file(ctx.runs / "matrix_file", ctx.settings.matrix_seeds)
    jobs = {"serial": 1, "packed": ctx.args.jobs}
    intro = [
        f"`blockbench.matrix.run.run_matrix` on `{path.name}` (`trainer.precision: auto`) twice, each into a fresh "
        f"results folder under `{ctx.runs}`: one cell at a time (`--jobs 1`), then packed (`--jobs {ctx.args.jobs}`: "
        "single-GPU cells share a GPU where their memory fits, the CPU cores split between them). Matrix seconds: "
        "the run's process, as `matrix_run.json` records it; a cell's: its process as the runner saw it.",
        "",
    ]
    ctx.matrix = {}
    failures = []
    for label in MATRIX_RUNS:
        spec = {"label": label, "matrix": str(path), "root": str(ctx.runs / label), "jobs": jobs[label]}
        outcome = ctx.worker("matrix", spec)
        if isinstance(outcome, str):
            failures.append(outcome)
            continue
        ctx.matrix[label] = outcome
    lines = [*intro, "| run | cells at once | cells ok | matrix s | cells' seconds (sum) |", "|---|---|---|---|---|"]
    for label, run in ctx.matrix.items():
        ok = sum(cell["status"] == "ok" for cell in run["cells"])
        cell_seconds = sum(cell["runner_s"] or 0.0 for cell in run["cells"])
        lines.append(
            f"| {label} | {run['jobs']} | {ok}/{len(run['cells'])} | {run['wall_time_s'] or run['seconds']:.0f} | "
            f"{cell_seconds:.0f} |"
        )
    lines += ["", "| cell | " + " | ".join(f"{label} status | step ms | cell s" for label in ctx.matrix) + " |"]
    lines.append("|---|" + "---|---|---|" * len(ctx.matrix))
    keys = [cell["key"] for run in ctx.matrix.values() for cell in run["cells"]]
    for key in dict.fromkeys(keys):
        row = [key]
        for run in ctx.matrix.values():
            cell = next((c for c in run["cells"] if c["key"] == key), {})
            row += [str(cell.get("status")), _ms(cell.get("step_ms")), _ms(cell.get("runner_s"))]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", *[f"- failed: {failure}" for failure in failures]] if failures else []
    serial, packed = ctx.matrix.get("serial"), ctx.matrix.get("packed")
    if serial and packed:
        speedup = (serial["wall_time_s"] or serial["seconds"]) / (packed["wall_time_s"] or packed["seconds"])
        headline = (
            f"packed ({packed['jobs']} at once) {packed['wall_time_s']:.0f} s against one at a time "
            f"{serial['wall_time_s']:.0f} s: {speedup:.2f}x"
        )
    else:
        headline = "one run only" if ctx.matrix else "no run"
    bad = failures or any(
        run["exit_code"] != 0 or any(c["status"] != "ok" for c in run["cells"]) for run in ctx.matrix.values()
    )
    return Section("matrix", headline, lines, {"runs": ctx.matrix, "failures": failures}, failed=bool(bad))


#: the share of a cell's wall time its breakdown must attribute to named parts
ATTRIBUTED_SHARE = 0.9


def attributed_share(breakdown: dict[str, Any]) -> float | None:
    """The share of a cell's wall time its breakdown attributes to named parts: 1 - other / total."""
    total = breakdown.get("total")
    return None if not total else 1.0 - (breakdown.get("other") or 0.0) / total


def section_breakdown(ctx: Context) -> Section:
    from blockbench.walltime import CELL_PARTS

    label = next((label for label in MATRIX_RUNS if label in ctx.matrix), None)
    if label is None:
        return Section("breakdown", "nothing to break down: the matrix section ran no cell", [], cut=True)
    cells = [cell for cell in ctx.matrix[label]["cells"] if cell.get("breakdown")]
    parts = ["startup", *CELL_PARTS, "other"]
    lines = [
        f"Each cell of the matrix section's `{label}` run: the seconds of each part of its wall time "
        "(`result.json` `wall_time_breakdown`, from its process's start to its result; `other` is what no part "
        "holds), the share the parts attribute, and the cell's seconds as the runner saw them (its process, fork "
        "to exit: `after` is the time after the result, the process's exit among it).",
        "",
        "| cell | "
        + " | ".join(part.replace("_", " ") for part in parts)
        + " | total | attributed | runner s | after |",
        "|---|" + "---|" * (len(parts) + 4),
    ]
    shares = []
    for cell in cells:
        breakdown = cell["breakdown"]
        share = attributed_share(breakdown)
        shares.append(share or 0.0)
        after = None if cell["runner_s"] is None else cell["runner_s"] - breakdown["total"]
        values = [_seconds(breakdown.get(part)) for part in parts]
        lines.append(
            f"| {cell['key']} | {' | '.join(values)} | {breakdown['total']:.2f} | {_pct(share)} | "
            f"{_ms(cell['runner_s'])} | {_seconds(after)} |"
        )
    if not shares:
        return Section("breakdown", "no cell recorded a breakdown", lines, failed=True)
    means = {part: statistics.fmean(cell["breakdown"].get(part) or 0.0 for cell in cells) for part in parts}
    largest = max((part for part in parts if part != "other"), key=means.__getitem__)
    headline = (
        f"{min(shares):.0%} to {max(shares):.0%} of each cell's wall time attributed; the largest part: {largest} "
        f"({means[largest]:.1f} s a cell)"
    )
    low = [cell["key"] for cell, share in zip(cells, shares, strict=True) if share < ATTRIBUTED_SHARE]
    lines += ["", f"- below {ATTRIBUTED_SHARE:.0%} attributed: {', '.join(low)}"] if low else []
    return Section("breakdown", headline, lines, {"run": label, "cells": cells, "means": means}, failed=bool(low))


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def section_gradients(ctx: Context) -> Section:
    checks: list[GradientCheck] = []
    for variant in POSITIONAL_VARIANTS:
        if ctx.left() <= 0:
            raise SectionCut(f"after {len(checks)} of {2 * len(POSITIONAL_VARIANTS)} checks")
        checks += positional_gradients(ctx.device, ctx.gradient_dims, ctx.gradient_dtypes, variants=[variant])
    lines = gradient_lines(checks, ctx.device, ctx.gradient_dims)
    disagree = [f"{c.variant} {c.dtype}" for c in checks if not c.agrees]
    headline = f"all {len(checks)} agree" if not disagree else f"differ: {', '.join(disagree)}"
    data = {"checks": [asdict(c) for c in checks]}
    return Section("gradients", headline, lines, data, failed=bool(disagree))


def _trainer_run(ctx: Context) -> dict[str, Any] | str:
    spec = {
        "label": "trainer",
        "steps": ctx.settings.trainer_steps,
        "compile": False,
        "dims": asdict(ctx.dims),
        "out": str(ctx.runs / "trainer"),
    }
    return ctx.worker("trainer", spec)


def train_step_share(breakdown: dict[str, Any] | None) -> float | None:
    """The share of a run's wall time spent in training steps: ``train_steps / total``."""
    if not breakdown or not breakdown.get("total"):
        return None
    return breakdown.get("train_steps", 0.0) / breakdown["total"]


def process_seconds(run: dict[str, Any]) -> float:
    """A trainer run's seconds from its process's start to its result (its training's, if the
    breakdown has no total)."""
    return run["process_s"] if run.get("process_s") is not None else run["wall_time_s"]


def breakdown_lines(breakdown: dict[str, Any]) -> list[str]:
    total = breakdown["total"]
    parts = [
        (k, v) for k, v in breakdown.items() if isinstance(v, int | float) and not isinstance(v, bool) and k != "total"
    ]
    lines = ["| part | seconds | share |", "|---|---|---|"]
    lines += [f"| {k} | {v:.2f} | {v / total:.1%} |" for k, v in parts]
    lines.append(f"| total | {total:.2f} | 100% |")
    lines.append(f"\nMeasured from: {breakdown.get('measured_from')}.")
    return lines


def _trainer_row(r: dict[str, Any]) -> str:
    share = train_step_share(r["wall_time_breakdown"])
    return (
        f"| {r['label']} | {r['status']} | {r['precision']} | {r['steps']} | {r['parameters']:,} | "
        f"{r['throughput']:,.0f} | {_ms(r['step_ms_median'])} | "
        f"{_ms(r['achieved_tflops'])} | {_pct(r['mfu'])} | "
        f"{process_seconds(r):.0f} | {_pct(share)} |"
    )


TRAINER_HEADER = [
    "| run | status | precision | steps | parameters | tokens/s | step ms (median) | achieved TFLOP/s | MFU | "
    "process s | time in training steps |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]


def section_trainer(ctx: Context) -> Section:
    outcome = _trainer_run(ctx)
    run = trainer_run_config(ctx.settings.trainer_steps, compile=False, dims=ctx.dims)
    intro = [
        f"{_trainer_shape(run)}; `blockbench.cell.train.train` on a RunConfig from "
        f"`build_run_config(configs/base.yaml, overrides)`, {ctx.settings.trainer_steps} steps, validation at the "
        f"end, every other setting the default (`trainer.checkpoint_every_n_steps: "
        f"{run.trainer.checkpoint_every_n_steps}`, `trainer.log_every_n_steps: {run.trainer.log_every_n_steps}`). "
        "The task's generated language decides the vocabulary: unlike the eager section's models this one "
        "has no 50304-token embedding and head.",
        "",
    ]
    if isinstance(outcome, str):
        return _failed("trainer", intro, outcome)
    share = train_step_share(outcome["wall_time_breakdown"])
    lines = [*intro, *TRAINER_HEADER, _trainer_row(outcome), ""]
    if outcome["wall_time_breakdown"]:
        lines += [
            "Where the wall time went (`wall_time_breakdown`):",
            "",
            *breakdown_lines(outcome["wall_time_breakdown"]),
        ]
    if outcome["peak_source"]:
        lines += ["", f"- peak: {outcome['peak_source']} ({outcome['peak_tflops']} TFLOP/s)"]
    if outcome.get("runtime"):
        lines += [f"- runtime: {', '.join(f'{k} {v}' for k, v in outcome['runtime'].items())}"]
    headline = (
        f"{outcome['throughput']:,.0f} tok/s, MFU {_pct(outcome['mfu'])}, {_pct(share)} of the wall time in steps"
    )
    return Section("trainer", headline, lines, {"run": outcome}, failed=outcome["status"] != "ok")


def driver_version() -> str | None:
    """The NVIDIA driver's version: from NVML where pynvml is installed, else from nvidia-smi."""
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip().splitlines()[0]
    return None


def gpu_facts() -> dict[str, Any]:
    """The GPU and the software stack the figures depend on."""
    from importlib.metadata import version

    import torch

    props = torch.cuda.get_device_properties(0)
    nccl = None
    with contextlib.suppress(Exception):
        raw = torch.cuda.nccl.version()
        nccl = ".".join(map(str, raw)) if isinstance(raw, tuple) else str(raw)
    return {
        "name": props.name,
        "count": torch.cuda.device_count(),
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "driver": driver_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": nccl,
        "torch": torch.__version__,
        "lightning": version("lightning"),
    }


RUNNERS: dict[str, Callable[[Context], Section]] = {
    "loss": section_loss,
    "cudnn": section_cudnn,
    "eager": section_eager,
    "compiled": section_compiled,
    "matrix": section_matrix,
    "breakdown": section_breakdown,
    "gradients": section_gradients,
    "trainer": section_trainer,
}


# ---------------------------------------------------------------------------------- the report
def report(sections: list[Section], gpu: dict[str, Any], machine: dict[str, Any], command: str, minutes: float) -> str:
    lines = report_header("blockbench on a GPU: the GPU check", command, machine, note=f" in {minutes:.1f} min")
    lines += [
        f"- GPU: {gpu['name']} (compute capability {gpu['capability']}, {gpu['memory_gib']} GiB)"
        + (f", {gpu['count']} visible, the first used" if gpu["count"] > 1 else "")
        + f"; driver {gpu['driver'] or 'unknown'}, CUDA {gpu['cuda']} (torch's), cuDNN {gpu['cudnn']}, "
        f"NCCL {gpu['nccl'] or 'unknown'}",
        "",
        "| section | result | seconds | time limit |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {s.name} | {'FAILED: ' if s.failed else ''}{'CUT: ' if s.cut else ''}{s.headline} | {s.seconds:.0f} | "
        f"{BUDGET_S[s.name]:.0f} |"
        for s in sections
    ]
    for s in sections:
        lines += ["", f"## {s.name}: {SECTIONS[s.name]}", "", *s.lines]
    return "\n".join(lines) + "\n"


def run_section(name: str, ctx: Context, limit: float) -> Section:
    """Run section ``name`` within ``limit`` seconds: its outcome, cut where it ran out of time, failed
    (with the error's last lines) where it raised."""
    start = time.perf_counter()
    ctx.deadline = start + limit
    if limit <= 1:
        outcome = Section(name, "no time left", ["Not run: the check's time was spent."], cut=True)
    else:
        try:
            outcome = RUNNERS[name](ctx)
        except SectionCut as cut:
            outcome = Section(name, f"out of time at its {limit:.0f} s limit", [f"Cut: {cut}."], cut=True)
        except Exception as error:  # the other sections still run and report
            tail = traceback.format_exc().strip().splitlines()[-3:]
            outcome = Section(
                name, f"{type(error).__name__}: {error}", ["Failed:", "", "```", *tail, "```"], failed=True
            )
    outcome.seconds = time.perf_counter() - start
    return outcome


# ---------------------------------------------------------------------------------- arguments
def section_names(value: str) -> list[str]:
    """``--skip`` values: section names, several at once comma-separated (``matrix,compiled``)."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown section {', '.join(repr(n) for n in unknown) or repr(value)}; choose from {', '.join(SECTIONS)}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="sections, in this order: " + "; ".join(f"{name}: {what}" for name, what in SECTIONS.items()),
    )
    parser.add_argument(
        "--nanogpt", default=None, metavar="PATH", help="nanoGPT's model.py, or the folder of a clone of it"
    )
    parser.add_argument("--quick", action="store_true", help="shorter sections: 3 rounds, fewer steps and calls")
    parser.add_argument(
        "--skip",
        nargs="+",
        type=section_names,
        default=[],
        metavar="SECTION",
        help=f"sections to leave out ({', '.join(SECTIONS)})",
    )
    parser.add_argument("--dtypes", nargs="+", default=["bf16"], choices=DTYPES, help="eager and compiled dtypes")
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="the GPU's peak for MFU (default: the trainer's peak_flops)"
    )
    parser.add_argument("--jobs", default="auto", help="the packed matrix run's --jobs (default auto)")
    parser.add_argument(
        "--budget", type=float, default=TOTAL_BUDGET_S, metavar="SECONDS", help="the whole check's time limit"
    )
    parser.add_argument(
        "--runs",
        default=None,
        metavar="DIR",
        help="where the trainer run and the matrices go (default: a temporary folder)",
    )
    parser.add_argument(
        "--out", default="results/gpu.md", help="markdown report, and its .json beside it ('-': print only)"
    )
    parser.add_argument("--plan", action="store_true", help="print what would run and the time limits, then exit")
    parser.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.skip = [name for names in args.skip for name in names]
    if not args.worker and set(args.skip) >= set(SECTIONS):
        parser.error("--skip leaves no section to run")
    if args.jobs != "auto":
        try:
            args.jobs = int(args.jobs)
        except ValueError:
            parser.error(f"--jobs must be a number or auto, not {args.jobs!r}")
    return args


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        record = WORKERS[args.worker](json.loads(args.spec))
        print("RESULT " + json.dumps(record), flush=True)
        return 0
    if args.plan:
        print(format_plan(plan(args), args.budget))
        return 0
    if not cuda_available():
        print(NO_GPU_MESSAGE)
        return 0
    if args.nanogpt:
        try:  # a wrong path fails here, not after minutes of the other sections
            load_nanogpt(args.nanogpt)
        except (OSError, ImportError) as error:
            sys.exit(str(error))

    import torch

    planned = plan(args)
    print(format_plan(planned, args.budget), flush=True)
    started = time.perf_counter()
    ctx = make_context(args)
    sections = []
    try:
        for section in planned:
            print(f"== {section.name}: {section.what}", flush=True)
            left = args.budget - (time.perf_counter() - started)
            outcome = run_section(section.name, ctx, min(section.limit_s, left))
            sections.append(outcome)
            state = "FAILED: " if outcome.failed else "CUT: " if outcome.cut else ""
            print(f"== {section.name}: {state}{outcome.headline} ({outcome.seconds:.0f} s)", flush=True)
    finally:
        if not args.runs:
            shutil.rmtree(ctx.runs, ignore_errors=True)
    minutes = (time.perf_counter() - started) / 60
    command = command_line("benchmarks/gpu_check.py", argv)
    gpu = gpu_facts()
    machine = machine_facts("cuda", torch.get_num_threads(), package_versions())
    print_and_write(report(sections, gpu, machine, command.strip(), minutes), args.out)
    if args.out != "-":
        summary = {
            "gpu": gpu,
            "machine": machine,
            "minutes": round(minutes, 2),
            "sections": {
                s.name: {"failed": s.failed, "cut": s.cut, "seconds": round(s.seconds, 1), **s.data} for s in sections
            },
        }
        json_path = Path(args.out).with_suffix(".json")
        json_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        print(f"wrote {json_path}")
    return 1 if any(s.failed for s in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
