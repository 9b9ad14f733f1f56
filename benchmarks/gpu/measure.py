"""What the GPU check's worker processes measure (``benchmarks.gpu.check`` runs each in a fresh process
with ``--worker KIND --spec JSON`` and reads the JSON it prints): the LM loss's two paths, SDPA's
first calls per backend, interleaved rounds of training steps of several implementations in one
process, a matrix run, and a trainer run. Each takes a spec (a dict that went through JSON) and returns
a dict that goes back through JSON; each works on a CPU at tiny shapes too (the tests run them so).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import interleaved, synced_clock, time_calls
from benchmarks.parity.implementations import GPT2_SMALL_NAME, Dims
from benchmarks.speed.throughput import build_training_step

#: the largest relative difference from the float32 reference that still agrees, per compute dtype:
#: the loss, and every gradient's max |difference| / max |reference|
LOSS_TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}
GRAD_TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}


def _relative(value: Any, reference: Any) -> float:
    scale = reference.abs().max().item()
    difference = (value.float() - reference).abs().max().item()
    return difference / scale if scale > 0 else difference


def loss_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """The LM loss alone (output projection + cross-entropy, forward and backward) at ``spec``'s shape:
    the plain ``F.cross_entropy(F.linear(...))`` and the chunked ``models.loss.linear_cross_entropy``,
    each in every dtype of ``spec["dtypes"]`` (bf16: autocast), against the plain path in float32 at
    the highest matmul precision: the loss's and the gradients' relative differences, the median
    milliseconds of ``spec["calls"]`` calls (after two warm-up calls) and on CUDA the peak memory above
    what was allocated before."""
    import torch
    import torch.nn.functional as F

    from blockbench.models.loss import linear_cross_entropy

    torch.set_float32_matmul_precision("highest")
    device = torch.device(spec["device"])
    generator = torch.Generator().manual_seed(0)
    tokens, d_model, vocab = spec["tokens"], spec["d_model"], spec["vocab"]
    hidden = torch.randn(tokens, d_model, generator=generator).to(device)
    weight = (0.02 * torch.randn(vocab, d_model, generator=generator)).to(device)
    targets = torch.randint(vocab, (tokens,), generator=generator).to(device)
    paths: dict[str, Callable[..., Any]] = {
        "plain": lambda h, w: F.cross_entropy(F.linear(h, w), targets),
        "chunked": lambda h, w: linear_cross_entropy(h, w, targets),
    }

    def forward_backward(path: str, dtype: str) -> tuple[Any, Any, Any]:
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = paths[path](h, w)
        loss.backward()
        return loss.detach().float(), h.grad, w.grad

    reference = forward_backward("plain", "fp32")
    rows = []
    for path in paths:
        for dtype in spec["dtypes"]:
            loss, grad_hidden, grad_weight = forward_backward(path, dtype)
            errors = {
                "loss": _relative(loss, reference[0]),
                "grad_hidden": _relative(grad_hidden, reference[1]),
                "grad_weight": _relative(grad_weight, reference[2]),
            }
            del grad_hidden, grad_weight
            before = 0
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            timed = time_calls(
                lambda p=path, d=dtype: forward_backward(p, d), warmup=2, min_calls=spec["calls"], device=device
            )
            memory = (torch.cuda.max_memory_allocated() - before) / 2**30 if device.type == "cuda" else None
            agrees = (
                errors["loss"] <= LOSS_TOLERANCE[dtype]
                and max(errors["grad_hidden"], errors["grad_weight"]) <= (GRAD_TOLERANCE[dtype])
            )
            rows.append(
                {
                    "path": path,
                    "dtype": dtype,
                    **errors,
                    "ms": 1e3 * timed.median,
                    "memory_gib": memory,
                    "agrees": agrees,
                }
            )
    return {"rows": rows}


#: SDPA backends by name (``torch.nn.attention.SDPBackend``)
SDPA_BACKENDS = ("cudnn", "flash", "efficient", "math")


def cudnn_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """SDPA forward and backward with one backend (``spec["backend"]``) in this fresh process, at each of
    ``spec["shapes"]`` (batch, heads, sequence, head size, causal) in turn: the first call's
    milliseconds (for the first shape: the backend's set-up in the process too, e.g. cuDNN's handle;
    for every new shape: its execution plan) and the median of ``spec["calls"]`` later calls, each
    synchronised. The device is warmed (its context made) before the first call."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[spec["backend"]]
    device = torch.device(spec["device"])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    clock = synced_clock(device)
    (torch.ones(8, device=device) * 2).sum().item()  # the context, before anything is timed
    results = []
    for shape in spec["shapes"]:
        size = (shape["batch"], shape["heads"], shape["seq"], shape["head_dim"])
        q, k, v = (torch.randn(size, device=device, dtype=dtype, requires_grad=True) for _ in range(3))

        def call(q=q, k=k, v=v, causal=shape["causal"]) -> None:
            q.grad = k.grad = v.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

        try:
            with sdpa_kernel(backend):
                start = clock()
                call()
                first = clock() - start
                later = time_calls(call, min_calls=spec["calls"], device=device).times
        except RuntimeError as error:  # no kernel of this backend for the shape, dtype or device
            results.append({"label": shape["label"], "error": str(error).strip().splitlines()[0][:160]})
            continue
        median = statistics.median(later)
        results.append({"label": shape["label"], "first_ms": 1e3 * first, "median_ms": 1e3 * median})
    return {"backend": spec["backend"], "results": results}


