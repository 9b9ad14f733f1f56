"""``blockbench matrix --dry-run``: every cell validated, its status read from what is on disk
(done, stale, resumable from step k, failed before, to run), a wall-time estimate from the step
times measured here, and nothing written or trained."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import CPU_FP32, GPU_BF16, TINY_LM, write_matrix

from blockbench.cli import main
from blockbench.config import TrainerConfig
from blockbench.durations import format_duration
from blockbench.matrix.devices import cell_hardware, cells_get_cuda
from blockbench.matrix.estimate.estimator import TimeEstimator
from blockbench.matrix.estimate.timing import (
    AFTER_REPORT_SECONDS,
    REPORT_SECONDS,
    CellTiming,
    makespan,
    report_seconds,
)
from blockbench.matrix.estimate.total import MatrixProgress, cells_seconds, describe_total, later_rungs
from blockbench.matrix.expand import load_matrix
from blockbench.matrix.finish import Reporting
from blockbench.matrix.plan import IF_NEEDED, CellPlan, OtherHardware, plan_cells
from blockbench.matrix.run import MatrixRunner, RunOptions
from blockbench.matrix.schedule import Results
from blockbench.models import ModelConfig
from blockbench.provenance import code_fingerprint
from blockbench.store.layout import CHECKPOINT_DIR, RESULT_FILE, write_json
from blockbench.store.record import HARDWARE_WAYS_OUT, CellRecord, read_record
from blockbench.store.reuse import ReuseRule


def _files(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


#: a fake timing of a tiny LM cell (4 steps, validated at 2 and 4, a loss-curve point at 0-4, no checkpoint
#: at CPU's 50-step interval): 0.5 + 1.5 + 2.0 + 4 x 3.0 + 2 x 2.5 + 5 x 0.2 = 22 s
TIMING = CellTiming(
    process=0.5, build=1.5, fit=2.0, step=3.0, validation=2.5, curve=0.2, checkpoint=0.7, checkpoint_every=50
)


def fake_timer(timed: list, timing: CellTiming = TIMING):
    """A stand-in for ``blockbench.matrix.estimate.timing.cell_timer`` (timings vary here): every run gets ``timing``
    and is listed in ``timed``."""

    def timer(jobs: int):
        def time_them(runs):
            timed.extend(runs)
            return {key: timing for key in runs}, {}

        return time_them

    return timer


def test_dry_run_lists_every_status_with_its_estimate_and_writes_nothing(tmp_path, capsys, monkeypatch):
    timed: list = []
    monkeypatch.setattr("blockbench.matrix.estimate.dry_run.cell_timer", fake_timer(timed))
    monkeypatch.setattr("blockbench.matrix.estimate.dry_run.start_server", lambda: None)
    monkeypatch.setattr("blockbench.walltime.process_age", lambda: 3.0)  # the CLI's start-up: 3 s
    # and its planning no time at all, so the figures below hold on a loaded machine too
    monkeypatch.setattr("blockbench.walltime.WallClock.elapsed", lambda self: 3.0)
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"], "seed": [0, 1, 2]})
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    cell = {c.key: c for c in cells}
    fingerprint = code_fingerprint()

    def record(key: str, **fields) -> None:
        c = cell[key]
        write_json(
            c.directory(matrix_dir) / RESULT_FILE,
            {"status": "ok", "task": "lm", "seed": c.seed, "config_hash": c.run.config_hash(), **fields},
        )

    # pre: seed 0 done by this code in 10 s, seed 1 by other code in 14 s (both 4 steps: 2.5 and 3.5 s a step),
    # seed 2 interrupted at step 2; post: seed 0 failed, seeds 1 and 2 never started
    record("lm/norm_placement=pre/seed0", code_fingerprint=fingerprint, wall_time_s=10.0, steps=4)
    record("lm/norm_placement=pre/seed1", code_fingerprint="0" * 64, wall_time_s=14.0, steps=4)
    checkpoint = cell["lm/norm_placement=pre/seed2"].directory(matrix_dir) / CHECKPOINT_DIR / "last.ckpt"
    checkpoint.parent.mkdir(parents=True)
    torch.save(
        {
            "global_step": 2,
            "callbacks": {
                "ResumeState": {
                    "config_hash": cell["lm/norm_placement=pre/seed2"].run.config_hash(),
                    "code_fingerprint": fingerprint,
                    "hardware": CPU_FP32.model_dump(),  # this machine's: no GPU
                }
            },
        },
        checkpoint,
    )
    record("lm/norm_placement=post/seed0", status="failed", code_fingerprint=fingerprint, error="RuntimeError: boom")
    before = _files(tmp_path)

    assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), "--dry-run", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert _files(tmp_path) == before  # nothing written, the checkpoint kept
    rows = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r"^\[\d/6\] (\S+)\s+(done|stale|resumable|failed before|to run)\s+(~[\d:?]+)?", out, re.M)
    }
    # the estimate of each cell to train: pre, measured, its steps times the median step time of its
    # variant (2.5 and 3.5 -> 3.0 s); post, none of whose cells finished, its timing: 22 s a cell
    assert rows == {
        "lm/norm_placement=pre/seed0": ("done", None),
        "lm/norm_placement=pre/seed1": ("stale", "~0:00:12"),
        "lm/norm_placement=pre/seed2": ("resumable", "~0:00:06"),
        "lm/norm_placement=post/seed0": ("failed before", "~0:00:22"),
        "lm/norm_placement=post/seed1": ("to run", "~0:00:22"),
        "lm/norm_placement=post/seed2": ("to run", "~0:00:22"),
    }, out
    assert "resumes from step 2" in out and "code changed since its result" in out and "RuntimeError: boom" in out
    assert "timing a cell of each of 1 variant(s)" in out and timed == [("lm", "norm_placement=post")]
    # 12 + 6 + 3 x 22 = 84 s of cells one at a time, the 3 s start-up (and planning) before them, the
    # report's 7 s after them
    total = format_duration(3 + 84 + REPORT_SECONDS)
    assert (
        f"about {total} on this machine to train 5 cells (1 resume), 1 reused (cells 0:01:24 + before them 0:00:03 + "
        in out
    )
    assert f"report and exit 0:00:{REPORT_SECONDS:02.0f}" in out and "cells timed here in parts" in out

    # with two jobs the same cells share two slots, in order as each frees: 12 | 6, then 22 after the 6
    # (28), 22 after the 12 (34), 22 after the 28 (50); 3 s before, 7 after
    assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), "--dry-run", "--jobs", "2"]) == 0
    total = format_duration(3 + 50 + REPORT_SECONDS)
    assert (
        f"about {total} on this machine with --jobs 2 to train 5 cells (1 resume), 1 reused (cells 0:00:50, 2 at a time"
        in (capsys.readouterr().out)
    )


@pytest.mark.parametrize("load, busy", [(0.4, False), (1.0, False), (2.6, True)])
def test_a_dry_run_timed_on_a_busy_machine_says_its_estimate_runs_long(tmp_path, capsys, monkeypatch, load, busy):
    """Timings that share two cores with other processes (load above one core) run long, and so does
    the estimate made of them: the dry run says so before it times, with the load and the cores."""
    monkeypatch.setattr("blockbench.matrix.estimate.dry_run.cell_timer", fake_timer([]))
    monkeypatch.setattr("blockbench.matrix.estimate.dry_run.start_server", lambda: None)
    monkeypatch.setattr("blockbench.matrix.estimate.dry_run.cpu_cores", lambda: 2)
    monkeypatch.setattr("os.getloadavg", lambda: (load, 0.0, 0.0))
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"]})
    assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    said = f"this machine is busy (load {load:.1f} over the last minute on 2 CPUs)"
    assert (said in out) is busy, out


def test_dry_run_of_a_new_matrix_times_a_cell_of_each_variant(tmp_path, capsys):
    """The timing itself, end to end: each variant's cell timed in a process of its own, forked from the
    cell server as a cell is, the estimate a whole cell's; nothing written under the results."""
    base = {**TINY_LM, "trainer": {**TINY_LM["trainer"], "num_threads": 1}}
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"]}, base=base)
    assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), "--dry-run", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "timing a cell of each of 2 variant(s)" in out and "not timed" not in out, out
    assert len(re.findall(r"^\[\d/2\] lm/norm_placement=\w+/seed0\s+to run\s+~0:00:0\d", out, re.M)) == 2, out
    assert re.search(
        r"about \d+:\d\d:\d\d on this machine with --jobs 2 to train 2 cells "
        r"\(cells 0:00:\d\d, 2 at a time \+ before them",
        out,
        re.M,
    ), out
    assert "cells timed here in parts: start-up, build, steps, validations, loss curve, checkpoints" in out
    assert not (tmp_path / "results").exists()


