"""GPU placement of a matrix's cells, checked on a CPU by faking the job's devices: the job's own
``CUDA_VISIBLE_DEVICES`` list is respected (SLURM's ``2,3`` stays 2 and 3), a cell gets as many whole
devices as ``trainer.devices`` asks, and ``--jobs auto`` packs whole cells."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import TINY_LM, write_ok_record

from blockbench.config import ConfigError, build_run_config
from blockbench.matrix.devices import DevicePool, auto_jobs, devices_per_cell, visible_devices


def run(**trainer):
    return build_run_config({**TINY_LM, "trainer": {**TINY_LM["trainer"], **trainer}})


def test_the_jobs_own_device_list_is_kept():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2,3"}, device_count=2) == ["2", "3"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-a1, GPU-b2"}, device_count=2) == ["GPU-a1", "GPU-b2"]
    assert visible_devices({}, device_count=4) == ["0", "1", "2", "3"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}, device_count=0) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "1,-1,2"}, device_count=1) == ["1"]  # CUDA stops at -1


def test_a_cell_takes_as_many_devices_as_it_asks_for():
    assert devices_per_cell(run(accelerator="gpu", devices=4), available=8) == 4
    assert devices_per_cell(run(accelerator="gpu", devices="0,1"), available=8) == 2
    assert devices_per_cell(run(accelerator="gpu", devices="auto"), available=8) == 8
    assert devices_per_cell(run(accelerator="gpu", devices=-1), available=3) == 3
    assert devices_per_cell(run(devices=1), available=0) == 0  # no GPU: a CPU cell
    assert devices_per_cell(run(accelerator="cpu", devices=2), available=8) == 0
    with pytest.raises(ConfigError, match="asks for 4 GPUs, but this job sees 2"):
        devices_per_cell(run(accelerator="gpu", devices=4), available=2)
    with pytest.raises(ConfigError, match="--launcher slurm"):
        devices_per_cell(run(accelerator="gpu", devices=4, num_nodes=2), available=8)


def test_auto_jobs_packs_whole_cells():
    assert auto_jobs([4, 4, 4], available=8, cpu_cores=32) == 2
    assert auto_jobs([1] * 10, available=8, cpu_cores=32) == 8
    assert auto_jobs([4, 1], available=6, cpu_cores=32) == 1  # the largest cell decides
    assert auto_jobs([0, 0], available=0, cpu_cores=2) == 2  # a CPU: one cell per core


def test_the_pool_hands_out_whole_disjoint_devices_and_waits_for_them():
    pool = DevicePool(["2", "3", "5", "7"])
    first = pool.take(2)
    second = pool.take(2)
    assert first == ["2", "3"] and second == ["5", "7"]
    got: list[list[str]] = []
    waiting = threading.Thread(target=lambda: got.append(pool.take(3)))
    waiting.start()
    time.sleep(0.1)
    assert not got  # only 0 free: it waits
    pool.give_back(first)
    time.sleep(0.1)
    assert not got  # 2 free: still waits for a third
    pool.give_back(second)
    waiting.join(timeout=5)
    assert got == [["2", "3", "5"]]
    assert pool.take(0) == []


def test_a_matrix_of_multi_gpu_cells_hands_each_running_cell_its_own_devices(tmp_path, monkeypatch):
    """A job given GPUs 2, 3, 5 and 7 (``CUDA_VISIBLE_DEVICES``, as SLURM sets it) runs cells of 2 GPUs:
    ``--jobs auto`` runs 2 at once, each sees exactly 2 of the job's devices, never one another holds."""
    import torch
    from helpers import write_matrix

    import blockbench.matrix.run as run_module

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5,7")
    monkeypatch.setattr(run_module, "resolve_peaks", lambda cells, threads, **_: None)  # no GPU to probe here
    base = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "accelerator": "gpu", "devices": 2, "strategy": "ddp"}}
    path = write_matrix(tmp_path, {"seed": [0, 1, 2, 3, 4, 5]}, base=base)
    lock = threading.Lock()
    running: list[tuple[str, ...]] = []
    seen: list[tuple[str, ...]] = []
    overlaps: list[str] = []

    def fake_run_cell(cell, matrix_dir, matrix_file, *, slot, log_file=None, fresh=False):
        devices = tuple(slot.environment()["CUDA_VISIBLE_DEVICES"].split(","))
        with lock:
            if any(set(devices) & set(other) for other in running):
                overlaps.append(cell.key)
            running.append(devices)
            seen.append(devices)
        time.sleep(0.2)
        with lock:
            running.remove(devices)
        return write_ok_record(cell, matrix_dir)

    monkeypatch.setattr("blockbench.matrix.rounds.run_cell", fake_run_cell)
    assert run_module.run_matrix(path, tmp_path / "results") == 0
    assert len(seen) == 6 and not overlaps
    assert all(len(d) == 2 and set(d) <= {"2", "3", "5", "7"} for d in seen)
    assert {d for d in seen} == {("2", "3"), ("5", "7")}  # two cells at a time, each a pair of the job's devices
