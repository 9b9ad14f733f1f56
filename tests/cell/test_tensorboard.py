"""What TensorBoard shows of a matrix: run names, charts, the HParams table and the files behind them,
read back from the event files and through TensorBoard's own plugins (the HTTP API the dashboards
call), on a tiny matrix run by the real runner and on runs written by the functions directly."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import TINY_LM_TASK, TINY_MODEL, tensorboard_events, write_matrix
from tensorboard.backend.event_processing import data_provider, io_wrapper, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.custom_scalar import custom_scalars_plugin, layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalars_metadata
from tensorboard.plugins.hparams import api_pb2, hparams_plugin, metadata
from tensorboard.plugins.scalar import scalars_plugin
from werkzeug.test import Client

from blockbench import cli
from blockbench.matrix.expand import load_matrix
from blockbench.matrix_command import run_matrix
from blockbench.store.layout import TB_VIEWS_FILE
from blockbench.store.record import FINAL_FIGURES
from blockbench.store.tbruns import move_runs
from blockbench.tasks import Metric
from blockbench.tensorboard.events import refresh_run_views, run_views
from blockbench.tensorboard.logdirs import publish_views
from blockbench.tensorboard.names import PRIMARY_METRIC_TAG, compare_tag_names, hparam_value, run_tag, time_series_order
from blockbench.tensorboard.rebuild import rebuild_matrix
from blockbench.tensorboard.views import LENS_CHART, matrix_views, view_summaries
from blockbench.tensorboard.writer import CellLogger, log_cell_hparams, log_views

ALL_STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
#: how many metric columns the HParams dashboard ticks by default (tensorboard 2.21's frontend,
#: ``_computeMetrics``: ``displayed: i < 5``); its parallel-coordinates view draws only the rows
#: with a value in every ticked column
DEFAULT_METRIC_COLUMNS = 5


class Dashboards:
    """TensorBoard's backend for a log dir: its runs, the HParams and Custom Scalars plugins' HTTP routes."""

    def __init__(self, tb_dir: Path):
        self.multiplexer = plugin_event_multiplexer.EventMultiplexer()
        self.tb_dir = tb_dir
        provider = data_provider.MultiplexerDataProvider(self.multiplexer, str(tb_dir))
        plugins: dict[str, base_plugin.TBPlugin] = {}
        context = base_plugin.TBContext(
            logdir=str(tb_dir), data_provider=provider, multiplexer=self.multiplexer, plugin_name_to_instance=plugins
        )
        plugins[scalars_plugin.ScalarsPlugin.plugin_name] = scalars_plugin.ScalarsPlugin(context)
        self.hparams = Client(_routes(hparams_plugin.HParamsPlugin(context)))
        self.custom_scalars = Client(_routes(custom_scalars_plugin.CustomScalarsPlugin(context)))
        self.multiplexer.AddRunsFromDirectory(str(self.tb_dir))
        self.multiplexer.Reload()

    def runs(self) -> set[str]:
        return set(self.multiplexer.Runs())

    def experiment(self) -> dict[str, Any]:
        return self.hparams.post("/experiment", data=json.dumps({})).json

    def session_groups(self, **request: Any) -> list[dict[str, Any]]:
        request = {"startIndex": 0, "sliceSize": 100, "allowedStatuses": ALL_STATUSES, **request}
        return self.hparams.post("/session_groups", data=json.dumps(request)).json.get("sessionGroups", [])

    def layout(self) -> dict[str, Any]:
        return self.custom_scalars.get("/layout").json

    def chart_runs(self, regex: str) -> set[str]:
        """The runs a custom-scalar chart of ``regex`` draws: those with a scalar tag it matches."""
        return {
            run
            for run in self.runs()
            if self.custom_scalars.get("/scalars", query_string={"run": run, "tag": regex}).json["tag_to_events"]
        }


def _routes(plugin: base_plugin.TBPlugin):
    apps = plugin.get_plugin_apps()

    def app(environ, start_response):
        return apps[environ["PATH_INFO"]](environ, start_response)

    return app


def metric_values(group: dict[str, Any]) -> dict[str, float]:
    return {m["name"]["tag"]: m["value"] for m in group.get("metricValues", [])}


# --- a tiny matrix (2 tasks x 2 variants x 1 seed) through the runner ------------------------------

TINY_VIT_TASK = {"name": "vit", "n_train": 256, "n_val": 32}
TINY_BASE = {
    "model": TINY_MODEL,
    "optimizer": {"warmup_steps": 1},
    "trainer": {
        "max_steps": 4,
        "batch_size": 8,
        "val_every_n_steps": 2,
        "log_every_n_steps": 1,
        "num_threads": 1,
        "peak_tflops": 1.0,
        "checkpoint_every_n_steps": None,
    },
}
TINY_RUNS = {"lm/pre/seed0", "lm/post/seed0", "vit/pre/seed0", "vit/post/seed0"}


@contextlib.contextmanager
def cells_in_this_process() -> Iterator[None]:
    """The runner's ``blockbench train`` subprocesses run in this process instead (the same command
    line through the same CLI; a process start-up costs more than a tiny cell)."""
    real_run = subprocess.run

    def run(command, *args, **kwargs):
        if list(command[:3]) != [sys.executable, "-m", "blockbench"]:
            return real_run(command, *args, **kwargs)
        return subprocess.CompletedProcess(command, cli.main(list(command[3:])))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess, "run", run)
        yield


@pytest.fixture(scope="module")
def tiny_matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results folder of a trained matrix: lm and vit x pre and post, seed 0."""
    folder = tmp_path_factory.mktemp("tb_matrix")
    path = write_matrix(
        folder,
        {"task": [TINY_LM_TASK, TINY_VIT_TASK], "model.norm_placement": ["pre", "post"], "seed": [0]},
        base=TINY_BASE,
    )
    with cells_in_this_process():
        assert run_matrix(path, folder / "results") == 0
    return folder / "results" / "m"


