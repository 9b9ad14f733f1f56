"""Speed figures of a cell: model FLOPs, the peak FLOP/s probe, MFU, data wait, and what a real
training run writes to result.json and TensorBoard."""

from __future__ import annotations

import copy
import itertools
import json
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import TINY_LM, tensorboard_events, write_matrix
from torch import nn
from torch.utils.data import default_collate

import blockbench.matrix.jobs
from blockbench.cell import peak as peak_module
from blockbench.cell.callbacks import PerformanceMonitor
from blockbench.cell.peak import (
    PEAK_CACHE_FOLDER,
    PROBE_VERSION,
    PeakFlops,
    compute_dtype,
    datasheet_gpu,
    measure_peak_flops,
    peak_flops,
    tf32_enabled,
)
from blockbench.cell.perf import StepTiming, count_training_flops, flop_counter, step_statistics
from blockbench.cell.train import train
from blockbench.config import build_run_config
from blockbench.matrix.expand import load_matrix
from blockbench.matrix.jobs import job_slots
from blockbench.matrix.peaks import resolve_peaks
from blockbench.models import build_model, moe_layers
from blockbench.models import moe as moe_module
from blockbench.models.attention import MultiHeadAttention
from blockbench.models.moe import MoEFeedForward
from blockbench.provenance import cpu_model
from blockbench.store.record import CellRecord
from blockbench.tasks.lm import AgreementDataModule

# --- model FLOPs ----------------------------------------------------------------------------------


def test_linear_layers_count_six_flops_per_weight_and_item():
    """Forward 2*B*in*out, backward 4*B*in*out (input and weight gradients): 6*B*in*out in all."""
    batch, d_in, d_hidden, d_out = 4, 16, 32, 8
    model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, d_out))
    x = torch.randn(batch, d_in, requires_grad=True)
    flops = count_training_flops(model, lambda: model(x).sum())
    assert flops == 6 * batch * (d_in * d_hidden + d_hidden * d_out)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_fused_attention_counts_what_the_plain_matmul_path_counts(n_kv_heads, causal):
    """SDPA's fused kernels (forward and backward) count the model FLOPs of the plain-matmul path,
    which is QK^T and PV forward, twice that backward (no recomputation, no causal discount)."""
    torch.manual_seed(0)
    batch, length, d_model, n_heads = 2, 16, 64, 4
    attention = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads)
    x = torch.randn(batch, length, d_model)

    def count(need_weights: bool) -> tuple[int, dict[str, int]]:
        with flop_counter() as counter:
            out = attention(x, causal=causal, need_weights=need_weights)
            (out[0] if need_weights else out).sum().backward()
        return counter.get_total_flops(), {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}

    fused, fused_ops = count(need_weights=False)
    plain, plain_ops = count(need_weights=True)
    assert any("scaled_dot_product" in op for op in fused_ops), fused_ops  # really the fused kernel
    assert "aten.bmm" in plain_ops and not any("scaled_dot_product" in op for op in plain_ops)
    assert fused == plain
    attention_forward = 4 * batch * n_heads * length * length * (d_model // n_heads)
    assert plain_ops["aten.bmm"] == 3 * attention_forward


def test_cross_attention_counts_like_its_plain_path():
    torch.manual_seed(0)
    attention = MultiHeadAttention(32, 2, cross=True)
    x, context = torch.randn(3, 5, 32), torch.randn(3, 9, 32)
    counts = []
    for need_weights in (False, True):
        with flop_counter() as counter:
            out = attention(x, context, need_weights=need_weights)
            (out[0] if need_weights else out).sum().backward()
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1]


