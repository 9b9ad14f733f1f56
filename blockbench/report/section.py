"""One task's part of a matrix's summary, rendered from its statistics (``analysis.TaskAnalysis``):
the markdown (the table of means and figures, the intervals, the differences from the baseline
variant, the time to target and the logit lens), the task's row of the matrix's curves figure
(``curve_row``), the task's rows of ``summary.csv``, and the comparisons that the verdicts word
(``verdicts.Comparison``), with the same texts as the tables. It computes no statistic: what it shows
is what the analysis computed, so the summary, the CSV and the index of verdicts cannot disagree.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from blockbench.tasks import Metric

from ..store.record import SPEED_FIGURES
from .analysis import LEVEL, GroupStats, MetricStats, TaskAnalysis
from .differences import comparisons, difference_table, question_note
from .headroom import headroom_lines
from .lens import logit_lens_section
from .plots import CURVE_METRIC, Panel, TaskCurves, VariantCurves, metric_words, plotted_history
from .results import Group
from .table import arrow, decimals, fmt
from .table import row as _row
from .table import table_head as _table_head

__all__ = ["comparisons", "curve_row", "section_csv_rows", "section_markdown"]

NOT_RECORDED = "not recorded"  # a metric the cells' records lack (written before their task added it)


def section_markdown(a: TaskAnalysis) -> list[str]:
    """The task's markdown lines (its curves are a row of the matrix's figure: :func:`curve_row`)."""
    lines = [f"## {a.task}: {a.task_cfg.description}", ""]
    lines += question_note(a)
    lines += main_table(a)
    lines += ["", main_note(a), ""]
    lines += speed_note(a)
    lines += sparsity_note(a)
    lines += headroom_lines(a.groups, [m.name for m in a.metrics])
    lines += interval_table(a)
    lines += difference_table(a)
    lines += target_table(a)
    lines += logit_lens_section(a.groups)
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


def main_table(a: TaskAnalysis) -> list[str]:
    performance, peak_memory, sparse = has_performance(a), has_peak_memory(a), has_sparsity(a)
    header = ["variant"] + [arrow(m) for m in a.metrics]
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
            row = [group.variant] + [status] * len(a.metrics) + [group.seeds_label(a.headline)]
            lines.append(_row(row + [""] * (len(header) - len(row))))
            continue
        stats = a.stats[group.variant]
        row = [group.variant] + [mean_cell(group, stats.metrics[metric.name]) for metric in a.metrics]
        row += [group.seeds_label(a.headline), str(stats.steps), f"{stats.wall_time_s:.1f}", f"{stats.parameters:,}"]
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
    if stats.mean is None:
        return NOT_RECORDED
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
    if a.any_did_not_learn:
        note += (
            f" A seed that *did not learn* finished with a {a.headline.name} no better than the trivial baseline's; "
            "it counts as it is (it finished)."
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
        "Speed, median over the finished seeds (a few cells timed under another load do not move it): step time "
        "is each seed's median optimizer step (forward, backward, optimizer); "
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
    lines += _table_head(["variant"] + [arrow(m) for m in a.metrics])
    for group in a.groups:
        cells = []
        for stats in a.stats[group.variant].metrics.values():
            if not group.ok:
                cells.append(group.status_without_ok)
            elif stats.mean is None:
                cells.append(NOT_RECORDED)
            elif stats.interval is None:
                cells.append("one seed")
            else:
                digits = decimals(stats.mean)
                cells.append(f"[{fmt(stats.interval[0], digits)}, {fmt(stats.interval[1], digits)}]")
        lines.append(_row([group.variant, *cells]))
    return [*lines, "", interval_method(a.metrics), ""]


def interval_method(metrics: tuple[Metric, ...]) -> str:
    """How the intervals of the task's metrics were computed: Student t, cut at the metric's bounds."""
    bounded = [m for m in metrics if math.isfinite(m.low) or math.isfinite(m.high)]
    if not bounded:
        return "Method: Student t."
    ranges = ", ".join(
        f"{m.name} in [{m.low:g}, {m.high:g}]"
        if math.isfinite(m.low) and math.isfinite(m.high)
        else (f"{m.name} ≥ {m.low:g}" if math.isfinite(m.low) else f"{m.name} ≤ {m.high:g}")
        for m in bounded
    )
    return (
        f"Method: Student t, cut at the metric's bounds ({ranges}): cutting removes only values the metric cannot "
        "take, so each interval holds its own mean."
    )


# targets and the curves ---------------------------------------------------------------------------


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


CURVE_TITLE = "validation loss on a fixed sample (lower is better)"
LOSS_LABEL = "cross-entropy (nats)"


def _words(metric: Metric) -> str:
    return metric_words(metric.name)


def _direction(metric: Metric) -> str:
    return "higher is better" if metric.higher_is_better else "lower is better"


def curve_row(a: TaskAnalysis) -> TaskCurves:
    """The task's row of the matrix's curves figure: its headline metric at each full validation, then
    the loss curve (the validation loss on a fixed sample every few steps, the densest series; the full
    validations' loss for cells recorded without one), each with the task's trivial baseline."""
    curves = tuple(
        VariantCurves(
            g.variant,
            finished=[history for r in g.ok if (history := plotted_history(r))],
            diverged=[plotted_history(r) for r in g.diverged],
        )
        for g in a.groups
    )
    headline, baselines = a.headline, a.trivial_baselines
    panels = [
        Panel(
            headline.name,
            f"validation {_words(headline)} ({_direction(headline)})",
            _words(headline),
            headline.low,
            headline.high,
            baselines.get(headline.name),
        )
    ]
    loss = next((m for m in a.metrics if m.name == "loss"), None)
    low = loss.low if loss is not None else 0.0
    if any(r.curve is not None for g in a.groups for r in g.ok + g.diverged):
        panels.append(Panel(CURVE_METRIC, CURVE_TITLE, LOSS_LABEL, low, baseline=baselines.get("loss")))
    elif loss is not None and loss is not headline:
        panels.append(
            Panel("loss", f"validation loss ({_direction(loss)})", LOSS_LABEL, low, baseline=baselines.get("loss"))
        )
    return TaskCurves(a.task, a.task_cfg.description, tuple(panels), curves)


# csv --------------------------------------------------------------------------------------------


def section_csv_rows(a: TaskAnalysis) -> list[dict[str, Any]]:
    """The task's rows of ``summary.csv``: one per group x metric."""
    return [
        csv_row(a, group_stats, stats) for group_stats in a.stats.values() for stats in group_stats.metrics.values()
    ]


def csv_row(a: TaskAnalysis, group_stats: GroupStats, stats: MetricStats) -> dict[str, Any]:
    """One group x metric: ``mean``, ``std``, ``ci_*`` and ``diff_*`` count the diverged seeds (at
    ``diverged_value``); ``mean_finished`` is over the finished seeds alone. ``diff_*`` is the
    unadjusted 95% description; ``verdict`` and the ``decision_*`` columns are the headline metric's
    question (empty in the other metrics' rows and the baseline's)."""
    group, metric, diff, outcome = group_stats.group, stats.metric, stats.difference, stats.outcome
    question = group_stats.question if metric is a.headline else None
    decision = question.decision if question is not None else None
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
        "seeds_did_not_learn": len(group.did_not_learn(a.headline)),
        "diverged_value": _blank(a.diverged_values[metric.name]) if group.diverged else "",
        "higher_is_better": metric.higher_is_better,
        "baseline_variant": baseline.variant if (baseline := a.baseline_of(group)) else a.baseline_label,
        "diff_vs_baseline": diff.difference if diff else "",
        "diff_ci_low": _blank(diff.ci_low) if diff else "",
        "diff_ci_high": _blank(diff.ci_high) if diff else "",
        "diff_test": diff.test if diff else "",
        "diff_p_value": _blank(diff.p_value) if diff else "",
        "direction": stats.direction,
        "verdict": question.verdict if question is not None else "",
        "decision_test": decision.test if decision else "",
        # the seeds the decision used: pairs, or the two sides' counts (variant vs baseline) when unpaired
        "decision_seeds": " vs ".join(map(str, decision.n)) if decision else "",
        "decision_alpha": decision.alpha if decision else "",
        "decision_difference": decision.difference if decision else "",
        "decision_ci_low": decision.interval[0] if decision and decision.interval else "",
        "decision_ci_high": decision.interval[1] if decision and decision.interval else "",
        "decision_p_value": _blank(decision.p_value) if decision else "",
        "decision_p_equivalence": _blank(decision.p_equivalence) if decision else "",
        "margin": question.margin.value if question is not None and question.margin else "",
        "prob_improvement": _blank(decision.prob_improvement) if decision else "",
        "prob_improvement_low": decision.prob_improvement_interval[0]
        if decision and decision.prob_improvement_interval
        else "",
        "prob_improvement_high": decision.prob_improvement_interval[1]
        if decision and decision.prob_improvement_interval
        else "",
        "decision_final": decision.final if decision else "",
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
