"""This process's random generators captured and restored as one state: what a checkpoint saves so
that a resumed run draws the numbers an uninterrupted one does (the runner's callbacks, and each
DataLoader worker's augmentation through ``tasks.base.WorkerRngState``). Torch and numpy only, so that
code outside Lightning can use it.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """This process's random generators (python, numpy, torch, CUDA), as tensors and plain values so
    that a checkpoint holding them loads with ``torch.load(weights_only=True)``."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    numpy_state = [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gaussian]
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set this process's random generators to a state from :func:`capture_rng`."""
    random.setstate(state["python"])
    name, keys, position, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
