"""Every bad config is rejected before training, with a message that names the key: the run
config (``build_run_config``), the matrix (``load_matrix``) and the CLI; variants own their checks
(``Registry.check``); trainer settings are checked against Lightning's own lists; results folders
stay one level per task, variant and seed; the dependency floors cover the APIs the code uses."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pydantic
import pytest
import torch
from helpers import REPO, TINY_LM, blockbench, write_matrix
from packaging.requirements import Requirement
from packaging.version import Version

from blockbench.config import (
    COMMON_LIGHTNING_VALUES,
    LIGHTNING_FIELDS,
    ConfigError,
    TrainerConfig,
    build_run_config,
    lightning_choices,
    load_yaml,
)
from blockbench.matrix.expand import load_matrix
from blockbench.matrix.jobs import cell_command
from blockbench.models import ModelConfig, build_model
from blockbench.models.config import VARIANT_REGISTRIES
from blockbench.models.registry import Registry
from blockbench.report.summary import write_report
from blockbench.store.layout import write_atomic, write_json

# the tiny LM, two steps on one thread
TINY = {**TINY_LM, "trainer": {"max_steps": 2, "batch_size": 8, "val_every_n_steps": 2, "num_threads": 1}}

# (dotted overrides on TINY, text the error must contain: the key and what is wrong)
BAD_CONFIGS = {
    "unknown key": ({"model.norm_placment": "pre"}, "model.norm_placment: unknown key"),
    "wrong type": ({"trainer.max_steps": "many"}, "trainer.max_steps: Input should be a valid integer"),
    "out of range": ({"model.dropout": 1.5}, "model.dropout: Input should be less than 1"),
    "n_heads does not divide d_model": ({"model.n_heads": 6}, "n_heads=6 does not divide d_model=32"),
    "bad n_kv_heads": ({"model.n_kv_heads": 3}, "n_kv_heads=3 does not divide n_heads=2"),
    "top_k above n_experts": ({"model.n_experts": 2, "model.moe_top_k": 3}, "moe_top_k=3 exceeds n_experts=2"),
    "learned positions with eval_seq_len": (
        {"task.eval_seq_len": 64},
        "task.eval_seq_len=64 exceeds task.seq_len=32, but model.pos_encoding=learned",
    ),
    "rope with odd head dim": (
        {"model.pos_encoding": "rope", "model.d_model": 30},
        "model.pos_encoding: pos_encoding=rope needs an even head",
    ),
    "sincos2d on lm": (
        {"model.pos_encoding": "sincos2d"},
        "model.pos_encoding: pos_encoding=sincos2d is for the vit family",
    ),
    "sincos2d on translation": (
        {"task": "translation", "model.pos_encoding": "sincos2d"},
        "model.pos_encoding: pos_encoding=sincos2d is for the vit family (it needs model.image_size), "
        "not encoder_decoder",
    ),
    "sincos2d with d_model not divisible by 4": (
        {"task": "vit", "model.pos_encoding": "sincos2d", "model.d_model": 30},
        "model.pos_encoding: pos_encoding=sincos2d needs d_model divisible by 4",
    ),
    "fixed pattern summary above stride": (
        {"model.attention_pattern": "fixed", "model.attention_stride": 4, "model.attention_summary": 5},
        "model.attention_pattern: attention_pattern=fixed: attention_summary=5 exceeds attention_stride=4",
    ),
    "patch_size does not divide image_size": (
        {"task": "vit", "model.patch_size": 5},
        "patch_size=5 does not divide image_size=32",
    ),
    "data-decided field": ({"model.vocab_size": 10}, "model.vocab_size=10: decided by task 'lm'"),
    "bad precision": (
        {"trainer.precision": "fp7"},
        "trainer.precision: 'fp7' is not a Lightning precision; choose one of: auto,",
    ),
    "bad accelerator": ({"trainer.accelerator": "npu"}, "trainer.accelerator: 'npu' is not a Lightning accelerator"),
    "bad strategy": ({"trainer.strategy": "horovod"}, "trainer.strategy: 'horovod' is not a Lightning strategy"),
    "label with /": ({"task.label": "runs/a"}, "task.label: 'runs/a' cannot name a results folder"),
    "label ..": ({"task.label": ".."}, "task.label: '..' cannot name a results folder"),
    "empty label": ({"task.label": ""}, "task.label: '' cannot name a results folder"),
    "batch not divisible by devices": (
        {"trainer.devices": 3},
        "trainer: batch_size=8 is not divisible by 3 process(es)",
    ),
    "unknown task": ({"task": "chess"}, "task: unknown task 'chess'; choose a task (lm, translation, vit"),
    "unknown variant name": (
        {"model.norm": "batchnorm"},
        "model.norm: unknown norm 'batchnorm'; choose one of: layernorm",
    ),
}


@pytest.mark.parametrize("overrides, expected", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_bad_config_is_a_config_error_naming_the_key(overrides, expected):
    with pytest.raises(ConfigError) as info:
        build_run_config(TINY, overrides)
    assert expected in str(info.value)


def test_the_good_neighbours_of_the_bad_configs_pass():
    """The checks reject only what cannot run: the same keys with fitting values validate."""
    good = [
        {"model.pos_encoding": "rope"},
        {"task": "vit", "model.pos_encoding": "sincos2d"},
        {"model.attention_pattern": "fixed", "model.attention_stride": 4, "model.attention_summary": 4},
        {"model.attention_stride": 4, "model.attention_summary": 5},  # no fixed pattern: the summary is unused
        {"trainer.precision": "bf16-mixed", "trainer.accelerator": "cpu", "trainer.strategy": "ddp"},
        {"trainer.strategy": "DDP"},  # Lightning lowercases strategy names
        {"trainer.precision": "16"},  # Lightning's short alias of 16-mixed
        {"task.label": "shakespeare_v1.2"},
        {"task.eval_seq_len": 64, "model.pos_encoding": "alibi"},
    ]
    for overrides in good:
        build_run_config(TINY, overrides)


def test_sincos2d_on_a_non_vit_family_fails_at_validation_not_at_build():
    bad = {"family": "decoder_lm", "vocab_size": 20, "d_model": 32, "n_heads": 4, "pos_encoding": "sincos2d"}
    with pytest.raises(pydantic.ValidationError) as info:
        ModelConfig.model_validate(bad)
    assert info.value.errors()[0]["loc"] == ("pos_encoding",)
    # without a family (a model: section before the task fills it in) only the width is checked
    assert ModelConfig(pos_encoding="sincos2d", d_model=32).pos_encoding == "sincos2d"
    vit = build_model(
        {"family": "vit", "d_model": 32, "n_heads": 4, "image_size": 8, "n_classes": 3, "pos_encoding": "sincos2d"}
    )
    assert vit.positions.table.shape == (2 * 2, 32)  # the 2x2 patch grid


# variants own their checks ----------------------------------------------------------------------


def test_registry_check_calls_the_variants_own_check():
    calls = []
    registry = Registry("toy")

    @registry.register("checked", "a class with a check")
    class Checked:
        @classmethod
        def check(cls, cfg):
            calls.append(cfg)
            if cfg == "bad":
                raise ValueError("toy=checked cannot run with bad")

    def check_function(cfg):
        if cfg == "bad":
            raise ValueError("toy=function cannot run with bad")

    registry.register("function", "a function variant", check=check_function)(lambda: None)
    registry.register("plain", "no check")(object)
    registry.check("checked", "good")
    assert calls == ["good"]
    with pytest.raises(ValueError, match="toy=checked cannot run with bad"):
        registry.check("checked", "bad")
    with pytest.raises(ValueError, match="toy=function cannot run with bad"):
        registry.check("function", "bad")
    registry.check("plain", "bad")  # no check: nothing to reject
    with pytest.raises(KeyError, match="unknown toy 'missing'; choose one of: checked, function, plain"):
        registry.check("missing", "good")


@pytest.mark.parametrize("field", VARIANT_REGISTRIES)
def test_model_config_calls_the_check_of_every_selected_variant(field, monkeypatch):
    """Each name-selected field's variant check runs at validation and is reported at that field."""
    registry = VARIANT_REGISTRIES[field]
    name = {"family": "decoder_lm"}.get(field) or ModelConfig.model_fields[field].default
    entry = registry._entries[name]

    def refuse(cfg: ModelConfig) -> None:
        assert isinstance(cfg, ModelConfig)
        raise ValueError(f"{field}={name} refuses this config")

    monkeypatch.setitem(registry._entries, name, dataclasses.replace(entry, check=refuse))
    with pytest.raises(pydantic.ValidationError) as info:
        ModelConfig.model_validate({"family": "decoder_lm", "vocab_size": 10, field: name})
    [error] = info.value.errors()
    assert error["loc"] == (field,) and error["msg"] == f"Value error, {field}={name} refuses this config"


