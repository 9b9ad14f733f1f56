"""ScaleNorm, the sandwich and DeepNorm placements, DeepNet's constants and its initialisation,
each checked against the formula written out by hand."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import DT, TOL, randomize_
from torch import nn

from blockbench.models.block import TransformerBlock, TransformerStack
from blockbench.models.config import ModelConfig
from blockbench.models.norm import ScaleNorm, build_norm
from blockbench.models.placement import (
    DeepNormResidual,
    PostNormResidual,
    PreNormResidual,
    Residual,
    SandwichResidual,
    deepnorm_alpha_beta,
    deepnorm_init_,
)
from blockbench.models.registry import NORMS, PLACEMENTS


def layer_norm(x: torch.Tensor, norm: nn.Module, eps: float) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * norm.weight + norm.bias


# --------------------------------------------------------------------------- ScaleNorm


def test_scalenorm_registered_and_initialised():
    assert NORMS.get("scalenorm") is ScaleNorm
    norm = build_norm("scalenorm", 16, eps=1e-3, bias=False)
    assert isinstance(norm, ScaleNorm) and norm.eps == 1e-3
    params = dict(norm.named_parameters())
    assert list(params) == ["g"] and params["g"].shape == ()  # one scalar, no bias
    assert params["g"].item() == pytest.approx(4.0)  # sqrt(16)
    assert ScaleNorm(10).g.item() == pytest.approx(math.sqrt(10))


@pytest.mark.parametrize("dtype", [torch.float32, DT])
def test_scalenorm_formula(dtype):
    torch.manual_seed(0)
    d, eps = 6, 1e-5
    norm = ScaleNorm(d, eps=eps).to(dtype)
    with torch.no_grad():
        norm.g.fill_(1.7)
    x = torch.randn(2, 3, d, dtype=dtype)
    x[0, 0] = 0.0  # zero vector: the eps clamp keeps it finite (output 0)
    x[0, 1] = 1e-7  # norm below eps: divided by eps, not by its norm
    want = torch.empty_like(x)
    for idx in torch.cartesian_prod(torch.arange(2), torch.arange(3)):
        v = x[idx[0], idx[1]]
        length = math.sqrt(sum(float(t) ** 2 for t in v))
        want[idx[0], idx[1]] = 1.7 * v / max(length, eps)
    tol = TOL if dtype == DT else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(norm(x), want, **tol)
    assert norm(x).dtype == dtype
    # a known value: [3, 4] has norm 5
    two = ScaleNorm(2).to(DT)
    torch.testing.assert_close(
        two(torch.tensor([3.0, 4.0], dtype=DT)), two.g.detach() * torch.tensor([0.6, 0.8], dtype=DT), **TOL
    )


# --------------------------------------------------------------------------- placements


def test_placements_registered_with_final_norm_flags():
    assert PLACEMENTS.get("sandwich") is SandwichResidual and SandwichResidual.final_norm is True
    assert PLACEMENTS.get("deepnorm") is DeepNormResidual and DeepNormResidual.final_norm is False


@pytest.mark.parametrize("norm", ["layernorm", "scalenorm"])
def test_sandwich_formula(norm):
    torch.manual_seed(1)
    d, eps = 8, 1e-5
    res = randomize_(SandwichResidual(nn.Linear(d, d), norm, d, eps, True, 0.0), std=0.5).to(DT)
    assert res.norm is not res.post_norm
    x = torch.randn(3, 4, d, dtype=DT)
    f = res.sublayer
    if norm == "layernorm":
        n1 = lambda t: layer_norm(t, res.norm, eps)  # noqa: E731
        n2 = lambda t: layer_norm(t, res.post_norm, eps)  # noqa: E731
    else:
        n1 = lambda t: res.norm.g * t / t.norm(dim=-1, keepdim=True)  # noqa: E731
        n2 = lambda t: res.post_norm.g * t / t.norm(dim=-1, keepdim=True)  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(res(x), x + n2(f(n1(x))), **TOL)


def test_deepnorm_formula_and_positional_signature():
    torch.manual_seed(2)
    d, eps, alpha = 8, 1e-5, 2.5
    res = randomize_(
        DeepNormResidual(nn.Linear(d, d), "layernorm", d, eps, True, 0.0, residual_scale=alpha), std=0.5
    ).to(DT)
    assert res.residual_scale == alpha
    x = torch.randn(3, 4, d, dtype=DT)
    with torch.no_grad():
        torch.testing.assert_close(res(x), layer_norm(alpha * x + res.sublayer(x), res.norm, eps), **TOL)
    # default alpha 1 is plain post-norm
    plain = DeepNormResidual(nn.Linear(d, d), "layernorm", d, eps, True, 0.0)
    assert plain.residual_scale == 1.0


def test_pre_and_post_store_and_ignore_residual_scale():
    torch.manual_seed(3)
    d = 8
    x = torch.randn(2, 3, d, dtype=DT)
    for cls in (PreNormResidual, PostNormResidual, SandwichResidual):
        one = randomize_(cls(nn.Linear(d, d), "layernorm", d, 1e-5, True, 0.0), std=0.5).to(DT)
        scaled = cls(nn.Linear(d, d), "layernorm", d, 1e-5, True, 0.0, residual_scale=3.0).to(DT)
        scaled.load_state_dict(one.state_dict())
        assert scaled.residual_scale == 3.0
        with torch.no_grad():
            torch.testing.assert_close(scaled(x), one(x), **TOL)


# --------------------------------------------------------------------------- DeepNet constants


def test_deepnorm_constants_hand_computed():
    # decoder-only, M = 4: alpha = 8^(1/4), beta = 32^(-1/4)
    a, b = deepnorm_alpha_beta("decoder", 99, 4)["decoder"]
    assert a == pytest.approx(8**0.25, rel=1e-12) and a == pytest.approx(1.6817928305074290)
    assert b == pytest.approx(32**-0.25, rel=1e-12) and b == pytest.approx(0.42044820762685725)
    # encoder-only, N = 12: alpha = 24^(1/4), beta = 96^(-1/4)
    assert deepnorm_alpha_beta("encoder", 12, 99) == {"encoder": pytest.approx((24**0.25, 96**-0.25))}
    # encoder-decoder, N = M = 6: (N^4 M)^(1/16) = 6^(5/16) = 1.75054091... (its 16th power is 6^5 = 7776)
    ed = deepnorm_alpha_beta("encoder_decoder", 6, 6)
    assert ed["encoder"] == pytest.approx((0.81 * 1.7505409144265713, 0.87 / 1.7505409144265713), rel=1e-12)
    assert ed["encoder"] == pytest.approx((1.417938140685523, 0.49698924077132345), rel=1e-12)
    assert ed["decoder"] == pytest.approx((18**0.25, 72**-0.25), rel=1e-12)
    assert ed["decoder"] == pytest.approx((2.0597671439071177, 0.34329452398451965), rel=1e-12)
    # encoder-decoder with different depths, N = 18, M = 2: (18^4 * 2)^(1/16)
    ed = deepnorm_alpha_beta("encoder_decoder", 18, 2)
    s = (18**4 * 2) ** (1 / 16)
    assert ed["encoder"] == pytest.approx((0.81 * s, 0.87 / s), rel=1e-12)
    assert ed["decoder"] == pytest.approx((6**0.25, 24**-0.25), rel=1e-12)


def test_stack_constants_per_placement():
    for name in PLACEMENTS.names():
        cls = PLACEMENTS.get(name)
        assert issubclass(cls, Residual)
        for arch, stacks in (
            ("encoder", ["encoder"]),
            ("decoder", ["decoder"]),
            ("encoder_decoder", ["encoder", "decoder"]),
        ):
            for stack in stacks:
                got = cls.stack_constants(arch, 6, 6, stack)
                want = deepnorm_alpha_beta(arch, 6, 6)[stack] if name == "deepnorm" else (1.0, 1.0)
                assert got == pytest.approx(want)
    with pytest.raises(ValueError, match="no 'decoder' stack"):
        DeepNormResidual.stack_constants("encoder", 6, 6, "decoder")
    with pytest.raises(ValueError, match="unknown architecture"):
        PreNormResidual.stack_constants("vit", 6, 6, "encoder")
    with pytest.raises(ValueError, match="positive"):
        deepnorm_alpha_beta("decoder", 6, 0)


# --------------------------------------------------------------------------- DeepNet init


def _xavier_reference(shapes_and_gains: list[tuple[tuple[int, int], float]]) -> list[torch.Tensor]:
    """``nn.init.xavier_normal_`` of a fresh matrix per ``(shape, gain)``, in order: the draws the
    paper's ``deepnorm_init`` makes, one projection (or one block of a fused one) at a time."""
    out = []
    for shape, gain in shapes_and_gains:
        w = torch.empty(shape)
        nn.init.xavier_normal_(w, gain=gain)
        out.append(w)
    return out


