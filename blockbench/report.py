"""Summarise a matrix directory: ``summary.md``, a tidy ``summary.csv`` and ``plots/<task>.png``.

Per task x variant: each metric's mean ± std over seeds, the task's trivial baseline, steps,
wall time, parameters, and the speed figures (step time, throughput, MFU, data wait, peak memory;
means over seeds); then each metric's 95% confidence interval over seeds
(Student t), its difference from the matrix's baseline variant with a 95% Welch interval, the
steps and seconds to reach the matrix's ``targets``, and the validation curves. Statistics use
the seeds that finished; seeds that diverged and cells that failed are counted and listed.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tasks import TASK_CONFIGS, Metric

from .matrix import CELL_FILE
from .perf import speed_figures
from .plots import VariantCurves, plot_task
from .stats import Difference, mean_std, t_confidence_interval, time_to_target, welch_difference
from .train import RESULT_FILE, write_atomic

__all__ = ["Group", "load_groups", "mean_std", "write_report", "RUN_FILE"]

RUN_FILE = "matrix_run.json"
PLOTS_DIR = "plots"
LEVEL = 0.95  # confidence level of every interval in the summary
SIGNIFICANT = "✓"  # marks a difference whose interval excludes zero


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
        return [r for r in self.results if r.get("status") == "ok"]

    @property
    def diverged(self) -> list[dict[str, Any]]:
        return [r for r in self.results if r.get("status") == "diverged"]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.results if r.get("status") not in ("ok", "diverged")]

    def values(self, key: str, metric: str | None = None) -> list[float]:
        """``key`` (or ``metrics[metric]``) of every finished seed."""
        return [r["metrics"][metric] if metric else r[key] for r in self.ok]

    def speed_values(self, figure: str) -> list[float]:
        """A speed figure (see :data:`SPEED_FIGURES`) of every finished seed that recorded it."""
        values = (speed_figures(r)[figure] for r in self.ok)
        return [v for v in values if v is not None]

    def speed_mean(self, figure: str) -> float | None:
        values = self.speed_values(figure)
        return statistics.fmean(values) if values else None

    @property
    def status_without_ok(self) -> str:
        """What a group without a finished seed shows instead of numbers."""
        return "diverged" if self.diverged else "failed"

    def seeds_label(self) -> str:
        """``3``, or ``2 (1 diverged)``, ``0 (2 diverged, 1 failed)``."""
        extra = [f"{len(rs)} {name}" for name, rs in (("diverged", self.diverged), ("failed", self.failed)) if rs]
        return f"{len(self.ok)}" + (f" ({', '.join(extra)})" if extra else "")


def _performance(result: dict[str, Any]) -> dict[str, Any]:
    return result.get("performance") or {}


#: the speed figures of a result, by their summary.csv column (see ``blockbench.perf.speed_figures``)
SPEED_FIGURES = tuple(speed_figures({}))


@dataclass(frozen=True)
class MatrixSettings:
    """What the report reads from the runner's copy of the matrix file."""

    description: str = ""
    baseline_variant: str | None = None
    targets: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def load(cls, matrix_dir: Path) -> "MatrixSettings":
        path = matrix_dir / "matrix.yaml"
        raw = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
        targets = {str(task): {str(m): float(v) for m, v in (metrics or {}).items()}
                   for task, metrics in (raw.get("targets") or {}).items()}
        return cls(raw.get("description") or "", raw.get("baseline_variant"), targets)


def decimals(value: float) -> int:
    """Decimals to show for a metric of this size: 3 below 10, 2 below 100, else 1."""
    return 3 if abs(value) < 10 else 2 if abs(value) < 100 else 1


def fmt(value: float, digits: int | None = None, sign: bool = False) -> str:
    return f"{value:{'+' if sign else ''},.{decimals(value) if digits is None else digits}f}"


def load_groups(matrix_dir: Path) -> list[Group]:
    """Every task x variant with a result, in matrix order."""
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
    for group in groups.values():
        group.results.sort(key=lambda r: r.get("seed", 0))
    return sorted(groups.values(), key=lambda g: g.index)


