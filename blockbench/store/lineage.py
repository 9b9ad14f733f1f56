"""Code changes that keep results: a lineage of code fingerprints, recorded in a results folder.

Every cell records the fingerprint of the code that made it (:func:`blockbench.provenance.code_fingerprint`),
and a matrix run retrains a cell of another fingerprint: its numbers might not be this code's. Most
changes to that code leave the numbers alone (a docstring, a float64 path, a GPU path), and without
more they would still retrain every cell. A lineage step is the evidence that they do not: code of
fingerprint ``new`` retrained a declared sample of the cells that code ``old`` made (one seed of every
task and variant, tuning cells, the smoke matrix; ``benchmarks/book/lineage.py``) and gave the same numbers
bit for bit, on one kind of device (``CellRecord.device_kind``: the accelerator, the CPU's vector extensions
and the torch and lightning versions). A change meant to move some cells declares them before the
sample trains (``changed``, dotted config keys and values); those cells stay stale and are retrained.

A cell of ``old`` made on the step's device kind and not among its ``changed`` configs then counts as
made by ``new``: the matrix runner reuses it and the report calls it current, naming the step it rests
on. Steps chain (``old -> mid -> new``). What a sample can and cannot prove is in
``docs/reproducibility.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from .layout import write_atomic

#: the lineage of a results root, beside its matrices
LINEAGE_FILE = "lineage.json"


class Made(Protocol):
    """What a lineage reads of a cell's record (:class:`blockbench.store.record.CellRecord`)."""

    code_fingerprint: str | None
    config_hash: str | None

    @property
    def device_kind(self) -> str | None: ...


def config_value(config: Mapping[str, Any], dotted: str) -> Any:
    """``config``'s value at a dotted key (``model.pos_encoding``); None where it has none."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


class Selector(BaseModel):
    """Cells whose resolved config has every one of ``values`` (dotted key -> value, compared as text)."""

    values: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> Selector:
        """``model.family=encoder_decoder,model.pos_encoding=relative`` -> a Selector."""
        values = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep or not key or not value:
                raise ValueError(f"'{part}' in '{text}' is not key=value; write e.g. model.pos_encoding=relative")
            values[key.strip()] = value.strip()
        if not values:
            raise ValueError(f"'{text}' selects nothing; write e.g. model.pos_encoding=relative")
        return cls(values=values)

    def matches(self, config: Mapping[str, Any]) -> bool:
        return all(str(config_value(config, key)) == value for key, value in self.values.items())

    def describe(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.values.items())


class Step(BaseModel):
    """One link: code ``new`` reproduced code ``old``'s ``sample`` on ``device``, except ``changed``."""

    old: str
    new: str
    device: str
    #: the cells the change was declared to move, before the sample trained; they are retrained
    changed: list[Selector] = Field(default_factory=list)
    #: the config hashes of the cells of the results folder (of any code) that ``changed`` selected when
    #: the step was recorded: what the runner and the report check a record against (records carry no
    #: config), here and in a chain of steps
    changed_configs: list[str] = Field(default_factory=list)
    #: the cells compared (``<matrix>/<cell path>``), every one identical
    sample: list[str]
    #: the sampled cells of ``changed`` and whether each moved (a declared change that moved nothing)
    changed_sample: dict[str, bool] = Field(default_factory=dict)
    commit: str | None = None
    dirty: bool | None = None
    command: str
    machine: str
    recorded: str

    def admits(self, record: Made, code: str | None = None) -> bool:
        """Whether ``record``, made by code ``old`` (or counting as made by ``code``, earlier in a chain),
        counts as made by code ``new`` through this step."""
        return (
            (code or record.code_fingerprint) == self.old
            and record.config_hash not in self.changed_configs
            and record.device_kind == self.device
        )

    def describe(self) -> str:
        return f"{self.old[:8]} -> {self.new[:8]} ({len(self.sample)} cells identical on {self.device})"


class LineageFile(BaseModel):
    steps: list[Step] = Field(default_factory=list)


@dataclass(frozen=True)
class Lineage:
    """The steps recorded in a results folder (none outside one): which records of other code count
    as made by the code at hand."""

    steps: tuple[Step, ...] = ()

    @classmethod
    def load(cls, results_root: Path) -> Lineage:
        path = Path(results_root) / LINEAGE_FILE
        if not path.is_file():
            return cls()
        return cls(tuple(LineageFile.model_validate_json(path.read_text()).steps))

    def route(self, record: Made, fingerprint: str) -> tuple[Step, ...] | None:
        """The steps that take ``record``'s code to ``fingerprint``, fewest first (a breadth-first search:
        steps may branch): () for a record of that very code, None where no chain of steps admits it
        (a stale record)."""
        paths: dict[str | None, tuple[Step, ...]] = {record.code_fingerprint: ()}
        frontier = [record.code_fingerprint]
        while frontier:
            code = frontier.pop(0)
            if code == fingerprint:
                return paths[code]
            for step in self.steps:
                if step.new not in paths and step.admits(record, code):
                    paths[step.new] = (*paths[code], step)
                    frontier.append(step.new)
        return None

    def admits(self, record: Made, fingerprint: str) -> bool:
        """Whether ``record`` counts as made by code ``fingerprint`` (its own, or through steps)."""
        return self.route(record, fingerprint) is not None

    def add(self, results_root: Path, step: Step) -> None:
        """Append ``step`` to the results folder's lineage file (a step of the same ``old``, ``new`` and
        device replaces the earlier one)."""
        kept = [s for s in self.steps if (s.old, s.new, s.device) != (step.old, step.new, step.device)]
        text = LineageFile(steps=[*kept, step]).model_dump_json(indent=2)
        write_atomic(Path(results_root) / LINEAGE_FILE, text + "\n")


#: no steps: only a record of the very code counts
NO_LINEAGE = Lineage()
