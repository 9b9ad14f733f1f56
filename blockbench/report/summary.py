"""Summarise a matrix directory: ``summary.md``, a tidy ``summary.csv``, the validation curves
``plots/curves.png`` (``plots``) and the verdict picture ``plots/verdicts.png`` (``forest``).

At the top, the verdicts: one question per task x variant (x level of the matrix's ``within:`` axes
and budget), the task's headline metric against the baseline variant, answered better, worse,
equivalent or undecided from the two sides' cells alone (``analysis``, ``decide``; worded by
``verdicts``). Then, with ``tune:``, each variant's tuning and what it cost; then per task: the
question (the margin of practical equivalence and its reason, the planned looks, what a seed varies),
each metric's mean ± std over seeds with the task's trivial baseline, steps, wall time, parameters and
the speed figures (means over the finished seeds), the LM's headroom to its entropy floor, each
metric's 95% interval over seeds (Student t, cut at the metric's bounds), the differences from the
baseline variant (the headline metric as decided, the others described with unadjusted intervals),
and the steps and seconds to the matrix's ``targets``; then the validation curves of every task in
one figure, a row per task. The statistics are
``analysis``'s and each task's part is rendered by ``section``; this module puts them together under
the matrix's header (its command, cells, machines and code) and adds the lists of the cells that did
not learn, diverged or failed, and where the wall time went. The index of every matrix,
``results/README.md``, is ``index.write_index``'s, from the same statistics.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..durations import format_duration
from ..prereg import PlanBook
from ..store.files import remove_files
from ..store.files import write_summary as write_summary_files
from ..store.layout import MATRIX_FILE, PLOTS_DIR
from ..store.lineage import Lineage
from ..store.record import CellRecord, MatrixRun, RunCell, read_matrix_run
from ..walltime import CELL_PARTS, MATRIX_PARTS
from .analysis import TaskAnalysis, analyze
from .forest import VERDICT_PICTURE, draw_matrix_picture
from .fragility import summary_swaps
from .ladders import draw_trend_picture, ladder_cost_line, ladder_questions, trend_section
from .lrcurves import rate_curves, rate_section
from .plans import plan_section
from .plots import CURVES_PICTURE, draw_curves
from .results import (
    Group,
    MatrixSettings,
    code_versions,
    gives_verdicts,
    lineage_lines,
    machines,
    matrix_description,
    resumed_cells,
    resumed_note,
    rung_tuning_costs,
    tuning_records,
)
from .section import comparisons, curve_row, section_csv_rows, section_markdown
from .table import fmt
from .table import row as _row
from .table import table_head as _table_head
from .tuning import tuning_cost_lines, tuning_section
from .verdicts import Comparison, verdict_lines

__all__ = ["Written", "write_report", "write_summary"]


@dataclass(frozen=True)
class Written:
    """What :func:`write_summary` wrote: the summary's Markdown and its questions as the verdicts show
    them (fragile ones marked), from which a run's short answer (``answer``) is printed."""

    markdown: str
    comparisons: list[Comparison]


def write_report(matrix_dir: Path, *, before_header: Callable[[], None] | None = None) -> str:
    """Write the summary of ``matrix_dir`` (:func:`write_summary`); return its Markdown."""
    return write_summary(matrix_dir, before_header=before_header).markdown


