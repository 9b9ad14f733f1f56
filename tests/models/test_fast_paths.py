"""The fast paths give the same results as the plain ones: the fused linear cross-entropy, the
fused optimizer, bf16 autocast and torch.compile."""

from __future__ import annotations

import functools
import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_LM_TASK, TINY_MODEL, tiny

from blockbench.cell.train import train
from blockbench.config import build_run_config
from blockbench.models import ModelConfig, build_model
from blockbench.models import loss as loss_module
from blockbench.models.attention import CPU_MATH_MAX_KEYS, MultiHeadAttention, sdpa_backends
from blockbench.models.loss import _FusedLinearCrossEntropy, linear_cross_entropy, loss_path, plain_loss_bytes
from blockbench.tasks import OptimizerConfig
from blockbench.tasks.lm import LMTask, next_token_loss
from blockbench.tasks.translation import teacher_forcing_loss
from blockbench.tasks.vision import VisionTask

TINY_TASKS = {
    "lm": TINY_LM_TASK,
    "translation": {"name": "translation", "n_train": 500, "n_val": 16},
    "vit": {"name": "vit", "n_train": 256, "n_val": 32},
}
# a configured peak skips the peak FLOP/s probe (a 512^2 matmul, emulated and slow in bf16 on AVX2)
TINY_TRAINER = {
    "trainer.max_steps": 4,
    "trainer.batch_size": 8,
    "trainer.val_every_n_steps": 4,
    "trainer.log_every_n_steps": 1,
    "optimizer.warmup_steps": 1,
    "trainer.peak_tflops": 1.0,
    "trainer.checkpoint_every_n_steps": None,
}