def test_model_config_has_no_variant_special_cases():
    """The variant-specific checks live in the variants: ModelConfig's source names no variant."""
    source = Path(sys.modules[ModelConfig.__module__].__file__).read_text()
    validators = source[source.index("def _shapes") : source.index("def ffn_dim")]
    for special_case in ('"rope"', '"sincos2d"', '"fixed"', "attention_summary"):
        assert special_case not in validators, special_case


# trainer settings against Lightning --------------------------------------------------------------


def lightning_accepts(key: str, value: str) -> bool:
    """Whether lightning.Trainer itself accepts ``key=value`` (the reference for our check)."""
    settings = {"accelerator": "cpu", "devices": 1, key: value}
    try:
        L.Trainer(
            **settings, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
        )
    except ValueError:
        return False
    except Exception:  # accepted by name, but not runnable here (no GPU, no DeepSpeed installed, ...)
        return True
    return True


@pytest.mark.filterwarnings("ignore:`precision=bf16` is supported for historical reasons")
@pytest.mark.parametrize(
    "key, value",
    [
        ("precision", "fp7"),
        ("precision", "bf16-mixed"),
        ("precision", "64-true"),
        ("precision", "bf16"),
        ("accelerator", "npu"),
        ("accelerator", "cpu"),
        ("strategy", "horovod"),
        ("strategy", "ddp"),
        ("strategy", "single_device"),
        ("strategy", "Ddp_Spawn"),
    ],
)
def test_trainer_settings_are_accepted_exactly_when_lightning_accepts_them(key, value):
    try:
        TrainerConfig(**{key: value})
        ours = True
    except pydantic.ValidationError:
        ours = False
    assert ours == lightning_accepts(key, value), (key, value, ours)


