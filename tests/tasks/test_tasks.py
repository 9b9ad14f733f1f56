"""Task modules: the training loss each task optimizes."""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import scalars

from blockbench.cell.train import train
from blockbench.config import build_run_config
from blockbench.models import MultiHeadAttention, attended_fraction, build_model, extrapolating_pos_encodings
from blockbench.models.moe import MoEFeedForward
from blockbench.models.registry import POSITIONAL
from blockbench.tensorboard.names import run_tag

TINY_VIT = {
    "task": "vit",
    "task.n_train": 16,
    "task.n_val": 8,
    "model.d_model": 32,
    "model.n_layers": 2,
    "model.n_heads": 2,
}


def build(overrides):
    run = build_run_config({}, overrides)
    module, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=2, batch_size=4)
    datamodule.setup("fit")
    module.log = module.log_dict = lambda *args, **kwargs: None  # no Trainer attached
    return datamodule, module, next(iter(datamodule.train_dataloader()))


def test_dense_training_step_is_the_task_loss():
    _, module, (images, labels) = build(TINY_VIT)
    torch.testing.assert_close(module.training_step((images, labels), 0), F.cross_entropy(module.model(images), labels))


def test_moe_auxiliary_losses_join_the_training_loss():
    _, module, (images, labels) = build(
        {
            **TINY_VIT,
            "model.n_experts": 4,
            "model.moe_top_k": 1,
            "model.moe_aux_loss_weight": 0.5,
            "model.moe_z_loss_weight": 0.25,
        }
    )
    torch.manual_seed(0)
    loss = module.training_step((images, labels), 0)
    layers = [m for m in module.model.modules() if isinstance(m, MoEFeedForward)]
    assert len(layers) == 2
    task_loss = F.cross_entropy(module.model(images), labels)  # recomputes the same routing
    aux = torch.stack([m.aux_loss for m in layers]).mean()
    z = torch.stack([m.z_loss for m in layers]).mean()
    assert aux.item() > 0 and z.item() > 0
    torch.testing.assert_close(loss, task_loss + 0.5 * aux + 0.25 * z)
    loss.backward()
    assert all(m.router.weight.grad is not None for m in layers)


def test_moe_training_step_returns_and_logs_what_it_did_before_the_helpers_moved_to_models():
    """The MoE training step through ``models.add_auxiliary_losses`` / ``expert_load`` keeps the
    arithmetic and the logs of the code it replaced: the returned loss is bit for bit
    ``(task loss + 0.5 * mean aux) + 0.25 * mean z`` over the layers, and the step logs the task
    loss, the two mean losses, then every layer's expert shares and dropped tokens, in this order."""
    _, module, (images, labels) = build(
        {
            **TINY_VIT,
            "model.n_experts": 4,
            "model.moe_top_k": 1,
            "model.moe_aux_loss_weight": 0.5,
            "model.moe_z_loss_weight": 0.25,
        }
    )
    logged = []
    module.log = lambda name, value, **kwargs: logged.append((name, value))
    module.log_dict = lambda values, **kwargs: logged.extend(values.items())
    torch.manual_seed(0)
    loss = module.training_step((images, labels), 0)

    layers = module.moe_layers
    task_loss = F.cross_entropy(module.model(images), labels)  # recomputes the same routing
    aux = torch.stack([m.aux_loss for m in layers]).mean()
    z = torch.stack([m.z_loss for m in layers]).mean()
    assert torch.equal(loss, task_loss + 0.5 * aux + 0.25 * z)
    expected = [("train/loss", task_loss), ("moe/aux_loss", aux), ("moe/z_loss", z)]
    for i, layer in enumerate(layers):
        expected += [
            (f"moe/layer{i}/expert{j}_token_share", share) for j, share in enumerate(layer.tokens_per_expert.unbind())
        ]  # device tensors: Lightning reads them only when it writes the logs (no host sync in the step)
        expected.append((f"moe/layer{i}/dropped_tokens", layer.dropped_assignments.float()))
    assert [name for name, _ in logged] == [name for name, _ in expected]
    for (name, got), (_, want) in zip(logged, expected, strict=True):
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(want)), name
        assert type(got) is type(want), name  # tensors stay tensors, floats stay floats


def test_attended_fraction_is_the_mean_over_the_sparse_attention_layers():
    """``models.attended_fraction`` against a hand count: a causal LM with a local window of 2 attends
    7 of the 16 (query, key) pairs of a 4-token row in every layer (the diagonal and the one before,
    minus the first row's missing neighbour); the task's result keeps it rounded to 4 places.
    Dense attention, or no forward yet: None, and no entry in the result."""
    local = build_model(
        {
            "family": "decoder_lm",
            "vocab_size": 20,
            "d_model": 32,
            "n_layers": 2,
            "n_heads": 2,
            "attention_pattern": "local",
            "attention_window": 2,
        }
    )
    assert attended_fraction(local) is None
    local(torch.randint(0, 20, (2, 4)))
    per_layer = [m.attended_fraction for m in local.modules() if isinstance(m, MultiHeadAttention)]
    assert per_layer == [7 / 16, 7 / 16]
    assert attended_fraction(local) == 7 / 16

    dense = build_model({"family": "decoder_lm", "vocab_size": 20, "d_model": 32, "n_layers": 1, "n_heads": 2})
    dense(torch.randint(0, 20, (2, 4)))
    assert attended_fraction(dense) is None
    _, module, (images, _) = build({**TINY_VIT, "model.attention_pattern": "local", "model.attention_window": 3})
    assert module.result_extras() == {}
    module.model(images)
    assert module.result_extras() == {"attended_fraction": round(attended_fraction(module.model), 4)}


