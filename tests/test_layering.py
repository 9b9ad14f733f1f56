"""The import graph, read from the source (AST) without importing anything: the layers
``benchmarks -> blockbench -> tasks -> models`` only import downwards, no modules of one package
import each other in a cycle, ``tasks`` uses only ``models``' public API, and inside ``blockbench``
three wings stand on a ground floor: ``cell/`` (one cell's process) and ``report/`` (results read
back) import only the ground floor, ``matrix/`` (many cells) imports ``cell/`` and the ground floor but
never the report, and only the CLI sits above all three. Only the results store (``blockbench/store/``)
writes a results folder, and no function of ``blockbench`` is too long to hold in one's head.

Every import counts, a function's local imports and those under ``if TYPE_CHECKING:`` too: deferring
an import hides a cycle from the interpreter, and a type-only import hides it from the interpreter
and the tests, not from a reader. A type needed on both sides of a cycle lives in the wrong module.
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
ACYCLIC = ("benchmarks", "blockbench", "tasks", "models")


@dataclass(frozen=True)
class Import:
    """One imported module (a submodule where ``from package import name`` names one)."""

    source: str  # the importing module, e.g. ``blockbench.report``
    target: str  # the imported module, e.g. ``blockbench.store.layout``
    names: tuple[str, ...]  # what ``from target import ...`` takes from it; () for ``import target``
    where: str  # ``blockbench/report.py:40``
    statement: str  # as written
    type_only: bool = False  # under ``if TYPE_CHECKING:``

    def __str__(self) -> str:
        return f"{self.where}: {self.statement}"


#: folders at the top of the repository that install inside the blockbench namespace (pyproject's package-dir)
NAMESPACED = ("models", "tasks")


def module_name(path: Path) -> str:
    """``blockbench/report/summary.py`` -> ``blockbench.report.summary``; ``models/attention.py`` ->
    ``blockbench.models.attention`` (installed inside the namespace); a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(REPO).with_suffix("").parts
    parts = ("blockbench", *parts) if parts[0] in NAMESPACED else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the layers, by name."""
    return {
        module_name(path): path
        for layer in LAYERS
        for path in sorted((REPO / layer).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(
    nodes: Iterable[ast.AST], type_only: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
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
    """``blockbench.models.attention`` -> ``models``, ``blockbench.report`` -> ``blockbench``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "blockbench" and len(parts) > 1 and parts[1] in NAMESPACED else parts[0]


def test_the_graph_is_read():
    assert {
        "blockbench.report.summary",
        "blockbench.store.layout",
        "blockbench.tasks.base",
        "blockbench.tasks.data.cache",
        "blockbench.models",
    } <= modules().keys()
    assert any(
        i.source == "blockbench.report.verdicts" and i.target == "blockbench.report.decide" for i in all_imports()
    )
    source = """
from blockbench import models
from ..base import Metric
from blockbench import progress
from blockbench.report import summary
from . import text

def load():
    from blockbench.models.attention import MultiHeadAttention

if TYPE_CHECKING:
    from blockbench.tasks import TaskConfig
"""
    found = [
        (i.target, i.names, i.type_only)
        for i in imports_in("blockbench.tasks.data.images", source, "tasks/data/images.py")
    ]
    assert found == [
        ("blockbench.models", (), False),
        ("blockbench.tasks.base", ("Metric",), False),  # relative imports resolved
        ("blockbench.progress", (), False),
        ("blockbench.report.summary", (), False),  # submodules, not names
        ("blockbench.tasks.data.text", (), False),
        ("blockbench.models.attention", ("MultiHeadAttention",), False),  # a function's local import
        ("blockbench.tasks", ("TaskConfig",), True),
    ]
    assert [
        layer(m)
        for m in ("blockbench.models.attention", "blockbench.tasks", "blockbench.report", "benchmarks.speed.jobs")
    ] == ["models", "tasks", "blockbench", "benchmarks"]


