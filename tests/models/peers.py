"""Weight transplants from the implementations people use into blockbench's models, for the parity
tests (``test_peer_parity.py``): HF GPT-2, Llama and T5, timm's ViT and ``torch.nn.Transformer``.

Each peer has a ``build_*`` (the peer at a small shape, every weight redrawn by ``randomize_``: biases
and norm gains away from 0 and 1, so a dropped bias or a gain read as 1 shows), a ``*_config`` (the
blockbench model config that describes the same architecture) and a ``*_mapping``: a function from the
peer's parameters (``named_parameters``) to blockbench's, written with differentiable tensor operations
(transposes, slices, concatenations, sums and exact scalings). ``transplant`` copies the weights
through it, and ``pull_back`` carries blockbench's gradients back to the peer's parameters as the
vector-Jacobian product of the same mapping: since the peer's loss is blockbench's loss of the mapped
parameters, that is exactly the gradient the peer computes, a rename for a copied tensor, the sum of
both uses for a parameter the mapping folds into two of blockbench's or two into one.

Everything runs in float64. Where a peer computes in float32 whatever the model's dtype (HF's RMSNorm,
rotary angles and causal-LM loss), ``lift_to_float64`` replaces that one computation by the same
formula in float64, so that the comparison is float64 against float64 and any difference larger than
rounding (~1e-14 here) is a difference of the models. transformers and timm are imported inside the
functions that need them: importing them takes ~10 s of CPU, which every pytest-xdist worker would pay
at collection.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blockbench.models import build_model
from blockbench.models.mlp import gated_hidden_size

DT = torch.float64
#: the tolerance of every comparison: float64 rounding through two layers is ~1e-14
ATOL = 1e-10

Params = dict[str, Tensor]
#: the peer's parameters (by ``named_parameters`` name) -> blockbench's
Mapping = Callable[[Params], Params]

#: the sizes of every peer: d_model, layers, heads, vocabulary, sequence and batch
D_MODEL, N_LAYERS, N_HEADS, VOCAB, SEQ, BATCH = 64, 2, 4, 101, 12, 2


# --------------------------------------------------------------------------- the generic machinery


def randomize_(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Redraw every parameter from a normal distribution (mean, std): biases (0, 0.1), the other
    vectors, norm gains, (1, 0.2), matrices and tables (0, 1/sqrt(d_model)), enough for attention far
    from uniform."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1 and name.rsplit(".", 1)[-1] == "bias":
                p.normal_(0.0, 0.1, generator=generator)
            elif p.dim() == 1:
                p.normal_(1.0, 0.2, generator=generator)
            else:
                p.normal_(0.0, D_MODEL**-0.5, generator=generator)
    return module


def transplant(peer: nn.Module, ours: nn.Module, mapping: Mapping) -> nn.Module:
    """Copy the peer's weights into ``ours`` through ``mapping``, which must set each of our
    parameters (tied ones once) with a tensor of its shape; returns ``ours``."""
    with torch.no_grad():
        mapped = mapping(dict(peer.named_parameters()))
        params = dict(ours.named_parameters())
        missing, unknown = sorted(params.keys() - mapped.keys()), sorted(mapped.keys() - params.keys())
        assert not missing and not unknown, f"mapping leaves {missing} unset and sets {unknown}, not in the model"
        for name, value in mapped.items():
            assert value.shape == params[name].shape, f"{name}: {tuple(value.shape)} != {tuple(params[name].shape)}"
            params[name].copy_(value)
    return ours


def pull_back(peer: nn.Module, ours: nn.Module, mapping: Mapping) -> Params:
    """Our gradients (after backward) as gradients of the peer's parameters: the vector-Jacobian
    product of ``mapping`` at the peer's weights. Every peer parameter must reach ours."""
    leaves = {name: p.detach().clone().requires_grad_() for name, p in peer.named_parameters()}
    mapped = mapping(leaves)
    params = dict(ours.named_parameters())
    no_grad = [name for name in mapped if params[name].grad is None]
    assert not no_grad, f"blockbench parameters without a gradient: {no_grad}"
    grads = torch.autograd.grad(
        list(mapped.values()), list(leaves.values()), [params[n].grad for n in mapped], allow_unused=True
    )
    unused = [name for name, g in zip(leaves, grads, strict=True) if g is None]
    assert not unused, f"peer parameters the mapping never reads: {unused}"
    return dict(zip(leaves, grads, strict=True))


