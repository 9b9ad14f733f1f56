"""What training through Lightning costs over a plain PyTorch loop, per step.

    python -m benchmarks.speed.lightning_overhead               # the three default tasks: results/lightning_overhead.md
    python -m benchmarks.speed.lightning_overhead --device cpu  # on the CPU even where there is a GPU

For each task of ``configs/base.yaml`` it trains the same model, on the same data loader, with the
same optimizer, schedule and gradient clipping, on the same device and in the same precision, twice:

* **plain**: ``for batch in loader: move it to the device (Lightning's batch hooks); zero_grad;
  loss = module.training_loss(batch) (under autocast for bf16-mixed); backward; clip_grad_norm_;
  optimizer.step(); scheduler.step()``, under the machine settings and data loading ``train`` uses
  (``blockbench.cell.runtime``: TF32, DataLoader workers and pinned memory on a GPU);
* **Lightning**: ``blockbench.cell.train.train`` -- the runner every cell uses, with its callbacks
  (speed figures, divergence guard, validation history, learning-rate monitor), TensorBoard
  logging, progress bar and per-step logging; validation is moved after the timed steps and
  checkpoints are switched off, so both loops do the same work.

The device is the one Lightning's ``accelerator: auto`` picks in ``blockbench.cell.train`` (a CUDA
GPU if there is one, else the CPU) unless ``--device`` names one; both loops get it explicitly
(``trainer.accelerator``, ``module.to(device)``), and the precision is the config's resolved for it
(``trainer.precision: auto``: bf16-mixed on a GPU, 32-true on a CPU). On a GPU each cycle starts
with ``torch.cuda.synchronize()`` in both loops, so a cycle's time is its work on the device, not
the host's lead over it (``benchmarks.harness.synced_clock``).

A step's time is one whole cycle of the loop, from the start of a step to the start of the next:
fetching the batch, hooks and logging included: timestamps inside a running loop, not a call a
``torch.utils.benchmark.Timer`` could repeat. Both loops run back to back, alternating which goes
first (``benchmarks.harness.round_order``); each repeat gives the ratio of their median cycles
(paired, so the slow and fast phases of a shared machine cancel). The overhead is the geometric mean
of these ratios with a 95% t interval over the repeats (``benchmarks.harness.ratio_interval``, the
same method as the speed table); repeats go on until that interval is narrower than
``--target-width`` (5 points) or ``--max-repeats`` is reached.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden

from benchmarks import ROOT
from benchmarks.harness import (
    RATIO_METHOD,
    Ratio,
    command_line,
    machine_facts,
    print_and_write,
    ratio_interval,
    report_header,
    round_order,
    synced_clock,
)
from blockbench.cell.runtime import data_loading, machine_settings
from blockbench.cell.train import train
from blockbench.config import RunConfig, build_run_config, load_yaml


def loop_device(requested: str | None = None) -> torch.device:
    """The device both loops train on: ``requested`` ("cpu" or "cuda", the first GPU as Lightning's
    ``devices: 1``), or with None or "auto" the one ``blockbench.cell.train`` gives
    ``trainer.accelerator: auto``, a CUDA GPU if there is one."""
    if requested in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def accelerator(device: torch.device) -> str:
    """``trainer.accelerator`` for ``device``: the Lightning run goes where the plain loop does."""
    return "gpu" if device.type == "cuda" else device.type


def precision_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """What Lightning's precision plugin wraps a training step in, for the precisions the plain loop
    mirrors: nothing for 32-true, bf16 autocast for bf16-mixed."""
    if precision in ("32-true", "32"):
        return contextlib.nullcontext()
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise ValueError(
        f"the plain loop mirrors precision 32-true and bf16-mixed, not {precision} (16-mixed needs a GradScaler)"
    )


class StepIntervalTimer(L.Callback):
    """Wall time between the starts of consecutive optimizer steps from step ``first`` on: one
    whole cycle of the loop each (fetching the batch, hooks, logging, the step itself)."""

    def __init__(self, first: int, device: torch.device | None = None):
        self.first = first
        self.device = device or torch.device("cpu")
        self.clock = synced_clock(self.device)  # as the plain loop: the previous step's work is done
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step >= self.first:
            self.starts.append(self.clock())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == trainer.max_steps:  # the end of the last cycle (before the final validation)
            self.starts.append(self.clock())

    @property
    def intervals(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.starts)]


def run_config(task: str, steps: int, device: torch.device) -> RunConfig:
    overrides = {
        "task": task,
        "trainer.max_steps": steps,
        "trainer.val_every_n_steps": steps,
        "trainer.checkpoint_every_n_steps": None,
        "trainer.accelerator": accelerator(device),
    }
    return build_run_config(load_yaml(ROOT / "configs" / "base.yaml"), overrides)


def batch_hook(name: str, module: L.LightningModule, datamodule: L.LightningDataModule, *args):
    """Call a batch hook (``on_before_batch_transfer``, ``transfer_batch_to_device``,
    ``on_after_batch_transfer``) where Lightning's trainer calls it: on the datamodule if it
    overrides the hook, else on the module."""
    owner = datamodule if is_overridden(name, datamodule, L.LightningDataModule) else module
    return getattr(owner, name)(*args)


def plain_loop(task: str, steps: int, warmup: int, device: torch.device) -> list[float]:
    """Seconds of each loop cycle of the plain PyTorch loop on ``device``, from step ``warmup`` on."""
    run = run_config(task, steps, device)
    cfg, on = run.trainer, accelerator(device)
    with machine_settings(cfg, on):  # as train(): TF32 for float32 matmuls on a GPU
        L.seed_everything(run.seed, workers=True, verbose=False)
        module, datamodule = run.task.build(
            run.resolved_model(), run.optimizer, max_steps=steps, batch_size=cfg.per_device_batch_size(1)
        )
        datamodule.load_for(**data_loading(cfg, on, 1))  # as train(): workers and pinned memory on a GPU
        module.to(device)  # before the optimizer exists, as Lightning moves it
        precision = cfg.resolved_precision(on)
        datamodule.setup("fit")
        optimization = module.configure_optimizers()
        optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
        module.train()
        clock, starts = synced_clock(device), []
        for step, batch in enumerate(datamodule.train_dataloader()):
            if step >= warmup:
                starts.append(clock())
            if step == steps:
                break
            batch = batch_hook("on_before_batch_transfer", module, datamodule, batch, 0)
            batch = batch_hook("transfer_batch_to_device", module, datamodule, batch, device, 0)
            batch = batch_hook("on_after_batch_transfer", module, datamodule, batch, 0)
            optimizer.zero_grad(set_to_none=True)
            with precision_context(precision, device):
                loss = module.training_loss(batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
    return [b - a for a, b in itertools.pairwise(starts)]


def lightning_loop(task: str, steps: int, warmup: int, workdir: Path, device: torch.device) -> list[float]:
    """The same through blockbench's Lightning runner, on ``device``."""
    timer = StepIntervalTimer(warmup, device)
    run = run_config(task, steps, device)
    out = workdir / f"{task}-{time.monotonic_ns()}"
    train(run, out, tb_dir=out / "tb", tb_name=task, tb_version="0", extra_callbacks=[timer])
    return timer.intervals


