"""Summarise a matrix directory: ``summary.md``, a tidy ``summary.csv`` and ``plots/<task>.png``.

Per task x variant: each metric's mean ± std over seeds, the task's trivial baseline, steps,
wall time, parameters, and the speed figures (step time, throughput, MFU, data wait, peak memory;
means over the finished seeds); then each metric's 95% confidence interval over seeds (Student t,
kept inside the metric's range), its difference from the matrix's baseline variant with a 95%
interval (paired t when the seeds match, Welch otherwise) and a mark where the Holm-adjusted
p-value over the whole matrix is below 0.05, the steps and seconds to reach the matrix's
``targets``, and the validation curves. Above them, the verdict of each variant in each task's
headline metric (``blockbench.verdicts``); :func:`write_index` puts every matrix's verdicts into the
index of a results root, ``results/README.md``, from the same statistics (:func:`analyze`).

The rules that keep the statistics from flattering a variant:

- A diverged seed counts, with the worse of the task's trivial baseline and the task's worst
  finished seed (``stats.diverged_value``): an unstable variant is not judged by its good seeds.
- Seeds of different variants share the data order, so a variant with the baseline variant's
  seeds is compared by a paired t test on the seed-matched differences.
- Every difference of the matrix is one family: Holm's adjustment controls the chance of any
  false mark.
- Cells that failed (an error, not a finding) are left out of the statistics and listed.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import urllib.parse
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tasks import TASK_CONFIGS, Metric

from ..layout import CELLS_DIR, CONFIG_FILE, INDEX_FILE, MATRIX_FILE, PLOTS_DIR, RESULT_FILE, RUN_FILE, SUMMARY_CSV, SUMMARY_MD, TUNE_DIR, cell_files, write_atomic
from .lens import logit_lens_section
from ..record import SPEED_FIGURES, CellRecord, read_tuning
from ..provenance import code_fingerprint
from .plots import CURVE_METRIC, VariantCurves, plot_task, plotted_history
from .stats import LOGIT_EPSILON, PAIRED, Difference, compare, diverged_value, holm_adjust, mean_std, t_confidence_interval, time_to_target, with_diverged
from .results import BUDGET_AXIS, Group, MatrixSettings, load_groups
from .table import decimals, fmt
from .table import row as _row
from .table import table_head as _table_head
from .tuning import chosen_text, tuning_section
from .verdicts import Comparison, Index, MatrixVerdicts, NotRun, Side, index_markdown, verdict_lines
from ..walltime import CELL_PARTS, MATRIX_PARTS

__all__ = ["Group", "load_groups", "mean_std", "write_index", "write_report"]

LEVEL = 0.95  # confidence level of every interval in the summary
ALPHA = 1 - LEVEL  # a difference is marked when its Holm-adjusted p-value is below this
SIGNIFICANT = "✓"  # marks a difference whose Holm-adjusted p-value is below ALPHA


def analyze(matrix_dir: Path) -> tuple[MatrixSettings, list[Group], list["TaskSection"]]:
    """A matrix's settings, its groups and a section per task with every statistic computed: the one
    path from the cells to the numbers, which the summary and the index of verdicts both render."""
    settings = MatrixSettings.load(matrix_dir)
    groups = load_groups(matrix_dir)
    by_task: dict[str, list[Group]] = defaultdict(list)
    for group in groups:
        by_task[group.task].append(group)
    baseline_variant = settings.baseline_variant or (groups[0].variant if groups else None)
    sections = [TaskSection(matrix_dir, task, task_groups, baseline_variant, settings)
                for task, task_groups in by_task.items()]
    # one family: every comparison of the matrix (task x variant x metric) that has a p-value
    adjusted = holm_adjust({(section.task, *key): diff.p_value for section in sections
                            for key, diff in section.differences.items() if diff.p_value is not None})
    for section in sections:
        section.summarize({(variant, metric): p for (task, variant, metric), p in adjusted.items() if task == section.task},
                          len(adjusted))
    return settings, groups, sections


def write_report(matrix_dir: Path, *, before_header: Callable[[], None] | None = None) -> str:
    """Write ``summary.md``, ``summary.csv`` and the plots for ``matrix_dir``; return the markdown.

    ``before_header`` is called once the task sections and plots are done, before ``matrix_run.json``
    is read for the header and the wall-time section: the matrix runner records the report's own time
    there, so that the summary it writes shows it, as does every later ``blockbench report``."""
    matrix_dir = Path(matrix_dir)
    settings, groups, sections = analyze(matrix_dir)
    lines: list[str] = tuning_section(matrix_dir)  # a matrix with tune: each variant's values, before its results
    csv_rows: list[dict[str, Any]] = []
    for section in sections:
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

    if before_header is not None:
        before_header()
    run = _last_run(matrix_dir)
    lines += _wall_time_section(run, groups)
    comparisons = [comparison for section in sections for comparison in section.comparisons()]
    demonstration = not _gives_verdicts(matrix_dir / MATRIX_FILE)
    markdown = "\n".join(_header(matrix_dir, settings, groups, run) + verdict_lines(comparisons, demonstration=demonstration) + lines)
    write_atomic(matrix_dir / SUMMARY_MD, markdown)
    write_atomic(matrix_dir / SUMMARY_CSV, _to_csv(csv_rows))
    return markdown


def write_index(results_root: Path, matrices: Path | None = None, *, command: str | None = None) -> str:
    """Write ``<results_root>/README.md``, the verdicts of every matrix folder there (see
    ``blockbench.verdicts``) from the same statistics as each one's summary; return the markdown.

    Matrices without a finished or diverged cell are listed as not run yet, with the command that runs
    them: those of ``results_root`` and every matrix file in ``matrices`` (a folder such as
    ``configs/matrix``; default: the folders of the matrix files the results were made from). Tuning
    cells (``<matrix>/tune/``) are not the reported seeds: no verdict reads them. ``command``: the
    command the index says made it (default ``blockbench report --index <results_root>``)."""
    results_root = Path(results_root)
    folders = sorted(p for p in results_root.iterdir() if p.is_dir() and ((p / CELLS_DIR).is_dir() or (p / MATRIX_FILE).is_file()))
    index = Index(command or f"blockbench report --index {results_root}")
    files = _matrix_files(matrices if matrices is not None else _recorded_matrix_folders(folders))
    for folder in folders:
        if not _gives_verdicts(folder / MATRIX_FILE):
            index.demonstrations.append(folder.name)
            continue
        _, groups, sections = analyze(folder)
        results, tuning = [r for g in groups for r in g.results], _tuning_results(folder)
        if not any(g.ok or g.diverged for g in groups):
            failed = sum(len(g.failed) for g in groups)
            reason = f"{failed} cell(s) failed, none finished" if failed else "no cell has finished"
            index.not_run.append(NotRun(folder.name, _run_command(folder, files), reason,
                                        _description(files.get(folder.name, folder / MATRIX_FILE))))
            continue
        unfinished = MatrixSettings.load(folder).without_result(folder, len(results))
        index.matrices.append(MatrixVerdicts(folder.name, [c for section in sections for c in section.comparisons()],
                                             has_summary=(folder / SUMMARY_MD).is_file(), unfinished=unfinished,
                                             code=tuple(_code_versions(results + tuning)),
                                             machines=tuple(_machines(results + tuning)),
                                             cost=_cost(folder, results, tuning)))
    ran = {folder.name for folder in folders}
    index.not_run += [NotRun(name, f"blockbench matrix {path}", "no results", _description(path)) for name, path in files.items()
                      if name not in ran and _gives_verdicts(path)]
    index.not_run.sort(key=lambda m: m.name)
    markdown = index_markdown(index)
    write_atomic(results_root / INDEX_FILE, markdown)
    return markdown


def _first_cell(folder: Path) -> dict[str, Any]:
    files = cell_files(folder)
    return json.loads(files[0].read_text()) if files else {}


def _recorded_matrix_folders(folders: list[Path]) -> list[Path]:
    """The folders of the matrix files these results were made from (``cell.json``), where they still exist."""
    recorded = [(_first_cell(folder).get("matrix_file") or {}).get("path") for folder in folders]
    return list(dict.fromkeys(Path(path).parent for path in recorded if path and Path(path).is_file()))


def _matrix_files(folders: Path | list[Path]) -> dict[str, Path]:
    """Matrix name -> its file, for every matrix file (a YAML with ``name`` and ``axes``) in ``folders``."""
    files: dict[str, Path] = {}
    for folder in [folders] if isinstance(folders, Path) else folders:
        for path in sorted(folder.glob("*.y*ml")):
            try:
                raw = yaml.safe_load(path.read_text())
            except yaml.YAMLError:
                continue  # not a matrix file the runner could read either; `blockbench matrix` says why
            if isinstance(raw, dict) and isinstance(raw.get("name"), str) and "axes" in raw:
                files.setdefault(raw["name"], path)
    return files


def _matrix_raw(matrix_file: Path) -> dict[str, Any]:
    """The matrix file's top-level keys, unvalidated ({} when it is missing or does not parse)."""
    try:
        raw = yaml.safe_load(matrix_file.read_text()) if matrix_file.is_file() else None
    except yaml.YAMLError:
        return {}
    return raw if isinstance(raw, dict) else {}


