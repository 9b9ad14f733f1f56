"""Tests for the feed-forward variants (``models/mlp.py``) and the MoE layer (``models/moe.py``).

References are written independently: the GLU formulas with plain tensor ops, MoE routing
with per-token Python loops and hand-made router weights whose routing is known in advance.
The batched MoE dispatch (stacked experts, one ``bmm`` per expert Linear) is checked against a
per-assignment Python loop over the experts as standalone FFNs (``moe.expert(e)``), outputs and
gradients, and by counting the aten ops of a forward and backward pass. Padding and evaluation:
real tokens with padding around them against the real tokens alone (bit for bit), a token in a
batch against the token alone, and an MoE translator validated with two batch sizes.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from helpers import DT
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from blockbench.models import add_auxiliary_losses, build_model, expert_load, moe_layers
from blockbench.models import moe as moe_module
from blockbench.models.block import init_weights
from blockbench.models.mlp import FFNS, FeedForward, GEGLUFeedForward, SwiGLUFeedForward, build_ffn, gated_hidden_size
from blockbench.models.moe import MoEFeedForward, StackedLinear, stack_experts
from blockbench.models.placement import deepnorm_alpha_beta
from blockbench.models.registry import ACTIVATIONS, ALL_REGISTRIES

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
    """Per-assignment Python loop with the documented capacity rule: in training, assignments are
    visited in priority order (choice rank, then token index) and expert e takes at most
    ``ceil(capacity_factor * n * top_k / n_experts)`` of them; in evaluation there is no limit.
    Routed expert e is the standalone FFN ``experts[e]``. Returns the output and the number of
    dropped assignments."""
    flat = x.reshape(-1, x.shape[-1])
    n, k = flat.shape[0], moe.top_k
    limited = moe.training and moe.capacity_factor is not None
    capacity = math.ceil(moe.capacity_factor * n * k / moe.n_experts) if limited else math.inf
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
    aux = 4 * sum(fi * Pi for fi, Pi in zip(f, P, strict=True))
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
@pytest.mark.parametrize("on_gpu", [False, True], ids=["largest-count", "capacity-sized"])
def test_batched_dispatch_matches_per_assignment_loop(kind, top_k, capacity_factor, n_shared, on_gpu, monkeypatch):
    """Output, dropped count and every gradient (input, router, each expert, shared experts)
    equal a per-assignment loop over standalone copies of the experts, whether the experts' buffer
    has as many rows per expert as the busiest expert's assignments (a CPU: reading them back is
    free) or as many as the capacity (a GPU, which the layer is made to believe it is on here)."""
    monkeypatch.setattr(moe_module, "runs_ahead", lambda device: on_gpu, raising=False)
    moe = randomize(
        MoEFeedForward(
            8,
            24,
            activation="silu",
            n_experts=4,
            top_k=top_k,
            capacity_factor=capacity_factor,
            n_shared_experts=n_shared,
            expert_kind=kind,
        ),
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
    residual shrink on ``fc_out`` for pre-norm) and zero biases; DeepNet's init redraws them."""
    torch.manual_seed(0)
    lm = build_model(
        {
            "family": "decoder_lm",
            "vocab_size": 40,
            "d_model": 64,
            "n_heads": 4,
            "d_ff": 256,
            "n_layers": 4,
            "n_experts": 4,
            "norm_placement": placement,
        }
    )
    moe = lm.stack.blocks[0].ffn.sublayer
    assert isinstance(moe, MoEFeedForward)
    beta = deepnorm_alpha_beta("decoder", 4, 4)["decoder"][1]
    # DeepNet: xavier with gain beta, each expert's own fans (64 <-> 256); GPT-2: 0.02, fc_out shrunk
    in_std = beta * math.sqrt(2 / (64 + 256)) if placement == "deepnorm" else 0.02
    out_std = beta * math.sqrt(2 / (64 + 256)) if placement == "deepnorm" else 0.02 / math.sqrt(2 * 4)
    for e in range(4):
        assert moe.experts.fc_in.weight[e].std().item() == pytest.approx(in_std, rel=0.05)
        assert moe.experts.fc_out.weight[e].std().item() == pytest.approx(out_std, rel=0.05)
    assert not moe.experts.fc_in.bias.any() and not moe.experts.fc_out.bias.any()
    assert moe.router.weight.std().item() == pytest.approx(0.02, rel=0.1)  # never scaled
    # init_weights alone, on a bare layer: residual-stream name match on experts.fc_out
    layer = nn.ModuleDict({"ffn": MoEFeedForward(64, 256, n_experts=2, top_k=1)})
    init_weights(layer, n_layers=2)
    assert layer["ffn"].experts.fc_out.weight.std().item() == pytest.approx(0.02 / 2, rel=0.05)


