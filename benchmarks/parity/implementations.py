"""The models the benchmark scripts compare: blockbench's and the implementations people already use.

Every builder takes ``(torch, generator, dims)`` (nanoGPT's also the path of its source) and
returns a ``Run``: the model (drawn from the global RNG, so seed it first), a random batch drawn
from ``generator`` (the same batch for every implementation of a family at the same ``dims``),
and the loss the implementation is trained with:
ours through the loss functions blockbench's tasks call in training, the references as their users
do (``F.cross_entropy`` on the logits, inside nanoGPT's forward, or through litgpt's
``chunked_cross_entropy``). ``torch`` is passed in so that a script can import it only in the
process that needs it. Our models are built through ``models.build_model``, so every change to
the library shows up here.

Two references are not in the ``bench`` extra, and a run without them says so and goes on:
nanoGPT is a repository, not a package, so its ``model.py`` is imported from the user's clone
(``load_nanogpt``; its code is never copied here); no litgpt release installs beside
``constraints.txt``'s pins (0.5.10+ needs ``huggingface-hub<1.4``, transformers 5 ``>=1.31``;
0.5.8-0.5.9 need numpy<2), so it runs where the user has installed it.

Used by ``benchmarks.speed.throughput`` and ``benchmarks.speed.profile_step`` (speed), the GPU check
(``benchmarks.gpu.check``) and ``benchmarks.parity.init_parity`` (fitting a fixed batch from each
implementation's own initialisation).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Dims:
    """The sizes of one comparison; each family reads the fields it needs."""

    d_model: int
    n_layers: int  # per stack: the encoder-decoder has n_layers encoder + n_layers decoder blocks
    n_heads: int
    d_ff: int  # dense FFN width; a gated FFN (Llama) has gated_hidden_size(d_ff), the same weight count
    batch: int
    vocab: int = 8192
    seq_len: int = 256  # LM context; encoder-decoder source length (targets have one token more, BOS)
    n_kv_heads: int | None = None  # Llama only
    image_size: int = 32
    patch_size: int = 4
    n_classes: int = 10
    norm_placement: str = "post"  # encoder-decoder only (the decoder LMs and ViTs are pre-norm)
    activation: str = "relu"  # encoder-decoder only (GPT and ViT use GELU, Llama SwiGLU)


#: GPT-2 small (124M with its 50257-token vocabulary padded to 50304, as nanoGPT pads it): the GPU
#: check's throughput shape, which the profiler takes too
GPT2_SMALL = Dims(d_model=768, n_layers=12, n_heads=12, d_ff=3072, batch=16, vocab=50304, seq_len=1024)
GPT2_SMALL_NAME = "gpt2_small"


def describe_dims(dims: Dims) -> str:
    """A GPT shape in words (GPT-2 small's named)."""
    name = "GPT-2 small" if dims == GPT2_SMALL else "GPT"
    return (
        f"{name}: d {dims.d_model}, {dims.n_layers} layers, {dims.n_heads} heads, context {dims.seq_len}, vocab "
        f"{dims.vocab}, FFN {dims.d_ff} GELU, learned positions, pre-LN, biases, tied embeddings; batch {dims.batch} "
        f"sequences ({dims.batch * dims.seq_len:,} tokens) per step"
    )


@dataclass
class Run:
    """What one implementation needs for a training step: the model, a batch, and its loss."""

    model: Any
    batch: tuple
    loss: Callable[[Any, tuple], Any]
    items: int  # tokens or images per step
    note: str
    #: parameters minus blockbench's at the same dims, and why, where the reference cannot match them
    param_difference: int = 0
    param_difference_why: str = ""


Builder = Callable[[Any, Any, Dims], Run]


# --------------------------------------------------------------------------------- blockbench
def _token_batch(torch, generator, rows: int, length: int, vocab: int):
    return torch.randint(0, vocab, (rows, length), generator=generator)


def _image_batch(torch, generator, dims: Dims) -> tuple:
    images = torch.randn(dims.batch, 3, dims.image_size, dims.image_size, generator=generator)
    labels = torch.randint(0, dims.n_classes, (dims.batch,), generator=generator)
    return images, labels


def _seq2seq_batch(torch, generator, dims: Dims) -> tuple:
    src = _token_batch(torch, generator, dims.batch, dims.seq_len, dims.vocab).clamp(min=1)  # id 0 is padding
    tgt = _token_batch(torch, generator, dims.batch, dims.seq_len + 1, dims.vocab).clamp(min=1)
    return src, tgt


def _ours(model_fields: dict[str, Any]):
    from blockbench.models import ModelConfig, build_model

    return build_model(ModelConfig(**model_fields))


def lm_fields(dims: Dims, **fields: Any) -> dict[str, Any]:
    """blockbench's decoder LM at ``dims`` (vocabulary, context, width, depth, heads, FFN), with ``fields``."""
    return dict(
        family="decoder_lm",
        vocab_size=dims.vocab,
        max_seq_len=dims.seq_len,
        d_model=dims.d_model,
        n_layers=dims.n_layers,
        n_heads=dims.n_heads,
        d_ff=dims.d_ff,
        **fields,
    )


def ours_lm_gpt(torch, generator, dims: Dims) -> Run:
    from blockbench.tasks.lm import next_token_loss

    model = _ours(
        lm_fields(
            dims,
            activation="gelu",
            norm="layernorm",
            norm_placement="pre",
            pos_encoding="learned",
            bias=True,
            tie_embeddings=True,
        )
    )
    rows = _token_batch(torch, generator, dims.batch, dims.seq_len + 1, dims.vocab)
    return Run(
        model,
        (rows,),
        lambda m, b: next_token_loss(m, b[0]),
        dims.batch * dims.seq_len,
        "blockbench decoder_lm; loss: tasks.lm.next_token_loss (as the LM tasks train)",
    )


def ours_lm_llama(torch, generator, dims: Dims) -> Run:
    from blockbench.tasks.lm import next_token_loss

    model = _ours(
        lm_fields(
            dims,
            n_kv_heads=dims.n_kv_heads,
            ffn="swiglu",
            norm="rmsnorm",
            norm_eps=1e-6,
            norm_placement="pre",
            pos_encoding="rope",
            bias=False,
            tie_embeddings=False,
        )
    )
    rows = _token_batch(torch, generator, dims.batch, dims.seq_len + 1, dims.vocab)
    return Run(
        model,
        (rows,),
        lambda m, b: next_token_loss(m, b[0]),
        dims.batch * dims.seq_len,
        f"blockbench decoder_lm (rmsnorm, rope, swiglu with d_ff {dims.d_ff} = hidden {_gated(dims)}, "
        f"n_kv_heads {dims.n_kv_heads}, no bias)",
    )


def ours_vit(torch, generator, dims: Dims) -> Run:
    from blockbench.tasks.vision import classification_loss

    model = _ours(
        dict(
            family="vit",
            image_size=dims.image_size,
            patch_size=dims.patch_size,
            in_channels=3,
            n_classes=dims.n_classes,
            d_model=dims.d_model,
            n_layers=dims.n_layers,
            n_heads=dims.n_heads,
            d_ff=dims.d_ff,
            activation="gelu",
            norm="layernorm",
            norm_placement="pre",
            pos_encoding="learned",
            bias=True,
        )
    )
    return Run(
        model,
        _image_batch(torch, generator, dims),
        lambda m, b: classification_loss(m, *b),
        dims.batch,
        "blockbench vit; loss: tasks.vision.classification_loss",
    )


def ours_seq2seq(torch, generator, dims: Dims) -> Run:
    from blockbench.tasks.translation import teacher_forcing_loss

    model = _ours(
        dict(
            family="encoder_decoder",
            vocab_size=dims.vocab,
            max_seq_len=dims.seq_len + 1,
            d_model=dims.d_model,
            n_layers=dims.n_layers,
            n_heads=dims.n_heads,
            d_ff=dims.d_ff,
            activation=dims.activation,
            norm="layernorm",
            norm_placement=dims.norm_placement,
            pos_encoding="sinusoidal",
            bias=True,
            tie_embeddings=True,
        )
    )
    return Run(
        model,
        _seq2seq_batch(torch, generator, dims),
        lambda m, b: teacher_forcing_loss(m, *b, pad_id=0),
        dims.batch * dims.seq_len,
        "blockbench encoder_decoder; loss: tasks.translation.teacher_forcing_loss (padding masks as in training)",
    )


# --------------------------------------------------------------------------------- references
def _gated(dims: Dims) -> int:
    from blockbench.models.mlp import gated_hidden_size

    return gated_hidden_size(dims.d_ff)


def _lm_logits_loss(torch):
    import torch.nn.functional as F

    def loss(model, batch):
        rows = batch[0]
        logits = model(input_ids=rows[:, :-1]).logits
        return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())

    return loss


