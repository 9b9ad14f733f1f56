"""Multi-head attention on ``torch.nn.functional.scaled_dot_product_attention``.

One class serves self-attention (causal or bidirectional) and cross-attention, with multi-head
(MHA), grouped-query (GQA) or multi-query (MQA) key/value heads via ``n_kv_heads``. Masks follow
the conventions of ``torch.nn.MultiheadAttention``: ``key_padding_mask`` is a bool tensor of
shape ``(batch, key_len)`` that is True where the key is padding and must be ignored.

Positional encodings that act inside attention (RoPE rotates q and k; ALiBi adds a score bias)
reach it through the ``positional`` argument (see ``models.position``). ``need_weights=True``
takes a plain-matmul path that also returns the attention weights, for inspection.

What an attention call adds to its scores (causal, padding and sparse-pattern masks, the ALiBi or
T5 bias) is an ``AttentionMask``. A stack builds one per forward for its self-attention and one for
its cross-attention and hands them to every layer (``models.block.TransformerStack``), so the dense
``(heads, T, T)`` masks are not rebuilt in every layer; a layer called alone builds its own. Masks
stay boolean (or SDPA's ``is_causal``, no mask at all) unless a score bias makes them float.
Grouped-query attention with a mask repeats its key/value heads on CUDA (``expands_kv_heads``), so
that a fused kernel takes the call.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .position import PositionalEncoding
from .registry import ATTENTION_SCORES
from .sparse import attended_fraction, sparse_mask


@dataclass(frozen=True)
class SparsePattern:
    """A fixed sparse attention pattern of Child et al. 2019 and its sizes (see ``models.sparse``)."""

    name: str
    window: int
    stride: int
    summary: int

    def mask(self, q_len: int, k_len: int, *, device: torch.device) -> torch.Tensor | None:
        return sparse_mask(
            self.name, q_len, k_len, window=self.window, stride=self.stride, summary=self.summary, device=device
        )


@ATTENTION_SCORES.register("dot", "scaled dot product q.k / sqrt(d) (Vaswani et al. 2017); runs on fused SDPA kernels")
class DotProductScore(nn.Module):
    fused: bool = True  # F.scaled_dot_product_attention computes exactly this score

    def __init__(self, n_heads: int, head_dim: int):
        super().__init__()
        self.scale = 1 / math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``q`` (B, H, Tq, hd), ``k`` (B, H, Tk, hd) -> scores (B, H, Tq, Tk)."""
        return q @ k.transpose(-2, -1) * self.scale


@ATTENTION_SCORES.register("additive", "additive score v.tanh(W_q q + W_k k) (Bahdanau et al. 2015), per head")
class AdditiveScore(nn.Module):
    """Memory grows as (B, H, Tq, Tk, head_dim): meant for comparisons at small sizes."""

    fused: bool = False

    def __init__(self, n_heads: int, head_dim: int):
        super().__init__()
        self.w_q = nn.Parameter(torch.randn(n_heads, head_dim, head_dim) / math.sqrt(head_dim))
        self.w_k = nn.Parameter(torch.randn(n_heads, head_dim, head_dim) / math.sqrt(head_dim))
        self.v = nn.Parameter(torch.randn(n_heads, head_dim) / math.sqrt(head_dim))

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        q_proj = torch.einsum("bhqd,hde->bhqe", q, self.w_q)
        k_proj = torch.einsum("bhkd,hde->bhke", k, self.w_k)
        return torch.einsum("bhqke,he->bhqk", torch.tanh(q_proj[:, :, :, None] + k_proj[:, :, None]), self.v)


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


