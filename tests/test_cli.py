"""The command line at the door: ``--help`` and ``blockbench list`` answer without loading torch (the
listing read from its cache, walked again when the code changes), every example in the help runs as
written, and a config error names the closest valid keys and where the bad key was set (the command
line, a config file, a matrix file's ``overrides:`` or axis), and a matrix file's unknown top-level
key lists the keys a matrix file takes.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, TINY_LM, write_matrix

from blockbench import listing
from blockbench.cli import EXAMPLES, _user_error, build_parser, main
from blockbench.config import (
    ConfigError,
    RunConfig,
    build_run_config,
    lightning_choices,
    load_yaml,
    parse_overrides,
)
from blockbench.keys import Key, Origins, closest_keys, config_classes, known_keys
from blockbench.lifeline import FolderHeld
from blockbench.listing import CACHE_DIR, Listing, format_listing, load_listing, source_digest, walk_listing
from blockbench.matrix.expand import load_matrix
from blockbench.matrixfile import MatrixConfig
from blockbench.models.config import VARIANT_REGISTRIES
from blockbench.tasks import TASK_CONFIGS, presets
from blockbench.tasks.data import DataError

#: where the task presets (``task.name``'s other names) are defined
TASK_PRESETS_MODULE = presets.__name__
#: what a command that needs none of it must not load: the training stack and the report's plotting
HEAVY = ("torch", "lightning", "matplotlib", "blockbench.models", "blockbench.tasks", "blockbench.config")

#: runs ``blockbench.cli.main(argv)`` as the ``blockbench`` command does, then prints (last, on stderr)
#: the heavy modules it loaded
PROBE = """
import json, sys
from blockbench.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY or m.rpartition(".")[0] in HEAVY or m in HEAVY)
print(json.dumps(heavy), file=sys.stderr)
"""


def loaded_by(*argv: str) -> list[str]:
    """The heavy modules a fresh interpreter has loaded after running ``blockbench *argv``."""
    code = f"HEAVY = {HEAVY!r}\n{PROBE}"
    process = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=REPO)
    return json.loads(process.stderr.strip().splitlines()[-1])


# --------------------------------------------------------------------------- no torch at the door


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["train", "--help"], ["matrix", "--help"], ["report", "--help"], ["list"], ["list", "n_head"]],
    ids=" ".join,
)
def test_help_and_list_load_no_torch(cache_dir, argv):
    load_listing()  # the listing of this code in the test's cache (as any earlier `blockbench list` leaves it)
    assert loaded_by(*argv) == []


def test_the_help_shows_no_docstring_markup(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    said = capsys.readouterr().out
    assert "``" not in said and said.split("\n\n")[1].startswith("blockbench: train one config")


def test_importtime_of_help_lists_no_torch(cache_dir):
    """``python -X importtime -m blockbench --help``: the help imports none of torch, lightning, matplotlib."""
    process = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "blockbench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert process.returncode == 0 and "examples:" in process.stdout
    imported = [line.rsplit("|", 1)[1].strip() for line in process.stderr.splitlines() if line.startswith("import")]
    assert "blockbench.cli" in imported
    assert not [name for name in imported if name.split(".")[0] in ("torch", "lightning", "matplotlib")]


def test_train_still_loads_the_stack_it_needs(cache_dir):
    """The other side of the lazy imports: a command that validates a config does load it, once its
    keys passed the pre-check (a misspelt key stops before, see tests/test_precheck.py)."""
    load_listing()
    assert "blockbench.config" in loaded_by("train", "model.n_heads=4", "trainer.max_steps=0", "--dry-run")


# --------------------------------------------------------------------------- the listing's cache


def test_the_cached_listing_is_the_walked_one(cache_dir):
    walked = walk_listing()
    assert load_listing() == walked  # walked and cached
    path = cache_dir / CACHE_DIR / f"{source_digest()}.json"
    cached = Listing.from_json(path.read_text())
    assert cached == walked
    assert format_listing(cached.keys, cached.titles) == format_listing(walked.keys, walked.titles)
    assert len(cached.keys) > 100 and {"model", "trainer", "optimizer", "task"} <= set(cached.titles)


def test_the_listing_is_read_from_the_cache_and_walked_again_when_the_code_changes(cache_dir, tmp_path, monkeypatch):
    package = tmp_path / "src" / "bb_listing_probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "fields.py").write_text("X = 1\n")
    (tmp_path / "src" / "bb_listing_module.py").write_text("Y = 1\n")
    (tmp_path / "src" / "bb_listing_elsewhere.py").write_text("Z = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setattr(listing, "LISTING_SOURCES", ("bb_listing_probe", "bb_listing_module"))
    first, second = Listing([Key("a.b")], {"a": "first"}), Listing([Key("a.c")], {"a": "second"})

    monkeypatch.setattr(listing, "walk_listing", lambda: first)
    assert load_listing() == first  # walked, cached
    monkeypatch.setattr(listing, "walk_listing", lambda: second)
    assert load_listing() == first  # the same code: from the cache, not walked
    (tmp_path / "src" / "bb_listing_elsewhere.py").write_text("Z = 2\n")
    assert load_listing() == first  # code the listing is not read from changed: still the cache
    (package / "fields.py").write_text("X = 2\n")
    assert load_listing() == second  # a file of a listed package changed: walked again
    monkeypatch.setattr(listing, "walk_listing", lambda: first)
    (tmp_path / "src" / "bb_listing_module.py").write_text("Y = 2\n")
    assert load_listing() == first  # a listed module changed: walked again
    monkeypatch.setattr(listing, "walk_listing", lambda: second)
    (cache_dir / CACHE_DIR / f"{source_digest()}.json").write_text("{not json")
    monkeypatch.setattr(listing, "walk_listing", lambda: first)
    assert load_listing() == first  # a damaged cache file is walked past and replaced
    assert load_listing() == first


def test_the_digest_covers_the_library_versions(monkeypatch):
    before = source_digest()
    monkeypatch.setattr(listing.metadata, "version", lambda name: "0.0-other")
    assert source_digest() != before


def test_the_digest_covers_every_module_the_listing_is_read_from():
    """Every config class the walk reaches, and every variant registered under a ``model.*`` key,
    is defined in :data:`LISTING_SOURCES` (or outside the project, as ``torch.nn.ReLU``): an edit
    anywhere else cannot change the listing, so it may keep its cache."""

    def inside(module: str) -> bool:
        return any(module == source or module.startswith(source + ".") for source in listing.LISTING_SOURCES)

    seen, todo = set(), [RunConfig]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            todo += [member for info in cls.model_fields.values() for member in config_classes(info.annotation)]
    assert len(seen) > 10
    assert [cls for cls in seen if not inside(cls.__module__)] == []
    targets = [entry.target for registry in VARIANT_REGISTRIES.values() for entry in registry]
    project = [t.__module__ for t in targets if t.__module__.startswith("blockbench")]
    assert project and [module for module in project if not inside(module)] == []
    assert inside(TASK_PRESETS_MODULE) and inside(lightning_choices.__module__)


def test_every_key_an_error_suggests_is_one_blockbench_list_shows():
    listed = {key.key for key in walk_listing().keys}
    assert {name for name, key in known_keys(RunConfig).items() if key.definitions} == listed


# --------------------------------------------------------------------------- the examples in the help


def example_commands() -> list[list[str]]:
    """Every command of the help's examples, as argv after ``blockbench``."""
    commands = []
    for text in EXAMPLES.values():
        for line in text.splitlines():
            if line.startswith("  blockbench"):
                command = re.split(r"\s{2,}", line.strip())[0].split("|")[0]
                commands.append(shlex.split(command)[1:])
    return commands


