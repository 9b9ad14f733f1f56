"""blockbench's models against the implementations people use, by weight transplant: HF GPT-2 and
Llama against the decoder LM, timm's ViT against the ViT, ``torch.nn.Transformer`` and HF T5 against
the translator. Each peer is built at a small shape with random weights (non-zero biases, norm gains
away from 1), its weights are copied into blockbench's equivalent (``peers.py`` holds every mapping),
and in float64 the two must give the same logits, the same training loss (each model's own
cross-entropy, as it is trained) and the same gradient of every peer parameter (blockbench's carried
back through the mapping), within 1e-10 where float64 rounding is ~1e-14. A config option that
computes something else (an activation, a norm's eps, a position table per stack, a rotation in float32)
shows as a difference of 1e-7 or more.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from peers import (
    ATOL,
    BATCH,
    DT,
    SEQ,
    VOCAB,
    assert_parity,
    build_gpt2,
    build_llama,
    build_t5,
    build_timm_vit,
    build_torch_seq2seq,
    gpt2_config,
    gpt2_mapping,
    llama_config,
    llama_mapping,
    max_error,
    ours_for,
    rotary_float64,
    t5_config,
    t5_mapping_for,
    timm_vit_config,
    timm_vit_mapping,
    tokens,
    torch_seq2seq_config,
    torch_seq2seq_mapping,
    transplant,
)

from blockbench.models.norm import RMSNorm
from blockbench.models.position import RotaryPositionalEmbedding, t5_relative_position_bucket


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- HF GPT-2


@pytest.mark.parametrize("activation_function", ["gelu_new", "gelu"])
def test_gpt2_parity(activation_function):
    """HF GPT-2 (its own tanh GELU, ``gelu_new``, and the exact one) is blockbench's decoder LM with
    pre-norm LayerNorm, learned positions, tied embeddings, biases and activation gelu_tanh (or gelu):
    logits, the LM loss (HF's shifted labels; blockbench's ``loss(x[:, :-1], x[:, 1:])`` as the LM task
    trains) and every gradient. The other GELU form is more than the tolerance away."""
    g = generator(0)
    peer = build_gpt2(activation_function, g)
    config = gpt2_config(peer)
    ours = transplant(peer, ours_for(config), gpt2_mapping)
    x = tokens(g)

    def peer_step():
        out = peer(input_ids=x, labels=x)
        return out.logits, out.loss

    assert_parity(peer, ours, gpt2_mapping, peer_step, lambda: (ours(x), ours.loss(x[:, :-1], x[:, 1:])))

    other = {"gelu_tanh": "gelu", "gelu": "gelu_tanh"}[config["activation"]]
    wrong = transplant(peer, ours_for({**config, "activation": other}), gpt2_mapping)
    with torch.no_grad():
        assert max_error(wrong(x), peer(input_ids=x).logits) > 1e3 * ATOL


def test_gpt2_left_padding_parity():
    """A left-padded row (attention_mask with leading zeros in HF, ``padding_mask`` in blockbench): the
    real positions' logits, the loss over targets predicted from real positions, and every gradient.
    blockbench's learned positions count the padded slots (a real token after 4 pads sits at position
    4 and up), so HF gets those positions (``position_ids = arange``), not the pad-skipping ones its
    ``generate`` builds. What padded positions output is not compared: HF attends them uniformly to
    padding, blockbench gives a query with no key a zero attention output; neither reaches a real one."""
    g = generator(1)
    peer = build_gpt2("gelu_new", g)
    ours = transplant(peer, ours_for(gpt2_config(peer)), gpt2_mapping)
    x = tokens(g)
    padding = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    padding[0, :4] = True
    real = ~padding
    predicted_from_real = torch.zeros_like(real)
    predicted_from_real[:, 1:] = real[:, 1:] & real[:, :-1]
    labels = x.masked_fill(~predicted_from_real, -100)
    positions = torch.arange(SEQ).expand(BATCH, SEQ)

    def peer_step():
        out = peer(input_ids=x, attention_mask=real.long(), position_ids=positions, labels=labels)
        return out.logits[real], out.loss

    def our_step():
        logits = ours(x, padding_mask=padding)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
        return logits[real], loss

    assert_parity(peer, ours, gpt2_mapping, peer_step, our_step)
    with torch.no_grad():  # the padding matters: without the mask the padded row's real positions move
        assert max_error(ours(x)[real], peer_step()[0]) > 1e3 * ATOL


# --------------------------------------------------------------------------- HF Llama


@pytest.mark.parametrize("n_kv_heads, tied", [(2, False), (1, True)], ids=["gqa-untied", "mqa-tied"])
def test_llama_parity(n_kv_heads, tied):
    """HF Llama with grouped-query (2 key/value heads for 4 query heads) and multi-query attention is
    blockbench's decoder LM with RMSNorm (the same eps), RoPE, SwiGLU and no biases: logits, the LM loss
    and every gradient. HF's RMSNorm, rotary angles and loss run in float32 in any model; they are
    lifted to float64 (``peers.lift_to_float64``), so that a rotation computed in float32 (the logits
    ~3e-7 off) fails."""
    g = generator(2)
    peer = build_llama(n_kv_heads, tied, g)
    ours = transplant(peer, ours_for(llama_config(peer)), llama_mapping)
    theirs_eps = {m.variance_epsilon for m in peer.modules() if hasattr(m, "variance_epsilon")}
    our_eps = {m.eps for m in ours.modules() if isinstance(m, RMSNorm)}
    assert theirs_eps == our_eps == {1e-6}
    x = tokens(g)

    def peer_step():
        out = peer(input_ids=x, labels=x)
        return out.logits, out.loss

    assert_parity(peer, ours, llama_mapping, peer_step, lambda: (ours(x), ours.loss(x[:, :-1], x[:, 1:])))


def test_rope_is_hf_llamas_rotation_in_float64():
    """blockbench's RoPE rotates float64 queries and keys as HF's ``apply_rotary_pos_emb`` with float64
    angles does, at positions 4000-4011 (a cache offset), to 1e-10; the same rotation in float32 angles
    is ~1e-4 away there."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    g = generator(3)
    head_dim, offset = 16, 4000
    q, k = (torch.randn(BATCH, 4, SEQ, head_dim, generator=g, dtype=DT) for _ in range(2))
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, max_position_embeddings=8192)
    hf_rotary = LlamaRotaryEmbedding(config)
    cos, sin = rotary_float64(hf_rotary)(q, torch.arange(offset, offset + SEQ)[None])
    theirs = apply_rotary_pos_emb(q, k, cos, sin)
    rope = RotaryPositionalEmbedding(head_dim, base=config.rope_parameters["rope_theta"])
    for ours, expected in zip(rope.rotate(q, k, offset), theirs, strict=True):
        torch.testing.assert_close(ours, expected, rtol=0, atol=ATOL)
    cos32, sin32 = rope.angles(SEQ, offset, torch.float32)
    assert max_error(rope._rotate_by(q, cos32.to(DT), sin32.to(DT)), theirs[0]) > 1e-6


