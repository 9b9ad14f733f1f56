"""Dotted config keys (``model.n_heads``): every key a config class accepts, walked from its pydantic
fields, and what an error about a key says: the closest valid keys to a misspelt one, and where the
key was set (a config file, the command line, a matrix file's ``overrides:`` or one of its axes).

``blockbench list`` prints these keys (``blockbench.listing``) and config validation suggests from the
same walk (``blockbench.config.describe_validation_error``), so every key an error suggests is one
``blockbench list`` shows. The module imports neither the config classes nor any model or task code
(the walk is handed its root class), so that the listing can be read back from its cache without
loading torch; pydantic is imported only by the walk itself.
"""

from __future__ import annotations

import difflib
import inspect
import types
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

import yaml

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from pydantic import BaseModel
    from pydantic.fields import FieldInfo

#: the default of a field that has none (the config must set it)
REQUIRED = "(required)"
#: suggestions whose similarity is this far below the best one's are left out (``model.n_head``:
#: ``model.n_heads``, not also ``model.n_kv_heads``)
SUGGESTION_SPREAD = 0.05
#: where an override was set when its caller does not say
OVERRIDE = "by an override"


@dataclass(frozen=True)
class Choice:
    """A name a key accepts, with its one-line description ('' where the source has none)."""

    name: str
    description: str = ""


@dataclass(frozen=True)
class Definition:
    """A key as one config class declares it: a task key has one definition per task that has it."""

    owner: str | None  # the task (and image source) whose key it is; None outside a tagged union
    default: Any  # as plain YAML/JSON data (a section as a mapping, a tuple as a list); REQUIRED if none
    kind: str  # type and bounds, e.g. "int >0 or null"
    description: str


@dataclass
class Key:
    """One dotted config key (``model.n_kv_heads``) and everything ``blockbench list`` says about it."""

    key: str
    definitions: list[Definition] = field(default_factory=list)
    choices: list[Choice] = field(default_factory=list)

    @property
    def section(self) -> str:
        return self.key.split(".")[0]

    def text(self) -> str:
        """What a filter searches: the key, its meanings, owners and accepted names."""
        parts = [self.key]
        parts += [f"{d.owner or ''} {d.description}" for d in self.definitions]
        parts += [f"{c.name} {c.description}" for c in self.choices]
        return "\n".join(parts).lower()


# --------------------------------------------------------------------------- the walk


def no_choices(cls: type[BaseModel], name: str) -> list[Choice]:
    """The names a field accepts beyond its type, where the caller knows none."""
    return []


def config_keys(root: type[BaseModel], choices: Callable[[type, str], list[Choice]] = no_choices) -> list[Key]:
    """Every key of config class ``root``, in the order the classes declare them, the keys of a
    subsection (``task.data.*``) together after their section's own keys. ``choices(cls, name)``
    gives the names field ``name`` of ``cls`` accepts beyond its type (a registry's); a tagged union's
    tag key (``task.name``) lists its members' tags, then ``choices`` of the union field.

    A field holding a config class is a section (``model.*``); a tagged union (``task``, an image
    task's ``data``) is one key for its tag (``task.name``) plus the keys of every member, each key
    naming the members that have it and their defaults."""
    keys: dict[str, Key] = {}
    _walk(root, "", None, None, keys, choices)
    groups: dict[str, int] = {}
    for key in keys:
        groups.setdefault(key.rpartition(".")[0], len(groups))
    return sorted(keys.values(), key=lambda k: groups[k.key.rpartition(".")[0]])


def _walk(
    cls: type[BaseModel],
    prefix: str,
    owner: str | None,
    instance: BaseModel | None,
    keys: dict[str, Key],
    choices: Callable[[type, str], list[Choice]],
    skip: str | None = None,
) -> None:
    """Add the keys of config class ``cls`` under ``prefix``; ``instance`` supplies the defaults of a
    section whose parent default differs from the class defaults."""
    from pydantic import BaseModel

    for name, info in cls.model_fields.items():
        if name == skip:  # a union member's tag: the union's own key lists the tags
            continue
        key, default = prefix + name, _default(info, instance, name)
        members = config_classes(info.annotation)
        if members and info.discriminator:
            tag = info.discriminator
            tags = [Choice(m.model_fields[tag].default, _summary(m)) for m in members] + choices(cls, name)
            tag_default = REQUIRED if default is REQUIRED else getattr(default, tag)
            _add(keys, f"{key}.{tag}", Definition(owner, tag_default, "str", info.description or ""), tags)
            for member in members:
                member_tag = member.model_fields[tag].default
                _walk(
                    member,
                    f"{key}.",
                    member_tag if owner is None else f"{owner} ({member_tag})",
                    default if isinstance(default, member) else None,
                    keys,
                    choices,
                    skip=tag,
                )
        elif members:
            section = default if isinstance(default, BaseModel) else None
            _walk(members[0], f"{key}.", owner, section, keys, choices)
        else:
            definition = Definition(owner, plain(default), _kind(info), info.description or "")
            _add(keys, key, definition, choices(cls, name))


