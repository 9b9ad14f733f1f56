"""The project's legal and contributor files agree with the package and with each other: the MIT
licence in ``LICENSE``, ``pyproject.toml`` and ``CITATION.cff``; one version in ``pyproject.toml``,
``blockbench.__version__``, ``CITATION.cff`` and the changelog's latest release; the changelog in
Keep a Changelog's shape; ``CONTRIBUTING.md`` gives the README's test command as it is.
"""

from __future__ import annotations

import re

import yaml
from helpers import REPO

import blockbench

#: the ``[project]`` table's one-line string settings (tomllib is Python 3.11+; the package supports 3.10)
PYPROJECT = dict(re.findall(r'^(\w+) = "(.*)"$', (REPO / "pyproject.toml").read_text().split("[project]")[1], re.M))
#: the section headings Keep a Changelog 1.1.0 allows under a version
CHANGE_TYPES = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_the_licence_is_mit_everywhere():
    licence = (REPO / "LICENSE").read_text()
    assert licence.startswith("MIT License\n\nCopyright (c) 2026 the blockbench authors\n")
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in licence
    assert PYPROJECT["license"] == "MIT"


def test_the_citation_file_is_cff_1_2_0_of_this_version():
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert {"cff-version", "message", "title", "authors"} <= set(citation)  # CFF 1.2.0's required keys
    assert citation["cff-version"] == "1.2.0"
    assert citation["authors"] == [{"name": "The blockbench authors"}]
    assert citation["version"] == PYPROJECT["version"] == blockbench.__version__
    assert citation["license"] == "MIT" and citation["type"] == "software"
    assert "repository-code" not in citation  # no address to give yet, and no placeholder


def test_the_changelog_keeps_a_changelog():
    text = (REPO / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[(.+?)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, flags=re.MULTILINE)
    assert versions[0] == ("Unreleased", "")
    assert versions[1] == (PYPROJECT["version"], versions[1][1]) and versions[1][1]  # released with a date
    assert len(versions) == len(re.findall(r"^## ", text, flags=re.MULTILINE))
    assert set(re.findall(r"^### (.+)$", text, flags=re.MULTILINE)) <= CHANGE_TYPES


def test_contributing_gives_the_readmes_test_command():
    readme = (REPO / "README.md").read_text()
    [command] = [line for line in readme.splitlines() if line.startswith("pip install") and "pytest" in line]
    contributing = (REPO / "CONTRIBUTING.md").read_text()
    assert f"```bash\n{command}\n```" in contributing
    for topic in ("## Adding a variant", "## Adding a task", "## Adding a matrix", "## Rerunning and committing"):
        assert topic in contributing
    assert "ruff check" in contributing and "clean tree" in contributing
