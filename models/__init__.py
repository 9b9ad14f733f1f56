"""blockbench's block library: plain PyTorch modules, every variant selected by name.

from blockbench.models import build_model
model = build_model({"family": "decoder_lm", "vocab_size": 1000, "norm_placement": "post"})
"""

from . import attention, lm, mlp, norm, placement, position, translator, vit  # noqa: F401  (register variants)
from .attention import MultiHeadAttention
from .block import TransformerBlock, TransformerStack
from .build import build_model, count_parameters
from .config import ModelConfig
from .decoding import beam_search, generate, greedy_decode
from .introspection import (
    add_auxiliary_losses,
    attended_fraction,
    expert_load,
    extrapolating_pos_encodings,
    logit_lens_depth,
    logit_lens_losses,
    moe_layers,
)
from .lm import DecoderLM
from .registry import ALL_REGISTRIES
from .translator import EncoderDecoder
from .vit import VisionTransformer

__all__ = [
    "ALL_REGISTRIES",
    "DecoderLM",
    "EncoderDecoder",
    "ModelConfig",
    "MultiHeadAttention",
    "TransformerBlock",
    "TransformerStack",
    "VisionTransformer",
    "add_auxiliary_losses",
    "attended_fraction",
    "beam_search",
    "build_model",
    "count_parameters",
    "expert_load",
    "extrapolating_pos_encodings",
    "generate",
    "greedy_decode",
    "logit_lens_depth",
    "logit_lens_losses",
    "moe_layers",
]
