"""Is any family handicapped by its initialisation? Each blockbench family fits one fixed random batch
next to the implementations people already use, each from its own initialisation.

    pip install -e ".[bench]"
    python benchmarks/init_parity.py                    # every family, writes results/init_parity.md
    python benchmarks/init_parity.py --cases vit --steps 10 --out -   # a quick look

For each family, ours (built through ``models.build_model``) and its references (HF GPT-2 and
Llama, timm's and HF's ViT, ``torch.nn.Transformer``; ``benchmarks/implementations.py`` builds
them at the same sizes) train on the same seeded random batch with the same optimizer: AdamW at a
constant learning rate (no warm-up, no schedule, no clipping), blockbench's betas and weight decay
(``tasks.base.OptimizerConfig``) on the matrices only, as blockbench's tasks group them; fp32, one
process. The loss is recorded before every update (step k = after k updates). A random batch
has nothing to learn but itself, so the loss after a few dozen steps measures how fast each
initialisation lets the optimizer fit, and a family whose loss falls far slower than its
reference's starts every short-budget comparison behind.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from implementations import IMPLEMENTATIONS, Dims, missing_packages, package_versions  # noqa: E402  (benchmarks/)

#: the steps whose loss the report shows (each <= --steps is shown)
REPORT_STEPS = (0, 1, 5, 10, 25, 50)


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    dims: Dims
    impls: tuple[str, ...]  # ours first, then the references
    notes: str  # what a gap means: the known differences of initialisation and parameter count


CASES = {
    c.name: c
    for c in (
        Case("lm_gpt", "GPT: vocab 1024, d 128, 2 layers, 4 heads, FFN 512 GELU, learned positions, pre-LN, biases, "
                       "tied embeddings; 16 random rows of 65 tokens",
             Dims(d_model=128, n_layers=2, n_heads=4, d_ff=512, batch=16, vocab=1024, seq_len=64),
             ("blockbench", "hf_gpt2"),
             "Same architecture and the same init (N(0, 0.02) everywhere, residual output projections "
             "N(0, 0.02 / sqrt(2 n_layers)), zero biases, unit norms), so the same parameter count; a gap "
             "here is the seed (the init is drawn in a different order) or a bug."),
        Case("lm_llama", "Llama: vocab 1024, d 128, 2 layers, 4 query / 2 key-value heads, SwiGLU 341 (d_ff 512), "
                         "RMSNorm, RoPE, no biases, untied embeddings; 16 random rows of 65 tokens",
             Dims(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=512, batch=16, vocab=1024, seq_len=64),
             ("blockbench_llama", "hf_llama"),
             "Same parameter count. One init difference: HF Llama draws every matrix from N(0, 0.02); "
             "blockbench also scales the residual output projections (attention out, FFN out) to "
             "N(0, 0.02 / sqrt(2 n_layers)) as GPT-2 does."),
        Case("vit", "ViT: 3x32x32 images, patch 4 (64 patches + CLS), d 128, 2 layers, 4 heads, MLP 512 GELU, "
                    "learned positions, pre-LN, 10 classes; 16 random images with random labels",
             Dims(d_model=128, n_layers=2, n_heads=4, d_ff=512, batch=16, image_size=32, patch_size=4, n_classes=10),
             ("blockbench_vit", "timm_vit", "hf_vit"),
             "Same parameter count. The classification head is N(0, 0.02) with a zero bias in all three "
             "(timm: init_weights_vit_timm; HF: PreTrainedModel._init_weights); blockbench's head was "
             "zero-initialised (the JAX fine-tuning recipe) before issue 12, which made it fit far slower. "
             "Remaining init differences: timm's patch projection keeps PyTorch's Conv2d default and its CLS "
             "token is N(0, 1e-6); HF draws the patch projection from N(0, 0.02) and the position table and "
             "CLS token from a truncated N(0, 0.02); timm and HF scale no residual projection; LayerNorm eps "
             "is 1e-5 (blockbench), 1e-6 (timm), 1e-12 (HF)."),
        Case("seq2seq_pre", "encoder-decoder: shared vocab 1024, d 128, 2+2 layers, 4 heads, FFN 512 GELU, pre-LN, "
                            "sinusoidal positions, tied embeddings; 16 random source rows of 64 and target rows of 65",
             Dims(d_model=128, n_layers=2, n_heads=4, d_ff=512, batch=16, vocab=1024, seq_len=64,
                  norm_placement="pre", activation="gelu"),
             ("blockbench_seq2seq", "torch_transformer"),
             "Same parameter count (a pre-LN stack ends in a LayerNorm in both). torch.nn.Transformer draws "
             "every matrix from xavier_uniform_ (std sqrt(2 / (fan_in + fan_out)), 0.088 for the 128x128 "
             "projections, 4.4 times blockbench's 0.02) and scales no residual projection; its embedding follows "
             "fairseq (N(0, 1/d) times sqrt(d): unit RMS, positions of unit amplitude), blockbench's has RMS "
             "0.02 for tokens and positions (models.embedding)."),
        Case("seq2seq_post", "encoder-decoder as seq2seq_pre but post-LN with a ReLU FFN (the original Transformer)",
             Dims(d_model=128, n_layers=2, n_heads=4, d_ff=512, batch=16, vocab=1024, seq_len=64,
                  norm_placement="post", activation="relu"),
             ("blockbench_seq2seq", "torch_transformer"),
             "torch.nn.Transformer has 4 x 128 more parameters: it adds a final LayerNorm to each stack even "
             "when post-LN, where each block already ends in one. Init differences as for seq2seq_pre."),
    )
}


# -------------------------------------------------------------------------------------- fitting
def optimizer_for(torch, model, lr: float):
    """AdamW as blockbench's tasks build it (weight decay on matrices only, their betas and decay),
    at a constant ``lr``; the same for every implementation."""
    from tasks.base import OptimizerConfig

    defaults = OptimizerConfig()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": defaults.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=defaults.betas)


def fit(impl: str, dims: Dims, *, steps: int, seed: int, lr: float) -> dict[str, Any]:
    """Train ``impl`` for ``steps`` updates on the batch of seed 0 from its init of ``seed``; the loss
    before each update and after the last (``steps + 1`` values)."""
    import torch

    generator = torch.Generator().manual_seed(0)  # the batch: the same for every implementation and seed
    torch.manual_seed(seed)  # the init
    run = IMPLEMENTATIONS[impl].build(torch, generator, dims)
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
    lines = ["| implementation | parameters | " + " | ".join(f"loss @{s}" for s in shown)
             + f" | ours / this @{steps} | ours − this @{steps} |",
             "|---|---|" + "---|" * len(shown) + "---|---|"]
    for impl in case.impls:
        runs = fits[impl]
        final = statistics.fmean(f["losses"][steps] for f in runs)
        cells = [_loss([f["losses"][s] for f in runs]) for s in shown]
        lines.append(f"| {impl} | {runs[0]['parameters']:,} | " + " | ".join(cells)
                     + f" | {ours_final / final:.2f} | {ours_final - final:+.3f} |")
    return lines


def report(fits: dict[str, dict[str, list[dict[str, Any]]]], args: argparse.Namespace, command: str) -> str:
    import torch

    from blockbench.provenance import cpu_model, git_state

    git = git_state()
    commit = f"{git['commit'][:12]}{' + uncommitted changes' if git['dirty'] else ''}" if git["commit"] else "unknown"
    lines = ["# Initialisation parity: fitting a fixed batch, blockbench vs the implementations people use", "",
             f"Produced by `{command}` on {time.strftime('%Y-%m-%d')} (code: {commit}).", "",
             f"- CPU: {cpu_model()}, {os.cpu_count()} logical CPUs, torch threads {args.threads}, "
             f"`torch.backends.cpu.get_cpu_capability()` = {torch.backends.cpu.get_cpu_capability()}",
             f"- torch {torch.__version__}, Python {platform.python_version()}; {package_versions()}",
             f"- Every implementation: the same seeded random batch per family, fp32, AdamW lr {args.lr:g} constant "
             "(no warm-up, schedule or clipping), betas and weight decay of blockbench's tasks "
             "(`tasks.base.OptimizerConfig`) on matrices only; loss before each update (step k = after k updates), "
             "computed as each implementation is trained (ours: the tasks' loss functions; references: "
             "`F.cross_entropy` on the logits).",
             f"- Init seeds {', '.join(map(str, args.seeds))}" + (": each loss is the mean over seeds, with the "
                                                                    "range in brackets." if len(args.seeds) > 1 else "."),
             ""]
    lines += ["## Summary: loss after the last step", "",
              f"| family | blockbench @{args.steps} | best reference | its loss @{args.steps} | ours / it | ours − it |",
              "|---|---|---|---|---|---|"]
    for name, case_fits in fits.items():
        case = CASES[name]

        def final(impl: str) -> float:
            return statistics.fmean(f["losses"][args.steps] for f in case_fits[impl])

        best = min(case.impls[1:], key=final)
        ours = final(case.impls[0])
        lines.append(f"| {name} | {ours:.3f} | {best} | {final(best):.3f} | **{ours / final(best):.2f}** | "
                     f"{ours - final(best):+.3f} |")
    for name, case_fits in fits.items():
        case = CASES[name]
        lines += ["", f"## {name}", "", case.description + ".", ""] + case_table(case, case_fits, args.steps)
        lines += ["", f"What differs: {case.notes}", ""]
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

    missing = missing_packages([impl for name in args.cases for impl in CASES[name].impls])
    if missing:
        sys.exit(f"the reference implementations need {', '.join(missing)}: pip install -e \".[bench]\"")
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
    command = "python benchmarks/init_parity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(fits, args, command.strip())
    print(text)
    if args.out != "-":
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
