"""Summarise a matrix directory: ``summary.md`` (one table per task) and a tidy ``summary.csv``.

Per task x variant: each metric's mean ± std over seeds, the task's trivial baseline, steps,
wall time, parameters and throughput. Cells that failed are listed with their error.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tasks import TASK_CONFIGS

from .matrix import CELL_FILE
from .train import RESULT_FILE, write_atomic


@dataclass
class Group:
    """The cells of one task x variant (one per seed)."""

    task: str  # the row label (a preset name, or the task name)
    task_name: str  # the task kind, a key of TASK_CONFIGS
    variant: str
    index: int
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> list[dict[str, Any]]:
        return [r for r in self.results if r["status"] == "ok"]

    def values(self, key: str, metric: str | None = None) -> list[float]:
        return [r["metrics"][metric] if metric else r[key] for r in self.ok]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single seed)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def decimals(value: float) -> int:
    """Decimals to show for a metric of this size: 3 below 10, 2 below 100, else 1."""
    return 3 if abs(value) < 10 else 2 if abs(value) < 100 else 1


def fmt(value: float, digits: int | None = None) -> str:
    return f"{value:,.{decimals(value) if digits is None else digits}f}"


def load_groups(matrix_dir: Path) -> list[Group]:
    groups: dict[tuple[str, str], Group] = {}
    for cell_file in sorted((matrix_dir / "cells").glob(f"*/*/*/{CELL_FILE}")):
        result_file = cell_file.with_name(RESULT_FILE)
        if not result_file.is_file():
            continue  # not run yet (an interrupted matrix)
        cell = json.loads(cell_file.read_text())
        result = json.loads(result_file.read_text())
        group = groups.setdefault(
            (cell["task"], cell["variant"]),
            Group(cell["task"], cell.get("task_name", cell["task"]), cell["variant"], cell["index"]),
        )
        group.index = min(group.index, cell["index"])
        group.results.append(result)
    return sorted(groups.values(), key=lambda g: g.index)


RUN_FILE = "matrix_run.json"


def write_report(matrix_dir: Path) -> str:
    """Write ``summary.md`` and ``summary.csv`` for ``matrix_dir``; return the markdown."""
    groups = load_groups(matrix_dir)
    by_task: dict[str, list[Group]] = defaultdict(list)
    for group in groups:
        by_task[group.task].append(group)

    results = [r for g in groups for r in g.results]
    n_ok = sum(r["status"] == "ok" for r in results)
    machines = sorted({r["machine"] for r in results if "machine" in r})
    lines = [f"# {matrix_dir.name}", ""]
    matrix_file = matrix_dir / "matrix.yaml"  # the runner's copy of the matrix file
    if matrix_file.is_file():
        description = (yaml.safe_load(matrix_file.read_text()) or {}).get("description")
        lines += [description, ""] if description else []
    run_file = matrix_dir / RUN_FILE  # written by the runner: the command and its wall time
    if run_file.is_file():
        run = json.loads(run_file.read_text())
        lines.append(f"Command: `{run['command']}` (last run: {run['wall_time_s'] / 60:.1f} min, {run['cells_trained']} cells trained)  ")
    lines.append(f"Cells: {len(results)} ({n_ok} ok, {len(results) - n_ok} failed)  ")
    lines += [f"Machine: {m}  " for m in machines]
    lines.append("")
    csv_rows = []
    for task, task_groups in by_task.items():
        task_cfg = TASK_CONFIGS[task_groups[0].task_name]
        metrics = task_cfg.metrics
        lines += [f"## {task}: {task_cfg.description}", ""]
        header = ["variant"] + [f"{m.name} {'↑' if m.higher_is_better else '↓'}" for m in metrics]
        header += ["seeds", "steps", "wall time (s)", "parameters", f"throughput ({task_cfg.throughput_unit}/s)"]
        # sparse attention cells record the share of (query, key) pairs they attend
        sparse = any("attended_fraction" in r for g in task_groups for r in g.ok)
        if sparse:
            header.append("attended pairs")
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for group in task_groups:
            if not group.ok:
                lines.append(f"| {group.variant} | " + " | ".join(["failed"] * (len(header) - 1)) + " |")
                continue
            row = [group.variant]
            for metric in metrics:
                mean, std = mean_std(group.values("metrics", metric.name))
                row.append(f"{fmt(mean)} ± {fmt(std, decimals(mean))}")
                csv_rows.append(_csv_row(group, metric.name, mean, std))
            seeds = f"{len(group.ok)}" + (f" ({len(group.results) - len(group.ok)} failed)" if len(group.ok) < len(group.results) else "")
            row += [
                seeds,
                str(round(statistics.fmean(group.values("steps")))),
                f"{statistics.fmean(group.values('wall_time_s')):.1f}",
                f"{group.ok[0]['parameters']:,}",
                f"{statistics.fmean(group.values('throughput')):,.0f}",
            ]
            if sparse:
                row.append(f"{group.ok[0].get('attended_fraction', 1.0):.3f}")
            lines.append("| " + " | ".join(row) + " |")
        baselines = next((g.ok[0]["baselines"] for g in task_groups if g.ok), {})
        if baselines:
            cells = [fmt(baselines[m.name]) if m.name in baselines else "" for m in metrics]
            lines.append("| *trivial baseline* | " + " | ".join(cells) + " |" + " |" * (len(header) - 1 - len(metrics)))
        lines += ["", f"Trivial baseline: {task_cfg.baseline_description}", ""]

    failures = [(g, r) for g in groups for r in g.results if r["status"] != "ok"]
    if failures:
        lines += ["## Failed cells", ""]
        lines += [f"- `{g.task}/{g.variant}/seed{r['seed']}`: {r['error']}" for g, r in failures]
        lines.append("")

    markdown = "\n".join(lines)
    write_atomic(matrix_dir / "summary.md", markdown)
    write_atomic(matrix_dir / "summary.csv", _to_csv(csv_rows))
    return markdown


def _csv_row(group: Group, metric: str, mean: float, std: float) -> dict[str, Any]:
    first = group.ok[0]
    return {
        "task": group.task,
        "variant": group.variant,
        "metric": metric,
        "mean": mean,
        "std": std,
        "seeds": len(group.ok),
        "baseline": first["baselines"].get(metric, ""),
        "steps": first["steps"],
        "wall_time_s": statistics.fmean(group.values("wall_time_s")),
        "parameters": first["parameters"],
        "throughput": statistics.fmean(group.values("throughput")),
        "throughput_unit": first["throughput_unit"],
    }


def _to_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()