def test_the_runner_and_the_dry_run_agree_on_what_is_reused(tmp_path):
    """The plan is the runner's rule: a stale result is reused only with --reuse-stale."""
    path = write_matrix(tmp_path, {"seed": [0]})
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    write_json(
        cells[0].directory(matrix_dir) / RESULT_FILE,
        {
            "status": "ok",
            "task": "lm",
            "config_hash": cells[0].run.config_hash(),
            "code_fingerprint": "0" * 64,
            "wall_time_s": 1.0,
            "steps": 4,
        },
    )
    [strict] = plan_cells(cells, matrix_dir, ReuseRule(code_fingerprint()))
    [lenient] = plan_cells(cells, matrix_dir, ReuseRule(code_fingerprint(), reuse_stale=True))
    [forced] = plan_cells(cells, matrix_dir, ReuseRule(code_fingerprint(), force=True))
    assert (strict.status, strict.trains) == ("stale", True)
    assert (lenient.status, lenient.trains) == ("stale", False)
    assert (forced.status, forced.trains) == ("to run", True)
    estimator = TimeEstimator()
    estimator.add_results(cells, matrix_dir)
    assert estimator.seconds(strict) == 1.0 and estimator.seconds(lenient) == 0.0
    assert json.loads((cells[0].directory(matrix_dir) / RESULT_FILE).read_text())["code_fingerprint"] == "0" * 64


