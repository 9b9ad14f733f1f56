"""Queries whose keys are all masked, and padding masks with KV caches.

A sparse pattern plus padding can leave a query with no key at all (a padding query far from
every real token). SDPA gives such a row a zero attention output; the hand-written math path
(``need_weights``, the additive score) must give the same, finite values and finite gradients,
or a cell would be recorded as diverged for a reason that is not a finding. Each path is checked
against a brute-force reference that loops over query rows.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import DT, randomize_, tiny_model
from torch.nn.attention import SDPBackend, sdpa_kernel

from blockbench.models import MultiHeadAttention
from blockbench.models import attention as attention_module
from blockbench.models.attention import SparsePattern, expands_kv_heads, grouped_sdpa
from blockbench.models.position import ALiBi, alibi_slopes

D, HEADS, KV_HEADS = 16, 4, 2
T, LENGTHS = 11, (11, 4, 1)
WINDOW, STRIDE, SUMMARY = 3, 4, 1


def pattern_allows(pattern: str, i: int, j: int) -> bool:
    """Child et al.'s patterns written out for one (query, key) pair (cf. ``models.sparse``)."""
    if pattern == "local":
        return abs(i - j) < WINDOW
    if pattern == "strided":
        return abs(i - j) < STRIDE or (i - j) % STRIDE == 0
    return i // STRIDE == j // STRIDE or j % STRIDE >= STRIDE - SUMMARY  # fixed


def padding_mask(side: str) -> torch.Tensor:
    """(B, T), True = padding: each row's real tokens at the end (left padding) or the start (right)."""
    positions = torch.arange(T)[None, :]
    lengths = torch.tensor(LENGTHS)[:, None]
    return positions < T - lengths if side == "left" else positions >= lengths


def allowed_keys(pattern: str, padding: torch.Tensor, causal: bool) -> list[list[list[int]]]:
    """[batch][query] -> the keys that query may attend."""
    return [
        [
            [j for j in range(T) if pattern_allows(pattern, i, j) and not padding[b, j] and (j <= i or not causal)]
            for i in range(T)
        ]
        for b in range(len(LENGTHS))
    ]


def brute_force(
    attn: MultiHeadAttention, x: torch.Tensor, keys: list[list[list[int]]], *, causal: bool, alibi: bool, additive: bool
) -> torch.Tensor:
    """The attention output row by row: softmax over the allowed keys only, zero without any."""
    hd = D // HEADS
    q, k, v = attn.qkv_proj(x).split([D, KV_HEADS * hd, KV_HEADS * hd], dim=-1)
    slopes = alibi_slopes(HEADS)
    heads_out = torch.zeros(x.shape[0], T, HEADS, hd, dtype=DT)
    for b in range(x.shape[0]):
        for h in range(HEADS):
            g = h // (HEADS // KV_HEADS)  # the key/value head serving query head h
            for i in range(T):
                js = keys[b][i]
                if not js:
                    continue
                q_i = q[b, i, h * hd : (h + 1) * hd]
                k_j = k[b, js, g * hd : (g + 1) * hd]
                v_j = v[b, js, g * hd : (g + 1) * hd]
                if additive:
                    s = torch.tanh(q_i @ attn.score.w_q[h] + k_j @ attn.score.w_k[h]) @ attn.score.v[h]
                else:
                    s = k_j @ q_i / math.sqrt(hd)
                if alibi:
                    distance = torch.tensor([max(i - j, 0) if causal else abs(i - j) for j in js], dtype=DT)
                    s = s - slopes[h] * distance
                heads_out[b, i, h] = torch.softmax(s, dim=0) @ v_j
    return attn.out_proj(heads_out.reshape(x.shape[0], T, D))


def attention(pattern: str, score: str) -> MultiHeadAttention:
    torch.manual_seed(0)
    attn = MultiHeadAttention(
        D, HEADS, n_kv_heads=KV_HEADS, score=score, sparsity=SparsePattern(pattern, WINDOW, STRIDE, SUMMARY)
    ).to(DT)
    with torch.no_grad():  # no trivial 0 or 1 (the out_proj bias then marks a zero attention output)
        for p in attn.parameters():
            p.normal_(0.0, 0.5)
    return attn


