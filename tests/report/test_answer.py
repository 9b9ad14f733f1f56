"""The short answer a matrix run prints at its end (``blockbench.report.answer``): it fits a screen
whatever the number of questions, names the summary and the TensorBoard log folders, and the index of
a results root that holds only a demonstration says so instead of "no finished cell"."""

from __future__ import annotations

import json

import yaml
from test_verdicts import POST, PRE, ROUND_PRE, _lm_cells, _write_matrix

from blockbench.report.answer import MAX_LINES, answer_lines
from blockbench.report.index import write_index
from blockbench.report.summary import write_summary
from blockbench.store.tbruns import tensorboard_logdirs
from blockbench.tensorboard.logdirs import browse_hint

#: a post-norm LM a clear step worse than the pre-norm seeds
POST_LM = [7.60, 7.72, 7.65]


def test_many_questions_fit_a_screen_and_say_how_many_more(tmp_path):
    _write_matrix(tmp_path, "m", _lm_cells(pre=ROUND_PRE[:3], post=POST_LM), PRE)
    found = write_summary(tmp_path / "m").comparisons
    assert len(found) == 1
    many = found * 30
    lines = answer_lines("m: the verdicts", many, tmp_path / "m" / "summary.md", "TensorBoard: ...", None)
    assert len(lines) <= MAX_LINES
    shown = sum(1 for line in lines if line.startswith("  lm "))
    assert lines[shown + 1] == f"  ... {30 - shown} more in the summary"
    exact = answer_lines(
        "m: the verdicts", found * (MAX_LINES - 3), tmp_path / "m" / "summary.md", "TensorBoard: ...", None
    )
    assert len(exact) == MAX_LINES and not any("more in the summary" in line for line in exact)


def test_the_tensorboard_line_names_every_log_folder_on_disk(tmp_path):
    """The answer's TensorBoard line is the one the run started with (``browse_hint``), from the log
    folders on disk: reported ones first, the tuning ones named apart."""
    assert tensorboard_logdirs(tmp_path) == []
    assert browse_hint(tmp_path, tensorboard_logdirs(tmp_path)) == f"TensorBoard: no runs in {tmp_path / 'tb'}"
    for folder in ("tb/vit", "tb/lm", "tb/translation", "tb_tune/lm"):
        (tmp_path / folder / POST / "seed0").mkdir(parents=True)
    (tmp_path / "tb" / "views.json").write_text("{}")  # a file, not a log folder
    assert tensorboard_logdirs(tmp_path) == ["tb/lm", "tb/translation", "tb/vit", "tb_tune/lm"]
    browse = browse_hint(tmp_path, tensorboard_logdirs(tmp_path))
    assert browse == (
        f"TensorBoard: tensorboard --logdir {tmp_path / 'tb/lm'} (a log folder per task, at most 40 runs, "
        "opened one at a time; the others: tb/translation, tb/vit; tuning runs: tb_tune/lm)"
    )
    assert answer_lines("m: the verdicts", [], tmp_path / "summary.md", browse)[-1] == browse


def test_an_index_of_a_demonstration_alone_does_not_say_nothing_finished(tmp_path):
    _write_matrix(tmp_path, "smoke", _lm_cells(pre=ROUND_PRE[:3], post=POST_LM), PRE)
    matrix_file = tmp_path / "smoke" / "matrix.yaml"
    matrix_file.write_text(yaml.safe_dump({**yaml.safe_load(matrix_file.read_text()), "verdicts": False}))
    index = write_index(tmp_path, tmp_path / "none")
    assert "No matrix has a finished cell yet" not in index
    assert "No matrix that asks a design question has a finished cell yet" in index and "smoke" in index
    (tmp_path / "smoke").rename(tmp_path / "empty")
    for cells in (tmp_path / "empty" / "cells").glob("*"):
        for path in sorted(cells.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    matrix_file = tmp_path / "empty" / "matrix.yaml"
    matrix_file.write_text(
        yaml.safe_dump({k: v for k, v in yaml.safe_load(matrix_file.read_text()).items() if k != "verdicts"})
    )
    assert "No matrix has a finished cell yet" in write_index(tmp_path, tmp_path / "none")


def test_the_summary_header_states_the_whole_matrix_cost(tmp_path):
    """Every cell's process time, whenever it trained, reported and tuning cells apart, as h:mm:ss."""
    _write_matrix(tmp_path, "m", _lm_cells(pre=ROUND_PRE[:3], post=POST_LM), PRE)
    results = sorted((tmp_path / "m" / "cells").rglob("result.json"))
    for i, path in enumerate(results):  # 6 cells of 600 s, 660 s, ...: 600 * 6 + 60 * 15 = 4,500 s
        path.write_text(json.dumps({**json.loads(path.read_text()), "wall_time_s": 600.0 + 60 * i}))
    summary = write_summary(tmp_path / "m").markdown
    assert len(results) == 6
    assert "Cost: 1:15:00 of cell processes in all, whenever they trained (1:15:00 for the 6 reported cells;" in summary
