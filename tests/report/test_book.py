"""The book's rows (``blockbench.report.book``) and what every verdict line says of its numbers: one row
per distinct question, however many matrices ask it of the same cells; the two forms of a better or worse
verdict (by more than the margin, or possibly by less); the seeds each number was computed over; and
comparisons that neither side learned, which get no verdict. Hand-written matrix folders (``test_verdicts``'s
helpers) and hand-built decisions, every expected number computed here (scipy's t distribution)."""

from __future__ import annotations

import math
import statistics

import pytest
import yaml
from scipy import stats as scipy_stats
from test_verdicts import MARGINS, POST, PRE, ROUND_PRE, _hand, _lm_cells, _questions, _row, _write_matrix

from blockbench.report.analysis import analyze
from blockbench.report.book import Index, MatrixVerdicts, book_rows, distinct_questions
from blockbench.report.decide import BEYOND_MARGIN, WITHIN_MARGIN, Decision
from blockbench.report.differences import comparisons
from blockbench.report.forest import book_forest_rows, forest_rows
from blockbench.report.headroom import NOT_LEARNED_SHARE, share_of_the_way
from blockbench.report.index import write_index
from blockbench.report.summary import write_report
from blockbench.tasks import TASK_CONFIGS

SANDWICH = "norm_placement=sandwich"
ROUNDS = {"min": 3, "max": 9, "step": 3}
AXES = {"task": ["lm"], "model.norm_placement": ["pre", "post", "sandwich"]}
#: post-norm far worse than pre-norm at 3 pairs (decided at the first look); sandwich undecided there, so the
#: baseline of a matrix that has sandwich trains 6 seeds, past post-norm's look
POST_LM = [7.60, 7.72, 7.65]
SANDWICH_LM = [7.10, 6.95, 7.08, 7.00, 7.02, 6.99]


def _comparisons(matrix_dir):
    return [c for a in analyze(matrix_dir)[2] for c in comparisons(a)]


# one row per question -----------------------------------------------------------------------------------


def test_a_question_several_matrices_ask_of_the_same_cells_is_one_row_and_counted_once(tmp_path):
    """``wide`` asks post- vs pre-norm and sandwich vs pre-norm (its baseline trains 6 seeds for sandwich's
    undecided question); ``flagship`` asks post- vs pre-norm alone on copies of the same cells (3 seeds of
    pre-norm). Post-norm's question is decided at its first look, on the same 3 pairs in both: one row that
    lists both matrices, one question in the counts and one row in the book's picture. A third matrix with the
    same names but other records (``other``: different values) asks another question, and stays apart."""
    _write_matrix(
        tmp_path, "wide", _lm_cells(pre=ROUND_PRE[:6], post=POST_LM, sandwich=SANDWICH_LM), PRE, axes=AXES, seeds=ROUNDS
    )
    two = {"task": ["lm"], "model.norm_placement": ["pre", "post"]}
    _write_matrix(tmp_path, "flagship", _lm_cells(pre=ROUND_PRE[:3], post=POST_LM), PRE, axes=two, seeds=ROUNDS)
    _write_matrix(tmp_path, "other", _lm_cells(pre=ROUND_PRE[:3], post=[7.5, 7.6, 7.7]), PRE, axes=two, seeds=ROUNDS)
    wide, flagship = (_questions(tmp_path / m)[POST] for m in ("wide", "flagship"))
    assert wide.decision == flagship.decision and wide.decision.n == (3,) and wide.verdict == "worse"
    assert len(wide.baseline.results) == 6 and len(flagship.baseline.results) == 3  # not the same folders
    sandwich = _questions(tmp_path / "wide")[SANDWICH]
    assert sandwich.verdict == "undecided"
    for matrix in ("wide", "flagship", "other"):
        write_report(tmp_path / matrix)
    index = write_index(tmp_path, tmp_path / "none")
    rows = [line for line in index.splitlines() if line.startswith("| [") and f" | {POST} | " in line]
    assert len(rows) == 2  # flagship's and wide's question once, other's apart
    assert rows[0].startswith("| [flagship](flagship/summary.md), [wide](wide/summary.md) | ")
    assert rows[1].startswith("| [other](other/summary.md) | ")
    # questions: post-norm (flagship = wide), sandwich, other's post-norm: 3, not 4
    other = _hand([7.5, 7.6, 7.7], ROUND_PRE[:3], False, MARGINS["lm"])
    assert other.verdict == "worse"
    assert "**2 of 3 distinct questions are decided** (better, worse or equivalent): " in index
    assert "worse: 2 (" in index and "undecided: 1." in index

    matrices = [MatrixVerdicts(m, _comparisons(tmp_path / m)) for m in ("flagship", "other", "wide")]
    book = book_rows(Index("test", matrices))
    assert [row.names for row in book] == [("flagship", "wide"), ("other",), ("wide",)]
    assert len(distinct_questions(Index("test", matrices))) == 3
    picture = book_forest_rows(book)
    assert [(row.group, row.label) for row in picture] == [
        ("flagship", "norm_placement: post vs pre (also wide)"),
        ("other", "norm_placement: post vs pre"),
        ("wide", "norm_placement: sandwich vs pre"),
    ]
    # each matrix's own picture keeps its own rows
    assert len(forest_rows([("", matrices[2].comparisons)])) == 2