def _gives_verdicts(matrix_file: Path) -> bool:
    """Whether the matrix file's results are verdicts (``verdicts: false`` marks a demonstration)."""
    return _matrix_raw(matrix_file).get("verdicts") is not False


def _description(matrix_file: Path) -> str:
    """The matrix file's ``description`` ("" without one, or when the file does not parse)."""
    return str(_matrix_raw(matrix_file).get("description") or "").strip()


def _run_command(folder: Path, files: dict[str, Path]) -> str:
    """The command that runs the matrix of the results ``folder``: its file's, the one its cells record, or its last run's."""
    if folder.name in files:
        return f"blockbench matrix {files[folder.name]}"
    recorded = (_first_cell(folder).get("matrix_file") or {}).get("path")
    if recorded:
        return f"blockbench matrix {recorded}"
    run = _last_run(folder)
    return run["command"] if run else f"blockbench matrix <the matrix file of {folder.name}>"


def _last_run(folder: Path) -> dict[str, Any] | None:
    """``matrix_run.json``, written by the runner: the last run's command, its wall time and where it went."""
    run_file = folder / RUN_FILE
    return json.loads(run_file.read_text()) if run_file.is_file() else None


def _tuning_results(folder: Path) -> list[dict[str, Any]]:
    """The results of a matrix's tuning cells (``<matrix>/tune/cells``): no statistic reads them, but
    their code, machine and time are part of the matrix's."""
    return [json.loads(path.read_text()) for path in sorted((folder / TUNE_DIR / CELLS_DIR).rglob(RESULT_FILE))]


def _machines(results: list[dict[str, Any]]) -> list[str]:
    """The machines the cells ran on (``provenance.machine_description``), each once."""
    return sorted({r["machine"] for r in results if "machine" in r})


