"""Cross-entropy over a vocabulary computed together with the output projection.

``linear_cross_entropy(hidden, weight, targets)`` equals
``F.cross_entropy(F.linear(hidden, weight), targets)`` (with ``ignore_index``, ``label_smoothing``
and ``reduction`` as there). Training on a CPU never holds the (tokens x vocabulary) logits: it walks
over chunks of tokens, and for each computes the logits, the loss and at once the gradients of the
loss with respect to the chunk's hidden states and the weight, which backward then only scales.
This is the fused linear cross-entropy of Liger-Kernel (Hsu et al. 2024) and of Apple's
Cut Cross-Entropy (Wijmans et al. 2024) in plain PyTorch: the same FLOPs as logits + cross-entropy,
without the memory passes over the logits that ``log_softmax``, its backward and the one-hot
``nll_loss`` gradient make (the largest non-matmul cost of a small-model LM step on a CPU), and
without keeping the logits for backward.

With gradients off (validation) or when the result must be differentiated twice, it takes the
plain path. Under ``torch.autocast`` the matmuls run in the autocast dtype and the softmax in
float32, as autocast runs ``F.linear`` and ``F.cross_entropy``.

On a CUDA GPU training takes the plain path too, ``F.cross_entropy(F.linear(...))`` with ordinary
autograd, wherever its logits fit (:func:`loss_path`): there the memory passes that the chunks save
cost little next to the chunks' own overhead (at 16k tokens x 50k vocabulary in bf16 on an H200 the
plain loss takes 12 ms forward and backward, the chunked one 21 ms), and a compiled model
(``model.compile: true``) fuses the plain loss with the projection. Only logits too large for the
free memory go through the chunks. A CPU always takes the chunked path in training.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

#: tokens per chunk: 1024 x vocabulary 32k float32 logits = 128 MiB at most at a time
DEFAULT_CHUNK_TOKENS = 1024
#: the share of a GPU's free memory that the plain loss's logits may take (the rest stays for the
#: backward pass through the model)
PLAIN_LOSS_MEMORY_SHARE = 0.5
#: where the plain path runs in training: on these device types only (a CPU gains from the chunks)
PLAIN_LOSS_DEVICES = ("cuda",)


def plain_loss_bytes(n_tokens: int, vocab: int, dtype: torch.dtype) -> int:
    """The memory the plain loss holds at its peak for ``n_tokens`` x ``vocab`` logits computed in
    ``dtype``: the logits and their gradient in ``dtype``, and in the softmax's dtype (float32 at
    least) the log-softmax kept for backward and its gradient."""
    softmax_dtype = torch.promote_types(dtype, torch.float32)
    return n_tokens * vocab * 2 * (dtype.itemsize + softmax_dtype.itemsize)


def loss_path(
    device_type: str, n_tokens: int, vocab: int, dtype: torch.dtype, free_bytes: int | None
) -> Literal["plain", "chunked"]:
    """Which path a training loss takes: ``plain`` (``F.cross_entropy(F.linear(...))``) on a device of
    :data:`PLAIN_LOSS_DEVICES` where :func:`plain_loss_bytes` fit in :data:`PLAIN_LOSS_MEMORY_SHARE` of
    its ``free_bytes``, else ``chunked`` (always on a CPU). Pure: the caller reads the free memory."""
    if device_type not in PLAIN_LOSS_DEVICES or free_bytes is None:
        return "chunked"
    fits = plain_loss_bytes(n_tokens, vocab, dtype) <= PLAIN_LOSS_MEMORY_SHARE * free_bytes
    return "plain" if fits else "chunked"


@torch.compiler.assume_constant_result
def _free_bytes(device: torch.device) -> int:
    """What the caching allocator could still give on ``device``: the device's free memory and the blocks
    it has reserved but not handed out. A constant to ``torch.compile``: a compiled loss decides its path
    once, when it is traced (its shapes are fixed), and a recompile for new shapes reads it again."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def _training_path(hidden: torch.Tensor, weight: torch.Tensor, n_tokens: int) -> Literal["plain", "chunked"]:
    """:func:`loss_path` for this call (the free memory is read only on a device that may go plain)."""
    device_type = hidden.device.type
    autocast = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if autocast else hidden.dtype
    free = _free_bytes(hidden.device) if device_type in PLAIN_LOSS_DEVICES else None
    return loss_path(device_type, n_tokens, weight.shape[0], dtype, free)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    chunked: bool | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T`` (``hidden`` (..., D), ``weight`` (V, D), ``targets`` (...)).
    ``chunked``: the path in training, None (the models') to let :func:`loss_path` decide, True for the
    chunks on any device (a benchmark of them), False for the plain path."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    training = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad) and len(targets)
    if training and chunked is None:
        chunked = _training_path(hidden, weight, len(targets)) == "chunked"
    if training and chunked:
        return _FusedLinearCrossEntropy.apply(
            hidden, weight, targets, ignore_index, label_smoothing, reduction, chunk_tokens
        )
    return F.cross_entropy(
        F.linear(hidden, weight),
        targets,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
    )


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Loss in forward, with its gradients for ``hidden`` and ``weight``; backward scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, label_smoothing, reduction, chunk_tokens):
        device_type = hidden.device.type
        # the matmuls in the autocast dtype, if autocast is on (as it runs F.linear), cast once here
        autocast = torch.is_autocast_enabled(device_type)
        compute_dtype = torch.get_autocast_dtype(device_type) if autocast else hidden.dtype
        with torch.autocast(device_type, enabled=False):
            loss, grad_hidden, grad_weight = _loss_and_gradients(
                hidden,
                weight.to(compute_dtype),
                targets,
                ignore_index,
                label_smoothing,
                reduction,
                chunk_tokens,
                hidden_grad=hidden.requires_grad,
                weight_grad=weight.requires_grad,
                compute_dtype=compute_dtype,
            )
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (
            None if grad_hidden is None else grad_hidden * grad_output.to(grad_hidden.dtype),
            None if grad_weight is None else (grad_weight * grad_output).to(ctx.weight_dtype),
            None,
            None,
            None,
            None,
            None,
        )


