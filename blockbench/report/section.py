"""One task's part of a matrix's summary, rendered from its statistics (``analysis.TaskAnalysis``):
the markdown (the table of means and figures, the intervals, the differences from the baseline
variant, the time to target, the logit lens and the plot), the task's rows of ``summary.csv``, and the
comparisons that the verdicts word (``verdicts.Comparison``), with the same texts as the tables. It
computes no statistic: what it shows is what the analysis computed, so the summary, the CSV and the
index of verdicts cannot disagree.
"""

from __future__ import annotations

import math
import statistics
import urllib.parse
from typing import Any

from blockbench.tasks import Metric

from ..layout import PLOTS_DIR
from ..record import SPEED_FIGURES, read_tuning
from .analysis import ALPHA, LEVEL, GroupStats, MetricStats, TaskAnalysis
from .lens import logit_lens_section
from .plots import CURVE_METRIC, VariantCurves, plot_task, plotted_history
from .results import BUDGET_AXIS, Group
from .stats import LOGIT_EPSILON, PAIRED, Difference
from .table import decimals, fmt
from .table import row as _row
from .table import table_head as _table_head
from .tuning import chosen_text
from .verdicts import Comparison

SIGNIFICANT = "✓"  # marks a difference whose Holm-adjusted p-value is below ALPHA


def section_markdown(a: TaskAnalysis) -> list[str]:
    """The task's markdown lines; draws its plot (``plots/<task>.png``) on the way."""
    lines = [f"## {a.task}: {a.task_cfg.description}", ""]
    lines += main_table(a)
    lines += ["", main_note(a), ""]
    lines += speed_note(a)
    lines += sparsity_note(a)
    lines += interval_table(a)
    lines += difference_table(a)
    lines += target_table(a)
    lines += logit_lens_section(a.groups)
    lines += plot(a)
    return lines


# what the cells recorded ------------------------------------------------------------------------


def has_performance(a: TaskAnalysis) -> bool:
    """Whether the cells recorded speed figures (results written before them did not)."""
    return any(r.performance is not None for g in a.groups for r in g.ok)


def has_peak_memory(a: TaskAnalysis) -> bool:
    return any(r.peak_memory is not None for g in a.groups for r in g.ok)


def has_sparsity(a: TaskAnalysis) -> bool:
    """Sparse attention cells record the share of (query, key) pairs they attend."""
    return any("attended_fraction" in r.extras for g in a.groups for r in g.ok)


# the table of means and its notes ---------------------------------------------------------------


def _arrow(metric: Metric) -> str:
    return f"{metric.name} {'↑' if metric.higher_is_better else '↓'}"


def main_table(a: TaskAnalysis) -> list[str]:
    performance, peak_memory, sparse = has_performance(a), has_peak_memory(a), has_sparsity(a)
    header = ["variant"] + [_arrow(m) for m in a.metrics]
    header += ["seeds", "steps", "wall time (s)", "parameters"]
    if performance:
        header.append("step time (ms)")
    header.append(f"throughput ({a.task_cfg.throughput_unit}/s)")
    if performance:
        header += ["MFU", "data wait"]
    if peak_memory:
        header.append("peak memory (MB)")
    if sparse:
        header.append("attended pairs")
    lines = _table_head(header)
    for group in a.groups:
        if not group.ok:
            status = group.status_without_ok
            row = [group.variant] + [status] * len(a.metrics) + [group.seeds_label()]
            lines.append(_row(row + [""] * (len(header) - len(row))))
            continue
        stats = a.stats[group.variant]
        row = [group.variant] + [mean_cell(group, stats.metrics[metric.name]) for metric in a.metrics]
        row += [group.seeds_label(), str(stats.steps), f"{stats.wall_time_s:.1f}", f"{stats.parameters:,}"]
        if performance:
            row.append(_speed_cell(stats.speed["step_time_ms"], "{:,.1f}"))
        row.append(f"{stats.throughput:,.0f}")
        if performance:
            row += [_speed_cell(stats.speed["mfu"], "{:.1%}"), _speed_cell(stats.speed["data_wait_fraction"], "{:.1%}")]
        if peak_memory:
            row.append(_speed_cell(stats.speed["peak_memory_mb"], "{:,.0f}"))
        if sparse:
            row.append(f"{group.ok[0].extras.get('attended_fraction', 1.0):.3f}")
        lines.append(_row(row))
    if a.trivial_baselines:
        cells = [fmt(a.trivial_baselines[m.name]) if m.name in a.trivial_baselines else "" for m in a.metrics]
        lines.append("| *trivial baseline* | " + " | ".join(cells) + " |" + " |" * (len(header) - 1 - len(a.metrics)))
    return lines


