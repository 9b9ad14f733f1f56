"""Tests for the feed-forward variants (``models/mlp.py``) and the MoE layer (``models/moe.py``).

References are written independently: the GLU formulas with plain tensor ops, MoE routing
with per-token Python loops and hand-made router weights whose routing is known in advance.
The batched MoE dispatch (stacked experts, one ``bmm`` per expert Linear) is checked against a
per-assignment Python loop over the experts as standalone FFNs (``moe.expert(e)``), outputs and
gradients, and by counting the aten ops of a forward and backward pass.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from models import build_model
from models.block import init_weights
from models.mlp import FFNS, FeedForward, GEGLUFeedForward, SwiGLUFeedForward, build_ffn, gated_hidden_size
from models.moe import MoEFeedForward, StackedLinear, stack_experts
from models.placement import deepnorm_alpha_beta
from models.registry import ACTIVATIONS, ALL_REGISTRIES

DT = torch.float64
TOL = dict(rtol=1e-10, atol=1e-12)
MATMULS = {"mm", "addmm", "bmm", "baddbmm"}


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def randomize(m: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial weights everywhere (including biases), in float64."""
    g = torch.Generator().manual_seed(seed)
    m = m.to(DT)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=DT) * 0.3)
    return m


# --------------------------------------------------------------------------- FFN variants


def test_registry_and_silu():
    assert FFNS in ALL_REGISTRIES
    assert FFNS.names() == ["geglu", "mlp", "swiglu"]
    assert FFNS.get("mlp") is FeedForward
    assert ACTIVATIONS.get("silu") is nn.SiLU
    x = torch.randn(5, dtype=DT)
    torch.testing.assert_close(ACTIVATIONS.get("silu")()(x), x * torch.sigmoid(x), **TOL)
    with pytest.raises(KeyError, match="choose one of"):
        build_ffn("moe", 8, 16)


def test_gated_hidden_size():
    assert gated_hidden_size(512) == 341  # 341.33 -> 341
    assert gated_hidden_size(256) == 171  # 170.67 -> 171
    assert gated_hidden_size(3) == 2
    assert gated_hidden_size(1) == 1


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
def test_gated_param_count_matches_dense(kind):
    d, d_ff = 128, 512
    # bias=True: dense 2*128*512 + 512 + 128 = 131712; gated (h=341) 3*128*341 + 2*341 + 128 = 131754
    dense, gated = build_ffn("mlp", d, d_ff), build_ffn(kind, d, d_ff)
    assert n_params(dense) == 131712 and n_params(gated) == 131754
    assert abs(n_params(gated) - n_params(dense)) / n_params(dense) < 0.01  # 0.032 %
    # bias=False: dense 2*128*512 = 131072; gated 3*128*341 = 130944
    dense, gated = build_ffn("mlp", d, d_ff, bias=False), build_ffn(kind, d, d_ff, bias=False)
    assert n_params(dense) == 131072 and n_params(gated) == 130944
    assert abs(n_params(gated) - n_params(dense)) / n_params(dense) < 0.01  # 0.098 %


@pytest.mark.parametrize("kind, act", [("swiglu", F.silu), ("geglu", F.gelu)])
@pytest.mark.parametrize("bias", [True, False])
def test_gated_forward_matches_formula(kind, act, bias):
    m = randomize(build_ffn(kind, 16, 48, activation="relu", bias=bias))  # activation is ignored
    assert isinstance(m, SwiGLUFeedForward if kind == "swiglu" else GEGLUFeedForward)
    assert m.fc_gate.out_features == m.fc_in.out_features == m.fc_out.in_features == 32
    x = torch.randn(2, 5, 16, dtype=DT)

    def lin(layer, v):
        return v @ layer.weight.T + (layer.bias if bias else 0)

    ref = lin(m.fc_out, act(lin(m.fc_gate, x)) * lin(m.fc_in, x))
    if kind == "swiglu":
        ref2 = lin(m.fc_out, lin(m.fc_gate, x) * torch.sigmoid(lin(m.fc_gate, x)) * lin(m.fc_in, x))
    else:
        g = lin(m.fc_gate, x)
        ref2 = lin(m.fc_out, 0.5 * g * (1 + torch.erf(g / math.sqrt(2))) * lin(m.fc_in, x))
    torch.testing.assert_close(m(x), ref, **TOL)
    torch.testing.assert_close(m(x), ref2, **TOL)


