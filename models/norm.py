"""Normalization layers: LayerNorm, RMSNorm and ScaleNorm, selected by name (``model.norm``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .registry import NORMS


@NORMS.register("layernorm", "LayerNorm (Ba et al. 2016): subtract mean, divide by std, affine")
class LayerNorm(nn.LayerNorm):
    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__(dim, eps=eps, bias=bias)


@NORMS.register("rmsnorm", "RMSNorm (Zhang & Sennrich 2019): divide by root mean square, scale only")
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        del bias  # RMSNorm has a gain and no bias by definition
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))  # upcast half precision, keep float64
        rms = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * rms).type_as(x) * self.weight


@NORMS.register("scalenorm", "ScaleNorm (Nguyen & Salazar 2019): g * x / ||x||_2 with one learnable scalar g")
class ScaleNorm(nn.Module):
    """``y = g * x / max(||x||_2, eps)`` over the last dimension, with ONE learnable scalar ``g``
    initialised to ``sqrt(dim)`` (Nguyen & Salazar 2019, "Transformers without Tears").

    ``g`` is a 0-dim parameter, so the optimizer puts it in the no-weight-decay group.
    """

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        del bias  # ScaleNorm has a single scalar gain and no bias by definition
        self.eps = eps
        self.g = nn.Parameter(torch.tensor(math.sqrt(dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))  # upcast half precision, keep float64
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(self.eps)
        return (xf / norm).type_as(x) * self.g

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


def build_norm(name: str, dim: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    return NORMS.get(name)(dim, eps=eps, bias=bias)