def test_the_library_and_the_tasks_are_imported_through_the_blockbench_namespace():
    """``models`` and ``tasks`` install as ``blockbench.models`` and ``blockbench.tasks``: an import of a
    top-level ``models`` or ``tasks`` would find another project's package, or none."""
    top_level = [str(i) for i in all_imports() if i.target.split(".")[0] in NAMESPACED]
    assert not top_level, "import blockbench.models / blockbench.tasks instead:\n" + "\n".join(top_level)


def test_no_package_imports_a_layer_above_it():
    upward = [
        f"{i} ({layer(i.source)} is below {layer(i.target)})"
        for i in all_imports()
        if layer(i.target) in LAYERS and LAYERS.index(layer(i.target)) < LAYERS.index(layer(i.source))
    ]
    assert not upward, (
        f"the layers are {' -> '.join(LAYERS)}, and nothing imports upwards; move what the lower "
        "layer needs down into it:\n" + "\n".join(upward)
    )


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
    inside = [i for i in all_imports() if layer(i.source) in ACYCLIC and i.target in modules()]  # type-only too
    edges: dict[str, set[str]] = {name: set() for name in modules() if layer(name) in ACYCLIC}
    for i in inside:
        edges[i.source].add(i.target)
    problems = []
    for component in cycles(edges):
        members = set(component)
        problems.append(
            f"{' <-> '.join(component)}:\n"
            + "\n".join(f"  {i}" for i in inside if i.source in members and i.target in members)
        )
    assert not problems, (
        "modules that import each other (a function-local import too); move what both need into "
        "a module of its own that both import:\n" + "\n".join(problems)
    )


def test_benchmark_scripts_importing_the_harness_and_each_other_are_in_the_graph():
    assert any(i.source == "benchmarks.speed.jobs" and i.target == "benchmarks.harness" for i in all_imports())
    assert any(i.source == "benchmarks.gpu.check" and i.target == "benchmarks.gpu.measure" for i in all_imports())
    assert any(
        i.source == "benchmarks.gpu.measure" and i.target == "benchmarks.speed.throughput" for i in all_imports()
    )


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
    private = [
        f"{i}"
        for i in all_imports()
        if layer(i.source) == "tasks"
        and layer(i.target) == "models"
        and (i.target != "blockbench.models" or not set(i.names) <= public)
    ]
    assert not private, (
        "tasks import from models only what `models` exports (`from blockbench.models import X`, X in "
        "models.__all__); import these from `models`, adding them to its API if they belong there:\n"
        + "\n".join(private)
    )


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


#: the wings of ``blockbench``, and the wings each may import besides the ground floor and itself
#: (the runner does not import the report: the command line hands it the report's functions)
WINGS = {"blockbench.cell": (), "blockbench.report": (), "blockbench.matrix": ("blockbench.cell",)}
#: the modules above every wing: the command line
TOP = ("blockbench.cli", "blockbench.__main__", "blockbench.matrix_command")
#: the most floors ``blockbench`` may stand on, a wing counting as one floor (see :func:`floors`): the
#: command line, the runner, the cell, and three ground floors under the cell (a TensorBoard run's
#: names, its views built from them, and what the cell's live writer takes both through)
MAX_FLOORS = 6
#: the most lines a module of ``blockbench`` may have
MAX_LINES = 600


def unit(module: str) -> str:
    """The part of ``blockbench`` a module belongs to: its wing, the top, or itself (the ground floor)."""
    if module in TOP:
        return TOP[0]
    for wing in WINGS:
        if module == wing or module.startswith(wing + "."):
            return wing
    return module


def test_each_wing_imports_only_the_ground_floor_and_the_wings_below_it():
    wrong = []
    for i in all_imports():
        if layer(i.source) != "blockbench" or layer(i.target) != "blockbench" or i.source in TOP:
            continue
        source, target = unit(i.source), unit(i.target)
        if source == target:
            continue
        if target in TOP:
            wrong.append(f"{i} (nothing imports the command line)")
        elif source in WINGS and target in WINGS and target not in WINGS[source]:
            wrong.append(
                f"{i} ({source} may import only the ground floor{' and ' if WINGS[source] else ''}"
                f"{', '.join(WINGS[source])})"
            )
        elif source not in WINGS and target in WINGS:
            wrong.append(f"{i} (the ground floor imports no wing: move what it needs down into the ground floor)")
    assert not wrong, "imports across the wings of blockbench against the rule:\n" + "\n".join(wrong)


