"""blockbench on a CUDA GPU in one command: speed against nanoGPT and HF GPT-2, the real trainer, SDPA
gradients, the smoke matrix and torch.compile, in under 15 minutes.

    python benchmarks/gpu_check.py --nanogpt ~/nanoGPT   # every section; writes results/gpu.md and results/gpu.json
    python benchmarks/gpu_check.py --quick               # every section, shorter (fewer rounds and steps, one seed)
    python benchmarks/gpu_check.py --skip matrix compile --out -   # some sections, printed only
    python benchmarks/gpu_check.py --plan                # what would run, and a rough time; needs no GPU

On a machine without a CUDA device it prints "no CUDA device: nothing measured; see README" and
exits 0, writing nothing. The sections (``--skip`` leaves any out):

* **throughput**: training-step throughput and MFU at the GPT-2-small shape (d 768, 12 layers,
  12 heads, context 1024, vocab 50304, batch 16) of blockbench's LM next to nanoGPT's model.py
  (``--nanogpt PATH``, imported from the user's clone as ``benchmarks.speed.throughput`` does) and HF
  transformers' GPT2LMHeadModel (where transformers is installed), in bf16 (autocast) and fp32
  (``--dtypes``; ``tf32`` is fp32 with ``torch.set_float32_matmul_precision("high")``). The step and
  its timing are ``benchmarks.speed.throughput``'s (``time_training_step``: the builders of
  ``benchmarks.parity.implementations``,
  our model through ``build_model``, fused AdamW, CUDA synchronisation around each timed step),
  each implementation and dtype in a fresh process, rounds interleaved; ratios with a 95% interval
  over rounds (``benchmarks.harness.ratio_interval``). MFU divides by ``blockbench.cell.perf.peak_flops``,
  the denominator the trainer uses (``--peak-tflops`` overrides it).
* **trainer**: the same model shape through the real trainer, ``blockbench.cell.train.train`` with a
  RunConfig from ``blockbench.config.build_run_config`` (``configs/base.yaml`` + overrides, the
  embedded ``lm`` task at context 1024, every other setting the default: precision auto,
  checkpoints, validation, logging): its throughput, MFU and the share of its wall time spent in
  training steps (``wall_time_breakdown``: train_steps / total, counted from the process start as
  ``blockbench train`` counts it). The task's data decides the vocabulary (its generated language
  has a few dozen words), so this model has no 50304-token embedding and output layer.
* **gradients**: every positional variant (learned, sinusoidal, rope, alibi, relative = the T5
  bias, nope) of a small decoder LM built by ``build_model``: the gradients of every parameter
  (the learned table and the T5 bias table included) with PyTorch's SDPA backend choice against
  the math backend (``sdpa_kernel(SDPBackend.MATH)``), in fp32 and under bf16 autocast, with the
  kernels each run called.
* **matrix**: ``configs/matrix/smoke.yaml`` with ``trainer.precision: auto`` through
  ``blockbench.matrix.run.run_matrix``, into ``--runs`` (default: a temporary folder); ``--quick``
  runs its seed 0 only.
* **compile**: the trainer run with ``model.compile=true`` against the same run without
  (``model.compile`` is the override a matrix would set).

Every measurement of the trainer, the matrix and the models goes through the functions a matrix
uses (``build_run_config``, ``train``, ``run_matrix``, ``build_model``), never a copy of them. A
section that fails is reported as failed and the others go on (exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
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
from benchmarks.harness import (
    RATIO_METHOD,
    Ratio,
    command_line,
    interleaved,
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
    lm_fields,
    load_nanogpt,
    package_versions,
)
from benchmarks.speed.throughput import merge, time_training_step

#: what a machine without a CUDA device prints (and nothing else happens)
NO_GPU_MESSAGE = "no CUDA device: nothing measured; see README"

#: the sections, in the order they run, with what each measures
SECTIONS: dict[str, str] = {
    "throughput": "training-step throughput and MFU at the GPT-2-small shape: blockbench, nanoGPT, HF GPT-2",
    "trainer": "the GPT-2-small shape through blockbench's trainer: throughput, MFU, share of wall time in steps",
    "gradients": "SDPA gradients of every positional variant against the math backend",
    "matrix": "the smoke matrix (configs/matrix/smoke.yaml) with trainer.precision auto",
    "compile": "the trainer run with model.compile=true against model.compile=false",
}

DTYPES = ("bf16", "fp32", "tf32")
DTYPE_NOTES = {
    "bf16": "bf16 autocast (parameters, gradients and optimizer state fp32)",
    "fp32": 'fp32 with torch.set_float32_matmul_precision("highest") (no TF32)',
    "tf32": 'fp32 with torch.set_float32_matmul_precision("high") (TF32 matmuls)',
}

#: the positional variants whose gradients are checked, and the small shape they are checked at
POSITIONAL_VARIANTS = ("learned", "sinusoidal", "rope", "alibi", "relative", "nope")
GRADIENT_DIMS = Dims(d_model=256, n_layers=2, n_heads=4, d_ff=1024, batch=4, vocab=512, seq_len=256)
#: the largest gradient difference, relative to the parameter's largest gradient, that still agrees
GRADIENT_TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}

SMOKE_MATRIX = ROOT / "configs" / "matrix" / "smoke.yaml"
BASE_CONFIG = ROOT / "configs" / "base.yaml"


@dataclass(frozen=True)
class Settings:
    """How long each section measures: the full run's or ``--quick``'s."""

    rounds: int  # throughput: interleaved rounds
    warmup: int  # throughput: untimed steps per run
    min_steps: int
    max_steps: int
    min_seconds: float
    trainer_steps: int  # trainer and compile runs: optimizer steps
    matrix_seeds: tuple[int, ...] | None  # None: the smoke matrix's own seeds


FULL = Settings(rounds=3, warmup=5, min_steps=10, max_steps=60, min_seconds=3.0, trainer_steps=300, matrix_seeds=None)
QUICK = Settings(rounds=1, warmup=3, min_steps=5, max_steps=20, min_seconds=1.0, trainer_steps=60, matrix_seeds=(0,))

#: rough seconds per piece for the plan's estimate, from the first run (``--quick`` on one H200, 2026-11-26,
#: results/gpu.md: 6.7 min, as these figures estimate it)
ESTIMATE_S = {
    "throughput_run_overhead": 13.0,  # a worker's start: imports, CUDA context, build, FLOP count, warm-up
    "trainer_run_overhead": 14.0,  # imports, data generation, validation, checkpoints
    "trainer_step": 0.035,  # bf16 at the GPT-2-small shape with the lm task's vocabulary
    "compile": 40.0,  # torch.compile's warm-up of the GPT-2-small graph
    "gradients": 5.0,
    "matrix_overhead": 10.0,  # the cell server's start and the report
    "matrix_variant": 25.0,  # the planning's timing of a cell of each variant (one at a time on one GPU)
    "matrix_cell": 13.0,  # a smoke cell's process, most of it outside the training steps
}


# ------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class PlannedSection:
    """One section as it would run: what, at which shape, the runs it makes, and a rough time."""

    name: str
    what: str
    shape: str
    runs: tuple[str, ...]
    estimate_s: float
    notes: tuple[str, ...] = ()


def throughput_impls(nanogpt: str | None) -> tuple[list[str], list[str]]:
    """The implementations the throughput section times, and a line for each it cannot time here."""
    impls, not_run = ["blockbench"], []
    if nanogpt:
        impls.append("nanogpt")
    else:
        not_run.append("nanogpt not run: pass --nanogpt PATH (nanoGPT's model.py, or the folder of a clone of it)")
    if importable("transformers"):
        impls.append("hf_gpt2")
    else:
        not_run.append('hf_gpt2 not run: transformers is not installed (pip install -e ".[bench]")')
    return impls, not_run


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


def plan(args: argparse.Namespace) -> list[PlannedSection]:
    """Every section not skipped, as it would run with ``args``: needs no GPU (the trainer configs
    and the matrix are validated as the trainer and the runner validate them)."""
    settings = QUICK if args.quick else FULL
    planned = []
    skip = set(args.skip or ())
    steps = settings.trainer_steps
    trainer_s = ESTIMATE_S["trainer_run_overhead"] + steps * ESTIMATE_S["trainer_step"]
    for name in SECTIONS:
        if name in skip:
            continue
        if name == "throughput":
            impls, not_run = throughput_impls(args.nanogpt)
            runs = tuple(f"{impl} {dtype}" for impl in impls for dtype in args.dtypes)
            per_run = ESTIMATE_S["throughput_run_overhead"] + settings.min_seconds
            planned.append(
                PlannedSection(
                    name,
                    SECTIONS[name],
                    describe_dims(GPT2_SMALL),
                    runs,
                    len(runs) * settings.rounds * per_run,
                    (f"{settings.rounds} interleaved round(s), each run in a fresh process", *not_run),
                )
            )
        elif name == "trainer":
            run = trainer_run_config(steps, compile=False)
            planned.append(
                PlannedSection(
                    name,
                    SECTIONS[name],
                    _trainer_shape(run),
                    (f"blockbench.cell.train.train, {steps} steps, model.compile=false",),
                    trainer_s,
                )
            )
        elif name == "gradients":
            d = GRADIENT_DIMS
            planned.append(
                PlannedSection(
                    name,
                    SECTIONS[name],
                    f"decoder LM d {d.d_model}, {d.n_layers} layers, {d.n_heads} heads, context {d.seq_len}, "
                    f"vocab {d.vocab}, batch {d.batch}",
                    tuple(f"{variant} {dtype}" for variant in POSITIONAL_VARIANTS for dtype in ("fp32", "bf16")),
                    ESTIMATE_S["gradients"],
                )
            )
        elif name == "matrix":
            cells = smoke_cells(settings.matrix_seeds)
            model, trainer = cells[0].run.model, cells[0].run.trainer
            tasks = ", ".join(dict.fromkeys(cell.task for cell in cells))
            planned.append(
                PlannedSection(
                    name,
                    SECTIONS[name],
                    f"the smoke matrix's models (d {model.d_model}, {model.n_layers} layers, {trainer.max_steps} "
                    f"steps) on {tasks}",
                    tuple(cell.key for cell in cells),
                    ESTIMATE_S["matrix_overhead"]
                    + len({(cell.task, cell.variant) for cell in cells}) * ESTIMATE_S["matrix_variant"]
                    + len(cells) * ESTIMATE_S["matrix_cell"],
                    ("trainer.precision: auto in every cell (bf16-mixed on a GPU)",),
                )
            )
        elif name == "compile":
            compiled = trainer_run_config(steps, compile=True)
            runs = [f"blockbench.cell.train.train, {steps} steps, model.compile=true"]
            if "trainer" in skip:
                runs.insert(0, f"blockbench.cell.train.train, {steps} steps, model.compile=false")
            planned.append(
                PlannedSection(
                    name,
                    SECTIONS[name],
                    _trainer_shape(compiled),
                    tuple(runs),
                    ESTIMATE_S["compile"] + len(runs) * trainer_s,
                    () if "trainer" in skip else ("its compile-off run is the trainer section's",),
                )
            )
    return planned


def _trainer_shape(run) -> str:
    model = run.resolved_model()
    return (
        f"blockbench decoder_lm d {model.d_model}, {model.n_layers} layers, {model.n_heads} heads, context "
        f"{run.task.seq_len}, vocab {model.vocab_size} (the lm task's), batch {run.trainer.batch_size}, "
        f"precision {run.trainer.precision}"
    )


def format_plan(planned: list[PlannedSection]) -> str:
    lines = ["| section | shape | runs | rough time |", "|---|---|---|---|"]
    for section in planned:
        lines.append(
            f"| {section.name} | {section.shape} | {len(section.runs)}: {', '.join(section.runs)} | "
            f"{section.estimate_s / 60:.1f} min |"
        )
    notes = [f"- {section.name}: {note}" for section in planned for note in section.notes]
    total = sum(section.estimate_s for section in planned) / 60
    return "\n".join([*lines, "", *notes, f"- rough total: {total:.1f} min (estimates from one H200 run)"])


# ---------------------------------------------------------------------------------- workers
def run_worker(kind: str, spec: dict[str, Any], timeout: float) -> dict[str, Any] | str:
    """Run this module with ``--worker kind`` in a fresh process; its record, or why it failed."""
    command = module_command(__spec__.name, "--worker", kind, "--spec", json.dumps(spec))
    env = module_env({**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{kind} {spec.get('label', '')} did not finish in {timeout:.0f} s"
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return f"{kind} {spec.get('label', '')} failed (exit {proc.returncode}): " + " | ".join(tail)


def throughput_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One implementation in one dtype at GPT2_SMALL, timed by ``benchmarks.speed.throughput.time_training_step``."""
    import torch

    from blockbench.cell.perf import peak_flops

    dtype = spec["dtype"]
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    device = torch.device(spec["device"])
    precision = "bf16-mixed" if dtype == "bf16" else "32-true"
    peaks = []

    def peak() -> float:
        peaks.append(peak_flops(spec["peak_tflops"], device, precision))
        return peaks[-1].tflops * 1e12

    record = time_training_step(
        spec["impl"],
        GPT2_SMALL_NAME,
        Dims(**spec["dims"]),
        "bf16" if dtype == "bf16" else "fp32",
        spec["device"],
        warmup=spec["warmup"],
        min_steps=spec["min_steps"],
        max_steps=spec["max_steps"],
        min_seconds=spec["min_seconds"],
        peak=peak,
        sources={"nanogpt": spec.get("nanogpt")},
    )
    return {
        **record,
        "dtype": dtype,
        "peak_source": peaks[-1].source,
        "probe_tflops": getattr(peaks[-1], "probe_tflops", None),  # the matmul probe beside a datasheet peak
        "matmul_precision": torch.get_float32_matmul_precision(),
        "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }


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
    "throughput": throughput_worker,
    "trainer": trainer_worker,
}


