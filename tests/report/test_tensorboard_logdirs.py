"""TensorBoard's log folders: what a reader opens shows every run at once (TensorBoard ticks a folder's
runs by default only up to 40), tuning runs apart from the reported ones, a variant's seeds side by
side, and the charts a reader opens the dashboard for first. Checked on records written to disk and
rebuilt (``blockbench report --tensorboard``), through TensorBoard's own run listing, and on the
runner's cell commands, against counts and orders worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from helpers import TINY_LM, tensorboard_events
from tensorboard.backend.event_processing import io_wrapper
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.custom_scalar import layout_pb2
from test_tensorboard_rebuild import RECORD, write_cell
from torch.utils.tensorboard import SummaryWriter

from blockbench.matrix.expand import expand_matrix
from blockbench.matrix.jobs import cell_command
from blockbench.store.layout import CELL_FILE, MAX_RUNS_PER_LOGDIR, RESULT_FILE, tuning_cell_directory, write_json
from blockbench.store.record import CellRecord, write_record
from blockbench.store.tbruns import logdirs
from blockbench.tasks import TASK_CONFIGS
from blockbench.tensorboard.events import run_views
from blockbench.tensorboard.logdirs import publish_logdirs
from blockbench.tensorboard.names import HEADLINE_METRICS, run_tag, time_series_order
from blockbench.tensorboard.rebuild import rebuild_matrix, write_tensorboard
from blockbench.tensorboard.views import view_summaries

VARIANTS = ["pre", "post", "sandwich", "deepnorm", "peri", "mix"]
SEEDS = 8  # 6 variants x 8 seeds: 48 reported runs of one task, more than TensorBoard enables at once


def runs_in(logdir: Path) -> set[str]:
    """The runs TensorBoard lists for ``logdir``: every folder under it holding an event file."""
    return {Path(run).relative_to(logdir).as_posix() for run in io_wrapper.GetLogdirSubdirectories(str(logdir))}


def write_tuning_cell(matrix_dir: Path, variant: str, lr: float, seed: int) -> None:
    """A tuning cell folder as the runner leaves it: the variant at learning rate ``lr``."""
    folder = tuning_cell_directory(matrix_dir, "lm", f"norm_placement={variant}", f"lr={lr}", seed)
    info = {
        "task": "lm",
        "task_name": "lm",
        "variant": f"norm_placement={variant}",
        "seed": seed,
        "axes": {"task": "lm", "model.norm_placement": variant, "seed": seed},
        "phase": "tune",
        "tuned": {"optimizer.lr": lr},
    }
    write_json(folder / CELL_FILE, info)
    write_record(folder / RESULT_FILE, CellRecord.model_validate({**RECORD, "seed": seed}))


def test_a_task_with_more_runs_than_tensorboard_enables_is_split_into_folders_of_whole_variants() -> None:
    """By hand: variants of 7 runs fill a folder of 40 five at a time (35; a sixth would make 42); a
    variant of more runs than a folder holds goes on into the next one; a task that fits keeps its name."""
    tasks = ["lm"] * 42 + ["vit"] * 12
    variants = [f"v{i // 7}" for i in range(42)] + [f"w{i // 3}" for i in range(12)]
    assert logdirs("tb", tasks, variants) == ["tb/lm_1of2"] * 35 + ["tb/lm_2of2"] * 7 + ["tb/vit"] * 12
    assert logdirs("tb", ["lm"] * 45, ["one"] * 45) == ["tb/lm_1of2"] * 40 + ["tb/lm_2of2"] * 5
    # a folder of 4: 3 + 3 > 4 and 3 + 2 > 4 start new parts; 2 + 2 fills one
    sizes = [3, 3, 2, 2]
    small = logdirs("tb_tune", ["lm"] * 10, [f"v{i}" for i, size in enumerate(sizes) for _ in range(size)], limit=4)
    assert small == ["tb_tune/lm_1of3"] * 3 + ["tb_tune/lm_2of3"] * 3 + ["tb_tune/lm_3of3"] * 4


def test_rebuilt_log_folders_hold_at_most_40_runs_tuning_runs_apart_and_open_on_the_headline(tmp_path: Path) -> None:
    matrix_dir = tmp_path / "m"
    for v, variant in enumerate(VARIANTS):
        for seed in range(SEEDS):
            write_cell(matrix_dir, variant, seed, index=v * SEEDS + seed)
        for lr in (0.001, 0.003):
            write_tuning_cell(matrix_dir, variant, lr, 1000)
    done = rebuild_matrix(matrix_dir)
    # 48 runs: the first 5 variants (40) in one folder, the sixth in another; 12 tuning runs in their own
    assert done.logdirs == ["tb/lm_1of2", "tb/lm_2of2", "tb_tune/lm"]
    listed = {logdir: runs_in(matrix_dir / logdir) for logdir in done.logdirs}
    assert {logdir: len(runs) for logdir, runs in listed.items()} == {
        "tb/lm_1of2": 40,
        "tb/lm_2of2": 8,
        "tb_tune/lm": 12,
    }
    assert all(len(runs) <= MAX_RUNS_PER_LOGDIR for runs in listed.values())
    # named <variant>/seed<k>: a variant's seeds side by side, selected together by ^<variant>/
    assert listed["tb/lm_1of2"] == {f"{variant}/seed{seed}" for variant in VARIANTS[:5] for seed in range(SEEDS)}
    assert listed["tb/lm_2of2"] == {f"mix/seed{seed}" for seed in range(SEEDS)}
    assert listed["tb_tune/lm"] == {f"{variant}/lr={lr}/seed1000" for variant in VARIANTS for lr in (0.001, 0.003)}
    assert not any("lr=" in run for run in runs_in(matrix_dir / "tb"))  # no tuning run anywhere under tb/
    out = write_tensorboard(matrix_dir)
    assert (
        f"tensorboard --logdir {matrix_dir / 'tb' / 'lm_1of2'}" in out and "tb/lm_2of2" in out and "tb_tune/lm" in out
    )

    # Time Series orders its charts by TensorBoard's tag comparison: the headline metric and the loss
    # curve first (c before p), then the validation loss and the logit lens, the final figures last
    first_run = matrix_dir / "tb" / "lm_1of2" / "pre" / "seed0"
    tags = set(tensorboard_events(first_run).Tags()["scalars"])
    assert time_series_order(tags)[:4] == [
        "0_main/lm/curve_loss",
        "0_main/lm/perplexity",
        "1_val/lm/lens/layer0",
        "1_val/lm/loss",
    ]
    # Custom Scalars: the loss curve, then the headline metric, in the task's category
    [_, layout_value] = run_views(first_run)
    layout = layout_pb2.Layout.FromString(Summary.Value.FromString(layout_value).tensor.string_val[0])
    [category] = layout.category
    assert [chart.title for chart in category.chart][:2] == ["val/curve_loss", "val/perplexity"]
    assert [list(chart.multiline.tag) for chart in category.chart][:2] == [
        ["^0_main/lm/curve_loss$"],
        ["^0_main/lm/perplexity$"],
    ]


def test_a_live_run_in_another_part_of_its_tasks_folders_is_kept_and_not_copied(tmp_path: Path) -> None:
    """The runner splits a task by every seed its matrix file may train, the rebuild by the cells with
    a record: a live run the runner put in ``tb/lm_1of2`` stays the cell's run, with no rebuilt copy in
    ``tb/lm`` beside it."""
    matrix_dir = tmp_path / "m"
    write_cell(matrix_dir, "pre", 0, index=0)
    write_cell(matrix_dir, "post", 0, index=1)
    writer = SummaryWriter(str(matrix_dir / "tb" / "lm_1of2" / "pre" / "seed0"))
    writer.add_scalar(run_tag("val/loss", "lm"), 2.5, 10)
    writer.close()
    done = rebuild_matrix(matrix_dir)
    assert done.live == ["tb/lm_1of2/pre/seed0"] and done.written == ["tb/lm/post/seed0"]
    assert runs_in(matrix_dir / "tb" / "lm") == {"post/seed0"}


def write_split_matrix(folder: Path) -> Path:
    """A matrix file of 4 variants x 11 seeds (44 runs of one task) with two candidate learning rates."""
    (folder / "base.yaml").write_text(yaml.safe_dump(TINY_LM))
    path = folder / "m.yaml"
    axes = {"model.norm_placement": VARIANTS[:4], "seed": list(range(11))}
    tune = {"optimizer.lr": [1e-3, 3e-3]}
    path.write_text(yaml.safe_dump({"name": "m", "base": "base.yaml", "axes": axes, "tune": tune}))
    return path


def test_the_runner_gives_each_cell_its_task_folder_and_each_tuning_cell_one_of_its_own(tmp_path: Path) -> None:
    """The cell commands of a matrix of 4 variants x 11 seeds (44 runs of one task) with two candidate
    learning rates: 3 variants (33 runs) in one folder, the fourth in a second; the 16 tuning runs
    (4 variants x 2 rates x 2 tuning seeds) in tb_tune/lm, each folder's views beside its runs."""
    path = write_split_matrix(tmp_path)
    expansion = expand_matrix(path)
    matrix_dir = tmp_path / "results" / "m"
    folders: dict[str, set[str]] = {}
    for cell in [*expansion.cells, *expansion.tuning]:
        command = cell_command(cell, matrix_dir, path)
        tb_dir = Path(command[command.index("--tb-dir") + 1])
        name, version = command[command.index("--tb-name") + 1], command[command.index("--tb-version") + 1]
        assert command[command.index("--tb-views") + 1] == str(tb_dir / "views.json")
        folders.setdefault(tb_dir.relative_to(matrix_dir).as_posix(), set()).add(f"{name}/{version}")
    assert {logdir: len(runs) for logdir, runs in folders.items()} == {
        "tb/lm_1of2": 33,
        "tb/lm_2of2": 11,
        "tb_tune/lm": 16,
    }
    assert folders["tb/lm_2of2"] == {f"deepnorm/seed{seed}" for seed in range(11)}
    assert "pre/lr=0.001/seed1000" in folders["tb_tune/lm"]


