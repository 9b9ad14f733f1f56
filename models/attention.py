"""Multi-head attention on ``torch.nn.functional.scaled_dot_product_attention``.

One class serves self-attention (causal or bidirectional) and cross-attention. Masks follow
the conventions of ``torch.nn.MultiheadAttention``: ``key_padding_mask`` is a bool tensor of
shape ``(batch, key_len)`` that is True where the key is padding and must be ignored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def attention_mask(
    query_len: int,
    key_len: int,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor | None:
    """Boolean SDPA mask (True = may attend), broadcastable to ``(B, H, Tq, Tk)``, or None."""
    mask = None
    if causal:
        # query i sees keys j <= i + (key_len - query_len) (aligned at the end, as with a cache)
        offset = key_len - query_len
        mask = torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(diagonal=offset)
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, Tk)
        mask = keep if mask is None else keep & mask
    return mask


class MultiHeadAttention(nn.Module):
    """Scaled dot-product multi-head attention with a fused QKV projection for self-attention."""

    def __init__(self, d_model: int, n_heads: int, *, cross: bool = False, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.cross = cross
        self.dropout = dropout
        if cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x``: (B, Tq, D) queries; ``context``: (B, Tk, D) keys/values for cross-attention."""
        if self.cross:
            if context is None:
                raise ValueError("cross-attention needs a context (the encoder output)")
            q = self.q_proj(x)
            k, v = self.kv_proj(context).chunk(2, dim=-1)
        else:
            q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        dropout_p = self.dropout if self.training else 0.0
        if key_padding_mask is None and (not causal or q.shape[2] == k.shape[2]):
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
        else:
            mask = attention_mask(
                q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
            )
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        batch, _, length, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, -1))