def measure_task(task: str, args: argparse.Namespace, workdir: Path) -> tuple[list[float], list[float], Ratio]:
    """Repeat both loops on ``task`` until the overhead's interval is narrow enough: every cycle of
    each loop, and Lightning's time over plain's with its interval over the paired repeats."""
    device = loop_device(args.device)
    plain, lightning, plain_ms, lightning_ms = [], [], {}, {}
    for repeat in range(args.max_repeats):
        # alternate which loop goes first, so a drift of the machine's speed cancels out
        for loop in round_order(("plain", "lightning"), repeat):
            if loop == "plain":
                p = plain_loop(task, args.steps, args.warmup, device)
            else:
                q = lightning_loop(task, args.steps, args.warmup, workdir, device)
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
    parser.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="where both loops train; auto (default): where Lightning's accelerator auto trains, a CUDA GPU if any",
    )
    parser.add_argument("--out", default="results/lightning_overhead.md", help="markdown report ('-': print only)")
    args = parser.parse_args(argv)
    if args.min_repeats < 1 or args.max_repeats < args.min_repeats:
        parser.error("--min-repeats must be at least 1 and at most --max-repeats")

    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for task in args.tasks:
            plain, lightning, ratio = measure_task(task, args, Path(workdir))
            rows.append((task, statistics.median(plain), statistics.median(lightning), ratio))

    device = loop_device(args.device)
    machine = machine_facts(str(device), torch.get_num_threads())
    precision = run_config(args.tasks[0], args.steps, device).trainer.resolved_precision(accelerator(device))
    lines = report_header("Lightning overhead per training step", command_line(__spec__.name, argv), machine)
    lines += [
        f"- Both loops on {machine['device']}, precision {precision}. Default cells of `configs/base.yaml`, "
        f"{args.steps} steps per run, the first {args.warmup} untimed. "
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