def test_the_runner_moves_the_runs_of_the_earlier_layout_into_the_log_folders(tmp_path: Path) -> None:
    """A matrix trained when every run lay in one folder, ``tb/`` (tuning runs under ``tb/tune/``, the
    views in ``tb/views.json``): before its next cell, each run is in its log folder, carrying that
    folder's views, and nothing of the old layout is left."""
    expansion = expand_matrix(write_split_matrix(tmp_path))
    matrix_dir = tmp_path / "results" / "m"
    earlier = {  # where the run was -> its log folder now, and its name there
        "tb/lm/deepnorm/seed3": ("tb/lm_2of2", "deepnorm/seed3"),
        "tb/tune/lm/pre/lr=0.001/seed1000": ("tb_tune/lm", "pre/lr=0.001/seed1000"),
    }
    loss = run_tag("val/loss", "lm")
    for old in earlier:
        writer = SummaryWriter(str(matrix_dir / old))
        writer.add_scalar(loss, 2.5, 10)
        writer.close()
    write_json(matrix_dir / "tb" / "views.json", {})
    hint = publish_logdirs(
        matrix_dir, [cell.logdir_cell for cell in expansion.cells], [cell.logdir_cell for cell in expansion.tuning]
    )
    for old, (logdir, name) in earlier.items():
        assert not (matrix_dir / old).exists()
        assert [event.value for event in tensorboard_events(matrix_dir / logdir / name).Scalars(loss)] == [2.5]
        views = json.loads((matrix_dir / logdir / "views.json").read_text())
        assert list(views["layout"]) == ["lm"]
        expected = [value.SerializeToString() for summary in view_summaries(views) for value in summary.value]
        assert run_views(matrix_dir / logdir / name) == expected
    assert sorted(path.name for path in (matrix_dir / "tb").iterdir()) == ["lm_1of2", "lm_2of2"]  # no tune/, views.json
    assert hint.startswith(f"TensorBoard: tensorboard --logdir {matrix_dir / 'tb' / 'lm_1of2'} (")
    assert "the others: tb/lm_2of2; tuning runs: tb_tune/lm" in hint


def test_the_headline_metrics_are_each_tasks_primary_and_no_other_metric() -> None:
    """The cell's writer knows a tag and its task label only, so the metrics that open Time Series are
    listed by name: each task's primary metric (its first), and no other metric of any task."""
    primaries = {config.metrics[0].name for config in TASK_CONFIGS.values()}
    others = {metric.name for config in TASK_CONFIGS.values() for metric in config.metrics[1:]}
    assert primaries == HEADLINE_METRICS and not others & HEADLINE_METRICS
    for config in TASK_CONFIGS.values():
        assert run_tag(f"val/{config.metrics[0].name}", "t").startswith("0_main/t/")
        assert all(run_tag(f"val/{metric.name}", "t").startswith("1_val/t/") for metric in config.metrics[1:])
