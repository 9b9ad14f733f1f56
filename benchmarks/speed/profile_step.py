"""Where a training step's time goes: the top operators of one step of each family, blockbench next
to a reference, with ``torch.profiler`` (self CPU time, the op's own time without its children).

    pip install -e ".[bench]"
    python -m benchmarks.speed.profile_step                 # every shape, fp32; writes results/profile.md
    python -m benchmarks.speed.profile_step --shapes vit --steps 3 --out -
    python -m benchmarks.speed.profile_step --shapes gpt2_small --device cuda --dtype bf16 --out results/profile_gpu.md

The step is the one ``benchmarks.speed.throughput`` times (``zero_grad -> forward -> loss -> backward ->
AdamW step`` on a fixed random batch, the same shapes and builders), run ``--warmup`` times, then
profiled over ``--steps`` steps; the table gives each operator's self CPU time per step and its share
of the step. What is not a matmul (``aten::mm``, ``aten::addmm``, ``aten::bmm``, ``aten::linear``'s
parts, SDPA) is what a faster implementation can still win on a CPU. On a CUDA device the tables are kernels by
their own GPU time (what a GPU step waits for), the matrix products the GEMM and attention kernels.
"""

from __future__ import annotations

import argparse

from benchmarks.harness import command_line, machine_facts, print_and_write, report_header
from benchmarks.parity.implementations import GPT2_SMALL, GPT2_SMALL_NAME, describe_dims, require_packages
from benchmarks.speed.throughput import IMPLEMENTATIONS, SHAPES, Shape

#: the throughput shapes, and GPT-2 small (gpu_check's throughput shape, for a GPU)
SHAPES = {**SHAPES, GPT2_SMALL_NAME: Shape(GPT2_SMALL_NAME, describe_dims(GPT2_SMALL), "tokens", GPT2_SMALL)}

#: per shape: blockbench's implementation and the reference it is profiled next to (the fastest in
#: the committed throughput run, or the one users pick)
PAIRS = {
    "lm_gpt": ("blockbench", "hf_gpt2"),
    "lm_llama": ("blockbench_llama", "hf_llama"),
    "vit": ("blockbench_vit", "timm_vit"),
    "seq2seq": ("blockbench_seq2seq", "torch_transformer"),
    GPT2_SMALL_NAME: ("blockbench", "hf_gpt2"),
}
#: the shapes profiled unless --shapes names others (GPT-2 small is for a GPU)
DEFAULT_SHAPES = ["lm_gpt", "lm_llama", "vit", "seq2seq"]
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
#: CUDA kernels (names as the profiler gives them, lower case) that do matrix products or attention:
#: cuBLAS/CUTLASS GEMMs (sm90_xmma, cutlass, gemm, nvjet) and the SDPA kernels (flash, fmha, cudnn)
CUDA_MATMUL_KERNELS = ("gemm", "xmma", "cutlass", "nvjet", "flash", "fmha", "cudnn", "attention")


def profile(
    impl_name: str,
    shape: str,
    steps: int,
    warmup: int,
    threads: int,
    top: int,
    device: str = "cpu",
    dtype: str = "fp32",
) -> tuple[float, float, list[tuple[str, float, int]]]:
    """(operator ms per step, of it in matrix products, [(operator, self ms per step, calls per step)]) of
    ``impl_name``, top ``top`` first. On a CPU the time is each operator's self CPU time; on a CUDA
    device it is the self time of the kernels each operator launched (the GPU's time, which is what a
    step waits for there), and the matrix products are the GEMM and attention kernels."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    run = IMPLEMENTATIONS[impl_name].make(torch, torch.Generator().manual_seed(0), SHAPES[shape].dims, {})
    model = run.model.to(device).train()
    batch = tuple(t.to(device) for t in run.batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    cuda = torch.device(device).type == "cuda"

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = run.loss(model, batch)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    times = self_times(prof.key_averages(), cuda)
    total_ms = sum(us for _, us, _ in times) / 1000 / steps
    matmul_ms = sum(us for name, us, _ in times if is_matmul(name, cuda)) / 1000 / steps
    return total_ms, matmul_ms, [(name[:90], us / 1000 / steps, count // steps) for name, us, count in times[:top]]


def self_times(events, cuda: bool) -> list[tuple[str, float, int]]:
    """(name, self microseconds, calls) of every profiled event with time of its own, longest first: on
    a CUDA device the kernels (their GPU time, the unit a GPU step's time is made of), leaving out user
    annotations, whose GPU range (``Optimizer.step#AdamW.step``) spans kernels listed on their own; on a
    CPU the operators' self CPU time."""
    if cuda:
        kernels = [e for e in events if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False)]
        times = [(e.key, e.self_device_time_total, e.count) for e in kernels]
    else:
        times = [(e.key, e.self_cpu_time_total, e.count) for e in events]
    return sorted((t for t in times if t[1] > 0), key=lambda t: t[1], reverse=True)


def is_matmul(name: str, cuda: bool) -> bool:
    """Whether an operator (CPU) or kernel (CUDA) does a matrix product or attention."""
    return any(k in name.lower() for k in CUDA_MATMUL_KERNELS) if cuda else name in MATMUL_OPS


def lead_bound(ours_matmul_ms: float, reference_total_ms: float) -> float:
    """The most our throughput can exceed the reference's with the same matrix products (Amdahl): our
    step if every other operator of ours took no time, against the reference's whole step."""
    return reference_total_ms / ours_matmul_ms


def main(argv: list[str] | None = None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, choices=list(PAIRS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (the kernels' GPU time per step)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast, as the trainer")
    parser.add_argument("--out", default="results/profile.md", help="markdown report ('-': print only)")
    args = parser.parse_args(argv)
    require_packages([IMPLEMENTATIONS[name] for shape in args.shapes for name in PAIRS[shape]])

    cuda = torch.device(args.device).type == "cuda"
    unit = "kernels by self GPU time" if cuda else "operators by self CPU time"
    machine = machine_facts(args.device, args.threads)
    lines = report_header("Where a training step's time goes", command_line(__spec__.name, argv), machine)
    lines += [
        f"- {args.dtype}" + (f"; CUDA {torch.version.cuda}" if cuda else ""),
        f"- Each table: the top {args.top} {unit} (their own time, children excluded) per "
        f"training step, mean over {args.steps} profiled steps after {args.warmup} warm-up steps; the share is of "
        "the sum of all operators' self time. Profiling adds overhead per operator call, so step times here are "
        "above those of `benchmarks.speed.throughput`.",
        "",
    ]
    for shape in args.shapes:
        lines += [f"## {shape}", "", SHAPES[shape].description, ""]
        figures = {}
        for impl_name in PAIRS[shape]:
            total, matmul, top = profile(
                impl_name, shape, args.steps, args.warmup, args.threads, args.top, args.device, args.dtype
            )
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
    print_and_write("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
