"""``blockbench list``: every key a run config or a matrix axis accepts, with its default, its type and
its meaning, read from the pydantic models themselves (as ``--help`` generated from dataclass fields
in HF's ``HfArgumentParser`` or litgpt's CLI), so a new field shows up without anyone editing a list.

The walk starts at ``RunConfig``: a field holding a config class is a section (``model.*``); a
tagged union (``task``, an image task's ``data``) is one key for its tag (``task.name``) plus the
keys of every member, each key naming the members (tasks) that have it and their defaults. A key
whose value is a name from a registry (``model.norm_placement``) lists the names it accepts.
"""

from __future__ import annotations

import inspect
import textwrap
import types
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from blockbench.models import ModelConfig
from blockbench.models.config import VARIANT_REGISTRIES
from blockbench.tasks import TASK_PRESETS

from .config import LIGHTNING_FIELDS, RunConfig, TrainerConfig, lightning_choices

#: terminal width the listing is wrapped to
WIDTH = 100
#: how every text is wrapped: at spaces only, so names (``GPT-NeoX``, ``cl100k_base``) stay whole
WRAP = dict(break_on_hyphens=False, break_long_words=False)
#: the default of a field that has none (the config must set it)
REQUIRED = "(required)"


@dataclass(frozen=True)
class Choice:
    """A name a key accepts, with its one-line description ('' where the source has none)."""

    name: str
    description: str = ""


@dataclass(frozen=True)
class Definition:
    """A key as one config class declares it: a task key has one definition per task that has it."""

    owner: str | None  # the task (and image source) whose key it is; None outside a tagged union
    default: Any  # REQUIRED when the field has no default
    kind: str  # type and bounds, e.g. "int >0 or null"
    description: str


@dataclass
class Key:
    """One dotted config key (``model.n_kv_heads``) and everything ``blockbench list`` says about it."""

    key: str
    definitions: list[Definition]
    choices: list[Choice]

    @property
    def section(self) -> str:
        return self.key.split(".")[0]

    def text(self) -> str:
        """What a filter searches: the key, its meanings, owners and accepted names."""
        parts = [self.key]
        parts += [f"{d.owner or ''} {d.description}" for d in self.definitions]
        parts += [f"{c.name} {c.description}" for c in self.choices]
        return "\n".join(parts).lower()


# --------------------------------------------------------------------------- reading the models


def config_keys() -> list[Key]:
    """Every key of a run config, in the order the config classes declare them, the keys of a
    subsection (``task.data.*``) together after their section's own keys."""
    keys: dict[str, Key] = {}
    _walk(RunConfig, "", None, None, keys)
    groups: dict[str, int] = {}
    for key in keys:
        groups.setdefault(key.rpartition(".")[0], len(groups))
    return sorted(keys.values(), key=lambda k: groups[k.key.rpartition(".")[0]])


def section_titles() -> dict[str, str]:
    """Each section's one-line title: its class docstring, or for a tagged union how to read its keys."""
    titles = {}
    for name, info in RunConfig.model_fields.items():
        members = _config_classes(info.annotation)
        if info.discriminator:
            titles[name] = (
                f"keys of the {name} chosen by {name}.{info.discriminator}; each key lists the "
                f"{name}s that have it, with their defaults"
            )
        elif members:
            title = _first_line(members[0].__doc__)
            first_word = title.split(" ")[0]
            titles[name] = title[:1].lower() + title[1:] if first_word[1:].islower() else title  # "AdamW" stays
    return titles


def _walk(
    cls: type[BaseModel],
    prefix: str,
    owner: str | None,
    instance: BaseModel | None,
    keys: dict[str, Key],
    skip: str | None = None,
) -> None:
    """Add the keys of config class ``cls`` under ``prefix``; ``instance`` supplies the defaults of a
    section whose parent default differs from the class defaults."""
    for name, info in cls.model_fields.items():
        if name == skip:  # a union member's tag: the union's own key lists the tags
            continue
        key, default = prefix + name, _default(info, instance, name)
        members = _config_classes(info.annotation)
        if members and info.discriminator:
            tag = info.discriminator
            choices = [Choice(m.model_fields[tag].default, _summary(m)) for m in members]
            if cls is RunConfig and name == "task":  # RunConfig._task_by_name also takes a preset's name
                choices += [Choice(p, f"preset of {s.task['name']}: {s.description}") for p, s in TASK_PRESETS.items()]
            tag_default = REQUIRED if default is REQUIRED else getattr(default, tag)
            _add(keys, f"{key}.{tag}", Definition(owner, tag_default, "str", info.description or ""), choices)
            for member in members:
                member_tag = member.model_fields[tag].default
                _walk(
                    member,
                    f"{key}.",
                    member_tag if owner is None else f"{owner} ({member_tag})",
                    default if isinstance(default, member) else None,
                    keys,
                    skip=tag,
                )
        elif members:
            _walk(members[0], f"{key}.", owner, default if isinstance(default, BaseModel) else None, keys)
        else:
            _add(keys, key, Definition(owner, default, _kind(info), info.description or ""), _choices(cls, name))


