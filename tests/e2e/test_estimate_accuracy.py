"""benchmarks/statistics/estimate_accuracy.py: what it reads from the dry run's and the runner's output (lines
written here by hand, with the ratios computed by hand), and, run on a tiny matrix, the report it prints."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest
from helpers import REPO, TINY_LM, write_matrix


def script():
    return importlib.import_module("benchmarks.statistics.estimate_accuracy")


DRY_RUN = (
    """matrix smoke: 12 cells -> /tmp/x/smoke (dry run: every cell validated, nothing trained)
[1/12] lm/norm_placement=pre/seed0            to run            ~0:07
matrix smoke: 12 cells -> /tmp/x/smoke; about 0:01:16 on this machine with --jobs 2 to train 12 cells
"""
    + """(cells 0:00:50, 2 at a time + before them 0:00:19 + report 0:00:07)
"""
)
TUNED = (
    "about 1:02:03 on this machine with --jobs 2 to train 36 cells (18 tuning, 18 after tuning) (cells 1:00:00); "
    "if needed up to 1:10:05 more, for up to 54 more cells (later tuning rungs, seeds for undecided verdicts)"
)


def test_the_dry_runs_estimate_and_what_later_rounds_may_add_are_read():
    estimate = script()
    assert estimate.parse_estimate(DRY_RUN) == (76.0, None)
    assert estimate.parse_estimate(TUNED) == (3723.0, 4205.0)
    with pytest.raises(ValueError, match="no estimate"):
        estimate.parse_estimate("12 cells to train; no time estimate (nothing measured or timed here yet)")


def test_the_eta_at_a_share_of_the_cells_is_read_against_the_time_that_was_left():
    estimate = script()
    lines = [
        (20.0, "matrix smoke: 4 cells -> /tmp/x, 2 at a time; about 0:01:00 on this machine to train 4 cells"),
        (30.0, "[1/4] lm/a/seed0: ok, perplexity 12.14 in 0:10  |  1/4 trained, 0:10 elapsed, ETA 0:40"),
        (
            41.0,
            "[2/4] lm/a/seed1: ok, perplexity 11.85, no better than the trivial baseline's 12: it did not learn "
            "(a result, not an error) in 0:11  |  2/4 trained, 0:21 elapsed, ETA 0:25",
        ),
        (50.0, "[3/4] lm/b/seed0: ok, perplexity 9 in 0:10  |  3/4 trained, 0:30 elapsed, ETA 0:12"),
        (60.0, "[4/4] lm/b/seed1: ok, perplexity 9 in 0:10  |  4/4 trained, 0:40 elapsed"),
    ]
    points = estimate.parse_progress(lines)
    assert [(p.at, p.done, p.total, p.eta) for p in points] == [
        (30.0, 1, 4, 40.0),
        (41.0, 2, 4, 25.0),
        (50.0, 3, 4, 12.0),
        (60.0, 4, 4, None),
    ]
    # the run ended at 70 s: left at 30 s, 40 s (ETA 40: 1.00); at 41 s, 29 s (25 / 29); at 50 s, 20 s (12 / 20)
    ratios = estimate.eta_ratios(points, 70.0)
    assert {f: (found[0].done, round(found[1], 4)) for f, found in ratios.items()} == {
        0.25: (1, 1.0),
        0.5: (2, round(25 / 29, 4)),
        0.75: (3, 0.6),
    }
    assert estimate.eta_ratios(points[-1:], 70.0) == {0.25: None, 0.5: None, 0.75: None}  # no ETA printed


@pytest.mark.slow  # two matrix commands; run with -m slow
def test_the_benchmark_reports_the_ratios_of_a_tiny_matrix(tmp_path):
    base = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "num_threads": 1}}
    path = write_matrix(tmp_path, {"seed": [0, 1, 2, 3]}, base=base)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.statistics.estimate_accuracy", str(path), "--jobs", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "get_cpu_capability()" in out and "torch " in out and f"blockbench matrix {path} --jobs 2" in out
    assert re.search(r"dry run: estimate \d+ s, itself \d+ s; the run took \d+ s: ratio \*\*\d\.\d\d\*\*", out), out
    for share in ("25%", "50%", "75%"):
        assert re.search(rf"ETA at {share} of the cells \(\d/4 at \d+ s\): \d+ s against \d+ s left", out), out
