"""Sparse attention patterns (Child et al. 2019) against hand-written masks, and their composition
with the causal / padding masks of ``models.attention.attention_mask``."""

from __future__ import annotations

import pytest
import torch

from blockbench.models.attention import attention_mask
from blockbench.models.sparse import SPARSITY, attended_fraction, sparse_mask

PATTERNS = ("dense", "local", "strided", "fixed")
SPARSE = ("local", "strided", "fixed")


def as_mask(rows: list[str]) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row.split()] for row in rows], dtype=torch.bool)


def causal(q_len: int, k_len: int) -> torch.Tensor:
    return attention_mask(q_len, k_len, causal=True, key_padding_mask=None, device=torch.device("cpu"))


def test_registry_holds_the_four_patterns():
    assert SPARSITY.names() == sorted(PATTERNS)
    with pytest.raises(KeyError, match="attention sparsity 'bogus'"):
        sparse_mask("bogus", 4, 4)


def test_dense_gives_none():
    assert sparse_mask("dense", 5, 5) is None
    assert sparse_mask("dense", 2, 7, window=1, stride=1) is None
    # the registered function itself is all True
    full = SPARSITY.get("dense")(3, 5, window=1, stride=1, summary=1, device=None)
    assert full.dtype == torch.bool and full.shape == (3, 5) and full.all()


def test_local_matches_hand_written():
    expected = as_mask(
        [
            "1 1 0 0 0 0",
            "1 1 1 0 0 0",
            "0 1 1 1 0 0",
            "0 0 1 1 1 0",
            "0 0 0 1 1 1",
            "0 0 0 0 1 1",
        ]
    )
    assert torch.equal(sparse_mask("local", 6, 6, window=2), expected)


def test_local_window_one_is_the_diagonal():
    assert torch.equal(sparse_mask("local", 5, 5, window=1), torch.eye(5, dtype=torch.bool))


def test_strided_matches_hand_written():
    # stride 3: attended distances |i - j| in {0, 1, 2} (local) and {3, 6} (strided); not 4, 5, 7
    expected = as_mask(
        [
            "1 1 1 1 0 0 1 0",
            "1 1 1 1 1 0 0 1",
            "1 1 1 1 1 1 0 0",
            "1 1 1 1 1 1 1 0",
            "0 1 1 1 1 1 1 1",
            "0 0 1 1 1 1 1 1",
            "1 0 0 1 1 1 1 1",
            "0 1 0 0 1 1 1 1",
        ]
    )
    assert torch.equal(sparse_mask("strided", 8, 8, stride=3), expected)


def test_fixed_matches_hand_written():
    # blocks {0,1,2} {3,4,5} {6,7}; summary positions (last 1 of each block): 2, 5
    expected = as_mask(
        [
            "1 1 1 0 0 1 0 0",
            "1 1 1 0 0 1 0 0",
            "1 1 1 0 0 1 0 0",
            "0 0 1 1 1 1 0 0",
            "0 0 1 1 1 1 0 0",
            "0 0 1 1 1 1 0 0",
            "0 0 1 0 0 1 1 1",
            "0 0 1 0 0 1 1 1",
        ]
    )
    assert torch.equal(sparse_mask("fixed", 8, 8, stride=3, summary=1), expected)


def test_fixed_with_two_summary_positions_matches_hand_written():
    # blocks {0..3} {4..7}; summary positions (last 2 of each block): 2, 3, 6, 7
    expected = as_mask(
        [
            "1 1 1 1 0 0 1 1",
            "1 1 1 1 0 0 1 1",
            "1 1 1 1 0 0 1 1",
            "1 1 1 1 0 0 1 1",
            "0 0 1 1 1 1 1 1",
            "0 0 1 1 1 1 1 1",
            "0 0 1 1 1 1 1 1",
            "0 0 1 1 1 1 1 1",
        ]
    )
    assert torch.equal(sparse_mask("fixed", 8, 8, stride=4, summary=2), expected)


def test_causal_fixed_matches_hand_written():
    # causal & fixed(stride=3, summary=1) at T=6: own block up to i, plus summary position 2 once past it
    expected = as_mask(
        [
            "1 0 0 0 0 0",
            "1 1 0 0 0 0",
            "1 1 1 0 0 0",
            "0 0 1 1 0 0",
            "0 0 1 1 1 0",
            "0 0 1 1 1 1",
        ]
    )
    assert torch.equal(causal(6, 6) & sparse_mask("fixed", 6, 6, stride=3, summary=1), expected)


