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
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing


# --------------------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shape:
    name: str
    description: str
    unit: str  # what the throughput counts


SHAPES = {
    s.name: s
    for s in (
        Shape("lm_gpt", "GPT: vocab 8192, d 256, 4 layers, 4 heads, ctx 256, batch 16, FFN 1024 GELU, "
                        "learned positions, pre-LN, biases, tied embeddings", "tokens"),
        Shape("lm_llama", "Llama: vocab 8192, d 256, 4 layers, 4 query / 2 key-value heads, ctx 256, batch 16, "
                          "SwiGLU 704, RMSNorm, RoPE, no biases, untied embeddings", "tokens"),
        Shape("vit", "ViT: 3x32x32 images, patch 4 (64 patches + CLS), d 256, 6 layers, 4 heads, MLP 1024 GELU, "
                     "10 classes, batch 64", "images"),
        Shape("seq2seq", "encoder-decoder: shared vocab 8192, d 256, 3+3 layers, 4 heads, FFN 1024 ReLU, post-LN, "
                         "sinusoidal positions, source/target length 64, batch 32, tied embeddings", "target tokens"),
    )
}
VOCAB, LM_BATCH, CTX = 8192, 16, 256
VIT_BATCH, SEQ_BATCH, SEQ_LEN = 64, 32, 64


@dataclass
class Run:
    """What one implementation needs for a timed step: the model, a batch, and its loss."""

    model: Any
    batch: tuple
    loss: Callable[[Any, tuple], Any]
    items: int  # tokens or images per step
    note: str


# ------------------------------------------------------------------------------ implementations
def _token_batch(torch, generator, rows: int, length: int):
    return torch.randint(0, VOCAB, (rows, length), generator=generator)


def _ours(model_fields: dict[str, Any]):
    from models import ModelConfig, build_model

    return build_model(ModelConfig(**model_fields))


def ours_lm_gpt(torch, generator) -> Run:
    from tasks.lm import next_token_loss

    model = _ours(dict(family="decoder_lm", vocab_size=VOCAB, max_seq_len=CTX, d_model=256, n_layers=4, n_heads=4,
                       d_ff=1024, activation="gelu", norm="layernorm", norm_placement="pre", pos_encoding="learned",
                       bias=True, tie_embeddings=True))
    rows = _token_batch(torch, generator, LM_BATCH, CTX + 1)
    return Run(model, (rows,), lambda m, b: next_token_loss(m, b[0]), LM_BATCH * CTX,
               "blockbench decoder_lm; loss: tasks.lm.next_token_loss (as the LM tasks train)")


def ours_lm_llama(torch, generator) -> Run:
    from tasks.lm import next_token_loss

    model = _ours(dict(family="decoder_lm", vocab_size=VOCAB, max_seq_len=CTX, d_model=256, n_layers=4, n_heads=4,
                       n_kv_heads=2, d_ff=1056, ffn="swiglu", norm="rmsnorm", norm_eps=1e-6, norm_placement="pre",
                       pos_encoding="rope", bias=False, tie_embeddings=False))
    rows = _token_batch(torch, generator, LM_BATCH, CTX + 1)
    return Run(model, (rows,), lambda m, b: next_token_loss(m, b[0]), LM_BATCH * CTX,
               "blockbench decoder_lm (rmsnorm, rope, swiglu with d_ff 1056 = hidden 704, n_kv_heads 2, no bias)")


def ours_vit(torch, generator) -> Run:
    from tasks.vision import classification_loss

    model = _ours(dict(family="vit", image_size=32, patch_size=4, in_channels=3, n_classes=10, d_model=256,
                       n_layers=6, n_heads=4, d_ff=1024, activation="gelu", norm="layernorm", norm_placement="pre",
                       pos_encoding="learned", bias=True))
    images = torch.randn(VIT_BATCH, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (VIT_BATCH,), generator=generator)
    return Run(model, (images, labels), lambda m, b: classification_loss(m, *b), VIT_BATCH,
               "blockbench vit; loss: tasks.vision.classification_loss")


def ours_seq2seq(torch, generator) -> Run:
    from tasks.translation import teacher_forcing_loss

    model = _ours(dict(family="encoder_decoder", vocab_size=VOCAB, max_seq_len=SEQ_LEN + 1, d_model=256, n_layers=3,
                       n_heads=4, d_ff=1024, activation="relu", norm="layernorm", norm_placement="post",
                       pos_encoding="sinusoidal", bias=True, tie_embeddings=True))
    src = _token_batch(torch, generator, SEQ_BATCH, SEQ_LEN).clamp(min=1)  # id 0 is padding
    tgt = _token_batch(torch, generator, SEQ_BATCH, SEQ_LEN + 1).clamp(min=1)
    return Run(model, (src, tgt), lambda m, b: teacher_forcing_loss(m, *b, pad_id=0), SEQ_BATCH * SEQ_LEN,
               "blockbench encoder_decoder; loss: tasks.translation.teacher_forcing_loss (padding masks as in training)")


