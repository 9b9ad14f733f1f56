"""Speed figures of a training cell: model FLOPs per step, step timing on a GPU, data wait, and the
per-step statistics of ``result.json`` (MFU divides by :func:`blockbench.cell.peak.peak_flops`).

* :func:`count_training_flops` counts the FLOPs of one forward and backward pass with
  ``torch.utils.flop_counter.FlopCounterMode``, without disturbing the run it is measured in; MoE
  experts count the assignments routed to them, not the empty rows of their buffers.
* :func:`runs_ahead`, :func:`record_event` and :func:`elapsed_seconds` time steps on a GPU by CUDA
  events, read only when the figures are logged, so that the host never waits for the GPU inside a
  step (nanoGPT and litgpt synchronise only at log steps).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.profilers import Profiler
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from blockbench.models import moe_layers
from blockbench.models.moe import MoEFeedForward

from ..walltime import WallClock

# the peak FLOP/s moved to .peak; imported from here by the runner, the CLI and the benchmarks
from .peak import PeakFlops as PeakFlops
from .peak import compute_dtype as compute_dtype
from .peak import measure_peak_flops as measure_peak_flops
from .peak import peak_flops as peak_flops
from .peak import significant

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

    The routed experts of an MoE layer run on a buffer of ``n_experts x C`` rows (see
    ``blockbench.models.moe``), most of them empty where the routing is uneven or ``C`` is the
    capacity; the model needs only the rows its assignments fill, so the empty rows' FLOPs are
    taken off (:func:`empty_expert_row_flops`). This reads each layer's dropped-assignment count
    once, a host synchronisation on a GPU, in this one-off count only.
    """
    parameters = list(module.parameters())
    saved_grads = [p.grad for p in parameters]
    cuda_devices = sorted({p.device.index or 0 for p in parameters if p.device.type == "cuda"})
    calls: list[tuple[MoEFeedForward, int, int, torch.Tensor, bool]] = []

    def record_call(layer: MoEFeedForward, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
        x = args[0] if args else kwargs["x"]
        calls.append((layer, layer.expert_rows, layer.assignments, layer.dropped_assignments, x.requires_grad))

    hooks = [layer.register_forward_hook(record_call, with_kwargs=True) for layer in moe_layers(module)]
    try:
        for p in parameters:
            p.grad = None  # backward would otherwise add into (and change) the saved gradients
        with (
            torch.random.fork_rng(devices=cuda_devices, device_type="cuda"),
            torch.compiler.set_stance("force_eager"),
            torch.enable_grad(),
        ):
            with flop_counter() as counter:
                with context():
                    value = loss()
                value.backward()
            for hook in hooks:
                hook.remove()
            empty = empty_expert_row_flops(calls)
    finally:
        for hook in hooks:
            hook.remove()
        for p, grad in zip(parameters, saved_grads, strict=True):
            p.grad = grad
    return counter.get_total_flops() - empty


def empty_expert_row_flops(calls: Sequence[tuple[MoEFeedForward, int, int, torch.Tensor, bool]]) -> int:
    """The FLOPs (forward and backward) that MoE layers' routed experts spent on empty buffer rows,
    one ``(layer, rows, assignments, dropped, input_requires_grad)`` per forward: the buffer's
    ``rows`` less the ``assignments - dropped`` it holds, times the FLOPs of one row.

    Every expert matmul is a ``StackedLinear`` on the buffer's rows (elementwise work counts
    nothing), so the experts' FLOPs are proportional to the rows; one row's are counted by running
    the layer's experts on one row per expert, its input requiring a gradient as the layer's did,
    so that the backward counts the same matmuls (no input gradient in the first layer otherwise)."""
    per_row: dict[tuple[int, bool], int] = {}
    empty = 0
    for layer, rows, assignments, dropped, requires_grad in calls:
        key = (id(layer), requires_grad)
        if key not in per_row:
            per_row[key] = _expert_flops_of_one_row_each(layer, requires_grad)
        empty += per_row[key] * (rows - (assignments - int(dropped))) // layer.n_experts
    return empty


def _expert_flops_of_one_row_each(layer: MoEFeedForward, requires_grad: bool) -> int:
    """FLOPs of ``layer``'s routed experts, forward and backward, on a buffer of one row per expert."""
    weight = layer.router.weight
    x = torch.zeros(
        layer.n_experts, 1, layer.d_model, device=weight.device, dtype=weight.dtype, requires_grad=requires_grad
    )
    with flop_counter() as counter:
        out = layer.experts(x)
        if out.requires_grad:
            out.sum().backward()
    return counter.get_total_flops()


# --- step timing on a GPU -----------------------------------------------------------------------


def runs_ahead(device: torch.device) -> bool:
    """Whether the host runs ahead of the work it queues on ``device``, so that reading a value or a
    timestamp of it on the host (``.item()``, ``.tolist()``, ``torch.cuda.synchronize``) waits for
    that work: on a CUDA GPU. A CPU has done its work when each call returns: reading costs nothing."""
    return torch.device(device).type == "cuda"


def record_event() -> torch.cuda.Event:
    """A CUDA timing event recorded now on the current stream (it completes when the GPU gets there)."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def elapsed_seconds(spans: Sequence[tuple[torch.cuda.Event, torch.cuda.Event]]) -> list[float]:
    """The GPU seconds between each ``(start, end)`` pair of :func:`record_event` events, after one
    wait for the last end event (events of one stream complete in order): one host synchronisation."""
    if not spans:
        return []
    spans[-1][1].synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in spans]


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


class WallTimeProfiler(DataWaitProfiler):
    """The data-wait profiler (``Trainer(profiler=...)``) that also tells a :class:`WallClock` which
    part of the run Lightning is in, from the actions it profiles (as its SimpleProfiler times them):

    - ``data``: the data module's hooks (``[LightningDataModule]<class>.prepare_data``, ``setup``,
      ``train_dataloader``, ``val_dataloader``, ``teardown``): generating data, reading caches;
    - ``data_wait``: the training loop's waits for the next batch (:data:`TRAIN_FETCH_ACTION`);
    - ``validation``: a whole validation run, from the first ``on_validation_start`` hook to the
      strategy's ``on_validation_end`` (its last hook), every callback's hooks and the metrics'
      logging included; the validation data loader is made before it (``data``). Should Lightning
      skip that last hook, the run ends at the latest with the next training batch's fetch or the stage;
    - ``checkpoints``: ``trainer.save_checkpoint`` (``save_checkpoint``), callbacks' state included,
      also when saved inside a validation (the clock counts the innermost part).

    The training steps come from :class:`PerformanceMonitor`. Reading the clock draws no random
    number and changes no order: the run's numbers stay as they are.
    """

    DATA_HOOKS = ("prepare_data", "setup", "train_dataloader", "val_dataloader", "test_dataloader", "teardown")
    CHECKPOINT_ACTION = "save_checkpoint"
    #: the last hook of a validation run (lightning's _EvaluationLoop._on_evaluation_end)
    VALIDATION_END = ".on_validation_end"

    def __init__(self, clock: WallClock) -> None:
        super().__init__()
        self.clock = clock
        self._validating = False

    def start(self, action_name: str) -> None:
        super().start(action_name)
        if action_name == TRAIN_FETCH_ACTION:
            self._end_validation()
            self.clock.enter("data_wait")
        elif action_name.endswith(".on_validation_start") and not self._validating:
            self._validating = True
            self.clock.enter("validation")
        elif action_name == self.CHECKPOINT_ACTION:
            self.clock.enter("checkpoints")
        elif self._is_data_hook(action_name):
            self.clock.enter("data")

    def stop(self, action_name: str) -> None:
        super().stop(action_name)
        if action_name == TRAIN_FETCH_ACTION:
            self.clock.exit("data_wait")
        elif action_name.startswith("[Strategy]") and action_name.endswith(self.VALIDATION_END):
            self._end_validation()
        elif action_name == self.CHECKPOINT_ACTION:
            self.clock.exit("checkpoints")
        elif self._is_data_hook(action_name):
            self.clock.exit("data")

    def teardown(self, stage: str | None) -> None:
        self._end_validation()
        super().teardown(stage)

    def _end_validation(self) -> None:
        if self._validating:
            self._validating = False
            self.clock.exit("validation")

    def _is_data_hook(self, action_name: str) -> bool:
        return action_name.startswith("[LightningDataModule]") and action_name.rsplit(".", 1)[-1] in self.DATA_HOOKS


# --- per-step statistics ------------------------------------------------------------------------


@dataclass
class StepTiming:
    """One optimizer step (all its micro-batches): compute seconds, data-wait seconds, items. On a
    GPU the seconds and items are filled in when the step's events are read (at a log step)."""

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
        "peak_tflops": significant(peak.tflops) if peak else None,
        "peak_source": peak.source if peak else None,
        "peak_probe": peak.probe if peak else None,
    }
    if peak is not None and peak.probe_tflops is not None:  # a datasheet peak, and this machine's probe beside it
        peak_figures["probe_tflops"] = significant(peak.probe_tflops)
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
        "step_time_ms": {"median": significant(1e3 * statistics.median(seconds)), "mean": significant(1e3 * mean_step)},
        "data_wait_ms": significant(1e3 * mean_wait),
        "data_wait_fraction": significant(mean_wait / (mean_wait + mean_step)) if mean_wait + mean_step > 0 else None,
        "flops_per_step": flops_per_step,
        "achieved_tflops": significant(achieved),
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
        return {"mfu": None, "mfu_above_peak": True, "mfu_raw": significant(ratio)}
    return {"mfu": significant(ratio), "mfu_above_peak": False}


# --- memory -------------------------------------------------------------------------------------


def current_peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: CUDA max allocated on a GPU, this process's peak resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
