"""The docs site's reference parts, written at build time from the code so that they can never drift
from it: the configuration reference, ``configuration.md``, from the same listing ``blockbench list``
prints (``blockbench.listing.load_listing``: every key of a run config, read from the pydantic config
classes), and the table of each task's declared margin of equivalence and saturation rule, which
replaces the marker :data:`MARGINS_MARKER` of a page (``tasks.md``).

Used two ways: as an mkdocs hook (``hooks:`` in ``mkdocs.yml``; :func:`on_files` adds the page to
the site without writing it into ``docs/``), and as a script, ``python docs/gen_config_reference.py``,
which prints the page. ``tests/test_docs.py`` checks that the page lists every key ``blockbench list``
lists and that the table has every task's margin.
"""

from __future__ import annotations

import html
from typing import Any

#: the page's path in the site, as ``mkdocs.yml``'s nav names it
PAGE = "configuration.md"
#: the line of a page that the table of the tasks' margins replaces
MARGINS_MARKER = "<!-- task-margins -->"

INTRO = """# Configuration reference

Every key a run config (`configs/base.yaml`, `configs/real.yaml`), a dotted override
(`blockbench train configs/base.yaml model.norm=rmsnorm`) or a matrix file's `overrides:`, `axes:`
and `tune:` accept, with its default, its type and its meaning. This page is generated when the site
is built (`docs/gen_config_reference.py`), from the listing `blockbench list` prints: in a terminal,
`blockbench list model` shows one section and `blockbench list WORD` the keys that mention a word.
The keys of a matrix file itself (`name`, `axes`, `seeds`, ...) are on [Matrix files](matrix-files.md).

A `task.*` key names the tasks that have it, each with its default: `task.name` picks the task (or a
preset of real data), and only that task's keys apply.
"""


def _text(text: str) -> str:
    """A description as Markdown text: HTML-escaped, and ``*`` kept literal (``model.*``)."""
    return html.escape(text, quote=False).replace("*", r"\*")


def _code(value: str) -> str:
    """A value as an inline code span, whatever backticks it holds."""
    fence = "``" if "`" in value else "`"
    return f"{fence}{value}{fence}" if fence == "`" else f"{fence} {value} {fence}"


def key_markdown(key: Any, value_text: Any) -> list[str]:
    """One key as a definition-list entry: ``key = default`` and its type, then its meaning (per task
    for a task key), then the names it accepts."""
    definitions = key.definitions
    kinds = dict.fromkeys(d.kind for d in definitions)
    if len(definitions) == 1 and definitions[0].owner is None:
        d = definitions[0]
        head = _code(f"{key.key} = {value_text(d.default)}")
        lines = [f"{head} &nbsp; *{_text(d.kind)}*", f":   {_text(d.description)}"]
    else:
        head = f"{_code(key.key)} &nbsp; *{_text(next(iter(kinds)))}*" if len(kinds) == 1 else _code(key.key)
        lines = [head]
        first = True
        for description in dict.fromkeys(d.description for d in definitions):
            same = [d for d in definitions if d.description == description]
            by_default: dict[tuple[str, str], list[str]] = {}
            for d in same:
                by_default.setdefault((value_text(d.default), d.kind), []).append(d.owner or "")
            defaults = "; ".join(
                f"**{_text(', '.join(owners))}** = {_code(value)}" + ("" if len(kinds) == 1 else f" *{_text(kind)}*")
                for (value, kind), owners in by_default.items()
            )
            lines.append(f"{':   ' if first else '    '}{defaults}: {_text(description)}")
            lines.append("")
            first = False
        lines.pop()
    if key.choices:
        lines += [""] + [
            f"    - {_code(choice.name)}" + (f": {_text(choice.description)}" if choice.description else "")
            for choice in key.choices
        ]
    return [*lines, ""]


def reference_markdown() -> str:
    """The whole page: the introduction, then each section's title and keys, as ``blockbench list``
    orders them."""
    from blockbench.keys import value_text
    from blockbench.listing import load_listing

    listing = load_listing()
    lines, section = [INTRO], None
    for key in listing.keys:
        if key.section != section:
            section = key.section
            lines += [f"## {section}", ""]
            if section in listing.titles:
                lines += [_text(listing.titles[section][:1].upper() + listing.titles[section][1:]) + ".", ""]
        lines += key_markdown(key, value_text)
    return "\n".join(lines)


def margins_markdown() -> str:
    """A table of every task's headline metric, its margin of practical equivalence and when it is
    saturated, each with the reason the task declares (``TaskConfig.margin``, ``.saturation``)."""
    from blockbench.tasks import TASK_CONFIGS

    lines = [
        "| task | headline metric | margin of equivalence | saturated (no verdict) when both sides are |",
        "|---|---|---|---|",
    ]
    for name, task in TASK_CONFIGS.items():
        margin, saturation = task.margin, task.saturation
        amount = f"{margin.value:.0%} of the baseline's mean" if margin.relative else f"± {margin.value:g}"
        if saturation is None:
            saturated = "never (no known floor)"
        else:
            where = "of the best value" if saturation.of == "best" else "nats of loss above the entropy floor"
            saturated = f"within {saturation.distance:g} {where}: {_text(saturation.reason)}"
        cells = [f"`{name}`", task.metrics[0].name, f"{amount}: {_text(margin.reason)}", saturated]
        lines.append("| " + " | ".join(cell.replace("|", "&#124;") for cell in cells) + " |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: put the table of the tasks' margins where a page has :data:`MARGINS_MARKER`."""
    return markdown.replace(MARGINS_MARKER, margins_markdown()) if MARGINS_MARKER in markdown else markdown


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated page to the site's files (nothing is written into ``docs/``)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=reference_markdown()))
    return files


if __name__ == "__main__":
    print(reference_markdown())