def test_a_run_on_a_gpu_retrains_a_cell_made_on_a_cpu_and_resumes_no_cpu_checkpoint(tmp_path):
    """A committed cell (cpu at 32-true) of the same config and code: reused by a run on a CPU, retrained
    by one whose cells get a GPU (accelerator and precision auto: cuda at bf16-mixed), which also does
    not resume the cell's CPU checkpoint."""
    path = write_matrix(tmp_path, {"seed": [0, 1]})
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    fields = {"status": "ok", "task": "lm", "code_fingerprint": code_fingerprint(), "steps": 4}
    fields |= {"precision": "32-true", "runtime": {"accelerator": "cpu"}}  # as every committed cell
    for cell in cells:
        write_json(cell.directory(matrix_dir) / RESULT_FILE, {**fields, "config_hash": cell.run.config_hash()})
    state = {"config_hash": cells[1].run.config_hash(), "code_fingerprint": code_fingerprint()}
    state["hardware"] = {"device_kind": "cpu", "precision": "32-true"}
    (cells[1].directory(matrix_dir) / RESULT_FILE).unlink()  # interrupted at step 2
    (cells[1].directory(matrix_dir) / CHECKPOINT_DIR).mkdir()
    torch.save(
        {"global_step": 2, "callbacks": {"ResumeState": state}},
        cells[1].directory(matrix_dir) / CHECKPOINT_DIR / "last.ckpt",
    )
    on_cpu = plan_cells(cells, matrix_dir, ReuseRule(code_fingerprint()))
    assert [(p.status, p.trains, p.resume_step) for p in on_cpu] == [("done", False, 0), ("resumable", True, 2)]
    done, resumed = plan_cells(cells, matrix_dir, ReuseRule(code_fingerprint(), reuse_stale=True, cuda=True))
    assert (done.status, done.trains) == ("stale", True)
    assert done.detail == "made on cpu at 32-true; this run resolves cuda at bf16-mixed, retraining"
    assert (resumed.status, resumed.resume_step) == ("to run", 0)
    assert "is made on cpu at 32-true; this run resolves cuda at bf16-mixed; starting from step 0" in resumed.detail
    assert Results(matrix_dir, ReuseRule(code_fingerprint(), cuda=True)).record(cells[0]) is None
    assert Results(matrix_dir, ReuseRule(code_fingerprint())).record(cells[0]) is not None


def test_a_cell_resolves_its_hardware_as_its_process_will():
    """auto: cuda at bf16-mixed where the cells get a GPU, cpu at 32-true where not; an explicit accelerator
    or precision wins; Lightning's short precision names are the full ones."""
    assert cell_hardware(TrainerConfig(), cuda=True) == GPU_BF16
    assert cell_hardware(TrainerConfig(), cuda=False) == CPU_FP32
    assert cell_hardware(TrainerConfig(accelerator="cpu"), cuda=True) == CPU_FP32
    assert cell_hardware(TrainerConfig(precision="32"), cuda=True).describe() == "cuda at 32-true"
    assert cell_hardware(TrainerConfig(accelerator="gpu", precision="bf16"), cuda=True) == GPU_BF16
    assert cells_get_cuda("local", ["0"]) and not cells_get_cuda("local", []) and cells_get_cuda("slurm", [])
    assert not cells_get_cuda("submitit-local", []) and cells_get_cuda("submitit-local", ["0"])


ON = {
    CPU_FP32: {"precision": "32-true", "runtime": {"accelerator": "cpu"}},  # as every committed cell
    GPU_BF16: {"precision": "bf16-mixed", "runtime": {"accelerator": "cuda"}},
}


