"""``blockbench``: train one config, run a matrix, rebuild a report, show the MFU peak, list the config keys.

The module imports only what parsing the command line needs: each command imports its own stack
(the config classes with the models and tasks, torch, Lightning, the report's plotting) when it
runs, so that ``blockbench --help``, a command's ``--help`` and ``blockbench list`` (which reads the
config keys from its cache, ``blockbench.listing``) answer at once rather than after the seconds that
loading torch and Lightning take (``benchmarks/speed/cli_startup.py`` times them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .lifeline import RUNNER_ENV, FolderHeld, die_with_parent, hold, watch_runner
from .store.layout import CELLS_DIR, CHECKPOINT_DIR, CONFIG_FILE, RESULT_FILE

if TYPE_CHECKING:
    from .config import RunConfig

#: where ``blockbench train``'s overrides were set, as a config error names it
COMMAND_LINE = "on the command line"
#: the longest run-folder label ``blockbench train`` derives from the overrides (the config hash follows it)
MAX_LABEL_CHARS = 60


def run_folder_name(config_file: str | None, overrides: dict[str, object], config_hash: str) -> str:
    """The folder name of a ``blockbench train`` run: what it changed, then its config's hash, e.g.
    ``norm_placement=post,lr=0.001-1a2b3c4d`` (``defaults-...`` for none; ``...,+3-...`` where more
    overrides than fit): runs of other configs never share a folder, and the name still says what each
    one is, as a matrix cell's folder does."""
    parts = [Path(config_file).stem] if config_file and Path(config_file).stem != "base" else []
    parts += [
        f"{key.rsplit('.', 1)[-1]}={value}".replace("/", "_").replace(" ", "")
        for key, value in overrides.items()
        if key not in ("task", "task.name")
    ]
    shown: list[str] = []
    for part in parts:
        if len(",".join([*shown, part])) > MAX_LABEL_CHARS:
            shown.append(f"+{len(parts) - len(shown)}")
            break
        shown.append(part)
    return f"{','.join(shown) or 'defaults'}-{config_hash[:8]}"


def earlier_run(out: Path, run: RunConfig) -> tuple[str, str | None]:
    """What ``out`` already holds: ``("none", None)``; ``("same", None)``, an unfinished run of this
    config (it resumes; a matrix writes its cell's config there first); ``("done", None)``, this
    config's finished run; or ``("other", why)``, a run of another config, which training would replace."""
    from .config import ConfigError, build_run_config, load_yaml
    from .store.record import read_record

    record = read_record(out / RESULT_FILE) if (out / RESULT_FILE).is_file() else None
    if record is not None:
        if record.config_hash == run.config_hash():
            return "done", None
        return "other", f"it holds the result of another config ({record.config_hash}, {record.status})"
    if (out / CONFIG_FILE).is_file():
        try:
            earlier = build_run_config(load_yaml(out / CONFIG_FILE), {}, source=str(out / CONFIG_FILE)).config_hash()
        except ConfigError:
            return "other", f"it holds a config that no longer validates ({out / CONFIG_FILE})"
        if earlier != run.config_hash():
            return "other", f"it holds an unfinished run of another config ({earlier})"
        return "same", None
    return "none", None


