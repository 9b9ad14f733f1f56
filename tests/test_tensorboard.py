"""HParams and Custom Scalars data of a matrix, read back from the event files and through
TensorBoard's own plugins (the HTTP API the dashboards call)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.custom_scalar import custom_scalars_plugin, layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalars_metadata
from tensorboard.plugins.hparams import api_pb2, hparams_plugin, metadata
from tensorboard.plugins.scalar import scalars_plugin
from werkzeug.test import Client

from blockbench.perf import FINAL_FIGURES, throughput_tag
from blockbench.tensorboard import (
    EXPERIMENT_RUN,
    LAYOUT_RUN,
    SUPERSEDED_FILE_GRACE_S,
    hparam_value,
    log_cell_hparams,
    write_custom_scalars_layout,
    write_hparams_experiment,
)
from conftest import tensorboard_events

ALL_STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]


def cell_logger(tb_dir: Path, task: str, variant: str, seed: int) -> TensorBoardLogger:
    """The logger a matrix cell trains with."""
    return TensorBoardLogger(save_dir=str(tb_dir), name=f"{task}/{variant}", version=f"seed{seed}", default_hp_metric=False)


def run_cell(
    tb_dir: Path,
    task: str,
    variant: str,
    seed: int,
    curves: dict[int, dict[str, float]],
    final: dict[str, float] | None = None,
    status: str = "ok",
    **hparams: Any,
) -> TensorBoardLogger:
    """Log ``curves`` (step -> val metrics) as training would, finish the logger as Lightning does
    after fit, then record the cell; ``final`` defaults to the last step's metrics."""
    logger = cell_logger(tb_dir, task, variant, seed)
    for step, values in curves.items():
        logger.log_metrics(values, step=step)
    logger.finalize("success")
    last_step = max(curves)
    hparams = {"task": task, "model.norm_placement": variant, "seed": seed, **hparams}
    log_cell_hparams(logger, hparams, curves[last_step] if final is None else final, status=status, step=last_step)
    logger.finalize("success")
    return logger


def hparams_content(run_dir: Path) -> dict[str, bytes]:
    return tensorboard_events(run_dir).PluginTagToContent(metadata.PLUGIN_NAME)


class Dashboards:
    """TensorBoard's backend for a log dir: the HParams and Custom Scalars plugins' HTTP routes."""

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
        self.reload()

    def reload(self) -> None:
        self.multiplexer.AddRunsFromDirectory(str(self.tb_dir))
        self.multiplexer.Reload()

    def experiment(self) -> dict[str, Any]:
        return self.hparams.post("/experiment", data=json.dumps({})).json

    def session_groups(self, **request: Any) -> list[dict[str, Any]]:
        request = {"startIndex": 0, "sliceSize": 100, "allowedStatuses": ALL_STATUSES, **request}
        return self.hparams.post("/session_groups", data=json.dumps(request)).json.get("sessionGroups", [])

    def layout(self) -> dict[str, Any]:
        return self.custom_scalars.get("/layout").json


def _routes(plugin: base_plugin.TBPlugin):
    apps = plugin.get_plugin_apps()

    def app(environ, start_response):
        return apps[environ["PATH_INFO"]](environ, start_response)

    return app


def metric_values(group: dict[str, Any]) -> dict[str, float]:
    return {m["name"]["tag"]: m["value"] for m in group.get("metricValues", [])}


LM_CURVES = {10: {"val/perplexity": 9.0, "val/loss": 2.2}, 20: {"val/perplexity": 8.0, "val/loss": 2.1},
             30: {"val/perplexity": 7.0, "val/loss": 1.9}}


# --- log_cell_hparams: what the cell's run holds ---------------------------------------------------


def test_session_start_holds_the_hparams_with_their_types(tmp_path: Path) -> None:
    logger = run_cell(tmp_path, "lm", "post", 1, LM_CURVES, **{"model.dropout": 0.1, "model.tied": True, "model.window": None})
    content = hparams_content(Path(logger.log_dir))
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    values = {name: value.WhichOneof("kind") for name, value in start.hparams.items()}
    assert values == {"task": "string_value", "model.norm_placement": "string_value", "seed": "number_value",
                      "model.dropout": "number_value", "model.tied": "bool_value", "model.window": "string_value",
                      "status": "string_value"}
    assert start.hparams["task"].string_value == "lm"
    assert start.hparams["seed"].number_value == 1.0
    assert start.hparams["model.dropout"].number_value == pytest.approx(0.1)
    assert start.hparams["model.tied"].bool_value is True
    assert start.hparams["model.window"].string_value == "None"
    assert start.hparams["status"].string_value == "ok"
    assert start.group_name == "lm/post/seed1"  # one row per cell, named after its run
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS
    assert metadata.EXPERIMENT_TAG not in content  # the matrix declares the one experiment


