"""Which earlier result counts for a cell, and the copy of one trained in another matrix.

A matrix run reuses a cell's ``result.json`` instead of training the cell again when its config is
unchanged (the same ``config_hash``) and it was made by this code (its ``code_fingerprint``, see
:func:`blockbench.provenance.code_fingerprint`), or by code that the results folder's lineage shows
gives this code's numbers (:mod:`blockbench.store.lineage`). A result of other code is stale: retrained,
unless the run reuses stale results (``--reuse-stale``); ``--force`` counts nothing until the cell
has trained again. A finished cell of the same config that another matrix of the results root made
with this code is copied, not trained again (:func:`trained_elsewhere`, :func:`copy_cell`).

One rule (:class:`ReuseRule`) for the planner, the tuning and the rounds of seeds, so that what a
dry run lists, what the runner trains and what a round decides from cannot disagree. It takes cell
folders and config hashes, never the runner's cells, so the runner builds on it and not around it.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..lifeline import LOCK_FILE
from .layout import CELL_FILE, CELLS_DIR, CHECKPOINT_DIR, RESULT_FILE, TRAIN_LOG, TUNE_DIR
from .lineage import NO_LINEAGE, Lineage
from .record import CellRecord, read_record

#: what :func:`reuse_earlier` says of a result of this very code
REUSED = "done earlier"
#: what a copied cell folder leaves behind: its matrix's own files (cell.json names that matrix's
#: variant and axes), a live run's lock, and training state that a finished cell no longer needs
NOT_COPIED = (CELL_FILE, LOCK_FILE, CHECKPOINT_DIR, TRAIN_LOG)


def earlier_record(cell_dir: Path) -> CellRecord | None:
    """The record in the cell folder's result.json (of any status and config), if it can be read."""
    return read_record(Path(cell_dir) / RESULT_FILE)


def earlier_result(cell_dir: Path, config_hash: str) -> CellRecord | None:
    """The finished result (ok or diverged) of exactly this resolved config, if the cell has one."""
    result = earlier_record(cell_dir)
    return result if result and result.finished and result.config_hash == config_hash else None


def reuse_earlier(
    cell_dir: Path, config_hash: str, fingerprint: str, *, reuse_stale: bool = False, lineage: Lineage = NO_LINEAGE
) -> tuple[bool, str | None]:
    """Whether a matrix run reuses the earlier result in ``cell_dir`` for the config ``config_hash``
    instead of training the cell, and what it says (see the module docstring)."""
    result = earlier_result(cell_dir, config_hash)
    if result is None:
        return False, None
    theirs = result.code_fingerprint
    if theirs == fingerprint:
        return True, f"{REUSED}, reusing its result"
    route = lineage.route(result, fingerprint)
    if route:
        return True, f"{REUSED} by code {str(theirs)[:12]}, the same numbers by lineage {route[-1].describe()}"
    change = f"code changed since its result (fingerprint {theirs[:12] if theirs else 'none'} -> {fingerprint[:12]})"
    return (True, f"{change}, reusing it (--reuse-stale)") if reuse_stale else (False, f"{change}, retraining")


@dataclass(frozen=True)
class ReuseRule:
    """Which results count for a run of this code (``fingerprint``): those of the cell's current config
    made by this code or, by the results folder's ``lineage``, with its numbers (any code with
    ``reuse_stale``); none with ``force``, until the cell has trained again. ``elsewhere``: config hash
    -> a finished cell folder of another matrix to copy (:func:`trained_elsewhere`)."""

    fingerprint: str
    reuse_stale: bool = False
    force: bool = False
    lineage: Lineage = NO_LINEAGE
    elsewhere: Mapping[str, Path] = field(default_factory=dict)

    def reuse(self, cell_dir: Path, config_hash: str) -> tuple[bool, str | None]:
        """:func:`reuse_earlier` under this rule."""
        return reuse_earlier(
            cell_dir, config_hash, self.fingerprint, reuse_stale=self.reuse_stale, lineage=self.lineage
        )

    def counted(self, cell_dir: Path, config_hash: str, *, finished_only: bool = False) -> CellRecord | None:
        """The record in ``cell_dir`` that counts for the config ``config_hash`` (tuning scores and the
        rounds of seeds read it); ``finished_only`` while planning: a failed cell is retried, and
        ``force`` retrains everything."""
        record = earlier_record(cell_dir)
        if record is None or record.config_hash != config_hash:
            return None
        if finished_only and (self.force or not record.finished):
            return None
        return record if self.reuse_stale or self.lineage.admits(record, self.fingerprint) else None

    def source(self, cell_dir: Path, config_hash: str) -> Path | None:
        """Another matrix's folder of a finished cell of this config to copy into ``cell_dir``, if any."""
        source = self.elsewhere.get(config_hash)
        return source if source is not None and source.resolve() != Path(cell_dir).resolve() else None


def trained_elsewhere(results_root: Path, fingerprint: str, lineage: Lineage = NO_LINEAGE) -> dict[str, Path]:
    """Config hash -> the folder of a finished cell (ok or diverged) of any matrix under ``results_root``,
    reported or tuning, made by this code (``fingerprint``, or through the ``lineage``): a matrix that
    needs the same config copies it instead of training it again. The shared baselines (pre-norm, the
    dense FFN, learned positions) are the same config in every matrix of the book, so each trains once."""
    found: dict[str, Path] = {}
    for result in sorted(results_root.glob(f"*/{CELLS_DIR}/*/*/*/{RESULT_FILE}")) + sorted(
        results_root.glob(f"*/{TUNE_DIR}/{CELLS_DIR}/*/*/*/*/{RESULT_FILE}")
    ):
        record = read_record(result)
        if record is not None and record.finished and lineage.admits(record, fingerprint) and record.config_hash:
            found.setdefault(record.config_hash, result.parent)
    return found


def copy_cell(source: Path, cell_dir: Path) -> None:
    """Copy a finished cell's files from ``source`` into ``cell_dir`` (see :data:`NOT_COPIED`), the
    result last, so that a copy cut short has no result and is planned again."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    for item in sorted(source.iterdir(), key=lambda p: p.name == RESULT_FILE):
        if item.name in NOT_COPIED:
            continue
        if item.is_dir():
            shutil.copytree(item, cell_dir / item.name, dirs_exist_ok=True)
        else:
            shutil.copy2(item, cell_dir / item.name)
