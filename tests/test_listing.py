"""``blockbench list``: every key a config accepts, read back from the printed output.

The expectations come from the pydantic models themselves (walked here independently of
``blockbench.listing``), so a field added without a description, or one the listing misses, fails.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import sys
from collections.abc import Iterator
from typing import Any, get_args

import pytest
import yaml
from helpers import REPO
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from blockbench.cli import main
from blockbench.config import LIGHTNING_FIELDS, RunConfig, TrainerConfig, lightning_choices
from blockbench.models import ALL_REGISTRIES, ModelConfig
from blockbench.models.config import VARIANT_REGISTRIES
from blockbench.tasks import TASK_CONFIGS, TASK_PRESETS, OptimizerConfig
from blockbench.tasks.data.image_sources import IMAGE_SOURCES


def run_list(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["list", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def entries(output: str) -> dict[str, list[str]]:
    """Each key's lines: a key starts at column 0, its details are indented below it."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith(" ") or not line:
            if current and line:
                blocks[current].append(line)
            continue
        key = re.match(r"([a-z_][\w.]*)(?: = |  |$)", line)  # ``key = default  type``, ``key  type`` or ``key``
        current = key[1] if key else None  # not a key: a section title ``model.*: ...``
        if current:
            assert current not in blocks, f"{current} is listed twice"
            blocks[current] = [line]
    return blocks


@pytest.fixture(scope="module")
def listing() -> str:
    """The whole output of ``blockbench list`` (captured without capsys, which is function-scoped)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["list"]) == 0
    return out.getvalue()


def words(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())


def yaml_default(info: FieldInfo) -> Any:
    """A field's default as ``yaml.safe_load`` reads it back from the listing."""
    if info.is_required():
        return "(required)"
    default = info.get_default(call_default_factory=True)
    return list(default) if isinstance(default, tuple) else default


def single(block: list[str]) -> tuple[Any, str, str]:
    """A key outside the tasks: ``key = default  kind`` then its meaning (4 spaces in)."""
    match = re.fullmatch(r"(\S+) = (.*?)  (\S.*)", block[0])
    assert match, f"not 'key = default  type': {block[0]!r}"
    description = [line for line in block[1:] if re.match(r" {4}\S", line)]
    return yaml.safe_load(match[2]), match[3], words(description)


def per_owner(block: list[str], owner: str) -> tuple[Any, str]:
    """A task key: ``    owner, owner = default`` lines (4 spaces in), each group's meaning below (8 in)."""
    for i, line in enumerate(block):
        match = re.fullmatch(r" {4}(\S.*?) = (.*?)(?:  \S.*)?", line)
        if match and owner in match[1].split(", "):
            rest = block[i + 1 :]
            while rest and re.match(r" {4}\S", rest[0]):  # other defaults of the same meaning
                rest = rest[1:]
            description = []
            for later in rest:
                if not re.match(r" {8}\S", later):
                    break
                description.append(later)
            return yaml.safe_load(match[2]), words(description)
    raise AssertionError(f"no default of {owner!r} in:\n" + "\n".join(block))


def choice_rows(block: list[str], indent: int) -> dict[str, str]:
    """``name  description`` rows ``indent`` spaces in, with their wrapped continuation lines."""
    rows: dict[str, list[str]] = {}
    name = None
    for line in block[1:]:
        row = re.fullmatch(rf" {{{indent}}}(\S+)  +(.*)", line)
        if row:
            name = row[1]
            rows[name] = [row[2]]
        elif name and len(line) - len(line.lstrip()) > indent:
            rows[name].append(line)
        else:
            name = None
    return {name: words(lines) for name, lines in rows.items()}