# --------------------------------------------------------------------------- timm's ViT


def test_timm_vit_parity():
    """timm's ViT (class token, learned positions, pre-norm LayerNorm with eps 1e-6, exact GELU, qkv
    bias) is blockbench's ViT: logits, the classification loss and every gradient. timm adds a position
    to the class token, blockbench does not: blockbench's class token is timm's plus timm's first
    position (an exact reparametrisation), and its gradient, carried back, is the gradient of both."""
    g = generator(4)
    peer = build_timm_vit(g)
    ours = transplant(peer, ours_for(timm_vit_config(peer)), timm_vit_mapping)
    images = torch.randn(BATCH, 3, 16, 16, generator=g, dtype=DT)
    labels = torch.randint(0, 10, (BATCH,), generator=g)

    def step(model):
        logits = model(images)
        return logits, F.cross_entropy(logits, labels)

    assert_parity(peer, ours, timm_vit_mapping, lambda: step(peer), lambda: step(ours))


# --------------------------------------------------------------------------- torch.nn.Transformer


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")], ids=["post-relu", "pre-gelu"])
def test_torch_transformer_parity(norm_first, activation):
    """``torch.nn.Transformer`` (post-norm with ReLU, pre-norm with GELU), given a tied token table and
    a learned position table (``peers.TorchSeq2Seq``), is blockbench's translator with norm placement
    post or pre: logits, the teacher-forcing loss and every gradient, with a right-padded source row
    (masked in the encoder and in cross-attention). The post-norm peer has no final norms (as the
    original Transformer and blockbench's post placement), the pre-norm one nn.Transformer's."""
    g = generator(5)
    peer = build_torch_seq2seq(norm_first, activation, g)
    ours = transplant(peer, ours_for(torch_seq2seq_config(peer)), torch_seq2seq_mapping)
    src, tgt = tokens(g), tokens(g, length=SEQ - 2)
    src_padding = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    src_padding[1, -3:] = True

    def peer_step():
        logits = peer(src, tgt[:, :-1], src_padding)
        return logits, F.cross_entropy(logits.reshape(-1, VOCAB), tgt[:, 1:].reshape(-1))

    def our_step():
        logits = ours(src, tgt[:, :-1], src_padding)
        return logits, ours.loss(src, tgt[:, :-1], tgt[:, 1:], src_padding_mask=src_padding)

    assert_parity(peer, ours, torch_seq2seq_mapping, peer_step, our_step)