def test_extrapolating_pos_encodings_are_those_defined_beyond_the_training_length():
    assert extrapolating_pos_encodings() == ["alibi", "nope", "relative", "rope", "sinusoidal"]
    assert set(POSITIONAL.names()) - set(extrapolating_pos_encodings()) == {"learned", "sincos2d"}


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.n_experts": 2, "model.moe_top_k": 3}, "moe_top_k=3 exceeds n_experts=2"),
        ({"model.ffn": "swiglu2"}, "unknown feed-forward 'swiglu2'"),
    ],
)
def test_bad_moe_or_ffn_config_names_the_key(overrides, message):
    from blockbench.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        build_run_config({}, overrides)


LONG_CONTEXT_LM = {
    "task": "lm",
    "task.seq_len": 16,
    "task.eval_seq_len": 48,
    "task.n_train_tokens": 4000,
    "task.n_val_tokens": 2000,
    "task.n_probes": 8,
    "model.d_model": 32,
    "model.n_layers": 1,
    "model.n_heads": 2,
    "model.d_ff": 64,
    "trainer.max_steps": 3,
    "trainer.batch_size": 8,
    "trainer.val_every_n_steps": 3,
    "optimizer.lr": 1e-2,
    "optimizer.warmup_steps": 1,
    "trainer.peak_tflops": 1.0,
    "trainer.checkpoint_every_n_steps": None,
}


class LMValidationSpy(L.Callback):
    """Keeps the widths of the training rows, the shapes of the last validation's batches of the LM
    stream (dataloader 0), the module and the datamodule."""

    def __init__(self):
        self.train_widths: set[int] = set()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.train_widths.add(batch[0].shape[1])

    def on_validation_epoch_start(self, trainer, pl_module):
        self.row_shapes: list[tuple[int, ...]] = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if dataloader_idx == 0:
            self.row_shapes.append(tuple(batch[0].shape))

    def on_fit_end(self, trainer, pl_module):
        self.module, self.datamodule = pl_module, trainer.datamodule


def mean_next_token_loss(model: torch.nn.Module, stream: np.ndarray, length: int) -> torch.Tensor:
    """Brute force: the stream cut into rows of ``length`` inputs plus one target, one plain forward
    pass, F.cross_entropy over every target token."""
    n_rows = len(stream) // (length + 1)
    rows = torch.from_numpy(stream[: n_rows * (length + 1)].astype(np.int64)).view(n_rows, length + 1)
    with torch.no_grad():
        logits = model.eval()(rows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).double(), rows[:, 1:].flatten())


@pytest.mark.parametrize("pos", ["rope", "alibi", "sinusoidal", "nope", "relative"])
def test_lm_validates_at_a_longer_context_when_the_encoding_extrapolates(tmp_path, pos):
    """With task.eval_seq_len = 3 x task.seq_len, validation feeds rows of eval_seq_len + 1 tokens
    and the logged val/loss is the mean next-token cross-entropy of the trained model over the
    validation stream cut at eval_seq_len (brute force below), val/perplexity its exp; the same
    model scored at the training length gives another number, so the comparison tells them apart."""
    run = build_run_config({}, {**LONG_CONTEXT_LM, "model.pos_encoding": pos})
    spy = LMValidationSpy()
    result = train(
        run, tmp_path / "out", tb_dir=tmp_path / "tb", tb_name=pos, tb_version="0", extra_callbacks=[spy]
    ).to_json()
    assert result["status"] == "ok"

    stream, eval_len = spy.datamodule.corpus.val, LONG_CONTEXT_LM["task.eval_seq_len"]
    n_rows = len(stream) // (eval_len + 1)
    assert spy.train_widths == {LONG_CONTEXT_LM["task.seq_len"] + 1}
    assert {shape[1] for shape in spy.row_shapes} == {eval_len + 1}  # 49 tokens: three training contexts
    assert sum(shape[0] for shape in spy.row_shapes) == n_rows  # every row of the stream, once

    expected = mean_next_token_loss(spy.module.model, stream, eval_len).item()
    logged = {name: scalars(tmp_path / "tb" / pos / "0", run_tag(f"val/{name}"))[-1] for name in ("loss", "perplexity")}
    for metrics in (result["metrics"], result["history"][-1]["metrics"], logged):
        assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
        assert metrics["perplexity"] == pytest.approx(math.exp(expected), rel=1e-5)
    at_training_length = mean_next_token_loss(spy.module.model, stream, LONG_CONTEXT_LM["task.seq_len"]).item()
    assert abs(at_training_length - expected) > 1e-4 * expected  # 10x the tolerance above


def test_lm_rejects_a_longer_validation_context_for_learned_positions():
    from blockbench.config import ConfigError

    with pytest.raises(ConfigError, match=r"model\.pos_encoding=learned cannot extrapolate"):
        build_run_config({}, {**LONG_CONTEXT_LM, "model.pos_encoding": "learned"})