#: the Tensor methods that read a value back to the host (on a GPU each waits for the GPU)
HOST_READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")


def count_host_reads(monkeypatch: pytest.MonkeyPatch, reads: list[str]) -> None:
    """Append the name of every host read (:data:`HOST_READS`) to ``reads``."""

    def counted(name, original):
        def read(self, *args, **kwargs):
            reads.append(name)
            return original(self, *args, **kwargs)

        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))


def test_on_a_gpu_training_with_a_capacity_reads_nothing_back(monkeypatch):
    """Reading a GPU tensor on the host waits for the GPU. Made to believe it is on one, a layer in
    training with a capacity sizes its buffer by the capacity (the counts are never read back;
    scatter_add counts them where bincount would read the largest index) and keeps its statistics
    as tensors: forward and backward read nothing. Without a capacity the buffer is sized by the
    largest count: one read per forward. The dropped count is read only when asked for."""
    monkeypatch.setattr(moe_module, "runs_ahead", lambda device: True, raising=False)
    moe = randomize(MoEFeedForward(8, 16, n_experts=4, top_k=2, capacity_factor=1.25), seed=13)
    unlimited = randomize(MoEFeedForward(8, 16, n_experts=4, top_k=2, capacity_factor=None), seed=13)
    x = torch.randn(3, 10, 8, dtype=DT, requires_grad=True)
    reads: list[str] = []
    with monkeypatch.context() as patch:
        count_host_reads(patch, reads)
        moe(x).sum().backward()
        assert reads == []
        unlimited(x).sum().backward()
        assert reads == ["__int__"]  # the largest expert count, C
    assert moe.expert_rows == 4 * moe.capacity(30) == 4 * 19 and moe.assignments == 60  # ceil(1.25 * 30 * 2 / 4)
    assert isinstance(moe.dropped_assignments, torch.Tensor) and moe.dropped_assignments.dim() == 0
    assert moe.dropped_tokens == int(moe.dropped_assignments)


def test_empty_batch():
    for capacity_factor in (1.25, None):
        moe = MoEFeedForward(8, 16, n_experts=4, top_k=2, capacity_factor=capacity_factor)
        out = moe(torch.randn(0, 3, 8))
        assert out.shape == (0, 3, 8) and moe.dropped_tokens == 0
        assert moe.aux_loss.item() == 0.0


# --------------------------------------------------------------------------- padding and evaluation


