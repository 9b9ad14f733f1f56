"""The peak FLOP/s of one device that MFU divides by (:func:`peak_flops`): the configured
``trainer.peak_tflops``; else, for a GPU in :data:`DATASHEET_PEAKS`, its datasheet's dense peak in
the run's matmul compute (bf16, fp16, TF32 for fp32 where TF32 is on, fp32), what litgpt and
torchtitan divide by and users compare against; else (every CPU, unknown GPUs) a matmul probe in
the run's compute dtype, measured once per machine, dtype, fp32 matmul precision and thread count
and cached (:func:`cached_peak_flops`) so that every cell divides by the same figure. Beside a
datasheet peak the result shows this machine's probe where one is cached. An MFU above 1 means the
peak is wrong: it is recorded as such, never shown as a figure (``blockbench.cell.perf``)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from blockbench.tasks.data.cache import cache_key, cache_root

from ..provenance import cpu_model, hardware
from ..store.layout import write_json

#: the compute dtype of each Lightning precision (the dtype its matmuls run in)
PRECISION_DTYPES: dict[str, torch.dtype] = {
    "bf16-mixed": torch.bfloat16,
    "bf16-true": torch.bfloat16,
    "bf16": torch.bfloat16,
    "16-mixed": torch.float16,
    "16-true": torch.float16,
    "16": torch.float16,
    "32-true": torch.float32,
    "32": torch.float32,
    "64-true": torch.float64,
    "64": torch.float64,
    "transformer-engine": torch.bfloat16,
    "transformer-engine-float16": torch.float16,
}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


def compute_dtype(precision: str | int) -> torch.dtype:
    """The dtype matmuls run in under a Lightning precision (``bf16-mixed`` -> bfloat16)."""
    try:
        return PRECISION_DTYPES[str(precision)]
    except KeyError:
        raise ValueError(
            f"no compute dtype known for precision {precision!r} to measure the peak FLOP/s in; "
            "set trainer.peak_tflops to the device's peak (TFLOP/s per device)"
        ) from None


@dataclass(frozen=True)
class PeakFlops:
    """A device's peak FLOP/s and where the figure came from: ``config`` (``trainer.peak_tflops``),
    ``datasheet: ...`` (:data:`DATASHEET_PEAKS`) or ``measured: ...`` by the matmul probe. ``probe``
    is the probe's record: its size, the spread of its samples, and for a cached probe its key, file
    and date (``result.json`` ``peak_probe``). Beside a datasheet peak, ``probe_tflops`` is the
    probe's figure where one was measured on this machine (shown, not divided by)."""

    tflops: float
    source: str
    probe: dict[str, Any] | None = field(
        default=None, compare=False
    )  # equal peaks: the same figure from the same source
    probe_tflops: float | None = field(default=None, compare=False)


# --- datasheet peaks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasheetGpu:
    """A GPU model's dense peak TFLOP/s (no 2:4 sparsity) per matmul compute (``bf16``, ``fp16``,
    ``tf32``: fp32 matmuls on TF32 tensor cores, ``fp32``: without), from NVIDIA's datasheet, and
    the ``torch.cuda.get_device_name()`` it is found by (a regular expression, case-insensitive)."""

    name: str
    pattern: str
    tflops: dict[str, float]


