"""Speed figures of a training cell: model FLOPs per step, the device's peak FLOP/s, data wait.

* :func:`count_training_flops` counts the FLOPs of one forward and backward pass with
  ``torch.utils.flop_counter.FlopCounterMode``, without disturbing the run it is measured in.
* :func:`peak_flops` is the peak FLOP/s of one device that MFU divides by: the configured
  ``trainer.peak_tflops``, or a matmul probe in the run's compute dtype, measured once per machine,
  dtype and thread count and cached (:func:`cached_peak_flops`), so every cell divides by the same
  figure. An MFU above 1 means the peak is wrong: it is recorded as such, never shown as a figure.
* :class:`DataWaitProfiler` is a Lightning profiler that records only the time the training loop
  waits for the next batch.

**Model FLOPs.** MFU (PaLM, Chowdhery et al. 2022, appendix B) divides the FLOPs the model needs
by the device's peak, not the FLOPs the kernels happen to run. FlopCounterMode counts matmuls
(``mm``, ``addmm``, ``bmm``, convolutions, attention kernels); elementwise work, softmax and norms
count nothing, as usual. Fused attention is counted as its two matmuls (QK^T and PV:
``4 * batch * heads * q_len * k_len * head_dim``, causal masking not discounted, as torch's own
formulas do), and its backward as twice that, the four matmuls of the gradients. Torch's backward
formulas add the recomputation of QK^T that flash kernels do instead of storing it; that is
hardware work, not model work, so :data:`MODEL_FLOP_FORMULAS` replaces them. With it, attention
through ``scaled_dot_product_attention`` counts exactly what the plain-matmul path counts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.profilers import Profiler
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from blockbench.tasks.data.cache import cache_key, cache_root

from ..layout import write_json
from ..provenance import cpu_model, hardware

aten = torch.ops.aten


# --- model FLOPs ------------------------------------------------------------------------------


def attention_flops(query_shape: torch.Size, key_shape: torch.Size, value_shape: torch.Size) -> int:
    """Forward FLOPs of attention on (batch, heads, length, head_dim) tensors: QK^T and PV.

    Grouped-query attention (fewer key/value heads) computes as many scores as query heads."""
    batch, heads, q_len, qk_dim = query_shape
    k_len, v_dim = key_shape[2], value_shape[3]
    return 2 * batch * heads * q_len * k_len * (qk_dim + v_dim)


def _attention_backward_flops(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    """Backward of fused attention as model FLOPs: the gradients' four matmuls, twice the forward."""
    return 2 * attention_flops(query_shape, key_shape, value_shape)


