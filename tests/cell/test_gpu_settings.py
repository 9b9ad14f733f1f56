"""The fast settings on a GPU and the deterministic switch, tested on a CPU by faking CUDA where a
setting depends on it: TF32 for float32 matmuls, fused AdamW with gradient clipping under
bf16-mixed, DataLoader workers and pinned memory, the checkpoint interval, deterministic kernels,
the CUDA versions in the provenance and the summary's line on bit-for-bit reruns. On a CPU every
one of them leaves the run as it was: the same optimizer, loaders, checkpoints and numbers."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from helpers import REPO, TINY_LM, TINY_MODEL
from lightning.pytorch.strategies import SingleDeviceStrategy

import blockbench.provenance as provenance
import blockbench.tasks.base as task_base
from blockbench.cell import runtime
from blockbench.cell.train import train
from blockbench.config import build_run_config, deep_merge, load_yaml, to_yaml
from blockbench.progress import LIGHTNING_INFO_LOGGERS, quiet_lightning
from blockbench.report.summary import _bit_for_bit
from blockbench.store.record import CellRecord

GPU_CLIPPED_BF16 = dict(gradient_clip_val=1.0, gradient_clip_algorithm=None, precision="bf16-mixed")


def cell(**trainer) -> dict:
    return deep_merge(TINY_LM, {"trainer": {"checkpoint_every_n_steps": None, "peak_tflops": 1.0, **trainer}})


def run_cell(tmp_path, raw: dict, name: str = "run", **kwargs) -> CellRecord:
    return train(build_run_config(raw), tmp_path / name, tb_dir=tmp_path / "tb", tb_name="c", tb_version=name, **kwargs)


@pytest.fixture
def restored_torch_settings():
    """Tests that set torch's process-wide settings themselves leave them as they found them."""
    matmul, cudnn_tf32 = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn_tf32


# --------------------------------------------------------------------------- TF32


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_gpu_run_uses_tf32_and_restores_the_setting_after(restored_torch_settings, precision):
    trainer = build_run_config(cell(precision=precision)).trainer
    torch.set_float32_matmul_precision("highest")
    with runtime.machine_settings(trainer, "gpu"):
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("switch", [{"tf32": False}, {"deterministic": True}])
def test_tf32_off_or_deterministic_keeps_full_fp32_on_a_gpu(restored_torch_settings, switch):
    trainer = build_run_config(cell(**switch)).trainer
    torch.set_float32_matmul_precision("high")  # e.g. left by other code in the process
    with runtime.machine_settings(trainer, "cuda"):
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "high"


def test_train_runs_a_cell_under_the_settings_of_its_gpu(tmp_path, monkeypatch, restored_torch_settings):
    """``train`` resolves ``accelerator: auto`` to the GPU and trains the cell with TF32 on."""
    import blockbench.cell.train as cell_train

    seen = {}

    def fake_cell(run, out_dir, *, accelerator, **kwargs):
        seen.update(accelerator=accelerator, matmul=torch.get_float32_matmul_precision())

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cell_train, "train_cell", fake_cell)
    torch.set_float32_matmul_precision("highest")
    cell_train.train(build_run_config(cell()), tmp_path)
    assert seen == {"accelerator": "gpu", "matmul": "high"}
    assert torch.get_float32_matmul_precision() == "highest"


# --------------------------------------------------------------------------- cuDNN attention


def test_a_cells_sdpa_calls_are_its_attention_layers_times_its_steps():
    assert runtime.attention_calls(build_run_config(cell())) == 1 * 4  # one layer, four steps
    translator = {
        **cell(max_steps=10, accumulate_grad_batches=2),
        "task": {"name": "translation"},
        "model": {**TINY_MODEL, "n_layers": 2},
    }
    # an encoder, a decoder and its cross-attention, each of 2 layers, over 10 steps of 2 micro-batches
    assert runtime.attention_calls(build_run_config(translator)) == 3 * 2 * 10 * 2


@pytest.fixture
def restored_cudnn_sdp():
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(enabled)