def test_final_metrics_are_own_scalars_and_val_curves_are_untouched(tmp_path: Path) -> None:
    logger = run_cell(tmp_path, "lm", "pre", 0, LM_CURVES)
    acc = tensorboard_events(Path(logger.log_dir))
    for name in ("val/perplexity", "val/loss"):
        curve = [(e.step, e.value) for e in acc.Scalars(name)]
        assert curve == [(step, pytest.approx(values[name])) for step, values in LM_CURVES.items()]
        final = [(e.step, e.value) for e in acc.Scalars(f"final/{name}")]
        assert final == [(30, pytest.approx(LM_CURVES[30][name]))]


@pytest.mark.parametrize("final", [{}, {"val/perplexity": math.nan, "val/loss": math.inf}])
def test_diverged_cell_has_a_session_and_no_non_finite_metrics(tmp_path: Path, final: dict[str, float]) -> None:
    logger = run_cell(tmp_path, "lm", "post", 0, {10: {"val/perplexity": 9.0}}, final=final, status="diverged")
    content = hparams_content(Path(logger.log_dir))
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["status"].string_value == "diverged"
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_FAILURE
    assert not [tag for tag in tensorboard_events(Path(logger.log_dir)).Tags()["scalars"] if tag.startswith("final/")]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("pre", "pre"), (3, 3), (0.5, 0.5), (True, True), (None, "None"), (math.nan, "nan"), ([1, 2], "[1, 2]")],
)
def test_hparam_values_are_bool_number_or_string(value: Any, expected: Any) -> None:
    assert hparam_value(value) == expected
    assert type(hparam_value(value)) is type(expected)


# --- what the HParams dashboard shows --------------------------------------------------------------


def run_matrix(tb_dir: Path) -> None:
    """Two tasks sharing val/loss; one diverged cell."""
    run_cell(tb_dir, "lm", "pre", 0, LM_CURVES)
    run_cell(tb_dir, "lm", "post", 0, {10: {"val/perplexity": 50.0, "val/loss": 4.0}}, status="diverged",
             final={"val/perplexity": math.nan, "val/loss": math.nan})
    run_cell(tb_dir, "mt", "pre", 0, {10: {"val/bleu": 3.0, "val/loss": 2.0}, 20: {"val/bleu": 12.5, "val/loss": 1.5}})


MATRIX_HPARAMS = [{"task": t, "model.norm_placement": v, "seed": 0} for t in ("lm", "mt") for v in ("pre", "post")]
MATRIX_METRICS = {"val/perplexity": "validation perplexity", "val/bleu": "corpus BLEU", "val/loss": "cross-entropy"}


def test_hparams_dashboard_lists_every_cell_with_its_final_metrics(tmp_path: Path) -> None:
    write_hparams_experiment(tmp_path, MATRIX_HPARAMS, MATRIX_METRICS)
    run_matrix(tmp_path)
    dashboards = Dashboards(tmp_path)

    experiment = dashboards.experiment()
    hparams = {info["name"]: info for info in experiment["hparamInfos"]}
    assert set(hparams) == {"task", "model.norm_placement", "seed", "status"}
    assert hparams["task"]["type"] == "DATA_TYPE_STRING" and hparams["task"]["domainDiscrete"] == ["lm", "mt"]
    assert hparams["seed"]["type"] == "DATA_TYPE_FLOAT64" and hparams["seed"]["domainDiscrete"] == [0.0]
    assert set(hparams["status"]["domainDiscrete"]) >= {"ok", "diverged"}
    metrics = {info["name"]["tag"]: info for info in experiment["metricInfos"]}
    assert set(metrics) == {"final/val/perplexity", "final/val/bleu", "final/val/loss"}
    assert metrics["final/val/bleu"]["displayName"] == "val/bleu"
    assert metrics["final/val/bleu"]["description"] == "corpus BLEU"

    groups = {group["name"]: group for group in dashboards.session_groups()}
    assert set(groups) == {"lm/pre/seed0", "lm/post/seed0", "mt/pre/seed0"}
    assert groups["lm/pre/seed0"]["hparams"] == {"task": "lm", "model.norm_placement": "pre", "seed": 0.0, "status": "ok"}
    assert metric_values(groups["lm/pre/seed0"]) == {"final/val/perplexity": 7.0, "final/val/loss": pytest.approx(1.9)}
    assert metric_values(groups["mt/pre/seed0"]) == {"final/val/bleu": 12.5, "final/val/loss": 1.5}
    assert groups["lm/post/seed0"]["hparams"]["status"] == "diverged"
    assert groups["lm/post/seed0"]["sessions"][0]["status"] == "STATUS_FAILURE"
    assert metric_values(groups["lm/post/seed0"]) == {}

    # filter on an hparam, sort by a metric: what the dashboard's controls send
    diverged = dashboards.session_groups(colParams=[{"hparam": "status", "filterDiscrete": ["diverged"]}])
    assert [group["name"] for group in diverged] == ["lm/post/seed0"]
    by_loss = dashboards.session_groups(colParams=[{"metric": {"tag": "final/val/loss"}, "order": "ORDER_ASC"}])
    assert [group["name"] for group in by_loss][:2] == ["mt/pre/seed0", "lm/pre/seed0"]


