"""The rewrite of committed records' config hashes (``benchmarks/book/rehash_records.py``): a record
holding a hash an earlier code gave its config gets the whole-config hash, byte for byte otherwise;
a rerun changes nothing; a hash that is none of them stops it before anything is written."""

from __future__ import annotations

import json
import runpy

import pytest
from helpers import REPO

from blockbench.config import build_run_config, load_yaml, to_yaml

SCRIPT = REPO / "benchmarks" / "book" / "rehash_records.py"
#: hashes the earlier code gave configs/base.yaml with each task (computed by that code, not by the script)
EARLIER = {"lm": "ac16a4138e919f5c", "translation": "4d486b8379e148cb", "vit": "9582b417e8e925dd"}
#: the hashes before the generated tasks' harder settings (computed by that code: the whole config, without them)
BEFORE_HARDER = {"lm": "99f5ad4aa5f5c6a6", "translation": "dd3ec965f8cc0a93", "vit": "345f9c7fa758b62a"}


def script():
    return runpy.run_path(str(SCRIPT))


def cell(root, task, recorded):
    run = build_run_config(load_yaml(REPO / "configs" / "base.yaml"), {"task": task})
    folder = root / "m" / "cells" / task / "base" / "seed0"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(to_yaml(run))
    text = json.dumps({"status": "ok", "task": task, "config_hash": recorded, "final": {"x": 0.1}}, indent=2)
    (folder / "result.json").write_text(text)
    return run, folder / "result.json", text


@pytest.mark.parametrize("task", sorted(EARLIER))
def test_the_earlier_hash_is_what_the_script_calls_old(task):
    run = build_run_config(load_yaml(REPO / "configs" / "base.yaml"), {"task": task})
    assert script()["legacy_hash"](run) == EARLIER[task]
    assert script()["legacy_hash"](run, 1) == BEFORE_HARDER[task]


@pytest.mark.parametrize("task", sorted(BEFORE_HARDER))
def test_records_of_either_generation_get_the_new_hash(tmp_path, task):
    run, result, before = cell(tmp_path, task, BEFORE_HARDER[task])
    assert script()["main"]([str(tmp_path)]) == 0
    assert result.read_text() == before.replace(BEFORE_HARDER[task], run.config_hash())
    assert (run.config_hash() == BEFORE_HARDER[task]) == (task == "lm")  # lm gained no setting


def test_a_harder_setting_away_from_its_default_is_no_earlier_config(tmp_path):
    """A vit cell drawing 9 shapes was never made by the earlier code: its hash must not map to one."""
    run = build_run_config(load_yaml(REPO / "configs" / "base.yaml"), {"task": "vit", "task.max_shapes": 9})
    assert script()["legacy_hash"](run, 1) not in BEFORE_HARDER.values()


def test_records_get_the_whole_config_hash_and_nothing_else_changes(tmp_path):
    cells = {task: cell(tmp_path, task, EARLIER[task]) for task in EARLIER}
    old = EARLIER["lm"]
    (tmp_path / "lineage.json").write_text(json.dumps({"steps": [{"changed_configs": [old]}]}))
    assert script()["main"]([str(tmp_path)]) == 0
    for task, (run, result, before) in cells.items():
        assert result.read_text() == before.replace(EARLIER[task], run.config_hash())
    lm_hash = cells["lm"][0].config_hash()
    assert json.loads((tmp_path / "lineage.json").read_text())["steps"][0]["changed_configs"] == [lm_hash]
    snapshot = {path: path.read_text() for path in tmp_path.rglob("*.json")}
    assert script()["main"]([str(tmp_path)]) == 0  # a rerun changes nothing
    assert {path: path.read_text() for path in tmp_path.rglob("*.json")} == snapshot


def test_an_unknown_hash_stops_everything(tmp_path):
    _, good, good_text = cell(tmp_path, "lm", EARLIER["lm"])
    cell(tmp_path, "vit", "0123456789abcdef")
    assert script()["main"]([str(tmp_path)]) == 1
    assert good.read_text() == good_text