def _train(args: argparse.Namespace) -> int:
    sources = list(args.config_or_overrides)
    config_file = sources.pop(0) if sources and sources[0].endswith((".yaml", ".yml")) else None
    in_matrix = bool(os.environ.get(RUNNER_ENV))  # a matrix's cell (or a DDP rank of one)
    if not in_matrix:  # a matrix checked its cells before the first trained; here a typo is told at once
        from .precheck import precheck

        precheck(config_file, sources, COMMAND_LINE)

    from .config import build_run_config, load_yaml, parse_overrides
    from .matrix.launch import accept_interrupts

    accept_interrupts()  # a matrix stops its cells with SIGINT, even one started with it ignored
    if in_matrix:  # it dies with the runner, however it dies
        if os.getppid() != 1:
            die_with_parent(os.getppid())
        watch_runner()

    raw = load_yaml(config_file) if config_file else {}
    overrides = parse_overrides(sources)
    run = build_run_config(raw, overrides, source=config_file or "", origins=dict.fromkeys(overrides, COMMAND_LINE))
    name = run_folder_name(config_file, overrides, run.config_hash())
    root = Path(args.results_dir) / "train"
    out = Path(args.out) if args.out else root / run.task.display_name / name
    tb_dir, tb_name, tb_version = tensorboard_run(args, run.task.display_name, name, root)
    if args.dry_run:
        print(dry_run_text(run, out, tb_dir, earlier_run(out, run)))
        return 0
    from lightning.pytorch.utilities import rank_zero_only  # after validation: a config error is told sooner

    talk = rank_zero_only.rank == 0 and not args.quiet
    # one process per folder: rank 0 holds its lock (DDP ranks share the folder with it) before it
    # looks at what the folder holds
    with hold(out) if rank_zero_only.rank == 0 else contextlib.nullcontext():
        return _train_into(args, run, out, tb_dir, tb_name, tb_version, talk)


def tensorboard_run(args: argparse.Namespace, task: str, name: str, root: Path) -> tuple[Path, str, str]:
    """Where ``blockbench train`` logs its TensorBoard run: ``--tb-dir``/``--tb-name``/``--tb-version``,
    by default ``RESULTS/train/tb/<task>/<name>``, ``name`` being the run folder's name without ``--out``
    (what the config changes and its hash). The version never comes from ``--out``'s last part: two
    configs trained at once into ``a/seed0`` and ``b/seed0`` would share one TensorBoard folder, and each
    start clears it."""
    return Path(args.tb_dir or root / "tb"), args.tb_name or task, args.tb_version or name


#: what ``blockbench train --dry-run`` says a run folder's state means for the run
DRY_RUN_STATES = {
    "none": "it would train from step 0",
    "same": "it holds an unfinished run of this config, which would resume from its last checkpoint",
    "done": "it already holds this config's result: nothing would train (--force trains it again)",
}


def dry_run_text(run: RunConfig, out: Path, tb_dir: Path, earlier: tuple[str, str | None]) -> str:
    """What ``blockbench train --dry-run`` prints: that the config is valid, where it would train and
    what that folder holds, then the fully resolved config (every default filled in), which can be
    saved as a file to copy and edit."""
    from .config import to_yaml

    state, why = earlier
    then = DRY_RUN_STATES.get(state) or f"{why}: training would stop there (--force replaces it, --out picks another)"
    return (
        f"blockbench: the config is valid (config hash {run.config_hash()[:8]}); nothing was trained or written\n"
        f"task {run.task.display_name}, {run.trainer.max_steps} steps, seed {run.seed}\n"
        f"run folder: {out}: {then}\n"
        f"TensorBoard: tensorboard --logdir {tb_dir}\n"
        "resolved config (save it as a .yaml file to copy and edit):\n" + to_yaml(run).rstrip()
    )


