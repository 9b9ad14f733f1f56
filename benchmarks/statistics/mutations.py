"""Mutation testing of the verdict code: does some test fail when the code that decides a verdict is
wrong in one plausible way?

    python -m benchmarks.statistics.mutations                  # every mutation against tests/report and tests/matrix
    python -m benchmarks.statistics.mutations --list           # the mutations' names and what each breaks
    python -m benchmarks.statistics.mutations --only tost-at-half-alpha prob-interval-at-90
    python -m benchmarks.statistics.mutations --only tost-at-half-alpha --tests "tests/report/test_decide.py -k tost"
    python -m benchmarks.statistics.mutations --check          # only show which blockbench the copy imports
    python -m benchmarks.statistics.mutations --out results/mutations.md   # the committed result (about 30 minutes)

Each mutation is one exact edit of one file (its original text, found exactly once, and the
replacement). The repository is copied once to a temporary folder (``runs/``, caches and the run
artefacts git ignores under ``results/`` left out; the committed book's records, which tests read, and
``.git``, which a cell's record of its commit needs, are copied); each mutation is applied to the copy
alone, the test selection is run there, and the copy's file is restored before the next. The working
tree is never edited, so a matrix running from it meanwhile imports the code as it is.

The copy must import its own code, not the editable install's (which points at this checkout): the
tests run with the copy as their working directory and first on ``PYTHONPATH``, and the copy also
holds ``models/`` and ``tasks/`` at ``blockbench/models`` and ``blockbench/tasks``, where a wheel
installs them, so that ``blockbench.models`` and ``blockbench.tasks`` resolve inside the copy as well.
The script checks this before it runs anything (``--check`` prints it) and stops if any of the three
would come from elsewhere. Bytecode is not written (``PYTHONDONTWRITEBYTECODE``): an edit and its
undo within one second, of the same size, could otherwise be read back from a stale cache.

First the unmutated copy runs the selection (skip it with ``--no-baseline``): a mutation counts as
caught only if the selection passes without it. Then the table: each mutation, and the first test
that failed with it (``caught``) or ``SURVIVED``. The exit status is 1 if any mutation survived, 2
if the baseline failed or a mutation's original text was not found exactly once (the code moved on:
update the mutation).

Cost: a caught mutation stops at its first failure (``-x``); a surviving one runs the whole
selection. ``--tests`` narrows the selection (one string of pytest paths and options, e.g. one test
file, or ``-k`` an expression).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import ROOT
from benchmarks.harness import command_line, report_header

#: left out of the copy: user runs and caches. The committed book (results/, its records and summaries,
#: 33 MB) is copied, since tests read it (one question, one verdict across its matrices), and so is .git
#: (20 MB): a cell records its commit, and a summary's line of the code that made it needs one
EXCLUDED = {"runs", ".pytest_cache", ".ruff_cache", ".benchmarks", "__pycache__", "site"}
#: the run artefacts git ignores inside results/ (none in a clone; large where a matrix ran in place)
ARTEFACTS = {"tb", "tb_tune", "checkpoints", "train.log", ".lock", "lightning_logs"}
#: the folders the install maps into the blockbench namespace (pyproject's package-dir)
MAPPED = {"models": "blockbench/models", "tasks": "blockbench/tasks"}
DEFAULT_TESTS = ("tests/report", "tests/matrix")
#: pytest's options before the selection (whose own, e.g. ``-n 0``, come later and win)
PYTEST = ("-q", "-x", "-n", "auto", "-p", "no:cacheprovider")


@dataclass(frozen=True)
class Mutation:
    """One plausible bug: ``original`` (found exactly once in ``file``) replaced by ``replacement``."""

    name: str
    file: str
    original: str
    replacement: str
    what: str


MUTATIONS = (
    Mutation(
        "rank-direction-ignores-lower-is-better",
        "blockbench/report/decide.py",
        "np.where(tests.p_value < alpha, _direction(tests.sign, higher_is_better), UNDECIDED)",
        "np.where(tests.p_value < alpha, _direction(tests.sign, True), UNDECIDED)",
        "a rank-decided question reads larger values as better whatever the metric's direction",
    ),
    Mutation(
        "tost-at-half-alpha",
        "blockbench/report/decide.py",
        "equivalent = moments.spread & (tests.p_equivalence < alpha)",
        "equivalent = moments.spread & (tests.p_equivalence < alpha / 2)",
        "equivalence is declared by TOST at α_k/2 instead of α_k",
    ),
    Mutation(
        "tuning-chooses-by-last-seed",
        "blockbench/matrix/tuning.py",
        "ranked = rank(rungs[-1], self.seeds[: len(rungs)], self.higher_is_better)",
        "ranked = rank(rungs[-1], self.seeds[len(rungs) - 1 : len(rungs)], self.higher_is_better)",
        "the tuned value is the best on the last tuning seed, not the best mean over the last rung's seeds",
    ),
    Mutation(
        "unpaired-size-swapped",
        "blockbench/report/stats.py",
        '" vs ".join(str(k) for k in n) + " seeds"',
        '" vs ".join(str(k) for k in reversed(n)) + " seeds"',
        "an unpaired look's verdict line prints the baseline's seed count first",
    ),
    Mutation(
        "prob-interval-at-90",
        "blockbench/report/decide.py",
        "PROB_LEVEL = 0.95",
        "PROB_LEVEL = 0.90",
        "P(better)'s bootstrap interval is a 90% one",
    ),
    Mutation(
        "t-direction-flipped",
        "blockbench/report/decide.py",
        "np.where(rejects & agrees, _direction(moments.mean, higher_is_better), UNDECIDED)",
        "np.where(rejects & agrees, _direction(-moments.mean, higher_is_better), UNDECIDED)",
        "a t-decided difference reads in the wrong direction (the sign of variant - baseline flipped)",
    ),
    Mutation(
        "difference-p-one-sided",
        "blockbench/report/decide.py",
        "p_value = 2 * t.sf(np.abs(moments.mean) / se, moments.dof)",
        "p_value = t.sf(np.abs(moments.mean) / se, moments.dof)",
        "the difference test's p-value is one-sided",
    ),
    Mutation(
        "difference-interval-one-sided-quantile",
        "blockbench/report/decide.py",
        "half = t.ppf(1 - alpha / 2, moments.dof) * se",
        "half = t.ppf(1 - alpha, moments.dof) * se",
        "the difference's interval is the (1 - 2α_k) one",
    ),
    Mutation(
        "alpha-not-split-over-looks",
        "blockbench/report/decide.py",
        "return self.alpha / len(self.sizes)",
        "return self.alpha",
        "every look spends the whole α (no Bonferroni over the looks)",
    ),
    Mutation(
        "last-look-off-by-one",
        "blockbench/report/decide.py",
        "return len(self.sizes) == 1 or n >= self.sizes[-1]",
        "return len(self.sizes) == 1 or n > self.sizes[-1]",
        "the last planned look is not taken as the last",
    ),
    Mutation(
        "welch-dof-off-by-one",
        "blockbench/report/decide.py",
        "(var_a**2 / (n_a - 1) + var_b**2 / (n_b - 1))",
        "(var_a**2 / n_a + var_b**2 / n_b)",
        "Welch-Satterthwaite's degrees of freedom divide by n instead of n - 1",
    ),
    Mutation(
        "rank-p-one-sided",
        "blockbench/report/ranks.py",
        "2 * np.minimum(at_most, at_least) / len(null_statistics)",
        "np.minimum(at_most, at_least) / len(null_statistics)",
        "the exact rank tests' p-values are one-sided",
    ),
    Mutation(
        "unpaired-n-counts-the-variant-twice",
        "blockbench/report/decide.py",
        "n = (len(a),) if paired else (len(a), len(b))",
        "n = (len(a),) if paired else (len(a), len(a))",
        "an unpaired decision records the variant's seed count for both sides",
    ),
    Mutation(
        "form-read-from-the-far-end",
        "blockbench/report/decide.py",
        "(self.difference > 0 and low > self.margin)",
        "(self.difference > 0 and high > self.margin)",
        "a better verdict is called better by more than the margin from its interval's far end",
    ),
    Mutation(
        "not-learned-on-one-side",
        "blockbench/report/headroom.py",
        "if any(share is None or share >= NOT_LEARNED_SHARE for share in shares):",
        "if all(share is None or share >= NOT_LEARNED_SHARE for share in shares):",
        "a comparison is not learned when one side alone stayed near the trivial baseline",
    ),
    Mutation(
        "csv-seeds-sorted",
        "blockbench/report/section.py",
        '" vs ".join(map(str, decision.n))',
        '" vs ".join(map(str, sorted(decision.n)))',
        "summary.csv gives an unpaired look's sizes smaller first, not variant first",
    ),
    Mutation(
        "tuning-score-is-last-trial",
        "blockbench/matrix/tuning.py",
        "return statistics.fmean(t.score for t in trials)  # type: ignore[misc]",
        "return trials[-1].score",
        "a candidate's score over several tuning seeds is its last seed's",
    ),
    Mutation(
        "typical-seed-ignored",
        "blockbench/report/decide.py",
        "agrees = True if prob_better is None else typical_agrees(moments.mean, prob_better, higher_is_better)",
        "agrees = True",
        "better or worse is given where the typical seed (P(better)) points the other way",
    ),
    Mutation(
        "rank-test-only-for-mixed-sides",
        "blockbench/report/ranks.py",
        "return np.any([np.asarray(failed, dtype=bool).any(axis=-1) for failed in sides], axis=0)",
        "return np.any([np.asarray(f, dtype=bool).any(axis=-1) & ~np.asarray(f, dtype=bool).all(axis=-1) "
        "for f in sides], axis=0)",
        "a side whose seeds all failed goes to the t test, not the rank test",
    ),
    Mutation(
        "extension-cap-off-by-one",
        "blockbench/matrix/tuning.py",
        "if beyond < EXTENSION_STEPS and following not in tried and following > 0:",
        "if beyond <= EXTENSION_STEPS and following not in tried and following > 0:",
        "the tuner adds one value more past a grid's end than its cap allows",
    ),
    Mutation(
        "extension-ratio-inverted",
        "blockbench/matrix/tuning.py",
        "beyond, ratio = sum(v < ends[0] for v in tried), ends[0] / ends[1]",
        "beyond, ratio = sum(v < ends[0] for v in tried), ends[1] / ends[0]",
        "a choice at the lowest value extends the grid upwards, into values already tried",
    ),
    Mutation(
        "wrong-split-counted",
        "blockbench/report/results.py",
        'return not isinstance(task, dict) or task.get("eval_split", VALIDATION_SPLIT) == VALIDATION_SPLIT',
        "return True",
        "a reported cell scored on the tuning split counts in the statistics",
    ),
    Mutation(
        "plan-flag-misses-mixed-cells",
        "blockbench/report/plans.py",
        "if set(under) <= {book.current}:",
        "if book.current in under:",
        "a verdict with some cells under an earlier plan is not flagged when others started under the current one",
    ),
)


def copy_tree(destination: Path) -> Path:
    """The repository copied to ``destination`` without :data:`EXCLUDED`, with :data:`MAPPED` placed inside
    the package as well (where a wheel puts them); returns the copy's root."""
    root = destination / ROOT.name

    def ignore(folder: str, names: list[str]) -> set[str]:
        top = Path(folder) == ROOT
        book = Path(folder).is_relative_to(ROOT / "results")
        return {
            n
            for n in names
            if n == "__pycache__"
            or (top and (n in EXCLUDED or n.endswith(".egg-info")))
            or (book and (n in ARTEFACTS or n.endswith(".ckpt")))
        }

    shutil.copytree(ROOT, root, ignore=ignore, symlinks=True)
    for source, target in MAPPED.items():
        shutil.copytree(root / source, root / target, ignore=shutil.ignore_patterns("__pycache__"))
    if (ROOT.parent / "shared").is_dir():  # the data sets beside the repository, as tests/conftest.py finds them
        (destination / "shared").symlink_to(ROOT.parent / "shared")
    return root