def test_lightning_choices_come_from_lightning():
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    assert {"auto", "32-true", "bf16-mixed", "16-mixed", "64-true", "bf16"} <= set(lightning_choices("precision"))
    assert set(lightning_choices("accelerator")) == {"auto", "gpu", *AcceleratorRegistry.available_accelerators()}
    assert set(lightning_choices("strategy")) == {"auto", *StrategyRegistry.available_strategies()}
    for key in ("precision", "accelerator", "strategy"):
        for value in lightning_choices(key):
            TrainerConfig(
                **{key: value, "curve_every_n_steps": 0}
            )  # every listed choice validates (sharding: without the curve)


def test_the_values_checked_without_lightning_are_in_lightnings_own_lists():
    """Validation takes the common trainer values (``COMMON_LIGHTNING_VALUES``) without importing
    Lightning for its lists: each of them is in those lists, so that the shortcut never passes a value
    that the installed Lightning would reject."""
    assert set(COMMON_LIGHTNING_VALUES) == set(LIGHTNING_FIELDS)
    for key in LIGHTNING_FIELDS:
        assert set(COMMON_LIGHTNING_VALUES[key]) <= set(lightning_choices(key)), key


#: validates configs of every task, a bad run config and a bad matrix file, then prints the heavy
#: libraries that are loaded
VALIDATE_WITHOUT_LIGHTNING = """
import sys
from blockbench.config import ConfigError, build_run_config, load_yaml, parse_overrides
from blockbench.matrixfile import MatrixConfig
from blockbench.tasks import TASK_CONFIGS
import pydantic

base = load_yaml("configs/base.yaml")
for task in [*TASK_CONFIGS.keys() - {"lm_text", "translation_text", "image_classification"}, "wikitext2",
             "multi30k_de_en", "cifar10"]:
    build_run_config(base, parse_overrides([f"task={task}", "trainer.precision=bf16-mixed", "trainer.strategy=ddp"]))
try:
    build_run_config(base, parse_overrides(["model.n_heads=5", "trainer.accelerator=cpu"]))
    raise AssertionError("model.n_heads=5 passed")
except ConfigError as error:
    assert "n_heads=5 does not divide d_model=128" in str(error), error
try:
    MatrixConfig.model_validate({"name": "m", "axes": {"model.norm": []}})
    raise AssertionError("an empty axis passed")
except pydantic.ValidationError as error:
    assert "has no values" in str(error), error
print(sorted({name.split(".")[0] for name in sys.modules} & {"lightning", "torchmetrics", "torchvision"}))
"""


