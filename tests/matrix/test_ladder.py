"""A scale ladder in a matrix file (``ladder:``, ``blockbench.matrix.ladder``): every cell trains at
every rung, the rung a pseudo-axis in its labels and folders and a level compared within; the rung's
settings and the settings that scale with them are applied to each cell; the mistakes are refused
before anything trains; the rung the book's size is gives exactly the book's cells, so they are copied;
the top rung may tune a grid centred on the rate the rungs below point to."""

from __future__ import annotations

import gzip
import math
import re
from pathlib import Path

import pytest
import yaml
from helpers import REPO, TINY_LM

from blockbench.config import ConfigError
from blockbench.matrix.expand import expand_matrix
from blockbench.matrix.ladder import centred_grid, extrapolated_value, lattice
from blockbench.matrix.tuning import Candidate, Trial, Tuning, tuning_record
from blockbench.matrixfile import RUNG_AXIS, MatrixConfig
from blockbench.prereg import ALPHA, smallest_rank_p
from blockbench.store.record import load_record

#: a tiny LM cell of 2 layers and 4 steps, the ladder's reference
BASE = {
    **TINY_LM,
    "model": {**TINY_LM["model"], "n_layers": 2},
    "optimizer": {"warmup_steps": 2},
    "trainer": {**TINY_LM["trainer"], "max_steps": 4, "val_every_n_steps": 2},
}
#: depth x2 and steps x2 a rung: computes 1/4, 1 and 4; data, warm-up and validations with the steps
LADDER = {
    "rungs": [
        {"name": "0.25x", "model.n_layers": 1, "trainer.max_steps": 2},
        {"name": "1x"},
        {"name": "4x", "compute": 4, "model.n_layers": 4, "trainer.max_steps": 8},
    ],
    "scale": {
        "task.n_train_tokens": {"with": "trainer.max_steps"},
        "optimizer.warmup_steps": {"with": "trainer.max_steps"},
        "trainer.val_every_n_steps": {"with": "trainer.max_steps"},
    },
}


def ladder_matrix(folder: Path, ladder: dict | None = None, base: dict = BASE, **spec) -> Path:
    """A matrix file of the tiny LM, pre vs post, one seed, with ``ladder`` and ``spec``'s other keys."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text(yaml.safe_dump(base))
    matrix = {
        "name": "lad",
        "base": "base.yaml",
        "axes": {"model.norm_placement": ["pre", "post"], "seed": [0]},
        "ladder": LADDER if ladder is None else ladder,
        **spec,
    }
    path = folder / "lad.yaml"
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    return path


def test_every_cell_trains_at_every_rung_with_the_rung_s_settings_and_those_that_scale(tmp_path):
    expansion = expand_matrix(ladder_matrix(tmp_path))
    cells = {cell.key: cell for cell in expansion.cells}
    assert list(cells) == [
        "lm/norm_placement=pre,rung=0.25x/seed0",
        "lm/norm_placement=pre,rung=1x/seed0",
        "lm/norm_placement=pre,rung=4x/seed0",
        "lm/norm_placement=post,rung=0.25x/seed0",
        "lm/norm_placement=post,rung=1x/seed0",
        "lm/norm_placement=post,rung=4x/seed0",
    ]
    post = cells["lm/norm_placement=post,rung=4x/seed0"]
    assert post.axes == {"model.norm_placement": "post", RUNG_AXIS: "4x", "seed": 0}
    assert post.directory(Path("r")) == Path("r/cells/lm/norm_placement=post,rung=4x/seed0")
    # (layers, steps, warm-up, validation interval, training tokens) at each rung: the data, the warm-up and the
    # validations follow the steps (x1/2, x1, x2), so the epochs and the warm-up's share stay as they are
    settings = {
        cell.axes[RUNG_AXIS]: (
            cell.run.model.n_layers,
            cell.run.trainer.max_steps,
            cell.run.optimizer.warmup_steps,
            cell.run.trainer.val_every_n_steps,
            cell.run.task.n_train_tokens,
        )
        for cell in expansion.cells
        if cell.run.model.norm_placement == "post"
    }
    assert settings == {"0.25x": (1, 2, 1, 1, 4000), "1x": (2, 4, 2, 2, 8000), "4x": (4, 8, 4, 4, 16000)}
    # layers x steps over the reference's: 1 x 2 / (2 x 4) = 1/4, 1, 4 x 8 / 8 = 4 (declared there, and checked)
    assert expansion.computes == {"0.25x": 0.25, "1x": 1.0, "4x": 4.0}
    # the rung is a level: each variant is compared with the baseline at its own rung
    assert expansion.matrix.levels == [RUNG_AXIS]


def test_the_rung_at_the_reference_is_the_cell_without_the_ladder(tmp_path):
    """A rung that sets nothing trains exactly the matrix's cell without a ladder (same config hash), and so
    does every rung's tuning cell at the reference: the ladder adds nothing to it, not even a default."""
    tune = {"tune": {"optimizer.lr": [1e-3, 3e-3]}}
    with_ladder = expand_matrix(ladder_matrix(tmp_path / "a", **tune))
    spec = yaml.safe_load(ladder_matrix(tmp_path / "b", **tune).read_text())
    del spec["ladder"]
    (tmp_path / "b" / "lad.yaml").write_text(yaml.safe_dump(spec))
    without = expand_matrix(tmp_path / "b" / "lad.yaml")
    at_1x = [cell for cell in with_ladder.cells + with_ladder.tuning if cell.axes[RUNG_AXIS] == "1x"]
    assert [cell.run.config_hash() for cell in at_1x] == [
        cell.run.config_hash() for cell in without.cells + without.tuning
    ]
    others = [cell for cell in with_ladder.cells if cell.axes[RUNG_AXIS] != "1x"]
    assert not {cell.run.config_hash() for cell in others} & {cell.run.config_hash() for cell in without.cells}