def with_bias(mask: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Fold an additive score bias (H, Tq, Tk) into the mask: a float mask SDPA adds to the scores."""
    if bias is None:
        return mask
    bias = bias.to(dtype)
    return bias if mask is None else bias.masked_fill(~mask, float("-inf"))


def safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension that gives all-zero weights, not NaN, to a row whose scores
    are all -inf (a query every key of which is masked, e.g. a padding query under a sparse
    pattern): what ``F.scaled_dot_product_attention`` returns for such a row, bool or float mask.
    Gradients stay finite. (``torch._safe_softmax`` does this but is private.)"""
    fully_masked = scores.isneginf().all(dim=-1, keepdim=True)
    return scores.masked_fill(fully_masked, 0.0).softmax(dim=-1).masked_fill(fully_masked, 0.0)


class AttentionMask:
    """What one attention call over ``q_len`` queries and ``k_len`` keys adds to its scores: a boolean
    mask (causal, key padding, sparse pattern; True = may attend) and a positional score bias (ALiBi,
    T5), combined as SDPA takes them. Built once per forward of a stack and shared by its layers.

    ``is_causal``: plain causal attention (no padding, pattern or bias; as many queries as keys),
    which SDPA runs with ``is_causal=True`` and no mask tensor, so fused kernels stay eligible. The
    queries are the last ``q_len`` of the keys; ``cached`` of the keys come from a KV cache (for the
    error message of a padding mask that does not cover them).

    A bias without parameters (ALiBi), or any bias while gradients are off, is formed once, and so is
    its float mask per dtype. A learned bias (T5's table) with gradients on is looked up per layer
    (``PositionalEncoding.bias_from_layout``) from buckets built once, so the table's gradient sums
    the layers' contributions in the same order as when every layer built its own bias.
    """

    def __init__(
        self,
        q_len: int,
        k_len: int,
        *,
        causal: bool,
        key_padding_mask: torch.Tensor | None = None,
        positional: PositionalEncoding | None = None,
        sparsity: SparsePattern | None = None,
        device: torch.device,
        cached: int = 0,
    ):
        if key_padding_mask is not None and key_padding_mask.shape[-1] != k_len:
            keys = f"{k_len} keys ({cached} cached + {q_len} new)" if cached else f"{k_len} keys"
            raise ValueError(
                f"key_padding_mask covers {key_padding_mask.shape[-1]} keys, but this attention has {keys}; "
                "with a KV cache, pass a (batch, cached + new) mask that covers every key seen so far"
            )
        self.q_len, self.k_len, self.causal, self.device = q_len, k_len, causal, device
        layout = positional.bias_layout(q_len, k_len, causal=causal, device=device) if positional is not None else None
        sparse = sparsity.mask(q_len, k_len, device=device) if sparsity is not None else None
        #: whether a sparse pattern restricts the mask
        self.sparse = sparse is not None
        self.is_causal = causal and q_len == k_len and key_padding_mask is None and layout is None and sparse is None
        #: the boolean mask (None: no restriction, or ``is_causal``)
        self.mask: torch.Tensor | None = None
        if not self.is_causal:
            mask = attention_mask(q_len, k_len, causal=causal, key_padding_mask=key_padding_mask, device=device)
            if sparse is not None:
                mask = sparse if mask is None else mask & sparse
            self.mask = mask
        self._positional, self._layout = positional, layout
        self._bias: torch.Tensor | None = None  # the shared bias; None while a learned one is looked up per layer
        if layout is not None and not (positional.learned_bias and torch.is_grad_enabled()):
            self._bias = positional.bias_from_layout(layout, device)
        self._by_dtype: dict[torch.dtype, torch.Tensor | None] = {}

    def sdpa_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """SDPA's ``attn_mask`` for scores of ``dtype``: the boolean mask, or with a score bias the
        float bias with -inf where the mask forbids (``with_bias``); None with ``is_causal``."""
        if self._layout is None:
            return self.mask
        if self._bias is None:  # a learned bias with gradients on: this layer's own lookup
            return with_bias(self.mask, self._positional.bias_from_layout(self._layout, self.device), dtype)
        if dtype not in self._by_dtype:
            self._by_dtype[dtype] = with_bias(self.mask, self._bias, dtype)
        return self._by_dtype[dtype]

    def explicit_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """``sdpa_mask``, with ``is_causal`` as a boolean causal mask: for attention by plain matmuls."""
        if not self.is_causal:
            return self.sdpa_mask(dtype)
        if torch.bool not in self._by_dtype:
            self._by_dtype[torch.bool] = attention_mask(
                self.q_len, self.k_len, causal=True, key_padding_mask=None, device=self.device
            )
        return self._by_dtype[torch.bool]


#: on a CPU, half-precision attention over at most this many keys runs on SDPA's math backend
CPU_MATH_MAX_KEYS = 128


def sdpa_backends(q: torch.Tensor, k_len: int) -> contextlib.AbstractContextManager:
    """The SDPA backends for this call: all of them (PyTorch picks flash or memory-efficient kernels
    where they apply), except on a CPU in bf16/fp16 with at most ``CPU_MATH_MAX_KEYS`` keys. There the
    CPU flash kernel is 1.5-3x slower, forward and backward, than the math backend, which computes in
    float32 and is as accurate (measured on an AVX-512/AMX Xeon; ``tests/test_fast_paths.py``
    checks the result). Not while compiling: inductor chooses its own kernels."""
    short_half_on_cpu = (
        q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and k_len <= CPU_MATH_MAX_KEYS
    )
    if short_half_on_cpu and not torch.compiler.is_compiling():
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


def expands_kv_heads(device_type: str, n_heads: int, n_kv_heads: int, masked: bool) -> bool:
    """Whether grouped-query attention (``n_kv_heads`` < ``n_heads``) repeats its key and value heads to
    ``n_heads`` before SDPA instead of passing ``enable_gqa``: on CUDA where an ``attn_mask`` is given
    (padding, a sparse pattern, an ALiBi or T5 bias). No fused CUDA kernel takes ``enable_gqa`` with a
    mask (flash takes no mask, the memory-efficient kernel no ``enable_gqa``), so SDPA would fall back
    to its math backend, the slowest; with the heads repeated the memory-efficient kernel runs.
    Elsewhere (a CPU, no mask) ``enable_gqa`` stays: the kernels it reaches there take it."""
    return device_type == "cuda" and masked and n_kv_heads != n_heads


def grouped_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    expand_kv: bool,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` of ``q`` (B, H, Tq, hd) over ``k``, ``v`` (B, H_kv, Tk, hd),
    each key/value head serving ``H / H_kv`` consecutive query heads: with ``expand_kv`` the key and
    value heads repeated to ``H`` (``repeat_interleave``, SDPA's own grouping for ``enable_gqa``), else
    ``enable_gqa`` where ``H_kv < H`` (see :func:`expands_kv_heads`)."""
    groups = q.shape[1] // k.shape[1]
    if expand_kv and groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=k.shape[1] != q.shape[1]
    )


@dataclass
class KVCache:
    """Keys and values one attention layer has seen, for incremental decoding: self-attention
    appends each step's keys/values; cross-attention computes the encoder's once and keeps them."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def reorder(self, indices: torch.Tensor) -> None:
        """Keep batch rows ``indices`` (in that order, repeats allowed): beam search follows each new
        beam's parent. Reorders nothing before the first step has filled the cache."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, indices), self.v.index_select(0, indices)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention with a fused QKV projection for self-attention."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        cross: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        score: str = "dot",
        sparsity: SparsePattern | None = None,
    ):
        super().__init__()
        n_kv_heads = n_kv_heads or n_heads
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} does not divide n_heads={n_heads}")
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.cross = cross
        self.dropout = dropout
        kv_dim = n_kv_heads * self.head_dim
        if cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * kv_dim, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, d_model + 2 * kv_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.score = ATTENTION_SCORES.get(score)(n_heads, self.head_dim)
        self.sparsity = sparsity
        self._sparse_shape: tuple[int, int, bool] | None = None  # (q_len, k_len, causal) of the last sparse forward

    @property
    def attended_fraction(self) -> float | None:
        """Share of (query, key) pairs the sparse pattern (with the causal mask, without padding)
        let the last forward attend; None without a sparse pattern. Computed on demand, not per step."""
        if self._sparse_shape is None:
            return None
        q_len, k_len, causal = self._sparse_shape
        mask = self.sparsity.mask(q_len, k_len, device=torch.device("cpu"))
        if causal:
            mask &= attention_mask(q_len, k_len, causal=True, key_padding_mask=None, device=mask.device)
        return attended_fraction(mask)

    def _heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, n_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
        positional: PositionalEncoding | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        mask: AttentionMask | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x``: (B, Tq, D) queries; ``context``: (B, Tk, D) keys/values for cross-attention.

        With a ``cache``, ``x`` holds only the new positions: self-attention attends to the cached
        keys/values plus its own; cross-attention reuses the context's keys/values after the first
        call. ``key_padding_mask`` (B, Tk) covers every key, cached ones included. A query whose
        keys are all masked gets a zero attention output on every path, as SDPA gives. Returns the
        output (B, Tq, D), and with ``need_weights`` also the weights (B, H, Tq, Tk). ``mask``: the
        ``AttentionMask`` its stack built for every layer from the same ``causal``,
        ``key_padding_mask``, ``positional`` and this layer's sparse pattern; without one, the layer
        builds its own.
        """
        d_model, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        offset = cache.length if cache is not None and not self.cross else 0
        if self.cross:
            q = self._heads(self.q_proj(x), self.n_heads)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                if context is None:
                    raise ValueError("cross-attention needs a context (the encoder output)")
                k, v = (self._heads(t, self.n_kv_heads) for t in self.kv_proj(context).split(kv_dim, dim=-1))
        else:
            q, k, v = self.qkv_proj(x).split([d_model, kv_dim, kv_dim], dim=-1)
            q, k, v = self._heads(q, self.n_heads), self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)
            if positional is not None:
                q, k = positional.rotate(q, k, offset)
            if cache is not None and cache.k is not None:
                k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
        if cache is not None:
            cache.k, cache.v = k, v
        q_len, k_len = q.shape[2], k.shape[2]
        if mask is None:
            mask = AttentionMask(
                q_len,
                k_len,
                causal=causal,
                key_padding_mask=key_padding_mask,
                positional=positional,
                sparsity=self.sparsity,
                device=q.device,
                cached=offset,
            )
        elif (mask.q_len, mask.k_len) != (q_len, k_len):
            raise ValueError(
                f"the attention mask is for {mask.q_len} queries and {mask.k_len} keys, "
                f"this attention has {q_len} and {k_len}"
            )
        if mask.sparse:
            self._sparse_shape = (q_len, k_len, mask.causal)

        dropout_p = self.dropout if self.training else 0.0
        if need_weights or not self.score.fused:
            out, weights = self._math_attention(q, k, v, mask.explicit_mask(q.dtype), dropout_p=dropout_p)
        else:
            attn_mask = mask.sdpa_mask(q.dtype)
            with sdpa_backends(q, k_len):
                out = grouped_sdpa(
                    q,
                    k,
                    v,
                    attn_mask=attn_mask,
                    dropout_p=dropout_p,
                    is_causal=mask.is_causal,
                    expand_kv=expands_kv_heads(q.device.type, self.n_heads, self.n_kv_heads, attn_mask is not None),
                )
        out = self.out_proj(out.transpose(1, 2).reshape(x.shape[0], q_len, d_model))
        return (out, weights) if need_weights else out

    def _math_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        dropout_p: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """softmax(score(Q, K) + mask) V with plain matmuls; for the dot score, the SDPA path's result,
        including zeros for a query whose keys are all masked (``safe_softmax``)."""
        groups = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = self.score(q, k)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        weights = safe_softmax(scores)
        return F.dropout(weights, dropout_p) @ v, weights
