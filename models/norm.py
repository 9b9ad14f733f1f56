"""Normalization layers: LayerNorm and RMSNorm, selected by name (``model.norm``)."""

from __future__ import annotations

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


def build_norm(name: str, dim: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    return NORMS.get(name)(dim, eps=eps, bias=bias)