def mean_cell(group: Group, stats: MetricStats) -> str:
    """``mean ± std`` over the seeds in the statistics; with diverged seeds, also the mean of the
    finished ones alone: ``26.37 ± 40.0 (finished 72.55)``."""
    text = f"{fmt(stats.mean)} ± {fmt(stats.std, decimals(stats.mean))}"
    if group.diverged:
        text += f" (finished {fmt(stats.mean_finished, decimals(stats.mean))})"
    return text


def main_note(a: TaskAnalysis) -> str:
    """How the first table counts seeds, and what the trivial baseline is."""
    note = "Mean ± std over seeds."
    if a.any_diverged:
        counted = ", ".join(
            f"{m.name} {diverged_value_text(a, m)}" for m in a.metrics if a.diverged_values[m.name] is not None
        )
        note += (
            " A diverged seed left no usable model, so it counts with the worse of the trivial baseline and the "
            f'worst finished seed of this task: {counted}; "finished" is the mean of the finished seeds alone.'
        )
    if any(g.failed for g in a.groups):
        note += " Failed seeds (an error, not a finding) are not counted."
    return f"{note} Trivial baseline: {a.task_cfg.baseline_description}"


def diverged_value_text(a: TaskAnalysis, metric: Metric) -> str:
    """``0.930 (trivial baseline)`` or ``200.0 (worst finished seed)``."""
    value = a.diverged_values[metric.name]
    source = "trivial baseline" if value == a.trivial_baselines.get(metric.name) else "worst finished seed"
    return f"{fmt(value)} ({source})"


def speed_note(a: TaskAnalysis) -> list[str]:
    """What the speed columns are, with the peak FLOP/s that MFU divides by."""
    if not has_performance(a):
        return []
    peaks = [v for g in a.groups for v in g.speed_values("peak_tflops")]
    sources = sorted(
        {
            _peak_source_kind(r.performance.peak_source)
            for g in a.groups
            for r in g.ok
            if r.performance is not None and r.performance.peak_source
        }
    )
    peak = ""
    if peaks:
        spread = f" (cells: {fmt(min(peaks))} to {fmt(max(peaks))})" if min(peaks) != max(peaks) else ""
        peak = f" of {fmt(statistics.fmean(peaks))} TFLOP/s per device{spread}, {'; '.join(sources)}"
    no_mfu = any(r.speed_figures()["mfu"] is None for g in a.groups for r in g.ok if r.performance is not None)
    return [
        "Speed, mean over the finished seeds: step time is each seed's median optimizer step (forward, backward, "
        "optimizer); "
        f"MFU is model FLOP/s over the peak{peak}; data wait is the share of the training loop spent waiting for "
        "batches; peak memory is CUDA max allocated on a GPU, resident set size on a CPU."
        + (
            " An MFU above 100% says the peak was measured too low, not how well the device was used: such seeds "
            "have no MFU, and – marks a variant without any."
            if no_mfu
            else ""
        ),
        "",
    ]


def sparsity_note(a: TaskAnalysis) -> list[str]:
    """What the attended pairs column counts (``models.MultiHeadAttention.attended_fraction``)."""
    if not has_sparsity(a):
        return []
    return [
        "Attended pairs: the share of all (query, key) pairs that the sparse pattern, with the causal mask where "
        "there is one, let the cell's last forward pass attend (the translator's: a greedy decoding step's), "
        "averaged over the attention layers. 1.000 marks a variant without a pattern, although a causal mask "
        "alone keeps about half the pairs: on a decoder, the share of the causal pairs is about twice the figure.",
        "",
    ]


def _speed_cell(value: float | None, form: str) -> str:
    return "–" if value is None else form.format(value)


def _peak_source_kind(source: str) -> str:
    """``config`` or the probe without its size: ``measured: fp32 matmul``."""
    if source == "config":
        return "from trainer.peak_tflops"
    dtype = source.removeprefix("measured: ").split(" ")[0]
    return f"measured by a {dtype} matmul probe"


# intervals --------------------------------------------------------------------------------------


