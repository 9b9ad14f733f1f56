"""Positional encodings (``model.pos_encoding``), one class per way positions enter the model.

Every encoding is a ``PositionalEncoding`` and overrides the hooks it needs:

- ``embedding(length, offset)``: a ``(length, d_model)`` table added to the token embeddings
  (learned, sinusoidal, sincos2d), with the RMS of the token signal at init
  (``models.embedding`` states the convention);
- ``rotate(q, k, offset)``: new queries and keys of self-attention rotated by position (RoPE);
- ``attention_bias(q_len, k_len, causal)``: a ``(heads, q_len, k_len)`` bias added to the
  self-attention scores (ALiBi, the T5 relative bias). A stack builds it once per forward for all
  its layers (``models.attention.AttentionMask``) in two steps, ``bias_layout`` (what needs no
  parameters: ALiBi's whole bias, T5's buckets) and ``bias_from_layout`` (the learned T5 table's
  lookup, done per layer while gradients are on: see ``learned_bias``).

``nope`` overrides none of them: the causal mask is the model's only source of order.
``extrapolates`` says whether the encoding is defined beyond the training length, and a class's
``check(cfg)`` rejects a config it cannot run with, at validation (``models.registry``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ModelConfig
from .init_scale import EMBEDDING_STD
from .registry import POSITIONAL


class PositionalEncoding(nn.Module):
    """Base class: no positional information unless a hook is overridden."""

    extrapolates: bool = True

    @classmethod
    def from_config(cls, cfg: ModelConfig, max_len: int, rms: float = EMBEDDING_STD) -> PositionalEncoding:
        """``rms``: the RMS at init of the token signal a table is added to, which the table takes
        (``models.embedding``); encodings without a table ignore it."""
        return cls(max_len, cfg.d_model, rms)

    def __init__(self, max_len: int = 0, dim: int = 0, rms: float = EMBEDDING_STD):
        super().__init__()

    def embedding(self, length: int, offset: int = 0) -> torch.Tensor | None:
        return None

    def add_to(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``x`` (B, T, D) plus this encoding's table for positions ``offset .. offset + T - 1``, if it has one."""
        table = self.embedding(x.shape[1], offset)
        return x if table is None else x + table

    def rotate(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``q``, ``k``: (B, heads, T, head_dim) at positions ``offset .. offset + T - 1``."""
        return q, k

    #: whether ``attention_bias`` depends on parameters (T5's learned table)
    learned_bias: bool = False
    #: whether an encoder-decoder builds one instance per stack rather than one for both: an encoding
    #: whose parameters mean different things in a bidirectional and a causal stack (T5's buckets)
    one_per_stack: bool = False

    def attention_bias(self, q_len: int, k_len: int, *, causal: bool, device: torch.device) -> torch.Tensor | None:
        return None

    def bias_layout(self, q_len: int, k_len: int, *, causal: bool, device: torch.device) -> torch.Tensor | None:
        """The part of ``attention_bias`` that needs no parameters, built once per forward of a stack
        and shared by its layers (``models.attention.AttentionMask``); None without a bias. By default
        the whole bias (it has no parameters); ``bias_from_layout`` turns it into the bias."""
        return self.attention_bias(q_len, k_len, causal=causal, device=device)

    def bias_from_layout(self, layout: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The ``(heads, q_len, k_len)`` bias of a ``bias_layout``: the layout itself by default. With
        a ``learned_bias`` every layer calls it while gradients are on, so that each layer's gradient
        reaches the parameters through its own lookup, summed over the layers as before the bias was
        shared (floating-point sums in another order would change the gradient's last bits)."""
        return layout


POSITIONAL.register("nope", "no positional encoding (NoPE, Kazemnejad et al. 2023); order from the causal mask")(
    PositionalEncoding
)


@POSITIONAL.register("learned", "learned absolute position embeddings (GPT-2, BERT, ViT)")
class LearnedPositionalEmbedding(PositionalEncoding):
    extrapolates = False

    def __init__(self, max_len: int, dim: int, rms: float = EMBEDDING_STD):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.zeros(max_len, dim))
        nn.init.normal_(self.weight, std=rms)  # the token signal's RMS (models.embedding)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        if offset + length > self.max_len:
            raise ValueError(
                f"sequence of length {offset + length} exceeds the learned positions "
                f"(model.max_seq_len={self.max_len}); learned absolute positions cannot extrapolate: "
                "use pos_encoding rope, alibi, sinusoidal or nope to evaluate longer contexts"
            )
        return self.weight[offset : offset + length]

    embedding = forward