def test_counting_leaves_rng_gradients_and_compiled_modules_as_they_were():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    x = torch.randn(4, 8, requires_grad=True)
    model(x).sum().backward()  # half-way through an accumulation window: gradients exist
    grads = [p.grad.clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    flops = count_training_flops(model, lambda: model(x).sum())
    assert torch.equal(torch.get_rng_state(), rng)  # dropout drew from a forked generator
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    compiled = copy.deepcopy(model)
    compiled.compile(backend="eager")
    assert count_training_flops(compiled, lambda: compiled(x).sum()) == flops


@pytest.mark.parametrize("on_gpu", [False, True], ids=["largest-count-buffer", "capacity-buffer"])
@pytest.mark.parametrize(
    "capacity_factor, routed", [(4.0, 5), (0.8, 3)], ids=["capacity-above-routed", "over-capacity"]
)
def test_moe_flops_count_the_routed_assignments_not_empty_buffer_rows(capacity_factor, routed, on_gpu, monkeypatch):
    """5 tokens routed by hand to experts 0, 0, 0, 1, 2 of 4 (top-1; the router is the identity on
    one-hot inputs). The experts run on a buffer of 4 x C rows: C = 3 (the busiest expert) where the
    host reads the counts, C = the capacity on a GPU; with capacity factor 4 the capacity is 5, so 7
    or 15 rows are empty. With factor 0.8 the capacity is 1: expert 0 keeps 1 of its 3, 3 routed.
    Model FLOPs by hand, forward and backward (input and weight gradients), 6 per weight and row:
    the router 6 * 5 * d * E, each routed row 6 * (d * d_ff + d_ff * d); the empty rows count nothing."""
    monkeypatch.setattr(moe_module, "runs_ahead", lambda device: on_gpu, raising=False)
    d, d_ff, n_experts = 4, 8, 4
    layer = MoEFeedForward(d, d_ff, n_experts=n_experts, top_k=1, capacity_factor=capacity_factor)
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(n_experts, d))
    x = (10 * torch.nn.functional.one_hot(torch.tensor([0, 0, 0, 1, 2]), d).float()).requires_grad_()
    flops = count_training_flops(layer, lambda: layer(x).sum())
    assert layer.dropped_tokens == 5 - routed
    assert layer.expert_rows > routed  # the buffer had empty rows
    assert flops == 6 * 5 * d * n_experts + 6 * routed * (d * d_ff + d_ff * d)


def test_moe_flops_of_a_whole_model_leave_out_only_the_empty_rows():
    """In an LM with 2 MoE layers (top-2, uneven routing), the count is FlopCounterMode's total less,
    per layer, its experts' FLOPs per buffer row times the empty rows; every row costs the same."""
    torch.manual_seed(0)
    model = build_model(
        {
            "family": "decoder_lm",
            "vocab_size": 40,
            "d_model": 16,
            "n_heads": 2,
            "d_ff": 32,
            "n_layers": 2,
            "n_experts": 4,
            "moe_top_k": 2,
            "moe_capacity_factor": 2.0,
        }
    )
    idx = torch.randint(0, 40, (2, 9))
    layers = moe_layers(model)
    with flop_counter() as counter:
        model.loss(idx[:, :-1], idx[:, 1:]).backward()
    model.zero_grad()
    counted = count_training_flops(model, lambda: model.loss(idx[:, :-1], idx[:, 1:]))
    per_row = 6 * (16 * 32 + 32 * 16)  # one row of one expert, forward and backward
    empty = [layer.expert_rows - (layer.assignments - layer.dropped_tokens) for layer in layers]
    assert all(e > 0 for e in empty) and layers[0].assignments == 2 * 16
    assert counted == counter.get_total_flops() - per_row * sum(empty)


# --- peak FLOP/s and MFU --------------------------------------------------------------------------


def test_compute_dtype_of_each_precision():
    assert compute_dtype("bf16-mixed") == compute_dtype("bf16-true") == torch.bfloat16
    assert compute_dtype("16-mixed") == compute_dtype("16-true") == torch.float16
    assert compute_dtype("32-true") == compute_dtype(32) == torch.float32
    assert compute_dtype("64-true") == compute_dtype(64) == torch.float64
    with pytest.raises(ValueError, match=r"set trainer\.peak_tflops"):
        compute_dtype("8-magic")


@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_probe_measures_a_positive_peak_in_each_dtype_within_its_budget(dtype, name):
    """A dtype with slow CPU kernels (bf16, fp16 without AVX512-BF16/AMX) gets small matrices, not minutes."""
    start = time.perf_counter()
    peak = measure_peak_flops("cpu", dtype, budget_s=0.5)
    assert time.perf_counter() - start < 10  # about a second; the smallest size always runs
    assert peak.tflops > 0 and peak.source.startswith(f"measured: {name} matmul {peak.probe['size']}^2")
    spread = peak.probe["spread_tflops"]
    assert spread["n"] == 7 and spread["min"] <= spread["median"] <= spread["max"]
    assert spread["median"] == pytest.approx(peak.tflops, rel=1e-3)


