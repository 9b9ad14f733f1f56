"""Which checkpoint a cell would resume from, read without changing anything.

An interrupted cell leaves ``checkpoints/last.ckpt`` (written by ``blockbench.cell``'s
``StepCheckpoint``), which holds, under its ``ResumeState`` callback's state, the config hash, code
fingerprint and hardware (device kind and precision) of the run that wrote it. A cell resumes only a
checkpoint of its own config and code made on the hardware it trains on; any other is replaced when
the cell trains. The planner (``blockbench.matrix``) asks here what
the cell's training process will find, so that ``--dry-run`` and the progress line say "resumes from
step N" without importing Lightning or touching the folder; the cell's own process inspects the
same file again and clears what it cannot resume. Torch is imported only where a checkpoint exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .record import Hardware

#: the checkpoint an interrupted cell resumes (``blockbench.cell.callbacks.StepCheckpoint.FILE``)
LAST_CHECKPOINT = "last.ckpt"
#: the key of the resume state in a checkpoint's callbacks (``blockbench.cell.callbacks.ResumeState``)
RESUME_STATE = "ResumeState"


@dataclass(frozen=True)
class Resume:
    """What an earlier, interrupted run of a cell left behind: the checkpoint to resume and its
    step, or why there is none to resume."""

    checkpoint: Path | None = None
    step: int = 0
    #: a checkpoint exists but cannot be loaded
    error: str | None = None
    #: an intact checkpoint of another config, of other code or of other hardware, which the cell replaces
    note: str | None = None


def resumable_checkpoint(checkpoints: Path, config_hash: str, fingerprint: str, hardware: Hardware) -> Resume:
    """``last.ckpt`` in the ``checkpoints`` folder of an interrupted run of this same config
    (``config_hash``) and code (``fingerprint``) on this ``hardware``, with its step; else why it would
    not be resumed: one that cannot be loaded, or one of another config, other code or other hardware
    (a checkpoint that names none was written before checkpoints did). Reads only."""
    last = Path(checkpoints) / LAST_CHECKPOINT
    if not last.is_file():
        return Resume()
    import torch  # only where there is a checkpoint: planning a fresh matrix loads no torch

    try:
        state = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
        saved, step = state["callbacks"][RESUME_STATE], int(state["global_step"])
        saved_hash, saved_fingerprint = saved["config_hash"], saved.get("code_fingerprint")
        saved_hardware = Hardware.model_validate(saved["hardware"]) if saved.get("hardware") else None
    except Exception as error:  # e.g. truncated by a full disk, or not a checkpoint at all
        reason = (str(error).strip().splitlines() or [""])[0][:300]
        return Resume(
            error=f"checkpoint {last} could not be loaded ({type(error).__name__}: {reason}); starting from step 0"
        )
    if saved_hash != config_hash:
        what = f"of another config ({saved_hash})"
    elif saved_fingerprint != fingerprint:
        what = f"written by other code (fingerprint {str(saved_fingerprint)[:12]} -> {fingerprint[:12]})"
    elif saved_hardware != hardware:
        made = saved_hardware.describe() if saved_hardware is not None else "unrecorded hardware"
        what = f"made on {made}; this run resolves {hardware.describe()}"
    else:
        return Resume(last, step)
    return Resume(note=f"checkpoint {last} (step {step}) is {what}; starting from step 0")
