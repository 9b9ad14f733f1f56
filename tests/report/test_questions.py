"""What the report's questions rest on, from hand-written results: the matrix settings read through
``MatrixConfig`` (and an older copy that no longer validates), the LM's headroom to its entropy floor,
and a comparison saturated at the floor. No training: every cell is a result.json written here."""

from __future__ import annotations

import math

import yaml

from blockbench.report.analysis import analyze
from blockbench.report.results import MatrixSettings
from blockbench.report.summary import write_report
from blockbench.store.layout import write_json
from blockbench.tasks import TASK_CONFIGS

PRE, POST = "norm_placement=pre", "norm_placement=post"
FLOOR, UNIGRAM = 1.869, 3.421  # the LM's entropy floor and unigram loss, nats per token


def _lm_cell(matrix_dir, variant: str, seed: int, loss: float, index: int) -> None:
    """A finished LM cell whose loss is ``loss``: perplexity exp(loss), the floor among its baselines
    and, where the task reports them, its excess loss and share of the gap closed."""
    cell_dir = matrix_dir / "cells" / "lm" / variant / f"seed{seed}"
    names = {m.name for m in TASK_CONFIGS["lm"].metrics}
    derived = {"excess_loss": loss - FLOOR, "gap_closed": (UNIGRAM - loss) / (UNIGRAM - FLOOR)}
    metrics = {"perplexity": math.exp(loss), "agreement_acc": 0.7, "loss": loss}
    write_json(cell_dir / "cell.json", {"index": index, "task": "lm", "variant": variant, "seed": seed, "axes": {}})
    write_json(
        cell_dir / "result.json",
        {
            "status": "ok",
            "task": "lm",
            "seed": seed,
            "metrics": {**metrics, **{k: v for k, v in derived.items() if k in names}},
            "baselines": {"perplexity": math.exp(UNIGRAM), "loss": UNIGRAM, "agreement_acc": 0.5, "loss_floor": FLOOR},
            "steps": 30,
            "wall_time_s": 4.0,
            "parameters": 1000,
            "throughput": 100.0,
            "throughput_unit": "tokens/s",
        },
    )


def _lm_matrix(matrix_dir, losses: dict[str, list[float]]) -> None:
    index = 0
    for variant, values in losses.items():
        for seed, loss in enumerate(values):
            _lm_cell(matrix_dir, variant, seed, loss, index)
            index += 1
    matrix = {"name": matrix_dir.name, "axes": {"task": ["lm"]}, "baseline_variant": PRE}
    (matrix_dir / "matrix.yaml").write_text(yaml.safe_dump(matrix))


def test_the_lm_section_states_its_headroom_to_the_entropy_floor(tmp_path):
    """The LM's floor, and each variant's excess loss over it and the share of the
    unigram-to-floor gap it closed (as columns where the task reports them, else a table)."""
    losses = {PRE: [1.99, 2.00, 2.01], POST: [2.39, 2.40, 2.41]}
    _lm_matrix(tmp_path / "m", losses)
    summary = write_report(tmp_path / "m")
    assert (
        f"Headroom: no model can reach a loss below the entropy floor of the task's grammar, {FLOOR:.3f} nats per "
        f"token on the validation set (perplexity {math.exp(FLOOR):.3f}), the unigram model's {UNIGRAM:.3f}."
    ) in summary
    excess, gap = 2.40 - FLOOR, (UNIGRAM - 2.40) / (UNIGRAM - FLOOR)  # post-norm's, by hand
    if "excess_loss" in {m.name for m in TASK_CONFIGS["lm"].metrics}:  # columns of the main table
        row = next(line for line in summary.splitlines() if line.startswith(f"| {POST} | "))
        assert f"| {excess:.3f} ± 0.010 | {gap:.3f} ± " in row
    else:
        assert f"| {POST} | {excess:.3f} | {gap:.1%} |" in summary
    assert "saturated" not in summary.split("## Verdicts")[1].split("\n## ")[0].replace("*saturated*", "")


