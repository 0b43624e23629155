"""Exporters: a trained run directory as a model that other tools load.

`s2s export RUN_DIR --to FORMAT --output DIR` reads the run the way `s2s generate RUN_DIR` does
(its config.yaml, vocabulary and the checkpoint `s2s train` tested, which result.json names, else
checkpoint_average.pt, else the newest checkpoint: `checkpoint.tested`) and writes one of:

* safetensors: `model.safetensors` (the weights, each tied tensor once, no pickle), `config.json`
  (the model section, vocabulary sizes, sharing, the task) and the task's vocabulary files;
  `load_safetensors` builds the engine's Transformer from them again.
* ctranslate2: a CTranslate2 model through its spec API (`ctranslate2.specs.TransformerSpec`),
  optionally quantised. The architecture maps one to one: post-norm (or pre-norm with final
  layer norms), ReLU, biases everywhere, embeddings scaled by sqrt(d_model) and the output
  projection tied or not (model.tie_output), our interleaved sinusoid table (or the learned one,
  model.positions=learned) stored as the position encodings, heads of model.d_k = model.d_v
  dimensions as its head_dim, EOS appended to the source, BOS as the decoder's start token. Its
  heads have one width: model.d_k other than model.d_v is refused.
* huggingface: a `transformers` MarianMTModel with a PreTrainedTokenizerFast over the task's
  `tokenizers` vocabulary. Marian lays sinusoids out as [sin | cos] halves where we interleave
  them (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos); the export permutes the d_model dimensions of
  every weight by the same fixed permutation (even dimensions first, then odd), which is exact
  because layer norms, attention and the tied output projection are equivariant under it.
  Marian computes its position table itself (in float64, then rounded), which differs from
  our float32 one by up to 3e-5 at position 1023. Marian has no pre-norm form, no learned
  positions and heads of d_model / heads dimensions only: model.pre_norm=true,
  model.positions=learned and model.d_k / model.d_v other than that are refused.

`s2s.core.inference.deployed` decodes source lines with an export the way `s2s generate` does.

Every export folder holds `s2s_export.json` (MARKER): the format, the source run and the files
written. `--force` replaces a folder only when it is empty or holds one such export and nothing
else; the run directory, a folder that contains it and a folder with other files are refused.
The export is written into `.DIR.tmpPID` beside DIR and renamed at the end.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from ..errors import ExportError
from ..files import remove_stale_temporaries
from ..nn.model import Transformer
from ..setup.settings import ModelConfig
from ..tokenizers.pieces import Pieces
from ..tokenizers import BOS, EOS, PAD, SPECIALS, UNK

FORMATS = ("ctranslate2", "huggingface", "safetensors")
MARKER = "s2s_export.json"  # in every export folder: the format, the source run, the files written
QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)


@dataclass(frozen=True)
class ExportJob:
    """One `s2s export`: the run, the format (`FORMATS`), the output folder, CTranslate2's
    quantization (`QUANTIZATIONS`; None: its default), and whether a previous export there may
    be replaced."""

    run_dir: str
    to: str
    output: str
    quantization: str | None = None
    force: bool = False


def export(job: ExportJob, registry) -> Path:
    """Write the run's model (what `s2s generate RUN_DIR` decodes with) in format `job.to` into
    `job.output`."""
    from ..runs.directory import run_dir_of
    from . import load_for_inference

    run_dir, to, output, quantization = job.run_dir, job.to, job.output, job.quantization

    if to not in FORMATS:
        raise ExportError(f"unknown export format {to!r}: choose one of {', '.join(FORMATS)}")
    if quantization is not None and to != "ctranslate2":
        raise ExportError(f"--quantization applies to --to ctranslate2 only, not {to}")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(
            f"unknown quantization {quantization!r}: choose one of {', '.join(QUANTIZATIONS)}"
        )
    out = Path(output)
    replaceable(out, run_dir_of(run_dir), job.force)
    config = Path(run_dir) / "config.yaml"
    if config.is_file() and OmegaConf.load(config).get("tasks"):
        raise ExportError(
            f"{run_dir} is a multi-task run: export takes single-task runs (the formats "
            "have no place for the members' task tokens and joined vocabularies)"
        )
    # the weights as trained (fp32), whatever precision the run searches in
    overrides = ["run.device=cpu", "decode.precision=fp32"]
    cfg, member, model = load_for_inference(run_dir, registry, overrides)
    task = member.task
    # written beside `output` and renamed at the end: a failed export leaves `output` as it was
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out.parent)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if to == "safetensors":
            save_safetensors(model, cfg, task, tmp)
        elif to == "ctranslate2":
            to_ctranslate2(model, task, tmp, quantization)
        else:
            to_huggingface(model, cfg, task, tmp)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        marker = {"format": to, "source": str(run_dir_of(run_dir).resolve()), "files": files}
        # what `s2s import` needs to make the run again from a Hugging Face export: the run's
        # own settings (the export decodes in fp32 on the CPU whatever the run's are)
        own = OmegaConf.load(run_dir_of(run_dir) / "config.yaml")
        sections = ("task", "model", "decode")
        marker["config"] = {k: OmegaConf.to_container(own[k], enum_to_str=True) for k in sections}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
        if out.exists():
            replaceable(
                out, run_dir_of(run_dir), job.force
            )  # again: nothing came into it meanwhile
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def replaceable(out: Path, run_dir: Path, force: bool) -> None:
    """Refuse an --output that an export may not write: a file, the run directory or a folder
    that contains it; a non-empty folder without --force; with --force, a folder holding
    anything but one previous export (its MARKER and the files the marker lists)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ExportError(
            f"{out} is {'a link' if out.is_symlink() else 'a file'}, not a folder to export into"
        )
    target, run = out.resolve(), run_dir.resolve()
    if target == run or target in run.parents:
        raise ExportError(
            f"--output {out} {'is' if target == run else 'contains'} the run directory {run_dir}: "
            "export into a folder of its own"
        )
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise ExportError(
            f"{out} exists and is not empty (use --force to replace a previous export)"
        )
    try:
        listed = json.loads((out / MARKER).read_text(encoding="utf-8"))["files"]
        allowed = {MARKER, *listed} | {
            parent.as_posix() for f in listed for parent in Path(f).parents
        }
    except (OSError, ValueError, KeyError, TypeError):
        raise ExportError(
            f"--force: {out} holds no previous s2s export ({MARKER}): "
            "refusing to delete a folder s2s did not write; choose another --output"
        ) from None
    other = sorted(
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if p.relative_to(out).as_posix() not in allowed
    )
    if other:
        raise ExportError(
            f"--force: {out} holds "
            f"{other[0]}{f' and {len(other) - 1} more' if len(other) > 1 else ''}, "
            "which no previous export wrote: refusing to delete it; move it or choose another "
            "--output"
        )