def test_mlp_kind_is_feedforward():
    m = randomize(build_ffn("mlp", 8, 24, activation="silu"))
    x = torch.randn(3, 8, dtype=DT)
    ref = F.silu(x @ m.fc_in.weight.T + m.fc_in.bias) @ m.fc_out.weight.T + m.fc_out.bias
    torch.testing.assert_close(m(x), ref, **TOL)


# --------------------------------------------------------------------------- MoE helpers


def reference_moe(moe: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Per-token loop, no capacity limit: sum over top-k experts of gate * expert(x)."""
    experts = [moe.expert(e) for e in range(moe.n_experts)]
    flat = x.reshape(-1, x.shape[-1])
    rows = []
    for t in range(flat.shape[0]):
        xt = flat[t]
        probs = torch.softmax(moe.router.weight @ xt, dim=0)
        top = sorted(range(moe.n_experts), key=lambda i: -probs[i].item())[: moe.top_k]
        total = sum(probs[i] for i in top)
        y = torch.zeros_like(xt)
        for i in top:
            gate = probs[i] / total if moe.top_k > 1 else probs[i]
            y = y + gate * experts[i](xt[None])[0]
        for shared in moe.shared_experts:
            y = y + shared(xt[None])[0]
        rows.append(y)
    return torch.stack(rows).reshape(x.shape)


def reference_moe_with_capacity(
    moe: MoEFeedForward, x: torch.Tensor, experts: list[nn.Module]
) -> tuple[torch.Tensor, int]:
    """Per-assignment Python loop with the documented capacity rule: assignments are visited in
    priority order (choice rank, then token index) and expert e takes at most
    ``moe.capacity(n)`` of them; routed expert e is the standalone FFN ``experts[e]``.
    Returns the output and the number of dropped assignments."""
    flat = x.reshape(-1, x.shape[-1])
    n, k = flat.shape[0], moe.top_k
    capacity = moe.capacity(n) if moe.capacity_factor is not None else math.inf
    probs = [torch.softmax(moe.router.weight @ flat[t], dim=0) for t in range(n)]
    choices = [sorted(range(moe.n_experts), key=lambda i: -p[i].item())[:k] for p in probs]
    load, dropped = [0] * moe.n_experts, 0
    contributions: list[list[torch.Tensor]] = [[] for _ in range(n)]
    for rank in range(k):
        for t in range(n):
            e = choices[t][rank]
            if load[e] >= capacity:
                dropped += 1
                continue
            load[e] += 1
            p = probs[t]
            gate = p[e] / sum(p[i] for i in choices[t]) if k > 1 else p[e]
            contributions[t].append(gate * experts[e](flat[t][None])[0])
    rows = []
    for t in range(n):
        y = sum(contributions[t], torch.zeros_like(flat[t]))
        for shared in moe.shared_experts:
            y = y + shared(flat[t][None])[0]
        rows.append(y)
    return torch.stack(rows).reshape(x.shape), dropped


class AtenOpCounter(TorchDispatchMode):
    """Counts the aten ops (by name, e.g. ``"bmm"``) run inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


# --------------------------------------------------------------------------- MoE


@pytest.mark.parametrize("kind", ["mlp", "swiglu"])
def test_single_expert_equals_dense_exactly(kind):
    dense = randomize(build_ffn(kind, 16, 32), seed=1)
    moe = randomize(MoEFeedForward(16, 32, n_experts=1, top_k=1, capacity_factor=None, expert_kind=kind), seed=2)
    with torch.no_grad():
        for name, stacked in moe.experts.named_parameters():
            stacked[0].copy_(dense.get_parameter(name))
    x = torch.randn(3, 7, 16, dtype=DT)
    out = moe(x)
    assert out.shape == x.shape
    assert torch.equal(out, dense(x))  # gate probability is exactly 1
    assert moe.dropped_tokens == 0
    assert torch.equal(moe.tokens_per_expert, torch.ones(1, dtype=DT))
    assert moe.aux_loss.item() == pytest.approx(1.0)


def test_aux_and_z_loss_on_hand_made_routing():
    moe = MoEFeedForward(4, 8, n_experts=4, top_k=1, capacity_factor=None).to(DT)
    with torch.no_grad():
        moe.router.weight.copy_(2.0 * torch.eye(4, dtype=DT))  # logits = 2 * x
    # tokens 0,1 -> expert 0; token 2 -> expert 1; token 3 -> expert 2; expert 3 gets none
    x = torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.5, 0]], dtype=DT)
    moe(x)
    logits = [[2, 0, 0, 0], [2, 0, 0, 0], [0, 2, 0, 0], [0, 0, 3, 0]]
    probs = [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in logits]
    f = [2 / 4, 1 / 4, 1 / 4, 0.0]
    P = [sum(p[i] for p in probs) / 4 for i in range(4)]
    aux = 4 * sum(fi * Pi for fi, Pi in zip(f, P))
    z = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits) / 4
    assert moe.aux_loss.item() == pytest.approx(aux, rel=1e-12)
    assert moe.z_loss.item() == pytest.approx(z, rel=1e-12)
    assert moe.tokens_per_expert.tolist() == pytest.approx(f)
    assert not moe.tokens_per_expert.requires_grad
    # uniform routing gives aux loss exactly 1 (its minimum)
    with torch.no_grad():
        moe.router.weight.zero_()
    moe(x)
    # all probs equal -> topk picks some expert; P_i = 1/4, sum_i f_i = 1 -> aux = 1
    assert moe.aux_loss.item() == pytest.approx(1.0)
    assert moe.z_loss.item() == pytest.approx(math.log(4) ** 2)


