"""``blockbench report --tensorboard``: TensorBoard runs written from the cells' records, read back
with TensorBoard's own ``EventAccumulator`` against values and times worked out by hand from a
record written here; the run names and HParams rows of the committed book against those its live
runs recorded; reruns that replace and never duplicate; live runs left alone. (That a rebuilt run
reads as the live run of the same cell: ``tests/cell/test_tensorboard.py``, on a trained matrix.)"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, hparams_session, tensorboard_events, write_matrix
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.hparams import api_pb2, metadata
from torch.utils.tensorboard import SummaryWriter

from blockbench import cli
from blockbench.config import ConfigError
from blockbench.matrix.expand import expand_matrix
from blockbench.matrix.jobs import write_cell_file
from blockbench.store.layout import CELL_FILE, RESULT_FILE, cell_directory, write_json
from blockbench.store.record import CellRecord, load_record, write_record
from blockbench.store.tbruns import earlier_run_path
from blockbench.tensorboard.rebuild import REBUILT_MARK, matrix_cells, rebuild_matrix, run_names, write_tensorboard

#: the result.json's modification time, and so (less the wall time of 11 s) the run's start
WRITTEN_AT = 1_700_000_011.0
START = WRITTEN_AT - 11.0

RECORD = {
    "status": "ok",
    "task": "lm",
    "seed": 0,
    "metrics": {"perplexity": 8.0, "loss": 2.125},
    "primary_metric": "perplexity",
    "steps": 20,
    "wall_time_s": 11.0,
    "throughput": 1000.0,
    "throughput_unit": "tokens/s",
    "performance": {
        "step_time_ms": {"median": 12.5},
        "timed_steps": 20,
        "achieved_tflops": 0.5,
        "mfu": 0.25,
        "data_wait_fraction": 0.125,
    },
    "peak_memory": {"cpu_rss_mb": 300.0},
    "history": [
        {"step": 10, "time_s": 5.0, "metrics": {"perplexity": 9.0, "loss": 2.25, "lens/layer0": 3.0}},
        {"step": 20, "time_s": 9.0, "metrics": {"perplexity": 8.0, "loss": 2.125, "lens/layer0": 2.75}},
    ],
    "curve": {"every_n_steps": 5, "items": 16, "points": [[0, 4.0], [5, 3.0], [10, 2.5], [15, 2.25], [20, 2.125]]},
}


def write_cell(matrix_dir: Path, variant: str, seed: int = 0, record: dict[str, Any] = RECORD, **cell: Any) -> Path:
    """A cell folder as the runner leaves it (cell.json, result.json), of an LM matrix over
    ``model.norm_placement``; its result.json written at :data:`WRITTEN_AT`."""
    folder = cell_directory(matrix_dir, "lm", f"norm_placement={variant}", seed)
    info = {
        "index": cell.pop("index", 0),
        "task": "lm",
        "task_name": "lm",
        "variant": f"norm_placement={variant}",
        "seed": seed,
        "axes": {"task": "lm", "model.norm_placement": variant, "seed": seed},
        **cell,
    }
    write_json(folder / CELL_FILE, info)
    write_record(folder / RESULT_FILE, CellRecord.model_validate({**record, "seed": seed}))
    os.utime(folder / RESULT_FILE, (WRITTEN_AT, WRITTEN_AT))
    return folder


def points(events, tag: str) -> list[tuple[int, float, float]]:
    """(step, value, seconds after the run's start) of each point of ``tag``."""
    return [(e.step, e.value, e.wall_time - START) for e in events.Scalars(tag)]


def test_validations_curve_and_final_figures_are_the_records(tmp_path: Path) -> None:
    matrix_dir = tmp_path / "m"
    write_cell(matrix_dir, "pre", index=0)
    write_cell(matrix_dir, "post", index=1)
    done = rebuild_matrix(matrix_dir)
    assert done.written == ["tb/lm/pre/seed0", "tb/lm/post/seed0"] and not done.live and done.bytes > 0
    run_dir = matrix_dir / "tb" / "lm" / "pre" / "seed0"
    [event_file] = run_dir.iterdir()
    assert event_file.name == f"events.out.tfevents.{int(START)}.{REBUILT_MARK}"
    events = tensorboard_events(run_dir)
    # each validation at its step, value and time_s after the start
    assert points(events, "0_main/lm/perplexity") == [(10, 9.0, 5.0), (20, 8.0, 9.0)]  # the headline metric
    assert points(events, "1_val/lm/loss") == [(10, 2.25, 5.0), (20, 2.125, 9.0)]
    assert points(events, "1_val/lm/lens/layer0") == [(10, 3.0, 5.0), (20, 2.75, 9.0)]
    # the curve's times interpolated by step between (0, 0 s), (10, 5 s) and (20, 9 s)
    assert points(events, "0_main/lm/curve_loss") == [
        (0, 4.0, 0.0),
        (5, 3.0, 2.5),
        (10, 2.5, 5.0),
        (15, 2.25, 7.0),
        (20, 2.125, 9.0),
    ]
    # the final figures at the last step, when the run ended (wall_time_s), the primary metric once more
    finals = {tag: points(events, tag) for tag in events.Tags()["scalars"] if tag.startswith("z_final/")}
    at_end = {
        "z_final/val/perplexity": 8.0,
        "z_final/val/loss": 2.125,
        "z_final/primary_metric": 8.0,
        "z_final/perf/step_time_ms": 12.5,
        "z_final/perf/tokens_per_sec": 1000.0,
        "z_final/perf/tflops_per_sec": 0.5,
        "z_final/perf/mfu": 0.25,
        "z_final/perf/data_wait_fraction": 0.125,
        "z_final/perf/peak_memory_mb": 300.0,
    }
    assert finals == {tag: [(20, value, 11.0)] for tag, value in at_end.items()}
    # the HParams row: the cell's axes as text, its status, named after its run, started and ended as it did
    session = hparams_session(run_dir)
    assert {name: value.string_value for name, value in session.hparams.items()} == {
        "task": "lm",
        "model.norm_placement": "pre",
        "seed": "0",
        "status": "ok",
    }
    assert session.group_name == "pre/seed0" and session.start_time_secs == START  # the run's name in tb/lm
    content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS and end.end_time_secs == START + 11.0
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    columns = {info.name.tag: info.display_name for info in experiment.metric_infos}
    assert (
        columns["z_final/val/perplexity"] == "perplexity ↓"
        and columns["z_final/val/agreement_acc"] == "agreement_acc ↑"
    )
    hparam_values = {info.name: list(info.domain_discrete) for info in experiment.hparam_infos}
    assert hparam_values["model.norm_placement"] == ["post", "pre"]


def test_a_diverged_cell_shows_its_non_finite_points_and_no_final_metrics(tmp_path: Path) -> None:
    diverged = {
        **RECORD,
        "status": "diverged",
        "metrics": {},
        "diverged_at_step": 20,
        "history": [RECORD["history"][0], {"step": 20, "time_s": 9.0, "metrics": {"perplexity": None, "loss": None}}],
    }
    matrix = tmp_path / "m"
    write_cell(matrix, "post", record=diverged)
    rebuild_matrix(matrix)
    run_dir = matrix / "tb" / "lm" / "post" / "seed0"
    events = tensorboard_events(run_dir)
    [(first, nine, _), (last, value, _)] = points(events, "0_main/lm/perplexity")
    assert (first, nine, last) == (10, 9.0, 20) and math.isnan(value)  # as the live run logged it
    finals = [
        tag for tag in events.Tags()["scalars"] if tag.startswith("z_final/val/") or tag.endswith("primary_metric")
    ]
    assert not finals  # the table shows no value rather than the curve's last
    assert hparams_session(run_dir).hparams["status"].string_value == "diverged"
    content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_FAILURE


def event_count(run_dir: Path) -> int:
    return sum(1 for path in run_dir.glob("*tfevents*") for _ in EventFileLoader(str(path)).Load())


def test_a_rerun_replaces_the_rebuilt_run_and_never_duplicates_it(tmp_path: Path) -> None:
    matrix_dir = tmp_path / "m"
    result = write_cell(matrix_dir, "pre") / RESULT_FILE
    rebuild_matrix(matrix_dir)
    run_dir = matrix_dir / "tb" / "lm" / "pre" / "seed0"
    [first] = run_dir.iterdir()
    content, count = first.read_bytes(), event_count(run_dir)
    rebuild_matrix(matrix_dir)
    assert list(run_dir.iterdir()) == [first] and first.read_bytes() == content  # the same file, the same events
    # a record written later (a later start): the new file replaces the old one
    os.utime(result, (WRITTEN_AT + 100, WRITTEN_AT + 100))
    rebuild_matrix(matrix_dir)
    [again] = run_dir.iterdir()
    assert again != first and event_count(run_dir) == count
    assert [e.step for e in tensorboard_events(run_dir).Scalars("0_main/lm/perplexity")] == [10, 20]


def test_a_live_run_is_left_as_it_is(tmp_path: Path) -> None:
    """A run folder holding a live run's event file (a cell trained here) is never written to."""
    matrix_dir = tmp_path / "m"
    write_cell(matrix_dir, "pre", index=0)
    write_cell(matrix_dir, "post", index=1)
    live_dir = matrix_dir / "tb" / "lm" / "pre" / "seed0"
    writer = SummaryWriter(str(live_dir))
    writer.add_scalar("0_main/lm/perplexity", 7.0, 30)
    writer.close()
    [live_file] = live_dir.iterdir()
    before = live_file.read_bytes()
    done = rebuild_matrix(matrix_dir)
    assert done.live == ["tb/lm/pre/seed0"] and done.written == ["tb/lm/post/seed0"]
    assert list(live_dir.iterdir()) == [live_file] and live_file.read_bytes() == before
    assert "1 live runs kept" in done.describe()


def test_a_results_root_rebuilds_every_matrix_and_the_command_says_where(tmp_path: Path, capsys) -> None:
    root = tmp_path / "results"
    write_cell(root / "a", "pre")
    write_cell(root / "b", "post")
    (root / "notes").mkdir()  # a folder without cells/ is no matrix
    assert cli.main(["report", str(root), "--tensorboard"]) == 0
    out = capsys.readouterr().out
    assert f"{root / 'a'}: 1 runs rebuilt" in out and f"{root / 'b'}: 1 runs rebuilt" in out
    assert f"tensorboard --logdir {root / '<matrix>' / 'tb' / '<task>'}" in out
    assert (root / "a" / "tb" / "lm" / "pre" / "seed0").is_dir() and (
        root / "b" / "tb" / "lm" / "post" / "seed0"
    ).is_dir()
    assert f"tensorboard --logdir {root / 'a' / 'tb' / 'lm'}" in write_tensorboard(root / "a")
    with pytest.raises(ConfigError, match="neither a matrix results folder"):
        write_tensorboard(root / "notes")


def test_tuning_cells_get_their_runs_in_a_log_folder_of_their_own(tmp_path: Path) -> None:
    matrix_dir = tmp_path / "m"
    tuned = {"phase": "report", "tuned": {"optimizer.lr": 0.001}}
    write_cell(matrix_dir, "pre", **tuned)
    tuning_dir = matrix_dir / "tune" / "cells" / "lm" / "norm_placement=pre" / "lr=0.003" / "seed1000"
    write_json(
        tuning_dir / CELL_FILE,
        {
            "index": 0,
            "task": "lm",
            "task_name": "lm",
            "variant": "norm_placement=pre",
            "seed": 1000,
            "axes": {"task": "lm", "model.norm_placement": "pre", "seed": 1000},
            "phase": "tune",
            "tuned": {"optimizer.lr": 0.003},
        },
    )
    write_record(tuning_dir / RESULT_FILE, CellRecord.model_validate({**RECORD, "seed": 1000}))
    done = rebuild_matrix(matrix_dir)
    assert done.written == ["tb/lm/pre/seed0", "tb_tune/lm/pre/lr=0.003/seed1000"]
    assert done.logdirs == ["tb/lm", "tb_tune/lm"]  # outside tb/, so tb/lm holds no tuning run
    session = hparams_session(matrix_dir / "tb_tune" / "lm" / "pre" / "lr=0.003" / "seed1000")
    assert session.hparams["phase"].string_value == "tune" and session.hparams["optimizer.lr"].string_value == "0.003"
    assert session.group_name == "pre/lr=0.003/seed1000"


def test_a_run_is_rebuilt_where_its_live_writer_put_it_while_seed_rounds_are_open(tmp_path: Path) -> None:
    """The runner splits a task's log folder by every cell the matrix file may train: 2 variants x 24
    seeds are 48 runs, more than one folder holds, so each variant gets a part (``tb/lm_1of2``,
    ``tb/lm_2of2``). With only the first round's 3 seeds a side finished, the records alone would fit
    in one folder (``tb/lm``); the rebuild puts each run where the cell's cell.json says it was written."""
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"]})
    matrix = yaml.safe_load(path.read_text()) | {"seeds": {"min": 3, "max": 24, "step": 3}}
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    matrix_dir = tmp_path / "results" / "m"
    first_round = [cell for cell in expand_matrix(path).cells if cell.seed % 1000 < 3]
    for cell in first_round:
        write_cell_file(cell, matrix_dir, path)
        write_record(cell.directory(matrix_dir) / RESULT_FILE, CellRecord.model_validate({**RECORD, "seed": cell.seed}))
    assert len(first_round) == 6 and {cell.tb.logdir for cell in first_round} == {"tb/lm_1of2", "tb/lm_2of2"}
    done = rebuild_matrix(matrix_dir)
    assert sorted(done.written) == sorted(cell.tb.path for cell in first_round)


def split_parts(one: str, other: str) -> bool:
    """Whether two log folders are one task's, one or both of them a part of its split folder
    (``tb/lm`` and ``tb/lm_1of2``, ``tb/lm_1of3`` and ``tb/lm_2of2``)."""
    whole = [re.sub(r"_\d+of\d+$", "", folder) for folder in (one, other)]
    return whole[0] == whole[1] and one != other


def test_the_committed_books_runs_are_named_as_its_live_runs_were() -> None:
    """Each committed record's provenance holds the command that trained it, with the run its live
    writer used (``--tb-name``, ``--tb-version``) and the HParams row (``--hparams``): the rebuild
    names every cell's run and row the same (tuning cells included), in the log folder each run has
    moved to since (a folder per task; tuning runs from ``tb/tune/<task>`` to ``tb_tune/<task>``). The
    committed cell.json files record no run (their version did not), so the rebuild names them from the
    cells with a record. A task with more runs than one folder holds is split into parts
    (``tb/<task>_1of2``): the runner splits by every cell its matrix file may train (every seed of
    ``seeds:``), the rebuild by the cells with a record, so while seed rounds are open a run may sit in
    another part of its task's folder (the rebuild leaves a live run where it is). A tuning run whose
    variant has no reported record yet is named by the variant's folder name (``run_names``), the rest
    of its name the same. A cell copied from another matrix that trained the same config
    (``blockbench.matrix.plan.copy_cell``: attention_score's dot-product cells are the flagship's
    pre-norm ones) was trained under that matrix's names, which its command keeps (``--out``); the
    rebuild names it by this matrix's, and its source is in the book."""
    checked = copied = 0
    for matrix_dir in sorted(path.parent for path in (REPO / "results").glob("*/cells")):
        reported, tuning, _ = matrix_cells(matrix_dir)
        reported_variants = {(cell.task, cell.cell.variant) for cell in reported}
        for cell, run in run_names(reported, tuning):
            command = cell.record.provenance.command
            source_matrix, source_cell = re.search(r"--out \S*?([^/\s]+)/((?:tune/)?cells/\S+)", command).groups()
            if source_matrix != matrix_dir.name:
                source = load_record(REPO / "results" / source_matrix / source_cell / "result.json")
                assert source.config_hash == cell.record.config_hash, cell.result
                copied += 1
                continue
            tb_dir, name, version = re.search(r"--tb-dir (\S+) --tb-name (\S+) --tb-version (\S+)", command).groups()
            logdir = tb_dir.split(f"/{source_matrix}/", 1)[1]  # tb (every run in one folder), or tb/lm
            trained_at = f"{logdir}/{name}/{version}"  # relative to the matrix folder
            tuning = trained_at.startswith("tb/tune/")
            moved = f"tb_tune/{trained_at.removeprefix('tb/tune/')}" if tuning else trained_at
            if run.path != moved:  # a matrix with cells still to run: see the docstring
                root, folder, moved_name = moved.split("/", 2)
                assert split_parts(run.logdir, f"{root}/{folder}") or run.logdir == f"{root}/{folder}", cell.result
                unreported = root == "tb_tune" and (cell.task, cell.cell.variant) not in reported_variants
                assert run.name == moved_name or (
                    unreported and run.name.split("/", 1)[1] == moved_name.split("/", 1)[1]
                ), cell.result
            elif trained_at != run.path:  # trained where an earlier layout put it: the rebuild moves it
                assert earlier_run_path(cell.task, run) == trained_at, cell.result
            hparams = json.loads(re.search(r"--hparams (\{.*?\}) --", command)[1])
            assert cell.hparams == hparams, cell.result
            checked += 1
    assert checked >= 400 and copied >= 1  # the book's cells, tuning cells included


def test_a_run_holds_only_its_own_event_file(tmp_path: Path) -> None:
    """No half-written file is left where TensorBoard reads: the file is complete before it gets its name."""
    matrix_dir = tmp_path / "m"
    write_cell(matrix_dir, "pre")
    rebuild_matrix(matrix_dir)
    run_dir = matrix_dir / "tb" / "lm" / "pre" / "seed0"
    assert [path.name for path in run_dir.iterdir()] == [f"events.out.tfevents.{int(START)}.{REBUILT_MARK}"]
    first = next(EventFileLoader(str(next(run_dir.iterdir()))).Load())
    assert first.file_version == "brain.Event:2" and first.wall_time == START