def reference(pattern: str, q_len: int, k_len: int, window: int, stride: int, summary: int) -> torch.Tensor:
    """Straight from the definitions, one pair at a time."""
    rules = {
        "local": lambda i, j: abs(i - j) < window,
        "strided": lambda i, j: abs(i - j) < stride or (i - j) % stride == 0,
        "fixed": lambda i, j: j // stride == i // stride or j % stride >= stride - summary,
    }
    offset = k_len - q_len
    return torch.tensor([[rules[pattern](offset + r, j) for j in range(k_len)] for r in range(q_len)], dtype=torch.bool)


@pytest.mark.parametrize("pattern", SPARSE)
@pytest.mark.parametrize("window,stride,summary", [(1, 1, 1), (2, 3, 1), (3, 4, 2), (5, 5, 5), (4, 16, 0)])
def test_matches_elementwise_definition(pattern, window, stride, summary):
    for q_len, k_len in [(11, 11), (4, 11), (1, 9)]:
        got = sparse_mask(pattern, q_len, k_len, window=window, stride=stride, summary=summary)
        assert torch.equal(got, reference(pattern, q_len, k_len, window, stride, summary))


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("window,stride,summary", [(1, 1, 1), (2, 3, 1), (3, 4, 2), (4, 16, 0)])
def test_causal_and_sparse_never_sees_the_future_and_keeps_the_diagonal(pattern, window, stride, summary):
    for q_len, k_len in [(13, 13), (5, 13), (1, 13)]:
        offset = k_len - q_len
        sparse = sparse_mask(pattern, q_len, k_len, window=window, stride=stride, summary=summary)
        mask = causal(q_len, k_len) if sparse is None else causal(q_len, k_len) & sparse
        rows = torch.arange(q_len)
        i = offset + rows
        future = torch.arange(k_len)[None, :] > i[:, None]
        assert not (mask & future).any()
        assert mask[rows, i].all()  # every query attends itself, so no row is empty
        assert mask.any(dim=-1).all()


@pytest.mark.parametrize("pattern", SPARSE)
@pytest.mark.parametrize("window,stride,summary", [(1, 1, 1), (3, 4, 2), (4, 16, 0)])
def test_diagonal_in_every_pattern_without_causal(pattern, window, stride, summary):
    mask = sparse_mask(pattern, 10, 10, window=window, stride=stride, summary=summary)
    assert mask.diagonal().all()


@pytest.mark.parametrize("pattern", SPARSE)
def test_kv_cache_alignment_gives_the_last_rows(pattern):
    kw = dict(window=3, stride=4, summary=2)
    k_len = 12
    full = sparse_mask(pattern, k_len, k_len, **kw)
    full_causal = causal(k_len, k_len) & full
    for q_len in range(1, k_len + 1):
        step = sparse_mask(pattern, q_len, k_len, **kw)
        assert step.shape == (q_len, k_len)
        assert torch.equal(step, full[k_len - q_len :])
        assert torch.equal(causal(q_len, k_len) & step, full_causal[k_len - q_len :])


def test_composes_with_padding_mask_by_broadcasting():
    padding = torch.tensor([[False, False, False, True], [False, False, True, True]])  # True = pad
    base = attention_mask(4, 4, causal=True, key_padding_mask=padding, device=torch.device("cpu"))
    combined = base & sparse_mask("local", 4, 4, window=2)
    assert combined.shape == (2, 1, 4, 4)
    expected_first = as_mask(["1 0 0 0", "1 1 0 0", "0 1 1 0", "0 0 1 0"])
    expected_second = as_mask(["1 0 0 0", "1 1 0 0", "0 1 0 0", "0 0 0 0"])
    assert torch.equal(combined[0, 0], expected_first)
    assert torch.equal(combined[1, 0], expected_second)
    assert attended_fraction(combined) == pytest.approx((6 + 4) / 32)


def test_attended_fraction_on_hand_examples():
    assert attended_fraction(causal(4, 4)) == pytest.approx(10 / 16)
    # causal & local(window=2) at T=4: diagonal (4) + first sub-diagonal (3)
    assert attended_fraction(causal(4, 4) & sparse_mask("local", 4, 4, window=2)) == pytest.approx(7 / 16)
    assert attended_fraction(torch.ones(2, 3, 5, dtype=torch.bool)) == 1.0
    assert isinstance(attended_fraction(causal(3, 3)), float)
    with pytest.raises(TypeError):
        attended_fraction(torch.ones(2, 2))


def test_invalid_arguments_raise():
    with pytest.raises(ValueError):
        sparse_mask("local", 5, 4)  # more queries than keys
    with pytest.raises(ValueError):
        sparse_mask("local", 4, 4, window=0)
    with pytest.raises(ValueError):
        sparse_mask("strided", 4, 4, stride=0)
    with pytest.raises(ValueError):
        sparse_mask("fixed", 4, 4, stride=2, summary=3)