def reference_loss(hidden, weight, targets, **kwargs):
    return F.cross_entropy(F.linear(hidden, weight), targets, **kwargs)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_linear_cross_entropy_equals_logits_then_cross_entropy(reduction, label_smoothing):
    """Loss and both gradients equal F.cross_entropy(F.linear(...)) in float64 (to rounding), with
    ignored targets, label smoothing, a chunk size that does not divide the tokens, and an upstream
    gradient that is not 1."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 150, 16, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, generator=generator, requires_grad=True)
    targets = torch.randint(0, 50, (2, 150), generator=generator)
    targets[:, ::7] = -100
    kwargs = dict(label_smoothing=label_smoothing, reduction=reduction)

    expected = reference_loss(hidden.flatten(0, 1), weight, targets.flatten(), **kwargs)
    expected_grads = torch.autograd.grad(expected * 2.5, (hidden, weight))
    loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=64, **kwargs)
    grads = torch.autograd.grad(loss * 2.5, (hidden, weight))

    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


def test_linear_cross_entropy_under_bf16_autocast_matches_autocast_reference():
    """Under autocast the matmuls run in bf16 and the softmax in float32, as autocast runs
    F.linear and F.cross_entropy: results agree with the float64 truth to bf16 precision, like the
    reference path's own, and the gradients come back in the parameters' dtype."""
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(300, 32, generator=generator, requires_grad=True)
    weight = (torch.randn(64, 32, generator=generator) * 0.3).requires_grad_()
    targets = torch.randint(0, 64, (300,), generator=generator)
    truth = reference_loss(hidden.double(), weight.double(), targets)
    truth_grads = torch.autograd.grad(truth, (hidden, weight))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = reference_loss(hidden, weight, targets)
        loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=128)
    reference_grads = torch.autograd.grad(reference, (hidden, weight))
    grads = torch.autograd.grad(loss, (hidden, weight))
    assert loss.dtype == torch.float32 and [g.dtype for g in grads] == [torch.float32, torch.float32]
    for ours, theirs, true in [(loss, reference, truth), *zip(grads, reference_grads, truth_grads, strict=True)]:
        ours_error = (ours.double() - true).abs().max()
        reference_error = (theirs.double() - true).abs().max()
        assert ours_error <= 2 * reference_error + 1e-6


def test_linear_cross_entropy_without_gradients_and_with_nothing_to_count():
    generator = torch.Generator().manual_seed(2)
    hidden, weight = torch.randn(10, 8, generator=generator), torch.randn(12, 8, generator=generator)
    targets = torch.randint(0, 12, (10,), generator=generator)
    with torch.no_grad():
        torch.testing.assert_close(
            linear_cross_entropy(hidden, weight, targets), reference_loss(hidden, weight, targets)
        )
    all_ignored = torch.full((10,), -100)
    assert linear_cross_entropy(hidden.requires_grad_(), weight, all_ignored).isnan()  # as F.cross_entropy: 0 / 0
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(hidden, weight, targets, reduction="none")


MiB = 2**20


def test_the_loss_takes_the_plain_path_on_a_gpu_where_its_logits_fit_and_the_chunks_elsewhere():
    """The rule by hand: 1024 tokens x vocabulary 1024 in bf16 hold 1 Mi x 2 x (2 + 4) bytes = 12 MiB at
    their peak (the logits and their gradient in bf16, the float32 log-softmax and its gradient), in
    float32 16 MiB; plain on CUDA where that is at most half the free memory. A CPU (and mps) always
    takes the chunks, however much memory is free."""
    assert plain_loss_bytes(1024, 1024, torch.bfloat16) == 12 * MiB
    assert plain_loss_bytes(1024, 1024, torch.float32) == 16 * MiB
    assert plain_loss_bytes(1024, 1024, torch.float64) == 32 * MiB
    assert loss_path("cuda", 1024, 1024, torch.bfloat16, free_bytes=24 * MiB) == "plain"
    assert loss_path("cuda", 1024, 1024, torch.bfloat16, free_bytes=24 * MiB - 1) == "chunked"
    assert loss_path("cuda", 1024, 1024, torch.float32, free_bytes=24 * MiB) == "chunked"
    # the measured GPU case: 16k tokens x 50k vocabulary in bf16 (9.2 GiB) on an H200's ~139 GiB
    assert loss_path("cuda", 16368, 50304, torch.bfloat16, free_bytes=139 * 2**30) == "plain"
    assert loss_path("cuda", 16368, 50304, torch.bfloat16, free_bytes=16 * 2**30) == "chunked"
    assert loss_path("cuda", 1024, 1024, torch.bfloat16, free_bytes=None) == "chunked"
    for device in ("cpu", "mps"):
        assert loss_path(device, 1024, 1024, torch.bfloat16, free_bytes=2**50) == "chunked"


class FusedSpy:
    """Counts the calls of the chunked loss (``_FusedLinearCrossEntropy.apply``), which it still runs."""

    def __init__(self, monkeypatch):
        self.calls = 0
        apply = _FusedLinearCrossEntropy.apply

        def counted(*args):
            self.calls += 1
            return apply(*args)

        monkeypatch.setattr(_FusedLinearCrossEntropy, "apply", counted)


def fake_gpu_memory(monkeypatch, free_bytes: int) -> None:
    """Let a CPU take the GPU's rule, with ``free_bytes`` free."""
    monkeypatch.setattr(loss_module, "PLAIN_LOSS_DEVICES", ("cpu",))
    monkeypatch.setattr(loss_module, "_free_bytes", lambda device: free_bytes)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"ignore_index": 3}, {"label_smoothing": 0.1, "reduction": "sum"}, {"ignore_index": 3, "reduction": "sum"}],
)
def test_the_plain_path_is_cross_entropy_of_the_projection_and_too_little_memory_takes_the_chunks(monkeypatch, kwargs):
    """Where the rule says plain (the GPU's rule, faked on a CPU with memory to spare), the loss and
    both gradients are exactly those of F.cross_entropy(F.linear(...)), with ``ignore_index``,
    ``label_smoothing`` and ``reduction`` passed on; with too little memory (or ``chunked=True``) it
    takes the chunks."""
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 40, 16, generator=generator, requires_grad=True)
    weight = torch.randn(50, 16, generator=generator, requires_grad=True)
    targets = torch.randint(0, 50, (2, 40), generator=generator)
    targets[:, ::5] = 3
    expected = reference_loss(hidden.flatten(0, 1), weight, targets.flatten(), **kwargs)
    expected_grads = torch.autograd.grad(expected * 1.5, (hidden, weight))
    spy = FusedSpy(monkeypatch)

    fake_gpu_memory(monkeypatch, free_bytes=2**40)
    loss = linear_cross_entropy(hidden, weight, targets, **kwargs)
    grads = torch.autograd.grad(loss * 1.5, (hidden, weight))
    assert spy.calls == 0
    assert torch.equal(loss, expected)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert torch.equal(grad, expected_grad)

    forced = linear_cross_entropy(hidden, weight, targets, chunked=True, **kwargs)  # a benchmark of the chunks
    assert spy.calls == 1
    torch.testing.assert_close(forced, expected)
    fake_gpu_memory(monkeypatch, free_bytes=2 * plain_loss_bytes(80, 50, torch.float32) - 1)
    chunked = linear_cross_entropy(hidden, weight, targets, **kwargs)
    assert spy.calls == 2
    torch.testing.assert_close(chunked, expected)