def _train_into(
    args: argparse.Namespace, run: RunConfig, out: Path, tb_dir: Path, tb_name: str, tb_version: str, talk: bool
) -> int:
    """Train ``run`` into ``out`` unless the folder holds what ``--force`` alone may replace."""
    from lightning.pytorch.utilities import rank_zero_only

    from .cell.train import error_record, train
    from .config import ConfigError
    from .store.record import write_record

    state, why = earlier_run(out, run)
    if args.force and state != "none":
        for file in (RESULT_FILE, CONFIG_FILE):
            (out / file).unlink(missing_ok=True)
        shutil.rmtree(out / CHECKPOINT_DIR, ignore_errors=True)
        shutil.rmtree(tb_dir / tb_name / tb_version, ignore_errors=True)
    elif state == "other":
        raise ConfigError(
            f"{out}: {why}; training here would replace it. Pass --force to replace it, or choose "
            "another folder with --out (without --out every config gets a folder of its own)"
        )
    elif state == "done":
        if talk:
            print(
                f"blockbench: {out} already holds this config's result ({out / RESULT_FILE}); "
                "pass --force to train it again",
                flush=True,
            )
        return 0
    if talk:
        print(f"blockbench: training into {out} (TensorBoard: tensorboard --logdir {tb_dir})", flush=True)
    try:
        hparams = json.loads(args.hparams) if args.hparams else {"task": run.task.display_name, "seed": run.seed}
        result = train(
            run,
            out,
            tb_dir=tb_dir,
            tb_name=tb_name,
            tb_version=tb_version,
            hparams=hparams,
            tb_scope=args.tb_scope,
            tb_views=json.loads(Path(args.tb_views).read_text()) if args.tb_views else None,
            progress_every=args.progress_every,
            from_process_start=True,  # this process is the run's: its start-up counts
        )
    except Exception as error:  # recorded as a failed cell; the matrix goes on
        if rank_zero_only.rank == 0:
            write_record(out / RESULT_FILE, error_record(run, error))
        raise
    if not talk:  # other DDP processes: rank 0 reports; a matrix prints its own line
        return 0
    if result.ok:
        print(json.dumps({"metrics": result.metrics, "baselines": result.baselines}, indent=2))
    else:
        print(
            f"diverged at step {result.diverged_at_step} (loss {result.diverging_loss}, "
            f"last finite loss {result.last_finite_loss})"
        )
    print(f"blockbench: result in {out / RESULT_FILE} (config: {out / CONFIG_FILE})", flush=True)
    return 0


def _jobs(value: str) -> int | str:
    """``--jobs``: a number of cells (1 or more) or ``auto``."""
    if value == "auto":
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a number of cells to run at once (1 or more), or auto")
    return int(value)


def _matrix(args: argparse.Namespace) -> int:
    from .matrix_command import matrix_command

    return matrix_command(args)


#: where ``blockbench report --index`` looks for the matrix files to list those not run yet (from the repo root)
MATRICES_DIR = Path("configs/matrix")


def _report(args: argparse.Namespace) -> int:
    from .config import ConfigError
    from .report.summary import write_report

    if args.index is not None:
        return _index(args)
    if args.tensorboard:
        from .tensorboard.rebuild import write_tensorboard

        if args.matrix_dir is None:
            raise ConfigError("blockbench report --tensorboard: pass a matrix results folder or a results root")
        print(write_tensorboard(Path(args.matrix_dir)))
        return 0
    if args.matrix_dir is None:
        raise ConfigError(
            "blockbench report: pass a matrix results folder such as results/<matrix name>, "
            "or --index results for the verdicts of every matrix"
        )
    matrix_dir = Path(args.matrix_dir)
    if not (matrix_dir / CELLS_DIR).is_dir():
        raise ConfigError(
            f"{matrix_dir}: no {CELLS_DIR}/ folder; pass a matrix results folder such as results/<matrix name>"
        )
    print(write_report(matrix_dir))
    return 0


def _index(args: argparse.Namespace) -> int:
    """``blockbench report --index RESULTS``: write RESULTS/README.md, the verdicts of every matrix there."""
    from .config import ConfigError
    from .report.index import write_index

    if args.matrix_dir is not None:
        raise ConfigError(
            f"blockbench report: give a matrix folder ({args.matrix_dir}) or --index {args.index}, not both"
        )
    root = Path(args.index)
    if not root.is_dir():
        raise ConfigError(
            f"--index {root}: no such folder; pass the folder that holds the matrix results, e.g. --index results"
        )
    if args.matrices is not None and not Path(args.matrices).is_dir():
        raise ConfigError(
            f"--matrices {args.matrices}: no such folder; pass the folder of the matrix files, e.g. configs/matrix"
        )
    matrices = Path(args.matrices) if args.matrices is not None else MATRICES_DIR if MATRICES_DIR.is_dir() else None
    command = f"blockbench report --index {args.index}" + (
        f" --matrices {args.matrices}" if args.matrices is not None else ""
    )
    print(write_index(root, matrices, command=command))
    return 0


