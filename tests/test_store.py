"""The results store (``blockbench.store``): which earlier record counts for a cell, the copy of a cell
another matrix trained, and which checkpoint a cell would resume from, read without changing anything."""

from __future__ import annotations

import pytest
import torch
from helpers import CPU_FP32, GPU_BF16

from blockbench.cell.callbacks import ResumeState, StepCheckpoint
from blockbench.cell.train import resumable_checkpoint as clear_unresumable
from blockbench.store.checkpoints import LAST_CHECKPOINT, RESUME_STATE, resumable_checkpoint
from blockbench.store.layout import CELL_FILE, CHECKPOINT_DIR, RESULT_FILE
from blockbench.store.record import CellRecord, Hardware, write_record
from blockbench.store.reuse import ReuseRule, copy_cell, trained_elsewhere

MINE, OTHER = "a" * 64, "b" * 64


def test_the_store_reads_the_checkpoint_the_trainer_writes():
    assert (StepCheckpoint.FILE, ResumeState.__qualname__) == (LAST_CHECKPOINT, RESUME_STATE)


def test_a_checkpoint_is_inspected_and_never_removed(tmp_path):
    folder = tmp_path / CHECKPOINT_DIR
    folder.mkdir()
    state = {"config_hash": "h", "code_fingerprint": MINE, "hardware": CPU_FP32.model_dump()}
    torch.save({"global_step": 7, "callbacks": {RESUME_STATE: state}}, folder / LAST_CHECKPOINT)
    resume = resumable_checkpoint(folder, "h", MINE, CPU_FP32)
    assert (resume.checkpoint, resume.step) == (folder / LAST_CHECKPOINT, 7)
    other = resumable_checkpoint(folder, "h", OTHER, CPU_FP32)
    assert other.checkpoint is None and "written by other code" in other.note
    assert resumable_checkpoint(folder, "g", MINE, CPU_FP32).note.startswith(
        f"checkpoint {folder / LAST_CHECKPOINT} (step 7)"
    )
    (folder / LAST_CHECKPOINT).write_bytes(b"cut short")
    assert "could not be loaded" in resumable_checkpoint(folder, "h", MINE, CPU_FP32).error
    assert (folder / LAST_CHECKPOINT).read_bytes() == b"cut short"  # read only: the cell clears it
    assert resumable_checkpoint(tmp_path / "none", "h", MINE, CPU_FP32).checkpoint is None


def test_a_checkpoint_made_on_other_hardware_is_not_resumed_and_the_cell_clears_it(tmp_path):
    """A CPU float32 checkpoint of the same config and code is not resumed by a GPU bf16 run (nor one
    that names no hardware), and the cell's process deletes it, as one of another config."""
    folder = tmp_path / CHECKPOINT_DIR
    folder.mkdir()
    state = {"config_hash": "h", "code_fingerprint": MINE, "hardware": CPU_FP32.model_dump()}
    torch.save({"global_step": 7, "callbacks": {RESUME_STATE: state}}, folder / LAST_CHECKPOINT)
    assert resumable_checkpoint(folder, "h", MINE, CPU_FP32).checkpoint == folder / LAST_CHECKPOINT
    on_gpu = resumable_checkpoint(folder, "h", MINE, GPU_BF16)
    assert on_gpu.checkpoint is None
    assert on_gpu.note == (
        f"checkpoint {folder / LAST_CHECKPOINT} (step 7) is made on cpu at 32-true; "
        "this run resolves cuda at bf16-mixed; starting from step 0"
    )
    at_bf16 = Hardware(device_kind="cpu", precision="bf16-mixed")
    assert resumable_checkpoint(folder, "h", MINE, at_bf16).checkpoint is None
    assert folder.is_dir()  # the store only reads
    assert clear_unresumable(folder, "h", MINE, GPU_BF16).checkpoint is None
    assert not folder.exists()
    folder.mkdir()
    unnamed = {"config_hash": "h", "code_fingerprint": MINE}
    torch.save({"global_step": 7, "callbacks": {RESUME_STATE: unnamed}}, folder / LAST_CHECKPOINT)
    assert "made on unrecorded hardware" in resumable_checkpoint(folder, "h", MINE, CPU_FP32).note


