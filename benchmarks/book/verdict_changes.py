"""Which verdicts of the earlier book changed in the rerun, and whether the rule or the cells changed
them: the table behind the README's "What we found".

    python -m benchmarks.book.verdict_changes --out results/verdict_changes.md

Three readings of every question (task x variant, at a budget, of a matrix), each from the
``summary.csv`` files of ``results/`` at one point of git history:

- **earlier**: the earlier book as it was reported (``--earlier``, default 551add2): Holm-adjusted
  p < 0.05 over the matrix's whole family read **better** or **worse** (the difference's direction),
  a larger p **n.s.**, and no test **untested**;
- **same cells, new rule** (``--redecided``, default d712b97): those very cells decided by the rule
  of the current rule (one question per task x variant, four verdicts, docs/decisions/verdict-rule.md);
- **rerun** (the working tree's ``results/``): the book's cells retrained under the new rules (each
  variant tuned, seeds that draw the data, seeds added in rounds). A matrix whose numbers equal its
  redecided ones has not been rerun yet and says so.

So a change from the first to the second column is the rule's doing, and one from the second to the
third is the new cells'. Questions of the earlier book that the rerun no longer asks (the 1,500-step
budget that sat at the ceiling, the flagship's tuned copy) are listed as dropped. The summaries' CSV
is read, not the index, because it has the headline metric's row per question in every version.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks import ROOT

EARLIER, REDECIDED = "551add2", "d712b97"
#: the earlier words that the new rule says in its own: not a change of verdict
SAME_AS = {"n.s.": "undecided", "untested": "saturated"}
#: each :attr:`Change.cause` as the page words it, in the order it lists them
CAUSE_WORDS = {
    "rule": "the rule alone (the same cells)",
    "cells": "the new cells alone",
    "rule, then cells": "both",
    "unchanged": "unchanged",
    "new question": "new questions",
    "dropped from the book": "dropped from the book",
}
STEPS_AXIS = "max_steps="


@dataclass(frozen=True)
class Question:
    """One question of a matrix: a task, a variant against its baseline, at a step budget."""

    matrix: str
    task: str
    variant: str  # without its budget (``ffn=swiglu``, not ``ffn=swiglu,max_steps=300``)
    baseline: str
    steps: str


@dataclass(frozen=True)
class Reading:
    """A question's verdict in one version of the book, with what the reader needs beside it."""

    verdict: str
    metric: str  # the headline metric the verdict is on
    difference: str  # the headline difference with its interval, as the CSV has it
    seeds: str  # the seeds that decided it (and how many of the variant's did not learn)
    means: tuple[str, ...]  # every mean of the question's rows: equal means = the same cells


@dataclass(frozen=True)
class Change:
    question: Question
    earlier: Reading | None
    redecided: Reading | None
    rerun: Reading | None
    rerun_done: bool  # False: the rerun column still holds the earlier cells (not rerun yet)

    @property
    def cause(self) -> str:
        """What moved the verdict: the rule (same cells), the cells (same rule), both, or nothing (an
        earlier n.s. that now reads undecided, or untested now saturated, is no change)."""
        if self.rerun is None:
            return "dropped from the book"
        if self.earlier is None:
            return "new question"
        earlier = SAME_AS.get(self.earlier.verdict, self.earlier.verdict)
        by_rule = self.redecided is not None and self.redecided.verdict != earlier
        by_cells = self.redecided is not None and self.rerun.verdict != self.redecided.verdict
        return {(True, True): "rule, then cells", (True, False): "rule", (False, True): "cells"}.get(
            (by_rule, by_cells), "unchanged"
        )


def _strip_steps(variant: str) -> str:
    return ",".join(part for part in variant.split(",") if not part.startswith(STEPS_AXIS))


def _question(matrix: str, row: dict[str, str]) -> Question:
    """The question a summary.csv row belongs to, its variants without their budget."""
    return Question(
        matrix, row["task"], _strip_steps(row["variant"]), _strip_steps(row["baseline_variant"]), row["steps"]
    )


def _number(text: str, digits: int = 3) -> str:
    return f"{float(text):+.{digits}g}" if text else "n/a"


def earlier_verdict(row: dict[str, str]) -> str:
    """The earlier book's verdict of a headline row: better/worse where its Holm-adjusted p passed."""
    if not row.get("diff_p_holm"):
        return "untested"
    return row["direction"] if row["significant"] == "True" else "n.s."


def read_book(csvs: dict[str, str], *, verdict_rows: dict[Question, str] | None = None) -> dict[Question, Reading]:
    """Every question of a book from its matrices' ``summary.csv`` texts (matrix -> text). A book of the
    new rule marks each question's headline row with a verdict; the earlier book had none, so its
    headline metric is taken from ``verdict_rows`` (question -> metric, read from the same cells under
    the new rule) and its verdict from the Holm test."""
    book: dict[Question, Reading] = {}
    for matrix, text in csvs.items():
        rows = list(csv.DictReader(io.StringIO(text)))
        for row in rows:
            if row["variant"] == row["baseline_variant"]:
                continue
            question = _question(matrix, row)
            if verdict_rows is None:
                if not row.get("verdict"):
                    continue
                verdict = row["verdict"]
                low, high = row.get("decision_ci_low", ""), row.get("decision_ci_high", "")
                difference = row["decision_difference"] or row["diff_vs_baseline"]
            else:
                if verdict_rows.get(question) != row["metric"]:
                    continue
                verdict = earlier_verdict(row)
                low, high, difference = row.get("diff_ci_low", ""), row.get("diff_ci_high", ""), row["diff_vs_baseline"]
            interval = f" [{_number(low)}, {_number(high)}]" if low and high else ""
            # the seeds the decision used where the CSV says (a question stops at its first final look)
            seeds = f"{row.get('decision_seeds') or row['seeds']} seeds"
            if row.get("seeds_did_not_learn", "0") not in ("", "0"):
                seeds += f", {row['seeds_did_not_learn']} did not learn"
            sides = (row["variant"], row["baseline_variant"])
            means = tuple(r["mean"] for r in rows if r["task"] == row["task"] and r["variant"] in sides)
            book[question] = Reading(verdict, row["metric"], f"{_number(difference)}{interval}", seeds, means)
    return book