def test_a_matrix_apart_is_not_merged_with_the_verdicts(tmp_path):
    """A matrix whose file says ``verdicts: false`` asks no design question: the same cells there do not
    join (or count as) the row of a matrix that gives verdicts."""
    cells = _lm_cells(pre=ROUND_PRE[:3], post=POST_LM)
    _write_matrix(tmp_path, "flagship", cells, PRE)
    _write_matrix(tmp_path, "smoke", cells, PRE)
    matrix_file = tmp_path / "smoke" / "matrix.yaml"
    matrix_file.write_text(yaml.safe_dump({**yaml.safe_load(matrix_file.read_text()), "verdicts": False}))
    write_report(tmp_path / "flagship")
    index = write_index(tmp_path, tmp_path / "none")
    assert _row(index, "flagship", POST)[0] == "[flagship](flagship/summary.md)"
    assert "**1 of 1 distinct questions are decided**" in index


# strong and weak forms ----------------------------------------------------------------------------------


def _decision(verdict: str, difference: float, interval: tuple[float, float] | None, margin: float, test: str):
    return Decision(
        verdict=verdict,
        test=test,
        difference=difference,
        interval=interval,
        equivalence_interval=None,
        p_value=0.01,
        p_equivalence=0.5,
        margin=margin,
        alpha=0.05 / 3,
        n=(9,),
        excludes_zero=verdict in ("better", "worse"),
        prob_improvement=None,
        prob_improvement_interval=None,
        final=True,
    )


@pytest.mark.parametrize(
    ("verdict", "difference", "interval", "margin", "test", "beyond"),
    [
        # ViT SwiGLU vs MLP: +0.051 [+0.003, +0.098], margin 0.01: the end nearer zero lies inside ± the margin
        ("better", 0.051, (0.003, 0.098), 0.01, "paired t", False),
        ("better", 0.145, (0.099, 0.191), 0.01, "paired t", True),  # MoE's ViT: beyond it
        ("worse", -0.042, (-0.076, -0.008), 0.01, "paired t", False),
        ("worse", 3.66, (2.40, 4.93), 0.074, "paired t", True),  # a perplexity rise: worse, the interval positive
        ("better", -0.123, (-0.233, -0.013), 0.074, "paired t", False),  # a perplexity fall inside the margin
        ("worse", 0.02, (0.01, 0.03), 0.01, "paired t", False),  # the end exactly at the margin is not beyond it
        # a rank test: its form read from the t interval beside it, never the larger one where that holds zero
        ("worse", -60.26, (-89.97, -30.55), 1.0, "Wilcoxon signed-rank", True),
        ("worse", 8.22, (-4.48, 20.93), 0.1, "Wilcoxon signed-rank", False),
        ("equivalent", 0.001, (-0.003, 0.005), 0.01, "paired t", None),
        ("undecided", 0.05, (-0.01, 0.11), 0.01, "paired t", None),
    ],
)
def test_a_better_or_worse_verdict_says_whether_it_holds_by_more_than_the_margin(
    verdict, difference, interval, margin, test, beyond
):
    decision = _decision(verdict, difference, interval, margin, test)
    assert decision.beyond_margin is beyond
    assert decision.form == {True: BEYOND_MARGIN, False: WITHIN_MARGIN, None: ""}[beyond]
    assert decision.describe().startswith(f"{verdict} {decision.form} (" if beyond is not None else f"{verdict} (")


