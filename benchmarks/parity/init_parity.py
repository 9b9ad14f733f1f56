"""Is any family handicapped by its initialisation? Each blockbench family fits one fixed random batch
next to the implementations people already use, each from its own initialisation.

    pip install -e ".[bench]"
    python -m benchmarks.parity.init_parity                    # every family, writes results/init_parity.md
    python -m benchmarks.parity.init_parity --cases vit --steps 10 --out -   # a quick look

For each family, ours (built through ``models.build_model``) and its references (HF GPT-2 and
Llama, timm's and HF's ViT, ``torch.nn.Transformer``; ``benchmarks.parity.implementations`` builds
them at the same sizes) train on the same seeded random batch with the same optimizer: AdamW at a
constant learning rate (no warm-up, no schedule, no clipping), blockbench's betas and weight decay
(``tasks.base.OptimizerConfig``) on the matrices only, as blockbench's tasks group them; fp32, one
process. The loss is recorded before every update (step k = after k updates). A random batch
has nothing to learn but itself, so the loss after a few dozen steps measures how fast each
initialisation lets the optimizer fit, and a family whose loss falls far slower than its
reference's starts every short-budget comparison behind. Ablation rows (``ABLATIONS``) change one
part of one implementation's init, to show where a gap comes from; each case's report says what
its gap means.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.harness import command_line, machine_facts, print_and_write, report_header
from benchmarks.parity.implementations import (
    IMPLEMENTATIONS,
    Dims,
    Implementation,
    Run,
    ours_seq2seq,
    ours_vit,
    package_versions,
    require_packages,
    torch_transformer,
)

#: the steps whose loss the report shows (each <= --steps is shown)
REPORT_STEPS = (0, 1, 5, 10, 25, 50)


# ------------------------------------------------------------------------------------ ablations
def ours_vit_zero_head(torch, generator, dims: Dims) -> Run:
    """blockbench's ViT, same init, but the head's weight zero, as it was in earlier versions."""
    run = ours_vit(torch, generator, dims)
    torch.nn.init.zeros_(run.model.head.weight)
    run.note = "blockbench vit with the zero head weight it had in earlier versions (the JAX fine-tuning recipe)"
    return run


def ours_vit_cls_002(torch, generator, dims: Dims) -> Run:
    """blockbench's ViT, same init, but its CLS token at HF's N(0, 0.02) instead of the patches' RMS."""
    run = ours_vit(torch, generator, dims)
    torch.nn.init.normal_(run.model.cls_token, std=0.02)
    run.note = "blockbench vit with its CLS token drawn at HF's 0.02 instead of the patches' RMS 1/sqrt(2)"
    return run


def ours_seq2seq_xavier(torch, generator, dims: Dims) -> Run:
    """blockbench's encoder-decoder with torch.nn.Transformer's init of the stacks: xavier_uniform_ on
    every matrix of the encoder and decoder (the embedding keeps blockbench's init)."""
    run = ours_seq2seq(torch, generator, dims)
    for stack in (run.model.encoder, run.model.decoder):
        for p in stack.parameters():
            if p.dim() > 1:
                torch.nn.init.xavier_uniform_(p)
    run.note = "blockbench encoder_decoder with xavier_uniform_ on every matrix of its stacks, as nn.Transformer"
    return run


def torch_transformer_small_embedding(torch, generator, dims: Dims) -> Run:
    """The torch.nn.Transformer reference with blockbench's embedding convention instead of fairseq's."""
    from blockbench.models.embedding import EMBEDDING_STD

    return torch_transformer(torch, generator, dims, embedding_rms=EMBEDDING_STD)


#: variants shown next to ours and the references, to show where a gap comes from (``ours``: is it blockbench?)
ABLATIONS = {
    "blockbench_vit_zero_head": Implementation("vit", ours_vit_zero_head, True, None),
    "blockbench_vit_cls_002": Implementation("vit", ours_vit_cls_002, True, None),
    "blockbench_seq2seq_xavier": Implementation("seq2seq", ours_seq2seq_xavier, True, None),
    "torch_transformer_small_embedding": Implementation("seq2seq", torch_transformer_small_embedding, False, None),
}
CANDIDATES = {**IMPLEMENTATIONS, **ABLATIONS}


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    dims: Dims
    impls: tuple[str, ...]  # ours first, then the references and ablations (CANDIDATES)
    differences: str  # what differs between the implementations: initialisation, parameter count
    meaning: str  # what the gap means: fixed, explained or remaining, and by what evidence