def write_finished(folder: Path, cell, hardware) -> None:
    """A finished result of ``cell``'s config, by this code, made on ``hardware``, in ``folder``."""
    fields = {"status": "ok", "task": "lm", "code_fingerprint": code_fingerprint(), "steps": 4, "wall_time_s": 1.0}
    write_json(folder / RESULT_FILE, {**fields, **ON[hardware], "config_hash": cell.run.config_hash()})


def test_a_run_on_a_gpu_refuses_a_results_folder_of_cpu_cells_before_any_cell_trains(tmp_path, capsys, monkeypatch):
    """Cells made on a CPU at the paths of a run whose cells get a GPU (two reported seeds, and a tuning
    candidate of the same task) are neither trained over nor seeded beside: the run and its dry run stop
    before anything trains or is written, naming how many cells, their hardware, this run's and the ways out."""
    monkeypatch.setattr("blockbench.matrix.run.cells_get_cuda", lambda launcher, gpus: True)
    monkeypatch.setattr("blockbench.matrix.run.MatrixRunner.prepare", lambda self: pytest.fail("a cell was started"))
    monkeypatch.setattr("blockbench.matrix.estimate.dry_run.cell_timer", fake_timer([]))
    path = write_matrix(tmp_path, {"seed": [0, 1, 2]})
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    for cell in cells[:2]:
        write_finished(cell.directory(matrix_dir), cell, CPU_FP32)
    write_finished(matrix_dir / "tune" / "cells" / "lm" / "default" / "lr=0.01" / "seed1000", cells[0], CPU_FP32)
    before = {name: (matrix_dir / name).read_bytes() for name in _files(matrix_dir)}
    expected = (
        f"{matrix_dir} holds 3 finished cells made on other hardware than this run's (cpu at 32-true: 3 cells "
        "(lm/default/seed0, lm/default/seed1, tune/lm/default/lr=0.01/seed1000)), and this run's cells resolve "
        "cuda at bf16-mixed: "
    )
    for dry_run in (["--dry-run"], []):
        assert main(["--results-dir", str(tmp_path / "results"), "matrix", str(path), *dry_run]) == 2
        err = capsys.readouterr().err
        assert expected in err, err
        assert HARDWARE_WAYS_OUT in err, err  # the ways out, as the report's refusal gives them
        assert {name: (matrix_dir / name).read_bytes() for name in _files(matrix_dir)} == before


def test_a_hardware_axis_puts_the_gpu_cells_in_folders_of_their_own_and_is_not_refused(tmp_path, monkeypatch):
    """With trainer.precision an axis, a run on a GPU has its variants' folders apart from the CPU cells
    the matrix made without it (one per precision, and each resolved to its own hardware): not refused,
    and the CPU cells are left as they were; the matrix without the axis is refused."""
    monkeypatch.setattr("blockbench.matrix.run.cells_get_cuda", lambda launcher, gpus: True)
    plain = write_matrix(tmp_path / "plain", {"seed": [0]})
    _, [on_cpu] = load_matrix(plain)
    matrix_dir = tmp_path / "results" / "m"
    write_finished(on_cpu.directory(matrix_dir), on_cpu, CPU_FP32)
    path = write_matrix(tmp_path, {"trainer.precision": ["32-true", "bf16-mixed"], "seed": [0]})
    _, cells = load_matrix(path)
    folders = {cell.directory(matrix_dir) for cell in cells}
    assert len(folders | {on_cpu.directory(matrix_dir)}) == 3
    assert [cell_hardware(cell.run.trainer, cuda=True).describe() for cell in cells] == [
        "cuda at 32-true",
        "cuda at bf16-mixed",
    ]
    runner = MatrixRunner(path, tmp_path / "results", RunOptions(dry_run=True), Reporting.none())
    assert [plan.status for plan in runner.plan.plans] == ["to run", "to run"]
    assert read_record(on_cpu.directory(matrix_dir) / RESULT_FILE).hardware == CPU_FP32
    with pytest.raises(OtherHardware, match="1 finished cell made on other hardware"):
        MatrixRunner(plain, tmp_path / "results", RunOptions(dry_run=True), Reporting.none())


