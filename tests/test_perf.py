"""Speed figures of a cell: model FLOPs, the peak FLOP/s probe, MFU, data wait, and what a real
training run writes to result.json and TensorBoard."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import default_collate

from blockbench.callbacks import PerformanceMonitor
from blockbench.config import build_run_config
from blockbench.perf import (
    PeakFlops,
    StepTiming,
    compute_dtype,
    count_training_flops,
    flop_counter,
    measure_peak_flops,
    peak_flops,
    step_statistics,
)
from blockbench.train import train
from models.attention import MultiHeadAttention
from tasks.lm import AgreementDataModule
from test_runner import TINY_LM


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
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    compiled = copy.deepcopy(model)
    compiled.compile(backend="eager")
    assert count_training_flops(compiled, lambda: compiled(x).sum()) == flops


# --- peak FLOP/s and MFU --------------------------------------------------------------------------


def test_compute_dtype_of_each_precision():
    assert compute_dtype("bf16-mixed") == compute_dtype("bf16-true") == torch.bfloat16
    assert compute_dtype("16-mixed") == compute_dtype("16-true") == torch.float16
    assert compute_dtype("32-true") == compute_dtype(32) == torch.float32
    assert compute_dtype("64-true") == compute_dtype(64) == torch.float64
    with pytest.raises(ValueError, match="set trainer.peak_tflops"):
        compute_dtype("8-magic")


@pytest.mark.parametrize("precision, name", [("32-true", "fp32"), ("bf16-mixed", "bf16"), ("16-true", "fp16")])
def test_probe_measures_a_positive_peak_in_the_compute_dtype_quickly(precision, name):
    start = time.perf_counter()
    peak = peak_flops(None, torch.device("cpu"), precision)
    assert time.perf_counter() - start < 5  # about half a second; float16 on a CPU gets a smaller matrix
    assert peak.tflops > 0
    assert peak.source.startswith(f"measured: {name} matmul ") and "^2 fastest of 10" in peak.source


def test_probe_leaves_the_global_rng_alone():
    rng = torch.get_rng_state()
    measure_peak_flops("cpu", torch.float32, max_size=256)
    assert torch.equal(torch.get_rng_state(), rng)


def test_configured_peak_is_used_as_given():
    assert peak_flops(312.0, torch.device("cpu"), "bf16-mixed") == PeakFlops(312.0, "config")


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
    result = train(run, tmp_path / name, tb_dir=tmp_path / "tb", tb_name="lm", tb_version=name)
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
    assert 0 < perf["step_time_ms"]["median"] and 0 < perf["step_time_ms"]["mean"]
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
    module, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=run.trainer.max_steps,
                                        batch_size=run.trainer.per_device_batch_size(1))
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
    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    per_step = {"perf/step_time_ms", "perf/tokens_per_sec", "perf/tokens_per_sec_per_process", "perf/data_wait_fraction",
                "perf/tflops_per_sec", "perf/mfu", "perf/peak_memory_mb"}
    assert per_step <= tags, tags
    assert len(events.Scalars("perf/step_time_ms")) == 8  # every optimizer step (log_every_n_steps: 1)
    [flops] = events.Scalars("perf/flops_per_step")
    assert flops.value == pytest.approx(result["performance"]["flops_per_step"], rel=1e-6)
    # the cell's final figures, next to its final metrics
    perf = result["performance"]
    final = {"final/perf/step_time_ms": perf["step_time_ms"]["median"], "final/perf/mfu": perf["mfu"],
             "final/perf/tflops_per_sec": perf["achieved_tflops"], "final/perf/tokens_per_sec": result["throughput"],
             "final/perf/data_wait_fraction": perf["data_wait_fraction"],
             "final/perf/peak_memory_mb": result["peak_memory"]["cpu_rss_mb"]}
    for tag, value in final.items():
        assert events.Scalars(tag)[-1].value == pytest.approx(value, rel=1e-5), tag


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