_SEQ2SEQ_DIFFERENCES = (
    "torch.nn.Transformer draws every matrix from xavier_uniform_ (std 0.06-0.09 at d 128, three to four times "
    "blockbench's 0.02) and scales no residual projection; its embedding follows fairseq (table N(0, 1/d) times "
    "sqrt(d): unit RMS; unit-amplitude positions; so the tied output starts with logits of RMS about 1), "
    "blockbench's follows GPT-2 (tokens and positions of RMS 0.02, no multiplier, `models.embedding`; tied "
    "logits of RMS about 0.2)."
)

CASES = {
    c.name: c
    for c in (
        Case(
            "lm_gpt",
            "GPT: vocab 1024, d 128, 2 layers, 4 heads, FFN 512 GELU, learned positions, pre-LN, biases, "
            "tied embeddings; 16 random rows of 65 tokens",
            Dims(d_model=128, n_layers=2, n_heads=4, d_ff=512, batch=16, vocab=1024, seq_len=64),
            ("blockbench", "hf_gpt2"),
            "nothing but the order in which the init is drawn: the same architecture, the same parameter count and "
            "the same init (N(0, 0.02), residual output projections N(0, 0.02 / sqrt(2 n_layers)), zero biases, "
            "unit norms).",
            "parity: the curves agree to the seed's noise at every step.",
        ),
        Case(
            "lm_llama",
            "Llama: vocab 1024, d 128, 2 layers, 4 query / 2 key-value heads, SwiGLU 341 (d_ff 512), "
            "RMSNorm, RoPE, no biases, untied embeddings; 16 random rows of 65 tokens",
            Dims(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=512, batch=16, vocab=1024, seq_len=64),
            ("blockbench_llama", "hf_llama"),
            "the same parameter count; HF Llama draws every matrix from N(0, 0.02), blockbench also scales the "
            "residual output projections (attention out, FFN out) to N(0, 0.02 / sqrt(2 n_layers)) as GPT-2 does.",
            "parity: blockbench is as fast or slightly ahead; the residual scaling does not hold it back.",
        ),
        Case(
            "vit",
            "ViT: 3x32x32 images, patch 4 (64 patches + CLS), d 128, 2 layers, 4 heads, MLP 512 GELU, "
            "learned positions, pre-LN, 10 classes; 16 random images with random labels",
            Dims(d_model=128, n_layers=2, n_heads=4, d_ff=512, batch=16, image_size=32, patch_size=4, n_classes=10),
            ("blockbench_vit", "timm_vit", "hf_vit", "blockbench_vit_cls_002", "blockbench_vit_zero_head"),
            "the same sizes (blockbench has d fewer parameters: its CLS token takes no position row, as timm's "
            "no_embed_class); the classification head is N(0, 0.02) (timm: truncated) with a zero bias in "
            "all three (timm's default init_weights_vit_timm; HF's PreTrainedModel._init_weights). blockbench "
            "draws the patch projection, its position table and the CLS token at RMS 1/sqrt(2) (models.embedding); "
            "timm keeps PyTorch's Conv2d default for the patch projection, draws the position table from a "
            "truncated N(0, 0.02) and the CLS token from N(0, 1e-6); HF draws the patch projection, the position "
            "table and the CLS token from a truncated N(0, 0.02); neither scales a residual projection; "
            "LayerNorm eps is 1e-5 (blockbench), 1e-6 (timm), 1e-12 (HF).",
            "documented gap, from the CLS token's scale: the blockbench_vit_cls_002 row, the same model with its "
            "CLS token at HF's 0.02, fits this random-label batch like timm and HF. blockbench keeps CLS at the "
            "patches' RMS because on its vit task (pos_encoding=learned, 300 steps, seeds 0-3) it scores accuracy "
            "0.78 on average there against 0.68 at 0.02, higher on every seed: fitting noise fast is not what "
            "the cells are scored on. Fixed: in earlier versions the head's weight was zero (the JAX fine-tuning "
            "recipe, timm's weight_init='jax', not its default), the blockbench_vit_zero_head row, which fits far "
            "slower than every other row, since AdamW must first grow the head before any gradient reaches the stack.",
        ),
        Case(
            "seq2seq_pre",
            "encoder-decoder: shared vocab 1024, d 128, 2+2 layers, 4 heads, FFN 512 GELU, pre-LN, "
            "sinusoidal positions, tied embeddings; 16 random source rows of 64 and target rows of 65",
            Dims(
                d_model=128,
                n_layers=2,
                n_heads=4,
                d_ff=512,
                batch=16,
                vocab=1024,
                seq_len=64,
                norm_placement="pre",
                activation="gelu",
            ),
            ("blockbench_seq2seq", "torch_transformer"),
            "the same parameter count (a pre-LN stack ends in a LayerNorm in both). " + _SEQ2SEQ_DIFFERENCES,
            "no handicap: blockbench fits faster than the reference.",
        ),
        Case(
            "seq2seq_post",
            "encoder-decoder as seq2seq_pre but post-LN with a ReLU FFN (the original Transformer)",
            Dims(
                d_model=128,
                n_layers=2,
                n_heads=4,
                d_ff=512,
                batch=16,
                vocab=1024,
                seq_len=64,
                norm_placement="post",
                activation="relu",
            ),
            (
                "blockbench_seq2seq",
                "torch_transformer",
                "torch_transformer_small_embedding",
                "blockbench_seq2seq_xavier",
            ),
            "torch.nn.Transformer has 4 x 128 more parameters: it adds a final LayerNorm to each stack even when "
            "post-LN, where each block already ends in one. " + _SEQ2SEQ_DIFFERENCES,
            "remaining, explained by the scale of the init, not a bug: post-LN, the reference fits this batch "
            "faster. Its two differences account for the whole gap: the same reference with blockbench's "
            "embedding convention (torch_transformer_small_embedding) fits almost as slowly as blockbench, and "
            "blockbench with the reference's xavier_uniform_ stack weights (blockbench_seq2seq_xavier) fits like "
            "that row; the embedding is most of it. fairseq's unit-RMS embedding, whose tied output starts with "
            "logits of RMS 1, lets post-LN fit fast; blockbench gives every family GPT-2's scale (RMS 0.02), "
            "which pre-LN fits well from (seq2seq_pre, where blockbench is ahead) and post-LN fits more slowly "
            "from. Post-LN cells of a short-budget matrix start from that scale.",
        ),
    )
}