def test_probe_figure_is_the_best_sizes_median_over_rounds_of_each_rounds_fastest_call(monkeypatch):
    """Scripted call times (ms) per size: warm-up, 3 calibration calls, then 3 rounds of 2 calls.
    The peak is computed by hand from them."""
    times = {
        64: [9, 9, 9, 9, 4, 2, 8, 3, 1, 5],  # fastest per round: 2, 3, 1 -> median 2 ms
        128: [90, 90, 90, 90, 40, 12, 10, 30, 8, 60],
    }  # 12, 10, 8 -> median 10 ms
    calls = {size: iter(values) for size, values in times.items()}
    monkeypatch.setattr(peak_module, "_timed_matmul", lambda a, b, out, device: next(calls[a.shape[0]]) / 1e3)
    peak = measure_peak_flops("cpu", torch.float32, sizes=(64, 128), rounds=3, calls=2, budget_s=100)

    def tflops(size: int, ms: float) -> float:
        return 2 * size**3 / (ms / 1e3) / 1e12

    assert tflops(128, 10) > tflops(64, 2)  # 128^2 is the faster size: its median is the peak
    assert peak.tflops == pytest.approx(tflops(128, 10)) and peak.probe["size"] == 128
    assert peak.probe["spread_tflops"] == {
        "min": pytest.approx(tflops(128, 12), rel=1e-3),
        "median": pytest.approx(tflops(128, 10), rel=1e-3),
        "max": pytest.approx(tflops(128, 8), rel=1e-3),
        "n": 3,
    }
    assert peak.probe["median_tflops_by_size"]["64"] == pytest.approx(tflops(64, 2), rel=1e-3)
    assert all(not list(rest) for rest in calls.values())  # no call more or less than scripted


def test_probe_leaves_the_global_rng_alone():
    rng = torch.get_rng_state()
    measure_peak_flops("cpu", torch.float32, sizes=(64, 128), rounds=2)
    assert torch.equal(torch.get_rng_state(), rng)


def test_configured_peak_is_used_as_given():
    assert peak_flops(312.0, torch.device("cpu"), "bf16-mixed") == PeakFlops(312.0, "config")


@pytest.fixture
def probes(cache_dir, monkeypatch) -> list[dict]:
    """An empty blockbench cache, and a record of each probe: its dtype and the threads it ran on
    (a real probe, on small matrices to stay fast)."""
    calls: list[dict] = []
    real_probe = peak_module.measure_peak_flops

    def counted_probe(device, dtype):
        calls.append({"dtype": dtype, "threads": torch.get_num_threads()})
        return real_probe(device, dtype, sizes=(32, 64), rounds=3, calls=2)

    monkeypatch.setattr(peak_module, "measure_peak_flops", counted_probe)
    return calls


def start_monitor(
    precision: str = "32-true", peak_tflops: float | None = None, device: str | torch.device = "cpu"
) -> PerformanceMonitor:
    """A PerformanceMonitor after ``on_train_start`` of a cell in ``precision`` on ``device``."""
    monitor = PerformanceMonitor("tokens", peak_tflops=peak_tflops)
    trainer = SimpleNamespace(world_size=1, accumulate_grad_batches=1, global_step=0, precision=precision)
    monitor.on_train_start(trainer, SimpleNamespace(device=torch.device(device)))
    return monitor