def _peak(args: argparse.Namespace) -> int:
    import torch

    from .cell.perf import peak_flops
    from .config import TrainerConfig

    trainer = TrainerConfig(accelerator=args.accelerator, precision=args.precision)
    accelerator = (
        trainer.accelerator if trainer.accelerator != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")
    )
    device = torch.device("cuda", 0) if accelerator in ("gpu", "cuda") else torch.device(accelerator)
    peak = peak_flops(
        None, device, trainer.resolved_precision(accelerator), threads=args.threads, remeasure=args.remeasure
    )
    print(json.dumps({"peak_tflops": peak.tflops, "peak_source": peak.source, "peak_probe": peak.probe}, indent=2))
    return 0


def _list(args: argparse.Namespace) -> int:
    from .listing import format_listing, load_listing, select

    listing = load_listing()
    keys = select(listing.keys, args.query)
    if not keys:
        print(
            f"blockbench list: no config key matches '{args.query}'; `blockbench list` shows them all", file=sys.stderr
        )
        return 1
    try:
        print(format_listing(keys, listing.titles), flush=True)
    except BrokenPipeError:  # `blockbench list | head`: the reader is gone; say nothing more (Python docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _env(args: argparse.Namespace) -> int:
    from .provenance import constraints_text, environment_report

    print(
        constraints_text() if args.constraints else json.dumps(environment_report(), indent=2),
        end="" if args.constraints else "\n",
    )
    return 0


#: where runs go by default (git ignores it), and the committed results (the book), which only
#: ``--results-dir results`` updates
RUNS_DIR, BOOK_DIR = "runs", "results"

#: the examples under each ``--help`` (argparse epilogs; tests/test_cli.py parses every one of them)
EXAMPLES = {
    "blockbench": """\
examples:
  blockbench train task=vit model.norm_placement=post      train one config: key=value overrides
  blockbench matrix configs/matrix/smoke.yaml --dry-run    a matrix's cells, what is done, the time left
  blockbench matrix configs/matrix/smoke.yaml              run them, then write the summary
  blockbench report --index results                        the verdicts of every matrix
  blockbench list moe                                      the config keys that mention MoE
  blockbench train --help                                  one command's options and examples""",
    "train": """\
examples:
  blockbench train                                         the defaults: the lm task, 300 steps
  blockbench train task=vit model.norm_placement=post trainer.max_steps=50
  blockbench train configs/base.yaml model.pos_encoding=rope --out runs/rope
  blockbench train task=vit --dry-run                      check a config, print it resolved, train nothing
  blockbench train task=wikitext103 task.seq_len=128       a preset, refined
keys and their defaults: blockbench list (blockbench list model, blockbench list seq_len)""",
    "matrix": """\
examples:
  blockbench matrix configs/matrix/smoke.yaml --dry-run    check every cell, list what would run
  blockbench matrix configs/matrix/smoke.yaml --jobs 2     two cells at a time
  blockbench --results-dir results matrix configs/matrix/norm_type.yaml    update the committed book
a matrix file takes name, base, overrides (run settings, e.g. trainer.max_steps: 600), axes and tune:
see configs/matrix/ and the README""",
    "report": """\
examples:
  blockbench report runs/smoke                             rebuild runs/smoke/summary.md and .csv
  blockbench report --index results                        write results/README.md
  blockbench report results --tensorboard                  rebuild every matrix's TensorBoard runs from its records""",
    "list": """\
examples:
  blockbench list                                          every key
  blockbench list model                                    the model section
  blockbench list n_head                                   keys whose name or meaning mention n_head
  blockbench list moe | less""",
}


def _examples(command: str) -> dict[str, object]:
    """A subcommand parser's epilog of examples, printed as written."""
    return {"epilog": EXAMPLES[command], "formatter_class": argparse.RawDescriptionHelpFormatter}


