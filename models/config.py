"""One validated config object holds every architecture knob (cf. litgpt's ``Config``).

The fields are exactly the keys of a YAML ``model:`` section. Data-dependent fields
(``vocab_size``, ``n_classes``, ``image_size``, ...) are filled in by the task; a plain user of
the library sets them directly.

Validation checks what every model shares (``n_heads`` divides ``d_model``, ...) here, then asks
each variant the config selects by name (``VARIANT_REGISTRIES``) for its own checks
(``Registry.check``), so a variant's constraints live with the variant.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails

from .registry import ACTIVATIONS, ATTENTION_SCORES, FAMILIES, FFNS, NORMS, PLACEMENTS, POSITIONAL, SPARSITY, Registry

#: config fields that select a variant by name, and the registry each name must be in
VARIANT_REGISTRIES: dict[str, Registry] = {
    "family": FAMILIES,
    "norm": NORMS,
    "norm_placement": PLACEMENTS,
    "activation": ACTIVATIONS,
    "ffn": FFNS,
    "attention_score": ATTENTION_SCORES,
    "attention_pattern": SPARSITY,
    "pos_encoding": POSITIONAL,
}


class ModelConfig(BaseModel):
    """The architecture: every knob of the model a task builds (family, sizes, variants by name, MoE)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    family: str | None = Field(
        None, description="which model to build (decoder_lm, encoder_decoder, vit); set by the task"
    )
    # widths and depths, shared by all families so tasks stay comparable
    d_model: int = Field(128, gt=0, description="width: the size of each token's (or patch's) vector between blocks")
    n_layers: int = Field(4, gt=0, description="blocks per stack (the translator has an encoder and a decoder stack)")
    n_encoder_layers: int | None = Field(None, gt=0, description="encoder depth of encoder_decoder; default n_layers")
    n_decoder_layers: int | None = Field(None, gt=0, description="decoder depth of encoder_decoder; default n_layers")
    n_heads: int = Field(4, gt=0, description="attention (query) heads; must divide d_model")
    attention_score: str = Field("dot", description="attention score: dot (SDPA) or additive (Bahdanau)")
    attention_pattern: str = Field("dense", description="sparse self-attention pattern (Child et al. 2019)")
    attention_window: int = Field(16, gt=0, description="window of the local pattern")
    attention_stride: int = Field(8, gt=0, description="stride (block length) of the strided and fixed patterns")
    attention_summary: int = Field(1, ge=0, description="summary positions per block of the fixed pattern")
    n_kv_heads: int | None = Field(
        None, gt=0, description="key/value heads: n_heads = MHA (default), 1 = MQA, in between = GQA"
    )
    d_ff: int | None = Field(None, gt=0, description="feed-forward hidden size; default 4 * d_model")
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="dropout probability of embeddings, attention, FFN and residual branches; 0 = off",
    )
    bias: bool = Field(True, description="biases in the Linear layers and norms (false: none, as in PaLM and LLaMA)")
    # variants, selected by name (see `blockbench list`)
    norm: str = Field("layernorm", description="normalization layer")
    norm_eps: float = Field(
        1e-5, gt=0, description="epsilon the norm adds to the variance (or mean square) for stability"
    )
    norm_placement: str = Field("pre", description="where the norm sits around each residual branch")
    activation: str = Field(
        "gelu", description="activation of the mlp feed-forward (swiglu and geglu have their own gate)"
    )
    ffn: str = Field("mlp", description="feed-forward kind (mlp, swiglu, geglu); also the kind of each MoE expert")
    # mixture of experts in place of the FFN (n_experts=0: dense FFN)
    n_experts: int = Field(0, ge=0, description="experts per MoE layer; 0 = dense feed-forward")
    moe_top_k: int = Field(2, gt=0, description="experts each token is routed to")
    moe_capacity_factor: float | None = Field(
        1.25,
        gt=0,
        description="expert capacity factor in training, over the real (non-padding) tokens; null = no limit. "
        "Evaluation never drops tokens, so validation metrics do not depend on the batch size",
    )
    moe_shared_experts: int = Field(0, ge=0, description="always-on dense experts (DeepSeekMoE)")
    moe_aux_loss_weight: float = Field(0.01, ge=0, description="weight of the Switch load-balancing loss")
    moe_z_loss_weight: float = Field(0.001, ge=0, description="weight of the router z-loss (ST-MoE)")
    pos_encoding: str = Field("learned", description="how token (or patch) positions enter the model")
    rope_base: float = Field(10000.0, gt=1, description="RoPE frequency base")
    # token models
    vocab_size: int | None = Field(None, gt=0, description="token vocabulary size; set by the task from its data")
    max_seq_len: int = Field(
        256,
        gt=0,
        description=(
            "longest sequence (size of learned position tables); the token tasks set it to their sequence length"
        ),
    )
    tie_embeddings: bool = Field(True, description="the output projection shares the token embedding's weights")
    # vision
    image_size: int | None = Field(None, gt=0, description="image side in pixels (vit); set by the task")
    patch_size: int = Field(4, gt=0, description="side of a ViT patch in pixels; must divide image_size")
    in_channels: int = Field(3, gt=0, description="image channels (vit); set by the task")
    n_classes: int | None = Field(None, gt=1, description="classes of the ViT head; set by the task from its data")
    # execution (same math, different speed)
    compile: bool = Field(
        False,
        description="compile the model with torch.compile (nn.Module.compile): faster steps after a compile warm-up",
    )

    @field_validator(*VARIANT_REGISTRIES)
    @classmethod
    def _known_variant(cls, value: str | None, info: ValidationInfo) -> str | None:
        registry = VARIANT_REGISTRIES[info.field_name]
        if value is not None and value not in registry:
            raise ValueError(registry.unknown_message(value))
        return value

    @model_validator(mode="after")
    def _shapes(self) -> ModelConfig:
        """Shape checks every model shares; a variant's own checks are its ``check`` (``_variant_checks``)."""
        if self.d_model % self.n_heads:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0 and h <= 64]
            raise ValueError(
                f"n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                f"use one of {divisors} or change d_model"
            )
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}; "
                "each key/value head serves a whole group of query heads"
            )
        if self.n_experts and self.moe_top_k > self.n_experts:
            raise ValueError(
                f"moe_top_k={self.moe_top_k} exceeds n_experts={self.n_experts}; "
                "route each token to at most n_experts experts"
            )
        if self.image_size is not None and self.image_size % self.patch_size:
            raise ValueError(f"patch_size={self.patch_size} does not divide image_size={self.image_size}")
        return self

    @model_validator(mode="after")
    def _variant_checks(self) -> ModelConfig:
        """Every selected variant's own checks (``Registry.check``: RoPE's even head dimension,
        sincos2d's vit-only grid, ...), each reported at the field that selected the variant
        (``pos_encoding: ...``). Runs after ``_shapes``, so the checks may assume the shapes fit."""
        problems = []
        for field, registry in VARIANT_REGISTRIES.items():
            name = getattr(self, field)
            if name is None:
                continue
            try:
                registry.check(name, self)
            except ValueError as error:
                problems.append(InitErrorDetails(type="value_error", loc=(field,), input=name, ctx={"error": error}))
        if problems:
            # pydantic keeps the location of a ValidationError raised in a validator (a plain
            # ValueError would be reported at the model, not at the field)
            raise ValidationError.from_exception_data(type(self).__name__, problems)
        return self

    @property
    def ffn_dim(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def encoder_layers(self) -> int:
        return self.n_encoder_layers or self.n_layers

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    def require(self, *fields: str) -> None:
        """Raise a clear error if a field the family needs was left unset."""
        missing = [f for f in fields if getattr(self, f) is None]
        if missing:
            raise ValueError(
                f"model family '{self.family}' needs {', '.join(f'model.{m}' for m in missing)}; "
                "set it in the config (a task sets it from its data)"
            )