def interval_table(a: TaskAnalysis) -> list[str]:
    """95% CI of each metric's mean; shown when some variant has two or more seeds in the statistics."""
    if not any(len(g.ok) + len(g.diverged) > 1 for g in a.groups if g.ok):
        return []
    counted = " (diverged seeds counted as above)" if a.any_diverged else ""
    lines = [f"{LEVEL:.0%} confidence interval of the mean over seeds{counted}:", ""]
    lines += _table_head(["variant"] + [_arrow(m) for m in a.metrics])
    for group in a.groups:
        cells = []
        for stats in a.stats[group.variant].metrics.values():
            if not group.ok:
                cells.append(group.status_without_ok)
            elif stats.interval is None:
                cells.append("one seed")
            else:
                digits = decimals(stats.mean)
                cells.append(f"[{fmt(stats.interval[0], digits)}, {fmt(stats.interval[1], digits)}]")
        lines.append(_row([group.variant, *cells]))
    return [*lines, "", interval_method(a.metrics), ""]


def interval_method(metrics: tuple[Metric, ...]) -> str:
    """How the intervals of the task's metrics were computed, by the kind of range they have."""
    both = [m for m in metrics if math.isfinite(m.low) and math.isfinite(m.high)]
    one = [m for m in metrics if math.isfinite(m.low) != math.isfinite(m.high)]
    free = [m for m in metrics if not (math.isfinite(m.low) or math.isfinite(m.high))]
    parts = []
    if both:
        ranges = ", ".join(f"{m.name} in [{m.low:g}, {m.high:g}]" for m in both)
        parts.append(
            f"{ranges}: Student t on the logit of the share of the range, (value − low) / (high − low), "
            f"with shares clamped to [{LOGIT_EPSILON:g}, {1 - LOGIT_EPSILON:g}], transformed back, so the "
            "interval stays inside the range"
        )
    if one:
        bounds = ", ".join(f"{m.name} ≥ {m.low:g}" if math.isfinite(m.low) else f"{m.name} ≤ {m.high:g}" for m in one)
        parts.append(f"{bounds}: Student t, cut at the bound")
    if free:
        parts.append(f"{', '.join(m.name for m in free)}: Student t")
    return "Method: " + "; ".join(parts) + "."


# differences from the baseline variant ----------------------------------------------------------


def difference_table(a: TaskAnalysis) -> list[str]:
    """Each variant minus the baseline variant, per metric, with its interval, a mark where the
    Holm-adjusted p-value is below ALPHA, and the tests used."""
    others = [g for g in a.groups if not a.is_baseline(g)]
    if not others:
        return []
    if not a.baselines:
        return [f"No differences: the baseline variant `{a.baseline_label}` has no cells for this task.", ""]
    if not any(a.has_values(baseline) for baseline in a.baselines.values()):
        status = " or ".join(dict.fromkeys(b.status_without_ok for b in a.baselines.values()))
        return [f"No differences: every seed of the baseline variant `{a.baseline_label}` {status}.", ""]
    at = f" at the same budget (`{BUDGET_AXIS}`)" if a.by_budget else ""
    lines = [
        f"Difference from the baseline variant `{a.baseline_label}`{at} (variant − baseline) with its {LEVEL:.0%} "
        f"interval; {SIGNIFICANT} = Holm-adjusted p < {ALPHA:.2g}:",
        "",
    ]
    lines += _table_head(["variant"] + [_arrow(m) for m in a.metrics])
    for group in others:
        lines.append(_row([group.variant] + [difference_cell(a, group, m) for m in a.metrics]))
    return [*lines, "", difference_method(a, others), ""]


def no_difference_reason(a: TaskAnalysis, group: Group) -> str:
    """Why ``group`` has no difference from its baseline: ``failed``, ``diverged`` (its own seeds), or the
    baseline's."""
    baseline = a.baseline_of(group)
    if baseline is None:
        at = f" at {group.budget} steps" if a.by_budget else ""
        return f"no cells of the baseline variant `{a.baseline_label}`{at}"
    if not a.has_values(baseline):
        return f"every seed of the baseline {baseline.status_without_ok}"
    return group.status_without_ok


def difference_cell(a: TaskAnalysis, group: Group, metric: Metric) -> str:
    stats = a.stats[group.variant].metrics[metric.name]
    if stats.difference is None:
        return no_difference_reason(a, group)
    text = difference_text(a, group, metric)
    return f"{text} {SIGNIFICANT} {stats.direction}" if stats.significant else text


def difference_text(a: TaskAnalysis, group: Group, metric: Metric) -> str:
    """``+23.29 [+23.26, +23.31]``, or ``+0.200 (no interval: one seed)``: ``group``'s difference from
    its baseline in ``metric``, to the decimals of the larger mean."""
    stats = a.stats[group.variant].metrics[metric.name]
    diff = stats.difference
    baseline_mean = a.stats[a.baseline_of(group).variant].metrics[metric.name].mean
    digits = decimals(max(abs(stats.mean), abs(baseline_mean)))
    text = fmt(diff.difference, digits, sign=True)
    if diff.ci_low is None or diff.ci_high is None:
        return f"{text} (no interval: {_no_interval_reason(diff)})"
    return text + f" [{fmt(diff.ci_low, digits, sign=True)}, {fmt(diff.ci_high, digits, sign=True)}]"