# --------------------------------------------------------------------------------- sections
@dataclass
class Section:
    """A section's outcome: its markdown, a one-line headline for the summary table, its figures."""

    name: str
    headline: str
    lines: list[str]
    data: dict[str, Any] = field(default_factory=dict)
    failed: bool = False
    seconds: float = 0.0


@dataclass
class Context:
    """What the sections share. A GPU run takes the defaults; the tests run the sections on a CPU at
    tiny shapes through the same code (``device``, ``dims``, ``gradient_dims``)."""

    args: argparse.Namespace
    settings: Settings
    runs: Path  # where the trainer runs and the matrix write
    device: str = "cuda"
    dims: Dims = GPT2_SMALL  # the throughput, trainer and compile sections' model
    gradient_dims: Dims = GRADIENT_DIMS
    gradient_dtypes: tuple[str, ...] = ("fp32", "bf16")
    trainer_off: dict[str, Any] | None = None  # the trainer section's run, reused by the compile section


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


def section_throughput(ctx: Context) -> Section:
    args, settings = ctx.args, ctx.settings
    impls, not_run = throughput_impls(args.nanogpt)
    runs = [(impl, dtype) for impl in impls for dtype in args.dtypes]
    records: dict[tuple[str, str], list[dict[str, Any]]] = {run: [] for run in runs}
    failures: list[str] = []
    for round_index, (impl, dtype) in interleaved(settings.rounds, runs):
        spec = {
            "label": f"{impl} {dtype}",
            "impl": impl,
            "dtype": dtype,
            "device": ctx.device,
            "dims": asdict(ctx.dims),
            "warmup": settings.warmup,
            "min_steps": settings.min_steps,
            "max_steps": settings.max_steps,
            "min_seconds": settings.min_seconds,
            "peak_tflops": args.peak_tflops,
            "nanogpt": args.nanogpt,
        }
        print(f"  throughput round {round_index + 1}/{settings.rounds}: {impl} {dtype} ...", end=" ", flush=True)
        outcome = run_worker("throughput", spec, timeout=600)
        if isinstance(outcome, str):
            print("FAILED")
            failures.append(outcome)
            continue
        records[(impl, dtype)].append({**outcome, "round": round_index})
        print(f"{statistics.median(outcome['step_s']) * 1e3:.1f} ms/step", flush=True)
    results = []
    for rs in records.values():
        if rs:
            extra = {k: rs[0].get(k) for k in ("peak_source", "probe_tflops", "matmul_precision")}
            memory = [r["max_memory_gib"] for r in rs if r["max_memory_gib"] is not None]
            results.append({**merge(rs), **extra, "max_memory_gib": max(memory) if memory else None})
    by_key = {(r["impl"], r["dtype"]): r for r in results}
    lines = [
        f"Shape: {describe_dims(ctx.dims)}. Step: zero_grad + forward + loss + backward + fused AdamW step "
        f"(`benchmarks.speed.throughput`'s `time_training_step`); {settings.rounds} interleaved round(s) of "
        f"{settings.warmup} warm-up steps, then >= {settings.min_steps} steps and >= {settings.min_seconds:g} s "
        f"(at most {settings.max_steps}). MFU = achieved / peak FLOP/s, the peak from "
        "`blockbench.cell.perf.peak_flops` (the trainer's denominator) unless `--peak-tflops`.",
        "",
        *[f"- {DTYPE_NOTES[d]}: rows `{d}`" for d in args.dtypes],
        *[f"- {line}" for line in not_run],
        "",
        "| implementation | dtype | parameters | step ms (median) | tokens/s | achieved TFLOP/s | peak TFLOP/s | MFU "
        "| peak memory GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        mfu = r["achieved_tflops"] / r["peak_tflops"]
        lines.append(
            f"| {r['impl']} | {r['dtype']} | {r['parameters']:,} | {r['step_ms_median']:.1f} | "
            f"{r['throughput']:,.0f} | {r['achieved_tflops']:.1f} | {r['peak_tflops']:.1f} | "
            f"{'above the peak' if mfu > 1 else f'{mfu:.1%}'} | {_ms(r['max_memory_gib'])} |"
        )
    ratios = []
    for dtype in args.dtypes:
        ours = by_key.get(("blockbench", dtype))
        for impl in impls[1:]:
            theirs = by_key.get((impl, dtype))
            if not ours or not theirs:
                continue
            ratio = ratio_interval(
                dict(zip(ours["rounds"], ours["round_medians_ms"], strict=True)),
                dict(zip(theirs["rounds"], theirs["round_medians_ms"], strict=True)),
            )
            ratios.append({"dtype": dtype, "reference": impl, "ratio": ratio})
    if ratios:
        lines += [
            "",
            f"Ours / theirs (throughput), with a 95% interval over rounds ({RATIO_METHOD}); an interval "
            "that includes 1 is a tie.",
            "",
            "| dtype | reference | ours / theirs | 95% interval | verdict |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {x['dtype']} | {x['reference']} | **{x['ratio'].ratio:.2f}** | {_interval(x['ratio'])} | "
            f"{x['ratio'].verdict} |"
            for x in ratios
        ]
    peaks = sorted({(r["dtype"], r["peak_tflops"], r["peak_source"], r.get("probe_tflops")) for r in results}, key=str)
    lines += [""]
    lines += [
        f"- peak {dtype}: {tflops:.1f} TFLOP/s, {source}"
        + ("" if probe is None else f" (this machine's matmul probe: {probe:.1f} TFLOP/s)")
        for dtype, tflops, source, probe in peaks
    ]
    notes = {r["impl"]: r["note"] for r in results}
    lines += [f"- **{impl}**: {note}" for impl, note in notes.items()]
    if failures:
        lines += ["", "Failed runs:", "", *[f"- {failure}" for failure in failures]]
    headline = "; ".join(
        f"{r['impl']} {r['dtype']} {r['throughput'] / 1e3:,.0f}k tok/s "
        f"(MFU {r['achieved_tflops'] / r['peak_tflops']:.0%})"
        for r in results
    )
    return Section(
        "throughput",
        headline or "nothing timed",
        lines,
        {
            "runs": results,
            "ratios": [{"dtype": x["dtype"], "reference": x["reference"], **asdict(x["ratio"])} for x in ratios],
            "failures": failures,
            "not_run": not_run,
        },
        failed=bool(failures) or not results,
    )


def _trainer_run(ctx: Context, compile: bool) -> dict[str, Any] | str:
    label = f"compile-{'on' if compile else 'off'}"
    spec = {
        "label": label,
        "steps": ctx.settings.trainer_steps,
        "compile": compile,
        "dims": asdict(ctx.dims),
        "out": str(ctx.runs / label),
    }
    print(f"  trainer run {label} ({ctx.settings.trainer_steps} steps) ...", end=" ", flush=True)
    outcome = run_worker("trainer", spec, timeout=900)
    print("FAILED" if isinstance(outcome, str) else f"{process_seconds(outcome):.0f} s", flush=True)
    return outcome


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
    outcome = _trainer_run(ctx, compile=False)
    run = trainer_run_config(ctx.settings.trainer_steps, compile=False, dims=ctx.dims)
    intro = [
        f"{_trainer_shape(run)}; `blockbench.cell.train.train` on a RunConfig from "
        f"`build_run_config(configs/base.yaml, overrides)`, {ctx.settings.trainer_steps} steps, validation at the "
        f"end, every other setting the default (`trainer.checkpoint_every_n_steps: "
        f"{run.trainer.checkpoint_every_n_steps}`, `trainer.log_every_n_steps: {run.trainer.log_every_n_steps}`). "
        "The task's generated language decides the vocabulary: unlike the throughput section's models this one "
        "has no 50304-token embedding and head.",
        "",
    ]
    if isinstance(outcome, str):
        return Section("trainer", "failed", [*intro, f"Failed: {outcome}"], {"error": outcome}, failed=True)
    ctx.trainer_off = outcome
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


@dataclass(frozen=True)
class GradientCheck:
    """One variant in one dtype: the gradients with PyTorch's SDPA choice against the math backend."""

    variant: str
    dtype: str
    kernels: str  # the SDPA kernels the default run called
    max_abs_diff: float  # over every parameter's gradient
    worst_parameter: str  # the parameter with the largest difference relative to its largest gradient
    worst_relative: float
    positional: dict[str, tuple[float, float]]  # the encoding's own parameters: (max abs diff, relative)
    missing: tuple[str, ...]  # parameters with a gradient in one run and none in the other

    @property
    def agrees(self) -> bool:
        return not self.missing and self.worst_relative <= GRADIENT_TOLERANCE[self.dtype]


#: SDPA's kernels by aten name, the most specific first
SDPA_KERNELS = (
    ("_scaled_dot_product_flash_attention_for_cpu", "flash (CPU)"),
    ("_scaled_dot_product_flash_attention", "flash"),
    ("_scaled_dot_product_efficient_attention", "memory-efficient"),
    ("_scaled_dot_product_cudnn_attention", "cuDNN"),
    ("_scaled_dot_product_fused_attention_overrideable", "fused (other)"),
)


def kernel_names(ops: set[str]) -> str:
    """The SDPA kernels among the aten ops a run called; "math" where none of them ran (the math
    backend decomposes into matmuls and softmax)."""
    found = []
    for op, label in SDPA_KERNELS:
        if any(name == op for name in ops):
            found.append(label)
    return ", ".join(found) or "math"


def positional_gradients(
    device: str, dims: Dims = GRADIENT_DIMS, dtypes: Iterable[str] = ("fp32", "bf16"), seed: int = 0
) -> list[GradientCheck]:
    """For every positional variant: a decoder LM at ``dims`` (``build_model``, as every cell builds
    it) and one batch; the gradients of every parameter from one forward and backward of the LM loss
    (``tasks.lm.next_token_loss``) as PyTorch picks the SDPA kernel, and under
    ``sdpa_kernel(SDPBackend.MATH)``. bf16 runs under autocast; fp32 matmuls at the highest precision
    (no TF32, which would blur the comparison). Works on a CPU too (with its own kernels)."""
    import torch

    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        return [
            check
            for variant in POSITIONAL_VARIANTS
            for check in _variant_gradients(variant, device, dims, dtypes, seed)
        ]
    finally:
        torch.set_float32_matmul_precision(saved)


def _aten_ops_mode():
    """A dispatch mode that records the names of the aten ops called inside it: which SDPA kernel ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class AtenOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    return AtenOps()


def _variant_gradients(variant: str, device: str, dims: Dims, dtypes: Iterable[str], seed: int) -> list[GradientCheck]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from blockbench.models import ModelConfig, build_model
    from blockbench.models.position import PositionalEncoding
    from blockbench.tasks.lm import next_token_loss

    torch.manual_seed(seed)
    model = build_model(ModelConfig(**lm_fields(dims, pos_encoding=variant))).to(device)
    model.train()
    positional = {  # the encoding's own parameters: a learned table, the T5 bias table
        f"{name}.{p_name}" if name else p_name
        for name, module in model.named_modules()
        if isinstance(module, PositionalEncoding)
        for p_name, _ in module.named_parameters()
    }
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, dims.vocab, (dims.batch, dims.seq_len + 1), generator=generator).to(device)

    def gradients(backend, dtype: str) -> tuple[dict[str, torch.Tensor], set[str]]:
        model.zero_grad(set_to_none=True)
        ops = _aten_ops_mode()
        autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == "bf16")
        with backend, autocast, ops:
            loss = next_token_loss(model, rows)
        with ops:
            loss.backward()
        grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
        return grads, ops.names

    checks = []
    for dtype in dtypes:
        default, ops = gradients(contextlib.nullcontext(), dtype)
        reference, _ = gradients(sdpa_kernel(SDPBackend.MATH), dtype)
        diffs = {}
        for name in set(default) & set(reference):
            diff = (default[name] - reference[name]).abs().max().item()
            scale = reference[name].abs().max().item()
            diffs[name] = (diff, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
        worst = max(diffs, key=lambda n: diffs[n][1])
        checks.append(
            GradientCheck(
                variant=variant,
                dtype=dtype,
                kernels=kernel_names(ops),
                max_abs_diff=max(d for d, _ in diffs.values()),
                worst_parameter=worst,
                worst_relative=diffs[worst][1],
                positional={name: diffs[name] for name in sorted(positional) if name in diffs},
                missing=tuple(sorted(set(default) ^ set(reference))),
            )
        )
    return checks


def gradient_lines(checks: list[GradientCheck], device: str, dims: Dims) -> list[str]:
    lines = [
        f"A decoder LM (d {dims.d_model}, {dims.n_layers} layers, {dims.n_heads} heads, context {dims.seq_len}, "
        f"vocab {dims.vocab}, batch {dims.batch}) per positional variant on {device}, built by `build_model`; "
        "the gradients of every parameter from the LM loss with the SDPA kernel PyTorch picks, against "
        "`sdpa_kernel(SDPBackend.MATH)`. Relative = max |difference| / max |math gradient| of a parameter; "
        f"agreement: relative <= {GRADIENT_TOLERANCE['fp32']:g} in fp32, <= {GRADIENT_TOLERANCE['bf16']:g} under "
        "bf16 autocast (the math backend rounds too), and the same parameters have gradients.",
        "",
        "| variant | dtype | SDPA kernel (default) | max abs diff, all parameters | worst parameter (relative) | "
        "positional parameters: max abs diff (relative) | agrees |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        positional = "; ".join(f"`{n}` {d:.2e} ({r:.1e})" for n, (d, r) in c.positional.items()) or "none"
        verdict = (
            "yes"
            if c.agrees
            else "**NO**" + (f": no gradient in one run for {', '.join(c.missing)}" if c.missing else "")
        )
        lines.append(
            f"| {c.variant} | {c.dtype} | {c.kernels} | {c.max_abs_diff:.2e} | `{c.worst_parameter}` "
            f"({c.worst_relative:.1e}) | {positional} | {verdict} |"
        )
    return lines


def section_gradients(ctx: Context) -> Section:
    checks = positional_gradients(ctx.device, ctx.gradient_dims, ctx.gradient_dtypes)
    lines = gradient_lines(checks, ctx.device, ctx.gradient_dims)
    disagree = [f"{c.variant} {c.dtype}" for c in checks if not c.agrees]
    headline = f"all {len(checks)} agree" if not disagree else f"differ: {', '.join(disagree)}"
    data = {"checks": [asdict(c) for c in checks]}
    return Section("gradients", headline, lines, data, failed=bool(disagree))


def section_matrix(ctx: Context) -> Section:
    from blockbench.matrix.expand import expand_matrix
    from blockbench.matrix.run import run_matrix
    from blockbench.store.record import read_matrix_run, read_record

    root = ctx.runs / "matrix"
    path = smoke_matrix_file(ctx.runs / "matrix_file", ctx.settings.matrix_seeds)
    code = run_matrix(path, root, jobs=ctx.args.jobs)
    expansion = expand_matrix(path)
    matrix_dir = root / expansion.matrix.name
    lines = [
        f"`blockbench.matrix.run.run_matrix` on `configs/matrix/smoke.yaml` with `trainer.precision: auto`"
        f"{'' if ctx.settings.matrix_seeds is None else f', seeds {list(ctx.settings.matrix_seeds)}'}, "
        f"`--jobs {ctx.args.jobs}`, into `{matrix_dir}`; exit code {code}.",
        "",
        "| cell | status | precision | steps | throughput | step ms (median) | MFU | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cells = []
    for cell in expansion.cells:
        record = read_record(cell.directory(matrix_dir) / "result.json")
        if record is None:
            lines.append(f"| {cell.key} | no result | – | – | – | – | – | – |")
            cells.append({"key": cell.key, "status": None})
            continue
        perf = record.performance
        step_ms = perf.step_time_ms.median if perf and perf.step_time_ms else None
        lines.append(
            f"| {cell.key} | {record.status} | {record.precision} | {record.steps} | "
            f"{record.throughput or 0:,.0f} {record.throughput_unit or ''} | {_ms(step_ms)} | "
            f"{_pct(perf.mfu if perf else None)} | {record.wall_time_s or 0:.0f} |"
        )
        cells.append(
            {
                "key": cell.key,
                "status": record.status,
                "precision": record.precision,
                "throughput": record.throughput,
                "step_ms_median": step_ms,
                "mfu": perf.mfu if perf else None,
                "wall_time_s": record.wall_time_s,
                "error": record.error,
            }
        )
    matrix_run = read_matrix_run(matrix_dir)
    if matrix_run is not None:
        lines += ["", f"- matrix wall time {matrix_run.wall_time_s:.0f} s ({matrix_run.cells_trained} cells trained)"]
    ok = sum(c["status"] == "ok" for c in cells)
    precisions = sorted({str(c.get("precision")) for c in cells if c.get("precision")})
    headline = f"{ok}/{len(cells)} cells ok, precision {', '.join(precisions) or '–'}"
    data = {"exit_code": code, "cells": cells, "wall_time_s": matrix_run.wall_time_s if matrix_run else None}
    return Section("matrix", headline, lines, data, failed=code != 0 or ok != len(cells))


def section_compile(ctx: Context) -> Section:
    off = ctx.trainer_off or _trainer_run(ctx, compile=False)
    on = _trainer_run(ctx, compile=True)
    lines = [
        f"The trainer section's run with `model.compile=true` (`build_run_config` override), "
        f"{ctx.settings.trainer_steps} steps each; the step statistics leave out the warm-up steps (compilation). "
        "One run each: no interval.",
        "",
        *TRAINER_HEADER,
    ]
    failures = [x for x in (off, on) if isinstance(x, str)]
    lines += [_trainer_row(x) for x in (off, on) if not isinstance(x, str)]
    if failures:
        lines += ["", *[f"- failed: {x}" for x in failures]]
        return Section("compile", "failed", lines, {"failures": failures}, failed=True)
    speedup = off["step_ms_median"] / on["step_ms_median"] if off["step_ms_median"] and on["step_ms_median"] else None
    warmup = process_seconds(on) - process_seconds(off)
    lines += [
        "",
        f"- compiled step time: {'–' if speedup is None else f'{speedup:.2f}x'} as fast as eager (median step times); "
        f"the compiled run's wall time is {warmup:+.0f} s longer (compilation, net of faster steps)",
    ]
    headline = f"compiled steps {'–' if speedup is None else f'{speedup:.2f}x'} faster, {warmup:+.0f} s wall time"
    ok = off["status"] == on["status"] == "ok"
    return Section("compile", headline, lines, {"off": off, "on": on, "speedup": speedup}, failed=not ok)


RUNNERS: dict[str, Callable[[Context], Section]] = {
    "throughput": section_throughput,
    "trainer": section_trainer,
    "gradients": section_gradients,
    "matrix": section_matrix,
    "compile": section_compile,
}


# ---------------------------------------------------------------------------------- the report
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


def report(sections: list[Section], gpu: dict[str, Any], machine: dict[str, Any], command: str, minutes: float) -> str:
    lines = report_header("blockbench on a GPU: the GPU check", command, machine, note=f" in {minutes:.1f} min")
    lines += [
        f"- GPU: {gpu['name']} (compute capability {gpu['capability']}, {gpu['memory_gib']} GiB)"
        + (f", {gpu['count']} visible, the first used" if gpu["count"] > 1 else "")
        + f"; driver {gpu['driver'] or 'unknown'}, CUDA {gpu['cuda']} (torch's), cuDNN {gpu['cudnn']}, "
        f"NCCL {gpu['nccl'] or 'unknown'}",
        "",
        "| section | result | seconds |",
        "|---|---|---|",
    ]
    lines += [f"| {s.name} | {'FAILED: ' if s.failed else ''}{s.headline} | {s.seconds:.0f} |" for s in sections]
    for s in sections:
        lines += ["", f"## {s.name}: {SECTIONS[s.name]}", "", *s.lines]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- arguments
def section_names(value: str) -> list[str]:
    """``--skip`` values: section names, several at once comma-separated (``matrix,compile``)."""
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
        epilog="sections: " + "; ".join(f"{name}: {what}" for name, what in SECTIONS.items()),
    )
    parser.add_argument(
        "--nanogpt", default=None, metavar="PATH", help="nanoGPT's model.py, or the folder of a clone of it"
    )
    parser.add_argument("--quick", action="store_true", help="shorter: 1 round, fewer steps, the matrix's seed 0 only")
    parser.add_argument(
        "--skip",
        nargs="+",
        type=section_names,
        default=[],
        metavar="SECTION",
        help=f"sections to leave out ({', '.join(SECTIONS)})",
    )
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=DTYPES, help="throughput dtypes")
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="the GPU's peak for MFU (default: the trainer's peak_flops)"
    )
    parser.add_argument("--jobs", default="auto", help="the matrix's --jobs (default auto)")
    parser.add_argument(
        "--runs",
        default=None,
        metavar="DIR",
        help="where the trainer runs and the matrix go (default: a temporary folder)",
    )
    parser.add_argument(
        "--out", default="results/gpu.md", help="markdown report, and its .json beside it ('-': print only)"
    )
    parser.add_argument("--plan", action="store_true", help="print what would run and a rough time, then exit")
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
        print(format_plan(plan(args)))
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
    print(format_plan(planned), flush=True)
    started = time.perf_counter()
    runs = Path(args.runs) if args.runs else Path(tempfile.mkdtemp(prefix="gpu_check-"))
    ctx = Context(args, QUICK if args.quick else FULL, runs)
    sections = []
    try:
        for section in planned:
            print(f"== {section.name}: {section.what}", flush=True)
            t0 = time.perf_counter()
            try:
                outcome = RUNNERS[section.name](ctx)
            except Exception as error:  # the other sections still run and report
                tail = traceback.format_exc().strip().splitlines()[-3:]
                outcome = Section(
                    section.name,
                    f"{type(error).__name__}: {error}",
                    ["Failed:", "", "```", *tail, "```"],
                    {"error": str(error)},
                    failed=True,
                )
            outcome.seconds = time.perf_counter() - t0
            sections.append(outcome)
            print(f"== {section.name}: {'FAILED: ' if outcome.failed else ''}{outcome.headline}", flush=True)
    finally:
        if not args.runs:
            shutil.rmtree(runs, ignore_errors=True)
    minutes = (time.perf_counter() - started) / 60
    command = command_line("benchmarks/gpu_check.py", argv)
    gpu = gpu_facts()
    machine = machine_facts("cuda", torch.get_num_threads(), package_versions())
    text = report(sections, gpu, machine, command.strip(), minutes)
    print_and_write(text, args.out)
    if args.out != "-":
        summary = {
            "gpu": gpu,
            "machine": machine,
            "minutes": round(minutes, 2),
            "sections": {s.name: {"failed": s.failed, "seconds": round(s.seconds, 1), **s.data} for s in sections},
        }
        json_path = Path(args.out).with_suffix(".json")
        json_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        print(f"wrote {json_path}")
    return 1 if any(s.failed for s in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
