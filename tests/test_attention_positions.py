"""GQA/MQA, the weight-returning math path, RoPE, ALiBi and NoPE against independent references."""

from __future__ import annotations

import math

import pydantic
import pytest
import torch

from models import ModelConfig, MultiHeadAttention, build_model
from models.position import ALiBi, RotaryPositionalEmbedding, alibi_slopes

DT = torch.float64


def test_gqa_equals_mha_with_repeated_key_value_heads():
    torch.manual_seed(0)
    d, heads, kv_heads, hd = 32, 4, 2, 8
    gqa = MultiHeadAttention(d, heads, n_kv_heads=kv_heads).to(DT)
    mha = MultiHeadAttention(d, heads).to(DT)
    with torch.no_grad():
        w_q, w_k, w_v = gqa.qkv_proj.weight.split([d, kv_heads * hd, kv_heads * hd])
        b_q, b_k, b_v = gqa.qkv_proj.bias.split([d, kv_heads * hd, kv_heads * hd])

        def repeat(t):  # each kv head serves heads // kv_heads consecutive query heads
            return t.reshape(kv_heads, hd, *t.shape[1:]).repeat_interleave(heads // kv_heads, 0).reshape(d, *t.shape[1:])

        mha.qkv_proj.weight.copy_(torch.cat([w_q, repeat(w_k), repeat(w_v)]))
        mha.qkv_proj.bias.copy_(torch.cat([b_q, repeat(b_k), repeat(b_v)]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(2, 7, d, dtype=DT)
    for causal in (False, True):
        torch.testing.assert_close(gqa(x, causal=causal), mha(x, causal=causal))


def test_gqa_with_as_many_kv_heads_as_heads_is_mha():
    torch.manual_seed(1)
    a, b = MultiHeadAttention(32, 4, n_kv_heads=4), MultiHeadAttention(32, 4)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(a(x, causal=True), b(x, causal=True))


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_attention_parameter_count_formula(kv_heads):
    d, heads = 64, 4
    hd = d // heads
    attn = MultiHeadAttention(d, heads, n_kv_heads=kv_heads)
    qkv = d * (d + 2 * kv_heads * hd) + (d + 2 * kv_heads * hd)
    out = d * d + d
    assert sum(p.numel() for p in attn.parameters()) == qkv + out


@pytest.mark.parametrize("kv_heads", [4, 1])
@pytest.mark.parametrize("causal, padded, alibi", [(False, False, False), (True, False, False), (True, True, False),
                                                    (False, True, True), (True, True, True)])
def test_math_path_equals_sdpa_and_returns_weights(kv_heads, causal, padded, alibi):
    torch.manual_seed(2)
    attn = MultiHeadAttention(32, 4, n_kv_heads=kv_heads).to(DT)
    x = torch.randn(2, 6, 32, dtype=DT)
    padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2]) if padded else None
    positional = ALiBi(4) if alibi else None
    fast = attn(x, causal=causal, key_padding_mask=padding, positional=positional)
    slow, weights = attn(x, causal=causal, key_padding_mask=padding, positional=positional, need_weights=True)
    torch.testing.assert_close(slow, fast)
    assert weights.shape == (2, 4, 6, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6, dtype=DT))
    if causal:
        assert torch.all(weights.triu(diagonal=1) == 0)
    if padded:
        assert torch.all(weights[1, :, :, 4:] == 0)


def test_rope_score_depends_only_on_relative_position():
    torch.manual_seed(3)
    rope = RotaryPositionalEmbedding(head_dim=8)
    q_vec, k_vec = torch.randn(8), torch.randn(8)

    def score(i: int, j: int) -> float:
        length = max(i, j) + 1
        q = torch.zeros(1, 1, length, 8)
        k = torch.zeros(1, 1, length, 8)
        q[..., i, :], k[..., j, :] = q_vec, k_vec
        q_rot, k_rot = rope.rotate(q, k)
        return float(q_rot[0, 0, i] @ k_rot[0, 0, j])

    for i, j in [(3, 1), (5, 5), (2, 6)]:
        for shift in (1, 7, 20):
            assert score(i + shift, j + shift) == pytest.approx(score(i, j), abs=1e-4)
    assert score(4, 1) != pytest.approx(score(4, 2), abs=1e-4)  # the score does depend on the distance
    # position 0 is not rotated; rotation preserves norms
    q0, _ = rope.rotate(q_vec.view(1, 1, 1, 8), k_vec.view(1, 1, 1, 8))
    torch.testing.assert_close(q0.flatten(), q_vec)


