"""What training through Lightning costs over a plain PyTorch loop, per step.

    python benchmarks/lightning_overhead.py            # the three default tasks, writes results/lightning_overhead.md

For each task of ``configs/base.yaml`` it trains the same model, on the same data loader, with the
same optimizer, schedule and gradient clipping, twice:

* **plain**: ``for batch in loader: zero_grad; loss = module.training_loss(batch); backward;
  clip_grad_norm_; optimizer.step(); scheduler.step()``;
* **Lightning**: ``blockbench.cell.train.train`` -- the runner every cell uses, with its callbacks
  (speed figures, divergence guard, validation history, learning-rate monitor), TensorBoard
  logging, progress bar and per-step logging; validation is moved after the timed steps and
  checkpoints are switched off, so both loops do the same work.

A step's time is one whole cycle of the loop, from the start of a step to the start of the next:
fetching the batch, hooks and logging included. Both loops run back to back, alternating which goes
first; each repeat gives the ratio of their median cycles (paired, so the slow and fast phases of a
shared machine cancel). The overhead is the geometric mean of these ratios with a 95% t interval over
the repeats (``throughput.ratio_interval``, the same method as the speed table); repeats go on until
that interval is narrower than ``--target-width`` (5 points) or ``--max-repeats`` is reached.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import lightning as L  # noqa: E402
import torch  # noqa: E402
from throughput import RATIO_METHOD, Ratio, code_note, machine_facts, print_and_write, ratio_interval  # noqa: E402

from blockbench.cell.train import train  # noqa: E402
from blockbench.config import build_run_config, load_yaml  # noqa: E402


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
        return [b - a for a, b in itertools.pairwise(self.starts)]


def run_config(task: str, steps: int):
    overrides = {
        "task": task,
        "trainer.max_steps": steps,
        "trainer.val_every_n_steps": steps,
        "trainer.checkpoint_every_n_steps": None,
    }
    return build_run_config(load_yaml(ROOT / "configs" / "base.yaml"), overrides)


def plain_loop(task: str, steps: int, warmup: int) -> list[float]:
    """Seconds of each loop cycle of the plain PyTorch loop, from step ``warmup`` on."""
    run = run_config(task, steps)
    L.seed_everything(run.seed, workers=True, verbose=False)
    module, datamodule = run.task.build(
        run.resolved_model(), run.optimizer, max_steps=steps, batch_size=run.trainer.per_device_batch_size(1)
    )
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
    return [b - a for a, b in itertools.pairwise(starts)]


def lightning_loop(task: str, steps: int, warmup: int, workdir: Path) -> list[float]:
    """The same through blockbench's Lightning runner."""
    timer = StepIntervalTimer(warmup)
    run = run_config(task, steps)
    out = workdir / f"{task}-{time.monotonic_ns()}"
    train(run, out, tb_dir=out / "tb", tb_name=task, tb_version="0", extra_callbacks=[timer])
    return timer.intervals


def measure_task(task: str, args: argparse.Namespace, workdir: Path) -> tuple[list[float], list[float], Ratio]:
    """Repeat both loops on ``task`` until the overhead's interval is narrow enough: every cycle of
    each loop, and Lightning's time over plain's with its interval over the paired repeats."""
    plain, lightning, plain_ms, lightning_ms = [], [], {}, {}
    for repeat in range(args.max_repeats):
        # alternate which loop goes first, so a drift of the machine's speed cancels out
        if repeat % 2 == 0:
            p = plain_loop(task, args.steps, args.warmup)
            q = lightning_loop(task, args.steps, args.warmup, workdir)
        else:
            q = lightning_loop(task, args.steps, args.warmup, workdir)
            p = plain_loop(task, args.steps, args.warmup)
        plain += p
        lightning += q
        plain_ms[repeat], lightning_ms[repeat] = statistics.median(p) * 1e3, statistics.median(q) * 1e3
        ratio = ratio_interval(plain_ms, lightning_ms)  # Lightning's step time over plain's
        width = None if ratio.low is None else ratio.high - ratio.low
        print(
            f"{task} repeat {repeat + 1}: median plain {plain_ms[repeat]:.1f} ms/step, Lightning "
            f"{lightning_ms[repeat]:.1f} ms/step; overhead so far {ratio.ratio - 1:+.1%}"
            + ("" if width is None else f" ({ratio.low - 1:+.1%} to {ratio.high - 1:+.1%})"),
            flush=True,
        )
        if repeat + 1 >= args.min_repeats and width is not None and width < args.target_width:
            break
    return plain, lightning, ratio


def overhead_verdict(ratio: Ratio, target: float) -> str:
    """Within the target, above it, or not decided by this machine's noise."""
    if ratio.high is None:
        return "no interval (1 repeat)"
    if ratio.high - 1 <= target:
        return f"within {target:.0%}"
    if ratio.low - 1 > target:
        return f"above {target:.0%}"
    return f"undecided (the interval spans {target:.0%})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["lm", "translation", "vit"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--min-repeats", type=int, default=4)
    parser.add_argument("--max-repeats", type=int, default=16)
    parser.add_argument(
        "--target-width",
        type=float,
        default=0.05,
        help="stop repeating once the 95%% interval of the overhead is narrower than this (0.05: 5 points)",
    )
    parser.add_argument("--target", type=float, default=0.02, help="the overhead the verdict column checks (0.02: 2%%)")
    parser.add_argument("--out", default="results/lightning_overhead.md", help="markdown report ('-': print only)")
    args = parser.parse_args(argv)
    if args.min_repeats < 1 or args.max_repeats < args.min_repeats:
        parser.error("--min-repeats must be at least 1 and at most --max-repeats")

    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for task in args.tasks:
            plain, lightning, ratio = measure_task(task, args, Path(workdir))
            rows.append((task, statistics.median(plain), statistics.median(lightning), ratio))

    machine = machine_facts("cpu", torch.get_num_threads())
    command = "python benchmarks/lightning_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# Lightning overhead per training step",
        "",
        f"Produced by `{command.strip()}` on {time.strftime('%Y-%m-%d')}{code_note()}.",
        "",
        f"- CPU: {machine['cpu']}, `torch.backends.cpu.get_cpu_capability()` = {machine['cpu_capability']}, "
        f"{machine['logical_cpus']} logical CPUs, {machine['torch_threads']} torch threads; torch {machine['torch']}, "
        f"lightning {L.__version__}, Python {machine['python']}; fp32",
        f"- Default cells of `configs/base.yaml`, {args.steps} steps per run, the first {args.warmup} untimed. "
        "A step's time is one cycle of the loop (batch fetch, hooks, logging, step). Each repeat runs both loops "
        "back to back (alternating which goes first) and gives the ratio of their median cycles; the overhead is "
        f"the geometric mean of those paired ratios with a 95% interval over the repeats ({RATIO_METHOD}). "
        f"Repeats go on until the interval is narrower than {args.target_width * 100:.0f} points "
        f"({args.min_repeats} to {args.max_repeats} repeats).",
        "",
        f"| task | plain PyTorch ms/step | Lightning runner ms/step | overhead | 95% interval | repeats | "
        f"target <= {args.target:.0%} |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, plain, lightning, ratio in rows:
        interval = "–" if ratio.low is None else f"{ratio.low - 1:+.1%} to {ratio.high - 1:+.1%}"
        lines.append(
            f"| {task} | {plain * 1e3:.1f} | {lightning * 1e3:.1f} | {ratio.ratio - 1:+.1%} | {interval} | "
            f"{ratio.rounds} | {overhead_verdict(ratio, args.target)} |"
        )
    lines.append("")
    print_and_write("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