def test_top2_aux_fraction_counts_all_assignments():
    moe = MoEFeedForward(4, 8, n_experts=4, top_k=2, capacity_factor=None).to(DT)
    with torch.no_grad():
        moe.router.weight.copy_(torch.diag(torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=DT)))
    x = torch.ones(3, 4, dtype=DT)  # logits [4,3,2,1] -> experts 0 and 1 for every token
    moe(x)
    assert moe.tokens_per_expert.tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0])
    p = [math.exp(v) / sum(math.exp(u) for u in [4, 3, 2, 1]) for v in [4, 3, 2, 1]]
    assert moe.aux_loss.item() == pytest.approx(4 * (0.5 * p[0] + 0.5 * p[1]), rel=1e-12)


def test_capacity_overflow_drops_last_tokens():
    torch.manual_seed(0)
    moe = randomize(MoEFeedForward(6, 12, n_experts=2, top_k=1, capacity_factor=1.0), seed=3)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 10.0  # feature 0 > 0 -> expert 0
    x = torch.randn(8, 6, dtype=DT)
    x[:, 0] = x[:, 0].abs() + 1.0
    assert moe.capacity(8) == 4  # ceil(1.0 * 8 * 1 / 2)
    out = moe(x)
    assert moe.dropped_tokens == 4
    ref = reference_moe(moe, x)  # no capacity
    torch.testing.assert_close(out[:4], ref[:4], **TOL)
    assert torch.equal(out[4:], torch.zeros(4, 6, dtype=DT))
    assert moe.tokens_per_expert.tolist() == [1.0, 0.0]  # f counts assignments before dropping


def test_top2_capacity_priority_first_choices_first():
    moe = randomize(MoEFeedForward(2, 8, n_experts=2, top_k=2, capacity_factor=0.5), seed=4)
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(2, dtype=DT))
    # tokens 0,1 prefer expert 1; tokens 2,3 prefer expert 0
    x = torch.tensor([[0.0, 1.0], [0.0, 2.0], [1.0, 0.0], [2.0, 0.0]], dtype=DT)
    assert moe.capacity(4) == 2  # ceil(0.5 * 4 * 2 / 2)
    out = moe(x)
    assert moe.dropped_tokens == 4  # every second choice
    for t in range(4):
        probs = torch.softmax(moe.router.weight @ x[t], dim=0)
        first = int(probs.argmax())
        gate = probs[first] / probs.sum()
        torch.testing.assert_close(out[t], gate * moe.expert(first)(x[t][None])[0], **TOL)


