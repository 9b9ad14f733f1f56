"""The repo ships the exact versions behind its committed results: ``constraints.txt`` pins every
dependency, at the versions the committed summaries say made them."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from blockbench.provenance import installed_requirements

REPO = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    return {canonicalize_name(name): version for name, version in pins.items()}


def test_constraints_pin_every_dependency_the_package_declares():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [
        *project["dependencies"],
        *project["optional-dependencies"]["dev"],
        *project["optional-dependencies"]["bench"],
    ]
    missing = {canonicalize_name(Requirement(r).name) for r in declared} - set(_pins())
    assert not missing, f"constraints.txt pins no version of {sorted(missing)}: regenerate it (see its header)"


def test_constraints_are_the_versions_the_committed_summaries_were_made_with():
    pins = _pins()
    machines = [
        line
        for path in sorted((REPO / "results").glob("*/summary.md"))
        for line in path.read_text().splitlines()
        if line.startswith("Machine:")
    ]
    assert machines
    for line in machines:
        torch_version, lightning_version = re.search(r"torch ([\d.]+)\S*, lightning ([\d.]+)", line).groups()
        assert (pins["torch"], pins["lightning"]) == (torch_version, lightning_version), line


def test_the_dependency_closure_follows_requirements_transitively():
    """What ``blockbench env --constraints`` pins: the package's requirements and theirs (lightning
    pulls in lightning-utilities), each at its installed version, never the package itself."""
    from importlib import metadata

    closure = installed_requirements()
    assert closure["torch"] == metadata.version("torch") and closure["lightning"] == metadata.version("lightning")
    assert "lightning-utilities" in closure and "blockbench-transformers" not in closure
    assert all(re.fullmatch(r"[a-z0-9-]+", name) for name in closure)


def test_every_committed_cell_config_still_has_the_hash_its_result_records():
    """Settings added to the config since (``trainer.tf32``, ``trainer.num_workers``, ...) hash as
    before at their defaults: each committed cell's ``config.yaml`` gives the hash of its
    ``result.json``, so the committed results stay current and are not trained again."""
    from blockbench.config import build_run_config, load_yaml
    from blockbench.store.record import load_record

    configs = sorted((REPO / "results").glob("*/cells/**/config.yaml"))
    assert configs
    # the one change that is a new experiment: a real-data task now always holds task.tuning_fraction of its
    # training data out for tuning (0.05), so a config written before it trained on more data; the book's
    # rerun replaces those cells
    current = [path for path in configs if not _trained_on_the_tuning_split(load_yaml(path))]
    assert len(current) >= len(configs) - 18
    changed = [
        str(path.relative_to(REPO))
        for path in current
        if build_run_config(load_yaml(path)).config_hash() != load_record(path.with_name("result.json")).config_hash
    ]
    assert not changed, f"{len(changed)} committed cells changed their config hash, e.g. {changed[:3]}"


def _trained_on_the_tuning_split(config: dict) -> bool:
    """A real-data task's config from before ``task.tuning_fraction``: it trained on the data now held out."""
    from blockbench.tasks import TASK_CONFIGS

    task = config.get("task") or {}
    fields = TASK_CONFIGS[task["name"]].model_fields
    return "tuning_fraction" in fields and "tuning_fraction" not in task
