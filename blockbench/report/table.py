"""Markdown table and number formatting shared by the summary's sections."""

from __future__ import annotations

from blockbench.tasks import Metric


def row(cells: list[str]) -> str:
    """One markdown table row."""
    return "| " + " | ".join(cells) + " |"


def table_head(header: list[str]) -> list[str]:
    """A markdown table's header and rule."""
    return [row(header), "|" + "---|" * len(header)]


def decimals(value: float) -> int:
    """Decimals to show for a metric of this size: 3 below 10, 2 below 100, else 1."""
    return 3 if abs(value) < 10 else 2 if abs(value) < 100 else 1


def fmt(value: float, digits: int | None = None, sign: bool = False) -> str:
    return f"{value:{'+' if sign else ''},.{decimals(value) if digits is None else digits}f}"


def arrow(metric: Metric) -> str:
    """``perplexity ↓``: a metric's name and which way is better."""
    return f"{metric.name} {'↑' if metric.higher_is_better else '↓'}"
