"""Attention masks and biases built once per forward of a stack, and the blocks' outputs a
model returns for the logit lens.

ALiBi, the T5 relative bias, sparse patterns and padding reach SDPA as masks. A stack builds each once
per forward (``models.attention.AttentionMask``) and hands the same tensor to all its layers, instead
of every layer building its own; the numbers stay those of the per-layer masks bit for bit. The
learned T5 table is still looked up per layer while gradients are on: one shared lookup would sum the
layers' gradients in another order and change their last bits.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_model
from torch._dynamo.utils import counters

from blockbench.models import attention as attention_module
from blockbench.models import build_model
from blockbench.models.position import ALiBi, T5RelativePositionBias

#: what builds a mask or bias, patched to count its calls: (owner, attribute)
BUILDERS = {
    "attention_mask": (attention_module, "attention_mask"),  # causal and padding masks
    "sparse_mask": (attention_module, "sparse_mask"),  # the sparse patterns
    "alibi": (ALiBi, "attention_bias"),
    "t5_buckets": (T5RelativePositionBias, "buckets"),
}
LAYERS = 3


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Calls of each mask or bias builder (``BUILDERS``) since the test began, by name."""
    calls: Counter = Counter()
    for name, (owner, attribute) in BUILDERS.items():
        original = getattr(owner, attribute)

        def counting(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, attribute, counting)
    return calls


def inputs(family: str, padding: bool) -> tuple[tuple, dict]:
    """A batch of 3 for ``family`` (tiny sizes of ``helpers.tiny``), padded where asked."""
    g = torch.Generator().manual_seed(0)
    if family == "vit":
        return (torch.randn(3, 3, 8, 8, generator=g, dtype=torch.float64),), {}
    tokens = torch.randint(1, 17, (3, 9), generator=g)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    if padding:
        pad[0, :4] = True
        pad[2, :1] = True
    if family == "decoder_lm":
        return (tokens,), {"padding_mask": pad if padding else None}
    return (tokens, tokens[:, :7]), {"src_padding_mask": pad if padding else None}


#: (family, model overrides, padding) -> builder calls per forward: one per stack that needs the mask
#: (the translator: encoder self-attention, decoder self-attention, decoder cross-attention); the
#: pattern is asked once per self-attention stack even when it is dense (``sparse_mask`` gives None)
CASES = {
    "lm-padding": ("decoder_lm", {}, True, {"attention_mask": 1, "sparse_mask": 1}),
    "lm-alibi": ("decoder_lm", {"pos_encoding": "alibi"}, False, {"attention_mask": 1, "alibi": 1, "sparse_mask": 1}),
    "lm-relative-padding": (
        "decoder_lm",
        {"pos_encoding": "relative"},
        True,
        {"attention_mask": 1, "t5_buckets": 1, "sparse_mask": 1},
    ),
    "lm-local": ("decoder_lm", {"attention_pattern": "local"}, False, {"attention_mask": 1, "sparse_mask": 1}),
    "lm-plain-causal": ("decoder_lm", {}, False, {"sparse_mask": 1}),  # SDPA's is_causal: no mask tensor
    "translator-alibi-fixed-padding": (
        "encoder_decoder",
        {"pos_encoding": "alibi", "attention_pattern": "fixed"},
        True,
        {"attention_mask": 3, "alibi": 2, "sparse_mask": 2},
    ),
    "translator-relative": (
        "encoder_decoder",
        {"pos_encoding": "relative"},
        False,
        {"attention_mask": 3, "t5_buckets": 2, "sparse_mask": 2},
    ),
    "vit-relative-strided": (
        "vit",
        {"pos_encoding": "relative", "attention_pattern": "strided"},
        False,
        {"attention_mask": 1, "t5_buckets": 1, "sparse_mask": 1},
    ),
}