def run(attn: MultiHeadAttention, x: torch.Tensor, **kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Output and gradients (input and parameters) of a random linear function of the output."""
    x = x.clone().requires_grad_()
    attn.zero_grad()
    out = attn(x, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    (out * torch.randn(out.shape, dtype=DT, generator=torch.Generator().manual_seed(1))).sum().backward()
    return out.detach(), {"x": x.grad, **{n: p.grad.clone() for n, p in attn.named_parameters()}}


@pytest.mark.parametrize("alibi", [False, True], ids=["bool-mask", "alibi-float-mask"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("pattern", ["local", "strided", "fixed"])
def test_fully_masked_queries_give_zero_attention_on_every_path(pattern, side, causal, alibi):
    padding = padding_mask(side)
    keys = allowed_keys(pattern, padding, causal)
    has_keys = torch.tensor([[bool(js) for js in row] for row in keys])
    assert not has_keys.all(), "the setup must leave some query without keys"
    x = torch.randn(len(LENGTHS), T, D, dtype=DT, generator=torch.Generator().manual_seed(2))
    kwargs = dict(causal=causal, key_padding_mask=padding, positional=ALiBi(HEADS) if alibi else None)

    dot = attention(pattern, "dot")
    fused, fused_grads = run(dot, x, **kwargs)
    math_path, math_grads = run(dot, x, need_weights=True, **kwargs)
    additive_attn = attention(pattern, "additive")
    additive, additive_grads = run(additive_attn, x, **kwargs)

    with torch.no_grad():
        want_dot = brute_force(dot, x, keys, causal=causal, alibi=alibi, additive=False)
        want_additive = brute_force(additive_attn, x, keys, causal=causal, alibi=alibi, additive=True)
    for got, want, module in [
        (fused, want_dot, dot),
        (math_path, want_dot, dot),
        (additive, want_additive, additive_attn),
    ]:
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got[has_keys], want[has_keys])
        # no key: a zero attention output, as SDPA gives, so the layer returns its output bias
        torch.testing.assert_close(got[~has_keys], module.out_proj.bias.detach().expand(int((~has_keys).sum()), D))
    torch.testing.assert_close(math_path, fused)
    for grads in (fused_grads, math_grads, additive_grads):
        assert all(torch.isfinite(g).all() for g in grads.values())
    for name in fused_grads:
        torch.testing.assert_close(math_grads[name], fused_grads[name])


def test_math_path_weights_of_a_fully_masked_query_are_zero():
    padding = padding_mask("left")
    attn = attention("local", "dot")
    x = torch.randn(len(LENGTHS), T, D, dtype=DT)
    _, weights = attn(x, causal=True, key_padding_mask=padding, need_weights=True)
    has_keys = torch.tensor([[bool(js) for js in row] for row in allowed_keys("local", padding, True)])
    assert torch.all(weights.permute(0, 2, 1, 3)[~has_keys] == 0)
    torch.testing.assert_close(
        weights.sum(-1).permute(0, 2, 1)[has_keys], torch.ones(int(has_keys.sum()), HEADS, dtype=DT)
    )


# --------------------------------------------------------------------------- padding with KV caches


def tiny_lm(**fields) -> torch.nn.Module:
    """The tiny float64 LM (vocabulary 13, 16 positions) of seed 3, every weight redrawn from N(0, 0.3)."""
    torch.manual_seed(3)
    return randomize_(tiny_model("decoder_lm", vocab_size=13, max_seq_len=16, **fields), std=0.3)


@pytest.mark.parametrize(
    "fields",
    [
        {"pos_encoding": "learned"},
        {"pos_encoding": "rope", "attention_pattern": "local", "attention_window": 3},
        {"pos_encoding": "alibi", "attention_pattern": "strided", "attention_stride": 3},
        {
            "pos_encoding": "sinusoidal",
            "attention_score": "additive",
            "attention_pattern": "fixed",
            "attention_stride": 3,
        },
        {"pos_encoding": "rope", "n_experts": 2, "moe_top_k": 1, "moe_capacity_factor": None},  # routes new tokens only
    ],
    ids=["learned", "rope-local", "alibi-strided", "sinusoidal-additive-fixed", "rope-moe"],
)
def test_incremental_decoding_of_a_left_padded_prompt_equals_the_full_forward(fields):
    model = tiny_lm(**fields)
    prompt_len, total = 5, 9
    idx = torch.randint(0, 13, (3, total), generator=torch.Generator().manual_seed(4))
    padding = torch.arange(total)[None, :] < torch.tensor([[0], [2], [4]])  # left padding of 0, 2 and 4 tokens
    with torch.no_grad():
        full = model(idx, padding_mask=padding)
        caches = model.new_caches()
        steps = [model(idx[:, :prompt_len], padding_mask=padding[:, :prompt_len], caches=caches)]
        for t in range(prompt_len, total):  # each new token with the mask of every key so far
            steps.append(model(idx[:, t : t + 1], padding_mask=padding[:, : t + 1], caches=caches))
    assert torch.isfinite(full).all()
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    if fields["pos_encoding"] in ("rope", "alibi"):  # relative positions, patterns of i - j only:
        with torch.no_grad():  # the real tokens' logits are those of the unpadded sequence
            torch.testing.assert_close(full[2, 4:], model(idx[2:, 4:])[0])


def test_padding_mask_of_only_the_new_tokens_is_rejected_with_a_cache():
    model = tiny_lm()
    idx = torch.randint(0, 13, (2, 4))
    padding = torch.tensor([[True, False, False, False], [False] * 4])
    caches = model.new_caches()
    model(idx, padding_mask=padding, caches=caches)
    with pytest.raises(
        ValueError,
        match=r"covers 1 keys, but this attention has 5 keys \(4 cached \+ 1 new\).*"
        r"\(batch, cached \+ new\) mask",
    ):
        model(idx[:, :1], padding_mask=torch.tensor([[False], [False]]), caches=caches)
    with pytest.raises(ValueError, match=r"covers 3 keys, but this attention has 4 keys;"):
        model(idx, padding_mask=padding[:, :3])


# grouped-query attention with a mask on CUDA: the key/value heads repeated ------------------------


def test_gqa_repeats_its_key_value_heads_only_on_cuda_with_a_mask():
    """Where no fused CUDA kernel takes ``enable_gqa`` (with a mask) the heads are repeated; a CPU,
    a call without a mask and plain multi-head attention keep SDPA's own path."""
    assert expands_kv_heads("cuda", HEADS, KV_HEADS, masked=True)
    assert expands_kv_heads("cuda", HEADS, 1, masked=True)  # multi-query
    assert not expands_kv_heads("cuda", HEADS, KV_HEADS, masked=False)  # is_causal or nothing: flash takes it
    assert not expands_kv_heads("cuda", HEADS, HEADS, masked=True)  # nothing to repeat
    assert not expands_kv_heads("cpu", HEADS, KV_HEADS, masked=True)
    assert not expands_kv_heads("mps", HEADS, KV_HEADS, masked=True)


@pytest.mark.parametrize("kv_heads", [KV_HEADS, 1])
def test_repeated_key_value_heads_give_the_math_backend_s_gqa_with_a_padding_mask(kv_heads):
    """The repeated-heads call gives the output and the q, k, v gradients of SDPA's math backend with
    ``enable_gqa``, under a padding mask (a fully masked query row included: zeros)."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(3, HEADS, T, 8, dtype=DT, generator=generator, requires_grad=True)
    k, v = (torch.randn(3, kv_heads, T, 8, dtype=DT, generator=generator, requires_grad=True) for _ in range(2))
    keep = ~padding_mask("right")[:, None, None, :]  # (B, 1, 1, T), True = may attend
    keep = keep & torch.ones(T, T, dtype=torch.bool).tril()
    keep[2, :, 0] = False  # a query with no key
    upstream = torch.randn(3, HEADS, T, 8, dtype=DT, generator=generator)

    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    expected_grads = torch.autograd.grad(expected, (q, k, v), upstream)
    out = grouped_sdpa(q, k, v, attn_mask=keep, dropout_p=0.0, is_causal=False, expand_kv=True)
    grads = torch.autograd.grad(out, (q, k, v), upstream)

    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(out[2, :, 0], torch.zeros_like(out[2, :, 0]))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)


def test_a_gqa_layer_on_cuda_calls_sdpa_with_the_heads_repeated(monkeypatch):
    """The layer asks :func:`expands_kv_heads` with its device type: on CUDA (faked) with a padding mask,
    SDPA gets as many key/value heads as query heads and no ``enable_gqa``, and the layer's output is
    the one the CPU path gives; on the CPU itself SDPA gets the grouped heads and ``enable_gqa``."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(D, HEADS, n_kv_heads=KV_HEADS).to(DT)
    x = torch.randn(3, T, D, dtype=DT)
    padding = padding_mask("right")
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        calls.append((k.shape[1], kwargs["enable_gqa"]))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    on_cpu = attention(x, causal=True, key_padding_mask=padding)
    monkeypatch.setattr(attention_module, "expands_kv_heads", lambda device, *args: expands_kv_heads("cuda", *args))
    on_cuda = attention(x, causal=True, key_padding_mask=padding)
    assert calls == [(KV_HEADS, True), (HEADS, False)]
    torch.testing.assert_close(on_cuda, on_cpu, rtol=1e-12, atol=1e-12)