def _attention_forward_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Forward of fused attention: QK^T and PV."""
    return attention_flops(query_shape, key_shape, value_shape)


#: FlopCounterMode ``custom_mapping``: the fused-attention backward kernels counted as model FLOPs,
#: and the CPU flash kernel's forward, which torch's own table lacks (torch 2.14 counts it as 0)
MODEL_FLOP_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _attention_forward_flops,
} | {
    op: _attention_backward_flops
    for op in (
        aten._scaled_dot_product_flash_attention_for_cpu_backward,
        aten._scaled_dot_product_flash_attention_backward,
        aten._scaled_dot_product_efficient_attention_backward,
        aten._scaled_dot_product_cudnn_attention_backward,
    )
}


def flop_counter() -> FlopCounterMode:
    """A silent FlopCounterMode that counts model FLOPs (see the module docstring)."""
    return FlopCounterMode(display=False, custom_mapping=MODEL_FLOP_FORMULAS)


def count_training_flops(
    module: nn.Module,
    loss: Callable[[], torch.Tensor],
    *,
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> int:
    """Model FLOPs of ``loss()`` and its backward pass through ``module``'s parameters.

    Meant to run inside a training loop without changing it: the random number generators are
    forked (dropout draws nothing from the training stream), every parameter's ``.grad`` is put
    back as it was (gradient accumulation may be half-way through a window), and compiled modules
    run eagerly (``torch.compiler.set_stance("force_eager")``: FlopCounterMode cannot see inside a
    compiled graph). ``context`` is entered around the forward pass, e.g. the precision plugin's
    autocast. The optimizer is not stepped.
    """
    parameters = list(module.parameters())
    saved_grads = [p.grad for p in parameters]
    cuda_devices = sorted({p.device.index or 0 for p in parameters if p.device.type == "cuda"})
    try:
        for p in parameters:
            p.grad = None  # backward would otherwise add into (and change) the saved gradients
        with (
            torch.random.fork_rng(devices=cuda_devices, device_type="cuda"),
            torch.compiler.set_stance("force_eager"),
            torch.enable_grad(),
            flop_counter() as counter,
        ):
            with context():
                value = loss()
            value.backward()
    finally:
        for p, grad in zip(parameters, saved_grads, strict=True):
            p.grad = grad
    return counter.get_total_flops()


# --- peak FLOP/s --------------------------------------------------------------------------------

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
    """A device's peak FLOP/s and where the figure came from: ``config`` (``trainer.peak_tflops``)
    or ``measured: ...`` by the matmul probe. ``probe`` is the probe's record: its size, the spread
    of its samples, and for a cached probe its key, file and date (``result.json`` ``peak_probe``)."""

    tflops: float
    source: str
    probe: dict[str, Any] | None = field(
        default=None, compare=False
    )  # equal peaks: the same figure from the same source


def peak_flops(
    configured_tflops: float | None,
    device: torch.device,
    precision: str | int,
    *,
    threads: int | None = None,
    remeasure: bool = False,
) -> PeakFlops:
    """``trainer.peak_tflops`` if set, else this machine's cached matmul probe in ``precision``'s
    dtype on ``threads`` intra-op threads (default: torch's current count); see :func:`cached_peak_flops`."""
    if configured_tflops is not None:
        return PeakFlops(float(configured_tflops), "config")
    return cached_peak_flops(device, compute_dtype(precision), threads=threads, remeasure=remeasure)


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
            "min": _round(min(chosen)),
            "median": _round(medians[size]),
            "max": _round(max(chosen)),
            "n": len(chosen),
        },
        "samples_tflops": [_round(value) for value in chosen],
        "median_tflops_by_size": {str(s): _round(m) for s, m in medians.items()},
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
    """What a measured peak depends on, its cache key: the dtype, torch's version, and on a GPU the
    device's name; on a CPU its model, logical CPUs, torch's CPU capability (the kernels it
    dispatches to: AVX2, AVX512, ...) and the intra-op threads (default: torch's current count)."""
    device = torch.device(device)
    description: dict[str, Any] = {
        "probe_version": PROBE_VERSION,
        "device": device.type,
        "dtype": DTYPE_NAMES.get(dtype, str(dtype)),
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        return description | {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda}
    return description | {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": threads or torch.get_num_threads(),
    }


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
    by: measured once per machine, dtype and thread count by :func:`measure_peak_flops` and stored
    as JSON in the blockbench cache (:func:`peak_cache_file`) with its spread, the machine's
    description and the date; every later call, in any process, reads it. ``remeasure`` (``blockbench
    peak --remeasure``, or deleting the file) measures anew and replaces it.

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


# --- data wait ----------------------------------------------------------------------------------

#: the profiler action around ``next()`` on the training dataloader (lightning's _TrainingEpochLoop)
TRAIN_FETCH_ACTION = "[_TrainingEpochLoop].train_dataloader_next"


class DataWaitProfiler(Profiler):
    """Lightning profiler (``Trainer(profiler=...)``) that records only the training loop's waits
    for the next batch: Lightning's data fetcher reports each ``next()`` on the training dataloader
    as the action :data:`TRAIN_FETCH_ACTION`. Every other action costs a string comparison."""

    def __init__(self) -> None:
        super().__init__()
        self.fetches = 0  # training batches fetched since the profiler was created
        self._pending = 0.0  # seconds waited since the last :meth:`take`
        self._started: float | None = None

    def start(self, action_name: str) -> None:
        if action_name == TRAIN_FETCH_ACTION:
            self._started = time.perf_counter()

    def stop(self, action_name: str) -> None:
        if action_name == TRAIN_FETCH_ACTION and self._started is not None:
            self._pending += time.perf_counter() - self._started
            self._started = None
            self.fetches += 1

    def take(self) -> float:
        """Seconds the loop waited for training data since the previous call."""
        waited, self._pending = self._pending, 0.0
        return waited


# --- per-step statistics ------------------------------------------------------------------------


@dataclass
class StepTiming:
    """One optimizer step (all its micro-batches): compute seconds, data-wait seconds, items."""

    seconds: float = 0.0
    data_wait: float = 0.0
    items: int = 0


def step_statistics(
    steps: list[StepTiming],
    *,
    warmup_steps: int,
    flops_per_step: int | None,
    peak: PeakFlops | None,
) -> dict[str, Any]:
    """The ``performance`` block of ``result.json`` from this run's optimizer steps.

    The first ``warmup_steps`` steps are left out (or none, if the run had no more steps than that).
    Achieved FLOP/s is ``flops_per_step`` over the mean step time; MFU divides it by the peak (see
    :func:`mfu_figures`)."""
    timed = steps[warmup_steps:] or steps
    peak_figures = {
        "peak_tflops": _round(peak.tflops) if peak else None,
        "peak_source": peak.source if peak else None,
        "peak_probe": peak.probe if peak else None,
    }
    if not timed:
        return {
            "timed_steps": 0,
            "warmup_steps": 0,
            "flops_per_step": flops_per_step,
            **peak_figures,
            **mfu_figures(None, peak),
        }
    seconds = [s.seconds for s in timed]
    mean_step = statistics.fmean(seconds)
    mean_wait = statistics.fmean(s.data_wait for s in timed)
    achieved = flops_per_step / mean_step / 1e12 if flops_per_step is not None and mean_step > 0 else None
    return {
        "step_time_ms": {"median": _round(1e3 * statistics.median(seconds)), "mean": _round(1e3 * mean_step)},
        "data_wait_ms": _round(1e3 * mean_wait),
        "data_wait_fraction": _round(mean_wait / (mean_wait + mean_step)) if mean_wait + mean_step > 0 else None,
        "flops_per_step": flops_per_step,
        "achieved_tflops": _round(achieved),
        **peak_figures,
        **mfu_figures(achieved, peak),
        "timed_steps": len(timed),
        "warmup_steps": len(steps) - len(timed),
    }


def mfu_figures(achieved_tflops: float | None, peak: PeakFlops | None) -> dict[str, Any]:
    """``mfu`` = achieved / peak FLOP/s, or None. A ratio above 1 is not a utilization but a peak
    that is too low (e.g. a probe on a busy machine): ``mfu`` is then None, ``mfu_above_peak`` True
    and ``mfu_raw`` the ratio, so that the result says why it has no MFU."""
    ratio = achieved_tflops / peak.tflops if achieved_tflops is not None and peak else None
    if ratio is not None and ratio > 1:
        return {"mfu": None, "mfu_above_peak": True, "mfu_raw": _round(ratio)}
    return {"mfu": _round(ratio), "mfu_above_peak": False}


def _round(value: float | None, digits: int = 4) -> float | None:
    """``value`` to ``digits`` significant digits (None stays None)."""
    return None if value is None else float(f"{value:.{digits}g}")


# --- memory -------------------------------------------------------------------------------------


def current_peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: CUDA max allocated on a GPU, this process's peak resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