@pytest.mark.parametrize("kind", ["mlp", "geglu"])
def test_top2_matches_per_token_loop(kind):
    moe = randomize(MoEFeedForward(8, 16, n_experts=4, top_k=2, capacity_factor=None, expert_kind=kind), seed=5)
    x = torch.randn(2, 9, 8, dtype=DT)
    torch.testing.assert_close(moe(x), reference_moe(moe, x), **TOL)
    assert moe.dropped_tokens == 0
    assert moe.tokens_per_expert.sum().item() == pytest.approx(1.0)


def test_large_capacity_drops_nothing():
    moe = randomize(MoEFeedForward(8, 16, n_experts=4, top_k=2, capacity_factor=4.0), seed=6)
    x = torch.randn(20, 8, dtype=DT)
    torch.testing.assert_close(moe(x), reference_moe(moe, x), **TOL)
    assert moe.dropped_tokens == 0


def test_shared_experts_add_dense_ffn():
    moe = randomize(MoEFeedForward(8, 16, n_experts=4, top_k=1, capacity_factor=None, n_shared_experts=2), seed=7)
    assert len(moe.shared_experts) == 2 and isinstance(moe.shared_experts[0], FeedForward)
    x = torch.randn(10, 8, dtype=DT)
    out = moe(x)
    torch.testing.assert_close(out, reference_moe(moe, x), **TOL)
    routed_only = MoEFeedForward(8, 16, n_experts=4, top_k=1, capacity_factor=None).to(DT)
    routed_only.load_state_dict({k: v for k, v in moe.state_dict().items() if not k.startswith("shared")})
    dense = moe.shared_experts[0](x) + moe.shared_experts[1](x)
    torch.testing.assert_close(out, routed_only(x) + dense, **TOL)


def test_gradients_flow_to_router_and_experts():
    torch.manual_seed(0)
    moe = MoEFeedForward(8, 16, n_experts=4, top_k=2, capacity_factor=None, n_shared_experts=1, expert_kind="swiglu")
    x = torch.randn(4, 16, 8, requires_grad=True)
    out = moe(x)
    assert (moe.tokens_per_expert > 0).all()  # every expert used, so all should get gradients
    (out.pow(2).sum() + 0.01 * moe.aux_loss + 0.001 * moe.z_loss).backward()
    for name, p in moe.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad is not None and x.grad.abs().sum() > 0
    # the aux loss alone also trains the router (through P_i)
    moe.zero_grad()
    moe(x.detach())
    moe.aux_loss.backward()
    assert moe.router.weight.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError):
        MoEFeedForward(8, 16, n_experts=2, top_k=3)
    with pytest.raises(ValueError):
        MoEFeedForward(8, 16, n_experts=0, top_k=1)
    with pytest.raises(ValueError):
        MoEFeedForward(8, 16, n_experts=2, top_k=1, capacity_factor=0.0)


# --------------------------------------------------------------------------- batched MoE dispatch