@pytest.mark.parametrize("cuda, hardware", [(False, CPU_FP32), (True, GPU_BF16)])
def test_a_rerun_and_a_resume_on_the_same_hardware_are_not_refused(tmp_path, monkeypatch, cuda, hardware):
    """A run on the hardware its folder's cells were made on reuses the finished cell and resumes the
    interrupted one, as before; a run on the other hardware is refused."""
    monkeypatch.setattr("blockbench.matrix.run.cells_get_cuda", lambda launcher, gpus: cuda)
    path = write_matrix(tmp_path, {"seed": [0, 1]})
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    write_finished(cells[0].directory(matrix_dir), cells[0], hardware)
    state = {"config_hash": cells[1].run.config_hash(), "code_fingerprint": code_fingerprint()}
    checkpoint = cells[1].directory(matrix_dir) / CHECKPOINT_DIR / "last.ckpt"
    checkpoint.parent.mkdir(parents=True)
    torch.save(
        {"global_step": 2, "callbacks": {"ResumeState": {**state, "hardware": hardware.model_dump()}}}, checkpoint
    )
    runner = MatrixRunner(path, tmp_path / "results", RunOptions(dry_run=True), Reporting.none())
    assert [(p.status, p.trains, p.resume_step) for p in runner.plan.plans] == [
        ("done", False, 0),
        ("resumable", True, 2),
    ]
    monkeypatch.setattr("blockbench.matrix.run.cells_get_cuda", lambda launcher, gpus: not cuda)
    with pytest.raises(OtherHardware, match=f"{hardware.describe()}: 1 cell \\(lm/default/seed0\\)") as refused:
        MatrixRunner(path, tmp_path / "results", RunOptions(dry_run=True), Reporting.none())
    assert str(refused.value).endswith(HARDWARE_WAYS_OUT)  # the ways out the report's refusal gives too


def trained(steps: int) -> CellRecord:
    """The record of a cell that trained ``steps`` steps (all the runner's progress line reads of it)."""
    return CellRecord(status="ok", task="lm", steps=steps)


def test_the_matrix_eta_covers_tasks_none_of_whose_cells_ran_yet(tmp_path):
    """After the first cell the runner has an ETA for the whole matrix: a task that has not run yet
    (and could not be timed) is guessed at the pace of those that have (the smoke matrix printed no ETA
    until its last task)."""
    from helpers import TINY_LM_TASK

    path = write_matrix(
        tmp_path, {"task": [{**TINY_LM_TASK, "label": "a"}, {**TINY_LM_TASK, "label": "b"}], "seed": [0, 1]}
    )
    _, cells = load_matrix(path)
    plans = plan_cells(cells, tmp_path / "results" / "m", ReuseRule(code_fingerprint()))
    progress = MatrixProgress(plans, TimeEstimator(after=5.0), jobs=1)
    assert progress.eta() is None  # nothing measured
    first = plans[0]
    progress.start(first.n)
    progress.started[first.n] -= 8.0  # it took 8 s for its 4 steps: 2 s a step
    progress.finish(first.n, trained(4))
    seconds, source = progress.estimator.estimate(plans[2])  # task b, not run yet
    assert source == "other tasks" and seconds == pytest.approx(8.0, rel=1e-3)
    assert progress.eta() == pytest.approx(3 * 8.0 + 5.0, rel=0.01)  # three cells of 4 steps left, then the report
    assert "1/4 trained" in progress.describe() and ", ETA 0:00:29" in progress.describe()


def test_the_runner_eta_of_a_variant_whose_first_cells_are_training_uses_their_printed_pace(tmp_path):
    """attention_score's runner printed "ETA 13:51" with about 45 min to go: its additive cells were
    training at five times the dot-product pace, and the ETA gave them the dot-product cells' pace. A
    variant none of whose cells finished (nor was timed) but some are training gets the pace their
    train.log shows."""
    from blockbench.store.layout import TRAIN_LOG

    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"], "seed": [0, 1]})
    _, cells = load_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    plans = plan_cells(cells, matrix_dir, ReuseRule(code_fingerprint()))
    estimator = TimeEstimator()
    estimator.add_results(cells, matrix_dir)
    estimator.after = 0.0
    progress = MatrixProgress(plans, estimator, jobs=2)
    pre, post = (
        [p for p in plans if p.cell.variant.endswith("pre")],
        [p for p in plans if p.cell.variant.endswith("post")],
    )
    progress.start(pre[0].n)
    progress.started[pre[0].n] -= 8.0  # 2 s a step, its 4 steps
    progress.finish(pre[0].n, trained(4))
    progress.start(post[0].n)  # training, its log written as a --jobs cell's
    log = post[0].cell.directory(matrix_dir) / TRAIN_LOG
    log.parent.mkdir(parents=True)
    log.write_text("step 1/4 (25%)  loss 3.9  0:12 elapsed, ETA 0:36\n")
    assert estimator.pace(post[1].cell) == (pytest.approx(2.0, rel=1e-3), "same shape")  # one line: no pace yet
    log.write_text(log.read_text() + "step 2/4 (50%)  loss 3.1  val/perplexity 40.2  0:22 elapsed, ETA 0:22\n")
    assert estimator.pace(post[1].cell) == (pytest.approx(10.0), "running")  # (22 - 12) s / (2 - 1) steps
    assert estimator.estimate(post[1], guess=False) is None  # the dry run and the runner still time it
    log.write_bytes(log.read_bytes() + b"a warning in Latin-1: \xe9\n")  # not UTF-8: still read, no error
    assert estimator.estimate(post[1]) == (pytest.approx(40.0), "running")
    os.utime(log, (estimator.started - 60, estimator.started - 60))  # another run's log (--jobs 1 writes none)
    assert estimator.pace(post[1].cell)[1] == "same shape"
    os.utime(log)
    # left: post's running cell (40 s less the ~0 s it has had) in one slot; pre's second (8 s) and then
    # post's second (40 s) in the other, in the order of the queue: 48 s
    assert progress.eta() == pytest.approx(48.0, rel=0.01)
    progress.finish(post[0].n, trained(4))  # a finished cell's own time wins over any log
    assert estimator.estimate(post[1])[1] == "measured"


