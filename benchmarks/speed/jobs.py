"""One cell on every core, or one cell per core? What ``--jobs auto`` is based on.

    python -m benchmarks.speed.jobs            # the three default tasks, writes results/jobs.md

For each task of ``configs/base.yaml`` and each round, it times training steps of the task's default
cell (plain loop: zero_grad, forward, backward, AdamW step, the cell's own data) two ways, back to
back (alternating which goes first, ``benchmarks.harness.round_order``):

* **one cell**: one process on all ``N`` cores (N intra-op threads);
* **N cells**: N processes at once, each on one thread, as ``--jobs auto`` runs them.

The figure that matters is cells finished per unit of time: ``N / (step time of a cell among N)``
against ``1 / (step time of the lone cell)``. Each round gives that ratio; the report gives its
geometric mean with a 95% interval over the rounds (``benchmarks.harness.ratio_interval``), a tie when
it includes 1. Each worker times its steps with ``benchmarks.harness.time_calls``; the cells of a
measurement are processes started together, which no ``torch.utils.benchmark.Timer`` in this process sees.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics

import torch

from benchmarks import ROOT
from benchmarks.harness import (
    RATIO_METHOD,
    command_line,
    machine_facts,
    print_and_write,
    ratio_interval,
    report_header,
    round_order,
    time_calls,
)


def time_steps(task: str, threads: int, steps: int, warmup: int, start, results) -> None:
    """Worker: build the task's default cell, wait for the others, then time ``steps`` optimizer steps."""
    torch.set_num_threads(threads)
    from blockbench.config import build_run_config, load_yaml

    run = build_run_config(load_yaml(ROOT / "configs" / "base.yaml"), {"task": task})
    torch.manual_seed(0)
    module, datamodule = run.task.build(
        run.resolved_model(),
        run.optimizer,
        max_steps=run.trainer.max_steps,
        batch_size=run.trainer.per_device_batch_size(1),
    )
    datamodule.setup("fit")
    optimizer = module.configure_optimizers()["optimizer"]
    module.train()
    batches = iter(datamodule.train_dataloader())
    start.wait()  # every worker of this measurement starts timing together

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        module.training_loss(next(batches)).backward()
        optimizer.step()

    results.put(statistics.median(time_calls(step, warmup=warmup, min_calls=steps).times))


def measure(task: str, cells: int, threads: int, steps: int, warmup: int) -> float:
    """Median step seconds of a cell while ``cells`` cells of ``threads`` threads train at once (mean over cells)."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(cells), context.Queue()
    workers = [
        context.Process(target=time_steps, args=(task, threads, steps, warmup, start, results)) for _ in range(cells)
    ]
    for worker in workers:
        worker.start()
    medians = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    return statistics.fmean(medians)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["lm", "translation", "vit"])
    parser.add_argument("--cores", type=int, default=torch.get_num_threads(), help="N (default: torch's threads)")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="results/jobs.md", help="markdown report ('-': print only)")
    args = parser.parse_args(argv)
    n = args.cores

    rows = []
    for task in args.tasks:
        lone_ms, shared_ms = {}, {}
        for r in range(args.rounds):
            for cells, threads in round_order([(1, n), (n, 1)], r):
                seconds = measure(task, cells, threads, args.steps, args.warmup)
                (lone_ms if cells == 1 else shared_ms)[r] = seconds * 1e3
            print(
                f"{task} round {r + 1}: one cell on {n} threads {lone_ms[r]:.0f} ms/step, {n} cells on 1 thread "
                f"{shared_ms[r]:.0f} ms/step",
                flush=True,
            )
        # cells per second: 1 / lone vs n / shared; as a "ratio of step times" that is lone / (shared / n)
        ratio = ratio_interval({r: ms / n for r, ms in shared_ms.items()}, lone_ms)
        rows.append((task, statistics.median(lone_ms.values()), statistics.median(shared_ms.values()), ratio))

    machine = machine_facts("cpu", n)
    lines = report_header("One cell on every core, or one cell per core", command_line(__spec__.name, argv), machine)
    lines += [
        f"- fp32. The default cell of each task (`configs/base.yaml`), {args.steps} timed optimizer steps after "
        f"{args.warmup} warm-up steps, {args.rounds} rounds, both ways back to back in each (alternating which "
        f"goes first). Cells per unit of time: {n} / (step time of each of {n} cells training at once) against "
        f"1 / (step time of one cell on {n} threads); 95% interval over rounds ({RATIO_METHOD}).",
        "",
        f"| task | one cell, {n} threads: ms/step | {n} cells, 1 thread each: ms/step | cells per unit of time, "
        f"{n} at once vs one | 95% interval | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for task, lone, shared, ratio in rows:
        interval = "–" if ratio.low is None else f"{ratio.low:.2f} to {ratio.high:.2f}"
        verdict = {"faster": f"{n} cells at once", "slower": "one cell at a time"}.get(ratio.verdict, ratio.verdict)
        lines.append(f"| {task} | {lone:.0f} | {shared:.0f} | **{ratio.ratio:.2f}** | {interval} | {verdict} |")
    lines.append("")
    print_and_write("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