@pytest.mark.parametrize("cross_attention", [False, True])
def test_deepnorm_init_is_xavier_with_gain_beta_on_v_out_and_ffn_and_1_on_q_k(cross_attention):
    """DeepNet's Figure 2: xavier_normal_(gain=beta) for the FFN, value and output projections,
    xavier_normal_(gain=1) for query and key, zero biases; each block of a fused projection drawn as
    the projection it stands for. Checked bit for bit against torch's xavier_normal_ in the same order."""
    cfg = ModelConfig(d_model=16, n_heads=4, d_ff=24, norm_placement="deepnorm")
    d, f, beta = cfg.d_model, cfg.d_ff, 0.3
    torch.manual_seed(4)
    blk = TransformerBlock(cfg, causal=True, cross_attention=cross_attention)
    for p in blk.parameters():  # nonzero biases and odd weights: the init must replace them
        nn.init.uniform_(p, 0.5, 1.5)
    assert isinstance(blk.self_attn, DeepNormResidual) and isinstance(blk.ffn, DeepNormResidual)
    before = copy.deepcopy(blk).state_dict()
    torch.manual_seed(11)
    gains = deepnorm_init_(blk, beta)
    after = blk.state_dict()

    sa, ca, ffn = "self_attn.sublayer.", "cross_attn.sublayer.", "ffn.sublayer."
    # (weight, row block or None, shape, gain) in the order the init visits them
    plan = [
        (f"{sa}qkv_proj.weight", (0, d), (d, d), 1.0),
        (f"{sa}qkv_proj.weight", (d, 2 * d), (d, d), 1.0),
        (f"{sa}qkv_proj.weight", (2 * d, 3 * d), (d, d), beta),
        (f"{sa}out_proj.weight", None, (d, d), beta),
    ]
    if cross_attention:
        plan += [
            (f"{ca}q_proj.weight", None, (d, d), 1.0),
            (f"{ca}kv_proj.weight", (0, d), (d, d), 1.0),
            (f"{ca}kv_proj.weight", (d, 2 * d), (d, d), beta),
            (f"{ca}out_proj.weight", None, (d, d), beta),
        ]
    plan += [(f"{ffn}fc_in.weight", None, (f, d), beta), (f"{ffn}fc_out.weight", None, (d, f), beta)]
    torch.manual_seed(11)
    reference = _xavier_reference([(shape, gain) for _, _, shape, gain in plan])
    for (key, rows, _, _), want in zip(plan, reference, strict=True):
        got = after[key] if rows is None else after[key][rows[0] : rows[1]]
        assert torch.equal(got, want), key
    assert gains == {key if rows is None else f"{key}[{rows[0]}:{rows[1]}]": gain for key, rows, _, gain in plan}
    redrawn = {key for key, *_ in plan}
    for key, w in before.items():
        if key in redrawn:
            continue
        if key.endswith(".bias") and key.replace(".bias", ".weight") in redrawn:
            assert not after[key].any(), key  # the redrawn layers' biases are zero
        else:
            assert torch.equal(after[key], w), key  # norms untouched


