"""One embedding convention (``models.embedding``) for every family and positional variant.

What enters the first block is the token signal plus the position table. At init, on real inputs
of the embedded tasks, token : position RMS must be 1 : 1 for every additive positional variant
of every family, so a comparison of positional encodings starts every variant from the same
signal ratio; and the token signal has its family's RMS (``EMBEDDING_STD`` for token tables,
``PATCH_RMS`` for the ViT's patches). The token signal is measured as what the model feeds its
first block minus the position table, so a family that rescales either side fails.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from blockbench.models import build_model
from blockbench.models.embedding import EMBEDDING_STD, PATCH_RMS
from blockbench.models.position import (
    SinCos2DPositionalEncoding,
    SinusoidalPositionalEncoding,
    sincos_2d_table,
    sinusoidal_table,
)
from blockbench.tasks.lm import AgreementDataModule, LMTaskConfig
from blockbench.tasks.translation import ParallelDataModule, TranslationTaskConfig
from blockbench.tasks.vision import ShapesDataModule, VisionTaskConfig

#: sampling noise of an RMS over a few thousand N(0, 0.02) draws, with margin; the old conventions
#: were off by a factor of 0.03 to 30 (the closest, the ViT's sine-cosine tables, by 0.82)
RTOL = 0.1
BATCH = 16


def rms(x: torch.Tensor) -> float:
    return x.pow(2).mean().sqrt().item()


@functools.cache  # the embedded data is generated once per test session
def lm_inputs():
    task = LMTaskConfig(n_train_tokens=5_000, n_val_tokens=1_000, n_probes=4)
    data = AgreementDataModule(task, BATCH)
    data.setup()
    return task, (data.train_rows[:BATCH, :-1],)


@functools.cache  # the embedded data is generated once per test session
def translation_inputs():
    task = TranslationTaskConfig(n_train=BATCH, n_val=4)
    data = ParallelDataModule(task, BATCH)
    data.setup()
    pairs = data.corpus.train
    return task, (torch.from_numpy(pairs.src), torch.from_numpy(pairs.tgt[:, :-1]))


@functools.cache  # the embedded data is generated once per test session
def vision_inputs():
    task = VisionTaskConfig(n_train=BATCH, n_val=4)
    data = ShapesDataModule(task, BATCH)
    data.setup()
    return task, (data.train_set.tensors[0],)


INPUTS = {"decoder_lm": lm_inputs, "encoder_decoder": translation_inputs, "vit": vision_inputs}
TOKEN_RMS = {"decoder_lm": EMBEDDING_STD, "encoder_decoder": EMBEDDING_STD, "vit": PATCH_RMS}
ADDITIVE = [
    ("decoder_lm", "learned"),
    ("decoder_lm", "sinusoidal"),
    ("encoder_decoder", "learned"),
    ("encoder_decoder", "sinusoidal"),
    ("vit", "learned"),
    ("vit", "sinusoidal"),
    ("vit", "sincos2d"),
]


def first_block_inputs(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """What the model feeds the first block of each of its stacks (encoder, then decoder)."""
    seen: list[torch.Tensor] = []
    stacks = [model.encoder, model.decoder] if hasattr(model, "encoder") else [model.stack]
    hooks = [s.blocks[0].register_forward_pre_hook(lambda _, args: seen.append(args[0])) for s in stacks]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def build(family: str, pos_encoding: str, seed: int) -> torch.nn.Module:
    task, _ = INPUTS[family]()
    torch.manual_seed(seed)
    return build_model(
        {**task.model_overrides(), "d_model": 256, "n_layers": 1, "n_heads": 4, "pos_encoding": pos_encoding}
    ).eval()


def signal_rms(family: str, pos_encoding: str, seed: int = 0) -> list[tuple[float, float]]:
    """(token RMS, position RMS) at init of each stack's input, over the positions that carry a
    table: the ViT's patches (its CLS token takes none, ``test_vit_cls_token_enters_without_a_position``)."""
    model = build(family, pos_encoding, seed)
    pairs = []
    for x in first_block_inputs(model, INPUTS[family]()[1]):
        first = 1 if family == "vit" else 0
        x = x[:, first:]
        table = model.positions.embedding(x.shape[1])
        pairs.append((rms(x - table), rms(table)))
    return pairs