def _add_matrix_parser(commands: argparse._SubParsersAction) -> None:
    """``blockbench matrix`` and its options."""
    matrix = commands.add_parser(
        "matrix", help="run every cell of a matrix file, then write the summary", **_examples("matrix")
    )
    matrix.add_argument("matrix", help="matrix YAML, e.g. configs/matrix/prenorm_vs_postnorm.yaml")
    rerun = matrix.add_mutually_exclusive_group()
    rerun.add_argument(
        "--force", action="store_true", help="rerun cells from scratch, even those that already have a result"
    )
    rerun.add_argument(
        "--reuse-stale",
        action="store_true",
        help="reuse results made by other code (their code fingerprint differs, e.g. after editing "
        "models/ or tasks/) instead of retraining those cells",
    )
    matrix.add_argument(
        "--dry-run",
        action="store_true",
        help="validate every cell, list each one's status (done, stale, resumable, to run) and an "
        "estimate of the wall time, then exit without training or writing anything; a variant with no "
        "earlier results here is timed first with a short fit (seconds each), where one cannot be: ~?",
    )
    matrix.add_argument(
        "--time-cells",
        action="store_true",
        help="before the first cell, time a cell of each variant with no earlier results here (a short fit "
        "each), for an ETA from the start; without it the ETA comes from earlier results, and from the "
        "cells as they finish",
    )
    matrix.add_argument(
        "--jobs",
        type=_jobs,
        default="auto",
        metavar="N",
        help="run up to N cells at once (CPU threads split between them; one GPU each if there are "
        "GPUs); auto (default): one per GPU, else one per CPU core, each on one thread",
    )
    matrix.add_argument(
        "--launcher",
        choices=["local", "slurm", "submitit-local"],
        default="local",
        help="local: run cells here; slurm: one SLURM job per cell through submitit (waits for all); "
        "submitit-local: the job path as local processes, to try it out",
    )
    matrix.add_argument("--slurm-partition", help="SLURM partition for --launcher slurm")
    matrix.add_argument("--slurm-account", help="SLURM account for --launcher slurm")
    matrix.add_argument("--slurm-time", type=int, default=240, metavar="MINUTES", help="time limit of each cell's job")
    matrix.add_argument("--slurm-cpus-per-task", type=int, default=8, help="CPUs per task (data loading)")
    matrix.set_defaults(func=_matrix)