def difference_method(a: TaskAnalysis, others: list[Group]) -> str:
    """Which test each variant's differences used, the Holm family, and the cut of bounded ranges."""
    tests: dict[str, list[str]] = {}
    for group in others:
        diff = next((s.difference for s in a.stats[group.variant].metrics.values() if s.difference is not None), None)
        if diff is not None:
            tests.setdefault(_test_text(diff), []).append(f"`{group.variant}`")
    if len(tests) == 1:
        test_text = f"Test: {next(iter(tests))}. "
    else:
        test_text = "; ".join(f"{text} for {', '.join(variants)}" for text, variants in tests.items())
        test_text = f"Tests: {test_text}. " if tests else ""
    spans = [m.name for m in a.metrics if math.isfinite(m.span)]
    cut = f" Intervals of {', '.join(spans)} are cut to ± the width of the metric's range." if spans else ""
    return (
        f"{test_text}Family-wise error: Holm over {a.family_size} comparisons (every task x variant x metric "
        f"of this matrix against the baseline variant); the intervals themselves are not adjusted.{cut}"
    )


def _test_text(diff: Difference) -> str:
    """``paired t over 3 seed-matched pairs``, ``Welch t (seeds differ ...: 3 vs 2)`` or ``none (one seed)``."""
    if min(diff.n) < 2:
        return "none (one seed)"
    if diff.test == PAIRED:
        return f"paired t over {diff.n[0]} seed-matched pairs"
    return f"Welch t (seeds differ from the baseline variant's: {diff.n[0]} vs {diff.n[1]})"


def _no_interval_reason(diff: Difference) -> str:
    if min(diff.n) < 2:
        return "one seed"
    return "the same difference in every seed pair" if diff.test == PAIRED else "seeds identical"


def comparisons(a: TaskAnalysis) -> list[Comparison]:
    """Each variant against its baseline in the task's headline metric (its first), as the task's
    section shows it: what the verdicts (``blockbench.report.verdicts``) word."""
    metric = a.metrics[0]
    family = next((g.family for g in a.groups if g.family), None) or a.task_cfg.family
    tuned = ((read_tuning(a.matrix_dir) or {}).get("tasks") or {}).get(a.task, {}).get("variants")

    def tuned_value(group: Group | None) -> str | None:
        return chosen_text(tuned.get(group.variant)) if tuned and group else None

    found = []
    for group in a.groups:
        if a.is_baseline(group):
            continue
        baseline, stats = a.baseline_of(group), a.stats[group.variant].metrics[metric.name]
        found.append(
            Comparison(
                task=a.task,
                family=family,
                variant=group.design if a.by_budget else group.variant,
                baseline=a.baseline_label,
                budget=group.budget if a.by_budget else None,
                metric=metric,
                difference=stats.difference,
                difference_text=difference_text(a, group, metric) if stats.difference else "",
                significant=stats.significant,
                direction=stats.direction,
                variant_side=a.side(group, metric),
                baseline_side=a.side(baseline, metric),
                missing="" if stats.difference else no_difference_reason(a, group),
                tuned=(tuned_value(group), tuned_value(baseline)) if tuned else None,
                p_holm=stats.p_holm,
            )
        )
    return found


# targets and the plot ---------------------------------------------------------------------------


def target_table(a: TaskAnalysis) -> list[str]:
    """Steps and seconds until each target is first reached: mean over the seeds that reached it."""
    if not a.targets:
        return []
    lines = []
    unknown = [name for name in a.targets if name not in {m.name for m in a.metrics}]
    if unknown:
        lines += [
            f"Targets for metrics this task does not report (ignored): {', '.join(unknown)}; "
            f"its metrics: {', '.join(m.name for m in a.metrics)}.",
            "",
        ]
    targets = a.target_metrics()
    if not targets:
        return lines
    lines += [
        "Time to target: the finished seeds that reached it at a validation, out of the finished and diverged seeds "
        "(a diverged seed counts as not reaching it), and their mean steps and seconds since training started:",
        "",
    ]
    lines += _table_head(
        ["variant"] + [f"{m.name} {'≥' if m.higher_is_better else '≤'} {value:g}" for m, value in targets]
    )
    for group in a.groups:
        lines.append(_row([group.variant] + [target_cell(a, group, m) for m, _ in targets]))
    return [*lines, ""]


