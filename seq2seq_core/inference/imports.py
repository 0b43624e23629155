"""Importers: a model the field trained elsewhere as an s2s run directory.

`s2s import SOURCE --output RUN_DIR` reads an OPUS-MT model (Hugging Face's `MarianMTModel`
layout: config.json, model.safetensors or pytorch_model.bin, MarianTokenizer's source.spm,
target.spm and vocab.json, or target_vocab.json beside it for separate vocabularies), from a
folder or, where the hub is reachable, by its hub name through huggingface_hub's own download
and cache. It writes what `s2s train` would have: config.yaml, the vocabulary files and one
checkpoint, so that generate, serve, score, export, attention, label and `run.init_from` take
it as any other run. The config's `origin` records the source, its revision and every file
read with its SHA-256.

What maps (docs/pretrained.md): OPUS-MT is the paper's Transformer, post-norm, with swish in
the feed-forward networks (model.activation=swish), a final logits bias (model.output_bias),
sinusoids laid out as [sin | cos] halves (the weights' d_model dimensions are permuted into
s2s's interleaved layout, the inverse of `s2s export --to huggingface`'s permutation: exact,
as layer norms, attention and the tied projection are equivariant under it), and its "<pad>"
as the decoder's start token (s2s's BOS row). s2s's PAD is an extra row whose bias is -inf:
never written, outside every softmax. It decodes as transformers' `generate` does:
decode.length_penalty=power with generate's length_penalty as alpha, decode.stop=transformers,
its num_beams, and at most max_length - 2 tokens before </s>.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from omegaconf import OmegaConf

from ..data import moses_bpe, pieces
from ..data.moses_bpe import MosesBPE, read_fairseq_dictionary
from ..data.pieces import Pieces
from ..errors import DataError, ImportModelError
from ..files import remove_stale_temporaries, sha256
from ..data.members import build_members
from ..nn.model import Transformer
from ..setup.config import load_config
from ..training import checkpoint
from ..vocab import BOS
from .export import MARKER, permutation

log = logging.getLogger("s2s")

#: model_type values of config.json that s2s reads, and what others are
SUPPORTED = ("marian",)
OTHERS = {
    "t5": "T5 (relative position buckets, no sinusoids)",
    "mt5": "mT5 (relative position buckets, no sinusoids)",
    "bart": "BART (learned positions offset by 2, GELU, layer-normed embeddings)",
    "mbart": "mBART (pre-norm with learned positions)",
    "m2m_100": "M2M100 / NLLB (pre-norm, sinusoids offset by the padding index)",
    "nllb-moe": "NLLB-MoE (mixture of experts)",
    "fsmt": "FSMT (fairseq's WMT19 models in transformers' layout)",
    "pegasus": "Pegasus",
}
ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu"}
FILES = {pieces.KIND: pieces.FILES, moses_bpe.KIND: moses_bpe.FILES}  # the vocabularies' files
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class ImportJob:
    """One `s2s import`: the source (a folder or a hub name), the run directory to write, the
    languages (None: from the tokenizer's config or the model's name), the hub revision."""

    source: str
    output: str
    src_lang: str | None = None
    tgt_lang: str | None = None
    revision: str | None = None


@dataclass
class Imported:
    """What a reader made of a source: the run's config (a dict), the record of where it came
    from, the two vocabularies, and a function from the new model to its state dict."""

    config: dict
    origin: dict
    src_vocab: object
    tgt_vocab: object
    state: Callable
    weights_file: Path
    config_file: Path


def import_model(job: ImportJob, registry) -> Path:
    """Write the run directory `job.output` for the model at `job.source`; returns it."""
    out = Path(job.output)
    if out.exists() or out.is_symlink():
        raise ImportModelError(f"--output {out} exists: import into a new run directory")
    path = Path(job.source)
    fairseq = path.suffix == ".pt" or (path.is_dir() and _fairseq_checkpoint(path) is not None)
    ours = path.is_dir() and (path / MARKER).is_file() and not (path / "source.spm").is_file()
    found = _read_fairseq(job) if fairseq else _read_s2s(path) if ours else _read_marian(job)
    found.config["run"] = {"dir": str(out)}
    if found.config["task"].get("tokenizer") in FILES:  # where fine-tuning reads it
        found.config["task"]["vocab_from"] = str(out.resolve())
    cfg = load_config(None, _as_overrides(found.config), registry=registry)
    cfg.origin = found.origin
    src, tgt = found.src_vocab, found.tgt_vocab
    shared = src is tgt or getattr(src, "id_space", None) == getattr(tgt, "id_space", 0)
    model = Transformer(cfg.model, len(src), len(tgt), shared)
    state = found.state(model)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ImportModelError(
            f"{found.weights_file}: the weights do not fit {found.config_file} "
            f"({(str(e).splitlines() or [''])[0]})"
        ) from None
    _write_run(out, cfg, model, src, tgt, registry)
    return out


def _read_marian(job: ImportJob) -> Imported:
    """An OPUS-MT model: a folder in MarianMTModel's layout, or a hub name."""
    folder, revision = _resolve(job)
    model_cfg = _read_json(folder / "config.json")
    kind = model_cfg.get("model_type")
    if kind not in SUPPORTED:
        what = OTHERS.get(kind, f"model_type {kind!r}")
        raise ImportModelError(
            f"{folder / 'config.json'}: {what} is not supported; s2s imports OPUS-MT "
            "(MarianMTModel, model_type 'marian') and fairseq Transformer checkpoints"
        )
    src_vocab, tgt_vocab, vocab_files = _marian_vocabularies(folder)
    src_lang, tgt_lang = _languages(job, folder)
    config = _marian_config(model_cfg, folder, src_vocab, tgt_vocab, src_lang, tgt_lang)
    weights_file, weights = _read_weights(folder)
    files = [folder / "config.json", weights_file, *vocab_files]
    origin = {
        "format": "marian",
        "source": job.source,
        "revision": revision or "",
        "files": {f.name: sha256(f) for f in files},
    }
    return Imported(
        config,
        origin,
        src_vocab,
        tgt_vocab,
        lambda model: _marian_state(
            model, weights, src_vocab.source_ids, tgt_vocab.source_ids, weights_file
        ),
        weights_file,
        folder / "config.json",
    )