def test_rope_matches_the_complex_number_formulation():
    torch.manual_seed(4)
    hd, length = 8, 5
    rope = RotaryPositionalEmbedding(head_dim=hd, base=10000.0)
    x = torch.randn(1, 1, length, hd, dtype=torch.float32)
    rotated, _ = rope.rotate(x, x)
    # half-split pairs (x_i, x_{i+hd/2}) as complex numbers, multiplied by e^{i * p * theta_i}
    theta = 10000.0 ** (-torch.arange(0, hd, 2).float() / hd)
    pairs = torch.complex(x[..., : hd // 2], x[..., hd // 2 :])
    angles = torch.arange(length).float()[:, None] * theta
    expected = pairs * torch.polar(torch.ones_like(angles), angles)
    torch.testing.assert_close(rotated, torch.cat([expected.real, expected.imag], dim=-1), atol=1e-5, rtol=1e-5)


def test_alibi_slopes_follow_the_paper():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (i + 1)) for i in range(4)]))
    # not a power of two: the 4-head slopes, then every other slope of the 8-head sequence
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]))


def test_alibi_bias_is_minus_slope_times_distance():
    bias = ALiBi(2).attention_bias(3, 3, causal=True, device=torch.device("cpu"))
    slopes = alibi_slopes(2)
    expected = -slopes[:, None, None] * torch.tensor([[0, 0, 0], [1, 0, 0], [2, 1, 0]]).float()
    torch.testing.assert_close(bias, expected)
    both_ways = ALiBi(2).attention_bias(3, 3, causal=False, device=torch.device("cpu"))
    torch.testing.assert_close(both_ways[0], -slopes[0] * torch.tensor([[0, 1, 2], [1, 0, 1], [2, 1, 0]]).float())


@pytest.mark.parametrize("pos", ["rope", "alibi", "nope", "sinusoidal"])
def test_lm_is_causal_and_evaluates_beyond_its_training_length(pos):
    torch.manual_seed(5)
    model = build_model({"family": "decoder_lm", "vocab_size": 50, "d_model": 32, "n_layers": 2, "n_heads": 4,
                         "max_seq_len": 8, "pos_encoding": pos, "n_kv_heads": 2}).eval()
    idx = torch.randint(0, 50, (2, 16))  # twice the training context
    logits = model(idx)
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 50
    torch.testing.assert_close(model(changed)[:, :10], logits[:, :10])
    assert not torch.allclose(model(changed)[:, 10:], logits[:, 10:])


@pytest.mark.parametrize("family", ["encoder_decoder", "vit"])
@pytest.mark.parametrize("pos", ["rope", "alibi", "nope"])
def test_other_families_take_every_position_variant(family, pos):
    torch.manual_seed(6)
    cfg = {"family": family, "d_model": 32, "n_layers": 1, "n_heads": 4, "pos_encoding": pos, "n_kv_heads": 1}
    if family == "vit":
        model = build_model({**cfg, "image_size": 8, "patch_size": 4, "n_classes": 3})
        assert model(torch.randn(2, 3, 8, 8)).shape == (2, 3)
    else:
        model = build_model({**cfg, "vocab_size": 20})
        assert model(torch.randint(0, 20, (2, 5)), torch.randint(0, 20, (2, 4))).shape == (2, 4, 20)


def test_config_rejects_impossible_head_layouts():
    with pytest.raises(pydantic.ValidationError, match="n_kv_heads=3 does not divide n_heads=4"):
        ModelConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(pydantic.ValidationError, match="pos_encoding=rope needs an even head dimension"):
        ModelConfig(d_model=36, n_heads=4, pos_encoding="rope")
    assert math.isclose(ModelConfig(pos_encoding="rope").rope_base, 10000.0)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "nope"])
