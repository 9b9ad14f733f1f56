"""Re-exports, for ``blockbench.cell.tensorboard`` alone, the views it takes from ``blockbench.tensorboard``."""

from .tensorboard.events import VIEW_TAGS, write_event_file
from .tensorboard.views import (
    LENS_CHART,
    Views,
    matrix_views,
    session_end,
    session_start,
    view_summaries,
)

__all__ = [
    "LENS_CHART",
    "VIEW_TAGS",
    "Views",
    "matrix_views",
    "session_end",
    "session_start",
    "view_summaries",
    "write_event_file",
]
