"""The fingerprint lineage: which records of other code count as this code's, in the runner's reuse,
its copies between matrices, its rounds and the summary's header; and ``benchmarks/book/lineage.py``,
which records a step only where a retrained sample is identical bit for bit."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CPU_FP32, REPO, blockbench, write_matrix

from blockbench.matrix.expand import load_matrix
from blockbench.provenance import code_fingerprint
from blockbench.report.results import code_versions, lineage_lines
from blockbench.store.lineage import LINEAGE_FILE, Lineage, LineageFile, Selector, Step
from blockbench.store.record import CellRecord, load_record
from blockbench.store.reuse import ReuseRule, reuse_earlier, trained_elsewhere

KIND = "cpu AVX512, torch 2.14.1, lightning 2.6.6"
OLD, MID, NEW = "a" * 64, "b" * 64, "c" * 64


def record(fingerprint: str = OLD, config_hash: str = "h1", capability: str = "AVX512", **extra) -> CellRecord:
    extra = {"runtime": {"accelerator": "cpu"}, "precision": "32-true", **extra}
    return CellRecord(
        status="ok",
        task="lm",
        config_hash=config_hash,
        code_fingerprint=fingerprint,
        machine=f"AMD EPYC, 2 logical CPUs ({capability}); torch 2.14.1+cu130, lightning 2.6.6",
        provenance={
            "packages": {"torch": "2.14.1", "lightning": "2.6.6"},
            "hardware": {"gpus": []},
            "git": {"commit": "e9ffbeb" + "0" * 33, "dirty": False},
        },
        **extra,
    )


def step(old: str = OLD, new: str = NEW, changed_configs: tuple[str, ...] = (), device: str = KIND) -> Step:
    return Step(
        old=old,
        new=new,
        device=device,
        changed_configs=list(changed_configs),
        sample=["m/cells/lm/default/seed0"],
        command="python -m benchmarks.book.lineage",
        machine="AMD EPYC",
        recorded="2026-11-28T00:00:00+00:00",
    )


def test_the_device_kind_names_the_accelerator_the_vector_extensions_and_the_versions():
    assert record().device_kind == KIND
    assert record(capability="AVX2").device_kind == "cpu AVX2, torch 2.14.1, lightning 2.6.6"
    on_gpu = record(runtime={"accelerator": "gpu"})
    on_gpu.provenance.hardware["gpus"] = ["NVIDIA H200"]
    assert on_gpu.device_kind.startswith("NVIDIA H200 ")
    assert CellRecord.failure("lm", 0, "h", OLD, "boom").device_kind is None


def test_a_step_admits_the_old_codes_cells_on_its_device_kind_outside_the_declared_changes():
    lineage = Lineage((step(changed_configs=("h2",)),))
    assert lineage.route(record(), NEW) == (lineage.steps[0],)
    assert lineage.route(record(NEW), NEW) == ()  # this very code
    assert lineage.route(record(config_hash="h2"), NEW) is None  # declared changed: retrained
    assert lineage.route(record(capability="AVX2"), NEW) is None  # reproduced on another kind only
    assert lineage.route(record(MID), NEW) is None  # other code no step links
    assert lineage.route(record(), MID) is None  # a step to other code
    assert not Lineage().admits(record(), NEW)


def test_steps_chain_and_a_cycle_ends():
    chain = Lineage((step(MID, NEW), step(OLD, MID)))
    assert [s.new for s in chain.route(record(), NEW)] == [MID, NEW]
    cycle = Lineage((step(OLD, MID), step(MID, OLD)))
    assert cycle.route(record(), NEW) is None
    dead_end_first = Lineage((step(OLD, "d" * 64), step(OLD, MID), step(MID, NEW)))
    assert [s.new for s in dead_end_first.route(record(), NEW)] == [MID, NEW]
    shortcut = Lineage((step(OLD, MID), step(MID, NEW), step(OLD, NEW)))
    assert [s.new for s in shortcut.route(record(), NEW)] == [NEW]
    declared_later = Lineage((step(OLD, MID), step(MID, NEW, changed_configs=("h1",))))
    assert declared_later.route(record(), NEW) is None  # a change declared on the second step


def test_a_selector_matches_dotted_config_values_and_a_bad_one_says_how_to_write_it():
    selector = Selector.parse("model.family=encoder_decoder, model.pos_encoding=relative")
    config = {"model": {"family": "encoder_decoder", "pos_encoding": "relative"}, "task": {"name": "translation"}}
    assert selector.matches(config)
    assert not selector.matches({**config, "model": {**config["model"], "pos_encoding": "rope"}})
    assert not selector.matches({"task": {"name": "lm"}})
    assert selector.describe() == "model.family=encoder_decoder,model.pos_encoding=relative"
    with pytest.raises(ValueError, match=re.escape("is not key=value; write e.g. model.pos_encoding=relative")):
        Selector.parse("model.pos_encoding")


def test_the_lineage_file_round_trips_and_a_step_replaces_its_twin(tmp_path):
    Lineage().add(tmp_path, step())
    Lineage.load(tmp_path).add(tmp_path, step(changed_configs=("h9",)))
    Lineage.load(tmp_path).add(tmp_path, step(OLD, MID))
    steps = LineageFile.model_validate_json((tmp_path / LINEAGE_FILE).read_text()).steps
    assert [(s.new, s.changed_configs) for s in steps] == [(NEW, ["h9"]), (MID, [])]


def _cell_with_result(tmp_path: Path, fingerprint: str):
    path = write_matrix(tmp_path, {"seed": [0]})
    _, (cell,) = load_matrix(path)
    cell_dir = tmp_path / "results" / "m" / "cells" / "lm" / "default" / "seed0"
    cell_dir.mkdir(parents=True)
    mine = record(fingerprint, cell.run.config_hash())
    (cell_dir / "result.json").write_text(mine.model_dump_json())
    return cell, cell_dir, mine


def test_the_runner_reuses_copies_and_counts_a_cell_the_lineage_keeps(tmp_path):
    cell, cell_dir, _ = _cell_with_result(tmp_path, OLD)
    lineage = Lineage((step(),))
    reused, message = reuse_earlier(cell_dir, cell.run.config_hash(), NEW, lineage=lineage)
    assert reused and message.startswith("done earlier by code aaaaaaaaaaaa, the same numbers by lineage aaaaaaaa -> ")
    assert reuse_earlier(cell_dir, cell.run.config_hash(), NEW) == (
        False,
        "code changed since its result (fingerprint aaaaaaaaaaaa -> cccccccccccc), retraining",
    )
    assert trained_elsewhere(tmp_path / "results", NEW, lineage) == {(cell.run.config_hash(), CPU_FP32): cell_dir}
    assert trained_elsewhere(tmp_path / "results", NEW) == {}
    assert ReuseRule(NEW, lineage=lineage).counted(cell_dir, cell.run.config_hash(), hardware=CPU_FP32) is not None
    assert ReuseRule(NEW).counted(cell_dir, cell.run.config_hash(), hardware=CPU_FP32) is None
    declared = Lineage((step(changed_configs=(cell.run.config_hash(),)),))
    assert reuse_earlier(cell_dir, cell.run.config_hash(), NEW, lineage=declared)[0] is False


def test_the_summary_header_names_the_lineage_a_cell_rests_on():
    current = code_fingerprint()
    lineage = Lineage((step(OLD, current),))
    assert code_versions([record()], lineage) == ["commit e9ffbeb (clean tree)"]
    assert lineage_lines([record(), record(), record(current)], lineage) == [
        f"2 cells by lineage aaaaaaaa -> {current[:8]} (1 cells identical on {KIND})"
    ]
    assert "stale at this checkout" in code_versions([record()])[0]
    assert lineage_lines([record()], Lineage()) == []


def lineage_script(results: Path, scratch: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "benchmarks.book.lineage", "--results", str(results), "--jobs", "1"]
    return subprocess.run([*command, "--scratch", str(scratch), *args], cwd=REPO, capture_output=True, text=True)


@pytest.mark.slow  # five training processes (about 75 s of CPU); run with -m slow
def test_the_lineage_script_keeps_what_it_reproduces_and_records_nothing_where_a_cell_differs(tmp_path):
    """A tiny two-variant matrix, its cells then marked as made by other code. Both retrain
    identically; post-norm is declared changed, so the step keeps only pre-norm's config, and the
    next matrix run reuses it and retrains post-norm. A copy whose pre-norm metric is one last bit
    off (the sample reused from the first run) gets no step."""
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"], "seed": [0]})
    results, scratch = tmp_path / "results", tmp_path / "scratch"
    done = blockbench("--results-dir", str(results), "matrix", str(path), "--jobs", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    for result in results.rglob("result.json"):
        result.write_text(json.dumps({**json.loads(result.read_text()), "code_fingerprint": OLD}))
    tampered = tmp_path / "tampered"
    shutil.copytree(results, tampered)
    pre_result = tampered / "m/cells/lm/norm_placement=pre/seed0/result.json"
    data = json.loads(pre_result.read_text())
    data["metrics"]["perplexity"] += 1e-9
    pre_result.write_text(json.dumps(data))

    done = lineage_script(results, scratch, "--changed", "model.norm_placement=post")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "m/cells/lm/norm_placement=post/seed0: declared changed, did NOT move" in done.stdout
    (kept,) = Lineage.load(results).steps
    assert (kept.old, kept.new, kept.sample) == (OLD, code_fingerprint(), ["m/cells/lm/norm_placement=pre/seed0"])
    post = load_record(results / "m/cells/lm/norm_placement=post/seed0/result.json")
    assert kept.changed_configs == [post.config_hash]

    differs = lineage_script(tampered, scratch)
    assert differs.returncode == 1
    assert "m/cells/lm/norm_placement=pre/seed0: DIFFERS: metrics" in differs.stdout
    assert "no lineage recorded for aaaaaaaaaaaa" in differs.stdout
    assert not (tampered / LINEAGE_FILE).exists()

    again = blockbench("--results-dir", str(results), "matrix", str(path), "--jobs", "1", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "lm/norm_placement=pre/seed0: training" not in again.stdout
    assert "lm/norm_placement=post/seed0: training" in again.stdout
    assert load_record(results / "m/cells/lm/norm_placement=pre/seed0/result.json").code_fingerprint == OLD
    summary = (results / "m" / "summary.md").read_text()
    assert "Current at this checkout: 1 cell by lineage aaaaaaaa -> " in summary
    assert "stale at this checkout" not in summary
