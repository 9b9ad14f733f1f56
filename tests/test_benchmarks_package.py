"""``benchmarks/`` as a package: the harness's rounds, timing and ratio interval checked on a fake clock
and hand-computed figures, and every module of the package importable as a module, with no
``sys.path`` edit anywhere in it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from helpers import REPO

from benchmarks import harness

BENCHMARKS = REPO / "benchmarks"


class FakeClock:
    """A clock that moves only when a timed call says how long it took."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def call_taking(self, durations: list[float]):
        """A callable whose n-th call takes ``durations[n]`` seconds on this clock."""
        queue = list(durations)

        def call() -> None:
            self.now += queue.pop(0)

        return call


def test_rounds_reverse_the_order_every_other_round():
    assert harness.round_order(["A", "B", "C"], 0) == ["A", "B", "C"]
    assert harness.round_order(["A", "B", "C"], 1) == ["C", "B", "A"]
    assert harness.round_order(["A", "B"], 0, offset=1) == ["B", "A"]  # the next pair starts with the other arm
    assert list(harness.interleaved(3, ["A", "B"])) == [(0, "A"), (0, "B"), (1, "B"), (1, "A"), (2, "A"), (2, "B")]


def test_time_calls_warms_up_untimed_then_times_each_call_until_enough_calls_and_seconds():
    """Warm-up 1 s (untimed), then 0.5, 0.25, 0.25, 0.5 s: at least 2 calls and 1 s takes three calls
    (0.75 s after two); at most 2 calls stops at two; with neither seconds nor a maximum, exactly
    ``min_calls``."""
    clock = FakeClock()
    timed = harness.time_calls(
        clock.call_taking([1.0, 0.5, 0.25, 0.25, 0.5]), warmup=1, min_calls=2, min_seconds=1.0, clock=clock
    )
    assert timed.times == [0.5, 0.25, 0.25] and timed.median == 0.25 and timed.number_per_run == 1
    clock = FakeClock()
    capped = harness.time_calls(
        clock.call_taking([0.5, 0.25, 0.25]), min_calls=2, max_calls=2, min_seconds=10.0, clock=clock
    )
    assert capped.times == [0.5, 0.25]
    clock = FakeClock()
    assert harness.time_calls(clock.call_taking([0.5, 0.25, 1.0]), min_calls=2, clock=clock).times == [0.5, 0.25]


def test_interleaved_rounds_on_a_machine_that_slows_down_give_the_true_ratio():
    """B takes twice A's time; the machine gets slower every round (x1, x2, x3). Each round's ratio is
    still exactly 2, where the plain medians over all rounds would mix rounds of different load."""
    clock = FakeClock()
    seconds = {"A": 1.0, "B": 2.0}
    per_round: dict[str, dict[int, float]] = {"A": {}, "B": {}}
    for round_index, arm in harness.interleaved(3, ["A", "B"]):
        load = 1 + round_index
        call = clock.call_taking([seconds[arm] * load])
        per_round[arm][round_index] = harness.time_calls(call, clock=clock).median
    assert per_round == {"A": {0: 1.0, 1: 2.0, 2: 3.0}, "B": {0: 2.0, 1: 4.0, 2: 6.0}}
    ratio = harness.ratio_interval(per_round["A"], per_round["B"])
    assert ratio.ratio == pytest.approx(2.0) and ratio.rounds == 3


def test_ratio_interval_is_the_t_interval_of_the_log_round_ratios():
    """Round ratios theirs / ours of 2, 4 and 2: in log2, 1, 2 and 1; mean 4/3, SD sqrt(1/3), standard
    error 1/3; t(0.975, 2 dof) = 4.302653, so the log2 interval is 4/3 -+ 1.434218: the ratio
    2^(4/3) = 2.51984 with the interval 2^-0.10088 = 0.93246 to 2^2.76755 = 6.80951, which holds 1."""
    ratio = harness.ratio_interval({0: 10.0, 1: 10.0, 2: 10.0}, {0: 20.0, 1: 40.0, 2: 20.0})
    assert (ratio.ratio, ratio.low, ratio.high) == pytest.approx((2.5198421, 0.9324613, 6.8095096), rel=1e-6)
    assert ratio.rounds == 3 and ratio.verdict == "tie"
    single = harness.ratio_interval({0: 10.0}, {0: 20.0})
    assert (single.ratio, single.low, single.high) == (2.0, None, None)
    with pytest.raises(ValueError, match="no round timed both"):
        harness.ratio_interval({0: 1.0}, {1: 1.0})


def test_the_report_header_names_the_machine_versions_command_and_code():
    machine = harness.machine_facts("cpu", 1, "numpy 2")
    lines = harness.report_header("A title", harness.command_line("benchmarks.speed.jobs", ["--rounds", "1"]), machine)
    text = "\n".join(lines)
    assert lines[0] == "# A title"
    assert "Produced by `python -m benchmarks.speed.jobs --rounds 1` on " in text and "(code: " in text
    assert f"`torch.backends.cpu.get_cpu_capability()` = {machine['cpu_capability']}" in text
    assert f"- Python {machine['python']}, torch {machine['torch']}, lightning " in text and "; numpy 2" in text
    assert harness.command_line("benchmarks/gpu_check.py", ["--quick"]) == "python benchmarks/gpu_check.py --quick"


def modules() -> list[str]:
    """Every module of the benchmarks package, by its dotted name."""
    names = []
    for path in sorted(BENCHMARKS.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_benchmark_imports_as_a_module_of_the_package():
    assert {"benchmarks.harness", "benchmarks.speed.throughput", "benchmarks.gpu_check"} <= set(modules())
    for name in modules():
        importlib.import_module(name)


@pytest.mark.parametrize("path", sorted(BENCHMARKS.rglob("*.py")), ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_no_benchmark_edits_sys_path(path: Path):
    """The scripts run as modules from the repository root, so no code of theirs touches ``sys.path``
    (read from the AST: ``sys.path`` in any expression, ``from sys import path``)."""
    tree = ast.parse(path.read_text())
    touched = [
        node.lineno
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys")
        or (isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names))
    ]
    assert not touched, f"{path.relative_to(REPO)} uses sys.path at lines {touched}"
