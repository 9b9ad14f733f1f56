"""Which GPUs each cell of a matrix gets: the devices this job may use, as many as each cell asks for.

A job sees the GPUs its scheduler gave it (SLURM and ``CUDA_VISIBLE_DEVICES=2,3`` name physical
devices 2 and 3), and a cell asks for ``trainer.devices`` of them on its one node. The runner hands
each running cell whole devices from that list (a cell of 4 GPUs takes 4, a cell of 1 takes 1) and
sets the cell's ``CUDA_VISIBLE_DEVICES`` to exactly those, so Lightning inside the cell sees as many
devices as it was told to use, numbered from 0, as torchrun and SLURM's GPU binding do. A cell that
waits for devices starts when an earlier one returns them. A cell of several nodes
(``trainer.num_nodes`` > 1) cannot run on one machine: it needs ``--launcher slurm``.

Small cells leave a GPU mostly idle (a step of the book's small models takes a few milliseconds of
host time), so single-GPU cells share a GPU where their memory fits: :func:`cells_per_gpu` counts how
many of the largest cell's footprint (its expected peak of allocated memory with headroom, plus the
CUDA context every process has) fit in a GPU's free memory, at most :data:`MAX_CELLS_PER_GPU` and no
more than the CPU cores feed (:data:`CORES_PER_GPU_CELL` each); a cell whose peak is not known gets a
GPU to itself. Cells of several GPUs (DDP) are never packed: they take whole devices that no other
cell uses. ``--jobs auto`` runs as many cells at once as the devices hold (:func:`auto_jobs`), and the
runner splits the CPU cores between the cells that run at once. Standard library only: the runner
imports it without torch (device counts and free memory are passed in).

What a cell trains on also decides which earlier results count for it: the runner resolves once, before
planning, whether its cells get a CUDA GPU (:func:`cells_get_cuda`), and from it each cell's hardware
(:func:`cell_hardware`: ``trainer.accelerator: auto`` and ``trainer.precision: auto`` made concrete), which
a result, a checkpoint or a copy must have been made on to count (``blockbench.store.reuse``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence

from ..config import ConfigError, RunConfig, TrainerConfig
from ..store.record import Hardware

#: the variable that lists a process's visible GPUs (by index or UUID, comma-separated)
VISIBLE = "CUDA_VISIBLE_DEVICES"
#: GPU memory a cell's process takes beyond its tensors: the CUDA context, cuBLAS and cuDNN workspaces
CONTEXT_BYTES = 1 << 30
#: the factor on a cell's expected peak of allocated memory: the caching allocator reserves more
#: than it allocates (rounding, fragmentation), and an estimate may be low
HEADROOM = 1.5
#: the most single-GPU cells one GPU runs at once: without MPS the processes take turns on the GPU,
#: which pays while each leaves it idle between its host-bound steps, not beyond a few of them
MAX_CELLS_PER_GPU = 4
#: CPU cores a GPU cell keeps busy: its training loop and its data
CORES_PER_GPU_CELL = 2


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


def footprint(peak_bytes: int) -> int:
    """GPU bytes a cell's process takes at most: :data:`CONTEXT_BYTES` plus :data:`HEADROOM` times its
    expected peak of allocated memory."""
    return CONTEXT_BYTES + math.ceil(HEADROOM * peak_bytes)


def cells_per_gpu(peaks: Sequence[int | None], capacity: int, most: int = MAX_CELLS_PER_GPU) -> int:
    """How many single-GPU cells one GPU with ``capacity`` free bytes runs at once: as many footprints
    (:func:`footprint`) of the largest of ``peaks`` as fit, at most ``most``, at least 1 (a cell too
    large to share a GPU still gets one to itself). A cell whose peak is unknown (None) is not packed: 1."""
    if not peaks or any(peak is None for peak in peaks):
        return 1
    largest = footprint(max(peak for peak in peaks if peak is not None))
    return max(1, min(most, capacity // largest))


def packed_per_gpu(
    needs: Sequence[int],
    peaks: Sequence[int | None],
    capacities: Sequence[int],
    cpu_cores: int,
    jobs: int | None = None,
) -> int:
    """Single-GPU cells per GPU: 1 unless every cell takes exactly one GPU (a cell of several GPUs
    takes whole devices: none is packed beside it); else as many as fit in the GPU with the least
    free memory (``capacities``, :func:`cells_per_gpu` of the cells' ``peaks``), and for ``--jobs
    auto`` (``jobs`` None) as many as the CPU cores feed (:data:`CORES_PER_GPU_CELL` each, cores
    split between the GPUs), for ``--jobs N`` the N cells spread over the GPUs."""
    if not needs or not capacities or set(needs) != {1}:
        return 1
    fit = min(cells_per_gpu(peaks, capacity) for capacity in capacities)
    if jobs is None:
        return max(1, min(fit, cpu_cores // (CORES_PER_GPU_CELL * len(capacities))))
    return max(1, min(fit, -(-jobs // len(capacities))))


def auto_jobs(needs: Sequence[int], available: int, cpu_cores: int, per_gpu: int = 1) -> int:
    """``--jobs auto``: on GPUs, as many cells at once as whole cells of the largest need fit on the
    devices, ``per_gpu`` single-GPU cells on each (:func:`packed_per_gpu`); on a CPU (no cell needs a
    GPU), one cell per core."""
    largest = max(needs, default=0)
    if largest == 0:
        return max(1, cpu_cores)
    return max(1, available // largest * (per_gpu if largest == 1 else 1))


class DevicePool:
    """The job's GPUs, handed to the running cells: a cell of one GPU shares a device with at most
    ``per_gpu - 1`` others (the least busy device first), a cell of several takes whole devices that
    no other cell uses; :meth:`take` waits until they are free."""

    def __init__(self, devices: Sequence[str], per_gpu: int = 1):
        self._all = tuple(devices)
        self._cells = dict.fromkeys(self._all, 0)  # cells running on each device
        self.per_gpu = max(1, per_gpu)
        self._changed = threading.Condition()

    @property
    def devices(self) -> tuple[str, ...]:
        return self._all

    def _choose(self, n: int) -> list[str] | None:
        if n == 1:
            room = [d for d in self._all if self._cells[d] < self.per_gpu]
            return [min(room, key=lambda d: self._cells[d])] if room else None
        idle = [d for d in self._all if self._cells[d] == 0]
        return idle[:n] if len(idle) >= n else None

    def take(self, n: int) -> list[str]:
        """Devices for a cell of ``n`` GPUs, waiting for them (the lowest-listed first): one with room
        for a cell for ``n`` = 1, ``n`` idle devices, held whole, for more; none for ``n`` = 0."""
        if n > len(self._all):
            raise ValueError(f"a cell asks for {n} devices of {len(self._all)}")
        if n == 0:
            return []
        with self._changed:
            self._changed.wait_for(lambda: self._choose(n) is not None)
            taken = self._choose(n) or []
            for device in taken:
                self._cells[device] += 1 if n == 1 else self.per_gpu
            return taken

    def give_back(self, devices: Sequence[str]) -> None:
        """The devices of a cell that ended (as :meth:`take` handed them)."""
        with self._changed:
            for device in devices:
                self._cells[device] = max(0, self._cells[device] - (1 if len(devices) == 1 else self.per_gpu))
            self._changed.notify_all()