def hf_gpt2(torch, generator, dims: Dims) -> Run:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=dims.vocab,
        n_positions=dims.seq_len,
        n_embd=dims.d_model,
        n_layer=dims.n_layers,
        n_head=dims.n_heads,
        n_inner=dims.d_ff,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
    rows = _token_batch(torch, generator, dims.batch, dims.seq_len + 1, dims.vocab)
    return Run(
        model,
        (rows,),
        _lm_logits_loss(torch),
        dims.batch * dims.seq_len,
        "transformers GPT2LMHeadModel, sdpa attention, exact GELU (GPT-2's default is the tanh approximation), tied",
    )


def hf_llama(torch, generator, dims: Dims) -> Run:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=dims.vocab,
        hidden_size=dims.d_model,
        intermediate_size=_gated(dims),
        num_hidden_layers=dims.n_layers,
        num_attention_heads=dims.n_heads,
        num_key_value_heads=dims.n_kv_heads,
        max_position_embeddings=dims.seq_len,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    rows = _token_batch(torch, generator, dims.batch, dims.seq_len + 1, dims.vocab)
    return Run(
        model,
        (rows,),
        _lm_logits_loss(torch),
        dims.batch * dims.seq_len,
        "transformers LlamaForCausalLM, sdpa attention, rope_theta 1e4, untied",
    )