#: Dense peaks of the GPUs MFU is commonly quoted for, first match wins. The datasheets print the
#: tensor-core figures with 2:4 sparsity (the starred ones); the dense peak is half of that.
#: NVL variants, A10G (no NVIDIA datasheet) and MIG slices (a fraction of the GPU) are not listed:
#: unknown devices get the probe. Sources:
#: H100: NVIDIA H100 Tensor Core GPU datasheet (SXM: FP32 67, TF32 989*, BF16/FP16 1,979*; PCIe:
#: FP32 51, TF32 756*, BF16/FP16 1,513*), https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet;
#: H200 (SXM): NVIDIA H200 Tensor Core GPU datasheet, the figures of the H100 SXM;
#: A100 (SXM and PCIe, 40 and 80 GB): NVIDIA A100 datasheet (FP32 19.5, TF32 156, BF16/FP16 312 dense);
#: L40S: NVIDIA L40S datasheet (FP32 91.6, TF32 183, BF16/FP16 362.05 dense);
#: L4: NVIDIA L4 datasheet (FP32 30.3, TF32 120*, BF16/FP16 242*);
#: A10: NVIDIA A10 datasheet (FP32 31.2, TF32 62.5, BF16/FP16 125 dense);
#: RTX 4090: NVIDIA Ada GPU architecture whitepaper v2.1, appendix table (FP32 82.6, TF32 82.6,
#: BF16 and FP16 with FP32 accumulate 165.2 dense: PyTorch accumulates in FP32).
DATASHEET_PEAKS: tuple[DatasheetGpu, ...] = (
    DatasheetGpu("NVIDIA H100 PCIe", r"\bH100\b.*\bPCIe\b", {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51}),
    DatasheetGpu(
        "NVIDIA H100 SXM", r"\bH100\b(?!.*\b(PCIe|NVL)\b)", {"bf16": 989, "fp16": 989, "tf32": 494.5, "fp32": 67}
    ),
    DatasheetGpu("NVIDIA H200", r"\bH200\b(?!.*\bNVL\b)", {"bf16": 989, "fp16": 989, "tf32": 494.5, "fp32": 67}),
    DatasheetGpu("NVIDIA A100", r"\bA100\b", {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}),
    DatasheetGpu("NVIDIA L40S", r"\bL40S\b", {"bf16": 362.05, "fp16": 362.05, "tf32": 183, "fp32": 91.6}),
    DatasheetGpu("NVIDIA L4", r"\bL4\b", {"bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3}),
    DatasheetGpu("NVIDIA A10", r"\bA10\b", {"bf16": 125, "fp16": 125, "tf32": 62.5, "fp32": 31.2}),
    DatasheetGpu(
        "NVIDIA GeForce RTX 4090", r"\bRTX 4090\b(?! D\b)", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}
    ),
)


def datasheet_gpu(device_name: str) -> DatasheetGpu | None:
    """The :data:`DATASHEET_PEAKS` entry of a GPU by its ``torch.cuda.get_device_name()``; None for
    a GPU not listed and for a MIG slice of one (``... MIG 3g.40gb``: a fraction of its peak)."""
    if re.search(r"\bMIG\b", device_name):
        return None
    return next((gpu for gpu in DATASHEET_PEAKS if re.search(gpu.pattern, device_name, re.IGNORECASE)), None)


def tf32_enabled() -> bool:
    """Whether fp32 matmuls on CUDA may run on TF32 tensor cores: ``torch.set_float32_matmul_precision``
    ``"high"`` or ``"medium"``, ``torch.backends.cuda.matmul.allow_tf32 = True`` or (torch 2.9 and
    later) ``torch.backends.cuda.matmul.fp32_precision = "tf32"``, which reflects all of them."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # the legacy getters raise once the new API was used
        return matmul.fp32_precision == "tf32"
    return bool(matmul.allow_tf32)


def matmul_compute(device: torch.device | str, dtype: torch.dtype) -> str:
    """What matmuls in ``dtype`` run as on ``device``: ``bf16``, ``fp16``, ``fp64``, and for fp32
    on a GPU ``tf32`` where TF32 is enabled (:func:`tf32_enabled`), else ``fp32``."""
    name = DTYPE_NAMES.get(dtype, str(dtype))
    if dtype == torch.float32 and torch.device(device).type == "cuda" and tf32_enabled():
        return "tf32"
    return name


def datasheet_peak(device: torch.device | str, dtype: torch.dtype) -> PeakFlops | None:
    """The datasheet's dense peak of ``device`` for matmuls in ``dtype`` (see :func:`matmul_compute`),
    e.g. ``989 TFLOP/s, "datasheet: NVIDIA H100 SXM bf16 dense"``; None on a CPU, for a GPU not in
    :data:`DATASHEET_PEAKS`, or a dtype its entry lacks (fp64)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    gpu = datasheet_gpu(torch.cuda.get_device_name(device))
    compute = matmul_compute(device, dtype)
    if gpu is None or compute not in gpu.tflops:
        return None
    kind = "dense" if compute != "fp32" else "(no tensor cores)"
    return PeakFlops(float(gpu.tflops[compute]), f"datasheet: {gpu.name} {compute} {kind}")


def peak_flops(
    configured_tflops: float | None,
    device: torch.device,
    precision: str | int,
    *,
    threads: int | None = None,
    remeasure: bool = False,
) -> PeakFlops:
    """The peak MFU divides by: ``trainer.peak_tflops`` if set; else the datasheet's dense peak of a
    known GPU in ``precision``'s matmul compute (:func:`datasheet_peak`), with the probe's figure
    beside it (``probe_tflops``) if this machine has one cached (``remeasure``: measured now), never
    measured for it otherwise; else (every CPU, unknown GPUs) this machine's cached matmul probe in
    ``precision``'s dtype on ``threads`` intra-op threads (default: torch's current count); see
    :func:`cached_peak_flops`."""
    if configured_tflops is not None:
        return PeakFlops(float(configured_tflops), "config")
    dtype = compute_dtype(precision)
    sheet = datasheet_peak(device, dtype)
    if sheet is None:
        return cached_peak_flops(device, dtype, threads=threads, remeasure=remeasure)
    probe = cached_peak_flops(device, dtype, remeasure=True) if remeasure else read_cached_peak_flops(device, dtype)
    if probe is None:
        return sheet
    return PeakFlops(sheet.tflops, sheet.source, probe.probe, probe_tflops=probe.tflops)


# --- the matmul probe ---------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a GPU, so that host timestamps bound it; nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: matrix sizes the probe tries, smallest first (as many as its time budget allows)
CPU_PROBE_SIZES = (128, 256, 512, 1024, 2048)
GPU_PROBE_SIZES = (1024, 2048, 4096, 8192)


def measure_peak_flops(
    device: torch.device | str,
    dtype: torch.dtype,
    *,
    sizes: Sequence[int] | None = None,
    rounds: int = 7,
    calls: int = 3,
    budget_s: float = 4.0,
) -> PeakFlops:
    """FLOP/s of square matmuls on ``device`` in ``dtype`` with the threads torch has: the median
    over ``rounds`` rounds of each round's fastest of ``calls`` calls, at the size where it is highest.

    Why this figure on a shared, noisy host: other processes and slow phases of the host only ever
    slow a call down, so a round's fastest call is the device's speed with the least interference;
    the median over rounds spread across the probe keeps one lucky round from setting the peak and a
    busy phase in fewer than half of the rounds from lowering it. (A median over all calls measures
    the host's load; the fastest single call of a short probe, the earlier probe, swung with the
    phase the host was in.) Each round times every size, so a busy phase hits all sizes alike.
    Several sizes because small matmuls are bound by overheads and large ones by memory: the peak
    is the best size's.

    The sizes are ``sizes`` (default :data:`CPU_PROBE_SIZES` or :data:`GPU_PROBE_SIZES`), smallest
    first, as long as the timed calls of all sizes so far are predicted to take at most ``budget_s``
    (from the fastest of 3 calibration calls, and before those from the previous size: a matmul
    twice as large takes 8 times as long): a dtype with slow kernels on the device (bf16 or fp16 on
    a CPU without them) gets small matrices rather than minutes of probing. The smallest size
    always runs. ``probe`` holds every size's median and the chosen size's samples with their spread.
    """
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    name = DTYPE_NAMES.get(dtype, str(dtype))
    sizes = sorted(sizes or (GPU_PROBE_SIZES if on_gpu else CPU_PROBE_SIZES))
    generator = torch.Generator(device=device).manual_seed(0)  # leaves the global RNG alone
    started = time.perf_counter()
    operands: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    planned, last_call, last_size = 0.0, 0.0, 0
    for size in sizes:
        if operands and planned + rounds * calls * last_call * (size / last_size) ** 3 > budget_s:
            break  # predicted from the previous size, before spending a calibration call on it
        a, b = (torch.randn(size, size, device=device, dtype=dtype, generator=generator) for _ in range(2))
        out = torch.empty(size, size, device=device, dtype=dtype)
        _timed_matmul(a, b, out, device)  # warm-up
        call = min(_timed_matmul(a, b, out, device) for _ in range(3))  # one call may land in a busy moment
        if operands and planned + rounds * calls * call > budget_s:
            break
        operands[size] = (a, b, out)
        planned, last_call, last_size = planned + rounds * calls * call, call, size
    samples: dict[int, list[float]] = {size: [] for size in operands}
    for _ in range(rounds):
        for size, (a, b, out) in operands.items():
            fastest = min(_timed_matmul(a, b, out, device) for _ in range(calls))
            samples[size].append(2 * size**3 / fastest / 1e12)
    del operands
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)  # the run's peak memory should not be the probe's
    medians = {size: statistics.median(values) for size, values in samples.items()}
    size = max(medians, key=medians.__getitem__)
    chosen = samples[size]
    probe = {
        "dtype": name,
        "size": size,
        "method": f"median over {rounds} rounds of the fastest of {calls} calls, at the size with the highest median",
        "spread_tflops": {
            "min": significant(min(chosen)),
            "median": significant(medians[size]),
            "max": significant(max(chosen)),
            "n": len(chosen),
        },
        "samples_tflops": [significant(value) for value in chosen],
        "median_tflops_by_size": {str(s): significant(m) for s, m in medians.items()},
        "threads": None if on_gpu else torch.get_num_threads(),
        "seconds": round(time.perf_counter() - started, 2),
        "load_average": round(os.getloadavg()[0], 2),  # runnable processes over the last minute: the probe's company
    }
    return PeakFlops(
        medians[size], f"measured: {name} matmul {size}^2, median of {rounds} rounds' fastest calls", probe
    )


