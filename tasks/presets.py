"""Named real-data task settings: ``task: wikitext103`` expands to a preset's ``task:`` mapping.

Keys given next to a preset name refine it (``task: {name: wikitext103, seq_len: 512}``). The
preset name becomes the task's label, the row name in summaries. Hub presets download on
first use and come from the HF cache afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskPreset:
    description: str
    task: dict[str, Any]


TASK_PRESETS: dict[str, TaskPreset] = {}