def test_every_example_in_the_help_parses_and_names_files_that_exist(monkeypatch):
    monkeypatch.chdir(REPO)
    commands = example_commands()
    assert len(commands) >= 15
    for argv in commands:
        if "--help" in argv:
            with pytest.raises(SystemExit) as info:
                build_parser().parse_args(argv)
            assert info.value.code == 0
            continue
        args = build_parser().parse_args(argv)
        for value in vars(args).values():
            if isinstance(value, str) and value.startswith("configs/"):
                assert Path(value).is_file(), (argv, value)


def test_the_train_examples_are_valid_configs(monkeypatch):
    monkeypatch.chdir(REPO)
    trains = [argv[1:] for argv in example_commands() if argv[:1] == ["train"] and "--help" not in argv]
    assert len(trains) >= 4
    for argv in trains:
        args = build_parser().parse_args(["train", *argv])
        sources = list(args.config_or_overrides)
        raw = load_yaml(sources.pop(0)) if sources and sources[0].endswith(".yaml") else {}
        build_run_config(raw, parse_overrides(sources))  # raises ConfigError if an example is wrong


def test_the_matrix_examples_load(monkeypatch):
    monkeypatch.chdir(REPO)
    for argv in example_commands():
        if "matrix" in argv and "--help" not in argv:
            load_matrix(argv[argv.index("matrix") + 1])


# --------------------------------------------------------------------------- did you mean


NAMES = list(known_keys(RunConfig))