def environment(root: Path) -> dict[str, str]:
    """The environment the copy's tests run in: the copy first on the path, no bytecode written."""
    path = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def imported_from(root: Path) -> dict[str, str]:
    """Where the copy's python imports blockbench, blockbench.models and blockbench.tasks from."""
    code = (
        "import blockbench, blockbench.models, blockbench.tasks\n"
        "for m in (blockbench, blockbench.models, blockbench.tasks): print(m.__name__, m.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=environment(root), capture_output=True, text=True, check=True
    )
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def run_tests(root: Path, tests: list[str], timeout: float, show: bool = False) -> tuple[bool, str, float]:
    """Run pytest on ``tests`` in the copy: (passed, the first failing test or why it stopped, seconds);
    ``show`` prints the failure's ``E`` lines (what the failing assertion saw)."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *PYTEST, *tests],
            cwd=root,
            env=environment(root),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s", time.monotonic() - start
    seconds = time.monotonic() - start
    if done.returncode == 0:
        return True, "", seconds
    if show:
        print("\n".join(f"      {line}" for line in done.stdout.splitlines() if line.startswith("E "))[:3000])
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, flags=re.MULTILINE)
    return False, failed[0] if failed else f"pytest exit {done.returncode}: {done.stdout.strip()[-300:]}", seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutations only (see --list)")
    parser.add_argument(
        "--tests",
        default=" ".join(DEFAULT_TESTS),
        help="the pytest selection, one string of paths and options (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one pytest run may take (default 1800)")
    parser.add_argument("--show", action="store_true", help="print what the failing assertion of each mutation saw")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated copy")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--check", action="store_true", help="only show which blockbench the copy imports")
    parser.add_argument("--out", help="also write the table as markdown here (results/mutations.md), with its command")
    args = parser.parse_args(argv)

    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:40} {m.file}: {m.what}")
        return 0
    by_name = {m.name: m for m in MUTATIONS}
    unknown = [name for name in args.only or [] if name not in by_name]
    if unknown:
        parser.error(f"unknown mutation {', '.join(unknown)}; --list names them")
    chosen = [by_name[name] for name in args.only] if args.only else list(MUTATIONS)
    stale = [m.name for m in chosen if (ROOT / m.file).read_text().count(m.original) != 1]
    if stale:
        print(
            f"the original text of {', '.join(stale)} is not found exactly once: update the mutation", file=sys.stderr
        )
        return 2

    with tempfile.TemporaryDirectory(prefix="mutations-") as folder:
        root = copy_tree(Path(folder))
        sources = imported_from(root)
        for name, file in sources.items():
            print(f"{name} imported from {file}")
        outside = [name for name, file in sources.items() if not Path(file).resolve().is_relative_to(root.resolve())]
        if outside:
            print(f"{', '.join(outside)} would not come from the copy {root}: stopping", file=sys.stderr)
            return 2
        if args.check:
            return 0
        tests = shlex.split(args.tests)
        print(f"tests: {args.tests}")
        if not args.no_baseline:
            passed, failure, seconds = run_tests(root, tests, args.timeout)
            print(f"baseline (no mutation): {'passes' if passed else 'FAILS: ' + failure} ({seconds:.0f} s)")
            if not passed:
                return 2
        rows = []
        for m in chosen:
            path = root / m.file
            text = path.read_text()
            path.write_text(text.replace(m.original, m.replacement, 1))
            try:
                passed, failure, seconds = run_tests(root, tests, args.timeout, args.show)
            finally:
                path.write_text(text)
            rows.append((m.name, "SURVIVED" if passed else f"caught by {failure}", seconds))
            print(f"  {m.name}: {rows[-1][1]} ({seconds:.0f} s)", flush=True)

    width = max(len(name) for name, _, _ in rows)
    print(f"\n{'mutation':{width}}  {'seconds':>7}  result")
    for name, result, seconds in rows:
        print(f"{name:{width}}  {seconds:7.0f}  {result}")
    survived = sum(result == "SURVIVED" for _, result, _ in rows)
    print(f"\n{len(rows) - survived} of {len(rows)} caught" + (f", {survived} SURVIVED" if survived else ""))
    if args.out:
        write_markdown(Path(args.out), rows, args.tests, [m for m in chosen], argv)
    return 1 if survived else 0


def write_markdown(
    path: Path, rows: list[tuple[str, str, float]], tests: str, chosen: list[Mutation], argv: list[str] | None
) -> None:
    """The table as ``path`` (markdown): the command, date, code commit and machine, then each mutation,
    what it breaks and the first test that caught it."""
    what = {m.name: f"`{m.file}`: {m.what}" for m in chosen}
    survived = sum(result == "SURVIVED" for _, result, _ in rows)
    lines = [
        *report_header("Mutation check of the verdict code", command_line(__spec__.name, argv)),
        "",
        "Each mutation is one plausible bug in the code that decides a verdict, applied alone to a copy of the "
        f"repository; the tests `{tests}` must fail with it (`benchmarks/statistics/mutations.py` says how).",
        "",
        f"**{len(rows) - survived} of {len(rows)} caught**" + (f", {survived} survived" if survived else "") + ".",
        "",
        "| mutation | what it breaks | result | seconds |",
        "|---|---|---|---:|",
        *(f"| `{name}` | {what[name]} | {result} | {seconds:.0f} |" for name, result, seconds in rows),
        "",
    ]
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