def test_a_small_gpu_cell_runs_sdpa_without_cudnn_and_a_large_one_with_it(restored_torch_settings, restored_cudnn_sdp):
    """cuDNN's attention plans cost more than its kernel saves in a cell of fewer than CUDNN_SDPA_MIN_CALLS
    calls: SDPA runs without it there, with it from there on (and where the calls are not known); the
    setting is restored after."""
    trainer = build_run_config(cell()).trainer
    small, large = runtime.CUDNN_SDPA_MIN_CALLS - 1, runtime.CUDNN_SDPA_MIN_CALLS
    torch.backends.cuda.enable_cudnn_sdp(True)
    with runtime.machine_settings(trainer, "gpu", small):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    for calls in (large, None):
        with runtime.machine_settings(trainer, "cuda", calls):
            assert torch.backends.cuda.cudnn_sdp_enabled()
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_a_cpu_cell_leaves_the_cudnn_attention_setting_alone(monkeypatch, restored_cudnn_sdp):
    calls = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", lambda value: calls.append(value))
    with runtime.machine_settings(build_run_config(cell()).trainer, "cpu", 4):
        pass
    assert set(calls) <= {torch.backends.cuda.cudnn_sdp_enabled()}  # at most restored to what it was


def test_a_cpu_run_leaves_the_matmul_precision_alone_and_records_it(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda value: calls.append(value))
    with runtime.machine_settings(build_run_config(cell()).trainer, "cpu"):
        pass
    assert set(calls) <= {torch.get_float32_matmul_precision()}  # at most restored to what it was
    monkeypatch.undo()
    record = run_cell(tmp_path, cell(accelerator="cpu"))
    assert record.runtime.accelerator == "cpu" and record.runtime.matmul_precision == "highest"
    assert "cudnn_attention" not in record.runtime.model_dump(exclude_unset=True)  # a GPU's setting only


def test_lightnings_tf32_hint_is_not_silenced_but_its_other_notices_are():
    """quiet_lightning drops Lightning's device lines and tips, not its advice to use TF32 (shown
    when a GPU run keeps full fp32: trainer.tf32: false, or trainer.deterministic)."""
    from lightning.fabric.accelerators import cuda
    from lightning.fabric.utilities.rank_zero import rank_zero_info

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    loggers = [logging.getLogger(name) for name in LIGHTNING_INFO_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        quiet_lightning()
        rank_zero_info("GPU available: True (cuda), used: True")
        with pytest.MonkeyPatch.context() as patch:  # Lightning's own check, on a faked H100
            patch.setattr(torch.cuda, "is_available", lambda: True)
            patch.setattr(cuda, "_is_ampere_or_later", lambda device=None: True)
            patch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100")
            torch.set_float32_matmul_precision("highest")
            cuda._check_cuda_matmul_precision(torch.device("cuda", 0))
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert len(seen) == 1 and "set_float32_matmul_precision('medium' | 'high')" in seen[0], seen


# --------------------------------------------------------------------------- fused AdamW


def built_module(trainer: SimpleNamespace | None):
    run = build_run_config({"model": TINY_MODEL, "task": TINY_LM["task"]})
    module, _ = run.task.build(run.resolved_model(), run.optimizer, max_steps=4, batch_size=8)
    module._trainer = trainer
    return module


def fake_trainer(strategy=None, **fields) -> SimpleNamespace:
    strategy = strategy or SingleDeviceStrategy(device=torch.device("cpu"))
    return SimpleNamespace(strategy=strategy, **{**GPU_CLIPPED_BF16, **fields})


def fake_cuda_parameters(monkeypatch) -> None:
    monkeypatch.setattr(task_base, "parameter_devices", lambda params: {"cuda"})


def test_bf16_mixed_with_clipping_keeps_the_fused_adamw_on_cuda_and_clips_itself(monkeypatch):
    fake_cuda_parameters(monkeypatch)
    module = built_module(fake_trainer())
    optimizer = module.configure_optimizers()["optimizer"]
    assert optimizer.defaults["fused"] is True and module.clips_itself and module.adamw_implementation == "fused"
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for p in params:
        p.grad = torch.full_like(p, 10.0)
    module.configure_gradient_clipping(optimizer, 1.0, None)  # Lightning's own would refuse a fused optimizer
    assert torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])).item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "trainer",
    [
        pytest.param(dict(precision="16-mixed"), id="fp16-mixed: the gradient scaler"),
        pytest.param(dict(strategy=object()), id="a sharding strategy"),
    ],
)
def test_fp16_mixed_or_a_sharded_model_keeps_the_default_adamw_under_clipping(monkeypatch, trainer):
    fake_cuda_parameters(monkeypatch)
    module = built_module(fake_trainer(**trainer))
    optimizer = module.configure_optimizers()["optimizer"]
    assert optimizer.defaults["fused"] is None and not module.clips_itself


def test_fp32_on_cuda_is_fused_and_lightning_clips(monkeypatch):
    fake_cuda_parameters(monkeypatch)
    module = built_module(fake_trainer(precision="32-true"))
    assert module.configure_optimizers()["optimizer"].defaults["fused"] is True and not module.clips_itself