def test_training_on_a_cpu_takes_the_chunked_loss_and_validation_the_plain_one(monkeypatch):
    """Every family's training loss with gradients on a CPU goes through the chunks (the CPU numbers of
    the committed cells), and without gradients through F.cross_entropy."""
    spy = FusedSpy(monkeypatch)
    lm, translator = seeded_tiny_model("decoder_lm"), seeded_tiny_model("encoder_decoder")
    rows = torch.randint(1, 40, (3, 9), generator=torch.Generator().manual_seed(0))
    next_token_loss(lm, rows).backward()
    teacher_forcing_loss(translator, rows, rows, pad_id=0, label_smoothing=0.1).backward()
    assert spy.calls == 2
    with torch.no_grad():
        next_token_loss(lm, rows)
    assert spy.calls == 2


def seeded_tiny_model(family: str, **fields) -> torch.nn.Module:
    """The tiny ``family`` model (vocabulary 40, 16 positions) of seed 0 in float64, in training mode."""
    torch.manual_seed(0)
    return build_model(tiny(family, vocab_size=40, max_seq_len=16, **fields)).double()


def assert_same_loss_and_gradients(model: torch.nn.Module, loss: torch.Tensor, expected: torch.Tensor) -> None:
    """``loss`` equals ``expected``, and so does its gradient with respect to every parameter of ``model``."""
    parameters = list(model.parameters())
    torch.testing.assert_close(loss, expected)
    for grad, expected_grad in zip(
        torch.autograd.grad(loss, parameters), torch.autograd.grad(expected, parameters), strict=True
    ):
        torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("fields", [{}, {"tie_embeddings": False, "norm": "rmsnorm", "pos_encoding": "rope"}])
def test_lm_loss_equals_cross_entropy_of_its_logits(fields):
    model = seeded_tiny_model("decoder_lm", **fields)
    rows = torch.randint(0, 40, (3, 13), generator=torch.Generator().manual_seed(0))
    expected = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
    assert_same_loss_and_gradients(model, next_token_loss(model, rows), expected)


def test_translation_loss_equals_cross_entropy_of_its_logits():
    model = seeded_tiny_model("encoder_decoder")
    generator = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(1, 40, (3, 9), generator=generator), torch.randint(1, 40, (3, 8), generator=generator)
    src[0, -3:] = 0  # padding
    tgt[1, -2:] = 0
    logits = model(src, tgt[:, :-1], src_padding_mask=src == 0)
    expected = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0, label_smoothing=0.1)
    assert_same_loss_and_gradients(
        model, teacher_forcing_loss(model, src, tgt, pad_id=0, label_smoothing=0.1), expected
    )


def test_tasks_train_with_the_fused_adamw_kernel():
    run = build_run_config({"model": TINY_MODEL, "task": TINY_TASKS["lm"]})
    module, _ = run.task.build(run.resolved_model(), run.optimizer, max_steps=4, batch_size=8)
    optimizer = module.configure_optimizers()["optimizer"]
    assert optimizer.defaults["fused"] is True


