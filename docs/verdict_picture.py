"""The verdict picture in the docs site: ``results/verdicts.png`` (drawn by ``blockbench report``, beside
``results/README.md``) lives outside ``docs/``, and may not exist yet (before the book is rerun). This
mkdocs hook copies it into the site as ``img/verdicts.png`` when it exists, and replaces the marker
line :data:`MARKER` of a page with the picture, or, when it does not exist, with a note that says how
to draw it. So the strict build never fails on a missing picture and never shows a broken one.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

#: the line a page writes where the picture goes (an HTML comment: invisible if the hook is absent)
MARKER = "<!-- verdict-picture -->"
#: the picture, relative to the repository root (the folder of mkdocs.yml)
SOURCE = Path("results") / "verdicts.png"
#: where the site holds it
SITE_PATH = "img/verdicts.png"
CAPTION = (
    "Every comparison of the book, a panel per model family: each variant's mean difference from its "
    "baseline in the metric's own unit (perplexity, BLEU, accuracy), the grey band ± the margin of "
    "practical equivalence; linear within the margin, logarithmic beyond. Thin line: the (1 − α_k) "
    "interval; thick line: the (1 − 2α_k) equivalence interval (α_k: 0.05 split over the question's "
    "planned looks); colour: the verdict; hollow: better or worse possibly by less than the margin; "
    "diamond: decided by a rank test. Drawn by `blockbench report --index results` as "
    "`results/verdicts.png`, at the top of `results/README.md`; each matrix's own is "
    "`plots/verdicts.png` in its summary."
)
MISSING = (
    '!!! note "The verdict picture is not drawn yet"\n'
    "    `blockbench report` is to draw it as `results/verdicts.png`, beside `results/README.md`; it "
    "appears here once the rerun book is committed with it."
)


def _source(config: Any) -> Path:
    return Path(config.config_file_path).resolve().parent / SOURCE


def on_files(files: Any, config: Any) -> Any:
    """Add ``results/verdicts.png`` to the site as :data:`SITE_PATH`, where it exists."""
    from mkdocs.structure.files import File

    if _source(config).is_file():
        files.append(File.generated(config, SITE_PATH, abs_src_path=str(_source(config))))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Put the picture (or the note that it is missing) where the page has :data:`MARKER`."""
    if MARKER not in markdown:
        return markdown
    if _source(config).is_file():
        link = posixpath.relpath(SITE_PATH, posixpath.dirname(page.file.src_uri) or ".")
        block = f"![The verdicts of the book]({link})\n\n*{CAPTION}*"
    else:
        block = MISSING
    return markdown.replace(MARKER, block)