# --------------------------------------------------------------------------- HF T5


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (16, 40), (64, 256)])
def test_t5_buckets_equal_hf_transformers(num_buckets, max_distance):
    """The buckets are those of HF transformers' ``T5Attention._relative_position_bucket``, both ways,
    over +-300 positions."""
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-300, 301)
    for bidirectional in (True, False):
        ours = t5_relative_position_bucket(
            relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        theirs = T5Attention._relative_position_bucket(
            relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        assert torch.equal(ours, theirs), bidirectional


def test_t5_relative_bias_of_each_stack_is_hf_compute_bias():
    """The translator with ``pos_encoding=relative`` has T5's two tables: its encoder's bias is HF T5's
    encoder ``compute_bias`` (bidirectional buckets, from the encoder's table) and its decoder's
    (``decoder_positions()``, what ``decode`` uses) HF's decoder one (causal buckets, from the decoder's
    own table), over 1-40 positions, and for the decoder with a cache too (fewer queries than keys, the
    queries last). One table for both stacks cannot give both."""
    g = generator(6)
    peer = build_t5(g)
    ours = transplant(peer, ours_for(t5_config(peer)), t5_mapping_for(peer))
    encoder = peer.encoder.block[0].layer[0].SelfAttention
    decoder = peer.decoder.block[0].layer[0].SelfAttention
    cpu = torch.device("cpu")
    with torch.no_grad():
        for n in (1, 7, 40):
            ours_bias = ours.positions.attention_bias(n, n, causal=False, device=cpu)
            assert torch.equal(ours_bias, encoder.compute_bias(n, n)[0]), n
        for q_len, k_len in ((1, 1), (12, 12), (40, 40), (1, 40), (5, 40)):
            ours_bias = ours.decoder_positions().attention_bias(q_len, k_len, causal=True, device=cpu)
            theirs = decoder.compute_bias(q_len, k_len, past_seen_tokens=k_len - q_len)[0]
            assert torch.equal(ours_bias, theirs), (q_len, k_len)
        # the two stacks' biases differ: the encoder's table under causal buckets is not the decoder's
        shared = ours.positions.attention_bias(12, 12, causal=True, device=cpu)
        assert max_error(shared, decoder.compute_bias(12, 12)[0]) > 0.1


def test_t5_parity():
    """HF T5 (ReLU feed-forward, tied embeddings) is blockbench's translator with RMSNorm (the same
    eps), pre-norm, no biases, ReLU and ``pos_encoding=relative``: logits, the teacher-forcing loss and
    every gradient, the two relative bias tables' included, with a right-padded source row. Exact
    reparametrisations (``peers.t5_mapping``): T5's unscaled q.k is blockbench's scaled one with the
    query weights times sqrt(head_dim), T5's d_model^-1/2 before the tied output layer is folded into
    the decoder's final norm gain. With the decoder given the encoder's table, as one shared table
    would, the logits move by far more than the tolerance."""
    g = generator(7)
    peer = build_t5(g)
    mapping = t5_mapping_for(peer)
    ours = transplant(peer, ours_for(t5_config(peer)), mapping)
    theirs_eps = {m.variance_epsilon for m in peer.modules() if hasattr(m, "variance_epsilon")}
    assert theirs_eps == {m.eps for m in ours.modules() if isinstance(m, RMSNorm)} == {1e-6}
    src, tgt = tokens(g), tokens(g, length=SEQ - 2)
    src_padding = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    src_padding[1, -3:] = True

    def peer_step():
        out = peer(
            input_ids=src,
            attention_mask=(~src_padding).long(),
            decoder_input_ids=tgt[:, :-1],
            labels=tgt[:, 1:].contiguous(),  # HF views the labels
        )
        return out.logits, out.loss

    def our_step():
        logits = ours(src, tgt[:, :-1], src_padding)
        return logits, ours.loss(src, tgt[:, :-1], tgt[:, 1:], src_padding_mask=src_padding)

    assert_parity(peer, ours, mapping, peer_step, our_step)
    with torch.no_grad():
        ours.target_positions.weight.copy_(ours.positions.weight)
        assert max_error(ours(src, tgt[:, :-1], src_padding), peer_step()[0]) > 1e3 * ATOL