@dataclass
class Errors:
    """The largest absolute differences between the peer and blockbench."""

    logits: float
    loss: float
    grads: float


def max_error(actual: Tensor, expected: Tensor) -> float:
    return (actual - expected).abs().max().item()


def assert_parity(
    peer: nn.Module,
    ours: nn.Module,
    mapping: Mapping,
    peer_step: Callable[[], tuple[Tensor, Tensor]],
    our_step: Callable[[], tuple[Tensor, Tensor]],
) -> Errors:
    """Run each model's ``step`` (its logits and its training loss, with gradients), backpropagate
    each loss, and assert equal logits, losses and gradients of every peer parameter (ours pulled
    back through ``mapping``) within ``ATOL``; returns the largest differences."""
    for model in (peer, ours):
        model.zero_grad(set_to_none=True)
    peer_logits, peer_loss = peer_step()
    our_logits, our_loss = our_step()
    peer_loss.backward()
    our_loss.backward()
    close = dict(rtol=0.0, atol=ATOL)
    torch.testing.assert_close(our_logits, peer_logits, **close, msg=lambda m: f"logits: {m}")
    torch.testing.assert_close(our_loss, peer_loss, **close, msg=lambda m: f"loss: {m}")
    pulled = pull_back(peer, ours, mapping)
    grad_error = 0.0
    for name, p in peer.named_parameters():
        assert p.grad is not None, f"the peer's {name} got no gradient"
        torch.testing.assert_close(pulled[name], p.grad, **close, msg=lambda m, name=name: f"grad of {name}: {m}")
        grad_error = max(grad_error, max_error(pulled[name], p.grad))
    return Errors(max_error(our_logits, peer_logits), max_error(our_loss, peer_loss), grad_error)


def tokens(generator: torch.Generator, batch: int = BATCH, length: int = SEQ) -> Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=generator)


def ours_for(config: dict) -> nn.Module:
    """blockbench's model for ``config`` (dropout 0), in float64 and eval mode."""
    return build_model({"dropout": 0.0, **config}).to(DT).eval()


# --------------------------------------------------------------------------- float64 throughout


def rms_norm_float64(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """HF's RMSNorm formula (``LlamaRMSNorm``, ``T5LayerNorm``), ``weight * x / sqrt(mean(x^2) + eps)``,
    without their cast of ``x`` (Llama) or of its mean square (T5) to float32."""

    def forward(x: Tensor) -> Tensor:
        return module.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon))

    return forward


def rotary_float64(module: nn.Module) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """HF's default rotary embedding (``LlamaRotaryEmbedding.forward`` with
    ``compute_default_rope_parameters``), ``inv_freq = 1 / base^(2i/dim)`` and ``position * inv_freq``,
    computed in float64: HF computes both in float32 in any model (its logits then move by ~3e-7 here)."""
    base = module.config.rope_parameters["rope_theta"]
    dim = 2 * module.inv_freq.shape[0]

    def forward(x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=DT, device=x.device) / dim))
        freqs = position_ids[..., None].to(DT) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * module.attention_scaling, emb.sin() * module.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)

    return forward


def causal_lm_loss_float64(logits: Tensor, labels: Tensor, vocab_size: int, **kwargs) -> Tensor:
    """HF's ``ForCausalLMLoss`` (labels shifted left by one, -100 ignored, mean over the rest) without
    its cast of the logits to float32."""
    assert kwargs.get("num_items_in_batch") is None
    shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
    return F.cross_entropy(logits.reshape(-1, vocab_size), shifted.reshape(-1), ignore_index=-100)


