"""Rewrite the config hashes of committed records after settings were added to the config classes, at
defaults that do what the code did before them: every number stays as it is.

    python -m benchmarks.book.rehash_records results            # rewrite
    python -m benchmarks.book.rehash_records results --check    # say what would change, write nothing

The hash is that of the whole resolved config (:meth:`blockbench.config.RunConfig.config_hash`), so a
setting added to the config classes changes every hash of its section. Each generation of added settings
(``GENERATIONS`` below, oldest first) lists them at the value that does what the code before them did;
the first is the settings an earlier hash left out. For each cell folder (a ``result.json`` beside its
``config.yaml``) this recomputes, from the committed ``config.yaml``, the hash before each generation
(that generation's settings and every later one's taken out) and the hash now: a record holding an
earlier one gets the new one; a record already holding the new one is left alone (a rerun changes
nothing); any other hash is an error, and nothing is written. The old-to-new map must be one to one.
``lineage.json``'s ``changed_configs`` are mapped the same way. Only the ``config_hash`` text changes:
the rest of every file stays byte for byte. Why a script and not a hash that skips defaults: a default
can change what it does, and a hash that skipped it would keep the stale records current.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from blockbench.config import CHECKPOINT_STEPS, RunConfig
from blockbench.store.layout import CONFIG_FILE, RESULT_FILE

#: a setting configs written before it was added did not have
ABSENT = object()
#: per generation, oldest first, (section, task or None for any, key) -> (value, as the hash before it saw
#: it): not at all (``ABSENT``) or as the number an ``auto`` replaced
Generation = dict[tuple[str, str | None, str], tuple[Any, Any]]
GENERATIONS: list[Generation] = [
    {  # the settings the hash left out before it hashed the whole config
        ("trainer", None, "checkpoint_every_n_steps"): ("auto", CHECKPOINT_STEPS["cpu"]),
        ("trainer", None, "num_workers"): ("auto", ABSENT),
        ("trainer", None, "tf32"): (True, ABSENT),
        ("trainer", None, "deterministic"): (False, ABSENT),
        ("task", None, "num_workers"): (None, 0),
        ("task", None, "eval_split"): ("validation", ABSENT),
    },
    {  # the generated tasks' harder settings
        ("task", "vit", "max_shapes"): (5, ABSENT),
        ("task", "vit", "pixel_noise"): (8.0, ABSENT),
        ("task", "translation", "max_depth"): (0, ABSENT),
    },
]


def legacy_hash(run: RunConfig, generation: int = 0) -> str:
    """The hash the code before ``GENERATIONS[generation]`` gave ``run``: its resolved config with the
    settings of that generation and every later one at their listed value hashed as before."""
    hashed = run.resolved_dict()
    for added in GENERATIONS[generation:]:
        for (section, task, key), (value, before) in added.items():
            if task not in (None, hashed["task"]["name"]) or key not in hashed[section]:
                continue
            if hashed[section][key] == value:
                if before is ABSENT:
                    del hashed[section][key]
                else:
                    hashed[section][key] = before
    return hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()[:16]


def hash_field(old: str) -> str:
    return f'"config_hash": "{old}"'


def plan(root: Path) -> tuple[dict[Path, tuple[str, str]], list[str]]:
    """Each record to rewrite (path -> (old, new)) and the problems that stop the rewrite."""
    rewrites: dict[Path, tuple[str, str]] = {}
    problems: list[str] = []
    for result in sorted(root.rglob(RESULT_FILE)):
        config = result.with_name(CONFIG_FILE)
        if not config.is_file():
            continue
        recorded = json.loads(result.read_text()).get("config_hash")
        run = RunConfig.model_validate(yaml.safe_load(config.read_text()))
        new = run.config_hash()
        if recorded == new:
            continue
        earlier = [legacy_hash(run, generation) for generation in range(len(GENERATIONS))]
        if recorded not in earlier:
            listed = ", ".join(earlier)
            problems.append(f"{result}: hash {recorded} is none of the earlier ({listed}) nor the new ({new})")
            continue
        if result.read_text().count(hash_field(recorded)) != 1:
            problems.append(f"{result}: expected one config_hash field")
            continue
        rewrites[result] = (recorded, new)
    mapping: dict[str, set[str]] = {}
    for old, new in rewrites.values():
        mapping.setdefault(old, set()).add(new)
    problems += [f"old hash {old} maps to {sorted(news)}" for old, news in mapping.items() if len(news) > 1]
    return rewrites, problems


def lineage_hashes(lineage: Path) -> set[str]:
    """Every config hash the lineage's steps declare changed."""
    return {h for step in json.loads(lineage.read_text())["steps"] for h in step.get("changed_configs", [])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a results root (the folder of the matrices and lineage.json)")
    parser.add_argument("--check", action="store_true", help="say what would change; write nothing")
    args = parser.parse_args(argv)
    rewrites, problems = plan(args.results)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"{len(problems)} problem(s); nothing written", file=sys.stderr)
        return 1
    mapping = {old: new for old, new in rewrites.values()}
    lineage = args.results / "lineage.json"
    declared = lineage_hashes(lineage) if lineage.is_file() else set()
    present = {json.loads(result.read_text()).get("config_hash") for result in args.results.rglob(RESULT_FILE)}
    unknown = sorted(declared - present)
    if unknown:
        print(f"lineage.json declares configs no record holds: {unknown}; nothing written", file=sys.stderr)
        return 1
    print(f"{len(rewrites)} record(s) to rehash ({len(mapping)} distinct configs)")
    if args.check:
        return 0
    for result, (old, new) in rewrites.items():
        result.write_text(result.read_text().replace(hash_field(old), hash_field(new)))
    if lineage.is_file():
        text = lineage.read_text()
        for old, new in mapping.items():
            text = text.replace(f'"{old}"', f'"{new}"')
        lineage.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
