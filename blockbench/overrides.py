"""What a run config is read from: a YAML file of sections and ``key=value`` overrides, and the error
that a config that cannot run raises.

Apart from the config classes (``blockbench.config``), which import torch and the models, so that the
key pre-check of ``blockbench train`` (``blockbench.precheck``), which runs before torch is imported,
reads a config file and the overrides exactly as the full validation reads them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config that cannot run; the message lists every problem with its key."""


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["model.n_heads=8", "task=vit"]`` -> ``{"model.n_heads": 8, "task": "vit"}`` (values parsed as YAML)."""
    overrides = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. model.n_heads=8)")
        try:
            overrides[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override '{item}': the value is not valid YAML: {exc}") from None
    return overrides


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The sections of the config file at ``path``; ConfigError if it is missing, not YAML, or not a
    mapping at the top level."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections at the top level")
    return data