def compare(earlier: dict[str, str], redecided: dict[str, str], rerun: dict[str, str]) -> list[Change]:
    """The three readings of every question asked in any of the three books, in the rerun's order."""
    old_cells = read_book(redecided)
    before = read_book(earlier, verdict_rows={q: reading.metric for q, reading in old_cells.items()})
    after = read_book(rerun)
    rerun_matrices = {
        q.matrix for q, reading in after.items() if q not in old_cells or old_cells[q].means != reading.means
    }
    questions = list(dict.fromkeys([*after, *old_cells, *before]))
    return [
        Change(q, before.get(q), old_cells.get(q), after.get(q), q.matrix in rerun_matrices or q not in old_cells)
        for q in questions
    ]


def asks_questions(matrix: str) -> bool:
    """False for a matrix file that says ``verdicts: false`` (the demonstration, the empirical null),
    which the index lists apart; a matrix no longer in ``configs/matrix`` asked questions."""
    path = ROOT / "configs" / "matrix" / f"{matrix}.yaml"
    return not path.exists() or yaml.safe_load(path.read_text()).get("verdicts", True) is not False


def book_at(revision: str | None, results: str = "results") -> dict[str, str]:
    """matrix -> its summary.csv text, in the working tree (``None``) or at a git revision; only the
    matrices that ask questions."""
    if revision is None:
        return {
            p.parent.name: p.read_text()
            for p in sorted((ROOT / results).glob("*/summary.csv"))
            if asks_questions(p.parent.name)
        }
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", revision, results], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    paths = [p for p in listing if p.endswith("/summary.csv") and p.count("/") == 2 and asks_questions(p.split("/")[1])]
    return {
        p.split("/")[1]: subprocess.run(
            ["git", "show", f"{revision}:{p}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        for p in paths
    }


def _cell(reading: Reading | None) -> str:
    if reading is None:
        return "—"
    return f"**{reading.verdict}** {reading.difference} ({reading.seeds})"


def report(changes: list[Change], *, earlier: str, redecided: str, head: str) -> str:
    """The markdown page: counts of each move, then one row per question."""
    asked = [c for c in changes if c.rerun is not None and c.earlier is not None]
    moves = Counter((c.earlier.verdict, c.rerun.verdict) for c in asked if c.rerun_done)
    causes = Counter(c.cause for c in changes if c.rerun_done or c.rerun is None)
    pending = sorted({c.question.matrix for c in changes if c.rerun is not None and not c.rerun_done})
    lines = [
        "# What the rerun changed",
        "",
        f"Written by `python -m benchmarks.book.verdict_changes --out results/verdict_changes.md` at {head}. Each",
        "question (task x variant against its baseline, at a step budget) read three ways: the **earlier** book",
        f"as it was reported ({earlier}: Holm-adjusted p < 0.05 over the whole matrix, else n.s.), the **same cells**",
        f"decided by the new rule ({redecided}), and the **rerun** (the cells retrained under the current rules, in",
        "`results/`). A change between the first two is the rule's doing; between the last two, the new cells'",
        "(each variant at its own tuned rate, seeds that draw the data, seeds added in rounds). An earlier",
        "n.s. that reads undecided now (or untested, now saturated) is the same answer in the new words.",
        "",
        "Earlier verdict → rerun verdict, over the questions rerun so far:",
        "",
        "| earlier | rerun | questions |",
        "|---|---|---|",
        *(f"| {a} | {b} | {n} |" for (a, b), n in sorted(moves.items())),
        "",
        "What moved them (questions rerun so far, and those dropped): "
        + "; ".join(f"{CAUSE_WORDS[cause]}: {causes[cause]}" for cause in CAUSE_WORDS if causes[cause])
        + ".",
        "",
    ]
    if pending:
        lines += [f"Not rerun yet (the rerun column still holds the earlier cells): {', '.join(pending)}.", ""]
    lines += [
        "| matrix | variant vs baseline | task | steps | earlier | same cells, new rule | rerun | changed by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in changes:
        q = c.question
        rerun = _cell(c.rerun) if c.rerun_done or c.rerun is None else "not rerun yet"
        cause = c.cause if c.rerun_done or c.rerun is None else "—"
        lines.append(
            f"| {q.matrix} | {q.variant} vs {q.baseline} | {q.task} | {q.steps} | {_cell(c.earlier)} | "
            f"{_cell(c.redecided)} | {rerun} | {cause} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--earlier", default=EARLIER, help="git revision of the earlier book as reported")
    parser.add_argument("--redecided", default=REDECIDED, help="git revision of its cells under the new rule")
    parser.add_argument("--out", type=Path, help="write the page here (default: print it)")
    args = parser.parse_args()
    head = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    page = report(
        compare(book_at(args.earlier), book_at(args.redecided), book_at(None)),
        earlier=args.earlier,
        redecided=args.redecided,
        head=head,
    )
    if args.out:
        args.out.write_text(page)
    else:
        print(page, end="")


if __name__ == "__main__":
    main()
