"""Position-wise feed-forward networks.

The activation of the dense FFN is selected by name (``model.activation``, registry
``ACTIVATIONS``); the kind of FFN is selected by name from ``FFNS``:

* ``"mlp"``    -- ``Linear -> activation -> dropout -> Linear`` (Vaswani et al. 2017).
* ``"swiglu"`` -- ``fc_out(dropout(silu(fc_gate(x)) * fc_in(x)))`` (Shazeer 2020, "GLU Variants
  Improve Transformer"; PaLM, LLaMA).
* ``"geglu"``  -- the same with GELU (Shazeer 2020).

Every FFN kind has the same constructor ``(d_model, d_ff, activation="gelu", bias=True,
dropout=0.0)``, so ``build_ffn(kind, ...)`` can swap them. The gated kinds ignore
``activation`` (the gate nonlinearity is part of their definition) and shrink the hidden size
to ``gated_hidden_size(d_ff)`` so their parameter count matches the dense FFN of width ``d_ff``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .registry import ACTIVATIONS, FFNS

ACTIVATIONS.register("relu", "ReLU (Vaswani et al. 2017)")(nn.ReLU)
ACTIVATIONS.register("gelu", "GELU, exact erf form (Hendrycks & Gimpel 2016; BERT, ViT)")(nn.GELU)


@ACTIVATIONS.register("gelu_tanh", "GELU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2, GPT-J)")
class GELUTanh(nn.GELU):
    """GELU with the tanh approximation, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``: what
    GPT-2 trained with (HF's ``gelu_new``); it differs from the exact form by up to about 1e-3."""

    def __init__(self):
        super().__init__(approximate="tanh")


ACTIVATIONS.register("silu", "SiLU / Swish-1, x * sigmoid(x) (Elfwing et al. 2017; Ramachandran et al. 2017)")(nn.SiLU)


def gated_hidden_size(d_ff: int) -> int:
    """Hidden size of a gated (GLU) FFN with the parameter budget of a dense FFN of width ``d_ff``.

    A gated FFN has three ``d_model x h`` matrices (``fc_gate``, ``fc_in``, ``fc_out``) instead
    of two ``d_model x d_ff``, so ``h = 2/3 * d_ff`` gives equal weight counts (Shazeer 2020
    Sec. 2). We round to the NEAREST INTEGER (no rounding up to a multiple of 8/64): this keeps
    the weight count within ``d_model`` of the dense one (e.g. d_model=128, d_ff=512: h=341,
    3*128*341 = 130944 vs 2*128*512 = 131072 weights). ``2*d_ff/3`` never has fractional part
    exactly 1/2, so the integer formula ``(2*d_ff + 1) // 3`` is round-half-free. At least 1.
    """
    if d_ff <= 0:
        raise ValueError(f"d_ff must be positive, got {d_ff}")
    return max(1, (2 * d_ff + 1) // 3)


@FFNS.register("mlp", "dense Linear -> activation -> Linear (Vaswani et al. 2017)")
class FeedForward(nn.Module):
    """``Linear(d_model, d_ff) -> activation -> dropout -> Linear(d_ff, d_model)``."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)
        self.act = ACTIVATIONS.get(activation)()
        self.dropout = nn.Dropout(dropout)
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.dropout(self.act(self.fc_in(x))))


class GatedFeedForward(nn.Module):
    """``fc_out(dropout(gate_act(fc_gate(x)) * fc_in(x)))`` with hidden size ``gated_hidden_size(d_ff)``.

    ``activation`` is accepted for a uniform constructor and ignored; subclasses fix the gate
    nonlinearity in ``gate_act``.
    """

    gate_act = staticmethod(F.silu)

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True, dropout: float = 0.0):
        super().__init__()
        hidden = gated_hidden_size(d_ff)
        self.hidden_size = hidden
        self.fc_gate = nn.Linear(d_model, hidden, bias=bias)
        self.fc_in = nn.Linear(d_model, hidden, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.fc_out = nn.Linear(hidden, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.dropout(self.gate_act(self.fc_gate(x)) * self.fc_in(x)))


@FFNS.register("swiglu", "SwiGLU: silu(x W_gate) * (x W_in) -> W_out, hidden 2/3 d_ff (Shazeer 2020; PaLM, LLaMA)")
class SwiGLUFeedForward(GatedFeedForward):
    gate_act = staticmethod(F.silu)


@FFNS.register("geglu", "GEGLU: gelu(x W_gate) * (x W_in) -> W_out, hidden 2/3 d_ff (Shazeer 2020)")
class GEGLUFeedForward(GatedFeedForward):
    gate_act = staticmethod(F.gelu)  # exact erf form, like the "gelu" activation


def build_ffn(
    kind: str, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True, dropout: float = 0.0
) -> nn.Module:
    """Build the feed-forward network registered in ``FFNS`` under ``kind``."""
    return FFNS.get(kind)(d_model, d_ff, activation, bias=bias, dropout=dropout)
