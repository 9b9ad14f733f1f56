"""Speed figures of a training cell: model FLOPs per step, the device's peak FLOP/s, data wait.

* :func:`count_training_flops` counts the FLOPs of one forward and backward pass with
  ``torch.utils.flop_counter.FlopCounterMode``, without disturbing the run it is measured in.
* :func:`peak_flops` is the peak FLOP/s of one device that MFU divides by: the configured
  ``trainer.peak_tflops``, or a short matmul probe in the run's compute dtype.
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
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.profilers import Profiler
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


# --- model FLOPs ------------------------------------------------------------------------------


def attention_flops(query_shape: torch.Size, key_shape: torch.Size, value_shape: torch.Size) -> int:
    """Forward FLOPs of attention on (batch, heads, length, head_dim) tensors: QK^T and PV.

    Grouped-query attention (fewer key/value heads) computes as many scores as query heads."""
    batch, heads, q_len, qk_dim = query_shape
    k_len, v_dim = key_shape[2], value_shape[3]
    return 2 * batch * heads * q_len * k_len * (qk_dim + v_dim)


def _attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Backward of fused attention as model FLOPs: the gradients' four matmuls, twice the forward."""
    return 2 * attention_flops(query_shape, key_shape, value_shape)


#: FlopCounterMode ``custom_mapping``: the fused-attention backward kernels counted as model FLOPs
MODEL_FLOP_FORMULAS: dict[Any, Callable[..., int]] = {
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
        for p, grad in zip(parameters, saved_grads):
            p.grad = grad
    return counter.get_total_flops()


# --- peak FLOP/s --------------------------------------------------------------------------------

#: the compute dtype of each Lightning precision (the dtype its matmuls run in)
PRECISION_DTYPES: dict[str, torch.dtype] = {
    "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16, "bf16": torch.bfloat16,
    "16-mixed": torch.float16, "16-true": torch.float16, "16": torch.float16,
    "32-true": torch.float32, "32": torch.float32,
    "64-true": torch.float64, "64": torch.float64,
    "transformer-engine": torch.bfloat16, "transformer-engine-float16": torch.float16,
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
    """A device's peak FLOP/s, and where the figure came from (``config`` or the probe)."""

    tflops: float
    source: str


def peak_flops(configured_tflops: float | None, device: torch.device, precision: str | int) -> PeakFlops:
    """``trainer.peak_tflops`` if set, else a matmul probe on ``device`` in ``precision``'s dtype."""
    if configured_tflops is not None:
        return PeakFlops(float(configured_tflops), "config")
    return measure_peak_flops(device, compute_dtype(precision))


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a GPU, so that host timestamps bound it; nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_peak_flops(
    device: torch.device | str, dtype: torch.dtype, *, max_size: int | None = None, repeats: int = 10,
    budget_s: float = 0.8,
) -> PeakFlops:
    """FLOP/s of a square matmul on ``device`` in ``dtype``: the fastest of ``repeats`` timed calls.

    The fastest call, not the median: a peak is what the device can reach, and other processes or
    a slow phase of a shared host only ever slow a call down (a median of a short probe lands in
    whatever phase the host is in, so MFU would vary from cell to cell with it).

    The size is ``max_size`` (default 1024 on a CPU, 8192 on a GPU) unless the faster of two calls
    at half that size (the first is a warm-up) predicts that the timed calls at the full size take
    more than ``budget_s``: a device with slow kernels for ``dtype`` (float16 on most CPUs) gets
    the half-size matrix rather than a probe of seconds. The probe uses the threads torch has, so
    it measures the share of the machine the run trains on; on a busy machine it measures less.
    """
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    max_size = max_size or (8192 if on_gpu else 1024)
    generator = torch.Generator(device=device).manual_seed(0)  # leaves the global RNG alone

    def matmul_at(size: int) -> Callable[[], float]:
        a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
        b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)

        def timed_call() -> float:
            synchronize(device)
            start = time.perf_counter()
            torch.mm(a, b)
            synchronize(device)
            return time.perf_counter() - start

        return timed_call

    size = max_size // 2
    call = matmul_at(size)
    if min(call(), call()) * 8 * repeats <= budget_s:  # a matmul twice as large takes 8 times as long
        size, call = max_size, matmul_at(max_size)
        call()  # warm-up
    fastest = min(call() for _ in range(repeats))
    del call
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)  # the run's peak memory should not be the probe's
    tflops = 2 * size**3 / fastest / 1e12
    return PeakFlops(tflops, f"measured: {DTYPE_NAMES.get(dtype, str(dtype))} matmul {size}^2 fastest of {repeats}")


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
    Achieved FLOP/s is ``flops_per_step`` over the mean step time; MFU divides it by the peak."""
    timed = steps[warmup_steps:] or steps
    if not timed:
        return {"timed_steps": 0, "warmup_steps": 0, "flops_per_step": flops_per_step,
                "peak_tflops": _round(peak.tflops) if peak else None, "peak_source": peak.source if peak else None}
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
        "peak_tflops": _round(peak.tflops) if peak else None,
        "peak_source": peak.source if peak else None,
        "mfu": _round(achieved / peak.tflops) if achieved is not None and peak else None,
        "timed_steps": len(timed),
        "warmup_steps": len(steps) - len(timed),
    }


def _round(value: float | None, digits: int = 4) -> float | None:
    """``value`` to ``digits`` significant digits (None stays None)."""
    return None if value is None else float(f"{value:.{digits}g}")


# --- memory -------------------------------------------------------------------------------------


def current_peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: CUDA max allocated on a GPU, this process's peak resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def headline_peak_memory_mb(peak_memory: dict[str, float] | None) -> float | None:
    """The figure of a result's ``peak_memory`` that the summary shows: GPU if recorded, else CPU RSS."""
    if not peak_memory:
        return None
    return peak_memory.get("cuda_max_allocated_mb", peak_memory.get("cpu_rss_mb"))


