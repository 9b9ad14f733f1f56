"""The baseline swap (``blockbench.report.fragility``), from hand-written results: a question decided again
with its baseline's seeds swapped for cells of the very same config on other seeds (an empirical null's
second replica) keeps its word or turns out fragile; a question without such cells has no independent set,
and cells of another config, other code or that failed are never taken for one. The index and the summary
say so. No training: every cell is a result.json and a resolved config written here."""

from __future__ import annotations

import pytest
import yaml
from helpers import ok_result

from blockbench.config import RunConfig
from blockbench.matrixfile import REPLICA_SEED_STRIDE
from blockbench.report.fragility import FRAGILE_MARK, config_key, fragile_questions
from blockbench.report.index import write_index
from blockbench.report.summary import write_report
from blockbench.store.layout import write_json
from blockbench.store.record import CellRecord

MLP, SWIGLU, GEGLU = "ffn=mlp", "ffn=swiglu", "ffn=geglu"
HEADLINE = {"vit": "accuracy", "translation": "bleu"}
TRIVIAL = {"vit": {"accuracy": 0.1}, "translation": {"bleu": 0.9}}
OTHERS = {"vit": {"loss": 1.0}, "translation": {"exact_match": 0.1, "loss": 1.0}}
MARGINS = {"vit": 0.005, "translation": 1.0}
REPLICA_B = [REPLICA_SEED_STRIDE + k for k in range(3)]


def _config(task: str, ffn: str, seed: int, lr: float = 0.001) -> dict:
    """A cell's resolved config, as the runner writes it: the task's defaults with ``model.ffn`` and the lr."""
    raw = {"task": {"name": task}, "model": {"ffn": ffn}, "optimizer": {"lr": lr}, "seed": seed}
    return RunConfig.model_validate(raw).resolved_dict()


def _cells(matrix_dir, task: str, variant: str, values: dict[int, float], **config: object) -> None:
    """Finished cells of ``variant`` (``ffn=...``) on ``task``, seed -> headline value, with resolved configs
    (``config``: the lr, and ``fingerprint``/``status`` of the records)."""
    fingerprint, status = config.pop("fingerprint", "code-a"), config.pop("status", "ok")
    for index, (seed, value) in enumerate(values.items()):
        cell_dir = matrix_dir / "cells" / task / variant / f"seed{seed}"
        axes = {"task": task, "model.ffn": variant.split("=")[1], "seed": seed}
        write_json(
            cell_dir / "cell.json",
            {"index": index, "task": task, "task_name": task, "variant": variant, "seed": seed, "axes": axes},
        )
        (cell_dir / "config.yaml").write_text(yaml.safe_dump(_config(task, variant.split("=")[1], seed, **config)))
        record = ok_result(task, seed, {HEADLINE[task]: value, **OTHERS[task]}, TRIVIAL[task])
        record.update(code_fingerprint=fingerprint)
        if status != "ok":
            record.update(status=status, error="killed", metrics={})
        write_json(cell_dir / "result.json", record)


def _matrix_file(matrix_dir, tasks: list[str], **settings: object) -> None:
    matrix = {
        "name": matrix_dir.name,
        "axes": {"task": tasks, "seed": [0, 1, 2]},
        "margins": {task: {HEADLINE[task]: MARGINS[task]} for task in tasks},
        "baseline_variant": MLP,
        **settings,
    }
    (matrix_dir / "matrix.yaml").write_text(yaml.safe_dump(matrix))


def _seeds(values: list[float], seeds: list[int] | None = None) -> dict[int, float]:
    return dict(zip(seeds or range(len(values)), values, strict=True))


@pytest.fixture
def book(tmp_path):
    """A results root: ``designs`` asks SwiGLU and GeGLU vs the MLP on the ViT and SwiGLU vs the MLP on the
    translator, 3 seeds each; ``null`` (``verdicts: false``) has 3 more seeds of the ViT's MLP baseline
    (its second replica) and, for the translator, 3 seeds of the MLP at another lr. The ViT baseline's own
    seeds were an unlucky draw: SwiGLU is better than them, not than the replica's."""
    designs = tmp_path / "designs"
    _cells(designs, "vit", MLP, _seeds([0.700, 0.702, 0.701]))
    _cells(designs, "vit", SWIGLU, _seeds([0.750, 0.753, 0.751]))  # + 0.05 over the unlucky draw
    _cells(designs, "vit", GEGLU, _seeds([0.950, 0.953, 0.951]))  # far above any draw
    _cells(designs, "translation", MLP, _seeds([30.0, 31.0, 30.5]))
    _cells(designs, "translation", SWIGLU, _seeds([40.0, 41.5, 40.2]))
    _matrix_file(designs, ["vit", "translation"])
    null = tmp_path / "null"
    _cells(null, "vit", MLP, _seeds([0.800, 0.760, 0.780], REPLICA_B))  # the replica: the baseline's usual level
    # the translator's MLP at another lr: no independent set (taken, it would turn better into worse)
    _cells(null, "translation", MLP, _seeds([50.0, 51.0, 50.5], REPLICA_B), lr=0.003)
    _matrix_file(null, ["vit", "translation"], verdicts=False, baseline_variant=None)
    return tmp_path


def _swap(swaps, task: str, variant: str):
    return next(s for s in swaps.swaps if s.matrix == "designs" and s.task == task and s.variant == variant)