def test_the_peak_is_probed_once_then_every_cell_reads_it_from_the_cache(probes, cache_dir):
    first, second = start_monitor(), start_monitor()
    assert len(probes) == 1  # the second cell read the first one's probe
    assert first.peak == second.peak and first.peak.tflops > 0
    assert first.peak.probe["measured_now"] and not second.peak.probe["measured_now"]
    [cached] = (cache_dir / PEAK_CACHE_FOLDER).glob("*.json")
    record = json.loads(cached.read_text())
    # the file holds the figure, its spread, the machine it describes and the date
    assert record["tflops"] == first.peak.tflops and record["key"] == cached.stem == first.peak.probe["key"]
    assert record["spread_tflops"]["n"] == 3 and record["spread_tflops"]["min"] <= record["spread_tflops"]["max"]
    assert record["description"] == {
        "probe_version": PROBE_VERSION,
        "device": "cpu",
        "dtype": "fp32",
        "torch": torch.__version__,
        "fp32_matmul": "ieee",  # torch's default float32 matmul precision, "highest"
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }
    assert datetime.fromisoformat(record["measured_at"]).date() == datetime.now(timezone.utc).date()
    # the result names the figure's source: the cached probe, its key and date, and its spread
    figures = first.summary()
    assert figures["peak_tflops"] == pytest.approx(first.peak.tflops, rel=1e-3)
    assert figures["peak_source"].startswith("measured: fp32 matmul") and record["key"] in figures["peak_source"]
    assert figures["peak_probe"]["measured_at"] == record["measured_at"]
    assert figures["peak_probe"]["spread_tflops"] == record["spread_tflops"]
    # a configured peak probes nothing; --remeasure replaces the cached figure
    assert start_monitor(peak_tflops=1.0).peak == PeakFlops(1.0, "config") and len(probes) == 1
    again = peak_flops(None, torch.device("cpu"), "32-true", remeasure=True)
    assert len(probes) == 2 and again.probe["measured_now"] and json.loads(cached.read_text())["tflops"] == again.tflops


def test_the_cache_key_changes_with_dtype_and_thread_count(probes, cache_dir):
    before = torch.get_num_threads()
    settings = [("32-true", 1), ("32-true", 2), ("bf16-mixed", 1), ("bf16-true", 1)]  # bf16-true: the same bf16 matmuls
    peaks = [peak_flops(None, torch.device("cpu"), precision, threads=threads) for precision, threads in settings]
    again = [peak_flops(None, torch.device("cpu"), precision, threads=threads) for precision, threads in settings]
    assert probes == [
        {"dtype": torch.float32, "threads": 1},
        {"dtype": torch.float32, "threads": 2},
        {"dtype": torch.bfloat16, "threads": 1},
    ]  # each measured on the threads it is for
    assert torch.get_num_threads() == before
    assert again == peaks and peaks[3] == peaks[2]
    assert len({p.probe["key"] for p in peaks}) == 3 and len(list((cache_dir / PEAK_CACHE_FOLDER).glob("*.json"))) == 3
    assert [p.probe["key"].split("-")[:3] for p in peaks[:3]] == [
        ["cpu", "fp32", "1threads"],
        ["cpu", "fp32", "2threads"],
        ["cpu", "bf16", "1threads"],
    ]


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_cell_of_a_matrix_divides_by_the_peak_the_runner_measured_before_them(
    probes, tmp_path, monkeypatch, jobs
):
    """The runner measures the peak before the first cell; each cell (with the threads its slot
    gives it: OMP_NUM_THREADS under --jobs) reads the identical figure and probes nothing."""
    monkeypatch.setattr(blockbench.matrix.jobs, "cpu_cores", lambda: 8)  # --jobs 2 gives each cell 4 threads
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"]})
    _, cells = load_matrix(path)
    slots = job_slots(jobs)
    resolve_peaks(cells, slots[0].threads)
    assert len(probes) == 1 and probes[0]["threads"] == (4 if jobs == 2 else torch.get_num_threads())
    before = torch.get_num_threads()
    peaks = []
    for cell, slot in zip(cells, itertools.cycle(slots)):
        torch.set_num_threads(cell.run.trainer.num_threads or slot.threads or before)  # what the cell's process has
        try:
            peaks.append(start_monitor(cell.run.trainer.resolved_precision("cpu")).peak)
        finally:
            torch.set_num_threads(before)
    assert len(probes) == 1 and peaks[0] == peaks[1] and not peaks[1].probe["measured_now"]


@pytest.mark.parametrize(
    "device_name, listed",
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H100 SXM5 80GB", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", None),  # other clocks and power: not the SXM's figures
        ("NVIDIA H200", "NVIDIA H200"),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
        ("NVIDIA A100-PCIE-40GB", "NVIDIA A100"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None),  # a seventh of the GPU
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", None),
        ("NVIDIA L4", "NVIDIA L4"),
        ("NVIDIA L40S", "NVIDIA L40S"),
        ("NVIDIA L40", None),
        ("NVIDIA A10", "NVIDIA A10"),
        ("NVIDIA A10G", None),  # no NVIDIA datasheet
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("Tesla V100-SXM2-16GB", None),
    ],
)
def test_datasheet_entry_by_device_name(device_name, listed):
    gpu = datasheet_gpu(device_name)
    assert (gpu.name if gpu else None) == listed


