"""What building the attention masks once per stack saves over building them in every layer.

    python -m benchmarks.speed.mask_cost                    # the full shape, writes results/mask_cost.md
    python -m benchmarks.speed.mask_cost --quick --out -    # a tiny shape, a few seconds: a quick look

A stack builds its attention masks and biases (causal, padding and sparse-pattern boolean masks, the
ALiBi bias, the T5 bias's buckets) once per forward and hands them to every block
(``blockbench.models.attention.AttentionMask``); a block called without one builds its own. This
script times a decoder LM (``DecoderLM``, 8 layers, length 512, batch 4, d_model 256, right-padded
rows, so every variant needs a mask tensor) both ways, for each positional variant whose mask
differs: ALiBi, T5's relative bias, learned positions with the local sparse pattern, and learned
positions with dense attention:

* **shared**: ``model(idx, padding_mask)``, the normal path: one ``AttentionMask`` per forward;
* **per layer**: the same model and inputs, its stack's blocks driven one by one without the
  shared mask (``per_layer``: the stack's forward as it was before masks were shared), so every
  layer's attention builds its own.

Before timing, the two paths are checked to give identical bits: the logits without gradients,
and with gradients the loss and every parameter's gradient (``check_identical``; the run stops
if they differ). While training, T5's table is looked up per layer on both paths (its gradient
keeps its bits that way); only its buckets are shared.

Two measurements per variant: (a) the forward without gradients (logits), and (b) forward +
backward of the training loss (the LM's fused linear cross-entropy, padding ignored). Each round
runs both paths back to back, ``--calls`` calls each, alternating which goes first
(``benchmarks.harness.round_order``); a path's time in a round is the median of its calls. The ratio
per-layer / shared (above 1: sharing is faster) is the geometric mean over rounds with a 95% interval
(``benchmarks.harness.ratio_interval``); a ratio whose interval includes 1 is a tie. The report also
gives what one layer's mask costs alone (building the ``AttentionMask`` and SDPA's mask from it, no
gradients, ``mask_build_ms``, timed by ``torch.utils.benchmark``'s blocked autorange): sharing saves at most
``layers - 1`` of it per forward. About 5 minutes on one thread of a 2-core CPU.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from benchmarks.harness import (
    RATIO_METHOD,
    Ratio,
    autorange,
    command_line,
    machine_facts,
    print_and_write,
    ratio_interval,
    report_header,
    round_order,
    time_calls,
)
from blockbench.models.attention import AttentionMask
from blockbench.models.config import ModelConfig
from blockbench.models.lm import DecoderLM
from blockbench.models.loss import linear_cross_entropy

#: the positional variants timed: config overrides, and what each layer's self-attention mask is
VARIANTS: dict[str, tuple[dict[str, str], str]] = {
    "alibi": ({"pos_encoding": "alibi"}, "float: ALiBi bias, -inf at causal and padding"),
    "relative": ({"pos_encoding": "relative"}, "float: T5 bias (buckets + table lookup), -inf at causal and padding"),
    "learned_local": (
        {"pos_encoding": "learned", "attention_pattern": "local"},
        "boolean: causal & padding & local window",
    ),
    "learned_dense": ({"pos_encoding": "learned"}, "boolean: causal & padding"),
}

#: the full run's shape and rounds, and the ``--quick`` one's (a few seconds, for tests)
PROFILES = {
    "full": {
        "layers": 8,
        "seq_len": 512,
        "batch": 4,
        "d_model": 256,
        "heads": 4,
        "vocab": 1024,
        "rounds": 7,
        "calls": 3,
        "warmup": 0,  # the identity check has run each path and pass once already
    },
    "quick": {
        "layers": 2,
        "seq_len": 32,
        "batch": 2,
        "d_model": 32,
        "heads": 2,
        "vocab": 64,
        "rounds": 2,
        "calls": 1,
        "warmup": 0,
    },
}


#: seconds of blocked autorange that time one mask build, by ``--quick``
MASK_BUILD_SECONDS = {False: 1.0, True: 0.05}


# ------------------------------------------------------------------------------- the two paths
@contextmanager
def per_layer(model: DecoderLM) -> Iterator[DecoderLM]:
    """``model`` whose stack drives its blocks one by one without a shared mask, so each block's
    attention builds its own (``MultiHeadAttention.forward`` with ``mask=None``): the stack's
    forward as it was before masks were shared. Everything else (``DecoderLM.forward``, the blocks,
    the final norm) is the model's own."""
    stack = model.stack

    def forward(x: torch.Tensor, caches=None, *, block_outputs: bool = False, **kwargs) -> torch.Tensor:
        if caches or block_outputs:
            raise ValueError("the per-layer path times full forwards: no caches, no block outputs")
        for block in stack.blocks:
            x = block(x, **kwargs)  # no self_mask / memory_mask
        return stack.final_norm(x)

    stack.forward = forward  # an instance attribute: nn.Module.__call__ finds it before the class's
    try:
        yield model
    finally:
        del stack.forward


