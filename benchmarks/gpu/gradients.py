"""The GPU check's gradient section: the gradients of every positional variant of a small decoder LM
(``build_model``, as every cell builds it) with PyTorch's SDPA kernel choice against the math backend
(``sdpa_kernel(SDPBackend.MATH)``), in fp32 and under bf16 autocast, with the kernels each run called.
Works on a CPU too (with its own kernels)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from dataclasses import dataclass

from benchmarks.parity.implementations import Dims, lm_fields

#: the positional variants whose gradients are checked, and the small shape they are checked at
POSITIONAL_VARIANTS = ("learned", "sinusoidal", "rope", "alibi", "relative", "nope")
GRADIENT_DIMS = Dims(d_model=256, n_layers=2, n_heads=4, d_ff=1024, batch=4, vocab=512, seq_len=256)
#: the largest gradient difference, relative to the parameter's largest gradient, that still agrees
GRADIENT_TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}


@dataclass(frozen=True)
class GradientCheck:
    """One variant in one dtype: the gradients with PyTorch's SDPA choice against the math backend."""

    variant: str
    dtype: str
    kernels: str  # the SDPA kernels the default run called
    max_abs_diff: float  # over every parameter's gradient
    worst_parameter: str  # the parameter with the largest difference relative to its largest gradient
    worst_relative: float
    positional: dict[str, tuple[float, float]]  # the encoding's own parameters: (max abs diff, relative)
    missing: tuple[str, ...]  # parameters with a gradient in one run and none in the other

    @property
    def agrees(self) -> bool:
        return not self.missing and self.worst_relative <= GRADIENT_TOLERANCE[self.dtype]


#: SDPA's kernels by aten name, the most specific first
SDPA_KERNELS = (
    ("_scaled_dot_product_flash_attention_for_cpu", "flash (CPU)"),
    ("_scaled_dot_product_flash_attention", "flash"),
    ("_scaled_dot_product_efficient_attention", "memory-efficient"),
    ("_scaled_dot_product_cudnn_attention", "cuDNN"),
    ("_scaled_dot_product_fused_attention_overrideable", "fused (other)"),
)


def kernel_names(ops: set[str]) -> str:
    """The SDPA kernels among the aten ops a run called; "math" where none of them ran (the math
    backend decomposes into matmuls and softmax)."""
    found = []
    for op, label in SDPA_KERNELS:
        if any(name == op for name in ops):
            found.append(label)
    return ", ".join(found) or "math"


def positional_gradients(
    device: str,
    dims: Dims = GRADIENT_DIMS,
    dtypes: Iterable[str] = ("fp32", "bf16"),
    seed: int = 0,
    variants: Iterable[str] = POSITIONAL_VARIANTS,
) -> list[GradientCheck]:
    """For every positional variant of ``variants``: a decoder LM at ``dims`` (``build_model``, as every
    cell builds it) and one batch; the gradients of every parameter from one forward and backward of the
    LM loss (``tasks.lm.next_token_loss``) as PyTorch picks the SDPA kernel, and under
    ``sdpa_kernel(SDPBackend.MATH)``. bf16 runs under autocast; fp32 matmuls at the highest precision
    (no TF32, which would blur the comparison). Works on a CPU too (with its own kernels)."""
    import torch

    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        return [check for variant in variants for check in _variant_gradients(variant, device, dims, dtypes, seed)]
    finally:
        torch.set_float32_matmul_precision(saved)


def _aten_ops_mode():
    """A dispatch mode that records the names of the aten ops called inside it: which SDPA kernel ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class AtenOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    return AtenOps()


def _variant_gradients(variant: str, device: str, dims: Dims, dtypes: Iterable[str], seed: int) -> list[GradientCheck]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from blockbench.models import ModelConfig, build_model
    from blockbench.models.position import PositionalEncoding
    from blockbench.tasks.lm import next_token_loss

    torch.manual_seed(seed)
    model = build_model(ModelConfig(**lm_fields(dims, pos_encoding=variant))).to(device)
    model.train()
    positional = {  # the encoding's own parameters: a learned table, the T5 bias table
        f"{name}.{p_name}" if name else p_name
        for name, module in model.named_modules()
        if isinstance(module, PositionalEncoding)
        for p_name, _ in module.named_parameters()
    }
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, dims.vocab, (dims.batch, dims.seq_len + 1), generator=generator).to(device)

    def gradients(backend, dtype: str) -> tuple[dict[str, torch.Tensor], set[str]]:
        model.zero_grad(set_to_none=True)
        ops = _aten_ops_mode()
        autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == "bf16")
        with backend, autocast, ops:
            loss = next_token_loss(model, rows)
        with ops:
            loss.backward()
        grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
        return grads, ops.names

    checks = []
    for dtype in dtypes:
        default, ops = gradients(contextlib.nullcontext(), dtype)
        reference, _ = gradients(sdpa_kernel(SDPBackend.MATH), dtype)
        diffs = {}
        for name in set(default) & set(reference):
            diff = (default[name] - reference[name]).abs().max().item()
            scale = reference[name].abs().max().item()
            diffs[name] = (diff, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
        worst = max(diffs, key=lambda n: diffs[n][1])
        checks.append(
            GradientCheck(
                variant=variant,
                dtype=dtype,
                kernels=kernel_names(ops),
                max_abs_diff=max(d for d, _ in diffs.values()),
                worst_parameter=worst,
                worst_relative=diffs[worst][1],
                positional={name: diffs[name] for name in sorted(positional) if name in diffs},
                missing=tuple(sorted(set(default) ^ set(reference))),
            )
        )
    return checks


def gradient_lines(checks: list[GradientCheck], device: str, dims: Dims) -> list[str]:
    lines = [
        f"A decoder LM (d {dims.d_model}, {dims.n_layers} layers, {dims.n_heads} heads, context {dims.seq_len}, "
        f"vocab {dims.vocab}, batch {dims.batch}) per positional variant on {device}, built by `build_model`; "
        "the gradients of every parameter from the LM loss with the SDPA kernel PyTorch picks, against "
        "`sdpa_kernel(SDPBackend.MATH)`. Relative = max |difference| / max |math gradient| of a parameter; "
        f"agreement: relative <= {GRADIENT_TOLERANCE['fp32']:g} in fp32, <= {GRADIENT_TOLERANCE['bf16']:g} under "
        "bf16 autocast (the math backend rounds too), and the same parameters have gradients.",
        "",
        "| variant | dtype | SDPA kernel (default) | max abs diff, all parameters | worst parameter (relative) | "
        "positional parameters: max abs diff (relative) | agrees |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        positional = "; ".join(f"`{n}` {d:.2e} ({r:.1e})" for n, (d, r) in c.positional.items()) or "none"
        verdict = (
            "yes"
            if c.agrees
            else "**NO**" + (f": no gradient in one run for {', '.join(c.missing)}" if c.missing else "")
        )
        lines.append(
            f"| {c.variant} | {c.dtype} | {c.kernels} | {c.max_abs_diff:.2e} | `{c.worst_parameter}` "
            f"({c.worst_relative:.1e}) | {positional} | {verdict} |"
        )
    return lines