def write_summary(matrix_dir: Path, *, before_header: Callable[[], None] | None = None) -> Written:
    """Write ``summary.md``, ``summary.csv`` and the plots (the verdict picture at the end of the verdicts)
    for ``matrix_dir``.

    ``before_header`` is called once the task sections and plots are done, before ``matrix_run.json``
    is read for the header and the wall-time section: the matrix runner records the report's own time
    there, so that the summary it writes shows it, as does every later ``blockbench report``."""
    matrix_dir = Path(matrix_dir)
    settings, groups, analyses = analyze(matrix_dir)
    lines: list[str] = tuning_section(matrix_dir)  # a matrix with tune: each variant's values, before its results
    cost = tuning_cost_lines(matrix_dir)
    lines += cost if lines or not cost else ["## Tuning", "", *cost]
    csv_rows: list[dict[str, Any]] = []
    for analysis in analyses:
        lines += section_markdown(analysis)
        csv_rows += section_csv_rows(analysis)
    lines += _curves(matrix_dir, analyses)  # plots/curves.png
    lines += rate_section(matrix_dir, rate_curves(matrix_dir, settings))  # plots/lr_<task>.png, a ladder's
    lines += _did_not_learn(analyses)
    lines += _diverged_and_failed(groups)
    lines += _wrong_split(groups)
    lines += plan_section(matrix_dir, analyses)

    found = [comparison for analysis in analyses for comparison in comparisons(analysis)]
    apart = None if gives_verdicts(matrix_dir / MATRIX_FILE) else matrix_description(matrix_dir / MATRIX_FILE)
    picture = draw_matrix_picture(matrix_dir, found, apart=apart is not None)  # plots/verdicts.png
    swaps = summary_swaps(matrix_dir, analyses)  # the baseline swap (``fragility``): fragile verdicts marked
    found = swaps.marked(matrix_dir.name, found)
    ladder = [q for analysis in analyses for q in ladder_questions(analysis)]
    baseline = analyses[0].baseline_label if analyses else ""
    trends = trend_section(ladder, baseline, draw_trend_picture(matrix_dir, ladder))  # plots/trend.png

    if before_header is not None:
        before_header()
    run = read_matrix_run(matrix_dir)
    lines += _wall_time_section(run, groups)
    markdown = "\n".join(
        _header(matrix_dir, settings, groups, run)
        + verdict_lines(found, apart=apart)
        + swaps.summary_lines(matrix_dir.name)
        + picture
        + trends
        + lines
    )
    write_summary_files(matrix_dir, markdown, _to_csv(csv_rows))
    return Written(markdown, found)


def _curves(matrix_dir: Path, analyses: list[TaskAnalysis]) -> list[str]:
    """Draw ``plots/curves.png``, the validation curves of every task (a row each, ``plots.curves_figure``),
    and return the summary's section that shows it; none, and no stale figure left, without a history.
    A figure per task, ``plots/<task>.png``, as older reports drew, is removed: no stale picture stays beside it."""
    plots = matrix_dir / PLOTS_DIR
    older = [a.task for a in analyses if f"{a.task}.png" not in (CURVES_PICTURE, VERDICT_PICTURE)]
    remove_files(plots / f"{task}.png" for task in older)
    path = plots / CURVES_PICTURE
    if not draw_curves(path, f"{matrix_dir.name}: validation curves", [curve_row(a) for a in analyses]):
        remove_files([path])
        return []
    return [
        "## Validation curves",
        "",
        f"![The validation curves of {matrix_dir.name}]({PLOTS_DIR}/{CURVES_PICTURE})",
        "",
    ]


def _seed_text(result: CellRecord) -> Any:
    return "?" if result.seed is None else result.seed


def _did_not_learn(analyses: list[TaskAnalysis]) -> list[str]:
    """The cells that finished without beating their task's trivial baseline in the headline metric:
    where they ended and what they had to beat, and how many each variant has."""
    rows = [(a, g, r) for a in analyses for g in a.groups for r in g.did_not_learn(a.headline)]
    if not rows:
        return []
    lines = [
        "## Cells that did not learn",
        "",
        "These cells finished (neither diverged nor failed) with a headline metric no better than their task's "
        "trivial baseline: their values count as they are, and a question with such a seed on either side is "
        "decided by a rank test.",
        "",
    ]
    for a, g, r in rows:
        metric = a.headline
        reference = r.baselines.get(metric.name)
        against = f" (trivial baseline {fmt(reference)})" if reference is not None else ""
        lines.append(
            f"- `{g.task}/{g.variant}/seed{_seed_text(r)}`: {metric.name} {fmt(r.metrics[metric.name])}{against}"
        )
    counts = {}
    for a, g, _ in rows:
        counts[g.task, g.variant] = f"{len(g.did_not_learn(a.headline))} of {len(g.ok) + len(g.diverged)}"
    lines += [
        "",
        "Per variant: " + "; ".join(f"{task} {variant}: {n}" for (task, variant), n in counts.items()) + ".",
        "",
    ]
    return lines


