"""CTranslate2: a run as a CTranslate2 Transformer model through its spec API
(`ctranslate2.specs.TransformerSpec`), optionally quantised (`s2s export --to ctranslate2`).

The architecture maps one to one: post-norm (or pre-norm with final layer norms), ReLU (or
swish), biases everywhere, embeddings scaled by sqrt(d_model) or not (model.scale_embedding),
the output projection tied or not (model.tie_output) and its bias (model.output_bias), the
position table as the model adds it stored as the position encodings (our interleaved
sinusoids, fairseq's offset sinusoids of an NLLB / M2M100 or fairseq import, a learned table),
heads of model.d_k = model.d_v dimensions as its head_dim, stacks of their own depths, EOS
appended to the source, BOS as the decoder's start token. Every import maps too: an OPUS-MT
import's weights are already in s2s's interleaved dimension order (the import permuted them),
its BOS is Marian's "<pad>"; a fairseq or NLLB import's BOS is a copy of </s> (the decoder's
start there) whose output logit is -inf. The vocabularies are the task's tokens in id order
(`common.task_tokens`: an import's sentencepiece pieces or Moses+BPE tokens as its vocabulary
file lists them, language codes included); the task's vocabulary files lie beside model.bin,
to turn text into those tokens. A multilingual import's source code is part of the source's
tokens and its target code is CTranslate2's target_prefix (`s2s.core.inference.deployed`,
which decodes an export the way `s2s generate` does). Its heads have one width: model.d_k other
than model.d_v is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...tokenizers import BOS, EOS, SPECIALS, UNK
from ...errors import ExportError
from ...nn.model import Transformer
from .common import task_tokens

QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)


def _numpy(t: torch.Tensor):
    """A float32 copy: the converter may change the arrays it is given, the model must not
    change."""
    return t.detach().float().numpy().copy()


def to_ctranslate2(model: Transformer, task, out: Path, quantization: str | None = None) -> None:
    """A CTranslate2 Transformer model (model.bin, config.json, vocabularies) in `out`, with the
    task's own vocabulary files beside them (to turn text into the tokens)."""
    try:
        import ctranslate2
        from ctranslate2.specs import common_spec, transformer_spec
    except ImportError:
        raise ExportError(
            "--to ctranslate2 needs the ctranslate2 package: pip install ctranslate2 "
            "(s2s's export extra)"
        ) from None
    pre_norm, attn = model.encoder[0].res1.pre_norm, model.encoder[0].self_attn
    if attn.d_k != attn.d_v:
        raise ExportError(
            f"model.d_k={attn.d_k} with model.d_v={attn.d_v} has no CTranslate2 form (its heads "
            "have one width for queries, keys and values): export it with --to safetensors"
        )
    src_tokens, tgt_tokens = task_tokens(task)  # before the long work
    activation = model.encoder[0].ffn[1]
    layers, relu = (
        (len(model.encoder), len(model.decoder)),
        (
            common_spec.Activation.SWISH
            if isinstance(activation, torch.nn.SiLU)
            else common_spec.Activation.RELU
        ),
    )
    if attn.d_k * attn.h == model.d_model:
        spec = transformer_spec.TransformerSpec.from_config(
            layers, attn.h, pre_norm=pre_norm, activation=relu
        )
    else:  # heads narrower or wider than d_model / h
        spec = transformer_spec.TransformerSpec(
            transformer_spec.TransformerEncoderSpec(
                layers[0], attn.h, pre_norm=pre_norm, activation=relu, head_dim=attn.d_k
            ),
            transformer_spec.TransformerDecoderSpec(
                layers[1], attn.h, pre_norm=pre_norm, activation=relu, head_dim=attn.d_k
            ),
        )
    spec.config.add_source_eos = True  # the engine ends every source with EOS
    spec.config.decoder_start_token = SPECIALS[BOS]
    spec.config.layer_norm_epsilon = model.encoder[0].res1.norm.eps
    for stack, layers, emb, final in (
        (spec.encoder, model.encoder, model.src_embed, model.enc_norm),
        (spec.decoder, model.decoder, model.tgt_embed, model.dec_norm),
    ):
        embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
        embeddings.weight = _numpy(emb.weight)
        stack.scale_embeddings = model.embed_scale != 1.0  # x sqrt(d_model), or not
        stack.position_encodings.encodings = _numpy(
            model.position_table()
        )  # interleaved sinusoids, or learned
        if pre_norm:
            _ct2_norm(stack.layer_norm, final)
        for layer_spec, layer in zip(stack.layer, layers):
            _ct2_attention(
                layer_spec.self_attention, layer.self_attn, layer.res1.norm, self_attention=True
            )
            if hasattr(layer, "cross_attn"):
                _ct2_attention(
                    layer_spec.attention, layer.cross_attn, layer.res2.norm, self_attention=False
                )
            _ct2_linear(layer_spec.ffn.linear_0, layer.ffn[0])
            _ct2_linear(layer_spec.ffn.linear_1, layer.ffn[2])
            _ct2_norm(
                layer_spec.ffn.layer_norm,
                layer.res3.norm if hasattr(layer, "res3") else layer.res2.norm,
            )
    if model.out.weight is model.tgt_embed.weight:
        spec.decoder.projection.weight = spec.decoder.embeddings.weight  # tied: stored once
    else:  # a separate target vocabulary has its own projection (model.tie_output)
        spec.decoder.projection.weight = _numpy(model.out.weight)
    if model.out.bias is not None:  # model.output_bias
        spec.decoder.projection.bias = _numpy(model.out.bias)
    spec.register_source_vocabulary(src_tokens)
    spec.register_target_vocabulary(tgt_tokens)
    for key, value in (
        ("unk_token", SPECIALS[UNK]),
        ("bos_token", SPECIALS[BOS]),
        ("eos_token", SPECIALS[EOS]),
    ):
        setattr(spec.config, key, value)

    class Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    Converter().convert(str(out), quantization=quantization, force=True)
    task.save_vocab(out)  # the task's own tokenizer files, to turn text into the tokens above


def _ct2_linear(spec, linear: torch.nn.Linear) -> None:
    spec.weight = _numpy(linear.weight)
    spec.bias = _numpy(linear.bias)


def _ct2_norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _numpy(norm.weight), _numpy(norm.bias)


def _ct2_attention(spec, attn, norm, self_attention: bool) -> None:
    """Self-attention: one fused [q; k; v] projection; encoder-decoder: q, then fused [k; v]."""
    fuse = lambda *ls: (
        _numpy(torch.cat([lin.weight for lin in ls])),
        _numpy(torch.cat([lin.bias for lin in ls])),
    )  # noqa: E731
    groups = (
        [(attn.w_q, attn.w_k, attn.w_v)] if self_attention else [(attn.w_q,), (attn.w_k, attn.w_v)]
    )
    for lin_spec, group in zip(spec.linear, groups):
        lin_spec.weight, lin_spec.bias = fuse(*group)
    _ct2_linear(spec.linear[-1], attn.w_o)
    _ct2_norm(spec.layer_norm, norm)