def leaf_fields(
    cls: type[BaseModel], prefix: str, owner: str | None
) -> Iterator[tuple[str, str | None, FieldInfo, bool]]:
    """(dotted key, owner, field, is a union tag) of every value field of ``cls``, nested config
    classes and tagged unions (an image task's ``data``) included: a union is its tag's key (with the
    union field's meaning) plus its members' fields, a member's owner being ``task (tag)``."""
    for name, info in cls.model_fields.items():
        options = get_args(info.annotation) or (info.annotation,)
        members = [o for o in options if inspect.isclass(o) and issubclass(o, BaseModel)]
        if not members:
            yield prefix + name, owner, info, False
        tag = info.discriminator
        if tag is not None:  # one key for the tag, with the union field's meaning
            yield f"{prefix}{name}.{tag}", owner, info, True
        for member in members:
            if tag is None:
                yield from leaf_fields(member, f"{prefix}{name}.", owner)
                continue
            member_owner = f"{owner} ({member.model_fields[tag].default})"
            yield from (
                f for f in leaf_fields(member, f"{prefix}{name}.", member_owner) if f[0] != f"{prefix}{name}.{tag}"
            )


# --------------------------------------------------------------------------- every field


@pytest.mark.parametrize(
    "section, cls", [("model", ModelConfig), ("trainer", TrainerConfig), ("optimizer", OptimizerConfig)]
)
def test_every_field_of_a_section_is_listed_with_its_default_and_meaning(listing, section, cls):
    blocks = entries(listing)
    for name, info in cls.model_fields.items():
        key = f"{section}.{name}"
        assert info.description, f"{cls.__name__}.{name} has no description: add Field(..., description=...)"
        assert key in blocks, f"{key} is missing from `blockbench list`"
        default, _, description = single(blocks[key])
        assert default == yaml_default(info), key
        assert description == words([info.description]), key


def test_the_seed_is_listed(listing):
    info = RunConfig.model_fields["seed"]
    assert info.description
    default, kind, description = single(entries(listing)["seed"])
    assert (default, kind, description) == (0, "int", words([info.description]))


@pytest.mark.parametrize("task", list(TASK_CONFIGS))
def test_every_field_of_a_task_is_listed_with_that_tasks_default_and_meaning(listing, task):
    blocks = entries(listing)
    fields = [f for f in leaf_fields(TASK_CONFIGS[task], "task.", task) if f[0] != "task.name"]
    assert fields
    for key, owner, info, is_tag in fields:
        assert info.description, f"{key} of task {owner} has no description: add Field(..., description=...)"
        assert key in blocks, f"{key} (task {owner}) is missing from `blockbench list`"
        expected = yaml_default(info)
        if is_tag and isinstance(expected, BaseModel):  # a union with a default member: that member's tag
            expected = getattr(expected, info.discriminator)
        default, description = per_owner(blocks[key], owner)
        assert default == expected, f"{key} of {owner}"
        assert description == words([info.description]), f"{key} of {owner}"


# --------------------------------------------------------------------------- attention, MoE and sparsity axes


def test_attention_moe_and_sparsity_knobs_and_an_embedded_tasks_own_knobs(listing):
    blocks = entries(listing)
    expected = {
        "model.n_kv_heads": (None, ["MHA", "MQA", "GQA"]),
        "model.n_experts": (0, ["experts per MoE layer"]),
        "model.moe_top_k": (2, ["experts each token is routed to"]),
        "model.moe_capacity_factor": (1.25, ["capacity"]),
        "model.moe_shared_experts": (0, ["shared", "always-on"]),
        "model.attention_window": (16, ["window of the local pattern"]),
        "model.attention_stride": (8, ["stride"]),
    }
    for key, (default, phrases) in expected.items():
        value, _, description = single(blocks[key])
        assert value == default, key
        assert any(p in description for p in phrases), (key, description)
    assert single(blocks["model.n_kv_heads"])[1] == "int >0 or null"
    assert per_owner(blocks["task.n_probes"], "lm") == (512, "held-out sentences for the agreement accuracy")
    assert per_owner(blocks["task.max_depth"], "lm")[0] == 2
    assert per_owner(blocks["task.data_seed"], "vit")[0] is None  # null: the training seed draws the data
    assert per_owner(blocks["task.seq_len"], "lm")[0] == 64 and per_owner(blocks["task.seq_len"], "lm_text")[0] == 256