@pytest.fixture
def fake_gpu(monkeypatch, cache_dir) -> Callable[[str], list[torch.dtype]]:
    """Makes ``torch.cuda.get_device_name`` answer the given name on this GPU-less machine, with an
    empty cache; the probe returns 50 TFLOP/s without touching a GPU, and the list it returns records
    each probe's dtype. TF32 is left off (torch's default) and restored after."""
    probes: list[torch.dtype] = []

    def fake_probe(device, dtype):
        assert torch.device(device).type == "cuda"
        probes.append(dtype)
        return PeakFlops(
            50.0, f"measured: {peak_module.DTYPE_NAMES[dtype]} matmul 4096^2", {"dtype": "x", "size": 4096}
        )

    def use(name: str) -> list[torch.dtype]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        return probes

    monkeypatch.setattr(peak_module, "measure_peak_flops", fake_probe)
    before = torch.get_float32_matmul_precision()
    yield use
    torch.set_float32_matmul_precision(before)


GPU = torch.device("cuda", 0)


def test_known_gpus_divide_by_their_datasheet_peak_in_the_runs_compute(fake_gpu):
    """bf16 and fp16 runs divide by the dense tensor-core peak; fp32 by the TF32 peak where TF32 is
    on (torch.set_float32_matmul_precision("high")), else by the FP32 peak. No probe runs."""
    probes = fake_gpu("NVIDIA H100 80GB HBM3")
    assert peak_flops(None, GPU, "bf16-mixed") == PeakFlops(989.0, "datasheet: NVIDIA H100 SXM bf16 dense")
    assert peak_flops(None, GPU, "16-mixed") == PeakFlops(989.0, "datasheet: NVIDIA H100 SXM fp16 dense")
    assert peak_flops(None, GPU, "32-true").tflops == 67.0 and not tf32_enabled()
    torch.set_float32_matmul_precision("high")
    assert peak_flops(None, GPU, "32-true") == PeakFlops(494.5, "datasheet: NVIDIA H100 SXM tf32 dense")
    fake_gpu("NVIDIA A100-SXM4-40GB")
    assert peak_flops(None, GPU, "32-true").tflops == 156.0
    assert peak_flops(None, GPU, "bf16-true").tflops == 312.0
    torch.set_float32_matmul_precision("highest")
    assert peak_flops(None, GPU, "32-true") == PeakFlops(19.5, "datasheet: NVIDIA A100 fp32 (no tensor cores)")
    assert probes == []
    assert peak_flops(7.0, GPU, "bf16-mixed") == PeakFlops(7.0, "config")  # trainer.peak_tflops still wins


def test_an_unknown_gpu_is_probed_and_the_probe_is_cached_per_tf32_setting(fake_gpu, cache_dir):
    """An A10G (no NVIDIA datasheet) gets the probe; fp32 matmuls with and without TF32 are other
    speeds, so the probe's cache key has the setting: two probes, each read back from its own file."""
    probes = fake_gpu("NVIDIA A10G")
    ieee = peak_flops(None, GPU, "32-true")
    torch.set_float32_matmul_precision("high")
    tf32 = peak_flops(None, GPU, "32-true")
    again = peak_flops(None, GPU, "32-true")
    assert probes == [torch.float32, torch.float32] and again.probe["key"] == tf32.probe["key"]
    assert ieee.source.startswith("measured: fp32 matmul") and ieee.probe_tflops is None
    assert ieee.probe["key"] != tf32.probe["key"]
    bf16 = peak_flops(None, GPU, "bf16-mixed")  # other dtypes have no TF32 in their key
    records = {p.stem: json.loads(p.read_text()) for p in (cache_dir / PEAK_CACHE_FOLDER).glob("*.json")}
    assert len(records) == 3 and probes == [torch.float32, torch.float32, torch.bfloat16]
    assert records[ieee.probe["key"]]["description"]["fp32_matmul"] == "ieee"
    assert records[tf32.probe["key"]]["description"]["fp32_matmul"] == "tf32"
    assert records[tf32.probe["key"]]["description"]["gpu"] == "NVIDIA A10G"
    bf16 = records[bf16.probe["key"]]
    assert "fp32_matmul" not in bf16["description"]


