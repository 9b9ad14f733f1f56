"""A step-time ratio says what load and which machines its two sides were timed under
(``verdicts.load_mark``, ``verdicts.machine_mark``): a summary line marks a ratio whose sides ran under
different load (the runner's ``load.json`` per cell) or on different machines (a matrix resumed on
another one) as no finding, says plainly where a side's load was not recorded, and adds nothing where
both were alike. No training: every cell is a result.json and load.json written below."""

from __future__ import annotations

import pytest
import yaml
from helpers import ok_result

from blockbench.report.stats import ratio_of_medians
from blockbench.report.summary import write_report
from blockbench.report.verdicts import LOAD_DIFFERENCE, Side, load_mark, machine_mark
from blockbench.store.layout import write_json
from blockbench.store.record import CellLoad, read_load, write_load

PRE, POST = "norm_placement=pre", "norm_placement=post"
#: the step times of the user's case: post-norm cells timed while other work loaded the machine
STEP_MS = {PRE: [100.0, 101.0, 99.0], POST: [660.0, 700.0, 640.0]}
PERPLEXITY = {PRE: [10.0, 10.1, 10.2], POST: [10.05, 10.15, 10.25]}
AMD = "AMD EPYC, 2 logical CPUs (AVX2); torch 2.14.1+cu130, lightning 2.6.6"
INTEL = "Intel(R) Xeon(R) Processor, 2 logical CPUs (AVX512); torch 2.14.1+cu130, lightning 2.6.6"


def _load(other_cores: float, cores: int = 2, wall_s: float = 100.0, cell_cores: float = 1.0) -> CellLoad:
    """A cell's load: ``other_cores`` busy on average with other processes, beside the cell's own."""
    cell = cell_cores * wall_s
    return CellLoad(wall_s=wall_s, cores=cores, machine_cpu_s=cell + other_cores * wall_s, cell_cpu_s=cell)