def _add_report_parser(commands: argparse._SubParsersAction) -> None:
    """``blockbench report`` and its options."""
    report = commands.add_parser(
        "report",
        help="rebuild summary.md/summary.csv of a matrix results folder, or with "
        "--index the verdicts of every matrix (results/README.md)",
        **_examples("report"),
    )
    report.add_argument("matrix_dir", nargs="?", help="e.g. results/prenorm_vs_postnorm")
    report.add_argument(
        "--index",
        metavar="RESULTS",
        help="write RESULTS/README.md instead: one row per variant vs baseline of every matrix in "
        "RESULTS, a verdict per model family and whether it transfers, and the matrices not run yet",
    )
    report.add_argument(
        "--matrices",
        metavar="DIR",
        help="with --index: the folder of the matrix files to list as not run yet (default: "
        f"{MATRICES_DIR} if it exists, else the folders of the matrix files the results were made from)",
    )
    report.add_argument(
        "--tensorboard",
        action="store_true",
        help="write the TensorBoard runs (MATRIX_DIR/tb/<task>, tuning runs MATRIX_DIR/tb_tune/<task>) from the "
        "cells' records instead, for a matrix folder or every matrix of a results root (e.g. results): "
        "tensorboard --logdir results/<matrix>/tb/<task>",
    )
    report.set_defaults(func=_report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blockbench",
        description=__doc__.split("\n\n")[0].replace("``", ""),  # the docstring's markup is not for a terminal
        epilog=EXAMPLES["blockbench"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--results-dir",
        default=RUNS_DIR,
        help=f"where runs go (default: {RUNS_DIR}/, which git ignores; --results-dir {BOOK_DIR} "
        "updates the committed results)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser(
        "train", help="train one config (a YAML file and/or key=value overrides)", **_examples("train")
    )
    train.add_argument(
        "config_or_overrides",
        nargs="*",
        metavar="CONFIG.yaml | key=value",
        help="an optional run config file, then dotted overrides such as task=vit model.norm_placement=post",
    )
    train.add_argument(
        "--out",
        help="folder for config.yaml and result.json (default: RESULTS/train/<task>/<what the "
        "overrides change>-<config hash>, a folder per config)",
    )
    train.add_argument(
        "--force",
        action="store_true",
        help="replace what the folder holds (another config's run, or this config's finished one)",
    )
    train.add_argument("--tb-dir", help="TensorBoard root (default: RESULTS/train/tb)")
    train.add_argument("--tb-name", help="TensorBoard run name (default: the task)")
    train.add_argument("--tb-version", help="TensorBoard run version (default: what the config changes and its hash)")
    train.add_argument(
        "--tb-scope",
        help="name the TensorBoard tags after this scope, val/<scope>/loss (the matrix "
        "runner passes the task, so that each chart holds one task's runs)",
    )
    train.add_argument(
        "--tb-views",
        help="JSON file of the HParams columns and Custom Scalars charts to write into "
        "the run (the matrix runner's tb/<task>/views.json)",
    )
    train.add_argument("--hparams", help="JSON of the cell's varied keys, listed in TensorBoard's HParams dashboard")
    train.add_argument(
        "--progress-every",
        type=int,
        metavar="N",
        help="when stdout is not a terminal, print a progress line every N optimizer steps "
        "(default: 10 lines over trainer.max_steps)",
    )
    train.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config, say where it would train and what that folder holds, print the "
        "resolved config, then exit without training or writing anything",
    )
    train.add_argument(
        "--quiet",
        action="store_true",
        help="do not print the metrics at the end (the matrix runner prints its own line per cell)",
    )
    train.set_defaults(func=_train)

    _add_matrix_parser(commands)

    _add_report_parser(commands)
    peak = commands.add_parser("peak", help="show the cached peak FLOP/s that MFU divides by (measured on first use)")
    peak.add_argument(
        "--precision", default="auto", help="a Lightning precision (auto: bf16-mixed on a GPU, 32-true on a CPU)"
    )
    peak.add_argument("--accelerator", default="auto", help="cpu or gpu (auto: a GPU if there is one)")
    peak.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch intra-op threads on a CPU (default: torch's default, what a cell without "
        "trainer.num_threads uses; --jobs N gives each cell cores/N)",
    )
    peak.add_argument("--remeasure", action="store_true", help="measure again and replace the cached peak")
    peak.set_defaults(func=_peak)

    env = commands.add_parser(
        "env", help="print the package versions, hardware and code version results record (paste it into bug reports)"
    )
    env.add_argument(
        "--constraints",
        action="store_true",
        help="print a pip constraints file pinning every installed dependency instead (how constraints.txt is made)",
    )
    env.set_defaults(func=_env)

    listing = commands.add_parser(
        "list",
        help="print every config key (a run config's or a matrix axis's) with its default, type and meaning, "
        "and the names each variant key, task.name and task preset accept",
        **_examples("list"),
    )
    listing.add_argument(
        "query",
        nargs="?",
        help="show only a section or key prefix (model, trainer, task.augment) or the keys whose "
        "key, meaning or names contain QUERY (moe, kv, attention)",
    )
    listing.set_defaults(func=_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("blockbench: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        said = _user_error(error)
        if said is None:
            raise
        print(f"blockbench: {said}", file=sys.stderr)
        return 2


def _user_error(error: Exception) -> str | None:
    """What to print, without a traceback, for a mistake of the user's (a config, the data, a folder
    another process holds); None for a bug. The error classes are looked up among the modules already
    loaded: an error of a module that the command never imported cannot be one of its classes, and
    importing them here would load torch for every error."""
    config, data = sys.modules.get("blockbench.config"), sys.modules.get("blockbench.tasks.data")
    if config is not None and isinstance(error, config.ConfigError):
        return f"config error:\n{error}"
    if data is not None and isinstance(error, data.DataError):
        return f"data error: {error}"
    precheck = sys.modules.get("blockbench.precheck")
    if precheck is not None and isinstance(error, precheck.KeyProblems):
        return f"config error:\n{error}"
    if isinstance(error, FolderHeld):
        return str(error)
    return None
