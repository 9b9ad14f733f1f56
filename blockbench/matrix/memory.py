"""A GPU cell's expected peak of allocated memory, for packing several cells on one GPU
(:func:`blockbench.matrix.devices.packed_per_gpu`).

Best first: the peak an earlier run of the same task and variant recorded in the matrix folder
(``result.json`` ``peak_memory.cuda_max_allocated_mb``: ``torch.cuda.max_memory_allocated``), else the
largest such peak of the same task, else an estimate from the config (:func:`estimated_peak_bytes`):
the parameters with their gradients and AdamW's two moments in float32, the activations a block keeps
for backward (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models": ``s b h (34 + 5 a s / h)`` bytes per layer in 16-bit, twice that in float32) and the logits
with their gradient in float32. The estimate errs high (fused attention keeps no score matrix); the
packing adds its headroom and the CUDA context on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..config import RunConfig
from ..store.reuse import earlier_record
from .expand import Cell

MIB = 2**20
#: bytes per parameter while training: float32 weight and gradient, AdamW's two float32 moments
TRAINING_BYTES_PER_PARAMETER = 16
#: precisions whose activations are 16-bit
HALF_PRECISIONS = ("bf16-mixed", "bf16-true", "bf16", "16-mixed", "16-true", "16")


def estimated_peak_bytes(run: RunConfig, precision: str = "bf16-mixed") -> int:
    """An upper estimate of the allocated memory a cell of ``run`` peaks at when trained in
    ``precision`` on one device (see the module docstring); the vocabulary a task sets from its data
    counts as 50,304 (GPT-2's, padded) where the config does not know it yet."""
    model, trainer = run.resolved_model(), run.trainer
    d, heads, seq = model.d_model, model.n_heads, model.max_seq_len
    ffn = (model.d_ff or 4 * d) * max(1, model.n_experts + model.moe_shared_experts)
    layers = model.n_layers * (2 if model.family == "encoder_decoder" else 1)
    vocab = model.vocab_size or 50304
    parameters = layers * (4 * d * d + 3 * d * ffn) + (vocab + seq) * d
    batch = trainer.per_device_batch_size(1)
    width = 1 if precision in HALF_PRECISIONS else 2  # activations in 16-bit or in float32
    activations = layers * seq * batch * (34 * d + 5 * heads * seq) * width
    logits = 3 * batch * seq * vocab * 4  # the logits, their softmax and gradient in float32
    return TRAINING_BYTES_PER_PARAMETER * parameters + activations + logits


def recorded_peak_bytes(cell_dir: Path) -> int | None:
    """The peak of allocated GPU memory an earlier run of the cell in ``cell_dir`` recorded, if any."""
    record = earlier_record(cell_dir)
    peak = (record.peak_memory or {}).get("cuda_max_allocated_mb") if record else None
    return int(peak * MIB) if peak else None


def cell_peaks(cells: Sequence[Cell], matrix_dir: Path) -> list[int]:
    """Each cell's expected peak of allocated GPU memory (see the module docstring)."""
    recorded = {cell.key: recorded_peak_bytes(cell.directory(matrix_dir)) for cell in cells}
    by_variant: dict[tuple[str, str], int] = {}
    by_task: dict[str, int] = {}
    for cell in cells:
        if (peak := recorded[cell.key]) is not None:
            by_variant[cell.task, cell.variant] = max(peak, by_variant.get((cell.task, cell.variant), 0))
            by_task[cell.task] = max(peak, by_task.get(cell.task, 0))
    return [
        by_variant.get((cell.task, cell.variant))
        or by_task.get(cell.task)
        or estimated_peak_bytes(cell.run, cell.run.trainer.resolved_precision("gpu"))
        for cell in cells
    ]