def _cost(folder: Path, results: list[dict[str, Any]], tuning: list[dict[str, Any]]) -> str | None:
    """``blockbench matrix ... --jobs 2, 50.4 min, 36 cells trained; 1.4 h of cell processes (36 cells)``:
    the matrix's last run (``matrix_run.json``), then the processes' time of every cell with a result
    (``results``, the reported cells' as loaded for the statistics, and ``tuning``, the tuning cells'): what the
    whole matrix cost, whether it ran at once or resumed over several runs. None without either."""
    run = _last_run(folder)
    seconds = [r["wall_time_s"] for r in results + tuning if isinstance(r.get("wall_time_s"), (int, float))]
    parts = [f"`{run['command']}`, {run['wall_time_s'] / 60:.1f} min, {run['cells_trained']} cells trained"] if run else []
    if seconds:
        total = sum(seconds)
        took = f"{total / 3600:.1f} h" if total >= 3600 else f"{total / 60:.1f} min"  # as the run's wall time
        parts.append(f"{took} of cell processes ({len(seconds)} cells)")
    return "; ".join(parts) or None


def _header(matrix_dir: Path, settings: MatrixSettings, groups: list[Group], run: dict[str, Any] | None) -> list[str]:
    results = [r for g in groups for r in g.results]
    counts = {status: sum(len(getattr(g, status)) for g in groups) for status in ("ok", "diverged", "failed")}
    tuning = _tuning_results(matrix_dir)
    machines = _machines(results + tuning)
    lines = [f"# {matrix_dir.name}", ""]
    if settings.description:
        lines += [settings.description, ""]
    if run is not None:
        share = _training_share(run, groups)
        share_text = "" if share is None else f"; training steps {share[0]:.0%} of the wall time" + (
            f" of {share[2]} parallel slots" if share[2] > 1 else "")
        lines.append(f"Command: `{run['command']}` (last run: {run['wall_time_s'] / 60:.1f} min, {run['cells_trained']} cells "
                     f"trained{share_text})  ")
    missing = settings.without_result(matrix_dir, len(results))
    of = f" of {len(results) + missing}" if missing > 0 else ""
    lines.append(f"Cells: {len(results)}{of} ({counts['ok']} ok, {counts['diverged']} diverged, {counts['failed']} failed)  ")
    if missing > 0:
        lines.append(f"Unfinished: {missing} cell(s) without a result yet (`blockbench matrix` resumes the run), so the "
                     "verdicts below are provisional: they compare the cells that have finished.  ")
    lines += [f"Machine: {m}  " for m in machines]
    code = _code_versions(results)
    lines += [f"Code: {c}  " for c in code]
    tuning_code = _code_versions(tuning)
    if tuning_code and tuning_code != code:  # e.g. candidates added to tune: later, the finished ones reused
        lines.append(f"Code of the tuning cells: {'; '.join(tuning_code)}  ")
    lines.append("")
    return lines


#: the parts of a cell's wall time (``result.json`` ``wall_time_breakdown``) and their columns in the summary
CELL_TIME_COLUMNS = {part: part.replace("_", " ") for part in ("startup", *CELL_PARTS, "other", "total")}
#: the matrix's own parts (``matrix_run.json`` ``wall_time_breakdown``, all but its cells) as the summary names them
MATRIX_TIME_NAMES = {part: {"tensorboard_views": "TensorBoard views", "peak_probe": "peak FLOP/s probe",
                            "cell_server": "cell process server start-up", "report": "this report"}.get(part, part.replace("_", " "))
                     for part in ("startup", *MATRIX_PARTS, "other") if part != "cells"}


def _cell_key(group: Group, result: dict[str, Any]) -> str:
    """``task/variant/seed<k>``: a result's cell as the runner names it (``matrix_run.json`` ``cells``)."""
    return f"{group.task}/{group.variant}/seed{result.get('seed', '?')}"


def _last_run_cells(run: dict[str, Any], groups: list[Group]) -> list[tuple[dict[str, Any], dict[str, Any]]] | None:
    """Each cell the last run trained, as the runner timed it (key, seconds), with the breakdown its
    result recorded (a tuning cell's, outside the groups: the runner's copy; empty if none: a failed
    cell); None when the run did not time its cells (an older run, or cells run as cluster jobs)."""
    if not run.get("cells") or not run.get("wall_time_breakdown"):
        return None
    results = {_cell_key(g, r): r for g in groups for r in g.results}
    return [(cell, (results.get(cell["key"]) or cell).get("wall_time_breakdown") or {}) for cell in run["cells"]]


def _training_share(run: dict[str, Any], groups: list[Group]) -> tuple[float, float, int] | None:
    """The last run's training steps as a share of its wall time, their seconds, and the slots the
    wall time was shared by: with N cells at a time (``--jobs N``) the share is of N x the wall time,
    the time the slots could have trained."""
    cells, total = _last_run_cells(run, groups), (run.get("wall_time_breakdown") or {}).get("total")
    if cells is None or not total:
        return None
    steps = sum(breakdown.get("train_steps") or 0.0 for _, breakdown in cells)
    slots = max(1, min(int(run.get("jobs") or 1), len(cells)))
    return steps / (slots * total), steps, slots