def test_a_config_is_validated_without_importing_lightning():
    """Validating run configs and matrix files, and telling what is wrong with them, imports neither
    Lightning nor torchmetrics nor torchvision, seconds of imports before the first word: the task
    configs live apart from the tasks' Lightning code, and Lightning's lists are read only for an
    uncommon trainer value."""
    process = subprocess.run(
        [sys.executable, "-c", VALIDATE_WITHOUT_LIGHTNING], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert process.returncode == 0, process.stderr
    assert process.stdout.split("\n")[-2] == "[]", process.stdout


# results folders -------------------------------------------------------------------------------


def fake_result(task: str, seed: int, perplexity: float) -> dict:
    """A finished lm_text cell's result.json, as the training process writes it."""
    return {
        "status": "ok",
        "task": task,
        "seed": seed,
        "config_hash": "x",
        "primary_metric": "perplexity",
        "metrics": {"perplexity": perplexity, "bits_per_byte": 1.0, "loss": 2.0},
        "baselines": {},
        "data": {},
        "steps": 2,
        "wall_time_s": 1.0,
        "parameters": 10,
        "throughput": 1.0,
        "throughput_unit": "tokens/s",
    }


def test_axis_value_with_a_slash_keeps_one_folder_per_cell_and_shows_in_the_summary(tmp_path):
    """A hub dataset name ("Salesforce/wikitext") as an axis value: the cell folder is
    cells/<task>/<variant>/seed<k> (the depth the report reads), and the summary lists the readable label."""
    base = {"task": {"name": "lm_text", "data": {"hf_path": "x"}}}
    path = write_matrix(tmp_path, {"task.data.hf_path": ["Salesforce/wikitext", "roneneldan/TinyStories"]}, base)
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    write_atomic(matrix_dir / "matrix.yaml", path.read_text())
    for perplexity, cell in zip([11.0, 22.0], cells, strict=True):
        cell_dir = cell.directory(matrix_dir)
        assert (
            cell_dir.relative_to(matrix_dir).parts[:2] == ("cells", "lm_text")
            and len(cell_dir.relative_to(matrix_dir).parts) == 4
        )
        cell_command(cell, matrix_dir, path)  # writes cell.json and config.yaml, as before training
        write_json(cell_dir / "result.json", fake_result("lm_text", 0, perplexity))
    assert [c.variant for c in cells] == ["hf_path=Salesforce/wikitext", "hf_path=roneneldan/TinyStories"]
    assert [c.directory(matrix_dir).parent.name for c in cells] == [
        "hf_path=Salesforce%2Fwikitext",
        "hf_path=roneneldan%2FTinyStories",
    ]
    summary = write_report(matrix_dir)
    assert re.search(r"\| hf_path=Salesforce/wikitext \| 11\.0+ ", summary), summary
    assert re.search(r"\| hf_path=roneneldan/TinyStories \| 22\.0+ ", summary), summary


def test_usual_variant_folders_are_unchanged(tmp_path):
    """Folders of labels without unsafe characters stay as they were, so earlier results are reused."""
    path = write_matrix(
        tmp_path, {"model.norm_placement": ["pre"], "optimizer.lr": [0.001], "model.n_kv_heads": [None]}, TINY
    )
    [cell] = load_matrix(path)[1]
    assert cell.directory(Path("r")) == Path("r/cells/lm/norm_placement=pre,lr=0.001,n_kv_heads=None/seed0")


@pytest.mark.parametrize(
    "axes",
    [
        {"task": ["lm", {"name": "lm", "seq_len": 16}]},  # two tasks both labelled lm
        {"model.norm": ["rmsnorm", "rmsnorm"]},  # a repeated axis value
        {"optimizer.lr": [1, "1"]},  # values that print alike
    ],
)
def test_cells_that_would_share_a_folder_are_a_config_error(tmp_path, axes):
    path = write_matrix(tmp_path, axes, TINY)
    with pytest.raises(ConfigError, match="would share the folder cells/lm/"):
        load_matrix(path)


def test_distinct_task_labels_separate_the_cells(tmp_path):
    path = write_matrix(tmp_path, {"task": ["lm", {"name": "lm", "seq_len": 16, "label": "lm16"}]}, TINY)
    assert [c.key for c in load_matrix(path)[1]] == ["lm/default/seed0", "lm16/default/seed0"]


def test_matrix_with_a_bad_cell_fails_before_anything_is_written(tmp_path):
    path = write_matrix(tmp_path, {"model.pos_encoding": ["learned", "sincos2d"]}, TINY)
    with pytest.raises(
        ConfigError, match=r"\[cell model.pos_encoding=sincos2d\]: model.pos_encoding: pos_encoding=sincos2d"
    ):
        load_matrix(path)


# the command line ------------------------------------------------------------------------------


def test_cli_train_with_sincos2d_on_the_lm_exits_2_without_a_traceback(tmp_path):
    results = tmp_path / "results"
    process = blockbench(
        "--results-dir",
        str(results),
        "train",
        "task=lm",
        "model.pos_encoding=sincos2d",
        "trainer.max_steps=1",
        cwd=tmp_path,
        timeout=120,
    )
    assert process.returncode == 2, process.stderr
    assert process.stderr.startswith("blockbench: config error:\n")
    assert "model.pos_encoding: pos_encoding=sincos2d is for the vit family" in process.stderr
    assert "Traceback" not in process.stderr
    assert not results.exists()  # nothing trained, nothing written


# dependency floors -----------------------------------------------------------------------------


def _sdpa_enable_gqa() -> None:
    q, kv = torch.zeros(1, 4, 2, 8), torch.zeros(1, 2, 2, 8)
    torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)