#: bf16 keeps 8 significant bits (7 stored and the implicit one): its unit roundoff is 2^-8
BF16_UNIT_ROUNDOFF = 2.0**-8
#: the argmax metrics and the number of items each counts in TINY_TASKS
COUNTED_METRICS = {
    "accuracy": TINY_TASKS["vit"]["n_val"],
    "agreement_acc": TINY_TASKS["lm"]["n_probes"],
    "exact_match": TINY_TASKS["translation"]["n_val"],
}


class PrecisionSpy(L.Callback):
    """Records every training step's loss, and the (output dtype, weight dtype) of each call of the
    model's matmul layers (Linear, Conv2d) in training and validation."""

    def __init__(self):
        self.losses: list[torch.Tensor] = []
        self.matmul_dtypes: set[tuple[torch.dtype, torch.dtype]] = set()
        self._handles = []

    def on_train_start(self, trainer, pl_module):
        def record(module, args, output):
            self.matmul_dtypes.add((output.dtype, module.weight.dtype))

        layers = [m for m in pl_module.model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
        self._handles = [layer.register_forward_hook(record) for layer in layers]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].detach().clone())

    def on_fit_end(self, trainer, pl_module):
        for handle in self._handles:
            handle.remove()


def train_tiny(tmp_path, task: str, precision: str) -> tuple[dict, PrecisionSpy]:
    """Four steps of ``task`` at ``precision`` (lr 1e-2, so that the four losses move apart)."""
    overrides = {**TINY_TRAINER, "optimizer.lr": 1e-2, "trainer.precision": precision}
    spy = PrecisionSpy()
    result = train(
        build_run_config({"model": TINY_MODEL, "task": TINY_TASKS[task]}, overrides),
        tmp_path / precision,
        tb_dir=tmp_path / "tb",
        tb_name=task,
        tb_version=precision,
        extra_callbacks=[spy],
    ).to_json()
    assert result["status"] == "ok" and result["precision"] == precision
    return result, spy


@pytest.mark.parametrize("task", list(TINY_TASKS))
def test_bf16_mixed_precision_trains_like_fp32_to_bf16_rounding(tmp_path, task):
    """``trainer.precision: bf16-mixed`` runs every family under CPU autocast: every matmul layer
    outputs bf16 while the weights stay float32 (master weights) and the loss float32, in training
    and validation. Against the fp32 run of the same config and seed (same init, same batches):
    each step's training loss differs (bf16 really rounds) by at most one bf16 rounding of the loss,
    2^-8 relative, and so do the final validation loss and log-perplexity. The argmax metrics may flip
    a near-tie: at most 2 of their items. (BLEU compares greedy decodes, which one flipped token can
    move by any amount; the loss compares the same translations continuously.)"""
    fp32, fp32_spy = train_tiny(tmp_path, task, "32-true")
    bf16, bf16_spy = train_tiny(tmp_path, task, "bf16-mixed")

    assert fp32_spy.matmul_dtypes == {(torch.float32, torch.float32)}
    assert bf16_spy.matmul_dtypes == {(torch.bfloat16, torch.float32)}
    assert {loss.dtype for loss in bf16_spy.losses} == {torch.float32}

    fp32_losses, bf16_losses = torch.stack(fp32_spy.losses), torch.stack(bf16_spy.losses)
    assert len(fp32_losses) == len(bf16_losses) == TINY_TRAINER["trainer.max_steps"]
    assert bf16_losses[0] != fp32_losses[0]  # the same weights and batch: only the rounding differs
    torch.testing.assert_close(bf16_losses, fp32_losses, rtol=BF16_UNIT_ROUNDOFF, atol=0)

    ours, reference = bf16["metrics"], fp32["metrics"]
    assert ours["loss"] == pytest.approx(reference["loss"], rel=BF16_UNIT_ROUNDOFF)
    if "perplexity" in reference:
        assert math.log(ours["perplexity"]) == pytest.approx(math.log(reference["perplexity"]), rel=BF16_UNIT_ROUNDOFF)
    for name, items in COUNTED_METRICS.items():
        if name in reference:
            assert abs(ours[name] - reference[name]) <= 2 / items + 1e-9, name