def _wall_time_section(run: dict[str, Any] | None, groups: list[Group]) -> list[str]:
    """``Where the time went``: per task, the mean seconds of each part of its cells' wall time, and
    the last run's cells and the matrix's own parts (nothing for results recorded before the breakdown)."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for group in groups:
        for result in group.results:
            if result.get("wall_time_breakdown"):
                by_task.setdefault(group.task, []).append(result["wall_time_breakdown"])
    if not by_task:
        return []
    records = [record for task_records in by_task.values() for record in task_records]
    resumed = sum(1 for record in records if record.get("resumed"))
    no_startup = sum(1 for record in records if record.get("startup") is None)
    lines = [
        "## Where the time went", "",
        "Seconds per cell, mean over each task's cells: startup from the process start to training (interpreter, imports, "
        "config), build the model and data module (with the real-data tasks' data: they size the model by it), data "
        "their generation or reading (`prepare_data`, `setup`, data loaders), data wait the training loop's waits for "
        "batches, train steps the optimizer steps (forward, backward, optimizer), validation every validation run, "
        "checkpoints their saves, other the rest (Lightning's set-up and teardown, logging, the FLOP count, a peak FLOP/s "
        "probe the cell ran itself, loading a checkpoint to resume, the result); "
        "total from the process start to the result."
        + (f" {resumed} resumed cell(s) count their last process only." if resumed else "")
        + (f" {no_startup} cell(s) have no start-up time (not run as a process of their own, or not on Linux): their "
           "total starts at training." if no_startup else ""),
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


def _last_run_lines(run: dict[str, Any] | None, groups: list[Group]) -> list[str]:
    """The last run's wall time: its cells' processes as the runner saw them (with the time after they
    wrote their results, which their breakdown cannot hold), their training steps, and the matrix's own parts."""
    breakdown = (run or {}).get("wall_time_breakdown")
    if not breakdown:
        return []
    own = ", ".join(f"{name} {breakdown[part]:,.1f} s" for part, name in MATRIX_TIME_NAMES.items()
                    if breakdown.get(part) is not None)
    text = f"The last run took {breakdown['total']:,.1f} s"
    cells, share = _last_run_cells(run, groups), _training_share(run, groups)
    if cells and share is not None:
        fraction, steps, slots = share
        seconds = sum(cell["seconds"] for cell, _ in cells)
        # a breakdown from the process start (all but off Linux) ends where the process wrote its result
        after = sum(cell["seconds"] - recorded["total"] for cell, recorded in cells if recorded.get("startup") is not None)
        at_once = f", {slots} at a time" if slots > 1 else ""
        text += (f": {len(cells)} cells{at_once}, whose processes took {seconds:,.1f} s from start to exit ({after:,.1f} s "
                 f"of it after they wrote their results: shutting down), {steps:,.1f} s of it training steps "
                 f"({fraction:.0%} of the wall time{' of the slots' if slots > 1 else ''}; outside them {1 - fraction:.0%})")
    return [text + f"; the matrix's own parts: {own}.", ""]


def _code_versions(results: list[dict[str, Any]]) -> list[str]:
    """``commit 595b935 (clean tree)`` per distinct code version the cells ran with (with its count
    if there are several): a summary says which code made its numbers, and whether it was committed.
    Cells whose code fingerprint is not this checkout's are marked stale: the numbers are still those
    of their commit, but ``blockbench matrix`` here would train them again (``plan``'s "stale")."""
    current = code_fingerprint()
    versions: dict[str, int] = {}
    for r in results:
        git = (r.get("provenance") or {}).get("git") or {}
        if not git.get("commit"):
            continue
        text = f"commit {git['commit'][:7]}" + {True: " + uncommitted changes", False: " (clean tree)"}.get(git.get("dirty"), "")
        if r.get("code_fingerprint") not in (None, current):
            text += ", stale at this checkout (its model, task or runner code has changed since)"
        versions[text] = versions.get(text, 0) + 1
    if len(versions) <= 1:
        return list(versions)
    return [f"{text} ({n} cell{'s' if n != 1 else ''})" for text, n in versions.items()]


def _arrow(metric: Metric) -> str:
    return f"{metric.name} {'↑' if metric.higher_is_better else '↓'}"


@dataclass
class TargetOutcome:
    """How the seeds of one group did against one target."""

    reached: list[tuple[int, float | None]]  # (step, seconds) of each finished seed that reached it
    seeds_with_history: int  # finished seeds with a history, plus the diverged seeds (0 without any history)

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


@dataclass(frozen=True)
class MetricStats:
    """One group's statistics of one metric, computed once: summary.md and summary.csv both render
    these, so the two files cannot disagree."""

    metric: Metric
    #: seed -> value of every seed in the statistics: the finished seeds, and the diverged ones at the
    #: task's diverged value (see ``TaskSection.diverged_values``)
    values: dict[Any, float]
    mean: float | None  # of ``values`` (None: no seed in the statistics)
    std: float | None
    interval: tuple[float, float] | None  # of the mean, inside the metric's range (None: fewer than two seeds)
    mean_finished: float | None  # of the finished seeds alone
    difference: Difference | None  # from the baseline variant (None: the baseline itself, or a side without seeds)
    p_holm: float | None  # the difference's Holm-adjusted p-value over the matrix's family of comparisons
    target: float | None  # the matrix's target for this metric
    outcome: TargetOutcome | None  # the seeds against ``target`` (None: no target, or no finished seed)

    @property
    def significant(self) -> bool:
        """Whether the difference's Holm-adjusted p-value is below ALPHA."""
        return self.p_holm is not None and self.p_holm < ALPHA

    @property
    def direction(self) -> str:
        """``better``, ``worse`` or ``same`` than the baseline variant; empty without a difference."""
        return direction(self.difference.difference, self.metric) if self.difference else ""


@dataclass(frozen=True)
class GroupStats:
    """One group's statistics: each metric's, and the figures of its finished seeds (None: no finished seed)."""

    group: Group
    metrics: dict[str, MetricStats]  # by metric name
    steps: int | None  # of the first finished seed (every seed of a group trains the same config)
    wall_time_s: float | None  # mean over the finished seeds
    parameters: int | None  # of the first finished seed
    throughput: float | None  # mean over the finished seeds
    throughput_unit: str | None
    speed: dict[str, float | None]  # each of SPEED_FIGURES: mean over the finished seeds that recorded it