# -- safetensors -----------------------------------------------------------------------------
def save_safetensors(model: Transformer, cfg, task, out: Path) -> None:
    """model.safetensors + config.json + the task's vocabulary files."""
    from omegaconf import OmegaConf
    from safetensors.torch import save_model

    save_model(model, str(out / "model.safetensors"))  # a tied tensor is stored once
    meta = {
        "format": "s2s",
        "model": OmegaConf.to_container(cfg.model),
        "task": OmegaConf.to_container(cfg.task),
        "src_vocab_size": task.src_vocab_size,
        "tgt_vocab_size": task.tgt_vocab_size,
        "shared_vocab": bool(task.shared_vocab),
        "special_ids": dict(zip(SPECIALS, range(len(SPECIALS)))),
    }
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    task.save_vocab(out)


def load_safetensors(directory) -> Transformer:
    """The engine's Transformer from a safetensors export (model.safetensors + config.json)."""
    from safetensors.torch import load_model

    d = Path(directory)
    meta = json.loads((d / "config.json").read_text(encoding="utf-8"))
    model = Transformer(
        ModelConfig(**meta["model"]),
        meta["src_vocab_size"],
        meta["tgt_vocab_size"],
        meta["shared_vocab"],
    )
    load_model(model, str(d / "model.safetensors"))
    return model.eval()