def _wrong_split(groups: list[Group]) -> list[str]:
    """The reported cells left out of every statistic because they scored another split than the
    validation split, and how to replace them."""
    rows = [(g, r) for g in groups for r in g.wrong_split]
    if not rows:
        return []
    return [
        "## Cells scored on the wrong split",
        "",
        "These cells' configs score the task's tuning split (`task.eval_split: tuning`), the split tuning "
        "chooses its values on, not the validation split every reported metric comes from: they count in no "
        "verdict, table or plot. Running the matrix again retrains them on the validation split "
        "(their config changed).",
        "",
        *(f"- `{g.task}/{g.variant}/seed{_seed_text(r)}`" for g, r in rows),
        "",
    ]


def _diverged_and_failed(groups: list[Group]) -> list[str]:
    """The lists of the diverged cells (where and at what loss they stopped) and of the failed ones (their error)."""
    lines = []
    diverged = [(g, r) for g in groups for r in g.diverged]
    if diverged:
        lines += [
            "## Diverged cells",
            "",
            "Training stopped when the loss exceeded the divergence threshold or stopped being finite.",
            "",
        ]
        for g, r in diverged:
            loss = r.last_finite_loss
            loss_text = f"last finite training loss {fmt(loss)}" if loss is not None else "no finite training loss"
            step = "?" if r.diverged_at_step is None else r.diverged_at_step
            lines.append(f"- `{g.task}/{g.variant}/seed{_seed_text(r)}`: diverged at step {step}, {loss_text}")
        lines.append("")
    failures = [(g, r) for g in groups for r in g.failed]
    if failures:
        lines += ["## Failed cells", ""]
        lines += [
            f"- `{g.task}/{g.variant}/seed{_seed_text(r)}`: {'no error recorded' if r.error is None else r.error}"
            for g, r in failures
        ]
        lines.append("")
    return lines


def _header(matrix_dir: Path, settings: MatrixSettings, groups: list[Group], run: MatrixRun | None) -> list[str]:
    results = [r for g in groups for r in g.results]
    counts = {status: sum(len(getattr(g, status)) for g in groups) for status in ("ok", "diverged", "failed")}
    tuning = tuning_records(matrix_dir)
    lines = [f"# {matrix_dir.name}", ""]
    if settings.description:
        lines += [settings.description, ""]
    if run is not None:
        share = _training_share(run, groups)
        share_text = (
            ""
            if share is None
            else f"; training steps {share[0]:.0%} of the wall time"
            + (f" of {share[2]} parallel slots" if share[2] > 1 else "")
        )
        lines.append(
            f"Command: `{run.command}` (last run: {format_duration(run.wall_time_s)}, {run.cells_trained} cells "
            f"trained{share_text})  "
        )
    reported_s, tuning_s = (sum(r.wall_time_s or 0.0 for r in records) for records in (results, tuning))
    n_tuning = len(tuning)
    lines.append(
        f"Cost: {format_duration(reported_s + tuning_s)} of cell processes in all, whenever they trained "
        f"({format_duration(reported_s)} for the {len(results)} reported cells"
        + (f", {format_duration(tuning_s)} for the {n_tuning} tuning cells" if n_tuning else "")
        + f"; cells run side by side take less wall time{resumed_note(resumed_cells(results + tuning))})  "
    )
    wrong_split = sum(len(g.wrong_split) for g in groups)
    plan = PlanBook.load(matrix_dir).current
    if plan:
        lines.append(f"Analysis plan: `{plan}` (what decides the verdicts, fixed before the cells: see below)  ")
    missing = settings.without_result(matrix_dir, len(results) + wrong_split)
    of = f" of {len(results) + wrong_split + missing}" if missing > 0 or wrong_split else ""
    refused = f", {wrong_split} scored on the wrong split and left out" if wrong_split else ""
    lines.append(
        f"Cells: {len(results)}{of} ({counts['ok']} ok, {counts['diverged']} diverged, {counts['failed']} failed"
        f"{refused})  "
    )
    if missing > 0:
        lines.append(
            f"Unfinished: {missing} cell(s) without a result yet (`blockbench matrix` resumes the run), so the "
            "verdicts below are provisional: they compare the cells that have finished.  "
        )
    lines += ladder_cost_line(settings.rungs, groups, rung_tuning_costs(matrix_dir))
    lines += [f"Machine: {m}  " for m in machines(results + tuning)]
    lines += _bit_for_bit(results + tuning)
    lineage = Lineage.load(matrix_dir.parent)  # the results folder's (blockbench.store.lineage)
    code = code_versions(results, lineage)
    lines += [f"Code: {c}  " for c in code]
    tuning_code = code_versions(tuning, lineage)
    if tuning_code and tuning_code != code:  # e.g. candidates added to tune: later, the finished ones reused
        lines.append(f"Code of the tuning cells: {'; '.join(tuning_code)}  ")
    lines += [f"Current at this checkout: {text}  " for text in lineage_lines(results + tuning, lineage)]
    lines.append("")
    return lines