def test_the_flagship_ladder_trains_its_harder_tasks_at_every_rung():
    """configs/matrix/prenorm_vs_postnorm_ladder.yaml declares harder tasks than the book's (the book's are
    saturated at its top rung): every rung trains them, the 1x rung too, so no cell of it is a committed
    book cell (none is copied). The 1x rung is configs/base.yaml's size; the others grow depth x2 and steps
    x2 a rung, the generated data and the warm-up with the steps (the LM's text is read byte by byte).
    The ladders' own committed records (results/<ladder>/) are theirs, not the book's, so they are left out,
    and so are the shape check's, whose balanced cells are the flagship ladder's 4x cells by design (the
    shape check's test below)."""
    expansion = expand_matrix(REPO / "configs" / "matrix" / "prenorm_vs_postnorm_ladder.yaml")
    ladders = {path.stem for path in (REPO / "configs" / "matrix").glob("*_ladder.yaml")}
    ladders.add("prenorm_vs_postnorm_shape")
    book = [
        path
        for path in (REPO / "results").rglob("result.json")
        if path.relative_to(REPO / "results").parts[0] not in ladders
    ]
    assert len(book) > 100, "the book's committed records were not found"
    committed = {load_record(path).config_hash for path in book}
    assert not {cell.run.config_hash() for cell in expansion.cells + expansion.tuning} & committed
    runs = {(cell.task, cell.axes[RUNG_AXIS]): cell.run for cell in expansion.cells}
    lm, translation, vit = runs["war_and_peace", "1x"], runs["translation_clauses", "1x"], runs["vit_9_shapes", "1x"]
    assert (lm.model.n_layers, lm.trainer.max_steps, lm.optimizer.warmup_steps) == (4, 300, 30)
    assert lm.task.name == "lm_text" and str(lm.task.data.files["train"]).endswith("english_text/war_and_peace.txt.gz")
    assert lm.task.tokenizer.encoding == "bytes"
    assert (translation.task.max_depth, translation.task.max_len, translation.task.n_train) == (3, 48, 40_000)
    assert (vit.task.max_shapes, vit.task.pixel_noise, vit.task.n_train) == (9, 24, 20_000)
    assert expansion.computes == {"0.25x": 0.25, "1x": 1.0, "4x": 4.0, "16x": 16.0}
    top = {task: runs[task, "16x"] for task in ("war_and_peace", "translation_clauses", "vit_9_shapes")}
    lm = top["war_and_peace"]
    assert (lm.model.n_layers, lm.trainer.max_steps, lm.optimizer.warmup_steps, lm.trainer.val_every_n_steps) == (
        16,
        1200,
        120,
        400,
    )
    assert (top["translation_clauses"].task.n_train, top["vit_9_shapes"].task.n_train) == (160_000, 80_000)
    assert top["translation_clauses"].task.max_depth == 3 and top["vit_9_shapes"].task.max_shapes == 9
    model = top["translation_clauses"].resolved_model()
    assert model.encoder_layers == model.decoder_layers == 16


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"axes": {"model.n_layers": [2, 4], "seed": [0]}},
            "ladder: rung '0.25x' sets model.n_layers=1 but the axis model.n_layers also varies it",
        ),
        ({"ladder": {"rungs": [{"name": "1x"}]}}, "List should have at least 2 items"),
        ({"ladder": {"rungs": [{"name": "a"}, {"name": "a", "trainer.max_steps": 8}]}}, "two rungs are named 'a'"),
        (
            {"ladder": {"rungs": [{"name": "a", "compute": 4}, {"name": "b", "compute": 2}]}},
            "rung 'b' declares compute 2, not above rung 'a''s 4",
        ),
        (
            {"ladder": {"rungs": [{"name": "a", "trainer.max_steps": 8}, {"name": "b"}]}},
            "rung 'b' has compute 1, not above rung 'a''s 2",
        ),
        (
            {"ladder": {"rungs": [{"name": "a"}, {"name": "b", "compute": 3, "trainer.max_steps": 8}]}},
            "rung 'b' declares compute 3, but its cells train 2 times the layers x steps",
        ),
        (
            {"ladder": {"rungs": [{"name": "a"}, {"name": "b", "model.n_layer": 4}]}},
            "rung 'b': model.n_layer: unknown key; did you mean model.n_layers?",
        ),
        (
            {"ladder": {"rungs": [{"name": "a"}, {"name": "b", "model.d_model": 64}]}},
            "rung 'b' changes model.d_model 32 -> 64",
        ),
        (
            {"ladder": {**LADDER, "scale": {"trainer.max_steps": "fixed"}}},
            "rung '0.25x' sets trainer.max_steps, which ladder.scale also scales",
        ),
        (
            {"ladder": {**LADDER, "scale": {"task.n_train": {"with": "trainer.max_steps"}}}},
            "ladder.scale: task.n_train is a setting of none of the matrix's cells",
        ),
        (
            {"ladder": {**LADDER, "scale": {"task.n_train_tokens": {"with": "model.n_layerz"}}}},
            "model.n_layerz: unknown key; did you mean model.n_layers?",
        ),
        (
            {"ladder": {**LADDER, "scale": {"task.n_train_tokens": {"per": "trainer.max_steps"}}}},
            "is not a scale rule; write fixed",
        ),
        (
            {"ladder": {"rungs": [{"name": "a"}, {"name": "b", "trainer.max_steps": 5}], "scale": LADDER["scale"]}},
            "optimizer.warmup_steps (2) with trainer.max_steps gives 2.5 at rung 'b', not a whole number",
        ),
        ({"axes": {"rung": ["a"], "seed": [0]}}, "axis 'rung' is the ladder's own"),
        ({"ladder": {**LADDER, "top_grid": {"points": 3}}}, "ladder.top_grid centres one tuned number"),
        ({"ladder": {"rungs": [{"name": "a"}, {"name": "b", "seed": 3}]}}, "a rung cannot set 'seed'"),
        ({"ladder": {"rungs": [{"name": "a", "comput": 2}, {"name": "b"}]}}, "'comput' is not a rung field; did you "),
    ],
)
def test_ladder_mistakes_stop_the_matrix_before_anything_trains(tmp_path, spec, expected):
    ladder = spec.pop("ladder", None)
    with pytest.raises(ConfigError) as raised:
        expand_matrix(ladder_matrix(tmp_path, ladder, **spec, **({"tune": {}} if "tune" not in spec else {})))
    assert expected in str(raised.value)