class TaskSection:
    """One task's part of the summary: its statistics (:meth:`summarize`), rendered as tables, a plot
    and CSV rows."""

    def __init__(self, matrix_dir: Path, task: str, groups: list[Group], baseline_variant: str | None,
                 settings: MatrixSettings) -> None:
        self.matrix_dir = matrix_dir
        self.task = task
        self.groups = groups
        self.task_cfg = TASK_CONFIGS[groups[0].task_name]
        self.metrics: tuple[Metric, ...] = self.task_cfg.metrics
        self.baseline_variant = baseline_variant
        #: whether each variant is compared with the baseline variant at its own budget (see BUDGET_AXIS)
        self.by_budget = any(g.budget is not None for g in groups) and any(g.design for g in groups)
        named = next((g for g in groups if g.variant == baseline_variant), None)
        #: the baseline variant's label, without the budget when comparisons are by budget
        self.baseline_label = (named.design if named else baseline_variant or "") if self.by_budget else baseline_variant or ""
        #: budget (None unless by budget) -> the baseline variant's group
        self.baselines: dict[Any, Group] = {
            (g.budget if self.by_budget else None): g for g in groups
            if (g.design == self.baseline_label if self.by_budget else g.variant == baseline_variant)
        }
        self.targets = settings.targets.get(task) or settings.targets.get(groups[0].task_name) or {}
        self.trivial_baselines: dict[str, float] = next(
            (r["baselines"] for g in groups for r in g.ok + g.diverged if r.get("baselines")), {}
        )
        #: the value a diverged seed counts with, per metric (None: no baseline and no finished seed)
        self.diverged_values: dict[str, float | None] = {
            m.name: diverged_value(self.trivial_baselines.get(m.name),
                                   [v for g in groups for v in g.finished_values(m.name).values()], m.higher_is_better)
            for m in self.metrics
        }
        #: (variant, metric) -> seed -> value of every seed in the statistics: the finished seeds, and the
        #: diverged ones at the value of :attr:`diverged_values`
        self.values: dict[tuple[str, str], dict[Any, float]] = {
            (g.variant, m.name): with_diverged(g.finished_values(m.name), g.diverged_seeds, self.diverged_values[m.name])
            for g in groups for m in self.metrics
        }
        #: (variant, metric) -> its difference from the baseline variant
        self.differences: dict[tuple[str, str], Difference] = {
            (g.variant, m.name): d for g in groups for m in self.metrics if (d := self._difference(g, m)) is not None
        }
        #: variant -> its statistics (set by :meth:`summarize`, once the matrix's comparisons are known)
        self.stats: dict[str, GroupStats] = {}
        self.family_size = 0

    # statistics -------------------------------------------------------------------------------

    def baseline_of(self, group: Group) -> Group | None:
        """The group ``group`` is compared with: the baseline variant's (at ``group``'s budget when by budget)."""
        return self.baselines.get(group.budget if self.by_budget else None)

    def is_baseline(self, group: Group) -> bool:
        return any(group is baseline for baseline in self.baselines.values())

    def _difference(self, group: Group, metric: Metric) -> Difference | None:
        """``group`` minus the baseline variant, paired when their seeds match (see ``stats.compare``);
        None for the baseline itself or when a side has no seed in the statistics."""
        baseline = self.baseline_of(group)
        if baseline is None or group is baseline:
            return None
        values = self.values[group.variant, metric.name]
        baseline_values = self.values[baseline.variant, metric.name]
        if not values or not baseline_values:
            return None
        return compare(values, baseline_values, LEVEL, metric.span)

    def summarize(self, holm_p: dict[tuple[str, str], float], family_size: int) -> None:
        """Compute every group's statistics (:attr:`stats`), which the markdown and the CSV render.
        ``holm_p``: (variant, metric) -> the Holm-adjusted p-value of its difference over the matrix's
        family of ``family_size`` comparisons (every task's: known only once every section is built)."""
        self.family_size = family_size
        self.stats = {g.variant: self._group_stats(g, holm_p) for g in self.groups}

    def _group_stats(self, group: Group, holm_p: dict[tuple[str, str], float]) -> GroupStats:
        first = group.ok[0] if group.ok else {}
        return GroupStats(
            group,
            {m.name: self._metric_stats(group, m, holm_p.get((group.variant, m.name))) for m in self.metrics},
            steps=first.get("steps"),
            wall_time_s=statistics.fmean(group.values("wall_time_s")) if group.ok else None,
            parameters=first.get("parameters"),
            throughput=statistics.fmean(group.values("throughput")) if group.ok else None,
            throughput_unit=first.get("throughput_unit"),
            speed={figure: group.speed_mean(figure) for figure in SPEED_FIGURES},
        )

    def _metric_stats(self, group: Group, metric: Metric, p_holm: float | None) -> MetricStats:
        values = self.values[group.variant, metric.name]
        finished = list(group.finished_values(metric.name).values())
        mean, std = mean_std(list(values.values())) if values else (None, None)
        target = self.targets.get(metric.name)
        return MetricStats(
            metric,
            values,
            mean,
            std,
            interval=t_confidence_interval(list(values.values()), LEVEL, metric.low, metric.high) if values else None,
            mean_finished=statistics.fmean(finished) if finished else None,
            difference=self.differences.get((group.variant, metric.name)),
            p_holm=p_holm,
            target=target,
            outcome=self._target_outcome(group, metric, target) if target is not None and group.ok else None,
        )

    @property
    def any_diverged(self) -> bool:
        return any(g.diverged for g in self.groups)

    def _target_outcome(self, group: Group, metric: Metric, target: float) -> TargetOutcome:
        """The finished seeds that reached ``target``, out of the finished seeds with a history and the
        diverged seeds (which count as not reaching it: they left no usable model)."""
        histories = [r["history"] for r in group.ok if r.get("history")]
        reached = [hit for h in histories if (hit := time_to_target(h, metric.name, target, metric.higher_is_better))]
        return TargetOutcome(reached, len(histories) + len(group.diverged) if histories else 0)

    def target_metrics(self) -> list[tuple[Metric, float]]:
        """(metric, target) in the task's metric order."""
        return [(m, self.targets[m.name]) for m in self.metrics if m.name in self.targets]

    # markdown ---------------------------------------------------------------------------------

    def markdown(self) -> list[str]:
        lines = [f"## {self.task}: {self.task_cfg.description}", ""]
        lines += self.main_table()
        lines += ["", self.main_note(), ""]
        lines += self.speed_note()
        lines += self.sparsity_note()
        lines += self.interval_table()
        lines += self.difference_table()
        lines += self.target_table()
        lines += logit_lens_section(self.groups)
        lines += self.plot()
        return lines

    @property
    def has_performance(self) -> bool:
        """Whether the cells recorded speed figures (results written before them did not)."""
        return any("performance" in r for g in self.groups for r in g.ok)

    @property
    def has_peak_memory(self) -> bool:
        return any("peak_memory" in r for g in self.groups for r in g.ok)

    @property
    def has_sparsity(self) -> bool:
        """Sparse attention cells record the share of (query, key) pairs they attend."""
        return any("attended_fraction" in r for g in self.groups for r in g.ok)

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
        sparse = self.has_sparsity
        if sparse:
            header.append("attended pairs")
        lines = _table_head(header)
        for group in self.groups:
            if not group.ok:
                status = group.status_without_ok
                row = [group.variant] + [status] * len(self.metrics) + [group.seeds_label()]
                lines.append(_row(row + [""] * (len(header) - len(row))))
                continue
            stats = self.stats[group.variant]
            row = [group.variant] + [self.mean_cell(group, stats.metrics[metric.name]) for metric in self.metrics]
            row += [group.seeds_label(), str(stats.steps), f"{stats.wall_time_s:.1f}", f"{stats.parameters:,}"]
            if self.has_performance:
                row.append(_speed_cell(stats.speed["step_time_ms"], "{:,.1f}"))
            row.append(f"{stats.throughput:,.0f}")
            if self.has_performance:
                row += [_speed_cell(stats.speed["mfu"], "{:.1%}"), _speed_cell(stats.speed["data_wait_fraction"], "{:.1%}")]
            if self.has_peak_memory:
                row.append(_speed_cell(stats.speed["peak_memory_mb"], "{:,.0f}"))
            if sparse:
                row.append(f"{group.ok[0].get('attended_fraction', 1.0):.3f}")
            lines.append(_row(row))
        if self.trivial_baselines:
            cells = [fmt(self.trivial_baselines[m.name]) if m.name in self.trivial_baselines else "" for m in self.metrics]
            lines.append("| *trivial baseline* | " + " | ".join(cells) + " |" + " |" * (len(header) - 1 - len(self.metrics)))
        return lines

    @staticmethod
    def mean_cell(group: Group, stats: MetricStats) -> str:
        """``mean ± std`` over the seeds in the statistics; with diverged seeds, also the mean of the
        finished ones alone: ``26.37 ± 40.0 (finished 72.55)``."""
        text = f"{fmt(stats.mean)} ± {fmt(stats.std, decimals(stats.mean))}"
        if group.diverged:
            text += f" (finished {fmt(stats.mean_finished, decimals(stats.mean))})"
        return text

    def main_note(self) -> str:
        """How the first table counts seeds, and what the trivial baseline is."""
        note = "Mean ± std over seeds."
        if self.any_diverged:
            counted = ", ".join(f"{m.name} {self.diverged_value_text(m)}"
                                for m in self.metrics if self.diverged_values[m.name] is not None)
            note += (" A diverged seed left no usable model, so it counts with the worse of the trivial baseline and the "
                     f"worst finished seed of this task: {counted}; \"finished\" is the mean of the finished seeds alone.")
        if any(g.failed for g in self.groups):
            note += " Failed seeds (an error, not a finding) are not counted."
        return f"{note} Trivial baseline: {self.task_cfg.baseline_description}"

    def diverged_value_text(self, metric: Metric) -> str:
        """``0.930 (trivial baseline)`` or ``200.0 (worst finished seed)``."""
        value = self.diverged_values[metric.name]
        source = "trivial baseline" if value == self.trivial_baselines.get(metric.name) else "worst finished seed"
        return f"{fmt(value)} ({source})"

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
        no_mfu = any(speed_figures(r)["mfu"] is None for g in self.groups for r in g.ok if "performance" in r)
        return [
            "Speed, mean over the finished seeds: step time is each seed's median optimizer step (forward, backward, optimizer); "
            f"MFU is model FLOP/s over the peak{peak}; data wait is the share of the training loop spent waiting for "
            "batches; peak memory is CUDA max allocated on a GPU, resident set size on a CPU."
            + (" An MFU above 100% says the peak was measured too low, not how well the device was used: such seeds "
               "have no MFU, and – marks a variant without any." if no_mfu else ""),
            "",
        ]

    def sparsity_note(self) -> list[str]:
        """What the attended pairs column counts (``models.MultiHeadAttention.attended_fraction``)."""
        if not self.has_sparsity:
            return []
        return [
            "Attended pairs: the share of all (query, key) pairs that the sparse pattern, with the causal mask where "
            "there is one, let the cell's last forward pass attend (the translator's: a greedy decoding step's), "
            "averaged over the attention layers. 1.000 marks a variant without a pattern, although a causal mask "
            "alone keeps about half the pairs: on a decoder, the share of the causal pairs is about twice the figure.",
            "",
        ]

    def interval_table(self) -> list[str]:
        """95% CI of each metric's mean; shown when some variant has two or more seeds in the statistics."""
        if not any(len(g.ok) + len(g.diverged) > 1 for g in self.groups if g.ok):
            return []
        counted = " (diverged seeds counted as above)" if self.any_diverged else ""
        lines = [f"{LEVEL:.0%} confidence interval of the mean over seeds{counted}:", ""]
        lines += _table_head(["variant"] + [_arrow(m) for m in self.metrics])
        for group in self.groups:
            cells = []
            for stats in self.stats[group.variant].metrics.values():
                if not group.ok:
                    cells.append(group.status_without_ok)
                elif stats.interval is None:
                    cells.append("one seed")
                else:
                    digits = decimals(stats.mean)
                    cells.append(f"[{fmt(stats.interval[0], digits)}, {fmt(stats.interval[1], digits)}]")
            lines.append(_row([group.variant] + cells))
        return lines + ["", self.interval_method(), ""]

    def interval_method(self) -> str:
        """How the intervals of the task's metrics were computed, by the kind of range they have."""
        both = [m for m in self.metrics if math.isfinite(m.low) and math.isfinite(m.high)]
        one = [m for m in self.metrics if math.isfinite(m.low) != math.isfinite(m.high)]
        free = [m for m in self.metrics if not (math.isfinite(m.low) or math.isfinite(m.high))]
        parts = []
        if both:
            ranges = ", ".join(f"{m.name} in [{m.low:g}, {m.high:g}]" for m in both)
            parts.append(f"{ranges}: Student t on the logit of the share of the range, (value − low) / (high − low), "
                         f"with shares clamped to [{LOGIT_EPSILON:g}, {1 - LOGIT_EPSILON:g}], transformed back, so the "
                         "interval stays inside the range")
        if one:
            bounds = ", ".join(f"{m.name} ≥ {m.low:g}" if math.isfinite(m.low) else f"{m.name} ≤ {m.high:g}" for m in one)
            parts.append(f"{bounds}: Student t, cut at the bound")
        if free:
            parts.append(f"{', '.join(m.name for m in free)}: Student t")
        return "Method: " + "; ".join(parts) + "."

    def difference_table(self) -> list[str]:
        """Each variant minus the baseline variant, per metric, with its interval, a mark where the
        Holm-adjusted p-value is below ALPHA, and the tests used."""
        others = [g for g in self.groups if not self.is_baseline(g)]
        if not others:
            return []
        if not self.baselines:
            return [f"No differences: the baseline variant `{self.baseline_label}` has no cells for this task.", ""]
        if not any(self.has_values(baseline) for baseline in self.baselines.values()):
            status = " or ".join(dict.fromkeys(b.status_without_ok for b in self.baselines.values()))
            return [f"No differences: every seed of the baseline variant `{self.baseline_label}` {status}.", ""]
        at = f" at the same budget (`{BUDGET_AXIS}`)" if self.by_budget else ""
        lines = [
            f"Difference from the baseline variant `{self.baseline_label}`{at} (variant − baseline) with its {LEVEL:.0%} "
            f"interval; {SIGNIFICANT} = Holm-adjusted p < {ALPHA:.2g}:",
            "",
        ]
        lines += _table_head(["variant"] + [_arrow(m) for m in self.metrics])
        for group in others:
            lines.append(_row([group.variant] + [self.difference_cell(group, m) for m in self.metrics]))
        return lines + ["", self.difference_method(others), ""]

    def has_values(self, group: Group) -> bool:
        """Whether ``group`` has a seed in the statistics (finished, or diverged with a value to count)."""
        return any(stats.values for stats in self.stats[group.variant].metrics.values())

    def no_difference_reason(self, group: Group) -> str:
        """Why ``group`` has no difference from its baseline: ``failed``, ``diverged`` (its own seeds), or the baseline's."""
        baseline = self.baseline_of(group)
        if baseline is None:
            at = f" at {group.budget} steps" if self.by_budget else ""
            return f"no cells of the baseline variant `{self.baseline_label}`{at}"
        if not self.has_values(baseline):
            return f"every seed of the baseline {baseline.status_without_ok}"
        return group.status_without_ok

    def difference_cell(self, group: Group, metric: Metric) -> str:
        stats = self.stats[group.variant].metrics[metric.name]
        if stats.difference is None:
            return self.no_difference_reason(group)
        text = self.difference_text(group, metric)
        return f"{text} {SIGNIFICANT} {stats.direction}" if stats.significant else text

    def difference_text(self, group: Group, metric: Metric) -> str:
        """``+23.29 [+23.26, +23.31]``, or ``+0.200 (no interval: one seed)``: ``group``'s difference from
        its baseline in ``metric``, to the decimals of the larger mean."""
        stats = self.stats[group.variant].metrics[metric.name]
        diff = stats.difference
        baseline_mean = self.stats[self.baseline_of(group).variant].metrics[metric.name].mean
        digits = decimals(max(abs(stats.mean), abs(baseline_mean)))
        text = fmt(diff.difference, digits, sign=True)
        if diff.ci_low is None or diff.ci_high is None:
            return f"{text} (no interval: {_no_interval_reason(diff)})"
        return text + f" [{fmt(diff.ci_low, digits, sign=True)}, {fmt(diff.ci_high, digits, sign=True)}]"

    def comparisons(self) -> list[Comparison]:
        """Each variant against its baseline in the task's headline metric (its first), as this section
        computed it: what the verdicts (``blockbench.verdicts``) word."""
        metric = self.metrics[0]
        family = next((g.family for g in self.groups if g.family), None) or self.task_cfg.family
        tuned = ((read_tuning(self.matrix_dir) or {}).get("tasks") or {}).get(self.task, {}).get("variants")

        def tuned_value(group: Group | None) -> str | None:
            return chosen_text(tuned.get(group.variant)) if tuned and group else None

        comparisons = []
        for group in self.groups:
            if self.is_baseline(group):
                continue
            baseline, stats = self.baseline_of(group), self.stats[group.variant].metrics[metric.name]
            comparisons.append(Comparison(
                task=self.task, family=family,
                variant=group.design if self.by_budget else group.variant, baseline=self.baseline_label,
                budget=group.budget if self.by_budget else None, metric=metric, difference=stats.difference,
                difference_text=self.difference_text(group, metric) if stats.difference else "",
                significant=stats.significant, direction=stats.direction,
                variant_side=self._side(group, metric), baseline_side=self._side(baseline, metric),
                missing="" if stats.difference else self.no_difference_reason(group),
                tuned=(tuned_value(group), tuned_value(baseline)) if tuned else None, p_holm=stats.p_holm,
            ))
        return comparisons

    def _side(self, group: Group | None, metric: Metric) -> Side:
        if group is None:
            return Side(0, 0, None)
        best = metric.high if metric.higher_is_better else metric.low
        solved = group.ok and not group.diverged and math.isfinite(best) and all(
            abs(value - best) <= 1e-9 * max(1.0, abs(best)) for value in group.finished_values(metric.name).values())
        return Side(len(group.ok) + len(group.diverged), len(group.diverged), self.stats[group.variant].speed["step_time_ms"],
                    at_best=best if solved else None)

    def difference_method(self, others: list[Group]) -> str:
        """Which test each variant's differences used, the Holm family, and the cut of bounded ranges."""
        tests: dict[str, list[str]] = {}
        for group in others:
            diff = next((s.difference for s in self.stats[group.variant].metrics.values() if s.difference is not None), None)
            if diff is not None:
                tests.setdefault(_test_text(diff), []).append(f"`{group.variant}`")
        if len(tests) == 1:
            test_text = f"Test: {next(iter(tests))}. "
        else:
            test_text = "; ".join(f"{text} for {', '.join(variants)}" for text, variants in tests.items())
            test_text = f"Tests: {test_text}. " if tests else ""
        spans = [m.name for m in self.metrics if math.isfinite(m.span)]
        cut = f" Intervals of {', '.join(spans)} are cut to ± the width of the metric's range." if spans else ""
        return (f"{test_text}Family-wise error: Holm over {self.family_size} comparisons (every task x variant x metric "
                f"of this matrix against the baseline variant); the intervals themselves are not adjusted.{cut}")

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
        lines += ["Time to target: the finished seeds that reached it at a validation, out of the finished and diverged seeds "
                  "(a diverged seed counts as not reaching it), and their mean steps and seconds since training started:", ""]
        lines += _table_head(["variant"] + [f"{m.name} {'≥' if m.higher_is_better else '≤'} {value:g}" for m, value in targets])
        for group in self.groups:
            lines.append(_row([group.variant] + [self.target_cell(group, m) for m, _ in targets]))
        return lines + [""]

    def target_cell(self, group: Group, metric: Metric) -> str:
        if not group.ok:
            return group.status_without_ok
        outcome = self.stats[group.variant].metrics[metric.name].outcome
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
                finished=[history for r in g.ok if (history := plotted_history(r))],
                diverged=[plotted_history(r) for r in g.diverged],
            )
            for g in self.groups
        ]
        path = self.matrix_dir / PLOTS_DIR / f"{self.task}.png"
        metrics = [(m.name, m.higher_is_better) for m in self.metrics]
        baselines = dict(self.trivial_baselines)
        if any(r.get("curve") for g in self.groups for r in g.ok + g.diverged):
            metrics.insert(0, (CURVE_METRIC, False))
            if "loss" in baselines:
                baselines[CURVE_METRIC] = baselines["loss"]
        if not plot_task(path, self.task, metrics, curves, baselines):
            return []
        return [f"![{self.task}]({PLOTS_DIR}/{urllib.parse.quote(path.name)})", ""]

    # csv --------------------------------------------------------------------------------------

    def csv_rows(self) -> list[dict[str, Any]]:
        return [self.csv_row(group_stats, stats) for group_stats in self.stats.values() for stats in group_stats.metrics.values()]

    def csv_row(self, group_stats: GroupStats, stats: MetricStats) -> dict[str, Any]:
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
            "diverged_value": _blank(self.diverged_values[metric.name]) if group.diverged else "",
            "higher_is_better": metric.higher_is_better,
            "baseline_variant": baseline.variant if (baseline := self.baseline_of(group)) else self.baseline_label,
            "diff_vs_baseline": diff.difference if diff else "",
            "diff_ci_low": _blank(diff.ci_low) if diff else "",
            "diff_ci_high": _blank(diff.ci_high) if diff else "",
            "diff_test": diff.test if diff else "",
            "diff_p_value": _blank(diff.p_value) if diff else "",
            "diff_p_holm": _blank(stats.p_holm),
            "significant": stats.significant if diff else "",
            "direction": stats.direction,
            "baseline": self.trivial_baselines.get(metric.name, ""),  # the task's trivial baseline
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


def direction(difference: float, metric: Metric) -> str:
    """``better`` or ``worse`` for a variant ``difference`` above its baseline (``same`` for zero)."""
    if difference == 0:
        return "same"
    return "better" if (difference > 0) == metric.higher_is_better else "worse"


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