def test_a_comparison_within_the_saturation_distance_of_the_floor_gets_no_verdict(tmp_path):
    """Both sides within the task's saturation distance of the floor (0.03 nats for the LM, where it
    declares one): the perplexity cannot tell them apart, whatever the test says, so no verdict."""
    saturation = getattr(TASK_CONFIGS["lm"], "saturation", None)
    distance = float(getattr(saturation, "distance", 0.0))
    if getattr(saturation, "of", None) != "floor":  # no declared floor distance: nothing is saturated here
        distance = 0.0
    # post-norm sits 0.02 nats above pre-norm in every seed pair: a clear difference to the paired t test
    losses = {PRE: [FLOOR + 0.001, FLOOR + 0.002, FLOOR + 0.003], POST: [FLOOR + 0.021, FLOOR + 0.022, FLOOR + 0.024]}
    _lm_matrix(tmp_path / "m", losses)
    [question] = [q for a in analyze(tmp_path / "m")[2] for q in a.questions]
    assert question.decision.verdict == "worse"  # what the test alone says
    if distance >= 0.024:
        assert question.verdict == "saturated"
        assert f"both sides within {distance:g} nats of the entropy floor (excess loss 0.022 and 0.002)" in (
            question.saturation
        )
        line = next(x for x in write_report(tmp_path / "m").splitlines() if x.startswith("- lm (LM)"))
        assert "**saturated** (no verdict: both sides within" in line
    else:
        assert question.verdict == "worse" and not question.saturation


def test_matrix_settings_come_from_the_matrix_config_and_an_old_copy_still_loads(tmp_path):
    """The report reads the runner's copy of the matrix file through ``MatrixConfig`` (levels: ``within:``
    and the budget; seeds in rounds; margins); a copy of an older file that no longer validates (here
    with ``tune_seed:``, since replaced by ``tune_seeds``) is read key by key instead of failing."""
    current = {
        "name": "m",
        "axes": {"task": ["lm"], "model.n_layers": [2, 4], "trainer.max_steps": [300, 1500]},
        "within": ["model.n_layers"],
        "seeds": {"min": 3, "max": 9, "step": 3},
        "margins": {"lm": {"perplexity": 0.05}},
        "baseline_variant": "norm_placement=pre",
    }
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(current))
    settings = MatrixSettings.load(tmp_path)
    assert settings.levels == ("model.n_layers", "trainer.max_steps")
    assert settings.seeds is not None and settings.seeds.sizes == (3, 6, 9) and settings.seed_axis is None
    assert settings.margins == {"lm": {"perplexity": 0.05}} and settings.baseline_variant == "norm_placement=pre"
    assert settings.cells == 4 * 3  # the axes' product, times the first round's seeds
    old = {
        "name": "m",
        "description": "An old copy.",
        "axes": {"task": ["lm"], "model.norm_placement": ["pre", "post"], "seed": [0, 1, 2]},
        "tune": {"optimizer.lr": [0.001, 0.003]},
        "tune_seed": 1000,
        "targets": {"lm": {"perplexity": 10}},
    }
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(old))
    settings = MatrixSettings.load(tmp_path)
    assert (settings.description, settings.targets, settings.cells) == ("An old copy.", {"lm": {"perplexity": 10.0}}, 6)
    assert settings.seed_axis == 3 and settings.seeds is None and settings.levels == () and settings.verdicts


def test_without_an_override_the_task_s_declared_margin_decides_and_is_stated_with_its_reason(tmp_path):
    """The task declares its headline metric's margin in code (the LM's is relative: a
    share of the baseline's mean); the summary states it with its reason, and two variants 0.3% apart in
    perplexity in every seed pair are equivalent under it."""
    margin = getattr(TASK_CONFIGS["lm"], "margin", None)
    if margin is None:
        raise AssertionError("the LM task declares no margin (blockbench.tasks: TASK_CONFIGS['lm'].margin)")
    pre = [2.000, 2.010, 2.020]
    post = [loss + math.log(1.003) + 0.0005 * i for i, loss in enumerate(pre)]  # 0.3% to 0.4% more perplexity
    _lm_matrix(tmp_path / "m", {PRE: pre, POST: post})
    summary = write_report(tmp_path / "m")
    baseline_mean = sum(math.exp(loss) for loss in pre) / 3
    value = margin.absolute(baseline_mean)
    assert value == (margin.value * baseline_mean if margin.relative else margin.value)
    share = f"{margin.value:.0%} of the baseline's mean, " if margin.relative else ""
    assert f"Margin of practical equivalence: {share}±{value:.3f} ({margin.reason})." in summary
    [question] = [q for a in analyze(tmp_path / "m")[2] for q in a.questions]
    assert question.margin.value == value and question.margin.source == "task"
    assert question.verdict == "equivalent" and f"margin ±{value:.3f}" in summary
