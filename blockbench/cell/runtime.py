"""What a cell sets for the machine it runs on, and records: TF32 for float32 matmuls on a CUDA GPU,
the deterministic switch, DataLoader workers and pinned memory for a GPU, and whether SDPA may use
cuDNN's attention kernel on a GPU (:func:`cudnn_attention_pays`).

On a CPU none of these change anything (no TF32 there, no workers, no pinned memory): the numbers of a
CPU run are those of the code before them. On a GPU they are the usual fast settings (nanoGPT, litgpt):
TF32 tensor cores for float32 matmuls and convolutions, the training data decoded and batched in
worker processes into pinned memory. ``trainer.deterministic`` trades speed for GPU reruns that give
the same bits: deterministic kernels only, a fixed cuBLAS workspace, no cuDNN autotuning, no TF32.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..config import RunConfig, TrainerConfig, on_gpu

#: what cuBLAS needs for deterministic results (NVIDIA's cuBLAS reproducibility notes); read when
#: CUDA creates its first cuBLAS handle, so it is set before the first matmul
CUBLAS_WORKSPACE = ":4096:8"


#: SDPA calls (a forward and backward per attention layer and step) from which a GPU cell lets SDPA use
#: cuDNN's attention kernel. cuDNN builds an execution plan for every new shape in every process (tens to
#: hundreds of milliseconds each, measured first call against later calls by the GPU check's cudnn section),
#: while at the book's small shapes its kernel saves microseconds a call over flash or memory-efficient
#: attention: a cell of fewer calls than this (the book's cells make a few thousand at most) runs without it
CUDNN_SDPA_MIN_CALLS = 20_000


def attention_calls(run: RunConfig) -> int:
    """The SDPA calls a cell makes: one per attention layer (self-attention in each stack, and the
    decoder's cross-attention in the translator) and optimizer step, micro-batches counted."""
    model, trainer = run.resolved_model(), run.trainer
    layers = model.n_layers * (3 if model.family == "encoder_decoder" else 1)
    return layers * trainer.max_steps * trainer.accumulate_grad_batches


def cudnn_attention_pays(calls: int | None) -> bool:
    """Whether a GPU cell making ``calls`` SDPA calls lets SDPA use cuDNN's attention kernel: from
    :data:`CUDNN_SDPA_MIN_CALLS` calls on, where its faster calls can repay its execution plans; PyTorch's
    choice (True) where the calls are not known."""
    return calls is None or calls >= CUDNN_SDPA_MIN_CALLS


def uses_tf32(cfg: TrainerConfig, accelerator: str) -> bool:
    """Whether float32 matmuls and convolutions run on TF32: on a CUDA GPU, with ``trainer.tf32`` and
    not ``trainer.deterministic``."""
    return on_gpu(accelerator) and cfg.tf32 and not cfg.deterministic


@contextmanager
def machine_settings(cfg: TrainerConfig, accelerator: str, attention: int | None = None) -> Iterator[None]:
    """Within: float32 matmul precision ``high`` (TF32) on a GPU where :func:`uses_tf32` (``highest``
    on a GPU otherwise, which keeps Lightning's hint about TF32 in view), on a GPU SDPA's cuDNN kernel
    only where :func:`cudnn_attention_pays` for the cell's ``attention`` calls (:func:`attention_calls`),
    and under ``trainer.deterministic`` the cuBLAS workspace of :data:`CUBLAS_WORKSPACE` (Lightning's
    ``deterministic=True`` does the rest when the Trainer is built); on a CPU nothing changes. The
    process's settings are restored after: a process that trains several cells (tests) starts each
    from the same state."""
    saved: dict[str, Any] = {
        "matmul": torch.get_float32_matmul_precision(),
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # ":16:8" (also valid) stays
    if on_gpu(accelerator):
        tf32 = uses_tf32(cfg, accelerator)
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.enable_cudnn_sdp(cudnn_attention_pays(attention))
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved["matmul"])
        torch.backends.cudnn.allow_tf32 = saved["cudnn_tf32"]
        torch.backends.cuda.enable_cudnn_sdp(saved["cudnn_sdp"])
        torch.backends.cudnn.benchmark = saved["cudnn_benchmark"]
        torch.use_deterministic_algorithms(saved["deterministic"], warn_only=saved["deterministic_warn_only"])
        if saved["cublas"] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved["cublas"]


def lightning_determinism(cfg: TrainerConfig) -> dict[str, Any]:
    """The Trainer's arguments for ``trainer.deterministic``: none without it (Lightning then leaves
    PyTorch's settings as they are), ``deterministic=True`` and ``benchmark=False`` with it (Lightning
    calls ``torch.use_deterministic_algorithms(True)`` and sets ``CUBLAS_WORKSPACE_CONFIG``)."""
    return {"deterministic": True, "benchmark": False} if cfg.deterministic else {}


def cpus_per_device(devices: int) -> int:
    """The CPUs this process may use (its affinity, e.g. a SLURM allocation), shared by the devices of
    this machine."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // max(1, devices))


def data_loading(cfg: TrainerConfig, accelerator: str, devices: int) -> dict[str, Any]:
    """The datamodule's loading for this machine (``TaskDataModule.load_for``): the training data's
    worker processes (``trainer.num_workers``) and pinned memory on a GPU."""
    return {"num_workers": cfg.loader_workers(accelerator, cpus_per_device(devices)), "pin_memory": on_gpu(accelerator)}