def test_runs_have_short_distinct_names_and_the_views_are_no_runs(tiny_matrix: Path) -> None:
    tb_dir = tiny_matrix / "tb"
    listed = {Path(run).relative_to(tb_dir).as_posix() for run in io_wrapper.GetLogdirSubdirectories(str(tb_dir))}
    assert listed == TINY_RUNS  # no .hparams, no .layout: every run is a cell
    assert Dashboards(tb_dir).runs() == TINY_RUNS


def test_each_run_is_one_event_file_and_nothing_else(tiny_matrix: Path) -> None:
    for run in TINY_RUNS:
        files = list((tiny_matrix / "tb" / run).iterdir())
        assert len(files) == 1 and "tfevents" in files[0].name, files  # one writer, no hparams.yaml


def test_every_chart_holds_the_runs_of_one_task(tiny_matrix: Path) -> None:
    dashboards = Dashboards(tiny_matrix / "tb")  # every task's log folder at once
    task_of = {run: run.split("/")[0] for run in TINY_RUNS}
    # Time Series: a chart per tag with every run that has it; the z_final/* scalars are HParams columns
    runs_by_tag: dict[str, set[str]] = {}
    for run, tags in dashboards.multiplexer.Runs().items():
        for tag in tags["tensors"]:  # the scalars, as the data provider reads them
            runs_by_tag.setdefault(tag, set()).add(run)
    curve_groups = ("0_main/", "1_val/", "2_train/", "3_lr/", "4_perf/")
    curves = {tag: runs for tag, runs in runs_by_tag.items() if tag.startswith(curve_groups)}
    assert {
        "2_train/lm/loss",
        "1_val/lm/loss",
        "0_main/lm/perplexity",
        "1_val/vit/loss",
        "0_main/vit/accuracy",
        "3_lr/vit/decay",
    } <= set(curves)
    for tag, runs in curves.items():
        assert len({task_of[run] for run in runs}) == 1, (tag, runs)

    # Custom Scalars of a task's log folder: the task's category, each chart drawing every run of it
    for task in ("lm", "vit"):
        dashboards = Dashboards(tiny_matrix / "tb" / task)
        [category] = dashboards.layout()["category"]
        assert category["title"] == task
        titles = [chart["title"] for chart in category["chart"]]
        assert (
            titles
            == {
                "lm": [
                    *("val/curve_loss", "val/perplexity", "val/agreement_acc", "val/loss"),
                    *("val/excess_loss", "val/gap_closed", "train/loss", LENS_CHART),
                ],
                "vit": ["val/curve_loss", "val/accuracy", "val/loss", "train/loss"],
            }[category["title"]]
        )
        for chart in category["chart"]:
            [regex] = chart["multiline"]["tag"]
            assert dashboards.chart_runs(regex) == {"pre/seed0", "post/seed0"}, regex


def test_hparams_default_view_is_filled_for_every_cell(tiny_matrix: Path) -> None:
    """Each task's log folder has its own HParams table: its cells, its metrics (the primary first)."""
    for task in ("lm", "vit"):
        dashboards = Dashboards(tiny_matrix / "tb" / task)
        experiment = dashboards.experiment()
        hparams = {info["name"]: info for info in experiment["hparamInfos"]}
        assert hparams["seed"]["type"] == "DATA_TYPE_STRING" and hparams["seed"]["domainDiscrete"] == ["0"]
        assert hparams["task"]["domainDiscrete"] == [task]
        # the varied key first (the dashboard shows the first 5), the one task, seed and the status after it
        assert experiment["hparamInfos"][0]["name"] == "model.norm_placement"
        columns = [info["name"]["tag"] for info in experiment["metricInfos"]]
        primary = {"lm": "z_final/val/perplexity", "vit": "z_final/val/accuracy"}[task]
        assert columns[0] == primary and PRIMARY_METRIC_TAG not in columns  # one task: its own metric names the column
        assert "z_final/val/loss" in columns[:DEFAULT_METRIC_COLUMNS]

        groups = {group["name"]: group for group in dashboards.session_groups()}
        assert set(groups) == {"pre/seed0", "post/seed0"}  # the runs' names in the log folder
        for run, group in groups.items():
            assert group["hparams"]["seed"] == "0"  # shown as 0, not 0.0000
            assert group["hparams"]["model.norm_placement"] == run.split("/")[0]
            values = metric_values(group)
            assert set(columns[:DEFAULT_METRIC_COLUMNS]) <= set(values), (run, values)  # no blank in the default view
            cell = tiny_matrix / "cells" / task / f"norm_placement={run.split('/')[0]}" / "seed0"
            result = json.loads((cell / "result.json").read_text())
            assert values[primary] == pytest.approx(result["metrics"][result["primary_metric"]], rel=1e-6)
            assert values["z_final/val/loss"] == pytest.approx(result["metrics"]["loss"], rel=1e-6)
        by_primary = dashboards.session_groups(colParams=[{"metric": {"tag": primary}, "order": "ORDER_ASC"}])
        assert len(by_primary) == 2