@pytest.mark.parametrize("kind", ["mlp", "swiglu", "geglu"])
@pytest.mark.parametrize(
    "top_k, capacity_factor, n_shared",
    [(1, 1.0, 0), (2, 0.75, 1), (1, None, 1), (2, None, 0)],
    ids=["top1-dropping", "top2-dropping-shared", "top1-unlimited-shared", "top2-unlimited"],
)
def test_batched_dispatch_matches_per_assignment_loop(kind, top_k, capacity_factor, n_shared):
    """Output, dropped count and every gradient (input, router, each expert, shared experts)
    equal a per-assignment loop over standalone copies of the experts."""
    moe = randomize(
        MoEFeedForward(8, 24, activation="silu", n_experts=4, top_k=top_k, capacity_factor=capacity_factor,
                       n_shared_experts=n_shared, expert_kind=kind),
        seed=11,
    )
    with torch.no_grad():
        moe.router.weight[0] += 0.4  # tokens with a large feature sum crowd expert 0
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(3, 10, 8, generator=gen, dtype=DT).requires_grad_()
    weights = torch.randn(3, 10, 8, generator=gen, dtype=DT)

    out = moe(x)
    (out * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in moe.named_parameters()}
    x_grad, x.grad = x.grad.clone(), None
    moe.zero_grad()

    experts = [moe.expert(e) for e in range(moe.n_experts)]
    ref, dropped = reference_moe_with_capacity(moe, x, experts)
    (ref * weights).sum().backward()

    torch.testing.assert_close(out, ref, **TOL)
    assert moe.dropped_tokens == dropped
    assert (dropped > 0) == (capacity_factor is not None)  # the capacity cases really drop
    torch.testing.assert_close(x_grad, x.grad, **TOL)
    for name, p in moe.named_parameters():
        if not name.startswith("experts."):  # router and shared experts: the same modules
            torch.testing.assert_close(grads[name], p.grad, **TOL)
    for name, _ in moe.experts.named_parameters():
        for e, expert in enumerate(experts):
            ref_grad = expert.get_parameter(name).grad
            ref_grad = torch.zeros_like(grads[f"experts.{name}"][e]) if ref_grad is None else ref_grad
            torch.testing.assert_close(grads[f"experts.{name}"][e], ref_grad, **TOL, msg=f"experts.{name}[{e}]")


@pytest.mark.parametrize("kind", ["mlp", "swiglu", "geglu"])
@pytest.mark.parametrize("bias", [True, False])
def test_dropout_inside_experts(kind, bias):
    """Dropout acts inside every expert: p=1 zeroes the hidden units, so each routed expert
    outputs its ``fc_out`` bias (zero without bias); eval mode switches dropout off."""
    x = torch.randn(12, 8, dtype=DT)
    kwargs = dict(bias=bias, n_experts=3, top_k=2, capacity_factor=1.0, expert_kind=kind)
    moe = randomize(MoEFeedForward(8, 16, dropout=1.0, **kwargs), seed=13).train()
    experts = [moe.expert(e) for e in range(3)]
    assert all(expert.training and expert.dropout.p == 1.0 for expert in experts)
    torch.testing.assert_close(moe(x), reference_moe_with_capacity(moe, x, experts)[0], **TOL)
    if not bias:
        assert torch.equal(moe(x), torch.zeros_like(x))

    moe = randomize(MoEFeedForward(8, 16, dropout=0.5, **kwargs), seed=14)
    assert not torch.equal(moe(x), moe(x))  # training: fresh masks
    moe.eval()
    experts = [moe.expert(e) for e in range(3)]
    torch.testing.assert_close(moe(x), reference_moe_with_capacity(moe, x, experts)[0], **TOL)


@pytest.mark.parametrize("kind", ["mlp", "swiglu"])
def test_no_python_loop_over_experts(kind):
    """The forward and backward run the same aten ops, in the same numbers, for 2 and 8
    experts: nothing is repeated per expert (nor per token: same counts for 16 and 64 tokens).
    Each expert Linear is one batched matmul."""

    def count_ops(n_experts: int, n_tokens: int) -> tuple[Counter, Counter]:
        torch.manual_seed(0)
        moe = MoEFeedForward(16, 32, n_experts=n_experts, top_k=2, capacity_factor=1.25, expert_kind=kind)
        x = torch.randn(n_tokens, 16, requires_grad=True)
        with AtenOpCounter() as forward:
            out = moe(x)
        with AtenOpCounter() as backward:
            out.sum().backward()
        return forward.counts, backward.counts

    forward, backward = count_ops(2, 64)
    assert count_ops(8, 64) == (forward, backward)
    assert count_ops(8, 16) == (forward, backward)
    n_linears = 3 if kind == "swiglu" else 2
    assert sum(forward[op] for op in MATMULS) == 1 + n_linears  # router + one bmm per expert Linear
    assert forward["baddbmm"] == n_linears
    assert sum(backward[op] for op in MATMULS) == 2 + 2 * n_linears  # grad of input and weight each


