"""Where a training step's time goes: the top operators of one step of each family, blockbench next
to a reference, with ``torch.profiler`` (self CPU time, the op's own time without its children).

    pip install -e ".[bench]"
    python benchmarks/profile_step.py                 # every shape, fp32; writes results/profile.md
    python benchmarks/profile_step.py --shapes vit --steps 3 --out -

The step is the one ``benchmarks/throughput.py`` times (``zero_grad -> forward -> loss -> backward ->
AdamW step`` on a fixed random batch, the same shapes and builders), run ``--warmup`` times, then
profiled over ``--steps`` steps; the table gives each operator's self CPU time per step and its share
of the step. What is not a matmul (``aten::mm``, ``aten::addmm``, ``aten::bmm``, ``aten::linear``'s
parts, SDPA) is what a faster implementation can still win on a CPU.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from implementations import require_packages  # noqa: E402  (benchmarks/, the script's folder)
from throughput import IMPLEMENTATIONS, SHAPES, code_note  # noqa: E402

#: per shape: blockbench's implementation and the reference it is profiled next to (the fastest in
#: the committed throughput run, or the one users pick)
PAIRS = {
    "lm_gpt": ("blockbench", "hf_gpt2"),
    "lm_llama": ("blockbench_llama", "hf_llama"),
    "vit": ("blockbench_vit", "timm_vit"),
    "seq2seq": ("blockbench_seq2seq", "torch_transformer"),
}
#: operators that do the model's matrix products
MATMUL_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::convolution_backward",
    "aten::mkldnn_convolution",
    "aten::linear",
    "aten::matmul",
)


def profile(
    impl_name: str, shape: str, steps: int, warmup: int, threads: int, top: int
) -> tuple[float, float, list[tuple[str, float, int]]]:
    """(operator ms per step, of it in matrix products, [(operator, self CPU ms per step, calls per step)]) of
    ``impl_name``, top ``top`` first."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    run = IMPLEMENTATIONS[impl_name].make(torch, torch.Generator().manual_seed(0), SHAPES[shape].dims, {})
    model = run.model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        run.loss(model, run.batch).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_ms = sum(e.self_cpu_time_total for e in events) / 1000 / steps
    matmul_ms = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS) / 1000 / steps
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return total_ms, matmul_ms, [(e.key, e.self_cpu_time_total / 1000 / steps, e.count // steps) for e in events[:top]]


def lead_bound(ours_matmul_ms: float, reference_total_ms: float) -> float:
    """The most our throughput can exceed the reference's with the same matrix products (Amdahl): our
    step if every other operator of ours took no time, against the reference's whole step."""
    return reference_total_ms / ours_matmul_ms


def main(argv: list[str] | None = None) -> None:
    import torch

    from blockbench.provenance import cpu_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", default="results/profile.md", help="markdown report ('-': print only)")
    args = parser.parse_args(argv)
    require_packages([IMPLEMENTATIONS[name] for shape in args.shapes for name in PAIRS[shape]])

    command = " ".join(["python benchmarks/profile_step.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [
        "# Where a training step's time goes",
        "",
        f"Produced by `{command}` on {datetime.date.today()}{code_note()}.",
        "",
        f"- CPU: {cpu_model()}, `torch.backends.cpu.get_cpu_capability()` = {torch.backends.cpu.get_cpu_capability()}, "
        f"{args.threads} torch threads; torch {torch.__version__}, fp32",
        f"- Each table: the top {args.top} operators by self CPU time (their own time, children excluded) per "
        f"training step, mean over {args.steps} profiled steps after {args.warmup} warm-up steps; the share is of "
        "the sum of all operators' self time. Profiling adds overhead per operator call, so step times here are "
        "above benchmarks/throughput.py's.",
        "",
    ]
    for shape in args.shapes:
        lines += [f"## {shape}", "", SHAPES[shape].description, ""]
        figures = {}
        for impl_name in PAIRS[shape]:
            total, matmul, top = profile(impl_name, shape, args.steps, args.warmup, args.threads, args.top)
            figures[impl_name] = (total, matmul)
            lines += [
                f"**{impl_name}**: {total:.1f} ms of operator time per step; matrix products and attention "
                f"{matmul:.1f} ms ({100 * matmul / total:.0f}%)",
                "",
                "| operator | ms / step | share | calls / step |",
                "|---|---|---|---|",
            ]
            lines += [f"| `{name}` | {ms:.2f} | {100 * ms / total:.1f}% | {calls} |" for name, ms, calls in top]
            lines.append("")
            print(f"{shape}/{impl_name}: {total:.1f} ms", flush=True)
        (ours_total, ours_matmul), (reference_total, _) = (figures[name] for name in PAIRS[shape])
        reference = PAIRS[shape][1]
        lines += [
            f"**Bound**: with the same matrix products, blockbench's throughput can exceed {reference}'s by at most "
            f"**{lead_bound(ours_matmul, reference_total):.2f}x**, and only if every other operator of ours took no "
            f"time ({reference_total:.0f} ms of {reference}'s operator time / {ours_matmul:.0f} ms of our matrix "
            f"products and attention); today's profiled ratio is {reference_total / ours_total:.2f}x.",
            "",
        ]
    text = "\n".join(lines)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