def _timed_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, device: torch.device) -> float:
    """Seconds of one ``a @ b`` into ``out`` (no allocation in the timed call)."""
    synchronize(device)
    start = time.perf_counter()
    torch.mm(a, b, out=out)
    synchronize(device)
    return time.perf_counter() - start


# --- the cached peak ---------------------------------------------------------------------------

#: part of the cache key: a change to the probe's method measures every peak anew
PROBE_VERSION = 2
#: the folder of cached peaks under the blockbench cache (``$BLOCKBENCH_CACHE``, ``~/.cache/blockbench``)
PEAK_CACHE_FOLDER = "peak_flops"


def probe_description(device: torch.device | str, dtype: torch.dtype, threads: int | None = None) -> dict[str, Any]:
    """What a measured peak depends on, its cache key: the dtype, torch's version, for fp32 the
    matmul precision (``fp32_matmul``: ``tf32`` or ``ieee`` on a GPU, oneDNN's setting on a CPU: both
    follow ``torch.set_float32_matmul_precision``), and on a GPU the device's name; on a CPU its
    model, logical CPUs, torch's CPU capability (the kernels it dispatches to: AVX2, AVX512, ...) and
    the intra-op threads (default: torch's current count)."""
    device = torch.device(device)
    description: dict[str, Any] = {
        "probe_version": PROBE_VERSION,
        "device": device.type,
        "dtype": DTYPE_NAMES.get(dtype, str(dtype)),
        "torch": torch.__version__,
    }
    if dtype == torch.float32:
        description["fp32_matmul"] = _fp32_matmul_precision(device)
    if device.type == "cuda":
        return description | {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda}
    return description | {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": threads or torch.get_num_threads(),
    }