# -- vocabularies ----------------------------------------------------------------------------
def tokenizers_of(task):
    try:
        src, tgt = task.tokenizers()
    except NotImplementedError as e:
        raise ExportError(
            f"{e}: CTranslate2 and Hugging Face exports need the vocabulary's tokens"
        ) from None
    return src, tgt


def tokens_of(tokenizer) -> list[str]:
    """The vocabulary's tokens in id order (ids 0..n-1, specials first)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    tokens = [None] * len(vocab)
    for token, i in vocab.items():
        if i >= len(tokens):
            raise ExportError(
                f"the vocabulary's ids are not 0..{len(vocab) - 1} (token {token!r} has id {i})"
            )
        tokens[i] = token
    if tokens[: len(SPECIALS)] != SPECIALS:
        raise ExportError(
            f"the vocabulary must start with {SPECIALS}, it starts with {tokens[: len(SPECIALS)]}"
        )
    return tokens


def _numpy(t: torch.Tensor):
    """A float32 copy: the converter may change the arrays it is given, the model must not
    change."""
    return t.detach().float().numpy().copy()


# -- CTranslate2 -----------------------------------------------------------------------------
def to_ctranslate2(model: Transformer, task, out: Path, quantization: str | None = None) -> None:
    """A CTranslate2 Transformer model (model.bin, config.json, vocabularies) in `out`, with the
    task's own vocabulary files beside them (to turn text into the tokens)."""
    try:
        import ctranslate2
        from ctranslate2.specs import common_spec, transformer_spec
    except ImportError:
        raise ExportError(
            "--to ctranslate2 needs the ctranslate2 package: pip install 's2s[export]'"
        ) from None
    pre_norm, attn = model.encoder[0].res1.pre_norm, model.encoder[0].self_attn
    if attn.d_k != attn.d_v:
        raise ExportError(
            f"model.d_k={attn.d_k} with model.d_v={attn.d_v} has no CTranslate2 form (its heads "
            "have one "
            "width for queries, keys and values): export it with --to safetensors"
        )
    if isinstance(task.src_vocab, Pieces):
        raise ExportError(
            "an imported OPUS-MT vocabulary (task.tokenizer=sentencepiece) has no CTranslate2 "
            "form here: export it with --to huggingface and convert that with CTranslate2's "
            "ct2-transformers-converter, which reads Marian models"
        )
    activation = model.encoder[0].ffn[1]
    layers, relu = (
        len(model.encoder),
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
                layers, attn.h, pre_norm=pre_norm, activation=relu, head_dim=attn.d_k
            ),
            transformer_spec.TransformerDecoderSpec(
                layers, attn.h, pre_norm=pre_norm, activation=relu, head_dim=attn.d_k
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
        stack.scale_embeddings = True  # x sqrt(d_model)
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
    src, tgt = tokenizers_of(task)
    spec.register_source_vocabulary(tokens_of(src))
    spec.register_target_vocabulary(tokens_of(tgt))
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


# -- Hugging Face ----------------------------------------------------------------------------
def to_huggingface(model: Transformer, cfg, task, out: Path) -> None:
    """A MarianMTModel (config.json, model.safetensors, generation_config.json) and its
    tokenizer."""
    try:
        from transformers import GenerationConfig, MarianConfig, MarianMTModel
    except ImportError:
        raise ExportError(
            "--to huggingface needs the transformers package: pip install 's2s[export]'"
        ) from None
    m = cfg.model
    if m.pre_norm:
        raise ExportError(
            "model.pre_norm=true has no MarianMT form (Marian is post-norm): "
            "export it with --to ctranslate2 or --to safetensors"
        )
    if m.positions != "sinusoid":
        raise ExportError(
            f"model.positions={m.positions} has no MarianMT form (Marian computes sinusoids): "
            "export it with --to ctranslate2 or --to safetensors"
        )
    for key, value in (("d_k", m.d_k), ("d_v", m.d_v)):
        if value is not None and value * m.heads != m.d_model:
            raise ExportError(
                f"model.{key}={value} has no MarianMT form (its heads have d_model / heads = "
                f"{m.d_model // m.heads} dimensions): export it with --to "
                f"{'ctranslate2 or --to ' if m.d_k == m.d_v else ''}safetensors"
            )
    shared = bool(task.shared_vocab)
    tied = model.out.weight is model.tgt_embed.weight
    # an import's vocabulary (s2s.core.tokenizers.pieces) goes back in its model's own numbering and
    # conventions: "<pad>" (s2s's BOS) starts the decoder, s2s's PAD row is left out
    marian = isinstance(task.src_vocab, Pieces)
    src_order, tgt_order = (
        (_source_order(task.src_vocab), _source_order(task.tgt_vocab))
        if marian
        else (list(range(task.src_vocab_size)), list(range(task.tgt_vocab_size)))
    )
    pad, bos, eos = (
        (task.tgt_vocab.source_ids[BOS],) * 2 + (task.tgt_vocab.source_ids[EOS],)
        if marian
        else (PAD, BOS, EOS)
    )
    hf_cfg = MarianConfig(
        vocab_size=len(src_order),
        decoder_vocab_size=len(tgt_order),
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=tied,
        d_model=m.d_model,
        encoder_layers=m.layers,
        decoder_layers=m.layers,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
        encoder_attention_heads=m.heads,
        decoder_attention_heads=m.heads,
        max_position_embeddings=m.max_positions,
        activation_function=m.activation,
        scale_embedding=True,
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        activation_dropout=0.0,
        pad_token_id=pad,
        bos_token_id=bos,
        eos_token_id=eos,
        decoder_start_token_id=bos,
        forced_eos_token_id=None,
    )
    hf = MarianMTModel(hf_cfg).eval()
    state = marian_state_dict(model, src_order, tgt_order)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # not given: the tied output projection and the position tables, which Marian computes itself
    left = [
        k
        for k in missing
        if not (tied and k == "lm_head.weight")
        and not k.endswith("embed_positions.weight")
        and not (shared and k.endswith("embed_tokens.weight"))
    ]
    if left or unexpected:
        raise ExportError(f"MarianMT weights do not match: missing {left}, unexpected {unexpected}")
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=bos,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        num_beams=1,
        do_sample=False,
        suppress_tokens=sorted({pad, bos}),
        max_length=m.max_positions,
    )
    hf.save_pretrained(str(out))
    if marian:
        marian_tokenizer(task, out)
        return
    src, tgt = tokenizers_of(task)
    hf_tokenizer(src, source=True).save_pretrained(str(out))
    if not shared:
        hf_tokenizer(tgt, source=False).save_pretrained(str(out / "target_tokenizer"))


