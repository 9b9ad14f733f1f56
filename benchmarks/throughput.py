"""Training-step throughput of blockbench's models against the implementations people already use.

    pip install -e ".[bench]"
    python benchmarks/throughput.py                      # all shapes, fp32 and bf16, writes results/throughput.md
    python benchmarks/throughput.py --shapes lm_gpt --dtypes fp32 --rounds 1 --out -   # a quick look

One training step is ``zero_grad -> forward -> loss -> backward -> AdamW step`` on a fixed random
batch, with the same optimizer (``torch.optim.AdamW``, fused where the device supports it, as
blockbench's tasks use it) for every implementation. Each implementation computes its loss the way it
is trained: ours through the loss functions blockbench's tasks call in training, the references as
their users do (``F.cross_entropy`` on the logits). Every (implementation, dtype) is timed in a
separate process; rounds run interleaved over all of them (order reversed every other round), so a
slow phase of a shared machine hits every implementation alike. The step time is the median over
the timed steps of all rounds, after warm-up steps.

Model FLOPs per step are counted once per run with ``torch.utils.flop_counter.FlopCounterMode``
(see ``blockbench.perf``); MFU divides the achieved FLOP/s by the device's peak: ``--peak-tflops``,
or a short matmul probe in the run's dtype. The same script runs unchanged on a GPU (CUDA
synchronisation around the timed steps, bf16 autocast on CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from implementations import IMPLEMENTATIONS as ALL_IMPLEMENTATIONS  # noqa: E402  (benchmarks/, the script's folder)
from implementations import Dims, missing_packages, package_versions  # noqa: E402


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
        Shape("lm_gpt", "GPT: vocab 8192, d 256, 4 layers, 4 heads, ctx 256, batch 16, FFN 1024 GELU, "
                        "learned positions, pre-LN, biases, tied embeddings", "tokens",
              Dims(d_model=256, n_layers=4, n_heads=4, d_ff=1024, batch=16, vocab=8192, seq_len=256)),
        Shape("lm_llama", "Llama: vocab 8192, d 256, 4 layers, 4 query / 2 key-value heads, ctx 256, batch 16, "
                          "SwiGLU 704, RMSNorm, RoPE, no biases, untied embeddings", "tokens",
              Dims(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=1056, batch=16, vocab=8192, seq_len=256)),
        Shape("vit", "ViT: 3x32x32 images, patch 4 (64 patches + CLS), d 256, 6 layers, 4 heads, MLP 1024 GELU, "
                     "10 classes, batch 64", "images",
              Dims(d_model=256, n_layers=6, n_heads=4, d_ff=1024, batch=64, image_size=32, patch_size=4, n_classes=10)),
        Shape("seq2seq", "encoder-decoder: shared vocab 8192, d 256, 3+3 layers, 4 heads, FFN 1024 ReLU, post-LN, "
                         "sinusoidal positions, source/target length 64, batch 32, tied embeddings", "target tokens",
              Dims(d_model=256, n_layers=3, n_heads=4, d_ff=1024, batch=32, vocab=8192, seq_len=64,
                   norm_placement="post", activation="relu")),
    )
}

#: the implementations timed (benchmarks/implementations.py builds them); each belongs to the shape of its family
TIMED = ("blockbench", "hf_gpt2", "blockbench_llama", "hf_llama", "blockbench_vit", "timm_vit", "blockbench_seq2seq",
         "torch_transformer")
IMPLEMENTATIONS = {name: ALL_IMPLEMENTATIONS[name] for name in TIMED}


# ------------------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> None:
    """Time one implementation in one dtype; print one JSON line."""
    import torch

    from blockbench.perf import count_training_flops, measure_peak_flops

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    impl = IMPLEMENTATIONS[args.impl]
    shape = impl.family
    run = impl.build(torch, generator, SHAPES[shape].dims)
    model = run.model.to(device).train()
    batch = tuple(t.to(device) for t in run.batch)
    fused = device.type in ("cpu", "cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=fused or None)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = run.loss(model, batch)
        loss.backward()
        optimizer.step()

    flops = count_training_flops(model, lambda: run.loss(model, batch), context=autocast)
    optimizer.zero_grad(set_to_none=True)
    for _ in range(args.warmup):
        step()
    synchronize()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < args.max_steps and (len(times) < args.min_steps or time.perf_counter() - started < args.min_seconds):
        t0 = time.perf_counter()
        step()
        synchronize()
        times.append(time.perf_counter() - t0)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else measure_peak_flops(device, dtype).tflops * 1e12
    params = {id(p): p.numel() for p in model.parameters() if p.requires_grad}
    record = {
        "impl": args.impl, "shape": shape, "dtype": args.dtype, "device": str(device), "step_s": times,
        "flops_per_step": flops, "peak_flops": peak, "parameters": sum(params.values()), "items": run.items,
        "note": run.note,
    }
    print("RESULT " + json.dumps(record), flush=True)


# ------------------------------------------------------------------------------------- driver
def run_worker(impl: str, dtype: str, args: argparse.Namespace) -> dict[str, Any] | str:
    command = [sys.executable, __file__, "--worker", "--impl", impl, "--dtype", dtype, "--device", args.device,
               "--threads", str(args.threads), "--warmup", str(args.warmup), "--min-steps", str(args.min_steps),
               "--max-steps", str(args.max_steps), "--min-seconds", str(args.min_seconds)]
    if args.peak_tflops:
        command += ["--peak-tflops", str(args.peak_tflops)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return f"{impl} {dtype} failed (exit {proc.returncode}): " + " | ".join(tail)


def merge(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool the rounds of one (implementation, dtype)."""
    times = [t for r in records for t in r["step_s"]]
    first = records[0]
    median = statistics.median(times)
    return {
        **{k: first[k] for k in ("impl", "shape", "dtype", "device", "flops_per_step", "parameters", "items", "note")},
        "steps": len(times),
        "step_ms_median": median * 1e3,
        "step_ms_min": min(times) * 1e3,
        "step_ms_max": max(times) * 1e3,
        "round_medians_ms": [statistics.median(r["step_s"]) * 1e3 for r in records],
        "throughput": first["items"] / median,
        "achieved_tflops": first["flops_per_step"] / median / 1e12,
        "peak_tflops": max(r["peak_flops"] for r in records) / 1e12,
    }


