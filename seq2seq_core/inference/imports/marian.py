"""OPUS-MT models (Hugging Face's MarianMTModel layout) and s2s's own Hugging Face exports.

What maps and what is refused: docs/pretrained.md, "What maps"."""

from __future__ import annotations

from pathlib import Path

import torch

from ...data.pieces import Pieces
from ...errors import DataError, ImportModelError
from ...files import sha256
from ..export import MARKER, permutation
from .common import ImportJob, Imported, layer_weights, read_json, read_weights

SUPPORTED = ("marian",)
OTHERS = {
    "t5": "T5 (relative position buckets, no sinusoids)",
    "mt5": "mT5 (relative position buckets, no sinusoids)",
    "bart": "BART (learned positions offset by 2, GELU, layer-normed embeddings)",
    "mbart": "mBART (pre-norm with learned positions)",
    "nllb-moe": "NLLB-MoE (mixture of experts)",
    "fsmt": "FSMT (fairseq's WMT19 models in transformers' layout)",
    "pegasus": "Pegasus",
}
ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu"}


def read(job: ImportJob) -> Imported:
    """An OPUS-MT model: a folder in MarianMTModel's layout, or a hub name."""
    folder, revision = resolve(job)
    model_cfg = read_json(folder / "config.json")
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
    weights_file, weights = read_weights(folder)
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


def resolve(job: ImportJob) -> tuple[Path, str | None]:
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


def _languages(job: ImportJob, folder: Path) -> tuple[str, str]:
    """--src-lang / --tgt-lang, else tokenizer_config.json's, else the name opus-mt-SRC-TGT."""
    tok = folder / "tokenizer_config.json"
    tok_cfg = read_json(tok) if tok.is_file() else {}
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
    separate = bool((read_json(tok) if tok.is_file() else {}).get("separate_vocabs"))
    names = ["source.spm", "target.spm", "vocab.json"] + (["target_vocab.json"] if separate else [])
    paths = [folder / n for n in names]
    for p in paths:
        if not p.is_file():
            raise ImportModelError(
                f"{p} is missing: MarianTokenizer's files are {', '.join(names)}"
            )
    vocabs = [read_json(folder / "vocab.json")]
    vocabs.append(read_json(folder / "target_vocab.json") if separate else vocabs[0])
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


def _marian_config(model_cfg, folder, src_vocab, tgt_vocab, src_lang, tgt_lang) -> dict:
    """The run's config as a dict: the translation task over the imported vocabulary, the model
    section of config.json, decoding as generation_config.json says."""
    where = folder / "config.json"

    def need(key, default=None):
        value = model_cfg.get(key, default)
        if value is None:
            raise ImportModelError(f"{where}: {key!r} is missing")
        return value

    if need("encoder_ffn_dim") != need("decoder_ffn_dim"):
        raise ImportModelError(
            f"{where}: encoder_ffn_dim={need('encoder_ffn_dim')} but "
            f"decoder_ffn_dim={need('decoder_ffn_dim')}: s2s's stacks have one d_ff"
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
    gen = read_json(gen_path) if gen_path.is_file() else {}
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
            "encoder_layers": int(need("encoder_layers")),
            "decoder_layers": int(need("decoder_layers")),
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

    shared = "shared.weight" in w
    src_table = get("shared.weight" if shared else "encoder.embed_tokens.weight")
    tgt_table = src_table if shared else get("decoder.embed_tokens.weight")
    state["src_embed.weight"] = rows(src_table, src_ids)[:, inv]
    state["tgt_embed.weight"] = rows(tgt_table, tgt_ids)[:, inv]
    for ours, theirs, role in layer_weights(model):
        {"reads": inp, "writes": outp, "norm": norm}[role](ours, theirs)
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


def read_export(folder: Path) -> Imported:
    """An `s2s export --to huggingface` of a run s2s trained: the MarianMTModel in s2s's own
    ids, its `tokenizers` vocabulary (tokenizer.json; target_tokenizer/ for a separate target
    one), and the run's task, model and decode sections, which the export's s2s_export.json
    keeps: the run again, every weight bit for bit."""
    from ...data.subwords import Subwords

    marker = read_json(folder / MARKER)
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
    weights_file, weights = read_weights(folder)
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
