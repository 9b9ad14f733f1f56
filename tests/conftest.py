import os

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
    ~/.cache/blockbench. Tests that check the cache itself point BLOCKBENCH_CACHE at their own folder."""
    before = os.environ.get("BLOCKBENCH_CACHE")
    os.environ["BLOCKBENCH_CACHE"] = str(tmp_path_factory.mktemp("blockbench_cache"))
    yield
    if before is None:
        os.environ.pop("BLOCKBENCH_CACHE", None)
    else:
        os.environ["BLOCKBENCH_CACHE"] = before
