"""T5 relative position bias ("relative") and the fixed 2D sine-cosine ViT embedding ("sincos2d")."""

from __future__ import annotations

import ast
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from models import build_model, count_parameters
from models.position import (
    SinCos2DPositionalEncoding,
    T5RelativePositionBias,
    fixed_table_scale,
    t5_relative_position_bucket,
)

CPU = torch.device("cpu")
DISTANCES = [-200, -50, -20, -3, 0, 3, 20, 50, 200]  # key position - query position


def test_t5_buckets_match_hand_computation():
    # bidirectional: 16 buckets per direction, max_exact 8; n >= 8 -> 8 + floor(ln(n/8) / ln(128/8) * 8), <= 15
    #   n=20: ln 2.5 / ln 16 * 8 = 2.64 -> 10;  n=50: ln 6.25 / ln 16 * 8 = 5.29 -> 13;  n=200: 9.29 -> 17 -> 15
    #   keys after the query (j - i > 0) add 16
    bidirectional = t5_relative_position_bucket(torch.tensor(DISTANCES), bidirectional=True)
    assert bidirectional.tolist() == [15, 13, 10, 3, 0, 19, 26, 29, 31]
    # causal: 32 buckets for the past, max_exact 16; n >= 16 -> 16 + floor(ln(n/16) / ln(128/16) * 16), <= 31
    #   n=20: ln 1.25 / ln 8 * 16 = 1.72 -> 17;  n=50: ln 3.125 / ln 8 * 16 = 8.77 -> 24;  n=200: 19.4 -> 35 -> 31
    #   every future key (j - i > 0) in bucket 0
    causal = t5_relative_position_bucket(torch.tensor(DISTANCES), bidirectional=False)
    assert causal.tolist() == [31, 24, 17, 3, 0, 0, 0, 0, 0]


def test_t5_buckets_are_monotone_and_in_range():
    rel = torch.arange(-300, 301)
    for bidirectional in (True, False):
        b = t5_relative_position_bucket(rel, bidirectional=bidirectional)
        assert b.min() == 0 and b.max() == 31
    past = t5_relative_position_bucket(-torch.arange(0, 300), bidirectional=False)
    assert torch.all(past[1:] >= past[:-1])


@pytest.mark.parametrize("causal", [False, True])
def test_relative_bias_shape_and_shift_invariance(causal):
    torch.manual_seed(0)
    rel = T5RelativePositionBias(n_heads=3)
    bias = rel.attention_bias(40, 40, causal=causal, device=CPU)
    assert bias.shape == (3, 40, 40)
    # depends only on j - i: every diagonal is constant
    for d in range(-39, 40):
        diagonal = bias.diagonal(offset=d, dim1=1, dim2=2)
        torch.testing.assert_close(diagonal, diagonal[:, :1].expand_as(diagonal))
    # and equals the table at the bucket of j - i
    i, j = 30, 5
    expected = rel.weight[t5_relative_position_bucket(torch.tensor(j - i), bidirectional=not causal)]
    torch.testing.assert_close(bias[:, i, j], expected)
    # rectangular (queries = the last q_len positions) is the bottom rows of the square bias
    torch.testing.assert_close(rel.attention_bias(7, 40, causal=causal, device=CPU), bias[:, -7:, :])


def test_relative_bias_distinguishes_directions_only_when_bidirectional():
    torch.manual_seed(1)
    rel = T5RelativePositionBias(n_heads=2)
    both = rel.attention_bias(5, 5, causal=False, device=CPU)
    assert not torch.allclose(both[:, 2, 1], both[:, 2, 3])  # before vs after the query
    one_way = rel.attention_bias(5, 5, causal=True, device=CPU)
    torch.testing.assert_close(one_way[:, 2, 3], one_way[:, 2, 4])  # all future keys share bucket 0


def test_relative_causal_bias_with_kv_cache_shape_is_last_row():
    torch.manual_seed(2)
    rel = T5RelativePositionBias(n_heads=4)
    full = rel.attention_bias(5, 5, causal=True, device=CPU)
    step = rel.attention_bias(1, 5, causal=True, device=CPU)
    assert step.shape == (4, 1, 5)
    torch.testing.assert_close(step, full[:, -1:, :])