def test_kv_cache_gives_the_logits_and_tokens_of_full_recomputation(pos):
    torch.manual_seed(7)
    model = build_model({"family": "decoder_lm", "vocab_size": 40, "d_model": 32, "n_layers": 2, "n_heads": 4,
                         "n_kv_heads": 2, "max_seq_len": 12, "pos_encoding": pos}).to(DT).eval()
    idx = torch.randint(0, 40, (2, 10))
    full = model(idx)
    caches = model.new_caches()
    steps = [model(idx[:, :4], caches=caches)]  # prefill, then one token at a time
    steps += [model(idx[:, t : t + 1], caches=caches) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    # generation past the learned window (12) too: cached and uncached agree token for token
    prompt = idx[:, :3]
    torch.testing.assert_close(model.generate(prompt, 15, temperature=0), model.generate(prompt, 15, temperature=0, use_cache=False))


@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
def test_translator_kv_cache_equals_full_recomputation(pos):
    torch.manual_seed(8)
    model = build_model({"family": "encoder_decoder", "vocab_size": 30, "d_model": 32, "n_layers": 2, "n_heads": 4,
                         "max_seq_len": 16, "pos_encoding": pos}).to(DT).eval()
    src = torch.randint(3, 30, (3, 7))
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, 5:] = True
    tgt = torch.randint(3, 30, (3, 6))
    memory = model.encode(src, padding)
    full = model.decode(tgt, memory, padding)
    caches = model.decoder.new_caches()
    steps = [model.decode(tgt[:, t : t + 1], memory, padding, caches) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    kwargs = {"bos_id": 1, "eos_id": 2, "max_len": 10, "src_padding_mask": padding}
    assert torch.equal(model.greedy_decode(src, **kwargs), model.greedy_decode(src, use_cache=False, **kwargs))


def test_additive_score_equals_bahdanau_formula_pair_by_pair():
    torch.manual_seed(9)
    attn = MultiHeadAttention(16, 2, score="additive").to(DT)
    x = torch.randn(1, 4, 16, dtype=DT)
    out, weights = attn(x, causal=True, need_weights=True)
    q, k, v = attn.qkv_proj(x).split(16, dim=-1)
    heads = lambda t: t.view(1, 4, 2, 8).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    score = attn.score
    expected = torch.full((1, 2, 4, 4), float("-inf"), dtype=DT)
    for h in range(2):
        for i in range(4):
            for j in range(i + 1):  # causal
                expected[0, h, i, j] = score.v[h] @ torch.tanh(q[0, h, i] @ score.w_q[h] + k[0, h, j] @ score.w_k[h])
    torch.testing.assert_close(weights, expected.softmax(-1))
    manual = (expected.softmax(-1) @ v).transpose(1, 2).reshape(1, 4, 16)
    torch.testing.assert_close(out, attn.out_proj(manual))
    torch.testing.assert_close(attn(x, causal=True), out)  # the default path takes the same math


def test_additive_lm_learns_and_stays_causal():
    torch.manual_seed(10)
    model = build_model({"family": "decoder_lm", "vocab_size": 20, "d_model": 32, "n_layers": 1, "n_heads": 2,
                         "attention_score": "additive", "max_seq_len": 8})
    idx = torch.randint(0, 20, (4, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    changed = idx.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 20
    torch.testing.assert_close(model(changed)[:, :5], model(idx)[:, :5])


@pytest.mark.parametrize("pattern, extra", [("local", {"window": 3}), ("strided", {"stride": 3}), ("fixed", {"stride": 3})])
def test_sparse_attention_attends_exactly_the_pattern(pattern, extra):
    from models.attention import SparsePattern
    from models.sparse import sparse_mask

    torch.manual_seed(11)
    sizes = {"window": 4, "stride": 4, "summary": 1, **extra}
    attn = MultiHeadAttention(32, 4, sparsity=SparsePattern(pattern, **sizes)).to(DT)
    x = torch.randn(2, 9, 32, dtype=DT)
    out, weights = attn(x, causal=True, need_weights=True)
    allowed = sparse_mask(pattern, 9, 9, **sizes) & torch.ones(9, 9, dtype=torch.bool).tril()
    assert torch.all(weights[..., ~allowed] == 0) and torch.all(weights[..., allowed] > 0)
    torch.testing.assert_close(attn(x, causal=True), out)  # SDPA path with the same mask
    assert attn.attended_fraction == pytest.approx(allowed.float().mean().item())
    dense = MultiHeadAttention(32, 4).to(DT)
    dense.load_state_dict(attn.state_dict())
    assert not torch.allclose(dense(x, causal=True), out)  # the pattern really removes pairs


def test_sparse_lm_kv_cache_and_config_checks():
    torch.manual_seed(12)
    model = build_model({"family": "decoder_lm", "vocab_size": 30, "d_model": 32, "n_layers": 2, "n_heads": 4,
                         "attention_pattern": "strided", "attention_stride": 3, "pos_encoding": "rope"}).to(DT).eval()
    idx = torch.randint(0, 30, (2, 9))
    caches = model.new_caches()
    steps = [model(idx[:, :2], caches=caches)] + [model(idx[:, t : t + 1], caches=caches) for t in range(2, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), model(idx))
    with pytest.raises(pydantic.ValidationError, match="attention_summary=5 exceeds attention_stride=4"):
        ModelConfig(attention_pattern="fixed", attention_stride=4, attention_summary=5)
    with pytest.raises(pydantic.ValidationError, match="unknown attention sparsity 'diagonal'"):
        ModelConfig(attention_pattern="diagonal")