def rounds_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Training steps of several implementations (``spec["impls"]``) in this one process, built by
    ``benchmarks.speed.throughput.build_training_step`` (compiled with ``spec["compile"]``), each warmed
    up (``spec["warmup"]`` steps: compilation, allocation; their seconds recorded), then timed in
    ``spec["rounds"]`` interleaved rounds (``benchmarks.harness.interleaved``: every implementation
    once a round, the order reversed every other round), each time ``time_calls``'s steps. The models
    stay resident together, so the peak memory of an implementation's steps counts the others' weights."""
    import torch

    from blockbench.cell.perf import peak_flops

    device = torch.device(spec["device"])
    dims, dtype = Dims(**spec["dims"]), spec["dtype"]
    built = {
        impl: build_training_step(
            impl,
            GPT2_SMALL_NAME,
            dims,
            dtype,
            spec["device"],
            sources={"nanogpt": spec.get("nanogpt")},
            compile=spec["compile"],
            compile_backend=spec.get("compile_backend", "inductor"),
        )
        for impl in spec["impls"]
    }
    clock = synced_clock(device)
    warmup_s = {}
    for impl, training in built.items():
        start = clock()
        for _ in range(spec["warmup"]):
            training.step()
        warmup_s[impl] = clock() - start
    rounds: dict[str, list[list[float]]] = {impl: [] for impl in built}
    memory: dict[str, float] = {}
    for _, impl in interleaved(spec["rounds"], list(built)):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        timed = time_calls(
            built[impl].step,
            min_calls=spec["min_steps"],
            max_calls=spec["max_steps"],
            min_seconds=spec["min_seconds"],
            device=device,
        )
        rounds[impl].append(timed.times)
        if device.type == "cuda":
            memory[impl] = max(memory.get(impl, 0.0), torch.cuda.max_memory_allocated() / 2**30)
    precision = "bf16-mixed" if dtype == "bf16" else "32-true"
    peak = peak_flops(spec.get("peak_tflops"), device, precision)
    runs = []
    for impl, training in built.items():
        medians = [statistics.median(times) for times in rounds[impl]]
        step_s = statistics.median([t for times in rounds[impl] for t in times])
        runs.append(
            {
                **training.record,
                "warmup_s": warmup_s[impl],
                "round_medians_ms": [1e3 * m for m in medians],
                "step_ms": 1e3 * step_s,
                "throughput": training.record["items"] / step_s,
                "achieved_tflops": training.flops / step_s / 1e12 if training.flops else None,
                "peak_tflops": peak.tflops,
                "peak_source": peak.source,
                "memory_gib": memory.get(impl),
            }
        )
    return {"runs": runs}


def matrix_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """``run_matrix`` on ``spec["matrix"]`` into ``spec["root"]`` with ``--jobs spec["jobs"]``: its exit
    code and seconds, its record (``matrix_run.json``: cells at once, each cell's seconds as the runner
    saw them) and each cell's result (status, precision, step time, wall-time breakdown)."""
    from blockbench.matrix.expand import expand_matrix
    from blockbench.matrix.run import run_matrix
    from blockbench.store.record import read_matrix_run, read_record

    path, root = Path(spec["matrix"]), Path(spec["root"])
    start = time.perf_counter()
    code = run_matrix(path, root, jobs=spec["jobs"])
    seconds = time.perf_counter() - start
    expansion = expand_matrix(path)
    matrix_dir = root / expansion.matrix.name
    run = read_matrix_run(matrix_dir)
    runner = {cell.key: cell.seconds for cell in (run.cells or [])} if run else {}
    cells = []
    for cell in expansion.cells:
        record = read_record(cell.directory(matrix_dir) / "result.json")
        perf = record.performance if record else None
        cells.append(
            {
                "key": cell.key,
                "status": record.status if record else None,
                "precision": record.precision if record else None,
                "steps": record.steps if record else None,
                "step_ms": perf.step_time_ms.median if perf and perf.step_time_ms else None,
                "breakdown": record.wall_time_breakdown if record else None,
                "runner_s": runner.get(cell.key),
                "error": record.error if record else None,
            }
        )
    return {
        "exit_code": code,
        "seconds": seconds,
        "jobs": run.jobs if run else None,
        "wall_time_s": run.wall_time_s if run else None,
        "matrix_dir": str(matrix_dir),
        "cells": cells,
    }
