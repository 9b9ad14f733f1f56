"""What training through Lightning costs over a plain PyTorch loop, per step.

    python benchmarks/lightning_overhead.py            # the three default tasks, writes results/lightning_overhead.md

For each task of ``configs/base.yaml`` it trains the same model, on the same data loader, with the
same optimizer, schedule and gradient clipping, twice:

* **plain**: ``for batch in loader: zero_grad; loss = module.training_loss(batch); backward;
  clip_grad_norm_; optimizer.step(); scheduler.step()``;
* **Lightning**: ``blockbench.train.train`` -- the runner every cell uses, with its callbacks
  (speed figures, divergence guard, validation history, learning-rate monitor), TensorBoard
  logging, progress bar and per-step logging; validation is moved after the timed steps and
  checkpoints are switched off, so both loops do the same work.

A step's time is one whole cycle of the loop, from the start of a step to the start of the next:
fetching the batch, hooks and logging included. Both loops run back to back ``--repeats`` times,
alternating which goes first; each repeat gives the ratio of their median cycles, and the overhead
is the median of these paired ratios, so the slow and fast phases of a shared machine cancel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import lightning as L  # noqa: E402
import torch  # noqa: E402

from blockbench.config import build_run_config, load_yaml  # noqa: E402
from blockbench.train import train  # noqa: E402


class StepIntervalTimer(L.Callback):
    """Wall time between the starts of consecutive optimizer steps from step ``first`` on: one
    whole cycle of the loop each (fetching the batch, hooks, logging, the step itself)."""

    def __init__(self, first: int):
        self.first = first
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step >= self.first:
            self.starts.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == trainer.max_steps:  # the end of the last cycle (before the final validation)
            self.starts.append(time.perf_counter())

    @property
    def intervals(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, self.starts[1:])]


def run_config(task: str, steps: int):
    overrides = {"task": task, "trainer.max_steps": steps, "trainer.val_every_n_steps": steps,
                 "trainer.checkpoint_every_n_steps": None}
    return build_run_config(load_yaml(ROOT / "configs" / "base.yaml"), overrides)


def plain_loop(task: str, steps: int, warmup: int) -> list[float]:
    """Seconds of each loop cycle of the plain PyTorch loop, from step ``warmup`` on."""
    run = run_config(task, steps)
    L.seed_everything(run.seed, workers=True, verbose=False)
    module, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=steps,
                                        batch_size=run.trainer.per_device_batch_size(1))
    datamodule.setup("fit")
    optimization = module.configure_optimizers()
    optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
    module.train()
    starts = []
    for step, batch in enumerate(datamodule.train_dataloader()):
        if step >= warmup:
            starts.append(time.perf_counter())
        if step == steps:
            break
        optimizer.zero_grad(set_to_none=True)
        loss = module.training_loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), run.trainer.grad_clip)
        optimizer.step()
        scheduler.step()
    return [b - a for a, b in zip(starts, starts[1:])]


def lightning_loop(task: str, steps: int, warmup: int, workdir: Path) -> list[float]:
    """The same through blockbench's Lightning runner."""
    timer = StepIntervalTimer(warmup)
    run = run_config(task, steps)
    out = workdir / f"{task}-{time.monotonic_ns()}"
    train(run, out, tb_dir=out / "tb", tb_name=task, tb_version="0", extra_callbacks=[timer])
    return timer.intervals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["lm", "translation", "vit"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/lightning_overhead.md", help="markdown report ('-': print only)")
    args = parser.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for task in args.tasks:
            plain, lightning, ratios = [], [], []
            for repeat in range(args.repeats):
                # alternate which loop goes first, so a drift of the machine's speed cancels out
                if repeat % 2 == 0:
                    p = plain_loop(task, args.steps, args.warmup)
                    q = lightning_loop(task, args.steps, args.warmup, Path(workdir))
                else:
                    q = lightning_loop(task, args.steps, args.warmup, Path(workdir))
                    p = plain_loop(task, args.steps, args.warmup)
                plain += p
                lightning += q
                ratios.append(statistics.median(q) / statistics.median(p))
                print(f"{task} repeat {repeat + 1}: median plain {statistics.median(p) * 1e3:.1f} ms/step, "
                      f"Lightning {statistics.median(q) * 1e3:.1f} ms/step", flush=True)
            rows.append((task, statistics.median(plain), statistics.median(lightning), ratios))

    command = "python benchmarks/lightning_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["# Lightning overhead per training step", "",
             f"Produced by `{command.strip()}` on {time.strftime('%Y-%m-%d')} ({torch.get_num_threads()} torch threads). "
             f"Default cells of `configs/base.yaml`, {args.steps} steps per run, the first {args.warmup} untimed, "
             f"{args.repeats} repeats of both loops back to back (alternating which goes first). A step's time is one "
             "cycle of the loop (batch fetch, hooks, logging, step); each repeat gives the ratio of the two loops' "
             "median cycles, and the overhead is the median of those ratios (paired, so the machine's slow and fast "
             "phases cancel).",
             "", "| task | plain PyTorch ms/step | Lightning runner ms/step | overhead (median) | overhead of each repeat |",
             "|---|---|---|---|---|"]
    for task, plain, lightning, ratios in rows:
        lines.append(f"| {task} | {plain * 1e3:.1f} | {lightning * 1e3:.1f} | {statistics.median(ratios) - 1:+.1%} | "
                     f"{', '.join(f'{r - 1:+.1%}' for r in ratios)} |")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