def _fused_adamw_on_cpu() -> None:
    parameter = torch.nn.Parameter(torch.zeros(2))
    parameter.grad = torch.ones(2)
    torch.optim.AdamW([parameter], fused=True).step()


#: the torch APIs the code uses, the release that introduced each, and a probe that uses it
TORCH_APIS = {
    "torch.compiler.set_stance (blockbench/perf.py)": ("2.6", lambda: torch.compiler.set_stance),
    "SDPA enable_gqa (models/attention.py)": ("2.5", _sdpa_enable_gqa),
    "torch.get_autocast_dtype (models/loss.py)": ("2.4", lambda: torch.get_autocast_dtype("cpu")),
    "fused AdamW on CPU (tasks/base.py)": ("2.4", _fused_adamw_on_cpu),
    "torch.nn.attention.sdpa_kernel (models/attention.py)": ("2.3", lambda: torch.nn.attention.sdpa_kernel),
    "torch.compiler.is_compiling (models/attention.py)": ("2.3", lambda: torch.compiler.is_compiling()),
    "nn.Module.compile (models/build.py)": ("2.2", lambda: torch.nn.Module.compile),
}


def _torchdata_stateful_sampler() -> None:
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler  # noqa: F401


#: other packages: the release that introduced what the code uses
OTHER_APIS = {
    "torchdata": ("0.9", _torchdata_stateful_sampler),  # StatefulDistributedSampler (tasks/base.py); 0.8 lacks it
    "torchvision": ("0.21", lambda: None),  # the release built for torch 2.6
}


def pyproject_floors() -> dict[str, Version]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    floors = {}
    for line in project["dependencies"]:
        requirement = Requirement(line)
        minimums = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        if minimums:
            floors[requirement.name] = max(minimums)
    return floors


def test_torch_floor_covers_every_torch_api_the_code_uses():
    needed = max(Version(version) for version, _ in TORCH_APIS.values())
    assert pyproject_floors()["torch"] >= needed, (
        f"pyproject says torch>={pyproject_floors()['torch']}; the code needs {needed}"
    )
    for _, probe in TORCH_APIS.values():
        probe()  # the API exists in the installed torch


@pytest.mark.parametrize("package", OTHER_APIS)
def test_other_floors_cover_the_apis_the_code_uses(package):
    version, probe = OTHER_APIS[package]
    assert pyproject_floors()[package] >= Version(version)
    probe()


def test_an_override_section_is_never_changed_by_building_a_config():
    """A task given as a section (a matrix axis's value) and refined by a dotted override of the same
    cell: building the config must not write the refinement into the caller's section, which other
    cells share."""
    section = {"name": "lm"}
    run = build_run_config({}, {"task": section, "task.eval_split": "tuning"})
    assert run.task.eval_split == "tuning" and section == {"name": "lm"}


def test_blockbench_train_and_the_base_config_share_one_step_budget():
    base = load_yaml(REPO / "configs" / "base.yaml")
    assert TrainerConfig().max_steps == base["trainer"]["max_steps"]