def test_speed_figures_are_hparams_columns_next_to_the_metrics(tmp_path: Path) -> None:
    """The runner passes a cell's final speed figures with its final metrics; a diverged cell has
    speed figures but no metrics."""
    write_hparams_experiment(tmp_path, MATRIX_HPARAMS, {**MATRIX_METRICS, **FINAL_FIGURES,
                                                        throughput_tag("tokens"): "tokens/s, all processes"})
    speed = {"perf/step_time_ms": 8.5, "perf/mfu": 0.25, "perf/tokens_per_sec": 12000.0}
    run_cell(tmp_path, "lm", "pre", 0, LM_CURVES, final={**LM_CURVES[30], **speed})
    run_cell(tmp_path, "lm", "post", 0, {10: {"val/perplexity": 50.0}}, status="diverged",
             final={"perf/step_time_ms": 9.0, "perf/mfu": 0.125})
    dashboards = Dashboards(tmp_path)
    columns = {info["name"]["tag"]: info for info in dashboards.experiment()["metricInfos"]}
    assert {"final/perf/step_time_ms", "final/perf/mfu", "final/perf/data_wait_fraction", "final/perf/tflops_per_sec",
            "final/perf/peak_memory_mb", "final/perf/tokens_per_sec"} <= set(columns)
    assert columns["final/perf/mfu"]["displayName"] == "perf/mfu"
    groups = {group["name"]: group for group in dashboards.session_groups()}
    assert metric_values(groups["lm/pre/seed0"]) == {"final/val/perplexity": 7.0, "final/val/loss": pytest.approx(1.9),
                                                     "final/perf/step_time_ms": 8.5, "final/perf/mfu": 0.25,
                                                     "final/perf/tokens_per_sec": 12000.0}
    assert metric_values(groups["lm/post/seed0"]) == {"final/perf/step_time_ms": 9.0, "final/perf/mfu": 0.125}
    by_mfu = dashboards.session_groups(colParams=[{"metric": {"tag": "final/perf/mfu"}, "order": "ORDER_DESC"}])
    assert [group["name"] for group in by_mfu] == ["lm/pre/seed0", "lm/post/seed0"]


def test_hparams_dashboard_lists_cells_without_a_matrix_experiment(tmp_path: Path) -> None:
    """A cell trained alone (no experiment written): TensorBoard derives the columns from the runs."""
    run_matrix(tmp_path)
    dashboards = Dashboards(tmp_path)
    experiment = dashboards.experiment()
    assert {info["name"] for info in experiment["hparamInfos"]} == {"task", "model.norm_placement", "seed", "status"}
    assert "final/val/perplexity" in {info["name"]["tag"] for info in experiment["metricInfos"]}
    groups = {group["name"]: group for group in dashboards.session_groups()}
    assert set(groups) == {"lm/pre/seed0", "lm/post/seed0", "mt/pre/seed0"}
    assert metric_values(groups["lm/pre/seed0"])["final/val/perplexity"] == 7.0


def test_experiment_is_replaced_not_added_to(tmp_path: Path) -> None:
    write_hparams_experiment(tmp_path, MATRIX_HPARAMS, {"val/perplexity": "validation perplexity"})
    write_hparams_experiment(tmp_path, MATRIX_HPARAMS, MATRIX_METRICS)
    files = sorted((tmp_path / EXPERIMENT_RUN).iterdir())
    assert len(files) == 1
    write_hparams_experiment(tmp_path, MATRIX_HPARAMS, MATRIX_METRICS)  # unchanged: left alone
    assert sorted((tmp_path / EXPERIMENT_RUN).iterdir()) == files
    experiment = Dashboards(tmp_path).experiment()
    assert {info["name"]["tag"] for info in experiment["metricInfos"]} == {f"final/{m}" for m in MATRIX_METRICS}