def target_cell(a: TaskAnalysis, group: Group, metric: Metric) -> str:
    if not group.ok:
        return group.status_without_ok
    outcome = a.stats[group.variant].metrics[metric.name].outcome
    if not outcome.seeds_with_history:
        return "no history"
    if not outcome.reached:
        return f"{outcome.fraction} seeds"
    seconds = f", {outcome.mean_seconds:.1f} s" if outcome.mean_seconds is not None else ""
    return f"{outcome.fraction} seeds: {outcome.mean_steps:.0f} steps{seconds}"


def plot(a: TaskAnalysis) -> list[str]:
    """Draw the task's validation curves (``plots/<task>.png``); the markdown that shows it, none without a history."""
    curves = [
        VariantCurves(
            g.variant,
            finished=[history for r in g.ok if (history := plotted_history(r))],
            diverged=[plotted_history(r) for r in g.diverged],
        )
        for g in a.groups
    ]
    path = a.matrix_dir / PLOTS_DIR / f"{a.task}.png"
    metrics = [(m.name, m.higher_is_better) for m in a.metrics]
    baselines = dict(a.trivial_baselines)
    if any(r.curve is not None for g in a.groups for r in g.ok + g.diverged):
        metrics.insert(0, (CURVE_METRIC, False))
        if "loss" in baselines:
            baselines[CURVE_METRIC] = baselines["loss"]
    if not plot_task(path, a.task, metrics, curves, baselines):
        return []
    return [f"![{a.task}]({PLOTS_DIR}/{urllib.parse.quote(path.name)})", ""]


# csv --------------------------------------------------------------------------------------------


def section_csv_rows(a: TaskAnalysis) -> list[dict[str, Any]]:
    """The task's rows of ``summary.csv``: one per group x metric."""
    return [
        csv_row(a, group_stats, stats) for group_stats in a.stats.values() for stats in group_stats.metrics.values()
    ]


def csv_row(a: TaskAnalysis, group_stats: GroupStats, stats: MetricStats) -> dict[str, Any]:
    """One group x metric: ``mean``, ``std``, ``ci_*`` and ``diff_*`` count the diverged seeds (at
    ``diverged_value``); ``mean_finished`` is over the finished seeds alone."""
    group, metric, diff, outcome = group_stats.group, stats.metric, stats.difference, stats.outcome
    return {
        "task": group.task,
        "variant": group.variant,
        "metric": metric.name,
        "mean": _blank(stats.mean),
        "std": _blank(stats.std),
        "ci_low": stats.interval[0] if stats.interval else "",
        "ci_high": stats.interval[1] if stats.interval else "",
        "mean_finished": _blank(stats.mean_finished),
        "seeds": len(stats.values),  # in the statistics: finished and diverged
        "seeds_diverged": len(group.diverged),
        "seeds_failed": len(group.failed),
        "diverged_value": _blank(a.diverged_values[metric.name]) if group.diverged else "",
        "higher_is_better": metric.higher_is_better,
        "baseline_variant": baseline.variant if (baseline := a.baseline_of(group)) else a.baseline_label,
        "diff_vs_baseline": diff.difference if diff else "",
        "diff_ci_low": _blank(diff.ci_low) if diff else "",
        "diff_ci_high": _blank(diff.ci_high) if diff else "",
        "diff_test": diff.test if diff else "",
        "diff_p_value": _blank(diff.p_value) if diff else "",
        "diff_p_holm": _blank(stats.p_holm),
        "significant": stats.significant if diff else "",
        "direction": stats.direction,
        "baseline": a.trivial_baselines.get(metric.name, ""),  # the task's trivial baseline
        "steps": _blank(group_stats.steps),
        "wall_time_s": _blank(group_stats.wall_time_s),
        "parameters": _blank(group_stats.parameters),
        "throughput": _blank(group_stats.throughput),
        "throughput_unit": _blank(group_stats.throughput_unit),
        **{figure: _blank(group_stats.speed[figure]) for figure in SPEED_FIGURES},
        "target": _blank(stats.target),
        "target_reached": outcome.fraction if outcome and outcome.seeds_with_history else "",
        "steps_to_target": _blank(outcome.mean_steps) if outcome else "",
        "seconds_to_target": _blank(outcome.mean_seconds) if outcome else "",
    }


def _blank(value: Any) -> Any:
    return "" if value is None else value