def test_mfu_of_a_known_gpu_divides_by_the_datasheet_and_shows_a_cached_probe_beside_it(fake_gpu):
    """A run on an H100 divides by 989; with a probe of this machine cached (``blockbench peak
    --remeasure`` measures it on a known GPU too), the result shows its figure beside the peak."""
    probes = fake_gpu("NVIDIA H100 80GB HBM3")
    steps = [StepTiming(seconds=0.5, items=100)] * 4
    monitor = start_monitor("bf16-mixed", device=GPU)
    monitor.steps, monitor.flops_per_batch = steps, 10**14  # 200 TFLOP/s achieved
    figures = monitor.summary()
    assert figures["peak_tflops"] == 989.0 and figures["peak_source"] == "datasheet: NVIDIA H100 SXM bf16 dense"
    assert figures["achieved_tflops"] == pytest.approx(200.0) and figures["mfu"] == pytest.approx(200 / 989, rel=1e-3)
    assert "probe_tflops" not in figures and figures["peak_probe"] is None and probes == []

    remeasured = peak_flops(None, GPU, "bf16-mixed", remeasure=True)
    assert probes == [torch.bfloat16] and remeasured.tflops == 989.0 and remeasured.probe_tflops == 50.0
    monitor = start_monitor("bf16-mixed", device=GPU)
    monitor.steps, monitor.flops_per_batch = steps, 10**14
    figures = monitor.summary()
    assert figures["peak_tflops"] == 989.0 and figures["probe_tflops"] == 50.0
    assert figures["mfu"] == pytest.approx(200 / 989, rel=1e-3) and figures["peak_probe"]["size"] == 4096
    assert probes == [torch.bfloat16]  # read from the cache


def test_an_mfu_above_one_is_no_figure_but_a_warning_in_the_result():
    """Achieved 5 TFLOP/s against a peak of 2.5: the peak is wrong, the result says so, and no
    summary or TensorBoard figure shows 200%."""
    steps = [StepTiming(seconds=0.2, items=100)] * 4
    figures = step_statistics(
        steps, warmup_steps=0, flops_per_step=10**12, peak=PeakFlops(2.5, "measured: fp32 matmul")
    )
    assert figures["achieved_tflops"] == pytest.approx(5.0)
    assert figures["mfu"] is None and figures["mfu_above_peak"] is True and figures["mfu_raw"] == pytest.approx(2.0)
    below = step_statistics(steps, warmup_steps=0, flops_per_step=10**12, peak=PeakFlops(10.0, "config"))
    assert below["mfu"] == pytest.approx(0.5) and below["mfu_above_peak"] is False
    # results written before mfu_above_peak (an MFU of 1.97 in result.json) show no figure either
    for mfu, shown in [(1.97, None), (1.0, 1.0), (0.42, 0.42), (None, None)]:
        result = CellRecord(status="ok", task="lm", performance={"mfu": mfu, "timed_steps": 4})
        assert result.speed_figures()["mfu"] == shown
        assert result.final_figures("tokens").get("perf/mfu") == shown


def test_mfu_arithmetic_with_a_configured_peak():
    """Warm-up steps left out; achieved = FLOPs per step / mean step time; MFU = achieved / peak."""
    warmup = [StepTiming(seconds=5.0, data_wait=1.0, items=100)] * 3
    timed = [StepTiming(seconds=s, data_wait=0.01, items=100) for s in (0.1, 0.2, 0.3, 0.2)]
    figures = step_statistics(warmup + timed, warmup_steps=3, flops_per_step=10**12, peak=PeakFlops(10.0, "config"))
    assert figures["timed_steps"] == 4 and figures["warmup_steps"] == 3
    assert figures["step_time_ms"] == {"median": 200.0, "mean": 200.0}
    assert figures["achieved_tflops"] == pytest.approx(5.0)  # 1e12 FLOPs in 0.2 s
    assert figures["mfu"] == pytest.approx(0.5)
    assert figures["peak_tflops"] == 10.0 and figures["peak_source"] == "config"
    assert figures["data_wait_ms"] == pytest.approx(10.0)
    assert figures["data_wait_fraction"] == pytest.approx(0.01 / 0.21, rel=1e-3)
    # a run no longer than its warm-up uses all its steps; no FLOP count, no MFU
    short = step_statistics(warmup[:2], warmup_steps=3, flops_per_step=None, peak=PeakFlops(10.0, "config"))
    assert short["timed_steps"] == 2 and short["achieved_tflops"] is None and short["mfu"] is None


