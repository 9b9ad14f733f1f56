"""Which earlier result counts for a cell, and the copy of one trained in another matrix.

A matrix run reuses a cell's ``result.json`` instead of training the cell again when its config is
unchanged (the same ``config_hash``) and it was made by this code (its ``code_fingerprint``, see
:func:`blockbench.provenance.code_fingerprint`), or by code that the results folder's lineage shows
gives this code's numbers (:mod:`blockbench.store.lineage`). A result of other code is stale: retrained,
unless the run reuses stale results (``--reuse-stale``); ``--force`` counts nothing until the cell
has trained again. A finished cell of the same config that another matrix of the results root made
with this code is copied, not trained again (:func:`trained_elsewhere`, :func:`copy_cell`).

Neither counts across hardware: a result made on another kind of device or at another precision
(:class:`blockbench.store.record.Hardware`, which the config hash does not name: ``trainer.accelerator``
and ``trainer.precision`` are ``auto`` by default) is never reused nor copied, whatever the flags; the
cell trains again on this run's hardware.

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
from .record import CellRecord, Hardware, read_record

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


def other_hardware(record: CellRecord, hardware: Hardware | None) -> str | None:
    """Why ``record`` does not count on ``hardware`` (this run's, for the record's cell): ``made on cpu at
    32-true; this run resolves cuda at bf16-mixed``; None where it was made on it, or where either is not
    known (``hardware`` None: not checked; a record without precision or device, written by hand)."""
    if hardware is None or record.hardware is None or record.hardware == hardware:
        return None
    return f"made on {record.hardware.describe()}; this run resolves {hardware.describe()}"


def reuse_earlier(
    cell_dir: Path,
    config_hash: str,
    fingerprint: str,
    *,
    reuse_stale: bool = False,
    lineage: Lineage = NO_LINEAGE,
    hardware: Hardware | None = None,
) -> tuple[bool, str | None]:
    """Whether a matrix run reuses the earlier result in ``cell_dir`` for the config ``config_hash``
    on ``hardware`` (None: not checked) instead of training the cell, and what it says (see the module
    docstring)."""
    result = earlier_result(cell_dir, config_hash)
    if result is None:
        return False, None
    elsewhere = other_hardware(result, hardware)
    if elsewhere:
        return False, f"{elsewhere}, retraining"
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
    ``reuse_stale``); none with ``force``, until the cell has trained again. ``elsewhere``: (config hash,
    hardware) -> a finished cell folder of another matrix to copy (:func:`trained_elsewhere`). ``cuda``:
    whether this run's cells train on a CUDA GPU where ``trainer.accelerator`` is ``auto``, resolved once
    by the runner before planning; the methods take each cell's :class:`Hardware` resolved from it
    (``blockbench.matrix.devices.cell_hardware``), and count only results made on it."""

    fingerprint: str
    reuse_stale: bool = False
    force: bool = False
    lineage: Lineage = NO_LINEAGE
    elsewhere: Mapping[tuple[str, Hardware], Path] = field(default_factory=dict)
    cuda: bool = False

    def reuse(self, cell_dir: Path, config_hash: str, *, hardware: Hardware | None) -> tuple[bool, str | None]:
        """:func:`reuse_earlier` under this rule."""
        return reuse_earlier(
            cell_dir,
            config_hash,
            self.fingerprint,
            reuse_stale=self.reuse_stale,
            lineage=self.lineage,
            hardware=hardware,
        )

    def counted(
        self, cell_dir: Path, config_hash: str, *, hardware: Hardware | None, finished_only: bool = False
    ) -> CellRecord | None:
        """The record in ``cell_dir`` that counts for the config ``config_hash`` on ``hardware`` (tuning
        scores and the rounds of seeds read it); ``finished_only`` while planning: a failed cell is
        retried, and ``force`` retrains everything."""
        record = earlier_record(cell_dir)
        if record is None or record.config_hash != config_hash:
            return None
        if record.finished and other_hardware(record, hardware):
            return None
        if finished_only and (self.force or not record.finished):
            return None
        return record if self.reuse_stale or self.lineage.admits(record, self.fingerprint) else None

    def source(self, cell_dir: Path, config_hash: str, *, hardware: Hardware) -> Path | None:
        """Another matrix's folder of a finished cell of this config, made on ``hardware``, to copy into
        ``cell_dir``, if any."""
        source = self.elsewhere.get((config_hash, hardware))
        return source if source is not None and source.resolve() != Path(cell_dir).resolve() else None


def trained_elsewhere(
    results_root: Path, fingerprint: str, lineage: Lineage = NO_LINEAGE
) -> dict[tuple[str, Hardware], Path]:
    """(config hash, hardware) -> the folder of a finished cell (ok or diverged) of any matrix under
    ``results_root``, reported or tuning, made by this code (``fingerprint``, or through the ``lineage``)
    on that hardware: a matrix that needs the same config on the same hardware copies it instead of
    training it again. The shared baselines (pre-norm, the dense FFN, learned positions) are the same
    config in every matrix of the book, so each trains once."""
    found: dict[tuple[str, Hardware], Path] = {}
    for result in sorted(results_root.glob(f"*/{CELLS_DIR}/*/*/*/{RESULT_FILE}")) + sorted(
        results_root.glob(f"*/{TUNE_DIR}/{CELLS_DIR}/*/*/*/*/{RESULT_FILE}")
    ):
        record = read_record(result)
        admitted = record is not None and record.finished and lineage.admits(record, fingerprint)
        if admitted and record.config_hash and record.hardware is not None:
            found.setdefault((record.config_hash, record.hardware), result.parent)
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