def floors() -> dict[str, int]:
    """The floor of each part of ``blockbench`` (:func:`unit`): 1 for one that imports no other part,
    else one above the highest part it imports; a wing counts as one part (its modules share a job)."""
    edges: dict[str, set[str]] = {}
    for name in modules():
        if layer(name) == "blockbench":
            edges.setdefault(unit(name), set())
    for i in all_imports():
        if (
            layer(i.source) == "blockbench"
            and i.target in modules()
            and layer(i.target) == "blockbench"
            and unit(i.source) != unit(i.target)
        ):
            edges[unit(i.source)].add(unit(i.target))
    found: dict[str, int] = {}

    def floor(part: str, path: tuple[str, ...] = ()) -> int:
        assert part not in path, f"a circle between the parts of blockbench: {' -> '.join((*path, part))}"
        if part not in found:
            found[part] = 1 + max((floor(t, (*path, part)) for t in edges[part]), default=0)
        return found[part]

    for part in edges:
        floor(part)
    return found


def test_blockbench_stands_on_few_floors():
    found = floors()
    assert found["blockbench.store.layout"] == 1 and found["blockbench.matrix"] > found["blockbench.cell"]
    assert max(found.values()) <= MAX_FLOORS, f"blockbench stands on more floors than {MAX_FLOORS}: " + ", ".join(
        f"{p} {f}" for p, f in sorted(found.items(), key=lambda x: -x[1])
    )


def test_no_module_of_blockbench_is_long():
    long = {
        name: n
        for name, path in modules().items()
        if layer(name) == "blockbench" and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules of blockbench over {MAX_LINES} lines; split them along their jobs: {long}"


#: fields of a cell's ``result.json`` that only its record names: read them as attributes of
#: ``blockbench.store.record.CellRecord``, never by string from a dict
RECORD_ONLY_KEYS = {
    "metrics",
    "primary_metric",
    "baselines",
    "diverged_at_step",
    "diverging_loss",
    "last_finite_loss",
    "resumed_from_step",
    "resume_error",
    "throughput_per_process",
    "throughput_unit",
    "performance",
    "peak_memory",
    "code_fingerprint",
    "config_hash",
    "curve",
    "record_version",
    "traceback",
}


def string_keyed_reads(source: str) -> list[tuple[int, str]]:
    """``x["key"]``, ``x.get("key")`` and ``"key" in x`` with a key of :data:`RECORD_ONLY_KEYS`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            key = node.args[0].value
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Constant)
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
        ):
            key = node.left.value
        if isinstance(key, str) and key in RECORD_ONLY_KEYS:
            found.append((node.lineno, node.col_offset, key))
    return [(line, key) for line, _, key in sorted(found)]


def test_string_keyed_reads_are_found():
    assert string_keyed_reads('r["metrics"]; r.get("performance") or {}; "curve" in r; d["other"]') == [
        (1, "metrics"),
        (1, "performance"),
        (1, "curve"),
    ]


def test_only_the_record_reads_result_json_by_key():
    """The readers of results (the runner, the report, the CLI) read records as types. The trainer
    (``blockbench.cell``) is left out: it builds the record, and its checkpoint and callback states are
    dicts that share some of its names (``config_hash``, ``metrics``)."""
    reads = [
        f"{path.relative_to(REPO)}:{line}: [{key!r}]"
        for name, path in modules().items()
        if layer(name) == "blockbench" and not name.startswith("blockbench.store") and unit(name) != "blockbench.cell"
        for line, key in string_keyed_reads(path.read_text())
    ]
    assert not reads, (
        "result.json read by string keys; read the field of blockbench.store.record.CellRecord "
        "(load_record / read_record) instead:\n" + "\n".join(reads)
    )


def test_the_report_reads_results_without_the_runner_or_the_trainer():
    """``blockbench report`` needs the results layout and records, not the code that wrote them."""
    reached = reachable("blockbench.report.summary")
    assert {"blockbench.store.layout", "blockbench.store.record"} <= reached
    assert not {m for m in reached if unit(m) in ("blockbench.matrix", "blockbench.cell")}


#: the calls that write, move or remove a file: the store's atomic writes and the file APIs under them
WRITING_CALLS = {
    "write_atomic",
    "write_json",
    "atomic_path",
    "write_text",
    "write_bytes",
    "unlink",
    "rmtree",
    "copy2",
    "copyfile",
    "copytree",
    "savefig",
}
#: calls that write only as functions of these modules (``os.replace``, not ``dataclasses.replace``)
WRITING_MODULE_CALLS = {("os", "replace"), ("os", "rename"), ("os", "remove"), ("shutil", "copy"), ("shutil", "move")}
#: modules outside ``blockbench/store/`` that write files themselves, and why
WRITERS = {
    "blockbench.cell": "the fingerprinted trainer writes its own cell folder through the store's re-exports",
    "blockbench.cli": "blockbench train's own run folder, outside any matrix",
    "blockbench.listing": "its cache of the config keys, not results",
    "blockbench.lifeline": "a cell folder's lock, which a process holds while it trains there",
    "blockbench.matrix.launch": "a cell process's own output, train.log, as the process writes it",
    "blockbench.matrix.estimate.timing": "the timing fits' temporary folder, outside the results",
    "blockbench.tensorboard": "TensorBoard's event files and views, written by the TensorBoard package",
    "blockbench.tensorboard.views": "TensorBoard's views (re-exported for the cell's writer)",
}


def writing_calls(source: str) -> list[tuple[int, str]]:
    """Each call of :data:`WRITING_CALLS` (``x.write_text(...)``, ``write_json(...)``) and each ``open``
    in a mode that writes."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        owner = getattr(node.func.value, "id", None) if isinstance(node.func, ast.Attribute) else None
        if name in WRITING_CALLS or (owner, name) in WRITING_MODULE_CALLS:
            found.append((node.lineno, name))
        elif name == "open":
            modes = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
            modes += [k.value.value for k in node.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)]
            if any(isinstance(m, str) and set(m) & set("wax+") for m in modes):
                found.append((node.lineno, "open"))
    return found


