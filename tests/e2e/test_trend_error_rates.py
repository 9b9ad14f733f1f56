"""benchmarks/statistics/trend_error_rates.py: its ``--quick`` run on a noise given here (no book read),
every simulated ladder's word agreeing with ``trend.trend`` on typed records, the nulls' false-trend
rates within binomial error of α (the trend decided at α/K where seeds come in rounds), and the markdown
it writes."""

from __future__ import annotations

import math
import re

import pytest

from benchmarks.statistics import trend_error_rates as script


@pytest.fixture
def lm_only(monkeypatch):
    """One task at a noise of θ 0.1, the baseline's 0.05, a reducible loss of 0.1 nats and a failed seed
    at the unigram loss: the simulation without reading a book."""
    noise = script.ThetaNoise("lm", 0.1, 0.12, 20, 0.05, math.log(0.1), math.log(3.42 - 1.89), 1.89)
    monkeypatch.setattr(script, "TASKS", ("lm",))
    monkeypatch.setattr(script, "measure", lambda results, task: noise)


def test_the_quick_run_agrees_with_trend_and_keeps_the_nulls_near_alpha(lm_only, tmp_path):
    out = tmp_path / "trend_error_rates.md"
    script.main(["--quick", "--out", str(out)])
    text = out.read_text()
    assert text.startswith("# The trend rule's error rates") and "python -m benchmarks.statistics" in text
    fixed, rounds = text.split("## Seeds in rounds")
    rows = [line.split(" | ") for line in fixed.splitlines() if line.startswith("| lm | (")]
    assert len(rows) == len(script.scenarios(script.measure(None, "lm")))
    for row in rows:
        agree, checked = row[-1].rstrip(" |").split("/")
        assert agree == checked, row
        reps = int(row[2].replace(",", ""))
        false_trend = float(re.match(r"[\d.]+", row[3]).group())
        if "null" in row[1]:
            assert false_trend <= 0.05 + 3.5 * math.sqrt(0.05 * 0.95 / reps), row
    # seeds in rounds: each plan's nulls keep the trend at α/K near α, and rungs end between the first and last look
    rows = [line.strip("| ").split(" | ") for line in rounds.splitlines() if line.startswith("| lm | (f)")]
    assert len(rows) == len(script.round_scenarios(script.measure(None, "lm"))) * len(script.ROUND_PLANS)
    for row in rows:
        looks = [int(n) for n in row[2].split(", ")]
        reps = int(row[3].replace(",", ""))
        assert looks[0] <= float(row[4]) <= looks[-1], row
        if "null" in row[1]:
            false_trend = float(re.match(r"[\d.]+", row[6]).group())
            assert false_trend <= 0.05 + 3.5 * math.sqrt(0.05 * 0.95 / reps), row
