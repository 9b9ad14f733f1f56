"""A scale ladder in the report: rungs in ladder order wherever levels are listed, the trend verdict of
every task x variant beside its per-rung verdicts (in the summary and the index), what each rung cost,
the learning-rate curves of the tuning cells and the trend picture. The records are synthetic, from a
power law whose truth is known: loss - floor = A·(m·C)^-α for a variant worth a compute multiplier m."""

from __future__ import annotations

import json
import math

import pytest
from helpers import LADDER_FLOOR, LADDER_RUNGS, write_ladder_results

from blockbench.report import lrcurves
from blockbench.report.index import write_index
from blockbench.report.summary import write_summary

PRE, POST = "norm_placement=pre", "norm_placement=post"
ALPHA_B, A = 0.3, 0.8
#: each seed's noise on ln(loss - floor), per side, zero mean at every rung: the rung means are the truth's
NOISE = {PRE: (0.0, 0.01, -0.01), POST: (0.02, -0.02, 0.0)}


def power_law(compute: float, multiplier: float = 1.0) -> float:
    """The reducible loss at ``compute`` of a model worth ``multiplier`` times the baseline's compute."""
    return A * (multiplier * compute) ** -ALPHA_B


def ladder_losses(theta_of) -> dict[tuple[str, str], list[float | None]]:
    """Per (design, rung) the seeds' losses: the baseline on the power law, the variant at θ = ``theta_of(x)``
    above it in ln reducible loss (x = log2 of the compute)."""
    losses = {}
    for rung, compute in LADDER_RUNGS.items():
        base = math.log(power_law(compute))
        theta = theta_of(math.log2(compute))
        for design, shift in ((PRE, 0.0), (POST, theta)):
            losses[design, rung] = [LADDER_FLOOR + math.exp(base + shift + e) for e in NOISE[design]]
    return losses


