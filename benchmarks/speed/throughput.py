"""Training-step throughput of blockbench's models against the implementations people already use.

    pip install -e ".[bench]"
    python -m benchmarks.speed.throughput --nanogpt ~/nanoGPT  # all shapes, fp32 and bf16, writes results/throughput.md
    python -m benchmarks.speed.throughput --shapes lm_gpt --dtypes fp32 --rounds 1 --out -   # a quick look

nanoGPT is timed from the user's clone (``--nanogpt``: its model.py or its folder) and litgpt when it
is installed; without them the report says they were not run and how to run them.

One training step is ``zero_grad -> forward -> loss -> backward -> AdamW step`` on a fixed random
batch, with the same optimizer (``torch.optim.AdamW``, fused where the device supports it, as
blockbench's tasks use it) for every implementation. Each implementation computes its loss the way it
is trained: ours through the loss functions blockbench's tasks call in training, the references as
their users do (``F.cross_entropy`` on the logits). Every (implementation, dtype) is timed in a
separate process; rounds run interleaved over all of them (``benchmarks.harness.interleaved``: order
reversed every other round), so a slow phase of a shared machine hits every implementation alike. The
step time is the median over the timed steps of all rounds, after warm-up steps
(``benchmarks.harness.time_calls``). The ratio of our throughput to a reference's comes with a 95%
interval over rounds (``benchmarks.harness.ratio_interval``); a ratio whose interval includes 1 is a tie.

bf16 runs only where the device has bf16 matmuls of its own: on a CPU without AVX512-BF16 or AMX
(``bf16_skip_note``) they are emulated, many times slower than fp32, and the run skips bf16 with a
one-line note (``--emulated-bf16`` runs it anyway).

Model FLOPs per step are counted once per run with ``torch.utils.flop_counter.FlopCounterMode``
(see ``blockbench.cell.perf``); MFU divides the achieved FLOP/s by the device's peak: ``--peak-tflops``,
or a short matmul probe in the run's dtype. The same script runs unchanged on a GPU (CUDA
synchronisation around the timed steps, bf16 autocast on CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RATIO_METHOD,
    command_line,
    interleaved,
    machine_facts,
    module_command,
    module_env,
    ratio_interval,
    report_header,
    time_calls,
)
from benchmarks.parity.implementations import IMPLEMENTATIONS as ALL_IMPLEMENTATIONS
from benchmarks.parity.implementations import Dims, load_nanogpt, package_versions, require_packages


# --------------------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shape:
    name: str
    description: str
    unit: str  # what the throughput counts
    dims: Dims


SHAPES = {
    s.name: s
    for s in (
        Shape(
            "lm_gpt",
            "GPT: vocab 8192, d 256, 4 layers, 4 heads, ctx 256, batch 16, FFN 1024 GELU, "
            "learned positions, pre-LN, biases, tied embeddings",
            "tokens",
            Dims(d_model=256, n_layers=4, n_heads=4, d_ff=1024, batch=16, vocab=8192, seq_len=256),
        ),
        Shape(
            "lm_llama",
            "Llama: vocab 8192, d 256, 4 layers, 4 query / 2 key-value heads, ctx 256, batch 16, "
            "SwiGLU 704, RMSNorm, RoPE, no biases, untied embeddings",
            "tokens",
            Dims(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=1056, batch=16, vocab=8192, seq_len=256),
        ),
        Shape(
            "vit",
            "ViT: 3x32x32 images, patch 4 (64 patches + CLS), d 256, 6 layers, 4 heads, MLP 1024 GELU, "
            "10 classes, batch 64",
            "images",
            Dims(d_model=256, n_layers=6, n_heads=4, d_ff=1024, batch=64, image_size=32, patch_size=4, n_classes=10),
        ),
        Shape(
            "seq2seq",
            "encoder-decoder: shared vocab 8192, d 256, 3+3 layers, 4 heads, FFN 1024 ReLU, post-LN, "
            "sinusoidal positions, source/target length 64, batch 32, tied embeddings",
            "target tokens",
            Dims(
                d_model=256,
                n_layers=3,
                n_heads=4,
                d_ff=1024,
                batch=32,
                vocab=8192,
                seq_len=64,
                norm_placement="post",
                activation="relu",
            ),
        ),
    )
}

#: the implementations timed (benchmarks/parity/implementations.py builds them); each belongs to the shape of its family
TIMED = (
    "blockbench",
    "hf_gpt2",
    "nanogpt",
    "litgpt_gpt",
    "blockbench_llama",
    "hf_llama",
    "litgpt_llama",
    "blockbench_vit",
    "timm_vit",
    "blockbench_seq2seq",
    "torch_transformer",
)
IMPLEMENTATIONS = {name: ALL_IMPLEMENTATIONS[name] for name in TIMED}


# ------------------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> None:
    """Time one implementation in one dtype; print one JSON line."""
    import torch

    from blockbench.cell.perf import measure_peak_flops

    torch.set_num_threads(args.threads)
    impl = IMPLEMENTATIONS[args.impl]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    device = torch.device(args.device)

    def peak() -> float:
        return args.peak_tflops * 1e12 if args.peak_tflops else measure_peak_flops(device, dtype).tflops * 1e12

    record = time_training_step(
        args.impl,
        impl.family,
        SHAPES[impl.family].dims,
        args.dtype,
        args.device,
        warmup=args.warmup,
        min_steps=args.min_steps,
        max_steps=args.max_steps,
        min_seconds=args.min_seconds,
        peak=peak,
        sources={"nanogpt": args.nanogpt},
    )
    print("RESULT " + json.dumps(record), flush=True)


@dataclass
class TrainingStep:
    """One implementation's training step, built and ready to time: ``step()`` runs zero_grad,
    forward, loss, backward and the AdamW step; ``flops`` its model FLOPs (counted before any
    compilation); ``record`` the figures a timing record carries besides its step times."""

    step: Callable[[], None]
    flops: int | None
    record: dict[str, Any]


def build_training_step(
    impl_name: str,
    shape: str,
    dims: Dims,
    dtype_name: str,
    device_name: str,
    *,
    sources: Mapping[str, str | Path | None] | None = None,
    compile: bool = False,
    compile_backend: str = "inductor",
) -> TrainingStep:
    """The training step of ``impl_name`` (``ALL_IMPLEMENTATIONS``) built at ``dims`` in ``dtype_name``
    ("fp32" or "bf16": autocast) on ``device_name``; with ``compile`` its model is ``torch.compile``d
    with ``compile_backend`` (the FLOPs are counted on the eager model; the first steps compile).
    ``shape`` names ``dims``."""
    import torch

    from blockbench.cell.perf import count_training_flops
    from blockbench.provenance import cpu_model

    device = torch.device(device_name)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    run = ALL_IMPLEMENTATIONS[impl_name].make(torch, generator, dims, sources)
    model = run.model.to(device).train()
    batch = tuple(t.to(device) for t in run.batch)
    fused = device.type in ("cpu", "cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=fused or None)

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)

    flops = count_training_flops(model, lambda: run.loss(model, batch), context=autocast)
    optimizer.zero_grad(set_to_none=True)
    stepped = torch.compile(model, backend=compile_backend) if compile else model

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = run.loss(stepped, batch)
        loss.backward()
        optimizer.step()

    params = {id(p): p.numel() for p in model.parameters() if p.requires_grad}
    record = {
        "impl": impl_name,
        "shape": shape,
        "dtype": dtype_name,
        "device": str(device),
        "compiled": compile,
        "flops_per_step": flops,
        "parameters": sum(params.values()),
        "items": run.items,
        "note": run.note,
        "param_difference": run.param_difference,
        "param_difference_why": run.param_difference_why,
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    return TrainingStep(step, flops, record)


def time_training_step(
    impl_name: str,
    shape: str,
    dims: Dims,
    dtype_name: str,
    device_name: str,
    *,
    warmup: int,
    min_steps: int,
    max_steps: int,
    min_seconds: float,
    peak: Callable[[], float],
    sources: Mapping[str, str | Path | None] | None = None,
) -> dict[str, Any]:
    """Time the training steps of ``impl_name`` (:func:`build_training_step`): ``warmup`` untimed
    steps, then timed steps until at least ``min_steps`` steps and ``min_seconds`` seconds (at most
    ``max_steps``). ``peak``: the device's peak FLOP/s, called once after the timed steps. The
    record is what :func:`merge` pools (``step_s``: every timed step's seconds); ``shape`` names
    ``dims`` in it."""
    built = build_training_step(impl_name, shape, dims, dtype_name, device_name, sources=sources)
    timed = time_calls(
        built.step, warmup=warmup, min_calls=min_steps, max_calls=max_steps, min_seconds=min_seconds, device=device_name
    )
    record = {key: value for key, value in built.record.items() if key != "compiled"}
    return {**record, "step_s": timed.times, "peak_flops": peak()}


# ------------------------------------------------------------------------------------- driver
def run_worker(impl: str, dtype: str, args: argparse.Namespace) -> dict[str, Any] | str:
    command = module_command(
        __spec__.name,
        "--worker",
        "--impl",
        impl,
        "--dtype",
        dtype,
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        "--warmup",
        str(args.warmup),
        "--min-steps",
        str(args.min_steps),
        "--max-steps",
        str(args.max_steps),
        "--min-seconds",
        str(args.min_seconds),
    )
    if args.peak_tflops:
        command += ["--peak-tflops", str(args.peak_tflops)]
    if args.nanogpt:
        command += ["--nanogpt", str(args.nanogpt)]
    env = module_env({**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"})
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return f"{impl} {dtype} failed (exit {proc.returncode}): " + " | ".join(tail)


def merge(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool the rounds of one (implementation, dtype); ``rounds`` says which round each median is of."""
    times = [t for r in records for t in r["step_s"]]
    first = records[0]
    median = statistics.median(times)
    return {
        **{
            k: first[k]
            for k in (
                "impl",
                "shape",
                "dtype",
                "device",
                "flops_per_step",
                "parameters",
                "items",
                "note",
                "param_difference",
                "param_difference_why",
                "cpu",
                "cpu_capability",
            )
        },
        "steps": len(times),
        "step_ms_median": median * 1e3,
        "step_ms_min": min(times) * 1e3,
        "step_ms_max": max(times) * 1e3,
        "round_medians_ms": [statistics.median(r["step_s"]) * 1e3 for r in records],
        "rounds": [r["round"] for r in records],
        "throughput": first["items"] / median,
        "achieved_tflops": first["flops_per_step"] / median / 1e12,
        "peak_tflops": max(r["peak_flops"] for r in records) / 1e12,
    }


# ------------------------------------------------------------------------------ machine, bf16
#: ``torch.backends.cpu.get_cpu_capability()`` values (its docstring lists them all) of x86 CPUs without
#: AVX-512, which have no bf16 dot-product instructions: torch emulates their bf16 matmuls
NO_NATIVE_BF16 = ("NO AVX", "AVX2")
#: a bf16 matmul this many times slower than an fp32 one is emulated: native bf16 is at least as fast
#: as fp32, AVX2's emulation measured 12-19x slower at 128² and 256²
EMULATED_BF16_SLOWDOWN = 2.0


def bf16_matmul_slowdown(size: int = 256, calls: int = 5) -> float:
    """Time of a bf16 matmul over an fp32 one of the same size, each the fastest of ``calls`` (other
    processes only ever slow a call down): about 0.1 s on a CPU that emulates bf16."""
    import torch

    def fastest(dtype) -> float:
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        return min(time_calls(lambda: a @ b, warmup=1, min_calls=calls).times)  # warm-up: allocation, kernels

    return fastest(torch.bfloat16) / fastest(torch.float32)


def bf16_skip_note(capability: str, native: bool | None, slowdown: Callable[[], float]) -> str | None:
    """The one line saying why this CPU skips bf16, or None to run it.

    ``capability`` is ``torch.backends.cpu.get_cpu_capability()``: "AVX2" or "NO AVX" means no
    AVX-512 and so no bf16 instructions. "AVX512" does not tell AVX512-BF16 apart from plain AVX-512,
    so ``native`` (``native_bf16_instructions``) decides; where it is None (other architectures:
    "DEFAULT", "SVE256", "VSX", "Z VECTOR"), ``slowdown`` times a bf16 matmul against fp32."""
    anyway = "(--emulated-bf16 runs it anyway)"
    if capability in NO_NATIVE_BF16:
        return (
            f"bf16 skipped: this CPU ({capability}) has no native bf16 (AVX512-BF16 or AMX); its bf16 matmuls are "
            f"emulated, many times slower than fp32 {anyway}"
        )
    if native is not None:
        return (
            None
            if native
            else (
                f"bf16 skipped: this CPU ({capability}) has neither AVX512-BF16 nor AMX; its bf16 "
                f"matmuls are emulated {anyway}"
            )
        )
    factor = slowdown()
    if factor > EMULATED_BF16_SLOWDOWN:
        return (
            f"bf16 skipped: a bf16 matmul took {factor:.1f}x as long as fp32 on this CPU ({capability}), so its bf16 "
            f"is emulated {anyway}"
        )
    return None


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our ratio to every reference of each shape and dtype, the fastest reference (lowest median
    step time) first; a reference that shared no round with ours has no ratio."""
    rows = []
    for shape in SHAPES:
        for dtype in ("fp32", "bf16"):
            cell = [r for r in results if r["shape"] == shape and r["dtype"] == dtype]
            ours = [r for r in cell if IMPLEMENTATIONS[r["impl"]].ours]
            theirs = sorted((r for r in cell if not IMPLEMENTATIONS[r["impl"]].ours), key=lambda r: r["step_ms_median"])
            if not ours:
                continue
            per_round = dict(zip(ours[0]["rounds"], ours[0]["round_medians_ms"], strict=True))
            for rank, reference in enumerate(theirs):
                try:
                    ratio = ratio_interval(
                        per_round, dict(zip(reference["rounds"], reference["round_medians_ms"], strict=True))
                    )
                except ValueError:
                    continue
                rows.append(
                    {
                        "shape": shape,
                        "dtype": dtype,
                        "ours": ours[0]["impl"],
                        "reference": reference["impl"],
                        "fastest": rank == 0,
                        "ours_ms": ours[0]["step_ms_median"],
                        "reference_ms": reference["step_ms_median"],
                        **asdict(ratio),
                        "verdict": ratio.verdict,
                    }
                )
    return rows


def _interval(row: dict[str, Any]) -> str:
    return "–" if row["low"] is None else f"{row['low']:.2f}–{row['high']:.2f}"


def _params_vs_ours(reference: dict[str, Any], ours: dict[str, Any]) -> str:
    """The reference's parameters minus ours, and whether its builder expected that difference."""
    difference = reference["parameters"] - ours["parameters"]
    if difference == reference["param_difference"] == 0:
        return "same"
    if difference == reference["param_difference"]:
        return f"{difference:+,} ({reference['param_difference_why']})"
    return f"**{difference:+,}, expected {reference['param_difference']:+,}**: the shapes do not match"


# ------------------------------------------------------------------------------------ report
def report(
    results: list[dict[str, Any]],
    failures: list[str],
    args: argparse.Namespace,
    command: str,
    machine: dict[str, Any],
    not_run: list[str],
) -> str:
    lines = report_header("Training-step throughput: blockbench vs the implementations people use", command, machine)
    lines += [
        f"- {args.rounds} interleaved round{'s' if args.rounds != 1 else ''}; per run {args.warmup} warm-up steps, "
        "then timed steps until "
        f">= {args.min_steps} steps and >= {args.min_seconds} s (at most {args.max_steps}).",
        "- Step = zero_grad + forward + loss + backward + AdamW (fused) step; bf16 = `torch.autocast` "
        "(parameters, gradients and optimizer state stay fp32).",
        f"- Ratio = our throughput / the reference's, with a 95% interval over rounds: {RATIO_METHOD}. "
        "A ratio whose interval includes 1.0 is a tie.",
    ]
    lines += [f"- {note}" for note in not_run]
    rows = ratios(results)
    lines += [
        "",
        "## Ours / fastest reference",
        "",
        "| shape | dtype | blockbench step ms | fastest reference | its step ms | ratio ours/theirs (throughput) | "
        "95% interval | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['shape']} | {r['dtype']} | {r['ours_ms']:.0f} | {r['reference']} | {r['reference_ms']:.0f} | "
        f"**{r['ratio']:.2f}** | {_interval(r)} | {r['verdict']} |"
        for r in rows
        if r["fastest"]
    ]
    if any(r["low"] is None for r in rows):
        lines += ["", "A single round timed these: no interval, so no verdict (run `--rounds 3` or more)."]
    by_key = {(r["impl"], r["dtype"]): r for r in results}
    lines += [
        "",
        "## Ours / every reference",
        "",
        "| shape | dtype | reference | its step ms | ratio ours/theirs | 95% interval | verdict | "
        "parameters - blockbench's |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['shape']} | {r['dtype']} | {r['reference']} | {r['reference_ms']:.0f} | {r['ratio']:.2f} | "
        f"{_interval(r)} | {r['verdict']} | "
        f"{_params_vs_ours(by_key[(r['reference'], r['dtype'])], by_key[(r['ours'], r['dtype'])])} |"
        for r in rows
    ]
    spreads = sorted(
        (max(r["round_medians_ms"]) - min(r["round_medians_ms"])) / r["step_ms_median"]
        for r in results
        if len(r["round_medians_ms"]) > 1
    )
    if spreads:
        lines += [
            "",
            f"Noise: the spread of a run's round medians, (max - min) / median, is "
            f"{statistics.median(spreads):.0%} for the typical run and up to {spreads[-1]:.0%}; the "
            "intervals above, over the rounds' paired ratios, decide what is a tie.",
        ]
    lines += [
        "",
        "## Every run",
        "",
        "| implementation | shape | dtype | params | step ms median (min–max) | round medians ms | throughput | "
        "GFLOP/step | achieved TFLOP/s | peak TFLOP/s | MFU | steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (list(SHAPES).index(r["shape"]), r["dtype"], r["impl"])):
        unit = SHAPES[r["shape"]].unit
        lines.append(
            f"| {r['impl']} | {r['shape']} | {r['dtype']} | {r['parameters']:,} | {r['step_ms_median']:.0f} "
            f"({r['step_ms_min']:.0f}–{r['step_ms_max']:.0f}) | "
            f"{'/'.join(f'{m:.0f}' for m in r['round_medians_ms'])} | "
            f"{r['throughput']:,.0f} {unit}/s | {r['flops_per_step'] / 1e9:.1f} | {r['achieved_tflops']:.3f} | "
            f"{r['peak_tflops']:.3f} | {r['achieved_tflops'] / r['peak_tflops']:.1%} | {r['steps']} |"
        )
    if failures:
        lines += ["", "## Failed runs", ""] + [f"- {f}" for f in failures]
    lines += ["", "## Shapes and implementations", ""]
    lines += [f"- **{s.name}**: {s.description}" for s in SHAPES.values()]
    notes = {r["impl"]: r for r in results}  # one note per implementation
    lines += [""] + [f"- **{r['impl']}** ({r['shape']}): {r['note']}" for r in notes.values()]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument(
        "--impls",
        nargs="+",
        default=None,
        choices=list(IMPLEMENTATIONS),
        help="default: every implementation of the chosen shapes",
    )
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    # 5: the t quantile of a 95% interval is 4.30 with 3 rounds and 2.78 with 5, an interval 1.5x
    # narrower for 5/3 of the time; 1 round gives no interval at all
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 2 for an interval of each ratio)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--min-steps", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--min-seconds", type=float, default=8.0)
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="device peak for MFU (default: measured by a matmul probe in each run's dtype)",
    )
    parser.add_argument(
        "--nanogpt",
        default=None,
        metavar="PATH",
        help="nanoGPT's model.py, or the folder of a clone of it: times nanoGPT on the GPT shape",
    )
    parser.add_argument(
        "--emulated-bf16",
        action="store_true",
        help="run bf16 on a CPU without native bf16 too (emulated: many times slower than fp32)",
    )
    parser.add_argument("--out", default="results/throughput.md", help="markdown report ('-': print only)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if _cuda_available() else "cpu")
    if args.worker:
        return worker(args)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    impls = [i for i in (args.impls or IMPLEMENTATIONS) if IMPLEMENTATIONS[i].family in args.shapes]
    require_packages([IMPLEMENTATIONS[i] for i in impls])
    if args.nanogpt:
        try:  # a wrong path fails here, not after minutes of the other runs
            load_nanogpt(args.nanogpt)
        except (OSError, ImportError) as error:
            sys.exit(str(error))
    not_run = []
    for impl in list(impls):
        why = IMPLEMENTATIONS[impl].unavailable({"nanogpt": args.nanogpt})
        if why:
            impls.remove(impl)
            not_run.append(f"{impl} {why}")
    machine = machine_facts(args.device, args.threads, package_versions())
    dtypes = list(args.dtypes)
    if "bf16" in dtypes and args.device == "cpu" and not args.emulated_bf16:
        note = bf16_skip_note(machine["cpu_capability"], machine["native_bf16"], bf16_matmul_slowdown)
        if note:
            dtypes.remove("bf16")
            not_run.append(note)
    for note in not_run:
        print(note)
    runs = [(impl, dtype) for impl in impls for dtype in dtypes]
    records: dict[tuple[str, str], list[dict[str, Any]]] = {run: [] for run in runs}
    failures: list[str] = []
    for i, (round_index, (impl, dtype)) in enumerate(interleaved(args.rounds, runs)):
        print(
            f"round {round_index + 1}/{args.rounds} run {i % len(runs) + 1}/{len(runs)}: {impl} {dtype} ...",
            end=" ",
            flush=True,
        )
        outcome = run_worker(impl, dtype, args)
        if isinstance(outcome, str):
            print("FAILED")
            failures.append(outcome)
            continue
        records[(impl, dtype)].append({**outcome, "round": round_index})
        print(f"{statistics.median(outcome['step_s']) * 1e3:.0f} ms/step")
    results = [merge(rs) for rs in records.values() if rs]
    text = report(results, failures, args, command_line(__spec__.name, argv), machine, not_run)
    print(text)
    if args.out != "-":
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        summary = {
            "machine": machine,
            "not_run": not_run,
            "failures": failures,
            "ratios": ratios(results),
            "runs": results,
        }
        out.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {out} and {out.with_suffix('.json')}")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
