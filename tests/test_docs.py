"""The README and the docs site against what they describe: the README stays short and its links
resolve, its test command is what CI runs, the generated configuration reference lists every key
``blockbench list`` lists, and the matrix-files page documents every key a matrix file takes.

(The strict build itself, ``mkdocs build --strict``, is a step of CI, ``.ci/run``: it fails on a
broken link or anchor.)
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
from helpers import REPO

from blockbench.cli import main
from blockbench.matrix.expand import load_matrix
from blockbench.matrixfile import MatrixConfig

README = REPO / "README.md"
DOCS = REPO / "docs"
#: the README's size limits: a page a reader reads through, not a manual
MAX_LINES, MAX_LINE_CHARS = 200, 300
#: the verdict picture, drawn by ``blockbench report`` once the book is rerun: the README embeds it
#: before it exists (the docs site shows a note instead, see docs/verdict_picture.py)
VERDICT_PICTURE = "results/verdicts.png"


def load_docs_module(name: str):
    """A hook script of docs/ (not a package) as a module."""
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def listed_keys(capsys) -> list[str]:
    """The keys ``blockbench list`` prints: each at column 0 as ``key = default  type``, ``key  type``
    or ``key`` (section titles end in ``.*:``)."""
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    keys = [m[1] for line in out.splitlines() if (m := re.match(r"([a-z_][\w.]*)(?: = |  |$)", line))]
    assert len(keys) > 50, "blockbench list printed too few keys to be the listing"
    return keys


def test_the_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/ (at most {MAX_LINES})"
    long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > MAX_LINE_CHARS]
    assert not long, f"README.md lines over {MAX_LINE_CHARS} characters (line, length): {long}; wrap them"


def test_the_readme_test_command_is_what_ci_runs():
    """The README's test command, split at ``&&``, is the list of commands ``.ci/run`` runs."""
    readme = README.read_text()
    command = next(line for line in readme.splitlines() if "python -m pytest" in line and "&&" in line)
    readme_steps = [shlex.split(step) for step in command.split("&&")]
    ci_steps = [
        shlex.split(line)
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "set ", "cd "))
    ]
    assert readme_steps == ci_steps
    assert ["mkdocs", "build", "--strict"] in ci_steps


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md", "docs/contributing.md"])
def test_every_page_that_shows_the_test_command_shows_the_same(page):
    readme_command = next(line for line in README.read_text().splitlines() if "python -m pytest" in line)
    commands = [line for line in (REPO / page).read_text().splitlines() if "python -m pytest &&" in line]
    assert commands == [readme_command]


def test_the_readme_links_resolve():
    """Every relative link and image of the README names a file of the repository (the verdict picture
    aside, which ``blockbench report`` draws when the book is rerun), and every ``#anchor`` a heading."""
    readme = README.read_text()
    anchors = {
        re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", readme, flags=re.M)
    }
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if target.startswith(("http://", "https://")):
            continue
        if target.startswith("#"):
            assert target[1:] in anchors, f"README.md links to {target}, which is no heading of it"
        elif target != VERDICT_PICTURE:
            assert (REPO / target.split("#")[0]).exists(), f"README.md links to {target}, which does not exist"


def test_the_configuration_reference_lists_every_key_blockbench_list_lists(capsys):
    page = load_docs_module("gen_config_reference").reference_markdown()
    missing = [key for key in listed_keys(capsys) if f"`{key}`" not in page and f"`{key} = " not in page]
    assert not missing, f"docs/gen_config_reference.py leaves out {missing}"
    assert page.count("\n## ") >= 4  # a section per part of the config: seed, model, task, optimizer, trainer


def test_the_configuration_reference_shows_defaults_per_task(capsys):
    """A task key shows each task's default, as ``blockbench list`` does: ``task.seq_len`` is 64 for the
    embedded LM and 256 for the text LM (``blockbench list seq_len``)."""
    page = load_docs_module("gen_config_reference").reference_markdown()
    entry = page.split("`task.seq_len`", 1)[1].split("\n`", 1)[0]
    assert "**lm** = `64`" in entry and "**lm_text** = `256`" in entry


def test_the_margins_table_has_every_task_with_its_declared_margin():
    """The tasks page's table, read from the task classes, has a row per task with the margin it
    declares (the LM's relative 1%, BLEU's one point, accuracy's one point) and its saturation."""
    from blockbench.tasks import TASK_CONFIGS

    module = load_docs_module("gen_config_reference")
    assert module.MARGINS_MARKER in (DOCS / "tasks.md").read_text()
    rows = {line.split(" | ")[0].strip("| `"): line for line in module.margins_markdown().splitlines()[2:]}
    assert set(rows) == set(TASK_CONFIGS)
    assert "1% of the baseline's mean" in rows["lm"] and "0.03 nats of loss above the entropy floor" in rows["lm"]
    assert "± 1:" in rows["translation"] and "within 0.5 of the best value" in rows["translation"]
    assert "± 0.01:" in rows["vit"] and "never (no known floor)" in rows["lm_text"]


