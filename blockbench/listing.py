"""``blockbench list``: every key a run config or a matrix axis accepts, with its default, its type and
its meaning, read from the pydantic models themselves (as ``--help`` generated from dataclass fields
in HF's ``HfArgumentParser`` or litgpt's CLI), so a new field shows up without anyone editing a list.

The walk (``blockbench.keys.config_keys``) starts at ``RunConfig``: a field holding a config class is
a section (``model.*``); a tagged union (``task``, an image task's ``data``) is one key for its tag
(``task.name``) plus the keys of every member, each key naming the members (tasks) that have it and
their defaults. A key whose value is a name from a registry (``model.norm_placement``) lists the
names it accepts.

The config classes live beside the models and tasks, whose modules import torch and Lightning (3 s
and more to load), and the registries of variant names are filled by those modules as they load. So
the walk's result is cached on disk (``$BLOCKBENCH_CACHE/config-keys/``), keyed by a digest of the
source it is read from (the config module, the walk, the models and the tasks) and of the versions of
the libraries whose names it lists: ``blockbench list`` reads the cache without importing torch, and
walks the classes again (and caches them) only when that code has changed since.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import textwrap
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from .keys import Choice, Definition, Key, config_classes, config_keys, first_line, value_text

#: terminal width the listing is wrapped to
WIDTH = 100
#: how every text is wrapped: at spaces only, so names (``GPT-NeoX``, ``cl100k_base``) stay whole
WRAP = dict(break_on_hyphens=False, break_long_words=False)
#: the environment variable of blockbench's disk cache, as ``blockbench.tasks.data.cache.CACHE_ENV``
#: (not imported from there: importing ``blockbench.tasks`` loads torch)
CACHE_ENV = "BLOCKBENCH_CACHE"
#: the cache's folder of listings, one file per source digest
CACHE_DIR = "config-keys"
#: listings kept in the cache (other checkouts of the code may share it); the oldest go first
CACHE_KEEP = 8
#: the modules and packages the listing is read from: the run config and its trainer section, the
#: walk and this module, the models (``ModelConfig``, the registries and the variants that fill them)
#: and the tasks (their configs and presets); tests/test_cli.py checks that every config class and
#: variant the listing shows is defined in one of them
LISTING_SOURCES = (
    "blockbench.config",
    "blockbench.keys",
    "blockbench.listing",
    "blockbench.models",
    "blockbench.tasks",
)
#: libraries whose names or field types appear in the listing (Lightning's precision, accelerator and
#: strategy names; pydantic's types)
LISTED_LIBRARIES = ("lightning", "pydantic")


@dataclass
class Listing:
    """What ``blockbench list`` shows: every config key, and each section's one-line title."""

    keys: list[Key]
    titles: dict[str, str]

    def to_json(self) -> str:
        return json.dumps({"keys": [asdict(key) for key in self.keys], "titles": self.titles})

    @classmethod
    def from_json(cls, text: str) -> Listing:
        data = json.loads(text)
        keys = [
            Key(
                key["key"],
                [Definition(**d) for d in key["definitions"]],
                [Choice(**c) for c in key["choices"]],
            )
            for key in data["keys"]
        ]
        return cls(keys, dict(data["titles"]))


# --------------------------------------------------------------------------- reading the models


def walk_listing() -> Listing:
    """The listing read from the config classes themselves (imports the models, the tasks, torch)."""
    from .config import RunConfig

    return Listing(config_keys(RunConfig, key_choices), section_titles())


def key_choices(cls: type, name: str) -> list[Choice]:
    """The names field ``name`` of config class ``cls`` accepts beyond its type: a variant registry's,
    Lightning's, or for ``task.name`` the presets (``RunConfig._task_by_name`` takes a preset's name)."""
    from blockbench.models import ModelConfig
    from blockbench.models.config import VARIANT_REGISTRIES
    from blockbench.tasks import TASK_PRESETS

    from .config import LIGHTNING_FIELDS, RunConfig, TrainerConfig, lightning_choices

    if issubclass(cls, ModelConfig) and name in VARIANT_REGISTRIES:
        return [Choice(entry.name, entry.description) for entry in VARIANT_REGISTRIES[name]]
    if issubclass(cls, TrainerConfig) and name in LIGHTNING_FIELDS:
        return [Choice(choice) for choice in lightning_choices(name)]
    if cls is RunConfig and name == "task":
        return [Choice(p, f"preset of {s.task['name']}: {s.description}") for p, s in TASK_PRESETS.items()]
    return []


def section_titles() -> dict[str, str]:
    """Each section's one-line title: its class docstring, or for a tagged union how to read its keys."""
    from .config import RunConfig

    titles = {}
    for name, info in RunConfig.model_fields.items():
        members = config_classes(info.annotation)
        if info.discriminator:
            titles[name] = (
                f"keys of the {name} chosen by {name}.{info.discriminator}; each key lists the "
                f"{name}s that have it, with their defaults"
            )
        elif members:
            title = first_line(members[0].__doc__)
            first_word = title.split(" ")[0]
            titles[name] = title[:1].lower() + title[1:] if first_word[1:].islower() else title  # "AdamW" stays
    return titles