def lift_to_float64(model: nn.Module) -> nn.Module:
    """The HF model in float64, each of its float32 computations replaced by its float64 form: the
    RMSNorm and rotary forwards (per instance) and a causal LM's loss function."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    model.to(DT)
    for module in model.modules():
        if isinstance(module, LlamaRMSNorm | T5LayerNorm):
            module.forward = rms_norm_float64(module)
        elif isinstance(module, LlamaRotaryEmbedding):
            module.forward = rotary_float64(module)
    if not model.config.is_encoder_decoder:
        model.loss_function = causal_lm_loss_float64
    return model


def block_mapping(p: Params, src: str, dst: str, parts: dict[str, Callable[[Params, str], Tensor] | str]) -> Params:
    """``{dst + name: value}`` for each of blockbench's parameters ``name`` in ``parts``, read from the
    peer's parameter ``src + value`` (a str) or computed by ``value(p, src)``."""
    return {
        dst + ours: (p[src + theirs] if isinstance(theirs, str) else theirs(p, src)) for ours, theirs in parts.items()
    }


# --------------------------------------------------------------------------- HF GPT-2


def build_gpt2(activation_function: str, generator: torch.Generator) -> nn.Module:
    """HF ``GPT2LMHeadModel``: pre-norm LayerNorm, learned positions, tied embeddings, biases."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=D_MODEL,
        n_layer=N_LAYERS,
        n_head=N_HEADS,
        activation_function=activation_function,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="sdpa",
    )
    return lift_to_float64(randomize_(GPT2LMHeadModel(config), generator)).eval()


#: HF's activation_function -> blockbench's activation
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu": "gelu"}


def gpt2_config(peer: nn.Module) -> dict:
    c = peer.config
    return {
        "family": "decoder_lm",
        "vocab_size": c.vocab_size,
        "max_seq_len": c.n_positions,
        "d_model": c.n_embd,
        "n_layers": c.n_layer,
        "n_heads": c.n_head,
        "d_ff": 4 * c.n_embd,
        "norm": "layernorm",
        "norm_eps": c.layer_norm_epsilon,
        "norm_placement": "pre",
        "activation": GPT2_ACTIVATIONS[c.activation_function],
        "pos_encoding": "learned",
        "bias": True,
        "tie_embeddings": True,
    }


def gpt2_mapping(p: Params) -> Params:
    """GPT-2's ``Conv1D`` stores its weight (in, out): blockbench's ``nn.Linear`` holds the transpose.
    ``c_attn`` projects to [q; k; v], blockbench's ``qkv_proj`` the same; ``lm_head`` is tied to ``wte``."""
    out = {"tok_emb.weight": p["transformer.wte.weight"], "positions.weight": p["transformer.wpe.weight"]}
    layers = {int(name.split(".")[2]) for name in p if name.startswith("transformer.h.")}
    for i in sorted(layers):
        out |= block_mapping(
            p,
            f"transformer.h.{i}.",
            f"stack.blocks.{i}.",
            {
                "self_attn.norm.weight": "ln_1.weight",
                "self_attn.norm.bias": "ln_1.bias",
                "self_attn.sublayer.qkv_proj.weight": lambda p, s: p[s + "attn.c_attn.weight"].t(),
                "self_attn.sublayer.qkv_proj.bias": "attn.c_attn.bias",
                "self_attn.sublayer.out_proj.weight": lambda p, s: p[s + "attn.c_proj.weight"].t(),
                "self_attn.sublayer.out_proj.bias": "attn.c_proj.bias",
                "ffn.norm.weight": "ln_2.weight",
                "ffn.norm.bias": "ln_2.bias",
                "ffn.sublayer.fc_in.weight": lambda p, s: p[s + "mlp.c_fc.weight"].t(),
                "ffn.sublayer.fc_in.bias": "mlp.c_fc.bias",
                "ffn.sublayer.fc_out.weight": lambda p, s: p[s + "mlp.c_proj.weight"].t(),
                "ffn.sublayer.fc_out.bias": "mlp.c_proj.bias",
            },
        )
    out |= {
        "stack.final_norm.weight": p["transformer.ln_f.weight"],
        "stack.final_norm.bias": p["transformer.ln_f.bias"],
    }
    return out


# --------------------------------------------------------------------------- HF Llama