# --- Time Series: the groups in reading order ------------------------------------------------------


def time_series_groups(tags: set[str]) -> list[str]:
    """The groups of the Time Series dashboard, in its order: each tag's part before the first ``/``,
    in the order of the group's first tag (the frontend's ``groupCardIdWithMetdata``)."""
    return list(dict.fromkeys(tag.split("/", 1)[0] for tag in time_series_order(tags)))


def test_tags_are_ordered_as_tensorboard_orders_them() -> None:
    """Hand-checked against the rule: numbers by value, digits and ``/`` before letters, then by code."""
    order = functools.cmp_to_key(compare_tag_names)
    assert sorted(["b", "a", "B"], key=order) == ["B", "a", "b"]
    assert sorted(["a10", "a9", "a2.5"], key=order) == ["a2.5", "a9", "a10"]
    assert sorted(["x_1", "x/1"], key=order) == ["x/1", "x_1"] and sorted(["xa", "x9"], key=order) == ["x9", "xa"]
    assert sorted(["train", "1_val", "10_a", "2_train"], key=order) == ["1_val", "2_train", "10_a", "train"]
    assert compare_tag_names("1_val/lm/loss", "1_val/lm/loss") == 0
    # Lightning's own groups, in the order that opened the dashboard on epoch and one-point finals
    assert time_series_groups({"val/lm/loss", "train/lm/loss", "epoch/lm", "final/val/loss", "lr/lm/decay"}) == [
        "epoch",
        "final",
        "lr",
        "train",
        "val",
    ]


def test_time_series_opens_on_the_headline_metric_and_the_loss_curve(tiny_matrix: Path) -> None:
    """A task's log folder opens Time Series on two charts, its headline metric and its loss curve,
    then the other validation curves, and ends on the final figures."""
    for task, headline in (("lm", "perplexity"), ("vit", "accuracy")):
        tags: set[str] = set()
        for run in ("pre/seed0", "post/seed0"):
            tags |= set(tensorboard_events(tiny_matrix / "tb" / task / run).Tags()["scalars"])
        assert time_series_groups(tags) == ["0_main", "1_val", "2_train", "3_lr", "4_perf", "z_final"]  # no epoch
        first, second, third = time_series_order(tags)[:3]
        assert {first, second} == {f"0_main/{task}/{headline}", f"0_main/{task}/curve_loss"}
        assert third.startswith(f"1_val/{task}/")


# --- the rebuild from the records reads as the live run ----------------------------------------------


def test_a_run_rebuilt_from_the_records_reads_as_the_live_one(tiny_matrix: Path, tmp_path: Path) -> None:
    """The matrix's folder without ``tb/`` (as committed), its runs rebuilt: the same runs, views,
    HParams rows and validation tags, with the same points; only what no record holds is missing
    (the training loss, learning rates and per-step speed figures)."""
    copy = tmp_path / "m"
    shutil.copytree(tiny_matrix, copy, ignore=shutil.ignore_patterns("tb"))
    rebuilt = rebuild_matrix(copy)
    assert sorted(rebuilt.written) == sorted(f"tb/{run}" for run in TINY_RUNS) and not rebuilt.live
    assert rebuilt.logdirs == ["tb/lm", "tb/vit"]

    def rows(dashboards: Dashboards) -> dict[str, tuple[dict[str, Any], dict[str, float], str]]:
        return {
            group["name"]: (group["hparams"], metric_values(group), group["sessions"][0]["status"])
            for group in dashboards.session_groups()
        }

    for task in ("lm", "vit"):  # each log folder a reader opens
        live_dashboards, rebuilt_dashboards = Dashboards(tiny_matrix / "tb" / task), Dashboards(copy / "tb" / task)
        assert rebuilt_dashboards.runs() == live_dashboards.runs() == {"pre/seed0", "post/seed0"}
        assert rebuilt_dashboards.experiment() == live_dashboards.experiment()
        assert rebuilt_dashboards.layout() == live_dashboards.layout()
        live_rows, rebuilt_rows = rows(live_dashboards), rows(rebuilt_dashboards)
        assert live_rows.keys() == rebuilt_rows.keys() == {"pre/seed0", "post/seed0"}
        for run, (hparams, values, status) in live_rows.items():
            assert rebuilt_rows[run][0] == hparams and rebuilt_rows[run][2] == status == "STATUS_SUCCESS"
            assert rebuilt_rows[run][1] == pytest.approx(values, rel=1e-6)
    for run in TINY_RUNS:
        live, again = tensorboard_events(tiny_matrix / "tb" / run), tensorboard_events(copy / "tb" / run)
        assert run_views(copy / "tb" / run) == run_views(tiny_matrix / "tb" / run)
        live_tags, rebuilt_tags = set(live.Tags()["scalars"]), set(again.Tags()["scalars"])
        not_recorded = {tag for tag in live_tags if tag.startswith(("2_train/", "3_lr/", "4_perf/"))}
        assert not_recorded and rebuilt_tags == live_tags - not_recorded, (run, live_tags ^ rebuilt_tags)
        assert {f"0_main/{run.split('/')[0]}/curve_loss", f"1_val/{run.split('/')[0]}/loss"} <= rebuilt_tags
        for tag in rebuilt_tags:
            points = [(e.step, e.value) for e in again.Scalars(tag)]
            # the record keeps the loss curve's points to 6 decimals
            assert points == [(e.step, pytest.approx(e.value, rel=1e-5)) for e in live.Scalars(tag)], tag


