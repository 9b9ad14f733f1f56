"""GQA/MQA, the weight-returning math path and the positional encodings (RoPE, ALiBi, NoPE, learned,
sinusoidal, T5 relative bias, the fixed 2D sine-cosine ViT table) against independent references;
KV caches, additive scores and sparse patterns against full recomputation."""

from __future__ import annotations

import math

import pydantic
import pytest
import torch
from helpers import DT
from torch.nn.attention import SDPBackend, sdpa_kernel

from blockbench.models import ModelConfig, MultiHeadAttention, build_model, count_parameters
from blockbench.models.decoding import generate, greedy_decode
from blockbench.models.position import (
    ALiBi,
    RotaryPositionalEmbedding,
    SinCos2DPositionalEncoding,
    T5RelativePositionBias,
    alibi_slopes,
    fixed_table_scale,
    t5_relative_position_bucket,
)


def test_gqa_equals_mha_with_repeated_key_value_heads():
    torch.manual_seed(0)
    d, heads, kv_heads, hd = 32, 4, 2, 8
    gqa = MultiHeadAttention(d, heads, n_kv_heads=kv_heads).to(DT)
    mha = MultiHeadAttention(d, heads).to(DT)
    with torch.no_grad():
        w_q, w_k, w_v = gqa.qkv_proj.weight.split([d, kv_heads * hd, kv_heads * hd])
        b_q, b_k, b_v = gqa.qkv_proj.bias.split([d, kv_heads * hd, kv_heads * hd])

        def repeat(t):  # each kv head serves heads // kv_heads consecutive query heads
            return (
                t.reshape(kv_heads, hd, *t.shape[1:]).repeat_interleave(heads // kv_heads, 0).reshape(d, *t.shape[1:])
            )

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
@pytest.mark.parametrize(
    "causal, padded, alibi",
    [(False, False, False), (True, False, False), (True, True, False), (False, True, True), (True, True, True)],
)
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
    model = build_model(
        {
            "family": "decoder_lm",
            "vocab_size": 50,
            "d_model": 32,
            "n_layers": 2,
            "n_heads": 4,
            "max_seq_len": 8,
            "pos_encoding": pos,
            "n_kv_heads": 2,
        }
    ).eval()
    idx = torch.randint(0, 50, (2, 16))  # twice the training context
    logits = model(idx)
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 50
    torch.testing.assert_close(model(changed)[:, :10], logits[:, :10])
    assert not torch.allclose(model(changed)[:, 10:], logits[:, 10:])


# --- positions in the bidirectional stacks (the translator's encoder, the ViT) ------------------
# Every check below takes the first self-attention layer of the stack during a real forward pass
# of the model (its input, the keyword arguments the block passes, its output) and recomputes the
# layer by hand from its own projections: softmax(q.k / sqrt(head_dim) + position bias) v.

N_HEADS = 4
#: ALiBi's slopes for 4 heads (Press et al. 2022): 2^(-8/4), 2^(-16/4), 2^(-24/4), 2^(-32/4)
ALIBI_SLOPES_4_HEADS = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]


def bidirectional_model(family: str, pos: str, seed: int = 6) -> torch.nn.Module:
    """A one-layer float64 translator or ViT (image 12, patch 4: CLS + 9 patches = 10 positions).
    Its query/key/value projections are redrawn at unit gain, N(0, 1/d_model): the scores are then
    O(1), not O(0.01) as at init, so the softmax is far from uniform and every position term shows."""
    torch.manual_seed(seed)
    cfg = {"family": family, "d_model": 32, "n_layers": 1, "n_heads": N_HEADS, "pos_encoding": pos}
    if family == "vit":
        cfg |= {"image_size": 12, "patch_size": 4, "n_classes": 3}
    else:
        cfg |= {"vocab_size": 20, "max_seq_len": 16}
    model = build_model(cfg).to(DT).eval()
    for name, parameter in model.named_parameters():
        if name.endswith(("qkv_proj.weight", "q_proj.weight", "kv_proj.weight")):
            torch.nn.init.normal_(parameter, std=32**-0.5)
    return model