def _add(keys: dict[str, Key], key: str, definition: Definition, choices: list[Choice]) -> None:
    entry = keys.setdefault(key, Key(key, [], []))
    entry.definitions.append(definition)
    entry.choices += [c for c in choices if c not in entry.choices]


def _default(info: FieldInfo, instance: BaseModel | None, name: str) -> Any:
    if instance is not None:
        return getattr(instance, name)
    return REQUIRED if info.is_required() else info.get_default(call_default_factory=True)


def _choices(cls: type[BaseModel], name: str) -> list[Choice]:
    """The names a field accepts beyond its type: a variant registry's, or Lightning's."""
    if issubclass(cls, ModelConfig) and name in VARIANT_REGISTRIES:
        return [Choice(entry.name, entry.description) for entry in VARIANT_REGISTRIES[name]]
    if issubclass(cls, TrainerConfig) and name in LIGHTNING_FIELDS:
        return [Choice(choice) for choice in lightning_choices(name)]
    return []


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def _config_classes(annotation: Any) -> list[type[BaseModel]]:
    """The config classes a field holds (one for a section, several for a tagged union)."""
    options = get_args(annotation) if _is_union(annotation) else (annotation,)
    return [option for option in options if inspect.isclass(option) and issubclass(option, BaseModel)]


def _first_line(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split()).replace("``", "`").removesuffix(".")


def _summary(cls: type[BaseModel]) -> str:
    """A union member's one-line description: a task's ``description``, else its docstring."""
    description = getattr(cls, "description", None)
    return description if isinstance(description, str) else _first_line(cls.__doc__)


# --------------------------------------------------------------------------- types and values


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if get_origin(annotation) is Literal:
        return " | ".join(str(value) for value in get_args(annotation))
    if _is_union(annotation):
        return " | ".join(_type_name(option) for option in get_args(annotation))
    args = [_type_name(arg) for arg in get_args(annotation)]
    if get_origin(annotation) is dict:
        return "{" + ": ".join(args) + "}"
    if get_origin(annotation) in (list, tuple):
        return "[" + ", ".join(args) + "]"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return "{" + ", ".join(annotation.model_fields) + "}"
    return getattr(annotation, "__name__", str(annotation))


def _kind(info: FieldInfo) -> str:
    """``int >0 or null``: the type, its bounds (pydantic's gt/ge/lt/le), and whether null is allowed."""
    options = get_args(info.annotation) if _is_union(info.annotation) else (info.annotation,)
    kind = " | ".join(_type_name(option) for option in options if option is not type(None))
    bounds = [
        f"{symbol}{value_text(getattr(m, attr))}"
        for m in info.metadata
        for attr, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
        if hasattr(m, attr)
    ]
    return " ".join([kind, *bounds]) + (" or null" if type(None) in options else "")


def value_text(value: Any) -> str:
    """A value as it is written in a YAML config or an override (``null``, ``1.0e-05``, ``[0.9, 0.98]``)."""
    if value is REQUIRED:
        return REQUIRED
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, tuple):
        value = list(value)
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 30).removesuffix("...\n").strip()


# --------------------------------------------------------------------------- filtering and printing


def select(keys: list[Key], query: str | None) -> list[Key]:
    """The keys a ``blockbench list QUERY`` shows: a section or key prefix (``model``, ``task.augment``)
    selects the keys under it; any other query, the keys whose text contains it (``moe``, ``kv``)."""
    if not query:
        return keys
    query = query.lower()
    under = [k for k in keys if k.key.lower() == query or k.key.lower().startswith(query.rstrip(".") + ".")]
    return under or [k for k in keys if query in k.text()]


def format_listing(keys: list[Key], width: int = WIDTH) -> str:
    """The keys grouped by section, each section under its title."""
    titles, lines, section = section_titles(), [], None
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