def _lm_logits_loss(torch):
    import torch.nn.functional as F

    def loss(model, batch):
        rows = batch[0]
        logits = model(input_ids=rows[:, :-1]).logits
        return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())

    return loss


def hf_gpt2(torch, generator) -> Run:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=256, n_layer=4, n_head=4,
                        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
    rows = _token_batch(torch, generator, LM_BATCH, CTX + 1)
    return Run(model, (rows,), _lm_logits_loss(torch), LM_BATCH * CTX,
               "transformers GPT2LMHeadModel, sdpa attention, exact GELU (GPT-2's default is the tanh approximation), tied")


def hf_llama(torch, generator) -> Run:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CTX,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    rows = _token_batch(torch, generator, LM_BATCH, CTX + 1)
    return Run(model, (rows,), _lm_logits_loss(torch), LM_BATCH * CTX,
               "transformers LlamaForCausalLM, sdpa attention, rope_theta 1e4, untied")


def timm_vit(torch, generator) -> Run:
    import torch.nn.functional as F
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=256, depth=6, num_heads=4, mlp_ratio=4,
                              num_classes=10, qkv_bias=True, global_pool="token")
    images = torch.randn(VIT_BATCH, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (VIT_BATCH,), generator=generator)
    return Run(model, (images, labels), lambda m, b: F.cross_entropy(m(b[0]), b[1]), VIT_BATCH,
               "timm VisionTransformer (class token, fused SDPA attention, qkv bias)")


class TorchSeq2Seq:  # built lazily: torch is imported in the worker only
    @staticmethod
    def build(torch):
        import math

        import torch.nn.functional as F
        from torch import nn

        class Seq2Seq(nn.Module):
            """torch.nn.Transformer with what a translator adds around it: a shared embedding scaled by
            sqrt(d), sinusoidal positions and a tied output projection."""

            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(VOCAB, 256)
                self.transformer = nn.Transformer(256, 4, 3, 3, 1024, dropout=0.0, activation="relu",
                                                  batch_first=True, norm_first=False)
                position = torch.arange(SEQ_LEN + 1)[:, None]
                div = torch.exp(torch.arange(0, 256, 2) * (-math.log(10000.0) / 256))
                table = torch.zeros(SEQ_LEN + 1, 256)
                table[:, 0::2], table[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
                self.register_buffer("positions", table)

            def forward(self, src, tgt):
                def embed(t):
                    return self.embed(t) * 16.0 + self.positions[: t.shape[1]]

                causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
                pad = src == 0
                out = self.transformer(embed(src), embed(tgt), tgt_mask=causal, tgt_is_causal=True,
                                       src_key_padding_mask=pad, memory_key_padding_mask=pad)
                return F.linear(out, self.embed.weight)

        return Seq2Seq()


def torch_transformer(torch, generator) -> Run:
    import torch.nn.functional as F

    model = TorchSeq2Seq.build(torch)
    src = _token_batch(torch, generator, SEQ_BATCH, SEQ_LEN).clamp(min=1)
    tgt = _token_batch(torch, generator, SEQ_BATCH, SEQ_LEN + 1).clamp(min=1)

    def loss(m, b):
        src, tgt = b
        logits = m(src, tgt[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0)

    return Run(model, (src, tgt), loss, SEQ_BATCH * SEQ_LEN,
               "torch.nn.Transformer (post-LN, ReLU; adds a final LayerNorm to each stack) + shared embedding, "
               "sinusoidal positions, tied output; padding masks and causal mask as a user passes them")


#: implementation name -> (shape, builder, is ours, pip package it needs)
IMPLEMENTATIONS: dict[str, tuple[str, Callable, bool, str | None]] = {
    "blockbench": ("lm_gpt", ours_lm_gpt, True, None),
    "hf_gpt2": ("lm_gpt", hf_gpt2, False, "transformers"),
    "blockbench_llama": ("lm_llama", ours_lm_llama, True, None),
    "hf_llama": ("lm_llama", hf_llama, False, "transformers"),
    "blockbench_vit": ("vit", ours_vit, True, None),
    "timm_vit": ("vit", timm_vit, False, "timm"),
    "blockbench_seq2seq": ("seq2seq", ours_seq2seq, True, None),
    "torch_transformer": ("seq2seq", torch_transformer, False, None),
}


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
    shape, build, _, _ = IMPLEMENTATIONS[args.impl]
    run = build(torch, generator)
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
            ours = [r for r in results if r["shape"] == shape and r["dtype"] == dtype and IMPLEMENTATIONS[r["impl"]][2]]
            theirs = [r for r in results if r["shape"] == shape and r["dtype"] == dtype and not IMPLEMENTATIONS[r["impl"]][2]]
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


def package_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("transformers", "timm", "lightning"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


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

    impls = [i for i in (args.impls or IMPLEMENTATIONS) if IMPLEMENTATIONS[i][0] in args.shapes]
    missing = sorted({IMPLEMENTATIONS[i][3] for i in impls if IMPLEMENTATIONS[i][3] and not _importable(IMPLEMENTATIONS[i][3])})
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


def _importable(module: str) -> bool:
    from importlib.util import find_spec

    return find_spec(module) is not None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
