"""The results store (``blockbench.store``): which earlier record counts for a cell, the copy of a cell
another matrix trained, and which checkpoint a cell would resume from, read without changing anything."""

from __future__ import annotations

import torch

from blockbench.cell.callbacks import ResumeState, StepCheckpoint
from blockbench.store.checkpoints import LAST_CHECKPOINT, RESUME_STATE, resumable_checkpoint
from blockbench.store.layout import CELL_FILE, CHECKPOINT_DIR, RESULT_FILE
from blockbench.store.record import CellRecord, write_record
from blockbench.store.reuse import ReuseRule, copy_cell

MINE, OTHER = "a" * 64, "b" * 64


def test_the_store_reads_the_checkpoint_the_trainer_writes():
    assert (StepCheckpoint.FILE, ResumeState.__qualname__) == (LAST_CHECKPOINT, RESUME_STATE)


def test_a_checkpoint_is_inspected_and_never_removed(tmp_path):
    folder = tmp_path / CHECKPOINT_DIR
    folder.mkdir()
    state = {"config_hash": "h", "code_fingerprint": MINE}
    torch.save({"global_step": 7, "callbacks": {RESUME_STATE: state}}, folder / LAST_CHECKPOINT)
    resume = resumable_checkpoint(folder, "h", MINE)
    assert (resume.checkpoint, resume.step) == (folder / LAST_CHECKPOINT, 7)
    other = resumable_checkpoint(folder, "h", OTHER)
    assert other.checkpoint is None and "written by other code" in other.note
    assert resumable_checkpoint(folder, "g", MINE).note.startswith(f"checkpoint {folder / LAST_CHECKPOINT} (step 7)")
    (folder / LAST_CHECKPOINT).write_bytes(b"cut short")
    assert "could not be loaded" in resumable_checkpoint(folder, "h", MINE).error
    assert (folder / LAST_CHECKPOINT).read_bytes() == b"cut short"  # read only: the cell clears it
    assert resumable_checkpoint(tmp_path / "none", "h", MINE).checkpoint is None


def test_the_reuse_rule_counts_this_code_s_finished_records_of_the_same_config(tmp_path):
    write_record(tmp_path / RESULT_FILE, CellRecord(status="ok", task="lm", config_hash="h", code_fingerprint=OTHER))
    assert ReuseRule(MINE).counted(tmp_path, "h") is None  # other code
    assert ReuseRule(MINE, reuse_stale=True).counted(tmp_path, "h") is not None
    assert ReuseRule(OTHER).counted(tmp_path, "g") is None  # another config
    assert ReuseRule(OTHER).counted(tmp_path, "h", finished_only=True) is not None
    assert ReuseRule(OTHER, force=True).counted(tmp_path, "h", finished_only=True) is None
    assert ReuseRule(OTHER).reuse(tmp_path, "h") == (True, "done earlier, reusing its result")
    assert ReuseRule(OTHER, elsewhere={"h": tmp_path}).source(tmp_path, "h") is None  # not its own copy


def test_a_copied_cell_leaves_its_matrix_s_own_files_and_training_state_behind(tmp_path):
    source, copy = tmp_path / "a", tmp_path / "b"
    (source / CHECKPOINT_DIR).mkdir(parents=True)
    for name in (RESULT_FILE, CELL_FILE, "config.yaml"):
        (source / name).write_text(name)
    copy_cell(source, copy)
    assert sorted(p.name for p in copy.iterdir()) == ["config.yaml", RESULT_FILE]
