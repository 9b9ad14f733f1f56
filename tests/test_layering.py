"""The import graph, read from the source (AST) without importing anything: the layers
``benchmarks -> blockbench -> tasks -> models`` only import downwards, no modules of one package
import each other in a cycle, and ``tasks`` uses only ``models``' public API.

Every import counts, a function's local imports too: deferring an import hides a cycle from the
interpreter, not from a reader. Imports under ``if TYPE_CHECKING:`` run for type checkers only: they
count as layering, not as cycles (a type named in an annotation is the usual way to break one).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: top to bottom: a package may import the packages below it, never one above it
LAYERS = ("benchmarks", "blockbench", "tasks", "models")
#: packages whose modules must not import each other in a cycle
ACYCLIC = ("blockbench", "tasks", "models")


@dataclass(frozen=True)
class Import:
    """One imported module (a submodule where ``from package import name`` names one)."""

    source: str  # the importing module, e.g. ``blockbench.report``
    target: str  # the imported module, e.g. ``blockbench.layout``
    names: tuple[str, ...]  # what ``from target import ...`` takes from it; () for ``import target``
    where: str  # ``blockbench/report.py:40``
    statement: str  # as written
    type_only: bool = False  # under ``if TYPE_CHECKING:``

    def __str__(self) -> str:
        return f"{self.where}: {self.statement}"


def module_name(path: Path) -> str:
    """``blockbench/report.py`` -> ``blockbench.report``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the layers, by name."""
    return {module_name(path): path for layer in LAYERS for path in sorted((REPO / layer).rglob("*.py"))
            if "__pycache__" not in path.parts}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(nodes: Iterable[ast.AST], type_only: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement in ``nodes``, at any depth, and whether it is under ``if TYPE_CHECKING:``."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, type_only
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_nodes(node.body, True)
            yield from _import_nodes(node.orelse, type_only)
        else:
            yield from _import_nodes(ast.iter_child_nodes(node), type_only)


def imports_of(name: str, path: Path) -> list[Import]:
    """Every import of the module ``name`` at ``path``."""
    return imports_in(name, path.read_text(), path.relative_to(REPO).as_posix(), is_package=path.name == "__init__.py")


def imports_in(name: str, source: str, file: str, *, is_package: bool = False) -> list[Import]:
    """Every import in the ``source`` of module ``name``, at any depth, with relative imports resolved."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node, type_only in _import_nodes([ast.parse(source, filename=file)]):
        where, statement = f"{file}:{node.lineno}", ast.unparse(node)
        if isinstance(node, ast.Import):
            found += [Import(name, alias.name, (), where, statement, type_only) for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names = []
            for alias in node.names:
                if f"{base}.{alias.name}" in modules():  # from package import submodule
                    found.append(Import(name, f"{base}.{alias.name}", (), where, statement, type_only))
                else:
                    names.append(alias.name)
            if names:
                found.append(Import(name, base, tuple(names), where, statement, type_only))
    return found


@cache
def all_imports() -> list[Import]:
    return [i for name, path in modules().items() for i in imports_of(name, path)]


def layer(module: str) -> str:
    return module.split(".")[0]


def test_the_graph_is_read():
    assert {"blockbench.report", "blockbench.layout", "tasks.base", "tasks.data.cache", "models"} <= modules().keys()
    assert any(i.source == "blockbench.report" and i.target == "blockbench.stats" for i in all_imports())
    source = """
import models
from ..base import Metric
from blockbench import layout, report
from . import text

def load():
    from models.attention import MultiHeadAttention

if TYPE_CHECKING:
    from tasks import TaskConfig
"""
    found = [(i.target, i.names, i.type_only) for i in imports_in("tasks.data.images", source, "tasks/data/images.py")]
    assert found == [
        ("models", (), False),
        ("tasks.base", ("Metric",), False),  # relative imports resolved
        ("blockbench.layout", (), False), ("blockbench.report", (), False),  # submodules, not names
        ("tasks.data.text", (), False),
        ("models.attention", ("MultiHeadAttention",), False),  # a function's local import
        ("tasks", ("TaskConfig",), True),
    ]


def test_no_package_imports_a_layer_above_it():
    upward = [f"{i} ({layer(i.source)} is below {layer(i.target)})" for i in all_imports()
              if layer(i.target) in LAYERS and LAYERS.index(layer(i.target)) < LAYERS.index(layer(i.source))]
    assert not upward, (f"the layers are {' -> '.join(LAYERS)}, and nothing imports upwards; move what the lower "
                        "layer needs down into it:\n" + "\n".join(upward))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one module importing
    itself (Tarjan's algorithm, iterative; not worth a graph library as a test dependency)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules():
    inside = [i for i in all_imports() if layer(i.source) in ACYCLIC and i.target in modules() and not i.type_only]
    edges: dict[str, set[str]] = {name: set() for name in modules() if layer(name) in ACYCLIC}
    for i in inside:
        edges[i.source].add(i.target)
    problems = []
    for component in cycles(edges):
        members = set(component)
        problems.append(f"{' <-> '.join(component)}:\n" + "\n".join(
            f"  {i}" for i in inside if i.source in members and i.target in members))
    assert not problems, ("modules that import each other (a function-local import too); move what both need into "
                          "a module of its own that both import:\n" + "\n".join(problems))


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}, "b": set()}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def models_public_api() -> set[str]:
    """The names in ``models/__init__.py``'s ``__all__``."""
    tree = ast.parse((REPO / "models" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("models/__init__.py has no __all__: the public API of models is what it lists")


def test_tasks_use_only_the_public_api_of_models():
    public = models_public_api()
    private = [f"{i}" for i in all_imports() if layer(i.source) == "tasks" and layer(i.target) == "models"
               and (i.target != "models" or not set(i.names) <= public)]
    assert not private, ("tasks import from models only what `models` exports (`from models import X`, X in "
                         "models.__all__); import these from `models`, adding them to its API if they belong there:\n"
                         + "\n".join(private))


def reachable(module: str) -> set[str]:
    """The project's modules that importing ``module`` can run: its imports, theirs, and so on."""
    targets: dict[str, set[str]] = {}
    for i in all_imports():
        if not i.type_only and i.target in modules():
            targets.setdefault(i.source, set()).add(i.target)
    seen, todo = set(), [module]
    while todo:
        for target in targets.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_report_reads_results_without_the_runner_or_the_trainer():
    """``blockbench report`` needs the results layout (``blockbench.layout``), not the code that wrote them."""
    assert "blockbench.layout" in reachable("blockbench.report")
    assert not reachable("blockbench.report") & {"blockbench.matrix", "blockbench.train", "blockbench.callbacks"}