# --- a real training run --------------------------------------------------------------------------

PEAK_TFLOPS = 0.05


def tiny_lm(**trainer) -> dict:
    config = copy.deepcopy(TINY_LM)
    config["trainer"].update({"max_steps": 8, "val_every_n_steps": 8, "checkpoint_every_n_steps": None, **trainer})
    return config


def train_tiny(tmp_path: Path, config: dict, name: str) -> tuple[dict, Path]:
    run = build_run_config(config)
    result = train(run, tmp_path / name, tb_dir=tmp_path / "tb", tb_name="lm", tb_version=name).to_json()
    return result, tmp_path / "tb" / "lm" / name


def normal_config() -> dict:
    """A tiny LM cell with dropout, 2 accumulation steps and a configured peak."""
    config = tiny_lm(accumulate_grad_batches=2, peak_tflops=PEAK_TFLOPS)
    config["model"]["dropout"] = 0.1
    return config


@pytest.fixture(scope="module")
def normal_run(tmp_path_factory) -> tuple[dict, Path, dict]:
    config = normal_config()
    result, run_dir = train_tiny(tmp_path_factory.mktemp("perf"), config, "normal")
    return result, run_dir, config


def test_result_has_the_performance_block(normal_run):
    result, _, _ = normal_run
    perf = result["performance"]
    assert perf["timed_steps"] == 5 and perf["warmup_steps"] == 3  # 8 steps, the first 3 are warm-up
    assert perf["step_time_ms"]["median"] > 0 and perf["step_time_ms"]["mean"] > 0
    assert perf["peak_tflops"] == PEAK_TFLOPS and perf["peak_source"] == "config"
    # MFU is achieved over peak, achieved is FLOPs per step over the mean step time (4 significant digits)
    achieved = perf["flops_per_step"] / (perf["step_time_ms"]["mean"] / 1e3) / 1e12
    assert perf["achieved_tflops"] == pytest.approx(achieved, rel=1e-3)
    assert perf["mfu"] == pytest.approx(perf["achieved_tflops"] / PEAK_TFLOPS, rel=1e-3)
    assert 0 <= perf["data_wait_fraction"] < 1 and perf["data_wait_ms"] >= 0
    assert result["throughput"] > 0 and result["throughput_unit"] == "tokens/s"
    assert result["peak_memory"]["cpu_rss_mb"] > 10


def test_flops_per_step_is_a_separate_count_on_the_same_model_and_batch(normal_run):
    """Each optimizer step is 2 micro-batches of 4 sequences; count one apart from training."""
    result, _, config = normal_run
    run = build_run_config(config)
    L.seed_everything(run.seed, verbose=False)
    module, datamodule = run.task.build(
        run.resolved_model(),
        run.optimizer,
        max_steps=run.trainer.max_steps,
        batch_size=run.trainer.per_device_batch_size(1),
    )
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    assert batch[0].shape == (4, run.task.seq_len + 1)
    with flop_counter() as counter:
        module.training_loss(batch).backward()
    assert result["performance"]["flops_per_step"] == 2 * counter.get_total_flops()


def test_counting_flops_does_not_change_training(normal_run, tmp_path, monkeypatch):
    """The count runs a forward and backward pass with dropout in the middle of an accumulation
    window's first micro-batch: without it, training ends with exactly the same metrics."""
    monkeypatch.setattr(PerformanceMonitor, "_count_flops", lambda self, trainer, pl_module, batch: None)
    uncounted, _ = train_tiny(tmp_path, normal_config(), "uncounted")
    assert uncounted["performance"]["flops_per_step"] is None and uncounted["performance"]["mfu"] is None
    counted = normal_run[0]
    assert counted["performance"]["flops_per_step"] > 0
    assert uncounted["metrics"] == counted["metrics"]
    assert [h["metrics"] for h in uncounted["history"]] == [h["metrics"] for h in counted["history"]]