def sinusoidal_table(length: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """``PE[p, 2i] = sin(p / base^(2i/dim))``, ``PE[p, 2i+1] = cos(p / base^(2i/dim))`` (Vaswani et al.)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(base) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: dim // 2])
    return table


def fixed_table_scale(rms: float = EMBEDDING_STD) -> float:
    """Factor that takes a unit-amplitude sine-cosine table (``sinusoidal_table``, ``sincos_2d_table``)
    to RMS ``rms``: each row's sin/cos pairs have sin^2 + cos^2 = 1, so its RMS is 1/sqrt(2). With the
    default, a fixed table has the RMS of the token embeddings at init (``models.embedding``)."""
    return rms * math.sqrt(2)


@POSITIONAL.register("sinusoidal", "fixed sinusoidal encodings (Vaswani et al. 2017), no parameters")
class SinusoidalPositionalEncoding(PositionalEncoding):
    """``sinusoidal_table`` times ``fixed_table_scale(rms)``: RMS ``rms`` per position (the embedding
    convention of ``models.embedding``; Vaswani et al.'s unit amplitude is ``rms = 1/sqrt(2)``)."""

    def __init__(self, max_len: int, dim: int, rms: float = EMBEDDING_STD):
        super().__init__()
        self.dim = dim
        self.scale = fixed_table_scale(rms)
        self.register_buffer("table", self._table(max_len), persistent=False)

    def _table(self, length: int) -> torch.Tensor:
        return sinusoidal_table(length, self.dim) * self.scale

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        if offset + length > self.table.shape[0]:  # grows on demand: sinusoids are defined everywhere
            self.table = self._table(offset + length).to(self.table)  # keep device and dtype
        return self.table[offset : offset + length]

    embedding = forward


@POSITIONAL.register("rope", "rotary position embedding (Su et al. 2021), half-split rotation as in GPT-NeoX/Llama")
class RotaryPositionalEmbedding(PositionalEncoding):
    """Rotates each (i, i + head_dim/2) pair of query/key features by ``position * base^(-2i/head_dim)``,
    so the score of q at position m and k at position n depends on m - n only."""

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        head_dim = cfg.d_model // cfg.n_heads
        if head_dim % 2:
            raise ValueError(
                f"pos_encoding=rope needs an even head dimension (it rotates pairs of features), but d_model="
                f"{cfg.d_model} / n_heads={cfg.n_heads} = {head_dim}; choose n_heads so that d_model / n_heads is even"
            )

    @classmethod
    def from_config(cls, cfg: ModelConfig, max_len: int, rms: float = EMBEDDING_STD) -> RotaryPositionalEmbedding:
        return cls(cfg.d_model // cfg.n_heads, base=cfg.rope_base)

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        self.head_dim, self.base = head_dim, base
        self.register_buffer("inv_freq", self.frequencies(torch.float32), persistent=False)

    def frequencies(self, dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
        """``base^(-2i/head_dim)`` computed in ``dtype``: float32 (the buffer) for float32 and half
        precision, float64 for a float64 model, whose rotation then has float64's accuracy."""
        return self.base ** (-torch.arange(0, self.head_dim, 2, dtype=dtype, device=device) / self.head_dim)

    def angles(
        self, length: int, offset: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the rotation angles, (length, head_dim), in ``dtype``: never below float32
        (half-precision queries are rotated in float32, as in Llama), float64 in a float64 model."""
        dtype = torch.promote_types(dtype, torch.float32)
        device = self.inv_freq.device
        inv_freq = self.inv_freq.float() if dtype == torch.float32 else self.frequencies(dtype, device)
        positions = torch.arange(offset, offset + length, dtype=dtype, device=device)
        freqs = torch.outer(positions, inv_freq)
        freqs = torch.cat([freqs, freqs], dim=-1)  # (length, head_dim)
        return freqs.cos(), freqs.sin()

    @staticmethod
    def _rotate_by(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        rotated_half = torch.cat([-second, first], dim=-1)
        return (x.to(cos.dtype) * cos + rotated_half.to(cos.dtype) * sin).type_as(x)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.angles(q.shape[-2], offset, q.dtype)
        return self._rotate_by(q, cos, sin), self._rotate_by(k, cos, sin)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Head slopes of ALiBi (Press et al. 2022): the geometric sequence 2^(-8/n), 2^(-16/n), ... for
    n a power of two; otherwise those of the closest smaller power of two, then every other slope
    of the next power of two (the paper's reference implementation)."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)


@POSITIONAL.register("alibi", "ALiBi (Press et al. 2022): per-head linear distance penalty on attention scores")
class ALiBi(PositionalEncoding):
    """Adds ``-slope_h * (i - j)`` to the score of query i and key j (``|i - j|`` when bidirectional)."""

    @classmethod
    def from_config(cls, cfg: ModelConfig, max_len: int, rms: float = EMBEDDING_STD) -> ALiBi:
        return cls(cfg.n_heads)

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def attention_bias(self, q_len: int, k_len: int, *, causal: bool, device: torch.device) -> torch.Tensor:
        query_positions = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        distance = (query_positions - torch.arange(k_len, device=device)[None, :]).float()
        distance = distance.clamp(min=0) if causal else distance.abs()
        return -self.slopes.to(device)[:, None, None] * distance


def t5_relative_position_bucket(
    relative_position: torch.Tensor, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """T5's bucket of each ``relative_position = key_position - query_position`` (Raffel et al. 2020;
    as ``T5Attention._relative_position_bucket`` in HF transformers).

    Bidirectional: half the buckets for keys at or before the query, half (offset by
    ``num_buckets // 2``) for keys after it. Unidirectional (causal): all buckets for the past, every
    future distance in bucket 0. Within a half, the first ``max_exact = buckets // 2`` distances get
    a bucket each, larger ones share logarithmically wider buckets up to ``max_distance``, beyond
    which everything falls in the last bucket.
    """
    relative_position = relative_position.long()
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    # clamp keeps log() finite where the exact branch is taken anyway
    log_ratio = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    if_large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, if_large)


@POSITIONAL.register(
    "relative", "T5 relative position bias (Raffel et al. 2020): learned per-head bias of bucketed distance"
)
class T5RelativePositionBias(PositionalEncoding):
    """Adds ``table[bucket(j - i), h]`` to the score of query i and key j in head h.

    One ``(num_buckets, n_heads)`` table per stack, shared by every layer of it (T5 computes it in
    the stack's first layer and reuses it). Bidirectional buckets when ``causal=False``,
    unidirectional when ``causal=True``: the same bucket means another distance in an encoder and in
    a decoder, so an encoder-decoder gives each stack its own table (``one_per_stack``), as T5 does.
    Initialised N(0, ``init_std``) like the other learned embeddings.
    """

    one_per_stack = True

    @classmethod
    def from_config(cls, cfg: ModelConfig, max_len: int, rms: float = EMBEDDING_STD) -> T5RelativePositionBias:
        return cls(cfg.n_heads)

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, init_std: float = 0.02):
        super().__init__()
        self.n_heads = n_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.weight = nn.Parameter(torch.zeros(num_buckets, n_heads))
        nn.init.normal_(self.weight, std=init_std)

    def buckets(self, q_len: int, k_len: int, *, causal: bool, device: torch.device) -> torch.Tensor:
        """(q_len, k_len) bucket indices; queries are the last ``q_len`` of the ``k_len`` positions."""
        query_positions = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        relative = torch.arange(k_len, device=device)[None, :] - query_positions
        return t5_relative_position_bucket(
            relative, bidirectional=not causal, num_buckets=self.num_buckets, max_distance=self.max_distance
        )

    learned_bias = True

    def bias_layout(self, q_len: int, k_len: int, *, causal: bool, device: torch.device) -> torch.Tensor:
        """The bucket indices (``buckets``), what the layers share; the table lookup is ``bias_from_layout``."""
        return self.buckets(q_len, k_len, causal=causal, device=self.weight.device)

    def bias_from_layout(self, layout: torch.Tensor, device: torch.device) -> torch.Tensor:
        return self.weight[layout].permute(2, 0, 1).to(device)  # (heads, q_len, k_len)

    def attention_bias(self, q_len: int, k_len: int, *, causal: bool, device: torch.device) -> torch.Tensor:
        return self.bias_from_layout(self.bias_layout(q_len, k_len, causal=causal, device=device), device)


def sincos_2d_table(grid_size: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """``(grid_size**2, dim)`` fixed 2D sine-cosine table of a square patch grid in row-major order
    (MAE, He et al. 2022; Beyer et al. 2022): the first ``dim/2`` features are the 1D sinusoidal
    encoding (``sinusoidal_table``, interleaved sin/cos) of the patch's row, the last ``dim/2`` that
    of its column."""
    if dim % 4:
        raise ValueError(f"a 2D sine-cosine table needs dim divisible by 4, got {dim}")
    axis = sinusoidal_table(grid_size, dim // 2, base)  # (grid, dim/2)
    rows = axis[:, None, :].expand(grid_size, grid_size, dim // 2)
    cols = axis[None, :, :].expand(grid_size, grid_size, dim // 2)
    return torch.cat([rows, cols], dim=-1).reshape(grid_size * grid_size, dim)


@POSITIONAL.register("sincos2d", "fixed 2D sine-cosine patch embeddings (MAE; Beyer et al. 2022), ViT only")
class SinCos2DPositionalEncoding(PositionalEncoding):
    """Row/column sine-cosine table of the ViT's patch grid times ``fixed_table_scale(rms)`` (RMS
    ``rms`` per patch, as ``models.embedding`` prescribes), one row per patch in row-major order
    (the ViT adds it to the patches only; its CLS token has no place in the grid)."""

    extrapolates = False  # defined for one grid only

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """The vit family only (its task sets model.image_size, the grid); with family unset (a
        ``model:`` section before the task fills it in) only the width is checked."""
        if cfg.family is not None and cfg.family != "vit":
            others = [name for name in POSITIONAL.names() if name != "sincos2d"]
            raise ValueError(
                f"pos_encoding=sincos2d is for the vit family (it needs model.image_size), not {cfg.family}; "
                f"use one of: {', '.join(others)}"
            )
        if cfg.d_model % 4:
            raise ValueError(
                f"pos_encoding=sincos2d needs d_model divisible by 4 (half for rows, half for columns, "
                f"each sin/cos pairs), got d_model={cfg.d_model}"
            )

    @classmethod
    def from_config(cls, cfg: ModelConfig, max_len: int, rms: float = EMBEDDING_STD) -> SinCos2DPositionalEncoding:
        return cls(cfg.image_size // cfg.patch_size, cfg.d_model, rms)  # checked by ``check`` and the vit family

    def __init__(self, grid_size: int, dim: int, rms: float = EMBEDDING_STD):
        super().__init__()
        self.grid_size = grid_size
        self.register_buffer("table", sincos_2d_table(grid_size, dim) * fixed_table_scale(rms), persistent=False)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        expected = self.table.shape[0]
        if offset != 0 or length != expected:
            raise ValueError(
                f"pos_encoding=sincos2d covers exactly the {self.grid_size}x{self.grid_size} patch grid "
                f"({expected} positions from 0), got length {length} at offset {offset}"
            )
        return self.table

    embedding = forward


def build_positional(cfg: ModelConfig, max_len: int, rms: float = EMBEDDING_STD) -> PositionalEncoding:
    """``model.pos_encoding`` for ``max_len`` positions; a table gets RMS ``rms`` at init, that of the
    token signal it is added to (``models.embedding``: the token tables' by default, the ViT passes
    its patch projection's)."""
    return POSITIONAL.get(cfg.pos_encoding).from_config(cfg, max_len, rms)
