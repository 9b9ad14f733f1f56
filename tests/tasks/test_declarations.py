"""What each task declares in code before any result: the margin of practical equivalence of its
headline metric, where that metric saturates, and whether a value beats the trivial baseline."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from blockbench.tasks import TASK_CONFIGS, Margin, Metric, Saturation

#: what each task declares: task -> (headline metric, margin value, relative, saturation distance and what of)
DECLARED = {
    "lm": ("perplexity", 0.01, True, (0.03, "floor")),
    "lm_text": ("perplexity", 0.01, True, None),  # real text: no known entropy floor
    "translation": ("bleu", 1.0, False, (0.5, "best")),
    "translation_text": ("bleu", 1.0, False, (0.5, "best")),
    "vit": ("accuracy", 0.01, False, (0.0025, "best")),
    "image_classification": ("accuracy", 0.01, False, (0.0025, "best")),
}


def headline(task: str) -> Metric:
    return TASK_CONFIGS[task].metrics[0]


def test_every_task_declares_its_margin_and_saturation():
    assert set(TASK_CONFIGS) == set(DECLARED)
    for task, (metric, value, relative, saturation) in DECLARED.items():
        cfg = TASK_CONFIGS[task]
        assert headline(task).name == metric
        assert isinstance(cfg.margin, Margin) and (cfg.margin.value, cfg.margin.relative) == (value, relative), task
        assert cfg.margin.reason.strip(), task
        if saturation is None:
            assert cfg.saturation is None
        else:
            assert isinstance(cfg.saturation, Saturation) and cfg.saturation.reason.strip(), task
            assert (cfg.saturation.distance, cfg.saturation.of) == saturation, task
    assert TASK_CONFIGS["lm"].margin.reason.startswith("a 1% perplexity ratio, 0.01 nats per token")


def test_a_relative_margin_is_a_share_of_the_baselines_mean():
    lm, bleu = TASK_CONFIGS["lm"].margin, TASK_CONFIGS["translation"].margin
    assert lm.absolute(30.6) == pytest.approx(0.306)  # 1% of a perplexity of 30.6
    assert lm.absolute(7.356) == pytest.approx(0.07356)
    assert bleu.absolute(30.0) == bleu.absolute(80.0) == 1.0  # absolute: whatever the baseline
    assert TASK_CONFIGS["vit"].margin.absolute(0.9) == 0.01
    with pytest.raises(ValidationError):
        Margin(value=0, relative=False, reason="none")
    with pytest.raises(ValidationError):
        Margin(value=0.1, relative=False, reason="")  # a margin states its reason


def test_bleu_and_accuracy_saturate_near_their_best_value():
    bleu, accuracy = TASK_CONFIGS["translation"], TASK_CONFIGS["image_classification"]
    assert bleu.saturation.saturated(99.5, headline("translation"))
    assert bleu.saturation.saturated(100.0, headline("translation"))
    assert not bleu.saturation.saturated(99.4, headline("translation"))
    assert accuracy.saturation.saturated(0.9975, headline("image_classification"))
    assert not accuracy.saturation.saturated(0.997, headline("image_classification"))
    # a lower-is-better metric's best value is its lower end
    loss = Metric(name="loss", higher_is_better=False, description="", low=0)
    assert loss.best == 0 and Saturation(distance=0.1, of="best", reason="r").saturated(0.05, loss)


def test_the_lm_saturates_in_excess_loss_over_its_floor():
    """The distance is 0.03 nats per token of loss over the floor; the headline perplexity is exp(loss)."""
    lm = TASK_CONFIGS["lm"]
    floor = 1.89
    assert lm.saturation.saturated(math.exp(floor + 0.029), headline("lm"), floor=floor)
    assert not lm.saturation.saturated(math.exp(floor + 0.031), headline("lm"), floor=floor)
    assert lm.saturation.saturated(math.exp(floor - 0.001), headline("lm"), floor=floor)  # a noisy mean below it
    loss = Metric(name="loss", higher_is_better=False, description="", low=0)  # a loss is compared as it is
    assert lm.saturation.saturated(floor + 0.02, loss, floor=floor)
    with pytest.raises(ValueError, match="pass floor="):
        lm.saturation.saturated(6.7, headline("lm"))


@pytest.mark.parametrize(
    ("task", "value", "baseline", "learned"),
    [
        ("lm", 30.64, 30.60, False),  # post-norm LM cells: above the unigram perplexity
        ("lm", 30.60, 30.60, False),  # a tie is not better
        ("lm", 7.36, 30.60, True),
        ("translation", 0.5, 0.93, False),  # BLEU below word-by-word translation's
        ("translation", 45.0, 0.93, True),
        ("vit", 0.2, 0.2, False),
        ("vit", 0.21, 0.2, True),
        ("lm", math.nan, 30.60, False),  # no value learned nothing
        ("translation", math.nan, 0.93, False),
    ],
)
def test_beats_is_strictly_better_than_the_trivial_baseline(task, value, baseline, learned):
    assert headline(task).beats(value, baseline) is learned