# --- run names, without training -------------------------------------------------------------------


def run_names(tmp_path: Path, axes: dict[str, list[Any]], base: dict[str, Any] | None = None) -> list[str]:
    """Each reported cell's run as its path under ``tb/``: its task's log folder, then its name there."""
    return [
        cell.tb.path.removeprefix("tb/")
        for cell in load_matrix(write_matrix(tmp_path, axes, base or {"model": TINY_MODEL}))[1]
    ]


def test_run_names_are_the_values_alone_when_those_name_themselves(tmp_path: Path) -> None:
    names = run_names(
        tmp_path, {"task": ["lm", "translation"], "model.norm_placement": ["pre", "post"], "seed": [0, 1]}
    )
    assert names[:3] == ["lm/pre/seed0", "lm/pre/seed1", "lm/post/seed0"] and len(set(names)) == 8
    two_axes = run_names(tmp_path, {"model.norm": ["layernorm", "rmsnorm"], "model.ffn": ["mlp", "swiglu"]})
    assert two_axes == [
        "lm/layernorm,mlp/seed0",
        "lm/layernorm,swiglu/seed0",
        "lm/rmsnorm,mlp/seed0",
        "lm/rmsnorm,swiglu/seed0",
    ]
    assert run_names(tmp_path, {"seed": [0, 1]}) == ["lm/default/seed0", "lm/default/seed1"]


def test_run_names_keep_the_key_of_values_that_do_not_name_themselves(tmp_path: Path) -> None:
    assert run_names(tmp_path, {"model.n_kv_heads": [2, 1], "model.norm": ["rmsnorm"]}) == [
        "lm/n_kv_heads=2,rmsnorm/seed0",
        "lm/n_kv_heads=1,rmsnorm/seed0",
    ]
    assert run_names(tmp_path, {"model.n_kv_heads": [None, 1]}) == ["lm/n_kv_heads=None/seed0", "lm/n_kv_heads=1/seed0"]
    # a value two axes take: which axis says "pre"?
    base = {"task": {"name": "lm_text", "data": {"hf_path": "x"}}}
    both = run_names(
        tmp_path,
        {
            "task.data.hf_path": ["wikitext", "body"],
            "task.data.text_field": ["body", "text"],
            "model.norm_placement": ["pre"],
        },
        base,
    )
    assert both == [
        "lm_text/hf_path=wikitext,text_field=body,pre/seed0",
        "lm_text/hf_path=wikitext,text_field=text,pre/seed0",
        "lm_text/hf_path=body,text_field=body,pre/seed0",
        "lm_text/hf_path=body,text_field=text,pre/seed0",
    ]


def test_run_names_encode_unsafe_characters_like_the_cell_folders(tmp_path: Path) -> None:
    base = {"task": {"name": "lm_text", "data": {"hf_path": "x"}}}
    assert run_names(tmp_path, {"task.data.hf_path": ["Salesforce/wikitext", "roneneldan/TinyStories"]}, base) == [
        "lm_text/Salesforce%2Fwikitext/seed0",
        "lm_text/roneneldan%2FTinyStories/seed0",
    ]


def test_run_names_fall_back_to_the_cell_folders_when_short_ones_collide(tmp_path: Path) -> None:
    # "a,b" + "c" and "a" + "b,c" would both be "a,b,c"
    base = {"task": {"name": "lm_text", "data": {"hf_path": "x"}}}
    names = run_names(tmp_path, {"task.data.hf_path": ["a,b", "a"], "task.data.text_field": ["c", "b,c"]}, base)
    assert names == [
        f"lm_text/{folder}/seed0"
        for folder in (
            "hf_path=a,b,text_field=c",
            "hf_path=a,b,text_field=b,c",
            "hf_path=a,text_field=c",
            "hf_path=a,text_field=b,c",
        )
    ]


# --- one cell's run: tags, one event file, the HParams session -------------------------------------


LM_METRICS = [
    Metric(name="perplexity", higher_is_better=False, description="validation perplexity"),
    Metric(name="loss", higher_is_better=False, description="cross-entropy"),
]
MT_METRICS = [
    Metric(name="bleu", higher_is_better=True, description="corpus BLEU"),
    Metric(name="loss", higher_is_better=False, description="cross-entropy"),
]
LM_CURVES = {
    10: {"val/perplexity": 9.0, "val/loss": 2.2},
    20: {"val/perplexity": 8.0, "val/loss": 2.1},
    30: {"val/perplexity": 7.0, "val/loss": 1.9},
}