def test_the_trainer_s_resume_state_names_the_hardware_and_refuses_another():
    state = ResumeState("h", MINE, GPU_BF16).state_dict()
    assert state["hardware"] == {"device_kind": "cuda", "precision": "bf16-mixed"}
    ResumeState("h", MINE, GPU_BF16).load_state_dict(state)
    with pytest.raises(ValueError, match=r"checkpoint of hardware .*, not of this run's"):
        ResumeState("h", MINE, CPU_FP32).load_state_dict(state)


def cpu_record(fingerprint: str = OTHER, config_hash: str = "h") -> CellRecord:
    """A finished record as a CPU cell writes it: on ``cpu`` (its runtime) at ``32-true``."""
    return CellRecord(
        status="ok",
        task="lm",
        config_hash=config_hash,
        code_fingerprint=fingerprint,
        precision="32-true",
        runtime={"accelerator": "cpu"},
    )


def test_the_reuse_rule_counts_this_code_s_finished_records_of_the_same_config(tmp_path):
    write_record(tmp_path / RESULT_FILE, cpu_record())
    assert ReuseRule(MINE).counted(tmp_path, "h", hardware=CPU_FP32) is None  # other code
    assert ReuseRule(MINE, reuse_stale=True).counted(tmp_path, "h", hardware=CPU_FP32) is not None
    assert ReuseRule(OTHER).counted(tmp_path, "g", hardware=CPU_FP32) is None  # another config
    assert ReuseRule(OTHER).counted(tmp_path, "h", hardware=CPU_FP32, finished_only=True) is not None
    assert ReuseRule(OTHER, force=True).counted(tmp_path, "h", hardware=CPU_FP32, finished_only=True) is None
    assert ReuseRule(OTHER).reuse(tmp_path, "h", hardware=CPU_FP32) == (True, "done earlier, reusing its result")
    rule = ReuseRule(OTHER, elsewhere={("h", CPU_FP32): tmp_path})
    assert rule.source(tmp_path, "h", hardware=CPU_FP32) is None  # not its own copy


def test_a_result_made_on_other_hardware_is_neither_reused_counted_nor_copied(tmp_path):
    """A committed CPU float32 cell of the same config and code does not count for a run that resolves
    a GPU at bf16, even with --reuse-stale: reused, counted and copied on the CPU only."""
    matrix_cell = tmp_path / "m" / "cells" / "lm" / "default" / "seed0"
    write_record(matrix_cell / RESULT_FILE, cpu_record(MINE))
    for rule in (ReuseRule(MINE), ReuseRule(MINE, reuse_stale=True)):
        assert rule.reuse(matrix_cell, "h", hardware=CPU_FP32) == (True, "done earlier, reusing its result")
        assert rule.reuse(matrix_cell, "h", hardware=GPU_BF16) == (
            False,
            "made on cpu at 32-true; this run resolves cuda at bf16-mixed, retraining",
        )
        assert rule.counted(matrix_cell, "h", hardware=GPU_BF16) is None
        assert rule.counted(matrix_cell, "h", hardware=CPU_FP32) is not None
    elsewhere = trained_elsewhere(tmp_path, MINE)
    assert elsewhere == {("h", CPU_FP32): matrix_cell}
    rule = ReuseRule(MINE, elsewhere=elsewhere)
    assert rule.source(tmp_path / "n", "h", hardware=CPU_FP32) == matrix_cell
    assert rule.source(tmp_path / "n", "h", hardware=GPU_BF16) is None


def test_a_copied_cell_leaves_its_matrix_s_own_files_and_training_state_behind(tmp_path):
    source, copy = tmp_path / "a", tmp_path / "b"
    (source / CHECKPOINT_DIR).mkdir(parents=True)
    for name in (RESULT_FILE, CELL_FILE, "config.yaml"):
        (source / name).write_text(name)
    copy_cell(source, copy)
    assert sorted(p.name for p in copy.iterdir()) == ["config.yaml", RESULT_FILE]
