"""What ``pip install`` puts on a user's machine: one top-level package, ``blockbench``, with the block
library and the tasks inside it (``blockbench.models``, ``blockbench.tasks``), never top-level
``models`` or ``tasks`` packages that would shadow, or be shadowed by, another project's."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import REPO


def build_wheel(folder: Path) -> Path:
    """The project's wheel, built from this checkout as pip builds it (an isolated build environment)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(folder), str(REPO)],
        check=True,
        capture_output=True,
    )
    [wheel] = folder.glob("blockbench_transformers-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_holds_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"blockbench"}
    for module in (
        "blockbench/models/attention.py",
        "blockbench/tasks/lm.py",
        "blockbench/tasks/data/text.py",
        "blockbench/cell/train.py",
        "blockbench/matrix/run.py",
        "blockbench/report/summary.py",
    ):
        assert module in names
    # every Python file of the checkout's packages is in the wheel, where the namespace puts it
    for folder, installed in (
        ("models", "blockbench/models"),
        ("tasks", "blockbench/tasks"),
        ("blockbench", "blockbench"),
    ):
        for path in (REPO / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                assert f"{installed}/{path.relative_to(REPO / folder).as_posix()}" in names, path


@pytest.mark.slow  # a virtual environment and the smoke matrix: minutes
def test_a_fresh_non_editable_install_trains_the_smoke_matrix(wheel, tmp_path):
    """The wheel in a new virtual environment (the heavy dependencies from this one), run outside
    the checkout: the smoke matrix trains all 12 cells from the installed package alone."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], check=True
    )
    where = subprocess.run(
        [str(python), "-c", "import blockbench.models, blockbench; print(blockbench.models.__file__)"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert str(venv) in where  # the wheel's copy, not the checkout's
    done = subprocess.run(
        [str(python), "-m", "blockbench", "matrix", str(REPO / "configs/matrix/smoke.yaml"), "--jobs", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "to train 12 cells" in done.stdout
        and len(list((tmp_path / "runs/smoke/cells").glob("*/*/*/result.json"))) == 12
    )