def test_a_verdict_that_rests_on_its_baselines_draw_is_fragile(book):
    """SwiGLU is better than the baseline's own seeds (paired), not than the replica's: another draw of
    the same baseline gives another answer."""
    swaps = fragile_questions(book)
    swap = _swap(swaps, "vit", SWIGLU)
    assert swap.verdict == "better" and swap.swapped == "undecided" and swap.fragile
    assert swap.seeds == tuple(REPLICA_B) and swap.sources == ("null",)
    assert swap.decision is not None and swap.decision.test == "Welch t" and swap.decision.n == (3, 3)
    assert swap.unpaired == "better" and not swap.by_pairing  # the draw changed it, not the lost pairing
    assert swaps.is_fragile("designs", "vit", SWIGLU)


def test_a_verdict_that_holds_against_another_draw_of_its_baseline_keeps_its_word(book):
    swaps = fragile_questions(book)
    swap = _swap(swaps, "vit", GEGLU)
    assert swap.verdict == swap.swapped == "better" and swap.has_set and not swap.fragile
    assert not swaps.is_fragile("designs", "vit", GEGLU)


def test_cells_of_another_config_are_no_independent_baseline_set(book):
    """The translator's null cells train the MLP at lr 0.003, not the baseline's 0.001: another config,
    whatever its seeds, so the question has no independent set (and keeps its word by default)."""
    swap = _swap(fragile_questions(book), "translation", SWIGLU)
    assert swap.verdict == "better" and swap.swapped is None and not swap.fragile
    assert "0 cell(s)" in swap.why and "3 needed" in swap.why
    assert config_key(_config("translation", "mlp", 0)) == config_key(_config("translation", "mlp", 7))
    assert config_key(_config("translation", "mlp", 0)) != config_key(_config("translation", "mlp", 0, lr=0.003))
    assert config_key({"model": {"family": "vit"}}) is None  # a config this code does not validate: matched with none


@pytest.mark.parametrize(
    "how",
    [{"fingerprint": "code-b"}, {"status": "failed"}],
    ids=["made by other code", "failed"],
)
def test_cells_of_other_code_or_that_failed_are_no_independent_baseline_set(tmp_path, how):
    """The replica's cells must count as made by the same code (the lineage may admit other code) and
    have finished: otherwise the question has no independent set."""
    designs, null = tmp_path / "designs", tmp_path / "null"
    _cells(designs, "vit", MLP, _seeds([0.700, 0.702, 0.701]))
    _cells(designs, "vit", SWIGLU, _seeds([0.750, 0.753, 0.751]))
    _matrix_file(designs, ["vit"])
    _cells(null, "vit", MLP, _seeds([0.800, 0.760, 0.780], REPLICA_B), **how)
    _matrix_file(null, ["vit"], verdicts=False, baseline_variant=None)
    swaps = fragile_questions(tmp_path)
    assert [(s.verdict, s.swapped) for s in swaps.swaps] == [("better", None)]
    assert len(swaps.without_set) == 1 and not swaps.fragile


def test_a_baselines_own_seeds_past_the_look_are_an_independent_set(tmp_path):
    """A baseline trained on more seeds than a question looked at (for another question) offers its
    later seeds: the question at seeds 0-2 is decided again against the baseline's seeds 3-5."""
    designs = tmp_path / "designs"
    _cells(designs, "vit", MLP, _seeds([0.700, 0.702, 0.701, 0.800, 0.760, 0.780]))
    _cells(designs, "vit", SWIGLU, _seeds([0.750, 0.753, 0.751]))
    _matrix_file(designs, ["vit"], seeds={"min": 3, "max": 6, "step": 3})
    [swap] = fragile_questions(tmp_path).swaps
    assert swap.verdict == "better" and swap.seeds == (3, 4, 5) and swap.swapped == "undecided"


def test_the_index_counts_the_swap_and_marks_each_fragile_verdict(book):
    readme = write_index(book)
    line = next(text for text in readme.splitlines() if text.startswith("**Baseline swap**"))
    assert line.startswith("**Baseline swap**: 1 of 2 verdicts with an independent baseline set")
    assert f"1 is fragile (marked {FRAGILE_MARK}" in line and "1 has no such set" in line
    rows = {row.split(" | ")[1]: row for row in readme.splitlines() if row.startswith("| designs")}
    assert FRAGILE_MARK in rows[SWIGLU].split(" | ")[5]  # the ViT column of SwiGLU's row
    assert FRAGILE_MARK not in rows[SWIGLU].split(" | ")[4]  # the translator's has no set: no mark
    assert FRAGILE_MARK not in rows[GEGLU]


def test_the_summary_names_its_fragile_verdicts(book):
    summary = write_report(book / "designs")
    assert f"accuracy ↑ +0.050 [+0.049, +0.052] {FRAGILE_MARK}" in summary  # its verdict line is marked
    paragraph = next(text for text in summary.splitlines() if text.startswith("**Fragile verdicts**"))
    assert f"vit, {SWIGLU}: better becomes undecided against seeds 1000000-1000002 of null" in paragraph
    assert GEGLU not in paragraph and "translation" not in paragraph
    assert "**Fragile verdicts**" not in write_report(book / "null")  # verdicts: false asks no question


def test_a_record_the_pool_reads_is_typed(book):
    """The pool's cells carry the typed record (``CellRecord``), not the file's dict."""
    from blockbench.report.fragility import CellPool

    pool = CellPool.load(book)
    cells = pool.by_config[config_key(_config("vit", "mlp", 0))]
    assert sorted(c.seed for c in cells) == [0, 1, 2, *REPLICA_B]
    assert all(isinstance(c.record, CellRecord) for c in cells)