def test_the_matrix_files_page_documents_every_key_a_matrix_file_takes():
    headings = set(re.findall(r"^## (\w+)$", (DOCS / "matrix-files.md").read_text(), flags=re.M))
    missing = sorted(set(MatrixConfig.model_fields) - headings)
    assert not missing, f"docs/matrix-files.md has no section for the matrix keys {missing}"


def test_the_verdict_picture_note_replaces_the_marker_when_the_picture_is_missing(tmp_path):
    """Before the book is rerun, ``results/verdicts.png`` does not exist: the page says how to draw it
    instead of linking a missing file (which would fail the strict build); once it exists, the page
    shows it, linked relative to the page."""
    hook = load_docs_module("verdict_picture")

    class Config:
        config_file_path = str(tmp_path / "mkdocs.yml")

    class Page:
        class file:
            src_uri = "decisions/some-page.md"

    markdown = f"before\n\n{hook.MARKER}\n\nafter"
    missing = hook.on_page_markdown(markdown, Page, Config, None)
    assert hook.MARKER not in missing and "not drawn yet" in missing and "verdicts.png)" not in missing
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "verdicts.png").write_bytes(b"\x89PNG")
    shown = hook.on_page_markdown(markdown, Page, Config, None)
    assert "](../img/verdicts.png)" in shown and "not drawn yet" not in shown
    assert Path(hook.SITE_PATH) == Path("img/verdicts.png")


def _verdict_words(cell: str) -> str:
    """A table cell's verdict word: the bold one (``**worse** perplexity ...``), else the cell's first word."""
    bold = re.match(r"\s*\*{1,2}([a-z ]+?)\*{1,2}", cell)
    return (bold.group(1) if bold else cell.split()[0]).strip()


def _verdict_and_marks(cell: str) -> tuple[str, bool, bool]:
    """An index cell's verdict word, whether it is the weak form, whether the baseline swap marks it fragile."""
    return _verdict_words(cell), "possibly by less than the margin" in cell, "†" in cell


def test_the_readme_answer_table_says_what_the_index_of_verdicts_says():
    """Each row of the README's answer table names its index row in a comment (``<!-- matrix: variant -->``);
    its three verdicts must be the LM, translator and ViT verdicts of that row of results/README.md, each with
    its form (*weak*: possibly by less than the margin) and its fragile mark (†), so the
    table cannot go stale when the book is rerun and the index regenerated. A row the index shares between
    matrices (the same question asked of the same cells) is found under its first matrix."""
    index = {}
    for line in (REPO / "results" / "README.md").read_text().splitlines():
        found = re.match(
            r"\| \[(\w+)\]\(\w+/summary\.md\)(?:, \[\w+\]\(\w+/summary\.md\))* \| ([^|]+) \| [^|]+ "
            r"\| ([^|]+) \| ([^|]+) \| ([^|]+) \|",
            line,
        )
        if found:
            index[found.group(1), found.group(2).strip()] = [_verdict_and_marks(c) for c in found.groups()[2:]]
    rows = re.findall(
        r"^\| [^|]*<!-- (\w+): ([^>]+?) --> \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", README.read_text(), re.M
    )
    assert len(rows) >= 8, "the README's answer table lost its rows or their index comments"
    for matrix, variant, *verdicts in rows:
        assert (matrix, variant) in index, f"README row {matrix}: {variant} is not a row of results/README.md"
        readme = [(_verdict_words(v), "(weak)" in v, "†" in v) for v in verdicts]
        assert readme == index[matrix, variant], (matrix, variant)


def test_the_rule_s_version_is_the_date_of_the_last_entry_of_its_history():
    """A change to what decides a verdict bumps ``decide.RULE_VERSION`` (recorded in every analysis plan)
    and is told in verdict-rule.md's History: the two must name the same latest date."""
    from blockbench.report.decide import RULE_VERSION

    history = (REPO / "docs" / "decisions" / "verdict-rule.md").read_text().split("## History", 1)[1]
    dates = re.findall(r"^- (\d{4}-\d{2}-\d{2})", history, flags=re.MULTILINE)
    assert dates and max(dates) == RULE_VERSION, (dates, RULE_VERSION)


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_cpu_only_install_takes_the_pinned_torch(page):
    """A CPU build of another version than the pins would be replaced by the pinned CUDA build when
    blockbench itself is installed with ``-c constraints.txt``: the CPU line must pin through it too."""
    lines = [line for line in (REPO / page).read_text().splitlines() if "download.pytorch.org/whl/cpu" in line]
    assert lines, f"{page} lost its CPU-only install line"
    for line in lines:
        assert line.startswith("pip install -c constraints.txt torch torchvision "), line