@dataclass
class Batch:
    idx: torch.Tensor  # (B, T) token ids, 0 at padding
    padding_mask: torch.Tensor  # (B, T), True at padding
    targets: torch.Tensor  # (B, T), -100 at padding


def make_batch(batch: int, seq_len: int, vocab: int, generator: torch.Generator) -> Batch:
    """Right-padded rows: row ``b`` has ``seq_len * (1 - b / (2 * batch))`` real tokens (all of
    them in row 0), so the mask has padding to hide and no query is left without a key."""
    lengths = torch.tensor([seq_len - b * seq_len // (2 * batch) for b in range(batch)])
    padding = torch.arange(seq_len)[None, :] >= lengths[:, None]
    idx = torch.randint(1, vocab, (batch, seq_len), generator=generator).masked_fill(padding, 0)
    targets = torch.randint(1, vocab, (batch, seq_len), generator=generator).masked_fill(padding, -100)
    return Batch(idx, padding, targets)


def build_model(variant: str, args: argparse.Namespace) -> DecoderLM:
    overrides, _ = VARIANTS[variant]
    cfg = ModelConfig(
        family="decoder_lm",
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        vocab_size=args.vocab,
        max_seq_len=args.seq_len,
        **overrides,
    )
    torch.manual_seed(args.seed)
    return DecoderLM(cfg).train()  # dropout 0: train and eval modes compute the same


def logits(model: DecoderLM, batch: Batch) -> torch.Tensor:
    with torch.no_grad():
        return model(batch.idx, batch.padding_mask)


def training_loss(model: DecoderLM, batch: Batch) -> torch.Tensor:
    """The LM's training loss (``DecoderLM.loss``: fused linear cross-entropy), padding ignored."""
    hidden = model(batch.idx, batch.padding_mask, head=False)
    return linear_cross_entropy(hidden, model.lm_head.weight, batch.targets)


def forward_backward(model: DecoderLM, batch: Batch) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss = training_loss(model, batch)
    loss.backward()
    return loss.detach()


def check_identical(model: DecoderLM, batch: Batch) -> None:
    """Both paths give the same bits: the logits without gradients, and with gradients the loss
    and every parameter's gradient. Raises AssertionError naming what differs."""
    shared_logits = logits(model, batch)
    with per_layer(model):
        own_logits = logits(model, batch)
    assert torch.equal(shared_logits, own_logits), "the logits of the shared and per-layer paths differ"
    shared_loss = forward_backward(model, batch)
    shared_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    with per_layer(model):
        own_loss = forward_backward(model, batch)
    own_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    assert torch.equal(shared_loss, own_loss), "the losses of the shared and per-layer paths differ"
    assert shared_grads.keys() == own_grads.keys(), "the two paths give gradients to different parameters"
    differ = [name for name in shared_grads if not torch.equal(shared_grads[name], own_grads[name])]
    assert not differ, f"the gradients of the shared and per-layer paths differ: {', '.join(differ)}"


def mask_build_ms(model: DecoderLM, batch: Batch, min_run_time: float) -> float:
    """Median milliseconds to build one layer's self-attention mask (``AttentionMask`` and SDPA's
    float32 mask from it), without gradients: what each layer of the per-layer path spends. Timed by
    ``benchmarks.harness.autorange`` for ``min_run_time`` seconds: a build takes about a millisecond."""
    seq_len = batch.idx.shape[1]

    def build() -> torch.Tensor:
        with torch.no_grad():
            return AttentionMask(
                seq_len,
                seq_len,
                causal=True,
                key_padding_mask=batch.padding_mask,
                positional=model.positions,
                sparsity=model.stack.sparsity,
                device=batch.idx.device,
            ).sdpa_mask(torch.float32)

    return 1e3 * autorange(build, min_run_time=min_run_time, label="mask build").median


# ------------------------------------------------------------------------------------ timing
MODES: dict[str, Callable[[DecoderLM, Batch], torch.Tensor]] = {
    "forward": logits,
    "forward_backward": forward_backward,
}


def calls_ms(
    fn: Callable[[DecoderLM, Batch], torch.Tensor], model: DecoderLM, batch: Batch, shared: bool, calls: int
) -> list[float]:
    """Milliseconds of each of ``calls`` calls of ``fn`` on the shared path or the per-layer one."""

    def timed() -> list[float]:
        return [1e3 * t for t in time_calls(lambda: fn(model, batch), min_calls=calls).times]

    if shared:
        return timed()
    with per_layer(model):
        return timed()


@dataclass
class Timing:
    """One variant and mode: every call's milliseconds and each round's median, per path."""

    shared: list[float]
    per_layer: list[float]
    shared_rounds: dict[int, float]
    per_layer_rounds: dict[int, float]

    @property
    def ratio(self) -> Ratio:
        """per-layer time over shared time (above 1: sharing is faster), with its interval over rounds."""
        return ratio_interval(self.shared_rounds, self.per_layer_rounds)


def measure(models: dict[str, DecoderLM], batch: Batch, args: argparse.Namespace) -> dict[tuple[str, str], Timing]:
    """Every (variant, mode), both paths back to back in each round (which goes first alternates
    with the round and the variant), after ``args.warmup`` untimed calls of each."""
    timings = {(v, m): Timing([], [], {}, {}) for v in models for m in MODES}
    for model in models.values():
        for fn in MODES.values():
            for _ in range(args.warmup):
                calls_ms(fn, model, batch, True, 1)
                calls_ms(fn, model, batch, False, 1)
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds}:", end="", flush=True)
        for v, (variant, model) in enumerate(models.items()):
            for mode, fn in MODES.items():
                timing = timings[(variant, mode)]
                calls: dict[bool, list[float]] = {True: [], False: []}
                for shared in round_order((True, False), round_index, offset=v):
                    calls[shared] = calls_ms(fn, model, batch, shared, args.calls)
                timing.shared += calls[True]
                timing.per_layer += calls[False]
                timing.shared_rounds[round_index] = statistics.median(calls[True])
                timing.per_layer_rounds[round_index] = statistics.median(calls[False])
                print(
                    f" {variant} {mode} {timing.shared_rounds[round_index]:.0f}/"
                    f"{timing.per_layer_rounds[round_index]:.0f} ms;",
                    end="",
                    flush=True,
                )
        print(flush=True)
    return timings


# ------------------------------------------------------------------------------------ report
#: the passes' names in the report
PASSES = {"forward": "forward (no gradients)", "forward_backward": "forward + backward"}


def verdict(ratio: Ratio) -> str:
    """What the interval says: sharing faster or slower only where it excludes 1, else a tie."""
    return {"faster": "shared faster", "slower": "shared slower"}.get(ratio.verdict, ratio.verdict)


def table_row(variant: str, mode: str, timing: Timing) -> str:
    ratio = timing.ratio
    interval = "–" if ratio.low is None else f"{ratio.low:.3f}–{ratio.high:.3f}"
    return (
        f"| {variant} | {PASSES[mode]} | {statistics.median(timing.shared):.1f} | "
        f"{statistics.median(timing.per_layer):.1f} | **{ratio.ratio:.3f}** | {interval} | {verdict(ratio)} |"
    )


def report(
    timings: dict[tuple[str, str], Timing],
    build_ms: dict[str, float],
    args: argparse.Namespace,
    command: str,
    machine: dict,
) -> str:
    variants = list(dict.fromkeys(v for v, _ in timings))
    lines = report_header("Attention masks: built once per stack vs once per layer", command, machine)
    lines += [
        f"- Model: `DecoderLM`, {args.layers} layers, d_model {args.d_model}, {args.heads} heads, d_ff "
        f"{4 * args.d_model}, vocab {args.vocab}, pre-LN, dropout 0, fp32. Batch: {args.batch} rows of {args.seq_len} "
        f"tokens, right-padded (row b has {args.seq_len} * (1 - b / {2 * args.batch}) real tokens), so every "
        "variant's attention needs a mask tensor.",
        "- **shared**: `model(idx, padding_mask)`, one `AttentionMask` per forward handed to every block; "
        "**per layer**: the same model with its stack's blocks called one by one without it, so each layer's "
        "attention builds its own mask (`per_layer` in the script). The two paths give identical bits: the "
        "logits without gradients, and the loss and every parameter's gradient with them (checked for every "
        "variant before timing; the run stops otherwise). With gradients on, T5's table is looked up per layer "
        "on both paths; only its buckets are shared.",
        f"- **forward (no gradients)**: the logits under `torch.no_grad()`; **forward + backward**: the training "
        f"loss (fused linear cross-entropy, padding ignored) and its backward. {args.rounds} rounds; in each, "
        f"both paths run {args.calls} call(s) back to back (alternating which goes first) after "
        f"{args.warmup} extra untimed call(s) of each (the identity check's calls warm up too). The ms columns "
        "are medians over all calls; the ratio is per layer / shared (above 1: sharing is faster), the geometric "
        f"mean over rounds of each round's ratio of medians, with a 95% interval ({RATIO_METHOD}); a ratio whose "
        "interval includes 1 is a tie.",
        "- What each layer of the per-layer path builds, and how long one build takes alone (`AttentionMask` "
        f"and SDPA's float32 mask from it, no gradients, the median of `torch.utils.benchmark`'s blocked "
        f"autorange over {MASK_BUILD_SECONDS[args.quick]} s); "
        f"sharing saves at most {args.layers - 1} of them (layers - 1) per forward:",
    ]
    lines += [
        f"  - **{v}**: {VARIANTS[v][1]}; {build_ms[v]:.2f} ms, x {args.layers - 1} = "
        f"{(args.layers - 1) * build_ms[v]:.1f} ms"
        for v in variants
    ]
    lines += [
        "",
        "| variant | pass | shared ms | per layer ms | per layer / shared | 95% interval | verdict |",
        "|---|---|--:|--:|--:|--:|---|",
    ]
    lines += [table_row(v, mode, timings[(v, mode)]) for v in variants for mode in MODES]
    lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--quick", action="store_true", help="a tiny shape, 2 rounds of 1 call, no warm-up: seconds (for tests)"
    )
    for name in PROFILES["full"]:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=int,
            default=None,
            help=f"default {PROFILES['full'][name]} ({PROFILES['quick'][name]} with --quick)",
        )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: steadier timings)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/mask_cost.md", help="markdown report ('-': print only)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, value in PROFILES["quick" if args.quick else "full"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    torch.set_num_threads(args.threads)

    batch = make_batch(args.batch, args.seq_len, args.vocab, torch.Generator().manual_seed(args.seed))
    models = {variant: build_model(variant, args) for variant in args.variants}
    for variant, model in models.items():
        check_identical(model, batch)
        print(f"{variant}: the shared and per-layer paths give identical logits, loss and gradients")
    build_ms = {v: mask_build_ms(m, batch, MASK_BUILD_SECONDS[args.quick]) for v, m in models.items()}
    timings = measure(models, batch, args)

    machine = machine_facts("cpu", torch.get_num_threads())
    print_and_write(report(timings, build_ms, args, command_line(__spec__.name, argv), machine), args.out)


if __name__ == "__main__":
    main()
