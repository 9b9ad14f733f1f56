"""The one Transformer block used by every family, and a stack of them.

A block is self-attention (causal or bidirectional), optional cross-attention, and a
feed-forward network; each sublayer sits in a residual wrapper chosen by
``model.norm_placement``. The encoder block of the translator and ViT, the decoder-only
block of the LM and the decoder block of the translator are all this class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .attention import AttentionMask, KVCache, MultiHeadAttention, SparsePattern
from .config import ModelConfig
from .init_scale import EMBEDDING_STD
from .mlp import build_ffn
from .moe import MoEFeedForward
from .norm import build_norm
from .position import PositionalEncoding
from .registry import PLACEMENTS


def build_feed_forward(cfg: ModelConfig) -> nn.Module:
    """The block's feed-forward sublayer: a dense FFN of kind ``cfg.ffn`` or an MoE of such experts."""
    if cfg.n_experts:
        return MoEFeedForward(
            cfg.d_model,
            cfg.ffn_dim,
            cfg.activation,
            cfg.bias,
            cfg.dropout,
            n_experts=cfg.n_experts,
            top_k=cfg.moe_top_k,
            capacity_factor=cfg.moe_capacity_factor,
            n_shared_experts=cfg.moe_shared_experts,
            expert_kind=cfg.ffn,
        )
    return build_ffn(cfg.ffn, cfg.d_model, cfg.ffn_dim, cfg.activation, bias=cfg.bias, dropout=cfg.dropout)


@dataclass
class LayerCache:
    """A block's key/value caches for incremental decoding."""

    self_attn: KVCache = field(default_factory=KVCache)
    cross_attn: KVCache = field(default_factory=KVCache)

    def reorder(self, indices: torch.Tensor) -> None:
        """Keep batch rows ``indices`` of both caches (see ``KVCache.reorder``)."""
        self.self_attn.reorder(indices)
        self.cross_attn.reorder(indices)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, *, causal: bool, cross_attention: bool = False, residual_scale: float = 1.0):
        super().__init__()
        self.causal = causal
        residual = PLACEMENTS.get(cfg.norm_placement)

        def wrap(sublayer: nn.Module) -> nn.Module:
            return residual(
                sublayer, cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias, cfg.dropout, residual_scale=residual_scale
            )

        # the sparse pattern restricts self-attention only; cross-attention sees the whole source
        sparsity = SparsePattern(
            cfg.attention_pattern, cfg.attention_window, cfg.attention_stride, cfg.attention_summary
        )

        def attention(cross: bool) -> MultiHeadAttention:
            return MultiHeadAttention(
                cfg.d_model,
                cfg.n_heads,
                n_kv_heads=cfg.n_kv_heads,
                cross=cross,
                bias=cfg.bias,
                dropout=cfg.dropout,
                score=cfg.attention_score,
                sparsity=None if cross else sparsity,
            )

        self.self_attn = wrap(attention(cross=False))
        self.cross_attn = wrap(attention(cross=True)) if cross_attention else None
        feed_forward = build_feed_forward(cfg)
        # an MoE routes each token against the others of the batch, so it must know the padding; a
        # dense FFN is position-wise, and padding cannot reach real tokens through it
        self.ffn_takes_padding = isinstance(feed_forward, MoEFeedForward)
        self.ffn = wrap(feed_forward)

    def forward(
        self,
        x: torch.Tensor,
        *,
        padding_mask: torch.Tensor | None = None,
        positional: PositionalEncoding | None = None,
        memory: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
        ffn_padding_mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        self_mask: AttentionMask | None = None,
        memory_mask: AttentionMask | None = None,
    ) -> torch.Tensor:
        """``padding_mask`` (B, T), True = padding, masks padded keys in self-attention and keeps
        padding out of the feed-forward's routing (MoE); with a ``cache`` it covers the cached
        positions too and ``x`` holds the last ones. ``ffn_padding_mask`` (the same positions)
        replaces it for the feed-forward only: a causal stack of right-padded sequences (the
        translator's decoder) needs no padding mask in attention, where the causal mask already
        hides later positions from every real token, but its MoE layers still must not route the
        padding. ``self_mask`` and ``memory_mask``: the self- and cross-attention masks its stack built
        once for all its blocks from these arguments (``AttentionMask``); without them, each attention
        builds its own."""
        x = self.self_attn(
            x,
            causal=self.causal,
            key_padding_mask=padding_mask,
            positional=positional,
            cache=cache.self_attn if cache else None,
            mask=self_mask,
        )
        if self.cross_attn is not None:
            x = self.cross_attn(
                x,
                memory,
                key_padding_mask=memory_padding_mask,
                cache=cache.cross_attn if cache else None,
                mask=memory_mask,
            )
        ffn_mask = padding_mask if ffn_padding_mask is None else ffn_padding_mask
        if not self.ffn_takes_padding or ffn_mask is None:
            return self.ffn(x)
        return self.ffn(x, padding_mask=ffn_mask[:, ffn_mask.shape[1] - x.shape[1] :])  # x's positions