def test_a_rung_key_the_task_entry_sets_too_is_refused(tmp_path):
    entry = {**BASE["task"], "overrides": {"trainer.max_steps": 6}}
    with pytest.raises(
        ConfigError, match=re.escape("rung '0.25x' sets trainer.max_steps, which the task entry's overrides")
    ):
        expand_matrix(ladder_matrix(tmp_path, axes={"task": [entry], "seed": [0]}))


def test_a_rung_that_changes_the_width_declares_its_compute(tmp_path):
    ladder = {"rungs": [{"name": "a"}, {"name": "wide", "compute": 3.5, "model.d_model": 64}]}
    assert expand_matrix(ladder_matrix(tmp_path, ladder)).computes == {"a": 1.0, "wide": 3.5}


@pytest.mark.parametrize(("rule", "expected"), [({"with": "model.n_heads"}, [2, 4]), ("fixed", [1, 2])])
def test_each_variant_declares_how_it_scales(tmp_path, rule, expected):
    """MQA (1 key/value head) and GQA (2 of 4 heads) up a rung of 8 heads: ``{with: model.n_heads}`` keeps their
    share of the heads (2 and 4 of 8), ``fixed`` keeps their counts (1 and 2); a count stays whole or is refused."""
    ladder = {
        "rungs": [{"name": "a"}, {"name": "heads", "compute": 2, "model.n_heads": 8}],
        "scale": {"model.n_kv_heads": rule},
    }
    base = {**BASE, "model": {**BASE["model"], "n_heads": 4}}
    axes = {"model.n_kv_heads": [1, 2], "seed": [0]}
    expansion = expand_matrix(ladder_matrix(tmp_path, ladder, base=base, axes=axes))
    at = {(cell.axes[RUNG_AXIS], cell.axes["model.n_kv_heads"]): cell.run.model.n_kv_heads for cell in expansion.cells}
    assert [at["a", 1], at["a", 2]] == [1, 2]
    assert [at["heads", 1], at["heads", 2]] == expected
    if rule != "fixed":
        ladder["rungs"][1]["model.n_heads"] = 2  # half the heads: MQA's one KV head would be half a head
        with pytest.raises(
            ConfigError, match=re.escape("model.n_kv_heads (1) with model.n_heads gives 0.5 at rung 'heads'")
        ):
            expand_matrix(ladder_matrix(tmp_path / "half", ladder, base=base, axes=axes))