def bidirectional_stack(model: torch.nn.Module):
    """The bidirectional stack: the translator's encoder or the ViT's only stack."""
    return model.encoder if hasattr(model, "encoder") else model.stack


def run_bidirectional_stack(model: torch.nn.Module, family: str) -> None:
    """A forward pass through the stack: a translator source with a padded row, or ViT images."""
    generator = torch.Generator().manual_seed(0)
    if family == "vit":
        model(torch.randn(2, 3, 12, 12, dtype=DT, generator=generator))
        return
    src = torch.randint(3, 20, (2, 10), generator=generator)
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[1, 7:] = True
    model.encode(src, padding)


def recorded_call(module: torch.nn.Module, run) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """(input, keyword arguments, output) of ``module``'s first call while ``run()`` runs."""
    calls = []
    handle = module.register_forward_hook(
        lambda m, args, kwargs, out: calls.append((args[0], kwargs, out)), with_kwargs=True
    )
    try:
        run()
    finally:
        handle.remove()
    return calls[0]


def rope_by_hand(t: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE (Su et al. 2021), half-split pairs as complex numbers: feature pair (i, i + hd/2) at
    position p times e^{i p base^(-2i/hd)}, positions 0 .. T-1 along dim -2."""
    hd, length = t.shape[-1], t.shape[-2]
    theta = base ** (-torch.arange(0, hd, 2, dtype=DT) / hd)
    angle = torch.arange(length, dtype=DT)[:, None] * theta
    pairs = torch.complex(t[..., : hd // 2], t[..., hd // 2 :]) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([pairs.real, pairs.imag], dim=-1)


def alibi_bias_by_hand(length: int) -> torch.Tensor:
    """-slope_h * |i - j| for query i and key j: bidirectional ALiBi, symmetric in the distance."""
    bias = torch.zeros(N_HEADS, length, length, dtype=DT)
    for h, slope in enumerate(ALIBI_SLOPES_4_HEADS):
        for i in range(length):
            for j in range(length):
                bias[h, i, j] = -slope * abs(i - j)
    return bias


def attention_by_hand(attn: MultiHeadAttention, x: torch.Tensor, *, rotate=None, bias=None, key_padding_mask=None):
    """The layer's output, weights and raw scores q.k / sqrt(head_dim) (after ``rotate``), written out
    from its own projections; ``bias`` (H, T, T) is added to the scores, padded keys get weight 0."""
    batch, length, d_model = x.shape
    q, k, v = (t.view(batch, length, N_HEADS, -1).transpose(1, 2) for t in attn.qkv_proj(x).split(d_model, dim=-1))
    if rotate is not None:
        q, k = rotate(q), rotate(k)
    raw = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = raw if bias is None else raw + bias
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    weights = scores.softmax(dim=-1)
    out = attn.out_proj((weights @ v).transpose(1, 2).reshape(batch, length, d_model))
    return out, weights, raw


def assert_stack_attention_is(model: torch.nn.Module, family: str, *, rotate=None, bias=None, tol: float = 1e-7):
    """The first self-attention of the bidirectional stack, in the model's own forward pass (fused
    SDPA path) and with ``need_weights`` (math path), equals ``attention_by_hand``; ``bias(length)``
    gives the hand-computed position bias. Returns the recorded input and keyword arguments."""
    attn = bidirectional_stack(model).blocks[0].self_attn.sublayer
    x, kwargs, out = recorded_call(attn, lambda: run_bidirectional_stack(model, family))
    assert kwargs["causal"] is False  # a bidirectional stack
    expected_out, expected_weights, _ = attention_by_hand(
        attn,
        x,
        rotate=rotate,
        bias=None if bias is None else bias(x.shape[1]),
        key_padding_mask=kwargs.get("key_padding_mask"),
    )
    torch.testing.assert_close(out, expected_out, rtol=tol, atol=tol)
    _, weights = attn(x, **kwargs, need_weights=True)
    torch.testing.assert_close(weights, expected_weights, rtol=tol, atol=tol)
    return x, kwargs


@pytest.mark.parametrize("family", ["encoder_decoder", "vit"])
def test_bidirectional_alibi_is_softmax_of_scores_minus_slope_times_absolute_distance(family):
    """ALiBi in a bidirectional stack penalizes keys on both sides of the query by slope_h * |i - j|;
    padded source keys get no weight."""
    model = bidirectional_model(family, "alibi")
    x, kwargs = assert_stack_attention_is(model, family, bias=alibi_bias_by_hand)
    if family == "encoder_decoder":
        assert kwargs["key_padding_mask"][1, 7:].all()
    # the bias matters at these sizes: without it the layer computes something else
    attn = bidirectional_stack(model).blocks[0].self_attn.sublayer
    without_bias, _, _ = attention_by_hand(attn, x, key_padding_mask=kwargs.get("key_padding_mask"))
    assert (attn(x, **kwargs) - without_bias).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["encoder_decoder", "vit"])
def test_bidirectional_rope_rotates_queries_and_keys_by_position(family):
    """RoPE in a bidirectional stack: the layer equals attention over hand-rotated q and k; the raw
    scores it computes are hand-rotated q.k / sqrt(head_dim)."""
    model = bidirectional_model(family, "rope")
    # the library rotates in float32 (exact for bf16/fp32 models), hence the float32 tolerance
    x, kwargs = assert_stack_attention_is(model, family, rotate=rope_by_hand, tol=1e-5)
    attn = bidirectional_stack(model).blocks[0].self_attn.sublayer
    raw_scores = recorded_call(attn.score, lambda: attn(x, **kwargs, need_weights=True))[2]
    torch.testing.assert_close(raw_scores, attention_by_hand(attn, x, rotate=rope_by_hand)[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["encoder_decoder", "vit"])
def test_bidirectional_rope_score_depends_only_on_the_signed_offset(family):
    """With the same content at every position, RoPE's score of query i and key j depends only on
    j - i, for keys after the query as for keys before it (every diagonal is constant), and does
    depend on it: on its size and on its sign (q and k differ, so j - i and i - j score differently)."""
    model = bidirectional_model(family, "rope")
    attn = bidirectional_stack(model).blocks[0].self_attn.sublayer
    x, kwargs, _ = recorded_call(attn, lambda: run_bidirectional_stack(model, family))
    kwargs = {**kwargs, "key_padding_mask": None}
    same_everywhere = x[:, :1].expand_as(x).contiguous()
    scores = recorded_call(attn.score, lambda: attn(same_everywhere, **kwargs, need_weights=True))[2]
    length = x.shape[1]
    for offset in range(-(length - 1), length):  # offset = j - i
        diagonal = scores.diagonal(offset=offset, dim1=-2, dim2=-1)
        torch.testing.assert_close(diagonal, diagonal[..., :1].expand_as(diagonal), rtol=1e-5, atol=1e-5)
    first_row = scores[..., 0, :]  # query 0: offsets 0, 1, 2, ...
    first_column = scores[..., :, 0]  # key 0: offsets 0, -1, -2, ...
    # in every head, the distance matters, and so does the direction
    assert (first_row[..., 1:] - first_row[..., :1]).abs().amax(-1).min() > 0.05
    assert (first_row[..., 1:] - first_column[..., 1:]).abs().amax(-1).min() > 0.05


@pytest.mark.parametrize("family", ["encoder_decoder", "vit"])
def test_bidirectional_nope_is_attention_without_positions(family):
    assert_stack_attention_is(bidirectional_model(family, "nope"), family)


#: (equivariant under any permutation of the input, equivariant under its reversal)
PERMUTATION_SYMMETRY = {
    "nope": (True, True),  # no position information at all
    "alibi": (False, True),  # |i - j| is what reversal preserves
    "rope": (False, False),  # sees the sign of j - i
    "relative": (False, False),  # T5's bidirectional buckets tell before from after
    "learned": (False, False),
    "sinusoidal": (False, False),
}


@pytest.mark.parametrize("pos", list(PERMUTATION_SYMMETRY))
def test_translator_encoder_output_follows_its_input_only_as_the_encoding_allows(pos):
    """Permuting the source permutes the encoder output exactly when the encoding carries no
    position (NoPE); ALiBi, which sees only |i - j|, keeps the symmetry under reversal alone; the
    others break both."""
    model = bidirectional_model("encoder_decoder", pos)
    if pos == "relative":  # the N(0, 0.02) table hardly moves the scores; make its effect plain
        torch.nn.init.normal_(model.positions.weight)
    src = torch.randint(3, 20, (2, 9), generator=torch.Generator().manual_seed(1))
    memory = model.encode(src)
    shuffle, reverse = torch.tensor([3, 0, 7, 1, 8, 5, 2, 6, 4]), torch.arange(8, -1, -1)
    for order, equivariant in zip((shuffle, reverse), PERMUTATION_SYMMETRY[pos], strict=True):
        difference = (model.encode(src[:, order]) - memory[:, order]).abs().max()
        assert difference < 1e-10 if equivariant else difference > 1e-4, (pos, order.tolist(), difference)


@pytest.mark.parametrize("pos", ["nope", "learned", "sinusoidal", "rope", "alibi", "relative", "sincos2d"])
def test_vit_sees_where_its_patches_are_unless_it_has_no_positions(pos):
    """Shuffling the patches of an image leaves a NoPE ViT's logits unchanged (the CLS token attends
    to a set) and changes them with every positional encoding."""
    model = bidirectional_model("vit", pos)
    torch.nn.init.normal_(model.head.weight)
    if pos == "relative":
        torch.nn.init.normal_(model.positions.weight)
    images = torch.randn(2, 3, 12, 12, dtype=DT, generator=torch.Generator().manual_seed(2))
    order = torch.tensor([4, 0, 8, 2, 6, 1, 7, 3, 5])  # a permutation of the 3 x 3 patch grid
    patches = images.unfold(2, 4, 4).unfold(3, 4, 4).reshape(2, 3, 9, 4, 4)  # row-major, as PatchEmbedding
    shuffled = patches[:, :, order].reshape(2, 3, 3, 3, 4, 4).permute(0, 1, 2, 4, 3, 5).reshape(2, 3, 12, 12)
    difference = (model(shuffled) - model(images)).abs().max()
    assert difference < 1e-10 if pos == "nope" else difference > 1e-4, (pos, difference)


def test_config_rejects_impossible_head_layouts():
    with pytest.raises(pydantic.ValidationError, match="n_kv_heads=3 does not divide n_heads=4"):
        ModelConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(pydantic.ValidationError, match="pos_encoding=rope needs an even head dimension"):
        ModelConfig(d_model=36, n_heads=4, pos_encoding="rope")
    assert math.isclose(ModelConfig(pos_encoding="rope").rope_base, 10000.0)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "nope"])
def test_kv_cache_gives_the_logits_and_tokens_of_full_recomputation(pos):
    torch.manual_seed(7)
    model = (
        build_model(
            {
                "family": "decoder_lm",
                "vocab_size": 40,
                "d_model": 32,
                "n_layers": 2,
                "n_heads": 4,
                "n_kv_heads": 2,
                "max_seq_len": 12,
                "pos_encoding": pos,
            }
        )
        .to(DT)
        .eval()
    )
    idx = torch.randint(0, 40, (2, 10))
    full = model(idx)
    caches = model.new_caches()
    steps = [model(idx[:, :4], caches=caches)]  # prefill, then one token at a time
    steps += [model(idx[:, t : t + 1], caches=caches) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    # generation past the learned window (12) too: cached and uncached agree token for token
    prompt = idx[:, :3]
    torch.testing.assert_close(
        generate(model, prompt, 15, temperature=0), generate(model, prompt, 15, temperature=0, use_cache=False)
    )


@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
def test_translator_kv_cache_equals_full_recomputation(pos):
    torch.manual_seed(8)
    model = (
        build_model(
            {
                "family": "encoder_decoder",
                "vocab_size": 30,
                "d_model": 32,
                "n_layers": 2,
                "n_heads": 4,
                "max_seq_len": 16,
                "pos_encoding": pos,
            }
        )
        .to(DT)
        .eval()
    )
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
    assert torch.equal(greedy_decode(model, src, **kwargs), greedy_decode(model, src, use_cache=False, **kwargs))


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
    model = build_model(
        {
            "family": "decoder_lm",
            "vocab_size": 20,
            "d_model": 32,
            "n_layers": 1,
            "n_heads": 2,
            "attention_score": "additive",
            "max_seq_len": 8,
        }
    )
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


@pytest.mark.parametrize(
    "pattern, extra", [("local", {"window": 3}), ("strided", {"stride": 3}), ("fixed", {"stride": 3})]
)
def test_sparse_attention_attends_exactly_the_pattern(pattern, extra):
    from blockbench.models.attention import SparsePattern
    from blockbench.models.sparse import sparse_mask

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
    model = (
        build_model(
            {
                "family": "decoder_lm",
                "vocab_size": 30,
                "d_model": 32,
                "n_layers": 2,
                "n_heads": 4,
                "attention_pattern": "strided",
                "attention_stride": 3,
                "pos_encoding": "rope",
            }
        )
        .to(DT)
        .eval()
    )
    idx = torch.randint(0, 30, (2, 9))
    caches = model.new_caches()
    steps = [model(idx[:, :2], caches=caches)] + [model(idx[:, t : t + 1], caches=caches) for t in range(2, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), model(idx))
    with pytest.raises(pydantic.ValidationError, match="attention_summary=5 exceeds attention_stride=4"):
        ModelConfig(attention_pattern="fixed", attention_stride=4, attention_summary=5)
    with pytest.raises(pydantic.ValidationError, match="unknown attention sparsity 'diagonal'"):
        ModelConfig(attention_pattern="diagonal")


# --- T5 relative position bias ("relative") -----------------------------------------------------

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
    original = T5RelativePositionBias.bias_from_layout

    def spy(self, *args, **kwargs):
        callers.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(T5RelativePositionBias, "bias_from_layout", spy)
    idx = torch.randint(0, 30, (2, 6))
    model(idx)  # gradients on: every layer looks its bias up in the one table (buckets built once)
    assert len(callers) == 3 and all(c is model.positions for c in callers)
    callers.clear()
    with torch.no_grad():  # gradients off: one lookup shared by the layers
        model(idx)
    assert len(callers) == 1 and callers[0] is model.positions


#: the devices the SDPA-versus-math gradient check runs on (the fused GPU kernels where there is one)
SDPA_DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.mark.parametrize("device", SDPA_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("pos_encoding", ["relative", "alibi"])
@pytest.mark.parametrize("family", ["decoder_lm", "encoder_decoder"])
def test_gradients_through_the_sdpa_bias_equal_the_math_backends(family, pos_encoding, dtype, device):
    """The learned T5 bias reaches the scores as SDPA's float mask, so its table's gradient flows
    through the mask, which a fused backend may not give (ALiBi's bias has no parameters,
    but its float mask decides the kernel too). With padding, in training: every gradient, the T5
    table's included, on the default backends equals that of SDPA's math backend (on a CPU the
    default takes the math kernel wherever the mask needs a gradient, the flash kernel elsewhere)."""
    if device == "cuda" and dtype == torch.float64:
        pytest.skip("the fused CUDA kernels take no float64: the default would be the math backend itself")
    torch.manual_seed(0)
    cfg = dict(family=family, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=24, vocab_size=17)
    model = build_model({**cfg, "pos_encoding": pos_encoding}).to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(1, 17, (3, 11), generator=g).to(device)
    tgt = torch.randint(1, 17, (3, 10), generator=g).to(device)
    padding = torch.zeros(3, 11, dtype=torch.bool, device=device)
    padding[0, 7:] = True
    padding[1, 9:] = True

    def gradients() -> dict[str, torch.Tensor]:
        model.zero_grad()
        if family == "decoder_lm":
            hidden = model(src, padding.flip(1), head=False)  # left padding
            hidden.square().mean().backward()
        else:
            model.loss(src, tgt[:, :-1], tgt[:, 1:], src_padding_mask=padding).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    default = gradients()
    with sdpa_kernel(SDPBackend.MATH):
        math_backend = gradients()
    if pos_encoding == "relative":
        assert default["positions.weight"].abs().sum() > 0
    # float32: the kernels' own rounding (on a CPU the largest difference is 2e-7, the T5 table's 2e-10)
    tolerance = dict(rtol=1e-9, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    if device == "cuda":
        tolerance = dict(rtol=1e-4, atol=1e-5)
    assert default.keys() == math_backend.keys()
    for name, grad in default.items():
        torch.testing.assert_close(grad, math_backend[name], **tolerance, msg=lambda m, name=name: f"{name}: {m}")


def test_relative_lm_kv_cache_and_extrapolation():
    torch.manual_seed(3)
    model = (
        build_model(
            {
                "family": "decoder_lm",
                "vocab_size": 40,
                "d_model": 32,
                "n_layers": 2,
                "n_heads": 4,
                "n_kv_heads": 2,
                "max_seq_len": 8,
                "pos_encoding": "relative",
            }
        )
        .to(torch.float64)
        .eval()
    )
    idx = torch.randint(0, 40, (2, 12))  # beyond max_seq_len: relative bias extrapolates
    full = model(idx)
    caches = model.new_caches()
    steps = [model(idx[:, :4], caches=caches)] + [model(idx[:, t : t + 1], caches=caches) for t in range(4, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    prompt = idx[:, :3]
    torch.testing.assert_close(
        generate(model, prompt, 12, temperature=0), generate(model, prompt, 12, temperature=0, use_cache=False)
    )


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
    assert dict(zip(relative.tolist(), buckets.tolist(), strict=True)) == T5_BUCKETS_BY_HAND


@pytest.mark.parametrize("family", ["encoder_decoder", "vit"])
def test_bidirectional_relative_bias_is_the_table_entry_of_each_pair(family):
    """In the translator's encoder and the ViT, the score of query i and key j in head h gets
    table[bucket(j - i), h], with the bidirectional buckets worked out by hand above (10 positions:
    offsets -9 .. 9); padded source keys get no weight."""
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


# --- the fixed 2D sine-cosine ViT table ("sincos2d") --------------------------------------------


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
    cfg = {
        "family": "vit",
        "d_model": 32,
        "n_layers": 1,
        "n_heads": 4,
        "image_size": 8,
        "patch_size": 4,
        "n_classes": 3,
    }
    model = build_model({**cfg, "pos_encoding": "sincos2d"})
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 3)
    assert list(model.positions.parameters()) == []
    assert count_parameters(model) == count_parameters(build_model({**cfg, "pos_encoding": "nope"}))
    assert (
        count_parameters(build_model({**cfg, "pos_encoding": "learned"})) - count_parameters(model) == 4 * 32
    )  # 2x2 patches


def test_sincos2d_outside_vit_or_with_bad_width_raises_a_clear_error():
    with pytest.raises(ValueError, match=r"pos_encoding=sincos2d is for the vit family \(it needs model.image_size\)"):
        build_model({"family": "decoder_lm", "vocab_size": 20, "d_model": 32, "n_heads": 4, "pos_encoding": "sincos2d"})
    with pytest.raises(ValueError, match="divisible by 4"):
        build_model(
            {
                "family": "vit",
                "d_model": 18,
                "n_heads": 2,
                "image_size": 8,
                "patch_size": 4,
                "n_classes": 3,
                "pos_encoding": "sincos2d",
            }
        )
