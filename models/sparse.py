"""Fixed sparse attention patterns (Child et al. 2019, "Generating Long Sequences with Sparse
Transformers", Sec. 4.2) as boolean masks.

Every pattern is a function ``(q_len, k_len, *, window, stride, summary, device)`` returning a
``(q_len, k_len)`` bool tensor, True = may attend, the same convention as
``models.attention.attention_mask``, so a sparse mask composes with the causal and padding masks
by logical AND (``causal_mask & sparse``; the ``(Tq, Tk)`` shape broadcasts against
``(B, 1, 1, Tk)`` padding masks). The queries are the *last* ``q_len`` of the ``k_len`` positions
(query row ``r`` sits at position ``i = k_len - q_len + r``), as with a KV cache, so a decoding
step's mask equals the last rows of the full-sequence mask.

Patterns are symmetric in ``i - j`` where that makes sense; for a decoder the causal mask
removes the future half. Every pattern contains the diagonal ``i == j``, so combined with a
causal mask each query still attends at least one key (itself).

- ``dense``: everything.
- ``local``: sliding window, ``|i - j| < window``.
- ``strided``: ``|i - j| < stride`` (local part) or ``(i - j) % stride == 0`` (strided part).
- ``fixed``: block length ``stride``; same block (``j // stride == i // stride``) or ``j`` is
  one of the last ``summary`` positions of its block (``j % stride >= stride - summary``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .registry import SPARSITY

if TYPE_CHECKING:
    from .config import ModelConfig

DEFAULT_WINDOW = 128
DEFAULT_STRIDE = 128


def _positions(q_len: int, k_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Query positions ``i`` as a (q_len, 1) column and key positions ``j`` as a (1, k_len) row."""
    if q_len < 0 or k_len < 0:
        raise ValueError(f"lengths must be non-negative, got q_len={q_len}, k_len={k_len}")
    if q_len > k_len:
        raise ValueError(f"q_len={q_len} exceeds k_len={k_len}; queries are the last q_len key positions")
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return i, j


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


@SPARSITY.register("dense", "every query attends every key (no sparsity)")
def dense(q_len: int, k_len: int, *, window: int, stride: int, summary: int, device=None) -> torch.Tensor:
    _positions(q_len, k_len, device)  # validate the lengths
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device)


@SPARSITY.register("local", "sliding window: attend iff |i - j| < window")
def local(q_len: int, k_len: int, *, window: int, stride: int, summary: int, device=None) -> torch.Tensor:
    _check_positive("window", window)
    i, j = _positions(q_len, k_len, device)
    return (i - j).abs() < window


@SPARSITY.register("strided", "Child et al. strided: |i - j| < stride or (i - j) % stride == 0")
def strided(q_len: int, k_len: int, *, window: int, stride: int, summary: int, device=None) -> torch.Tensor:
    _check_positive("stride", stride)
    i, j = _positions(q_len, k_len, device)
    diff = i - j
    return (diff.abs() < stride) | (torch.remainder(diff, stride) == 0)


def check_fixed(cfg: ModelConfig) -> None:
    """The fixed pattern's summary positions are part of a block of ``attention_stride`` positions."""
    if cfg.attention_summary > cfg.attention_stride:
        raise ValueError(
            f"attention_pattern=fixed: attention_summary={cfg.attention_summary} exceeds attention_stride="
            f"{cfg.attention_stride}; a block of the fixed pattern has only attention_stride positions, so lower "
            "attention_summary or raise attention_stride"
        )


@SPARSITY.register(
    "fixed", "Child et al. fixed: same block of `stride`, or the last `summary` positions of a block", check=check_fixed
)
def fixed(q_len: int, k_len: int, *, window: int, stride: int, summary: int, device=None) -> torch.Tensor:
    _check_positive("stride", stride)
    if not 0 <= summary <= stride:
        raise ValueError(f"summary must be in [0, stride={stride}], got {summary}")
    i, j = _positions(q_len, k_len, device)
    same_block = torch.div(i, stride, rounding_mode="floor") == torch.div(j, stride, rounding_mode="floor")
    is_summary = torch.remainder(j, stride) >= stride - summary
    return same_block | is_summary


def sparse_mask(
    pattern: str,
    q_len: int,
    k_len: int,
    *,
    window: int = DEFAULT_WINDOW,
    stride: int = DEFAULT_STRIDE,
    summary: int = 1,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """The ``(q_len, k_len)`` bool mask of a named pattern (True = may attend), or None for "dense".

    Unknown names raise ``KeyError`` listing the registered patterns. AND the result with the causal
    / padding mask from ``models.attention.attention_mask`` (None means "no restriction").
    """
    make = SPARSITY.get(pattern)
    if pattern == "dense":
        _positions(q_len, k_len, device)  # still validate the lengths
        return None
    return make(q_len, k_len, window=window, stride=stride, summary=summary, device=device)


def attended_fraction(mask: torch.Tensor) -> float:
    """Fraction of True entries in a (..., Tq, Tk) bool mask: the share of (query, key) pairs attended.

    Pass the combined mask (causal & sparse & padding) to report the effective density.
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"attended_fraction expects a bool mask, got {mask.dtype}")
    if mask.numel() == 0:
        raise ValueError("attended_fraction of an empty mask is undefined")
    return mask.float().mean().item()