def test_relative_table_is_one_module_shared_by_all_layers(monkeypatch):
    cfg = {"family": "decoder_lm", "vocab_size": 30, "d_model": 32, "n_layers": 3, "n_heads": 4, "max_seq_len": 16}
    model = build_model({**cfg, "pos_encoding": "relative"}).eval()
    baseline = build_model({**cfg, "pos_encoding": "nope"})
    assert count_parameters(model) - count_parameters(baseline) == 32 * 4
    tables = [m for m in model.modules() if isinstance(m, T5RelativePositionBias)]
    assert len(tables) == 1 and tables[0] is model.positions
    callers = []
    original = T5RelativePositionBias.attention_bias

    def spy(self, *args, **kwargs):
        callers.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(T5RelativePositionBias, "attention_bias", spy)
    model(torch.randint(0, 30, (2, 6)))
    assert len(callers) == 3 and all(c is model.positions for c in callers)


def test_relative_lm_kv_cache_and_extrapolation():
    torch.manual_seed(3)
    model = build_model({"family": "decoder_lm", "vocab_size": 40, "d_model": 32, "n_layers": 2, "n_heads": 4,
                         "n_kv_heads": 2, "max_seq_len": 8, "pos_encoding": "relative"}).to(torch.float64).eval()
    idx = torch.randint(0, 40, (2, 12))  # beyond max_seq_len: relative bias extrapolates
    full = model(idx)
    caches = model.new_caches()
    steps = [model(idx[:, :4], caches=caches)] + [model(idx[:, t : t + 1], caches=caches) for t in range(4, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    prompt = idx[:, :3]
    torch.testing.assert_close(model.generate(prompt, 12, temperature=0),
                               model.generate(prompt, 12, temperature=0, use_cache=False))


#: bidirectional T5 buckets (num_buckets 32, max_distance 128) of a key n = 0 .. 20 positions before
#: the query: 16 buckets per direction, the first max_exact = 8 distances exact, then
#: 8 + floor(ln(n / 8) / ln(128 / 8) * 8): n = 8..11 -> 8 (0.00 .. 0.92), n = 12..15 -> 9 (1.17 .. 1.81),
#: n = 16..20 -> 10 (2.00 .. 2.64); a key n > 0 positions after the query is 16 buckets further on
T5_BUCKETS_BEFORE = [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 10]
T5_BUCKETS_BY_HAND = {-n: b for n, b in enumerate(T5_BUCKETS_BEFORE)}
T5_BUCKETS_BY_HAND |= {n: 16 + b for n, b in enumerate(T5_BUCKETS_BEFORE) if n}
T5_BUCKETS_BY_HAND |= {-200: 15, 200: 31}  # 8 + floor(9.29) = 17, beyond max_distance: the last bucket, 15


def test_t5_bidirectional_buckets_for_every_distance_up_to_20_and_200_by_hand():
    relative = torch.tensor(list(T5_BUCKETS_BY_HAND))  # key position - query position
    buckets = t5_relative_position_bucket(relative, bidirectional=True, num_buckets=32, max_distance=128)
    assert dict(zip(relative.tolist(), buckets.tolist())) == T5_BUCKETS_BY_HAND


def hf_t5_relative_position_bucket():
    """HF transformers' ``T5Attention._relative_position_bucket``, compiled from its source file: the
    function needs only torch and math, and importing transformers' T5 module takes 8 s of CPU.
    Skips the calling test when transformers is not installed."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        pytest.skip("transformers is not installed (pip install -e '.[bench]')")
    source = (Path(spec.origin).parent / "models" / "t5" / "modeling_t5.py").read_text()
    t5_attention = next(node for node in ast.parse(source).body if getattr(node, "name", None) == "T5Attention")
    function = next(node for node in t5_attention.body if getattr(node, "name", None) == "_relative_position_bucket")
    function.decorator_list = []  # a staticmethod in the class, a plain function here
    namespace = {"torch": torch, "math": math}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "modeling_t5.py", "exec"), namespace)
    return namespace["_relative_position_bucket"]


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (16, 40), (64, 256)])
def test_t5_buckets_equal_hf_transformers(num_buckets, max_distance):
    """The buckets are those of HF transformers' T5Attention, both ways, over +-300 positions."""
    hf_bucket = hf_t5_relative_position_bucket()
    relative = torch.arange(-300, 301)
    for bidirectional in (True, False):
        ours = t5_relative_position_bucket(relative, bidirectional=bidirectional, num_buckets=num_buckets,
                                           max_distance=max_distance)
        theirs = hf_bucket(relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
        assert torch.equal(ours, theirs), bidirectional


@pytest.mark.parametrize("family", ["encoder_decoder", "vit"])
def test_bidirectional_relative_bias_is_the_table_entry_of_each_pair(family):
    """In the translator's encoder and the ViT, the score of query i and key j in head h gets
    table[bucket(j - i), h], with the bidirectional buckets worked out by hand above (10 positions:
    offsets -9 .. 9); padded source keys get no weight."""
    from test_attention_positions import N_HEADS, alibi_bias_by_hand, assert_stack_attention_is, bidirectional_model

    model = bidirectional_model(family, "relative")
    table = model.positions.weight
    torch.nn.init.normal_(table)  # N(0, 1): a bias that visibly moves the weights

    def bias(length: int) -> torch.Tensor:
        expected = torch.zeros(N_HEADS, length, length, dtype=table.dtype)
        for i in range(length):
            for j in range(length):
                expected[:, i, j] = table[T5_BUCKETS_BY_HAND[j - i]]
        return expected

    assert_stack_attention_is(model, family, bias=bias)
    with pytest.raises(AssertionError):  # the check tells biases apart: ALiBi's is not this one
        assert_stack_attention_is(model, family, bias=alibi_bias_by_hand)


def test_sincos2d_matches_the_2d_formula():
    # image 16, patch 4: a 4x4 grid; d_model 16: 8 features for the row, 8 for the column,
    # each [sin(p w0), cos(p w0), sin(p w1), cos(p w1), ...] with w_i = 10000^(-2i/8) = 1, 0.1, 0.01, 0.001
    pe = SinCos2DPositionalEncoding(grid_size=4, dim=16)
    table = pe.embedding(16) / fixed_table_scale()  # the unit-amplitude formula, scaled to the embedding RMS
    assert table.shape == (16, 16)  # one row per patch: the ViT's CLS token takes no table row

    def axis(p: int) -> list[float]:
        return [f(p * w) for w in (1.0, 0.1, 0.01, 0.001) for f in (math.sin, math.cos)]

    for row, col in [(0, 0), (2, 3), (3, 1), (0, 2)]:
        index = 4 * row + col  # row-major patches
        torch.testing.assert_close(table[index], torch.tensor(axis(row) + axis(col)))
    # spot checks written out: patch (row 2, col 3) -> index 11
    assert table[11, 0].item() == pytest.approx(math.sin(2.0), abs=1e-6)
    assert table[11, 3].item() == pytest.approx(math.cos(0.2), abs=1e-6)
    assert table[11, 8].item() == pytest.approx(math.sin(3.0), abs=1e-6)
    assert table[11, 14].item() == pytest.approx(math.sin(0.003), abs=1e-6)
    for wrong in (10, 17):  # 17: the grid plus a CLS row
        with pytest.raises(ValueError, match="sincos2d covers exactly the 4x4 patch grid"):
            pe.embedding(wrong)


def test_vit_with_sincos2d_runs_without_positional_parameters():
    torch.manual_seed(5)
    cfg = {"family": "vit", "d_model": 32, "n_layers": 1, "n_heads": 4, "image_size": 8, "patch_size": 4,
           "n_classes": 3}
    model = build_model({**cfg, "pos_encoding": "sincos2d"})
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 3)
    assert list(model.positions.parameters()) == []
    assert count_parameters(model) == count_parameters(build_model({**cfg, "pos_encoding": "nope"}))
    assert count_parameters(build_model({**cfg, "pos_encoding": "learned"})) - count_parameters(model) == 4 * 32  # 2x2 patches


def test_sincos2d_outside_vit_or_with_bad_width_raises_a_clear_error():
    with pytest.raises(ValueError, match=r"pos_encoding=sincos2d is for the vit family \(it needs model.image_size\)"):
        build_model({"family": "decoder_lm", "vocab_size": 20, "d_model": 32, "n_heads": 4, "pos_encoding": "sincos2d"})
    with pytest.raises(ValueError, match="divisible by 4"):
        build_model({"family": "vit", "d_model": 18, "n_heads": 2, "image_size": 8, "patch_size": 4, "n_classes": 3,
                     "pos_encoding": "sincos2d"})