def write_report(matrix_dir: Path) -> str:
    """Write ``summary.md``, ``summary.csv`` and the plots for ``matrix_dir``; return the markdown."""
    matrix_dir = Path(matrix_dir)
    settings = MatrixSettings.load(matrix_dir)
    groups = load_groups(matrix_dir)
    by_task: dict[str, list[Group]] = defaultdict(list)
    for group in groups:
        by_task[group.task].append(group)
    baseline_variant = settings.baseline_variant or (groups[0].variant if groups else None)

    lines = _header(matrix_dir, settings, groups)
    csv_rows: list[dict[str, Any]] = []
    for task, task_groups in by_task.items():
        section = TaskSection(matrix_dir, task, task_groups, baseline_variant, settings)
        lines += section.markdown()
        csv_rows += section.csv_rows()

    diverged = [(g, r) for g in groups for r in g.diverged]
    if diverged:
        lines += ["## Diverged cells", "", "Training stopped when the loss exceeded the divergence threshold or stopped being finite.", ""]
        for g, r in diverged:
            loss = r.get("last_finite_loss")
            loss_text = f"last finite training loss {fmt(loss)}" if loss is not None else "no finite training loss"
            lines.append(f"- `{g.task}/{g.variant}/seed{r.get('seed', '?')}`: diverged at step {r.get('diverged_at_step', '?')}, {loss_text}")
        lines.append("")
    failures = [(g, r) for g in groups for r in g.failed]
    if failures:
        lines += ["## Failed cells", ""]
        lines += [f"- `{g.task}/{g.variant}/seed{r.get('seed', '?')}`: {r.get('error', 'no error recorded')}" for g, r in failures]
        lines.append("")

    markdown = "\n".join(lines)
    write_atomic(matrix_dir / "summary.md", markdown)
    write_atomic(matrix_dir / "summary.csv", _to_csv(csv_rows))
    return markdown


def _header(matrix_dir: Path, settings: MatrixSettings, groups: list[Group]) -> list[str]:
    results = [r for g in groups for r in g.results]
    counts = {status: sum(len(getattr(g, status)) for g in groups) for status in ("ok", "diverged", "failed")}
    machines = sorted({r["machine"] for r in results if "machine" in r})
    lines = [f"# {matrix_dir.name}", ""]
    if settings.description:
        lines += [settings.description, ""]
    run_file = matrix_dir / RUN_FILE  # written by the runner: the command and its wall time
    if run_file.is_file():
        run = json.loads(run_file.read_text())
        lines.append(f"Command: `{run['command']}` (last run: {run['wall_time_s'] / 60:.1f} min, {run['cells_trained']} cells trained)  ")
    lines.append(f"Cells: {len(results)} ({counts['ok']} ok, {counts['diverged']} diverged, {counts['failed']} failed)  ")
    lines += [f"Machine: {m}  " for m in machines]
    lines.append("")
    return lines


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table_head(header: list[str]) -> list[str]:
    return [_row(header), "|" + "---|" * len(header)]


def _arrow(metric: Metric) -> str:
    return f"{metric.name} {'↑' if metric.higher_is_better else '↓'}"


@dataclass
class TargetOutcome:
    """How the finished seeds of one group did against one target."""

    reached: list[tuple[int, float | None]]  # (step, seconds) of each seed that reached it
    seeds_with_history: int

    @property
    def mean_steps(self) -> float | None:
        return statistics.fmean(s for s, _ in self.reached) if self.reached else None

    @property
    def mean_seconds(self) -> float | None:
        times = [t for _, t in self.reached if t is not None]
        return statistics.fmean(times) if times and len(times) == len(self.reached) else None

    @property
    def fraction(self) -> str:
        return f"{len(self.reached)}/{self.seeds_with_history}"