def padded_batch(real: torch.Tensor, lengths: list[int], pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``real`` (sum(lengths), D) laid out as right-padded rows (len(lengths), max(lengths), D),
    every padding position holding ``pad``; returns the batch and its padding mask (True = padding)."""
    width = max(lengths)
    mask = torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None]
    x = pad.expand(len(lengths), width, -1).clone()
    x[~mask] = real
    return x, mask


def test_padding_takes_no_capacity_and_changes_nothing_for_real_tokens():
    """In training, with a capacity that drops: a batch of real tokens gives bit-identical outputs,
    losses, token shares, drops and gradients with padding around it as alone. Padding (here a
    vector routed to the most crowded expert, as a padding embedding is routed to one expert) sits
    before later rows' real tokens in priority order, so routed like a token it takes their slots."""
    moe = randomize(MoEFeedForward(8, 24, n_experts=4, top_k=2, capacity_factor=1.0, n_shared_experts=1), seed=21)
    with torch.no_grad():
        moe.router.weight[0] += 0.4  # tokens with a large feature sum crowd expert 0
    gen = torch.Generator().manual_seed(22)
    real = torch.randn(17, 8, generator=gen, dtype=DT)
    pad = torch.full((8,), 2.0, dtype=DT)  # a large feature sum: expert 0 first
    x, mask = padded_batch(real, [3, 10, 4], pad)  # row 0 is mostly padding, ahead of rows 1 and 2
    weights = torch.randn(17, 8, generator=gen, dtype=DT)

    def run(inputs: torch.Tensor, padding_mask: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        moe.zero_grad()
        inputs = inputs.clone().requires_grad_()
        out = moe(inputs, padding_mask) if padding_mask is not None else moe(inputs)
        real_out = out[~padding_mask] if padding_mask is not None else out
        ((real_out * weights).sum() + moe.aux_loss + moe.z_loss).backward()
        grads = {name: p.grad.clone() for name, p in moe.named_parameters()}
        stats = dict(aux=moe.aux_loss, z=moe.z_loss, shares=moe.tokens_per_expert, dropped=moe.dropped_tokens)
        return out, {"grads": grads, "x_grad": inputs.grad, **stats}

    alone, ref = run(real, None)
    assert ref["dropped"] > 0  # the capacity is tight enough to drop real tokens
    padded, got = run(x, mask)
    assert torch.equal(padded[~mask], alone)
    assert torch.equal(padded[mask], torch.zeros_like(padded[mask]))  # shared experts included
    for key in ("aux", "z", "shares"):
        assert torch.equal(got[key], ref[key]), key
    assert got["dropped"] == ref["dropped"]
    for name, grad in ref["grads"].items():
        assert torch.equal(got["grads"][name], grad), name
    assert torch.equal(got["x_grad"][~mask], ref["x_grad"])
    assert not got["x_grad"][mask].any()
    # routed like a token, the same padding takes real tokens' slots: what the mask prevents
    unmasked = moe(x)
    assert not torch.allclose(unmasked[~mask], alone)
    assert moe.capacity(17) == math.ceil(1.0 * 17 * 2 / 4)  # counted over the real tokens only

    with pytest.raises(ValueError, match="padding_mask of shape"):
        moe(x, mask[:, :-1])
    moe(x, torch.ones_like(mask))  # all padding: nothing routed, nothing to balance
    assert moe.dropped_tokens == 0 and moe.aux_loss.item() == 0.0 and moe.z_loss.item() == 0.0


@pytest.mark.parametrize("top_k, n_shared", [(1, 0), (2, 1)])
def test_evaluation_drops_nothing_and_output_is_per_token(top_k, n_shared):
    """In evaluation a token's output does not depend on the other tokens of its batch, however
    small the capacity factor: it is the capacity-free per-token reference, alone or in any batch.
    Training keeps the capacity (the same batch drops assignments there)."""
    moe = randomize(
        MoEFeedForward(8, 24, n_experts=4, top_k=top_k, capacity_factor=0.5, n_shared_experts=n_shared), seed=23
    )
    with torch.no_grad():
        moe.router.weight[0] += 0.4  # crowd expert 0
    x = torch.randn(24, 8, generator=torch.Generator().manual_seed(24), dtype=DT)
    moe(x)
    assert moe.dropped_tokens > 0  # training: over capacity

    moe.eval()
    out = moe(x)
    for t in range(0, 24, 5):
        torch.testing.assert_close(moe(x[t : t + 1]), out[t : t + 1], **TOL)  # the token alone
    torch.testing.assert_close(moe(x[:8]), out[:8], **TOL)  # a smaller batch
    torch.testing.assert_close(out, reference_moe(moe, x), **TOL)
    moe(x)
    assert moe.dropped_tokens == 0 and moe.capacity(24) is None


def overflowing_moe_model(family: str, n_layers: int) -> tuple[torch.nn.Module, list[MoEFeedForward]]:
    """A tiny float64 MoE model (seed 0) whose routers are scaled up so routing is peaked and
    experts overflow their capacity (factor 1) in training; with its MoE layers."""
    torch.manual_seed(0)
    model = build_model(
        {
            "family": family,
            "vocab_size": 40,
            "d_model": 32,
            "n_heads": 2,
            "d_ff": 64,
            "n_layers": n_layers,
            "n_experts": 4,
            "moe_top_k": 2,
            "moe_capacity_factor": 1.0,
        }
    ).double()
    layers = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
    with torch.no_grad():
        for layer in layers:
            layer.router.weight.mul_(50)  # peaked routing: experts overflow
    return model, layers


def test_translator_loss_ignores_padding_in_moe_routing():
    """An MoE translator in training (capacity factor 1, so tokens are dropped): the teacher-forcing
    loss and every layer's balancing losses of a batch are those of the same batch with extra
    padding columns on the source and the target, i.e. padding never takes capacity in the encoder
    or the decoder (through ``teacher_forcing_loss``, as the tasks train)."""
    from blockbench.tasks.translation import teacher_forcing_loss

    model, layers = overflowing_moe_model("encoder_decoder", n_layers=1)
    gen = torch.Generator().manual_seed(1)
    pad, bos, eos = 0, 1, 2
    src = torch.randint(3, 40, (4, 9), generator=gen)
    tgt = torch.randint(3, 40, (4, 11), generator=gen)
    tgt[:, 0] = bos
    for row, (src_len, tgt_len) in enumerate([(9, 11), (4, 5), (7, 9), (2, 3)]):
        src[row, src_len - 1], src[row, src_len:] = eos, pad
        tgt[row, tgt_len - 1], tgt[row, tgt_len:] = eos, pad

    def loss_and_stats(src: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        loss = teacher_forcing_loss(model, src, tgt, pad_id=pad)
        return loss, [torch.stack([m.aux_loss, m.z_loss]) for m in layers] + [m.tokens_per_expert for m in layers]

    loss, stats = loss_and_stats(src, tgt)
    assert sum(m.dropped_tokens for m in layers) > 0
    wide_loss, wide_stats = loss_and_stats(F.pad(src, (0, 6), value=pad), F.pad(tgt, (0, 8), value=pad))
    torch.testing.assert_close(wide_loss, loss, **TOL)
    for got, want in zip(wide_stats, stats, strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_moe_translator_validation_does_not_depend_on_batch_size(tmp_path):
    """One MoE translator (4 experts, top-2, capacity factor 1) validated through
    the task's own path with validation batches of 8 and of 32 reports the same loss, BLEU, exact
    match and translations (up to float summation order). Weights are scaled up so that the
    routing is peaked (experts would overflow) and the greedy translations are varied."""
    import lightning as L

    from blockbench.config import build_run_config
    from blockbench.tasks.translation import ParallelDataModule

    run = build_run_config(
        {},
        {
            "task": "translation",
            "task.n_train": 64,
            "task.n_val": 64,
            "model.d_model": 32,
            "model.n_layers": 1,
            "model.n_heads": 2,
            "model.d_ff": 64,
            "model.n_experts": 4,
            "model.moe_top_k": 2,
            "model.moe_capacity_factor": 1.0,
        },
    )
    torch.manual_seed(0)
    module, _ = run.task.build(run.resolved_model(), run.optimizer, max_steps=1, batch_size=8)
    with torch.no_grad():
        for p in module.model.parameters():
            p.mul_(3)
        for layer in module.moe_layers:
            layer.router.weight.mul_(30)

    results = {}
    for batch_size in (8, 32):
        datamodule = ParallelDataModule(run.task, batch_size)
        gathered = module._all_translations
        translations: list[list[tuple[int, str]]] = []
        module._all_translations = lambda translations=translations, gathered=gathered: (
            translations.append(gathered()) or translations[-1]
        )
        trainer = L.Trainer(
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        trainer.validate(module, datamodule=datamodule, verbose=False)
        del module._all_translations
        metrics = {name: float(trainer.callback_metrics[f"val/{name}"]) for name in ("loss", "bleu", "exact_match")}
        results[batch_size] = metrics, translations[0]

    (metrics_8, translations_8), (metrics_32, translations_32) = results[8], results[32]
    assert translations_8 == translations_32
    assert metrics_8 == pytest.approx(metrics_32, rel=1e-6, abs=1e-9)
    assert len({text for _, text in translations_8}) > 32  # varied translations, sensitive to routing


def test_lm_padding_mask_reaches_moe_layers_with_and_without_cache():
    """The decoder LM passes its ``padding_mask`` on to its MoE layers: in training (capacity factor 1,
    tokens dropped) extra padding columns leave the real positions' logits unchanged; with a KV cache
    the mask covers the cached positions too, and a left-padded prompt fed one token at a time
    gives the logits of the whole prompt at once (evaluation)."""
    lm, layers = overflowing_moe_model("decoder_lm", n_layers=2)
    idx = torch.randint(0, 40, (3, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.arange(8)[None, :] >= torch.tensor([8, 3, 5])[:, None]  # right padding
    logits = lm(idx, mask)
    assert sum(m.dropped_tokens for m in layers) > 0
    wide = lm(F.pad(idx, (0, 6)), F.pad(mask, (0, 6), value=True))
    torch.testing.assert_close(wide[:, :8][~mask], logits[~mask], **TOL)

    lm.eval()
    prompt_mask = torch.arange(8)[None, :] < torch.tensor([0, 5, 3])[:, None]  # left padding
    full = lm(idx, prompt_mask)
    caches = lm.new_caches()
    steps = [lm(idx[:, t : t + 1], prompt_mask[:, : t + 1], caches)[:, 0] for t in range(8)]
    torch.testing.assert_close(torch.stack(steps, dim=1)[~prompt_mask], full[~prompt_mask], **TOL)


# --------------------------------------------------------------------------- public helpers (models/introspection.py)


def test_auxiliary_losses_and_expert_load_are_read_from_each_layers_last_forward():
    """``moe_layers``, ``add_auxiliary_losses`` and ``expert_load`` against a hand computation from
    the attributes each MoE layer sets in its forward (an LM with 2 MoE layers whose experts
    overflow): the logged losses are the plain means over the layers, the total adds them to the
    task loss with the config's weights in the order ``(loss + w_aux * aux) + w_z * z``, and the
    load lists every layer's token shares, then its dropped assignments."""
    model, layers = overflowing_moe_model("decoder_lm", n_layers=2)
    assert moe_layers(model) == layers and len(layers) == 2
    assert moe_layers(build_model({"family": "decoder_lm", "vocab_size": 40, "d_model": 32, "n_heads": 2})) == []
    cfg = model.cfg.model_copy(update={"moe_aux_loss_weight": 0.5, "moe_z_loss_weight": 0.25})
    idx = torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(1))
    task_loss = model.loss(idx[:, :-1], idx[:, 1:])

    total, logged = add_auxiliary_losses(task_loss, layers, cfg)
    aux = [layer.aux_loss.item() for layer in layers]
    z = [layer.z_loss.item() for layer in layers]
    assert list(logged) == ["moe/aux_loss", "moe/z_loss"]
    assert logged["moe/aux_loss"].item() == pytest.approx((aux[0] + aux[1]) / 2, rel=1e-12)
    assert logged["moe/z_loss"].item() == pytest.approx((z[0] + z[1]) / 2, rel=1e-12)
    assert total.item() == pytest.approx(
        task_loss.item() + 0.5 * (aux[0] + aux[1]) / 2 + 0.25 * (z[0] + z[1]) / 2, rel=1e-12
    )
    assert torch.equal(total, task_loss + 0.5 * logged["moe/aux_loss"] + 0.25 * logged["moe/z_loss"])
    total.backward()
    assert all(layer.router.weight.grad is not None for layer in layers)
    assert add_auxiliary_losses(task_loss, [], cfg) == (task_loss, {})

    load = expert_load(layers)
    per_layer = [*(f"expert{j}_token_share" for j in range(4)), "dropped_tokens"]
    assert list(load) == [f"moe/layer{i}/{name}" for i in range(2) for name in per_layer]
    # 0-dim tensors on the model's device: the logger reads them when it writes, nothing is read here
    assert all(isinstance(value, torch.Tensor) and value.dim() == 0 for value in load.values())
    for i, layer in enumerate(layers):
        shares = [load[f"moe/layer{i}/expert{j}_token_share"].item() for j in range(4)]
        assert shares == layer.tokens_per_expert.tolist() and sum(shares) == pytest.approx(1.0)
        assert load[f"moe/layer{i}/dropped_tokens"].item() == float(layer.dropped_tokens)
    assert sum(load[f"moe/layer{i}/dropped_tokens"].item() for i in range(2)) > 0  # capacity factor 1: tokens dropped


@pytest.mark.parametrize("train", [True, False])
def test_a_compiled_moe_model_has_no_graph_break_and_matches_eager(train):
    """``model.compile: true`` with experts: the layer reads no expert count back to the host while
    compiling (training with a capacity, or validation without one), so the graph does not break."""
    import torch._dynamo

    torch.manual_seed(0)
    cfg = {
        "family": "decoder_lm",
        "vocab_size": 50,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 2,
        "d_ff": 64,
        "max_seq_len": 16,
        "n_experts": 4,
        "moe_top_k": 2,
    }
    model = build_model(cfg).train(train)
    x = torch.randint(0, 50, (2, 16))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]
    torch.manual_seed(1)
    eager = model(x)
    torch.manual_seed(1)
    compiled = torch.compile(model)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("train", [True, False])
def test_a_compiled_moe_layer_with_padding_has_no_graph_break_and_matches_eager(train):
    """The translator's experts see padding: eagerly the layer routes only the real tokens (a
    data-dependent selection); compiled it routes all of them with padding ranked last and dropped,
    which gives the same output, losses and statistics without breaking the graph."""
    import torch._dynamo

    torch.manual_seed(0)
    cfg = {
        "family": "decoder_lm",
        "vocab_size": 50,
        "d_model": 32,
        "n_layers": 1,
        "n_heads": 2,
        "d_ff": 64,
        "max_seq_len": 16,
        "n_experts": 4,
        "moe_top_k": 2,
        "moe_capacity_factor": 0.6,
    }
    layer = moe_layers(build_model(cfg))[0].train(train)
    x = torch.randn(3, 10, 32)
    padding = torch.zeros(3, 10, dtype=torch.bool)
    padding[0, 6:] = True
    padding[2, 3:] = True
    torch._dynamo.reset()
    explained = torch._dynamo.explain(layer)(x, padding)
    assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]
    eager = layer(x, padding)
    stats = (layer.aux_loss, layer.z_loss, layer.tokens_per_expert, layer.dropped_assignments)
    compiled = torch.compile(layer, fullgraph=True)(x, padding)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    assert torch.equal(compiled[padding], torch.zeros_like(compiled[padding]))
    for got, want in zip(
        (layer.aux_loss, layer.z_loss, layer.tokens_per_expert, layer.dropped_assignments), stats, strict=True
    ):
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-5, atol=1e-6)