@pytest.mark.parametrize(
    "typo, expected",
    [
        ("model.n_head", ["model.n_heads"]),  # not also model.n_kv_heads, clearly further off
        ("model.norm_placment", ["model.norm_placement"]),
        ("model.nhead", ["model.n_heads"]),
        ("optimizer.lrr", ["optimizer.lr"]),
        ("model.lr", ["optimizer.lr"]),  # the right name in the wrong section
        ("model.max_step", ["trainer.max_steps"]),
        ("trainr", ["trainer"]),  # a section
        ("task.tokenizer.encodng", ["task.tokenizer.encoding"]),
        ("model.xyzzy", []),  # nothing like it, and never the section above it
    ],
)
def test_the_closest_keys_of_typos(typo, expected):
    assert closest_keys(typo, NAMES) == expected


def test_a_key_with_one_letter_missing_is_found_again():
    """Brute force over every key of the listing: drop one letter of its last part (first, middle,
    last); unless that spells a name that exists, the key is among the suggestions."""
    leaves = {name.rpartition(".")[2] for name in NAMES}
    checked = 0
    for name, key in known_keys(RunConfig).items():
        if not key.definitions:
            continue
        section, _, leaf = name.rpartition(".")
        for i in {0, len(leaf) // 2, len(leaf) - 1}:
            typo_leaf = leaf[:i] + leaf[i + 1 :]
            if not typo_leaf or typo_leaf in leaves:
                continue
            checked += 1
            typo = f"{section}.{typo_leaf}" if section else typo_leaf
            assert name in closest_keys(typo, NAMES), typo
    assert checked > 200


def run_cli(capsys, tmp_path: Path, *argv: str) -> tuple[int, str]:
    code = main(["--results-dir", str(tmp_path / "results"), *argv])
    return code, capsys.readouterr().err


def test_a_typo_on_the_command_line_is_named_there_with_the_key_it_meant(capsys, tmp_path):
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump({"model": {"d_modl": 64}, "trainer": {"max_steps": 5}}))
    code, err = run_cli(capsys, tmp_path, "train", str(config), "model.n_head=4")
    assert code == 2 and err.startswith("blockbench: config error:\n")
    lines = err.splitlines()[1:]
    assert "model.n_head: unknown key; did you mean model.n_heads? (set on the command line)" in lines
    assert f"model.d_modl: unknown key; did you mean model.d_model? (set in {config})" in lines
    assert not (tmp_path / "results").exists()


def test_an_override_is_blamed_where_it_replaces_the_files_value(capsys, tmp_path):
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"max_steps": 5}}))
    _, err = run_cli(capsys, tmp_path, "train", str(config), "trainer.max_steps=many")
    assert "trainer.max_steps: Input should be a valid integer" in err
    assert err.rstrip().endswith("(set on the command line)") and str(config) not in err
    config.write_text(yaml.safe_dump({"trainer": {"max_steps": "many"}}))
    _, err = run_cli(capsys, tmp_path, "train", str(config), "trainer.batch_size=4")
    assert err.rstrip().endswith(f"(set in {config})")


def test_another_tasks_key_names_the_tasks_that_have_it(capsys, tmp_path):
    _, err = run_cli(capsys, tmp_path, "train", "task=vit", "task.seq_len=16")
    owners = [name for name, cls in TASK_CONFIGS.items() if "seq_len" in cls.model_fields]
    assert "vit" not in owners and len(owners) >= 2
    assert f"task.seq_len: unknown key for this task; task.seq_len is a key of {', '.join(owners)} only" in err


def test_where_a_key_was_set():
    """``Origins.of``: the deepest override at or above the key, else the file; a section: all of them."""
    where = Origins.given(
        {"model": {"d_model": 30}, "task": "lm"},
        "base.yaml",
        {"model.n_heads": 4, "task": "vit", "task.seq_len": 3},
        {"model.n_heads": "on the command line", "task.seq_len": "by m.yaml's axis task.seq_len"},
    )
    assert where.of("model.n_heads") == "on the command line"
    assert where.of("model.d_model") == "in base.yaml"
    assert where.of("model") == "in base.yaml and on the command line"
    assert where.of("task.seq_len") == "by m.yaml's axis task.seq_len"
    assert where.of("task.image_size") == "by an override"  # under task=vit, whose origin was not given
    assert where.of("trainer.max_steps") == ""  # a default: set nowhere
    assert where.of("") == ""  # the config as a whole


# --------------------------------------------------------------------------- the matrix file