# -- the source -------------------------------------------------------------------------------
def _resolve(job: ImportJob) -> tuple[Path, str | None]:
    """The local folder of the source and its revision (a hub snapshot's commit)."""
    folder = Path(job.source)
    if folder.is_dir():
        return folder, job.revision
    if folder.exists():
        raise ImportModelError(f"{folder} is a file: import takes a model's folder or a hub name")
    if job.source.count("/") != 1 or job.source.startswith((".", "/")):
        raise ImportModelError(f"{job.source} is neither a folder nor a hub name (OWNER/NAME)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ImportModelError(
            f"{job.source}: a hub name needs the huggingface_hub package "
            "(pip install 's2s[export]'), or download the model's folder and import that"
        ) from None
    try:
        path = snapshot_download(job.source, revision=job.revision)
    except Exception as e:  # noqa: BLE001 -- the hub client's many network and lookup errors
        raise ImportModelError(
            f"{job.source}: not found in the local cache nor on the hub ({type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0]})"
        ) from None
    return Path(path), Path(path).name


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ImportModelError(f"{path} is missing: not a Hugging Face model folder") from None
    except (OSError, ValueError) as e:
        raise ImportModelError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(value, dict):
        raise ImportModelError(f"{path}: not a JSON object")
    return value


def _languages(job: ImportJob, folder: Path) -> tuple[str, str]:
    """--src-lang / --tgt-lang, else tokenizer_config.json's, else the name opus-mt-SRC-TGT."""
    tok = folder / "tokenizer_config.json"
    tok_cfg = _read_json(tok) if tok.is_file() else {}
    src, tgt = (
        job.src_lang or tok_cfg.get("source_lang"),
        job.tgt_lang or tok_cfg.get("target_lang"),
    )
    name = Path(job.source.rstrip("/")).name.split("opus-mt-")[-1].split("-")
    if (not src or not tgt) and len(name) == 2:
        src, tgt = src or name[0], tgt or name[1]
    if not src or not tgt:
        raise ImportModelError(
            f"{folder}: the languages are not recorded (tokenizer_config.json's source_lang, "
            "target_lang): give --src-lang and --tgt-lang"
        )
    return src, tgt


