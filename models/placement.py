"""Where the norm sits around each residual sublayer (``model.norm_placement``).

A placement wraps one sublayer (attention or feed-forward) and owns its norm(s):

- ``pre``:      ``x = x + Sublayer(Norm(x))``; the stack ends with a final norm.
- ``post``:     ``x = Norm(x + Sublayer(x))`` (the original Transformer); no final norm.
- ``sandwich``: ``x = x + Norm2(Sublayer(Norm1(x)))`` (CogView's sandwich-LN); final norm.
- ``deepnorm``: ``x = Norm(alpha * x + Sublayer(x))`` (DeepNet); no final norm. Needs its
  constants from the depth (``stack_constants``) and ``deepnorm_init_`` after initialisation.

API (what the block and the model families use)
-----------------------------------------------
``PLACEMENTS.get(name)`` returns a ``Residual`` subclass ``cls`` with:

- ``cls(sublayer, norm, dim, eps, bias, dropout, *, residual_scale=1.0)``: the wrapper.
  ``residual_scale`` is DeepNorm's ``alpha`` (stored as ``self.residual_scale``); every other
  placement stores it and ignores it. Dropout is applied to the sublayer branch.
- ``cls.final_norm: bool``: whether a stack of these needs a norm after its last block.
- ``cls.stack_constants(architecture, encoder_layers, decoder_layers, stack) -> (alpha, beta)``:
  ``architecture`` is ``"encoder"`` (ViT), ``"decoder"`` (decoder-only LM) or
  ``"encoder_decoder"`` (translator); ``stack`` is ``"encoder"`` or ``"decoder"``. Returns
  ``(1.0, 1.0)`` for every placement except ``deepnorm``. Pass ``alpha`` as ``residual_scale``
  to every wrapper of that stack, and call ``deepnorm_init_(stack_module, beta)`` once the
  stack's weights are initialised (a no-op when ``beta == 1.0``).

Module functions: ``deepnorm_alpha_beta(architecture, encoder_layers, decoder_layers)`` returns
``{stack: (alpha, beta)}`` for the stacks of that architecture, and
``deepnorm_init_(module, beta)`` scales the DeepNet-scaled weights in place.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .norm import build_norm
from .registry import PLACEMENTS

ARCHITECTURES = ("encoder", "decoder", "encoder_decoder")


class Residual(nn.Module):
    """Base class: one residual connection around ``sublayer`` with its norm."""

    #: whether a stack built from this placement needs a norm after its last block
    final_norm: bool = False
    #: whether the GPT-2 init shrink of residual-branch outputs (1/sqrt(2 * layers)) applies
    scaled_residual_init: bool = True

    def __init__(
        self,
        sublayer: nn.Module,
        norm: str,
        dim: int,
        eps: float,
        bias: bool,
        dropout: float,
        *,
        residual_scale: float = 1.0,
    ):
        super().__init__()
        self.sublayer = sublayer
        self.norm = build_norm(norm, dim, eps=eps, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.residual_scale = float(residual_scale)

    @classmethod
    def stack_constants(
        cls, architecture: str, encoder_layers: int, decoder_layers: int, stack: str
    ) -> tuple[float, float]:
        """``(alpha, beta)`` for the wrappers of ``stack``: residual scale and init gain."""
        _check_stack(architecture, stack)
        return 1.0, 1.0

    def extra_repr(self) -> str:
        return f"residual_scale={self.residual_scale:g}" if self.residual_scale != 1.0 else ""


@PLACEMENTS.register("pre", "pre-norm: x + Sublayer(Norm(x)), final norm after the stack")
class PreNormResidual(Residual):
    final_norm = True

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return x + self.dropout(self.sublayer(self.norm(x), *args, **kwargs))


@PLACEMENTS.register("post", "post-norm (Vaswani et al. 2017): Norm(x + Sublayer(x))")
class PostNormResidual(Residual):
    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.norm(x + self.dropout(self.sublayer(x, *args, **kwargs)))


@PLACEMENTS.register("sandwich", "sandwich-LN (Ding et al. 2021, CogView): x + Norm2(Sublayer(Norm1(x))), final norm")
class SandwichResidual(Residual):
    """``x + Norm2(Sublayer(Norm1(x)))``: ``self.norm`` is Norm1, ``self.post_norm`` is Norm2."""

    final_norm = True

    def __init__(self, sublayer: nn.Module, norm: str, dim: int, eps: float, bias: bool, dropout: float, **kwargs: Any):
        super().__init__(sublayer, norm, dim, eps, bias, dropout, **kwargs)
        self.post_norm = build_norm(norm, dim, eps=eps, bias=bias)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return x + self.dropout(self.post_norm(self.sublayer(self.norm(x), *args, **kwargs)))


@PLACEMENTS.register("deepnorm", "DeepNorm (Wang et al. 2022, DeepNet): Norm(alpha * x + Sublayer(x)), scaled init")
class DeepNormResidual(Residual):
    """``Norm(alpha * x + Sublayer(x))`` with ``alpha = self.residual_scale``."""

    scaled_residual_init = False  # DeepNet scales the init by beta instead (deepnorm_init_)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.norm(self.residual_scale * x + self.dropout(self.sublayer(x, *args, **kwargs)))

    @classmethod
    def stack_constants(
        cls, architecture: str, encoder_layers: int, decoder_layers: int, stack: str
    ) -> tuple[float, float]:
        _check_stack(architecture, stack)
        return deepnorm_alpha_beta(architecture, encoder_layers, decoder_layers)[stack]


def _check_stack(architecture: str, stack: str) -> None:
    stacks = {"encoder": ("encoder",), "decoder": ("decoder",), "encoder_decoder": ("encoder", "decoder")}
    if architecture not in stacks:
        raise ValueError(f"unknown architecture '{architecture}'; choose one of: {', '.join(ARCHITECTURES)}")
    if stack not in stacks[architecture]:
        raise ValueError(f"architecture '{architecture}' has no '{stack}' stack; it has {stacks[architecture]}")


def deepnorm_alpha_beta(architecture: str, encoder_layers: int, decoder_layers: int) -> dict[str, tuple[float, float]]:
    """DeepNorm's ``(alpha, beta)`` per stack, ``{"encoder": ..., "decoder": ...}``.

    Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers" (arXiv:2203.00555),
    Figure 2 (pseudocode table), with N encoder and M decoder layers:

    =================  ======================  =======================  ============  ==============
    architecture       encoder alpha           encoder beta             decoder alpha decoder beta
    =================  ======================  =======================  ============  ==============
    encoder-only       (2N)^(1/4)              (8N)^(-1/4)              --            --
    decoder-only       --                      --                       (2M)^(1/4)    (8M)^(-1/4)
    encoder-decoder    0.81 (N^4 M)^(1/16)     0.87 (N^4 M)^(-1/16)     (3M)^(1/4)    (12M)^(-1/4)
    =================  ======================  =======================  ============  ==============

    Checked against microsoft/torchscale (``torchscale/architecture/{encoder,decoder}.py``),
    which uses the same alphas and divides the init by ``(8N)^(1/4)``, ``(8M)^(1/4)``,
    ``(12M)^(1/4)`` and ``(N^4 M)^(1/16) / 1.15`` (``1/1.15 = 0.8696``, the paper's 0.87; we use
    the paper's 0.87). Only the stacks the architecture has are returned; ``decoder_layers`` is
    ignored for ``"encoder"`` and ``encoder_layers`` for ``"decoder"``.
    """
    if architecture == "encoder":
        n = _positive("encoder_layers", encoder_layers)
        return {"encoder": ((2 * n) ** 0.25, (8 * n) ** -0.25)}
    if architecture == "decoder":
        m = _positive("decoder_layers", decoder_layers)
        return {"decoder": ((2 * m) ** 0.25, (8 * m) ** -0.25)}
    if architecture == "encoder_decoder":
        n, m = _positive("encoder_layers", encoder_layers), _positive("decoder_layers", decoder_layers)
        depth = float(n) ** 4 * m
        return {
            "encoder": (0.81 * depth ** (1 / 16), 0.87 * depth ** (-1 / 16)),
            "decoder": ((3 * m) ** 0.25, (12 * m) ** -0.25),
        }
    raise ValueError(f"unknown architecture '{architecture}'; choose one of: {', '.join(ARCHITECTURES)}")


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


#: Linear layers of a feed-forward sublayer that DeepNet scales by beta (all of them)
FFN_LINEARS = ("fc_in", "fc_gate", "fc_out")
#: attention Linear layers scaled by beta (whole weight); query/key projections are not listed
ATTENTION_LINEARS = ("out_proj", "v_proj")
#: fused attention projections whose value rows only are scaled
FUSED_LINEARS = ("kv_proj", "qkv_proj")


def _value_rows(name: str, layer: nn.Linear) -> int:
    """First row of the value block of a fused ``[k; v]`` or ``[q; k; v]`` projection."""
    if name == "kv_proj":  # [k (kv); v (kv)]
        if layer.out_features % 2:
            raise ValueError(f"kv_proj has an odd number of rows ({layer.out_features})")
        return layer.out_features // 2
    kv = layer.out_features - layer.in_features  # [q (d); k (kv); v (kv)], q as wide as the input
    if kv <= 0 or kv % 2:
        raise ValueError(f"qkv_proj has shape {tuple(layer.weight.shape)}; cannot locate the value rows")
    return layer.out_features - kv // 2


@torch.no_grad()
def deepnorm_init_(module: nn.Module, beta: float) -> list[str]:
    """Multiply by ``beta`` the weights DeepNet scales (Wang et al. 2022, Figure 2: the
    feed-forward layers, the value projection and the attention output projection; the query
    and key projections keep gain 1), in every ``Residual`` inside ``module``. Call it after the
    usual initialisation (``init_weights`` would overwrite it). Biases are left alone (the
    paper's pseudocode scales weights; ours are zero-initialised anyway).

    Found by the attribute name of each ``nn.Linear`` anywhere inside a wrapper's sublayer (so
    the experts of an MoE feed-forward are covered; its router is not):

    - ``fc_in``, ``fc_gate``, ``fc_out``, ``out_proj``, ``v_proj``: the whole weight;
    - ``kv_proj`` (``[k; v]``): the second half of the rows;
    - ``qkv_proj`` (``[q (d); k (kv); v (kv)]``): the last ``kv = (out - in) / 2`` rows, i.e.
      rows ``[2d:3d)`` for standard multi-head attention (grouped-query ``kv < d`` works too);
    - ``q_proj``, ``k_proj``, q and k rows: untouched.

    A wrapper whose sublayer contains none of these raises ``ValueError`` rather than being
    skipped silently. ``beta == 1`` changes nothing. Returns the qualified names of the scaled
    weights (``[r:]`` marks a row slice).
    """
    beta = float(beta)
    scaled: list[str] = []
    for prefix, wrapper in module.named_modules():
        if not isinstance(wrapper, Residual):
            continue
        at = f"{prefix}.sublayer" if prefix else "sublayer"
        found = False
        for name, layer in wrapper.sublayer.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if not isinstance(layer, nn.Linear):
                continue
            qualified = f"{at}.{name}.weight"
            if leaf in FFN_LINEARS + ATTENTION_LINEARS:
                layer.weight.mul_(beta)
                scaled.append(qualified)
            elif leaf in FUSED_LINEARS:
                start = _value_rows(leaf, layer)
                layer.weight[start:].mul_(beta)
                scaled.append(f"{qualified}[{start}:]")
            else:
                continue
            found = True
        if not found:
            names = FFN_LINEARS + ATTENTION_LINEARS + FUSED_LINEARS
            raise ValueError(
                f"deepnorm_init_: {prefix or 'module'} wraps a {type(wrapper.sublayer).__name__} with no "
                f"Linear named one of {names}; cannot apply DeepNet's init"
            )
    return scaled