def _matrix(root, loads: dict[str, list[CellLoad | None]], machines: dict[str, list[str]] | None = None):
    """A matrix of one LM task, pre (the baseline) and post over seeds 0-2, each cell with its step time,
    the machine ``machines`` gives (every cell on :data:`AMD` without it) and, where ``loads`` gives one,
    a load.json."""
    matrix_dir = root / "m"
    index = 0
    for variant in (PRE, POST):
        for seed in range(3):
            cell_dir = matrix_dir / "cells" / "lm" / variant / f"seed{seed}"
            cell = {"index": index, "task": "lm", "task_name": "lm", "variant": variant, "seed": seed}
            write_json(cell_dir / "cell.json", {**cell, "axes": {"task": "lm", "seed": seed}})
            (cell_dir / "config.yaml").write_text(yaml.safe_dump({"model": {"family": "decoder_lm"}}))
            step = STEP_MS[variant][seed]
            metrics = {"perplexity": PERPLEXITY[variant][seed], "loss": 2.0}
            machine = machines[variant][seed] if machines else AMD
            timing = {"performance": {"step_time_ms": {"median": step, "mean": step}}, "machine": machine}
            write_json(cell_dir / "result.json", ok_result("lm", seed, metrics, {"perplexity": 30.0}, **timing))
            if loads[variant][seed] is not None:
                write_load(cell_dir, loads[variant][seed])
            index += 1
    matrix = {"name": "m", "axes": {"task": ["lm"]}, "margins": {"lm": {"perplexity": 0.1}}, "baseline_variant": PRE}
    (matrix_dir / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    return matrix_dir


def _lm_line(matrix_dir) -> str:
    return next(x for x in write_report(matrix_dir).splitlines() if x.startswith("- lm (LM)"))


def _ratio_text() -> str:
    ratio = ratio_of_medians(STEP_MS[POST], STEP_MS[PRE])
    assert ratio.value == pytest.approx(660.0 / 100.0)
    return f"step time ×{ratio.value:.2f} [{ratio.interval[0]:.2f}, {ratio.interval[1]:.2f}] over 3 vs 3 finished seeds"


def test_a_ratio_timed_under_different_load_is_marked_as_no_finding(tmp_path):
    """The post cells ran while other processes kept 0.9 of the 2 cores busy (45% of the machine), the pre
    cells beside 0.1 (5%): 0.40 apart, past the threshold of 0.1, so the ×6.60 is the machine's, not the
    design's."""
    loads = {PRE: [_load(0.1), _load(0.1), _load(0.15)], POST: [_load(0.9), _load(0.8), _load(0.9)]}
    line = _lm_line(_matrix(tmp_path, loads))
    assert line.endswith(
        f"; {_ratio_text()}, timed under different load (other processes: 0.9 vs 0.1 of 2 cores): not a finding"
    )
    assert "a tie" not in line


def test_a_ratio_timed_under_the_same_load_is_stated_as_it_is(tmp_path):
    """0.1 vs 0.15 of 2 cores (5% vs 7.5% of the machine) is alike: the ratio stands, unmarked."""
    loads = {PRE: [_load(0.1)] * 3, POST: [_load(0.15)] * 3}
    line = _lm_line(_matrix(tmp_path, loads))
    assert line.endswith(f"; {_ratio_text()}")
    assert "load" not in line.rsplit("; ", 1)[1]


def test_a_side_with_a_cell_without_a_load_record_says_so(tmp_path):
    """One post cell has no load.json (a cell trained before the runner recorded load): the side's load is
    not known, and the line says so rather than calling it alike."""
    loads = {PRE: [_load(0.1)] * 3, POST: [_load(0.1), None, _load(0.1)]}
    line = _lm_line(_matrix(tmp_path, loads))
    assert line.endswith(f"; {_ratio_text()}, load not recorded")


def test_a_ratio_timed_on_different_machines_is_marked_as_no_finding(tmp_path):
    """The post cells were trained after the run resumed on another machine, under the same light load: a
    CPU model moves a step time by more than a design does, so the ×6.60 is not a finding, and the line
    counts each machine's seeds per side. One machine on both sides leaves the ratio as it is."""
    loads = {PRE: [_load(0.1)] * 3, POST: [_load(0.1)] * 3}
    line = _lm_line(_matrix(tmp_path / "two", loads, {PRE: [AMD] * 3, POST: [INTEL] * 3}))
    assert line.endswith(
        f"; {_ratio_text()}, timed on different machines (AMD EPYC: 0 vs 3; Intel(R) Xeon(R) Processor: 3 vs 0)"
        ": not a finding"
    )
    line = _lm_line(_matrix(tmp_path / "one", loads, {PRE: [INTEL] * 3, POST: [INTEL] * 3}))
    assert line.endswith(f"; {_ratio_text()}")


def test_the_machine_mark_names_machines_in_full_only_where_their_cpus_agree():
    """Two sides on one CPU model that torch ran with other vector extensions are two machines too, named
    in full since their CPU names agree; seeds without a recorded machine are not counted."""
    avx512 = AMD.replace("AVX2", "AVX512")

    def side(*machines: str | None) -> Side:
        return Side(len(machines), 0, (100.0,) * len(machines), machines=machines)

    assert machine_mark(side(AMD, AMD), side(AMD, None)) == ""
    assert machine_mark(side(AMD, avx512), side(AMD, AMD)) == (
        f"timed on different machines ({AMD}: 1 vs 2; {avx512}: 1 vs 0): not a finding"
    )


def test_the_mark_compares_the_median_share_of_the_machine_against_the_threshold():
    """Each side's load is the median over its timed seeds of the share of the machine's cores other
    processes took (a single loaded seed moves neither a median step time nor this); the sides differ
    where the medians are more than ``LOAD_DIFFERENCE`` (0.1) apart, by hand: 4 cores, 0.2 vs 0.58 busy
    is 0.05 vs 0.145 of the machine, 0.095 apart (alike); 0.2 vs 0.7 is 0.05 vs 0.175 (marked)."""
    assert LOAD_DIFFERENCE == 0.1

    def side(*other_cores: float) -> Side:
        return Side(3, 0, (100.0,) * len(other_cores), 0, tuple(_load(c, cores=4) for c in other_cores))

    assert _load(0.58, cores=4).other_share == pytest.approx(0.145)
    assert load_mark(side(0.58, 0.58, 0.58), side(0.2, 0.2, 0.2)) == ""
    assert load_mark(side(0.7, 0.7, 0.7), side(0.2, 0.2, 0.2)) == (
        "timed under different load (other processes: 0.7 vs 0.2 of 4 cores): not a finding"
    )
    # one loaded seed of three: the median is unmoved, as is the median step time
    assert load_mark(side(3.0, 0.2, 0.2), side(0.2, 0.2, 0.2)) == ""
    assert load_mark(Side(3, 0, (100.0,) * 3), side(0.2, 0.2, 0.2)) == "load not recorded"


def test_a_load_record_round_trips_and_a_missing_one_reads_as_none(tmp_path):
    load = _load(0.5)
    write_load(tmp_path, load)
    assert read_load(tmp_path) == load and read_load(tmp_path / "elsewhere") is None
    assert (load.other_cpu_s, load.other_cores, load.other_share) == pytest.approx((50.0, 0.5, 0.25))
