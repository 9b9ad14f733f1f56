"""Session set-up for every test, and the fixtures more than one test file requests: one torch
thread, a private blockbench cache for the session and for a single test. The plain names tests share
(tiny configs and models, matrices on disk, the ``blockbench`` command, TensorBoard events) are in
helpers.py: pytest discourages importing conftest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    """The test models are tiny: one intra-op thread is faster and keeps the runtime stable when
    other processes share the two cores (two spinning threads then slow down by 10x or more)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory):
    """The blockbench cache (prepared data, the measured peak FLOP/s that MFU divides by) in a folder
    of this test session, for the cells tests run in subprocesses too: no test reads or writes
    ~/.cache/blockbench. Tests that check the cache itself use ``cache_dir``, a folder of their own."""
    before = os.environ.get("BLOCKBENCH_CACHE")
    os.environ["BLOCKBENCH_CACHE"] = str(tmp_path_factory.mktemp("blockbench_cache"))
    yield
    if before is None:
        os.environ.pop("BLOCKBENCH_CACHE", None)
    else:
        os.environ["BLOCKBENCH_CACHE"] = before


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty blockbench cache of this test alone (not yet created), for this process and the
    subprocesses it starts: tests of what the cache holds, hits and leaves behind."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("BLOCKBENCH_CACHE", str(folder))
    return folder