def test_hparams_with_mixed_types_get_a_string_domain(tmp_path: Path) -> None:
    cells = [{"model.window": None}, {"model.window": 64}, {"model.tied": True}, {"model.tied": False}]
    write_hparams_experiment(tmp_path, cells, {})
    hparams = {info["name"]: info for info in Dashboards(tmp_path).experiment()["hparamInfos"]}
    assert hparams["model.window"]["type"] == "DATA_TYPE_STRING"
    assert hparams["model.window"]["domainDiscrete"] == ["64", "None"]
    assert hparams["model.tied"]["type"] == "DATA_TYPE_BOOL"


# --- Custom Scalars layout -------------------------------------------------------------------------

CHARTS = {"lm": ["val/perplexity", "val/loss"], "mt": ["val/bleu", "val/loss"]}


def read_layout(tb_dir: Path) -> layout_pb2.Layout:
    """The layout stored in the layout run (its newest one)."""
    events = tensorboard_events(tb_dir / LAYOUT_RUN).Tensors(custom_scalars_metadata.CONFIG_SUMMARY_TAG)
    return layout_pb2.Layout.FromString(events[-1].tensor_proto.string_val[0])


def test_layout_has_a_category_per_task_and_a_chart_per_metric(tmp_path: Path) -> None:
    write_custom_scalars_layout(tmp_path, CHARTS)
    layout = read_layout(tmp_path)
    charts = {c.title: {chart.title: list(chart.multiline.tag) for chart in c.chart} for c in layout.category}
    assert charts == {
        "lm": {"val/perplexity": ["^val/perplexity$"], "val/loss (runs of lm, mt)": ["^val/loss$"]},
        "mt": {"val/bleu": ["^val/bleu$"], "val/loss (runs of lm, mt)": ["^val/loss$"]},
    }


def test_layout_charts_gather_the_metric_of_every_variant(tmp_path: Path) -> None:
    run_matrix(tmp_path)
    write_custom_scalars_layout(tmp_path, CHARTS)
    dashboards = Dashboards(tmp_path)
    assert [c["title"] for c in dashboards.layout()["category"]] == ["lm", "mt"]
    runs_with_perplexity = [
        run for run in dashboards.multiplexer.Runs()
        if dashboards.custom_scalars.get("/scalars", query_string={"run": run, "tag": "^val/perplexity$"}).json["tag_to_events"]
    ]
    assert sorted(runs_with_perplexity) == ["lm/post/seed0", "lm/pre/seed0"]  # not final/val/perplexity's single points


def layout_files(tb_dir: Path) -> list[Path]:
    return sorted((tb_dir / LAYOUT_RUN).iterdir())


def test_unchanged_layout_is_left_alone(tmp_path: Path) -> None:
    write_custom_scalars_layout(tmp_path, CHARTS)
    files = layout_files(tmp_path)
    write_custom_scalars_layout(tmp_path, CHARTS)
    assert layout_files(tmp_path) == files and len(files) == 1


def test_newest_layout_wins_also_for_a_running_tensorboard(tmp_path: Path) -> None:
    write_custom_scalars_layout(tmp_path, {"lm": ["val/perplexity"]})
    running = Dashboards(tmp_path)  # a TensorBoard started before the rewrites
    for _ in range(3):
        write_custom_scalars_layout(tmp_path, CHARTS)
        write_custom_scalars_layout(tmp_path, {**CHARTS, "img": ["val/accuracy"]})
    assert [c.title for c in read_layout(tmp_path).category] == ["lm", "mt", "img"]
    running.reload()
    assert [c["title"] for c in running.layout()["category"]] == ["lm", "mt", "img"]
    assert [c["title"] for c in Dashboards(tmp_path).layout()["category"]] == ["lm", "mt", "img"]


def test_layout_files_superseded_long_ago_are_deleted(tmp_path: Path) -> None:
    for charts in ({"lm": ["val/perplexity"]}, CHARTS):
        write_custom_scalars_layout(tmp_path, charts)
    long_ago = time.time() - 2 * SUPERSEDED_FILE_GRACE_S
    for path in layout_files(tmp_path):
        os.utime(path, (long_ago, long_ago))
    write_custom_scalars_layout(tmp_path, {"img": ["val/accuracy"]})
    files = layout_files(tmp_path)
    assert len(files) == 2  # the previous one, superseded just now, stays for running TensorBoards
    write_custom_scalars_layout(tmp_path, {"img": ["val/accuracy"]})  # unchanged, but still tidies up
    assert layout_files(tmp_path) == files
    os.utime(files[-1], (long_ago, long_ago))
    write_custom_scalars_layout(tmp_path, {"img": ["val/accuracy"]})
    assert layout_files(tmp_path) == files[-1:]
    assert [c.title for c in read_layout(tmp_path).category] == ["img"]