class TaskSection:
    """One task's part of the summary: tables, plot, CSV rows."""

    def __init__(self, matrix_dir: Path, task: str, groups: list[Group], baseline_variant: str | None,
                 settings: MatrixSettings) -> None:
        self.matrix_dir = matrix_dir
        self.task = task
        self.groups = groups
        self.task_cfg = TASK_CONFIGS[groups[0].task_name]
        self.metrics: tuple[Metric, ...] = self.task_cfg.metrics
        self.baseline_variant = baseline_variant
        self.baseline = next((g for g in groups if g.variant == baseline_variant), None)
        self.targets = settings.targets.get(task) or settings.targets.get(groups[0].task_name) or {}
        self.trivial_baselines: dict[str, float] = next((g.ok[0].get("baselines", {}) for g in groups if g.ok), {})

    # statistics -------------------------------------------------------------------------------

    def difference(self, group: Group, metric: Metric) -> Difference | None:
        """``group`` minus the baseline variant; None for the baseline itself or without finished seeds."""
        if self.baseline is None or group is self.baseline or not group.ok or not self.baseline.ok:
            return None
        return welch_difference(group.values("metrics", metric.name), self.baseline.values("metrics", metric.name), LEVEL)

    def target_outcome(self, group: Group, metric: Metric, target: float) -> TargetOutcome:
        histories = [r["history"] for r in group.ok if r.get("history")]
        reached = [hit for h in histories if (hit := time_to_target(h, metric.name, target, metric.higher_is_better))]
        return TargetOutcome(reached, len(histories))

    def target_metrics(self) -> list[tuple[Metric, float]]:
        """(metric, target) in the task's metric order."""
        return [(m, self.targets[m.name]) for m in self.metrics if m.name in self.targets]

    # markdown ---------------------------------------------------------------------------------

    def markdown(self) -> list[str]:
        lines = [f"## {self.task}: {self.task_cfg.description}", ""]
        lines += self.main_table()
        lines += ["", f"Mean ± std over the seeds that finished. Trivial baseline: {self.task_cfg.baseline_description}", ""]
        lines += self.speed_note()
        lines += self.interval_table()
        lines += self.difference_table()
        lines += self.target_table()
        lines += self.plot()
        return lines

    @property
    def has_performance(self) -> bool:
        """Whether the cells recorded speed figures (results written before them did not)."""
        return any("performance" in r for g in self.groups for r in g.ok)

    @property
    def has_peak_memory(self) -> bool:
        return any("peak_memory" in r for g in self.groups for r in g.ok)

    def main_table(self) -> list[str]:
        header = ["variant"] + [_arrow(m) for m in self.metrics]
        header += ["seeds", "steps", "wall time (s)", "parameters"]
        if self.has_performance:
            header.append("step time (ms)")
        header.append(f"throughput ({self.task_cfg.throughput_unit}/s)")
        if self.has_performance:
            header += ["MFU", "data wait"]
        if self.has_peak_memory:
            header.append("peak memory (MB)")
        # sparse attention cells record the share of (query, key) pairs they attend
        sparse = any("attended_fraction" in r for g in self.groups for r in g.ok)
        if sparse:
            header.append("attended pairs")
        lines = _table_head(header)
        for group in self.groups:
            if not group.ok:
                status = group.status_without_ok
                row = [group.variant] + [status] * len(self.metrics) + [group.seeds_label()]
                lines.append(_row(row + [""] * (len(header) - len(row))))
                continue
            row = [group.variant]
            for metric in self.metrics:
                mean, std = mean_std(group.values("metrics", metric.name))
                row.append(f"{fmt(mean)} ± {fmt(std, decimals(mean))}")
            row += [
                group.seeds_label(),
                str(round(statistics.fmean(group.values("steps")))),
                f"{statistics.fmean(group.values('wall_time_s')):.1f}",
                f"{group.ok[0]['parameters']:,}",
            ]
            if self.has_performance:
                row.append(_speed_cell(group.speed_mean("step_time_ms"), "{:,.1f}"))
            row.append(f"{statistics.fmean(group.values('throughput')):,.0f}")
            if self.has_performance:
                row += [_speed_cell(group.speed_mean("mfu"), "{:.1%}"), _speed_cell(group.speed_mean("data_wait_fraction"), "{:.1%}")]
            if self.has_peak_memory:
                row.append(_speed_cell(group.speed_mean("peak_memory_mb"), "{:,.0f}"))
            if sparse:
                row.append(f"{group.ok[0].get('attended_fraction', 1.0):.3f}")
            lines.append(_row(row))
        if self.trivial_baselines:
            cells = [fmt(self.trivial_baselines[m.name]) if m.name in self.trivial_baselines else "" for m in self.metrics]
            lines.append("| *trivial baseline* | " + " | ".join(cells) + " |" + " |" * (len(header) - 1 - len(self.metrics)))
        return lines

    def speed_note(self) -> list[str]:
        """What the speed columns are, with the peak FLOP/s that MFU divides by."""
        if not self.has_performance:
            return []
        peaks = [v for g in self.groups for v in g.speed_values("peak_tflops")]
        sources = sorted({_peak_source_kind(r) for g in self.groups for r in g.ok if _performance(r).get("peak_source")})
        peak = ""
        if peaks:
            spread = f" (cells: {fmt(min(peaks))} to {fmt(max(peaks))})" if min(peaks) != max(peaks) else ""
            peak = f" of {fmt(statistics.fmean(peaks))} TFLOP/s per device{spread}, {'; '.join(sources)}"
        return [
            "Speed, mean over the seeds: step time is each seed's median optimizer step (forward, backward, optimizer); "
            f"MFU is model FLOP/s over the peak{peak}; data wait is the share of the training loop spent waiting for "
            "batches; peak memory is CUDA max allocated on a GPU, resident set size on a CPU.",
            "",
        ]

    def interval_table(self) -> list[str]:
        """95% CI of each metric's mean; shown when some variant has two or more finished seeds."""
        if not any(len(g.ok) > 1 for g in self.groups):
            return []
        lines = [f"{LEVEL:.0%} confidence interval of the mean over seeds (Student t):", ""]
        lines += _table_head(["variant"] + [_arrow(m) for m in self.metrics])
        for group in self.groups:
            cells = []
            for metric in self.metrics:
                values = group.values("metrics", metric.name)
                interval = t_confidence_interval(values, LEVEL) if values else None
                if not values:
                    cells.append(group.status_without_ok)
                elif interval is None:
                    cells.append("one seed")
                else:
                    digits = decimals(statistics.fmean(values))
                    cells.append(f"[{fmt(interval[0], digits)}, {fmt(interval[1], digits)}]")
            lines.append(_row([group.variant] + cells))
        return lines + [""]

    def difference_table(self) -> list[str]:
        """Each variant minus the baseline variant, per metric, with Welch's interval and a marker."""
        others = [g for g in self.groups if g is not self.baseline]
        if not others:
            return []
        if self.baseline is None:
            return [f"No differences: the baseline variant `{self.baseline_variant}` has no cells for this task.", ""]
        if not self.baseline.ok:
            return [f"No differences: every seed of the baseline variant `{self.baseline.variant}` {self.baseline.status_without_ok}.", ""]
        lines = [
            f"Difference from the baseline variant `{self.baseline.variant}` (variant − baseline) with its {LEVEL:.0%} "
            f"Welch interval; {SIGNIFICANT} = the interval excludes zero:",
            "",
        ]
        lines += _table_head(["variant"] + [_arrow(m) for m in self.metrics])
        for group in others:
            lines.append(_row([group.variant] + [self.difference_cell(group, m) for m in self.metrics]))
        return lines + [""]

    def difference_cell(self, group: Group, metric: Metric) -> str:
        if not group.ok:
            return group.status_without_ok
        diff = self.difference(group, metric)
        assert diff is not None
        base_values = self.baseline.values("metrics", metric.name)
        digits = decimals(max(abs(statistics.fmean(base_values)), abs(statistics.fmean(group.values("metrics", metric.name)))))
        text = fmt(diff.difference, digits, sign=True)
        if diff.ci_low is None or diff.ci_high is None:
            reason = "one seed" if min(len(group.ok), len(base_values)) < 2 else "seeds identical"
            return f"{text} (no interval: {reason})"
        text += f" [{fmt(diff.ci_low, digits, sign=True)}, {fmt(diff.ci_high, digits, sign=True)}]"
        if diff.excludes_zero:
            text += f" {SIGNIFICANT} {direction(diff.difference, metric)}"
        return text

    def target_table(self) -> list[str]:
        """Steps and seconds until each target is first reached: mean over the seeds that reached it."""
        if not self.targets:
            return []
        lines = []
        unknown = [name for name in self.targets if name not in {m.name for m in self.metrics}]
        if unknown:
            lines += [f"Targets for metrics this task does not report (ignored): {', '.join(unknown)}; "
                      f"its metrics: {', '.join(m.name for m in self.metrics)}.", ""]
        targets = self.target_metrics()
        if not targets:
            return lines
        lines += ["Time to target: seeds that reached it at a validation, and their mean steps and seconds since training started:", ""]
        lines += _table_head(["variant"] + [f"{m.name} {'≥' if m.higher_is_better else '≤'} {value:g}" for m, value in targets])
        for group in self.groups:
            lines.append(_row([group.variant] + [self.target_cell(group, m, value) for m, value in targets]))
        return lines + [""]

    def target_cell(self, group: Group, metric: Metric, target: float) -> str:
        if not group.ok:
            return group.status_without_ok
        outcome = self.target_outcome(group, metric, target)
        if not outcome.seeds_with_history:
            return "no history"
        if not outcome.reached:
            return f"{outcome.fraction} seeds"
        seconds = f", {outcome.mean_seconds:.1f} s" if outcome.mean_seconds is not None else ""
        return f"{outcome.fraction} seeds: {outcome.mean_steps:.0f} steps{seconds}"

    def plot(self) -> list[str]:
        curves = [
            VariantCurves(
                g.variant,
                finished=[r["history"] for r in g.ok if r.get("history")],
                diverged=[r.get("history") or [] for r in g.diverged],
            )
            for g in self.groups
        ]
        path = self.matrix_dir / PLOTS_DIR / f"{self.task}.png"
        metrics = [(m.name, m.higher_is_better) for m in self.metrics]
        if not plot_task(path, self.task, metrics, curves, self.trivial_baselines):
            return []
        return [f"![{self.task}]({PLOTS_DIR}/{urllib.parse.quote(path.name)})", ""]

    # csv --------------------------------------------------------------------------------------

    def csv_rows(self) -> list[dict[str, Any]]:
        rows = []
        for group in self.groups:
            for metric in self.metrics:
                rows.append(self.csv_row(group, metric))
        return rows

    def csv_row(self, group: Group, metric: Metric) -> dict[str, Any]:
        values = group.values("metrics", metric.name)
        mean, std = mean_std(values) if values else ("", "")
        interval = t_confidence_interval(values, LEVEL) if values else None
        diff = self.difference(group, metric)
        first = group.ok[0] if group.ok else {}
        target = self.targets.get(metric.name) if metric.name in self.targets else None
        outcome = self.target_outcome(group, metric, target) if target is not None and group.ok else None
        return {
            "task": group.task,
            "variant": group.variant,
            "metric": metric.name,
            "mean": mean,
            "std": std,
            "ci_low": interval[0] if interval else "",
            "ci_high": interval[1] if interval else "",
            "seeds": len(group.ok),
            "seeds_diverged": len(group.diverged),
            "seeds_failed": len(group.failed),
            "higher_is_better": metric.higher_is_better,
            "baseline_variant": self.baseline.variant if self.baseline else (self.baseline_variant or ""),
            "diff_vs_baseline": diff.difference if diff else "",
            "diff_ci_low": _blank(diff.ci_low) if diff else "",
            "diff_ci_high": _blank(diff.ci_high) if diff else "",
            "diff_p_value": _blank(diff.p_value) if diff else "",
            "significant": diff.excludes_zero if diff else "",
            "direction": direction(diff.difference, metric) if diff else "",
            "baseline": self.trivial_baselines.get(metric.name, ""),  # the task's trivial baseline
            "steps": first.get("steps", ""),
            "wall_time_s": statistics.fmean(group.values("wall_time_s")) if group.ok else "",
            "parameters": first.get("parameters", ""),
            "throughput": statistics.fmean(group.values("throughput")) if group.ok else "",
            "throughput_unit": first.get("throughput_unit", ""),
            **{figure: _blank(group.speed_mean(figure)) for figure in SPEED_FIGURES},
            "target": "" if target is None else target,
            "target_reached": outcome.fraction if outcome and outcome.seeds_with_history else "",
            "steps_to_target": _blank(outcome.mean_steps) if outcome else "",
            "seconds_to_target": _blank(outcome.mean_seconds) if outcome else "",
        }


def direction(difference: float, metric: Metric) -> str:
    """``better`` or ``worse`` for a variant ``difference`` above its baseline (``same`` for zero)."""
    if difference == 0:
        return "same"
    return "better" if (difference > 0) == metric.higher_is_better else "worse"


def _speed_cell(value: float | None, form: str) -> str:
    return "–" if value is None else form.format(value)


def _peak_source_kind(result: dict[str, Any]) -> str:
    """``config`` or the probe without its size: ``measured: fp32 matmul``."""
    source = _performance(result)["peak_source"]
    if source == "config":
        return "from trainer.peak_tflops"
    dtype = source.removeprefix("measured: ").split(" ")[0]
    return f"measured by a {dtype} matmul probe"


def _blank(value: Any) -> Any:
    return "" if value is None else value


def _to_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()