@pytest.mark.parametrize("kind", ["mlp", "swiglu", "geglu"])
@pytest.mark.parametrize("bias", [True, False])
def test_stacked_experts_parameters_and_expert_copies(kind, bias):
    moe = MoEFeedForward(8, 24, bias=bias, n_experts=5, top_k=2, n_shared_experts=1, expert_kind=kind)
    dense = build_ffn(kind, 8, 24, bias=bias)
    assert n_params(moe) == 6 * n_params(dense) + 8 * 5  # 5 routed + 1 shared FFNs + router
    names = {name: p.shape for name, p in moe.experts.named_parameters()}
    assert names == {name: (5, *p.shape) for name, p in dense.named_parameters()}  # e.g. experts.fc_in.weight
    assert {type(m) for m in moe.experts.modules() if isinstance(m, nn.Linear)} == {StackedLinear}

    expert = moe.expert(3)
    assert type(expert) is FFNS.get(kind)
    for name, p in expert.named_parameters():
        assert torch.equal(p, moe.experts.get_parameter(name)[3]) and p.requires_grad
    with torch.no_grad():
        expert.fc_in.weight.zero_()  # a copy: the layer is untouched
    assert moe.experts.fc_in.weight[3].abs().sum() > 0
    assert not moe.eval().expert(0).training
    with pytest.raises(IndexError):
        moe.expert(5)


def test_stacked_linear_default_init_is_per_expert_linear():
    """Each expert matrix is drawn like ``nn.Linear``'s: U(-1/sqrt(in), 1/sqrt(in)), independently."""
    torch.manual_seed(0)
    layer = StackedLinear(4, 64, 32)
    bound = 1 / math.sqrt(64)
    assert layer.weight.shape == (4, 32, 64) and layer.bias.shape == (4, 32)
    for w in (layer.weight, layer.bias):
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
    assert layer.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert not torch.equal(layer.weight[0], layer.weight[1])
    assert StackedLinear(2, 3, 5, bias=False).bias is None
    with pytest.raises(TypeError, match=r"outside nn.Linear: \[.1.weight., .1.bias.\]"):
        stack_experts(lambda: nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)), 2)


@pytest.mark.parametrize("placement", ["pre", "deepnorm"])
def test_model_init_reaches_every_stacked_expert(placement):
    """``init_weights`` gives each expert matrix the std its ``nn.Linear`` would get (GPT-2
    residual shrink on ``fc_out`` for pre-norm) and zero biases; DeepNet's init scales them."""
    torch.manual_seed(0)
    lm = build_model({"family": "decoder_lm", "vocab_size": 40, "d_model": 64, "n_heads": 4, "d_ff": 256,
                      "n_layers": 4, "n_experts": 4, "norm_placement": placement})
    moe = lm.stack.blocks[0].ffn.sublayer
    assert isinstance(moe, MoEFeedForward)
    beta = deepnorm_alpha_beta("decoder", 4, 4)["decoder"][1] if placement == "deepnorm" else 1.0
    out_std = 0.02 * beta if placement == "deepnorm" else 0.02 / math.sqrt(2 * 4)
    for e in range(4):
        assert moe.experts.fc_in.weight[e].std().item() == pytest.approx(0.02 * beta, rel=0.05)
        assert moe.experts.fc_out.weight[e].std().item() == pytest.approx(out_std, rel=0.05)
    assert not moe.experts.fc_in.bias.any() and not moe.experts.fc_out.bias.any()
    assert moe.router.weight.std().item() == pytest.approx(0.02, rel=0.1)  # never scaled
    # init_weights alone, on a bare layer: residual-stream name match on experts.fc_out
    layer = nn.ModuleDict({"ffn": MoEFeedForward(64, 256, n_experts=2, top_k=1)})
    init_weights(layer, n_layers=2)
    assert layer["ffn"].experts.fc_out.weight.std().item() == pytest.approx(0.02 / 2, rel=0.05)


def test_empty_batch():
    for capacity_factor in (1.25, None):
        moe = MoEFeedForward(8, 16, n_experts=4, top_k=2, capacity_factor=capacity_factor)
        out = moe(torch.randn(0, 3, 8))
        assert out.shape == (0, 3, 8) and moe.dropped_tokens == 0
        assert moe.aux_loss.item() == 0.0