# --- TensorBoard --------------------------------------------------------------------------------


def throughput_tag(unit: str) -> str:
    """``target tokens`` -> ``perf/target_tokens_per_sec``: the throughput scalar (all processes)."""
    return f"perf/{unit.replace(' ', '_')}_per_sec"


#: the final speed figures of a cell as TensorBoard scalars (``final/<tag>``, HParams columns)
FINAL_FIGURES = {
    "perf/step_time_ms": "median training step time (ms): forward, backward, optimizer",
    "perf/tflops_per_sec": "achieved model TFLOP/s per device",
    "perf/mfu": "model FLOPs utilization: achieved / peak FLOP/s of a device",
    "perf/data_wait_fraction": "share of the training loop spent waiting for the next batch",
    "perf/peak_memory_mb": "peak memory (MB): CUDA max allocated on a GPU, RSS on a CPU",
}


def speed_figures(result: dict[str, Any]) -> dict[str, float | None]:
    """A result's speed figures by name (None where it has none): the summary's columns."""
    perf = result.get("performance") or {}
    return {
        "step_time_ms": (perf.get("step_time_ms") or {}).get("median"),  # the run's median step
        "achieved_tflops": perf.get("achieved_tflops"),
        "peak_tflops": perf.get("peak_tflops"),
        "mfu": perf.get("mfu"),
        "data_wait_fraction": perf.get("data_wait_fraction"),
        "peak_memory_mb": headline_peak_memory_mb(result.get("peak_memory")),
    }


def final_figures(result: dict[str, Any], unit: str) -> dict[str, float]:
    """A result's speed figures by TensorBoard tag (those it has): :data:`FINAL_FIGURES` and the
    throughput of all processes under :func:`throughput_tag`."""
    speed = speed_figures(result)
    figures = {
        "perf/step_time_ms": speed["step_time_ms"],
        throughput_tag(unit): result.get("throughput") if (result.get("performance") or {}).get("timed_steps") else None,
        "perf/tflops_per_sec": speed["achieved_tflops"],
        "perf/mfu": speed["mfu"],
        "perf/data_wait_fraction": speed["data_wait_fraction"],
        "perf/peak_memory_mb": speed["peak_memory_mb"],
    }
    return {tag: float(value) for tag, value in figures.items() if value is not None}
