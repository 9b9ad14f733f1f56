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
  to every wrapper of that stack.
- ``cls.init_stack_(stack_module, beta)``: the placement's own initialisation of the stack, once
  its weights are initialised (DeepNorm's ``deepnorm_init_``; nothing for the others).

Module functions: ``deepnorm_alpha_beta(architecture, encoder_layers, decoder_layers)`` returns
``{stack: (alpha, beta)}`` for the stacks of that architecture, and
``deepnorm_init_(module, beta)`` redraws the weights DeepNet initialises (Xavier, gain beta or 1) in place.
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

    @classmethod
    def init_stack_(cls, stack: nn.Module, beta: float) -> None:
        """The placement's own initialisation of a stack of its wrappers, after ``init_weights``
        (``beta`` from ``stack_constants``); none but DeepNorm's."""

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

    scaled_residual_init = False  # DeepNet's own init (gain beta) instead (deepnorm_init_)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.norm(self.residual_scale * x + self.dropout(self.sublayer(x, *args, **kwargs)))

    @classmethod
    def stack_constants(
        cls, architecture: str, encoder_layers: int, decoder_layers: int, stack: str
    ) -> tuple[float, float]:
        _check_stack(architecture, stack)
        return deepnorm_alpha_beta(architecture, encoder_layers, decoder_layers)[stack]

    @classmethod
    def init_stack_(cls, stack: nn.Module, beta: float) -> None:
        deepnorm_init_(stack, beta)


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


#: Linear layers of a feed-forward sublayer that DeepNet initialises with gain beta (all of them)
FFN_LINEARS = ("fc_in", "fc_gate", "fc_out")
#: attention Linear layers initialised with gain beta (whole weight)
ATTENTION_LINEARS = ("out_proj", "v_proj")
#: attention Linear layers initialised with gain 1 (whole weight)
QUERY_KEY_LINEARS = ("q_proj", "k_proj")
#: fused attention projections: their query and key rows get gain 1, their value rows gain beta
FUSED_LINEARS = ("kv_proj", "qkv_proj")


def _fused_blocks(name: str, layer: nn.Linear) -> list[tuple[int, int, str]]:
    """The row blocks ``(start, stop, part)`` of a fused ``[k; v]`` or ``[q; k; v]`` projection, ``part``
    in ``q``, ``k``, ``v``: each block is a projection of its own, initialised with its own fans."""
    rows = layer.out_features
    if name == "kv_proj":  # [k (kv); v (kv)]
        if rows % 2:
            raise ValueError(f"kv_proj has an odd number of rows ({rows})")
        return [(0, rows // 2, "k"), (rows // 2, rows, "v")]
    kv = rows - layer.in_features  # [q (d); k (kv); v (kv)], q as wide as the input
    if kv <= 0 or kv % 2:
        raise ValueError(f"qkv_proj has shape {tuple(layer.weight.shape)}; cannot locate the value rows")
    d = layer.in_features
    return [(0, d, "q"), (d, d + kv // 2, "k"), (d + kv // 2, rows, "v")]


def _xavier_normal_(weight: torch.Tensor, gain: float) -> None:
    """``nn.init.xavier_normal_`` of each ``(out, in)`` matrix in ``weight`` (a matrix, or a stack of
    expert matrices ``(n_experts, out, in)``, whose fans are one expert's): N(0, gain^2 * 2 / (in + out))."""
    fan_out, fan_in = weight.shape[-2], weight.shape[-1]
    weight.normal_(0.0, gain * (2.0 / (fan_in + fan_out)) ** 0.5)


@torch.no_grad()
def deepnorm_init_(module: nn.Module, beta: float) -> dict[str, float]:
    """DeepNet's initialisation (Wang et al. 2022, Figure 2) of every ``Residual`` inside ``module``:
    Xavier-normal with gain ``beta`` for the feed-forward layers, the value projection and the
    attention output projection, Xavier-normal with gain 1 for the query and key projections, zero
    biases. It redraws those weights rather than scaling the GPT-2 N(0, 0.02) of ``init_weights``:
    at d_model 128 Xavier's std is 3-4 times 0.02, and beta times 0.02 left each branch 10-20 times
    smaller next to ``alpha * x`` than DeepNet's, so that the translator learned nothing in 300 steps
    at any learning rate (x-transformers' ``deepnorm_init`` redraws the same way). Call it after
    ``init_weights``, which would overwrite it.

    Found by the attribute name of each ``nn.Linear`` anywhere inside a wrapper's sublayer (so
    the experts of an MoE feed-forward are covered, each expert matrix with its own fans; its
    router is not):

    - ``fc_in``, ``fc_gate``, ``fc_out``, ``out_proj``, ``v_proj``: gain beta;
    - ``q_proj``, ``k_proj``: gain 1;
    - ``kv_proj`` (``[k; v]``) and ``qkv_proj`` (``[q (d); k (kv); v (kv)]``, grouped-query
      ``kv < d`` too): each block on its own, gain 1 for q and k, beta for v.

    Other layers inside a sublayer (an additive attention score's) keep their init. A wrapper whose
    sublayer contains none of these raises ``ValueError`` rather than being skipped silently.
    Returns each redrawn weight's qualified name (``[a:b]`` marks a row block) and its gain.
    """
    beta = float(beta)
    gains: dict[str, float] = {}
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
            if leaf in FFN_LINEARS + ATTENTION_LINEARS + QUERY_KEY_LINEARS:
                gain = 1.0 if leaf in QUERY_KEY_LINEARS else beta
                _xavier_normal_(layer.weight, gain)
                gains[qualified] = gain
            elif leaf in FUSED_LINEARS:
                for start, stop, part in _fused_blocks(leaf, layer):
                    gain = beta if part == "v" else 1.0
                    _xavier_normal_(layer.weight[start:stop], gain)
                    gains[f"{qualified}[{start}:{stop}]"] = gain
            else:
                continue
            if layer.bias is not None:
                layer.bias.zero_()
            found = True
        if not found:
            names = FFN_LINEARS + ATTENTION_LINEARS + QUERY_KEY_LINEARS + FUSED_LINEARS
            raise ValueError(
                f"deepnorm_init_: {prefix or 'module'} wraps a {type(wrapper.sublayer).__name__} with no "
                f"Linear named one of {names}; cannot apply DeepNet's init"
            )
    return gains