@pytest.mark.parametrize("family, pos_encoding", ADDITIVE)
def test_token_and_position_signals_have_the_convention_rms_at_init(family, pos_encoding):
    for token, position in signal_rms(family, pos_encoding):
        assert token / position == pytest.approx(1.0, rel=RTOL), (token, position)
        assert token == pytest.approx(TOKEN_RMS[family], rel=RTOL)
        assert position == pytest.approx(TOKEN_RMS[family], rel=RTOL)


def test_every_family_and_variant_starts_from_the_same_ratio():
    ratios = {(f, p, i): t / q for f, p in ADDITIVE for i, (t, q) in enumerate(signal_rms(f, p, seed=1))}
    assert max(ratios.values()) / min(ratios.values()) < 1 + 2 * RTOL, ratios


@pytest.mark.parametrize("pos_encoding", ["learned", "sinusoidal", "sincos2d"])
def test_vit_cls_token_enters_without_a_position(pos_encoding):
    """The CLS token has no place in the image, so no table row (timm's no_embed_class; MAE's
    sincos2d CLS row is zero): a learned row would only repeat the learned CLS token. It is a token
    of the signal, at the patches' RMS (docs/decisions/embedding-scale.md gives the measurements behind that)."""
    model = build("vit", pos_encoding, seed=4)
    (x,) = first_block_inputs(model, INPUTS["vit"]()[1])
    torch.testing.assert_close(x[:, 0], model.cls_token[0].expand(len(x), -1))
    assert rms(x[:, 0]) == pytest.approx(PATCH_RMS, rel=RTOL)
    assert model.positions.embedding(model.n_patches).shape[0] == model.n_patches


def test_patch_projection_on_unit_variance_pixels_has_the_patch_rms():
    torch.manual_seed(2)
    model = build_model(
        {
            "family": "vit",
            "d_model": 256,
            "n_layers": 1,
            "n_heads": 4,
            "image_size": 32,
            "patch_size": 4,
            "n_classes": 3,
        }
    )
    with torch.no_grad():
        patches = model.patch_embed(torch.randn(8, 3, 32, 32))
    assert rms(patches) == pytest.approx(PATCH_RMS, rel=0.03)
    assert rms(model.positions.weight) == pytest.approx(PATCH_RMS, rel=0.03)


def test_fixed_tables_are_the_unit_tables_scaled_to_the_token_rms():
    scale = EMBEDDING_STD * math.sqrt(2)  # a unit-amplitude sin/cos row has RMS 1/sqrt(2)
    torch.testing.assert_close(SinusoidalPositionalEncoding(10, 8)(10), sinusoidal_table(10, 8) * scale)
    table = SinCos2DPositionalEncoding(grid_size=3, dim=16).embedding(9)
    torch.testing.assert_close(table, sincos_2d_table(3, 16) * scale)
    for row in (*SinusoidalPositionalEncoding(50, 64)(50), *table):
        assert rms(row) == pytest.approx(EMBEDDING_STD, rel=1e-5)
    # at the ViT's patch RMS the tables keep Vaswani et al.'s and MAE's unit amplitude
    torch.testing.assert_close(SinusoidalPositionalEncoding(10, 8, rms=PATCH_RMS)(10), sinusoidal_table(10, 8))
    vit = build_model(
        {
            "family": "vit",
            "d_model": 16,
            "n_layers": 1,
            "n_heads": 4,
            "image_size": 12,
            "patch_size": 4,
            "n_classes": 3,
            "pos_encoding": "sincos2d",
        }
    )
    torch.testing.assert_close(vit.positions.embedding(9), sincos_2d_table(3, 16))


@pytest.mark.parametrize("family", ["decoder_lm", "encoder_decoder", "vit"])
@pytest.mark.parametrize("pos_encoding", ["rope", "alibi", "relative", "nope"])
def test_variants_without_a_table_feed_the_bare_token_signal(family, pos_encoding):
    """No table, no multiplier: the first block sees the token embeddings (the CLS token and the
    patch projection) themselves, at their family's RMS."""
    inputs = INPUTS[family]()[1]
    model = build(family, pos_encoding, seed=3)
    with torch.no_grad():
        if family == "vit":
            patches = model.patch_embed(inputs[0])
            want = [torch.cat([model.cls_token.expand(len(patches), -1, -1), patches], dim=1)]
        else:
            want = [model.tok_emb(ids) for ids in inputs]
    got = first_block_inputs(model, inputs)
    assert len(got) == len(want)
    for x, tokens in zip(got, want, strict=True):
        torch.testing.assert_close(x, tokens)
        assert rms(x[:, 1:] if family == "vit" else x) == pytest.approx(TOKEN_RMS[family], rel=RTOL)
