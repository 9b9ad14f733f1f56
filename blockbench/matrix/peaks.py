"""The peak FLOP/s that the cells' MFU divides by, read or measured once before the first cell of a
matrix starts, so that every cell reads the same cached figure and no probe runs beside training cells."""

from __future__ import annotations

from typing import Any

from ..config import TrainerConfig
from .expand import Cell
from .launch import run_in_server


def resolve_peaks(cells: list[Cell], slot_threads: int | None, *, in_server: bool = False) -> None:
    """Read, or measure once, the peak FLOP/s that MFU divides by for every compute dtype and thread
    count these cells train with on this machine's CPU, before the first of them starts: each cell
    then reads the same cached figure (:func:`blockbench.cell.perf.peak_flops`), and no probe runs while
    other cells train. A cell's threads are ``trainer.num_threads``, else its slot's (``--jobs``),
    else torch's default, which this process has too (it runs in the same environment).

    Left to the cells themselves (the first probes, any others wait for it and read it): cells with
    ``trainer.peak_tflops``, GPU cells (a probe here would keep a CUDA context, and GPU memory, in
    this process for the whole matrix) and multi-process cells (Lightning sets their threads).

    ``in_server``: read or measure it in a process forked from the started cell server
    (:mod:`blockbench.matrix.launch`), which has imported Lightning already: the probe's module
    (:mod:`blockbench.cell.perf`) imports Lightning, which would cost the runner itself seconds of
    start-up.
    """
    trainers = [cell.run.trainer for cell in cells]
    if in_server:
        run_in_server(_resolve, trainers, slot_threads)
    else:
        _resolve(trainers, slot_threads)


def _resolve(trainers: list[TrainerConfig], slot_threads: int | None) -> None:
    """:func:`resolve_peaks` for the cells' Trainer settings, in this process."""
    import torch

    from ..cell.perf import compute_dtype, peak_flops

    settings: dict[tuple[Any, int], str] = {}
    for trainer in trainers:
        accelerator = (
            trainer.accelerator if trainer.accelerator != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")
        )
        if (
            trainer.peak_tflops is not None
            or accelerator != "cpu"
            or trainer.devices not in (1, "1")
            or trainer.num_nodes > 1
        ):
            continue
        precision = trainer.resolved_precision(accelerator)
        try:
            dtype = compute_dtype(precision)
        except ValueError:
            continue  # the cell reports it
        settings.setdefault((dtype, trainer.num_threads or slot_threads or torch.get_num_threads()), precision)
    for (_, threads), precision in settings.items():
        peak = peak_flops(None, torch.device("cpu"), precision, threads=threads)
        print(
            f"MFU peak for {precision} on {threads} thread(s): {peak.tflops:.4g} TFLOP/s, what the cells' model "
            "FLOPs utilization (MFU) divides by: this CPU's measured fastest matmul, cached "
            "(blockbench peak shows how it was measured)",
            flush=True,
        )
