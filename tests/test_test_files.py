"""The test files follow pytest's layout, read from the source (AST): fixtures and hooks live in
conftest.py, which pytest loads by itself and no test file imports; the plain names more than one
test file shares (configs, factories, constants) live in helpers.py, which test files import."""

from __future__ import annotations

import ast

from helpers import REPO

TESTS = REPO / "tests"


def conftest_imports(path) -> list[str]:
    """Where ``path`` imports a conftest module (``import conftest``, ``from conftest import ...``,
    ``from tests.conftest import ...``, a function's local imports too), as ``file:line``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] + [f"{node.module or ''}.{alias.name}".lstrip(".") for alias in node.names]
        else:
            continue
        if any(module.split(".")[-1] == "conftest" for module in modules):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_no_test_file_imports_conftest():
    """pytest imports each conftest.py itself, for its fixtures and hooks; importing it as a module too
    loads it a second time under another name and ties the test to its folder on sys.path."""
    found = [where for path in sorted(TESTS.rglob("*.py")) for where in conftest_imports(path)]
    assert not found, found


def test_conftest_holds_only_fixtures_and_hooks():
    """Each conftest.py defines fixtures (``@pytest.fixture``) and hooks (``pytest_*``) and nothing a
    test file would need to import: no module-level constants, classes or plain helper functions
    (``pytest_plugins`` aside)."""
    plain = []
    for path in sorted(TESTS.rglob("conftest.py")):
        for node in ast.parse(path.read_text()).body:
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                fixture = any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)
                if not fixture and not node.name.startswith("pytest_"):
                    plain.append(f"{where}: def {node.name}")
            elif isinstance(node, ast.ClassDef | ast.Assign | ast.AnnAssign):
                statement = ast.unparse(node).splitlines()[0]
                if not statement.startswith("pytest_plugins"):
                    plain.append(f"{where}: {statement}")
    assert not plain, plain