def _trend_row(summary: str) -> list[str]:
    section = summary.split("## Trend up the ladder")[1]
    row = next(line for line in section.splitlines() if line.startswith("| lm | norm_placement=post"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_rungs_sort_in_ladder_order_not_as_text(tmp_path):
    """``16x`` sorts after ``4x`` (as text it would come before ``1x``), in the verdicts and the level table."""
    summary = write_summary(write_ladder_results(tmp_path / "lad", ladder_losses(lambda x: 0.2))).markdown
    table = next(line for line in summary.splitlines() if line.startswith("| variant | rung="))
    assert table == "| variant | rung=0.25x | rung=1x | rung=4x | rung=16x |"
    verdicts = [line for line in summary.splitlines() if line.startswith("- ") and " vs norm_placement=pre at " in line]
    assert [line.split(" at rung=")[1].split(":")[0].split(" ")[0] for line in verdicts][:4] == list(LADDER_RUNGS)


def test_a_constant_compute_multiplier_holds_and_reads_the_multiplier_back(tmp_path):
    """Post-norm worth half the baseline's compute at every rung: θ = α ln 2 at each, slope 0, holds; the
    baseline's exponent is α; the multiplier reads 0.5 wherever half the rung's compute lies in the ladder."""
    summary = write_summary(
        write_ladder_results(tmp_path / "lad", ladder_losses(lambda x: ALPHA_B * math.log(2)))
    ).markdown
    row = _trend_row(summary)
    assert row[2] == "**holds**"
    assert row[3].startswith("+0.000 [") and row[4].startswith(f"{ALPHA_B:.3f} [")
    low, high = (float(v) for v in row[3].split("[")[1].rstrip("]").split(","))
    assert -0.016 < low < 0 < high < 0.016
    # half of 0.25x lies below the ladder: no multiplier there
    assert row[5] == "×0.50 at 1x; ×0.50 at 4x; ×0.50 at 16x"
    assert row[6:] == ["worse"] * 4  # the variant's reducible loss 23% above the baseline's at every rung
    assert "Ladder cost per rung, cell processes with their tuning: 0.25x" in summary


def test_a_growing_gap_grows_with_its_slope_per_doubling(tmp_path):
    """θ = 0.1 + 0.05·x: the variant's reducible loss falls behind by 0.05 more per doubling: grows, slope +0.05."""
    summary = write_summary(write_ladder_results(tmp_path / "lad", ladder_losses(lambda x: 0.1 + 0.05 * x))).markdown
    row = _trend_row(summary)
    assert row[2] == "**grows**" and row[3].startswith("+0.050 [")
    assert "](plots/trend.png)" in summary.split("## Trend up the ladder")[1]
    assert (tmp_path / "lad" / "plots" / "trend.png").read_bytes()[:4] == b"\x89PNG"
    # the per-rung verdicts, in ladder order, as the verdicts above say them
    for rung, word in zip(LADDER_RUNGS, row[6:], strict=True):
        line = next(line for line in summary.splitlines() if f"at rung={rung}:" in line and line.startswith("- "))
        assert word.strip("*") in line


def test_with_seeds_in_rounds_the_trend_spends_each_look_s_share_of_alpha(tmp_path):
    """θ = 0.1 + 0.01·x on 3 pairs: the slope's 95% interval excludes 0 (grows at α 0.05), its 97.5% one
    does not. With seeds in rounds of 3 up to 6, two looks, the trend is decided at α/2 as every question
    of the plan is: rungs that stop at the first look and rungs that go on make the last look's slope
    test reject a true slope of 0 more often than α (``benchmarks/statistics/trend_error_rates.py``,
    section (f)), so it is undecided here."""
    losses = ladder_losses(lambda x: 0.1 + 0.01 * x)
    fixed = _trend_row(write_summary(write_ladder_results(tmp_path / "fixed", losses)).markdown)
    rounds = write_ladder_results(tmp_path / "rounds", losses, seeds={"min": 3, "max": 6, "step": 3})
    in_rounds = _trend_row(write_summary(rounds).markdown)
    assert fixed[2] == "**grows**" and in_rounds[2] == "**undecided**"
    low, high = (float(v) for v in in_rounds[3].split("[")[1].rstrip("]").split(","))
    assert low < 0 < high  # the interval shown is the level's: 97.5%


def test_the_summary_says_why_a_trend_is_undecided(tmp_path):
    """A growing gap, but one post-norm seed at 0.25x diverged: rank tests decide the ladder, and no rung can
    be decided by a signed-rank test on 3 pairs (p ≥ 0.25), so the trend is undecided. The summary says so
    under the trend table, where a reader looks for why; a ladder decided by the slope test says its test."""
    losses = ladder_losses(lambda x: 0.1 + 0.05 * x)
    losses[POST, "0.25x"][1] = None
    summary = write_summary(write_ladder_results(tmp_path / "failed", losses)).markdown
    assert _trend_row(summary)[2] == "**undecided** (rank test)"
    why = next(line for line in summary.splitlines() if line.startswith("- lm, norm_placement=post: "))
    assert "a seed failed, so rank tests decide and never show holds" in why
    assert "no rung can be decided: a signed-rank test on 3 pairs gives p ≥ 0.25, not below α 0.05" in why
    assert "plan's last look" not in why  # a fixed plan of 3 seeds has no later look
    for most, then in ((6, "p ≥ 0.031: more seeds cannot change that"), (9, "p ≥ 0.0039: more seeds could")):
        plan = {"min": 3, "max": most, "step": 3}
        rounds = write_summary(write_ladder_results(tmp_path / f"rounds{most}", losses, seeds=plan)).markdown
        why = next(line for line in rounds.splitlines() if line.startswith("- lm, norm_placement=post: "))
        assert f"on the {most} pairs of the plan's last look {then}" in why
    grows = write_summary(write_ladder_results(tmp_path / "grows", ladder_losses(lambda x: 0.1 + 0.05 * x)))
    why = next(line for line in grows.markdown.splitlines() if line.startswith("- lm, norm_placement=post: "))
    assert why.startswith("- lm, norm_placement=post: **grows**: the slope test rejects 0 (p ")


def test_a_baseline_that_stops_improving_gets_no_trend_word(tmp_path):
    losses = ladder_losses(lambda x: 0.2)
    for rung in LADDER_RUNGS:  # every rung at the 1x rung's losses
        for design in (PRE, POST):
            losses[design, rung] = losses[design, "1x"]
    summary = write_summary(write_ladder_results(tmp_path / "lad", losses)).markdown
    assert _trend_row(summary)[2] == "none (ladder not scaling)"


def test_the_index_shows_each_ladder_s_trend(tmp_path):
    root = tmp_path / "results"
    write_summary(write_ladder_results(root / "lad", ladder_losses(lambda x: 0.1 + 0.05 * x)))
    index = write_index(root, matrices=tmp_path)
    section = index.split("## Trends up the ladders")[1]
    assert "[lad](lad/summary.md)" in section and "| lm | norm_placement=post | **grows** | +0.050 [" in section


def test_the_index_says_a_ladder_still_tuning_is_tuning(tmp_path):
    """A long ladder's records are committed as its run goes: with tuning cells finished and no reported cell
    yet, the index lists it as not run yet, saying how far its tuning got, not that no cell has finished."""
    tuning = {(PRE, "1x", 1e-3): 2.3, (POST, "1x", 1e-3): 2.4, (PRE, "4x", 1e-3): 2.1}
    write_ladder_results(tmp_path / "lad", {}, tuning=tuning)
    not_run = write_index(tmp_path).split("## Not run yet\n\n")[1]
    assert "- lad (tuning: 3 tuning cell(s) finished, no reported cell yet): `blockbench matrix " in not_run


@pytest.mark.parametrize("name_baseline", [True, False])
def test_learning_rate_curves_by_hand(tmp_path, name_baseline):
    """At rung 1x, pre: 2.6, 2.3, 2.5 at 1e-4, 1e-3, 1e-2; post: 2.7, 2.4, diverged. The trivial loss 3.4: pre's
    sensitivity ((2.6 + 2.3 + 2.5) / 3 - 2.3), post's ((2.7 + 2.4 + 3.4) / 3 - 2.4), penalty 2.4 - 2.3;
    the largest rate that learns 1e-2 for pre, 1e-3 for post. The penalty is against pre whether the matrix
    names it its baseline or only lists it first, as the verdicts take it."""
    tuning = {(PRE, "1x", 1e-4): 2.6, (PRE, "1x", 1e-3): 2.3, (PRE, "1x", 1e-2): 2.5}
    tuning |= {(POST, "1x", 1e-4): 2.7, (POST, "1x", 1e-3): 2.4, (POST, "1x", 1e-2): None}
    losses = ladder_losses(lambda x: 0.2)
    matrix_dir = write_ladder_results(tmp_path / "lad", losses, tuning=tuning, name_baseline=name_baseline)
    summary = write_summary(matrix_dir).markdown
    section = summary.split("## Learning-rate curves")[1]
    pre = (2.6 + 2.3 + 2.5) / 3 - 2.3
    post = (2.7 + 2.4 + 3.4) / 3 - 2.4
    assert f"| lm | 1x | {PRE} | 2.3000 | 0.001 | {pre:.4f} | – | 0.01 |" in section
    assert f"| lm | 1x | {POST} | 2.4000 | 0.001 | {post:.4f} | +0.1000 | 0.001 |" in section
    assert "](plots/lr_lm.png)" in section
    assert (matrix_dir / "plots" / "lr_lm.png").read_bytes()[:4] == b"\x89PNG"


def test_a_centred_top_rung_curve_reads_only_its_own_grid(tmp_path):
    """At a centred top rung each variant tunes its own grid (``tune.json``), and the headroom cell (pre at
    1e-3, trained before any tuning) is a tuning cell on disk too. Where 1e-3 is off pre's centred grid
    (3e-3, 1e-2, 3e-2) it is no point of pre's curve, though its loss (2.0) is the lowest: the best is 2.2 at
    3e-3, the sensitivity over the three ((2.2 + 2.3 + 2.5) / 3 - 2.2)."""
    tuning = {(PRE, "16x", 1e-3): 2.0, (PRE, "16x", 3e-3): 2.2, (PRE, "16x", 1e-2): 2.3, (PRE, "16x", 3e-2): 2.5}
    tuning |= {(POST, "16x", 1e-4): 2.6, (POST, "16x", 3e-4): 2.4, (POST, "16x", 1e-3): 2.5}
    matrix_dir = write_ladder_results(tmp_path / "lad", ladder_losses(lambda x: 0.2), tuning=tuning)

    def tuned(rates: list[float], chosen: float) -> dict:
        candidates = [
            {"values": {"optimizer.lr": r}, "label": f"lr={r:g}", "score": tuning.get((PRE, "16x", r)), "status": "ok"}
            for r in rates
        ]
        return {"chosen": {"optimizer.lr": chosen}, "chosen_label": f"lr={chosen:g}", "candidates": candidates}

    variants = {f"{PRE},rung=16x": tuned([3e-3, 1e-2, 3e-2], 3e-3), f"{POST},rung=16x": tuned([1e-4, 3e-4, 1e-3], 3e-4)}
    record = {"keys": ["optimizer.lr"], "grid": {"optimizer.lr": [3e-4, 1e-3, 3e-3]}, "tune_seeds": [1000]}
    record["tasks"] = {"lm": {"metric": "loss", "higher_is_better": False, "variants": variants}}
    (matrix_dir / "tune.json").write_text(json.dumps(record))
    section = write_summary(matrix_dir).markdown.split("## Learning-rate curves")[1]
    pre = (2.2 + 2.3 + 2.5) / 3 - 2.2
    assert f"| lm | 16x | {PRE} | 2.2000 | 0.003 | {pre:.4f} | – | 0.03 |" in section
    post = (2.6 + 2.4 + 2.5) / 3 - 2.4
    assert f"| lm | 16x | {POST} | 2.4000 | 0.0003 | {post:.4f} | +0.2000 | 0.001 |" in section


def test_each_learning_rate_panel_is_capped_at_its_own_trivial_loss(tmp_path, monkeypatch):
    """Two tasks with different trivial losses (the LM's unigram 3.4, the ViT's worst rung loss 0.08): each
    task's picture caps its rungs at its own, and a rung's panel holds only its own variants' points."""
    drawn = {}
    monkeypatch.setattr(lrcurves, "draw_rate_curves", lambda path, title, panels: drawn.update({path.name: panels}))

    def curve(task: str, rung: str, variant: str, trivial: float) -> lrcurves.RateCurve:
        points = ((1e-3, trivial / 2), (3e-3, None))
        return lrcurves.RateCurve(task, rung, variant, points, trivial, True, trivial / 2, 1e-3, 0.1, None, 1e-3)

    curves = [curve("lm", "1x", PRE, 3.4), curve("lm", "1x", POST, 3.4), curve("lm", "4x", PRE, 3.3)]
    curves += [curve("vit", "1x", PRE, 0.08)]
    lrcurves.rate_section(tmp_path, curves)
    assert [(p.rung, p.trivial, list(p.curves)) for p in drawn["lr_lm.png"]] == [
        ("1x", 3.4, [PRE, POST]),
        ("4x", 3.3, [PRE]),
    ]
    assert [(p.rung, p.trivial) for p in drawn["lr_vit.png"]] == [("1x", 0.08)]