def cell_like(
    task: str,
    variant: str,
    trainer: TrainerConfig,
    phase: str | None = None,
    candidate: str = "",
    seed: int = 0,
    model: ModelConfig | None = None,
) -> SimpleNamespace:
    """What the estimate reads of a cell (its model's sizes, for the pace of the cells of its shape)."""
    run = SimpleNamespace(trainer=trainer, resolved_model=lambda: model or ModelConfig())
    key = (task, variant, phase, candidate, seed)
    return SimpleNamespace(task=task, variant=variant, run=run, phase=phase, candidate=candidate, seed=seed, key=key)


#: 10 steps validated at 5 and 10, no loss curve, no checkpoint
TEN_STEPS = TrainerConfig(max_steps=10, val_every_n_steps=5, curve_every_n_steps=0, checkpoint_every_n_steps=None)
#: 1 + 2 + 3 + 10 x 0.5 + 2 x 2 = 15 s a cell of TEN_STEPS
TEN_STEP_TIMING = CellTiming(process=1.0, build=2.0, fit=3.0, step=0.5, validation=2.0, curve=9.0, checkpoint=9.0)


def test_a_variant_none_of_whose_cells_ran_is_timed_in_parts_and_scaled_by_what_the_timings_missed():
    """attention_score's dry run gave additive attention the pace of the dot-product cells that had run
    (2.5 min a cell), and its cells took 12; the smoke matrix's dry run timed training steps alone and
    said 0:22 for 2:04. A variant none of whose cells ran is timed as a whole cell (its parts scaled to
    the cell's steps, validations, loss-curve points and checkpoints); once cells with a timing finish,
    the others' timings are scaled by their measured-to-timed ratio (their task's first)."""
    dot, additive = (
        cell_like("lm", "attention_score=dot", TEN_STEPS),
        cell_like("lm", "attention_score=additive", TEN_STEPS),
    )
    vit = cell_like("vit", "attention_score=additive", TEN_STEPS)
    named = {"dot": dot, "additive": additive, "vit": vit}
    plan = {name: CellPlan(n, c, "to run") for n, (name, c) in enumerate(named.items(), 1)}
    estimator = TimeEstimator()
    estimator.add(dot, 30.0, 10)
    estimator.add(dot, 50.0, 10)  # 3 and 5 s a step: median 4
    assert estimator.estimate(plan["dot"]) == (40.0, "measured")
    assert estimator.estimate(plan["additive"]) == (40.0, "same shape")  # a rough guess, where it cannot be timed
    assert estimator.estimate(plan["additive"], guess=False) is None  # so it is timed
    assert estimator.estimate(plan["vit"]) == (40.0, "other tasks")

    timed = []

    def timer(runs):
        timed.extend(runs)
        return {key: TEN_STEP_TIMING for key in runs if key[0] == "lm"}, {("vit", "attention_score=additive"): "boom"}

    assert estimator.time(plan.values(), timer) == ["vit/attention_score=additive: not timed (boom)"]
    assert timed == [("lm", "attention_score=additive"), ("vit", "attention_score=additive")]  # the measured one is not
    assert estimator.estimate(plan["additive"]) == (15.0, "timed")
    # an additive cell finishes in 30 s, twice its timing: the timings of its task, then of every task, double
    estimator.add(additive, 30.0, 10)
    assert estimator.ratio("lm") == 2.0 and estimator.ratio("vit") == 2.0
    estimator.timings[("vit", "attention_score=additive")] = TEN_STEP_TIMING
    assert estimator.estimate(plan["vit"]) == (30.0, "scaled")
    resumed = CellPlan(4, vit, "resumable", resume_step=5)  # 1 + 2 + 3 + 5 x 0.5 + 1 x 2 = 10.5 s, twice
    assert estimator.estimate(resumed) == (21.0, "scaled")