def test_deepnorm_init_std_is_the_papers_not_a_scaled_gpt2_init():
    """At d_model 256 the drawn std is gain * sqrt(2 / (fan_in + fan_out)) (0.0625 for the square
    projections), not beta * 0.02: the branches start as large as DeepNet's."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=256, n_heads=4, d_ff=1024, norm_placement="deepnorm")
    blk = TransformerBlock(cfg, causal=True)
    beta = 0.4
    deepnorm_init_(blk, beta)
    qkv = blk.self_attn.sublayer.qkv_proj.weight
    assert qkv[:256].std().item() == pytest.approx(math.sqrt(2 / 512), rel=0.03)  # q, gain 1
    assert qkv[512:].std().item() == pytest.approx(beta * math.sqrt(2 / 512), rel=0.03)  # v, gain beta
    assert blk.ffn.sublayer.fc_in.weight.std().item() == pytest.approx(beta * math.sqrt(2 / 1280), rel=0.03)


def test_deepnorm_init_on_a_stack_and_gated_ffn():
    torch.manual_seed(5)
    cfg = ModelConfig(d_model=8, n_heads=2, d_ff=16, norm_placement="deepnorm")
    stack = TransformerStack(cfg, 3, causal=False)
    gains = deepnorm_init_(stack, 0.5)
    # per block: q, k, v blocks of qkv_proj, out_proj, fc_in, fc_out
    assert len(gains) == 3 * 6 and all(n.startswith("blocks.") for n in gains)
    assert sorted(set(gains.values())) == [0.5, 1.0]

    class GatedFFN(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc_in, self.fc_gate, self.fc_out = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)

    res = DeepNormResidual(GatedFFN(), "layernorm", 8, 1e-5, True, 0.0)
    assert deepnorm_init_(res, 0.5) == {f"sublayer.{key}.weight": 0.5 for key in ("fc_in", "fc_gate", "fc_out")}
    assert not any(res.sublayer.get_submodule(key).bias.any() for key in ("fc_in", "fc_gate", "fc_out"))

    with pytest.raises(ValueError, match="Identity"):
        deepnorm_init_(DeepNormResidual(nn.Identity(), "layernorm", 8, 1e-5, True, 0.0), 0.5)


def test_deepnorm_init_grouped_query_and_nested_experts():
    """Fused grouped-query ``[q (d); k (kv); v (kv)]``: three blocks with their own fans; FFN experts
    nested inside the sublayer (MoE) are found by name, each expert drawn with its own fans; the router
    and an additive attention score keep their init."""
    d, kv, beta = 8, 4, 0.25

    class GQA(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_proj, self.out_proj = nn.Linear(d, d + 2 * kv), nn.Linear(d, d)
            self.score = nn.Linear(d, 1)  # not one of DeepNet's projections

    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc_in, self.fc_out = nn.Linear(d, 16), nn.Linear(16, d)

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(d, 2, bias=False)
            self.experts = nn.ModuleList([Expert(), Expert()])

    torch.manual_seed(6)
    model = nn.ModuleList(
        [
            DeepNormResidual(GQA(), "layernorm", d, 1e-5, True, 0.0),
            DeepNormResidual(MoE(), "layernorm", d, 1e-5, True, 0.0),
        ]
    )
    before = copy.deepcopy(model.state_dict())
    torch.manual_seed(7)
    gains = deepnorm_init_(model, beta)
    after = model.state_dict()
    qkv = "0.sublayer.qkv_proj.weight"
    plan = [
        (qkv, (0, d), 1.0),
        (qkv, (d, d + kv), 1.0),
        (qkv, (d + kv, d + 2 * kv), beta),
        ("0.sublayer.out_proj.weight", None, beta),
    ]
    plan += [(f"1.sublayer.experts.{e}.{fc}.weight", None, beta) for e in range(2) for fc in ("fc_in", "fc_out")]
    shapes = [(rows[1] - rows[0], d) if rows else tuple(after[key].shape) for key, rows, _ in plan]
    torch.manual_seed(7)
    for (key, rows, _), want in zip(
        plan, _xavier_reference([(shape, g) for shape, (_, _, g) in zip(shapes, plan, strict=True)]), strict=True
    ):
        assert torch.equal(after[key] if rows is None else after[key][rows[0] : rows[1]], want), key
    assert gains == {key if rows is None else f"{key}[{rows[0]}:{rows[1]}]": g for key, rows, g in plan}
    for key in ("1.sublayer.router.weight", "0.sublayer.score.weight", "0.sublayer.score.bias"):
        assert torch.equal(after[key], before[key]), key


def test_deepnorm_init_draws_each_stacked_expert_with_its_own_fans():
    """A StackedLinear holds (n_experts, out, in): each expert's std is xavier's for (out, in), as the
    nn.Linear it stands for, not for a fan counted over all experts."""
    from blockbench.models.moe import StackedLinear

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc_in, self.fc_out = StackedLinear(8, 128, 512), StackedLinear(8, 512, 128)

    torch.manual_seed(8)
    res = DeepNormResidual(Experts(), "layernorm", 128, 1e-5, True, 0.0)
    deepnorm_init_(res, 0.5)
    for e in range(8):
        for fc in (res.sublayer.fc_in, res.sublayer.fc_out):
            assert fc.weight[e].std().item() == pytest.approx(0.5 * math.sqrt(2 / 640), rel=0.05)
            assert not fc.bias.any()


def test_families_wire_deepnorm_constants_per_stack():
    from blockbench.models import build_model
    from blockbench.models.placement import deepnorm_alpha_beta

    torch.manual_seed(0)
    cfg = {"d_model": 64, "n_heads": 4, "norm_placement": "deepnorm", "vocab_size": 40, "d_ff": 256}
    translator = build_model({**cfg, "family": "encoder_decoder", "n_encoder_layers": 6, "n_decoder_layers": 3})
    constants = deepnorm_alpha_beta("encoder_decoder", 6, 3)
    for stack_name, stack in (("encoder", translator.encoder), ("decoder", translator.decoder)):
        alpha, beta = constants[stack_name]
        assert {r.residual_scale for r in stack.modules() if hasattr(r, "residual_scale")} == {alpha}
        fc_in = torch.cat([b.ffn.sublayer.fc_in.weight.flatten() for b in stack.blocks])
        q_rows = torch.cat([b.self_attn.sublayer.qkv_proj.weight[:64].flatten() for b in stack.blocks])
        # DeepNet's xavier: gain beta on the FFN, value and output projections, 1 on query and key
        assert fc_in.std().item() == pytest.approx(beta * math.sqrt(2 / (64 + 256)), rel=0.05)
        assert q_rows.std().item() == pytest.approx(math.sqrt(2 / (64 + 64)), rel=0.05)
    lm = build_model({**cfg, "family": "decoder_lm", "n_layers": 4})
    alpha, beta = deepnorm_alpha_beta("decoder", 4, 4)["decoder"]
    out_proj = torch.cat([b.self_attn.sublayer.out_proj.weight.flatten() for b in lm.stack.blocks])
    assert out_proj.std().item() == pytest.approx(beta * math.sqrt(2 / 128), rel=0.05)  # no GPT-2 1/sqrt(2n) shrink
