"""The index of a results root, ``results/README.md``: the verdicts of every matrix folder there, from
the same decisions as each one's summary (``analysis.analyze``, worded as ``section.comparisons``),
how many of them are decided and what the whole book cost, with the code, machines and cost that
made each matrix, and the matrices not run yet with the command that runs them; at its top the verdict
picture (``verdicts.png`` beside it, drawn by ``forest``): every comparison's difference, interval and
verdict per family, a question several matrices ask of the same cells once. One page that says what the
benchmark has found so far, refreshed by ``blockbench matrix`` after each run and by ``blockbench report
--index``; ``book`` words it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..durations import format_duration
from ..store.files import write_index as write_index_file
from ..store.layout import CELLS_DIR, MATRIX_FILE, SUMMARY_MD
from ..store.lineage import Lineage
from ..store.record import CellRecord, read_matrix_run
from .analysis import analyze
from .book import Apart, Index, MatrixVerdicts, NotRun, book_rows, index_markdown
from .forest import draw_book_picture
from .fragility import fragile_questions
from .ladders import ladder_questions, trend_table
from .results import (
    MatrixSettings,
    book_cost,
    code_versions,
    first_cell,
    gives_verdicts,
    lineage_lines,
    machines,
    matrix_description,
    resumed_cells,
    resumed_note,
    tuning_records,
)
from .section import comparisons


def write_index(results_root: Path, matrices: Path | None = None, *, command: str | None = None) -> str:
    """Write ``<results_root>/README.md``, the verdicts of every matrix folder there (see
    ``blockbench.report.book``) from the same statistics as each one's summary, and the verdict picture
    ``<results_root>/verdicts.png`` it shows at its top; return the markdown.

    Matrices without a finished or diverged cell are listed as not run yet, with the command that runs
    them: those of ``results_root`` and every matrix file in ``matrices`` (a folder such as
    ``configs/matrix``; default: the folders of the matrix files the results were made from). Tuning
    cells (``<matrix>/tune/``) are not the reported seeds: no verdict reads them. ``command``: the
    command the index says made it (default ``blockbench report --index <results_root>``)."""
    results_root = Path(results_root)
    folders = sorted(
        p for p in results_root.iterdir() if p.is_dir() and ((p / CELLS_DIR).is_dir() or (p / MATRIX_FILE).is_file())
    )
    index = Index(command or f"blockbench report --index {results_root}")
    files = _matrix_files(matrices if matrices is not None else _recorded_matrix_folders(folders))
    index.cost = book_cost(folders)
    lineage = Lineage.load(results_root)
    for folder in folders:
        if not gives_verdicts(folder / MATRIX_FILE):
            index.apart.append(Apart(folder.name, matrix_description(folder / MATRIX_FILE)))
            continue
        _, groups, analyses = analyze(folder)
        results, tuning = [r for g in groups for r in g.results], tuning_records(folder)
        if not any(g.ok or g.diverged for g in groups):
            failed = sum(len(g.failed) for g in groups)
            reason = (
                f"{failed} cell(s) failed, none finished"
                if failed
                else f"tuning: {len(tuning)} tuning cell(s) finished, no reported cell yet"
                if tuning
                else "no cell has finished"
            )
            index.not_run.append(
                NotRun(
                    folder.name,
                    _run_command(folder, files),
                    reason,
                    matrix_description(files.get(folder.name, folder / MATRIX_FILE)),
                )
            )
            continue
        unfinished = MatrixSettings.load(folder).without_result(folder, len(results))
        index.matrices.append(
            MatrixVerdicts(
                folder.name,
                [c for analysis in analyses for c in comparisons(analysis)],
                has_summary=(folder / SUMMARY_MD).is_file(),
                unfinished=unfinished,
                code=tuple(code_versions(results + tuning, lineage) + lineage_lines(results + tuning, lineage)),
                machines=tuple(machines(results + tuning)),
                cost=_cost(folder, results, tuning),
                trends=tuple(trend_table([q for analysis in analyses for q in ladder_questions(analysis)])),
            )
        )
    ran = {folder.name for folder in folders}
    index.not_run += [
        NotRun(name, f"blockbench matrix {path}", "no results", matrix_description(path))
        for name, path in files.items()
        if name not in ran and gives_verdicts(path)
    ]
    index.not_run.sort(key=lambda m: m.name)
    # the baseline swap (``fragility``): a line under the count of verdicts, and a mark on each fragile one
    swaps = fragile_questions(results_root)
    index.notes.append(swaps.line())
    for matrix in index.matrices:
        matrix.comparisons = swaps.marked(matrix.name, matrix.comparisons)
    markdown = index_markdown(index)
    picture = draw_book_picture(results_root, book_rows(index))
    if picture is not None:  # after the title and the note on how it is made: the answer first
        title, note, rest = markdown.split("\n\n", 2)
        markdown = "\n\n".join([title, note, picture, rest])
    write_index_file(results_root, markdown)
    return markdown


def _recorded_matrix_file(folder: Path) -> str | None:
    """The path of the matrix file the results ``folder`` was made from, as its first cell records it."""
    return (first_cell(folder).get("matrix_file") or {}).get("path")


def _recorded_matrix_folders(folders: list[Path]) -> list[Path]:
    """The folders of the matrix files these results were made from (``cell.json``), where they still exist."""
    recorded = [_recorded_matrix_file(folder) for folder in folders]
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


def _run_command(folder: Path, files: dict[str, Path]) -> str:
    """The command that runs the matrix of the results ``folder``: its file's, the one its cells record, or its last
    run's."""
    if folder.name in files:
        return f"blockbench matrix {files[folder.name]}"
    recorded = _recorded_matrix_file(folder)
    if recorded:
        return f"blockbench matrix {recorded}"
    run = read_matrix_run(folder)
    return run.command if run else f"blockbench matrix <the matrix file of {folder.name}>"


def _cost(folder: Path, results: list[CellRecord], tuning: list[CellRecord]) -> str | None:
    """``1:24:00 of cell processes (36 cells); last run `blockbench matrix ... --jobs 2`, 0:50:24, 36 cells
    trained``: the processes' time of every cell with a result first (``results``, the reported cells' as
    loaded for the statistics, and ``tuning``, the tuning cells'), what the whole matrix cost whether it
    ran at once or resumed over several runs, then its last run (``matrix_run.json``). None without either."""
    run = read_matrix_run(folder)
    seconds = [r.wall_time_s for r in results + tuning if r.wall_time_s is not None]
    note = resumed_note(resumed_cells(results + tuning))
    parts = [f"{format_duration(sum(seconds))} of cell processes ({len(seconds)} cells{note})"] if seconds else []
    if run:
        parts.append(f"last run `{run.command}`, {format_duration(run.wall_time_s)}, {run.cells_trained} cells trained")
    return "; ".join(parts) or None
