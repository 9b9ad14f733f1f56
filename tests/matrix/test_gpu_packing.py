"""Several small cells on one GPU, checked on a CPU with the job's GPUs and their free memory faked:
how many cells a GPU holds for given peaks and free memory (never more than fit), the CPU threads
split between the cells that run at once, a cell of several GPUs never packed, and on a GPU the time
estimate's one timing per task and shape instead of one per variant."""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch
from helpers import TINY_LM, write_matrix, write_ok_record

from blockbench.cli import main
from blockbench.config import build_run_config
from blockbench.matrix import devices
from blockbench.matrix.devices import (
    CONTEXT_BYTES,
    MAX_CELLS_PER_GPU,
    DevicePool,
    auto_jobs,
    cells_per_gpu,
    footprint,
    packed_per_gpu,
)
from blockbench.matrix.estimate.timing import CellTiming
from blockbench.matrix.expand import load_matrix
from blockbench.matrix.memory import MIB, cell_peaks, estimated_peak_bytes
from blockbench.store.record import CellRecord, write_record

GIB = 2**30


@pytest.mark.parametrize("capacity_gib", [0.5, 1.0, 2.0, 5.0, 12.0, 80.0, 140.0])
@pytest.mark.parametrize("peaks_gib", [[0.01, 0.2], [1.0], [3.0, 0.5], [30.0], [100.0, 1.0]])
def test_a_gpu_holds_as_many_cells_as_fit_and_never_more(capacity_gib, peaks_gib):
    """Brute force: the largest count n <= MAX_CELLS_PER_GPU with n footprints of the largest cell
    within the free memory (the CUDA context and the headroom counted), at least 1."""
    peaks = [int(p * GIB) for p in peaks_gib]
    capacity = int(capacity_gib * GIB)
    got = cells_per_gpu(peaks, capacity)
    largest = CONTEXT_BYTES + 1.5 * max(peaks)
    fitting = [n for n in range(1, MAX_CELLS_PER_GPU + 1) if n * largest <= capacity]
    assert got == max(fitting, default=1)
    assert got == 1 or got * footprint(max(peaks)) <= capacity


def test_unknown_peaks_and_cells_of_several_gpus_are_not_packed():
    assert cells_per_gpu([GIB, None], 140 * GIB) == 1
    assert packed_per_gpu([1, 1], [MIB, MIB], [140 * GIB], cpu_cores=16) == MAX_CELLS_PER_GPU
    assert packed_per_gpu([2, 1], [MIB, MIB], [140 * GIB] * 2, cpu_cores=16) == 1  # a DDP cell: whole devices
    assert packed_per_gpu([0, 0], [MIB, MIB], [], cpu_cores=16) == 1  # a CPU
    # the GPU with the least free memory decides; the CPU cores feed 2 cells each (16 cores, 2 GPUs: 4 per GPU)
    assert packed_per_gpu([1] * 8, [int(2.2 * GIB)] * 8, [80 * GIB, 10 * GIB], cpu_cores=16) == 2
    assert packed_per_gpu([1] * 8, [MIB] * 8, [80 * GIB], cpu_cores=4) == 2
    # --jobs N spreads N cells over the GPUs, as many as fit
    assert packed_per_gpu([1] * 8, [MIB] * 8, [80 * GIB] * 2, cpu_cores=4, jobs=6) == 3
    assert packed_per_gpu([1] * 8, [30 * GIB] * 8, [80 * GIB], cpu_cores=64, jobs=6) == 1
    # --jobs auto: every GPU's cells at once; a cell of several GPUs takes them whole
    assert auto_jobs([1, 1], available=2, cpu_cores=16, per_gpu=3) == 6
    assert auto_jobs([2, 2], available=4, cpu_cores=16, per_gpu=3) == 2


def test_the_pool_packs_single_gpu_cells_and_keeps_a_multi_gpu_cell_alone():
    pool = DevicePool(["0", "1"], per_gpu=2)
    taken = [pool.take(1) for _ in range(4)]
    assert taken == [["0"], ["1"], ["0"], ["1"]]  # the least busy device first
    got: list[list[str]] = []
    waiting = threading.Thread(target=lambda: got.append(pool.take(2)))
    waiting.start()
    time.sleep(0.1)
    assert not got  # a cell of two GPUs waits for two idle devices
    pool.give_back(["0"])
    pool.give_back(["0"])
    pool.give_back(["1"])
    time.sleep(0.1)
    assert not got  # device 1 still runs a cell
    pool.give_back(["1"])
    waiting.join(timeout=5)
    assert got == [["0", "1"]]
    single: list[list[str]] = []
    blocked = threading.Thread(target=lambda: single.append(pool.take(1)))
    blocked.start()
    time.sleep(0.1)
    assert not single  # nothing packed beside the multi-GPU cell
    pool.give_back(["0", "1"])
    blocked.join(timeout=5)
    assert single == [["0"]]


