"""Behavioural tests for the block library in ``models/``.

Each layer is checked against an independent reference (``torch.nn`` modules with copied
weights, or the textbook formula written out with plain tensor ops), and each family against
properties that must hold (causality, padding invariance, memorisation, greedy decoding).
"""

from __future__ import annotations

import copy
import math

import pydantic
import pytest
import torch
import torch.nn.functional as F
from helpers import DT, TOL, randomize_, tiny, tiny_model
from torch import nn

from blockbench.models import (
    DecoderLM,
    EncoderDecoder,
    ModelConfig,
    MultiHeadAttention,
    TransformerBlock,
    TransformerStack,
    VisionTransformer,
    build_model,
    count_parameters,
)
from blockbench.models.decoding import generate, greedy_decode
from blockbench.models.norm import LayerNorm, RMSNorm, build_norm
from blockbench.models.placement import PostNormResidual, PreNormResidual
from blockbench.models.position import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    fixed_table_scale,
    sinusoidal_table,
)
from blockbench.models.registry import FAMILIES, NORMS, PLACEMENTS

# --------------------------------------------------------------------------- helpers


def causal_block_mask(t: int) -> torch.Tensor:
    """``nn.MultiheadAttention`` convention: True = NOT allowed to attend."""
    return torch.ones(t, t, dtype=torch.bool).triu(1)


def self_attn_pair(d: int = 16, h: int = 4, bias: bool = True):
    ours = randomize_(MultiHeadAttention(d, h, bias=bias)).to(DT).eval()
    ref = nn.MultiheadAttention(d, h, bias=bias, batch_first=True).to(DT).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.qkv_proj.weight)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        if bias:
            ref.in_proj_bias.copy_(ours.qkv_proj.bias)
            ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ours, ref


