"""The pre-check of ``blockbench train``: a misspelt key or variant name is told from the cached key
listing before torch loads, in the words the full validation uses, and nothing valid is refused (every
task's resolved config, every run config file in configs/, the examples); ``--dry-run`` validates,
says where the run would go and what is there, prints a config that loads back to the same run, and
writes nothing."""

from __future__ import annotations

import pytest
import yaml
from helpers import REPO
from test_cli import loaded_by

from blockbench.cli import main, run_folder_name
from blockbench.config import ConfigError, build_run_config, load_yaml, to_yaml
from blockbench.keys import Origins, with_sections
from blockbench.listing import load_listing
from blockbench.precheck import KeyProblems, key_problems, precheck
from blockbench.store.layout import CONFIG_FILE
from blockbench.tasks import TASK_CONFIGS, TASK_PRESETS

#: mistakes of a user's, each a config file's sections and overrides: every key here is unknown
MISTAKES = [
    ({}, {"model.n_head": 4}),
    ({"model": {"d_modl": 64}}, {"trainer.max_step": 5}),
    ({"trainr": {"max_steps": 5}}, {}),
    ({}, {"optimizer.lrr": 0.1, "task": "vit"}),
    ({"task": {"name": "lm", "seq_lenn": 16}}, {}),
]


@pytest.fixture(scope="module")
def known():
    return with_sections(load_listing().keys)


def full_validation_lines(raw: dict, overrides: dict) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        build_run_config(raw, overrides, source="m.yaml")
    return str(caught.value).splitlines()


@pytest.mark.parametrize(("raw", "overrides"), MISTAKES)
def test_an_unknown_key_is_told_as_the_full_validation_tells_it(known, raw, overrides):
    origins = Origins.given(raw, "m.yaml", overrides, {})
    quick = key_problems(known, raw, overrides, origins)
    full = full_validation_lines(raw, overrides)
    assert quick and set(quick) <= set(full), (quick, full)
    assert "did you mean" in " ".join(quick)


def test_an_unknown_variant_name_is_refused_with_the_names_it_takes(known):
    quick = key_problems(known, {}, {"model.norm_placement": "postt"}, Origins({}))
    assert quick == ["model.norm_placement: unknown name 'postt'; choose one of: deepnorm, post, pre, sandwich"]
    assert any(
        line.startswith("model.norm_placement: unknown norm placement 'postt'")
        for line in full_validation_lines({}, {"model.norm_placement": "postt"})
    )


def test_every_tasks_resolved_config_passes(known):
    """What ``--dry-run`` prints for each task and preset (every key, every default) is taken back; a
    task that needs a setting without a default (an image task's data) is covered by its presets."""
    built = 0
    for task in sorted({*TASK_CONFIGS, *TASK_PRESETS}):
        try:
            resolved = build_run_config({}, {"task": task}).resolved_dict()
        except ConfigError:
            continue
        assert key_problems(known, resolved, {}, Origins(resolved)) == [], task
        built += 1
    assert built >= len(TASK_PRESETS)


def test_every_run_config_file_and_matrix_override_passes(known):
    files = [p for p in (REPO / "configs").rglob("*.yaml") if "matrix" not in p.parts]
    assert files
    for file in files:
        raw = load_yaml(file)
        assert key_problems(known, raw, {}, Origins(raw)) == [], file
    for matrix in (REPO / "configs" / "matrix").glob("*.yaml"):
        overrides = yaml.safe_load(matrix.read_text()).get("overrides") or {}
        assert key_problems(known, {}, overrides, Origins({})) == [], matrix


def test_a_typo_is_told_before_torch_loads(cache_dir):
    load_listing()  # the listing of this code in the test's cache, as any earlier command leaves it
    assert loaded_by("train", "configs/base.yaml", "model.n_head=4") == []


def test_what_it_cannot_read_is_left_to_the_full_validation(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    precheck(str(bad), ["model.n_heads"], "on the command line")  # no `=`, bad YAML: not its to say
    with pytest.raises(KeyProblems, match=r"did you mean model\.n_heads"):
        precheck(None, ["model.n_head=4"], "on the command line")


def test_dry_run_validates_says_where_and_writes_nothing(capsys, tmp_path):
    results = tmp_path / "results"
    argv = ["--results-dir", str(results), "train", "task=vit", "trainer.max_steps=5", "--dry-run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    run = build_run_config({}, {"task": "vit", "trainer.max_steps": 5})
    folder = (
        results / "train" / "vit" / run_folder_name(None, {"task": "vit", "trainer.max_steps": 5}, run.config_hash())
    )
    assert f"run folder: {folder}: it would train from step 0" in out
    assert "task vit, 5 steps, seed 0" in out and not results.exists()
    printed = yaml.safe_load(out.split("copy and edit):\n", 1)[1])
    assert build_run_config(printed).config_hash() == run.config_hash()  # the printed config is this run
    folder.mkdir(parents=True)
    other = build_run_config({}, {"task": "vit", "trainer.max_steps": 6})
    (folder / CONFIG_FILE).write_text(to_yaml(other))  # an unfinished run of another config
    assert main(argv) == 0
    assert "an unfinished run of another config" in (said := capsys.readouterr().out)
    assert "training would stop there (--force replaces it" in said
    assert sorted(p.name for p in folder.iterdir()) == [CONFIG_FILE]


def test_dry_run_refuses_a_bad_config(capsys, tmp_path):
    assert main(["--results-dir", str(tmp_path), "train", "model.n_heads=0", "--dry-run"]) == 2
    assert "model.n_heads" in capsys.readouterr().err