def views_of(tasks: dict[str, list[Metric]], cell_hparams: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    cell_hparams = cell_hparams or [
        {"task": t, "model.norm_placement": v, "seed": 0} for t in tasks for v in ("pre", "post")
    ]
    return matrix_views(cell_hparams, {task: (metrics, "tokens") for task, metrics in tasks.items()})


MATRIX_VIEWS = views_of({"lm": LM_METRICS, "mt": MT_METRICS})


def run_cell(
    tb_dir: Path,
    task: str,
    variant: str,
    seed: int,
    curves: dict[int, dict[str, float]],
    final: dict[str, float] | None = None,
    status: str = "ok",
    views: dict[str, Any] | None = MATRIX_VIEWS,
    **hparams: Any,
) -> CellLogger:
    """Log ``curves`` (step -> val metrics) as a matrix cell does, finish the logger as Lightning does
    after fit, log once more (the final validation), then record the cell; ``final`` defaults to the
    last step's metrics."""
    logger = CellLogger(tb_dir, f"{task}/{variant}", f"seed{seed}", scope=task)
    if views is not None:
        log_views(logger, views)
    for step, values in curves.items():
        logger.log_metrics(values, step=step)
        logger.save()
    logger.finalize("success")
    last_step = max(curves)
    logger.log_metrics(curves[last_step], step=last_step)
    hparams = {"task": task, "model.norm_placement": variant, "seed": seed, **hparams}
    primary = "val/perplexity" if task == "lm" else "val/bleu"
    log_cell_hparams(
        logger, hparams, curves[last_step] if final is None else final, primary=primary, status=status, step=last_step
    )
    logger.close()
    return logger


def hparams_content(run_dir: Path) -> dict[str, bytes]:
    return tensorboard_events(run_dir).PluginTagToContent(metadata.PLUGIN_NAME)


def test_a_cell_writes_one_event_file_and_no_hparams_yaml(tmp_path: Path) -> None:
    logger = run_cell(tmp_path, "lm", "pre", 0, LM_CURVES)
    files = list(Path(logger.log_dir).iterdir())
    assert len(files) == 1 and "tfevents" in files[0].name, files


def test_tags_are_scoped_by_task_second(tmp_path: Path) -> None:
    assert run_tag("val/loss", "lm") == "1_val/lm/loss"
    assert run_tag("perf/tokens_per_sec", "vit") == "4_perf/vit/tokens_per_sec"
    assert run_tag("step", "lm") == "step/lm"
    assert run_tag("grad/norm", "lm") == "grad/lm/norm"  # a group of no known name keeps it
    assert run_tag("val/loss") == "1_val/loss" and run_tag("train/loss", None) == "2_train/loss"  # unscoped
    logger = run_cell(tmp_path, "lm", "pre", 0, LM_CURVES)
    acc = tensorboard_events(Path(logger.log_dir))
    tags = set(acc.Tags()["scalars"])
    assert {"0_main/lm/perplexity", "1_val/lm/loss", "z_final/val/loss", PRIMARY_METRIC_TAG} <= tags
    assert not {"val/loss", "val/perplexity", "val/lm/loss"} & tags


def test_session_start_holds_the_hparams_as_text(tmp_path: Path) -> None:
    logger = run_cell(
        tmp_path, "lm", "post", 1, LM_CURVES, **{"model.dropout": 0.1, "model.tied": True, "model.window": None}
    )
    content = hparams_content(Path(logger.log_dir))
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    values = {name: (value.WhichOneof("kind"), value.string_value) for name, value in start.hparams.items()}
    assert values == {
        "task": ("string_value", "lm"),
        "model.norm_placement": ("string_value", "post"),
        "seed": ("string_value", "1"),
        "model.dropout": ("string_value", "0.1"),
        "model.tied": ("string_value", "True"),
        "model.window": ("string_value", "None"),
        "status": ("string_value", "ok"),
    }
    assert start.group_name == "lm/post/seed1"  # one row per cell, named after its run
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS


def test_final_metrics_are_own_scalars_and_curves_are_untouched(tmp_path: Path) -> None:
    logger = run_cell(tmp_path, "lm", "pre", 0, LM_CURVES)
    acc = tensorboard_events(Path(logger.log_dir))
    for name in ("val/perplexity", "val/loss"):
        curve = [(e.step, e.value) for e in acc.Scalars(run_tag(name, "lm"))]
        assert curve == [(step, pytest.approx(values[name])) for step, values in LM_CURVES.items()] + [
            (30, pytest.approx(LM_CURVES[30][name]))
        ]  # the final validation's point, logged after fit
        assert [(e.step, e.value) for e in acc.Scalars(f"z_final/{name}")] == [(30, pytest.approx(LM_CURVES[30][name]))]
    assert [(e.step, e.value) for e in acc.Scalars(PRIMARY_METRIC_TAG)] == [(30, 7.0)]


@pytest.mark.parametrize("final", [{}, {"val/perplexity": math.nan, "val/loss": math.inf}])
def test_diverged_cell_has_a_session_and_no_non_finite_metrics(tmp_path: Path, final: dict[str, float]) -> None:
    logger = run_cell(tmp_path, "lm", "post", 0, {10: {"val/perplexity": 9.0}}, final=final, status="diverged")
    content = hparams_content(Path(logger.log_dir))
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["status"].string_value == "diverged"
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_FAILURE
    assert not [tag for tag in tensorboard_events(Path(logger.log_dir)).Tags()["scalars"] if tag.startswith("z_final/")]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("pre", "pre"), (3, "3"), (0.001, "0.001"), (True, "True"), (None, "None"), (math.nan, "nan"), ([1, 2], "[1, 2]")],
)
def test_hparam_values_are_their_text(value: Any, expected: str) -> None:
    assert hparam_value(value) == expected


# --- the views: HParams columns and charts ---------------------------------------------------------