def test_writing_calls_are_found():
    source = 'p.write_text("x"); write_json(p, {}); open(p, "w"); open(p); shutil.rmtree(d); os.replace(a, b)'
    assert [name for _, name in writing_calls(source + "; replace(cell, n=1); p.read_text()")] == [
        "write_text",
        "write_json",
        "open",
        "rmtree",
        "replace",
    ]


def test_only_the_store_writes_results():
    """A results folder is written only by ``blockbench/store/`` (named writes: a record, the summary, a
    cell's folder made ready), so that one place says what a results folder holds and how each file is
    written; the modules of :data:`WRITERS` write files of their own."""
    allowed = tuple(WRITERS)
    writes = [
        f"{path.relative_to(REPO)}:{line}: {name}"
        for name_, path in modules().items()
        if layer(name_) == "blockbench"
        and not name_.startswith("blockbench.store")
        and not any(name_ == a or name_.startswith(a + ".") for a in allowed)
        for line, name in writing_calls(path.read_text())
    ]
    assert not writes, (
        "files written outside blockbench/store; add a named write to the store and call it:\n" + "\n".join(writes)
    )


#: the most lines a function of ``blockbench`` may have
MAX_FUNCTION_LINES = 120


def long_functions(source: str, file: str) -> dict[str, int]:
    """``file:name`` -> lines of each function (at any depth) over :data:`MAX_FUNCTION_LINES`."""
    return {
        f"{file}:{node.name}": n
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES
    }


def test_long_functions_are_found():
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\ndef g():\n    pass\n", "m.py") == {"m.py:f": MAX_FUNCTION_LINES + 1}


def test_no_function_of_blockbench_is_long():
    long = {
        where: n
        for name, path in modules().items()
        if layer(name) == "blockbench"
        for where, n in long_functions(path.read_text(), path.relative_to(REPO).as_posix()).items()
    }
    assert not long, f"functions of blockbench over {MAX_FUNCTION_LINES} lines; split them along their steps: {long}"