def test_a_trainer_block_in_a_matrix_file_says_where_run_settings_go(capsys, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        yaml.safe_dump({"name": "m", "trainer": {"max_steps": 600}, "axis": {"seed": [0]}, "axes": {"seed": [0]}})
    )
    code, err = run_cli(capsys, tmp_path, "matrix", str(path))
    assert code == 2
    takes = f"a matrix file takes: {', '.join(MatrixConfig.model_fields)}"
    assert takes.startswith("a matrix file takes: name, description, base, overrides, axes")
    assert (
        f"{path}: trainer: unknown key; {takes}; trainer is a run config section: put run settings under "
        "overrides: (e.g. overrides: {trainer.max_steps: 600})"
    ) in err
    assert f"{path}: axis: unknown key; did you mean axes? A matrix file takes: name," in err


def test_a_matrix_cells_bad_keys_name_the_overrides_the_axis_and_the_base(tmp_path):
    path = write_matrix(tmp_path, {"model.norm_placment": ["pre"]}, {**TINY_LM, "optimizer": {"lrr": 0.1}})
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "overrides": {"model.n_head": 2}}))
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    lines = str(info.value).splitlines()
    cell = f"{path} [cell model.norm_placment=pre]: "
    assert f"{cell}model.n_head: unknown key; did you mean model.n_heads? (set in m.yaml's overrides:)" in lines
    assert (
        f"{cell}model.norm_placment: unknown key; did you mean model.norm_placement? "
        "(set by m.yaml's axis model.norm_placment)"
    ) in lines
    base = tmp_path / "base.yaml"
    assert f"{cell}optimizer.lrr: unknown key; did you mean optimizer.lr? (set in {base})" in lines


# --------------------------------------------------------------------------- errors the command line reports


def test_user_errors_are_reported_and_bugs_are_not():
    assert _user_error(ConfigError("bad")) == "config error:\nbad"
    assert _user_error(DataError("bad file")) == "data error: bad file"
    held = FolderHeld({})
    assert _user_error(held) == str(held)
    assert _user_error(RuntimeError("a bug")) is None
    assert _user_error(ValueError("a bug")) is None


# --------------------------------------------------------------------------- the start-up benchmark


def cli_startup_script():
    """``benchmarks/speed/cli_startup.py`` imported as the module it runs as."""
    return importlib.import_module("benchmarks.speed.cli_startup")


def startup_rows(table: str) -> list[str]:
    """The rows of the start-up table: the lines after its column heads, under the report's header."""
    lines = table.splitlines()
    heads = next(i for i, line in enumerate(lines) if line.startswith("command "))
    return lines[heads + 1 :]


def test_the_startup_table_gives_each_commands_median_and_range():
    table = cli_startup_script().report(
        {"blockbench --help": [0.3, 0.1, 0.2], "blockbench list": [0.5, 0.4]}, "python -m benchmarks.speed.cli_startup"
    )
    rows = {line.split("  ")[0]: line.split()[-5:] for line in startup_rows(table)}
    assert rows["blockbench --help"] == ["3", "0.200", "0.100", "-", "0.300"]
    assert rows["blockbench list"] == ["2", "0.450", "0.400", "-", "0.500"]


@pytest.mark.slow  # every command in fresh processes (about 25 s); run with -m slow
def test_the_startup_benchmark_times_every_command_in_fresh_processes():
    process = subprocess.run(
        [sys.executable, "-m", "benchmarks.speed.cli_startup", "--rounds", "1", "--cold-rounds", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr
    rows = startup_rows(process.stdout)
    assert [row.split("  ")[0] for row in rows] == [
        "blockbench --help",
        "blockbench train --help",
        "blockbench list",
        "blockbench list model",
        "blockbench train configs/base.yaml model.n_head=4",
        "python -c 'import blockbench.config'",
    ]
    assert all(row.split()[-5] == "1" for row in rows)


def test_two_configs_trained_at_once_into_folders_of_one_name_get_tensorboard_runs_of_their_own(tmp_path, monkeypatch):
    """Two ``blockbench train --out .../seed0`` runs of other configs (as a lineage check trains cells of
    two matrices at once) must not share a TensorBoard folder: a starting run clears its folder, and
    the other's event file then vanishes under it."""
    from blockbench import cli

    seen = []
    monkeypatch.setattr(
        cli,
        "_train_into",
        lambda args, run, out, tb_dir, name, version, talk: seen.append((tb_dir, name, version)) or 0,
    )
    for variant in ("pre", "post"):
        out = tmp_path / variant / "seed0"
        assert (
            main(["--results-dir", str(tmp_path), "train", f"model.norm_placement={variant}", "--out", str(out)]) == 0
        )
    assert len(seen) == 2 and seen[0][:2] == seen[1][:2]
    assert seen[0][2] != seen[1][2], seen