@pytest.mark.parametrize(
    ("precision", "fused", "implementation"), [("32-true", True, "fused"), ("bf16-mixed", None, "for-loop")]
)
def test_on_a_cpu_the_adamw_is_what_it_was(precision, fused, implementation):
    """On a CPU the committed results' optimizer: fused, except with clipping under mixed precision."""
    module = built_module(fake_trainer(precision=precision))
    assert module.configure_optimizers()["optimizer"].defaults["fused"] is fused
    assert module.adamw_implementation == implementation and not module.clips_itself


def test_a_run_clipping_for_the_fused_adamw_trains_through_lightning(tmp_path, monkeypatch):
    """Lightning's loop calls the module's clipping: with the fused AdamW under bf16-mixed (CUDA faked
    for the parameters, the kernels on the CPU) the run trains where Lightning's clipping would raise."""
    fake_cuda_parameters(monkeypatch)
    record = run_cell(tmp_path, cell(precision="bf16-mixed", accelerator="cpu"))
    assert record.status == "ok" and record.runtime.adamw == "fused"


# --------------------------------------------------------------------------- DataLoader workers


@pytest.mark.parametrize(
    ("accelerator", "cpus", "workers"), [("cpu", 16, 0), ("gpu", 16, 4), ("cuda", 3, 2), ("gpu", 1, 0)]
)
def test_auto_workers_none_on_a_cpu_and_up_to_four_per_gpu(accelerator, cpus, workers):
    trainer = build_run_config(cell()).trainer
    assert trainer.loader_workers(accelerator, cpus) == workers
    assert build_run_config(cell(num_workers=3)).trainer.loader_workers(accelerator, cpus) == 3


def test_a_gpu_process_loads_with_workers_and_pinned_memory(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    trainer = build_run_config(cell()).trainer
    assert runtime.data_loading(trainer, "gpu", devices=2) == {"num_workers": 4, "pin_memory": True}
    assert runtime.data_loading(trainer, "gpu", devices=8) == {"num_workers": 1, "pin_memory": True}
    assert runtime.data_loading(trainer, "cpu", devices=1) == {"num_workers": 0, "pin_memory": False}


def lm_datamodule(raw: dict = TINY_LM):
    run = build_run_config(raw)
    _, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=4, batch_size=8)
    datamodule.setup("fit")
    return datamodule


def test_the_loaders_take_the_workers_and_pinned_memory_only_when_set():
    datamodule = lm_datamodule()
    plain = datamodule.train_dataloader()
    assert (plain.num_workers, plain.pin_memory, plain.persistent_workers) == (0, False, False)
    datamodule.load_for(num_workers=2, pin_memory=True)
    loader = datamodule.train_dataloader()
    assert (loader.num_workers, loader.pin_memory, loader.persistent_workers) == (2, True, True)
    validation = datamodule.val_dataloader()[0]
    assert (validation.num_workers, validation.pin_memory) == (0, True)


def test_workers_give_the_numbers_of_the_main_process(tmp_path):
    """The embedded tasks draw nothing at random in their datasets: batches from workers are the same."""
    runs = [run_cell(tmp_path, cell(num_workers=n), name=f"w{n}") for n in (0, 2)]
    assert runs[1].runtime.num_workers == 2 and runs[0].runtime.num_workers == 0
    assert runs[0].metrics == runs[1].metrics
    assert [h.metrics for h in runs[0].history] == [h.metrics for h in runs[1].history]


# --------------------------------------------------------------------------- checkpoints


def test_checkpoints_every_50_steps_on_a_cpu_and_500_on_a_gpu():
    auto = build_run_config(cell(checkpoint_every_n_steps="auto")).trainer
    assert auto.checkpoint_interval("cpu") == 50 and auto.checkpoint_interval("gpu") == 500
    for value in (20, None):
        trainer = build_run_config(cell(checkpoint_every_n_steps=value)).trainer
        assert trainer.checkpoint_interval("cpu") == trainer.checkpoint_interval("gpu") == value
    assert build_run_config({}).trainer.checkpoint_every_n_steps == "auto"


# --------------------------------------------------------------------------- determinism