def _marian_vocabularies(folder: Path) -> tuple[Pieces, Pieces, list[Path]]:
    """The source and target `Pieces` of MarianTokenizer's files, and the files read."""
    tok = folder / "tokenizer_config.json"
    separate = bool((_read_json(tok) if tok.is_file() else {}).get("separate_vocabs"))
    names = ["source.spm", "target.spm", "vocab.json"] + (["target_vocab.json"] if separate else [])
    paths = [folder / n for n in names]
    for p in paths:
        if not p.is_file():
            raise ImportModelError(
                f"{p} is missing: MarianTokenizer's files are {', '.join(names)}"
            )
    vocabs = [_read_json(folder / "vocab.json")]
    vocabs.append(_read_json(folder / "target_vocab.json") if separate else vocabs[0])
    sides = []
    for spm, vocab, vocab_name in zip(paths[:2], vocabs, names[2:] + names[2:]):
        try:
            sides.append(Pieces.of_marian(spm.read_bytes(), vocab))
        except Exception as e:  # noqa: BLE001 -- sentencepiece's errors on a damaged model
            raise ImportModelError(
                f"{spm} or {folder / vocab_name}: not a tokenizer s2s can read "
                f"({(str(e).splitlines() or [''])[0]})"
            ) from None
    return sides[0], sides[1], paths + ([tok] if tok.is_file() else [])


def _read_weights(folder: Path) -> tuple[Path, dict]:
    for name in WEIGHTS:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return path, load_file(str(path))
            return path, torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 -- truncated or damaged files raise many kinds
            raise ImportModelError(
                f"{path} is unreadable (truncated or damaged?): {type(e).__name__}: "
                f"{(str(e).splitlines() or [''])[0]}"
            ) from None
    raise ImportModelError(f"{folder} holds no weights ({' or '.join(WEIGHTS)})")