def write_matrix_runs(tb_dir: Path, views: dict[str, Any] | None = MATRIX_VIEWS) -> None:
    """Two tasks sharing val/loss; one diverged cell."""
    run_cell(tb_dir, "lm", "pre", 0, LM_CURVES, views=views)
    run_cell(
        tb_dir,
        "lm",
        "post",
        0,
        {10: {"val/perplexity": 50.0, "val/loss": 4.0}},
        status="diverged",
        final={"val/perplexity": math.nan, "val/loss": math.nan},
        views=views,
    )
    run_cell(
        tb_dir,
        "mt",
        "pre",
        0,
        {10: {"val/bleu": 3.0, "val/loss": 2.0}, 20: {"val/bleu": 12.5, "val/loss": 1.5}},
        views=views,
    )


def test_hparams_dashboard_lists_every_cell_with_its_final_metrics(tmp_path: Path) -> None:
    write_matrix_runs(tmp_path)
    dashboards = Dashboards(tmp_path)
    assert dashboards.runs() == {"lm/pre/seed0", "lm/post/seed0", "mt/pre/seed0"}

    experiment = dashboards.experiment()
    hparams = {info["name"]: info for info in experiment["hparamInfos"]}
    assert set(hparams) == {"task", "model.norm_placement", "seed", "status"}
    assert hparams["task"]["type"] == "DATA_TYPE_STRING" and hparams["task"]["domainDiscrete"] == ["lm", "mt"]
    assert hparams["seed"]["type"] == "DATA_TYPE_STRING" and hparams["seed"]["domainDiscrete"] == ["0"]
    assert hparams["model.norm_placement"]["differs"] and not hparams["seed"].get("differs")
    metrics = {info["name"]["tag"]: info for info in experiment["metricInfos"]}
    assert list(metrics)[:2] == [PRIMARY_METRIC_TAG, "z_final/val/loss"]
    assert metrics["z_final/val/bleu"]["displayName"] == "bleu ↑ (mt)"  # the metric, its direction, its tasks
    assert metrics["z_final/val/loss"]["displayName"] == "loss ↓"  # every task's
    assert metrics["z_final/val/bleu"]["description"] == "corpus BLEU"
    assert "lm: perplexity (lower is better); mt: bleu (higher is better)" in metrics[PRIMARY_METRIC_TAG]["description"]
    # the column mixes the tasks' headline metrics: its name says which, and which way each is better
    assert metrics[PRIMARY_METRIC_TAG]["displayName"] == "primary: perplexity ↓ (lm), bleu ↑ (mt)"
    assert metrics["z_final/val/perplexity"]["displayName"] == "perplexity ↓ (lm)"

    groups = {group["name"]: group for group in dashboards.session_groups()}
    assert set(groups) == {"lm/pre/seed0", "lm/post/seed0", "mt/pre/seed0"}
    assert groups["lm/pre/seed0"]["hparams"] == {
        "task": "lm",
        "model.norm_placement": "pre",
        "seed": "0",
        "status": "ok",
    }
    assert metric_values(groups["lm/pre/seed0"]) == {
        "z_final/val/perplexity": 7.0,
        "z_final/val/loss": pytest.approx(1.9),
        PRIMARY_METRIC_TAG: 7.0,
    }
    assert metric_values(groups["mt/pre/seed0"]) == {
        "z_final/val/bleu": 12.5,
        "z_final/val/loss": 1.5,
        PRIMARY_METRIC_TAG: 12.5,
    }
    assert groups["lm/post/seed0"]["hparams"]["status"] == "diverged"
    assert groups["lm/post/seed0"]["sessions"][0]["status"] == "STATUS_FAILURE"
    assert metric_values(groups["lm/post/seed0"]) == {}

    # filter on an hparam, sort by a metric: what the dashboard's controls send
    diverged = dashboards.session_groups(colParams=[{"hparam": "status", "filterDiscrete": ["diverged"]}])
    assert [group["name"] for group in diverged] == ["lm/post/seed0"]
    seed0 = dashboards.session_groups(colParams=[{"hparam": "seed", "filterDiscrete": ["0"]}])
    assert len(seed0) == 3
    by_loss = dashboards.session_groups(colParams=[{"metric": {"tag": "z_final/val/loss"}, "order": "ORDER_ASC"}])
    assert [group["name"] for group in by_loss][:2] == ["mt/pre/seed0", "lm/pre/seed0"]


def test_metric_columns_every_cell_fills_come_first() -> None:
    def columns(views: dict[str, Any]) -> list[str]:
        return [metric["tag"] for metric in views["experiment"]["metric_columns"]]

    speed = [
        "z_final/perf/step_time_ms",
        "z_final/perf/peak_memory_mb",
        "z_final/perf/tflops_per_sec",
        "z_final/perf/mfu",
        "z_final/perf/data_wait_fraction",
    ]
    assert set(speed) == {f"z_final/{tag}" for tag in FINAL_FIGURES}
    assert columns(MATRIX_VIEWS) == [
        PRIMARY_METRIC_TAG,
        "z_final/val/loss",
        *speed,
        "z_final/val/perplexity",
        "z_final/val/bleu",
        "z_final/perf/tokens_per_sec",
    ]
    # one task: its metrics in its order (the primary first), no separate headline column
    assert columns(views_of({"lm": LM_METRICS})) == [
        "z_final/val/perplexity",
        "z_final/val/loss",
        *speed,
        "z_final/perf/tokens_per_sec",
    ]


