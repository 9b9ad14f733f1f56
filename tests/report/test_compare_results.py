"""``benchmarks/book/compare_results.py``: two results folders of one matrix compared cell by cell, exactly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import REPO

from blockbench.store.record import CellRecord, write_record


def record(loss: float, commit: str, *, last: float = 2.0) -> CellRecord:
    return CellRecord.model_validate(
        {
            "status": "ok",
            "task": "lm",
            "seed": 0,
            "config_hash": "c" * 16,
            "metrics": {"loss": loss},
            "history": [
                {"step": 2, "time_s": 1.0, "metrics": {"loss": 3.0}},
                {"step": 4, "time_s": 9.9, "metrics": {"loss": last}},
            ],
            "curve": {"every_n_steps": 2, "items": 8, "points": [[0, 4.0], [2, 3.0]]},
            "provenance": {"git": {"commit": commit, "dirty": False}},
        }
    )


def compare(first: Path, second: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "benchmarks.book.compare_results", str(first), str(second)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True)


def test_identical_numbers_pass_whatever_the_timings_and_commits(tmp_path):
    write_record(tmp_path / "a/cells/lm/default/seed0/result.json", record(2.0, "1" * 40))
    same = record(2.0, "2" * 40)
    same.history[0].time_s = 123.0  # timings differ between runs; the numbers must not
    write_record(tmp_path / "b/cells/lm/default/seed0/result.json", same)
    done = compare(tmp_path / "a", tmp_path / "b")
    assert done.returncode == 0, done.stdout
    assert "lm/default/seed0: identical metrics, history and curve (1111111 vs 2222222)" in done.stdout
    assert "1 of 1 cells identical" in done.stdout


def test_a_different_bit_or_a_missing_cell_fails(tmp_path):
    write_record(tmp_path / "a/cells/lm/default/seed0/result.json", record(2.0, "1" * 40))
    write_record(tmp_path / "b/cells/lm/default/seed0/result.json", record(2.0, "1" * 40, last=2.0000000000000004))
    write_record(tmp_path / "a/cells/lm/default/seed1/result.json", record(2.0, "1" * 40))
    done = compare(tmp_path / "a", tmp_path / "b")
    assert done.returncode == 1
    assert "lm/default/seed0: history differs" in done.stdout
    assert "lm/default/seed1: only in" in done.stdout and "0 of 2 cells identical" in done.stdout