def _add(keys: dict[str, Key], key: str, definition: Definition, choices: list[Choice]) -> None:
    entry = keys.setdefault(key, Key(key))
    entry.definitions.append(definition)
    entry.choices += [c for c in choices if c not in entry.choices]


def _default(info: FieldInfo, instance: BaseModel | None, name: str) -> Any:
    if instance is not None:
        return getattr(instance, name)
    return REQUIRED if info.is_required() else info.get_default(call_default_factory=True)


def plain(value: Any) -> Any:
    """``value`` as plain YAML/JSON data, as a config file would write it: a config section as its
    mapping, a tuple as a list (so that the listing reads back the same from its JSON cache). A
    section is known by its ``model_dump`` (pydantic's ``BaseModel``), so that printing the cached
    listing, already plain, needs no pydantic."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (tuple, list)):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def config_classes(annotation: Any) -> list[type[BaseModel]]:
    """The config classes a field holds (one for a section, several for a tagged union)."""
    from pydantic import BaseModel

    options = get_args(annotation) if _is_union(annotation) else (annotation,)
    return [option for option in options if inspect.isclass(option) and issubclass(option, BaseModel)]


def first_line(doc: str | None) -> str:
    """A docstring's first paragraph on one line, without its final full stop."""
    return " ".join((doc or "").strip().split("\n\n")[0].split()).replace("``", "`").removesuffix(".")


def _summary(cls: type[BaseModel]) -> str:
    """A union member's one-line description: a task's ``description``, else its docstring."""
    description = getattr(cls, "description", None)
    return description if isinstance(description, str) else first_line(cls.__doc__)


def _type_name(annotation: Any) -> str:
    from pydantic import BaseModel

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
    if value == REQUIRED:
        return REQUIRED
    return yaml.safe_dump(plain(value), default_flow_style=True, width=1 << 30).removesuffix("...\n").strip()


# --------------------------------------------------------------------------- errors about a key


@cache
def known_keys(root: type[BaseModel]) -> dict[str, Key]:
    """Every key of ``root`` by name, its sections (``model``, ``task.augment``) among them as keys
    without definitions, so that a misspelt section (``trainr``) finds ``trainer``."""
    return with_sections(config_keys(root))


def with_sections(found: Iterable[Key]) -> dict[str, Key]:
    """``found`` by name, with every section above a key (``model``, ``task.augment``) added as a key
    without definitions."""
    keys = {key.key: key for key in found}
    for name in list(keys):
        parts = name.split(".")
        for end in range(1, len(parts)):
            keys.setdefault(".".join(parts[:end]), Key(".".join(parts[:end])))
    return keys


def closest_keys(key: str, names: list[str]) -> list[str]:
    """The valid ``names`` a misspelt ``key`` most likely meant, best first: the names whose last part
    is closest to ``key``'s (``difflib``'s closeness, those clearly less alike than the best left out
    by :data:`SUGGESTION_SPREAD`), in ``key``'s own section first (``model.n_head``: ``model.n_heads``),
    then in others (``model.lr``: ``optimizer.lr``); never a section above ``key``; at most three."""
    section, _, leaf = key.rpartition(".")
    by_leaf: dict[str, list[str]] = {}
    for name in names:
        if not key.startswith(name + "."):
            by_leaf.setdefault(name.rpartition(".")[2], []).append(name)
    close = [name for match in _close(leaf, list(by_leaf)) for name in by_leaf[match]]
    return sorted(close, key=lambda name: name.rpartition(".")[0] != section)[:3]


def _close(word: str, names: list[str]) -> list[str]:
    """``difflib.get_close_matches`` of ``word`` in ``names``, without those far behind the best."""
    close = difflib.get_close_matches(word, names, n=3)
    score = [difflib.SequenceMatcher(None, word, name).ratio() for name in close]
    return [name for name, s in zip(close, score, strict=True) if s >= score[0] - SUGGESTION_SPREAD]