def test_the_summary_the_index_the_counts_and_the_picture_tell_the_two_forms_apart(tmp_path):
    """Two better ViT verdicts on 3 pairs against pre-norm, one whose interval clears the margin (0.005)
    and one whose interval starts inside it: the verdict lines, the index's cells and counts and the picture's
    markers (filled, hollow) say which is which."""
    pre = [0.50, 0.55, 0.60]
    clear, close = [0.60, 0.66, 0.69], [0.503, 0.5535, 0.6055]
    cells = [
        {"task": "vit", "task_name": "vit", "variant": variant, "values": values}
        for variant, values in ((PRE, pre), (POST, clear), (SANDWICH, close))
    ]
    _write_matrix(tmp_path, "forms", cells, PRE)
    strong, weak = (_hand(values, pre, True, MARGINS["vit"]) for values in (clear, close))
    assert (strong.verdict, weak.verdict) == ("better", "better")
    assert strong.low > MARGINS["vit"] > weak.low > 0
    summary = write_report(tmp_path / "forms")
    assert f"- vit (ViT), {POST} vs {PRE}: **better**, {BEYOND_MARGIN} (paired t, α 0.05), over 3 pairs: " in summary
    assert (
        f"- vit (ViT), {SANDWICH} vs {PRE}: **better**, {WITHIN_MARGIN} (paired t, α 0.05), over 3 pairs: " in summary
    )
    index = write_index(tmp_path, tmp_path / "none")
    assert _row(index, "forms", POST)[5].startswith(f"**better** ({BEYOND_MARGIN}) accuracy ↑ {strong.mean:+.3f} ")
    assert _row(index, "forms", SANDWICH)[5].startswith(f"**better** ({WITHIN_MARGIN}) accuracy ↑ {weak.mean:+.3f} ")
    assert "better: 2 (1 by more than the margin), worse: 0 (0 by more than the margin)" in index
    points = [r.points[0] for r in forest_rows([("", _comparisons(tmp_path / "forms"))])]
    assert [p.beyond_margin for p in points] == [True, False]


# one number, one seed set ------------------------------------------------------------------------------


def test_every_number_of_a_verdict_names_its_seeds_and_the_rest_of_the_seeds_are_described_apart(tmp_path):
    """Post-norm is decided worse at its first look (3 pairs) although both sides finished 6 seeds (trained
    for another question, or by another matrix): the verdict's difference and interval are the 3 pairs',
    and say so; the difference over all 6 pairs follows, labelled descriptive, with its own 95% interval;
    the step time names the finished seeds it is over; the difference table's cells name their seeds too."""
    pre = ROUND_PRE[:6]
    post = [*POST_LM, 7.2, 7.0, 7.3]
    _write_matrix(tmp_path, "looks", _lm_cells(pre=pre, post=post), PRE, axes=AXES, seeds=ROUNDS)
    question = _questions(tmp_path / "looks")[POST]
    assert question.decision.n == (3,) and question.verdict == "worse"
    look = _hand(POST_LM, pre[:3], False, MARGINS["lm"])
    differences = [v - b for v, b in zip(post, pre, strict=True)]
    mean, se = statistics.fmean(differences), statistics.stdev(differences) / math.sqrt(6)
    half = scipy_stats.t(5).ppf(0.975) * se
    every = f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"
    summary = write_report(tmp_path / "looks")
    line = next(x for x in summary.splitlines() if x.startswith(f"- lm (LM), {POST} vs {PRE}: "))
    t = scipy_stats.t(2).ppf(1 - 0.05 / 3 / 2) * statistics.stdev([v - b for v, b in zip(POST_LM, pre, strict=False)])
    low, high = look.mean - t / math.sqrt(3), look.mean + t / math.sqrt(3)
    assert f"(paired t, α 0.017), over 3 pairs: perplexity ↓ {look.mean:+.3f} [{low:+.3f}, {high:+.3f}]" in line
    assert f"; over all 6 pairs, descriptive (95%): {every}; " in line
    assert "; step time n/a" in line  # no step time recorded here; with one: "over 6 vs 6 finished seeds"
    table = summary.split("Difference from the baseline variant")[1]
    assert (
        f"| {POST} | {look.mean:+.3f} [{low:+.3f}, {high:+.3f}] **worse** over 3 pairs; over all 6 pairs, "
        f"descriptive (95%): {every} | +0.000 over 6 pairs (no interval: "
    ) in table
    # the index names the look's seeds; the description over every seed is the summary's
    assert _row(write_index(tmp_path, tmp_path / "none"), "looks", POST)[3].endswith(" over 3 pairs")
    # where the look used every seed there is nothing else to describe
    _write_matrix(tmp_path, "all", _lm_cells(pre=pre[:3], post=POST_LM), PRE, axes=AXES, seeds=ROUNDS)
    assert "descriptive (95%)" not in next(
        x for x in write_report(tmp_path / "all").splitlines() if x.startswith(f"- lm (LM), {POST} vs {PRE}: ")
    )


