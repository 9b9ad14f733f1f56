"""Re-exports, for ``blockbench.cell.tensorboard`` alone, the names it takes from ``blockbench.tensorboard.names``."""

from .tensorboard.names import (
    CURVE_TAG,
    DROPPED_TAGS,
    PRIMARY_METRIC_TAG,
    STATUSES,
    final_metric_tag,
    hparam_value,
    run_tag,
)

__all__ = ["CURVE_TAG", "DROPPED_TAGS", "PRIMARY_METRIC_TAG", "STATUSES", "final_metric_tag", "hparam_value", "run_tag"]
