"""A cell whose headline metric ends no better than its task's trivial baseline is recorded as having
not learned (``learned: false``), distinct from diverged and failed."""

from __future__ import annotations

from helpers import TINY_LM

from blockbench.cell.train import train
from blockbench.config import build_run_config
from blockbench.tasks import TASK_CONFIGS


def test_a_run_that_cannot_move_its_weights_did_not_learn_and_the_record_says_so(tmp_path):
    """A learning rate of 1e-9 leaves the tiny LM at its initial, near-uniform prediction: its perplexity
    is far above the unigram baseline's, so the record says ``learned: false`` and did_not_learn."""
    run = build_run_config(TINY_LM, {"optimizer.lr": 1.0e-9})
    record = train(run, tmp_path / "out", tb_dir=tmp_path / "tb", tb_name="cell", tb_version="0")
    perplexity, unigram = record.metrics["perplexity"], record.baselines["perplexity"]
    assert record.status == "ok" and perplexity > unigram  # the premise: it did not beat the unigram model
    assert record.learned is False and record.did_not_learn
    # the rule is the task's own: the headline metric beats its trivial baseline in its direction
    metric = TASK_CONFIGS["lm"].metrics[0]
    assert metric.beats(unigram - 1.0, unigram) and not metric.beats(unigram, unigram)