def permutation(d_model: int) -> torch.Tensor:
    """Dimension j of a Marian hidden state is dimension perm[j] of ours: even ones, then odd ones,
    which turns our interleaved sinusoids into Marian's [sin | cos] halves."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _source_order(vocab: Pieces) -> list[int]:
    """s2s's id of each id of the imported model's own vocabulary, in its order (PAD left out)."""
    order = [0] * (len(vocab) - 1)
    for ours, theirs in enumerate(vocab.source_ids):
        if theirs >= 0:
            order[theirs] = ours
    return order


def marian_tokenizer(task, out: Path) -> None:
    """MarianTokenizer's files for an import's vocabularies: source.spm, target.spm, vocab.json
    in the model's own numbering (and target_vocab.json where the two sides differ)."""
    src, tgt = task.src_vocab, task.tgt_vocab
    names = {BOS: "<pad>", EOS: "</s>", UNK: "<unk>"}

    def numbering(vocab):
        return {names.get(i, t): vocab.source_ids[i] for i, t in enumerate(vocab.itos) if i != PAD}

    (out / "source.spm").write_bytes(src.model_proto)
    (out / "target.spm").write_bytes(tgt.model_proto)
    separate = src.id_space != tgt.id_space
    vocab = json.dumps(numbering(src), ensure_ascii=False)
    (out / "vocab.json").write_text(vocab, encoding="utf-8")
    if separate:
        target = json.dumps(numbering(tgt), ensure_ascii=False)
        (out / "target_vocab.json").write_text(target, encoding="utf-8")
    config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": task.cfg.src_lang,
        "target_lang": task.cfg.tgt_lang,
        "separate_vocabs": separate,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def marian_state_dict(model: Transformer, src_order=None, tgt_order=None) -> dict:
    """Our weights under MarianMTModel's names, with the d_model dimensions permuted and the
    vocabulary rows in the order `src_order` / `tgt_order` (s2s's id of each of the export's
    ids; None: s2s's own)."""
    perm = permutation(model.d_model)
    src_rows = slice(None) if src_order is None else torch.tensor(src_order)
    tgt_rows = slice(None) if tgt_order is None else torch.tensor(tgt_order)
    state = {}

    def inp(name, lin):  # reads the residual stream: permute the input columns
        state[f"{name}.weight"] = lin.weight[:, perm].clone()
        state[f"{name}.bias"] = lin.bias.clone()

    def outp(name, lin):  # writes the residual stream: permute the output rows
        state[f"{name}.weight"] = lin.weight[perm].clone()
        state[f"{name}.bias"] = lin.bias[perm].clone()

    def norm(name, ln):
        state[f"{name}.weight"], state[f"{name}.bias"] = (
            ln.weight[perm].clone(),
            ln.bias[perm].clone(),
        )

    def attention(name, attn):
        for ours, theirs in ((attn.w_q, "q_proj"), (attn.w_k, "k_proj"), (attn.w_v, "v_proj")):
            inp(f"{name}.{theirs}", ours)
        outp(f"{name}.out_proj", attn.w_o)

    state["model.encoder.embed_tokens.weight"] = model.src_embed.weight[src_rows][:, perm].clone()
    state["model.decoder.embed_tokens.weight"] = model.tgt_embed.weight[tgt_rows][:, perm].clone()
    if model.src_embed is model.tgt_embed:  # one matrix, Marian's `shared`
        state["model.shared.weight"] = state["model.encoder.embed_tokens.weight"]
    for i, layer in enumerate(model.encoder):
        p = f"model.encoder.layers.{i}"
        attention(f"{p}.self_attn", layer.self_attn)
        norm(f"{p}.self_attn_layer_norm", layer.res1.norm)
        inp(f"{p}.fc1", layer.ffn[0])
        outp(f"{p}.fc2", layer.ffn[2])
        norm(f"{p}.final_layer_norm", layer.res2.norm)
    for i, layer in enumerate(model.decoder):
        p = f"model.decoder.layers.{i}"
        attention(f"{p}.self_attn", layer.self_attn)
        norm(f"{p}.self_attn_layer_norm", layer.res1.norm)
        attention(f"{p}.encoder_attn", layer.cross_attn)
        norm(f"{p}.encoder_attn_layer_norm", layer.res2.norm)
        inp(f"{p}.fc1", layer.ffn[0])
        outp(f"{p}.fc2", layer.ffn[2])
        norm(f"{p}.final_layer_norm", layer.res3.norm)
    if (
        model.out.weight is not model.tgt_embed.weight
    ):  # untied (model.tie_output): Marian's lm_head
        state["lm_head.weight"] = model.out.weight[tgt_rows][:, perm].clone()
    bias = model.out.bias
    rows = model.tgt_embed.num_embeddings if tgt_order is None else len(tgt_order)
    state["final_logits_bias"] = (
        torch.zeros(1, rows) if bias is None else bias.detach()[tgt_rows].clone()[None]
    )
    return state


def hf_tokenizer(tokenizer, source: bool):
    """A PreTrainedTokenizerFast over a copy of the task's tokenizer; the source one appends
    </s> as the engine does, and neither splits specials out of text (the engine does not)."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(tokenizer.to_str())
    if source:
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A {SPECIALS[EOS]}", special_tokens=[(SPECIALS[EOS], EOS)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=SPECIALS[PAD],
        bos_token=SPECIALS[BOS],
        eos_token=SPECIALS[EOS],
        unk_token=SPECIALS[UNK],
        split_special_tokens=True,
    )
