"""Where a result came from: code version, packages, hardware, and the resources a run used."""

from __future__ import annotations

import hashlib
import importlib
import os
import platform
import resource
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

#: packages whose versions can change results
PACKAGES = (
    "torch",
    "lightning",
    "torchmetrics",
    "torchdata",
    "numpy",
    "sacrebleu",
    "tiktoken",
    "datasets",
    "torchvision",
)
REPO = Path(__file__).resolve().parents[1]
#: the code that can change a cell's numbers, as importable names: the block library, the tasks, the
#: trainer (``blockbench.cell``) and what resolves a cell's config. The runner, the planner, the CLI,
#: the records' reader and the report are left out: editing them leaves every committed result current.
FINGERPRINTED = ("blockbench.models", "blockbench.tasks", "blockbench.cell", "blockbench.config")


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpus": gpus, "gpu_count": len(gpus)}


def machine_description() -> str:
    """One line for the results' header: CPU model and core count, GPUs if any, torch and lightning."""
    hw = hardware()
    # the vector extensions torch uses: bf16 matmuls are fast with AVX-512/AMX, emulated (slow) with AVX2 only
    parts = [f"{hw['cpu']}, {hw['cpu_count']} logical CPUs ({torch.backends.cpu.get_cpu_capability()})"]
    if hw["gpus"]:
        parts.append(f"{hw['gpu_count']} x {hw['gpus'][0]}")
    parts.append(f"torch {torch.__version__}, lightning {package_versions()['lightning']}")
    return "; ".join(parts)


def package_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


#: folders of outputs: their uncommitted files (a matrix's fresh summary) leave the code clean
OUTPUT_DIRS = ("results",)


def git_state(repo: Path = REPO) -> dict[str, Any]:
    """The commit of the code that ran and whether its tracked files had uncommitted changes,
    outside ``OUTPUT_DIRS`` (a benchmark run after a matrix would otherwise count as dirty code)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}  # not a git checkout (e.g. installed from a wheel)
    excluded = [f":(exclude){folder}" for folder in OUTPUT_DIRS]
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", *excluded))}


def fingerprinted_sources() -> dict[str, Path]:
    """Each of :data:`FINGERPRINTED` and where it is imported from: a package's folder, a module's file."""
    sources = {}
    for name in FINGERPRINTED:
        module = importlib.import_module(name)
        path = Path(module.__file__)
        sources[name] = path.parent if path.name == "__init__.py" else path
    return sources


def source_fingerprint(sources: dict[str, Path]) -> str:
    """sha256 of the ``.py`` files of ``sources`` (name -> a package's folder or a module's file), each
    with its name and path in the package, in that order: the same code gives the same digest wherever
    it is installed (a clone, an editable or a wheel install)."""
    digest = hashlib.sha256()
    for name, path in sources.items():
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            label = f"{name}/{file.relative_to(path).as_posix()}" if path.is_dir() else name
            digest.update(label.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


@cache
def code_fingerprint() -> str:
    """The fingerprint of the code that decides a result (:data:`FINGERPRINTED`, see
    :func:`source_fingerprint`).

    A result or checkpoint of another fingerprint was made by other model, task, trainer or config
    code, so the matrix trains its cell again. Package versions (torch, lightning, ...) are left out:
    they are recorded in ``provenance``, an upgrade changes at most the last bits of a result rather
    than what it measures, and folding them in would retrain every cell after each ``pip install -U``.
    """
    return source_fingerprint(fingerprinted_sources())


def peak_memory_mb() -> dict[str, float]:
    """Peak memory of this process: CUDA max allocated on GPU, resident set size on CPU."""
    peak = {"cpu_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}  # KiB on Linux
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peak["cuda_max_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return peak


#: the distribution this repo installs as, and the extras whose packages committed results used
DISTRIBUTION = "blockbench-transformers"
RESULT_EXTRAS = ("dev", "bench")


def installed_requirements(distribution: str = DISTRIBUTION, extras: tuple[str, ...] = RESULT_EXTRAS) -> dict[str, str]:
    """Every installed package ``distribution`` (with ``extras``) needs, directly or through another,
    with its installed version: what ``pip install -c`` must pin to rebuild this environment.
    Requirements whose markers exclude this platform (or name a package that is not installed) are
    left out. (pip has no command for the closure of one package: ``pip freeze`` lists everything.)"""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pinned: dict[str, str] = {}
    pending = [(distribution, set(extras))]
    while pending:
        name, wanted_extras = pending.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            requirement = Requirement(line)
            environments = [{"extra": extra} for extra in wanted_extras] or [{"extra": ""}]
            if requirement.marker and not any(requirement.marker.evaluate(env) for env in environments):
                continue
            key = canonicalize_name(requirement.name)
            if key in pinned or key == canonicalize_name(distribution):
                continue
            try:
                pinned[key] = metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                continue
            pending.append((requirement.name, set(requirement.extras)))
    return dict(sorted(pinned.items()))


def constraints_text() -> str:
    """A pip constraints file pinning :func:`installed_requirements`, headed by the machine and Python."""
    header = [
        "# The exact package versions behind the committed results; install with them to reproduce",
        "# the numbers bit for bit (same versions and same CPU; see docs/reproducibility.md):",
        '#   pip install -c constraints.txt -e ".[dev,bench]"',
        f"# Written by `blockbench env --constraints > constraints.txt` with Python {sys.version.split()[0]} on",
        f"# {machine_description()}.",
    ]
    return "\n".join(header + [f"{name}=={version}" for name, version in installed_requirements().items()]) + "\n"


def environment_report() -> dict[str, Any]:
    """What ``blockbench env`` prints: versions, hardware, the CPU's vector extensions, the code's commit."""
    return {
        "packages": package_versions(),
        "hardware": hardware(),
        "cuda": cuda_versions(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "git": git_state(),
        "code_fingerprint": code_fingerprint(),
    }


def driver_version() -> str | None:
    """The NVIDIA driver's version: torch's (where it has ``torch.cuda.driver_version``), else
    ``nvidia-smi``'s; None without either."""
    query = getattr(torch.cuda, "driver_version", None)
    if query is not None:
        return str(query())
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines() if done.returncode == 0 else []
    return lines[0].strip() if lines else None


def cuda_versions() -> dict[str, Any] | None:
    """The CUDA runtime torch was built with, cuDNN, NCCL and the driver where CUDA is available (None
    on a machine without it): a GPU result's bits depend on them as a CPU result's on the packages."""
    if not torch.cuda.is_available():
        return None
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    return {
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "driver": driver_version(),
    }


def provenance() -> dict[str, Any]:
    return {
        "git": git_state(),
        "packages": package_versions(),
        "hardware": hardware(),
        "cuda": cuda_versions(),
        "command": " ".join(sys.argv),
    }