# the top rung's grid ------------------------------------------------------------------------------------


def test_the_top_rung_s_rate_is_extrapolated_on_log_log_and_snapped_to_the_grid_s_lattice():
    """Chosen 3e-3, 1e-3, 3e-4 at 1/4, 1, 4 times the compute: x = ln C is -ln 4, 0, ln 4 (mean 0), so the
    slope is ln(3e-4 / 3e-3) / (2 ln 4) and the intercept the mean of ln(3e-3), ln(1e-3), ln(3e-4); at 16
    (x = 2 ln 4) the line gives (9e-10)^(1/3) x 0.1 = 9.655e-5. The lattice of [3e-4, 1e-3, 3e-3] below its
    end steps by 0.3 (9e-5, 2.7e-5, ...) and above by 3 (9e-3, ...): the nearest value on a log scale is 9e-5,
    and three points centred there are 2.7e-5, 9e-5 and 3e-4."""
    centre = extrapolated_value([(0.25, 3e-3), (1.0, 1e-3), (4.0, 3e-4)], 16.0)
    assert centre == pytest.approx(9e-10 ** (1 / 3) * 0.1, rel=1e-12)
    grid = [3e-4, 1e-3, 3e-3]
    assert lattice(grid, 3e-5, 1e-2, beyond=0) == pytest.approx([2.7e-5, 9e-5, 3e-4, 1e-3, 3e-3, 9e-3, 2.7e-2])
    assert centred_grid(grid, centre, 3) == pytest.approx([2.7e-5, 9e-5, 3e-4])
    # an even number of points takes the extra one on the side of the centre: 9.655e-5 is above 9e-5
    assert centred_grid(grid, centre, 4) == pytest.approx([2.7e-5, 9e-5, 3e-4, 1e-3])
    assert centred_grid(grid, 1e-3, 3) == grid  # the stand-in: centred on the grid's middle, the grid itself
    with pytest.raises(ValueError, match="two rungs or more"):
        extrapolated_value([(1.0, 1e-3)], 4.0)