def test_speed_figures_are_hparams_columns_next_to_the_metrics(tmp_path: Path) -> None:
    """The runner passes a cell's final speed figures with its final metrics; a diverged cell has
    speed figures but no metrics."""
    speed = {"perf/step_time_ms": 8.5, "perf/mfu": 0.25, "perf/tokens_per_sec": 12000.0}
    run_cell(tmp_path, "lm", "pre", 0, LM_CURVES, final={**LM_CURVES[30], **speed})
    run_cell(
        tmp_path,
        "lm",
        "post",
        0,
        {10: {"val/perplexity": 50.0}},
        status="diverged",
        final={"perf/step_time_ms": 9.0, "perf/mfu": 0.125},
    )
    dashboards = Dashboards(tmp_path)
    columns = {info["name"]["tag"]: info for info in dashboards.experiment()["metricInfos"]}
    assert {
        "z_final/perf/step_time_ms",
        "z_final/perf/mfu",
        "z_final/perf/data_wait_fraction",
        "z_final/perf/tflops_per_sec",
        "z_final/perf/peak_memory_mb",
        "z_final/perf/tokens_per_sec",
    } <= set(columns)
    assert columns["z_final/perf/mfu"]["displayName"] == "mfu ↑"
    assert columns["z_final/perf/step_time_ms"]["displayName"] == "step_time_ms ↓"
    groups = {group["name"]: group for group in dashboards.session_groups()}
    assert metric_values(groups["lm/pre/seed0"]) == {
        "z_final/val/perplexity": 7.0,
        "z_final/val/loss": pytest.approx(1.9),
        PRIMARY_METRIC_TAG: 7.0,
        "z_final/perf/step_time_ms": 8.5,
        "z_final/perf/mfu": 0.25,
        "z_final/perf/tokens_per_sec": 12000.0,
    }
    assert metric_values(groups["lm/post/seed0"]) == {"z_final/perf/step_time_ms": 9.0, "z_final/perf/mfu": 0.125}


def test_hparams_dashboard_lists_cells_without_views(tmp_path: Path) -> None:
    """Cells trained alone (no views): TensorBoard derives the columns from the runs."""
    write_matrix_runs(tmp_path, views=None)
    dashboards = Dashboards(tmp_path)
    experiment = dashboards.experiment()
    assert {info["name"] for info in experiment["hparamInfos"]} == {"task", "model.norm_placement", "seed", "status"}
    assert "z_final/val/perplexity" in {info["name"]["tag"] for info in experiment["metricInfos"]}
    groups = {group["name"]: group for group in dashboards.session_groups()}
    assert metric_values(groups["lm/pre/seed0"])["z_final/val/perplexity"] == 7.0
    assert dashboards.layout() == {}


def test_hparams_with_mixed_types_are_one_text_column() -> None:
    views = matrix_views(
        [
            {"model.window": None},
            {"model.window": 64},
            {"model.window": 8},
            {"model.tied": True},
            {"model.tied": False},
        ],
        {},
    )
    columns = {column["name"]: column["values"] for column in views["experiment"]["hparams"]}
    assert columns["model.window"] == ["8", "64", "None"]  # numbers in numeric order, then the rest
    assert columns["model.tied"] == ["False", "True"]


def test_layout_has_a_category_per_task_with_task_scoped_charts() -> None:
    [_, layout_summary] = view_summaries(MATRIX_VIEWS)
    layout = layout_pb2.Layout.FromString(layout_summary.value[0].tensor.string_val[0])
    charts = {c.title: {chart.title: list(chart.multiline.tag) for chart in c.chart} for c in layout.category}
    assert charts == {
        "lm": {
            "val/perplexity": ["^0_main/lm/perplexity$"],
            "val/loss": ["^1_val/lm/loss$"],
            "train/loss": ["^2_train/lm/loss$"],
        },
        "mt": {
            "val/bleu": ["^0_main/mt/bleu$"],
            "val/loss": ["^1_val/mt/loss$"],
            "train/loss": ["^2_train/mt/loss$"],
        },
    }
    assert layout_summary.value[0].tag == custom_scalars_metadata.CONFIG_SUMMARY_TAG


# --- views of runs trained before the matrix file changed ------------------------------------------


def test_runs_of_earlier_cells_get_the_new_views_in_one_file(tmp_path: Path) -> None:
    old_views = views_of({"lm": LM_METRICS})
    run_cell(tmp_path, "lm", "pre", 0, LM_CURVES, views=old_views)
    run_dir = tmp_path / "lm" / "pre" / "seed0"
    before = tensorboard_events(run_dir)
    new_views = MATRIX_VIEWS  # a task added to the matrix file
    summaries = view_summaries(new_views)
    assert refresh_run_views(run_dir, summaries)
    [event_file] = run_dir.iterdir()
    assert run_views(run_dir) == [value.SerializeToString() for summary in summaries for value in summary.value]
    after = tensorboard_events(run_dir)
    assert after.Tags()["scalars"] == before.Tags()["scalars"]
    for tag in before.Tags()["scalars"]:
        assert [(e.step, e.value) for e in after.Scalars(tag)] == [(e.step, e.value) for e in before.Scalars(tag)]
    assert not refresh_run_views(run_dir, summaries)  # unchanged: left as it is
    assert list(run_dir.iterdir()) == [event_file]
    assert [c["title"] for c in Dashboards(tmp_path).layout()["category"]] == ["lm", "mt"]
    columns = [info["name"]["tag"] for info in Dashboards(tmp_path).experiment()["metricInfos"]]
    assert columns[0] == PRIMARY_METRIC_TAG