def unknown_key(key: str, root: type[BaseModel], run: type[BaseModel], value: Any, noun: str) -> str:
    """What is wrong with ``key``, which config class ``root`` (of ``noun``, e.g. "a matrix file")
    does not take, ``value`` being what it was given: the closest valid keys, the members of a tagged
    union that do take it (``task.seq_len`` on the vit task), and for a run config's key at the top of
    a file of another kind (``trainer:`` in a matrix file) where run settings go."""
    known = known_keys(root)
    if root is run:
        return unknown_run_key(key, known)
    owners = _owners(key, known)
    if owners:
        return owners
    close = closest_keys(key, list(known))
    guess = f"unknown key; did you mean {' or '.join(close)}?" if close else ""
    if "." in key:
        return guess or f"unknown key, not a field of {noun}"
    takes = f"{noun} takes: {', '.join(root.model_fields)}"
    text = f"{guess} {takes[:1].upper()}{takes[1:]}" if guess else f"unknown key; {takes}"
    run_keys = known_keys(run)
    if key not in run_keys:
        return text
    example = {f"{key}.{inner}": v for inner, v in value.items()} if isinstance(value, dict) else {key: value}
    what = "section" if not run_keys[key].definitions else "key"
    return (
        f"{text}; {key} is a run config {what}: put run settings under overrides: "
        f"(e.g. overrides: {value_text(dict(list(example.items())[:2]) or {'trainer.max_steps': 600})})"
    )


def unknown_run_key(key: str, known: Mapping[str, Key]) -> str:
    """What is wrong with ``key`` in a run config whose keys are ``known`` (:func:`with_sections`): the
    tagged-union members that take it, else the closest valid keys, else where to look them up. Apart
    from :func:`unknown_key` so that ``blockbench.precheck`` can say it from the cached listing."""
    owners = _owners(key, known)
    if owners:
        return owners
    close = closest_keys(key, list(known))
    if close:
        return f"unknown key; did you mean {' or '.join(close)}?"
    section = key.split(".")[0]
    if section in known:
        return f"unknown key, not a config field: `blockbench list {section}` lists the {section} keys"
    return "unknown key, not a config field: `blockbench list` lists them all"


def _owners(key: str, known: Mapping[str, Key]) -> str:
    """For a key of other members of a tagged union (another task's key) which members take it; else ''."""
    owners = [d.owner for d in known[key].definitions if d.owner] if key in known else []
    return f"unknown key for this {key.split('.')[0]}; {key} is a key of {', '.join(owners)} only" if owners else ""


@dataclass(frozen=True)
class Origins:
    """Where each key of a config came from, so that an error names the place to fix: the file its
    sections were read from (``source``, e.g. ``in configs/base.yaml``; '' if unknown) and, for each
    dotted override, where it was given (``on the command line``, ``by m.yaml's axis model.norm``)."""

    raw: Mapping[str, Any]
    source: str = ""
    overrides: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def given(
        cls, raw: Mapping[str, Any], source: str, overrides: Mapping[str, Any], origins: Mapping[str, str]
    ) -> Origins:
        """The origins of a config read from file ``source`` ('' if unknown) as ``raw``, with
        ``overrides`` given where ``origins`` says (an override it leaves out: ``by an override``)."""
        return cls(raw, f"in {source}" if source else "", {key: origins.get(key, OVERRIDE) for key in overrides})

    def of(self, key: str) -> str:
        """Where ``key`` was set: the override that set it or a section above it (the deepest, which
        was applied last), else the file if it has the key; for a whole section (``model``) every
        place that set some of its keys; '' for the config as a whole or a key set nowhere (a default)."""
        if not key:
            return ""
        above = [o for o in self.overrides if key == o or key.startswith(o + ".")]
        if above:
            return self.overrides[max(above, key=len)]
        places = [self.source] if self.source and _has(self.raw, key) else []
        places += [where for o, where in self.overrides.items() if o.startswith(key + ".")]
        return " and ".join(dict.fromkeys(places))


def _has(config: Mapping[str, Any], key: str) -> bool:
    """Whether the nested mapping ``config`` sets dotted ``key`` (or a section above it to a value)."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@dataclass(frozen=True)
class Problem:
    """One validation problem: the dotted key it is about ('' for the config as a whole) and what is wrong."""

    key: str
    message: str

    def text(self, origins: Origins | None = None) -> str:
        """``model.n_head: unknown key; did you mean model.n_heads? (set on the command line)``."""
        line = f"{self.key}: {self.message}" if self.key else self.message
        where = origins.of(self.key) if origins is not None else ""
        return f"{line} (set {where})" if where else line