def reference_attention(x, ctx, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, n_heads, allowed):
    """softmax(Q K^T / sqrt(d_head)) V per head with plain matmuls. ``allowed``: bool
    broadcastable to (B, H, Tq, Tk), True = may attend (or None)."""

    def lin(t, w, b):
        return t @ w.T + (b if b is not None else 0.0)

    def heads(t):
        b_, n, d = t.shape
        return t.reshape(b_, n, n_heads, d // n_heads).permute(0, 2, 1, 3)

    q, k, v = heads(lin(x, w_q, b_q)), heads(lin(ctx, w_k, b_k)), heads(lin(ctx, w_v, b_v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # (B, H, Tq, dh)
    out = out.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], -1)
    return lin(out, w_o, b_o)


def right_padding_mask(lengths: list[int], total: int) -> torch.Tensor:
    return torch.arange(total)[None, :] >= torch.tensor(lengths)[:, None]


# --------------------------------------------------------------------------- 1. attention vs references


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mode", ["bidirectional", "causal", "padding", "causal+padding"])
def test_self_attention_matches_torch_mha(mode, bias):
    torch.manual_seed(0)
    ours, ref = self_attn_pair(bias=bias)
    b, t, d = 3, 7, 16
    x = torch.randn(b, t, d, dtype=DT)
    causal = "causal" in mode
    kpm = right_padding_mask([7, 4, 1], t) if "padding" in mode else None
    with torch.no_grad():
        got = ours(x, causal=causal, key_padding_mask=kpm)
        want, _ = ref(
            x, x, x, attn_mask=causal_block_mask(t) if causal else None, key_padding_mask=kpm, need_weights=False
        )
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("mode", ["bidirectional", "causal", "padding", "causal+padding"])
def test_self_attention_matches_handwritten_softmax(mode):
    torch.manual_seed(1)
    d, h, b, t = 24, 3, 2, 6
    att = randomize_(MultiHeadAttention(d, h)).to(DT).eval()
    x = torch.randn(b, t, d, dtype=DT)
    causal = "causal" in mode
    kpm = right_padding_mask([6, 3], t) if "padding" in mode else None
    allowed = torch.ones(b, 1, t, t, dtype=torch.bool)
    if causal:
        allowed &= torch.tril(torch.ones(t, t, dtype=torch.bool))
    if kpm is not None:
        allowed &= ~kpm[:, None, None, :]
    w_q, w_k, w_v = att.qkv_proj.weight.split(d)
    b_q, b_k, b_v = att.qkv_proj.bias.split(d)
    with torch.no_grad():
        want = reference_attention(
            x, x, w_q, b_q, w_k, b_k, w_v, b_v, att.out_proj.weight, att.out_proj.bias, h, allowed
        )
        got = att(x, causal=causal, key_padding_mask=kpm)
    torch.testing.assert_close(got, want, **TOL)


def test_cross_attention_matches_torch_mha_and_handwritten():
    torch.manual_seed(2)
    d, h, b, tq, tk = 16, 4, 3, 5, 7
    ours = randomize_(MultiHeadAttention(d, h, cross=True)).to(DT).eval()
    ref = nn.MultiheadAttention(d, h, batch_first=True).to(DT).eval()
    with torch.no_grad():
        ref.in_proj_weight[:d].copy_(ours.q_proj.weight)
        ref.in_proj_weight[d:].copy_(ours.kv_proj.weight)  # kv_proj rows are [K; V]
        ref.in_proj_bias[:d].copy_(ours.q_proj.bias)
        ref.in_proj_bias[d:].copy_(ours.kv_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(b, tq, d, dtype=DT)
    mem = torch.randn(b, tk, d, dtype=DT)
    for kpm in (None, right_padding_mask([7, 2, 5], tk)):
        with torch.no_grad():
            got = ours(x, mem, key_padding_mask=kpm)
            want, _ = ref(x, mem, mem, key_padding_mask=kpm, need_weights=False)
            w_k, w_v = ours.kv_proj.weight.split(d)
            b_k, b_v = ours.kv_proj.bias.split(d)
            allowed = None if kpm is None else ~kpm[:, None, None, :]
            manual = reference_attention(
                x,
                mem,
                ours.q_proj.weight,
                ours.q_proj.bias,
                w_k,
                b_k,
                w_v,
                b_v,
                ours.out_proj.weight,
                ours.out_proj.bias,
                h,
                allowed,
            )
        torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(got, manual, **TOL)


def test_cross_attention_requires_context():
    att = MultiHeadAttention(8, 2, cross=True)
    with pytest.raises(ValueError, match="context"):
        att(torch.randn(1, 3, 8))


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_blocks_match_torch_transformer_layers(placement, activation):
    """Whole encoder/decoder blocks against nn.TransformerEncoderLayer / DecoderLayer
    (norm_first=True is pre-norm, False is post-norm) with copied weights."""
    torch.manual_seed(3)
    cfg = ModelConfig(d_model=16, n_heads=4, d_ff=40, norm_placement=placement, activation=activation)
    kw = dict(
        d_model=16,
        nhead=4,
        dim_feedforward=40,
        dropout=0.0,
        activation=activation,
        batch_first=True,
        norm_first=placement == "pre",
    )

    def copy_attn(dst: nn.MultiheadAttention, src: MultiHeadAttention):
        if src.cross:
            dst.in_proj_weight.copy_(torch.cat([src.q_proj.weight, src.kv_proj.weight]))
            dst.in_proj_bias.copy_(torch.cat([src.q_proj.bias, src.kv_proj.bias]))
        else:
            dst.in_proj_weight.copy_(src.qkv_proj.weight)
            dst.in_proj_bias.copy_(src.qkv_proj.bias)
        dst.out_proj.load_state_dict(src.out_proj.state_dict())

    def copy_common(ref, blk):
        copy_attn(ref.self_attn, blk.self_attn.sublayer)
        ref.linear1.load_state_dict(blk.ffn.sublayer.fc_in.state_dict())
        ref.linear2.load_state_dict(blk.ffn.sublayer.fc_out.state_dict())
        ref.norm1.load_state_dict(blk.self_attn.norm.state_dict())

    x = torch.randn(2, 6, 16, dtype=DT)
    mem = torch.randn(2, 5, 16, dtype=DT)
    src_kpm = right_padding_mask([5, 3], 5)
    with torch.no_grad():
        enc = randomize_(TransformerBlock(cfg, causal=False)).to(DT).eval()
        ref_enc = nn.TransformerEncoderLayer(**kw).to(DT).eval()
        copy_common(ref_enc, enc)
        ref_enc.norm2.load_state_dict(enc.ffn.norm.state_dict())
        kpm = right_padding_mask([6, 4], 6)
        torch.testing.assert_close(enc(x, padding_mask=kpm), ref_enc(x, src_key_padding_mask=kpm), **TOL)

        dec = randomize_(TransformerBlock(cfg, causal=True, cross_attention=True)).to(DT).eval()
        ref_dec = nn.TransformerDecoderLayer(**kw).to(DT).eval()
        copy_common(ref_dec, dec)
        copy_attn(ref_dec.multihead_attn, dec.cross_attn.sublayer)
        ref_dec.norm2.load_state_dict(dec.cross_attn.norm.state_dict())
        ref_dec.norm3.load_state_dict(dec.ffn.norm.state_dict())
        got = dec(x, memory=mem, memory_padding_mask=src_kpm)
        want = ref_dec(x, mem, tgt_mask=causal_block_mask(6), memory_key_padding_mask=src_kpm)
        torch.testing.assert_close(got, want, **TOL)


# --------------------------------------------------------------------------- 2. causality


def _change_future(tokens: torch.Tensor, start: int, vocab: int) -> torch.Tensor:
    out = tokens.clone()
    out[:, start:] = (out[:, start:] + 1 + torch.randint(0, vocab - 1, out[:, start:].shape)) % vocab
    assert (out[:, start:] != tokens[:, start:]).all()
    return out


def test_causal_attention_ignores_future():
    torch.manual_seed(4)
    att = randomize_(MultiHeadAttention(16, 4)).to(DT).eval()
    x = torch.randn(2, 8, 16, dtype=DT)
    x2 = x.clone()
    x2[:, 5:] = torch.randn(2, 3, 16, dtype=DT)
    with torch.no_grad():
        y, y2 = att(x, causal=True), att(x2, causal=True)
        torch.testing.assert_close(y[:, :5], y2[:, :5], **TOL)
        assert not torch.allclose(y[:, 5:], y2[:, 5:])
        # bidirectional attention does look ahead (the check above is not vacuous)
        assert not torch.allclose(att(x)[:, :5], att(x2)[:, :5])


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_decoder_lm_is_causal(placement, pos):
    torch.manual_seed(5)
    model = randomize_(tiny_model("decoder_lm", norm_placement=placement, pos_encoding=pos), std=0.2)
    idx = torch.randint(0, 17, (3, 10))
    idx2 = _change_future(idx, 6, 17)
    with torch.no_grad():
        y, y2 = model(idx), model(idx2)
    torch.testing.assert_close(y[:, :6], y2[:, :6], **TOL)
    assert not torch.allclose(y[:, 6:], y2[:, 6:])


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_encoder_decoder_decoder_is_causal(placement):
    torch.manual_seed(6)
    model = randomize_(tiny_model("encoder_decoder", norm_placement=placement), std=0.2)
    src = torch.randint(0, 17, (2, 7))
    tgt = torch.randint(0, 17, (2, 9))
    tgt2 = _change_future(tgt, 4, 17)
    with torch.no_grad():
        y, y2 = model(src, tgt), model(src, tgt2)
        torch.testing.assert_close(y[:, :4], y2[:, :4], **TOL)
        assert not torch.allclose(y[:, 4:], y2[:, 4:])
        # the encoder is bidirectional: changing the last source token changes the first logits
        src2 = src.clone()
        src2[:, -1] = (src2[:, -1] + 1) % 17
        assert not torch.allclose(model(src2, tgt)[:, 0], y[:, 0])


# --------------------------------------------------------------------------- 3. padding


@pytest.mark.parametrize("causal", [False, True])
def test_attention_padding_matches_unpadded(causal):
    torch.manual_seed(7)
    att = randomize_(MultiHeadAttention(16, 4)).to(DT).eval()
    long_seq = torch.randn(1, 8, 16, dtype=DT)
    short = torch.randn(1, 5, 16, dtype=DT)
    junk = 100 * torch.randn(1, 3, 16, dtype=DT)
    batch = torch.cat([long_seq, torch.cat([short, junk], 1)])
    kpm = right_padding_mask([8, 5], 8)
    with torch.no_grad():
        out = att(batch, causal=causal, key_padding_mask=kpm)
        torch.testing.assert_close(out[0], att(long_seq, causal=causal)[0], **TOL)
        torch.testing.assert_close(out[1, :5], att(short, causal=causal)[0], **TOL)
        if not causal:  # without the mask the junk leaks into real positions
            assert not torch.allclose(att(batch)[1, :5], out[1, :5])


def test_decoder_lm_padding_matches_unpadded():
    torch.manual_seed(8)
    model = randomize_(tiny_model("decoder_lm"), std=0.2)
    a = torch.randint(0, 17, (1, 9))
    b = torch.randint(0, 17, (1, 5))
    batch = torch.cat([a, torch.cat([b, torch.randint(0, 17, (1, 4))], 1)])
    with torch.no_grad():
        out = model(batch, padding_mask=right_padding_mask([9, 5], 9))
        torch.testing.assert_close(out[0], model(a)[0], **TOL)
        torch.testing.assert_close(out[1, :5], model(b)[0], **TOL)


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_translator_src_padding_matches_unpadded(placement):
    torch.manual_seed(9)
    model = randomize_(tiny_model("encoder_decoder", norm_placement=placement), std=0.2)
    src_a = torch.randint(0, 17, (1, 8))
    src_b = torch.randint(0, 17, (1, 3))
    src = torch.cat([src_a, torch.cat([src_b, torch.randint(0, 17, (1, 5))], 1)])
    mask = right_padding_mask([8, 3], 8)
    tgt = torch.randint(0, 17, (2, 6))
    with torch.no_grad():
        out = model(src, tgt, src_padding_mask=mask)
        torch.testing.assert_close(out[0], model(src_a, tgt[:1])[0], **TOL)
        torch.testing.assert_close(out[1], model(src_b, tgt[1:])[0], **TOL)
        # without the mask the padding tokens do change the logits
        assert not torch.allclose(model(src, tgt)[1], out[1])


# --------------------------------------------------------------------------- 4. placement


def manual_norm(name: str, x: torch.Tensor, norm: nn.Module, eps: float) -> torch.Tensor:
    if name == "layernorm":
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * norm.weight + norm.bias
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * norm.weight


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_pre_and_post_placement_formulas(norm):
    torch.manual_seed(10)
    d, eps = 12, 1e-5
    x = torch.randn(3, 5, d, dtype=DT)
    pre_cls, post_cls = PLACEMENTS.get("pre"), PLACEMENTS.get("post")
    assert pre_cls is PreNormResidual and post_cls is PostNormResidual
    pre = randomize_(pre_cls(nn.Linear(d, d), norm, d, eps, True, 0.0)).to(DT)
    post = randomize_(post_cls(nn.Linear(d, d), norm, d, eps, True, 0.0)).to(DT)
    with torch.no_grad():
        f, g = pre.sublayer, post.sublayer
        torch.testing.assert_close(pre(x), x + f(manual_norm(norm, x, pre.norm, eps)), **TOL)
        torch.testing.assert_close(post(x), manual_norm(norm, x + g(x), post.norm, eps), **TOL)
    assert pre_cls.final_norm is True and post_cls.final_norm is False


def test_placement_forwards_extra_arguments():
    class Scaled(nn.Module):
        def forward(self, x, other, *, scale):
            return scale * x + other

    torch.manual_seed(11)
    x, other = torch.randn(2, 4, 8, dtype=DT), torch.randn(2, 4, 8, dtype=DT)
    pre = PreNormResidual(Scaled(), "layernorm", 8, 1e-5, True, 0.0).to(DT)
    post = PostNormResidual(Scaled(), "layernorm", 8, 1e-5, True, 0.0).to(DT)
    torch.testing.assert_close(pre(x, other, scale=3.0), x + 3.0 * F.layer_norm(x, (8,)) + other, **TOL)
    torch.testing.assert_close(post(x, other, scale=3.0), F.layer_norm(x + 3.0 * x + other, (8,)), **TOL)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_stack_final_norm_only_for_pre(norm):
    torch.manual_seed(12)
    pre = TransformerStack(ModelConfig(d_model=16, n_heads=2, norm=norm, norm_placement="pre"), 2, causal=False)
    post = TransformerStack(ModelConfig(d_model=16, n_heads=2, norm=norm, norm_placement="post"), 2, causal=False)
    assert isinstance(pre.final_norm, NORMS.get(norm))
    assert isinstance(post.final_norm, nn.Identity)
    for stack, cls in ((pre, PreNormResidual), (post, PostNormResidual)):
        for blk in stack.blocks:
            assert all(isinstance(m, cls) for m in (blk.self_attn, blk.ffn))
    randomize_(pre).to(DT).eval()
    x = torch.randn(2, 5, 16, dtype=DT)
    with torch.no_grad():
        h = x
        for blk in pre.blocks:
            h = blk(h)
        torch.testing.assert_close(pre(x), manual_norm(norm, h, pre.final_norm, 1e-5), **TOL)


# --------------------------------------------------------------------------- 5. norms


SHAPES = [(5, 8), (2, 3, 16), (2, 3, 4, 12)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_torch(shape, dtype, bias):
    torch.manual_seed(13)
    d, eps = shape[-1], 1e-3
    ours = randomize_(LayerNorm(d, eps=eps, bias=bias)).to(dtype)
    ref = nn.LayerNorm(d, eps=eps, bias=bias).to(dtype)
    ref.load_state_dict(ours.state_dict())
    x = 3 * torch.randn(*shape, dtype=dtype) + 1
    tol = TOL if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours(x), ref(x), **tol)
    assert isinstance(build_norm("layernorm", d), LayerNorm)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_rmsnorm_matches_torch(shape, dtype, eps):
    torch.manual_seed(14)
    d = shape[-1]
    ours = randomize_(RMSNorm(d, eps=eps)).to(dtype)
    ref = nn.RMSNorm(d, eps=eps).to(dtype)
    ref.load_state_dict(ours.state_dict())
    x = 0.3 * torch.randn(*shape, dtype=dtype) + 0.1  # small inputs so eps matters
    tol = TOL if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    out = ours(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref(x), **tol)
    assert isinstance(build_norm("rmsnorm", d), RMSNorm)


def test_rmsnorm_half_precision_computes_in_float32():
    torch.manual_seed(15)
    ours = randomize_(RMSNorm(16)).to(torch.bfloat16)
    x = torch.randn(4, 16).to(torch.bfloat16)
    out = ours(x)
    assert out.dtype == torch.bfloat16
    want = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(out.float(), (want.bfloat16() * ours.weight).float(), rtol=0, atol=0)


# --------------------------------------------------------------------------- 6. positions


def test_sinusoidal_table_hand_computed_entries():
    d = 8  # frequencies 1/10000^(2i/8) for i = 0..3: 1, 1/10, 1/100, 1/1000
    table = sinusoidal_table(101, d)
    assert table.shape == (101, d)
    expected = {
        (0, 0): 0.0,
        (0, 1): 1.0,
        (0, 6): 0.0,
        (0, 7): 1.0,
        (1, 0): 0.8414709848078965,  # sin(1)
        (1, 1): 0.5403023058681398,  # cos(1)
        (2, 2): 0.19866933079506122,  # sin(2/10)
        (2, 3): 0.9800665778412416,  # cos(2/10)
        (3, 4): 0.029995500202495664,  # sin(3/100)
        (5, 7): 0.9999875000260416,  # cos(5/1000)
        (100, 6): 0.09983341664682815,  # sin(100/1000)
        (100, 0): -0.5063656411097588,  # sin(100)
    }
    for (p, j), value in expected.items():
        assert table[p, j].item() == pytest.approx(value, abs=2e-6), (p, j)
    # and the whole table against the formula, evaluated in float64
    for p in (0, 1, 7, 50):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert table[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_sinusoidal_module_offset_and_growth():
    enc = SinusoidalPositionalEncoding(4, 6).to(DT)
    full = (sinusoidal_table(12, 6) * fixed_table_scale()).to(DT)  # scaled to the token embeddings' RMS
    torch.testing.assert_close(enc(3, offset=1), full[1:4])
    grown = enc(5, offset=7)  # beyond the initial table: sinusoids extrapolate
    assert grown.dtype == DT
    torch.testing.assert_close(grown, full[7:12])
    assert not list(enc.parameters())


def test_learned_positions_refuse_long_sequence():
    torch.manual_seed(16)
    emb = LearnedPositionalEmbedding(8, 4)
    assert emb(8).shape == (8, 4)
    torch.testing.assert_close(emb(3, offset=2), emb.weight[2:5])
    with pytest.raises(ValueError, match=r"length 9 exceeds .*max_seq_len=8"):
        emb(9)
    model = tiny_model("decoder_lm", max_seq_len=8)
    model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"max_seq_len=8.*cannot extrapolate"):
        model(torch.zeros(1, 9, dtype=torch.long))
    # sinusoidal positions have no such limit
    tiny_model("decoder_lm", max_seq_len=8, pos_encoding="sinusoidal")(torch.zeros(1, 12, dtype=torch.long))


# --------------------------------------------------------------------------- 7. config validation


def test_config_heads_must_divide_d_model():
    with pytest.raises(pydantic.ValidationError, match="n_heads=6 does not divide d_model=256"):
        ModelConfig(d_model=256, n_heads=6)
    cfg = ModelConfig(d_model=256, n_heads=8)
    with pytest.raises(pydantic.ValidationError, match="n_heads=6 does not divide d_model=256"):
        cfg.n_heads = 6  # validate_assignment
    with pytest.raises(pydantic.ValidationError, match="patch_size=3 does not divide image_size=8"):
        ModelConfig(image_size=8, patch_size=3)


def test_config_rejects_unknown_keys():
    with pytest.raises(pydantic.ValidationError) as err:
        ModelConfig(nheads=4)
    assert "nheads" in str(err.value) and "extra" in str(err.value).lower()
    with pytest.raises(pydantic.ValidationError):
        build_model({"family": "decoder_lm", "vocab_size": 10, "layers": 2})


@pytest.mark.parametrize(
    "field, value, registry",
    [
        ("norm", "batchnorm", NORMS),
        ("norm_placement", "upside_down", PLACEMENTS),
        ("activation", "swish", None),
        ("pos_encoding", "spiral", None),
    ],
)
def test_config_unknown_variant_lists_valid_names(field, value, registry):
    with pytest.raises(pydantic.ValidationError) as err:
        ModelConfig(**{field: value})
    msg = str(err.value)
    assert f"'{value}'" in msg and "choose one of" in msg
    if registry is not None:
        for name in registry.names():
            assert name in msg
    if field == "norm":
        assert "layernorm" in msg and "rmsnorm" in msg


def test_build_model_errors():
    with pytest.raises(ValueError, match=r"model\.family is not set") as err:
        build_model({"vocab_size": 10})
    for name in FAMILIES.names():
        assert name in str(err.value)
    for family in ("decoder_lm", "encoder_decoder"):
        with pytest.raises(ValueError, match=rf"'{family}' needs model\.vocab_size"):
            build_model({"family": family})
    with pytest.raises(ValueError, match=r"model\.image_size, model\.n_classes"):
        build_model({"family": "vit"})
    with pytest.raises(pydantic.ValidationError):
        build_model({"family": "gpt", "vocab_size": 10})


def test_build_model_families():
    assert isinstance(build_model(tiny("decoder_lm")), DecoderLM)
    assert isinstance(build_model(tiny("encoder_decoder")), EncoderDecoder)
    assert isinstance(build_model(ModelConfig(**tiny("vit"))), VisionTransformer)
    ed = build_model(tiny("encoder_decoder", n_encoder_layers=3, n_decoder_layers=1))
    assert len(ed.encoder.blocks) == 3 and len(ed.decoder.blocks) == 1


# --------------------------------------------------------------------------- 8. memorisation


def _loss(model, family, batch):
    if family == "decoder_lm":
        (idx,) = batch
        logits = model(idx[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
    if family == "encoder_decoder":
        src, tgt = batch
        logits = model(src, tgt[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))
    images, labels = batch
    return F.cross_entropy(model(images), labels)


VARIANTS = {
    "pre": {"norm_placement": "pre"},
    "post": {"norm_placement": "post"},
    "post-rms-sin-relu": {
        "norm_placement": "post",
        "norm": "rmsnorm",
        "pos_encoding": "sinusoidal",
        "activation": "relu",
    },
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("family", ["decoder_lm", "encoder_decoder", "vit"])
def test_family_memorises_tiny_batch(family, variant):
    torch.manual_seed(17)
    model = build_model(tiny(family, **VARIANTS[variant])).train()
    if family == "decoder_lm":
        batch = (torch.randint(0, 17, (4, 9)),)
    elif family == "encoder_decoder":
        batch = (torch.randint(0, 17, (4, 6)), torch.randint(0, 17, (4, 7)))
    else:
        batch = (torch.randn(8, 3, 8, 8), torch.randint(0, 5, (8,)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(30):
        loss = _loss(model, family, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.5 * losses[0], losses


# --------------------------------------------------------------------------- 9. decoding


def _manual_greedy(model, idx, steps):
    for _ in range(steps):
        nxt = model(idx)[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, nxt], 1)
    return idx


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_generate_greedy_and_top1_equal_manual_argmax(pos):
    torch.manual_seed(18)
    model = randomize_(tiny_model("decoder_lm", pos_encoding=pos), std=0.2)
    prompt = torch.randint(0, 17, (3, 4))
    with torch.no_grad():
        want = _manual_greedy(model, prompt, 10)
    greedy = generate(model, prompt, 10, temperature=0)
    assert torch.equal(greedy, want)
    assert torch.equal(greedy[:, :4], prompt)
    gen = torch.Generator().manual_seed(0)
    for temperature in (1.0, 0.5, 3.0):
        assert torch.equal(generate(model, prompt, 10, temperature=temperature, top_k=1, generator=gen), want)


@pytest.mark.parametrize("top_k", [None, 4])
def test_generate_samples_as_a_full_forward_loop_with_the_same_draws(top_k):
    """Prefill plus one cached token per step draws, from the same generator, the tokens that a
    loop of full forward passes and ``multinomial`` over softmax(logits / temperature) draws."""
    torch.manual_seed(23)
    model = randomize_(tiny_model("decoder_lm"), std=0.2)
    prompt = torch.randint(0, 17, (4, 3))
    gen = torch.Generator().manual_seed(5)
    want = prompt
    with torch.no_grad():
        for _ in range(10):
            logits = model(want)[:, -1] / 0.7
            if top_k is not None:
                logits = logits.masked_fill(logits < logits.topk(top_k).values[:, -1:], float("-inf"))
            want = torch.cat([want, torch.multinomial(logits.softmax(-1), 1, generator=gen)], 1)
    got = generate(model, prompt, 10, temperature=0.7, top_k=top_k, generator=torch.Generator().manual_seed(5))
    assert torch.equal(got, want)
    assert not torch.equal(got, generate(model, prompt, 10, temperature=0))  # the draws are not all the argmax


def test_generate_top_k_samples_only_top_k():
    torch.manual_seed(19)
    model = randomize_(tiny_model("decoder_lm"), std=0.2)
    prompt = torch.randint(0, 17, (1, 5)).repeat(300, 1)
    with torch.no_grad():
        top3 = set(model(prompt[:1])[0, -1].topk(3).indices.tolist())
    out = generate(model, prompt, 1, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(1))
    sampled = set(out[:, -1].tolist())
    assert sampled <= top3 and len(sampled) > 1


def test_generate_crops_context_to_learned_positions():
    torch.manual_seed(20)
    model = randomize_(tiny_model("decoder_lm", max_seq_len=8), std=0.2)
    prompt = torch.randint(0, 17, (2, 6))
    out = generate(model, prompt, 5, temperature=0)  # total 11 > max_seq_len: must not raise
    with torch.no_grad():
        idx = prompt
        for _ in range(5):
            idx = torch.cat([idx, model(idx[:, -8:])[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, idx)


def test_greedy_decode_equals_manual_loop():
    torch.manual_seed(21)
    bos, eos, max_len = 1, 2, 8
    srcs = [torch.randint(3, 17, (n,)) for n in (7, 4, 6)]
    targets = [[5, 9, 3, eos], [7, eos], [4, 6, 8, 10, 12, 14, 16, 3, 5]]  # the last never ends
    src = torch.randint(3, 17, (3, 7))  # junk behind the padding mask
    for i, s in enumerate(srcs):
        src[i, : len(s)] = s
    mask = right_padding_mask([len(s) for s in srcs], 7)
    # after EOS the model is taught to go on with token 11: greedy_decode must overwrite it with EOS
    tgt = torch.full((3, 10), 11)
    tgt[:, 0] = bos
    for i, t in enumerate(targets):
        tgt[i, 1 : len(t) + 1] = torch.tensor(t)

    # a briefly trained model, so greedy outputs vary and rows stop at different steps
    model = build_model(tiny("encoder_decoder"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(40):
        logits = model(src, tgt[:, :-1], src_padding_mask=mask)
        loss = F.cross_entropy(logits.reshape(-1, 17), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model = model.to(DT).eval()

    def manual(one_src):
        """Token-by-token argmax with forward() on one unpadded source; stops after EOS."""
        tokens = [bos]
        with torch.no_grad():
            for _ in range(max_len):
                nxt = model(one_src[None], torch.tensor([tokens]))[0, -1].argmax().item()
                tokens.append(nxt)
                if nxt == eos:
                    break
        return tokens[1:]

    rows = [manual(s) for s in srcs]
    length = max(len(r) for r in rows)
    assert any(r[-1] == eos and len(r) < length for r in rows), rows  # the EOS fill is exercised
    want = torch.tensor([r + [eos] * (length - len(r)) for r in rows])
    got = greedy_decode(model, src, bos_id=bos, eos_id=eos, max_len=max_len, src_padding_mask=mask)
    assert torch.equal(got, want), (got, want)

    # once every row has emitted EOS the loop stops before max_len
    short = [i for i, r in enumerate(rows) if r[-1] == eos]
    got = greedy_decode(model, src[short], bos_id=bos, eos_id=eos, max_len=max_len, src_padding_mask=mask[short])
    assert got.shape[1] == max(len(rows[i]) for i in short) < max_len
    for j, i in enumerate(short):
        assert got[j, : len(rows[i])].tolist() == rows[i]


# --------------------------------------------------------------------------- 10. tied embeddings


@pytest.mark.parametrize("family", ["decoder_lm", "encoder_decoder"])
def test_tied_embeddings(family):
    torch.manual_seed(22)
    tied = build_model(tiny(family, tie_embeddings=True))
    untied = build_model(tiny(family, tie_embeddings=False))
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert count_parameters(untied) - count_parameters(tied) == 17 * 32
    # still one tensor after an optimiser step
    opt = torch.optim.AdamW(tied.parameters(), lr=1e-2)
    idx = torch.randint(0, 17, (2, 5))
    out = tied(idx) if family == "decoder_lm" else tied(idx, idx)
    out.sum().backward()
    opt.step()
    assert tied.lm_head.weight is tied.tok_emb.weight


# --------------------------------------------------------------------------- 11. ViT classification head


def test_vit_head_init_is_timm_default():
    """The head is drawn like timm's default (``init_weights_vit_timm``: trunc_normal std 0.02, zero
    bias) and HF's ViT (N(0, 0.02), zero bias), not zero (the JAX fine-tuning recipe)."""
    torch.manual_seed(23)
    head = build_model(tiny("vit", d_model=64, n_classes=100)).head  # 6400 weights: the std to ~1%
    assert torch.equal(head.bias, torch.zeros(100))
    assert head.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert abs(head.weight.mean().item()) < 0.002
    assert (head.weight != 0).all()


def _fit_fixed_batch(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, steps: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(steps):
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return F.cross_entropy(model(images), labels).item()


@pytest.mark.parametrize("seed", [0, 1])
def test_vit_fits_fixed_batch_far_faster_than_with_zero_head(seed):
    """With a zero head, AdamW at 3e-4 first has to grow the head before any gradient
    reaches the stack, and a 25-step fit of 16 random images with random labels ends near ln(10);
    the built model (N(0, 0.02) head, as timm/HF) ends far lower. Same init otherwise. No position
    table (nope), and the CLS token redrawn at 0.02 in both: at the patches' RMS it slows a fit of
    noise for either head (see ``benchmarks/parity/init_parity.py``), so the fit measures the head alone."""
    torch.manual_seed(seed)
    built = build_model(tiny("vit", d_model=64, n_layers=1, d_ff=256, n_classes=10, pos_encoding="nope")).train()
    nn.init.normal_(built.cls_token, std=0.02)
    zero_head = copy.deepcopy(built)
    nn.init.zeros_(zero_head.head.weight)
    generator = torch.Generator().manual_seed(seed)
    images, labels = torch.randn(16, 3, 8, 8, generator=generator), torch.randint(0, 10, (16,), generator=generator)
    with_zero_head = _fit_fixed_batch(zero_head, images, labels, 25)
    as_built = _fit_fixed_batch(built, images, labels, 25)
    assert as_built < 0.75 * with_zero_head, (as_built, with_zero_head)