NANOGPT_HINT = (
    "pass --nanogpt PATH (nanoGPT's model.py, or the folder of a clone of "
    "https://github.com/karpathy/nanoGPT; it is a repository, not a pip package)"
)


def load_nanogpt(path: str | Path) -> ModuleType:
    """nanoGPT's ``model.py`` imported from the user's copy: the file, or the folder that holds it.

    Imported from where the user keeps it rather than copied into blockbench, so what is timed is
    the code they run (and its license stays with it). Loading the same file twice returns the
    module already loaded."""
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "model.py"
    if not file.is_file():
        raise FileNotFoundError(f"no nanoGPT model.py at {path}: {NANOGPT_HINT}")
    file = file.resolve()
    name = "nanogpt_model_" + hashlib.sha256(str(file).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # @dataclass (its GPTConfig) looks its module up while the file runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    missing = [attr for attr in ("GPT", "GPTConfig") if not hasattr(module, attr)]
    if missing:
        del sys.modules[name]
        raise ImportError(f"{file} defines no {' or '.join(missing)}: it is not nanoGPT's model.py; {NANOGPT_HINT}")
    return module


def file_digest(path: str | Path) -> str:
    """The first 12 hex digits of a file's SHA-256: which version of a user's file was timed."""
    file = Path(path).expanduser()
    return hashlib.sha256((file / "model.py" if file.is_dir() else file).read_bytes()).hexdigest()[:12]


def nanogpt(torch, generator, dims: Dims, source: str | Path) -> Run:
    """nanoGPT's GPT at the GPT shape: its ``GPTConfig`` takes the same vocabulary, width, depth,
    heads and context, ``bias=True`` (LayerNorm and Linear biases, as GPT-2) and ``dropout=0``;
    its MLP is 4 x n_embd wide with exact GELU, its positions learned and its embeddings tied,
    as blockbench's GPT shape. The loss is what nanoGPT's ``train.py`` calls: ``model(X, Y)``,
    F.cross_entropy on the logits inside its forward."""
    module = load_nanogpt(source)
    if dims.d_ff != 4 * dims.d_model:
        raise ValueError(
            f"nanoGPT's MLP is 4 x n_embd = {4 * dims.d_model} wide, not d_ff {dims.d_ff}: it cannot build this shape"
        )
    config = module.GPTConfig(
        block_size=dims.seq_len,
        vocab_size=dims.vocab,
        n_layer=dims.n_layers,
        n_head=dims.n_heads,
        n_embd=dims.d_model,
        dropout=0.0,
        bias=True,
    )
    model = module.GPT(config)
    rows = _token_batch(torch, generator, dims.batch, dims.seq_len + 1, dims.vocab)
    inputs, targets = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()  # X and Y as its get_batch makes them
    return Run(
        model,
        (inputs, targets),
        lambda m, b: m(*b)[1],
        dims.batch * dims.seq_len,
        f"nanoGPT model.py ({Path(source).expanduser()}, sha256 {file_digest(source)}): GPTConfig(bias=True, "
        "dropout=0.0), SDPA attention, exact GELU, learned positions, tied; loss: model(X, Y) as its train.py",
    )


LITGPT_HINT = (
    "pip install litgpt (not beside constraints.txt's pins: litgpt 0.5.10+ needs huggingface-hub<1.4, "
    "transformers 5 >=1.31; 0.5.8-0.5.9 need numpy<2)"
)


def _litgpt(dims: Dims, tie: bool, **fields) -> Any:
    """litgpt's ``GPT`` at ``dims``, with the sequential residual of GPT-2 and Llama (litgpt's
    default is GPT-NeoX's parallel one) and an unpadded vocabulary (``padded_vocab_size``)."""
    from litgpt import GPT, Config

    config = Config(
        name=f"blockbench_{dims.d_model}x{dims.n_layers}",
        block_size=dims.seq_len,
        vocab_size=dims.vocab,
        padded_vocab_size=dims.vocab,
        n_layer=dims.n_layers,
        n_embd=dims.d_model,
        n_head=dims.n_heads,
        parallel_residual=False,
        **fields,
    )
    model = GPT(config)
    if tie:  # what litgpt's pretrain.py does with --train.tie_embeddings true
        model.transformer.wte.weight = model.lm_head.weight
    return model


def _litgpt_loss(model, batch):
    from litgpt.utils import chunked_cross_entropy

    rows = batch[0]
    return chunked_cross_entropy(model(rows[:, :-1]), rows[:, 1:])  # as litgpt's pretrain.py


def litgpt_gpt(torch, generator, dims: Dims) -> Run:
    """litgpt's GPT as close to the GPT shape as its Config allows: LayerNorm (eps 1e-5) with biases,
    GptNeoxMLP of width d_ff with exact GELU, the sequential residual, tied embeddings. litgpt has
    no learned position table: its positions are always rotary, here on a quarter of each head's
    dimensions (``rotary_percentage`` 0.25, its default and GPT-NeoX's)."""
    model = _litgpt(
        dims,
        tie=True,
        norm_class_name="LayerNorm",
        norm_eps=1e-5,
        bias=True,
        mlp_class_name="GptNeoxMLP",
        intermediate_size=dims.d_ff,
        gelu_approximate="none",
        rotary_percentage=0.25,
    )
    rows = _token_batch(torch, generator, dims.batch, dims.seq_len + 1, dims.vocab)
    return Run(
        model,
        (rows,),
        _litgpt_loss,
        dims.batch * dims.seq_len,
        "litgpt GPT (LayerNorm, GptNeoxMLP exact GELU, biases, sequential residual, tied as pretrain.py's "
        "tie_embeddings); differs: RoPE on 25% of each head (rotary_percentage 0.25) instead of learned "
        "positions; loss: litgpt.utils.chunked_cross_entropy (F.cross_entropy over 128-token chunks, as pretrain.py)",
        -dims.seq_len * dims.d_model,
        "no learned position table: litgpt's positions are rotary",
    )


def litgpt_llama(torch, generator, dims: Dims) -> Run:
    """litgpt's GPT with the Llama shape: RMSNorm (eps 1e-6), LLaMAMLP (SwiGLU) of blockbench's gated
    width, RoPE on the whole head (base 1e4), grouped-query attention, no biases, untied."""
    model = _litgpt(
        dims,
        tie=False,
        norm_class_name="RMSNorm",
        norm_eps=1e-6,
        bias=False,
        mlp_class_name="LLaMAMLP",
        intermediate_size=_gated(dims),
        n_query_groups=dims.n_kv_heads,
        rotary_percentage=1.0,
        rope_base=10000,
    )
    rows = _token_batch(torch, generator, dims.batch, dims.seq_len + 1, dims.vocab)
    return Run(
        model,
        (rows,),
        _litgpt_loss,
        dims.batch * dims.seq_len,
        f"litgpt GPT (RMSNorm, LLaMAMLP hidden {_gated(dims)}, RoPE base 1e4, n_query_groups {dims.n_kv_heads} "
        "(keys and values repeated per query head), no bias, untied); loss: litgpt.utils.chunked_cross_entropy",
    )


_CLS_POSITION = "a position embedding for the CLS token, which blockbench's ViT does not give it"


def timm_vit(torch, generator, dims: Dims) -> Run:
    import torch.nn.functional as F
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(
        img_size=dims.image_size,
        patch_size=dims.patch_size,
        embed_dim=dims.d_model,
        depth=dims.n_layers,
        num_heads=dims.n_heads,
        mlp_ratio=dims.d_ff / dims.d_model,
        num_classes=dims.n_classes,
        qkv_bias=True,
        global_pool="token",
    )
    return Run(
        model,
        _image_batch(torch, generator, dims),
        lambda m, b: F.cross_entropy(m(b[0]), b[1]),
        dims.batch,
        "timm VisionTransformer (class token, fused SDPA attention, qkv bias; default weight_init, "
        "init_weights_vit_timm)",
        dims.d_model,
        _CLS_POSITION,
    )


def hf_vit(torch, generator, dims: Dims) -> Run:
    import torch.nn.functional as F
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        hidden_size=dims.d_model,
        num_hidden_layers=dims.n_layers,
        num_attention_heads=dims.n_heads,
        intermediate_size=dims.d_ff,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        image_size=dims.image_size,
        patch_size=dims.patch_size,
        num_channels=3,
        num_labels=dims.n_classes,
        qkv_bias=True,
    )
    model = ViTForImageClassification._from_config(config, attn_implementation="sdpa")
    return Run(
        model,
        _image_batch(torch, generator, dims),
        lambda m, b: F.cross_entropy(m(pixel_values=b[0]).logits, b[1]),
        dims.batch,
        "transformers ViTForImageClassification (CLS token, sdpa attention, LayerNorm eps 1e-12)",
        dims.d_model,
        _CLS_POSITION,
    )