#: an issue's number in prose: "issue", "Issue" or "issues", then the number, with or without a "#"
ISSUE_NUMBER = re.compile(r"\bissues? ?#?\d+", re.I)


def test_no_user_facing_text_names_an_issue():
    """Readers of the README, the docs, the results, the matrix files and the CLI's own code never saw
    the project's issue tracker: a rule named by its issue's number tells them nothing."""
    pages = [REPO / "README.md", REPO / "CONTRIBUTING.md"]
    for folder, pattern in (("docs", "*.md"), ("results", "*.md"), ("configs", "*.yaml"), ("blockbench", "*.py")):
        pages += sorted((REPO / folder).rglob(pattern))
    named = [f"{p.relative_to(REPO)}: {m.group()}" for p in pages for m in ISSUE_NUMBER.finditer(p.read_text())]
    assert not named, named


def test_no_test_names_an_issue():
    """A test says the behaviour it checks, in its name, docstring and comments: the reader of a failure
    needs what broke, not the number of the issue that once asked for it."""
    files = sorted((REPO / "tests").rglob("*.py"))
    named = [
        f"{p.relative_to(REPO)}:{n}: {m.group()}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        for m in ISSUE_NUMBER.finditer(line)
    ]
    assert not named, named


#: a duration in prose: ``62 s``, ``2.5 minutes``, ``1:02`` or ``0:01:02``
DURATION = re.compile(r"\b\d+(\.\d+)? ?(s|sec|seconds?|min|minutes?|h|hours?)\b|\b\d+:\d\d(:\d\d)?\b")
#: a quoted measurement, an h:mm:ss with its marker: left out of the prose checked for durations
QUOTED_DURATION = re.compile(r"\d+:\d\d:\d\d<!-- duration:\w+ -->")
#: the pages that say how long a run takes, and the measurement command that every such figure comes from
TIMED_PAGES = ("README.md", "docs/getting-started.md", "configs/matrix/*.yaml")


def _prose(path: Path) -> list[str]:
    """The lines of ``path`` a reader reads as text: a Markdown page without its code blocks and inline
    code (example output quotes its own times), a matrix file's comments."""
    text = QUOTED_DURATION.sub("", path.read_text())
    if path.suffix == ".yaml":
        return [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def benchmark_module(name: str):
    """A script of benchmarks/docs/ imported as the module it runs as."""
    return importlib.import_module(f"benchmarks.docs.{name}")


def test_every_duration_the_docs_quote_is_the_measured_one():
    """One source for how long things take: each page that says it quotes ``docs/durations.json``
    (written by ``python -m benchmarks.docs.durations``) through a marker, and states no other duration."""
    durations_module = benchmark_module("durations")
    record = json.loads((REPO / "docs" / "durations.json").read_text())
    assert record["command"] == "python -m benchmarks.docs.durations" and record["machine"] and record["measured"]
    assert durations_module.check(record["durations"]) == []
    pages = sorted({p for pattern in TIMED_PAGES for p in REPO.glob(pattern)})
    quoted = {name for p in pages for _, name in durations_module.quoted(p.read_text())}
    assert {"smoke_run", "smoke_estimate", "default_estimate", "example_estimate"} <= quoted
    bare = [
        f"{p.relative_to(REPO)}: {m.group()} in {line.strip()!r}"
        for p in pages
        for line in _prose(p)
        for m in DURATION.finditer(line)
    ]
    assert not bare, bare


def test_the_durations_script_rewrites_only_marked_durations_and_measures_the_readmes_example(tmp_path):
    durations = benchmark_module("durations")
    text = "about 0:00:00<!-- duration:smoke_run --> and 0:00:00<!-- duration:unknown --> and 1:02 plain"
    assert durations.requote(text, {"smoke_run": 128.4}) == (
        "about 0:02:08<!-- duration:smoke_run --> and 0:00:00<!-- duration:unknown --> and 1:02 plain"
    )
    assert durations.quoted(text) == [("0:00:00", "smoke_run"), ("0:00:00", "unknown")]
    example = durations.example_matrix(README.read_text(), tmp_path)
    matrix, cells = load_matrix(example)  # the README's own file, its base found from anywhere: every cell validates
    assert matrix.name == "my_norms" and "model.norm" in matrix.axes and len(cells) == 3 * 2 * 9  # seeds up to max