# -- OPUS-MT's settings and weights -------------------------------------------------------------
def _marian_config(model_cfg, folder, src_vocab, tgt_vocab, src_lang, tgt_lang) -> dict:
    """The run's config as a dict: the translation task over the imported vocabulary, the model
    section of config.json, decoding as generation_config.json says."""
    where = folder / "config.json"

    def need(key, default=None):
        value = model_cfg.get(key, default)
        if value is None:
            raise ImportModelError(f"{where}: {key!r} is missing")
        return value

    for a, b in (("encoder_layers", "decoder_layers"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if need(a) != need(b):
            raise ImportModelError(
                f"{where}: {a}={need(a)} but {b}={need(b)}: s2s's stacks are alike"
            )
    if need("encoder_attention_heads") != need("decoder_attention_heads"):
        raise ImportModelError(f"{where}: the encoder's and the decoder's heads differ")
    activation = ACTIVATIONS.get(str(need("activation_function")))
    if activation is None:
        raise ImportModelError(
            f"{where}: activation_function={model_cfg['activation_function']!r} is not "
            f"supported (one of {', '.join(ACTIVATIONS)})"
        )
    if not model_cfg.get("scale_embedding", False):
        raise ImportModelError(
            f"{where}: scale_embedding=false is not supported (s2s scales by sqrt d)"
        )
    if need("decoder_start_token_id") != need("pad_token_id"):
        raise ImportModelError(
            f"{where}: decoder_start_token_id={model_cfg['decoder_start_token_id']} is not "
            f"pad_token_id={model_cfg['pad_token_id']}, OPUS-MT's start token"
        )
    rows = {"vocab_size": len(src_vocab) - 1, "decoder_vocab_size": len(tgt_vocab) - 1}
    for key, n in rows.items():
        if int(model_cfg.get(key) or need("vocab_size")) != n:
            raise ImportModelError(
                f"{where}: {key}={model_cfg.get(key) or model_cfg['vocab_size']} but the "
                f"tokenizer's vocabulary holds {n} tokens"
            )
    gen_path = folder / "generation_config.json"
    gen = _read_json(gen_path) if gen_path.is_file() else {}
    max_length = int(gen.get("max_length", model_cfg.get("max_length") or 512))
    max_positions = int(need("max_position_embeddings"))
    return {
        "task": {
            "name": "translation",
            "source": "text",
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            "tokenizer": "sentencepiece",
            "vocab_size": len(tgt_vocab),
            "shared_vocab": src_vocab.id_space == tgt_vocab.id_space,
        },
        "model": {
            "layers": int(need("encoder_layers")),
            "d_model": int(need("d_model")),
            "d_ff": int(need("encoder_ffn_dim")),
            "heads": int(need("encoder_attention_heads")),
            "dropout": float(model_cfg.get("dropout", 0.1)),
            "attention_dropout": float(model_cfg.get("attention_dropout", 0.0)),
            "max_positions": max_positions,
            "activation": activation,
            "output_bias": True,
            "tie_output": bool(model_cfg.get("tie_word_embeddings", True)),
        },
        "decode": {
            "beam": int(gen.get("num_beams", model_cfg.get("num_beams") or 1)),
            "alpha": float(gen.get("length_penalty", 1.0)),
            "length_penalty": "power",
            "stop": "transformers",
            "max_len_a": 0.0,
            "max_len_b": max(0, min(max_length, max_positions) - 2),
        },
        "data": {"max_len": min(256, max_positions)},
        "run": {},
    }


def _same(vocab) -> list[int]:
    """Each id's row in an export of s2s's own: itself."""
    return list(range(len(vocab)))


def _marian_state(model, weights, src_ids, tgt_ids, path) -> dict:
    """MarianMTModel's weights under s2s's names: s2s's id i takes the source's row ids[i] (-1:
    a row the source lacks, zero, its output bias -inf), the d_model dimensions in s2s's
    interleaved order (`permutation`'s inverse)."""
    inv = torch.argsort(permutation(model.d_model))
    w = {k.removeprefix("model."): v for k, v in weights.items()}
    taken = set()

    def get(name):
        for key in (name, f"model.{name}"):
            if key in weights or key.removeprefix("model.") in w:
                taken.add(key.removeprefix("model."))
                return w[key.removeprefix("model.")].float()
        raise ImportModelError(f"{path}: {name!r} is missing")

    def rows(table, ids):  # [V_source, d] -> [V_s2s, d]: a row the source lacks zero
        out = table[torch.tensor([max(i, 0) for i in ids])].clone()
        out[torch.tensor([i < 0 for i in ids])] = 0.0
        return out

    state = {}

    def inp(ours, theirs):
        state[f"{ours}.weight"] = get(f"{theirs}.weight")[:, inv]
        state[f"{ours}.bias"] = get(f"{theirs}.bias")

    def outp(ours, theirs):
        state[f"{ours}.weight"] = get(f"{theirs}.weight")[inv]
        state[f"{ours}.bias"] = get(f"{theirs}.bias")[inv]

    def norm(ours, theirs):
        state[f"{ours}.weight"] = get(f"{theirs}.weight")[inv]
        state[f"{ours}.bias"] = get(f"{theirs}.bias")[inv]

    def attention(ours, theirs):
        for a, b in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj")):
            inp(f"{ours}.{a}", f"{theirs}.{b}")
        outp(f"{ours}.w_o", f"{theirs}.out_proj")

    shared = "shared.weight" in w
    src_table = get("shared.weight" if shared else "encoder.embed_tokens.weight")
    tgt_table = src_table if shared else get("decoder.embed_tokens.weight")
    state["src_embed.weight"] = rows(src_table, src_ids)[:, inv]
    state["tgt_embed.weight"] = rows(tgt_table, tgt_ids)[:, inv]
    for i in range(len(model.encoder)):
        p, q = f"encoder.{i}", f"encoder.layers.{i}"
        attention(f"{p}.self_attn", f"{q}.self_attn")
        norm(f"{p}.res1.norm", f"{q}.self_attn_layer_norm")
        inp(f"{p}.ffn.0", f"{q}.fc1")
        outp(f"{p}.ffn.2", f"{q}.fc2")
        norm(f"{p}.res2.norm", f"{q}.final_layer_norm")
    for i in range(len(model.decoder)):
        p, q = f"decoder.{i}", f"decoder.layers.{i}"
        attention(f"{p}.self_attn", f"{q}.self_attn")
        norm(f"{p}.res1.norm", f"{q}.self_attn_layer_norm")
        attention(f"{p}.cross_attn", f"{q}.encoder_attn")
        norm(f"{p}.res2.norm", f"{q}.encoder_attn_layer_norm")
        inp(f"{p}.ffn.0", f"{q}.fc1")
        outp(f"{p}.ffn.2", f"{q}.fc2")
        norm(f"{p}.res3.norm", f"{q}.final_layer_norm")
    if model.out.weight is model.tgt_embed.weight:
        state["out.weight"] = state["tgt_embed.weight"]
    else:
        head = weights.get("lm_head.weight")
        if head is None:
            raise ImportModelError(
                f"{path}: 'lm_head.weight' is missing (tie_word_embeddings=false)"
            )
        state["out.weight"] = rows(head.float(), tgt_ids)[:, inv]
    if model.out.bias is not None:
        bias = weights.get("final_logits_bias", w.get("final_logits_bias"))
        bias = torch.zeros(1, tgt_table.size(0)) if bias is None else bias.float()
        state["out.bias"] = bias.reshape(-1)[torch.tensor([max(i, 0) for i in tgt_ids])].clone()
        # a row the source lacks (s2s's PAD for OPUS-MT) is never written: outside every softmax
        state["out.bias"][torch.tensor([i < 0 for i in tgt_ids])] = -torch.inf
    skipped = {k for k in w if k.endswith("embed_positions.weight")} | {"final_logits_bias"}
    left = sorted(
        set(w)
        - taken
        - skipped
        - {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"}
    )
    if left:
        raise ImportModelError(f"{path}: {left[0]!r} has no place in the Transformer s2s imports")
    return state


# -- s2s's own Hugging Face exports ------------------------------------------------------------
def _read_s2s(folder: Path) -> Imported:
    """An `s2s export --to huggingface` of a run s2s trained: the MarianMTModel in s2s's own
    ids, its `tokenizers` vocabulary (tokenizer.json; target_tokenizer/ for a separate target
    one), and the run's task, model and decode sections, which the export's s2s_export.json
    keeps: the run again, every weight bit for bit."""
    from ..data.subwords import Subwords

    marker = _read_json(folder / MARKER)
    saved = marker.get("config")
    if marker.get("format") != "huggingface" or not isinstance(saved, dict):
        raise ImportModelError(
            f"{folder / MARKER}: not a Hugging Face export of s2s (format "
            f"{marker.get('format')!r}); import the folder `s2s export --to huggingface` wrote"
        )
    task = saved.get("task") or {}
    if task.get("name") != "translation" or task.get("tokenizer") not in ("bpe", "wordpiece"):
        raise ImportModelError(
            f"{folder / MARKER}: an export of task {task.get('name')!r} (tokenizer "
            f"{task.get('tokenizer')!r}); s2s imports back exports of translation's subword "
            "vocabularies (bpe, wordpiece)"
        )
    if not (folder / "tokenizer.json").is_file():
        raise ImportModelError(f"{folder / 'tokenizer.json'} is missing: the export's vocabulary")
    try:
        src = Subwords.load(folder / "tokenizer.json")
        target = folder / "target_tokenizer" / "tokenizer.json"
        tgt = Subwords.load(target) if target.is_file() else src
    except DataError as e:
        raise ImportModelError(
            f"{e}: s2s imports back exports of subword vocabularies (translation)"
        ) from None
    weights_file, weights = _read_weights(folder)
    config = {k: dict(saved[k]) for k in ("task", "model", "decode")}
    files = [folder / "config.json", weights_file, folder / "tokenizer.json", folder / MARKER]
    origin = {
        "format": "s2s-huggingface",
        "source": str(folder),
        "revision": "",
        "files": {f.name: sha256(f) for f in files},
    }
    return Imported(
        config,
        origin,
        src,
        tgt,
        lambda model: _marian_state(model, weights, _same(src), _same(tgt), weights_file),
        weights_file,
        folder / "config.json",
    )


# -- fairseq -----------------------------------------------------------------------------------
#: checkpoint names looked for in a folder: fairseq's hub archives' and fairseq-train's
FAIRSEQ_CHECKPOINTS = ("model.pt", "checkpoint_best.pt", "checkpoint_last.pt")
#: the architectures whose layers s2s holds (pre-norm where the options say so)
FAIRSEQ_ARCHS = (
    "transformer",
    "transformer_wmt_en_de",
    "transformer_vaswani_wmt_en_de_big",
    "transformer_vaswani_wmt_en_fr_big",
    "transformer_wmt_en_de_big",
    "transformer_wmt_en_de_big_t2t",
    "transformer_iwslt_de_en",
)
#: options a checkpoint may hold only at these values (what s2s's Transformer does)
FAIRSEQ_FIXED = {
    "activation_fn": "relu",
    "no_scale_embedding": False,
    "layernorm_embedding": False,
    "no_token_positional_embeddings": False,
    "encoder_learned_pos": False,
    "decoder_learned_pos": False,
    "adaptive_softmax_cutoff": None,
    "cross_self_attention": False,
    "no_cross_attention": False,
    "encoder_layerdrop": 0,
    "decoder_layerdrop": 0,
    "tie_adaptive_weights": False,
    "quant_noise_pq": 0,
    "checkpoint_activations": False,
}
BPE_CODES = ("bpecodes", "codes", "code", "bpe.codes")


def _fairseq_checkpoint(folder: Path) -> Path | None:
    return next((folder / n for n in FAIRSEQ_CHECKPOINTS if (folder / n).is_file()), None)


def _read_fairseq(job: ImportJob) -> Imported:
    """A fairseq Transformer checkpoint (a .pt file, or a folder holding model.pt or
    checkpoint_best.pt / checkpoint_last.pt) with its dict.SRC.txt, dict.TGT.txt and the
    subword-nmt codes it was trained with (bpecodes) beside it, as fairseq's hub archives hold
    them; text is Moses-tokenised (sacremoses) before BPE, as `--tokenizer moses --bpe
    subword_nmt` does."""
    import argparse

    path = Path(job.source)
    if path.is_dir():
        path = _fairseq_checkpoint(path)
    if not path.is_file():
        raise ImportModelError(f"{path} is missing: no fairseq checkpoint there")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- truncated files and foreign pickles raise many kinds
        raise ImportModelError(
            f"{path} is unreadable as a fairseq checkpoint: {type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:200]}"
        ) from None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise ImportModelError(f"{path}: holds no model state ('model')")
    cfg = saved.get("cfg") or {}
    args = cfg.get("model") if isinstance(cfg, dict) else None
    args = args if args is not None else saved.get("args")
    if isinstance(args, argparse.Namespace):
        args = vars(args)
    if not isinstance(args, dict):
        raise ImportModelError(f"{path}: holds no model configuration ('cfg' or 'args')")
    task = cfg.get("task") if isinstance(cfg.get("task"), dict) else args
    src_lang = job.src_lang or (task or {}).get("source_lang")
    tgt_lang = job.tgt_lang or (task or {}).get("target_lang")
    if not src_lang or not tgt_lang:
        raise ImportModelError(
            f"{path}: the languages are not recorded (task.source_lang, target_lang): give "
            "--src-lang and --tgt-lang"
        )
    folder = path.parent
    codes_file = next((folder / n for n in BPE_CODES if (folder / n).is_file()), None)
    bpe = (cfg.get("bpe") or {}) if isinstance(cfg, dict) else {}
    if str(bpe.get("_name", "subword_nmt")) not in ("subword_nmt", "None"):
        raise ImportModelError(
            f"{path}: bpe {bpe.get('_name')!r} is not supported (subword_nmt after Moses is)"
        )
    if codes_file is None:
        raise ImportModelError(
            f"{folder}: no BPE codes ({' or '.join(BPE_CODES)}): put the subword-nmt codes the "
            "model was trained with beside the checkpoint, as fairseq's archives hold them"
        )
    dict_files = [folder / f"dict.{lang}.txt" for lang in (src_lang, tgt_lang)]
    try:
        codes = codes_file.read_text(encoding="utf-8")
        src_vocab, tgt_vocab = (
            MosesBPE.of_fairseq(lang, codes, read_fairseq_dictionary(f))
            for lang, f in zip((src_lang, tgt_lang), dict_files)
        )
    except (DataError, OSError, UnicodeDecodeError) as e:
        raise ImportModelError(str(e)) from None
    except Exception as e:  # noqa: BLE001 -- subword-nmt's errors on malformed codes
        raise ImportModelError(f"{codes_file}: not subword-nmt BPE codes ({e})") from None
    config = _fairseq_config(args, path, src_vocab, tgt_vocab, src_lang, tgt_lang)
    origin = {
        "format": "fairseq",
        "source": job.source,
        "revision": "",
        "files": {f.name: sha256(f) for f in [path, *dict_files, codes_file]},
    }
    weights = saved["model"]
    return Imported(
        config,
        origin,
        src_vocab,
        tgt_vocab,
        lambda model: _fairseq_state(model, weights, args, src_vocab, tgt_vocab, path),
        path,
        path,
    )


def _fairseq_config(args: dict, path: Path, src_vocab, tgt_vocab, src_lang, tgt_lang) -> dict:
    """The run's config as a dict from a fairseq checkpoint's model arguments."""
    arch = args.get("arch") or args.get("_name")
    if arch not in FAIRSEQ_ARCHS:
        raise ImportModelError(
            f"{path}: arch {arch!r} is not supported (one of {', '.join(FAIRSEQ_ARCHS)})"
        )
    for key, value in FAIRSEQ_FIXED.items():
        if key in args and args[key] not in (value, None if value is False else value):
            raise ImportModelError(f"{path}: {key}={args[key]!r} is not supported ({value!r} is)")

    def same(a, b):
        if args.get(a) != args.get(b):
            raise ImportModelError(
                f"{path}: {a}={args.get(a)} but {b}={args.get(b)}: s2s's stacks are alike"
            )
        return args.get(a)

    d = same("encoder_embed_dim", "decoder_embed_dim")
    if args.get("decoder_output_dim", d) != d or args.get("decoder_input_dim", d) != d:
        raise ImportModelError(f"{path}: decoder_input_dim / decoder_output_dim other than {d}")
    pre_norm = same("encoder_normalize_before", "decoder_normalize_before")
    share_all = bool(args.get("share_all_embeddings"))
    if (src_vocab.id_space == tgt_vocab.id_space) != share_all:
        raise ImportModelError(
            f"{path}: share_all_embeddings={share_all} with "
            f"{'one' if src_vocab.id_space == tgt_vocab.id_space else 'two'} dictionaries: "
            "s2s shares embeddings exactly when the dictionaries are one"
        )
    max_positions = min(
        int(args.get("max_source_positions", 1024)), int(args.get("max_target_positions", 1024))
    )
    return {
        "task": {
            "name": "translation",
            "source": "text",
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            "tokenizer": moses_bpe.KIND,
            "vocab_size": len(tgt_vocab),
            "shared_vocab": share_all,
        },
        "model": {
            "layers": int(same("encoder_layers", "decoder_layers")),
            "d_model": int(d),
            "d_ff": int(same("encoder_ffn_embed_dim", "decoder_ffn_embed_dim")),
            "heads": int(same("encoder_attention_heads", "decoder_attention_heads")),
            "dropout": float(args.get("dropout", 0.1)),
            "attention_dropout": float(args.get("attention_dropout", 0.0)),
            "pre_norm": bool(pre_norm),
            "max_positions": max_positions,
            "positions": "learned",  # fairseq's own sinusoids, as a table (_fairseq_positions)
            "activation": "relu",
            "output_bias": True,  # zero but s2s's BOS row: -inf
            "tie_output": bool(share_all or args.get("share_decoder_input_output_embed")),
        },
        # fairseq-generate's defaults: beam 5, lenpen 1, 1 to 200 tokens, its stopping rule
        "decode": {
            "beam": 5,
            "alpha": 1.0,
            "length_penalty": "power",
            "stop": "beam",
            "min_len": 1,
            "max_len_a": 0.0,
            "max_len_b": min(200, max_positions - 1),
        },
        "data": {"max_len": min(256, max_positions)},
        "run": {},
    }


def _fairseq_positions(n: int, d: int, padding_idx: int = 1) -> torch.Tensor:
    """fairseq's sinusoidal table for s2s's positions 0..n-1, which are its padding_idx + 1 ..:
    [sin | cos] halves at frequencies 10000^(-i / (d/2 - 1)), computed in float32 as fairseq
    computes them (Vaswani et al.'s frequencies are 10000^(-2i / d))."""
    half = d // 2
    scale = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -scale)
    pos = torch.arange(padding_idx + 1 + n, dtype=torch.float).unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(pos), torch.cos(pos)], dim=1)
    if d % 2:
        table = torch.cat([table, torch.zeros(table.size(0), 1)], dim=1)
    return table[padding_idx + 1 :]