def test_refreshing_a_resumed_run_keeps_its_purge(tmp_path: Path) -> None:
    """A run killed after step 30 and resumed from a checkpoint of step 20 (two files, the second
    purging the steps from 20 on) reads the same after its views are rewritten."""
    first = CellLogger(tmp_path, "lm/pre", "seed0", scope="lm")
    log_views(first, views_of({"lm": LM_METRICS}))
    for step, values in LM_CURVES.items():
        first.log_metrics(values, step=step)
    first.close()
    resumed = CellLogger(tmp_path, "lm/pre", "seed0", scope="lm", purge_step=20)
    resumed.log_metrics({"val/loss": 1.5}, step=20)
    resumed.close()
    run_dir = tmp_path / "lm" / "pre" / "seed0"
    assert len(list(run_dir.iterdir())) == 2
    expected = [(10, 2.2), (20, 1.5)]
    assert [(e.step, pytest.approx(e.value)) for e in tensorboard_events(run_dir).Scalars("1_val/lm/loss")] == expected
    assert refresh_run_views(run_dir, view_summaries(MATRIX_VIEWS))
    assert len(list(run_dir.iterdir())) == 1
    assert [(e.step, pytest.approx(e.value)) for e in tensorboard_events(run_dir).Scalars("1_val/lm/loss")] == expected


def test_a_run_resumed_within_the_second_it_started_is_read_after_it(tmp_path: Path) -> None:
    """Writers name their files by the second, then pid and counter as text: an earlier file of the
    same second can sort after a new one (counter 9 vs 10, or a larger pid). The resumed run's file
    waits for a later second, so TensorBoard reads it last and its purge drops the right points."""
    run_dir = tmp_path / "lm" / "pre" / "seed0"
    first = CellLogger(tmp_path, "lm/pre", "seed0", scope="lm")
    for step, values in LM_CURVES.items():
        first.log_metrics(values, step=step)
    first.close()
    (earlier,) = run_dir.iterdir()
    # the same run, as if it had started in the coming second with a name sorting after every writer's
    stamp = int(time.time()) + 1
    earlier.rename(run_dir / f"events.out.tfevents.{stamp:010d}.zzzz.99999.99")
    resumed = CellLogger(tmp_path, "lm/pre", "seed0", scope="lm", purge_step=20)
    resumed.log_metrics({"val/loss": 1.5}, step=20)
    resumed.close()
    assert time.time() >= stamp + 1
    expected = [(10, 2.2), (20, 1.5)]
    assert [(e.step, pytest.approx(e.value)) for e in tensorboard_events(run_dir).Scalars("1_val/lm/loss")] == expected


def test_publishing_views_removes_the_runs_older_versions_wrote(tmp_path: Path) -> None:
    """Older versions wrote the experiment and the layout to runs of their own, and named cell runs
    after their folders: the runner deletes the former and moves the latter to the short names."""
    tb_dir = tmp_path / "tb"
    for legacy in (".hparams", ".layout"):
        (tb_dir / legacy).mkdir(parents=True)
        (tb_dir / legacy / "events.out.tfevents.1.x").write_bytes(b"")
    run_cell(tb_dir, "lm", "norm_placement=pre", 0, LM_CURVES, views=None)
    run_cell(tb_dir, "lm", "norm_placement=post", 0, LM_CURVES, views=None)
    run_cell(tb_dir, "lm", "post", 0, LM_CURVES, views=None)  # retrained since: the old run is obsolete
    runs = {"lm/norm_placement=pre/seed0": "lm/pre/seed0", "lm/norm_placement=post/seed0": "lm/post/seed0"}
    move_runs(tb_dir, runs)
    publish_views(tb_dir, MATRIX_VIEWS, runs.values())
    assert {Path(run).relative_to(tb_dir).as_posix() for run in io_wrapper.GetLogdirSubdirectories(str(tb_dir))} == {
        "lm/pre/seed0",
        "lm/post/seed0",
    }
    assert sorted(path.name for path in (tb_dir / "lm").iterdir()) == ["post", "pre"]  # no empty folders left
    assert json.loads((tb_dir / TB_VIEWS_FILE).read_text()) == MATRIX_VIEWS
    for run in runs.values():
        assert run_views(tb_dir / run) == [
            value.SerializeToString() for summary in view_summaries(MATRIX_VIEWS) for value in summary.value
        ]


def test_views_file_round_trips_to_the_same_summaries(tmp_path: Path) -> None:
    """The runner writes the views as JSON, each cell reads them back: the same bytes, so that an
    unchanged matrix rewrites no run."""
    publish_views(tmp_path, MATRIX_VIEWS, [])
    again = json.loads((tmp_path / TB_VIEWS_FILE).read_text())
    assert [s.SerializeToString() for s in view_summaries(again)] == [
        s.SerializeToString() for s in view_summaries(MATRIX_VIEWS)
    ]


def test_a_task_axis_given_as_a_mapping_shows_as_its_label_in_the_hparams_table(tmp_path):
    """The smoke matrix configures each task inline (``task: [{name: lm, n_train_tokens: ...}]``)."""
    from helpers import TINY_LM_TASK, write_matrix

    from blockbench.matrix.expand import load_matrix

    path = write_matrix(tmp_path, {"task": [{**TINY_LM_TASK, "label": "small_lm"}], "seed": [0]})
    [cell] = load_matrix(path)[1]
    assert cell.hparams == {"task": "small_lm", "seed": 0} and isinstance(cell.axes["task"], dict)
