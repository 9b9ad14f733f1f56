"""Keep a results folder's cells through a change of code: retrain a declared sample of them with the
code at hand, compare bit for bit, and record the lineage step where every one is identical.

    python -m benchmarks.book.lineage --results results --scratch runs/lineage --jobs 2 \\
        --changed model.family=encoder_decoder,model.pos_encoding=relative

The sample, for each code fingerprint of the folder's cells other than this code's: one seed (the
lowest) of every task and variant of every matrix, reported cells, each config once (the shared
baselines are one config); the first tuning cell of every task; every cell of the smoke matrix. Each
is trained from its committed ``config.yaml`` in a process of its own, on the intra-op threads it
recorded, ``--jobs`` at a time, into ``--scratch`` (a rerun of the command reuses what finished
there), then compared with its committed record by ``compare_results.differences`` (final metrics,
every validation, the loss curve; no tolerance).

``--changed`` (repeatable) declares, before the sample trains, the cells the change is meant to move:
dotted keys and values of the resolved config. Sampled cells it selects are trained and reported (a
declared change that moves nothing is worth knowing) but are not evidence. Where every other sampled
cell of a fingerprint is identical, and the two records' device kinds agree, a step ``old -> new`` is
appended to ``<results>/lineage.json`` (:mod:`blockbench.store.lineage`): the folder's cells of the old code,
on that device kind, outside the changed configs, then count as made by this code. Any difference
records nothing, names the cells, and exits 1. What a sample can and cannot prove:
``docs/reproducibility.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from benchmarks.book.compare_results import differences
from benchmarks.harness import command_line
from blockbench.models.config import VARIANT_REGISTRIES
from blockbench.provenance import code_fingerprint, git_state, machine_description
from blockbench.store.layout import CELL_FILE, CELLS_DIR, CONFIG_FILE, RESULT_FILE, TUNE_DIR
from blockbench.store.lineage import Lineage, Selector, Step
from blockbench.store.record import CellRecord, read_record

#: the matrix whose every cell is sampled: it runs each task end to end in a minute
SMOKE = "smoke"


@dataclass(frozen=True)
class Committed:
    """A committed cell: where it is, its record, its resolved config and what its cell.json says."""

    path: str  # <matrix>/cells/<task>/<variant>/seed<n>, or <matrix>/tune/cells/...
    folder: Path
    record: CellRecord
    config: dict
    task: str
    variant: str
    seed: int
    tuning: bool

    @property
    def threads(self) -> int:
        """The intra-op threads it trained on (its MFU probe's), 1 where it does not say."""
        performance = self.record.performance
        probe = (performance.peak_probe if performance is not None else None) or {}
        return int(probe.get("threads") or 1)


def committed_cells(results: Path) -> list[Committed]:
    """Every finished cell of every matrix folder of ``results``, reported and tuning, in path order."""
    found = []
    for pattern, tuning in (
        (f"*/{CELLS_DIR}/*/*/*/{RESULT_FILE}", False),
        (f"*/{TUNE_DIR}/{CELLS_DIR}/*/*/*/*/{RESULT_FILE}", True),
    ):
        for result in sorted(results.glob(pattern)):
            record, cell_file, config_file = (
                read_record(result),
                result.with_name(CELL_FILE),
                result.with_name(CONFIG_FILE),
            )
            if record is None or not record.finished or not cell_file.is_file() or not config_file.is_file():
                continue
            cell = json.loads(cell_file.read_text())
            found.append(
                Committed(
                    result.parent.relative_to(results).as_posix(),
                    result.parent,
                    record,
                    yaml.safe_load(config_file.read_text()),
                    cell["task"],
                    cell["variant"],
                    int(cell["seed"]),
                    tuning,
                )
            )
    return found


def sample(cells: list[Committed], fingerprint: str) -> list[Committed]:
    """The declared sample among ``cells`` of code ``fingerprint`` (the module docstring), in a stable order."""
    own = [c for c in cells if c.record.code_fingerprint == fingerprint]
    chosen: dict[str, Committed] = {}  # config hash -> cell
    lowest: dict[tuple[str, str, str], Committed] = {}
    for cell in own:
        if not cell.tuning:
            key = (cell.path.split("/")[0], cell.task, cell.variant)
            if key not in lowest or cell.seed < lowest[key].seed:
                lowest[key] = cell
    picks = list(lowest.values())
    first_tuning: dict[str, Committed] = {}
    for cell in own:
        if cell.tuning:
            first_tuning.setdefault(cell.config["task"]["name"], cell)
    picks += list(first_tuning.values())
    picks += [c for c in own if c.path.startswith(f"{SMOKE}/")]
    for cell in picks:
        chosen.setdefault(str(cell.record.config_hash), cell)
    return sorted(chosen.values(), key=lambda c: c.path)


def train(cell: Committed, scratch: Path) -> CellRecord | None:
    """Train ``cell``'s committed config into ``scratch/<its path>`` with this code, on its threads;
    reuse a result there of this code and config. None if the training process wrote no result."""
    out = scratch / cell.path
    earlier = read_record(out / RESULT_FILE)
    if earlier and earlier.config_hash == cell.record.config_hash and earlier.code_fingerprint == code_fingerprint():
        return earlier
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text((cell.folder / CONFIG_FILE).read_text())
    command = [sys.executable, "-m", "blockbench", "train", str(out / CONFIG_FILE), "--out", str(out), "--force"]
    command += ["--tb-dir", str(scratch / "tb"), "--quiet"]
    environment = {**os.environ, "OMP_NUM_THREADS": str(cell.threads)}
    with open(out / "train.log", "w") as log:
        subprocess.run(command, env=environment, stdout=log, stderr=subprocess.STDOUT, check=False)
    return read_record(out / RESULT_FILE)


def coverage(cells: Iterable[Committed]) -> list[str]:
    """Per variant registry: the registered names that no sampled cell uses (nothing committed to keep)."""
    used: dict[str, set[str]] = {field: set() for field in VARIANT_REGISTRIES}
    for cell in cells:
        for field in VARIANT_REGISTRIES:
            used[field].add(str(cell.config.get("model", {}).get(field)))
    lines = []
    for field, registry in VARIANT_REGISTRIES.items():
        absent = [name for name in registry.names() if name not in used[field]]
        sampled = sorted(name for name in used[field] if name in registry)
        lines.append(
            f"  model.{field}: sampled {', '.join(sampled)}"
            + (f"; in no committed cell: {', '.join(absent)}" if absent else "")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="the results folder to keep")
    parser.add_argument("--scratch", type=Path, default=Path("runs/lineage"), help="where the sample trains")
    parser.add_argument("--jobs", type=int, default=2, help="cells trained at once")
    parser.add_argument(
        "--changed",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="cells the change is meant to move (they are retrained, not kept), e.g. model.pos_encoding=relative",
    )
    parser.add_argument("--dry-run", action="store_true", help="list the sample, train nothing")
    args = parser.parse_args(argv)
    changed = [Selector.parse(text) for text in args.changed]
    current = code_fingerprint()
    git = git_state()
    cells = committed_cells(args.results)
    old = sorted({str(c.record.code_fingerprint) for c in cells if c.record.code_fingerprint != current})
    print(f"code {current[:12]} ({machine_description()}); commit {git['commit']}, dirty {git['dirty']}")
    if not old:
        print(f"every cell of {args.results} is of this code: nothing to keep")
        return 0
    status = 0
    lineage = Lineage.load(args.results)

    def declared_changed(cell: Committed) -> bool:
        return any(selector.matches(cell.config) for selector in changed)

    for fingerprint in old:
        picked = sample(cells, fingerprint)
        of_it = [c for c in cells if c.record.code_fingerprint == fingerprint]
        print(f"\ncode {fingerprint[:12]}: {len(of_it)} cells, a sample of {len(picked)}")
        print("\n".join(coverage(picked)))
        if args.dry_run:
            print("\n".join(f"  {c.path}" for c in picked))
            continue
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            new = list(pool.map(lambda c: train(c, args.scratch), picked))
        identical, moved, kinds = [], {}, set()
        for cell, record in zip(picked, new, strict=True):
            declared = declared_changed(cell)
            if record is None:
                print(f"  {cell.path}: no result (see {args.scratch / cell.path / 'train.log'})")
                status = 1
                continue
            found = differences(cell.record, record)
            if record.device_kind != cell.record.device_kind:
                found.append(f"device kind {cell.record.device_kind} vs {record.device_kind}")
            kinds.add(cell.record.device_kind)
            if declared:
                moved[cell.path] = bool(found)
                print(f"  {cell.path}: declared changed, {'moved' if found else 'did NOT move'}")
            elif found:
                print(f"  {cell.path}: DIFFERS: {'; '.join(found)}")
            else:
                identical.append(cell.path)
        minutes = (time.monotonic() - start) / 60
        others = [c for c in picked if c.path not in moved]
        print(f"  {len(identical)} of {len(others)} identical ({minutes:.1f} min)")
        if len(identical) != len(others) or len(kinds) != 1 or not identical:
            print(f"  no lineage recorded for {fingerprint[:12]}: its cells stay stale here")
            status = 1
            continue
        step = Step(
            old=fingerprint,
            new=current,
            device=kinds.pop(),
            changed=changed,
            changed_configs=sorted({str(c.record.config_hash) for c in cells if declared_changed(c)}),
            sample=identical,
            changed_sample=moved,
            commit=git["commit"],
            dirty=git["dirty"],
            command=command_line(__spec__.name, argv),
            machine=machine_description(),
            recorded=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        lineage.add(args.results, step)
        lineage = Lineage.load(args.results)
        kept = sum(step.admits(c.record) for c in of_it)
        print(
            f"  recorded {step.describe()} in {args.results / 'lineage.json'}: {kept} of {len(of_it)} cells kept, "
            f"{len(step.changed_configs)} configs declared changed are retrained"
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
