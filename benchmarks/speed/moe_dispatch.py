"""The cost of routing: one training step of ``MoEFeedForward`` vs one dense FFN on the same tokens.

For each expert count, times forward + backward (``layer(x).sum().backward()``, gradients
cleared before each step) of the MoE layer and of one dense FFN of the same kind and width on
the same ``n_tokens x d_model`` input, alternating MoE and dense steps so that both see the same
machine load (``benchmarks.harness.round_order``: MoE first in even rounds, dense first in odd ones),
and prints a markdown table with the median step times after warm-up.
``expert rows / token`` is the matmul work of the routed experts relative to the dense FFN:
``n_experts * C / n_tokens`` rows of the ``(n_experts, C, d_model)`` expert buffer per token
(``top_k`` assignments per token, plus padding up to the busiest expert, minus dropped
assignments). The rest of the gap is the router, the dispatch and the combine.

Run from the repository root, e.g.::

    python -m benchmarks.speed.moe_dispatch --experts 4 8 16 --d-model 256 --tokens 4096
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn

from benchmarks.harness import command_line, machine_facts, report_header, round_order, time_calls
from blockbench.models.mlp import FFNS, build_ffn
from blockbench.models.moe import MoEFeedForward


def step_ms(layers: list[nn.Module], x: torch.Tensor, warmup: int, repeats: int) -> list[float]:
    """Median milliseconds of one forward + backward on ``x`` of each of ``layers``, stepped in
    turn (one step of each per round, the order reversed every other round), after ``warmup`` rounds."""
    times: list[list[float]] = [[] for _ in layers]

    def step(layer: nn.Module) -> None:
        layer(x).sum().backward()

    for round_index in range(warmup + repeats):
        for i in round_order(range(len(layers)), round_index):
            layers[i].zero_grad(set_to_none=True)
            x.grad = None
            times[i] += time_calls(lambda layer=layers[i]: step(layer)).times
    return [1e3 * statistics.median(layer_times[warmup:]) for layer_times in times]


def expert_rows_per_token(moe: MoEFeedForward, n_tokens: int) -> float:
    """``n_experts * C / n_tokens`` of the last forward (``C``: the busiest expert's count, capped at the capacity)."""
    busiest = round(moe.tokens_per_expert.max().item() * n_tokens * moe.top_k)
    capacity = moe.capacity(n_tokens)
    slots = busiest if capacity is None else min(capacity, busiest)
    return moe.n_experts * slots / n_tokens


def capacity_factor(value: str) -> float | None:
    return None if value.lower() == "none" else float(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, nargs="+", default=[4, 8, 16], help="expert counts to time")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=None, help="FFN width (default 4 * d_model)")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per step")
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--capacity-factor", type=capacity_factor, default=1.25, help='a float, or "none"')
    parser.add_argument("--kind", choices=FFNS.names(), default="mlp", help="FFN kind of the experts and the dense FFN")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    d_ff = args.d_ff or 4 * args.d_model
    torch.manual_seed(args.seed)
    x = torch.randn(args.tokens, args.d_model, requires_grad=True)

    dense = build_ffn(args.kind, args.d_model, d_ff, dropout=args.dropout)
    title = "The cost of routing: MoE vs one dense FFN"
    print("\n".join(report_header(title, command_line(__spec__.name, argv), machine_facts())) + "\n")
    print(
        f"{args.kind} experts, d_model {args.d_model}, d_ff {d_ff}, {args.tokens} tokens, top-{args.top_k}, "
        f"capacity factor {args.capacity_factor}, threads: {torch.get_num_threads()}; "
        f"median of {args.repeats} steps (forward + backward) after {args.warmup} warm-up\n"
    )
    print("| experts | MoE ms | dense FFN ms | MoE / dense | expert rows / token | dropped assignments |")
    print("|--:|--:|--:|--:|--:|--:|")
    for n_experts in args.experts:
        moe = MoEFeedForward(
            args.d_model,
            d_ff,
            dropout=args.dropout,
            n_experts=n_experts,
            top_k=args.top_k,
            capacity_factor=args.capacity_factor,
            expert_kind=args.kind,
        )
        moe_ms, dense_ms = step_ms([moe, dense], x, args.warmup, args.repeats)
        print(
            f"| {n_experts} | {moe_ms:.1f} | {dense_ms:.1f} | {moe_ms / dense_ms:.2f} "
            f"| {expert_rows_per_token(moe, args.tokens):.2f} | {moe.dropped_tokens} |"
        )


if __name__ == "__main__":
    main()