# -------------------------------------------------------------------------------------- fitting
def optimizer_for(torch, model, lr: float):
    """AdamW as blockbench's tasks build it (weight decay on matrices only, their betas and decay),
    at a constant ``lr``; the same for every implementation."""
    from blockbench.tasks import OptimizerConfig

    defaults = OptimizerConfig()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": defaults.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=defaults.betas)


def fit(impl: str, dims: Dims, *, steps: int, seed: int, lr: float) -> dict[str, Any]:
    """Train ``impl`` for ``steps`` updates on the batch of seed 0 from its init of ``seed``; the loss
    before each update and after the last (``steps + 1`` values)."""
    import torch

    generator = torch.Generator().manual_seed(0)  # the batch: the same for every implementation and seed
    torch.manual_seed(seed)  # the init
    run = CANDIDATES[impl].build(torch, generator, dims)
    model = run.model.float().train()
    optimizer = optimizer_for(torch, model, lr)
    losses: list[float] = []
    started = time.perf_counter()
    for _ in range(steps):
        loss = run.loss(model, run.batch)
        losses.append(loss.item())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        losses.append(run.loss(model, run.batch).item())
    parameters = sum(p.numel() for p in model.parameters())  # tied weights once
    return {"losses": losses, "parameters": parameters, "seconds": time.perf_counter() - started, "note": run.note}


# -------------------------------------------------------------------------------------- report
def _loss(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.3f}" if len(values) == 1 else f"{mean:.3f} ({min(values):.3f}–{max(values):.3f})"