def test_tune_json_records_the_grid_a_centred_top_rung_tuned():
    """The top rung's candidates count as added only past the ends of its own grid, which it records."""
    trials = (Trial(1000, "c", "ok", 5.0),)
    candidates = tuple(Candidate({"optimizer.lr": lr}, f"lr={lr}", trials) for lr in (2.7e-5, 9e-5, 3e-4, 8.1e-6))
    tunings = [Tuning("lm", "v,rung=4x", "perplexity", False, candidates, (1000,))]
    own = {("lm", "v,rung=4x"): {"optimizer.lr": [2.7e-5, 9e-5, 3e-4]}}
    record = tuning_record({"optimizer.lr": [3e-4, 1e-3, 3e-3]}, [1000], tunings, own)
    variant = record["tasks"]["lm"]["variants"]["v,rung=4x"]
    assert variant["grid"] == {"optimizer.lr": [2.7e-5, 9e-5, 3e-4]}
    assert [c["added"] for c in variant["candidates"]] == [False, False, False, True]


def test_the_matrix_file_of_the_flagship_ladder_validates_as_a_design_matrix():
    matrix = MatrixConfig.model_validate(
        yaml.safe_load((REPO / "configs/matrix/prenorm_vs_postnorm_ladder.yaml").read_text())
    )
    assert matrix.ladder is not None and matrix.ladder.names == ["0.25x", "1x", "4x", "16x"]
    assert matrix.levels == [RUNG_AXIS] and math.isclose(matrix.ladder.top.compute or 0, 16)