def test_the_deterministic_switch_sets_what_pytorch_needs(tmp_path, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert runtime.lightning_determinism(build_run_config(cell()).trainer) == {}
    trainer = build_run_config(cell(deterministic=True)).trainer
    assert runtime.lightning_determinism(trainer) == {"deterministic": True, "benchmark": False}

    seen = {}

    class Spy(L.Callback):
        def on_train_start(self, trainer, pl_module):
            seen.update(
                cublas=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                deterministic=torch.are_deterministic_algorithms_enabled(),
                benchmark=torch.backends.cudnn.benchmark,
            )

    record = run_cell(tmp_path, cell(deterministic=True), extra_callbacks=[Spy()])
    assert seen == {"cublas": ":4096:8", "deterministic": True, "benchmark": False}
    assert record.runtime.deterministic is True
    assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_the_provenance_names_the_cuda_versions_where_cuda_is_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert provenance.cuda_versions() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    monkeypatch.setattr(torch.cuda, "driver_version", lambda: "550.54.15", raising=False)
    assert provenance.cuda_versions() == {"cuda": "12.4", "cudnn": 90100, "nccl": "2.21.5", "driver": "550.54.15"}

    monkeypatch.delattr(torch.cuda, "driver_version", raising=False)  # older torch: nvidia-smi answers
    monkeypatch.setattr(
        subprocess, "run", lambda *args, **kwargs: SimpleNamespace(returncode=0, stdout="535.104.05\n535.104.05\n")
    )
    assert provenance.cuda_versions()["driver"] == "535.104.05"


def record(accelerator: str | None, deterministic: bool | None = None, gpu_count: int = 0) -> CellRecord:
    runtime_block = None if accelerator is None else {"accelerator": accelerator, "deterministic": deterministic}
    return CellRecord.model_validate(
        {
            "status": "ok",
            "task": "lm",
            "runtime": runtime_block,
            "provenance": {"hardware": {"gpu_count": gpu_count}},
        }
    )


def test_the_summary_says_whether_bit_for_bit_claims_apply():
    cpu = "CPU: same bits for the same versions and CPU kind"
    assert _bit_for_bit([record("cpu"), record(None)]) == [f"Bit for bit: yes ({cpu}).  "]
    assert _bit_for_bit([record("cuda", True), record("cpu")]) == [
        f"Bit for bit: yes ({cpu}; GPU with trainer.deterministic: same bits for the same versions, driver and "
        "GPU kind).  "
    ]
    loose = _bit_for_bit([record("cuda", True), record("cuda", False), record(None, gpu_count=8)])
    assert loose == [
        "Bit for bit: no: 2 of 3 GPU cell(s) ran without trainer.deterministic; a rerun of them agrees only "
        "approximately.  "
    ]
    failed = CellRecord.model_validate({"status": "failed", "task": "lm"})
    assert _bit_for_bit([failed]) == []


# --------------------------------------------------------------------------- config hashes

CONFIGS = [(config, task) for config in ("base", "real") for task in ("lm", "translation", "vit")]


@pytest.mark.parametrize(("config", "task"), CONFIGS)
def test_a_config_hashes_as_its_whole_resolved_config(config, task):
    """The hash is the sha256 of the resolved config as sorted JSON (hand-computed here), and a cell's
    config.yaml read back hashes the same, so a committed cell is found again."""
    run = build_run_config(load_yaml(REPO / "configs" / f"{config}.yaml"), {"task": task})
    expected = hashlib.sha256(json.dumps(run.resolved_dict(), sort_keys=True).encode()).hexdigest()[:16]
    assert run.config_hash() == expected
    again = build_run_config(yaml.safe_load(to_yaml(run)))
    assert again.config_hash() == run.config_hash()


@pytest.mark.parametrize(
    "override",
    [
        {"trainer.tf32": False},
        {"trainer.deterministic": True},
        {"trainer.num_workers": 2},
        {"trainer.num_workers": 0},
        {"trainer.checkpoint_every_n_steps": 500},
        {"task.num_workers": 2},
    ],
)
def test_a_setting_away_from_its_default_changes_the_hash(override):
    task = "cifar10" if "task.num_workers" in override else "lm"
    base = load_yaml(REPO / "configs" / "base.yaml")
    default = build_run_config(base, {"task": task}).config_hash()
    assert build_run_config(base, {"task": task, **override}).config_hash() != default


def test_an_image_tasks_own_workers_win_over_the_trainers():
    from blockbench.tasks.image import ImageDataModule

    def datamodule(workers):
        run = build_run_config(
            load_yaml(REPO / "configs" / "base.yaml"), {"task": "cifar10", "task.num_workers": workers}
        )
        return ImageDataModule(run.task, 8)

    own, follows = datamodule(1), datamodule(None)
    assert own.num_workers == 1 and follows.num_workers == 0
    own.load_for(num_workers=4, pin_memory=True)
    follows.load_for(num_workers=4, pin_memory=True)
    assert (own.num_workers, own.pin_memory, follows.num_workers) == (1, True, 4)