class TorchSeq2Seq:  # built lazily: torch is imported in the worker only
    @staticmethod
    def build(torch, dims: Dims, embedding_rms: float | None = None):
        """``embedding_rms=None``: fairseq's embedding (below); a number: tokens drawn from
        N(0, embedding_rms) without a multiplier and positions scaled to that RMS (blockbench's
        convention, ``models.embedding``, for ablations)."""
        import torch.nn.functional as F
        from torch import nn

        d_model = dims.d_model
        multiplier = math.sqrt(d_model) if embedding_rms is None else 1.0
        # a unit-amplitude sine-cosine row has RMS 1/sqrt(2)
        position_scale = 1.0 if embedding_rms is None else embedding_rms * math.sqrt(2)

        class Seq2Seq(nn.Module):
            """torch.nn.Transformer with what a translator adds around it, as fairseq's transformer
            (Vaswani et al.'s recipe) does: a shared embedding drawn from N(0, 1/d) and multiplied by
            sqrt(d) (unit RMS), unit-amplitude sinusoidal positions and a tied output projection;
            nn.Transformer's own init (xavier_uniform_ on every matrix) for its layers."""

            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(dims.vocab, d_model)
                nn.init.normal_(self.embed.weight, std=d_model**-0.5 if embedding_rms is None else embedding_rms)
                with warnings.catch_warnings():  # "enable_nested_tensor is True, but ...": a fast path it skips
                    warnings.filterwarnings("ignore", message="enable_nested_tensor")
                    self.transformer = nn.Transformer(
                        d_model,
                        dims.n_heads,
                        dims.n_layers,
                        dims.n_layers,
                        dims.d_ff,
                        dropout=0.0,
                        activation=dims.activation,
                        batch_first=True,
                        norm_first=dims.norm_placement == "pre",
                    )
                position = torch.arange(dims.seq_len + 1)[:, None]
                div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
                table = torch.zeros(dims.seq_len + 1, d_model)
                table[:, 0::2], table[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
                self.register_buffer("positions", table * position_scale)

            def forward(self, src, tgt):
                def embed(t):
                    return self.embed(t) * multiplier + self.positions[: t.shape[1]]

                causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
                pad = src == 0
                out = self.transformer(
                    embed(src),
                    embed(tgt),
                    tgt_mask=causal,
                    tgt_is_causal=True,
                    src_key_padding_mask=pad,
                    memory_key_padding_mask=pad,
                )
                return F.linear(out, self.embed.weight)

        return Seq2Seq()


def torch_transformer(torch, generator, dims: Dims, embedding_rms: float | None = None) -> Run:
    import torch.nn.functional as F

    model = TorchSeq2Seq.build(torch, dims, embedding_rms)

    def loss(m, b):
        src, tgt = b
        logits = m(src, tgt[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0)

    placement = "pre-LN" if dims.norm_placement == "pre" else "post-LN"
    embedding = (
        "embedding N(0, 1/d) x sqrt(d), unit-amplitude sinusoidal positions"
        if embedding_rms is None
        else f"embedding N(0, {embedding_rms:g}) and sinusoidal positions of RMS {embedding_rms:g}"
    )
    post = dims.norm_placement == "post"  # a pre-LN stack of blockbench's ends in a LayerNorm too
    return Run(
        model,
        _seq2seq_batch(torch, generator, dims),
        loss,
        dims.batch * dims.seq_len,
        f"torch.nn.Transformer ({placement}, {dims.activation}; adds a final LayerNorm to each stack) + shared "
        f"{embedding}, tied output; padding masks and causal mask as a user passes them",
        2 * 2 * dims.d_model if post else 0,
        "a final LayerNorm (weight and bias) on each post-LN stack" if post else "",
    )


@dataclass(frozen=True)
class Implementation:
    family: str  # the kind of model: lm_gpt, lm_llama, vit, seq2seq
    build: Builder
    ours: bool
    package: str | None  # the pip package it needs beyond blockbench's own
    #: a file the user points to instead of a package ("nanogpt": --nanogpt PATH); the builder takes its path last
    source: str | None = None
    #: how to get a reference that the bench extra does not install; a run without it skips it with this line
    hint: str | None = None

    def make(self, torch, generator, dims: Dims, sources: Mapping[str, str | Path | None] | None = None) -> Run:
        """The run of this implementation at ``dims``; ``sources`` maps a ``source`` to the user's path."""
        if self.source is None:
            return self.build(torch, generator, dims)
        path = (sources or {}).get(self.source)
        if not path:
            raise ValueError(f"{self.source} needs the path of its source: {self.hint}")
        return self.build(torch, generator, dims, path)

    def unavailable(self, sources: Mapping[str, str | Path | None] | None = None) -> str | None:
        """Why a reference outside the bench extra cannot run here (None: it can)."""
        if self.source is not None and not (sources or {}).get(self.source):
            return f"not run: {self.hint}"
        if self.hint and self.package and not importable(self.package):
            return f"not run ({self.package} is not installed): {self.hint}"
        return None


IMPLEMENTATIONS: dict[str, Implementation] = {
    "blockbench": Implementation("lm_gpt", ours_lm_gpt, True, None),
    "hf_gpt2": Implementation("lm_gpt", hf_gpt2, False, "transformers"),
    "nanogpt": Implementation("lm_gpt", nanogpt, False, None, source="nanogpt", hint=NANOGPT_HINT),
    "litgpt_gpt": Implementation("lm_gpt", litgpt_gpt, False, "litgpt", hint=LITGPT_HINT),
    "blockbench_llama": Implementation("lm_llama", ours_lm_llama, True, None),
    "hf_llama": Implementation("lm_llama", hf_llama, False, "transformers"),
    "litgpt_llama": Implementation("lm_llama", litgpt_llama, False, "litgpt", hint=LITGPT_HINT),
    "blockbench_vit": Implementation("vit", ours_vit, True, None),
    "timm_vit": Implementation("vit", timm_vit, False, "timm"),
    "hf_vit": Implementation("vit", hf_vit, False, "transformers"),
    "blockbench_seq2seq": Implementation("seq2seq", ours_seq2seq, True, None),
    "torch_transformer": Implementation("seq2seq", torch_transformer, False, None),
}


# ------------------------------------------------------------------------------ machine facts
def package_versions() -> str:
    """The reference packages' versions, for a report's header (which names lightning's already)."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("transformers", "timm", "litgpt"):
        with contextlib.suppress(PackageNotFoundError):
            found.append(f"{package} {version(package)}")
    return ", ".join(found)


def importable(module: str) -> bool:
    from importlib.util import find_spec

    return find_spec(module) is not None


def missing_packages(implementations: list[Implementation]) -> list[str]:
    """The pip packages of the bench extra that ``implementations`` need and that are not installed
    (a reference outside it, with a ``hint``, is skipped instead: ``Implementation.unavailable``)."""
    return sorted({i.package for i in implementations if i.package and not i.hint and not importable(i.package)})


def require_packages(implementations: list[Implementation]) -> None:
    """Exit with the install command if ``implementations`` need packages that are not installed:
    before any of them runs, not with a traceback after minutes of the others."""
    missing = missing_packages(implementations)
    if missing:
        sys.exit(f'the reference implementations need {", ".join(missing)}: pip install -e ".[bench]"')