def build_llama(n_kv_heads: int, tied: bool, generator: torch.Generator) -> nn.Module:
    """HF ``LlamaForCausalLM``: RMSNorm, RoPE, SwiGLU of blockbench's gated width for d_ff = 4 d_model,
    no biases; SDPA attention (its eager path takes the softmax in float32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        intermediate_size=gated_hidden_size(4 * D_MODEL),
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=SEQ,
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="sdpa",
    )
    return lift_to_float64(randomize_(LlamaForCausalLM(config), generator)).eval()


def llama_config(peer: nn.Module) -> dict:
    c = peer.config
    assert c.rope_parameters["rope_type"] == "default" and c.intermediate_size == gated_hidden_size(4 * c.hidden_size)
    return {
        "family": "decoder_lm",
        "vocab_size": c.vocab_size,
        "max_seq_len": c.max_position_embeddings,
        "d_model": c.hidden_size,
        "n_layers": c.num_hidden_layers,
        "n_heads": c.num_attention_heads,
        "n_kv_heads": c.num_key_value_heads,
        "d_ff": 4 * c.hidden_size,
        "ffn": "swiglu",
        "norm": "rmsnorm",
        "norm_eps": c.rms_norm_eps,
        "norm_placement": "pre",
        "pos_encoding": "rope",
        "rope_base": c.rope_parameters["rope_theta"],
        "bias": False,
        "tie_embeddings": c.tie_word_embeddings,
    }


def llama_mapping(p: Params) -> Params:
    """Separate q, k, v projections -> blockbench's fused [q; k; v] (k and v n_kv_heads wide); gate_proj,
    up_proj, down_proj -> fc_gate, fc_in, fc_out (``silu(gate) * up``). Both rotate the half-split pairs
    (i, i + head_dim/2), so q and k need no permutation. Without tying, ``lm_head`` is a matrix of its own."""
    out = {"tok_emb.weight": p["model.embed_tokens.weight"], "stack.final_norm.weight": p["model.norm.weight"]}
    if "lm_head.weight" in p:
        out["lm_head.weight"] = p["lm_head.weight"]
    layers = {int(name.split(".")[2]) for name in p if name.startswith("model.layers.")}
    for i in sorted(layers):
        out |= block_mapping(
            p,
            f"model.layers.{i}.",
            f"stack.blocks.{i}.",
            {
                "self_attn.norm.weight": "input_layernorm.weight",
                "self_attn.sublayer.qkv_proj.weight": lambda p, s: torch.cat(
                    [p[s + f"self_attn.{x}_proj.weight"] for x in "qkv"]
                ),
                "self_attn.sublayer.out_proj.weight": "self_attn.o_proj.weight",
                "ffn.norm.weight": "post_attention_layernorm.weight",
                "ffn.sublayer.fc_gate.weight": "mlp.gate_proj.weight",
                "ffn.sublayer.fc_in.weight": "mlp.up_proj.weight",
                "ffn.sublayer.fc_out.weight": "mlp.down_proj.weight",
            },
        )
    return out


# --------------------------------------------------------------------------- timm's ViT


def build_timm_vit(generator: torch.Generator) -> nn.Module:
    """timm's ``VisionTransformer``: 16x16 images in 4x4 patches, a class token, learned positions
    (the class token's included), pre-norm LayerNorm (eps 1e-6), exact GELU, qkv bias, token pooling."""
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(
        img_size=16,
        patch_size=4,
        in_chans=3,
        num_classes=10,
        embed_dim=D_MODEL,
        depth=N_LAYERS,
        num_heads=N_HEADS,
        mlp_ratio=4.0,
        qkv_bias=True,
        class_token=True,
        global_pool="token",
    )
    return randomize_(model, generator).to(DT).eval()


def timm_vit_config(peer: nn.Module) -> dict:
    assert peer.has_class_token and not peer.no_embed_class and peer.global_pool == "token"
    return {
        "family": "vit",
        "image_size": peer.patch_embed.img_size[0],
        "patch_size": peer.patch_embed.patch_size[0],
        "in_channels": peer.patch_embed.proj.in_channels,
        "n_classes": peer.num_classes,
        "d_model": peer.embed_dim,
        "n_layers": len(peer.blocks),
        "n_heads": peer.blocks[0].attn.num_heads,
        "d_ff": peer.blocks[0].mlp.fc1.out_features,
        "norm": "layernorm",
        "norm_eps": peer.norm.eps,
        "norm_placement": "pre",
        "activation": "gelu",
        "pos_encoding": "learned",
        "bias": True,
    }


def timm_vit_mapping(p: Params) -> Params:
    """timm adds ``pos_embed[0]`` to the class token, blockbench gives the class token no position: the
    class token's input is ``cls_token + pos_embed[0]`` in timm and ``cls_token`` in blockbench, so
    blockbench's is the sum (an exact reparametrisation: the same model); the patches take
    ``pos_embed[1:]``. The gradient of that sum is the gradient of both of timm's terms, which is what
    ``pull_back`` returns for each."""
    out = {
        "cls_token": p["cls_token"] + p["pos_embed"][:, :1],
        "positions.weight": p["pos_embed"][0, 1:],
        "patch_embed.proj.weight": p["patch_embed.proj.weight"],
        "patch_embed.proj.bias": p["patch_embed.proj.bias"],
        "stack.final_norm.weight": p["norm.weight"],
        "stack.final_norm.bias": p["norm.bias"],
        "head.weight": p["head.weight"],
        "head.bias": p["head.bias"],
    }
    layers = {int(name.split(".")[1]) for name in p if name.startswith("blocks.")}
    for i in sorted(layers):
        parts = {
            "self_attn.norm": "norm1",
            "self_attn.sublayer.qkv_proj": "attn.qkv",
            "self_attn.sublayer.out_proj": "attn.proj",
            "ffn.norm": "norm2",
            "ffn.sublayer.fc_in": "mlp.fc1",
            "ffn.sublayer.fc_out": "mlp.fc2",
        }
        out |= block_mapping(
            p,
            f"blocks.{i}.",
            f"stack.blocks.{i}.",
            {f"{a}.{w}": f"{b}.{w}" for a, b in parts.items() for w in ("weight", "bias")},
        )
    return out


# --------------------------------------------------------------------------- torch.nn.Transformer


class TorchSeq2Seq(nn.Module):
    """``torch.nn.Transformer`` as a translator: a token table (also the tied output layer) and one
    learned position table added to source and target, as blockbench's translator has them (nn.Transformer
    itself has neither). nn.Transformer gives each stack a final LayerNorm in both placements; the
    original post-norm Transformer has none, nor has blockbench's post placement, so the post-norm one
    drops them (``norm=None``, nn.TransformerEncoder's and nn.TransformerDecoder's own default)."""

    def __init__(self, *, norm_first: bool, activation: str, d_ff: int = 2 * D_MODEL):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, D_MODEL)
        self.positions = nn.Parameter(torch.zeros(SEQ, D_MODEL))
        with warnings.catch_warnings():  # nested tensors are for inference; none here
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.transformer = nn.Transformer(
                D_MODEL,
                N_HEADS,
                N_LAYERS,
                N_LAYERS,
                d_ff,
                dropout=0.0,
                activation=activation,
                batch_first=True,
                norm_first=norm_first,
            )
        if not norm_first:
            self.transformer.encoder.norm = self.transformer.decoder.norm = None
        self.norm_first, self.activation = norm_first, activation

    def forward(self, src: Tensor, tgt: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        def embed(t: Tensor) -> Tensor:
            return self.tok_emb(t) + self.positions[: t.shape[1]]

        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=DT)
        hidden = self.transformer(
            embed(src),
            embed(tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_padding_mask,
            memory_key_padding_mask=src_padding_mask,
            tgt_is_causal=True,
        )
        return F.linear(hidden, self.tok_emb.weight)


def build_torch_seq2seq(norm_first: bool, activation: str, generator: torch.Generator) -> TorchSeq2Seq:
    return randomize_(TorchSeq2Seq(norm_first=norm_first, activation=activation), generator).to(DT).eval()


def torch_seq2seq_config(peer: TorchSeq2Seq) -> dict:
    layer = peer.transformer.encoder.layers[0]
    return {
        "family": "encoder_decoder",
        "vocab_size": VOCAB,
        "max_seq_len": SEQ,
        "d_model": peer.transformer.d_model,
        "n_layers": len(peer.transformer.encoder.layers),
        "n_decoder_layers": len(peer.transformer.decoder.layers),
        "n_heads": peer.transformer.nhead,
        "d_ff": layer.linear1.out_features,
        "norm": "layernorm",
        "norm_eps": layer.norm1.eps,
        "norm_placement": "pre" if peer.norm_first else "post",
        "activation": peer.activation,
        "pos_encoding": "learned",
        "bias": True,
        "tie_embeddings": True,
    }


def torch_seq2seq_mapping(p: Params) -> Params:
    """``in_proj_weight`` is [q; k; v]: the self-attention's is blockbench's ``qkv_proj``, the
    cross-attention's splits into ``q_proj`` and ``kv_proj`` ([k; v]). norm1, norm2 (and the decoder's
    norm3) are the norms of the sublayers in order; the stacks' final norms exist in the pre-norm one."""
    d = p["tok_emb.weight"].shape[1]
    out = {"tok_emb.weight": p["tok_emb.weight"], "positions.weight": p["positions"]}
    for stack in ("encoder", "decoder"):
        prefix = f"transformer.{stack}."
        layers = {int(name[len(prefix) :].split(".")[1]) for name in p if name.startswith(prefix + "layers.")}
        for i in sorted(layers):
            parts = {
                "self_attn.sublayer.qkv_proj.weight": "self_attn.in_proj_weight",
                "self_attn.sublayer.qkv_proj.bias": "self_attn.in_proj_bias",
                "self_attn.sublayer.out_proj.weight": "self_attn.out_proj.weight",
                "self_attn.sublayer.out_proj.bias": "self_attn.out_proj.bias",
                "ffn.sublayer.fc_in.weight": "linear1.weight",
                "ffn.sublayer.fc_in.bias": "linear1.bias",
                "ffn.sublayer.fc_out.weight": "linear2.weight",
                "ffn.sublayer.fc_out.bias": "linear2.bias",
            }
            norms = ["self_attn", "cross_attn", "ffn"] if stack == "decoder" else ["self_attn", "ffn"]
            for k, sublayer in enumerate(norms, start=1):
                parts |= {f"{sublayer}.norm.{w}": f"norm{k}.{w}" for w in ("weight", "bias")}
            if stack == "decoder":
                parts |= {
                    "cross_attn.sublayer.q_proj.weight": lambda p, s: p[s + "multihead_attn.in_proj_weight"][:d],
                    "cross_attn.sublayer.q_proj.bias": lambda p, s: p[s + "multihead_attn.in_proj_bias"][:d],
                    "cross_attn.sublayer.kv_proj.weight": lambda p, s: p[s + "multihead_attn.in_proj_weight"][d:],
                    "cross_attn.sublayer.kv_proj.bias": lambda p, s: p[s + "multihead_attn.in_proj_bias"][d:],
                    "cross_attn.sublayer.out_proj.weight": "multihead_attn.out_proj.weight",
                    "cross_attn.sublayer.out_proj.bias": "multihead_attn.out_proj.bias",
                }
            out |= block_mapping(p, f"{prefix}layers.{i}.", f"{stack}.blocks.{i}.", parts)
        if prefix + "norm.weight" in p:
            out |= {f"{stack}.final_norm.{w}": p[f"{prefix}norm.{w}"] for w in ("weight", "bias")}
    return out


# --------------------------------------------------------------------------- HF T5


def build_t5(generator: torch.Generator) -> nn.Module:
    """HF ``T5ForConditionalGeneration`` (the original T5: ReLU feed-forward, tied embeddings with the
    decoder output scaled by d_model^-1/2): RMSNorm without bias, pre-norm, no biases, a relative
    position bias table in the first layer of each stack, shared by the stack's layers. Its tables get
    N(0, 1) values, so a bias read from the wrong table, or bucketed the wrong way, moves the scores."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB,
        d_model=D_MODEL,
        d_kv=D_MODEL // N_HEADS,
        d_ff=2 * D_MODEL,
        num_layers=N_LAYERS,
        num_heads=N_HEADS,
        dropout_rate=0.0,
        feed_forward_proj="relu",
        attn_implementation="sdpa",
    )
    model = randomize_(T5ForConditionalGeneration(config), generator)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_attention_bias" in name:
                p.normal_(0.0, 1.0, generator=generator)
    return lift_to_float64(model).eval()


def t5_config(peer: nn.Module) -> dict:
    c = peer.config
    assert c.d_kv * c.num_heads == c.d_model and c.feed_forward_proj == "relu" and not c.is_gated_act
    # blockbench's T5RelativePositionBias has T5's default buckets
    assert (c.relative_attention_num_buckets, c.relative_attention_max_distance) == (32, 128)
    return {
        "family": "encoder_decoder",
        "vocab_size": c.vocab_size,
        "d_model": c.d_model,
        "n_layers": c.num_layers,
        "n_decoder_layers": c.num_decoder_layers,
        "n_heads": c.num_heads,
        "d_ff": c.d_ff,
        "norm": "rmsnorm",
        "norm_eps": c.layer_norm_epsilon,
        "norm_placement": "pre",
        "activation": "relu",
        "pos_encoding": "relative",
        "bias": False,
        "tie_embeddings": True,
    }


def t5_mapping(p: Params, *, head_dim: int, output_scale: float) -> Params:
    """T5 does not scale q.k by 1/sqrt(head_dim), blockbench does: blockbench's query weights are T5's
    times sqrt(head_dim) (exactly 4 at head_dim 16), the same scores. The encoder's relative bias table
    (bidirectional buckets) is blockbench's ``positions``, the decoder's (causal buckets)
    ``target_positions``. T5 multiplies the decoder output by ``output_scale`` (d_model^-1/2) before the
    tied output layer; blockbench has no such factor, and the decoder's final norm feeds only the
    output layer, so its gain is T5's times that factor (exactly 1/8 at d_model 64)."""
    sqrt_hd = math.sqrt(head_dim)
    table = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    out = {
        "tok_emb.weight": p["shared.weight"],
        "positions.weight": p["encoder." + table],
        "target_positions.weight": p["decoder." + table],
        "encoder.final_norm.weight": p["encoder.final_layer_norm.weight"],
        "decoder.final_norm.weight": p["decoder.final_layer_norm.weight"] * output_scale,
    }
    for stack in ("encoder", "decoder"):
        layers = {int(name.split(".")[2]) for name in p if name.startswith(f"{stack}.block.")}
        for i in sorted(layers):
            ffn = 2 if stack == "decoder" else 1
            parts = {
                "self_attn.norm.weight": "layer.0.layer_norm.weight",
                "self_attn.sublayer.qkv_proj.weight": lambda p, s: torch.cat(
                    [p[s + "layer.0.SelfAttention.q.weight"] * sqrt_hd]
                    + [p[s + f"layer.0.SelfAttention.{x}.weight"] for x in "kv"]
                ),
                "self_attn.sublayer.out_proj.weight": "layer.0.SelfAttention.o.weight",
                "ffn.norm.weight": f"layer.{ffn}.layer_norm.weight",
                "ffn.sublayer.fc_in.weight": f"layer.{ffn}.DenseReluDense.wi.weight",
                "ffn.sublayer.fc_out.weight": f"layer.{ffn}.DenseReluDense.wo.weight",
            }
            if stack == "decoder":
                parts |= {
                    "cross_attn.norm.weight": "layer.1.layer_norm.weight",
                    "cross_attn.sublayer.q_proj.weight": lambda p, s: (
                        p[s + "layer.1.EncDecAttention.q.weight"] * sqrt_hd
                    ),
                    "cross_attn.sublayer.kv_proj.weight": lambda p, s: torch.cat(
                        [p[s + f"layer.1.EncDecAttention.{x}.weight"] for x in "kv"]
                    ),
                    "cross_attn.sublayer.out_proj.weight": "layer.1.EncDecAttention.o.weight",
                }
            out |= block_mapping(p, f"{stack}.block.{i}.", f"{stack}.blocks.{i}.", parts)
    return out


def t5_mapping_for(peer: nn.Module) -> Mapping:
    c = peer.config
    output_scale = c.d_model**-0.5 if c.scale_decoder_outputs else 1.0

    def mapping(p: Params) -> Params:
        return t5_mapping(p, head_dim=c.d_kv, output_scale=output_scale)

    return mapping