# --------------------------------------------------------------------------- names under their key


def test_every_registered_variant_is_listed_under_its_key(listing):
    blocks = entries(listing)
    assert set(ALL_REGISTRIES) <= set(VARIANT_REGISTRIES.values()), "a registry that no model.* key selects from"
    for field, registry in VARIANT_REGISTRIES.items():
        rows = choice_rows(blocks[f"model.{field}"], indent=6)
        assert rows == {entry.name: words([entry.description]) for entry in registry}, field
    assert set(choice_rows(blocks["model.norm_placement"], indent=6)) == {"pre", "post", "sandwich", "deepnorm"}


def test_tasks_and_presets_are_listed_under_task_name(listing):
    block = entries(listing)["task.name"]
    default, _, _ = single(block)
    assert default == RunConfig().task.name
    rows = choice_rows(block, indent=6)
    for name, cfg in TASK_CONFIGS.items():
        assert rows[name] == words([cfg.description])
    for name, preset in TASK_PRESETS.items():
        assert rows[name] == words([f"preset of {preset.task['name']}: {preset.description}"])
    assert set(rows) == set(TASK_CONFIGS) | set(TASK_PRESETS)


def test_image_sources_and_lightning_names_are_listed_under_their_keys(listing):
    blocks = entries(listing)
    assert set(choice_rows(blocks["task.data.source"], indent=10)) == set(IMAGE_SOURCES)
    for field in LIGHTNING_FIELDS:
        text = words(blocks[f"trainer.{field}"])
        listed = text.split("choices: ")[1].split(", ")
        assert listed == lightning_choices(field), field


def test_the_listing_fits_a_100_column_terminal(listing):
    too_wide = [line for line in listing.splitlines() if len(line) > 100]
    assert not too_wide, too_wide


# --------------------------------------------------------------------------- the filter


def test_a_section_filter_shows_that_section_only(capsys, listing):
    code, out, _ = run_list(capsys, "model")
    assert code == 0
    model_keys = {k for k in entries(listing) if k.startswith("model.")}
    assert set(entries(out)) == model_keys
    assert "trainer." not in out and "task.name" not in out
    code, out, _ = run_list(capsys, "task.augment")
    assert set(entries(out)) == {k for k in entries(listing) if k.startswith("task.augment.")} != set()


def test_a_word_filter_shows_the_keys_that_mention_it(capsys, listing):
    code, out, _ = run_list(capsys, "moe")
    keys = set(entries(out))
    assert code == 0
    assert {
        "model.n_experts",
        "model.moe_top_k",
        "model.moe_capacity_factor",
        "model.moe_shared_experts",
        "model.ffn",
    } <= keys
    assert "model.d_model" not in keys and not any(k.startswith(("trainer.", "task.")) for k in keys)
    assert len(out.splitlines()) < len(listing.splitlines()) / 5
    _, out, _ = run_list(capsys, "GQA")  # the meaning is searched too, whatever the case
    assert set(entries(out)) == {"model.n_kv_heads"}


def test_a_filter_that_matches_nothing_says_so(capsys):
    code, out, err = run_list(capsys, "no_such_knob")
    assert code == 1 and out == ""
    assert "no config key matches 'no_such_knob'" in err


def test_the_docs_example_is_the_real_output(capsys):
    page = (REPO / "docs" / "getting-started.md").read_text()
    example = page.split("  $ blockbench list seq_len\n", 1)[1].split("  ```\n", 1)[0]
    _, out, _ = run_list(capsys, "seq_len")
    assert example == "".join(f"  {line}\n" if line else "\n" for line in out.splitlines())


def test_a_reader_that_stops_early_gets_no_traceback(monkeypatch):
    """``blockbench list | head``: the reader closes the pipe before the listing is written, which must
    end quietly with 0, as ``ls | head`` does, not with a BrokenPipeError traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    with open(write_end, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(["list"]) == 0