# comparisons neither side learned ----------------------------------------------------------------------


def test_the_share_of_the_way_runs_from_the_trivial_baseline_to_the_best_value_perplexity_in_loss():
    bleu, accuracy, perplexity = (TASK_CONFIGS[t].metrics[0] for t in ("translation", "vit", "lm"))
    assert share_of_the_way(5.0, 0.93, bleu) == pytest.approx((5.0 - 0.93) / (100 - 0.93))
    assert share_of_the_way(0.6, 0.2, accuracy) == pytest.approx(0.5)
    # perplexity on the log scale: halfway from 30 to 1 is √30 (loss halfway from ln 30 to 0), not 15.5
    assert share_of_the_way(math.sqrt(30.0), 30.0, perplexity) == pytest.approx(0.5)
    assert share_of_the_way(25.0, 30.0, perplexity) == pytest.approx(1 - math.log(25) / math.log(30))
    assert share_of_the_way(0.1, 0.2, accuracy) < 0  # worse than the trivial baseline
    assert NOT_LEARNED_SHARE == 0.1


def test_a_comparison_neither_side_learned_gets_no_verdict_whatever_its_test_says(tmp_path):
    """BLEU about 5 against about 3 (the trivial baseline 0.93): each side closed less than a tenth of the way
    to 100, so the comparison is *not learned*, although the paired t test calls it worse, in the summary, the
    index and the counts. The LM at perplexity 25 against 27 (the unigram 30) is not learned either: in loss
    each closed 5% and 3% of the way (linearly it would be 17%). One side past the tenth is an answer."""
    cells = [
        {"task": "translation", "task_name": "translation", "variant": PRE, "values": [5.2, 5.6, 4.9]},
        {"task": "translation", "task_name": "translation", "variant": POST, "values": [3.0, 3.1, 2.7]},
        {"task": "lm", "task_name": "lm", "variant": PRE, "values": [25.0, 25.2, 24.9]},
        {"task": "lm", "task_name": "lm", "variant": POST, "values": [27.0, 27.3, 26.8]},
        {"task": "vit", "task_name": "vit", "variant": PRE, "values": [0.50, 0.55, 0.60]},  # learned: (0.55-0.2)/0.8
        {"task": "vit", "task_name": "vit", "variant": POST, "values": [0.21, 0.22, 0.23]},
    ]
    _write_matrix(tmp_path, "early", cells, PRE)
    translation = _hand([3.0, 3.1, 2.7], [5.2, 5.6, 4.9], True, MARGINS["translation"])
    assert translation.verdict == "worse"  # what the test says
    lm = _hand([27.0, 27.3, 26.8], [25.0, 25.2, 24.9], False, MARGINS["lm"])
    assert lm.verdict == "worse"
    shares = [
        share_of_the_way(statistics.fmean(v), 30.0, TASK_CONFIGS["lm"].metrics[0])
        for v in (c["values"] for c in cells[2:4])
    ]
    assert all(0 < s < NOT_LEARNED_SHARE for s in shares)
    verdicts = {q.group.task: q.verdict for a in analyze(tmp_path / "early")[2] for q in a.questions}
    assert verdicts == {"translation": "not learned", "lm": "not learned", "vit": "worse"}
    summary = write_report(tmp_path / "early")
    line = next(x for x in summary.splitlines() if x.startswith(f"- translation (translator), {POST} vs {PRE}: "))
    assert line.startswith(
        f"- translation (translator), {POST} vs {PRE}: **not learned** (no verdict: both sides within 10% of the "
        "trivial baseline's distance to the best value: "
    )
    closed = [(statistics.fmean(v) - 0.93) / (100 - 0.93) for v in ([3.0, 3.1, 2.7], [5.2, 5.6, 4.9])]
    assert f"the variant closed {closed[0]:.1%} and the baseline {closed[1]:.1%} of the way from the " in line
    assert "trivial baseline's bleu 0.93 to 100; a difference this early says how fast two models start" in line
    assert f"over 3 pairs: bleu ↑ {translation.mean:+.3f} [" in line  # the numbers stay, described
    index = write_index(tmp_path, tmp_path / "none")
    row = _row(index, "early", POST)
    assert (
        row[3]
        == row[4]
        == ("*not learned* (both sides within 10% of the trivial baseline's distance to the best value)")
    )
    assert row[5].startswith("**worse** (")
    assert "**1 of 3 distinct questions are decided**" in index and "not learned: 2" in index
    assert row[6] == "undecided: worse in ViT, not learned in LM and translator"