def _fp32_matmul_precision(device: torch.device) -> str:
    """How fp32 matmuls run on ``device``: ``tf32`` or ``ieee`` on a GPU; on a CPU oneDNN's
    ``fp32_precision`` (``ieee``, ``bf16`` under ``"medium"``, ``tf32``) where torch has it."""
    if device.type == "cuda":
        return "tf32" if tf32_enabled() else "ieee"
    precision = getattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision", "none")
    return "ieee" if precision == "none" else precision


def peak_cache_file(description: dict[str, Any]) -> Path:
    """``<cache>/peak_flops/cpu-fp32-2threads-<hash of description>.json``: readable, and unique per key."""
    kind = "-".join(
        [description["device"], description["dtype"]]
        + ([f"{description['threads']}threads"] if description.get("threads") else [])
    )
    return cache_root() / PEAK_CACHE_FOLDER / f"{cache_key(kind, description)}.json"


def cached_peak_flops(
    device: torch.device | str, dtype: torch.dtype, *, threads: int | None = None, remeasure: bool = False
) -> PeakFlops:
    """The peak of ``device`` in ``dtype`` (on ``threads`` intra-op threads on a CPU) that MFU divides
    by: measured once per machine, dtype, fp32 matmul precision and thread count by
    :func:`measure_peak_flops` and stored as JSON in the blockbench cache (:func:`peak_cache_file`)
    with its spread, the machine's description and the date; every later call, in any process, reads
    it. ``remeasure`` (``blockbench peak --remeasure``, or deleting the file) measures anew and replaces it.

    One probe for every cell, rather than one per cell: a cell's own short probe measured whatever
    load the machine had at its start, so MFU (and the ranking of variants by it) varied with that
    load and came out above 100% when the probe fell in a busy phase. The probe holds a file lock:
    processes that need the same peak at once (DDP ranks, parallel cells) wait for one probe and
    read it, rather than each probing while the others slow it down.
    """
    device = torch.device(device)
    description = probe_description(device, dtype, threads)
    path = peak_cache_file(description)
    with _file_lock(path.with_suffix(".lock")):
        record = None if remeasure else _read_peak_record(path, description)
        measured_now = record is None
        if record is None:
            with _intra_op_threads(description.get("threads")):
                peak = measure_peak_flops(device, dtype)
            record = {
                "tflops": peak.tflops,
                "source": peak.source,
                **(peak.probe or {}),
                "key": path.stem,
                "description": description,
                "machine": hardware(),
                "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            write_json(path, record)
            if device.type != "cuda" and (record.get("load_average") or 0) > (os.cpu_count() or 1):
                rank_zero_warn(
                    f"the peak FLOP/s was measured on a busy machine (load {record['load_average']} on "
                    f"{os.cpu_count()} CPUs), so it may be far too low and MFU too high; it is cached in "
                    f"{path}: run `blockbench peak --remeasure` when the machine is quiet"
                )
    return _cached_peak(record, path, measured_now)


def read_cached_peak_flops(
    device: torch.device | str, dtype: torch.dtype, *, threads: int | None = None
) -> PeakFlops | None:
    """The probe :func:`cached_peak_flops` would return if this machine has it cached, else None
    (nothing is measured)."""
    description = probe_description(device, dtype, threads)
    path = peak_cache_file(description)
    record = _read_peak_record(path, description)
    return None if record is None else _cached_peak(record, path, measured_now=False)


def _cached_peak(record: dict[str, Any], path: Path, measured_now: bool) -> PeakFlops:
    """The :class:`PeakFlops` of a cached probe record (its ``probe``: key, file, date, spread)."""
    probe = {
        "key": record["key"],
        "file": str(path),
        "measured_at": record["measured_at"],
        "measured_now": measured_now,
        **{k: record.get(k) for k in ("dtype", "size", "threads", "method", "spread_tflops", "load_average")},
    }
    return PeakFlops(
        record["tflops"], f"{record['source']} (cached probe {record['key']} of {record['measured_at']})", probe
    )


def _read_peak_record(path: Path, description: dict[str, Any]) -> dict[str, Any] | None:
    """The cached record at ``path`` if it is a complete record of ``description``, else None."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    valid = isinstance(record, dict) and record.get("description") == description and (record.get("tflops") or 0) > 0
    return record if valid else None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing) for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _intra_op_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` (if given) inside the block, restored after."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --- figures -----------------------------------------------------------------------------------


def significant(value: float | None, digits: int = 4) -> float | None:
    """``value`` to ``digits`` significant digits (None stays None)."""
    return None if value is None else float(f"{value:.{digits}g}")