def _ran_on_gpu(record: CellRecord) -> bool | None:
    """Whether a finished cell trained on a GPU: its ``runtime`` says so; a record from before it ran on
    a GPU where its machine had one (``trainer.accelerator: auto``); None for a failed cell."""
    if record.status == "failed":
        return None
    if record.runtime is not None and record.runtime.accelerator is not None:
        return record.runtime.accelerator != "cpu"
    return bool(record.provenance and record.provenance.hardware.get("gpu_count"))


def _bit_for_bit(records: list[CellRecord]) -> list[str]:
    """The header's line on whether a rerun gives the same bits: on a CPU it does (same package versions,
    same kind of CPU); on a GPU only where every GPU cell ran with ``trainer.deterministic``."""
    on_gpu = [r for r in records if _ran_on_gpu(r)]
    on_cpu = sum(1 for r in records if _ran_on_gpu(r) is False)
    loose = sum(1 for r in on_gpu if not (r.runtime and r.runtime.deterministic))
    if not on_gpu and not on_cpu:
        return []
    cpu = "CPU: same bits for the same versions and CPU kind" if on_cpu else ""
    if loose:
        return [
            f"Bit for bit: no: {loose} of {len(on_gpu)} GPU cell(s) ran without trainer.deterministic; a rerun of "
            f"them agrees only approximately{f' ({cpu})' if cpu else ''}.  "
        ]
    gpu = "GPU with trainer.deterministic: same bits for the same versions, driver and GPU kind" if on_gpu else ""
    return [f"Bit for bit: yes ({'; '.join(filter(None, [cpu, gpu]))}).  "]


# where the time went ----------------------------------------------------------------------------

#: the parts of a cell's wall time (``result.json`` ``wall_time_breakdown``) and their columns in the summary
CELL_TIME_COLUMNS = {part: part.replace("_", " ") for part in ("startup", *CELL_PARTS, "other", "total")}
#: the matrix's own parts (``matrix_run.json`` ``wall_time_breakdown``, all but its cells) as the summary names them
MATRIX_TIME_NAMES = {
    part: {
        "tensorboard_views": "TensorBoard views",
        "peak_probe": "peak FLOP/s probe",
        "cell_server": "cell process server start-up",
        "report": "this report",
    }.get(part, part.replace("_", " "))
    for part in ("startup", *MATRIX_PARTS, "other")
    if part != "cells"
}


def _cell_key(group: Group, result: CellRecord) -> str:
    """``task/variant/seed<k>``: a result's cell as the runner names it (``matrix_run.json`` ``cells``)."""
    return f"{group.task}/{group.variant}/seed{_seed_text(result)}"


def _last_run_cells(run: MatrixRun, groups: list[Group]) -> list[tuple[RunCell, dict[str, Any]]] | None:
    """Each cell the last run trained, as the runner timed it (key, seconds), with the breakdown its
    result recorded (a tuning cell's, outside the groups: the runner's copy; empty if none: a failed
    cell); None when the run did not time its cells (an older run, or cells run as cluster jobs)."""
    if not run.cells or not run.wall_time_breakdown:
        return None
    results = {_cell_key(g, r): r for g in groups for r in g.results}
    return [
        (
            cell,
            (record.wall_time_breakdown if (record := results.get(cell.key)) is not None else cell.wall_time_breakdown)
            or {},
        )
        for cell in run.cells
    ]


