"""The code fingerprint covers exactly the code that can change a cell's numbers: the block library,
the tasks, the trainer and the config resolution. Editing the runner, the planner, the CLI, the
record reader or the report must leave every committed result current; editing any fingerprinted
place must not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from blockbench.provenance import FINGERPRINTED, code_fingerprint, fingerprinted_sources, source_fingerprint


@pytest.fixture()
def tree(tmp_path: Path) -> dict[str, Path]:
    """A copy of the fingerprinted sources and of the rest of ``blockbench``, laid out as installed."""
    sources = fingerprinted_sources()
    root = sources["blockbench.cell"].parent  # the blockbench package
    shutil.copytree(root, tmp_path / "blockbench", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("models", "tasks"):  # the repository's top-level folders, installed as blockbench.models, .tasks
        shutil.copytree(sources[f"blockbench.{name}"], tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    return {
        "blockbench.models": tmp_path / "models",
        "blockbench.tasks": tmp_path / "tasks",
        "blockbench.cell": tmp_path / "blockbench" / "cell",
        "blockbench.config": tmp_path / "blockbench" / "config.py",
    }


def test_the_fingerprint_is_of_the_installed_sources(tree):
    assert tuple(fingerprinted_sources()) == FINGERPRINTED
    assert source_fingerprint(tree) == code_fingerprint()  # a copy of the same code: the same digest


@pytest.mark.parametrize(
    "place",
    [
        "blockbench/cli.py",
        "blockbench/listing.py",
        "blockbench/store/record.py",
        "blockbench/progress.py",
        "blockbench/store/layout.py",
        "blockbench/matrix/plan.py",
        "blockbench/matrix/run.py",
        "blockbench/report/summary.py",
        "blockbench/report/stats.py",
        "blockbench/matrix/launch.py",
        "blockbench/matrix/expand.py",
        "blockbench/matrix/jobs.py",
        "blockbench/lifeline.py",
    ],
)
def test_a_change_outside_the_fingerprint_keeps_it(tree, place):
    before = source_fingerprint(tree)
    file = tree["blockbench.models"].parent / place
    assert file.is_file(), f"{place} moved: update this test's list of unfingerprinted places"
    file.write_text(file.read_text() + "\n# an edit\n")
    assert source_fingerprint(tree) == before


@pytest.mark.parametrize(
    "place",
    [
        "models/attention.py",
        "models/__init__.py",
        "tasks/lm.py",
        "tasks/data/text.py",
        "blockbench/cell/train.py",
        "blockbench/cell/callbacks.py",
        "blockbench/config.py",
    ],
)
def test_a_change_inside_the_fingerprint_changes_it(tree, place):
    before = source_fingerprint(tree)
    file = tree["blockbench.models"].parent / place
    assert file.is_file(), f"{place} moved: update this test's list of fingerprinted places"
    file.write_text(file.read_text() + "\n# an edit\n")
    assert source_fingerprint(tree) != before


def test_a_new_file_inside_the_fingerprint_changes_it(tree):
    before = source_fingerprint(tree)
    (tree["blockbench.cell"] / "extra.py").write_text("X = 1\n")
    assert source_fingerprint(tree) != before