def _loss_and_gradients(
    hidden,
    weight,
    targets,
    ignore_index,
    label_smoothing,
    reduction,
    chunk_tokens,
    *,
    hidden_grad,
    weight_grad,
    compute_dtype,
):
    """The loss and, chunk by chunk of tokens, its gradients for ``hidden`` and ``weight``."""
    n_tokens, vocab = hidden.shape[0], weight.shape[0]
    counted = targets != ignore_index
    softmax_dtype = torch.promote_types(compute_dtype, torch.float32)  # the softmax never below float32
    # mean: F.cross_entropy divides by the tokens not ignored (NaN if there are none)
    scale = (
        (1.0 / counted.sum().to(softmax_dtype))
        if reduction == "mean"
        else torch.ones((), dtype=softmax_dtype, device=hidden.device)
    )
    grad_hidden = torch.empty_like(hidden) if hidden_grad else None
    grad_weight = torch.zeros(weight.shape, dtype=softmax_dtype, device=weight.device) if weight_grad else None
    total = torch.zeros((), dtype=softmax_dtype, device=hidden.device)
    for start in range(0, n_tokens, chunk_tokens):
        h = hidden[start : start + chunk_tokens].to(compute_dtype)
        keep = counted[start : start + chunk_tokens]
        target = targets[start : start + chunk_tokens].masked_fill(~keep, 0)
        rows = torch.arange(len(target), device=target.device)
        logits = (h @ weight.t()).to(softmax_dtype)  # (chunk, V)
        # loss = log Z - (1 - eps) * z_target - eps * mean(z), with log Z = log sum exp(z - max) + max
        target_logit = logits[rows, target]
        mean_logit = logits.mean(dim=-1) if label_smoothing else None
        max_logit = logits.amax(dim=-1, keepdim=True)
        exp = logits.sub_(max_logit).exp_()  # in place: the chunk's logits are not needed again
        sum_exp = exp.sum(dim=-1, keepdim=True)
        log_z = (sum_exp.log() + max_logit).squeeze(1)
        losses = log_z - (1 - label_smoothing) * target_logit
        if label_smoothing:
            losses -= label_smoothing * mean_logit
        total += losses.masked_fill(~keep, 0).sum()
        # d loss / d logits = (softmax - (1 - eps) * onehot - eps / V) * row weight (0 for ignored tokens)
        row_weight = keep * scale
        grad_logits = exp.mul_(row_weight[:, None] / sum_exp)
        grad_logits[rows, target] -= (1 - label_smoothing) * row_weight
        if label_smoothing:
            grad_logits -= (label_smoothing / vocab) * row_weight[:, None]
        grad_logits = grad_logits.to(compute_dtype)
        if grad_hidden is not None:
            grad_hidden[start : start + chunk_tokens] = grad_logits @ weight
        if grad_weight is not None:
            grad_weight += grad_logits.t() @ h
    return total * scale, grad_hidden, grad_weight