class TransformerStack(nn.Module):
    """``n_layers`` blocks, plus a final norm when the placement needs one (pre-norm).

    ``architecture`` ("encoder", "decoder" or "encoder_decoder") and ``stack`` ("encoder" or
    "decoder") let placements that depend on depth (DeepNorm) compute their constants.

    Each forward builds the attention masks (causal, padding, sparse pattern, positional bias) once,
    for self-attention and for cross-attention, and hands them to every block (``AttentionMask``).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        n_layers: int,
        *,
        causal: bool,
        cross_attention: bool = False,
        architecture: str = "encoder",
        stack: str = "encoder",
    ):
        super().__init__()
        placement = PLACEMENTS.get(cfg.norm_placement)
        alpha, self.init_scale = placement.stack_constants(architecture, cfg.encoder_layers, cfg.decoder_layers, stack)
        self.placement = placement
        self.causal = causal
        self.cross_attention = cross_attention
        # the blocks' self-attention pattern (models.attention.SparsePattern), for the stack's masks
        self.sparsity = SparsePattern(
            cfg.attention_pattern, cfg.attention_window, cfg.attention_stride, cfg.attention_summary
        )
        self.blocks = nn.ModuleList(
            TransformerBlock(cfg, causal=causal, cross_attention=cross_attention, residual_scale=alpha)
            for _ in range(n_layers)
        )
        self.final_norm = (
            build_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias) if placement.final_norm else nn.Identity()
        )
        self.scaled_residual_init = placement.scaled_residual_init

    def scale_init(self) -> None:
        """The placement's own initialisation (DeepNorm's, with its beta); call after init_weights."""
        self.placement.init_stack_(self, self.init_scale)

    def new_caches(self) -> list[LayerCache]:
        return [LayerCache() for _ in self.blocks]

    def forward(
        self,
        x: torch.Tensor,
        caches: list[LayerCache] | None = None,
        *,
        padding_mask: torch.Tensor | None = None,
        positional: PositionalEncoding | None = None,
        memory: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
        ffn_padding_mask: torch.Tensor | None = None,
        block_outputs: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """``x`` (B, T, D) through every block (arguments as ``TransformerBlock.forward``; ``caches``
        one per block) and the final norm. With ``block_outputs``, also every block's output, first
        block first (the logit lens): ``(output, [block 0's output, ...])``."""
        q_len = x.shape[1]
        cached = caches[0].self_attn.length if caches else 0
        self_mask = AttentionMask(
            q_len,
            cached + q_len,
            causal=self.causal,
            key_padding_mask=padding_mask,
            positional=positional,
            sparsity=self.sparsity,
            device=x.device,
            cached=cached,
        )
        memory_mask = None
        if self.cross_attention and memory is not None:
            memory_mask = AttentionMask(
                q_len, memory.shape[1], causal=False, key_padding_mask=memory_padding_mask, device=x.device
            )
        outputs = []
        for i, block in enumerate(self.blocks):
            x = block(
                x,
                padding_mask=padding_mask,
                positional=positional,
                memory=memory,
                memory_padding_mask=memory_padding_mask,
                ffn_padding_mask=ffn_padding_mask,
                cache=caches[i] if caches else None,
                self_mask=self_mask,
                memory_mask=memory_mask,
            )
            if block_outputs:
                outputs.append(x)
        x = self.final_norm(x)
        return (x, outputs) if block_outputs else x


def init_weights(model: nn.Module, n_layers: int, std: float = 0.02) -> None:
    """GPT-2/nanoGPT initialisation: N(0, 0.02) for linear weights, zero biases, and
    N(0, 0.02 / sqrt(2 * n_layers)) for the projections that write into the residual stream;
    token tables N(0, EMBEDDING_STD), the embedding convention (``models.embedding``); then each
    stack's own scaling (``TransformerStack.scale_init``, e.g. DeepNorm)."""
    stacks = [m for m in model.modules() if isinstance(m, TransformerStack)]
    shrink_residual = all(s.scaled_residual_init for s in stacks)
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            residual_out = shrink_residual and name.endswith(("out_proj", "fc_out"))
            nn.init.normal_(m.weight, std=std / (2 * n_layers) ** 0.5 if residual_out else std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=EMBEDDING_STD)
    for stack in stacks:
        stack.scale_init()