def test_perf_scalars_in_tensorboard(normal_run):
    result, run_dir, _ = normal_run
    events = tensorboard_events(run_dir)
    tags = set(events.Tags()["scalars"])
    per_step = {
        "4_perf/step_time_ms",
        "4_perf/tokens_per_sec",
        "4_perf/tokens_per_sec_per_process",
        "4_perf/data_wait_fraction",
        "4_perf/tflops_per_sec",
        "4_perf/mfu",
        "4_perf/peak_memory_mb",
    }
    assert per_step <= tags, tags
    assert len(events.Scalars("4_perf/step_time_ms")) == 8  # every optimizer step (log_every_n_steps: 1)
    [flops] = events.Scalars("4_perf/flops_per_step")
    assert flops.value == pytest.approx(result["performance"]["flops_per_step"], rel=1e-6)
    # the cell's final figures, next to its final metrics
    perf = result["performance"]
    final = {
        "z_final/perf/step_time_ms": perf["step_time_ms"]["median"],
        "z_final/perf/mfu": perf["mfu"],
        "z_final/perf/tflops_per_sec": perf["achieved_tflops"],
        "z_final/perf/tokens_per_sec": result["throughput"],
        "z_final/perf/data_wait_fraction": perf["data_wait_fraction"],
        "z_final/perf/peak_memory_mb": result["peak_memory"]["cpu_rss_mb"],
    }
    for tag, value in final.items():
        assert events.Scalars(tag)[-1].value == pytest.approx(value, rel=1e-5), tag


def test_tensorboard_never_holds_an_mfu_above_one(tmp_path):
    """Against a peak of 1 MFLOP/s every step's ratio is far above 1: no step logs perf/mfu (it is
    left out, not clipped to 1), the result has no mfu but the raw ratio and the warning, and the
    final figures have no MFU either."""
    with pytest.warns(UserWarning, match="MFU .* is above 1, so the result has none"):
        result, run_dir = train_tiny(tmp_path, tiny_lm(peak_tflops=1e-6), "above_peak")
    perf_block = result["performance"]
    assert perf_block["mfu"] is None and perf_block["mfu_above_peak"] is True
    assert perf_block["mfu_raw"] == pytest.approx(perf_block["achieved_tflops"] / 1e-6, rel=1e-3)
    events = tensorboard_events(run_dir)
    tags = set(events.Tags()["scalars"])
    assert len(events.Scalars("4_perf/tflops_per_sec")) == 8  # every step was logged, with its FLOP/s
    assert all(e.value > 1e-6 for e in events.Scalars("4_perf/tflops_per_sec"))  # each above the peak
    assert "4_perf/mfu" not in tags and "z_final/perf/mfu" not in tags
    assert "z_final/perf/tflops_per_sec" in tags


SLEEP_S = 0.05


def test_data_wait_is_measured(normal_run, tmp_path, monkeypatch):
    """A dataset that takes 50 ms per batch shows up as data wait, not as step time."""

    def slow_collate(items):
        time.sleep(SLEEP_S)
        return default_collate(items)

    original = AgreementDataModule.train_dataloader

    def slow_train_dataloader(self):
        loader = original(self)
        return self.training_loader(loader.dataset, collate_fn=slow_collate)

    monkeypatch.setattr(AgreementDataModule, "train_dataloader", slow_train_dataloader)
    slow, _ = train_tiny(tmp_path, tiny_lm(), "slow")
    normal = normal_run[0]["performance"]
    waited = slow["performance"]
    assert waited["data_wait_ms"] >= 0.9 * 1e3 * SLEEP_S
    assert waited["data_wait_fraction"] > 0.5
    assert waited["data_wait_fraction"] > 5 * normal["data_wait_fraction"]
    assert waited["step_time_ms"]["median"] < 1e3 * SLEEP_S  # the sleep is not counted as compute
    assert waited["peak_source"].startswith("measured: fp32 matmul")  # no trainer.peak_tflops: the probe