def test_a_variant_none_of_whose_cells_ran_takes_the_pace_of_its_own_rung_not_its_whole_task():
    """A ladder's runner gave its top rung's first post-norm cells the median pace of every pre- and
    post-norm cell of the task that had run (mostly the 2- to 8-layer rungs): 15 min a translation cell
    that took 42, and its ETA jumped by an hour when the first of them finished. A variant with nothing
    measured, timed or training takes the pace of its task's other variants of the same sizes first."""
    deep, shallow = ModelConfig(n_layers=16), ModelConfig(n_layers=2)
    cells = {
        (placement, rung): cell_like("lm", f"norm_placement={placement},rung={rung}", TEN_STEPS, model=model)
        for placement in ("pre", "post")
        for rung, model in (("16x", deep), ("0.25x", shallow))
    }
    estimator = TimeEstimator()
    estimator.add(cells["pre", "16x"], 200.0, 10)  # 20 s a step at 16 layers
    for placement in ("pre", "post"):
        for seconds in (10.0, 10.0):  # 1 s a step at 2 layers, four cells
            estimator.add(cells[placement, "0.25x"], seconds, 10)
    top = CellPlan(1, cells["post", "16x"], "to run")
    assert estimator.estimate(top) == (200.0, "same shape")  # not the task's median, 1 s a step
    other = cell_like("lm", "norm_placement=post,rung=4x", TEN_STEPS, model=ModelConfig(n_layers=8))
    assert estimator.estimate(CellPlan(2, other, "to run")) == (10.0, "other variants")  # no cell of its sizes


def test_the_cells_run_jobs_at_a_time_as_the_queue_hands_them_out_phase_after_phase():
    """The runner's queue: each slot takes the next cell as it frees, the tuning cells before the
    reported ones (a phase's last cell holds up the next phase). Hand-computed schedules."""
    assert makespan([3.0, 3.0, 3.0], jobs=2) == 6.0  # 3 | 3, then 3 after the first
    assert makespan([5.0, 1.0, 1.0, 1.0], jobs=2) == 5.0  # the 1s follow each other beside the 5
    assert makespan([1.0, 1.0, 1.0, 5.0], jobs=2) == 6.0  # 1 | 1, then 1 | 5 from 1 s: the 5 ends at 6
    assert makespan([2.0, 2.0], jobs=2, busy=[4.0]) == 4.0  # one slot busy for 4 s: both 2s run in the other
    assert makespan([], jobs=3, busy=[1.0, 2.5]) == 2.5
    assert makespan([4.0, 6.0], jobs=1) == 10.0
    tune = [cell_like("lm", "v", TEN_STEPS, phase="tune")] * 3
    report = [cell_like("lm", "v", TEN_STEPS)]
    plans = [(CellPlan(n, c, "to run"), 0) for n, c in enumerate(tune + report, 1)]
    # tuning: 10 | 10, then 10: 20 s; the reported cell after it: 30 s (40 / 2 = 20 without the wait)
    assert cells_seconds(plans, [10.0] * 4, jobs=2) == 30.0
    # a second rung of two cells between them: 20 + 10 + 10
    rung = [(CellPlan(n, tune[0], IF_NEEDED), 1) for n in (5, 6)]
    assert cells_seconds(plans[:3] + rung + plans[3:], [10.0] * 6, jobs=2) == 40.0


def tuning_plans(candidates: int, seeds: list[int], planned: int = 0) -> list[CellPlan]:
    """A variant's tuning cells: every candidate at the first seed to run, those at the later seeds if
    needed but ``planned`` of the second seed's to run."""
    plans = []
    for seed in seeds:
        for c in range(candidates):
            cell = cell_like("lm", "v", TEN_STEPS, phase="tune", candidate=f"lr={c}", seed=seed)
            first = seed == seeds[0] or (seed == seeds[1] and c < planned)
            plans.append(
                CellPlan(len(plans) + 1, cell, "to run")
                if first
                else CellPlan(len(plans) + 1, cell, IF_NEEDED, trains=False)
            )
    return plans