def test_the_shape_check_spends_the_4x_compute_three_ways_and_its_balanced_cells_are_the_ladders():
    """configs/matrix/prenorm_vs_postnorm_shape.yaml: at the ladder's 4x compute (layers x steps 4 times
    configs/base.yaml's), balanced, steps only and depth only; the balanced cells are the ladder's 4x LM
    cells exactly (the same config hashes, tuning cells too), so they are copied rather than trained."""
    ladder = expand_matrix(REPO / "configs" / "matrix" / "prenorm_vs_postnorm_ladder.yaml")
    shape = expand_matrix(REPO / "configs" / "matrix" / "prenorm_vs_postnorm_shape.yaml")
    at_4x = {
        cell.run.config_hash()
        for cell in ladder.cells + ladder.tuning
        if cell.task == "war_and_peace" and cell.axes[RUNG_AXIS] == "4x"
    }
    balanced = {cell.run.config_hash() for cell in shape.cells + shape.tuning if cell.task == "war_and_peace"}
    assert balanced == at_4x and len(balanced) > 6
    shapes = {cell.task: cell.run for cell in shape.cells}
    layers_steps = {task: (run.model.n_layers, run.trainer.max_steps) for task, run in shapes.items()}
    assert layers_steps == {
        "war_and_peace": (8, 600),
        "war_and_peace_steps_only": (4, 1200),
        "war_and_peace_depth_only": (16, 300),
    }
    base = 4 * 300
    assert all(layers * steps == 4 * base for layers, steps in layers_steps.values())
    # the warm-up's share and the number of validations are the ladder's at every shape
    assert {run.optimizer.warmup_steps / run.trainer.max_steps for run in shapes.values()} == {0.1}
    assert {run.trainer.max_steps // run.trainer.val_every_n_steps for run in shapes.values()} == {3}


@pytest.mark.parametrize("matrix", ["prenorm_vs_postnorm_ladder.yaml", "prenorm_vs_postnorm_shape.yaml"])
def test_the_ladder_s_lm_reads_war_and_peace_less_than_once_in_every_cell(matrix):
    """The ladder's LM reads real text so that no rung repeats its data: a cell's steps x batch x context
    bytes stay below the training share of War and Peace (10% held out for validation, 5% of the rest
    for tuning) at every rung and shape, as the generated tasks' epochs stay fixed; the book's LM context
    (64) keeps the longest cell at about one pass, where the text task's default context (256) would
    read it about 3.5 times at the top rung."""
    expansion = expand_matrix(REPO / "configs" / "matrix" / matrix)
    lm_cells = [cell for cell in expansion.cells + expansion.tuning if cell.run.task.name == "lm_text"]
    assert lm_cells
    task = lm_cells[0].run.task
    text = Path(task.data.files["train"])
    training_bytes = len(gzip.decompress(text.read_bytes())) * (1 - task.data.val_fraction) * (1 - task.tuning_fraction)

    def passes(cell) -> float:
        return cell.run.trainer.max_steps * cell.run.trainer.batch_size * cell.run.task.seq_len / training_bytes

    for cell in lm_cells:
        assert passes(cell) < 1, f"{cell.key} reads {passes(cell):.1f} passes"
    assert max(passes(cell) for cell in lm_cells) == pytest.approx(0.87, abs=0.03)


#: the further questions' ladders, through the 4x rung on the flagship's tasks, and each one's baseline
FURTHER_LADDERS = {
    "dense_vs_moe_ladder": "model.n_experts",
    "positional_encoding_ladder": "model.pos_encoding",
    "attention_heads_ladder": "model.n_kv_heads",
    "sandwich_norm_ladder": "model.norm_placement",
}


@pytest.mark.parametrize("name", sorted(FURTHER_LADDERS))
def test_the_further_questions_climb_the_flagship_s_first_three_rungs_on_its_tasks(name):
    """Each further question's ladder trains the flagship ladder's tasks at its 1/4x, 1x and 4x rungs (the
    same rung settings, scaled keys and grid; seeds up to 9, so a rung where a seed fails can be decided),
    so its baseline's cells are the flagship's wherever the baseline's
    config is the flagship's pre-norm one: copied where both ran into one results folder, the top rung's
    headroom cell among them. Multi-head attention spells its key/value heads out (n_kv_heads 4, the
    book's label), which gives its cells configs of their own."""
    flagship = expand_matrix(REPO / "configs" / "matrix" / "prenorm_vs_postnorm_ladder.yaml")
    further = expand_matrix(REPO / "configs" / "matrix" / f"{name}.yaml")
    assert further.matrix.ladder is not None and further.matrix.ladder.names == ["0.25x", "1x", "4x"]
    assert further.computes == {"0.25x": 0.25, "1x": 1.0, "4x": 4.0}
    assert further.matrix.tune == flagship.matrix.tune
    # seeds in the flagship's rounds of 3, but up to 9: where a seed fails, the exact signed-rank test decides,
    # and its smallest p on n pairs, 2/2^n, is above α/2 on the flagship's 6 but below α/3 on 9
    seeds, flagship_seeds = further.matrix.seeds, flagship.matrix.seeds
    assert (seeds.min, seeds.step) == (flagship_seeds.min, flagship_seeds.step)
    assert smallest_rank_p(seeds.sizes[-1]) < ALPHA / len(seeds.sizes)
    axis = FURTHER_LADDERS[name]
    assert set(further.matrix.axes) == {"task", axis}
    assert further.matrix.axes["task"] == flagship.matrix.axes["task"]
    flagship_hashes = {cell.run.config_hash(): cell.axes[RUNG_AXIS] for cell in flagship.cells + flagship.tuning}
    baseline = further.matrix.axes[axis][0]
    copied = [cell for cell in further.cells + further.tuning if cell.run.config_hash() in flagship_hashes]
    if name == "attention_heads_ladder":
        assert not copied
        return
    baseline_cells = [cell for cell in further.cells + further.tuning if cell.axes[axis] == baseline]
    shared = [c for c in baseline_cells if c in further.tuning or c.run.seed < flagship_seeds.max]  # not seeds 6-8
    assert len(shared) < len(baseline_cells)
    assert copied == shared and {flagship_hashes[c.run.config_hash()] for c in copied} == {"0.25x", "1x", "4x"}