def test_compiled_model_trains_like_the_eager_one(tmp_path):
    """``model.compile: true`` runs the model through torch.compile on CPU: same parameter names
    (checkpoints stay interchangeable) and the same losses as eager, to float32 rounding."""
    eager = seeded_tiny_model("decoder_lm").float()
    compiled = seeded_tiny_model("decoder_lm", compile=True).float()
    assert list(compiled.state_dict()) == list(eager.state_dict())
    rows = torch.randint(0, 40, (4, 13), generator=torch.Generator().manual_seed(0))
    losses = []
    for model in (eager, compiled):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        trace = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = next_token_loss(model, rows)
            loss.backward()
            optimizer.step()
            trace.append(loss.item())
        losses.append(trace)
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


@pytest.mark.parametrize("family", ["decoder_lm", "vit"])
def test_a_compiled_model_traces_forward_and_loss_as_one_graph_and_validates_eagerly(monkeypatch, family):
    """``model.compile: true``: a training step's loss, forward and loss together, is one graph (the
    loss's ops in it: on a CPU the chunked loss, for the ViT its cross-entropy); validation (between the
    task's hooks, and the loss curve's ``sample_loss``) compiles nothing, since it runs eagerly, and
    the training graph is reused after it. (A no-gradient call outside validation compiles a graph of
    its own: what validation did.) The graphs are captured by a backend that runs them as traced."""
    torch._dynamo.reset()
    graphs: list[set[str]] = []

    def capture(graph: torch.fx.GraphModule, example_inputs):
        graphs.append({str(node.target) for node in graph.graph.nodes})
        return graph.forward

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=capture))
    generator = torch.Generator().manual_seed(0)
    if family == "vit":
        task = VisionTask(ModelConfig.model_validate(tiny(family, compile=True)), OptimizerConfig(), max_steps=4)
        batch = (torch.randn(4, 3, 8, 8, generator=generator), torch.randint(0, 5, (4,), generator=generator))
        loss_op = "cross_entropy"
    else:
        task = LMTask(ModelConfig.model_validate(tiny(family, compile=True)), OptimizerConfig(), max_steps=4)
        batch = (torch.randint(0, 17, (4, 9), generator=generator),)
        loss_op = "autograd_function_apply"
    task.training_loss(batch).backward()
    assert len(graphs) == 1
    assert loss_op in " ".join(graphs[0]) and "linear" in " ".join(graphs[0])

    task.on_validation_start()
    with torch.no_grad():
        task.validation_step(batch, 0)
    task.on_validation_end()
    task.sample_loss([batch], lambda b: b)
    assert len(graphs) == 1
    task.training_loss(batch).backward()
    assert len(graphs) == 1
    with torch.no_grad():
        task.validation_loss(batch)
    assert len(graphs) == 2


def test_short_half_precision_attention_on_cpu_uses_the_math_backend_and_stays_accurate():
    """bf16 attention over few keys on a CPU takes SDPA's math backend (faster there than the CPU
    flash kernel); its result and gradients agree with the float64 truth to bf16 precision, like
    the flash kernel's."""
    q = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16)
    assert type(sdpa_backends(q, CPU_MATH_MAX_KEYS)).__name__ != "nullcontext"
    assert type(sdpa_backends(q, CPU_MATH_MAX_KEYS + 1)).__name__ == "nullcontext"
    assert type(sdpa_backends(q.float(), 16)).__name__ == "nullcontext"

    torch.manual_seed(0)
    attention = MultiHeadAttention(64, 4, n_kv_heads=2)
    x = torch.randn(3, 65, 64)
    truth_attention = MultiHeadAttention(64, 4, n_kv_heads=2).double()
    truth_attention.load_state_dict(attention.state_dict())
    x64 = x.double().requires_grad_()
    truth = truth_attention(x64, causal=True)
    truth.square().sum().backward()
    x16 = x.bfloat16().requires_grad_()
    out = attention.bfloat16()(x16, causal=True)
    out.float().square().sum().backward()
    torch.testing.assert_close(out.double(), truth.detach(), atol=0.05, rtol=0.05)
    torch.testing.assert_close(x16.grad.double(), x64.grad, atol=0.1, rtol=0.05)