def _fairseq_state(model, w, args, src_vocab, tgt_vocab, path) -> dict:
    """fairseq's Transformer weights under s2s's names, rows in s2s's id order (BOS: a copy of
    </s>'s row, the decoder's start)."""
    taken = set()

    def get(name):
        if name not in w:
            raise ImportModelError(f"{path}: {name!r} is missing")
        taken.add(name)
        return w[name].float()

    def rows(table, vocab):
        index = torch.tensor([i if i >= 0 else 2 for i in vocab.source_ids])  # BOS: </s>'s
        if table.size(0) != len(vocab) - 1:
            raise ImportModelError(
                f"{path}: an embedding has {table.size(0)} rows but its dictionary "
                f"{len(vocab) - 1} tokens"
            )
        return table[index].clone()

    state = {}

    def linear(ours, theirs):
        state[f"{ours}.weight"], state[f"{ours}.bias"] = (
            get(f"{theirs}.weight"),
            get(f"{theirs}.bias"),
        )

    def attention(ours, theirs):
        for a, b in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"), ("w_o", "out_proj")):
            linear(f"{ours}.{a}", f"{theirs}.{b}")

    state["src_embed.weight"] = rows(get("encoder.embed_tokens.weight"), src_vocab)
    state["tgt_embed.weight"] = rows(get("decoder.embed_tokens.weight"), tgt_vocab)
    for i in range(len(model.encoder)):
        p, q = f"encoder.{i}", f"encoder.layers.{i}"
        attention(f"{p}.self_attn", f"{q}.self_attn")
        linear(f"{p}.res1.norm", f"{q}.self_attn_layer_norm")
        linear(f"{p}.ffn.0", f"{q}.fc1")
        linear(f"{p}.ffn.2", f"{q}.fc2")
        linear(f"{p}.res2.norm", f"{q}.final_layer_norm")
    for i in range(len(model.decoder)):
        p, q = f"decoder.{i}", f"decoder.layers.{i}"
        attention(f"{p}.self_attn", f"{q}.self_attn")
        linear(f"{p}.res1.norm", f"{q}.self_attn_layer_norm")
        attention(f"{p}.cross_attn", f"{q}.encoder_attn")
        linear(f"{p}.res2.norm", f"{q}.encoder_attn_layer_norm")
        linear(f"{p}.ffn.0", f"{q}.fc1")
        linear(f"{p}.ffn.2", f"{q}.fc2")
        linear(f"{p}.res3.norm", f"{q}.final_layer_norm")
    if model.encoder[0].res1.pre_norm:
        linear("enc_norm", "encoder.layer_norm")
        linear("dec_norm", "decoder.layer_norm")
    if model.out.weight is model.tgt_embed.weight:
        state["out.weight"] = state["tgt_embed.weight"]
        taken.add("decoder.output_projection.weight")
    else:
        state["out.weight"] = rows(get("decoder.output_projection.weight"), tgt_vocab)
    state["out.bias"] = torch.zeros(len(tgt_vocab))
    state["out.bias"][BOS] = -torch.inf  # a copy of </s> as input; never written
    state["pos_embed.weight"] = _fairseq_positions(model.max_positions, model.d_model)
    skipped = {k for k in w if k.endswith(("embed_positions._float_tensor", ".version"))}
    left = sorted(set(w) - taken - skipped)
    if left:
        raise ImportModelError(f"{path}: {left[0]!r} has no place in the Transformer s2s imports")
    return state


# -- the run directory --------------------------------------------------------------------------
def _as_overrides(cfg: dict) -> list[str]:
    """A config dict as the `key=value` overrides that load_config types and checks."""
    out = []

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out.append(f"{prefix}={str(value).lower() if isinstance(value, bool) else value}")

    walk("", cfg)
    return out


def _write_run(out: Path, cfg, model, src_vocab, tgt_vocab, registry) -> None:
    """config.yaml, the vocabulary files and checkpoints/checkpoint_00000000.pt, written into
    `.NAME.tmpPID` beside `out` and renamed at the end: a failed import leaves nothing."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out.parent)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        [member] = build_members(cfg, registry)
        member.task.src_vocab, member.task.tgt_vocab = src_vocab, tgt_vocab
        member.task.save_vocab(tmp)  # the files, and their names, the task reads back
        files = {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
        state = {
            "model": model.state_dict(),
            "update": 0,
            "tokenizer": {"files": files},
            "config": OmegaConf.to_container(cfg, enum_to_str=True),
            "tasks": [cfg.task.name],
        }
        checkpoint.save(state, tmp, 0, keep_last=1)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