def case_table(case: Case, fits: dict[str, list[dict[str, Any]]], steps: int) -> list[str]:
    """One row per implementation: parameters, the loss at the report steps (mean over seeds, with
    the range if several), and ours / this implementation at the last step."""
    shown = [s for s in REPORT_STEPS if s <= steps] + ([steps] if steps not in REPORT_STEPS else [])
    ours_final = statistics.fmean(f["losses"][steps] for f in fits[case.impls[0]])
    lines = [
        "| implementation | parameters | "
        + " | ".join(f"loss @{s}" for s in shown)
        + f" | ours / this @{steps} | ours − this @{steps} |",
        "|---|---|" + "---|" * len(shown) + "---|---|",
    ]
    for impl in case.impls:
        runs = fits[impl]
        final = statistics.fmean(f["losses"][steps] for f in runs)
        cells = [_loss([f["losses"][s] for f in runs]) for s in shown]
        lines.append(
            f"| {impl} | {runs[0]['parameters']:,} | "
            + " | ".join(cells)
            + f" | {ours_final / final:.2f} | {ours_final - final:+.3f} |"
        )
    return lines


def report(fits: dict[str, dict[str, list[dict[str, Any]]]], args: argparse.Namespace, command: str) -> str:
    title = "Initialisation parity: fitting a fixed batch, blockbench vs the implementations people use"
    lines = report_header(title, command, machine_facts("cpu", args.threads, package_versions()))
    lines += [
        f"- Every implementation: the same seeded random batch per family, fp32, AdamW lr {args.lr:g} constant "
        "(no warm-up, schedule or clipping), betas and weight decay of blockbench's tasks "
        "(`tasks.base.OptimizerConfig`) on matrices only; loss before each update (step k = after k updates), "
        "computed as each implementation is trained (ours: the tasks' loss functions; references: "
        "`F.cross_entropy` on the logits).",
        f"- Init seeds {', '.join(map(str, args.seeds))}"
        + (": each loss is the mean over seeds, with the range in brackets." if len(args.seeds) > 1 else "."),
        "",
    ]
    lines += [
        "## Summary: loss after the last step",
        "",
        f"| family | blockbench @{args.steps} | best reference | its loss @{args.steps} | ours / it | ours − it |",
        "|---|---|---|---|---|---|",
    ]
    for name, case_fits in fits.items():
        case = CASES[name]

        def final(impl: str, case_fits: dict[str, list[dict[str, Any]]] = case_fits) -> float:
            return statistics.fmean(f["losses"][args.steps] for f in case_fits[impl])

        best = min((i for i in case.impls if i not in ABLATIONS and not CANDIDATES[i].ours), key=final)
        ours = final(case.impls[0])
        lines.append(
            f"| {name} | {ours:.3f} | {best} | {final(best):.3f} | **{ours / final(best):.2f}** | "
            f"{ours - final(best):+.3f} |"
        )
    for name, case_fits in fits.items():
        case = CASES[name]
        lines += ["", f"## {name}", "", case.description + ".", "", *case_table(case, case_fits, args.steps)]
        lines += ["", f"**What differs**: {case.differences}", "", f"**What the gap means**: {case.meaning}", ""]
        lines += [f"- **{impl}**: {case_fits[impl][0]['note']}" for impl in case.impls]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="init seeds (the batch is always seed 0's)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", default="results/init_parity.md", help="markdown report ('-': print only)")
    args = parser.parse_args(argv)

    require_packages([CANDIDATES[impl] for name in args.cases for impl in CASES[name].impls])
    import torch

    torch.set_num_threads(args.threads)
    fits: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name in args.cases:
        case = CASES[name]
        fits[name] = {impl: [] for impl in case.impls}
        for impl in case.impls:
            for seed in args.seeds:
                print(f"{name}: {impl} seed {seed} ...", end=" ", flush=True)
                outcome = fit(impl, case.dims, steps=args.steps, seed=seed, lr=args.lr)
                fits[name][impl].append(outcome)
                print(f"loss {outcome['losses'][0]:.3f} -> {outcome['losses'][-1]:.3f} ({outcome['seconds']:.0f} s)")
    print_and_write(report(fits, args, command_line(__spec__.name, argv)), args.out)


if __name__ == "__main__":
    main()