def report(results: list[dict[str, Any]], failures: list[str], args: argparse.Namespace, command: str) -> str:
    import torch

    lines = ["# Training-step throughput: blockbench vs the implementations people use", "",
             f"Produced by `{command}` on {time.strftime('%Y-%m-%d')}.", ""]
    device = results[0]["device"] if results else args.device
    cpu = platform.processor() or platform.machine()
    lines += [f"- Device: {device} ({cpu}, {os.cpu_count()} logical CPUs, torch threads {args.threads})"
              if device == "cpu" else f"- Device: {device} ({torch.cuda.get_device_name(0)})",
              f"- torch {torch.__version__}, Python {platform.python_version()}; " + package_versions(),
              f"- {args.rounds} interleaved rounds; per run {args.warmup} warm-up steps, then timed steps until "
              f">= {args.min_steps} steps and >= {args.min_seconds} s (at most {args.max_steps}).",
              "- Step = zero_grad + forward + loss + backward + AdamW (fused) step; bf16 = `torch.autocast` "
              "(parameters, gradients and optimizer state stay fp32).", ""]
    lines += ["## Ours / fastest reference", "",
              "| shape | dtype | blockbench step ms | fastest reference | its step ms | ratio ours/theirs (throughput) |",
              "|---|---|---|---|---|---|"]
    by_key = {(r["impl"], r["dtype"]): r for r in results}
    for shape in SHAPES:
        for dtype in args.dtypes:
            ours = [r for r in results if r["shape"] == shape and r["dtype"] == dtype and IMPLEMENTATIONS[r["impl"]].ours]
            theirs = [r for r in results if r["shape"] == shape and r["dtype"] == dtype and not IMPLEMENTATIONS[r["impl"]].ours]
            if not ours or not theirs:
                continue
            best = min(theirs, key=lambda r: r["step_ms_median"])
            ratio = best["step_ms_median"] / ours[0]["step_ms_median"]
            lines.append(f"| {shape} | {dtype} | {ours[0]['step_ms_median']:.0f} | {best['impl']} | "
                         f"{best['step_ms_median']:.0f} | **{ratio:.2f}** |")
    spreads = sorted((max(r["round_medians_ms"]) - min(r["round_medians_ms"])) / r["step_ms_median"]
                     for r in results if len(r["round_medians_ms"]) > 1)
    if spreads:
        lines += ["", f"Noise: the spread of a run's round medians, (max - min) / median, is "
                      f"{statistics.median(spreads):.0%} for the typical run and up to {spreads[-1]:.0%}. A ratio "
                      "closer to 1 than that is a tie on this machine, not a measured difference."]
    lines += ["", "## Every run", "",
              "| implementation | shape | dtype | params | step ms median (min–max) | round medians ms | throughput | "
              "GFLOP/step | achieved TFLOP/s | peak TFLOP/s | MFU | steps |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (list(SHAPES).index(r["shape"]), r["dtype"], r["impl"])):
        unit = SHAPES[r["shape"]].unit
        lines.append(
            f"| {r['impl']} | {r['shape']} | {r['dtype']} | {r['parameters']:,} | {r['step_ms_median']:.0f} "
            f"({r['step_ms_min']:.0f}–{r['step_ms_max']:.0f}) | {'/'.join(f'{m:.0f}' for m in r['round_medians_ms'])} | "
            f"{r['throughput']:,.0f} {unit}/s | {r['flops_per_step'] / 1e9:.1f} | {r['achieved_tflops']:.3f} | "
            f"{r['peak_tflops']:.3f} | {r['achieved_tflops'] / r['peak_tflops']:.1%} | {r['steps']} |")
    if failures:
        lines += ["", "## Failed runs", ""] + [f"- {f}" for f in failures]
    lines += ["", "## Shapes and implementations", ""]
    lines += [f"- **{s.name}**: {s.description}" for s in SHAPES.values()]
    lines += [""] + [f"- **{r['impl']}** ({r['shape']}): {r['note']}" for r in results if r["dtype"] == args.dtypes[0]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--impls", nargs="+", default=None, choices=list(IMPLEMENTATIONS),
                        help="default: every implementation of the chosen shapes")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--min-steps", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--min-seconds", type=float, default=8.0)
    parser.add_argument("--device", default="cuda" if _cuda_available() else "cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="device peak for MFU (default: measured by a matmul probe in each run's dtype)")
    parser.add_argument("--out", default="results/throughput.md", help="markdown report ('-': print only)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    impls = [i for i in (args.impls or IMPLEMENTATIONS) if IMPLEMENTATIONS[i].family in args.shapes]
    missing = missing_packages([IMPLEMENTATIONS[i] for i in impls])
    if missing:
        sys.exit(f"the reference implementations need {', '.join(missing)}: pip install -e \".[bench]\"")
    runs = [(impl, dtype) for impl in impls for dtype in args.dtypes]
    records: dict[tuple[str, str], list[dict[str, Any]]] = {run: [] for run in runs}
    failures: list[str] = []
    for round_index in range(args.rounds):
        order = runs if round_index % 2 == 0 else runs[::-1]
        for i, (impl, dtype) in enumerate(order, 1):
            print(f"round {round_index + 1}/{args.rounds} run {i}/{len(order)}: {impl} {dtype} ...", end=" ", flush=True)
            outcome = run_worker(impl, dtype, args)
            if isinstance(outcome, str):
                print("FAILED")
                failures.append(outcome)
                continue
            records[(impl, dtype)].append(outcome)
            print(f"{statistics.median(outcome['step_s']) * 1e3:.0f} ms/step")
    results = [merge(rs) for rs in records.values() if rs]
    command = "python benchmarks/throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(results, failures, args, command.strip())
    print(text)
    if args.out != "-":
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {out} and {out.with_suffix('.json')}")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