# --------------------------------------------------------------------------- the cache


def source_digest() -> str:
    """sha256 of the ``.py`` files of :data:`LISTING_SOURCES` (found without importing them: a
    package's every file, a module's own), of the versions of :data:`LISTED_LIBRARIES` and of Python:
    what the listing is read from. Any edit to those files gives another digest (reading them takes a
    few milliseconds; telling which edits leave the listing as it was would take the walk itself)."""
    digest = hashlib.sha256(sys.version.encode())
    for library in LISTED_LIBRARIES:
        digest.update(f"\0{library}=={metadata.version(library)}".encode())
    for name in LISTING_SOURCES:
        spec = importlib.util.find_spec(name)  # imports the parent package only (blockbench: a docstring)
        if spec.submodule_search_locations:  # a package: every file in its folder
            folder = Path(next(iter(spec.submodule_search_locations)))
            files = [(f"{name}/{path.relative_to(folder).as_posix()}", path) for path in sorted(folder.rglob("*.py"))]
        else:
            files = [(name, Path(spec.origin))]
        for label, path in files:
            digest.update(f"\0{label}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:24]


def cache_folder() -> Path:
    """The cache's folder of listings (``$BLOCKBENCH_CACHE``, default ``~/.cache/blockbench``)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "blockbench") / CACHE_DIR


def load_listing() -> Listing:
    """The listing of this code: from the cache if this code's listing is there, else walked from the
    config classes (importing torch) and cached. A cache that cannot be read or written is passed by."""
    path = cache_folder() / f"{source_digest()}.json"
    try:
        return Listing.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        pass
    listing = walk_listing()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        temporary.write_text(listing.to_json())
        os.replace(temporary, path)  # whole or not at all, whoever else writes it at the same time
        for old in sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime)[:-CACHE_KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass
    return listing


# --------------------------------------------------------------------------- filtering and printing


def select(keys: list[Key], query: str | None) -> list[Key]:
    """The keys a ``blockbench list QUERY`` shows: a section or key prefix (``model``, ``task.augment``)
    selects the keys under it; any other query, the keys whose text contains it (``moe``, ``kv``)."""
    if not query:
        return keys
    query = query.lower()
    under = [k for k in keys if k.key.lower() == query or k.key.lower().startswith(query.rstrip(".") + ".")]
    return under or [k for k in keys if query in k.text()]


def format_listing(keys: list[Key], titles: dict[str, str], width: int = WIDTH) -> str:
    """The keys grouped by section, each section under its title."""
    lines, section = [], None
    for key in keys:
        if key.section != section:
            section = key.section
            if lines:
                lines.append("")
            if section in titles:
                lines += textwrap.wrap(f"{section}.*: {titles[section]}", width, subsequent_indent="  ", **WRAP)
                lines.append("")
        lines += format_key(key, width)
    return "\n".join(lines)


def format_key(key: Key, width: int = WIDTH) -> list[str]:
    """``key = default  kind``, its meaning, then the names it accepts. A key of several tasks has one
    line per default (``lm, vit = 1234``), each group of tasks under its own meaning."""
    definitions = key.definitions
    kinds = {d.kind for d in definitions}
    shared_kind = next(iter(kinds)) if len(kinds) == 1 else None
    if len(definitions) == 1 and definitions[0].owner is None:
        d = definitions[0]
        lines = [f"{key.key} = {value_text(d.default)}  {d.kind}"]
        lines += _wrap(d.description, 4, width)
        indent = 6
    else:
        lines = [f"{key.key}  {shared_kind}" if shared_kind else key.key]
        for description in dict.fromkeys(d.description for d in definitions):
            same = [d for d in definitions if d.description == description]
            by_default: dict[tuple[str, str], list[str]] = {}
            for d in same:
                by_default.setdefault((value_text(d.default), d.kind), []).append(d.owner or "")
            for (value, kind), owners in by_default.items():
                lines.append(f"    {', '.join(owners)} = {value}" + ("" if shared_kind else f"  {kind}"))
            lines += _wrap(description, 8, width)
        indent = 10
    return lines + _format_choices(key.choices, indent, width)


def _wrap(text: str, indent: int, width: int) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=" " * indent, subsequent_indent=" " * indent, **WRAP)


def _format_choices(choices: list[Choice], indent: int, width: int) -> list[str]:
    """The names a key accepts: a table of names and descriptions, or one wrapped line of bare names."""
    if not choices:
        return []
    if not any(c.description for c in choices):
        return textwrap.wrap(
            "choices: " + ", ".join(c.name for c in choices),
            width,
            initial_indent=" " * indent,
            subsequent_indent=" " * (indent + 9),
            **WRAP,
        )
    # ``name   description`` rows, the descriptions in one column and wrapped under themselves
    column = indent + max(len(c.name) for c in choices) + 2
    lines = []
    for choice in choices:
        wrapped = textwrap.wrap(choice.description, max(20, width - column), **WRAP) or [""]
        lines.append(f"{' ' * indent}{choice.name:<{column - indent}}{wrapped[0]}".rstrip())
        lines += [" " * column + line for line in wrapped[1:]]
    return lines