def test_the_peak_estimate_is_the_hand_computed_one_and_a_recorded_peak_wins(tmp_path):
    run = build_run_config(TINY_LM)
    model = run.resolved_model()
    d, ff, seq, vocab = 32, 64, model.max_seq_len, model.vocab_size
    parameters = 1 * (4 * d * d + 3 * d * ff) + (vocab + seq) * d
    activations = 1 * seq * 8 * (34 * d + 5 * 2 * seq)
    assert estimated_peak_bytes(run, "bf16-mixed") == 16 * parameters + activations + 3 * 8 * seq * vocab * 4
    assert estimated_peak_bytes(run, "32-true") == 16 * parameters + 2 * activations + 3 * 8 * seq * vocab * 4

    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"], "seed": [0, 1]})
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    first = cells[0]
    record = CellRecord(status="ok", task="lm", peak_memory={"cpu_rss_mb": 900.0, "cuda_max_allocated_mb": 300.0})
    write_record(first.directory(matrix_dir) / "result.json", record)
    peaks = dict(zip([c.key for c in cells], cell_peaks(cells, matrix_dir), strict=True))
    assert peaks[first.key] == 300 * MIB
    same_variant = [c for c in cells if c.variant == first.variant and c is not first]
    assert all(peaks[c.key] == 300 * MIB for c in same_variant)  # the variant's recorded peak
    assert all(peaks[c.key] == 300 * MIB for c in cells)  # the task's, for the variant not run yet


def fake_gpus(monkeypatch, count: int, free_gib: float, cores: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=0: (int(free_gib * GIB), int(free_gib * GIB)))
    monkeypatch.setattr("blockbench.matrix.jobs.cpu_cores", lambda: cores)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_a_matrix_on_one_gpu_runs_cells_side_by_side_with_the_cores_split(tmp_path, monkeypatch):
    """One faked GPU with room for many tiny cells and 8 cores: --jobs auto runs 4 cells at once on
    device 0 (8 cores feed 4), each with 8 // 4 = 2 threads."""
    import blockbench.matrix.run as run_module

    fake_gpus(monkeypatch, count=1, free_gib=80, cores=8)
    monkeypatch.setattr(run_module, "resolve_peaks", lambda cells, threads, **_: None)
    monkeypatch.setattr(run_module, "start_server", lambda: None)
    path = write_matrix(tmp_path, {"seed": list(range(8))})
    lock = threading.Lock()
    running: list[str] = []
    most: list[int] = []
    seen: list[tuple[str, str]] = []

    def fake_run_cell(cell, matrix_dir, matrix_file, *, slot, log_file=None, fresh=False):
        environment = slot.environment()
        with lock:
            running.append(cell.key)
            most.append(len(running))
            seen.append((environment["CUDA_VISIBLE_DEVICES"], environment["OMP_NUM_THREADS"]))
        time.sleep(0.2)
        with lock:
            running.remove(cell.key)
        return write_ok_record(cell, matrix_dir)

    monkeypatch.setattr("blockbench.matrix.rounds.run_cell", fake_run_cell)
    runner = run_module.MatrixRunner(path, tmp_path / "results", run_module.RunOptions(), run_module.Reporting.none())
    assert (runner.per_gpu, runner.jobs) == (4, 4)
    assert runner.run() == 0
    assert len(seen) == 8 and set(seen) == {("0", "2")}
    assert max(most) == 4


def test_a_cell_of_several_gpus_is_never_packed(tmp_path, monkeypatch):
    import blockbench.matrix.run as run_module

    fake_gpus(monkeypatch, count=4, free_gib=80, cores=64)
    base = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "accelerator": "gpu", "devices": 2, "strategy": "ddp"}}
    path = write_matrix(tmp_path, {"seed": [0, 1, 2]}, base=base)
    runner = run_module.MatrixRunner(path, tmp_path / "results", run_module.RunOptions(), run_module.Reporting.none())
    assert (runner.per_gpu, runner.jobs) == (1, 2)


def test_on_a_gpu_the_dry_run_times_one_cell_per_task_and_shape(tmp_path, monkeypatch, capsys):
    """Two variants of one shape and a wider model: two timings (not three), the variant of the timed
    shape estimated from its sibling's timing (a task probe)."""
    fake_gpus(monkeypatch, count=1, free_gib=80, cores=8)
    timed: list = []
    timing = CellTiming(process=0.5, build=1.5, fit=2.0, step=3.0, validation=2.5, curve=0.2, checkpoint=0.7)

    def timer(jobs):
        def time_them(runs):
            timed.extend(runs)
            return {key: timing for key in runs}, {}

        return time_them

    monkeypatch.setattr("blockbench.matrix.estimate.dry_run.cell_timer", timer)
    monkeypatch.setattr("blockbench.matrix.estimate.dry_run.start_server", lambda: None)
    axes = {"model.norm_placement": ["pre", "post"], "model.d_model": [32, 64]}
    path = write_matrix(tmp_path, axes)
    assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "timing a cell of each of 2 task and shape(s)" in out, out
    assert len(timed) == 2 and {variant for _, variant in timed} == {
        "norm_placement=pre,d_model=32",
        "norm_placement=pre,d_model=64",
    }, timed
    assert len(re.findall(r"to run\s+~0:00:\d\d", out)) == 4, out  # every cell has an estimate
    assert "a cell of another variant of the same task and shape timed here" in out


def test_the_packing_module_stays_standard_library_only():
    source = devices.__loader__.get_source(devices.__name__)
    assert "import torch" not in source
