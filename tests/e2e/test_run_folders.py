"""No run is overwritten and no user run lands in the committed book: ``blockbench train`` gives each
config a folder of its own, refuses to replace another config's run unless ``--force``, says where it
writes; runs go to ``runs/`` (ignored by git) unless ``--results-dir results`` asks for the book."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import REPO, TINY_LM, blockbench

from blockbench.cli import BOOK_DIR, RUNS_DIR, build_parser, main, run_folder_name
from blockbench.store.record import load_record

#: a tiny LM run as ``blockbench train`` overrides
TINY_OVERRIDES = [
    f"{section}.{key}={value}"
    for section in ("model", "task", "trainer", "optimizer")
    for key, value in TINY_LM[section].items()
]


def _train(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return blockbench("--results-dir", str(tmp_path / "runs"), "train", *TINY_OVERRIDES, *extra, cwd=tmp_path)


def _results(tmp_path: Path) -> dict[Path, dict]:
    return {path.parent: json.loads(path.read_text()) for path in (tmp_path / "runs" / "train").rglob("result.json")}


@pytest.mark.slow  # several training processes (about a minute); run with -m slow
def test_runs_of_other_configs_keep_their_own_folders(tmp_path):
    first = _train(tmp_path)
    assert first.returncode == 0, first.stderr
    [(folder, result)] = _results(tmp_path).items()
    assert f"training into {folder}" in first.stdout and f"result in {folder / 'result.json'}" in first.stdout
    second = _train(tmp_path, "model.norm_placement=post")
    assert second.returncode == 0, second.stderr
    results = _results(tmp_path)
    assert len(results) == 2 and results[folder] == result  # the first run is untouched
    [other] = set(results) - {folder}
    assert other.parent == folder.parent and other.name.endswith(f"-{results[other]['config_hash'][:8]}")
    assert yaml.safe_load((other / "config.yaml").read_text())["model"]["norm_placement"] == "post"
    assert yaml.safe_load((folder / "config.yaml").read_text())["model"]["norm_placement"] == "pre"
    # TensorBoard: a run per folder, not one shared seed0 run that the next train deletes
    assert {p.name for p in (tmp_path / "runs" / "train" / "tb" / "lm").iterdir()} == {folder.name, other.name}

    again = _train(tmp_path)  # the same config again: its finished run is kept and named
    assert again.returncode == 0 and "already holds this config's result" in again.stdout
    assert _results(tmp_path)[folder] == result

    # --out into the other run's folder: refused, nothing replaced; --force replaces it
    refused = _train(tmp_path, "--out", str(other))
    assert (
        refused.returncode == 2
        and "holds the result of another config" in refused.stderr
        and "--force" in refused.stderr
    )
    assert load_record(other / "result.json").config_hash == results[other]["config_hash"]
    forced = _train(tmp_path, "--out", str(other), "--force")
    assert forced.returncode == 0, forced.stderr
    assert load_record(other / "result.json").config_hash == result["config_hash"]


def test_run_folder_names_say_what_changed_and_differ_by_config():
    assert run_folder_name(None, {}, "0123456789abcdef") == "defaults-01234567"
    assert (
        run_folder_name(
            "configs/real.yaml",
            {"task": "lm", "model.norm_placement": "post", "optimizer.lr": 0.001},
            "fedcba9876543210",
        )
        == "real,norm_placement=post,lr=0.001-fedcba98"
    )
    long = run_folder_name(None, {f"model.key{i}": 1000 * i for i in range(20)}, "0" * 16)
    assert long == "key0=0,key1=1000,key2=2000,key3=3000,key4=4000,key5=5000,+14-00000000"  # 6 shown, 14 more


def test_user_runs_go_to_an_ignored_folder_not_the_book(tmp_path, monkeypatch, capsys):
    assert build_parser().parse_args(["matrix", "m.yaml"]).results_dir == RUNS_DIR != BOOK_DIR
    assert build_parser().parse_args(["train"]).results_dir == RUNS_DIR
    ignored = subprocess.run(
        ["git", "check-ignore", f"{RUNS_DIR}/smoke/summary.md", f"{RUNS_DIR}/README.md"], cwd=REPO, capture_output=True
    )
    assert ignored.returncode == 0, f"git does not ignore {RUNS_DIR}/: add it to .gitignore"
    # the README's first command in a fresh clone: every cell of the smoke matrix is to train, none is
    # reused from the committed book
    monkeypatch.chdir(tmp_path)
    assert main(["matrix", str(REPO / "configs" / "matrix" / "smoke.yaml"), "--dry-run", "--jobs", "1"]) == 0
    assert "to train 12 cells" in capsys.readouterr().out
    assert not (tmp_path / RUNS_DIR).exists()  # a dry run writes nothing
