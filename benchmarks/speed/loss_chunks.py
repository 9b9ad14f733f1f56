"""Time of the LM loss alone (output projection + cross-entropy, forward and backward) at GPT-2
small's shape: ``models.loss.linear_cross_entropy``'s chunked path at several chunk sizes (on any
device: the models take it on a CPU) against the plain ``F.cross_entropy(F.linear(...))`` that
nanoGPT and HF run, the models' path on a GPU.

    python -m benchmarks.speed.loss_chunks                       # on CUDA if there is one, bf16 autocast
    python -m benchmarks.speed.loss_chunks --tokens 4096 --device cpu --dtype fp32

The chunk size trades memory (a chunk's float32 logits) for the number of passes and kernel
launches; ``DEFAULT_CHUNK_TOKENS`` was chosen on a CPU. Prints the median milliseconds of
``--repeats`` timed calls after three warm-up calls (``benchmarks.harness.time_calls``, synchronised
on CUDA), and the peak memory on CUDA.
"""

from __future__ import annotations

import argparse

from benchmarks.harness import command_line, machine_facts, report_header, time_calls


def main(argv: list[str] | None = None) -> None:
    import torch
    import torch.nn.functional as F

    from blockbench.models.loss import linear_cross_entropy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16 * 1023, help="tokens per step (GPT-2 small: 16 x 1023)")
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.d_model, generator=generator).to(device).requires_grad_()
    weight = (0.02 * torch.randn(args.vocab, args.d_model, generator=generator)).to(device).requires_grad_()
    targets = torch.randint(args.vocab, (args.tokens,), generator=generator).to(device)

    def plain() -> torch.Tensor:
        return F.cross_entropy(F.linear(hidden, weight), targets)

    def chunked(chunk: int):
        return lambda: linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk, chunked=True)

    variants = {"plain F.cross_entropy(F.linear)": plain} | {f"fused, chunk {c}": chunked(c) for c in args.chunks}
    title = "The LM loss alone: chunked fused loss against the plain one"
    print("\n".join(report_header(title, command_line(__spec__.name, argv), machine_facts(str(device)))))
    print(f"- loss at {args.tokens} tokens, d {args.d_model}, vocab {args.vocab}, {args.dtype}, {device}\n")
    print("| loss | median ms (forward + backward) | peak memory GiB |")
    print("|---|---|---|")

    def forward_backward(loss_fn) -> None:
        hidden.grad = weight.grad = None
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = loss_fn()
        loss.backward()

    for name, loss_fn in variants.items():
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        timed = time_calls(lambda f=loss_fn: forward_backward(f), warmup=3, min_calls=args.repeats, device=device)
        memory = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
        print(f"| {name} | {1000 * timed.median:.2f} | {memory:.2f} |", flush=True)


if __name__ == "__main__":
    main()