def test_the_later_tuning_rungs_count_the_better_half_of_each_rung():
    """Successive halving keeps the better half (rounded up) of a rung for the next: of 3 candidates 2
    train at the second seed; of 5, 3 at the second and 2 at the third (fewer only where some fail)."""
    rungs = later_rungs(tuning_plans(3, [1000, 1001]))
    assert [(plan.n, plan.cell.seed, plan.trains, rung) for plan, rung in rungs] == [
        (4, 1001, True, 1),
        (5, 1001, True, 1),
    ]
    rungs = later_rungs(tuning_plans(5, [1000, 1001, 1002]))
    assert [(plan.cell.seed, rung) for plan, rung in rungs] == [(1001, 1)] * 3 + [(1002, 2)] * 2
    rungs = later_rungs(tuning_plans(5, [1000, 1001, 1002], planned=1))  # one of the second rung planned already
    assert [(plan.cell.seed, rung) for plan, rung in rungs] == [(1001, 1)] * 2 + [(1002, 2)] * 2
    assert later_rungs([CellPlan(1, cell_like("lm", "v", TEN_STEPS), IF_NEEDED, trains=False)]) == []  # a seed


def test_the_runner_eta_counts_the_later_tuning_rungs_until_they_are_planned():
    estimator = TimeEstimator(after=0.0)
    estimator.timings[("lm", "v")] = TEN_STEP_TIMING  # 15 s a cell
    plans = [*tuning_plans(3, [1000, 1001]), CellPlan(7, cell_like("lm", "v", TEN_STEPS), "after tuning")]
    progress = MatrixProgress(plans, estimator, jobs=1)
    assert len(progress.plans) == 4  # the count: what is planned to train
    assert progress.eta() == pytest.approx(6 * 15.0)  # 3 of the first rung, 2 of the second, the reported cell
    second = [CellPlan(n, plan.cell, "to run") for n, plan in zip((8, 9), plans[3:5], strict=True)]
    progress.revise(second)  # the second rung is planned: its cells count, not the expected ones as well
    assert progress.eta() == pytest.approx(6 * 15.0) and len(progress.plans) == 6
    progress.revise([CellPlan(7, cell_like("lm", "v", TEN_STEPS), "to run")])  # tuning ended
    assert progress.expected == []


def test_the_estimate_counts_the_run_before_and_after_its_cells_and_what_later_rounds_may_add(tmp_path):
    """The dry run's total: the run's own seconds before its cells (start-up, cell server, timing), the
    cells (the later tuning rungs among them) and the report after them; apart, what the seeds of later
    rounds would add."""
    estimator = TimeEstimator(before=12.0, after=8.0)
    estimator.timings[("lm", "v")] = TEN_STEP_TIMING  # 15 s a cell
    report = cell_like("lm", "v", TEN_STEPS)
    plans = [*tuning_plans(3, [1000, 1001]), CellPlan(7, report, "after tuning")]
    plans += [CellPlan(8, report, IF_NEEDED, trains=False), CellPlan(9, report, IF_NEEDED, trains=False)]
    text = describe_total(plans, estimator, jobs=2)
    # tuning 15 | 15, then 15 (30 s); its second rung, 2 of the 3 listed, side by side (15 s); the reported
    # cell (15 s): 60 s of cells, 12 before, 8 after: 80 s; later seeds, two side by side: up to +15 s
    assert text.startswith(
        "about 0:01:20 on this machine with --jobs 2 to train 4 cells (3 tuning, 1 after tuning) (cells 0:01:00, "
        "2 at a time, with 2 of later tuning rungs + before them 0:00:12 + report and exit 0:00:08; from cells "
        "timed here in parts"
    ), text
    assert text.endswith(
        "; if needed up to 0:00:15 more, for up to 5 more cells (later tuning rungs, seeds for undecided verdicts)"
    ), text


def test_the_report_time_is_the_earlier_runs_under_the_results_root(tmp_path):
    """A run's report (summary, plots), its index of every matrix and its exit: the median report of the
    earlier runs under the results root, plus the rest, which no run file records; else the default."""
    assert report_seconds(tmp_path) == REPORT_SECONDS
    for name, report in (("a", 2.0), ("b", 6.0), ("c", 3.0)):
        write_json(
            tmp_path / name / "matrix_run.json",
            {"command": "c", "wall_time_s": 9.0, "cells_trained": 1, "wall_time_breakdown": {"report": report}},
        )
    (tmp_path / "d").mkdir()  # a matrix folder without a run file
    assert report_seconds(tmp_path) == pytest.approx(3.0 + AFTER_REPORT_SECONDS)
