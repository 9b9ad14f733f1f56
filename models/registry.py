"""Name -> implementation registries, so every variant is selected by name from config.

A registry maps a config string (``"rmsnorm"``) to a class or factory plus a one-line
description (shown by ``blockbench list``). Config validation asks the registry whether a
name exists, so a typo fails before training with the list of valid names.

A variant also owns its config checks: the registered class may define a classmethod
``check(cls, cfg: ModelConfig) -> None`` (or ``register(..., check=fn)`` names one, for a
function variant) that raises ValueError when the variant cannot run with ``cfg``, saying how to
fix it. ``ModelConfig`` calls ``Registry.check`` for every variant it selects, so such a config
fails at validation, before training, with no special case in ``ModelConfig``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    target: T
    description: str
    check: Callable[[Any], None] | None = None  # raises ValueError if the variant cannot run with a ModelConfig


class Registry(Generic[T]):
    """A named collection of interchangeable variants of one kind of layer."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, description: str, *, check: Callable[[Any], None] | None = None) -> Callable[[T], T]:
        """Register a variant; ``check`` (default: the target's ``check`` classmethod, if any) validates a config."""

        def decorator(target: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = Entry(name, target, description, check or getattr(target, "check", None))
            return target

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name].target
        except KeyError:
            raise KeyError(self.unknown_message(name)) from None

    def check(self, name: str, cfg: Any) -> None:
        """Raise ValueError if variant ``name`` cannot run with the ModelConfig ``cfg`` (no-op without a check)."""
        if name not in self._entries:
            raise KeyError(self.unknown_message(name))
        check = self._entries[name].check
        if check is not None:
            check(cfg)

    def unknown_message(self, name: str) -> str:
        return f"unknown {self.kind} '{name}'; choose one of: {', '.join(self.names())}"

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))


NORMS: Registry = Registry("norm")
PLACEMENTS: Registry = Registry("norm placement")
ACTIVATIONS: Registry = Registry("activation")
POSITIONAL: Registry = Registry("positional encoding")
FAMILIES: Registry = Registry("model family")
FFNS: Registry = Registry("feed-forward")
ATTENTION_SCORES: Registry = Registry("attention score")
SPARSITY: Registry = Registry("attention sparsity")

ALL_REGISTRIES = (FAMILIES, NORMS, PLACEMENTS, ACTIVATIONS, POSITIONAL, FFNS, ATTENTION_SCORES, SPARSITY)
