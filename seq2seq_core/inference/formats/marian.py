"""OPUS-MT models: Hugging Face's MarianMTModel with MarianTokenizer's files (source.spm,
target.spm, vocab.json), imported from a folder or by hub name (`read`), and such an import
exported back in its own form, its model's own numbering (`to_marian`, `s2s export --to
huggingface` of an import).

What maps and what is refused: docs/pretrained.md, "What maps"."""

from __future__ import annotations

import json
from pathlib import Path

from ...tokenizers import BOS, EOS, PAD, UNK
from ...tokenizers.pieces import Pieces
from ...errors import ImportModelError
from ...files import sha256
from ...nn.model import Transformer
from .common import (
    Fields,
    ImportJob,
    Imported,
    depths,
    from_marian_state,
    read_ids,
    read_json,
    read_weights,
    save_marian_model,
    shown,
)

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
        what = OTHERS.get(kind, f"model_type {shown(kind)}") if isinstance(kind, str) else None
        what = what or f"model_type {shown(kind)}"
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
        lambda model: from_marian_state(
            model, weights, src_vocab.source_ids, tgt_vocab.source_ids, weights_file
        ),
        weights_file,
        folder / "config.json",
    )


def resolve(job: ImportJob) -> tuple[Path, str | None]:
    """The local folder of the source and its revision (a hub snapshot's commit)."""
    folder = Path(job.source)
    if folder.is_dir():
        return folder, None  # a folder has no revision (import_model refuses --revision)
    if folder.exists():
        raise ImportModelError(f"{folder} is a file: import takes a model's folder or a hub name")
    if job.source.count("/") != 1 or job.source.startswith((".", "/")):
        raise ImportModelError(f"{job.source} is neither a folder nor a hub name (OWNER/NAME)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ImportModelError(
            f"{job.source}: a hub name needs the huggingface_hub package "
            "(pip install huggingface_hub), or download the model's folder and import that"
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
    tok_cfg = Fields(tok, read_json(tok) if tok.is_file() else {})
    src = job.src_lang or tok_cfg.str("source_lang", None)
    tgt = job.tgt_lang or tok_cfg.str("target_lang", None)
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
    separate = Fields(tok, read_json(tok) if tok.is_file() else {}).bool("separate_vocabs", False)
    names = ["source.spm", "target.spm", "vocab.json"] + (["target_vocab.json"] if separate else [])
    paths = [folder / n for n in names]
    for p in paths:
        if not p.is_file():
            raise ImportModelError(
                f"{p} is missing: MarianTokenizer's files are {', '.join(names)}"
            )
    vocabs = [read_ids(folder / "vocab.json")]
    vocabs.append(read_ids(folder / "target_vocab.json") if separate else vocabs[0])
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
    section of config.json, decoding as generation_config.json says; every value read typed
    (`Fields`)."""
    where = folder / "config.json"
    f = Fields(where, model_cfg)
    for a, b in (
        ("encoder_ffn_dim", "decoder_ffn_dim"),
        ("encoder_attention_heads", "decoder_attention_heads"),
    ):  # the depths may differ (model.encoder_layers, model.decoder_layers); these may not
        if f.int(a, minimum=1) != f.int(b, minimum=1):
            raise ImportModelError(
                f"{where}: {a}={f.int(a)} but {b}={f.int(b)}: s2s's stacks have one d_ff and "
                "one number of heads"
            )
    activation = ACTIVATIONS.get(f.str("activation_function"))
    if activation is None:
        raise ImportModelError(
            f"{where}: activation_function={shown(model_cfg['activation_function'])} is not "
            f"supported (one of {', '.join(ACTIVATIONS)})"
        )
    if not f.bool("scale_embedding", False):
        raise ImportModelError(
            f"{where}: scale_embedding=false is not supported (s2s scales by sqrt d)"
        )
    if f.int("decoder_start_token_id") != f.int("pad_token_id"):
        raise ImportModelError(
            f"{where}: decoder_start_token_id={f.int('decoder_start_token_id')} is not "
            f"pad_token_id={f.int('pad_token_id')}, OPUS-MT's start token"
        )
    rows = {"vocab_size": len(src_vocab) - 1, "decoder_vocab_size": len(tgt_vocab) - 1}
    for key, n in rows.items():
        given = f.int(key, f.int("vocab_size", minimum=1), minimum=1)
        if given != n:
            raise ImportModelError(
                f"{where}: {key}={given} but the tokenizer's vocabulary holds {n} tokens"
            )
    gen_path = folder / "generation_config.json"
    gen = Fields(gen_path, read_json(gen_path) if gen_path.is_file() else {})
    max_length = gen.int("max_length", f.int("max_length", 512, minimum=1), minimum=1)
    max_positions = f.int("max_position_embeddings", minimum=2)
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
            **depths(f.int("encoder_layers", minimum=1), f.int("decoder_layers", minimum=1)),
            "d_model": f.int("d_model", minimum=1),
            "d_ff": f.int("encoder_ffn_dim"),
            "heads": f.int("encoder_attention_heads"),
            "dropout": f.float("dropout", 0.1, minimum=0.0),
            "attention_dropout": f.float("attention_dropout", 0.0, minimum=0.0),
            "max_positions": max_positions,
            "activation": activation,
            "output_bias": True,
            "output_bias_fixed": True,  # as the source keeps it: never trained
            "tie_output": f.bool("tie_word_embeddings", True),
        },
        "decode": {
            "beam": gen.int("num_beams", f.int("num_beams", 1, minimum=1), minimum=1),
            "alpha": gen.float("length_penalty", 1.0),
            "length_penalty": "power",
            "stop": "transformers",
            "max_len_a": 0.0,
            "max_len_b": max(0, min(max_length, max_positions) - 2),
        },
        "data": {"max_len": min(256, max_positions)},
        "run": {},
    }


def to_marian(model: Transformer, cfg, task, out: Path) -> None:
    """An imported OPUS-MT model back in its own numbering and conventions: the MarianMTModel
    ("<pad>", s2s's BOS, starts the decoder; s2s's PAD row left out) and MarianTokenizer's
    files."""
    src, tgt = task.src_vocab, task.tgt_vocab
    orders = (_source_order(src), _source_order(tgt))
    starts = (tgt.source_ids[BOS],) * 2 + (tgt.source_ids[EOS],)
    save_marian_model(model, cfg, task, out, orders, starts)
    marian_tokenizer(task, out)


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
