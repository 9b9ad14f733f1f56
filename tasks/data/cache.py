"""A disk cache for prepared data (tokenized text, decoded images), keyed by what produced it.

Preparation runs once per key: the result is written into a temporary folder that is renamed
into place only when it is complete, so an interrupted or failed preparation leaves nothing that
a later run would trust, and the next run starts clean. The cache lives in ``$BLOCKBENCH_CACHE``
(default ``~/.cache/blockbench``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE_ENV = "BLOCKBENCH_CACHE"
MANIFEST = "manifest.json"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "blockbench")


def file_fingerprint(path: Path) -> dict[str, Any]:
    """What identifies a local file's content cheaply: its resolved path, size and modification time."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def cache_key(kind: str, description: dict[str, Any]) -> str:
    """Folder name for ``description`` (a JSON-serializable record of everything that shapes the data)."""
    digest = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:20]
    return f"{kind}-{digest}"


def cached(kind: str, description: dict[str, Any], prepare: Callable[[Path], None]) -> tuple[Path, bool]:
    """The cache folder for ``description``, prepared by ``prepare(folder)`` on first use.

    Returns ``(folder, hit)``; ``hit`` is True when the folder came from an earlier run. A
    preparation that raises leaves no folder behind.
    """
    final = cache_root() / cache_key(kind, description)
    if (final / MANIFEST).is_file():
        return final, True
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(final)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        prepare(tmp)
        (tmp / MANIFEST).write_text(json.dumps(description, indent=2, sort_keys=True) + "\n")
        try:
            os.replace(tmp, final)
        except OSError:  # another process (e.g. another DDP rank) finished the same preparation first
            if not (final / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, False


def _remove_stale_temporaries(final: Path) -> None:
    """Temporaries of killed preparations of the same key (their process no longer exists)."""
    for tmp in final.parent.glob(f"{final.name}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _process_exists(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
