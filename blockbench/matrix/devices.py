"""Which GPUs each cell of a matrix gets: the devices this job may use, as many as each cell asks for.

A job sees the GPUs its scheduler gave it (SLURM and ``CUDA_VISIBLE_DEVICES=2,3`` name physical
devices 2 and 3), and a cell asks for ``trainer.devices`` of them on its one node. The runner hands
each running cell whole devices from that list (a cell of 4 GPUs takes 4, a cell of 1 takes 1) and
sets the cell's ``CUDA_VISIBLE_DEVICES`` to exactly those, so Lightning inside the cell sees as many
devices as it was told to use, numbered from 0, as torchrun and SLURM's GPU binding do. ``--jobs
auto`` runs as many cells at once as whole cells fit on the devices; a cell that waits for devices
starts when an earlier one returns them. A cell of several nodes (``trainer.num_nodes`` > 1) cannot
run on one machine: it needs ``--launcher slurm``. Standard library only: the runner imports it without
torch (the device count is passed in).

What a cell trains on also decides which earlier results count for it: the runner resolves once, before
planning, whether its cells get a CUDA GPU (:func:`cells_get_cuda`), and from it each cell's hardware
(:func:`cell_hardware`: ``trainer.accelerator: auto`` and ``trainer.precision: auto`` made concrete), which
a result, a checkpoint or a copy must have been made on to count (``blockbench.store.reuse``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from ..config import ConfigError, RunConfig, TrainerConfig
from ..store.record import Hardware

#: the variable that lists a process's visible GPUs (by index or UUID, comma-separated)
VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_devices(environment: Mapping[str, str], device_count: int) -> list[str]:
    """The GPUs this job may use, as the names its children pass on in ``CUDA_VISIBLE_DEVICES``: the
    list the job was given (``"2,3"`` -> ``["2", "3"]``; empty or ``-1``: none), else every device
    torch counts (``device_count``), by index."""
    given = environment.get(VISIBLE)
    if given is None:
        return [str(i) for i in range(device_count)]
    names = [name.strip() for name in given.split(",") if name.strip()]
    # CUDA stops at the first invalid entry: "-1" and what follows it hide every device
    if "-1" in names:
        names = names[: names.index("-1")]
    return names


def devices_per_cell(run: RunConfig, available: int) -> int:
    """How many GPUs a cell takes on this machine: 0 on a CPU; ``trainer.devices`` (a number, a list
    such as ``"0,1"`` or ``[0, 1]``, or ``auto`` / -1 for every one of ``available``)."""
    trainer = run.trainer
    if trainer.accelerator == "cpu" or available == 0:
        return 0
    if trainer.num_nodes > 1:
        raise ConfigError(
            f"trainer.num_nodes={trainer.num_nodes}: a cell of several nodes cannot run on this machine; "
            "run the matrix with --launcher slurm, which gives each cell its nodes"
        )
    devices = trainer.devices
    if devices in ("auto", -1, "-1"):
        return available
    if isinstance(devices, str):
        devices = [d for d in devices.split(",") if d.strip()] if "," in devices else int(devices)
    count = len(devices) if isinstance(devices, (list, tuple)) else int(devices)
    if count > available:
        raise ConfigError(
            f"trainer.devices={trainer.devices} asks for {count} GPUs, but this job sees {available} "
            f"({VISIBLE} or the machine's count): ask for at most {available}, or run where there are more"
        )
    return count


def cells_get_cuda(launcher: str, gpus: Sequence[str]) -> bool:
    """Whether this run's cells train on a CUDA GPU where ``trainer.accelerator`` is ``auto``: run on this
    machine (``local``, or ``submitit-local``'s jobs), where it has GPUs (``gpus``: :func:`visible_devices`);
    run as SLURM jobs, always (each job asks for GPUs unless its accelerator is ``cpu``,
    ``blockbench.matrix.jobs``)."""
    return True if launcher == "slurm" else bool(gpus)


def cell_hardware(trainer: TrainerConfig, *, cuda: bool) -> Hardware:
    """The device kind and precision a cell of ``trainer`` trains at where this run's cells get a CUDA
    GPU (``cuda``) or not: ``auto`` accelerator and precision resolved as the cell resolves them
    (``cuda at bf16-mixed`` on a GPU, ``cpu at 32-true`` on a CPU)."""
    accelerator = trainer.accelerator if trainer.accelerator != "auto" else ("gpu" if cuda else "cpu")
    return Hardware.of(accelerator, trainer.resolved_precision(accelerator), cuda=cuda)


def auto_jobs(needs: Sequence[int], available: int, cpu_cores: int) -> int:
    """``--jobs auto``: on GPUs, as many cells at once as whole cells of the largest need fit on the
    devices; on a CPU (no cell needs a GPU), one cell per core."""
    largest = max(needs, default=0)
    if largest == 0:
        return max(1, cpu_cores)
    return max(1, available // largest)


class DevicePool:
    """The job's GPUs, handed out whole to the running cells: :meth:`take` waits until ``n`` are free."""

    def __init__(self, devices: Sequence[str]):
        self._free = list(devices)
        self._all = tuple(devices)
        self._changed = threading.Condition()

    @property
    def devices(self) -> tuple[str, ...]:
        return self._all

    def take(self, n: int) -> list[str]:
        """``n`` free devices (the lowest-listed first), waiting for them; none for ``n`` = 0."""
        if n > len(self._all):
            raise ValueError(f"a cell asks for {n} devices of {len(self._all)}")
        with self._changed:
            self._changed.wait_for(lambda: len(self._free) >= n)
            taken, self._free = self._free[:n], self._free[n:]
            return taken

    def give_back(self, devices: Sequence[str]) -> None:
        with self._changed:
            self._free = [d for d in self._all if d in self._free or d in devices]
            self._changed.notify_all()