def _training_share(run: MatrixRun, groups: list[Group]) -> tuple[float, float, int] | None:
    """The last run's training steps as a share of its wall time, their seconds, and the slots the
    wall time was shared by: with N cells at a time (``--jobs N``) the share is of N x the wall time,
    the time the slots could have trained."""
    cells, total = _last_run_cells(run, groups), (run.wall_time_breakdown or {}).get("total")
    if cells is None or not total:
        return None
    steps = sum(breakdown.get("train_steps") or 0.0 for _, breakdown in cells)
    slots = max(1, min(int(run.jobs or 1), len(cells)))
    return steps / (slots * total), steps, slots


def _wall_time_section(run: MatrixRun | None, groups: list[Group]) -> list[str]:
    """``Where the time went``: per task, the mean seconds of each part of its cells' wall time, and
    the last run's cells and the matrix's own parts (nothing for results recorded before the breakdown)."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for group in groups:
        for result in group.results:
            if result.wall_time_breakdown:
                by_task.setdefault(group.task, []).append(result.wall_time_breakdown)
    if not by_task:
        return []
    records = [record for task_records in by_task.values() for record in task_records]
    resumed = sum(1 for record in records if record.get("resumed"))
    no_startup = sum(1 for record in records if record.get("startup") is None)
    lines = [
        "## Where the time went",
        "",
        "Seconds per cell, mean over each task's cells: startup from the process start to the cell's code "
        "(interpreter, imports), setup from there to the fit (config, code fingerprint, resume check, logger, "
        "Trainer), build the model and data module (with the real-data tasks' data: they size the model by it), "
        "data their generation or reading (`prepare_data`, `setup`, data loaders), fit setup Lightning's until "
        "training starts (the model to its device, optimizers, a checkpoint loaded to resume, the peak FLOP/s), "
        "flop count the model FLOPs counted on the first batch (on a GPU the first call of every kernel), data wait "
        "the training loop's waits for batches, first step the first step's time beyond the steady steps' median, "
        "train steps the optimizer steps (forward, backward, optimizer), loop the training loop between them "
        "(logging, callbacks), validation every validation run, checkpoints their saves, teardown from the end of "
        "training to the result, other what no part holds (results recorded before a part was measured keep its "
        "time there); total from the process start to the result."
        + (f" {resumed} resumed cell(s) count their last process only." if resumed else "")
        + (
            f" {no_startup} cell(s) have no start-up time (not run as a process of their own, or not on Linux): their "
            "total starts at training."
            if no_startup
            else ""
        ),
        "",
    ]
    lines += _table_head(["task", "cells", *CELL_TIME_COLUMNS.values()])
    for task, task_records in by_task.items():
        means = []
        for part in CELL_TIME_COLUMNS:
            values = [record[part] for record in task_records if record.get(part) is not None]
            means.append(f"{statistics.fmean(values):,.1f}" if values else "–")
        lines.append(_row([task, str(len(task_records)), *means]))
    lines.append("")
    return lines + _last_run_lines(run, groups)


def _last_run_lines(run: MatrixRun | None, groups: list[Group]) -> list[str]:
    """The last run's wall time: its cells' processes as the runner saw them (with the time after they
    wrote their results, which their breakdown cannot hold), their training steps, and the matrix's own parts."""
    breakdown = run.wall_time_breakdown if run else None
    if not breakdown:
        return []
    own = ", ".join(
        f"{name} {breakdown[part]:,.1f} s"
        for part, name in MATRIX_TIME_NAMES.items()
        if breakdown.get(part) is not None
    )
    text = f"The last run took {breakdown['total']:,.1f} s"
    cells, share = _last_run_cells(run, groups), _training_share(run, groups)
    if cells and share is not None:
        fraction, steps, slots = share
        seconds = sum(cell.seconds for cell, _ in cells)
        # a breakdown from the process start (all but off Linux) ends where the process wrote its result
        after = sum(cell.seconds - recorded["total"] for cell, recorded in cells if recorded.get("startup") is not None)
        at_once = f", {slots} at a time" if slots > 1 else ""
        text += (
            f": {len(cells)} cells{at_once}, whose processes took {seconds:,.1f} s from start to exit ({after:,.1f} s "
            f"of it after they wrote their results: shutting down), {steps:,.1f} s of it training steps "
            f"({fraction:.0%} of the wall time{' of the slots' if slots > 1 else ''}; outside them {1 - fraction:.0%})"
        )
    return [text + f"; the matrix's own parts: {own}.", ""]


def _to_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()
