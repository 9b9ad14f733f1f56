"""A first look at a run config's keys from the cached key listing, before anything imports torch.

The run config classes live beside the models and the tasks, and loading them loads torch and
Lightning: several seconds before the first word of a mistake the user made in a key's name. The key
listing ``blockbench list`` reads is cached on disk for the same reason (``blockbench.listing``), so
``blockbench train`` first checks every key of the config file and of the overrides against it, and
every variant name given to a ``model.*`` key (``model.norm_placement=postt``) against the names that
key's registry takes, and stops there with the same "did you mean" the full validation gives.

It is a pre-check, never the authority: it only reports what the full validation also rejects (a
key the config classes do not have, a name a variant registry does not hold), and leaves everything
else, a value's type or range, a key another task owns, to the pydantic models, which run next.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .keys import Key, Origins, Problem, unknown_run_key, with_sections
from .overrides import ConfigError, load_yaml, parse_overrides

#: the section whose keys with a list of names are variant registries (checked by name here)
REGISTRY_SECTION = "model"


class KeyProblems(ValueError):
    """Keys or variant names of a run config that its classes do not take: one line per problem."""


def key_problems(
    known: Mapping[str, Key], raw: Mapping[str, Any], overrides: Mapping[str, Any], origins: Origins
) -> list[str]:
    """One line per key of ``raw`` (a config file's sections) or ``overrides`` (dotted keys) that is
    not in ``known`` (:func:`blockbench.keys.with_sections` of the listing), and per name given to a
    variant key that its registry does not hold, each saying where it was set (``origins``)."""
    problems = [*_walk(known, "", raw), *(p for key, v in overrides.items() for p in _check(known, key, v))]
    seen: dict[str, Problem] = {}
    for problem in problems:  # a key set in the file and again on the command line: once
        seen.setdefault(problem.key, problem)
    return [problem.text(origins) for problem in seen.values()]


def _walk(known: Mapping[str, Key], prefix: str, node: Mapping[str, Any]) -> Iterable[Problem]:
    for name, value in node.items():
        yield from _check(known, f"{prefix}{name}", value)


def _check(known: Mapping[str, Key], key: str, value: Any) -> Iterable[Problem]:
    """The problems of ``key`` set to ``value``: an unknown key, a section's unknown keys below it, or an
    unknown variant name."""
    if key not in known:
        yield Problem(key, unknown_run_key(key, known))
    elif isinstance(value, dict) and not known[key].definitions:  # a section: its keys in turn
        yield from _walk(known, f"{key}.", value)
    elif key.split(".")[0] == REGISTRY_SECTION and isinstance(value, str) and known[key].choices:
        names = sorted(choice.name for choice in known[key].choices)
        if value not in names:
            yield Problem(key, f"unknown name '{value}'; choose one of: {', '.join(names)}")


def precheck(config_file: str | None, items: list[str], origin: str) -> None:
    """Raise :class:`KeyProblems` if ``config_file`` (read as YAML) or the ``key=value`` ``items`` (set
    ``origin``, e.g. "on the command line") use a key or a variant name the config classes do not take.
    Anything this cannot read (a missing file, bad YAML, an item without ``=``) is left to the full
    validation, which says what is wrong with it."""
    from .listing import load_listing

    try:  # read as the full validation reads them (blockbench.overrides)
        raw = load_yaml(config_file) if config_file is not None else {}
        overrides = parse_overrides(items)
    except ConfigError:
        return
    origins = Origins.given(raw, config_file or "", overrides, dict.fromkeys(overrides, origin))
    problems = key_problems(with_sections(load_listing().keys), raw, overrides, origins)
    if problems:
        raise KeyProblems("\n".join(problems))