@pytest.mark.parametrize("grad", [True, False], ids=["train", "no_grad"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_mask_and_bias_is_built_once_per_stack_per_forward(case: str, grad: bool, builds: Counter) -> None:
    family, overrides, padding, expected = CASES[case]
    torch.manual_seed(0)
    model = tiny_model(family, n_layers=LAYERS, attention_window=3, attention_stride=4, **overrides)
    args, kwargs = inputs(family, padding)
    builds.clear()
    with torch.set_grad_enabled(grad):
        out = model(*args, **kwargs)
    assert dict(builds) == expected
    if grad:
        out.square().mean().backward()  # the backward pass builds nothing either
        assert dict(builds) == expected


def test_a_decoding_step_builds_each_mask_once(builds: Counter) -> None:
    """With KV caches: the LM's step (one query, every cached key, a padding mask) and the
    translator's step (decoder self-attention and cross-attention to the padded source)."""
    torch.manual_seed(0)
    lm = tiny_model("decoder_lm", n_layers=LAYERS, pos_encoding="alibi")
    (tokens,), kwargs = inputs("decoder_lm", padding=True)
    caches = lm.new_caches()
    lm(tokens[:, :5], kwargs["padding_mask"][:, :5], caches)
    builds.clear()
    lm(tokens[:, 5:6], kwargs["padding_mask"][:, :6], caches)
    assert dict(builds) == {"attention_mask": 1, "alibi": 1, "sparse_mask": 1}

    translator = tiny_model("encoder_decoder", n_layers=LAYERS, pos_encoding="relative")
    (src, tgt), kwargs = inputs("encoder_decoder", padding=True)
    memory = translator.encode(src, kwargs["src_padding_mask"])
    caches = translator.new_caches()
    translator.decode(tgt[:, :1], memory, kwargs["src_padding_mask"], caches)
    builds.clear()
    translator.decode(tgt[:, 1:2], memory, kwargs["src_padding_mask"], caches)
    assert dict(builds) == {"attention_mask": 2, "t5_buckets": 1, "sparse_mask": 1}  # self (1 query, 2 keys), cross


@pytest.fixture
def sdpa_masks(monkeypatch: pytest.MonkeyPatch) -> list:
    """The ``attn_mask`` of every ``F.scaled_dot_product_attention`` call since the test began."""
    seen: list = []
    original = F.scaled_dot_product_attention

    def spy(*args, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return original(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return seen


@pytest.mark.parametrize(
    ("family", "overrides", "padding", "grad"),
    [
        ("decoder_lm", {"pos_encoding": "alibi"}, True, True),  # ALiBi has no parameters: shared in training
        ("decoder_lm", {"pos_encoding": "relative"}, False, False),
        ("decoder_lm", {"attention_pattern": "local"}, True, True),
        ("vit", {"pos_encoding": "alibi", "attention_pattern": "fixed"}, False, True),
    ],
)
def test_every_layer_of_a_stack_gets_the_same_mask_tensor(
    family: str, overrides: dict, padding: bool, grad: bool, sdpa_masks: list
) -> None:
    torch.manual_seed(0)
    model = tiny_model(family, n_layers=LAYERS, attention_window=3, attention_stride=4, **overrides)
    args, kwargs = inputs(family, padding)
    with torch.set_grad_enabled(grad):
        model(*args, **kwargs)
    assert len(sdpa_masks) == LAYERS and sdpa_masks[0] is not None
    assert all(mask is sdpa_masks[0] for mask in sdpa_masks)


def test_the_learned_t5_bias_is_looked_up_per_layer_in_training(sdpa_masks: list) -> None:
    """With gradients on, each layer gathers its own T5 bias (same values) from buckets built once, so
    the table's gradient sums the layers' contributions exactly as before the masks were shared."""
    torch.manual_seed(0)
    model = tiny_model("decoder_lm", n_layers=LAYERS, pos_encoding="relative")
    (tokens,), _ = inputs("decoder_lm", padding=False)
    model(tokens)
    assert len(sdpa_masks) == LAYERS and len({id(mask) for mask in sdpa_masks}) == LAYERS
    for mask in sdpa_masks[1:]:
        assert torch.equal(mask, sdpa_masks[0])


# --------------------------------------------------------------------------- block outputs


def hooked_block_outputs(model: torch.nn.Module, stack: torch.nn.Module, *args, **kwargs) -> list[torch.Tensor]:
    """Every block's output of one forward, collected by forward hooks."""
    outputs: list[torch.Tensor] = []
    handles = [block.register_forward_hook(lambda _m, _a, out: outputs.append(out)) for block in stack.blocks]
    try:
        model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return outputs


@pytest.mark.parametrize("family", ["decoder_lm", "encoder_decoder"])
def test_block_outputs_are_those_the_blocks_compute(family: str) -> None:
    """``block_outputs=True`` returns what forward hooks on the blocks see, bit for bit, beside the
    model's usual output (the decoding stack's: the translator's decoder)."""
    torch.manual_seed(0)
    model = tiny_model(family, n_layers=LAYERS, pos_encoding="alibi", attention_pattern="local", attention_window=3)
    args, kwargs = inputs(family, padding=True)
    stack = model.stack if family == "decoder_lm" else model.decoder
    for head in (True, False):
        out, outputs = model(*args, head=head, block_outputs=True, **kwargs)
        assert torch.equal(out, model(*args, head=head, **kwargs))
        hooked = hooked_block_outputs(model, stack, *args, head=head, **kwargs)
        assert len(outputs) == LAYERS
        for ours, theirs in zip(outputs, hooked, strict=True):
            assert torch.equal(ours, theirs)


def test_block_outputs_of_a_compiled_model_compile_once() -> None:
    """Under ``model.compile: true`` the blocks' outputs come from one more graph, compiled at the first
    validation and reused by the next (no hooks: dynamo does not guard them, so hooks registered after
    a graph was compiled without them never run)."""
    torch._dynamo.reset()
    cfg = dict(family="decoder_lm", d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=24, vocab_size=17)
    torch.manual_seed(0)
    eager = build_model(cfg)
    compiled = build_model({**cfg, "compile": True})
    compiled.load_state_dict(eager.state_dict())
    idx = torch.randint(0, 17, (4, 12), generator=torch.Generator().manual_seed(0))
    compiled.eval()
    eager.eval()

    def validation() -> int:
        """One validation pass: the forward without the blocks' outputs (the validation loss), then
        with them; returns the graphs the latter compiled."""
        with torch.no_grad():
            compiled(idx, head=False)
            graphs = counters["stats"]["unique_graphs"]
            out, outputs = compiled(idx, head=False, block_outputs=True)
            expected_out, expected = eager(idx, head=False, block_outputs=True)
        torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-6)
        assert len(outputs) == 2
        for ours, theirs in zip(outputs, expected, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        return counters["stats"]["unique_graphs"] - graphs

    assert validation() <= 1
    assert validation() == 0
