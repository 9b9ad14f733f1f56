"""Task modules: the training loss each task optimizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blockbench.config import build_run_config
from models.moe import MoEFeedForward

TINY_VIT = {
    "task": "vit", "task.n_train": 16, "task.n_val": 8,
    "model.d_model": 32, "model.n_layers": 2, "model.n_heads": 2,
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
    _, module, (images, labels) = build({**TINY_VIT, "model.n_experts": 4, "model.moe_top_k": 1,
                                           "model.moe_aux_loss_weight": 0.5, "model.moe_z_loss_weight": 0.25})
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


@pytest.mark.parametrize("overrides, message", [
    ({"model.n_experts": 2, "model.moe_top_k": 3}, "moe_top_k=3 exceeds n_experts=2"),
    ({"model.ffn": "swiglu2"}, "unknown feed-forward 'swiglu2'"),
])
def test_bad_moe_or_ffn_config_names_the_key(overrides, message):
    from blockbench.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        build_run_config({}, overrides)


def test_lm_validates_at_a_longer_context_when_the_encoding_extrapolates():
    overrides = {"task": "lm", "task.seq_len": 16, "task.eval_seq_len": 48, "task.n_train_tokens": 4000,
                 "task.n_val_tokens": 2000, "task.n_probes": 8, "model.d_model": 32, "model.n_layers": 1,
                 "model.n_heads": 2, "model.pos_encoding": "alibi"}
    datamodule, module, (train_rows,) = build(overrides)
    assert train_rows.shape[1] == 17
    val_rows = next(iter(datamodule.val_dataloader()[0]))[0]
    assert val_rows.shape[1] == 49  # three times the training context
    module.validation_step((val_rows,), 0, dataloader_idx=0)
    assert torch.isfinite(module.val_loss.compute())

    from blockbench.config import ConfigError

    with pytest.raises(ConfigError, match="model.pos_encoding=learned cannot extrapolate"):
        build_run_config({}, {**overrides, "model.pos_encoding": "learned"})
